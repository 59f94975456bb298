"""RULER's common words extraction task ``cwe`` (aggregation): name the 10 most frequent words.

A port of NVIDIA/RULER ``scripts/data/synthetic/common_words_extraction.py`` with
``scripts/synthetic.yaml``'s ``freq_cw: 30, freq_ucw: 3, num_cw: 10`` and the default one
in-context example. The word pool is wonderwords' nouns, adjectives and verbs, sorted unique and
shuffled by ``Random(seed)``; a sample draws ``num_words`` distinct words, the first 10 are the
common ones, repeated ``freq_cw`` times, the rest ``freq_ucw`` times, the list shuffled by a fresh
``Random(seed)`` and numbered ``"1. w 2. w ..."``. As in RULER, below ``max_seq_length`` 4096 the
repeats are 6 and 1 and the example is ``get_example(20, 3, 1)``; from 4096 on they are 30 and 3
and the example is ``get_example(40, 10, 3)``. The example is the full template with its answer
(``"1. w 2. w ..."``) after the answer prefix, then a newline and the task.

Kept from RULER: the template and answer prefix, 120 generated tokens, the draw order of one
``generate_input_output`` call (the example's words, then the sample's), the answer (the 10 common
words, scored by ``string_match_all``).

Deviations (also in :data:`DEVIATIONS`): the sizing (per sample, the largest ``num_words`` that fits,
found by replaying its draws, instead of one binary-searched size on throw-away draws and 10-word
shrink steps); the word lists are those of the installed wonderwords (3.0.1 here; RULER's pinned
version may differ); and RULER's fallback list for more words than the pool holds
(``json/english_words.json``, beyond about 64K tokens) is not shipped, so such lengths are refused.
"""

from __future__ import annotations

import functools
import logging
import random
from typing import Any

from .ruler_common import RulerSample, Streams, size_sample, split_answer_prefix

__all__ = ["TEMPLATE", "ANSWER_PREFIX", "TOKENS_TO_GENERATE", "DEVIATIONS", "cwe_words", "generate_cwe"]

logger = logging.getLogger(__name__)

# RULER scripts/data/synthetic/constants.py, TASKS['common_words_extraction'].
TOKENS_TO_GENERATE = 120
TEMPLATE = (
    "Below is a numbered list of words. In these words, some appear more often than others. "
    "Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words "
    "in the above list?"
)
ANSWER_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FREQ_CW, FREQ_UCW, NUM_CW, NUM_FEWSHOT = 30, 3, 10, 1

DEVIATIONS: tuple[str, ...] = (
    "sizing: per-sample largest word count (1-word steps) that fits, found by replaying the "
    "sample's draws; RULER binary-searches one size on throw-away samples (consuming random state)",
    "words: the installed wonderwords lists; RULER's english_words.json fallback (pools over "
    "the wonderwords lists, > ~64K tokens) is not shipped, such lengths are refused",
)


@functools.cache
def cwe_words(seed: int) -> tuple[str, ...]:
    """RULER's pool: ``sorted(set(nouns + adjs + verbs))`` shuffled by ``random.Random(seed)``."""
    from .niah import read_wonderwords_list

    words = sorted(
        set(
            read_wonderwords_list("nounlist.txt")
            + read_wonderwords_list("adjectivelist.txt")
            + read_wonderwords_list("verblist.txt")
        )
    )
    random.Random(seed).shuffle(words)
    return tuple(words)


def _numbered(words) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def _example(
    rng: random.Random, seed: int, num_words: int, common: int, uncommon: int
) -> tuple[str, list[str]]:
    """RULER ``get_example``: the numbered shuffled list and the common words."""
    pool = cwe_words(seed)
    if num_words > len(pool):
        raise ValueError(
            f"{num_words} distinct words exceed the {len(pool)}-word pool (RULER's english_words.json "
            f"fallback is not shipped): use a shorter length"
        )
    chosen = rng.sample(pool, num_words)
    words = chosen[:NUM_CW] * common + chosen[NUM_CW:] * uncommon
    random.Random(seed).shuffle(words)
    return _numbered(words), chosen[:NUM_CW]


def _generate(streams: Streams, n: int, *, length: int, seed: int) -> tuple[str, list[str]]:
    """RULER ``generate_input_output(n)``: the example(s), a newline, the task; and the answer."""
    rng = streams.py
    if length < 4096:
        shots = [_example(rng, seed, 20, 3, 1) for _ in range(NUM_FEWSHOT)]
        context, answer = _example(rng, seed, n, 6, 1)
    else:
        shots = [_example(rng, seed, 40, 10, 3) for _ in range(NUM_FEWSHOT)]
        context, answer = _example(rng, seed, n, FREQ_CW, FREQ_UCW)
    template = TEMPLATE + ANSWER_PREFIX
    shown = "\n".join(template.format(context=c, query="") + " " + _numbered(a) for c, a in shots)
    return shown + "\n" + template.format(context=context, query=""), answer


def generate_cwe(tokenizer: Any, length: int, num_samples: int, seed: int = 42) -> list[RulerSample]:
    """Generate ``cwe`` samples whose prompt plus 120 generated tokens fit ``length`` tokens.

    Raises:
        ValueError: a ``length`` too small for the example and 10 common words, or too large for
            the word pool.
    """
    streams = Streams(seed)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(s: Streams, n: int):
        return _generate(s, n, length=length, seed=seed)

    limit, guess, samples = length - TOKENS_TO_GENERATE, None, []
    for index in range(num_samples):
        try:
            n, text, answer, tokens = size_sample(
                streams, generate, count, limit, smallest=NUM_CW, guess=guess
            )
        except ValueError as err:
            raise ValueError(f"length={length} does not suit cwe: {err}") from None
        guess = n
        prompt, prefix = split_answer_prefix(text, ANSWER_PREFIX)
        samples.append(
            RulerSample(
                task="cwe",
                length=length,
                index=index,
                prompt=prompt,
                answer_prefix=prefix,
                outputs=list(answer),
                max_new_tokens=TOKENS_TO_GENERATE,
                n_prompt_tokens=tokens,
                num_haystack=n,
                metadata={"seed": seed, "repeats": [6, 1] if length < 4096 else [FREQ_CW, FREQ_UCW]},
            )
        )
    logger.info("generated %d cwe samples at length %d", len(samples), length)
    return samples

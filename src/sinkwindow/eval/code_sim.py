"""LongBench's code completion score (``code_sim_score``) and exact match, for the ``lcc`` task.

LongBench (THUDM/LongBench ``metrics.py``) scores a completion by the first line of the prediction
(leading newlines dropped) that contains none of ``` ` ```, ``#`` or ``//``, i.e. the first line
that is not a comment or a Markdown fence, and compares it with the reference line by fuzzywuzzy's
``fuzz.ratio``: ``round(100 * (len(a) + len(b) - d) / (len(a) + len(b)))`` with ``d`` the
insertion/deletion edit distance (Levenshtein with substitutions costing 2, what
python-Levenshtein's ``ratio`` computes; fuzzywuzzy returns 0 when a string is empty).

Here both lines are stripped of surrounding whitespace first: indentation is not scored (the
answer is stored without it). :func:`indel_distance` uses rapidfuzz when it is installed and the
plain dynamic programme :func:`indel_distance_reference` otherwise; a test holds them equal.
"""

from __future__ import annotations

__all__ = [
    "code_sim_score",
    "exact_match",
    "first_code_line",
    "fuzz_ratio",
    "indel_distance",
    "indel_distance_reference",
]

# LongBench skips prediction lines holding any of these (comments, Markdown fences, C++ comments).
SKIPPED_MARKS = ("`", "#", "//")


def first_code_line(prediction: str) -> str:
    """The first line of ``prediction`` (leading newlines dropped) without `` ` ``, ``#`` or ``//``;
    ``""`` when every line has one (LongBench's ``code_sim_score`` post-processing)."""
    for line in prediction.lstrip("\n").split("\n"):
        if not any(mark in line for mark in SKIPPED_MARKS):
            return line
    return ""


def indel_distance_reference(a: str, b: str) -> int:
    """Insertions plus deletions turning ``a`` into ``b``: ``len(a) + len(b) - 2 * LCS(a, b)``,
    by the textbook O(len(a) * len(b)) longest-common-subsequence table (one row kept)."""
    row = [0] * (len(b) + 1)
    for ca in a:
        prev_diag = 0
        for j, cb in enumerate(b, start=1):
            keep = row[j]
            row[j] = prev_diag + 1 if ca == cb else max(row[j], row[j - 1])
            prev_diag = keep
    return len(a) + len(b) - 2 * row[len(b)]


def indel_distance(a: str, b: str) -> int:
    """:func:`indel_distance_reference`, through rapidfuzz's bit-parallel ``Indel`` when installed."""
    try:
        from rapidfuzz.distance import Indel
    except ImportError:
        return indel_distance_reference(a, b)
    return int(Indel.distance(a, b))


def fuzz_ratio(a: str, b: str) -> int:
    """fuzzywuzzy's ``fuzz.ratio`` (with python-Levenshtein): 0-100, 0 when either string is empty."""
    if not a or not b:
        return 0
    total = len(a) + len(b)
    return int(round(100 * (total - indel_distance(a, b)) / total))


def code_sim_score(prediction: str, answer: str) -> int:
    """LongBench's ``code_sim_score`` × 100: the edit similarity (0-100) of the prediction's first
    code line to ``answer``, both stripped of surrounding whitespace."""
    return fuzz_ratio(first_code_line(prediction).strip(), answer.strip())


def exact_match(prediction: str, answer: str) -> int:
    """100 when the prediction's first code line equals ``answer`` once both are stripped, else 0."""
    return 100 if first_code_line(prediction).strip() == answer.strip() else 0

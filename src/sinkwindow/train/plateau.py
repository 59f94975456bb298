"""Whether a training stage has flattened: its validation loss over the last part of its steps.

"Trained to convergence" needs a test a reader can check, not a look at a curve. Over the last
``last`` share of a stage's steps (20% by default), this compares the first and the final
validation of that window (the last two validations, when fewer fall in it) on the same chunks
(the paired test from the window's first validation that logged per-chunk losses):

- ``change``: final minus first validation loss (negative: still falling), and ``relative``;
- ``slope_per_100``: least-squares slope of every validation in the window, per 100 steps;
- with per-chunk losses logged (``val_losses`` in the stage's ``log.jsonl``), the paired per-chunk
  differences and the exact Wilcoxon signed-rank test on them: ``flat`` when they are not
  distinguishable from zero (p >= 0.05), i.e. the last stretch of training moved the loss by less
  than the spread between held-out chunks can tell. Without per-chunk losses ``flat`` is ``None``;
  so it is when fewer chunks moved than the test needs to ever reject (:func:`min_pairs`, 6 at
  0.05), and ``undecided`` says so.

Only validations on the final validation set count (``val_key``): a run that changed its set
(``liger:256`` went from 4 to 20 chunks) is judged on the new one. A learning-rate drop inside the
window (``lr_drop_at``) is named in ``lr_drop_steps``; the fall it causes counts against "flat"
like any other, so a drop cannot make a window look flat.

At a low learning rate the held-out chunks move together, and the paired test then tells apart a
fall of any size, however small: "still moving" stays true long after more training stops
mattering. So the window is also judged against a stated tolerance (:data:`TOLERANCE`, 0.5% of the
window's first validation loss: the band in which the shipped ``lolcats:256``, ``linear`` and
SWA + LoRA runs ended, +0.08%, +0.41% and -0.20% over their last fifths). ``settled`` is the
equivalence verdict of two one-sided exact signed-rank tests on the same paired differences (TOST):
True when both reject that the window moved the loss by more than the tolerance, down or up
(``p_settled``, the larger of the two p). "flat" says the window did not move the loss at all that
the chunks can tell; "settled" says it moved it by less than the tolerance, and the summary keeps
both, so a reader sees which one a run passed.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..jsonl import read_jsonl

__all__ = ["ALPHA", "TOLERANCE", "describe", "min_pairs", "plateau"]

ALPHA = 0.05
# Fixed on 2026-12-07 at liger:256's step 1,206, a third of the way into the window it is judged
# on when it stops at two epochs (validations 1,112-1,383); see the docstring.
TOLERANCE = 0.005


def _validations(log: list[dict]) -> list[dict]:
    """Validation rows of a stage's log, the last one per step, in step order."""
    rows: dict[int, dict] = {}
    for row in log:
        val = row.get("val_loss")
        if isinstance(val, int | float) and math.isfinite(val) and "step" in row:
            rows[int(row["step"])] = row
    return [rows[s] for s in sorted(rows)]


def plateau(path: str | Path, last: float = 0.2, tolerance: float = TOLERANCE) -> dict | None:
    """The last ``last`` share of a stage's steps, judged from its ``log.jsonl`` (module docstring).

    Returns:
        ``{"from_step", "to_step", "first", "final", "change", "relative", "slope_per_100",
        "validations", "chunks", "mean_chunk_change", "p", "flat", "tolerance", "p_settled",
        "settled", "lr_drop_steps"}`` (with per-chunk losses also ``"paired_from_step"`` and
        ``"min_p"``, and ``"undecided"`` when too few chunks moved), or ``None`` with fewer than two
        validations on the final validation set.
    """
    log, _ = read_jsonl(path)  # a torn last line (a kill mid-write) is skipped with a warning
    rows = _validations(log)
    if not rows:
        return None
    drops = sorted({int(r["step"]) for r in log if "lr_drop" in r and "step" in r})
    key = rows[-1].get("val_key")
    rows = [r for r in rows if r.get("val_key") == key]
    end = int(rows[-1]["step"])
    window = [r for r in rows if r["step"] >= (1 - last) * end]
    if len(window) < 2:  # validations further apart than the window: the last two
        window = rows[-2:]
    if len(window) < 2:
        return None
    first, final = window[0], window[-1]
    xs = [float(r["step"]) for r in window]
    ys = [float(r["val_loss"]) for r in window]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    out = {
        "from_step": int(first["step"]),
        "to_step": end,
        "first": float(first["val_loss"]),
        "final": float(final["val_loss"]),
        "change": float(final["val_loss"]) - float(first["val_loss"]),
        "relative": (float(final["val_loss"]) - float(first["val_loss"])) / float(first["val_loss"]),
        "slope_per_100": 100 * slope,
        "validations": len(window),
        "chunks": None,
        "mean_chunk_change": None,
        "p": None,
        "flat": None,
        "tolerance": tolerance,
        "p_settled": None,
        "settled": None,
        "lr_drop_steps": [s for s in drops if first["step"] <= s < end],
    }
    # The paired test starts at the window's first validation that logged per-chunk losses: a run
    # resumed under a newer trainer logs them only from then on (liger:256 from step 368).
    b = final.get("val_losses")
    start = None
    if isinstance(b, list) and len(b) >= 2:
        start = next((r for r in window[:-1] if isinstance(r.get("val_losses"), list)
                      and len(r["val_losses"]) == len(b)), None)  # fmt: skip
    if start is not None:
        a = start["val_losses"]
        out["paired_from_step"] = int(start["step"])
        diffs = [y - x for x, y in zip(a, b)]
        out["chunks"] = len(diffs)
        out["mean_chunk_change"] = sum(diffs) / len(diffs)
        moved = sum(1 for d in diffs if d != 0)
        if moved:
            out["p"] = _signed_rank(diffs)
        else:
            out["p"] = 1.0
        # The smallest two-sided p the exact test can give on ``moved`` differences is 2 / 2**moved
        # (every one the same sign): below min_pairs() it never reaches ALPHA, so "not distinguishable"
        # would be said of any change at all. Then there is no verdict, and the reason says why.
        out["min_p"] = 2.0 / 2**moved if moved else 1.0
        needed = min_pairs()
        if 0 < moved < needed:
            out["undecided"] = (
                f"{moved} chunk(s) moved: the exact test cannot reach p < {ALPHA} with fewer than "
                f"{needed}; validate on more chunks (--val-batches)"
            )
        else:
            out["flat"] = out["p"] >= ALPHA
        out |= _settled(diffs, tolerance * sum(a) / len(a))
    return out


def _settled(diffs: list[float], margin: float) -> dict:
    """Equivalence of paired differences to zero within ``±margin`` (nats): two one-sided exact
    signed-rank tests, shifted by the margin (TOST). On n chunks the smallest one-sided p is
    1 / 2**n, so below ``min_pairs(2 * ALPHA)`` (5) chunks there is no verdict."""
    if len(diffs) < min_pairs(2 * ALPHA):
        return {"p_settled": None, "settled": None}
    above = _signed_rank([d + margin for d in diffs], "greater")
    below = _signed_rank([d - margin for d in diffs], "less")
    p = max(above, below)
    return {"p_settled": p, "settled": p < ALPHA}


def _signed_rank(diffs: list[float], alternative: str = "two-sided") -> float:
    """p of the Wilcoxon signed-rank test on paired differences: exact up to 50 pairs (the
    normal approximation past that is scipy's own choice)."""
    from scipy.stats import wilcoxon

    method = "exact" if len(diffs) <= 50 else "auto"
    return float(wilcoxon(diffs, alternative=alternative, method=method).pvalue)


def min_pairs(alpha: float = ALPHA) -> int:
    """Fewest nonzero paired differences with which the two-sided exact signed-rank test can
    reject at ``alpha``: the smallest n with 2 / 2**n <= alpha (6 at 0.05)."""
    n = 1
    while 2.0 / 2**n > alpha:
        n += 1
    return n


def describe(judged: dict) -> str:
    """One line for a :func:`plateau` result: the window, its change and the verdict with its p."""
    verdict = (
        judged.get("undecided")
        or {True: "flat", False: "still moving", None: "no per-chunk losses to test"}[judged["flat"]]
    )
    if judged["flat"] is False and judged.get("settled"):
        verdict = f"settled: moved by less than ±{judged['tolerance']:.1%} (p = {judged['p_settled']:.3g})"
    p = "" if judged["p"] is None else f"; no-change p = {judged['p']:.3g} over {judged['chunks']} chunks"
    return (
        f"steps {judged['from_step']}-{judged['to_step']}: validation {judged['first']:.4g} -> "
        f"{judged['final']:.4g} ({100 * judged['relative']:+.2f}%): {verdict}{p}"
    )

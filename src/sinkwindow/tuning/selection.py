"""How the units kept full are chosen from their scores: ``top`` (the K best single units) or
``greedy`` (forward selection by the answer NLL given the units already kept).

Scores of one unit at a time cannot see units that only help together (a retrieval circuit spans
layers), so ``greedy`` re-scores: :func:`greedy_select` starts from the best single unit and adds,
one step at a time, the candidate whose addition gives the lowest NLL *given the units already
kept*, the candidates being the ``pool`` best single units. It adds ``(P - 1) + (P - 2) + ... +
(P - K + 1)`` runs for a pool of P (45 for K = 6, P = 12).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..runtime.spec import MethodSpec
    from .criteria import ScoringRun
    from .units import Unit

__all__ = ["SELECTIONS", "choose_units", "greedy_runs", "greedy_select", "order", "select_units"]

# The ways of choosing K units from their scores (calibrate's --select).
SELECTIONS = ("top", "greedy")


def order(scores: Sequence[float], higher_is_better: bool = True) -> list[int]:
    """Indices best first; ties (and NaN, last) keep unit order, so the answer is deterministic."""

    def key(i: int):
        s = scores[i]
        bad = s is None or (isinstance(s, float) and math.isnan(s))
        return (bad, 0.0 if bad else (-s if higher_is_better else s), i)

    return sorted(range(len(scores)), key=key)


def select_units(
    units: Sequence[Unit], scores: Sequence[float], k: int, *, higher_is_better: bool = True
) -> list[Unit]:
    """The ``k`` best units by ``scores``, best first (ties: the earlier unit): top-K selection."""
    if len(units) != len(scores):
        raise ValueError(f"{len(units)} units but {len(scores)} scores")
    if not 0 <= k <= len(units):
        raise ValueError(f"K={k} units asked, but there are {len(units)}: choose K from 0 to {len(units)}")
    return [units[i] for i in order(scores, higher_is_better)[:k]]


def greedy_select(
    candidates: Sequence[Unit],
    k: int,
    nlls_of: Callable[[list[list[Unit]]], list[float]],
    *,
    first: dict[Unit, float] | None = None,
) -> tuple[list[Unit], list[dict]]:
    """Forward selection: keep adding the candidate whose addition gives the lowest NLL.

    Args:
        candidates: the units that may be kept, in the order that breaks ties (best single first).
        k: units to keep, at most ``len(candidates)``.
        nlls_of: mean NLL with each of several lists of units kept full (on top of the base): one
            step's candidates go as one batch, so they can run side by side (``nll.mean_nlls``).
        first: NLL of each candidate kept alone, when already known (step 1 then costs nothing).

    Returns:
        ``(chosen, steps)``: the units in the order they were added, and per step
        ``{"added": label, "nll": NLL with the units so far, "tried": {label: NLL}}``.
    """
    from .units import unit_label

    if not 0 <= k <= len(candidates):
        raise ValueError(f"K={k} units asked from a pool of {len(candidates)}: give a --pool of at least K")
    chosen: list[Unit] = []
    steps: list[dict] = []
    for step in range(k):
        rest = [u for u in candidates if u not in chosen]
        if step == 0 and first is not None:
            tried = {u: float(first[u]) for u in rest}
        else:
            tried = dict(zip(rest, map(float, nlls_of([[*chosen, u] for u in rest]))))
        best = min(rest, key=lambda u: (tried[u], rest.index(u)))  # ties: the earlier candidate
        chosen.append(best)
        steps.append(
            {
                "added": unit_label(best),
                "nll": tried[best],
                "tried": {unit_label(u): v for u, v in tried.items()},
            }
        )
    return chosen, steps


def greedy_runs(pool: int, k: int) -> int:
    """Prompt passes greedy selection adds to the single-unit scores (step 1 reuses them)."""
    return sum(pool - i for i in range(1, k))


def choose_units(
    run: ScoringRun, base: MethodSpec, scores: dict, criterion: str, select: str, k: int, pool: int | None,
    progress: bool = False,
) -> dict:  # fmt: skip
    """The K units kept full on one streaming base ``swa:W:S``: top-K by ``criterion``, or greedy
    over the ``pool`` best single units by NLL (``scores``: that base's, from ``score_units``).

    Returns:
        ``{"sinks", "base", "spec", "chosen", "scores", "steps"}``.
    """
    from ..runtime.kv_bytes import kv_geometry
    from .criteria import CRITERIA
    from .units import spec_with_units

    steps: list[dict] = []
    if select == "greedy":
        chosen, steps = _greedy(run, base, scores, k, pool, progress)
    else:
        chosen = select_units(
            run.units, scores[criterion], k, higher_is_better=CRITERIA[criterion].higher_is_better
        )
    spec = spec_with_units(base, chosen, kv_geometry(run.model.config)[2])
    return {
        "sinks": base.sinks,
        "base": base,
        "spec": spec,
        "chosen": chosen,
        "scores": scores,
        "steps": steps,
    }


def _greedy(run: ScoringRun, base: MethodSpec, scores: dict, k: int, pool: int, progress: bool):
    """``(chosen units, steps)`` of greedy selection over the ``pool`` best single units by NLL."""
    from ..runtime.method import use_method
    from .nll import mean_nlls
    from .units import spec_with_units

    candidates = select_units(run.units, scores["nll"], pool)
    ref = scores["nll_base"]
    first = {u: ref - scores["nll"][run.units.index(u)] for u in candidates}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=greedy_runs(pool, k) * len(run.prompts), desc="greedy", unit="prompt")
    try:
        return greedy_select(
            candidates, k,
            lambda kepts: mean_nlls(
                run.model, [spec_with_units(base, kept) for kept in kepts], run.prompts, run.chunk_size, bar,
                run.native_sliding, run.memo, run.workers,
            ),
            first=first,
        )  # fmt: skip
    finally:
        use_method(run.model, "full")
        if bar is not None:
            bar.close()

"""The criteria that score units (layers or KV heads) for keeping full attention, one small class
each, registered by name in :data:`CRITERIA` (the one list ``calibrate``, ``tune``, ``frontier``
and the command line read).

Every criterion scores each unit on calibration prompts (:class:`ScoringRun`) and fills, per base
``swa:W:S``, one score per unit; higher means more worth keeping full, except ``rank``'s (a mean
rank: lower). Adding a criterion is one class here and one entry in :data:`CRITERIA`.

- ``nll``: the NLL gain when that unit *alone* keeps full attention, NLL under ``swa:W:S`` minus
  NLL under ``swa:W:S+full:<unit>`` (arXiv 2606.27791); one run per unit and base.
- ``mass``: under full attention, the attention mass a unit's last :data:`LAST_QUERIES` queries put
  on keys SWA(W, S) would drop (``tuning/mass.py``); one pass for every base.
- ``rank``: the mean of the ``nll`` and ``mass`` ranks (1 = the unit most worth keeping).
- ``gates``: DuoAttention's trained gates (``tuning/gates.py``), α ∈ [0, 1] per KV head.
- ``retrieval``: the attention the answer's queries put on the needle (``tuning/retrieval.py``);
  one pass under full attention, the same for every base.

Importing this module does not import torch (the command line reads :data:`CRITERIA`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from .selection import order

__all__ = [
    "CRITERIA",
    "GATE_STEPS",
    "LAST_QUERIES",
    "Criterion",
    "ScoringRun",
    "check_criterion",
    "rank_scores",
    "score_units",
]

# The last queries of an S-NIAH prompt are the question, the answer prefix and the answer itself:
# the positions that must reach back to the needle. Earlier queries read the haystack, which is
# mostly local text, and would drown the retrieval signal in their number.
LAST_QUERIES = 64
# Adam steps of the trained gates (criterion "gates", tuning/gates.py): one calibration prompt each.
GATE_STEPS = 60


@dataclass
class ScoringRun:
    """What every criterion scores on: the model, its calibration prompts, the bases ``swa:W:S``
    and the units, with how the runs go.

    ``memo``: finished runs to reuse and keep (``tuning/memo.py``); ``workers``: where the answer-NLL
    runs go (``nll.mean_nlls``; mass, retrieval and gates run here). ``native_sliding`` is the policy
    every hybrid runs under (``apply``'s).
    """

    model: object
    prompts: Sequence
    bases: Sequence
    units: Sequence
    chunk_size: int = 512
    last_queries: int = LAST_QUERIES
    native_sliding: str = "override"
    memo: object | None = None
    workers: object | None = None


class Criterion:
    """One way of scoring units; :meth:`score` fills ``out[str(base)][self.name]`` for every base."""

    name = ""
    label = ""  # what the scores are, as calibrate.png titles them
    higher_is_better = True
    needs: tuple[str, ...] = ()  # criteria whose scores this one reads

    def runs(self, run: ScoringRun) -> int:
        """Prompt passes :meth:`score` makes (the progress bar's share)."""
        return 0

    def score(self, run: ScoringRun, out: dict[str, dict], bar=None) -> None:
        raise NotImplementedError


def _unit_values(grid, units: Sequence, per_layer: str) -> list[float]:
    """A ``[layers, kv_heads]`` grid read per unit: a KV head its cell, a layer its ``per_layer``."""
    return [
        float(getattr(grid[u], per_layer)()) if isinstance(u, int) else float(grid[u[0], u[1]]) for u in units
    ]


class Nll(Criterion):
    name = "nll"
    label = "NLL gain (nats / answer token)"

    def runs(self, run: ScoringRun) -> int:
        return len(run.bases) * (1 + len(run.units)) * len(run.prompts)

    def score(self, run: ScoringRun, out: dict[str, dict], bar=None) -> None:
        from .nll import base_gains

        for b in run.bases:
            ref, gains = base_gains(run, b, bar)
            out[str(b)]["nll"] = gains
            out[str(b)]["nll_base"] = ref


class Mass(Criterion):
    name = "mass"
    label = "mass outside the window"

    def runs(self, run: ScoringRun) -> int:
        return len(run.prompts)

    def score(self, run: ScoringRun, out: dict[str, dict], bar=None) -> None:
        import torch

        from .memo import prompts_digest

        shapes = [(b.window, b.sinks) for b in run.bases]
        key = {"kind": "mass", "shapes": [list(s) for s in shapes], "last_queries": run.last_queries,
               "chunk_size": run.chunk_size, "prompts": prompts_digest(run.prompts)}  # fmt: skip

        def compute() -> list:
            from .mass import mass_scores

            masses = mass_scores(run.model, run.prompts, shapes, last_queries=run.last_queries,
                                 chunk_size=run.chunk_size, bar=bar)  # fmt: skip
            return [masses[shape].tolist() for shape in shapes]

        grids = _kept_pass(run.memo, key, len(run.prompts), bar, compute)
        for b, grid in zip(run.bases, grids):
            out[str(b)]["mass"] = _unit_values(torch.tensor(grid, dtype=torch.float64), run.units, "mean")


class Retrieval(Criterion):
    name = "retrieval"
    label = "attention on the needle while answering"

    def runs(self, run: ScoringRun) -> int:
        return len(run.prompts)

    def score(self, run: ScoringRun, out: dict[str, dict], bar=None) -> None:
        import torch

        from .memo import prompts_digest

        key = {"kind": "retrieval", "chunk_size": run.chunk_size, "prompts": prompts_digest(run.prompts)}

        def compute() -> list:
            from .retrieval import retrieval_scores

            return retrieval_scores(run.model, run.prompts, chunk_size=run.chunk_size, bar=bar).tolist()

        grid = torch.tensor(_kept_pass(run.memo, key, len(run.prompts), bar, compute), dtype=torch.float64)
        scores = _unit_values(grid, run.units, "max")
        for b in run.bases:  # measured under full attention: the same for every base
            out[str(b)]["retrieval"] = scores


class Rank(Criterion):
    name = "rank"
    label = "mean rank (1 = kept first)"
    higher_is_better = False
    needs = ("nll", "mass")

    def score(self, run: ScoringRun, out: dict[str, dict], bar=None) -> None:
        for b in run.bases:
            out[str(b)]["rank"] = rank_scores({c: out[str(b)][c] for c in self.needs})


class Gates(Criterion):
    name = "gates"
    label = "trained gate α (1 = full attention)"

    def score(self, run: ScoringRun, out: dict[str, dict], bar=None) -> None:
        import torch

        from ..runtime.method import use_method

        use_method(run.model, "full")  # the gates mix the frozen model's own full attention with SWA
        sequences = [torch.cat([p.input_ids, p.answer_ids], dim=1) for p in run.prompts]
        for b in run.bases:
            trained = _trained_gates(run, sequences, b)
            out[str(b)]["gates"] = trained.scores(run.units)
            out[str(b)]["gate_losses"] = trained.losses


# The registry, in the order the command line lists them.
CRITERIA: dict[str, Criterion] = {c.name: c for c in (Nll(), Mass(), Rank(), Gates(), Retrieval())}
# The order the scoring passes run in (and their scores appear in ``tune.json``'s unit scores):
# the one-pass criteria first, rank after both it reads, the gates' training last.
_PASSES = ("mass", "retrieval", "nll", "rank", "gates")


def check_criterion(name: str) -> Criterion:
    """The criterion called ``name``, or a one-line error naming the choices."""
    if name not in CRITERIA:
        raise ValueError(f"unknown criterion {name!r}: choose from {', '.join(CRITERIA)}")
    return CRITERIA[name]


def rank_scores(per_criterion: dict[str, Sequence[float]]) -> list[float]:
    """Mean over criteria of each unit's rank (1 = most worth keeping full; higher score is better).

    Ties take ordinal ranks in unit order, so the mean rank is deterministic too.
    """
    if not per_criterion:
        raise ValueError("rank needs at least one criterion's scores")
    n = len(next(iter(per_criterion.values())))
    total = [0.0] * n
    for scores in per_criterion.values():
        for rank, i in enumerate(order(scores), start=1):
            total[i] += rank
    return [t / len(per_criterion) for t in total]


def score_units(run: ScoringRun, criteria: Sequence[str], *, progress: bool = False) -> dict[str, dict]:
    """Every criterion's per-unit scores for each base of ``run`` (and those the criteria need).

    Returns:
        ``{str(base): {"nll": [...], "mass": [...], "rank": [...], "nll_base": float}}`` with the
        criteria asked for (``rank`` needs, and brings, both others). Scores are aligned with
        ``run.units``; higher means more worth keeping full, except ``rank`` (a mean rank: lower).
    """
    from .units import check_base_spec

    run.bases = [check_base_spec(b) for b in run.bases]
    need = set()
    for name in criteria:
        need |= {name, *check_criterion(name).needs}
    passes = [CRITERIA[name] for name in _PASSES if name in need]
    bar = None
    if progress:  # the gates' steps are not counted: train_gates shows its own bar
        from tqdm.auto import tqdm

        bar = tqdm(total=sum(c.runs(run) for c in passes), desc="calibrating", unit="prompt")
    out: dict[str, dict] = {str(b): {} for b in run.bases}
    try:
        for criterion in passes:
            criterion.score(run, out, bar)
    finally:
        if bar is not None:
            bar.close()
    return out


def _kept_pass(memo, key: dict, prompts: int, bar, compute):
    """What a ``memo`` kept for one full-attention pass (the bar moved past its ``prompts``), or
    ``compute()``'s JSON-ready result, kept with the CPU seconds it took."""
    hit = None if memo is None else memo.get(key)
    if hit is not None:
        if bar is not None:
            bar.update(prompts)
        return hit
    t0 = time.process_time()
    value = compute()
    if memo is not None:
        memo.put(key, value, time.process_time() - t0)
    return value


def _trained_gates(run: ScoringRun, sequences, base):
    """``train_gates`` on ``base``, or the gates the memo kept from the same run (they depend on the
    prompts and the base, not on how many heads are then kept). With a memo the training state is
    kept after every step too (``gates-progress``), so a stopped training resumes at its last step."""
    from . import gates
    from .memo import prompts_digest

    memo, policy = run.memo, run.native_sliding
    key = {"kind": "gates", "spec": str(base), "native_sliding": policy, "steps": GATE_STEPS,
           "prompts": prompts_digest(sequences)}  # fmt: skip
    if memo is None:
        return gates.train_gates(run.model, sequences, base, steps=GATE_STEPS, native_sliding=policy)
    hit = memo.get(key)
    if hit is not None:
        return gates.GateResult(alpha=hit["alpha"], losses=hit["losses"])
    progress_key = {**key, "kind": "gates-progress"}
    resume = memo.get(progress_key)  # the last state kept (a later line wins), CPU so far inside it
    spent = 0.0 if resume is None else float(resume["cpu_s"])
    t0 = time.process_time()

    def keep(state: dict) -> None:
        memo.put(progress_key, {**state, "cpu_s": spent + time.process_time() - t0})

    trained = gates.train_gates(run.model, sequences, base, steps=GATE_STEPS, native_sliding=policy,
                                resume=resume, on_step=keep)  # fmt: skip
    memo.put(key, {"alpha": trained.alpha, "losses": trained.losses}, spent + time.process_time() - t0)
    return trained

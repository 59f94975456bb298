"""Score layers (or KV heads) for keeping full attention on top of SWA(W, S), and keep the top K.

A *unit* is a decoder layer (``11``) or one KV head of a layer (``(11, 2)``, spelt ``11.2`` as in
the spec grammar ``swa:256:4+full:11.2``). These criteria score every unit, on calibration prompts
that no evaluation uses (S-NIAH prompts of seed :data:`CAL_SEED`, far from every evaluation seed):

- ``nll``: the NLL gain when that unit *alone* keeps full attention, NLL under ``swa:W:S`` minus
  NLL under ``swa:W:S+full:<unit>`` (training-free NLL-guided layer selection, arXiv 2606.27791).
  The NLL is the teacher-forced gold answer's, averaged over its tokens: retrieval is what a
  window loses, so the loss that matters is the one on the needle's value.
- ``mass``: under full attention, the attention mass a unit's queries put on keys SWA(W, S) would
  drop (neither one of the S sinks nor among the W - S most recent), averaged over the last
  :data:`LAST_QUERIES` query positions and, for a KV head, over the query heads that share it.
  One full-attention pass gives the mass for every (W, S) at once.
- ``rank``: the mean of the two ranks (1 = the unit most worth keeping).
- ``retrieval``: under full attention, the attention weight the answer's queries put on the needle's
  value (``tuning/retrieval.py``; the soft form of the Retrieval Head paper's copy score, as
  RazorAttention keeps retrieval heads whole): a KV head scores the largest of its query heads, a
  layer the largest of its KV heads. One full-attention pass, like ``mass``.
- ``gates``: DuoAttention's trained gates (``tuning/gates.py``): one α ∈ [0, 1] per KV head, mixing
  its full-attention and SWA(W, S) outputs, trained on the frozen model to keep the last hidden
  states of full attention under an L1 pull towards 0; a unit scores its α (a layer: the mean).

:func:`select_units` then keeps the K best units (ties go to the earlier unit, so a seed gives one
answer), and :func:`spec_with_units` writes the hybrid spec. Scores of one unit at a time cannot see
units that only help together (a retrieval circuit spans layers), so ``select="greedy"`` re-scores:
:func:`greedy_select` starts from the best single unit and adds, one step at a time, the candidate
whose addition gives the lowest NLL *given the units already kept*, the candidates being the ``pool``
best single units.

Cost: ``nll`` runs the prompts once per unit plus once for the base (31 runs for a 30-layer model);
``mass`` and ``retrieval`` run them once in all; greedy adds ``(P - 1) + (P - 2) + ... +
(P - K + 1)`` runs for a pool of P (45 for K = 6, P = 12). Both prefill in chunks through the
method's cache, so a long prompt never needs more than a chunk's activations and the cache.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..runtime.kv_bytes import kv_geometry
from ..runtime.method import use_method
from ..runtime.spec import MethodSpec, parse_spec
from .mass import LAST_QUERIES, mass_scores
from .memo import Memo, prompts_digest
from .nll import NllWorkers, greedy_runs, greedy_select, mean_nlls, nll_scores
from .prompts import CAL_SEED, CalibrationPrompt, calibration_prompts, check_calibration_seed
from .retrieval import retrieval_scores
from .units import Unit, check_base_spec, model_units, parse_unit, spec_with_units, unit_label

__all__ = [
    "CRITERIA",
    "CalibrationResult",
    "calibrate",
    "plot_scores",
    "rank_scores",
    "score_units",
    "select_units",
    "SELECTIONS",
    "write_calibration",
]

logger = logging.getLogger(__name__)

CRITERIA = ("nll", "mass", "rank", "gates", "retrieval")
# Adam steps of the trained gates (criterion "gates", tuning/gates.py): one calibration prompt each.
GATE_STEPS = 60
SELECTIONS = ("top", "greedy")


def _order(scores: Sequence[float], higher_is_better: bool = True) -> list[int]:
    """Indices best first; ties (and NaN, last) keep unit order, so the answer is deterministic."""

    def key(i: int):
        s = scores[i]
        bad = s is None or (isinstance(s, float) and math.isnan(s))
        return (bad, 0.0 if bad else (-s if higher_is_better else s), i)

    return sorted(range(len(scores)), key=key)


def rank_scores(per_criterion: dict[str, Sequence[float]]) -> list[float]:
    """Mean over criteria of each unit's rank (1 = most worth keeping full; higher score is better).

    Ties take ordinal ranks in unit order, so the mean rank is deterministic too.
    """
    if not per_criterion:
        raise ValueError("rank needs at least one criterion's scores")
    n = len(next(iter(per_criterion.values())))
    total = [0.0] * n
    for scores in per_criterion.values():
        for rank, i in enumerate(_order(scores), start=1):
            total[i] += rank
    return [t / len(per_criterion) for t in total]


def select_units(
    units: Sequence[Unit], scores: Sequence[float], k: int, *, higher_is_better: bool = True
) -> list[Unit]:
    """The ``k`` best units by ``scores``, best first (ties: the earlier unit)."""
    if len(units) != len(scores):
        raise ValueError(f"{len(units)} units but {len(scores)} scores")
    if not 0 <= k <= len(units):
        raise ValueError(f"K={k} units asked, but there are {len(units)}: choose K from 0 to {len(units)}")
    return [units[i] for i in _order(scores, higher_is_better)[:k]]


def score_units(
    model,
    prompts: Sequence[CalibrationPrompt],
    bases: Sequence[MethodSpec | str],
    units: Sequence[Unit],
    criteria: Sequence[str],
    *,
    chunk_size: int = 512,
    last_queries: int = LAST_QUERIES,
    progress: bool = False,
    native_sliding: str = "override",
    memo: Memo | None = None,
    workers: NllWorkers | None = None,
) -> dict[str, dict]:
    """Every criterion's per-unit scores for each base ``swa:W:S``; mass runs once for all bases.

    ``memo``: finished runs to reuse (NLLs, the mass pass, trained gates and the gates' training
    state after each step), where new ones are kept as they finish (``tuning/memo.py``).
    ``workers``: where the NLL runs go (``nll.mean_nlls``); the mass, retrieval and gates run here.

    ``native_sliding`` is the policy every hybrid will run under (``apply``'s): with ``"keep"`` the
    NLLs and gates leave native sliding layers on their own window. (The mass is measured under full
    attention, where those layers run their own window anyway.)

    Returns:
        ``{str(base): {"nll": [...], "mass": [...], "rank": [...], "nll_base": float}}`` with the
        criteria asked for (``rank`` needs, and brings, both others). Scores are aligned with
        ``units``; higher means more worth keeping full, except ``rank`` (a mean rank: lower).
    """
    bases = [check_base_spec(b) for b in bases]
    unknown = [c for c in criteria if c not in CRITERIA]
    if unknown:
        raise ValueError(f"unknown criterion {unknown[0]!r}: choose from {', '.join(CRITERIA)}")
    need = set(criteria) | ({"nll", "mass"} if "rank" in criteria else set())
    runs = (
        (len(prompts) if "mass" in need else 0)
        + (len(prompts) if "retrieval" in need else 0)
        + (len(bases) * (1 + len(units)) * len(prompts) if "nll" in need else 0)
    )  # the gates' steps are not counted: train_gates shows its own bar
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=runs, desc="calibrating", unit="prompt")
    out: dict[str, dict] = {str(b): {} for b in bases}
    try:
        if "mass" in need:
            masses = _masses(model, prompts, bases, last_queries, chunk_size, bar, memo)
            for b in bases:
                grid = masses[(b.window, b.sinks)]
                out[str(b)]["mass"] = [
                    float(grid[u].mean()) if isinstance(u, int) else float(grid[u[0], u[1]]) for u in units
                ]
        if "retrieval" in need:
            grid = _retrievals(model, prompts, chunk_size, bar, memo)
            scores = [float(grid[u].max()) if isinstance(u, int) else float(grid[u[0], u[1]]) for u in units]
            for b in bases:  # measured under full attention: the same for every base
                out[str(b)]["retrieval"] = scores
        if "nll" in need:
            for b in bases:
                ref, gains = nll_scores(
                    model, b, prompts, units, chunk_size=chunk_size, bar=bar, native_sliding=native_sliding,
                    memo=memo, workers=workers,
                )  # fmt: skip
                out[str(b)]["nll"] = gains
                out[str(b)]["nll_base"] = ref
        if "rank" in need:
            for b in bases:
                out[str(b)]["rank"] = rank_scores({c: out[str(b)][c] for c in ("nll", "mass")})
        if "gates" in need:
            use_method(model, "full")  # the gates mix the frozen model's own full attention with SWA
            sequences = [torch.cat([p.input_ids, p.answer_ids], dim=1) for p in prompts]
            for b in bases:
                trained = _trained_gates(model, sequences, b, native_sliding, memo)
                out[str(b)]["gates"] = trained.scores(units)
                out[str(b)]["gate_losses"] = trained.losses
    finally:
        if bar is not None:
            bar.close()
    return out


def _masses(model, prompts, bases, last_queries: int, chunk_size: int, bar, memo: Memo | None) -> dict:
    """``mass_scores`` for every base's ``(W, S)``, or the grids a ``memo`` kept from the same pass."""
    shapes = [(b.window, b.sinks) for b in bases]
    key = {"kind": "mass", "shapes": [list(s) for s in shapes], "last_queries": last_queries,
           "chunk_size": chunk_size, "prompts": prompts_digest(prompts)}  # fmt: skip

    def run() -> list:
        masses = mass_scores(
            model, prompts, shapes, last_queries=last_queries, chunk_size=chunk_size, bar=bar
        )
        return [masses[shape].tolist() for shape in shapes]

    grids = _kept_pass(memo, key, len(prompts), bar, run)
    return {shape: torch.tensor(grid, dtype=torch.float64) for shape, grid in zip(shapes, grids)}


def _retrievals(model, prompts, chunk_size: int, bar, memo: Memo | None) -> torch.Tensor:
    """``retrieval_scores`` ``[layers, kv_heads]``, or the grid a ``memo`` kept from the same pass."""
    key = {"kind": "retrieval", "chunk_size": chunk_size, "prompts": prompts_digest(prompts)}
    grid = _kept_pass(
        memo,
        key,
        len(prompts),
        bar,
        lambda: retrieval_scores(model, prompts, chunk_size=chunk_size, bar=bar).tolist(),
    )
    return torch.tensor(grid, dtype=torch.float64)


def _kept_pass(memo: Memo | None, key: dict, prompts: int, bar, run):
    """What a ``memo`` kept for one full-attention pass (the bar moved past its ``prompts``), or
    ``run()``'s JSON-ready result, kept with the CPU seconds it took."""
    hit = None if memo is None else memo.get(key)
    if hit is not None:
        if bar is not None:
            bar.update(prompts)
        return hit
    t0 = time.process_time()
    value = run()
    if memo is not None:
        memo.put(key, value, time.process_time() - t0)
    return value


def _trained_gates(model, sequences, base: MethodSpec, native_sliding: str, memo: Memo | None):
    """``train_gates`` on ``base``, or the gates a ``memo`` kept from the same run (they depend on
    the prompts and the base, not on how many heads are then kept). With a memo the training state is
    kept after every step too (``gates-progress``), so a stopped training resumes at its last step."""
    from .gates import GateResult, train_gates

    key = {"kind": "gates", "spec": str(base), "native_sliding": native_sliding, "steps": GATE_STEPS,
           "prompts": prompts_digest(sequences)}  # fmt: skip
    if memo is None:
        return train_gates(model, sequences, base, steps=GATE_STEPS, native_sliding=native_sliding)
    hit = memo.get(key)
    if hit is not None:
        return GateResult(alpha=hit["alpha"], losses=hit["losses"])
    progress_key = {**key, "kind": "gates-progress"}
    resume = memo.get(progress_key)  # the last state kept (a later line wins), CPU so far inside it
    spent = 0.0 if resume is None else float(resume["cpu_s"])
    t0 = time.process_time()

    def keep(state: dict) -> None:
        memo.put(progress_key, {**state, "cpu_s": spent + time.process_time() - t0})

    trained = train_gates(model, sequences, base, steps=GATE_STEPS, native_sliding=native_sliding,
                          resume=resume, on_step=keep)  # fmt: skip
    memo.put(key, {"alpha": trained.alpha, "losses": trained.losses}, spent + time.process_time() - t0)
    return trained


@dataclass
class CalibrationResult:
    """What ``calibrate`` found (written to ``calibrate.json``).

    Attributes:
        units: unit labels (``"11"`` or ``"11.2"``), model order.
        scores: per criterion, one score per unit (``nll``: gain in nats per answer token;
            ``mass``: out-of-window attention mass in [0, 1]; ``rank``: mean rank, 1 is best;
            ``gates``: trained α in [0, 1]; ``retrieval``: attention weight on the needle in [0, 1]).
        nll_base: mean answer NLL under the base spec (when ``nll`` was computed).
        chosen: the K units kept full, best first (greedy: in the order they were added).
        spec: the hybrid spec, canonical.
        select: ``"top"`` (the K best single units) or ``"greedy"`` (re-scored given those kept).
        pool: greedy's candidates, the ``pool`` best single units by nll.
        steps: greedy's steps: the unit added, the NLL with the units so far, every NLL tried.
    """

    model: str
    base: str
    by: str
    criterion: str
    k: int
    samples: int
    length: int
    seed: int
    last_queries: int
    chunk_size: int
    units: list[str]
    scores: dict[str, list[float]]
    chosen: list[str]
    spec: str
    nll_base: float | None = None
    prompt_tokens: list[int] = field(default_factory=list)
    seconds: float = 0.0
    select: str = "top"
    pool: int | None = None
    steps: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # The trained gates' loss per step (criterion "gates"): distillation and the mean α.
    gate_losses: list[dict] = field(default_factory=list)
    # With several sink counts asked: each one's hybrid and its answer NLL (the lowest was kept).
    sinks_tried: list[dict] = field(default_factory=list)
    # The policy the hybrid runs under (apply's native_sliding): "keep" chose among global layers only.
    native_sliding: str = "override"

    def to_json(self) -> dict:
        return asdict(self)

    def top(self, criterion: str, k: int | None = None) -> list[str]:
        """The ``k`` (default: ``self.k``) best units by one criterion."""
        scores = self.scores[criterion]
        order = _order(scores, higher_is_better=criterion != "rank")
        return [self.units[i] for i in order[: self.k if k is None else k]]

    def table(self) -> str:
        """One line per unit: each criterion's score, and ``*`` on the chosen ones."""
        names = list(self.scores)
        head = f"{'unit':>6} " + " ".join(f"{c:>10}" for c in names) + "  kept"
        lines = [head]
        chosen = set(self.chosen)
        for i, u in enumerate(self.units):
            cells = " ".join(f"{self.scores[c][i]:>10.4f}" for c in names)
            lines.append(f"{u:>6} {cells}  {'*' if u in chosen else ''}")
        return "\n".join(lines)


def native_local_warnings(config, chosen: Sequence[Unit], length: int) -> list[str]:
    """What to say when kept units are local layers of a model with native sliding layers.

    Keeping such a layer "full" makes a layer trained on a short window (Gemma 3: 512 tokens, with
    its own RoPE base) attend over the whole context, at distances it never saw in training, and
    the answer NLL on short calibration prompts need not show it: on gemma3-270m the greedy choice
    on 2K prompts kept local layers 1 and 13, and that hybrid scored 0 on all 90 held-out S-NIAH
    samples at 4K (so did every swa:256:4 variant there that shrank the local windows:
    ``patch.shrunk_local_windows``). One line per calibration, naming the layers.
    """
    cfg = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    types = getattr(cfg, "layer_types", None)
    native = getattr(cfg, "sliding_window", None)
    if not types or not native:
        return []
    layers = {u if isinstance(u, int) else u[0] for u in chosen}
    local = sorted(i for i in layers if types[i] == "sliding_attention")
    if not local:
        return []
    names = ", ".join(str(i) for i in local)
    return [
        f"layer{'s' if len(local) > 1 else ''} {names} kept full {'are' if len(local) > 1 else 'is a'} "
        f"native sliding layer{'s' if len(local) > 1 else ''} (trained on a {native}-token window): made global, "
        f"{'they see' if len(local) > 1 else 'it sees'} distances never seen in training, which {length}-token "
        "calibration prompts may not reveal; calibrate at your evaluation context (--length) and check the "
        "spec on held-out samples"
    ]


def calibrate(
    model,
    tokenizer,
    method: MethodSpec | str,
    k: int,
    *,
    by: str = "layer",
    criterion: str = "nll",
    samples: int = 4,
    length: int = 2048,
    seed: int = CAL_SEED,
    chunk_size: int = 512,
    last_queries: int = LAST_QUERIES,
    progress: bool = True,
    name: str | None = None,
    select: str = "top",
    pool: int | None = None,
    sinks: Sequence[int] | None = None,
    native_sliding: str = "override",
    memo: Memo | None = None,
    workers: NllWorkers | None = None,
) -> CalibrationResult:
    """Score every unit on calibration prompts and keep the ``k`` best full on top of ``method``.

    Args:
        method: the plain ``swa:W:S`` to build on.
        k: units to keep full, 0 .. number of units.
        by: ``"layer"`` or ``"head"`` (KV heads).
        criterion: ``"nll"``, ``"mass"``, ``"rank"`` (both, ranks averaged), ``"gates"`` (one gate
            per KV head trained on the frozen model, DuoAttention's way: ``tuning/gates.py``) or
            ``"retrieval"`` (attention on the needle while answering: ``tuning/retrieval.py``).
        samples / length: calibration S-NIAH prompts and their token budget (answer included).
        seed: the prompts' seed; one of ``EVAL_SEEDS`` is refused.
        last_queries: query positions the mass averages over (the prompt's end).
        name: the model's name for the record (default: ``config.name_or_path``).
        select: ``"top"`` keeps the K best single units; ``"greedy"`` (nll only) re-scores the
            ``pool`` best single units given the ones already kept (:func:`greedy_select`).
        pool: greedy's candidates (default: K + 6, at most every unit).
        sinks: sink counts S to try for the streaming side instead of the method's own (DuoAttention's
            streaming heads keep 64): each gives the base ``swa:W:S`` at the same KV bytes, since the
            sinks are among the W slots. Units are chosen on each base, and the hybrid whose answer
            NLL on the calibration prompts is lowest is kept (``sinks_tried`` records every one).
        native_sliding: the policy the hybrid will run under (``apply``'s). ``"keep"`` (Gemma 3 as
            its local layers were trained) leaves native sliding layers on their own window and
            scores only the global layers' units; apply the result with the same policy.
        memo: finished runs (answer NLLs, the mass pass, trained gates and their state after each
            step) to reuse and to keep as they finish (``tuning/memo.py``): with one on disk a
            stopped calibration resumes at the run (or gate step) it was in, and calibrations on the
            same prompts share their runs. The result is the same.
        workers: where the answer-NLL runs go (``nll.NllWorkers``: local worker processes or Ray
            tasks, each with its own model copy); ``None``: this process. The result is the same.

    Returns:
        A :class:`CalibrationResult`; the model is left in full attention.

    Raises:
        ValueError: not a plain swa spec, K out of range, an evaluation seed, or prompts that fit
            inside the window (where full attention changes nothing).
    """
    base, units, pool = _check_calibration(
        model, method, k, by, criterion, seed, length, select, pool, native_sliding
    )
    bases = _sink_bases(base, sinks)
    t0 = time.perf_counter()
    prompts = calibration_prompts(tokenizer, samples, length, seed)
    # The mass is one full-attention pass, so it is always reported beside the criterion that decides.
    criteria = [criterion] if criterion in ("mass", "rank") else [criterion, "mass"]
    all_scores = score_units(
        model, prompts, bases, units, criteria, chunk_size=chunk_size, last_queries=last_queries,
        progress=progress, native_sliding=native_sliding, memo=memo, workers=workers,
    )  # fmt: skip
    tried = [
        _choose_on_base(model, b, units, all_scores[str(b)], criterion, select, prompts, k, pool, chunk_size,
                        progress, native_sliding, memo, workers)
        for b in bases
    ]  # fmt: skip
    best = _best_sinks(model, tried, prompts, chunk_size, native_sliding, memo, workers)
    base, chosen, spec, scores, steps = (best[key] for key in ("base", "chosen", "spec", "scores", "steps"))
    warnings = native_local_warnings(model.config, chosen, length)
    for w in warnings:
        logger.warning(w)
    return CalibrationResult(
        model=name or str(getattr(model.config, "name_or_path", "") or type(model).__name__),
        base=str(base),
        by=by,
        criterion=criterion,
        k=k,
        samples=samples,
        length=length,
        seed=seed,
        last_queries=last_queries,
        chunk_size=chunk_size,
        units=[unit_label(u) for u in units],
        scores={c: [float(v) for v in scores[c]] for c in CRITERIA if c in scores},
        chosen=[unit_label(u) for u in chosen],
        spec=str(spec),
        nll_base=scores.get("nll_base"),
        prompt_tokens=[p.n_tokens for p in prompts],
        seconds=round(time.perf_counter() - t0, 2),
        select=select,
        pool=pool,
        steps=steps,
        warnings=warnings,
        gate_losses=scores.get("gate_losses", []),
        sinks_tried=[{"sinks": t["sinks"], "spec": str(t["spec"]), "nll": t.get("nll")} for t in tried]
        if len(tried) > 1
        else [],
        native_sliding=native_sliding,
    )


def _choose_on_base(model, base, units, scores, criterion, select, prompts, k, pool, chunk_size, progress,
                    native_sliding, memo, workers=None) -> dict:  # fmt: skip
    """The K units kept full on one streaming base ``swa:W:S``: top-K by ``criterion``, or greedy."""
    steps: list[dict] = []
    if select == "greedy":
        chosen, steps = _greedy(
            model, base, units, scores, prompts, k, pool, chunk_size, progress, native_sliding, memo, workers
        )
    else:
        chosen = select_units(units, scores[criterion], k, higher_is_better=criterion != "rank")
    spec = spec_with_units(base, chosen, kv_geometry(model.config)[2])
    return {
        "sinks": base.sinks,
        "base": base,
        "spec": spec,
        "chosen": chosen,
        "scores": scores,
        "steps": steps,
    }


def _best_sinks(model, tried: list[dict], prompts, chunk_size: int, native_sliding: str, memo=None,
                workers=None) -> dict:  # fmt: skip
    """Of hybrids built on several sink counts, the one with the lowest answer NLL on the calibration
    prompts (each gets ``"nll"``); ties go to the earlier (fewer) sinks. One hybrid: itself."""
    if len(tried) == 1:
        return tried[0]
    try:
        nlls = mean_nlls(
            model, [t["spec"] for t in tried], prompts, chunk_size, None, native_sliding, memo, workers
        )
        for t, nll in zip(tried, nlls):
            t["nll"] = nll
    finally:
        use_method(model, "full")
    return min(tried, key=lambda t: t["nll"])


def _sink_bases(base: MethodSpec, sinks: Sequence[int] | None) -> list[MethodSpec]:
    """``swa:W:S`` for each S of ``sinks`` (once each, in increasing order), or ``[base]``."""
    if not sinks:
        return [base]
    out = []
    for s in sorted(set(sinks)):
        if not 0 <= s < base.window:
            raise ValueError(
                f"--sinks {s} must be from 0 to W-1 = {base.window - 1} (the sinks are among the W slots)"
            )
        out.append(parse_spec(f"swa:{base.window}:{s}"))
    return out


def _check_calibration(model, method, k, by, criterion, seed, length, select, pool, native_sliding):
    """``(base spec, units, greedy's pool)``, after refusing what no calibration can run, each with the fix."""
    base = check_base_spec(method)
    if criterion not in CRITERIA:
        raise ValueError(f"unknown criterion {criterion!r}: choose from {', '.join(CRITERIA)}")
    check_calibration_seed(seed)
    if native_sliding not in ("override", "keep"):
        raise ValueError(f"native_sliding must be 'override' or 'keep', got {native_sliding!r}")
    units = model_units(model.config, by, native_sliding)
    if not units:
        raise ValueError(
            "every layer slides natively, so under native_sliding='keep' there is no unit to keep full: "
            "use native_sliding='override'"
        )
    if not 0 <= k <= len(units):
        what = "layers" if by == "layer" else "KV heads"
        raise ValueError(f"K={k} is more than the model's {len(units)} {what}: give K from 1 to {len(units)}")
    if length <= base.window:
        raise ValueError(
            f"calibration prompts of {length} tokens fit inside the window W={base.window}, where full "
            f"attention changes nothing: use a --length above {base.window}"
        )
    if select not in SELECTIONS:
        raise ValueError(f"unknown selection {select!r}: choose from {', '.join(SELECTIONS)}")
    if select == "greedy":
        if criterion != "nll":
            raise ValueError(
                f"greedy selection re-scores by the answer's NLL: use --criterion nll, not {criterion}"
            )
        pool = min(len(units), k + 6) if pool is None else pool
        if not k <= pool <= len(units):
            raise ValueError(f"--pool {pool} must be from K={k} to the model's {len(units)} units")
    elif pool is not None:
        raise ValueError("--pool sets greedy selection's candidates: add --select greedy, or drop --pool")
    return base, units, pool


def _greedy(model, base, units, scores, prompts, k, pool, chunk_size, progress, native_sliding, memo=None,
            workers=None):  # fmt: skip
    """``(chosen units, steps)`` of greedy selection over the ``pool`` best single units by NLL."""
    candidates = select_units(units, scores["nll"], pool)
    ref = scores["nll_base"]
    first = {u: ref - scores["nll"][units.index(u)] for u in candidates}
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=greedy_runs(pool, k) * len(prompts), desc="greedy", unit="prompt")
    try:
        return greedy_select(
            candidates, k,
            lambda kepts: mean_nlls(
                model, [spec_with_units(base, kept) for kept in kepts], prompts, chunk_size, bar, native_sliding,
                memo, workers,
            ),
            first=first,
        )  # fmt: skip
    finally:
        use_method(model, "full")
        if bar is not None:
            bar.close()


_LABELS = {
    "nll": "NLL gain (nats / answer token)",
    "mass": "mass outside the window",
    "rank": "mean rank (1 = kept first)",
    "gates": "trained gate α (1 = full attention)",
    "retrieval": "attention on the needle while answering",
}


def plot_scores(result: CalibrationResult, path: str | Path) -> Path:
    """Per-unit scores: bars per layer, or a layer x KV-head heatmap; chosen units highlighted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    criteria = list(result.scores)
    chosen = set(result.chosen)
    rows = len(criteria) + bool(result.steps)
    fig, axes = plt.subplots(
        rows, 1, figsize=(max(6.0, 0.28 * len(result.units) + 2), 2.6 * rows), squeeze=False
    )
    units = [parse_unit(u) for u in result.units]
    for ax, c in zip(axes[:, 0], criteria):
        values = result.scores[c]
        if result.by == "layer":
            colors = ["tab:red" if u in chosen else "tab:gray" for u in result.units]
            ax.bar(range(len(values)), values, color=colors)
            ax.set_xticks(range(len(values)), result.units, fontsize=7)
            ax.set_xlabel("layer")
        else:
            layers = max(u[0] for u in units) + 1
            heads = max(u[1] for u in units) + 1
            grid = torch.full((heads, layers), float("nan"))
            for u, v in zip(units, values):
                grid[u[1], u[0]] = v
            im = ax.imshow(grid.numpy(), aspect="auto", cmap="viridis_r" if c == "rank" else "viridis")
            fig.colorbar(im, ax=ax, fraction=0.03)
            for label in chosen:
                layer, h = parse_unit(label)
                ax.add_patch(plt.Rectangle((layer - 0.5, h - 0.5), 1, 1, fill=False, ec="red", lw=2))
            ax.set_xlabel("layer")
            ax.set_ylabel("KV head")
            ax.set_xticks(range(layers))
            ax.set_yticks(range(heads))
        ax.set_title(_LABELS.get(c, c) + (" (chosen: red)" if c == criteria[0] else ""), fontsize=9)
    if result.steps:
        ax = axes[-1, 0]
        xs = list(range(len(result.steps) + 1))
        nlls = [result.nll_base, *(s["nll"] for s in result.steps)]
        ax.plot(xs, nlls, "o-", color="tab:red", label="greedy")
        ax.set_xticks(xs, ["base"] + [f"+{s['added']}" for s in result.steps], fontsize=7)
        ax.set_ylabel("answer NLL (nats)")
        ax.set_title(f"greedy selection over the {result.pool} best single units", fontsize=9)
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{result.model}: {result.spec}\n{result.criterion} criterion, {result.select}, K={result.k}, "
        f"n={result.samples} prompts x {result.length} tokens, seed {result.seed}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def provenance() -> dict:
    """What produced a calibrate/tune output: the command line and the library versions."""
    import shlex

    from ..runs.provenance import library_versions

    return {"command": shlex.join(["sinkwindow", *sys.argv[1:]]), "versions": library_versions()}


def write_calibration(result: CalibrationResult, out_dir: str | Path, *, plot: bool = True) -> dict[str, str]:
    """``calibrate.json`` (and ``calibrate.png``) in ``out_dir``; returns their paths.

    A folder's earlier calibration is never overwritten: its files move to ``previous-<UTC time>/``
    first (``runs.folder.move_aside``), so a re-run with other settings keeps both.
    """
    import json

    from ..runs.folder import move_aside

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    move_aside(out, ["calibrate.json", "calibrate.png"])
    paths = {"json": str(out / "calibrate.json")}
    data = {**result.to_json(), "provenance": provenance()}
    (out / "calibrate.json").write_text(json.dumps(data, indent=1) + "\n")
    if plot:
        try:
            paths["png"] = str(plot_scores(result, out / "calibrate.png"))
        except ImportError as err:  # matplotlib is an optional extra; the JSON has every number
            logger.warning("no plot: %s (pip install 'sinkwindow[eval]')", err)
    return paths

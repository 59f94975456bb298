"""Search SWA(W, S) + K full units under a KV-memory budget, and check the winner on held-out samples.

At one context n and a budget of B bytes (``memory.analytic_state_bytes`` in the model's
dtype, so the budget is enforced exactly):

1. every window W of a grid (powers of two below n) and sink count S gives a base ``swa:W:S``; the
   bases that fit B are kept, each with the most full units K_max the budget leaves it;
2. the units are scored once per base (``calibrate.score_units``; the default ``mass`` criterion
   scores every base in one full-attention pass) and the top K kept, K = 0 .. K_max;
3. every candidate is measured on calibration samples (seed :data:`~.calibrate.CAL_SEED`), and the
   Pareto frontier (fewer KV bytes, higher score) is marked;
4. the best candidate, full attention and the winner's base ``swa:W:S`` are measured again on
   held-out samples (seed :data:`HELDOUT_SEED`), so the reported number is not the one selected on.

Seeds: calibration and held-out seeds must differ and both lie outside ``EVAL_SEEDS`` (what
``sinkwindow eval`` uses), so tuning on the test set is impossible by construction; both are
recorded. Perplexity has no seed (its essay windows are fixed): its held-out windows are the last
ones of the essay stream, its calibration windows the ones before, and both stay clear of the first
:data:`EVAL_PPL_WINDOWS`, which ``sinkwindow eval ppl`` reads.

Scores: the eval runner's own, through ``tuning/measure.py`` (its sample building, batched greedy
decoding and string matching; ``ppl`` on essay windows).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from ..runtime.kv_bytes import analytic_state_bytes, kv_geometry
from ..runtime.method import use_method
from ..runtime.spec import MethodSpec, parse_spec
from .criteria import CRITERIA, LAST_QUERIES, ScoringRun, check_criterion, score_units
from .measure import Measurement, SampleSet, family_tasks, measure_all, ppl_splits
from .options import RunOptions
from .prompts import CAL_SEED, EVAL_SEEDS, calibration_prompts, check_calibration_seed
from .records import fresh_folder, provenance, write_json
from .selection import select_units
from .units import model_units, spec_with_units, unit_label

__all__ = [
    "HELDOUT_SEED",
    "Candidate",
    "TuneResult",
    "format_bytes",
    "pareto_front",
    "plan_candidates",
    "plot_frontier",
    "tune",
    "TuneConfig",
    "window_grid",
    "write_tune",
]

logger = logging.getLogger(__name__)

# Seed of the held-out samples the winner is reported on: not CAL_SEED, outside EVAL_SEEDS.
HELDOUT_SEED = 8_000_000
MIN_WINDOW = 64
MAX_WINDOW = 4096


def format_bytes(n: float) -> str:
    """``25165824`` -> ``"24.00 MiB"``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def window_grid(context: int, lo: int = MIN_WINDOW, hi: int = MAX_WINDOW) -> list[int]:
    """Powers of two from ``lo`` to ``hi`` below ``context`` (a window as long as the context is full)."""
    if context <= 0:
        raise ValueError(f"context must be a positive number of tokens, got {context}")
    out, w = [], 1
    while w <= hi:
        if w >= lo and w < context:
            out.append(w)
        w *= 2
    return out


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """Which ``(kv_bytes, score)`` points no other point dominates (no more bytes, no lower score,
    and better in one). Equal points are all on the front."""
    out = []
    for i, (b, s) in enumerate(points):
        dominated = any(
            (b2 <= b and s2 >= s) and (b2 < b or s2 > s) for j, (b2, s2) in enumerate(points) if j != i
        )
        out.append(not dominated)
    return out


def plan_candidates(
    config,
    context: int,
    budget: int,
    *,
    dtype: torch.dtype = torch.float32,
    windows: Sequence[int] | None = None,
    sinks: Sequence[int] = (4,),
    by: str = "layer",
    max_k: int | None = None,
) -> list[tuple[MethodSpec, int]]:
    """The bases ``swa:W:S`` within ``budget`` at ``context``, each with the most full units it affords.

    Every layer of a decoder has the same KV geometry, so K units cost the same whichever they are;
    ``tune`` still prices each final spec exactly.

    Returns:
        ``[(base, k_max)]`` in (W, S) order.

    Raises:
        ValueError: when not even the cheapest base fits the budget (naming what would).
    """
    windows = list(windows) if windows is not None else window_grid(context)
    if not [w for w in windows if w < context]:
        raise ValueError(
            f"no window below the context of {context} tokens: give --windows smaller than {context}"
        )
    units = model_units(config, by)
    cap = len(units) if max_k is None else min(max_k, len(units))
    out, cheapest = [], None
    for w in sorted(windows):
        for s in sorted(set(sinks)):
            if s >= w or w >= context:  # a window as long as the context is full attention
                continue
            base = MethodSpec("swa", window=w, sinks=s)
            cost = analytic_state_bytes(base, config, context, dtype=dtype)
            if cheapest is None or cost < cheapest[1]:
                cheapest = (base, cost)
            if cost > budget:
                continue
            k = 0
            while k < cap and (
                analytic_state_bytes(spec_with_units(base, units[: k + 1]), config, context, dtype=dtype)
                <= budget
            ):
                k += 1
            out.append((base, k))
    if not out:
        if cheapest is None:
            raise ValueError(
                f"no candidate: every sink count in {list(sinks)} is >= every window in {windows}"
            )
        spec, cost = cheapest
        raise ValueError(
            f"--kv-budget {format_bytes(budget)} is below the cheapest candidate, {spec} at {context} tokens "
            f"({format_bytes(cost)}): raise --kv-budget to at least {cost} (bytes), or give smaller --windows"
        )
    return out


@dataclass
class Candidate:
    """One point of the search: a spec, its exact KV bytes at the context, its calibration score."""

    spec: str
    window: int | None
    sinks: int | None
    k: int
    units: list[str]
    kv_bytes: int
    in_budget: bool = True
    score: float | None = None
    lo: float | None = None
    hi: float | None = None
    n: int = 0
    on_frontier: bool = False
    seconds: float = 0.0


@dataclass
class TuneResult:
    """What ``tune`` found (``tune.json``; ``frontier.json`` holds ``candidates``).

    Attributes:
        best: the best candidate within the budget on calibration samples.
        calibration / heldout: measurements of the best spec, full attention and the best's base
            ``swa:W:S``, on the calibration and on the held-out samples.
        seeds: the calibration and held-out seeds (and the evaluation seeds both avoid).
        unit_scores: per base, the units and their criterion scores.
    """

    model: str
    task: str
    tasks: list[str]
    context: int
    kv_budget_bytes: int
    dtype: str
    best: str
    candidates: list[Candidate]
    calibration: dict[str, Measurement]
    heldout: dict[str, Measurement]
    seeds: dict
    settings: dict
    unit_scores: dict[str, dict]
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        unit = "neg NLL" if self.task == "ppl" else "accuracy"
        lines = [
            f"tune {self.model} at {self.context} tokens, KV budget {format_bytes(self.kv_budget_bytes)} "
            f"({self.dtype}), task {self.task}: {len(self.candidates)} candidates, "
            f"{sum(c.on_frontier for c in self.candidates)} on the frontier",
            f"best: {self.best}",
            f"{'spec':<40} {'KV':>11} {'calibration ' + unit:>28} {'held-out ' + unit:>28}",
        ]
        by_spec = {c.spec: c for c in self.candidates}
        for spec, cal in self.calibration.items():
            held = self.heldout.get(spec)
            kv = by_spec[spec].kv_bytes if spec in by_spec else None
            kv_text = format_bytes(kv) if kv is not None else "-"
            lines.append(f"{spec:<40} {kv_text:>11} {_interval_text(cal):>28} {_interval_text(held):>28}")
        return "\n".join(lines)


def _interval_text(m: Measurement | None) -> str:
    if m is None:
        return "-"
    return f"{m.score:.3f} [{m.lo:.3f}, {m.hi:.3f}] n={m.n}"


def check_seeds(seed: int, heldout_seed: int) -> None:
    check_calibration_seed(seed, "calibration seed")
    check_calibration_seed(heldout_seed, "held-out seed")
    if seed == heldout_seed:
        raise ValueError(
            f"the calibration and held-out seeds are both {seed}: the held-out samples must differ from "
            f"the ones the search selects on; use e.g. --heldout-seed {HELDOUT_SEED if seed != HELDOUT_SEED else seed + 1}"
        )


@dataclass(frozen=True)
class TuneConfig:
    """The search :func:`tune` runs (what ``sinkwindow tune``'s flags set).

    Attributes:
        windows: the W grid (default: :func:`window_grid`, powers of two from 64 below the context).
        sinks: the S values (``(0, 4)`` widens the search; default 4 only).
        by: full units are ``"layer"`` or ``"head"`` (KV heads).
        criterion: how units are ranked (``calibrate``; ``gates`` too): ``mass`` (one pass for every
            base), ``nll`` or ``rank`` (one run per unit and base; slow).
        max_k: at most this many full units (default: whatever the budget allows).
        samples / heldout_samples: per task, on the calibration / held-out seed (ppl: windows).
        calib_samples / calib_length: the S-NIAH prompts that score the units (default length: the
            context).
        seed / heldout_seed: of the calibration and held-out samples (neither an evaluation seed).
        batch_size: samples decoded as one batch (default: the eval runner's).
        last_queries: query positions the ``mass`` criterion averages over.
    """

    windows: Sequence[int] | None = None
    sinks: Sequence[int] = (4,)
    by: str = "layer"
    criterion: str = "mass"
    max_k: int | None = None
    samples: int = 2
    heldout_samples: int = 3
    calib_samples: int = 4
    calib_length: int | None = None
    seed: int = CAL_SEED
    heldout_seed: int = HELDOUT_SEED
    chunk_size: int = 512
    batch_size: int | None = None
    last_queries: int = LAST_QUERIES


def tune(
    model,
    tokenizer,
    kv_budget_bytes: int,
    context: int,
    task: str = "niah",
    config: TuneConfig | None = None,
    *,
    out: str | Path | None = None,
    **options,
) -> TuneResult:
    """Find the best ``swa:W:S[+full:...]`` within ``kv_budget_bytes`` at ``context`` tokens.

    Every candidate (a base ``swa:W:S`` whose cache fits, plus the K best full units the budget
    leaves room for, for each K) is scored on calibration samples; the best, full attention and the
    best's base are then measured on held-out samples of another seed.

    Args:
        task: ``"niah"`` (S-NIAH-1/2/3 average), ``"babilong"`` (QA1-5), ``"ppl"``, or one runner task.
        config: the search (:class:`TuneConfig`; default: its defaults).
        out: also write ``frontier.json``, ``frontier.png`` and ``tune.json`` there.
        options: ``name`` (the model's, for the record) and ``progress`` (:class:`~.options.RunOptions`).

    Returns:
        A :class:`TuneResult`; the model is left in full attention.

    Raises:
        ValueError: a bad context, task, criterion or seed, or a budget no candidate fits.
    """
    t0 = time.perf_counter()
    cfg = config or TuneConfig()
    tasks = _check_tune(kv_budget_bytes, context, task, cfg)
    opts = RunOptions(**options).refuse_unused("tune", ("name", "progress"))
    progress = opts.progress
    name = opts.name or str(getattr(model.config, "name_or_path", "") or type(model).__name__)
    plan = plan_candidates(
        model.config, context, kv_budget_bytes, dtype=model.dtype, windows=cfg.windows, sinks=cfg.sinks,
        by=cfg.by, max_k=cfg.max_k,
    )  # fmt: skip
    ppl_windows = (
        ppl_splits(tokenizer, context, cfg.samples, cfg.heldout_samples) if tasks == ("ppl",) else None
    )
    candidates, unit_scores = _candidates(model, tokenizer, plan, context, kv_budget_bytes, cfg, progress)
    calib_set = SampleSet(task, context, cfg.samples, None if ppl_windows else cfg.seed,
                          ppl_windows[0] if ppl_windows else None, cfg.chunk_size, cfg.batch_size, name)  # fmt: skip
    heldout_set = replace(calib_set, samples=cfg.heldout_samples, seed=None if ppl_windows else cfg.heldout_seed,
                          windows=ppl_windows[1] if ppl_windows else None)  # fmt: skip
    try:
        calibration = measure_all(model, tokenizer, [c.spec for c in candidates], calib_set, progress)
        best = _choose(candidates, calibration)
        base_of_best = str(parse_spec(best.spec).base) if best.spec != "full" else None
        reported = list(dict.fromkeys([best.spec, "full", *([base_of_best] if base_of_best else [])]))
        heldout = measure_all(model, tokenizer, reported, heldout_set)
    finally:
        use_method(model, "full")  # whatever happened, the caller's model runs full attention again
    if ppl_windows:
        assert not set(ppl_windows[0]) & set(ppl_windows[1]), "calibration and held-out windows overlap"
    result = TuneResult(
        model=name,
        task=task,
        tasks=list(tasks),
        context=context,
        kv_budget_bytes=int(kv_budget_bytes),
        dtype=str(model.dtype).removeprefix("torch."),
        best=best.spec,
        candidates=candidates,
        calibration={s: calibration[s] for s in reported},
        heldout=heldout,
        seeds={
            "calibration": None if ppl_windows else cfg.seed,
            "heldout": None if ppl_windows else cfg.heldout_seed,
            "unit_calibration": cfg.seed,
            "evaluation_seeds_avoided": [EVAL_SEEDS.start, EVAL_SEEDS.stop - 1],
            "ppl_windows": {"calibration": ppl_windows[0], "heldout": ppl_windows[1]}
            if ppl_windows
            else None,
        },
        settings=_tune_settings(cfg, plan, context),
        unit_scores={
            b: {"units": [unit_label(u) for u in model_units(model.config, cfg.by)], **dict(s)}
            for b, s in unit_scores.items()
        },
        seconds=round(time.perf_counter() - t0, 1),
    )
    if out is not None:
        write_tune(result, out)
    return result


def _check_tune(kv_budget_bytes: int, context: int, task: str, cfg: TuneConfig) -> tuple[str, ...]:
    """The tasks of ``task``, after refusing what no search can run, each with the fix."""
    if context <= 0:
        raise ValueError(f"context must be a positive number of tokens, got {context}: e.g. --context 4096")
    if kv_budget_bytes <= 0:
        raise ValueError(
            f"the KV budget must be positive, got {kv_budget_bytes} bytes: e.g. --kv-budget 24MiB"
        )
    check_criterion(cfg.criterion)
    tasks = family_tasks(task)
    check_seeds(cfg.seed, cfg.heldout_seed)
    return tasks


def _candidates(model, tokenizer, plan, context: int, budget: int, cfg: TuneConfig, progress: bool):
    """``(candidates, unit scores)``: every base with 0..K of its best units kept full, within the
    budget, then full attention (measured for reference even over the budget, when it is no candidate).

    Units are scored once per base; bases the budget gives no full unit need none.
    """
    config, dtype = model.config, model.dtype
    kv_heads = kv_geometry(config)[2]
    units = model_units(config, cfg.by)
    scored = [base for base, k in plan if k > 0]
    unit_scores: dict[str, dict] = {}
    if scored:
        prompts = calibration_prompts(tokenizer, cfg.calib_samples, cfg.calib_length or context, cfg.seed)
        run = ScoringRun(model, prompts, scored, units, cfg.chunk_size, cfg.last_queries)
        unit_scores = score_units(run, [cfg.criterion], progress=progress)
    candidates: list[Candidate] = []
    for base, k_max in plan:
        scores = unit_scores[str(base)][cfg.criterion] if k_max else None
        higher = CRITERIA[cfg.criterion].higher_is_better
        ranked = select_units(units, scores, k_max, higher_is_better=higher) if k_max else []
        for k in range(k_max + 1):
            spec = spec_with_units(base, ranked[:k], kv_heads)
            cost = analytic_state_bytes(spec, config, context, dtype=dtype)
            if cost > budget:  # cannot happen for uniform layers; kept as the exact check
                break
            candidates.append(
                Candidate(str(spec), base.window, base.sinks, k, [unit_label(u) for u in ranked[:k]], cost)
            )
    full_cost = analytic_state_bytes(MethodSpec("full"), config, context, dtype=dtype)
    candidates.append(Candidate("full", None, None, len(units), [], full_cost, in_budget=full_cost <= budget))
    return candidates, unit_scores


def _choose(candidates: list[Candidate], calibration: dict) -> Candidate:
    """Fill in each candidate's calibration score, mark the Pareto front, and return the best within
    the budget (highest score; ties: fewer bytes, then the earlier candidate)."""
    for c in candidates:
        m = calibration[c.spec]
        c.score, c.lo, c.hi, c.n, c.seconds = m.score, m.lo, m.hi, m.n, m.seconds
    inside = [c for c in candidates if c.in_budget]
    for c, on in zip(inside, pareto_front([(c.kv_bytes, c.score) for c in inside])):
        c.on_frontier = on
    order = {id(c): i for i, c in enumerate(inside)}
    return max(inside, key=lambda c: (c.score, -c.kv_bytes, -order[id(c)]))


def _tune_settings(cfg: TuneConfig, plan, context: int) -> dict:
    """What ``tune.json`` records of the search."""
    return {
        "windows": sorted({b.window for b, _ in plan}),
        "windows_asked": list(cfg.windows) if cfg.windows is not None else window_grid(context),
        "sinks": sorted(set(cfg.sinks)),
        "by": cfg.by,
        "criterion": cfg.criterion,
        "max_k": cfg.max_k,
        "samples": cfg.samples,
        "heldout_samples": cfg.heldout_samples,
        "calib_samples": cfg.calib_samples,
        "calib_length": cfg.calib_length or context,
        "chunk_size": cfg.chunk_size,
        "batch_size": cfg.batch_size,
        "last_queries": cfg.last_queries,
        "niah_max_new_tokens": "auto (answer tokens + 16)",
        "babilong_facts": "generated",
    }


def plot_frontier(result: TuneResult, path: str | Path) -> Path:
    """KV bytes (MiB, log scale) against the calibration score; frontier joined, best starred."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    mib = 2**20
    for c in result.candidates:
        colour = "tab:red" if c.on_frontier else ("tab:gray" if c.in_budget else "black")
        marker = "s" if c.spec == "full" else "o"
        # Clamped: an interval may end a rounding error inside its estimate (matplotlib refuses < 0).
        err = [[max(0.0, c.score - c.lo)], [max(0.0, c.hi - c.score)]]
        ax.errorbar(c.kv_bytes / mib, c.score, yerr=err, fmt=marker, color=colour, ms=5, capsize=2, alpha=0.8)
        if c.on_frontier or c.spec == "full":
            ax.annotate(
                c.spec, (c.kv_bytes / mib, c.score), fontsize=6, xytext=(3, 3), textcoords="offset points"
            )
    front = sorted((c.kv_bytes / mib, c.score) for c in result.candidates if c.on_frontier)
    if front:
        ax.plot(*zip(*front), color="tab:red", lw=1, alpha=0.6)
    best = next(c for c in result.candidates if c.spec == result.best)
    ax.plot(
        best.kv_bytes / mib, best.score, "*", color="gold", ms=14, mec="black", label=f"best: {best.spec}"
    )
    ax.axvline(result.kv_budget_bytes / mib, color="tab:blue", ls="--", lw=1, label="budget")
    ax.set_xscale("log")
    ax.set_xlabel(f"KV bytes at {result.context} tokens (MiB, {result.dtype})")
    ax.set_ylabel(
        "negative NLL per token" if result.task == "ppl" else f"{result.task} accuracy (calibration)"
    )
    n = result.candidates[0].n if result.candidates else 0
    ax.set_title(
        f"{result.model}: budget {format_bytes(result.kv_budget_bytes)}, n={n} per candidate", fontsize=9
    )
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_tune(result: TuneResult, out_dir: str | Path, *, plot: bool = True) -> dict[str, str]:
    """``frontier.json``, ``frontier.png`` and ``tune.json`` in ``out_dir``; returns their paths.

    A folder's earlier results are never overwritten: they move to ``previous-<UTC time>/`` first.
    """
    out = fresh_folder(out_dir, ["frontier.json", "frontier.png", "tune.json"])
    data = {**result.to_json(), "provenance": provenance()}
    frontier = {
        k: data[k] for k in ("model", "task", "tasks", "context", "kv_budget_bytes", "dtype", "best", "seeds")
    }
    frontier["candidates"] = data["candidates"]
    frontier["provenance"] = data["provenance"]
    paths = {
        "frontier": write_json(out / "frontier.json", frontier),
        "tune": write_json(out / "tune.json", data),
    }
    if plot:
        try:
            paths["png"] = str(plot_frontier(result, out / "frontier.png"))
        except ImportError as err:  # matplotlib is an optional extra; the JSON has every number
            logger.warning("no plot: %s (pip install 'sinkwindow[eval]')", err)
    return paths

"""One KV-budget frontier: at each budget (a fraction of full attention's KV bytes at the context),
the best spec each way of choosing one reaches, measured held out against full attention.

The strategies (:data:`STRATEGIES`; a point's ``selection`` and the ``--selections`` flag name one),
each at the budget and with its best sink count S among ``sinks``:

- ``swa``: plain SWA(W, S) at the largest W that fits; S by the calibration answer NLL.
- ``heads-retrieval``: as many KV heads full as fit, those whose attention under full attention
  falls most on the needle while the answer is written (retrieval heads; one pass, no training).
- ``heads-nll``: as many KV heads full as fit, the best single heads by NLL gain.
- ``heads-gates``: as many KV heads full as fit, by DuoAttention's trained gates.
- ``layers``: SWA(``stream_window``, S) with as many whole layers full as fit, chosen greedily by
  the answer NLL (``calibrate --full-layers K --criterion nll --select greedy``) from one pool of
  candidates for every budget (``greedy_pool``), so the budgets walk one greedy path.

Calibration is most of the cost (on one CPU thread about a minute per run of four 4K-token
prompts, hundreds of runs), so every finished run is kept in ``OUT/calibration/runs.jsonl``
(``tuning/memo.py``): budgets share their single-unit scores, gates and greedy steps, and a stopped
calibration resumes at the run it was in. Selections go one at a time, cheapest first, each
calibrated at every budget and then evaluated, so a stopped frontier has whole points to show. A
rerun first evaluates and writes every point already calibrated, whatever its selection, so a run
that adds a selection never rewrites ``frontier.*`` with fewer points than the folder had.

The units are chosen on calibration prompts (a seed no evaluation uses, ``prompts.CAL_SEED``); every
chosen spec and full attention then run S-NIAH-1/2/3 at the context on the evaluation seed through
the eval runner (one resumable run folder, ``OUT/eval``), so recovery is paired over the same
samples. Each point records its calibration cost in CPU-minutes (this process's CPU time).
Calibrations are kept in ``OUT/calibration/`` and a rerun reuses them and the rows already there.

With ``native_sliding="keep"`` (Gemma 3 as its local layers were trained) every spec leaves the
native sliding layers on their own window: their bytes are the same at every point, SWA's W and the
hybrids' full units act on the global layers only, and the budget is still a fraction of the whole
model's full-attention KV.

    OUT/frontier.json   every point: budget, selection, spec, KV bytes, recovery [95%], n, p vs full
    OUT/frontier.md     the table
    OUT/frontier.png    KV bytes (fraction of full) against S-NIAH recovery, intervals, Pareto front
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..runtime.kv_bytes import analytic_state_bytes
from ..runtime.method import use_method
from ..runtime.spec import MethodSpec, parse_spec
from .calibrate import CalibrateConfig, calibrate
from .measure import SampleSet, measure_in_folder
from .memo import Memo
from .nll import NllWorkers, mean_nlls, nll_workers
from .options import RunOptions
from .prompts import CAL_SEED, calibration_prompts, check_calibration_seed
from .records import write_json, write_text
from .units import model_units, spec_with_units

__all__ = [
    "STRATEGIES",
    "FrontierConfig",
    "FrontierPoint",
    "best_point",
    "frontier",
    "largest_window",
    "max_units",
    "measure_points",
    "write_frontier",
]

logger = logging.getLogger(__name__)

# The ways a frontier point chooses its spec, cheapest first (not calibrate's --select, which is how
# units are picked from their scores: ``selection.SELECTIONS``).
STRATEGIES = ("swa", "heads-retrieval", "heads-nll", "heads-gates", "layers")
# How each selection calibrates: (units, criterion, select).
_CALIBRATION = {
    "layers": ("layer", "nll", "greedy"),
    "heads-retrieval": ("head", "retrieval", "top"),
    "heads-nll": ("head", "nll", "top"),
    "heads-gates": ("head", "gates", "top"),
}


@dataclass(frozen=True)
class FrontierConfig:
    """The frontier :func:`frontier` draws (what ``sinkwindow frontier``'s flags set).

    Attributes:
        budgets: KV budgets as fractions of full attention's bytes at ``context``.
        selections: the ways of choosing a spec (:data:`STRATEGIES`).
        sinks: sink counts each selection may use (the best by calibration answer NLL is kept).
        stream_window: W of the streaming side of the hybrids (DuoAttention: 64 sinks + 256 recent).
        greedy_pool: candidates of the greedy layer selection, the best single layers by NLL, the
            same at every budget (at least K, at most the layers there are).
        samples: held-out samples per S-NIAH task (on the evaluation seed ``eval_seed``).
        calib_samples / calib_length: calibration prompts and their length (default: the context).
        native_sliding: ``apply``'s policy for every spec: ``"keep"`` leaves native sliding layers
            on their own window and puts the budget question on the global layers.
        niah_max_new_tokens: the evaluation's decoding cap (``EvalConfig``); ``None``, the answer's
            tokens + 16, as ``tune`` decodes: of the 835 correct S-NIAH rows of the SmolLM2 reference
            run (RULER's 128) only 3, all ``swa:256:0``, needed more, and at 4K the 128-token cap
            doubled a sample's time (35 s for full attention on one thread).
    """

    budgets: Sequence[float] = (0.125, 0.25, 0.5)
    selections: Sequence[str] = STRATEGIES
    sinks: Sequence[int] = (4, 64)
    stream_window: int = 256
    greedy_pool: int = 20
    samples: int = 30
    calib_samples: int = 4
    calib_length: int | None = None
    seed: int = CAL_SEED
    eval_seed: int = 42
    chunk_size: int = 512
    native_sliding: str = "override"
    niah_max_new_tokens: int | None = None


@dataclass
class FrontierPoint:
    """One (budget, selection) point; ``recovery`` is the S-NIAH average ÷ full attention's, in %.

    ``calib_cpu_minutes`` is what the point's calibration costs alone: the CPU of every run it used,
    wherever in the frontier that run was first computed (``Memo.tally``), and of its own work
    besides; ``calib_cpu_minutes_here`` is what the process that wrote the point spent on it (runs
    it found in the memo, shared with earlier points or kept from a stopped process, cost nothing).

    ``beyond_window`` says where the point's retrieval comes from: over its paired samples, the needles
    that lay beyond its streaming side's view (the sinks and the last W − S positions of ``swa:W:S``,
    a hybrid's too; ``eval.window_split.needle_in_window``), ``{"window": [W, S], "n": ..., "found":
    found by the spec, "full_found": found by full attention}``. Plain SWA finds such a needle only
    through what its layers carried forward; a hybrid also through its full layers or heads.

    ``vs_best`` pairs the point with the best one at its budget (the highest recovery; the cheaper
    calibration on a tie) over the samples both ran: ``{"selection", "spec", "wins", "losses", "n",
    "p"}``, wins and losses counted for this point, p of the exact paired sign test (stratified by
    task); ``None`` for the best point itself, or when nothing else at its budget was measured.
    """

    budget: float
    selection: str
    spec: str
    kv_bytes: int
    kv_fraction: float
    calib_cpu_minutes: float
    accuracy: dict[str, float] = field(default_factory=dict)
    recovery: float | None = None
    lo: float | None = None
    hi: float | None = None
    n: int = 0
    p_vs_full: float | None = None
    calib_cpu_minutes_here: float | None = None
    beyond_window: dict | None = None
    full_accuracy: dict[str, float] = field(default_factory=dict)
    vs_best: dict | None = None


def largest_window(
    config, context: int, budget: int, sinks: int, dtype, native_sliding: str = "override"
) -> int | None:
    """The largest W whose ``swa:W:sinks`` cache fits ``budget`` bytes at ``context``, or ``None``."""

    def cost(w: int) -> int:
        spec = parse_spec(f"swa:{w}:{sinks}")
        return analytic_state_bytes(spec, config, context, dtype=dtype, native_sliding=native_sliding)

    lo, hi = sinks + 1, context
    if cost(lo) > budget:
        return None
    while lo < hi:  # bytes grow with W: the largest that fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(mid) <= budget else (lo, mid - 1)
    return lo


def max_units(
    base: MethodSpec, config, by: str, context: int, budget: int, dtype, native_sliding: str = "override"
) -> int:
    """How many units (layers or KV heads) can be full on top of ``base`` within ``budget`` bytes.

    Units of one kind cost the same on a model whose (global) layers are all alike, so the first K
    stand for any K; -1 when ``base`` alone does not fit.
    """
    units = model_units(config, by, native_sliding)
    kv_heads = None  # never merge heads into layers here: a merged layer costs the same bytes
    k = -1
    for n in range(len(units) + 1):
        spec = spec_with_units(base, units[:n], kv_heads)
        if analytic_state_bytes(spec, config, context, dtype=dtype, native_sliding=native_sliding) > budget:
            break
        k = n
    return k


def frontier(model, tokenizer, context: int, config: FrontierConfig, out: str | Path, *, name: str,
             **options) -> list[FrontierPoint]:  # fmt: skip
    """Draw the frontier into ``out`` (see the module docstring); returns its points.

    Selections go one at a time: each is calibrated at every budget, then its specs (and full
    attention) are evaluated and ``frontier.*`` rewritten with every point so far.
    ``options`` (:class:`~.options.RunOptions`: ``progress``, ``new_run``, ``workers``, ``ray``,
    ``model_factory``, ``source_diff``): the evaluation's cells and the calibration's answer-NLL runs
    go where ``workers`` / ``ray`` say (local worker processes or Ray tasks; ``nll.mean_nlls``), with
    the same rows and NLLs as a serial run; the attention mass and the trained gates run in this
    process. The workers load their own copy with ``model_factory`` (a picklable
    ``() -> (model, tokenizer)``); without one they get a pickled copy of ``model``. ``source_diff``:
    the sha256 of uncommitted source changes the run was allowed to compute with
    (``runs.check_clean_source``), recorded in every row.

    A folder keeps one calibration setting (``fingerprint.json``: the model, context, sinks, stream
    window, calibration prompts, chunk size): a rerun with other budgets, selections or samples adds
    to it, one with other calibration settings is refused, or with ``new_run`` starts over after
    moving the folder's files to ``previous-<time>/``.

    Raises:
        ValueError: an unknown selection, a budget outside (0, 1], or a calibration seed evaluation uses.
        RunMismatchError: ``out`` holds a frontier calibrated otherwise (names what differs).
    """
    cfg = config
    opts = RunOptions(name=name, **options)
    unknown = [s for s in cfg.selections if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown selection(s) {unknown}: choose from {', '.join(STRATEGIES)}")
    if cfg.native_sliding not in ("override", "keep"):
        raise ValueError(f"native_sliding must be 'override' or 'keep', got {cfg.native_sliding!r}")
    if not all(0 < b <= 1 for b in cfg.budgets):
        raise ValueError(
            f"budgets are fractions of full attention's KV bytes in (0, 1], got {list(cfg.budgets)}"
        )
    check_calibration_seed(cfg.seed)
    out = Path(out)
    _check_settings(out, _settings(cfg, name, context, model), opts.new_run)
    (out / "calibration").mkdir(parents=True, exist_ok=True)
    full_bytes = analytic_state_bytes(MethodSpec("full"), model.config, context, dtype=model.dtype)
    job = _PointJob(model, tokenizer, context, cfg, out, Memo(out / "calibration" / "runs.jsonl"))
    if opts.workers is not None or opts.ray not in (None, False):
        from ..eval.scheduler import PickledModel

        job.workers = nll_workers(
            opts.workers, opts.ray, opts.model_factory or PickledModel((model, tokenizer))
        )
    order = sorted(cfg.selections, key=STRATEGIES.index)  # cheapest first
    saved = {(s, b): _saved_point(out, s, b) for s in order for b in cfg.budgets}
    points = [p for p in saved.values() if p is not None]
    held_out = SampleSet("niah", context, cfg.samples, cfg.eval_seed, chunk_size=cfg.chunk_size, name=name,
                         native_sliding=cfg.native_sliding, niah_max_new_tokens=cfg.niah_max_new_tokens)  # fmt: skip

    def evaluate_and_write() -> None:
        points.sort(key=lambda p: (STRATEGIES.index(p.selection), cfg.budgets.index(p.budget)))
        use_method(model, "full")
        specs = list(dict.fromkeys(["full", *(p.spec for p in points)]))
        store = measure_in_folder((model, tokenizer), specs, held_out, out / "eval", opts)
        measure_points(points, store.rows(), context, full_bytes)
        write_frontier(points, out, context=context, model=name, config=cfg, full_bytes=full_bytes)

    if points:  # a rerun: the points calibrated before, evaluated and written before anything new
        evaluate_and_write()
    for selection in order:
        fresh = [
            _choose(job, selection, b, int(b * full_bytes))
            for b in cfg.budgets
            if saved[(selection, b)] is None
        ]
        fresh = [p for p in fresh if p is not None]
        if fresh:
            points.extend(fresh)
            evaluate_and_write()
    return points


@dataclass
class _PointJob:
    """What calibrating any point of one frontier needs: the model, the folder, the shared memo, and
    where the answer-NLL runs go. The calibration prompts are drawn only when a point is calibrated
    here (a rerun reads every point from ``OUT/calibration``)."""

    model: object
    tokenizer: object
    context: int
    cfg: FrontierConfig
    out: Path
    memo: Memo
    workers: NllWorkers | None = None

    @functools.cached_property
    def prompts(self) -> list:
        cfg = self.cfg
        return calibration_prompts(
            self.tokenizer, cfg.calib_samples, cfg.calib_length or self.context, cfg.seed
        )


def _settings(cfg: FrontierConfig, name: str, context: int, model) -> dict:
    """What a point's calibration depends on (budgets, selections and samples only add points or rows)."""
    return {"model": name, "context": context, "sinks": sorted(set(cfg.sinks)), "stream_window": cfg.stream_window,
            "greedy_pool": cfg.greedy_pool, "calib_samples": cfg.calib_samples, "calib_length": cfg.calib_length or context, "seed": cfg.seed,
            "chunk_size": cfg.chunk_size, "dtype": str(model.dtype).removeprefix("torch."),
            "native_sliding": cfg.native_sliding}  # fmt: skip


def _check_settings(out: Path, settings: dict, new_run: bool) -> None:
    from ..runs.folder import RunMismatchError, move_aside, read_settings, write_settings

    old = read_settings(out)
    if old is not None and old["settings"] != settings:
        if not new_run:
            keys = sorted(
                k for k in set(old["settings"]) | set(settings) if old["settings"].get(k) != settings.get(k)
            )
            said = "; ".join(f"{k}: {old['settings'].get(k)!r} -> {settings.get(k)!r}" for k in keys)
            raise RunMismatchError(
                f"{out} holds a frontier calibrated otherwise ({said}): use another --out, or --new-run"
            )
        move_aside(
            out, ["calibration", "eval", "frontier.json", "frontier.md", "frontier.png", "fingerprint.json"]
        )
    out.mkdir(parents=True, exist_ok=True)
    write_settings(out, settings)


def _point_path(out: Path, selection: str, budget: float) -> Path:
    return out / "calibration" / f"{selection}-{budget:g}.json"


def _saved_point(out: Path, selection: str, budget: float) -> FrontierPoint | None:
    """The point a previous run calibrated for ``selection`` at ``budget`` (``None``: not yet)."""
    path = _point_path(out, selection, budget)
    return FrontierPoint(**json.loads(path.read_text())) if path.exists() else None


def _choose(job: _PointJob, selection: str, budget: float, budget_bytes: int) -> FrontierPoint | None:
    """One point calibrated now and saved beside the others; ``None`` when nothing fits."""
    path = _point_path(job.out, selection, budget)
    t0 = time.process_time()
    with job.memo.tally() as tally:
        spec = _calibrate_point(job, selection, budget_bytes)
    if spec is None:
        return None
    # CPU spent here: this process's, and the runs its workers computed for it.
    here = time.process_time() - t0 + tally.elsewhere_cpu_s
    alone = here - tally.computed_cpu_s + tally.cpu_s
    model = job.model
    kv = analytic_state_bytes(
        spec, model.config, job.context, dtype=model.dtype, native_sliding=job.cfg.native_sliding
    )
    assert kv <= budget_bytes, f"{spec} costs {kv} bytes, over the budget of {budget_bytes}"
    point = FrontierPoint(budget, selection, str(spec), kv, 0.0, round(alone / 60, 4),
                          calib_cpu_minutes_here=round(here / 60, 4))  # fmt: skip
    write_json(path, asdict(point), indent=2, newline=False)
    return point


def _calibrate_point(job: _PointJob, selection: str, budget_bytes: int) -> MethodSpec | None:
    """The spec ``selection`` chooses within ``budget_bytes``, or ``None`` when nothing fits."""
    model, cfg, context = job.model, job.cfg, job.context
    dtype, policy = model.dtype, cfg.native_sliding
    if selection == "swa":
        specs = []
        for s in cfg.sinks:
            w = largest_window(model.config, context, budget_bytes, s, dtype, policy)
            if w is not None:
                specs.append(parse_spec(f"swa:{w}:{s}"))
        if not specs:
            return None
        try:
            nlls = mean_nlls(model, specs, job.prompts, cfg.chunk_size, None, policy, job.memo, job.workers)
        finally:
            use_method(model, "full")
        return min(zip(specs, nlls), key=lambda pair: pair[1])[0]
    by, criterion, select = _CALIBRATION[selection]
    sinks = [s for s in cfg.sinks if s < cfg.stream_window]
    if not sinks:
        raise ValueError(
            f"every sink count in {list(cfg.sinks)} fills the stream window {cfg.stream_window}: "
            f"give --sinks below --stream-window"
        )
    base = parse_spec(f"swa:{cfg.stream_window}:{sinks[0]}")
    k = max_units(base, model.config, by, context, budget_bytes, dtype, policy)
    if k < 1:
        return None
    pool = (
        min(len(model_units(model.config, by, policy)), max(cfg.greedy_pool, k))
        if select == "greedy"
        else None
    )
    how = CalibrateConfig(by=by, criterion=criterion, samples=cfg.calib_samples, length=cfg.calib_length or context,
                          seed=cfg.seed, chunk_size=cfg.chunk_size, progress=False, select=select, pool=pool,
                          sinks=sinks, native_sliding=policy)  # fmt: skip
    res = calibrate(model, job.tokenizer, base, k, how, memo=job.memo, workers=job.workers)
    return parse_spec(res.spec)


def measure_points(points: list[FrontierPoint], rows: list[dict], context: int, full_bytes: int) -> None:
    """Fill in each point's accuracy per task (and full attention's on the same samples), recovery vs
    full (paired, stratified by task), p, and its exact test against the best point at its budget."""
    from ..eval.stats import paired_bootstrap_ratio, paired_sign_test
    from ..eval.tasks import NIAH_TASKS
    from ..eval.window_split import needle_in_window

    by, needles = {}, {}
    for r in rows:
        if r["length"] == context:
            by.setdefault((r["method"], r["task"]), {})[r["index"]] = float(r["score"]) / 100.0
            if r.get("needle_tokens"):  # the same sample: the same needle whichever method ran it
                needles[(r["task"], r["index"])] = (*r["needle_tokens"], int(r["n_prompt_tokens"]))

    def paired(a: str, b: str) -> tuple[list[list[float]], list[list[float]], dict[str, list[int]]]:
        """Per task, ``a``'s and ``b``'s scores on the samples both ran (and those samples)."""
        ca, cb, common = [], [], {}
        for task in NIAH_TASKS:
            sa, sb = by.get((a, task), {}), by.get((b, task), {})
            idx = sorted(set(sa) & set(sb))
            if idx:
                ca.append([sa[i] for i in idx])
                cb.append([sb[i] for i in idx])
                common[task] = idx
        return ca, cb, common

    for p in points:
        p.kv_fraction = round(p.kv_bytes / full_bytes, 4)
        spec = parse_spec(p.spec)
        view = (spec.window, spec.sinks)
        beyond = {"window": list(view), "n": 0, "found": 0, "full_found": 0}
        located = 0
        ca, cb, common = paired(p.spec, "full")
        for (task, idx), mine, full in zip(common.items(), ca, cb):
            p.accuracy[task] = 100.0 * sum(mine) / len(idx)
            p.full_accuracy[task] = 100.0 * sum(full) / len(idx)
            for i, a, f in zip(idx, mine, full):
                where = needles.get((task, i))
                located += where is not None
                if where is not None and not needle_in_window(*where, view):
                    beyond["n"] += 1
                    beyond["found"] += int(a >= 1.0)
                    beyond["full_found"] += int(f >= 1.0)
        if not ca:
            continue
        p.beyond_window = beyond if located else None  # rows without needle positions: unknown
        iv = paired_bootstrap_ratio(ca, cb)
        p.n = iv.n
        if not math.isnan(iv.estimate):  # full attention found nothing: no ratio to give
            p.recovery, p.lo, p.hi = 100.0 * iv.estimate, 100.0 * iv.lo, 100.0 * iv.hi
        p.p_vs_full = paired_sign_test(ca, cb).p

    for budget in dict.fromkeys(p.budget for p in points):
        here = [p for p in points if p.budget == budget and p.recovery is not None]
        best = best_point(here)
        for p in here:
            p.vs_best = None
            if p is best:
                continue
            ca, cb, _ = paired(p.spec, best.spec)
            if ca:
                t = paired_sign_test(ca, cb)
                p.vs_best = {"selection": best.selection, "spec": best.spec, "wins": t.plus,
                             "losses": t.minus, "n": t.n, "p": t.p}  # fmt: skip


def best_point(points: list[FrontierPoint]) -> FrontierPoint | None:
    """The highest recovery among ``points`` (the cheaper calibration on a tie); ``None`` if none."""
    measured = [p for p in points if p.recovery is not None]
    return min(measured, key=lambda p: (-p.recovery, p.calib_cpu_minutes), default=None)


def write_frontier(points: list[FrontierPoint], out: str | Path, *, context: int, model: str,
                   config: FrontierConfig, full_bytes: int) -> dict[str, str]:  # fmt: skip
    """``frontier.json``, ``frontier.md`` and ``frontier.png`` in ``out``; their paths."""
    out = Path(out)
    record = {"model": model, "context": context, "full_kv_bytes": full_bytes, "config": asdict(config),
              "points": [asdict(p) for p in points]}  # fmt: skip
    json_path = write_json(out / "frontier.json", record, indent=2, newline=False, default=list)
    lines = [
        f"# KV-budget frontier: {model} at {context} tokens"
        + (" (native sliding layers kept on their own window)" if config.native_sliding == "keep" else ""),
        "",
        "S-NIAH-1/2/3 average recovery vs full attention (paired over the same samples, 95% bootstrap "
        "interval), p of the exact paired sign test against full attention, calibration cost in CPU-minutes: "
        "alone (every run the point used) and here (after the points before it shared their runs). "
        "Beyond the window: of the needles outside the streaming side's view (its sinks and last W − S "
        "positions), how many the spec found, and how many full attention found.",
        "",
        "| budget | selection | spec | KV (of full) | S-NIAH-1 / 2 / 3 % (full) | recovery % | n | p vs full "
        "| beyond the window: found (full) of n | calibration CPU-min (alone / here) |",
        "|---:|---|---|---:|---|---|---:|---:|---|---:|",
    ]  # fmt: skip
    for p in points:
        rec = "–" if p.recovery is None else f"{p.recovery:.1f} [{p.lo:.1f}, {p.hi:.1f}]"
        pv = "–" if p.p_vs_full is None else f"{p.p_vs_full:.3g}"
        bw = p.beyond_window
        far = "–" if not bw else f"{bw['found']} ({bw['full_found']}) of {bw['n']}"
        lines.append(f"| {p.budget:g} | {p.selection} | `{p.spec}` | {100 * p.kv_fraction:.1f}% | {_per_task(p)} "
                     f"| {rec} | {p.n} "
                     f"| {pv} | {far} | {p.calib_cpu_minutes:.2f} / {_minutes(p.calib_cpu_minutes_here)} |")  # fmt: skip
    lines += _head_to_head(points)
    paths = {"json": json_path, "md": write_text(out / "frontier.md", "\n".join(lines) + "\n")}
    try:
        paths["png"] = str(_plot(points, out / "frontier.png", model, context))
    except ImportError:  # matplotlib is an extra
        logger.warning("no frontier.png: matplotlib is not installed (pip install 'sinkwindow[eval]')")
    return paths


def _head_to_head(points: list[FrontierPoint]) -> list[str]:
    """``frontier.md``'s second table: at each budget, the best point and every other against it."""
    lines = [
        "",
        "## At each budget: the best point, and every other against it",
        "",
        "Best: the highest recovery (a point estimate; the cheaper calibration on a tie). Against it: the "
        "other point's wins and losses over the samples both ran, and p of the exact paired sign test "
        "(stratified by task); a large p means the two are not told apart.",
        "",
        "| budget | selection | spec | recovery % | against the best: wins / losses, p |",
        "|---:|---|---|---|---|",
    ]
    for budget in dict.fromkeys(p.budget for p in points):
        best = best_point([p for p in points if p.budget == budget])
        if best is None:
            continue
        others = sorted((p for p in points if p.budget == budget and p.recovery is not None and p is not best),
                        key=lambda p: -p.recovery)  # fmt: skip
        for p in [best, *others]:
            rec = f"{p.recovery:.1f} [{p.lo:.1f}, {p.hi:.1f}]"
            if p is best:
                name, against = f"**{p.selection}**", "(best)"
            else:
                vs = p.vs_best
                name = p.selection
                against = "–" if not vs else f"{vs['wins']} / {vs['losses']}, p {vs['p']:.2g}"
            lines.append(f"| {budget:g} | {name} | `{p.spec}` | {rec} | {against} |")
    return lines


def _per_task(p: FrontierPoint) -> str:
    """``"33.3 / 30.0 / 3.3 (100.0 / 90.0 / 63.3)"``: the spec's S-NIAH-1/2/3 scores, full attention's."""
    from ..eval.tasks import NIAH_TASKS

    def scores(acc: dict[str, float]) -> str:
        return " / ".join("–" if t not in acc else f"{acc[t]:.1f}" for t in NIAH_TASKS)

    return "–" if not p.accuracy else f"{scores(p.accuracy)} ({scores(p.full_accuracy)})"


def _minutes(m: float | None) -> str:
    return "–" if m is None else f"{m:.2f}"


_MARKERS = {"swa": "o", "heads-retrieval": "v", "heads-nll": "s", "heads-gates": "D", "layers": "^"}


def _plot(points: list[FrontierPoint], path: Path, model: str, context: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    measured = [p for p in points if p.recovery is not None]
    for sel in STRATEGIES:
        marker = _MARKERS[sel]
        mine = [p for p in measured if p.selection == sel]
        if mine:
            ax.errorbar([100 * p.kv_fraction for p in mine], [p.recovery for p in mine],
                        yerr=[[p.recovery - p.lo for p in mine], [p.hi - p.recovery for p in mine]],
                        fmt=marker, capsize=3, label=sel)  # fmt: skip
    # The Pareto front: no other point has fewer bytes and at least the recovery.
    front = sorted(
        (
            p
            for p in measured
            if not any(q.kv_bytes <= p.kv_bytes and q.recovery > p.recovery for q in measured)
        ),
        key=lambda p: p.kv_bytes,
    )
    if front:
        ax.plot(
            [100 * p.kv_fraction for p in front],
            [p.recovery for p in front],
            "k--",
            lw=1,
            label="Pareto front",
        )
    ax.axhline(100, color="grey", lw=0.8)
    ax.set_xlabel("KV bytes, % of full attention's")
    ax.set_ylabel("S-NIAH recovery vs full, %")
    ax.set_title(f"{model} at {context} tokens")
    if ax.get_legend_handles_labels()[0]:  # nothing measured (no recovery): no legend to draw
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

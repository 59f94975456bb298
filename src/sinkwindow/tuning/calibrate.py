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

The criteria are small classes registered in ``tuning/criteria.py``; the units are then chosen by
``tuning/selection.py`` (``select="top"``: the K best, ties to the earlier unit; ``"greedy"``:
re-scored given the units already kept), and :func:`spec_with_units` writes the hybrid spec.

Cost: ``nll`` runs the prompts once per unit plus once for the base (31 runs for a 30-layer model);
``mass`` and ``retrieval`` run them once in all; greedy adds ``(P - 1) + (P - 2) + ... +
(P - K + 1)`` runs for a pool of P (45 for K = 6, P = 12). Both prefill in chunks through the
method's cache, so a long prompt never needs more than a chunk's activations and the cache.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from ..runtime.method import use_method
from ..runtime.spec import MethodSpec, parse_spec
from .criteria import CRITERIA, LAST_QUERIES, ScoringRun, check_criterion, rank_scores, score_units
from .memo import Memo
from .nll import NllWorkers, mean_nlls
from .prompts import CAL_SEED, calibration_prompts, check_calibration_seed
from .records import fresh_folder, provenance, write_json
from .selection import SELECTIONS, choose_units, order, select_units
from .units import Unit, check_base_spec, model_units, parse_unit, unit_label

__all__ = [
    "CRITERIA",
    "CalibrateConfig",
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


@dataclass(frozen=True)
class CalibrateConfig:
    """How :func:`calibrate` scores and chooses (what ``sinkwindow calibrate``'s flags set).

    Attributes:
        by: ``"layer"`` or ``"head"`` (KV heads).
        criterion: a name of :data:`~.criteria.CRITERIA`: ``"nll"``, ``"mass"``, ``"rank"`` (both,
            ranks averaged), ``"gates"`` (one gate per KV head trained on the frozen model,
            DuoAttention's way) or ``"retrieval"`` (attention on the needle while answering).
        samples / length: calibration S-NIAH prompts and their token budget (answer included).
        seed: the prompts' seed; one of ``EVAL_SEEDS`` is refused.
        last_queries: query positions the mass averages over (the prompt's end).
        progress: show tqdm bars.
        name: the model's name for the record (default: ``config.name_or_path``).
        select: ``"top"`` keeps the K best single units; ``"greedy"`` (nll only) re-scores the
            ``pool`` best single units given the ones already kept (``selection.greedy_select``).
        pool: greedy's candidates (default: K + 6, at most every unit).
        sinks: sink counts S to try for the streaming side instead of the method's own (DuoAttention's
            streaming heads keep 64): each gives the base ``swa:W:S`` at the same KV bytes, since the
            sinks are among the W slots. Units are chosen on each base, and the hybrid whose answer
            NLL on the calibration prompts is lowest is kept (``sinks_tried`` records every one).
        native_sliding: the policy the hybrid will run under (``apply``'s). ``"keep"`` (Gemma 3 as
            its local layers were trained) leaves native sliding layers on their own window and
            scores only the global layers' units; apply the result with the same policy.
    """

    by: str = "layer"
    criterion: str = "nll"
    samples: int = 4
    length: int = 2048
    seed: int = CAL_SEED
    chunk_size: int = 512
    last_queries: int = LAST_QUERIES
    progress: bool = True
    name: str | None = None
    select: str = "top"
    pool: int | None = None
    sinks: Sequence[int] | None = None
    native_sliding: str = "override"


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
        best = order(scores, higher_is_better=CRITERIA[criterion].higher_is_better)
        return [self.units[i] for i in best[: self.k if k is None else k]]

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
    config: CalibrateConfig | None = None,
    *,
    memo: Memo | None = None,
    workers: NllWorkers | None = None,
    **settings,
) -> CalibrationResult:
    """Score every unit on calibration prompts and keep the ``k`` best full on top of ``method``.

    Args:
        method: the plain ``swa:W:S`` to build on.
        k: units to keep full, 0 .. number of units.
        config: how to score and choose (:class:`CalibrateConfig`); ``settings`` override its
            fields by name (``calibrate(model, tok, "swa:256:4", 6, by="head")``).
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
    cfg = replace(config or CalibrateConfig(), **settings)
    base, units, pool = _check_calibration(model, method, k, cfg)
    t0 = time.perf_counter()
    prompts = calibration_prompts(tokenizer, cfg.samples, cfg.length, cfg.seed)
    run = ScoringRun(model, prompts, _sink_bases(base, cfg.sinks), units, cfg.chunk_size, cfg.last_queries,
                     cfg.native_sliding, memo, workers)  # fmt: skip
    # The mass is one full-attention pass, so it is always reported beside the criterion that decides.
    criteria = [cfg.criterion] if cfg.criterion in ("mass", "rank") else [cfg.criterion, "mass"]
    all_scores = score_units(run, criteria, progress=cfg.progress)
    tried = [
        choose_units(run, b, all_scores[str(b)], cfg.criterion, cfg.select, k, pool, cfg.progress)
        for b in run.bases
    ]
    best = _best_sinks(run, tried)
    return _result(model, cfg, k, pool, run, best, tried, round(time.perf_counter() - t0, 2))


def _result(model, cfg: CalibrateConfig, k: int, pool, run: ScoringRun, best: dict, tried: list[dict],
            seconds: float) -> CalibrationResult:  # fmt: skip
    """The :class:`CalibrationResult` of the hybrid ``best`` among those ``tried``."""
    base, chosen, spec, scores, steps = (best[key] for key in ("base", "chosen", "spec", "scores", "steps"))
    warnings = native_local_warnings(model.config, chosen, cfg.length)
    for w in warnings:
        logger.warning(w)
    return CalibrationResult(
        model=cfg.name or str(getattr(model.config, "name_or_path", "") or type(model).__name__),
        base=str(base),
        by=cfg.by,
        criterion=cfg.criterion,
        k=k,
        samples=cfg.samples,
        length=cfg.length,
        seed=cfg.seed,
        last_queries=cfg.last_queries,
        chunk_size=cfg.chunk_size,
        units=[unit_label(u) for u in run.units],
        scores={c: [float(v) for v in scores[c]] for c in CRITERIA if c in scores},
        chosen=[unit_label(u) for u in chosen],
        spec=str(spec),
        nll_base=scores.get("nll_base"),
        prompt_tokens=[p.n_tokens for p in run.prompts],
        seconds=seconds,
        select=cfg.select,
        pool=pool,
        steps=steps,
        warnings=warnings,
        gate_losses=scores.get("gate_losses", []),
        sinks_tried=[{"sinks": t["sinks"], "spec": str(t["spec"]), "nll": t.get("nll")} for t in tried]
        if len(tried) > 1
        else [],
        native_sliding=cfg.native_sliding,
    )


def _best_sinks(run: ScoringRun, tried: list[dict]) -> dict:
    """Of hybrids built on several sink counts, the one with the lowest answer NLL on the calibration
    prompts (each gets ``"nll"``); ties go to the earlier (fewer) sinks. One hybrid: itself."""
    if len(tried) == 1:
        return tried[0]
    try:
        nlls = mean_nlls(run.model, [t["spec"] for t in tried], run.prompts, run.chunk_size, None,
                         run.native_sliding, run.memo, run.workers)  # fmt: skip
        for t, nll in zip(tried, nlls):
            t["nll"] = nll
    finally:
        use_method(run.model, "full")
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


def _check_calibration(model, method, k: int, cfg: CalibrateConfig):
    """``(base spec, units, greedy's pool)``, after refusing what no calibration can run, each with the fix."""
    base = check_base_spec(method)
    check_criterion(cfg.criterion)
    check_calibration_seed(cfg.seed)
    if cfg.native_sliding not in ("override", "keep"):
        raise ValueError(f"native_sliding must be 'override' or 'keep', got {cfg.native_sliding!r}")
    units = model_units(model.config, cfg.by, cfg.native_sliding)
    if not units:
        raise ValueError(
            "every layer slides natively, so under native_sliding='keep' there is no unit to keep full: "
            "use native_sliding='override'"
        )
    if not 0 <= k <= len(units):
        what = "layers" if cfg.by == "layer" else "KV heads"
        raise ValueError(f"K={k} is more than the model's {len(units)} {what}: give K from 1 to {len(units)}")
    if cfg.length <= base.window:
        raise ValueError(
            f"calibration prompts of {cfg.length} tokens fit inside the window W={base.window}, where full "
            f"attention changes nothing: use a --length above {base.window}"
        )
    return base, units, _pool(cfg, k, len(units))


def _pool(cfg: CalibrateConfig, k: int, n_units: int) -> int | None:
    """Greedy's pool (default K + 6, at most every unit), after refusing a selection that cannot run."""
    pool = cfg.pool
    if cfg.select not in SELECTIONS:
        raise ValueError(f"unknown selection {cfg.select!r}: choose from {', '.join(SELECTIONS)}")
    if cfg.select == "greedy":
        if cfg.criterion != "nll":
            raise ValueError(
                f"greedy selection re-scores by the answer's NLL: use --criterion nll, not {cfg.criterion}"
            )
        pool = min(n_units, k + 6) if pool is None else pool
        if not k <= pool <= n_units:
            raise ValueError(f"--pool {pool} must be from K={k} to the model's {n_units} units")
    elif pool is not None:
        raise ValueError("--pool sets greedy selection's candidates: add --select greedy, or drop --pool")
    return pool


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
        ax.set_title(
            (CRITERIA[c].label if c in CRITERIA else c) + (" (chosen: red)" if c == criteria[0] else ""),
            fontsize=9,
        )
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


def write_calibration(result: CalibrationResult, out_dir: str | Path, *, plot: bool = True) -> dict[str, str]:
    """``calibrate.json`` (and ``calibrate.png``) in ``out_dir``; returns their paths.

    A folder's earlier calibration is never overwritten: its files move to ``previous-<UTC time>/``
    first (``runs.folder.move_aside``), so a re-run with other settings keeps both.
    """
    out = fresh_folder(out_dir, ["calibrate.json", "calibrate.png"])
    paths = {"json": write_json(out / "calibrate.json", {**result.to_json(), "provenance": provenance()})}
    if plot:
        try:
            paths["png"] = str(plot_scores(result, out / "calibrate.png"))
        except ImportError as err:  # matplotlib is an optional extra; the JSON has every number
            logger.warning("no plot: %s (pip install 'sinkwindow[eval]')", err)
    return paths

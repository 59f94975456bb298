"""``sinkwindow calibrate`` and ``sinkwindow tune``: choose which units of a hybrid keep full attention."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..cli import args as cli_args
from ..eval.tasks import ALL_TASKS, GROUPS
from ..models import resolve
from ..runs.folder import RunLock, check_run_dir
from ..runtime.threads import set_threads
from .criteria import CRITERIA

__all__ = ["register", "CALIBRATE_MIN_LENGTH"]

# S-NIAH prompts reserve a 128-token answer budget plus RULER's template (see eval/cli.py), so no
# calibration prompt fits below this.
CALIBRATE_MIN_LENGTH = 256
# Equal to prompts.CAL_SEED / tune.HELDOUT_SEED (a test keeps them so): importing those modules
# here would pull torch into every --help.
CAL_SEED = 7_000_000
HELDOUT_SEED = 8_000_000


def swa_method(text: str) -> str:
    """``--method`` of calibrate: a plain ``swa:W:S`` (canonical)."""
    from ..methods import method_of
    from ..runtime.spec import parse_spec

    spec = parse_spec(cli_args.method(text))
    if not method_of(spec).takes_full_units:
        raise argparse.ArgumentTypeError(
            f"{spec} is not swa:W:S: hybrids keep units full on top of sliding-window attention, e.g. swa:256:4"
        )
    if spec.is_hybrid:
        raise argparse.ArgumentTypeError(
            f"{spec} already names full units: give the plain {spec.base} and let calibration choose them"
        )
    return str(spec)


def sinks_list(text: str) -> list[int]:
    parts = [p.strip() for p in str(text).split(",")]
    if not all(parts):
        raise argparse.ArgumentTypeError("give sink counts separated by single commas, e.g. 0,4")
    parse = cli_args.integer(0, what="each sink count")
    return sorted({parse(p) for p in parts})


def tune_task(text: str) -> str:
    """``niah`` | ``babilong`` | ``ppl``, or one runner task (``niah_single_2``, ``babilong_qa1``)."""
    text = str(text).strip()
    if text in GROUPS or text in ALL_TASKS:
        return text
    raise argparse.ArgumentTypeError(
        f"unknown task {text!r}: use niah (S-NIAH-1/2/3), babilong (QA1-5), ppl, or one of {', '.join(ALL_TASKS)}"
    )


def _seed_flag(p: argparse.ArgumentParser, flag: str, default: int, help: str) -> None:
    p.add_argument(
        flag,
        type=cli_args.integer(0, cli_args.SEED_MAX, what=flag),
        default=default,
        help=f"{help}; evaluation's seeds (0 .. 999999) are refused (default: %(default)s)",
    )


def _max_positions(model: str) -> int | None:
    """The model's trained positions, read from its config before the weights load (None: unknown)."""
    from ..models.loading import model_config

    try:
        cfg = model_config(model)
    except Exception:  # noqa: BLE001 - an unknown or unreadable model fails in load() with its own message
        return None
    if cfg is None:
        return None
    cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    return getattr(cfg, "max_position_embeddings", None)


def _load(args):

    set_threads(args.threads)
    return _loader(args)()


def _loader(args):
    """``() -> (model, tokenizer)`` as this command loads them; picklable, for worker processes."""
    import functools

    import torch

    from ..models.loading import load

    device = resolve.resolve_device(args.device)
    return functools.partial(load, args.model, device=device, dtype=getattr(torch, args.dtype))


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from ..eval.fingerprint import model_identity
    from .calibrate import calibrate, write_calibration
    from .memo import Memo
    from .nll import nll_workers
    from .prompts import check_calibration_seed

    check_calibration_seed(args.seed, "--seed")  # before the model loads
    by, k = ("layer", args.full_layers) if args.full_layers is not None else ("head", args.full_heads)
    with RunLock(check_run_dir(args.out)):  # one writer per folder, from the model's load to the files
        model, tok = _load(args)
        t0 = time.perf_counter()
        # Every finished run is kept in --out, so a stopped calibration resumes where it stopped.
        # The model as the evaluation's rows name it (its file's sha256, folder digest or hub revision).
        scope = {"model": args.model, "model_file": model_identity(args.model, model),
                 "dtype": str(model.dtype).removeprefix("torch.")}  # fmt: skip
        memo = Memo(Path(args.out) / "runs.jsonl", scope=scope)
        result = calibrate(
            model, tok, args.method, k, by=by, criterion=args.criterion, samples=args.samples, length=args.length,
            seed=args.seed, chunk_size=args.chunk_size, last_queries=args.last_queries,
            progress=not args.no_progress, name=args.model, select=args.select, pool=args.pool, sinks=args.sinks,
            native_sliding=args.native_sliding, memo=memo, workers=nll_workers(args.workers, args.ray, _loader(args)),
        )  # fmt: skip
        paths = write_calibration(result, args.out)
    if memo.hits:
        print(f"reused {memo.hits} finished run(s) kept in {memo.path}")
    print(result.table())
    for c in result.scores:
        print(f"top {result.k} by {c}: {','.join(result.top(c))}")
    for t in result.sinks_tried:
        print(
            f"sinks {t['sinks']}: {t['spec']} answer NLL {t['nll']:.4f}"
            + (" (kept)" if t["spec"] == result.spec else "")
        )
    for i, step in enumerate(result.steps, start=1):
        print(f"greedy step {i}: +{step['added']}  answer NLL {step['nll']:.4f} (base {result.nll_base:.4f})")
    keep = " with --native-sliding keep" if result.native_sliding == "keep" else ""
    print(f"spec: {result.spec}{keep}  ({result.seconds:.1f}s; {paths['json']})")
    print(
        json.dumps(
            {
                "spec": result.spec,
                "native_sliding": result.native_sliding,
                "chosen": result.chosen,
                "criterion": result.criterion,
                "select": result.select,
                "by": by,
                "k": k,
                "warnings": result.warnings,
                "out": str(args.out),
                **paths,
                "seconds": round(time.perf_counter() - t0, 2),
            }
        )
    )
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from ..eval.tasks import TASKS
    from .measure import family_tasks
    from .tune import TuneConfig, check_seeds, tune, write_tune

    check_seeds(args.seed, args.heldout_seed)  # before the model loads
    tasks = family_tasks(args.task)
    least = max(TASKS[t].min_length for t in tasks)
    if args.context < least:
        raise ValueError(
            f"--context {args.context} is too short for {args.task}: give at least {least} tokens"
        )
    limit = _max_positions(args.model)
    for flag, value in (("--context", args.context), ("--calib-length", args.calib_length)):
        if limit is not None and value is not None and value > limit:
            raise ValueError(
                f"{flag} {value} is beyond the model's {limit} positions (max_position_embeddings): give at most {limit}"
            )
    if args.calib_length is not None and args.calib_length < CALIBRATE_MIN_LENGTH:
        raise ValueError(
            f"--calib-length must be >= {CALIBRATE_MIN_LENGTH} tokens (an S-NIAH prompt), got {args.calib_length}"
        )
    windows = args.windows
    if windows is not None and all(w >= args.context for w in windows):
        raise ValueError(f"every --windows value is >= the context {args.context}: give windows below it")
    with RunLock(check_run_dir(args.out)):  # one writer per folder, from the model's load to the files
        model, tok = _load(args)
        config = TuneConfig(
            windows=windows, sinks=args.sinks, by=args.units, criterion=args.criterion, max_k=args.max_k,
            samples=args.samples, heldout_samples=args.heldout_samples, calib_samples=args.calib_samples,
            calib_length=args.calib_length, seed=args.seed, heldout_seed=args.heldout_seed,
            chunk_size=args.chunk_size, batch_size=args.batch_size,
        )  # fmt: skip
        result = tune(
            model, tok, args.kv_budget, args.context, args.task, config, progress=not args.no_progress, name=args.model,
        )  # fmt: skip
        paths = write_tune(result, args.out)
    print(result.summary())
    best = result.heldout[result.best]
    print(
        json.dumps(
            {
                "best": result.best,
                "kv_budget_bytes": result.kv_budget_bytes,
                "context": result.context,
                "task": result.task,
                "calibration_score": result.calibration[result.best].score,
                "heldout_score": best.score,
                "heldout_interval": [best.lo, best.hi],
                "heldout_n": best.n,
                "seeds": {"calibration": result.seeds["calibration"], "heldout": result.seeds["heldout"]},
                "candidates": len(result.candidates),
                "out": str(args.out),
                **paths,
                "seconds": result.seconds,
            }
        )
    )
    return 0


def _fractions(text: str) -> list[float]:
    """``--budgets``: fractions of full attention's KV bytes in (0, 1], e.g. 0.125,0.25,0.5."""
    out = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a fraction: give e.g. 0.125,0.25,0.5"
            ) from None
        if not 0 < value <= 1:
            raise argparse.ArgumentTypeError(
                f"{part} is outside (0, 1]: a budget is a fraction of full attention's KV"
            )
        out.append(value)
    return sorted(set(out))


def _selections(text: str) -> list[str]:
    from .frontier import STRATEGIES

    parts = [p.strip() for p in str(text).split(",")]
    unknown = [p for p in parts if p not in STRATEGIES]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(
            f"unknown selection(s) {', '.join(unknown)}: choose from {', '.join(STRATEGIES)}"
        )
    return list(dict.fromkeys(parts))


def _cmd_frontier(args: argparse.Namespace) -> int:
    from ..runs.provenance import check_clean_source
    from .frontier import STRATEGIES, FrontierConfig, frontier
    from .prompts import check_calibration_seed

    check_calibration_seed(args.seed, "--seed")  # before the model loads
    source_diff = check_clean_source(args.allow_dirty)
    config = FrontierConfig(
        budgets=args.budgets, selections=args.selections or STRATEGIES, sinks=args.sinks, stream_window=args.stream_window, greedy_pool=args.pool,
        samples=args.samples, calib_samples=args.calib_samples, calib_length=args.calib_length, seed=args.seed,
        chunk_size=args.chunk_size, native_sliding=args.native_sliding,
    )  # fmt: skip
    with RunLock(check_run_dir(args.out)):
        model, tok = _load(args)
        t0 = time.perf_counter()
        points = frontier(model, tok, args.context, config, args.out, name=args.model, progress=not args.no_progress,
                          workers=args.workers, ray=args.ray, model_factory=_loader(args),
                          source_diff=source_diff, new_run=args.new_run)  # fmt: skip
    print((Path(args.out) / "frontier.md").read_text())
    print(
        json.dumps(
            {"out": str(args.out), "points": len(points), "seconds": round(time.perf_counter() - t0, 1)}
        )
    )
    return 0


def _register_frontier(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "frontier",
        help="KV budget vs S-NIAH recovery: plain SWA, full layers, full KV heads (retrieval, NLL, gates), held out",
        description="At each KV budget (a fraction of full attention's bytes at --context), chooses a spec "
        "each way (plain SWA at the largest W that fits; whole layers, greedy by NLL; KV heads by attention on "
        "the needle, by NLL, by trained gates; each with its best sink count) on calibration prompts, then runs every spec and full "
        "attention on S-NIAH-1/2/3 at the context on the evaluation seed, and writes frontier.json, frontier.md "
        "and frontier.png (recovery with 95% intervals, exact p against full, calibration CPU-minutes). "
        "Resumable: calibrations and evaluated rows are kept in --out.",
    )
    cli_args.add_model(p)
    p.add_argument("--context", type=cli_args.size(2, what="--context"), default="4k",
                   help=f"tokens per S-NIAH sample and the context the budgets hold; {cli_args.SIZE_HELP} (default: %(default)s)")  # fmt: skip
    p.add_argument("--budgets", type=_fractions, default=[0.125, 0.25, 0.5],
                   help="KV budgets as fractions of full attention's bytes (default: 0.125,0.25,0.5)")  # fmt: skip
    p.add_argument("--selections", type=_selections, default=None,
                   help="swa, heads-retrieval, heads-nll, heads-gates, layers, comma-separated (default: all)")  # fmt: skip
    p.add_argument("--sinks", type=sinks_list, default=[4, 64],
                   help="sink counts each selection may use, the best by calibration NLL (default: 4,64)")  # fmt: skip
    p.add_argument("--stream-window", type=cli_args.integer(2, what="--stream-window"), default=256,
                   help="W of the hybrids' streaming side (default: %(default)s)")  # fmt: skip
    p.add_argument("--pool", type=cli_args.integer(1, what="--pool"), default=20, metavar="P",
                   help="the greedy layer selection's candidates, the P best single layers, the same at every "
                   "budget so they walk one greedy path (default: %(default)s; at least K)")  # fmt: skip
    p.add_argument("--samples", type=cli_args.integer(1, what="--samples"), default=30,
                   help="held-out samples per S-NIAH task (default: %(default)s)")  # fmt: skip
    p.add_argument("--calib-samples", type=cli_args.integer(1, what="--calib-samples"), default=4,
                   help="calibration prompts (default: %(default)s)")  # fmt: skip
    p.add_argument("--calib-length", type=cli_args.size(CALIBRATE_MIN_LENGTH, what="--calib-length"), default=None,
                   help="their token budget (default: --context)")  # fmt: skip
    _seed_flag(p, "--seed", CAL_SEED, "seed of the calibration prompts")
    cli_args.add_native_sliding(p, help="every spec's policy on native sliding layers: keep (Gemma 3's local layers on "
                                "their own window; the budget question is on the globals) or override")  # fmt: skip
    cli_args.add_out(p, "runs/frontier", help="run folder (resumes if it exists)")
    cli_args.add_new_run(p, redo=False, what="its calibrations and rows are")
    cli_args.add_scheduler(
        p,
        unit="the evaluation's cells and the calibration's answer-NLL runs (mass and gates stay in this process)",
    )
    cli_args.add_allow_dirty(p)
    _add_runtime(p)
    p.set_defaults(func=_cmd_frontier)


def _add_runtime(p: argparse.ArgumentParser) -> None:
    cli_args.add_chunk_size(p, 512)
    cli_args.add_device(p)
    cli_args.add_dtype(p)
    cli_args.add_threads(p)
    cli_args.add_no_progress(p)


def register(sub: argparse._SubParsersAction) -> None:
    """``calibrate``, ``tune`` and ``frontier``."""
    _register_calibrate(sub)
    _register_tune(sub)
    _register_frontier(sub)


def _register_calibrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="score layers / KV heads for keeping full attention on top of swa:W:S and pick the top K",
        description="Scores every layer (or KV head) on S-NIAH calibration prompts of a seed no evaluation "
        "uses: nll = the answer's NLL gain when that unit alone keeps full attention; mass = the attention "
        "it puts outside the window under full attention; rank = both ranks averaged. Prints the table and "
        "the hybrid spec, writes calibrate.json and calibrate.png, then one JSON line.",
    )
    cli_args.add_model(p)
    cli_args.add_method(
        p, "swa:256:4", kind=swa_method, help="the plain swa:W:S to build on (default: %(default)s)"
    )
    k = p.add_mutually_exclusive_group(required=True)
    k.add_argument("--full-layers", type=cli_args.integer(1, what="--full-layers"), metavar="K",
                   help="keep K whole layers full")  # fmt: skip
    k.add_argument("--full-heads", type=cli_args.integer(1, what="--full-heads"), metavar="K",
                   help="keep K KV heads full (each with the query heads that share it)")  # fmt: skip
    # nll by default: on smollm2-135m at 4K (benchmarks/RESULTS.md) its 6 layers lifted S-NIAH-1 from
    # 20% to 77%, while the rank choice (nll and mass averaged) and periodic layers added nothing.
    p.add_argument("--criterion", choices=tuple(CRITERIA), default="nll",
                   help="how units are ranked (default: %(default)s; nll and rank run the prompts once per unit; gates trains "
                   "one gate per KV head on the frozen model, DuoAttention's way; retrieval, one pass: attention on the needle "
                   "while answering)")  # fmt: skip
    # Single-unit scores cannot see units that only help together; greedy re-scores given those kept.
    p.add_argument("--select", choices=("top", "greedy"), default="top",
                   help="top: the K best single units; greedy (nll): add, one at a time, the unit that lowers the "
                   "answer NLL most given those kept (default: %(default)s)")  # fmt: skip
    p.add_argument("--pool", type=cli_args.integer(1, what="--pool"), default=None, metavar="P",
                   help="greedy's candidates: the P best single units; costs (P-1)+...+(P-K+1) more prompt passes "
                   "(default: K+6)")  # fmt: skip
    p.add_argument("--samples", type=cli_args.integer(1, what="--samples"), default=4,
                   help="calibration prompts, S-NIAH-1/2/3 in turn (default: %(default)s)")  # fmt: skip
    p.add_argument(
        "--length",
        type=cli_args.size(CALIBRATE_MIN_LENGTH, what="--length"),
        default="2k",
        help=f"prompt token budget, answer included, >= {CALIBRATE_MIN_LENGTH}; {cli_args.SIZE_HELP} (default: %(default)s)",
    )
    p.add_argument("--sinks", type=sinks_list, default=None, metavar="S,S",
                   help="sink counts to try for the streaming side at the same KV bytes, e.g. 4,64 (DuoAttention "
                   "keeps 64): units are chosen on each swa:W:S and the hybrid with the lowest answer NLL is kept "
                   "(default: the method's own)")  # fmt: skip
    p.add_argument("--last-queries", type=cli_args.integer(1, what="--last-queries"), default=64,
                   help="query positions at the prompt's end the mass averages over (default: %(default)s)")  # fmt: skip
    _seed_flag(p, "--seed", CAL_SEED, "seed of the calibration prompts")
    cli_args.add_native_sliding(p, help="the policy the hybrid runs under; keep scores only the global layers' units "
                                "(apply the spec with --native-sliding keep too)")  # fmt: skip
    cli_args.add_out(p, "runs/calibrate", help="folder for calibrate.json, calibrate.png and runs.jsonl (every "
                     "finished run: a stopped calibration resumes, a rerun reuses them)")  # fmt: skip
    _add_runtime(p)
    cli_args.add_scheduler(p, unit="the answer-NLL runs (mass and gates stay in this process)")
    p.set_defaults(func=_cmd_calibrate)


def _register_tune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tune",
        help="search swa:W:S + full layers under a KV-memory budget; report the winner on held-out samples",
        description="Searches windows W, sinks S and K full units (ranked by calibrate's criterion) whose KV "
        "cache at --context fits --kv-budget, scores each on calibration samples, writes the Pareto frontier "
        "(frontier.json, frontier.png) and tune.json, and reports the best spec, full attention and the "
        "best's plain swa:W:S on held-out samples of another seed, with 95% intervals.",
    )
    cli_args.add_model(p)
    p.add_argument("--kv-budget", type=cli_args.kv_budget, required=True, metavar="BYTES",
                   help="KV-cache budget at --context: 24MiB, 512KiB, 1.5GiB (1024-based), 24MB (1000-based) or bytes")  # fmt: skip
    p.add_argument("--context", type=cli_args.size(1, what="--context"), default="4k",
                   help=f"context the budget holds, tokens; {cli_args.SIZE_HELP} (default: %(default)s)")  # fmt: skip
    p.add_argument("--task", type=tune_task, default="niah",
                   help="niah (S-NIAH-1/2/3 average), babilong (QA1-5), ppl, or one runner task (default: %(default)s)")  # fmt: skip
    p.add_argument("--windows", type=cli_args.size_list(2, what="window"), default=None,
                   help="the W grid (default: powers of two from 64 below --context)")  # fmt: skip
    p.add_argument("--sinks", type=sinks_list, default=[4], help="the S values, e.g. 0,4 (default: 4)")
    p.add_argument("--units", choices=("layer", "head"), default="layer",
                   help="full units: whole layers or KV heads (default: %(default)s)")  # fmt: skip
    p.add_argument("--criterion", choices=tuple(CRITERIA), default="mass",
                   help="how units are ranked (default: %(default)s: one pass for every W; nll/rank are slow, and "
                   "nll chose better layers on smollm2-135m; gates trains one gate per KV head for each W)")  # fmt: skip
    p.add_argument("--max-k", type=cli_args.integer(0, what="--max-k"), default=None,
                   help="at most K full units (default: what the budget allows)")  # fmt: skip
    p.add_argument("--samples", type=cli_args.integer(1, what="--samples"), default=2,
                   help="calibration samples per task per candidate (ppl: windows) (default: %(default)s)")  # fmt: skip
    p.add_argument("--heldout-samples", type=cli_args.integer(1, what="--heldout-samples"), default=3,
                   help="held-out samples per task (ppl: windows) (default: %(default)s)")  # fmt: skip
    p.add_argument("--calib-samples", type=cli_args.integer(1, what="--calib-samples"), default=4,
                   help="S-NIAH prompts that score the units (default: %(default)s)")  # fmt: skip
    p.add_argument("--calib-length", type=cli_args.size(1, what="--calib-length"), default=None,
                   help="their token budget (default: --context)")  # fmt: skip
    _seed_flag(p, "--seed", CAL_SEED, "seed of the calibration samples")
    _seed_flag(p, "--heldout-seed", HELDOUT_SEED, "seed of the held-out samples, not --seed")
    p.add_argument("--batch-size", type=cli_args.integer(1, what="--batch-size"), default=None,
                   help="samples decoded as one batch (default: the eval runner's)")  # fmt: skip
    cli_args.add_out(p, "runs/tune", help="folder for frontier.json, frontier.png and tune.json")
    _add_runtime(p)
    p.set_defaults(func=_cmd_tune)

"""``sinkwindow eval …``, ``sinkwindow compare`` and ``sinkwindow report`` subcommands."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from ..cli import args as cli_args
from ..models import resolve
from .tasks import (
    ALL_TASKS,
    BABILONG_MIN_LENGTH,
    BABILONG_PROMPT_RESERVE,
    DEFAULT_TASKS,
    GROUPS,
    LCC_ANSWER_TOKENS,
    LCC_MIN_LENGTH,
    NIAH_ANSWER_TOKENS,
    NIAH_MIN_LENGTH,
    PPL_MIN_LENGTH,
    TASKS,
    group_tasks,
)

__all__ = [
    "register",
    "compare_methods",
    "COMPARE_METHODS",
    "COMPARE_SIZES",
]

logger = logging.getLogger(__name__)

DEFAULT_METHODS = ["full", "swa:64:4", "swa:64:0", "swa:256:4"]
# The main job is the paper's headline comparison at its window (Table 3: w = 256): SWA(256, 4), the
# trained LoLCATs(+SWA) and Liger-GLA(+SWA) retrofits of the same window, the no-sink ablation, and
# dense-prompt eviction (the other reading of "SWA at inference time"). A trained baseline runs when an
# adapter ships for the model (or --checkpoint gives one); otherwise compare says so and leaves it out.
COMPARE_METHODS = ["full", "swa:256:4", "lolcats:256", "liger:256", "swa:256:0", "evict:256:4"]

# The main job's two sizes. quick must finish in <= 20 minutes on 2 CPU cores (SmolLM2-135M), install
# included. There a sample costs 1-9 s, set by its length more than by the method (prefill about 400
# tokens/s; a decode step about 75 ms, memory-bound: every token reads the 0.5 GB of fp32 weights), and
# 0.5-2K on both tasks (294 samples) took 22.5 min on a quiet machine. So quick keeps S-NIAH's ends,
# 0.5K (where SWA(256, 4) and lolcats:256 both still retrieve) and 2K (where the reference run
# separates them), and BABILong's 0K and 1K; the reference run has every length at n = 30.
COMPARE_SIZES: dict[str, dict] = {
    "quick": dict(
        lengths=[512, 2048],
        babilong_lengths=[0, 1024],
        ppl_lengths=[2048],
        ppl_windows=1,
        samples=2,
        niah_max_new_tokens=None,
    ),
    "full": dict(
        lengths=[512, 1024, 2048, 4096],
        babilong_lengths=[0, 1024, 2048, 4096],
        ppl_lengths=[2048, 4096],
        ppl_windows=4,
        samples=10,
        niah_max_new_tokens=128,
    ),
}


def _decode_cap(text: str) -> int | None:
    """``--niah-max-new-tokens``: ``auto`` (answer length + 16) -> ``None``, or 1 .. 128 tokens."""
    if str(text).strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"use auto or an integer from 1 to {NIAH_ANSWER_TOKENS}, got {text!r}"
        ) from None
    if not 1 <= value <= NIAH_ANSWER_TOKENS:
        raise argparse.ArgumentTypeError(
            f"must be from 1 to {NIAH_ANSWER_TOKENS} (the answer budget every haystack is sized with), "
            f"or auto for the answer's length + 16; got {value}"
        )
    return value


def _task_list(family: str):
    def parse(text: str) -> list[str]:
        known = group_tasks(family)
        tasks = [t.strip() for t in str(text).split(",")]
        if not all(tasks):
            raise argparse.ArgumentTypeError(
                f"give task names separated by single commas, from {', '.join(known)}"
            )
        unknown = [t for t in tasks if t not in known]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {family} task(s) {', '.join(unknown)}; choose from {', '.join(known)}"
            )
        return list(dict.fromkeys(tasks))

    parse.__name__ = "task list"
    return parse


def _add_ruler_qa_data(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--ruler-qa-data",
        type=cli_args.existing_dir("--ruler-qa-data"),
        default=None,
        help="folder with RULER's squad.json (SQuAD 2.0 dev) and/or hotpotqa.json (HotpotQA dev, "
        "distractor) for qa_1 / qa_2; nothing is downloaded",
    )


def _compare_tasks(text: str) -> list[str]:
    """``compare --tasks``: task names and groups (``niah``, ``babilong``, ``ppl``, ``code``, ``ruler``),
    commas between."""
    names = [t.strip() for t in str(text).split(",")]
    unknown = [t for t in names if t not in GROUPS and t not in ALL_TASKS]
    if not all(names) or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown task(s) {', '.join(unknown) or repr(text)}; give tasks or groups separated by single "
            f"commas, from {', '.join(dict.fromkeys([*GROUPS, *ALL_TASKS]))}"
        )
    return list(dict.fromkeys(t for name in names for t in GROUPS.get(name, (name,))))


def _add_common(
    p: argparse.ArgumentParser, methods_default: list[str] | None, methods_help: str | None = None
) -> None:
    cli_args.add_model(p)
    cli_args.add_methods(p, methods_default, help=methods_help)
    cli_args.add_checkpoint(p)
    cli_args.add_seed(p, 42)
    cli_args.add_chunk_size(p, 512)
    cli_args.add_native_sliding(p)
    cli_args.add_device(p, None, shown="cpu")
    cli_args.add_device_map(p)
    cli_args.add_dtype(p, None, shown="float32")
    p.add_argument(
        "--batch-size",
        type=cli_args.integer(1, what="--batch-size"),
        default=None,
        help="samples decoded as one left-padded batch; results do not depend on it "
        "(default: 8 on CPU, 32 on CUDA)",
    )
    cli_args.add_threads(p, help=cli_args.THREADS_HELP + "; workers of --workers/--ray get their own")
    cli_args.add_no_progress(p)
    cli_args.add_new_run(p)
    cli_args.add_scheduler(p)
    cli_args.add_allow_dirty(p)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the cells, estimated tokens and GPU-hours of this sweep, and run nothing",
    )


def _dry_run(cfgs: list) -> int:
    from .pricing import format_sweep_plan, sweep_plan

    plan = sweep_plan(cfgs)
    print(format_sweep_plan(plan))
    print(json.dumps({"dry_run": True, **plan["total"]}))
    return 0


def _run_scheduled(cfg, out, args, model_and_tokenizer=None):
    """``run_eval`` with the scheduler the flags ask for; failed cells exit 1 after the rest is stored."""
    from .runner import run_eval
    from .scheduler import CellsFailedError

    if cfg.workers is not None or cfg.ray is not None:
        model_and_tokenizer = None  # each worker loads its own copy; none is shipped from here

    def announce(session: dict) -> None:
        # What a resume has left, counted against the folder (the plan's size would overstate it).
        print(
            f"running {session['samples_to_run']} sample(s) ({session['rows_before']} row(s) already in "
            f"{out}): {session['scheduler']}",
            file=sys.stderr,
        )

    try:
        return run_eval(
            cfg,
            out,
            model_and_tokenizer=model_and_tokenizer,
            progress=not args.no_progress,
            new_run=args.new_run,
            redo=args.redo,
            on_start=announce,
            source_diff=args.source_diff,
        )
    except CellsFailedError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None


def _add_babilong_facts(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--babilong-facts",
        choices=["real", "generated"],
        default="real",
        help="BABILong facts: the released bAbI test questions BABILong uses (shipped; 1,000 per task, "
        "its 100-question subset first) or sinkwindow's seeded generator (any number, recorded as a "
        "deviation) (default: %(default)s)",
    )
    p.add_argument(
        "--babilong-data",
        default=None,
        metavar="PATH",
        help="BABILong data instead of the shipped files: a BABILong JSON folder as the hub dataset "
        "ships it (data/qa1/0k.json ...; published samples used as they are) or a bAbI folder "
        "(qa1_*_test.txt ...)",
    )


def _check_units(model: str, methods: list[str]) -> None:
    """Refuse hybrid units the model does not have before it loads, where its config is at hand."""
    from ..runtime.spec import parse_spec

    hybrids = [spec for spec in map(parse_spec, methods) if spec.is_hybrid]
    if not hybrids:
        return
    from ..models.loading import model_config
    from ..runtime.kv_bytes import kv_geometry

    config = model_config(model)
    if config is None:
        return  # checked after the load, as before
    layers, _, kv_heads, _ = kv_geometry(config)
    for spec in hybrids:
        spec.check_units(layers, kv_heads)


def _source_diff(args: argparse.Namespace) -> str | None:
    """Refuse uncommitted source before anything loads (a dry run writes nothing and is let through)."""
    from ..runs.provenance import check_clean_source

    return None if args.dry_run else check_clean_source(args.allow_dirty)


def _cmd_eval(args: argparse.Namespace) -> int:
    from .report import write_report
    from .runner import EvalConfig

    args.source_diff = _source_diff(args)

    tasks = args.tasks or list(group_tasks(args.family))
    if not args.tasks and getattr(args, "ruler_qa_data", None) is None:
        from .tasks import RULER_QA

        if any(t in RULER_QA for t in tasks):
            tasks = [t for t in tasks if t not in RULER_QA]
            print(
                f"note: {', '.join(RULER_QA)} left out: they run on RULER's QA data, give --ruler-qa-data DIR",
                file=sys.stderr,
            )
    methods, checkpoints = resolve.resolve_checkpoints(args.checkpoint, args.methods)
    _check_units(args.model, methods)
    device, device_map = resolve.resolve_placement(args.device, args.device_map)
    lengths = args.lengths
    cfg = EvalConfig(
        model=args.model,
        methods=methods,
        tasks=tasks,
        lengths=lengths,
        babilong_lengths=lengths,
        ppl_lengths=lengths,
        samples=args.samples,
        ppl_windows=args.samples,
        seed=args.seed,
        chunk_size=args.chunk_size,
        niah_max_new_tokens=getattr(args, "niah_max_new_tokens", NIAH_ANSWER_TOKENS),
        niah_depths=getattr(args, "depths", "random"),
        native_sliding=args.native_sliding,
        checkpoints=checkpoints,
        babilong_facts=getattr(args, "babilong_facts", "real"),
        babilong_data=getattr(args, "babilong_data", None),
        ruler_qa_data=getattr(args, "ruler_qa_data", None),
        device=device,
        device_map=device_map,
        dtype=args.dtype,
        batch_size=args.batch_size,
        workers=args.workers,
        ray=args.ray,
        threads=args.threads,
    )
    if args.dry_run:
        return _dry_run([cfg])
    store = _run_scheduled(cfg, args.out, args)
    path = write_report(args.out, store=store)
    results = Path(args.out) / "results.jsonl"
    print(f"{len(store)} results in {results}; report: {path}")
    print(json.dumps({"out": str(args.out), "results": len(store), "report": str(path)}))
    return 0


def compare_methods(model: str, with_checkpoint: set[str] = frozenset()) -> tuple[list[str], list[str]]:
    """The main job's default methods for ``model``: ``COMPARE_METHODS``, trained baselines only where
    an adapter ships for the model or a checkpoint is given. Returns ``(methods, notes on what was left out)``.
    """
    from ..linear.adapters import shipped_adapter
    from ..runtime.spec import parse_spec

    methods = [
        m
        for m in COMPARE_METHODS
        if not parse_spec(m).is_trained or m in with_checkpoint or shipped_adapter(model, m) is not None
    ]
    notes = [
        f"{m} left out: no trained adapter ships for {model}; train one (sinkwindow train --method {m}) "
        f"and pass --checkpoint {m}=PATH"
        for m in COMPARE_METHODS
        if m not in methods
    ]
    return methods, notes


def _add_depths(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--depths",
        choices=("random", "stratified"),
        default="random",
        help="S-NIAH needle depths: random (RULER, default) or stratified (spread evenly over a cell's "
        "samples, so the share inside a method's window is what its size predicts; recorded in the fingerprint)",
    )


def _cmd_compare(args: argparse.Namespace) -> int:
    from .report import write_report
    from .runner import plan_size

    args.source_diff = None if args.paper else _source_diff(args)

    size = "full" if args.full else "quick"
    cfg = _compare_config(args, size)
    if args.paper:
        from .pricing import PAPER_MODELS

        return _dry_run(list(PAPER_MODELS))
    if args.dry_run:
        return _dry_run([cfg])
    out = Path(args.out)
    print(
        f"sinkwindow compare ({size}): model {cfg.model}; methods {', '.join(cfg.methods)}\n"
        + "".join(f"  {line}\n" for line in _compare_lines(cfg))
        + f"  {plan_size(cfg)} samples in all; results -> {out / 'results.jsonl'} (re-run to resume)",
        file=sys.stderr,
    )
    model_tok = _compare_model(args, cfg)
    if args.short_data and not args.new_run:
        # The short tasks run after the long part: a folder they cannot resume must be refused now,
        # not hours later.
        _short_tasks(args, cfg, model_tok, out, check_only=True)
    store = _run_scheduled(cfg, out, args, model_tok)
    extra = []
    if args.short_data:
        extra = _short_tasks(args, cfg, model_tok, out)
    path = write_report(out, extra_sections=extra, store=store, reference_run=_reference_run(args, cfg.model))
    print((out / "report.md").read_text().split("## Perplexity")[0])
    print(f"report: {path} (and report.html, PNGs, summary.json)")
    print(
        json.dumps(
            {
                "out": str(out),
                "size": size,
                "methods": cfg.methods,
                "results": len(store),
                "report": str(path),
            }
        )
    )
    return 0


def _compare_lines(cfg) -> list[str]:
    """What each task group of a compare run measures, one line each, in the run's task order."""
    groups = list(dict.fromkeys(TASKS[t].group for t in cfg.tasks))
    said = {
        "ppl": f"perplexity: {cfg.ppl_windows} essay window(s) at {cfg.ppl_lengths} tokens",
        "niah": f"S-NIAH: {', '.join(t for t in cfg.tasks if TASKS[t].group == 'niah')}: "
        f"{cfg.samples} samples x lengths {cfg.lengths}",
        "babilong": f"BABILong: {', '.join(t for t in cfg.tasks if TASKS[t].group == 'babilong')}: "
        f"{cfg.samples} samples x lengths {cfg.babilong_lengths}",
    }
    return [
        said.get(g, f"{', '.join(t for t in cfg.tasks if TASKS[t].group == g)}: {cfg.samples} samples x "
                 f"lengths {TASKS[next(t for t in cfg.tasks if TASKS[t].group == g)].lengths(cfg)}")
        for g in groups
    ]  # fmt: skip


def _compare_config(args: argparse.Namespace, size: str):
    """The long-context part of ``compare`` as an ``EvalConfig``: the size's counts, the methods
    (the default list, or what ``--methods`` gives, with their checkpoints) and the run flags."""
    from .runner import EvalConfig

    methods = args.methods
    if methods is None:
        methods, notes = compare_methods(args.model, {m for m, _ in args.checkpoint or [] if m})
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    methods, checkpoints = resolve.resolve_checkpoints(args.checkpoint, methods)
    _check_units(args.model, methods)
    device, device_map = resolve.resolve_placement(args.device, args.device_map)
    sizes = dict(COMPARE_SIZES[size])
    if args.samples is not None:
        sizes["samples"] = args.samples
    return EvalConfig(
        model=args.model,
        methods=methods,
        tasks=list(args.tasks or DEFAULT_TASKS),
        seed=args.seed,
        niah_depths=args.depths,
        chunk_size=args.chunk_size,
        native_sliding=args.native_sliding,
        checkpoints=checkpoints,
        babilong_facts=args.babilong_facts,
        babilong_data=args.babilong_data,
        ruler_qa_data=args.ruler_qa_data,
        device=device,
        device_map=device_map,
        dtype=args.dtype,
        batch_size=args.batch_size,
        workers=args.workers,
        ray=args.ray,
        threads=args.threads,
        **sizes,
    )


def _compare_model(args: argparse.Namespace, cfg):
    """The model this process loads once for every method, or ``None`` when workers load their own
    (and no short tasks need it here)."""
    import torch

    from ..models.loading import load

    scheduled = cfg.workers is not None or cfg.ray is not None
    if not scheduled or args.short_data:
        from ..runtime.threads import apply_threads

        apply_threads(args.threads)  # before the load; run_eval keeps this choice
        placement = (
            {"device_map": cfg.device_map} if cfg.device_map is not None else {"device": cfg.device or "cpu"}
        )
        return load(cfg.model, dtype=getattr(torch, cfg.dtype or "float32"), **placement)
    return None


def _short_tasks(args, cfg, model_tok, out: Path, *, check_only: bool = False) -> list[str]:
    """Run the six short tasks through lm-eval into ``OUT/short`` (its own results store, fingerprint
    and lock) when their data is given; return report sections. ``check_only``: only check that
    ``OUT/short`` can resume with these settings (raises like the run would)."""
    import importlib.util

    from .lmeval import LmEvalConfig, recovery_table, run_lmeval

    if importlib.util.find_spec("lm_eval") is None:
        logger.warning("short tasks skipped: lm-eval is not installed (pip install 'sinkwindow[lmeval]')")
        return []
    short = LmEvalConfig(
        cfg.model, cfg.methods, tasks=None, data_dir=args.short_data, limit=args.short_limit,
        checkpoints=cfg.checkpoints, workers=cfg.workers, ray=cfg.ray,
    )  # fmt: skip
    rows = run_lmeval(
        short,
        str(out / "short"),
        model_tok,
        new_run=args.new_run,  # run_eval moved OUT/short aside already; this keeps the two in step
        redo=args.redo,
        check_only=check_only,
    )
    if check_only:
        return []
    md, _ = recovery_table(rows)
    return [f"## Short tasks (lm-evaluation-harness, limit {args.short_limit or 'none'})", "", md, ""]


def _reference_dir(value: str) -> str:
    """``none`` or a run folder holding ``results.jsonl``."""
    if value == "none":
        return value
    if not (Path(value) / "results.jsonl").is_file():
        raise argparse.ArgumentTypeError(
            f"{value} holds no results.jsonl: pass a folder written by sinkwindow compare, or none"
        )
    return value


def _reference_run(args: argparse.Namespace, model: str) -> Path | None:
    """``--reference-run``: a folder, ``none``, or (unset) the committed ``<date>-<model>-long`` run."""
    from .committed_run import REFERENCE_SUFFIX, find_reference_run

    choice = getattr(args, "reference_run", None)
    if choice == "none":
        return None
    if choice is not None:
        return Path(choice)
    found = find_reference_run(model)
    if found is None:
        print(
            f"note: no reference run for {model} here (benchmarks/results/<date>-{model}{REFERENCE_SUFFIX}/ "
            "in a source checkout); the report has the quick numbers only",
            file=sys.stderr,
        )
    return found


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report
    from .results import RESULTS_FILE

    run = Path(args.run_dir)
    reference = getattr(args, "reference_run", None)
    if (run / "bench.jsonl").exists() and not (run / RESULTS_FILE).exists():
        from ..bench.report import write_folder_report  # a bench folder: its own report

        path = write_folder_report(run)
    else:
        path = write_report(run, reference_run=None if reference == "none" else reference)
    print(path)
    print(json.dumps({"run_dir": str(args.run_dir), "report": str(path)}))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """``eval FAMILY``, ``compare`` and ``report``."""
    _register_eval(sub)
    _register_compare(sub)
    _register_report(sub)


def _eval_families() -> tuple:
    """``(family, help, default lengths, --lengths type, --lengths help)`` of each ``eval`` family."""
    k = cli_args.SIZE_HELP
    return (
        (
            "niah",
            "S-NIAH-1/2/3 (RULER single needle)",
            "512,1k,2k,4k",
            cli_args.size_list(
                NIAH_MIN_LENGTH, why=f"the {NIAH_ANSWER_TOKENS}-token answer budget plus RULER's template"
            ),
            f"token budgets, prompt + answer, each >= {NIAH_MIN_LENGTH}; {k} (default: %(default)s)",
        ),
        (
            "babilong",
            "BABILong QA1-QA5 (bAbI facts in essay text)",
            "0,1k,2k,4k",
            cli_args.size_list(
                BABILONG_MIN_LENGTH,
                zero_ok=True,
                why=f"BABILong keeps {BABILONG_PROMPT_RESERVE} for the prompt; 0 is 0K, the facts alone",
            ),
            f"token budgets, 0 (facts only) or >= {BABILONG_MIN_LENGTH}; {k} (default: %(default)s)",
        ),
        (
            "ruler",
            "RULER's synthetic tasks: S-NIAH-1/2/3, multi-key/value/query NIAH, vt, cwe, fwe",
            "1k,2k,4k",
            cli_args.size_list(
                NIAH_MIN_LENGTH, why=f"the {NIAH_ANSWER_TOKENS}-token answer budget plus RULER's template"
            ),
            f"token budgets, prompt + answer, each >= {NIAH_MIN_LENGTH} (vt, cwe: >= 1024; the other "
            f"RULER-only tasks: >= 512); {k} (default: %(default)s)",
        ),
        (
            "ppl",
            "perplexity of essay windows, streamed through the method's cache",
            "2048",
            cli_args.size_list(
                PPL_MIN_LENGTH, what="window length", why="one token to predict from and one to predict"
            ),
            f"window lengths, each >= {PPL_MIN_LENGTH} tokens; {k} (default: %(default)s)",
        ),
        (
            "code",
            "LCC: next-line completion on the Python stdlib (LongBench edit similarity)",
            "1k,2k,4k",
            cli_args.size_list(
                LCC_MIN_LENGTH, why=f"the {LCC_ANSWER_TOKENS}-token answer budget, the template and some code"
            ),
            f"token budgets, prompt + answer, each >= {LCC_MIN_LENGTH}; {k} (default: %(default)s)",
        ),
    )


def _register_eval(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval", help="run one evaluation family: niah | babilong | ruler | ppl | code | lm-eval"
    )
    fam = p.add_subparsers(dest="family", metavar="FAMILY")
    for family, helptext, lengths, lengths_type, lengths_help in _eval_families():
        q = fam.add_parser(family, help=helptext)
        _add_common(q, ["full", "swa:64:4"])
        q.add_argument(
            "--tasks",
            type=_task_list(family),
            default=None,
            help={
                "niah": "subset, e.g. niah_single_3 or niah_single_1,niah_single_2",
                "babilong": "subset, e.g. babilong_qa1 or babilong_qa1,babilong_qa2",
                "ruler": "subset, e.g. vt or niah_multikey_1,cwe,fwe",
            }.get(family, f"{group_tasks(family)[0]}, the only task of this family"),
        )
        q.add_argument("--lengths", type=lengths_type, default=lengths, help=lengths_help)
        q.add_argument(
            "--samples",
            type=cli_args.integer(1, what="--samples"),
            default=10,
            help="samples per task and length (ppl: windows per length) (default: %(default)s)",
        )
        if family in ("niah", "ruler"):
            q.add_argument(
                "--niah-max-new-tokens",
                type=_decode_cap,
                default=str(NIAH_ANSWER_TOKENS),
                help=f"NIAH decode cap, 1 .. {NIAH_ANSWER_TOKENS}, or auto: the answer's length + 16 "
                "(default: %(default)s, as RULER)",
            )
            _add_depths(q)
        if family == "ruler":
            _add_ruler_qa_data(q)
        if family == "babilong":
            _add_babilong_facts(q)
        cli_args.add_out(q, required=True, help="run folder (resumes if it exists)")
        q.set_defaults(func=_cmd_eval, family=family)
    try:
        from .lmeval import register_lmeval_subcommand
    except ImportError:
        pass
    else:
        register_lmeval_subcommand(fam)


def _register_compare(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare", help="the main job: full vs SWA (and trained baselines) on every task, with a report"
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_true", help="small sample counts, <= 20 min on 2 CPU cores (default)"
    )
    size.add_argument("--full", action="store_true", help="paper-like sizes (hours on CPU)")
    _add_depths(p)
    _add_common(
        p,
        None,
        "method specs, comma-separated and/or repeated (default: "
        + ",".join(COMPARE_METHODS)
        + "; lolcats:256 and liger:256 only where a trained adapter ships for the model or --checkpoint gives one)",
    )
    p.add_argument(
        "--samples",
        type=cli_args.integer(1, what="--samples"),
        default=None,
        help="samples per task and length, instead of the size's",
    )
    _add_ruler_qa_data(p)
    p.add_argument(
        "--tasks",
        type=_compare_tasks,
        default=None,
        help="tasks or groups to run, e.g. niah_single_3,babilong, lcc or ruler (default: "
        + ",".join(DEFAULT_TASKS)
        + "; lcc and the RULER-only tasks run only when named)",
    )
    p.add_argument(
        "--short-data",
        type=cli_args.existing_dir("--short-data"),
        default=None,
        help="folder with the six short tasks' JSONL (adds an lm-eval section)",
    )
    p.add_argument(
        "--short-limit",
        type=cli_args.integer(1, what="--short-limit"),
        default=100,
        help="items per short task (default: %(default)s)",
    )
    p.add_argument(
        "--paper",
        action="store_true",
        help="with --dry-run semantics: price the paper's grid (11 models, full/SWA/LoLCATs/Liger, "
        "S-NIAH 0.5-4K, BABILong 0-4K) and run nothing",
    )
    _add_babilong_facts(p)
    p.add_argument(
        "--reference-run",
        type=_reference_dir,
        default=None,
        help="committed long run whose headline tables the report adds, or none (default: the newest "
        "benchmarks/results/<date>-MODEL-long/ of a source checkout, if any)",
    )
    cli_args.add_out(p, "runs/compare", help="run folder (resumes if it exists)")
    p.set_defaults(func=_cmd_compare)


def _register_report(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report", help="rebuild report.md/html and plots of a run folder from its results.jsonl"
    )
    p.add_argument(
        "run_dir", type=cli_args.existing_dir("run folder"), help="a folder a sinkwindow run wrote"
    )
    p.add_argument(
        "--reference-run",
        type=_reference_dir,
        default=None,
        help="a committed long run whose headline tables to add (e.g. benchmarks/results/<date>-smollm2-135m-long)",
    )
    p.set_defaults(func=_cmd_report)

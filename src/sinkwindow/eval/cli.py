"""``sinkwindow eval …``, ``sinkwindow compare`` and ``sinkwindow report`` subcommands."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..models import add_model_argument

__all__ = ["register", "COMPARE_SIZES"]

logger = logging.getLogger(__name__)

DEFAULT_METHODS = ["full", "swa:64:4", "swa:64:0", "swa:256:4"]

# The main job's two sizes. quick must finish in <= 20 minutes on 2 CPU cores (SmolLM2-135M).
COMPARE_SIZES: dict[str, dict] = {
    "quick": dict(
        lengths=[512, 1024, 2048],
        babilong_lengths=[0, 1024, 2048],
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


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str) -> list[int]:
    out = []
    for t in _csv(text):
        t = t.lower()
        mult = 1024 if t.endswith("k") else 1
        out.append(int(float(t.rstrip("k")) * mult))
    return out


def _checkpoints(pairs: list[str] | None) -> dict[str, str]:
    out = {}
    for p in pairs or []:
        if "=" not in p:
            raise ValueError(f"--checkpoint takes METHOD=PATH (e.g. lolcats:64=runs/lolcats64), got {p!r}")
        m, path = p.split("=", 1)
        from ..spec import parse_spec

        out[str(parse_spec(m))] = path
    return out


def _add_common(p: argparse.ArgumentParser, methods_default: str) -> None:
    add_model_argument(p)
    p.add_argument(
        "--method",
        "--methods",
        dest="methods",
        default=methods_default,
        help="comma-separated methods (default: %(default)s)",
    )
    p.add_argument(
        "--checkpoint",
        action="append",
        metavar="METHOD=PATH",
        help="trained checkpoint of a linear baseline, e.g. lolcats:64=runs/lolcats64 (repeatable)",
    )
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--chunk-size", type=int, default=512, help="prefill chunk (default: %(default)s)")
    p.add_argument(
        "--native-sliding",
        choices=["override", "keep"],
        default="override",
        help="SWA on models with native sliding layers: every layer, or global layers only",
    )
    p.add_argument("--no-progress", action="store_true")


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


def _cmd_eval(args: argparse.Namespace) -> int:
    from .report import write_report
    from .runner import BABILONG_TASKS, NIAH_TASKS, EvalConfig, run_eval

    tasks = {"niah": list(NIAH_TASKS), "babilong": list(BABILONG_TASKS), "ppl": ["ppl"]}[args.family]
    if args.tasks:
        tasks = _csv(args.tasks)
    lengths = _ints(args.lengths)
    cfg = EvalConfig(
        model=args.model,
        methods=_csv(args.methods),
        tasks=tasks,
        lengths=lengths,
        babilong_lengths=lengths,
        ppl_lengths=lengths,
        samples=args.samples,
        ppl_windows=args.samples,
        seed=args.seed,
        chunk_size=args.chunk_size,
        niah_max_new_tokens=None if args.niah_max_new_tokens == 0 else args.niah_max_new_tokens,
        native_sliding=args.native_sliding,
        checkpoints=_checkpoints(args.checkpoint),
        babilong_facts=getattr(args, "babilong_facts", "real"),
        babilong_data=getattr(args, "babilong_data", None),
    )
    store = run_eval(cfg, args.out, progress=not args.no_progress)
    path = write_report(args.out)
    print(f"{len(store)} results in {Path(args.out) / 'results.jsonl'}; report: {path}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from ..models import load
    from .report import write_report
    from .runner import EvalConfig, plan_size, run_eval

    size = "full" if args.full else "quick"
    checkpoints = _checkpoints(args.checkpoint)
    methods = _csv(args.methods)
    methods += [m for m in checkpoints if m not in methods]
    cfg = EvalConfig(
        model=args.model,
        methods=methods,
        seed=args.seed,
        chunk_size=args.chunk_size,
        native_sliding=args.native_sliding,
        checkpoints=checkpoints,
        babilong_facts=args.babilong_facts,
        babilong_data=args.babilong_data,
        **COMPARE_SIZES[size],
    )
    if args.samples:
        cfg.samples = args.samples
    out = Path(args.out)
    print(
        f"sinkwindow compare ({size}): model {cfg.model}; methods {', '.join(cfg.methods)}\n"
        f"  perplexity: {cfg.ppl_windows} essay window(s) at {cfg.ppl_lengths} tokens\n"
        f"  S-NIAH-1/2/3: {cfg.samples} samples x lengths {cfg.lengths}\n"
        f"  BABILong QA1-5: {cfg.samples} samples x lengths {cfg.babilong_lengths}\n"
        f"  {plan_size(cfg)} samples in all; results -> {out / 'results.jsonl'} (re-run to resume)",
        file=sys.stderr,
    )
    model_tok = load(cfg.model)
    run_eval(cfg, out, model_and_tokenizer=model_tok, progress=not args.no_progress)
    extra = []
    if args.short_data:
        extra = _short_tasks(args, cfg, model_tok, out)
    path = write_report(out, extra_sections=extra)
    print((out / "report.md").read_text().split("## Perplexity")[0])
    print(f"report: {path} (and report.html, PNGs, summary.json)")
    return 0


def _short_tasks(args, cfg, model_tok, out: Path) -> list[str]:
    """Run the six short tasks through lm-eval when their data is given; return report sections."""
    try:
        from .lmeval import recovery_table, run_lmeval
    except ImportError as err:
        logger.warning("short tasks skipped: %s (pip install 'sinkwindow[lmeval]')", err)
        return []
    rows = run_lmeval(
        cfg.model,
        cfg.methods,
        tasks=None,
        data_dir=args.short_data,
        limit=args.short_limit,
        out_dir=str(out / "short"),
        model_and_tokenizer=model_tok,
        checkpoints=cfg.checkpoints,
    )
    md, _ = recovery_table(rows)
    return [f"## Short tasks (lm-evaluation-harness, limit {args.short_limit or 'none'})", "", md, ""]


def _cmd_report(args: argparse.Namespace) -> int:
    from .report import write_report

    path = write_report(args.run_dir)
    print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="run one evaluation family: niah | babilong | ppl | lm-eval")
    fam = p.add_subparsers(dest="family", metavar="FAMILY")
    for family, helptext, lengths in (
        ("niah", "S-NIAH-1/2/3 (RULER single needle)", "512,1024,2048,4096"),
        ("babilong", "BABILong QA1-QA5 (bAbI facts in essay text)", "0,1024,2048,4096"),
        ("ppl", "perplexity of essay windows, streamed through the method's cache", "2048"),
    ):
        q = fam.add_parser(family, help=helptext)
        _add_common(q, "full,swa:64:4")
        q.add_argument(
            "--tasks", default=None, help="subset, e.g. niah_single_3 or babilong_qa1,babilong_qa2"
        )
        q.add_argument(
            "--lengths", default=lengths, help="token budgets, e.g. 512,1k,2k (default: %(default)s)"
        )
        q.add_argument("--samples", type=int, default=10, help="samples per task and length (ppl: windows)")
        q.add_argument(
            "--niah-max-new-tokens", type=int, default=128, help="NIAH decode cap; 0 = answer length + 16"
        )
        if family == "babilong":
            _add_babilong_facts(q)
        q.add_argument("--out", required=True, help="run folder (resumes if it exists)")
        q.set_defaults(func=_cmd_eval, family=family)
    try:
        from .lmeval import register_lmeval_subcommand
    except ImportError:
        pass
    else:
        register_lmeval_subcommand(fam)

    p = sub.add_parser(
        "compare", help="the main job: full vs SWA (and trained baselines) on every task, with a report"
    )
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_true", help="small sample counts, <= 20 min on 2 CPU cores (default)"
    )
    size.add_argument("--full", action="store_true", help="paper-like sizes (hours on CPU)")
    _add_common(p, ",".join(DEFAULT_METHODS))
    p.add_argument("--samples", type=int, default=None, help="override samples per task and length")
    p.add_argument(
        "--short-data", default=None, help="folder with the six short tasks' JSONL (adds an lm-eval section)"
    )
    p.add_argument("--short-limit", type=int, default=100, help="items per short task (default: %(default)s)")
    _add_babilong_facts(p)
    p.add_argument(
        "--out", default="runs/compare", help="run folder (default: %(default)s; resumes if it exists)"
    )
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser(
        "report", help="rebuild report.md/html and plots of a run folder from its results.jsonl"
    )
    p.add_argument("run_dir")
    p.set_defaults(func=_cmd_report)

"""``sinkwindow baseline``: a candidate C beside its base B under full attention and SWA at equal memory."""

from __future__ import annotations

import argparse
import json
import sys

from ...cli import args as cli_args
from ..tasks import ALL_TASKS, BABILONG_TASKS, GROUPS, NIAH_TASKS

__all__ = ["register"]


def _tasks(text: str) -> list[str]:
    """Task names and groups (``niah``, ``babilong``, ``ppl``, ``code``), commas between."""
    names = [t.strip() for t in str(text).split(",")]
    unknown = [t for t in names if t not in GROUPS and t not in ALL_TASKS]
    if not all(names) or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown task(s) {', '.join(unknown) or repr(text)}; give tasks or groups separated by single "
            f"commas, from {', '.join(dict.fromkeys([*GROUPS, *ALL_TASKS]))}"
        )
    return list(dict.fromkeys(t for name in names for t in GROUPS.get(name, (name,))))


def _cmd_baseline(args: argparse.Namespace) -> int:
    from ...models.resolve import resolve_checkpoints
    from ...runs.provenance import check_clean_source
    from ...runtime.threads import apply_threads
    from .candidate import parse_candidate
    from .report import write_baseline_report
    from .run import BaselineConfig, run_baseline

    source_diff = check_clean_source(args.allow_dirty)
    cand = parse_candidate(args.candidate)
    _, checkpoints = resolve_checkpoints(
        args.checkpoint, [cand.spec] if cand.is_method else [], add_methods=False
    )
    config = BaselineConfig(
        candidate=args.candidate, base=args.base, tasks=args.tasks or [*NIAH_TASKS, *BABILONG_TASKS],
        lengths=args.lengths, samples=args.samples, seed=args.seed, chunk_size=args.chunk_size,
        sinks=args.sinks, checkpoints=checkpoints, trust_remote_code=args.trust_remote_code,
        dtype=args.dtype, device=args.device,
    )  # fmt: skip
    apply_threads(args.threads)
    print(f"sinkwindow baseline: candidate {args.candidate}, base {args.base} -> {args.out}", file=sys.stderr)
    record = run_baseline(config, args.out, new_run=args.new_run, source_diff=source_diff)
    path = write_baseline_report(args.out)
    print(path.read_text().split("## State bytes")[0])
    choice = record["choice"]
    print(json.dumps({"out": str(args.out), "report": str(path), "window": choice["window"],
                      "state_bytes": choice["budget_bytes"], "eval_context": record["eval_context"]}))  # fmt: skip
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """``baseline``."""
    p = sub.add_parser(
        "baseline",
        help="bring your own sub-quadratic model: it, its base under full attention and SWA at equal memory",
    )
    p.add_argument("--candidate", required=True, type=cli_args.non_empty("--candidate"),
                   help="the candidate: a hub id, folder or .gguf, or a retrofit of the base (lolcats:256, liger:256, linear)")  # fmt: skip
    p.add_argument("--base", required=True, type=cli_args.non_empty("--base"),
                   help="the transformer the candidate came from (packaged name, hub id, folder, .gguf)")  # fmt: skip
    p.add_argument("--tasks", type=_tasks, default=None,
                   help="tasks or groups (default: niah,babilong, compare --quick's cells)")  # fmt: skip
    p.add_argument("--lengths", type=cli_args.size_list(1, zero_ok=True), default=None,
                   help="every task's lengths (default: S-NIAH 512,2k; BABILong 0,1k); " + cli_args.SIZE_HELP)  # fmt: skip
    p.add_argument("--samples", type=cli_args.integer(1, what="--samples"), default=None,
                   help="samples per task and length (default: 2)")  # fmt: skip
    p.add_argument(
        "--sinks", type=cli_args.integer(0, what="--sinks"), default=4, help="S of SWA(W, S) (default: 4)"
    )
    p.add_argument("--trust-remote-code", action="store_true",
                   help="let the candidate's own modelling code run (transformers' trust_remote_code); off unless given")  # fmt: skip
    cli_args.add_checkpoint(p)
    cli_args.add_seed(p, 42)
    cli_args.add_chunk_size(p, 512)
    cli_args.add_device(p, None, shown="cpu")
    cli_args.add_dtype(p, None, shown="float32")
    cli_args.add_threads(p)
    cli_args.add_allow_dirty(p)
    p.add_argument(
        "--new-run", action="store_true", help="start over in --out (old rows move to previous-<time>/)"
    )
    cli_args.add_out(p, "runs/baseline", help="run folder (resumes if it exists)")
    p.set_defaults(func=_cmd_baseline)

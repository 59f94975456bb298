"""The command lines: ``sinkwindow eval lm-eval`` and the ``sinkwindow-lm-eval`` console script.

- ``sinkwindow eval lm-eval`` (:func:`register_lmeval_subcommand`) runs :func:`run_lmeval` into a
  run folder and prints Table 1; ``--new-run`` starts the folder over.
- ``sinkwindow-lm-eval`` (:func:`cli_evaluate`) is lm-eval's own CLI with model ``sinkwindow``
  registered and the offline task configs included.

lm-eval is imported only when a command runs, so building the ``sinkwindow`` CLI stays cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ...cli import args as cli_args
from ...cli import errors as cli_errors
from ...models import resolve
from .constants import DEFAULT_MAX_BATCH_TOKENS, SHORT_TASKS
from .runner import LmEvalConfig, run_lmeval
from .table import recovery_table
from .tasks import TASKS_DIR
from .tasks import utils as _local

__all__ = ["cli_evaluate", "register_lmeval_subcommand"]


def cli_evaluate(argv: Sequence[str] | None = None) -> int:
    """``sinkwindow-lm-eval``: lm-eval's own CLI with model ``sinkwindow`` registered; the exit code.

    Also adds ``--include_path`` pointing at the offline task configs (unless one is given), and
    takes ``--data-dir DIR`` (exported as ``$SINKWINDOW_SHORT_DATA`` for those configs)::

        sinkwindow-lm-eval --model sinkwindow --model_args pretrained=smollm2-135m,method=swa:64:4 \\
            --tasks arc_easy_local,piqa_local --data-dir $SHORT --limit 50 --device cpu

    User errors (a missing ``--data-dir``, lm-eval not installed, a bad value) print one line and
    give exit code 2; ``--debug`` (ours, not passed on) shows the traceback instead.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = cli_errors.wants_debug(args)
    if debug:
        args.remove("--debug")
    return cli_errors.run_reporting_errors(
        lambda: _cli_evaluate(args), prog="sinkwindow-lm-eval", debug=debug
    )


def _cli_evaluate(args: list[str]) -> int:
    for flag in ("--data-dir", "--data_dir"):
        for i, arg in enumerate(args):
            if arg == flag and i + 1 < len(args):
                value = args[i + 1]
                del args[i : i + 2]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
                del args[i]
            else:
                continue
            folder = Path(value).expanduser().resolve()
            if not folder.is_dir():
                raise FileNotFoundError(
                    f"{flag} {value}: no such folder; give the folder of the short tasks' JSONL"
                )
            os.environ[_local.DATA_ENV] = str(folder)
            break
    takes_include = bool(args) and args[0] not in ("-h", "--help")  # bare or help: lm-eval prints help
    if takes_include and not any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        args += ["--include_path", str(TASKS_DIR)]
    from .model import register

    register()  # importing the model module registers "sinkwindow" with lm-eval
    from lm_eval.__main__ import cli_evaluate as _lm_eval_cli

    saved = sys.argv
    sys.argv = [saved[0] if saved else "sinkwindow-lm-eval", *args]
    try:
        _lm_eval_cli()
    except SystemExit as exit_:  # lm-eval's argparse: usage errors keep their own message
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    finally:
        sys.argv = saved
    return 0


def _limit_value(text: str, task: str | None = None) -> int | float:
    where = f" for {task}" if task else ""
    try:
        value = float(text) if "." in text else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"limit{where} must be a count or a fraction, got {text!r} (e.g. 100, 0.1, or 100,mmlu=2)"
        ) from None
    if isinstance(value, int) and value < 1:
        raise argparse.ArgumentTypeError(f"limit{where} must be >= 1 items, got {value}")
    if isinstance(value, float) and not 0 < value < 1:
        # lm-eval reads a limit below 1 as a fraction of the task and anything else as a count.
        raise argparse.ArgumentTypeError(
            f"a fractional limit{where} must be in (0, 1), got {value}; write a count as an integer"
        )
    return value


def _parse_limit(text: str | None) -> int | float | dict | None:
    """``--limit``: ``"100"``, ``"0.1"`` (a fraction of each task) or ``"100,mmlu=2"`` (a bare number is
    every other task's limit). Counts must be >= 1 and fractions in (0, 1)."""
    if text is None:
        return None
    text = str(text).strip()
    if not text:
        raise argparse.ArgumentTypeError("--limit is empty: give a count, a fraction or task=N,task=N")
    if "=" not in text:
        return _limit_value(text)
    out: dict[str, float | int] = {}
    for part in text.split(","):
        task, sep, value = part.partition("=")
        task, value = (task.strip(), value.strip()) if sep else ("*", task.strip())
        if not task or not value:
            raise argparse.ArgumentTypeError(
                f"bad --limit item {part!r}: use N or task=N, separated by commas"
            )
        if task in out:
            raise argparse.ArgumentTypeError(f"--limit gives {task if task != '*' else 'the default'} twice")
        out[task] = _limit_value(value, None if task == "*" else task)
    return out


def _task_items(text: str) -> list[str]:
    """``--tasks a,b``: names, none empty."""
    items = [t.strip() for t in str(text).split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"give task names separated by single commas, e.g. {','.join(SHORT_TASKS[:2])} (or all)"
        )
    return items


def _batch_size(text: str) -> int | str:
    """``--batch-size``: an integer >= 1, ``auto`` or ``auto:N`` (lm-eval's own forms)."""
    text = str(text).strip()
    if text == "auto" or (text.startswith("auto:") and text[5:].isdigit() and int(text[5:]) >= 1):
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"batch size must be an integer >= 1, auto or auto:N; got {text!r}")


def _cmd_lmeval(args: argparse.Namespace) -> int:
    methods = list(args.methods)
    if not args.no_baseline and "full" not in methods:
        methods = ["full", *methods]
    methods, checkpoints = resolve.resolve_checkpoints(args.checkpoint, methods)
    tasks = [t for group in args.tasks or [] for t in group] or list(SHORT_TASKS)
    if tasks in (["all"], ["short"]):
        tasks = list(SHORT_TASKS)
    if isinstance(args.limit, dict):
        stray = [t for t in args.limit if t != "*" and t not in tasks]
        if stray:
            raise ValueError(
                f"--limit names {', '.join(stray)}, which --tasks does not run ({', '.join(tasks)}): "
                f"add it to --tasks or drop it from --limit"
            )
    device, device_map = resolve.resolve_placement(args.device, args.device_map)
    from ...runtime.threads import apply_threads

    apply_threads(args.threads)
    config = LmEvalConfig(
        args.model,
        methods,
        tasks,
        data_dir=args.data_dir,
        limit=args.limit,
        num_fewshot=args.num_fewshot,
        batch_size=args.batch_size,
        checkpoints=checkpoints or None,
        device=device or "cpu",
        device_map=device_map,
        dtype=args.dtype,
        max_length=args.max_length,
        max_batch_tokens=args.max_batch_tokens or None,
        resume=not args.no_resume,
        workers=args.workers,
        ray=args.ray,
    )
    rows = run_lmeval(
        config,
        args.out,
        new_run=args.new_run,
        redo=args.redo,
        on_start=lambda session: print(
            f"running {session['pairs_to_run']} (task, method) pair(s) ({session['rows_before']} row(s) "
            f"already in {args.out}): {session['scheduler']}",
            file=sys.stderr,
        ),
    )
    md, data = recovery_table(rows)
    print(md)
    print(json.dumps({"out": str(args.out), "rows": len(rows), "models": data["models"]}, default=str))
    return 0


def register_lmeval_subcommand(eval_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``lm-eval`` to the ``sinkwindow eval`` subcommands; returns its parser."""
    p = eval_subparsers.add_parser(
        "lm-eval",
        help="short-context tasks (MMLU 5-shot, ARC-C/E, HellaSwag, PIQA, WinoGrande) through lm-eval, with recovery",
        description=(
            "Score methods on the paper's short-context tasks with lm-evaluation-harness and print Table 1 "
            "(per-task scores, average, MMLU and average recovery vs full attention). Rows are appended to "
            "OUT/results.jsonl; a rerun skips the pairs already there, picks a pair stopped midway up from its "
            "answered requests (OUT/lm-eval-cache), and refuses a folder made with other settings (shots, "
            "limit, data, checkpoint, dtype ...): --new-run starts it over."
        ),
    )
    cli_args.add_model(p)
    cli_args.add_methods(
        p,
        ["swa:64:4"],
        help="method specs, comma-separated and/or repeated (default: swa:64:4); full is added unless --no-baseline",
    )
    p.add_argument("--no-baseline", action="store_true", help="do not add the full-attention baseline")
    p.add_argument(
        "--tasks",
        action="append",
        type=_task_items,
        help=f"comma-separated tasks (default: all six: {','.join(SHORT_TASKS)}); mmlu_<subject> works too",
    )
    p.add_argument(
        "--data-dir",
        type=cli_args.existing_dir("--data-dir"),
        default=None,
        help="folder with the six tasks as local files in the hub schemas (arc_easy_test.jsonl, piqa_validation.jsonl, ...; docs/data.md lists them); default: stock tasks from the hub",
    )
    p.add_argument(
        "--limit",
        type=_parse_limit,
        default=None,
        help="items per task (per MMLU subject) >= 1, a fraction in (0, 1), or task=N,task=N",
    )
    cli_args.add_out(p, "runs/lm-eval", help="run folder for results.jsonl and the table")
    p.add_argument(
        "--num-fewshot",
        type=cli_args.integer(0, what="--num-fewshot"),
        default=None,
        help="shots for every task (default: MMLU 5, others 0)",
    )
    p.add_argument(
        "--batch-size", type=_batch_size, default="8", help="lm-eval batch size (default: %(default)s)"
    )
    cli_args.add_checkpoint(p)
    cli_args.add_device(p, None, shown="cpu")
    cli_args.add_device_map(p)
    cli_args.add_dtype(p)
    p.add_argument(
        "--max-length",
        type=cli_args.integer(1, what="--max-length"),
        default=None,
        help="truncate prompts to this many tokens (default: model's)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=cli_args.integer(0, what="--max-batch-tokens"),
        default=DEFAULT_MAX_BATCH_TOKENS,
        help="cap batch size x prompt tokens, 0 for none (default: %(default)s)",
    )
    cli_args.add_threads(p, help=cli_args.THREADS_HELP + "; workers of --workers/--ray get their own")
    cli_args.add_scheduler(p, unit="(task, method) pairs")
    cli_args.add_no_resume(
        p, help="rerun pairs already in results.jsonl (same settings; the table uses the latest)"
    )
    cli_args.add_new_run(p)
    p.set_defaults(func=_cmd_lmeval)
    return p

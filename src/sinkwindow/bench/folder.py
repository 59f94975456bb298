"""A benchmark run folder through the run-folder contract (``sinkwindow.runs``): resumed, never truncated.

``DIR/bench.jsonl`` holds one row per (model, kind, method, context) cell (paired cells
also by the method they alternate with). A re-run with the same
settings (the whole ``BenchConfig`` but its output options, plus this machine's CPU and core
count: a timing is a fact about a machine) measures only the cells that have no row yet and appends
them; a re-run with other settings is refused, naming what differs. ``--new-run`` moves the
folder's files into ``previous-<UTC time>/`` and starts over; ``--redo SPECS`` moves only those
methods' rows there (after a change to a method, say) and keeps every other method's.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection
from pathlib import Path

from ..jsonl import read_jsonl
from ..runs.folder import (
    FINGERPRINT_FILE,
    RunMismatchError,
    move_aside,
    previous_dir,
    read_settings,
    repair_tail,
    replace_lines,
    split_method_rows,
    write_settings,
)
from ..runs.session_log import SESSIONS_FILE, machine_info

__all__ = ["BENCH_FILE", "BENCH_RUN_FILES", "bench_settings", "cell_key", "open_bench_folder"]

logger = logging.getLogger(__name__)

BENCH_FILE = "bench.jsonl"
# What --new-run moves aside (glob patterns): the rows, what they were made under, what was rendered.
BENCH_RUN_FILES = (
    BENCH_FILE,
    FINGERPRINT_FILE,
    SESSIONS_FILE,
    "meta.json",
    "bench.md",
    "targets.json",
    "decode_*.png",
    "prefill_*.png",
)
# Config fields that change where results go or how they are shown, never what is measured.
_OUTPUT_FIELDS = ("out", "plots")


def cell_key(row: dict) -> tuple:
    """What identifies a measurement: (model, kind, method, context, baseline); ``baseline`` is the
    method a paired row alternated with (``None`` for the others)."""
    return (row.get("model"), row.get("kind"), row.get("method"), row.get("context"), row.get("baseline"))


def bench_settings(config_json: dict, device: str | None = None) -> dict:
    """The settings a bench row depends on: the config without its output fields, and the machine."""
    settings = {k: v for k, v in config_json.items() if k not in _OUTPUT_FIELDS}
    machine = machine_info(device)
    settings["machine"] = {k: machine.get(k) for k in ("cpu", "cores", "gpu") if machine.get(k) is not None}
    # As fingerprint.json will hold them (tuples become lists), so a re-run compares like with like.
    return json.loads(json.dumps(settings, default=str))


def _differences(old: dict, new: dict) -> str:
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return "; ".join(f"{k}: {json.dumps(old.get(k))} -> {json.dumps(new.get(k))}" for k in keys)


def _move_methods_aside(path: Path, methods: Collection[str]) -> None:
    """Move the rows of ``methods`` from ``path`` into ``previous-<time>/bench.jsonl``."""
    moved, kept = split_method_rows(path, methods)
    if not moved:
        return
    target = previous_dir(path.parent)
    (target / path.name).write_text("".join(moved))
    replace_lines(path, kept)
    logger.warning("redo %s: %d rows moved to %s", ", ".join(sorted(methods)), len(moved), target)


def open_bench_folder(
    out: str | os.PathLike, settings: dict, *, new_run: bool = False, redo: Collection[str] = ()
) -> list[dict]:
    """Make ``out`` ready for rows made under ``settings``; return the rows it already holds.

    The caller holds ``RunLock(out)``. Returns the rows to keep (their cells are not measured again).

    Raises:
        RunMismatchError: ``out`` holds rows made with other settings, or rows with no record of
            their settings (a folder written before runs/), and neither ``new_run`` nor a match.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / BENCH_FILE
    if new_run:
        move_aside(out, sorted({p.name for pattern in BENCH_RUN_FILES for p in out.glob(pattern)}))
    recorded = read_settings(out)
    has_rows = path.exists() and path.stat().st_size > 0
    fix = f"choose another --out, or pass --new-run to move them to {out}/previous-<time>/"
    if has_rows and recorded is None:
        raise RunMismatchError(
            f"{out} holds benchmark rows with no record of their settings ({FINGERPRINT_FILE}); {fix}"
        )
    if has_rows and recorded["settings"] != settings:
        raise RunMismatchError(
            f"{out} holds benchmark rows made with other settings ({_differences(recorded['settings'], settings)}); {fix}"
        )
    if redo:
        _move_methods_aside(path, set(redo))
    repair_tail(path)
    write_settings(out, settings)
    rows, _ = read_jsonl(path)
    if rows:
        logger.info("resuming %s: %d cells already measured are kept", out, len({cell_key(r) for r in rows}))
    return rows

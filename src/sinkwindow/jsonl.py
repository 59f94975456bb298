"""Reading and appending the JSONL files run folders keep (``results.jsonl``, ``bench.jsonl``,
``needles.jsonl``, ``sessions.jsonl``, training logs, memos).

One writer for all of them (:func:`append_jsonl`: one line, one ``write``, fsynced before it
returns, so a kill leaves at most a torn last line and never a lost finished one), and one reader, below evaluation and the benchmarks alike: a torn or damaged line is
skipped with a warning naming the file and line, never fatal, and each object keeps the number of
the line it came from so later checks can name it too.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

__all__ = ["MAX_LINE_WARNINGS", "append_jsonl", "read_jsonl", "read_jsonl_lines"]

logger = logging.getLogger(__name__)

# Past this many, unreadable lines are counted without a warning each.
MAX_LINE_WARNINGS = 10


def read_jsonl_lines(path: str | os.PathLike) -> tuple[list[dict], list[int], list[int]]:
    """``(objects, their line numbers, numbers of the lines that are not one)``, lines 1-based.

    Blank lines are ignored; a line that does not parse, or parses to something other than an
    object, is skipped with a warning naming the file and line. A missing file reads as empty.
    """
    path = Path(path)
    rows: list[dict] = []
    lines: list[int] = []
    bad: list[int] = []
    if not path.exists():
        return rows, lines, bad
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                obj = None
            if isinstance(obj, dict):
                rows.append(obj)
                lines.append(n)
                continue
            bad.append(n)
            if len(bad) <= MAX_LINE_WARNINGS:
                logger.warning("%s:%d: skipping a line that is not a JSON object", path, n)
    if len(bad) > MAX_LINE_WARNINGS:
        logger.warning("%s: skipped %d unreadable lines in all", path, len(bad))
    return rows, lines, bad


def read_jsonl(path: str | os.PathLike) -> tuple[list[dict], list[int]]:
    """Objects of a JSONL file and the numbers (1-based) of the lines that are not one
    (:func:`read_jsonl_lines` without the objects' own line numbers)."""
    rows, _, bad = read_jsonl_lines(path)
    return rows, bad


def append_jsonl(path: str | os.PathLike, row: dict, *, sort_keys: bool = False, default=None) -> None:
    """Append ``row`` to ``path`` as one JSON line, durable when this returns.

    The line goes out in one ``write`` on a file opened for appending (so concurrent appenders never
    interleave within a line) and is fsynced before returning. The parent folder is made if missing.

    Args:
        sort_keys, default: as for ``json.dumps`` (each file keeps the serialization it always had).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(row, sort_keys=sort_keys, default=default) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        written = 0
        while written < len(data):  # a regular file takes it in one call; a short write finishes here
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)

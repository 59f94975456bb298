"""The one writer of tuning's files (``calibrate.json``, ``tune.json``, both ``frontier.json``
schemas, ``frontier.md``, the memo's ``runs.jsonl``), through ``runs/``.

Every JSON file is written whole and atomically (``runs.folder.write_text_atomic``) with the
command line and library versions that made it (``runs.provenance.command_provenance``); a folder's
earlier files move to ``previous-<UTC time>/`` first (``runs.folder.move_aside``). The memo's
lines go through ``sinkwindow.jsonl.append_jsonl`` (atomic, fsynced).

Two files share the name ``frontier.json`` because committed result folders and their readers use
it; their schemas are told apart by their keys: ``tune``'s (``tune.write_tune``) holds
``candidates`` (every spec at one budget, with its calibration score and ``on_frontier``);
``frontier``'s (``frontier.write_frontier``) holds ``points`` (the best spec of each strategy at
each budget, with its held-out recovery) and the ``config`` that drew them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["fresh_folder", "provenance", "write_json", "write_text"]


def provenance() -> dict:
    """What produced a calibrate/tune output: the command line and the library versions."""
    from ..runs.provenance import command_provenance

    return command_provenance()


def fresh_folder(out: str | os.PathLike, names: Iterable[str]) -> Path:
    """``out`` created, with the ``names`` it already holds moved to ``previous-<UTC time>/``."""
    from ..runs.folder import move_aside

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    move_aside(out, names)
    return out


def write_text(path: str | os.PathLike, text: str) -> str:
    """``text`` at ``path``, atomically; returns the path."""
    from ..runs.folder import write_text_atomic

    return str(write_text_atomic(path, text))


def write_json(path: str | os.PathLike, data, *, indent: int = 1, newline: bool = True, default=None) -> str:
    """``data`` as indented JSON at ``path`` (ending in a newline unless told not to), atomically.

    ``indent`` / ``newline`` / ``default`` keep each file's committed layout (``frontier``'s own
    ``frontier.json`` is indented by 2, with no final newline, and writes its tuples as lists).
    """
    return write_text(path, json.dumps(data, indent=indent, default=default) + ("\n" if newline else ""))

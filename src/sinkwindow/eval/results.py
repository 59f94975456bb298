"""A resumable results store: one JSONL line per finished sample, plus the config that made it.

A run folder holds::

    config.json     the full configuration (model, methods, tasks, lengths, seed, data
                    deviations, library versions), rewritten whenever a run (re)starts
    results.jsonl   one JSON object per finished sample, appended and flushed as it finishes

A re-run with the same config skips every sample whose key is already in ``results.jsonl``; a run
killed midway loses at most the sample in flight. A truncated last line (killed mid-write) is
ignored on load and overwritten by the next append.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["ResultsStore", "library_versions", "row_key", "KEY_FIELDS"]

logger = logging.getLogger(__name__)

# What identifies a sample: rerunning with the same values skips it.
KEY_FIELDS = ("model", "task", "method", "length", "seed", "index")


def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in KEY_FIELDS)


def library_versions() -> dict[str, str]:
    """Versions of what produced the numbers (recorded in config.json)."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for name in ("sinkwindow", "torch", "transformers", "tokenizers", "gguf", "lm-eval", "peft"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


class ResultsStore:
    """Append-only JSONL results under ``run_dir``.

    Args:
        run_dir: the run folder (created if needed).
        config: written to ``config.json`` (with library versions and a timestamp added). The
            previous config is kept under ``history`` so a resumed run shows what changed.
    """

    def __init__(self, run_dir: str | os.PathLike, config: dict | None = None):
        self.dir = Path(run_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "results.jsonl"
        self.config_path = self.dir / "config.json"
        self._rows: list[dict] = self._load()
        self._keys = {row_key(r) for r in self._rows}
        if config is not None:
            self.write_config(config)

    def _load(self) -> list[dict]:
        if not self.path.exists():
            return []
        rows, bad = [], 0
        with self.path.open() as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    bad += 1  # a line cut short by a kill: that sample simply runs again
        if bad:
            logger.warning("%s: ignored %d unreadable line(s); those samples will be redone", self.path, bad)
            self._rewrite(rows)
        return rows

    def _rewrite(self, rows: list[dict]) -> None:
        tmp = self.path.with_suffix(".jsonl.tmp")
        with tmp.open("w") as f:
            for r in rows:
                f.write(json.dumps(r, sort_keys=True) + "\n")
        tmp.replace(self.path)

    def write_config(self, config: dict) -> None:
        previous = None
        if self.config_path.exists():
            try:
                previous = json.loads(self.config_path.read_text())
            except json.JSONDecodeError:
                previous = None
        full = dict(config)
        full["versions"] = library_versions()
        full["updated"] = datetime.now(UTC).isoformat(timespec="seconds")
        if previous is not None:
            history = previous.pop("history", [])
            if {k: v for k, v in previous.items() if k not in ("updated", "versions")} != config:
                history.append(previous)
            full["history"] = history[-10:]
        tmp = self.config_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(full, indent=2, sort_keys=True, default=str))
        tmp.replace(self.config_path)

    def has(self, row_or_key: dict | tuple) -> bool:
        key = row_or_key if isinstance(row_or_key, tuple) else row_key(row_or_key)
        return key in self._keys

    def append(self, row: dict) -> None:
        """Write one finished sample and make it durable before returning."""
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._rows.append(row)
        self._keys.add(row_key(row))

    def extend(self, rows: Iterable[dict]) -> None:
        for r in rows:
            self.append(r)

    def rows(self, **where) -> list[dict]:
        """Rows whose fields equal every ``where`` item."""
        return [r for r in self._rows if all(r.get(k) == v for k, v in where.items())]

    def __len__(self) -> int:
        return len(self._rows)

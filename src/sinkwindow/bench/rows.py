"""Rows of an efficiency run: the fields each kind carries, their check, loading, and the selections
the targets and the report read (``ok_rows``, ``by_context``, ``row_models``)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from ..jsonl import read_jsonl
from .peers import method_name

__all__ = ["ROW_FIELDS", "ROW_KINDS", "validate_row", "load_rows", "ok_rows", "by_context", "row_models"]


ROW_FIELDS = (
    "kind",
    "model",
    "method",
    "context",
    "status",
    "reason",
    "ms_per_token",
    "tokens_per_s",
    "kv_bytes",
    "prefill_s",
    "peak_rss_bytes",
)
ROW_KINDS = ("decode", "prefill", "paired")
_NUMBERS_WHEN_OK = ("ms_per_token", "tokens_per_s", "kv_bytes", "peak_rss_bytes")


def validate_row(row: dict) -> None:
    """Raise ``ValueError`` unless ``row`` follows the schema.

    Every row has ``ROW_FIELDS``; ``kind`` is one of ``ROW_KINDS``; ``method`` a method spec or a
    peer's name (``bench.peers``); ``status`` is ``ok`` (the
    numbers are present, non-negative, and ``prefill_s`` is set for prefill rows) or ``skipped``
    (``reason`` is a non-empty string).
    """
    missing = [k for k in ROW_FIELDS if k not in row]
    if missing:
        raise ValueError(f"row lacks {missing}: {row}")
    if row["kind"] not in ROW_KINDS:
        raise ValueError(f"row kind must be one of {ROW_KINDS}, got {row['kind']!r}")
    method_name(row["method"])
    if not isinstance(row["context"], int) or row["context"] <= 0:
        raise ValueError(f"context must be a positive int, got {row['context']!r}")
    if row["status"] == "skipped":
        if not isinstance(row["reason"], str) or not row["reason"]:
            raise ValueError(f"skipped row needs a reason: {row}")
        return
    if row["status"] != "ok":
        raise ValueError(f"status must be 'ok' or 'skipped', got {row['status']!r}")
    for k in _NUMBERS_WHEN_OK:
        v = row[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or not math.isfinite(v):
            raise ValueError(f"{k} must be a finite number >= 0, got {v!r}")
    if not isinstance(row["kv_bytes"], int) or not isinstance(row["peak_rss_bytes"], int):
        raise ValueError("kv_bytes and peak_rss_bytes must be ints")
    if row["kind"] == "prefill" and not isinstance(row["prefill_s"], (int, float)):
        raise ValueError("a prefill row needs prefill_s")
    if row["prefill_s"] is not None and (
        not isinstance(row["prefill_s"], (int, float)) or row["prefill_s"] < 0
    ):
        raise ValueError(f"prefill_s must be None or a number >= 0, got {row['prefill_s']!r}")


def load_rows(path: str | Path) -> list[dict]:
    """Rows of a ``bench.jsonl`` file (or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "bench.jsonl"
    rows, _ = read_jsonl(path)  # a torn or damaged line is left out with a warning naming it
    return rows


def ok_rows(
    rows: Iterable[dict], kind: str, model: str | None = None, method: str | None = None
) -> list[dict]:
    """The measured (``status == "ok"``) rows of one kind, optionally of one model and method."""
    return [
        r
        for r in rows
        if r["kind"] == kind
        and r["status"] == "ok"
        and (model is None or r["model"] == model)
        and (method is None or r["method"] == method)
    ]


def by_context(rows: Iterable[dict], key: str = "ms_per_token") -> dict[int, float]:
    """``{context: row[key]}``."""
    return {r["context"]: r[key] for r in rows}


def row_models(rows: list[dict]) -> list[str]:
    """The models of the rows, in first-seen order."""
    return list(dict.fromkeys(r["model"] for r in rows))

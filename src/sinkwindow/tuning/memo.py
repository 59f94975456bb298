"""Calibration runs kept on disk by what produced them.

A frontier calibrates the same units again and again: every budget scores the same single layers
and KV heads on the same prompts, greedy selection at a larger budget walks through the specs a
smaller one already tried, and the trained gates do not depend on how many heads are then kept. On
one CPU thread a run of four 4K-token calibration prompts takes about a minute, so a frontier is
many hours of them, and a calibration stopped half-way used to start over. A :class:`Memo` keeps
each finished run (an answer NLL, a set of trained gates) so it is computed once, and a stopped
calibration resumes at the run it was in.

The memo is one JSONL file, a line per finished run, ``{"key": {...}, "value": ...}``, appended
and flushed as soon as the run ends: a crash loses at most the run in flight, and a torn last line
is skipped on reading (``jsonl.read_jsonl``). The key names everything the value depends on within
one folder: what was computed (``"kind"``), the spec, the native-sliding policy, the chunk size and
a digest of the prompts' token ids. The model and context are the folder's own (its fingerprint
pins them), so one memo file must only ever serve one model.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from ..jsonl import read_jsonl

__all__ = ["Memo", "prompts_digest"]


def _canonical(key: dict) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


class Memo:
    """A persistent ``key -> value`` store of finished calibration runs (JSON keys and values).

    ``Memo(None)`` keeps nothing on disk (a plain dict), so code paths are the same with and
    without a folder.
    """

    def __init__(self, path: str | os.PathLike | None):
        self.path = None if path is None else Path(path)
        self._values: dict[str, object] = {}
        self.hits = 0
        if self.path is not None:
            rows, _ = read_jsonl(self.path)
            for r in rows:
                if isinstance(r.get("key"), dict) and "value" in r:
                    self._values[_canonical(r["key"])] = r["value"]

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: dict):
        """The value stored under ``key``, or ``None``."""
        value = self._values.get(_canonical(key))
        if value is not None:
            self.hits += 1
        return value

    def put(self, key: dict, value) -> None:
        """Store ``value`` (JSON, not ``None``) under ``key``; on disk before this returns."""
        if value is None:
            raise ValueError("a memo stores values, not None (None reads as 'not computed')")
        text = _canonical(key)
        self._values[text] = value
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"key": key, "value": value}, sort_keys=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())


def prompts_digest(prompts: Sequence) -> str:
    """sha256 (12 hex digits) of the prompts' token ids: ``input_ids`` then ``answer_ids`` of each
    calibration prompt, or each tensor itself."""
    h = hashlib.sha256()
    for p in prompts:
        parts = [p] if isinstance(p, torch.Tensor) else [p.input_ids, p.answer_ids]
        for t in parts:
            h.update(str(tuple(t.shape)).encode())
            h.update(t.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:12]

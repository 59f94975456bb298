"""Calibration runs kept on disk by what produced them.

A frontier calibrates the same units again and again: every budget scores the same single layers
and KV heads on the same prompts, greedy selection at a larger budget walks through the specs a
smaller one already tried, and the trained gates do not depend on how many heads are then kept. On
one CPU thread a run of four 4K-token calibration prompts takes about a minute, so a frontier is
many hours of them, and a calibration stopped half-way used to start over. A :class:`Memo` keeps
each finished run (an answer NLL, a set of trained gates) so it is computed once, and a stopped
calibration resumes at the run it was in.

The memo is one JSONL file, a line per finished run, ``{"key": {...}, "value": ..., "cpu_s": ...}``
(``cpu_s``: the run's CPU seconds in the process that computed it), appended
and flushed as soon as the run ends: a crash loses at most the run in flight, and a torn last line
is skipped on reading (``jsonl.read_jsonl``). The key names everything the value depends on within
one folder: what was computed (``"kind"``), the spec, the native-sliding policy, the chunk size and
a digest of the prompts' token ids. The model is either the folder's own (a frontier's fingerprint
pins it) or named in every key by a ``scope`` (``calibrate --out``: the model file's identity and
dtype, ``eval.fingerprint.model_identity``), so a memo never hands one model's run to another.

What a calibration *would* cost alone stays measurable: :meth:`Memo.tally` collects the runs a block
of code used, found or computed, with their recorded CPU seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..jsonl import append_jsonl, read_jsonl

__all__ = ["Memo", "Tally", "prompts_digest"]


def _canonical(key: dict) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


@dataclass
class Tally:
    """The runs one block used (``Memo.tally``): each run's CPU seconds, those computed in it, and of
    those the ones computed in other processes (worker processes or Ray tasks: this process's CPU
    time does not hold them)."""

    used: dict[str, float] = field(default_factory=dict)
    computed: dict[str, float] = field(default_factory=dict)
    elsewhere: dict[str, float] = field(default_factory=dict)

    @property
    def cpu_s(self) -> float:
        """CPU seconds of every run the block used, wherever it was computed: its cost alone."""
        return sum(self.used.values())

    @property
    def computed_cpu_s(self) -> float:
        """CPU seconds of the runs computed inside the block."""
        return sum(self.computed.values())

    @property
    def elsewhere_cpu_s(self) -> float:
        """CPU seconds of the runs computed inside the block by other processes."""
        return sum(self.elsewhere.values())


class Memo:
    """A persistent ``key -> value`` store of finished calibration runs (JSON keys and values).

    ``Memo(None)`` keeps nothing on disk (a plain dict), so code paths are the same with and
    without a folder. ``scope`` (JSON) goes into every key: runs of another scope are never found.
    """

    def __init__(self, path: str | os.PathLike | None, scope: dict | None = None):
        self.path = None if path is None else Path(path)
        self.scope = scope
        self._values: dict[str, object] = {}
        self._cpu_s: dict[str, float] = {}
        self._tallies: list[Tally] = []
        self.hits = 0
        if self.path is not None:
            rows, _ = read_jsonl(self.path)
            for r in rows:
                if isinstance(r.get("key"), dict) and "value" in r:
                    text = _canonical(r["key"])
                    self._values[text] = r["value"]
                    self._cpu_s[text] = float(r.get("cpu_s") or 0.0)

    def __len__(self) -> int:
        return len(self._values)

    def get(self, key: dict):
        """The value stored under ``key``, or ``None``."""
        text = _canonical(self._scoped(key))
        value = self._values.get(text)
        if value is not None:
            self.hits += 1
            for t in self._tallies:
                t.used[text] = self._cpu_s[text]
        return value

    def put(self, key: dict, value, cpu_s: float = 0.0, *, elsewhere: bool = False) -> None:
        """Store ``value`` (JSON, not ``None``) under ``key``, computed in ``cpu_s`` CPU seconds (by
        another process: ``elsewhere``); on disk before this returns."""
        if value is None:
            raise ValueError("a memo stores values, not None (None reads as 'not computed')")
        key = self._scoped(key)
        text = _canonical(key)
        self._values[text] = value
        self._cpu_s[text] = float(cpu_s)
        for t in self._tallies:
            t.used[text] = t.computed[text] = float(cpu_s)
            if elsewhere:
                t.elsewhere[text] = float(cpu_s)
        if self.path is not None:
            row = {"key": key, "value": value, "cpu_s": round(float(cpu_s), 3)}
            append_jsonl(self.path, row, sort_keys=True)

    def _scoped(self, key: dict) -> dict:
        return key if self.scope is None else {**key, "scope": self.scope}

    @contextmanager
    def tally(self) -> Iterator[Tally]:
        """Collect the runs used inside the ``with`` block (nested tallies each see them)."""
        t = Tally()
        self._tallies.append(t)
        try:
            yield t
        finally:
            self._tallies.remove(t)


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

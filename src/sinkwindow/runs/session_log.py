"""Which invocations wrote a run folder, on what machine, and for how long.

A long run (the committed reference run) is written over several sessions, each ended by a time
limit or a kill that leaves no chance to log an end. So each invocation appends its start to
``sessions.jsonl`` (command line, machine, threads, scheduler, what it had left to do), every row
records when it was ``written``, and a session's wall time is read back as the time from its start
to the last row it wrote: a killed session counts up to its last finished sample, and nothing is
lost if it never ends cleanly.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import sys
from datetime import datetime
from pathlib import Path

from ..jsonl import append_jsonl
from .provenance import source_commit, utc_now

__all__ = [
    "SESSIONS_FILE",
    "machine_info",
    "start_session",
    "read_sessions",
    "session_summary",
    "session_lines",
]

SESSIONS_FILE = "sessions.jsonl"


# Libraries whose kernels set the last bits of a result; their versions go into every session.
NUMERIC_LIBRARIES = ("torch", "transformers")


def _cpuinfo() -> dict:
    """The first processor's fields of ``/proc/cpuinfo`` (empty off Linux)."""
    fields: dict = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def machine_info(device: str | None = None) -> dict:
    """CPU model, cores, memory and OS of this machine (and the GPU's name when ``device`` is CUDA).

    A virtual machine often names its CPU only "AMD EPYC", while two such hosts of different
    generations (AVX2 against AVX-512 kernels) give fp32 sums that differ in the sixth digit; so the
    CPU family/model, the AVX-512 flag and the versions of :data:`NUMERIC_LIBRARIES` are kept too.
    """
    info: dict = {
        "cores": os.cpu_count(),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
    }
    cpu = _cpuinfo()
    if "model name" in cpu:
        info["cpu"] = cpu["model name"]
    info.setdefault("cpu", platform.processor() or platform.machine())
    if "cpu family" in cpu:
        info["cpu_id"] = f"family {cpu['cpu family']} model {cpu.get('model', '?')}"
    if "flags" in cpu:
        info["avx512"] = "avx512f" in cpu["flags"].split()
    info["libraries"] = {}
    for name in NUMERIC_LIBRARIES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info["libraries"][name] = importlib.metadata.version(name)
    with contextlib.suppress(ValueError, OSError, AttributeError):  # no sysconf names off POSIX
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    if device and str(device).startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def start_session(run_dir: str | os.PathLike, *, device: str | None = None, **info) -> dict:
    """Append this invocation's start to ``run_dir/sessions.jsonl`` and return the entry: the time
    (UTC, to the microsecond), the command line, this machine (:func:`machine_info` of ``device``),
    the source commit, and ``info`` (threads, scheduler, what it has left to do)."""
    entry = {
        "started": utc_now("microseconds"),
        "argv": list(sys.argv),
        "machine": machine_info(device),
        "commit": source_commit(),
        **info,
    }
    path = Path(run_dir) / SESSIONS_FILE
    append_jsonl(path, entry, sort_keys=True, default=str)
    return entry


def read_sessions(run_dir: str | os.PathLike) -> list[dict]:
    """The logged sessions, oldest first; unreadable lines are skipped."""
    path = Path(run_dir) / SESSIONS_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and _time(entry.get("started")) is not None:
            out.append(entry)
    return sorted(out, key=lambda e: _time(e["started"]))


def _time(text) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None


def session_summary(sessions: list[dict], rows: list[dict]) -> list[dict]:
    """Per session: its entry plus ``rows`` (how many rows it wrote) and ``wall_s`` (start to its
    last row; 0 when it wrote none). A row belongs to the last session started at or before it was
    ``written``; rows without that time (written before sessions were logged) belong to none."""
    starts = [_time(s["started"]) for s in sessions]
    counts = [0] * len(sessions)
    last = list(starts)
    for r in rows:
        t = _time(r.get("written"))
        if t is None:
            continue
        i = max((j for j, s in enumerate(starts) if s <= t), default=None)
        if i is None:
            continue
        counts[i] += 1
        last[i] = max(last[i], t)
    return [
        {**s, "rows": n, "wall_s": round((end - start).total_seconds(), 1)}
        for s, start, end, n in zip(sessions, starts, last, counts)
    ]


def _duration(seconds: float) -> str:
    h, m = divmod(round(seconds / 60), 60)
    return f"{h} h {m:02d} min" if h else f"{m} min"


def session_lines(run_dir: str | os.PathLike, rows: list[dict]) -> list[str]:
    """Markdown lines for a report: sessions, their wall time and machine; empty without a log."""
    summary = session_summary(read_sessions(run_dir), rows)
    if not summary:
        return []
    total = sum(s["wall_s"] for s in summary)
    untimed = sum(1 for r in rows if _time(r.get("written")) is None)
    machines = []
    for s in summary:
        m = s.get("machine") or {}
        label = f"{m.get('cpu', '?')}" + (f" ({m['cpu_id']})" if m.get("cpu_id") else "")
        label += f", {m.get('cores', '?')} cores" + (f", {m['gpu']}" if m.get("gpu") else "")
        if label not in machines:
            machines.append(label)
    lines = [
        "## Sessions",
        "",
        f"Written in {len(summary)} session(s), {_duration(total)} of wall time in all (each from its start "
        f"to the last row it wrote); machine: {'; '.join(machines)}."
        + (f" {untimed} row(s) predate the session log." if untimed else ""),
        "",
        "| started (UTC) | rows | wall | threads | scheduler | command |",
        "|---|---:|---:|---|---|---|",
    ]
    for s in summary:
        cmd = " ".join(s.get("argv") or [])
        lines.append(
            f"| {s['started'][:19].replace('T', ' ')} | {s['rows']} | {_duration(s['wall_s'])} | {s.get('threads', '?')} | "
            f"{s.get('scheduler', '?')} | `{cmd}` |"
        )
    return lines + [""]

"""A resumable results store: one JSONL line per finished sample, plus the settings that made it.

A run folder holds::

    config.json       the full configuration (model, methods, tasks, lengths, seed, data
                      deviations, library versions), rewritten whenever a run (re)starts
    fingerprint.json  the settings that can change a result (``eval/fingerprint.py``) and their
                      hash; every row carries the ``fingerprint`` of the part that applies to it
    results.jsonl     one JSON object per finished sample, appended and flushed as it finishes
    .lock             pid and start time of the run writing the folder (an advisory ``flock``)

A re-run with the same settings skips every sample already in ``results.jsonl``; a run killed
midway loses at most the sample in flight. A re-run with other settings (decode cap, chunk size,
checkpoint, dtype, ...) is refused with :class:`RunMismatchError` naming what differs; with
``new_run=True`` the old files move to ``previous-<UTC time>/`` and the run starts over in place;
with ``redo=METHODS`` only those methods' rows move there (and their recorded checkpoints are
forgotten), so a retrained baseline runs again beside the rows of every other method.
One run at a time writes a folder (:class:`RunLock`). Unreadable lines (a torn last line after a
kill, or a damaged file) are skipped with a warning naming file and line, and counted in
``skipped_lines``; a writer cuts a torn last line off so the next append starts on a fresh line.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import platform
import shutil
from collections.abc import Collection, Iterable
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "ResultsStore",
    "RunLock",
    "RunLockedError",
    "RunMismatchError",
    "check_redo",
    "check_resume",
    "read_jsonl",
    "library_versions",
    "row_key",
    "KEY_FIELDS",
    "FINGERPRINT_FILE",
]

logger = logging.getLogger(__name__)

# What identifies a sample; with the same fingerprint, rerunning skips it.
KEY_FIELDS = ("model", "task", "method", "length", "seed", "index")
RESULTS_FILE = "results.jsonl"
CONFIG_FILE = "config.json"
FINGERPRINT_FILE = "fingerprint.json"
LOCK_FILE = ".lock"
# What a new run moves aside: the rows, what they were made with, and what was rendered from them.
RUN_FILES = (
    RESULTS_FILE,
    CONFIG_FILE,
    FINGERPRINT_FILE,
    "sessions.jsonl",
    "report.md",
    "report.html",
    "summary.json",
    "accuracy_vs_context.png",
    "niah_depth_heatmap.png",
    "ppl_by_position.png",
    "short",
)
# Past this many, unreadable lines are counted without a warning each.
MAX_LINE_WARNINGS = 10


class RunMismatchError(ValueError):
    """The folder holds results made with other settings; resuming would mix them."""


class RunLockedError(ValueError):
    """Another live run is writing the folder."""


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
    commit = source_commit()
    if commit:
        out["sinkwindow-commit"] = commit
    return out


def source_commit() -> str | None:
    """The git commit of the sinkwindow source tree (``+dirty`` with uncommitted changes), or ``None``
    for an installed copy that is not a git checkout. Recorded so a committed run names its code."""
    import subprocess

    src = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no", "--", "."],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head or None


def utc_now(timespec: str = "seconds") -> str:
    """Now, UTC, ISO 8601 (config.json to the second; rows and sessions to the microsecond, so a
    row is never timed with the start of the session after it)."""
    return datetime.now(UTC).isoformat(timespec=timespec)


def check_run_dir(run_dir: str | os.PathLike) -> Path:
    """``run_dir`` as a path, refusing one that exists and is not a folder."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} is a file, not a run folder: choose another --out")
    return path


def read_jsonl(path: str | os.PathLike) -> tuple[list[dict], list[int]]:
    """Objects of a JSONL file and the numbers (1-based) of the lines that are not one.

    Blank lines are ignored; a line that does not parse, or parses to something other than an
    object, is skipped with a warning naming the file and line.
    """
    path = Path(path)
    rows: list[dict] = []
    bad: list[int] = []
    if not path.exists():
        return rows, bad
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
                continue
            bad.append(n)
            if len(bad) <= MAX_LINE_WARNINGS:
                logger.warning("%s:%d: skipping a line that is not a JSON object", path, n)
    if len(bad) > MAX_LINE_WARNINGS:
        logger.warning("%s: skipped %d unreadable lines in all", path, len(bad))
    return rows, bad


def _describe(value) -> str:
    text = "none" if value is None else str(value)
    # sha256 and folder digests: enough to tell them apart in one line.
    return text[:23] + "…" if len(text) > 24 else text


def _read_fingerprint(run_dir: Path) -> dict | None:
    path = run_dir / FINGERPRINT_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("settings"), dict) else None


def _has_rows(run_dir: Path) -> int:
    rows, _ = read_jsonl(run_dir / RESULTS_FILE) if (run_dir / RESULTS_FILE).exists() else ([], [])
    return len(rows)


def check_resume(run_dir: str | os.PathLike, settings: dict, redo: Collection[str] = ()) -> dict:
    """The settings to record after resuming ``run_dir`` with ``settings``; read-only.

    Returns the folder's recorded settings updated with ``settings`` (task parameters and
    checkpoints of tasks and methods this run does not touch are kept), or ``settings`` for a
    folder without results. ``redo``: methods whose rows will be moved aside (``ResultsStore``),
    so their recorded checkpoints are not compared.

    Raises:
        RunMismatchError: the folder's results were made with other settings, or recorded none.
    """
    from .fingerprint import checkpoint_method, conflicts, without_checkpoints

    run = check_run_dir(run_dir)
    n = _has_rows(run) if run.is_dir() else 0
    if not n:
        return dict(settings)
    recorded = _read_fingerprint(run)
    fix = "pass --new-run to start over (the old files move to previous-<time>/), or choose another --out"
    if recorded is None:
        raise RunMismatchError(
            f"{run} holds {n} results but no record of the settings they were made with ({FINGERPRINT_FILE}); "
            f"{fix}"
        )
    old = without_checkpoints(recorded["settings"], redo)
    diff = conflicts(old, settings)
    if diff:
        said = ", ".join(f"{k} {_describe(a)} → {_describe(b)}" for k, a, b in diff)
        only = {checkpoint_method(key) for key, *_ in diff}
        if None not in only:
            # A retrained baseline: only its rows need to go.
            fix = f"pass --redo {','.join(sorted(only))} to move its rows aside and run it again, or {fix}"
        raise RunMismatchError(f"{run} holds results made with other settings: {said}; {fix}")
    return {**old, **settings}


def check_redo(redo: Collection[str], methods: Collection[str]) -> tuple[str, ...]:
    """``redo``'s specs, canonical; each must be one of the run's ``methods`` (rows moved aside
    and not made again would only be lost from the report).

    Raises:
        ValueError: a bad spec, or one the run does not include (one line naming the fix).
    """
    from ..spec import parse_spec

    canonical = {str(parse_spec(m)) for m in methods}
    out = tuple(dict.fromkeys(str(parse_spec(m)) for m in redo))
    missing = [m for m in out if m not in canonical]
    if missing:
        raise ValueError(
            f"--redo {','.join(missing)}: not among this run's methods ({', '.join(methods)}); add it to --methods"
        )
    return out


class RunLock:
    """One writer per run folder: an exclusive ``flock`` on ``<run_dir>/.lock`` for the whole run.

    The file holds the holder's pid and start time. The kernel drops the lock when its process
    dies, so a file left by a dead run is taken over, with a warning naming it. Advisory only:
    it keeps sinkwindow runs apart, not other programs.

    Raises (on enter):
        RunLockedError: another process holds the lock (its pid and start time in the message).
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = check_run_dir(run_dir)
        self.path = self.dir / LOCK_FILE
        self._fd: int | None = None

    def _holder(self, fd: int) -> dict:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode(errors="replace")
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> RunLock:
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = self._holder(fd)
            os.close(fd)
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise RunLockedError(
                f"{self.dir} is being written by another run (pid {holder.get('pid', '?')}, started "
                f"{holder.get('started', '?')}): wait for it to finish, or choose another --out"
            ) from None
        old = self._holder(fd)
        if old.get("pid") is not None:
            # Released locks leave an empty file: a pid here means its run ended without releasing.
            logger.warning(
                "%s: taking over the lock left by pid %s (started %s), which no longer holds it",
                self.dir,
                old.get("pid"),
                old.get("started", "?"),
            )
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps({"pid": os.getpid(), "started": utc_now(), "host": platform.node()}).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        # The file stays (unlinking it would let a waiter lock an orphaned inode); emptied, it
        # tells the next run that this one ended cleanly.
        os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class ResultsStore:
    """Append-only JSONL results under ``run_dir``.

    Opened with neither ``config`` nor ``settings`` it only reads (and creates nothing). A writer
    should hold :class:`RunLock` on the folder while the store is open.

    Args:
        run_dir: the run folder (created if needed by a writer).
        config: written to ``config.json`` (with library versions and a timestamp added). The
            previous config is kept under ``history`` so a resumed run shows what changed.
        settings: the run's settings (``fingerprint.run_settings``): checked against the folder's
            (:func:`check_resume`), then recorded in ``fingerprint.json``.
        new_run: first move the folder's results, config, fingerprint and reports to
            ``previous-<UTC time>/``, so nothing old is checked or reused.
        redo: methods (canonical specs) whose rows first move to ``previous-<UTC time>/results.jsonl``
            (with copies of the config and fingerprint they were made under); their recorded
            checkpoints are forgotten, so a retrained baseline's rows are made again and every
            other method's rows are kept.

    Attributes:
        skipped_lines: how many lines of ``results.jsonl`` were unreadable and skipped.
        selection: row keys that :meth:`rows` and ``len()`` cover (``run_eval`` sets the cells it
            ran); ``None`` covers every row. :meth:`all_rows` ignores it.
        settings: the recorded settings (``None`` for a reader, or a folder without a record).

    Raises:
        RunMismatchError: ``settings`` differ from those the folder's results were made with.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        config: dict | None = None,
        *,
        settings: dict | None = None,
        new_run: bool = False,
        redo: Collection[str] = (),
    ):
        self.dir = check_run_dir(run_dir)
        self.path = self.dir / RESULTS_FILE
        self.config_path = self.dir / CONFIG_FILE
        self.selection: frozenset[tuple] | None = None
        writer = config is not None or settings is not None or new_run or bool(redo)
        if writer:
            self.dir.mkdir(parents=True, exist_ok=True)
        if new_run:
            self.previous: Path | None = self._move_aside()
        else:
            self.previous = self._move_methods_aside(redo) if redo else None
        merged = check_resume(self.dir, settings) if settings is not None else None
        self._rows, bad = read_jsonl(self.path)
        self.skipped_lines = len(bad)
        if writer:
            self._repair_tail()
        self._fps: dict[tuple, set] = {}
        for r in self._rows:
            self._fps.setdefault(row_key(r), set()).add(r.get("fingerprint"))
        if merged is not None:
            self._write_settings(merged)
        recorded = _read_fingerprint(self.dir)
        self.settings = recorded["settings"] if recorded else None
        if config is not None:
            self.write_config(config)

    def _previous_dir(self) -> Path:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        target, k = self.dir / f"previous-{stamp}", 1
        while target.exists():
            k += 1
            target = self.dir / f"previous-{stamp}-{k}"
        target.mkdir()
        return target

    def _move_aside(self) -> Path | None:
        present = [self.dir / name for name in RUN_FILES if (self.dir / name).exists()]
        if not present:
            return None
        target = self._previous_dir()
        for p in present:
            shutil.move(str(p), str(target / p.name))
        logger.warning("new run in %s: the previous results are in %s", self.dir, target)
        return target

    def _move_methods_aside(self, methods: Collection[str]) -> Path | None:
        """Move the rows of ``methods`` to ``previous-<time>/results.jsonl``; forget their checkpoints."""
        from .fingerprint import without_checkpoints

        recorded = _read_fingerprint(self.dir)
        moved: list[str] = []
        kept: list[str] = []
        for line in self.path.read_text().splitlines(keepends=True) if self.path.exists() else []:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                row = None  # a torn or damaged line stays where read_jsonl reports it
            (moved if isinstance(row, dict) and row.get("method") in methods else kept).append(line)
        forgotten = without_checkpoints(recorded["settings"], methods) if recorded is not None else None
        if not moved and (recorded is None or forgotten == recorded["settings"]):
            return None
        target = self._previous_dir()
        for name in (CONFIG_FILE, FINGERPRINT_FILE):  # what the moved rows were made under
            if (self.dir / name).exists():
                shutil.copy2(self.dir / name, target / name)
        (target / RESULTS_FILE).write_text("".join(moved))
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(kept))
        tmp.replace(self.path)
        if forgotten is not None:
            self._write_settings(forgotten)
        logger.warning(
            "redo %s in %s: its %d previous rows are in %s", ", ".join(methods), self.dir, len(moved), target
        )
        return target

    def _repair_tail(self) -> None:
        """Cut a torn last line off (a kill mid-append), and end the file with a newline."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with self.path.open("rb+") as f:
            data = f.read()
            if data.endswith(b"\n"):
                return
            start = data.rfind(b"\n") + 1
            try:
                whole = isinstance(json.loads(data[start:]), dict)
            except (json.JSONDecodeError, UnicodeDecodeError):
                whole = False
            if whole:
                f.write(b"\n")
            else:
                f.truncate(start)
                logger.warning("%s: cut off a torn last line; that sample runs again", self.path)

    def _write_settings(self, settings: dict) -> None:
        from .fingerprint import settings_fingerprint

        data = {"fingerprint": settings_fingerprint(settings), "settings": settings, "updated": utc_now()}
        tmp = self.dir / (FINGERPRINT_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
        tmp.replace(self.dir / FINGERPRINT_FILE)

    def write_config(self, config: dict) -> None:
        previous = None
        if self.config_path.exists():
            try:
                previous = json.loads(self.config_path.read_text())
            except json.JSONDecodeError:
                previous = None
        full = dict(config)
        full["versions"] = library_versions()
        full["updated"] = utc_now()
        if isinstance(previous, dict):
            history = previous.pop("history", [])
            if {k: v for k, v in previous.items() if k not in ("updated", "versions")} != config:
                history.append(previous)
            full["history"] = history[-10:]
        tmp = self.config_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(full, indent=2, sort_keys=True, default=str))
        tmp.replace(self.config_path)

    def has(self, row_or_key: dict | tuple) -> bool:
        """Whether the sample is done: same key and, for a row with a ``fingerprint``, same fingerprint."""
        if isinstance(row_or_key, tuple):
            return row_or_key in self._fps
        seen = self._fps.get(row_key(row_or_key))
        if not seen:
            return False
        fp = row_or_key.get("fingerprint")
        return fp is None or fp in seen

    def append(self, row: dict) -> None:
        """Write one finished sample and make it durable before returning."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as f:
            f.write(json.dumps(row, sort_keys=True, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self._rows.append(row)
        self._fps.setdefault(row_key(row), set()).add(row.get("fingerprint"))

    def extend(self, rows: Iterable[dict]) -> None:
        for r in rows:
            self.append(r)

    def select(self, keys: Collection[tuple] | None) -> None:
        """Let :meth:`rows` and ``len()`` cover only rows whose :func:`row_key` is in ``keys``."""
        self.selection = None if keys is None else frozenset(keys)

    def all_rows(self) -> list[dict]:
        """Every readable row of the file, selected or not."""
        return list(self._rows)

    def rows(self, selection: Collection[tuple] | None = None, **where) -> list[dict]:
        """Rows in ``selection`` (row keys; default: the store's :attr:`selection`) whose fields
        equal every ``where`` item."""
        keys = self.selection if selection is None else selection
        return [
            r
            for r in self._rows
            if (keys is None or row_key(r) in keys) and all(r.get(k) == v for k, v in where.items())
        ]

    def __len__(self) -> int:
        return len(self.rows())

"""A run folder's files: one writer, recorded settings, moving aside instead of deleting, torn tails.

Every writer of results (eval's store, bench, training) goes through these, so a folder behaves
the same whoever wrote it::

    .lock             pid, start time and host of the run writing the folder (advisory ``flock``)
    fingerprint.json  {"fingerprint", "settings", "updated"}: what the rows were made with
    previous-<time>/  what ``--new-run`` / ``--redo`` moved aside (nothing is ever deleted)
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import platform
import shutil
from collections.abc import Collection, Iterable
from datetime import UTC, datetime
from pathlib import Path

from .provenance import utc_now

__all__ = [
    "FINGERPRINT_FILE",
    "LOCK_FILE",
    "RunLock",
    "RunLockedError",
    "RunMismatchError",
    "check_run_dir",
    "move_aside",
    "write_text_atomic",
    "previous_dir",
    "read_settings",
    "repair_tail",
    "replace_lines",
    "settings_fingerprint",
    "split_method_rows",
    "write_settings",
]

logger = logging.getLogger(__name__)

FINGERPRINT_FILE = "fingerprint.json"
LOCK_FILE = ".lock"


class RunMismatchError(ValueError):
    """The folder holds results made with other settings; resuming would mix them."""


class RunLockedError(ValueError):
    """Another live run is writing the folder."""


def check_run_dir(run_dir: str | os.PathLike) -> Path:
    """``run_dir`` as a path, refusing one that exists and is not a folder."""
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{path} is a file, not a run folder: choose another --out")
    return path


def settings_fingerprint(settings: dict) -> str:
    """12 hex digits of the sha256 of ``settings`` as canonical JSON."""
    text = json.dumps(settings, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def read_settings(run_dir: Path) -> dict | None:
    """The folder's ``fingerprint.json`` (``{"fingerprint", "settings", "updated"}``), or ``None``
    when it is missing or damaged (not a JSON object with a ``settings`` object)."""
    path = Path(run_dir) / FINGERPRINT_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("settings"), dict) else None


def write_settings(run_dir: Path, settings: dict) -> None:
    """Record ``settings`` (and their fingerprint) in ``fingerprint.json``, atomically."""
    data = {"fingerprint": settings_fingerprint(settings), "settings": settings, "updated": utc_now()}
    tmp = Path(run_dir) / (FINGERPRINT_FILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str))
    tmp.replace(Path(run_dir) / FINGERPRINT_FILE)


def previous_dir(run_dir: Path) -> Path:
    """A new, empty ``run_dir/previous-<UTC time>/`` (``-2``, ``-3``, ... within one second)."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    target, k = Path(run_dir) / f"previous-{stamp}", 1
    while target.exists():
        k += 1
        target = Path(run_dir) / f"previous-{stamp}-{k}"
    target.mkdir(parents=True)
    return target


def move_aside(run_dir: Path, names: Iterable[str]) -> Path | None:
    """Move the files or folders ``names`` of ``run_dir`` that exist into a new ``previous-<time>/``;
    return it, or ``None`` when none exists (nothing is created then)."""
    present = [Path(run_dir) / name for name in names if (Path(run_dir) / name).exists()]
    if not present:
        return None
    target = previous_dir(run_dir)
    for p in present:
        shutil.move(str(p), str(target / p.name))
    logger.warning("new run in %s: the previous files are in %s", run_dir, target)
    return target


def repair_tail(path: Path) -> None:
    """Cut a torn last line off a JSONL file (a kill mid-append), and end the file with a newline.

    A last line that is a whole JSON object only lacks its newline: it is kept and ended.
    """
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as f:
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
            logger.warning("%s: cut off a torn last line; that row is made again", path)


def split_method_rows(path: Path, methods: Collection[str]) -> tuple[list[str], list[str]]:
    """The lines of the JSONL file ``path`` as ``(moved, kept)``: rows whose ``method`` is in
    ``methods``, and every other line (an unreadable line is kept, where the reader reports it)."""
    moved: list[str] = []
    kept: list[str] = []
    path = Path(path)
    for line in path.read_text().splitlines(keepends=True) if path.exists() else []:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        (moved if isinstance(row, dict) and row.get("method") in methods else kept).append(line)
    return moved, kept


def replace_lines(path: Path, lines: Iterable[str]) -> None:
    """Make ``path`` hold exactly ``lines`` (each with its newline), atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(lines))
    tmp.replace(path)


class RunLock:
    """One writer per run folder: an exclusive ``flock`` on ``<run_dir>/.lock`` for the whole run.

    The file holds the holder's pid and start time. The kernel drops the lock when its process
    dies, so a file left by a dead run is taken over, with a warning naming it. Advisory only:
    it keeps sinkwindow runs apart, not other programs. Folders the lock had to create are removed
    on release if the run put nothing in them.

    Raises (on enter):
        RunLockedError: another process holds the lock (its pid and start time in the message).
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = check_run_dir(run_dir)
        self.path = self.dir / LOCK_FILE
        self._fd: int | None = None
        self._created: list[Path] = []  # folders this lock made, deepest last

    @staticmethod
    def _holder(fd: int) -> dict:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode(errors="replace")
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> RunLock:
        missing = [p for p in [self.dir, *self.dir.parents] if not p.exists()]
        self.dir.mkdir(parents=True, exist_ok=True)
        self._created = missing[::-1]
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
        # A run that wrote nothing (refused, or failed before its first file) leaves nothing: the
        # folders this lock made go again while they hold only the lock.
        if self._created and [p.name for p in self.dir.iterdir()] == [LOCK_FILE]:
            self.path.unlink(missing_ok=True)
            for folder in reversed(self._created):
                try:
                    folder.rmdir()
                except OSError:
                    break
        self._created = []

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder, fsynced, then renamed:
    a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return path

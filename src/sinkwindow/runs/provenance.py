"""What produced a number: the time, the libraries' versions, and the sinkwindow source tree."""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

__all__ = [
    "utc_now",
    "library_versions",
    "source_state",
    "source_commit",
    "check_clean_source",
    "command_provenance",
]

# The package folder (src/sinkwindow in a checkout): what "the source" of a row means.
PACKAGE_DIR = Path(__file__).resolve().parents[1]
LIBRARIES = ("sinkwindow", "torch", "transformers", "tokenizers", "gguf", "lm-eval", "peft")


def utc_now(timespec: str = "seconds") -> str:
    """Now, UTC, ISO 8601 (config.json to the second; rows and sessions to the microsecond, so a
    row is never timed with the start of the session after it)."""
    return datetime.now(UTC).isoformat(timespec=timespec)


def library_versions() -> dict[str, str]:
    """Versions of what produced the numbers (recorded in config.json), and the source commit."""
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    commit = source_commit()
    if commit:
        out["sinkwindow-commit"] = commit
    return out


def source_state() -> dict | None:
    """The sinkwindow source tree a run computes with: ``{"commit", "dirty", "diff_sha256"}``, or
    ``None`` for an installed copy that is not a git checkout.

    ``dirty`` counts any change under the package (``src/sinkwindow``): edits to tracked files and
    untracked files alike. ``diff_sha256`` digests those changes (``git diff HEAD`` plus each
    untracked file's name and contents), so rows written from a dirty tree name the exact code.
    """

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout

    try:
        head = git("rev-parse", "--short=12", "HEAD").strip()
        status = git("status", "--porcelain", "--", ".").strip()
        if not status:
            return {"commit": head or None, "dirty": False, "diff_sha256": None}
        h = hashlib.sha256(git("diff", "HEAD", "--", ".").encode())
        for name in git("ls-files", "--others", "--exclude-standard", "--", ".").split():
            path = PACKAGE_DIR / name
            h.update(name.encode())
            if path.is_file():
                h.update(path.read_bytes())
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head or None, "dirty": True, "diff_sha256": h.hexdigest()}


def source_commit() -> str | None:
    """The git commit of the sinkwindow source tree (``+dirty`` with uncommitted changes under
    ``src/sinkwindow``), or ``None`` for an installed copy. Recorded so a committed run names its code."""
    state = source_state()
    if state is None or state["commit"] is None:
        return None
    return f"{state['commit']}+dirty" if state["dirty"] else state["commit"]


def check_clean_source(allow_dirty: bool) -> str | None:
    """Refuse to write results from uncommitted code unless asked; return the diff's sha256 to record.

    Rows must name the code that made them: from a tree with uncommitted changes under
    ``src/sinkwindow`` a run refuses, unless ``allow_dirty`` (``--allow-dirty``, or the environment
    variable ``SINKWINDOW_ALLOW_DIRTY=1``), and then every row records ``source_diff`` (the sha256
    of those changes, :func:`source_state`).

    Raises:
        ValueError: a dirty tree and no permission.
    """
    state = source_state()
    if state is None or not state["dirty"]:
        return None
    if not (allow_dirty or os.environ.get("SINKWINDOW_ALLOW_DIRTY") == "1"):
        raise ValueError(
            "the sinkwindow source (src/sinkwindow) has uncommitted changes, so its rows would not name the "
            "code that made them: commit them, or pass --allow-dirty (each row then records the diff's sha256)"
        )
    return state["diff_sha256"]


def command_provenance() -> dict:
    """What produced a file outside a run folder's rows: the command line and the library versions."""
    import shlex
    import sys

    return {"command": shlex.join(["sinkwindow", *sys.argv[1:]]), "versions": library_versions()}

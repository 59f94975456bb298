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

import json
import logging
import math
import os
import shutil
from collections.abc import Collection, Iterable
from pathlib import Path

from ..jsonl import MAX_LINE_WARNINGS, append_jsonl, read_jsonl, read_jsonl_lines
from ..runs.folder import (
    FINGERPRINT_FILE,
    RunMismatchError,
    check_run_dir,
    move_aside,
    previous_dir,
    read_settings,
    repair_tail,
    replace_lines,
    split_method_rows,
    write_settings,
)
from ..runs.provenance import library_versions, utc_now

__all__ = [
    "ResultsStore",
    "check_redo",
    "check_resume",
    "read_jsonl",
    "row_key",
    "KEY_FIELDS",
]

logger = logging.getLogger(__name__)

# What identifies a sample; with the same fingerprint, rerunning skips it.
KEY_FIELDS = ("model", "task", "method", "length", "seed", "index")
RESULTS_FILE = "results.jsonl"
CONFIG_FILE = "config.json"
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


def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in KEY_FIELDS)


def _number(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _count(x, low: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def row_problem(row: dict) -> str | None:
    """Why ``row`` cannot count as a finished sample, or ``None`` when it can.

    The same rule for every kind of row a run folder holds: key fields of the right type, and a
    score the report can use (a long-context score in [0, 100]; a perplexity window with a
    positive token count and a finite, non-negative NLL; an lm-eval value in [0, 1] with one finite
    per-item score per item).
    """
    for name in ("task", "method"):
        if not isinstance(row.get(name), str) or not row.get(name):
            return f"no {name}"
    if row.get("suite") == "lm-eval":
        value = row.get("value")
        if value is not None and not (_number(value) and 0.0 <= value <= 1.0):
            return f"value {value!r} is not a number in [0, 1]"
        items = row.get("items") or {}
        for metric, scores in (items.get("scores") or {}).items():
            if not isinstance(scores, list) or len(scores) != len(items.get("ids") or ()):
                return f"items.scores[{metric!r}] does not give one score per item"
            if not all(_number(x) for x in scores):
                return f"items.scores[{metric!r}] holds a value that is not a finite number"
        return None
    for name, low in (("length", 0), ("index", 0)):
        if not _count(row.get(name), low):
            return f"{name} {row.get(name)!r} is not a whole number >= {low}"
    score = row.get("score")
    if row["task"] == "ppl":
        if not _count(row.get("n_tokens"), 1):
            return f"n_tokens {row.get('n_tokens')!r} is not a positive whole number"
        if not (_number(row.get("nll_sum")) and row["nll_sum"] >= 0):
            return f"nll_sum {row.get('nll_sum')!r} is not a finite number >= 0"
        if not (_number(score) and score > 0):
            return f"perplexity {score!r} is not a finite number > 0"
        # The perplexity is exp(nll_sum / n_tokens): a score that disagrees was damaged or hand-edited.
        if abs(math.log(score) - row["nll_sum"] / row["n_tokens"]) > 1e-6 * max(1.0, abs(math.log(score))):
            return f"perplexity {score!r} is not exp(nll_sum / n_tokens) = {math.exp(min(row['nll_sum'] / row['n_tokens'], 700.0)):.6g}"
        return None
    if not (_number(score) and 0.0 <= score <= 100.0):
        return f"score {score!r} is not a number in [0, 100]"
    return None


def _refuse_foreign_files(run_dir: Path) -> None:
    """A folder with a report but no run is someone's files: a run would overwrite them unasked."""
    if not run_dir.is_dir() or (run_dir / RESULTS_FILE).exists() or (run_dir / FINGERPRINT_FILE).exists():
        return
    theirs = [name for name in ("report.md", "report.html", "summary.json") if (run_dir / name).exists()]
    if theirs:
        raise RunMismatchError(
            f"{run_dir} holds {', '.join(theirs)} but no run ({RESULTS_FILE}): a run would overwrite it; "
            f"choose another --out, or pass --new-run to move those files to previous-<time>/"
        )


def _describe(value) -> str:
    text = "none" if value is None else str(value)
    # sha256 and folder digests: enough to tell them apart in one line.
    return text[:23] + "…" if len(text) > 24 else text


def check_resume(run_dir: str | os.PathLike, settings: dict, redo: Collection[str] = ()) -> dict:
    """The settings to record after resuming ``run_dir`` with ``settings``; read-only.

    Returns the folder's recorded settings updated with ``settings`` (task parameters and
    checkpoints of tasks and methods this run does not touch are kept), or ``settings`` for a
    folder without results. ``redo``: methods whose rows will be moved aside (``ResultsStore``),
    so their recorded checkpoints are not compared.

    Raises:
        RunMismatchError: the folder's results were made with other settings, or recorded none.
    """
    from .fingerprint import checkpoint_method, concerns, conflicts, without_checkpoints

    run = check_run_dir(run_dir)
    rows = read_jsonl(run / RESULTS_FILE)[0] if run.is_dir() else []
    n = len(rows)
    if not n:
        return dict(settings)
    recorded = read_settings(run)
    fix = "pass --new-run to start over (the old files move to previous-<time>/), or choose another --out"
    if recorded is None:
        what = (
            f"its {FINGERPRINT_FILE} is damaged (not the JSON record of the settings)"
            if (run / FINGERPRINT_FILE).exists()
            else f"no record of the settings they were made with ({FINGERPRINT_FILE})"
        )
        raise RunMismatchError(f"{run} holds {n} results but {what}; {fix}")
    old = without_checkpoints(recorded["settings"], redo)
    cells = {
        (r["task"], r["method"])
        for r in rows
        if isinstance(r.get("task"), str) and isinstance(r.get("method"), str)
    }
    # Settings count only with rows: one no stored row depends on is replaced, not a conflict.
    diff = [d for d in conflicts(old, settings) if concerns(d[0], cells)]
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
    from ..runtime.spec import parse_spec

    canonical = {str(parse_spec(m)) for m in methods}
    out = tuple(dict.fromkeys(str(parse_spec(m)) for m in redo))
    missing = [m for m in out if m not in canonical]
    if missing:
        raise ValueError(
            f"--redo {','.join(missing)}: not among this run's methods ({', '.join(methods)}); add it to --methods"
        )
    return out


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
        if writer and not new_run:
            _refuse_foreign_files(self.dir)
        merged = check_resume(self.dir, settings) if settings is not None else None
        if writer:
            # First: a torn last line cut off now is gone, not "skipped", and its sample runs again.
            repair_tail(self.path)
        rows, lines, bad = read_jsonl_lines(self.path)
        self.skipped_lines = len(bad)
        recorded = read_settings(self.dir)
        # Settings count only with rows: they are recorded when this run stores its first row, so a
        # run that fails or is stopped before finishing a sample leaves no record that would refuse
        # the next, correct run.
        self._unrecorded = merged is not None and (recorded is None or recorded["settings"] != merged)
        self.settings = merged if merged is not None else (recorded["settings"] if recorded else None)
        self._rows, self.rejected = self._admit(rows, lines)
        self._fps: dict[tuple, set] = {}
        for r in self._rows:
            self._fps.setdefault(row_key(r), set()).add(r.get("fingerprint"))
        if config is not None:
            self.write_config(config)

    def _admit(self, rows: list[dict], lines: list[int]) -> tuple[list[dict], list[tuple[int, str]]]:
        """The rows that count, and ``(line, reason)`` for each that does not.

        A row is left out (so its sample runs again, and no report uses it) when ``row_problem``
        finds it unusable, when its fingerprint is not the one the folder's recorded settings give
        its (task, method) (made with other settings), or when it repeats an earlier row's key and
        fingerprint (a duplicate would count twice).
        """
        from .fingerprint import lmeval_row_fingerprint, row_fingerprint

        kept, rejected, seen = [], [], {}
        expected: dict[tuple[str, str], str] = {}
        for line, r in zip(lines, rows):
            if "task" not in r and "method" not in r:
                kept.append(r)  # not a result row at all: the report counts it as of no known shape
                continue
            why = row_problem(r)
            if why is None and self.settings is not None and r.get("fingerprint") is not None:
                cell = (r["task"], r["method"])
                if cell not in expected:
                    fp = lmeval_row_fingerprint if r.get("suite") == "lm-eval" else row_fingerprint
                    expected[cell] = fp(self.settings, *cell)
                if r["fingerprint"] != expected[cell]:
                    why = f"made with other settings (fingerprint {r['fingerprint']}, the folder's {expected[cell]})"
            if why is None:
                key = (row_key(r), r.get("fingerprint"))
                if key in seen:
                    why = f"repeats line {seen[key]}"
                else:
                    seen[key] = line
            if why is None:
                kept.append(r)
                continue
            rejected.append((line, why))
            if len(rejected) <= MAX_LINE_WARNINGS:
                logger.warning("%s:%d: leaving out a row: %s", self.path, line, why)
        if len(rejected) > MAX_LINE_WARNINGS:
            logger.warning("%s: left out %d rows in all", self.path, len(rejected))
        return kept, rejected

    def _move_aside(self) -> Path | None:
        return move_aside(self.dir, RUN_FILES)

    def _move_methods_aside(self, methods: Collection[str]) -> Path | None:
        """Move the rows of ``methods`` to ``previous-<time>/results.jsonl``; forget their checkpoints."""
        from .fingerprint import without_checkpoints

        recorded = read_settings(self.dir)
        moved, kept = split_method_rows(self.path, methods)
        forgotten = without_checkpoints(recorded["settings"], methods) if recorded is not None else None
        if not moved and (recorded is None or forgotten == recorded["settings"]):
            return None
        target = previous_dir(self.dir)
        for name in (CONFIG_FILE, FINGERPRINT_FILE):  # what the moved rows were made under
            if (self.dir / name).exists():
                shutil.copy2(self.dir / name, target / name)
        (target / RESULTS_FILE).write_text("".join(moved))
        replace_lines(self.path, kept)
        if forgotten is not None:
            write_settings(self.dir, forgotten)
        logger.warning(
            "redo %s in %s: its %d previous rows are in %s", ", ".join(methods), self.dir, len(moved), target
        )
        return target

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
        if self._unrecorded:
            write_settings(self.dir, self.settings)
            self._unrecorded = False
        append_jsonl(self.path, row, sort_keys=True, default=str)
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

"""The committed reference run that a quick report points to, rendered from its own results file.

A quick ``compare`` has a few samples per cell; the project commits one long run per packaged model
(``benchmarks/results/<date>-<name>-long/``, e.g. ``2026-12-02-smollm2-long``: ``sinkwindow compare --full`` with >= 30 samples per
cell). A quick report on the same model opens with that folder's decisions (``decisions.py``: SWA
against each baseline by exact test), checks its own samples against the folder's, and shows the
folder's headline tables further down; all of it computed at report time from the folder's
``results.jsonl`` by the same :func:`~.summary.summarize` as any report, and labelled with the
folder's date, its sample counts and the commit(s) that produced it, so no number in it is typed by
hand or goes stale when the run is extended.

The folder is looked for under ``benchmarks/results/`` of the current directory and of the source
checkout the package runs from; an installed wheel has neither, and the report then says so in one
line. ``--reference-run DIR`` names another folder.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .report import long_context_rows
from .results import CONFIG_FILE, ResultsStore
from .summary import summarize
from .tables import headline_sections

__all__ = ["find_reference_run", "load_reference", "reference_section", "Reference", "REFERENCE_SUFFIX"]

# benchmarks/results/<YYYY-MM-DD>-<model>-long
REFERENCE_SUFFIX = "-long"
RESULTS_DIR = Path("benchmarks") / "results"


def _roots() -> list[Path]:
    roots = [Path.cwd() / RESULTS_DIR]
    # src/sinkwindow/eval/committed_run.py -> the checkout holding src/ (an editable install).
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "pyproject.toml").is_file():
        roots.append(checkout / RESULTS_DIR)
    out: list[Path] = []
    for r in roots:
        if r.is_dir() and r.resolve() not in {o.resolve() for o in out}:
            out.append(r)
    return out


def find_reference_run(model: str, roots: list[Path] | None = None) -> Path | None:
    """The newest ``<date>-<name>-long`` folder with a ``results.jsonl``, or ``None``; ``name`` is the
    model's name or its family part (``smollm2-135m`` or ``smollm2``; a hub id's ``/`` reads ``--``).

    Folder names start with an ISO date, so the newest sorts last.
    """
    name = model.replace("/", "--")
    names = {name, name.split("-")[0]}
    found = []
    for root in _roots() if roots is None else roots:
        for n in names:
            for d in Path(root).glob(f"????-??-??-{n}{REFERENCE_SUFFIX}"):
                if (d / "results.jsonl").is_file():
                    found.append(d)
    return max(found, key=lambda d: d.name) if found else None


def _commits(config: dict) -> list[str]:
    seen: list[str] = []
    for c in [*(config.get("history") or []), config]:
        commit = (c.get("versions") or {}).get("sinkwindow-commit") if isinstance(c, dict) else None
        if commit and commit not in seen:
            seen.append(commit)
    return seen


@dataclass(frozen=True)
class Reference:
    """A reference run read once: its folder name, the label naming its n and commits, its
    long-context rows and their :func:`~.summary.summarize` dict."""

    name: str
    label: str
    rows: list
    summary: dict

    def section(self) -> list[str]:
        """Markdown lines: the label and the headline tables (summary, S-NIAH-3, BABILong, SWA ÷ LoLCATs)."""
        lines = [f"## Reference run: {self.name}", "", self.label, ""]
        return lines + headline_sections(self.summary, level=3)


def load_reference(folder: str | os.PathLike, link_from: str | os.PathLike | None = None) -> Reference:
    """Read a reference run folder and summarize its rows.

    Args:
        folder: the reference run folder.
        link_from: the folder of the report that embeds it; the label's link is relative to it.

    Raises:
        ValueError: the folder holds no readable long-context rows.
    """
    folder = Path(folder)
    rows, _, _ = long_context_rows(ResultsStore(folder).rows())
    if not rows:
        raise ValueError(
            f"{folder} holds no long-context results: pass a folder written by sinkwindow compare"
        )
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        config = {}
    per_cell = Counter((r["task"], r["length"], r["method"]) for r in rows if r["task"] != "ppl")
    n_lo, n_hi = (min(per_cell.values()), max(per_cell.values())) if per_cell else (0, 0)
    link = str(folder.resolve())
    if link_from is not None:
        link = os.path.relpath(folder.resolve(), Path(link_from).resolve())
    commits = _commits(config)
    label = (
        f"From the committed run [`{folder.name}`]({link}) (`results.jsonl`: {len(rows)} rows; "
        f"n = {n_lo}{'' if n_lo == n_hi else f'–{n_hi}'} per task, length and method; seed "
        f"{config.get('seed', '?')}; model {config.get('model', '?')}; "
        f"{'commit ' + ', '.join(commits) if commits else 'commit not recorded'}; last written "
        f"{config.get('updated', '?')}). Rendered from that file now, as its own report is; these are "
        "the numbers to quote, the quick run's are a smoke test."
    )
    return Reference(folder.name, label, rows, summarize(rows))


def reference_section(folder: str | os.PathLike, link_from: str | os.PathLike | None = None) -> list[str]:
    """Markdown lines: the reference run's label and headline tables, computed from
    ``folder/results.jsonl`` (:func:`load_reference`, then :meth:`Reference.section`).

    Raises:
        ValueError: the folder holds no readable long-context rows.
    """
    return load_reference(folder, link_from).section()

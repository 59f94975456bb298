"""Tables, plots and the report page from a results store.

Every number in a report is recomputed from ``results.jsonl``, so a report can be rebuilt at any time
(``sinkwindow report RUN_DIR``), also from a partial run. Tables follow the paper: accuracy per
context length per method, the recovery rate (method ÷ full attention, %), and averages. Every
number comes with its sample count and a 95% interval (``stats.py``):

- one task at one length: Wilson interval of the proportion correct;
- an average over several tasks (BABILong QA1–5) or over lengths: stratified bootstrap, resampling
  within each (task, length) cell, so each cell keeps its own n; Wilson on the pooled count when
  the cells have equal n, or when every score is the same (a bootstrap would have no spread);
- recovery (method ÷ full), the paper's ratio SWA ÷ LoLCATs, and differences between two methods:
  paired bootstrap over the samples both methods ran (same task, length, index and seed); a ratio
  whose numerator is all zero gets Wilson's upper bound instead (``stats.paired_bootstrap_ratio``);
- perplexity: bootstrap over windows of (nll_sum, n_tokens).

A difference between two methods is called larger than its noise only by an exact test: the
paired sign-flip test over the samples both ran (McNemar's exact test for one cell of 0/1 scores,
stratified by cell for BABILong's average of five tasks), with Holm's correction over the cells
the report lists for each compared pair (one family per pair). Bootstrap intervals are shown for scale and never decide; one printed from
fewer than ``MIN_INTERVAL_PAIRS`` pairs at zero width reads "n too small".

:func:`write_report` renders any run folder the CLI writes: long-context runs (``results.jsonl``
from ``eval``/``compare``, with a ``short/`` lm-eval section when there is one), lm-eval runs
(``results.jsonl`` of ``suite: lm-eval`` rows); ``sinkwindow report`` sends ``bench`` runs
(``bench.jsonl``) to ``bench/report.py``, so evaluation never imports the benchmarks. Unreadable lines and rows of no known shape are skipped, counted and
mentioned in the report; a folder with none of these is refused and left as it is.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from ..runtime.spec import parse_spec
from .decisions import opening_lines
from .html import md_to_html
from .plots import render_plots
from .summary import summarize
from .tables import markdown_report
from .window_split import read_needles

__all__ = ["adapter_facts", "write_report", "long_context_rows"]

logger = logging.getLogger(__name__)


def _json_safe(obj):
    """Non-finite floats to ``None`` (JSON has no NaN or Infinity); keys to strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _long_context_row(r: dict) -> bool:
    if (
        r.get("suite") is not None
        or not isinstance(r.get("task"), str)
        or not isinstance(r.get("method"), str)
    ):
        return False
    if not isinstance(r.get("length"), int) or isinstance(r.get("length"), bool):
        return False
    if r["task"] == "ppl":
        return (
            all(_is_number(r.get(k)) for k in ("nll_sum", "n_tokens", "bucket_size"))
            and isinstance(r.get("bucket_nll_sum"), list)
            and isinstance(r.get("bucket_count"), list)
        )
    return _is_number(r.get("score"))


def long_context_rows(rows: list[dict]) -> tuple[list[dict], list[dict], int]:
    """Split rows into (long-context rows, lm-eval rows, how many fit neither and are skipped)."""
    ours, lmeval, foreign = [], [], 0
    for r in rows:
        if r.get("suite") == "lm-eval":
            lmeval.append(r)
        elif _long_context_row(r):
            ours.append(r)
        else:
            foreign += 1
    return ours, lmeval, foreign


def _skip_notes(path: Path, skipped_lines: int, foreign: int, rejected=()) -> list[str]:
    notes = []
    if rejected:
        shown = "; ".join(f"line {line}: {why}" for line, why in rejected[:5])
        more = f"; and {len(rejected) - 5} more" if len(rejected) > 5 else ""
        notes.append(
            f"{len(rejected)} row(s) of {path.name} were left out of this report (and run again on resume): "
            f"{shown}{more}."
        )
    if skipped_lines:
        notes.append(
            f"{skipped_lines} unreadable line(s) of {path.name} were skipped (the warnings name each line)."
        )
    if foreign:
        notes.append(
            f"{foreign} row(s) of {path.name} of no known shape (no task, method, length or score) were skipped."
        )
    return notes


def _write_page(run: Path, md: str, summary: dict) -> Path:
    (run / "report.md").write_text(md)
    (run / "report.html").write_text(md_to_html(md))
    (run / "summary.json").write_text(json.dumps(_json_safe(summary), indent=2, default=str, allow_nan=False))
    return run / "report.md"


def _lmeval_report(run: Path, rows: list[dict], notes: list[str]) -> Path:
    from .lmeval import recovery_table

    md, data = recovery_table(rows)
    models = ", ".join(sorted({str(r.get("model")) for r in rows}))
    lines = [f"# sinkwindow report: {models} (short tasks, lm-evaluation-harness)", ""]
    lines += [line for note in notes for line in (f"**Note:** {note}", "")]
    lines += ["## Short-context tasks (lm-eval)", "", md]
    return _write_page(run, "\n".join(lines), {"kind": "lm-eval", **data, "notes": notes})


def write_report(
    run_dir: str | Path,
    extra_sections: list[str] = (),
    *,
    store=None,
    reference_run: str | Path | None = None,
) -> Path:
    """Rebuild the report of a run folder; return the path of its Markdown page.

    - long-context (``results.jsonl`` of ``eval``/``compare`` rows): ``report.md``, ``report.html``,
      ``summary.json`` (:func:`summarize`'s dict; numbers that are not finite, such as an interval
      reaching +inf or an undefined ratio, are written as ``null``, and the entry's ``flag`` says
      why) and the PNGs. lm-eval rows in the same file, or in ``short/results.jsonl`` when no
      ``extra_sections`` are given, add a short-task section.
    - lm-eval only (``suite: lm-eval`` rows): the recovery table as ``report.md``/``.html``/``summary.json``.
    - bench (``bench.jsonl``): ``bench.md``, ``targets.json`` and plots (``bench/report.py``).

    Args:
        store: a ``ResultsStore`` of this folder whose ``rows()`` to report instead of every row
            of the file (``run_eval``'s store covers the cells the run asked for).
        reference_run: a committed long run of the same model (``reference_run.py``) whose headline
            tables to add, computed from its own ``results.jsonl``; ignored when it is this folder.

    Raises:
        FileNotFoundError: no such folder, or it holds no results (nothing is created).
        ValueError: a file instead of a folder, or results without a readable row.
    """
    from .results import CONFIG_FILE, RESULTS_FILE, ResultsStore

    run = Path(run_dir)
    _check_report_folder(run, has_store=store is not None)
    if store is None:
        store = ResultsStore(run)
    rows, lm_rows, _ = long_context_rows(store.rows())
    # Rows of no known shape belong to no cell, so a run's selection never covers them: count them all.
    foreign = long_context_rows(store.all_rows())[2]
    notes = _skip_notes(store.path, store.skipped_lines, foreign, store.rejected)
    if store.selection is not None:
        # A staged folder (say 30 samples, then a run asking for 10) holds rows this run did not ask
        # for; the report covers the run, and says how to see the rest.
        beyond = len(long_context_rows(store.all_rows())[0]) - len(rows)
        if beyond > 0:
            notes.append(
                f"This report covers the {len(rows)} row(s) this run asked for; {run} holds {beyond} more "
                f"(other samples, lengths or methods): `sinkwindow report {run}` renders every row."
            )
    if not rows and lm_rows:
        return _lmeval_report(run, lm_rows, notes)
    if not rows:
        raise ValueError(
            f"{store.path} holds no readable results ({store.skipped_lines} unreadable line(s), {foreign} "
            f"of no known shape): rerun the evaluation into {run}"
        )
    try:
        config = json.loads((run / CONFIG_FILE).read_text()) if (run / CONFIG_FILE).exists() else {}
    except json.JSONDecodeError:
        logger.warning("%s: unreadable, the report goes without it", run / CONFIG_FILE)
        config = {}
    extra = list(extra_sections)
    if lm_rows or (not extra and (run / "short" / RESULTS_FILE).exists()):
        section = _short_section(lm_rows or None, run / "short")
        if section:
            extra += [section, ""]
    reference = None
    if reference_run is not None and Path(reference_run).resolve() != run.resolve():
        from .committed_run import load_reference

        reference = load_reference(reference_run, link_from=run)
        extra += reference.section()
    from ..runs.session_log import session_lines

    extra += session_lines(run, store.all_rows())
    trained, labels = adapter_facts(rows, config)
    s = summarize(rows, needles=read_needles(run), trained=trained, labels=labels)
    plots = render_plots(s, run)
    lead = opening_lines(s, rows, reference)
    md = markdown_report(s, config if isinstance(config, dict) else {}, plots, extra, notes, lead=lead)
    return _write_page(
        run,
        md,
        {
            **s,
            "skipped_lines": store.skipped_lines,
            "foreign_rows": foreign,
            "rejected_rows": len(store.rejected),
        },
    )


def _check_report_folder(run: Path, *, has_store: bool) -> None:
    """Refuse a path that is no long-context run folder, naming what to pass instead."""
    from .results import RESULTS_FILE

    if run.exists() and not run.is_dir():
        raise ValueError(f"{run} is a file: pass the run folder that holds it")
    if not run.is_dir():
        raise FileNotFoundError(
            f"no run folder {run}: pass a folder written by sinkwindow eval, compare or bench"
        )
    if not has_store and not (run / RESULTS_FILE).exists():
        if (run / "bench.jsonl").exists():
            raise ValueError(
                f"{run} is a bench run folder (bench.jsonl): render it with `sinkwindow report {run}`"
            )
        raise FileNotFoundError(
            f"{run} holds no results ({RESULTS_FILE} or bench.jsonl): pass a folder written by sinkwindow "
            f"eval, compare or bench"
        )


def adapter_facts(rows: list[dict], config: dict) -> tuple[dict[str, int], dict[str, str]]:
    """What the report says of each trained method in ``rows``, from its adapter: ``({method:
    sequence length it was trained on}, {method: its provenance's label})``. The adapter is the
    checkpoint named in the run's config, else the one shipped for the rows' model (only a shipped
    adapter carries a label)."""
    lengths: dict[str, int] = {}
    labels: dict[str, str] = {}
    checkpoints = (config or {}).get("checkpoints") or {}
    seen = {(r.get("model"), r.get("method")) for r in rows}
    for model, method in sorted(seen, key=str):  # a set: sorted, so the same rows give the same summary
        try:
            spec = parse_spec(method)
        except (TypeError, ValueError):
            continue
        if not spec.is_trained or method in lengths or method in labels:
            continue
        label = None
        try:
            from ..linear.adapters import read_provenance, shipped_adapter
            from ..linear.checkpoint import read_metadata

            given = checkpoints.get(method)
            if given:
                length = (read_metadata(given).get("data") or {}).get("seq_len")
            else:
                path = shipped_adapter(model, spec)
                prov = {} if path is None else read_provenance(path)
                length = prov.get("train_config", {}).get("seq_len")
                label = prov.get("label")
        except (ImportError, OSError, ValueError, KeyError):
            length = None
        if isinstance(length, int):
            lengths[method] = length
        if isinstance(label, str) and label:
            labels[method] = label
    return lengths, labels


def _short_section(rows: list[dict] | None, folder: Path) -> str | None:
    """The lm-eval section from ``rows``, or from ``folder/results.jsonl``; ``None`` without lm-eval."""
    try:
        from .lmeval import report_section
    except ImportError as err:
        logger.warning("short-task section skipped: %s", err)
        return None
    return report_section(rows if rows is not None else folder)

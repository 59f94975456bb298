"""The pair's report: the paper's table for a candidate C and its base B.

Per task and length: accuracy of B under full attention, of B under SWA at the neighbouring windows
and at equal memory, and of C; C's and SWA's recovery against B-full (ratio of means); C − SWA at
equal memory with the exact paired sign test (``stats.paired_sign_test``) on the samples both ran,
Holm-adjusted over the cells (``stats.holm``); and the state bytes each holds there. Then the same
over every accuracy cell (the stratified exact test), and a plot of state bytes against context.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from ..results import ResultsStore
from ..stats import holm, paired_sign_test
from ..tables import length_label
from ..tasks import TASKS
from .run import BASELINE_FILE

__all__ = ["write_baseline_report", "pair_table", "REPORT_FILE", "PLOT_FILE"]

logger = logging.getLogger(__name__)

REPORT_FILE = "baseline.md"
SUMMARY_FILE = "baseline_summary.json"
PLOT_FILE = "state_bytes.png"
ALPHA = 0.05


def _columns(record: dict) -> list[tuple[str, tuple[str, str]]]:
    """``(label, (role, method))`` per column, in table order: B full, B SWA windows (small to large), C."""
    cols, cand = [], record["config"]["candidate"]
    for method, info in record["roles"].items():
        if info["role"] == "base-full":
            cols.append(("B full", ("base", method)))
        elif info["role"].startswith("base-swa"):
            w = method.split(":")[1]
            mark = " =mem" if info["role"] == "base-swa" else ""
            cols.append((f"B SWA({w}){mark}", ("base", method)))
    on_base = record["candidate_kind"] == "method"
    cols.append((f"C {cand}", ("base" if on_base else "candidate", cand if on_base else "full")))
    return cols


def _cells(rows: list[dict], record: dict) -> dict[tuple, dict[tuple, dict[int, dict]]]:
    """``{(task, length): {(role, method): {index: row}}}`` of this pair's rows."""
    base, cand = record["config"]["base"], record["config"]["candidate"]
    on_base = record["candidate_kind"] == "method"
    out: dict = {}
    for r in rows:
        if r.get("model") == base and r.get("method") in record["roles"]:
            side = "base"
        elif not on_base and r.get("model") == cand and r.get("method") == "full":
            side = "candidate"
        else:
            continue
        out.setdefault((r["task"], r["length"]), {}).setdefault((side, r["method"]), {})[r["index"]] = r
    return out


def _mean(rows: dict[int, dict]) -> float:
    return sum(r["score"] for r in rows.values()) / len(rows) if rows else math.nan


def pair_table(rows: list[dict], record: dict) -> dict:
    """The numbers of the report: per cell, means, recoveries, the test; and the test over all cells."""
    cols = _columns(record)
    swa = next(key for label, key in cols if label.endswith("=mem"))
    cand = cols[-1][1]
    cells, tests = [], []
    for (task, length), by in sorted(_cells(rows, record).items(), key=lambda kv: (kv[0][0], kv[0][1])):
        means = {label: _mean(by.get(key, {})) for label, key in cols}
        full = means[cols[0][0]]
        common = sorted(set(by.get(swa, {})) & set(by.get(cand, {})))
        cell = {"task": task, "length": length, "means": means, "n": len(common),
                "state_bytes": {label: next(iter(by[key].values())).get("state_bytes") for label, key in cols if by.get(key)}}  # fmt: skip
        if TASKS[task].group != "ppl":
            cell["recovery"] = {label: means[label] / full if full else math.nan for label, _ in cols[1:]}
            if common:
                a = [by[cand][i]["score"] / 100 for i in common]
                b = [by[swa][i]["score"] / 100 for i in common]
                res = paired_sign_test(a, b, alpha=ALPHA)
                cell.update(diff=100 * (sum(a) - sum(b)) / len(a), p=res.p, min_p=res.min_p,
                            paired=(a, b), test=res.method)  # fmt: skip
                tests.append(cell)
        cells.append(cell)
    for cell, p in zip(tests, holm([c["p"] for c in tests])):
        cell["p_holm"] = p
    overall = None
    if tests:
        res = paired_sign_test([c["paired"][0] for c in tests], [c["paired"][1] for c in tests], alpha=ALPHA)
        diff = sum(100 * (sum(c["paired"][0]) - sum(c["paired"][1])) / c["n"] for c in tests) / len(tests)
        overall = {"diff": diff, "p": res.p, "min_p": res.min_p, "test": res.method, "cells": len(tests)}
    for c in tests:
        del c["paired"]
    return {"columns": [label for label, _ in cols], "cells": cells, "overall": overall}


def _fmt_bytes(n) -> str:
    if n is None:
        return "–"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _fmt(x: float, spec: str = ".1f") -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _pct(x) -> str:
    return "–" if x is None or math.isnan(x) else f"{100 * x:.0f}%"


def _table_lines(table: dict, record: dict) -> list[str]:
    cols = table["columns"]
    mem, cand = next(c for c in cols if c.endswith("=mem")), cols[-1]
    head = ["task", "length", *cols, "C / B full", "SWA=mem / B full", "C − SWA=mem", "n", "p", "p (Holm)",
            f"state: {cand}", f"state: {mem}"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in table["cells"]:
        rec = c.get("recovery", {})
        lines.append(
            "| " + " | ".join([
                c["task"], length_label(c["length"]), *(_fmt(c["means"][k]) for k in cols),
                _pct(rec.get(cand)), _pct(rec.get(mem)), _fmt(c.get("diff"), "+.1f"), str(c["n"]),
                _fmt(c.get("p"), ".3g"), _fmt(c.get("p_holm"), ".3g"),
                _fmt_bytes(c["state_bytes"].get(cand)), _fmt_bytes(c["state_bytes"].get(mem)),
            ]) + " |"
        )  # fmt: skip
    return lines


def _markdown(table: dict, record: dict, plotted: bool) -> str:
    cfg, choice = record["config"], record["choice"]
    cand = table["columns"][-1]
    lines = [
        f"# Baseline: {cfg['candidate']} against SWA on {cfg['base']}",
        "",
        f"- Candidate C: `{cfg['candidate']}` ({'a method of the base' if record['candidate_kind'] == 'method' else 'a model of its own'}); base B: `{cfg['base']}`.",
        f"- C's decoding state after a prefill of {record['eval_context']} tokens: {choice['budget_bytes']:,} bytes "
        f"(every tensor of its cache object, shared storage once).",
        f"- Equal memory: SWA({choice['window']}, {choice['sinks']}), {choice['why']}.",
        f"- Neighbouring windows: {', '.join(map(str, choice['neighbours'])) or 'none'}"
        + (
            f" ({', '.join(map(str, choice['neighbours_left_out']))} left out: past the context, full attention)"
            if choice.get("neighbours_left_out")
            else ""
        )
        + ".",
    ]
    if choice["within_window_at_context"]:
        lines.append(
            f"- At {record['eval_context']} tokens SWA({choice['window']}) still sees the whole context: "
            "C keeps as much as full attention here, so SWA at equal memory is full attention."
        )
    lines += ["", "## Accuracy, recovery and memory", "",
              "Accuracy in %; recovery = method ÷ B full; C − SWA=mem on the samples both ran, exact paired "
              f"sign test, Holm-adjusted over the {sum('p' in c for c in table['cells'])} cells; state bytes "
              "measured after a prefill at the cell's context.", "", *_table_lines(table, record), ""]  # fmt: skip
    o = table["overall"]
    if o is not None:
        verdict = "differ" if o["p"] <= ALPHA else "are not told apart"
        lines += [f"Over all {o['cells']} cells: {cand} − SWA=mem = {o['diff']:+.1f} points, p = {o['p']:.3g} "
                  f"({o['test']}; the smallest p these pairs allow: {o['min_p']:.3g}): they {verdict} at {ALPHA}.", ""]  # fmt: skip
    if plotted:
        lines += ["## State bytes against context", "", f"![state bytes]({PLOT_FILE})", ""]
    lines += [
        "| context | " + " | ".join(record["state_curves"]) + " |",
        "|---|" + "---|" * len(record["state_curves"]),
    ]
    ns = [n for n, _ in next(iter(record["state_curves"].values()))]
    for i, n in enumerate(ns):
        lines.append(
            f"| {n} | " + " | ".join(_fmt_bytes(c[i][1]) for c in record["state_curves"].values()) + " |"
        )
    return "\n".join(lines) + "\n"


def _plot(record: dict, path: Path) -> bool:
    """State bytes against context, one line per model (log-log); False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("no state-bytes plot: matplotlib is not installed")
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    for (label, pts), marker in zip(record["state_curves"].items(), ("o", "s", "^", "D")):
        ax.plot([n for n, _ in pts], [b for _, b in pts], marker=marker, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("decoding state (bytes, batch 1)")
    ax.set_title("measured on each cache object after a prefill")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_baseline_report(out: str | Path) -> Path:
    """Write ``baseline.md``, ``baseline_summary.json`` and ``state_bytes.png`` of a baseline run folder.

    Raises:
        ValueError: the folder holds no baseline run (one line).
    """
    out = Path(out)
    if not (out / BASELINE_FILE).is_file():
        raise ValueError(f"{out} holds no {BASELINE_FILE}: run sinkwindow baseline --out {out} first")
    record = json.loads((out / BASELINE_FILE).read_text())
    # baseline.json sorts its keys; the curves go back to B full, B SWA, C.
    rank = {"B full": 0, "B SWA": 1, "C ": 2}
    record["state_curves"] = dict(
        sorted(
            record["state_curves"].items(),
            key=lambda kv: min(r for p, r in rank.items() if kv[0].startswith(p)),
        )
    )
    table = pair_table(ResultsStore(out).all_rows(), record)
    plotted = _plot(record, out / PLOT_FILE)
    (out / SUMMARY_FILE).write_text(json.dumps({**table, "choice": record["choice"]}, indent=2, default=str))
    path = out / REPORT_FILE
    path.write_text(_markdown(table, record, plotted))
    return path

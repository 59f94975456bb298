"""Table 1 of the paper from lm-eval rows: per-task scores, average, MMLU and average recovery.

:func:`recovery_table` turns rows into the paper's layout, :func:`write_table` keeps it in
``OUT/short_tasks.md`` (and ``.json``), :func:`report_section` hands it to reports, and
:func:`read_rows` reads the rows of a run folder (unreadable lines skipped with a warning naming
file and line). Pure bookkeeping: no lm-eval, no torch.

Recovery is ``100 * method / full`` on the same metric and items. Metrics follow the field
(Mamba, LoLCATs): ``acc_norm`` for ARC-Challenge and HellaSwag, ``acc`` for the rest.

Rows that carry per-item scores (``items``, written since lm-eval runs log their samples) get 95%
intervals (``eval.stats``), for display: Wilson for each task's score, a bootstrap over items within
each task for the average, and paired bootstraps over the same items (method and baseline resampled
together) for every recovery. Decisions ("differs from full beyond noise") are exact paired tests on
the same items (``paired_sign_test``: McNemar's exact test for one task's 0/1 scores, the
stratified sign-flip test for the average over tasks), Holm-corrected over every comparison the
table lists; a comparison on too few items for any outcome to reach the level is said to be so,
never decided. Older rows without items get neither.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...runs.session_log import session_lines
from ...runtime.spec import parse_spec
from ..results import ResultsStore, read_jsonl, row_problem
from ..stats import (
    ALPHA,
    Interval,
    bootstrap_mean_interval,
    holm,
    paired_bootstrap_ratio,
    paired_sign_test,
    wilson_interval,
)
from .constants import (
    PAPER_RECOVERY,
    PAPER_TABLE1,
    SHORT_TASKS,
    SUITE,
    TABLE_FILE,
    TABLE_JSON,
    TASK_LABELS,
    headline_metric,
)

__all__ = ["recovery_table", "write_table", "report_section", "read_rows"]

logger = logging.getLogger(__name__)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a results file or of a run folder, by the store's rule: unreadable lines, and rows
    with an unusable value, other settings' fingerprint or a duplicate key, are left out with a
    warning naming the file and line (``results.ResultsStore``, ``results.row_problem``)."""
    path = Path(path)
    if path.is_dir():
        return ResultsStore(path).all_rows()
    rows, _ = read_jsonl(path)
    return [r for r in rows if row_problem(r) is None]


def _pick_rows(rows: Iterable[Mapping], baseline: str) -> dict[str, dict[str, dict[str, Mapping]]]:
    """``{model: {task: {method: row}}}``: the latest baseline row per (model, task), and for each
    other method its latest row on the same items (limit, shots, n, source) as that baseline."""
    rows = [
        r
        for r in rows
        if r.get("suite", SUITE) == SUITE and r.get("value") is not None and r.get("task") in TASK_LABELS
    ]
    latest_base: dict[tuple, Mapping] = {}
    for r in rows:
        if r["method"] == baseline:
            latest_base[(r.get("model"), r["task"])] = r
    out: dict[str, dict[str, dict[str, Mapping]]] = {}
    for r in rows:
        model, task = r.get("model"), r["task"]
        base = latest_base.get((model, task))
        slot = out.setdefault(str(model), {}).setdefault(task, {})
        if base is None:
            slot[r["method"]] = r
            continue
        same = all(r.get(k) == base.get(k) for k in ("limit", "num_fewshot", "n", "source"))
        if r["method"] == baseline:
            slot[baseline] = base
        elif same:
            slot[r["method"]] = r
        else:
            logger.warning(
                "not comparing %s / %s (limit %s, n %s) with %s (limit %s, n %s): different items",
                task,
                r["method"],
                r.get("limit"),
                r.get("n"),
                baseline,
                base.get("limit"),
                base.get("n"),
            )
    return out


def _metric_value(row: Mapping, metric: str) -> float | None:
    if row.get("metric") == metric and row.get("value") is not None:
        return float(row["value"])
    value = (row.get("metrics") or {}).get(metric)
    return None if value is None else float(value)


def _items(row: Mapping, metric: str) -> dict[str, float] | None:
    """``{item id: score}`` of ``row`` on ``metric``, or ``None`` when the row has no per-item scores."""
    items = row.get("items") or {}
    scores = (items.get("scores") or {}).get(metric)
    if not scores or len(scores) != len(items.get("ids") or ()):
        return None
    return dict(zip(items["ids"], (float(x) for x in scores)))


def _paired(a: Mapping[str, float] | None, b: Mapping[str, float] | None) -> tuple[list, list] | None:
    """Scores of the items both rows have, in one order; ``None`` when either has none."""
    if not a or not b:
        return None
    common = sorted(set(a) & set(b))
    if not common:
        return None
    return [a[i] for i in common], [b[i] for i in common]


def _ci(interval: Interval | None, scale: float = 100.0) -> list[float] | None:
    """``[lo, hi]`` in percent, or ``None`` for a missing or undefined interval."""
    if interval is None or interval.lo != interval.lo or interval.hi != interval.hi:  # nan
        return None
    return [scale * interval.lo, scale * interval.hi]


def _intervals(by_task: Mapping[str, Mapping], method: str, baseline: str, tasks: list[str], chosen) -> dict:
    """95% intervals of one method's scores, average and recoveries (percent), where items allow."""
    mine = {t: _items(by_task[t][method], chosen[t]) if method in by_task[t] else None for t in tasks}
    base = {t: _items(by_task[t][baseline], chosen[t]) if baseline in by_task[t] else None for t in tasks}
    scores_ci = {}
    for t in tasks:
        items = mine[t]
        scores_ci[t] = _ci(wilson_interval(sum(items.values()), len(items))) if items else None
    have = [t for t in tasks if mine[t]]
    average_ci = None
    if have and len(have) == len([t for t in tasks if method in by_task[t]]):
        average_ci = _ci(bootstrap_mean_interval([list(mine[t].values()) for t in have]))
    recovery_ci, pairs = {}, {}
    for t in tasks:
        pairs[t] = _paired(mine[t], base[t])
        recovery_ci[t] = _ci(paired_bootstrap_ratio(*pairs[t])) if pairs[t] else None
    both = [t for t in tasks if method in by_task[t] and baseline in by_task[t]]
    average_recovery_ci = None
    if both and all(pairs[t] for t in both):
        ratio = paired_bootstrap_ratio([pairs[t][0] for t in both], [pairs[t][1] for t in both])
        average_recovery_ci = _ci(ratio)
    return {
        "scores_ci": scores_ci,
        "average_ci": average_ci,
        "recovery_ci": recovery_ci,
        "mmlu_recovery_ci": recovery_ci.get("mmlu"),
        "average_recovery_ci": average_recovery_ci,
    }


def recovery_table(
    rows: Iterable[Mapping],
    baseline: str = "full",
    metrics: Mapping[str, str] | None = None,
) -> tuple[str, dict]:
    """Table 1 of the paper from result rows: scores, average, MMLU and average recovery.

    Scores are percentages (``100 * value``). For each method and task, recovery is
    ``100 * method / baseline`` on the same metric (``metrics`` overrides ``HEADLINE_METRIC``) and
    the same items. The average is the mean over the tasks that both the method and the baseline
    have; "average recovery" is ``100 * average(method) / average(baseline)`` over those tasks, and
    ``mean_task_recovery`` (in the dict) the mean of the per-task recoveries.

    Returns:
        ``(markdown, data)``; ``data = {"baseline", "metrics", "paper", "models": {model: {"tasks",
        "n", "methods": {method: {"scores", "recovery", "average", "average_recovery",
        "mean_task_recovery", "mmlu_recovery", "scores_ci", "average_ci", "recovery_ci",
        "mmlu_recovery_ci", "average_recovery_ci"}}}}}``. Missing values are ``None``; an interval
        is ``[lo, hi]`` in percent (95%), ``None`` where the rows carry no per-item scores.
    """
    chosen = {**{t: headline_metric(t) for t in SHORT_TASKS}, **(metrics or {})}
    picked = _pick_rows(rows, baseline)
    data: dict[str, Any] = {
        "baseline": baseline,
        "metrics": chosen,
        "paper": dict(PAPER_RECOVERY),
        "models": {},
    }
    parts = []
    for model, by_task in picked.items():
        tasks = [t for t in SHORT_TASKS if t in by_task]
        methods: list[str] = []
        for t in tasks:
            for m in by_task[t]:
                if m not in methods:
                    methods.append(m)
        methods.sort(key=lambda m: m != baseline)  # stable: baseline first, then first-seen order
        base_scores = {
            t: _pct(_metric_value(by_task[t][baseline], chosen[t])) for t in tasks if baseline in by_task[t]
        }
        entry = {"tasks": tasks, "n": {}, "limit": {}, "methods": {}}
        for t in tasks:
            ref = by_task[t].get(baseline) or next(iter(by_task[t].values()))
            entry["n"][t] = ref.get("n")
            entry["limit"][t] = ref.get("limit")
        for m in methods:
            scores = {
                t: _pct(_metric_value(by_task[t][m], chosen[t])) if m in by_task[t] else None for t in tasks
            }
            recovery = {
                t: (
                    100.0 * scores[t] / base_scores[t]
                    if scores[t] is not None and base_scores.get(t)
                    else None
                )
                for t in tasks
            }
            both = [t for t in tasks if scores[t] is not None and base_scores.get(t) is not None]
            avg = _mean([scores[t] for t in tasks if scores[t] is not None])
            avg_both = _mean([scores[t] for t in both])
            base_avg = _mean([base_scores[t] for t in both])
            entry["methods"][m] = {
                "scores": scores,
                "recovery": recovery,
                "average": avg,
                "average_tasks": len([t for t in tasks if scores[t] is not None]),
                "average_recovery": 100.0 * avg_both / base_avg if both and base_avg else None,
                "mean_task_recovery": _mean(
                    [recovery[t] for t in both if recovery[t] is not None]
                ),  # a 0 baseline has none
                "mmlu_recovery": recovery.get("mmlu"),
                **_intervals(by_task, m, baseline, tasks, chosen),
            }
        for m, tests in _tests(by_task, methods, baseline, tasks, chosen).items():
            entry["methods"][m]["tests"] = tests
        data["models"][model] = entry
        parts.append(_markdown(model, entry, chosen, baseline, len(picked) > 1))
    if not parts:
        return "_No short-task results yet._\n", data
    footer = (
        f"\nMetric: {', '.join(f'{TASK_LABELS[t]} {chosen[t]}' for t in SHORT_TASKS)}. "
        f"Cells: score % (recovery % = 100 × method ÷ {baseline}, same metric, same items). "
        f"Avg. recovery = 100 × Avg.(method) ÷ Avg.({baseline}). "
        "[lo, hi]: 95% interval (Avg.: bootstrap over items within each task; recoveries: paired "
        f"bootstrap, method and {baseline} resampled on the same items).\n" + _paper_lines(data)
    )
    return "\n".join(parts) + footer, data


def _paper_lines(data: Mapping) -> str:
    """The paper's Table 1 rows (MMLU and 6-task average recovery over 11 base models) for the
    method kinds in the table, so our recoveries can be read beside them."""
    kinds = []
    for entry in data["models"].values():
        for m in entry["methods"]:
            try:
                kind = parse_spec(m).kind
            except ValueError:
                continue
            if kind in PAPER_TABLE1 and kind not in kinds:
                kinds.append(kind)
    if "swa" not in kinds:
        kinds.insert(0, "swa")
    rows = [
        f"{label} ({tokens} tokens) {mmlu} / {avg}"
        for label, tokens, mmlu, avg in (PAPER_TABLE1[k] for k in kinds)
    ]
    return f"Paper, MMLU / average recovery over 11 base models: {'; '.join(rows)}.\n"


def _tests(
    by_task: Mapping[str, Mapping], methods: list[str], baseline: str, tasks: list[str], chosen
) -> dict:
    """Exact paired tests of each method against ``baseline`` on the same items, Holm-corrected.

    Returns ``{method: {task or "average": {"p", "p_holm", "n", "plus", "minus", "min_p",
    "too_few"}}}``: one test per task with paired items, and the average over tasks (stratified by
    task, as the table averages) where every task has them. ``p_holm`` is adjusted over every test
    that could reject (``too_few`` ones cannot and are left out of the family).
    """
    out: dict[str, dict] = {}
    family: list[dict] = []
    for m in methods:
        if m == baseline:
            continue
        pairs = {
            t: _paired(_items(by_task[t][m], chosen[t]), _items(by_task[t][baseline], chosen[t]))
            for t in tasks
            if m in by_task[t] and baseline in by_task[t]
        }
        have = {t: p for t, p in pairs.items() if p}
        cells: dict[str, tuple] = {t: ([p[0]], [p[1]]) for t, p in have.items()}
        if have and len(have) == len(pairs) and len(have) > 1:
            cells["average"] = ([p[0] for p in have.values()], [p[1] for p in have.values()])
        out[m] = {}
        for key, (a, b) in cells.items():
            r = paired_sign_test(a, b, alpha=ALPHA)
            d = {"p": r.p, "n": r.n, "plus": r.plus, "minus": r.minus, "min_p": r.min_p,
                 "too_few": r.min_p > ALPHA, "p_holm": float("nan")}  # fmt: skip
            out[m][key] = d
            if not d["too_few"]:
                family.append(d)
    for d, q in zip(family, holm([d["p"] for d in family])):
        d["p_holm"] = q
    return out


def _noise_lines(entry: Mapping, baseline: str) -> list[str]:
    """In words: which differences from ``baseline`` an exact paired test finds beyond noise."""
    out = []
    n_tests = sum(
        not d["too_few"] for v in entry["methods"].values() for d in (v.get("tests") or {}).values()
    )
    for m, v in entry["methods"].items():
        tests = v.get("tests") or {}
        if m == baseline or not tests:
            continue
        named, few = [], []
        for key, d in tests.items():
            what = "the average" if key == "average" else TASK_LABELS[key]
            if d["too_few"]:
                few.append(what)
            elif d["p_holm"] <= ALPHA:
                side = "below" if d["minus"] > d["plus"] else "above"
                named.append(
                    f"{what} {side} {baseline} ({d['plus']} vs {d['minus']} discordant items of {d['n']}, "
                    f"p = {d['p']:.2g}, Holm {d['p_holm']:.2g})"
                )
        if named:
            out.append(f"- {m}: " + "; ".join(named) + ".")
        else:
            out.append(f"- {m}: no difference from {baseline} beyond noise.")
        if few:
            out[-1] += f" Too few items to decide: {', '.join(few)}."
    if out:
        out.append(
            f"\nExact paired tests on the same items (McNemar's exact test per task, the stratified sign-flip "
            f"test for the average), Holm-corrected over the {n_tests} comparisons above, at level {ALPHA}."
        )
    return out


def _with_ci(text: str, ci: list[float] | None) -> str:
    return text if ci is None or text == "—" else f"{text} [{ci[0]:.1f}, {ci[1]:.1f}]"


def _pct(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _markdown(model: str, entry: dict, chosen: Mapping[str, str], baseline: str, heading: bool) -> str:
    tasks = entry["tasks"]
    header = ["method", *(TASK_LABELS[t] for t in tasks), "Avg.", "MMLU recovery", "Avg. recovery"]
    lines = []
    if heading:
        lines.append(f"#### {model}\n")
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for m, v in entry["methods"].items():
        cells = [f"**{m}**" if m == baseline else m]
        for t in tasks:
            score, rec = v["scores"][t], v["recovery"][t]
            cells.append(_fmt(score) if m == baseline or rec is None else f"{_fmt(score)} ({_fmt(rec)})")
        avg = _fmt(v["average"])
        if v["average_tasks"] < len(tasks):
            avg += f" ({v['average_tasks']} tasks)"
        avg = _with_ci(avg, v.get("average_ci"))
        if m == baseline:
            cells += [avg, _fmt(v["mmlu_recovery"]), _fmt(v["average_recovery"])]
        else:
            cells += [
                avg,
                _with_ci(_fmt(v["mmlu_recovery"]), v.get("mmlu_recovery_ci")),
                _with_ci(_fmt(v["average_recovery"]), v.get("average_recovery_ci")),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    sizes = ", ".join(
        f"{TASK_LABELS[t]} {entry['n'][t]}" + (f" (limit {entry['limit'][t]})" if entry["limit"][t] else "")
        for t in tasks
    )
    lines.append(f"\nItems per task: {sizes}.")
    widths = [
        (ci[1] - ci[0]) / 2
        for v in entry["methods"].values()
        for ci in (v.get("scores_ci") or {}).values()
        if ci is not None
    ]
    if widths:
        lines.append(
            f"A task's score has a 95% Wilson interval of ±{min(widths):.1f} to ±{max(widths):.1f} points at these sizes."
        )
    noise = _noise_lines(entry, baseline)
    if noise:
        lines.append("\nDifferences from " + baseline + " beyond noise:\n")
        lines.extend(noise)
    return "\n".join(lines) + "\n"


def write_table(
    out_dir: str | os.PathLike, baseline: str = "full", rows: Iterable[Mapping] | None = None
) -> tuple[str, dict]:
    """(Re)write ``OUT/short_tasks.md`` and ``OUT/short_tasks.json`` from ``rows`` (default: every
    row of ``OUT/results.jsonl``); the markdown ends with the folder's sessions when it logs them."""
    out = Path(out_dir)
    rows = read_rows(out) if rows is None else list(rows)
    md, data = recovery_table(rows, baseline=baseline)
    sessions = "\n".join(session_lines(out, rows))  # which invocations wrote the rows, how long each took
    out.mkdir(parents=True, exist_ok=True)
    text = "### Short-context tasks (lm-eval)\n\n" + md + (f"\n\n{sessions}" if sessions else "")
    (out / TABLE_FILE).write_text(text, encoding="utf-8")
    (out / TABLE_JSON).write_text(json.dumps(data, indent=2), encoding="utf-8")
    return md, data


def report_section(source: str | os.PathLike | Iterable[Mapping], baseline: str = "full") -> str | None:
    """Markdown for the compare report's short-task section, or ``None`` when there are no rows.

    ``source`` is a run folder, a results file, or rows.
    """
    rows = read_rows(source) if isinstance(source, (str, os.PathLike)) else list(source)
    rows = [r for r in rows if r.get("suite") == SUITE]
    if not rows:
        return None
    md, _ = recovery_table(rows, baseline=baseline)
    return "## Short-context tasks (lm-eval)\n\n" + md

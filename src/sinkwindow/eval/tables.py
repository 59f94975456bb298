"""Markdown from a ``summarize`` dict: accuracy, recovery and perplexity tables, the differences
with their exact tests, the window split, and the whole report page (``markdown_report``).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict

from ..methods import method_of
from ..runtime.spec import parse_spec
from .stats import (
    ZERO_DENOMINATOR,
    wilson_interval,
)
from .summary import (
    MIN_INTERVAL_PAIRS,
    PAPER_REFERENCE,
    PAPER_WINDOW,
    method_order,
    plain_mean,
)
from .tasks import BABILONG_TASKS, FAMILY_TITLES, HEADLINE_FAMILIES, NIAH_TASKS, RULER_CATEGORIES, RULER_TASKS

__all__ = ["markdown_report", "headline_sections", "length_label"]

logger = logging.getLogger(__name__)


def _isnan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _fmt(x: float, digits: int = 1) -> str:
    if _isnan(x):
        return "–"
    if isinstance(x, float) and math.isinf(x):
        return "∞" if x > 0 else "−∞"
    return f"{x:.{digits}f}"


def _fmt_iv(d: dict | None, key: str = "mean", digits: int = 1, unit: str = "") -> str:
    """``62.5 [40.9, 80.0]``; a ratio with a zero denominator reads ``– (÷0)``."""
    if not d:
        return "–"
    if d.get("flag") == ZERO_DENOMINATOR:
        return "∞ (÷0)" if not _isnan(d[key]) else "– (0 ÷ 0)"
    return f"{_fmt(d[key], digits)}{unit}{_fmt_bounds(d, digits)}"


def _fmt_bounds(d: dict, digits: int = 1) -> str:
    """`` [40.9, 80.0]``; nothing without bounds, `` [n too small]`` for a zero-width interval of few pairs."""
    if _isnan(d["lo"]):
        return ""
    if _zero_width(d):
        return " [n too small]"
    return f" [{_fmt(d['lo'], digits)}, {_fmt(d['hi'], digits)}]"


def _zero_width(d: dict) -> bool:
    """A bootstrap interval of zero width from fewer than ``MIN_INTERVAL_PAIRS`` samples: no
    evidence of no noise, just too few samples to show any (Wilson intervals never collapse)."""
    lo, hi, n = d.get("lo"), d.get("hi"), d.get("n") or 0
    if _isnan(lo) or _isnan(hi) or math.isinf(lo) or math.isinf(hi):
        return False
    return n < MIN_INTERVAL_PAIRS and abs(hi - lo) <= 1e-9 * max(1.0, abs(lo), abs(hi))


def length_label(L: int) -> str:
    if L == 0:
        return "0K"
    return f"{L / 1024:g}K" if L % 512 == 0 else str(L)


def _accuracy_table(s: dict, family: str) -> str:
    """Accuracy per length with Wilson (or, for an average of tasks, bootstrap) intervals and n,
    the stratified average over lengths, and the paired recovery of that average."""
    data = s["accuracy"][family]
    methods = method_order(data)
    lengths = sorted({L for m in methods for L in data[m]})
    head = "| method | " + " | ".join(length_label(L) for L in lengths) + " | avg | recovery vs full |"
    sep = "|---" * (len(lengths) + 3) + "|"
    lines = [head, sep]
    trained = s.get("trained_lengths") or {}
    marked = False
    for m in methods:
        cells = []
        for L in lengths:
            if L not in data[m]:
                cells.append("–")
                continue
            past = m in trained and trained[m] < L
            marked |= past
            cells.append(f"{_fmt_iv(data[m][L])}{' †' if past else ''} <sub>n={data[m][L]['n']}</sub>")
        avg = s["accuracy_avg"][family].get(m)
        avg_txt = _fmt_iv(avg) if avg and avg["complete"] else "–"
        rec = s["recovery"].get(family, {}).get(m, {}).get("avg")
        full_avg = s["accuracy_avg"][family].get("full")
        rec_ok = rec and avg and avg["complete"] and full_avg and full_avg["complete"]
        rec_txt = _fmt_iv(rec, "estimate", unit="%") if rec_ok else "–"
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {avg_txt} | {rec_txt} |")
    if marked:
        said = ", ".join(f"{m} {trained[m]:,}" for m in methods if m in trained)
        lines += ["", f"† past the sequence length the method's adapter was trained on (tokens: {said})."]
    return "\n".join(lines)


def _recovery_table(s: dict, family: str) -> str | None:
    """Method ÷ full (%) per length, paired bootstrap over the samples both methods ran."""
    rec = s["recovery"].get(family)
    if not rec:
        return None
    lengths = sorted({L for by in rec.values() for L in by if L != "avg"})
    lines = [
        "| method | " + " | ".join(length_label(L) for L in lengths) + " | avg |",
        "|---" * (len(lengths) + 2) + "|",
    ]
    for m in method_order(rec):
        cells = [_fmt_iv(rec[m].get(L), "estimate", digits=0, unit="%") for L in lengths + ["avg"]]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ppl_table(ppl: dict) -> str:
    methods = method_order(ppl)
    lengths = sorted({L for m in methods for L in ppl[m]})
    lines = [
        "| method | " + " | ".join(f"ppl @ {length_label(L)}" for L in lengths) + " | × full |",
        "|---" * (len(lengths) + 2) + "|",
    ]
    full = ppl.get("full", {})
    for m in methods:
        cells = [
            f"{_fmt_iv(ppl[m][L], 'ppl', 2)} <sub>{ppl[m][L]['windows']} win, {ppl[m][L]['n_tokens']} tok</sub>"
            if L in ppl[m]
            else "–"
            for L in lengths
        ]
        ratio = [ppl[m][L]["ppl"] / full[L]["ppl"] for L in lengths if L in ppl[m] and L in full]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {_fmt(plain_mean(ratio), 2)} |")
    return "\n".join(lines)


def _summary_table(s: dict) -> str:
    """One row per method: the headline of each task family, paper-style."""
    acc = s["accuracy"]
    methods = method_order(set(s["ppl"]) | {m for fam in acc.values() for m in fam})
    fams = [f for f in HEADLINE_FAMILIES if f in acc]
    head = (
        "| method | "
        + " | ".join(["perplexity"] * bool(s["ppl"]) + [FAMILY_TITLES[f].split(" (")[0] for f in fams])
        + " |"
    )
    lines = [head, "|---" * (1 + bool(s["ppl"]) + len(fams)) + "|"]
    for m in methods:
        cells = []
        if s["ppl"]:
            by_len = s["ppl"].get(m, {})
            cells.append(" / ".join(_fmt(v["ppl"], 1) for _, v in sorted(by_len.items())) or "–")
        for f in fams:
            avg = s["accuracy_avg"][f].get(m)
            if not avg:
                cells.append("–")
                continue
            rec = s["recovery"].get(f, {}).get(m, {}).get("avg")
            rec_txt = f"; {_fmt_iv(rec, 'estimate', digits=0, unit='%')}" if rec and m != "full" else ""
            cells.append(f"{_fmt_iv(avg)}{rec_txt}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _swa_lolcats_section(s: dict, level: int = 2) -> list[str]:
    """The paper's ratio SWA ÷ LoLCATs per length, ours with paired intervals, the paper's beside."""
    if not s["swa_vs_lolcats"]:
        return []
    lines = [
        "#" * level + " SWA ÷ LoLCATs, the paper's comparison",
        "",
        "Ratio of mean accuracies on the same samples (95% paired bootstrap interval; n pairs). "
        "Above 1: SWA wins. (÷0): LoLCATs scored 0, so the ratio has no finite value.",
        "",
    ]
    for pair, by_fam in s["swa_vs_lolcats"].items():
        a, b = pair.split(" / ")
        lengths = sorted({L for by in by_fam.values() for L in by})
        lines += [
            f"**`{a}` ÷ `{b}`**",
            "",
            "| task | " + " | ".join(length_label(L) for L in lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        for fam, by_len in by_fam.items():
            cells = [
                f"{_fmt_iv(by_len[L], 'estimate', 2, '×')} <sub>n={by_len[L]['n']}</sub>"
                if L in by_len
                else "–"
                for L in lengths
            ]
            lines.append(f"| {FAMILY_TITLES[fam].split(' (')[0]} | " + " | ".join(cells) + " |")
            paper = PAPER_REFERENCE.get(fam)
            retrofit = method_of(b).family
            if paper and retrofit in paper and parse_spec(b).window == PAPER_WINDOW:
                swa, lol = paper["SWA(256,4)"], paper[retrofit]
                cells = [f"{swa[L] / lol[L]:.2f}×" if L in swa and lol[L] else "–" for L in lengths]
                lines.append(
                    f"| {FAMILY_TITLES[fam].split(' (')[0]}, paper (Llama-3.1-8B) | "
                    + " | ".join(cells)
                    + " |"
                )
        lines.append("")
    return lines


def headline_sections(s: dict, level: int = 2) -> list[str]:
    """The paper's headline in Markdown lines, from :func:`summarize`'s dict: the summary table, the
    two families of its Table 3 (S-NIAH-3, BABILong QA1–5) per length, and SWA ÷ LoLCATs.
    ``level`` is the heading depth, so another page can embed them (``reference_run.py``)."""
    h = "#" * level
    lines = [f"{h} Summary", "", _summary_table(s), ""]
    for family in ("niah_single_3", "babilong"):
        if family in s["accuracy"]:
            lines += [f"{h} {FAMILY_TITLES[family]}", "", _accuracy_table(s, family), ""]
    return lines + _swa_lolcats_section(s, level)


def _hybrid_section(s: dict) -> list[str]:
    """Hybrid specs (a few layers or KV heads keep full attention): S-NIAH average, recovery, KV bytes."""
    hyb = s.get("hybrid") or {}
    if not hyb:
        return []
    lines = [
        "## Hybrid specs: a few layers keep full attention (beyond the paper)",
        "",
        "S-NIAH-1/2/3 average on the same samples (95% interval; n = samples over the tasks); recovery = "
        "hybrid ÷ full attention, paired bootstrap; KV = analytic bytes of the attention state at that "
        "context (batch 1) and its share of full attention's. Which units stay full is chosen without "
        "training (`sinkwindow calibrate` / `tune`, on calibration prompts that share no seed with these).",
        "",
    ]
    for L, by_m in sorted(hyb.items()):
        lines += [
            f"**{length_label(L)}**",
            "",
            "| method | full units | KV bytes | KV share of full | S-NIAH avg | recovery vs full |",
            "|---|---|---|---|---|---|",
        ]
        most = max(e["tasks"] for e in by_m.values())
        for m, e in by_m.items():
            kv = e.get("kv_bytes")
            kv_txt = f"{kv / 2**20:.1f} MiB" if kv else "–"
            share = f"{100 * e['kv_share']:.1f}%" if "kv_share" in e else "–"
            rec = _fmt_iv(e.get("recovery"), "estimate", digits=0, unit="%") if "recovery" in e else "–"
            units = "all" if m == "full" else str(e["units"])
            avg = f"{_fmt_iv(e['avg'])} <sub>n={e['avg']['n']}</sub>"
            if e["tasks"] < most:  # an unfinished method: its average covers fewer tasks than the others'
                avg += f" ({e['tasks']} of {most} tasks)"
            lines.append(f"| `{m}` | {units} | {kv_txt} | {share} | {avg} | {rec} |")
        lines.append("")
    return lines


def _differences_section(s: dict) -> list[str]:
    """Which differences are larger than their noise, in words, one line per (pair, task)."""
    diffs = s["differences"]
    if not diffs:
        return []
    lines = [
        "## Which differences are larger than their noise",
        "",
        "A difference (a − b, points) counts when an exact paired test rejects equality at 5% after "
        "Holm's correction: the sign test on the discordant pairs (McNemar's exact test) for one task, "
        "the same sign-flip test stratified by task for BABILong's average. Each compared pair is one Holm "
        "family (every task and length listed under it). p is the "
        "test's, Holm's adjusted value in brackets; the 95% paired bootstrap interval is shown for scale "
        "and decides nothing. Where no outcome on the pairs could reach 5% (fewer than 6 pairs), no "
        "decision is made: too few samples to tell. mdd is the smallest difference the test could call "
        "on that cell's pairs (every discordant pair one way).",
        "",
    ]
    groups: dict = defaultdict(list)
    for d in diffs:
        groups[(d["a"], d["b"])].append(d)
    against_full = []
    for (a, b), ds in groups.items():
        block = [f"`{a}` against `{b}`:", ""] + [
            _difference_line(a, b, fam, fds) for fam, fds in _by_family(ds)
        ]
        if b == "full":
            against_full += block + [""]
        else:
            lines += block + [""]
    if against_full:
        lines += ["<details><summary>Each method against full attention</summary>", ""]
        lines += against_full + ["</details>", ""]
    return lines


def _window_split_section(s: dict) -> list[str]:
    """Per S-NIAH task and length, each method's score on needles inside its window and beyond it."""
    split = s.get("window_split") or {}
    if not split:
        return []
    lines = [
        "## Where the needle was: inside the window or beyond it",
        "",
        "Each cell: needles found / samples, for the needles that lay inside the method's window (its s sinks "
        "or last w − s prompt positions; for lolcats:W and liger:W their last W, by softmax) and for those "
        "beyond it; `full` is split by the window of the SWA method beside it, on its own samples. "
        "'expected' is the share of the prompt the window covers, what a uniform needle position would put "
        "inside; a cell's in-window share far above it scores high for where its needles fell.",
        "",
    ]
    beyond_total: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for task in ("niah_single_1", "niah_single_2", "niah_single_3"):
        by_method = split.get(task)
        if not by_method:
            continue
        lengths = sorted({L for cells in by_method.values() for L in cells})
        lines += [f"**{FAMILY_TITLES[task].split(' (')[0]}**", ""]
        lines += [
            "| method | " + " | ".join(length_label(L) for L in lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        for m in method_order(by_method):
            cells = []
            for L in lengths:
                c = by_method[m].get(L)
                if c is None:
                    cells.append("–")
                    continue
                i, b = c["inside"], c["beyond"]
                n = i["n"] + b["n"]
                cells.append(
                    f"in {i['found']}/{i['n']} · beyond {b['found']}/{b['n']} "
                    f"<sub>in-window {100 * i['n'] / n:.0f}%, expected {100 * c['expected_share']:.0f}%</sub>"
                )
                beyond_total[m][0] += b["found"]
                beyond_total[m][1] += b["n"]
            by = next((c["by"] for c in by_method[m].values() if c.get("by")), None)
            label = f"{m} (split by {by})" if by else m
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    if beyond_total:
        lines += ["Retrieval beyond the window (all S-NIAH tasks and lengths):", ""]
        for m in method_order(beyond_total):
            found, n = beyond_total[m]
            if n:
                iv = wilson_interval(found, n)
                lines.append(
                    f"- `{m}`: {found} of {n} ({100 * iv.estimate:.1f}% [{100 * iv.lo:.1f}, {100 * iv.hi:.1f}])"
                )
        lines.append("")
    return lines


def format_p(d: dict) -> str:
    """``p=0.004 [Holm 0.03]``, or ``p=0.093`` where Holm did not apply."""

    def one(x: float) -> str:
        return "<1e-4" if x < 1e-4 else f"{x:.2g}" if x < 0.01 else f"{x:.3f}".rstrip("0").rstrip(".")

    text = f"p={one(d['p'])}"
    return text if _isnan(d.get("p_holm")) else f"{text} [Holm {one(d['p_holm'])}]"


def _by_family(ds: list[dict]) -> list[tuple[str, list[dict]]]:
    by_fam: dict = defaultdict(list)
    for d in ds:
        by_fam[d["family"]].append(d)
    return [(f, sorted(v, key=lambda d: d["length"])) for f, v in by_fam.items()]


def _difference_line(a: str, b: str, family: str, ds: list[dict]) -> str:
    """``- S-NIAH-3: at 2K a beats b: 60.0 vs 10.0, difference +50.0 [30.0, 70.0], n=10; the
    difference at 1K is within noise.``"""
    said = []
    for d in ds:
        if d["beyond_noise"]:
            verb = "beats" if d["estimate"] > 0 else "trails"
            said.append(
                f"at {length_label(d['length'])} {a} {verb} {b}: {_fmt(d['mean_a'])} vs {_fmt(d['mean_b'])}, "
                f"difference {d['estimate']:+.1f}{_fmt_bounds(d)}, "
                f"n={d['n']}, {format_p(d)}"
            )
    few = [f"{length_label(d['length'])} (n={d['n']})" for d in ds if d.get("too_few")]
    quiet = [
        f"{length_label(d['length'])} ({format_p(d)}, mdd {_fmt(d['mdd'])})"
        for d in ds
        if not d["beyond_noise"] and not d.get("too_few")
    ]
    if few:
        said.append(f"too few samples to tell at {', '.join(few)}")
    if quiet:
        noun, verb = ("the difference", "is") if len(quiet) == 1 else ("differences", "are")
        every = "at every length: " if not said and len(quiet) == len(ds) > 1 else "at "
        said.append(f"{noun} {every}{', '.join(quiet)} {verb} within noise")
    return f"- {FAMILY_TITLES[family].split(' (')[0]}: " + "; ".join(said) + "."


def _recovery_lines(s: dict, family: str) -> list[str]:
    table = _recovery_table(s, family)
    if not table:
        return []
    return ["Recovery vs full by length (%, paired over the same samples):", "", table, ""]


def markdown_report(
    s: dict,
    config: dict | None,
    plots: list[tuple[str, str]],
    extra_sections: list[str] = (),
    notes: list[str] = (),
    *,
    lead: list[str] = (),
) -> str:
    """The report page; ``lead`` (``decisions.opening_lines``: the answer) opens it, ``notes`` (one
    line each) go right after the introduction, and the long sections below the summary are folded."""
    cfg = config or {}
    lines = [f"# sinkwindow report: {cfg.get('model', '?')}", "", *lead]
    # The methods the rows hold: a folder built up in stages holds more than its last run asked for
    # (the config has that run's methods and samples), and cells of several n.
    methods = method_order(set(s["ppl"]) | {m for f in s["accuracy"].values() for m in f})
    asked = list(cfg.get("methods") or [])
    which = f"{', '.join(f'`{m}`' for m in asked)} at " if asked and asked != methods else ""
    labels = s.get("method_labels") or {}
    named = [f"`{m}`" + (f" ({labels[m]})" if labels.get(m) else "") for m in methods or asked]
    lines += [
        f"Methods: {', '.join(named)}. Seed {cfg.get('seed', '?')}; "
        f"the last run asked for {which}{cfg.get('samples', '?')} samples per task and length (each cell gives "
        "its n); scores are % correct (0/100 per sample, RULER "
        "string match / BABILong compare_answers)"
        + (
            "; LCC scores the predicted line's edit similarity to the true next line, 0-100 (LongBench "
            "code_sim_score; exact match is in the rows)"
            if "lcc" in s["accuracy"]
            else ""
        )
        + (
            "; RULER's multi-answer tasks score the share of their reference values found, 0-100"
            if any(c in s["accuracy"] for c in RULER_CATEGORIES)
            else ""
        )
        + "; recovery = method ÷ full attention.",
        "",
        "Every number has a 95% interval in brackets and its n: Wilson for one task at one length (a "
        "bootstrap for graded scores, such as LCC's); a "
        "stratified bootstrap (resampling within each task and length) for averages over tasks or lengths "
        "(Wilson on the pooled count when the cells have equal n, or when every score is the same); "
        "a paired bootstrap over the samples both methods ran for recovery, ratios and differences (a ratio "
        "whose method never succeeded takes Wilson's upper bound for it over the other's mean); a "
        "bootstrap over windows for perplexity.",
        "",
        *[line for note in notes for line in (f"**Note:** {note}", "")],
        "## Summary",
        "",
        "Perplexity on Paul Graham essay windows (lower is better); task columns give mean accuracy over all lengths "
        "and, after the semicolon, recovery vs full (%).",
        "",
        _summary_table(s),
        "",
    ]
    lines += _folded(_swa_lolcats_section(s), "the ratio tables, by baseline")
    lines += _hybrid_section(s)
    lines += _folded(_differences_section(s), "every compared pair, task and length, in words")
    lines += _folded(_window_split_section(s), "needles found inside and beyond each window")
    for title, fname in plots[:1]:
        lines += [f"![{title}]({fname})", ""]
    if s["ppl"]:
        lines += ["## Perplexity", "", _ppl_table(s["ppl"]), ""]
        lines += [f"![{t}]({f})" for t, f in plots if f.startswith("ppl")] + [""]
    lines += _task_sections(s, plots)
    lines += list(extra_sections)
    lines += _paper_section()
    devs = cfg.get("deviations") or []
    if devs:
        lines += ["## Deviations from the reference protocols", ""] + [f"- {d}" for d in devs] + [""]
    versions = cfg.get("versions") or {}
    if versions:
        lines += ["Produced with " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".", ""]
    return "\n".join(lines)


def _folded(section: list[str], what: str) -> list[str]:
    """A section with its heading shown and its body folded into ``<details>`` (``what`` says what the
    fold holds); an empty section stays empty."""
    if not section:
        return []
    return [section[0], "", f"<details><summary>Show {what}</summary>", "", *section[1:], "</details>", ""]


def _task_sections(s: dict, plots: list[tuple[str, str]]) -> list[str]:
    """A section per S-NIAH task, one per other task (LCC) and one for BABILong (its tasks folded
    out beneath)."""
    lines: list[str] = []
    for family in NIAH_TASKS:
        if family in s["accuracy"]:
            lines += [f"## {FAMILY_TITLES[family]}", "", _accuracy_table(s, family), ""]
            lines += _recovery_lines(s, family)
    lines += [f"![{t}]({f})" for t, f in plots if f.startswith("niah")] + [""]
    for family in HEADLINE_FAMILIES:
        # Tasks beyond S-NIAH and BABILong (LCC): their own section each.
        if (
            family in s["accuracy"]
            and family not in NIAH_TASKS
            and family != "babilong"
            and family not in RULER_CATEGORIES
        ):
            lines += [f"## {FAMILY_TITLES[family]}", "", _accuracy_table(s, family), ""]
            lines += _recovery_lines(s, family)
    if "babilong" in s["accuracy"]:
        lines += [
            f"## {FAMILY_TITLES['babilong']}",
            "",
            _accuracy_table(s, "babilong"),
            "",
        ]
        lines += _recovery_lines(s, "babilong")
        per_task = [t for t in BABILONG_TASKS if t in s["accuracy"]]
        for t in per_task:
            lines += [
                f"<details><summary>{t.replace('babilong_', 'BABILong ').upper()}</summary>",
                "",
                _accuracy_table(s, t),
                "",
                "</details>",
                "",
            ]
    return lines + _ruler_sections(s)


def _ruler_sections(s: dict) -> list[str]:
    """RULER's categories (retrieval, multi-hop tracing, aggregation), each its tasks' equal-weight
    average per method and length, then each RULER-only task's own table folded out beneath."""
    cats = [c for c in RULER_CATEGORIES if c in s["accuracy"]]
    if not cats:
        return []
    lines = [
        "## RULER by category",
        "",
        "Each category averages its tasks' scores with equal weight per task (RULER's metrics: "
        "string_match_all, the share of the reference values found in the answer, 0-100; for QA "
        "string_match_part, 100 when any reference answer is found).",
        "",
    ]
    for cat in cats:
        members = [t for t in RULER_CATEGORIES[cat] if t in s["accuracy"]]
        lines += [
            f"### {FAMILY_TITLES[cat]}",
            "",
            f"Tasks: {', '.join(members)}.",
            "",
            _accuracy_table(s, cat),
            "",
        ]
        lines += _recovery_lines(s, cat)
    for t in (t for t in RULER_TASKS if t in s["accuracy"]):
        lines += [
            f"<details><summary>{FAMILY_TITLES[t]}</summary>",
            "",
            _accuracy_table(s, t),
            "",
            "</details>",
            "",
        ]
    return lines


def _paper_section() -> list[str]:
    """The paper's numbers beside ours, for orientation."""
    lines: list[str] = []
    lines += ["## For orientation: the paper's numbers (Llama-3.1-8B, window 256)", ""]
    for fam, rows in PAPER_REFERENCE.items():
        name = FAMILY_TITLES.get(fam, fam)
        lengths = sorted(next(iter(rows.values())))
        lines += [
            f"**{name}**",
            "",
            "| method | " + " | ".join(length_label(L) for L in lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        lines += [
            f"| {m} | " + " | ".join(_fmt(float(v[L])) for L in lengths) + " |" for m, v in rows.items()
        ]
        lines.append("")
    return lines

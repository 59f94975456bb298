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

import html
import json
import logging
import math
from collections import defaultdict
from pathlib import Path

from ..spec import parse_spec
from .runner import BABILONG_TASKS, NIAH_TASKS
from .stats import (
    ZERO_DENOMINATOR,
    Interval,
    bootstrap_mean_interval,
    bootstrap_ppl_interval,
    equal_weight_size,
    holm,
    paired_bootstrap_diff,
    paired_bootstrap_ratio,
    paired_sign_test,
    wilson_interval,
)
from .window_split import read_needles, window_split

__all__ = [
    "summarize",
    "markdown_report",
    "write_report",
    "long_context_rows",
    "headline_sections",
    "PAPER_REFERENCE",
]

logger = logging.getLogger(__name__)

# Paper numbers (Llama-3.1-8B, window 256), for orientation beside ours (Jolicoeur-Martineau et al., 2026, Table 3).
PAPER_REFERENCE = {
    "niah_single_3": {
        "full attention": {512: 100, 1024: 99.8, 2048: 100, 4096: 99.8},
        "SWA(256,4)": {512: 100, 1024: 68.0, 2048: 50.2, 4096: 19.6},
        "LoLCATs(+SWA)": {512: 100, 1024: 30.6, 2048: 6.0, 4096: 2.2},
        "Liger-GLA(+SWA)": {512: 97.6, 1024: 1.0, 2048: 3.8, 4096: 0.6},
    },
    "babilong": {
        "full attention": {0: 74, 1024: 70, 2048: 67, 4096: 60},
        "SWA(256,4)": {0: 55, 1024: 20, 2048: 19, 4096: 15},
        "LoLCATs(+SWA)": {0: 56, 1024: 22, 2048: 10, 4096: 3},
    },
}
PAPER_WINDOW = 256

TASK_TITLES = {
    "niah_single_1": "S-NIAH-1 (noise haystack, 7-digit values)",
    "niah_single_2": "S-NIAH-2 (essay haystack, 7-digit values)",
    "niah_single_3": "S-NIAH-3 (essay haystack, UUID values)",
    "babilong": "BABILong QA1–QA5 average",
}
HEADLINE_FAMILIES = ("niah_single_1", "niah_single_2", "niah_single_3", "babilong")

# Bootstrap replicates per interval. 2000 puts the 2.5% and 97.5% percentiles 50 replicates from
# the ends, and a whole report still takes well under a second.
N_BOOT = 2000
# The level of every decision, after Holm's correction within its family.
ALPHA = 0.05
# A zero-width bootstrap interval from fewer pairs than this says nothing about the noise (at
# n = 10 every resample of ten equal pairs is the same): it is printed as "n too small".
MIN_INTERVAL_PAIRS = 30


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _order_methods(methods) -> list[str]:
    def key(m: str):
        if m == "full":
            return (0, 0, 0, "", m)
        try:
            sp = parse_spec(m)
        except ValueError:
            return (6, 0, 0, "", m)
        kind_rank = {"swa": 1, "evict": 2, "lolcats": 3, "liger": 4, "linear": 5}[sp.kind]
        return (kind_rank, sp.window or 0, -sp.sinks, sp.adapter, m)

    return sorted(set(methods), key=key)


def _family_tasks(family: str) -> tuple[str, ...]:
    return BABILONG_TASKS if family == "babilong" else (family,)


def _iv(iv: Interval, scale: float = 1.0, key: str = "estimate") -> dict:
    """An interval as the dict that goes into the summary (and summary.json)."""
    d = {key: iv.estimate * scale, "lo": iv.lo * scale, "hi": iv.hi * scale, "n": iv.n}
    if iv.flag:
        d["flag"] = iv.flag
    return d


class _Samples:
    """Per-sample scores as proportions: ``task -> method -> length -> {(index, seed): score}``."""

    def __init__(self) -> None:
        self.by: dict = {}

    def add(self, r: dict) -> None:
        cell = self.by.setdefault(r["task"], {}).setdefault(r["method"], {}).setdefault(r["length"], {})
        # Scores are stored 0–100; intervals are computed on proportions.
        cell[(r.get("index"), r.get("seed"))] = float(r["score"]) / 100.0

    def cell(self, task: str, method: str, length: int) -> dict:
        return self.by.get(task, {}).get(method, {}).get(length, {})

    def cells(self, tasks, method: str, lengths) -> list[list[float]]:
        """Non-empty (task, length) cells of one method, as lists of scores."""
        out = []
        for t in tasks:
            for L in lengths:
                c = self.cell(t, method, L)
                if c:
                    out.append(list(c.values()))
        return out

    def paired(self, tasks, a: str, b: str, lengths) -> tuple[list[list[float]], list[list[float]]]:
        """Cells of the samples both methods ran, aligned pair by pair."""
        ca, cb = [], []
        for t in tasks:
            for L in lengths:
                da, db = self.cell(t, a, L), self.cell(t, b, L)
                keys = sorted(da.keys() & db.keys(), key=repr)
                if keys:
                    ca.append([da[k] for k in keys])
                    cb.append([db[k] for k in keys])
        return ca, cb


def _decide(diffs: list[dict]) -> None:
    """Holm-adjust the exact tests' p-values in place and set ``beyond_noise``.

    One family per compared pair (a, b): its cells (every task and length the report lists under
    "`a` against `b`") answer one question, does a differ from b anywhere, at a family-wise 5%.
    Cells where no outcome could reach the level (``too_few``) take no part.
    """
    families: dict = defaultdict(list)
    for d in diffs:
        if not d["too_few"]:
            families[(d["a"], d["b"])].append(d)
    for fam in families.values():
        for d, q in zip(fam, holm([d["p"] for d in fam])):
            d["p_holm"] = q
            d["beyond_noise"] = q <= ALPHA
    for d in diffs:
        d.setdefault("p_holm", float("nan"))
        d.setdefault("beyond_noise", False)


def _comparison_pairs(methods) -> list[tuple[str, str]]:
    """(a, b) pairs the report compares: each SWA(W, S > 0) against the same-W LoLCATs, no-sink
    SWA, evict and linear baselines present (the paper's comparisons first), then every method
    against full."""
    methods = _order_methods(methods)
    specs = {}
    for m in methods:
        try:
            specs[m] = parse_spec(m)
        except ValueError:
            continue
    pairs = []
    for a, sa in specs.items():
        if sa.is_hybrid:
            # A hybrid against the plain SWA it extends, then against the other hybrids of that SWA.
            base = str(sa.base)
            pairs += [(a, base)] if base in specs else []
            pairs += [(a, b) for b, sb in specs.items() if sb.is_hybrid and sb.base == sa.base and b > a]
            continue
        if sa.kind != "swa" or not sa.sinks:
            continue
        ranked = []
        for b, sb in specs.items():
            same_w = sb.window == sa.window and sb.positions == sa.positions
            if sb.kind in ("lolcats", "liger") and sb.window == sa.window:
                ranked.append((0 if sb.kind == "lolcats" else 1, b))
            elif (
                sb.kind == "swa"
                and same_w
                and sb.sinks == sa.sinks
                and sb.adapter != sa.adapter
                and not sa.adapter
            ):
                ranked.append((1.5, b))  # SWA(w, s) against itself with a trained adapter: what training buys
            elif sb.kind == "swa" and same_w and sb.sinks == 0 and not sb.adapter:
                ranked.append((2, b))
            elif sb.kind == "evict" and same_w and sb.sinks == sa.sinks:
                ranked.append((3, b))
            elif sb.kind == "linear":
                ranked.append((4, b))
        pairs += [(a, b) for _, b in sorted(ranked)]
    return pairs + [(m, "full") for m in methods if m != "full" and "full" in methods]


def _average_interval(cells: list[list[float]], boot: dict) -> tuple[Interval, str]:
    """Interval of an equal-weight average over cells (tasks × lengths), and which kind it is
    (``"wilson"`` or ``"bootstrap"``).

    0/1 scores in cells of equal size: Wilson on the pooled count (the equal-weight mean is then the
    pooled mean), which stays honest when cells hold one or two samples, where a bootstrap within
    each cell has no spread at all. 0/1 scores that are all the same (every sample 0, or every
    sample 1) in cells of unequal size: the bootstrap would give a zero-width interval, so Wilson
    again, on the effective size of an equal-weight mean, n_eff = C² / Σ 1/n_c (C cells of n_c
    samples: the mean's variance at a common p is p(1 − p) / n_eff; n_eff is the pooled n when the
    sizes are equal). Otherwise the stratified bootstrap.
    """
    sizes = {len(c) for c in cells}
    flat = [v for c in cells for v in c]
    if all(v in (0.0, 1.0) for v in flat):
        if len(sizes) == 1:
            return wilson_interval(sum(flat), len(flat)), "wilson"
        if len(set(flat)) == 1 and all(cells):
            n_eff = equal_weight_size([len(c) for c in cells])
            return wilson_interval(flat[0] * n_eff, n_eff)._replace(n=len(flat)), "wilson"
    return bootstrap_mean_interval(cells, **boot), "bootstrap"


def _swa_lolcats_pairs(methods) -> list[tuple[str, str]]:
    """(SWA, retrofit) pairs of the same window: the paper's comparison, LoLCATs(+SWA) and Liger-GLA(+SWA)."""
    return [
        (a, b)
        for a, b in _comparison_pairs(methods)
        if b != "full" and parse_spec(b).kind in ("lolcats", "liger")
    ]


def summarize(
    rows: list[dict],
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    needles: dict | None = None,
    trained: dict | None = None,
) -> dict:
    """Aggregate rows into means with intervals (scores in %, as the rows store them).

    Returns a dict with:

    - ``accuracy``: ``{family: {method: {length: {"mean", "lo", "hi", "n", "ci"}}}}``. Families are
      each S-NIAH task, each ``babilong_qaK`` and ``babilong`` (the equal-weight average of QA1–5
      at each length). ``ci`` is ``"wilson"`` for one task and for an average whose tasks have
      equal n (or all-equal scores), ``"bootstrap"`` (stratified) for other averages
      (:func:`_average_interval`).
    - ``accuracy_avg``: ``{family: {method: {"mean", "lo", "hi", "n", "lengths", "complete"}}}``,
      the average over the method's lengths (same rule); ``complete`` is True when the
      method has every length of the family.
    - ``recovery``: ``{family: {method: {length | "avg": {"estimate", "lo", "hi", "n"[, "flag"]}}}}``,
      method ÷ full in %, paired over the samples both ran.
    - ``swa_vs_lolcats``: ``{"swa:W:S / lolcats:W": {family: {length: ratio interval}}}``, the
      paper's ratio, paired.
    - ``differences``: one dict per (family, a, b, length) of the compared pairs: ``mean_a``,
      ``mean_b``, ``estimate`` (a − b, points), ``lo``, ``hi``, ``n`` (pairs) and ``beyond_noise``.
    - ``ppl``: ``{method: {length: {"ppl", "lo", "hi", "n_tokens", "windows"}}}`` and
      ``ppl_buckets`` (the per-position curve); ``niah_depth`` (mean score per length and depth).

    - ``window_split``: S-NIAH scores split by where the needle lay, inside each method's window or
      beyond it (``window_split.window_split``; ``needles`` holds positions for rows without them).
    - ``trained_lengths``: ``trained`` as given, ``{method: training sequence length}``; cells past it
      are marked in the tables.

    ``n_boot`` and ``seed`` set every bootstrap, so the same rows give the same report.
    """
    samples = _Samples()
    ppl: dict = defaultdict(lambda: defaultdict(lambda: {"nll": [], "n": []}))
    buckets: dict = defaultdict(lambda: defaultdict(dict))
    depth: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        task, method, length = r["task"], r["method"], r["length"]
        if task == "ppl":
            p = ppl[method][length]
            p["nll"].append(r["nll_sum"])
            p["n"].append(r["n_tokens"])
            b = buckets[method][length]
            size = r["bucket_size"]
            for i, (s, c) in enumerate(zip(r["bucket_nll_sum"], r["bucket_count"])):
                cur = b.setdefault(i * size, [0.0, 0])
                cur[0] += s
                cur[1] += c
            continue
        samples.add(r)
        if task in NIAH_TASKS and r.get("depth") is not None:
            depth[method][(length, float(r["depth"]))].append(float(r["score"]))

    boot = dict(n_boot=n_boot, seed=seed)
    families = [t for t in samples.by if t in NIAH_TASKS or t in BABILONG_TASKS]
    families += [t for t in samples.by if t not in families]
    if any(t in BABILONG_TASKS for t in samples.by):
        families.append("babilong")
    out: dict = {
        "accuracy": {},
        "accuracy_avg": {},
        "recovery": {},
        "swa_vs_lolcats": {},
        "differences": [],
        "ppl": {},
        "ppl_buckets": {},
        "niah_depth": {},
        "hybrid": {},
        "window_split": window_split(rows, needles),
        "trained_lengths": dict(trained or {}),
    }
    lengths_of: dict[str, list[int]] = {}
    for fam in families:
        tasks = _family_tasks(fam)
        methods = _order_methods({m for t in tasks for m in samples.by.get(t, {})})
        lengths = sorted({L for t in tasks for m in methods for L in samples.by.get(t, {}).get(m, {})})
        lengths_of[fam] = lengths
        acc, avg = {}, {}
        for m in methods:
            acc[m] = {}
            for L in lengths:
                cells = samples.cells(tasks, m, [L])
                if not cells:
                    continue
                if len(cells) == 1 and all(0.0 <= v <= 1.0 for v in cells[0]):
                    iv, ci = wilson_interval(sum(cells[0]), len(cells[0])), "wilson"
                else:  # BABILong's five tasks at one length
                    iv, ci = _average_interval(cells, boot)
                acc[m][L] = {**_iv(iv, 100.0, key="mean"), "ci": ci}
            cells = samples.cells(tasks, m, lengths)
            avg[m] = {
                **_iv(_average_interval(cells, boot)[0], 100.0, key="mean"),
                "lengths": sorted(acc[m]),
                "complete": len(acc[m]) == len(lengths),
            }
        out["accuracy"][fam], out["accuracy_avg"][fam] = acc, avg
        if "full" in methods:
            rec = {}
            for m in methods:
                if m == "full":
                    continue
                rec[m] = {}
                for key, lens in [(L, [L]) for L in lengths] + [("avg", lengths)]:
                    ca, cb = samples.paired(tasks, m, "full", lens)
                    if ca:
                        rec[m][key] = _iv(paired_bootstrap_ratio(ca, cb, **boot), 100.0)
            out["recovery"][fam] = rec

    for fam in (f for f in HEADLINE_FAMILIES if f in lengths_of):
        tasks, lengths = _family_tasks(fam), lengths_of[fam]
        methods = list(out["accuracy"][fam])
        for a, b in _comparison_pairs(methods):
            for L in lengths:
                ca, cb = samples.paired(tasks, a, b, [L])
                if not ca:
                    continue
                d = paired_bootstrap_diff(ca, cb, **boot)
                t = paired_sign_test(ca, cb, alpha=ALPHA)
                out["differences"].append(
                    {
                        "family": fam,
                        "a": a,
                        "b": b,
                        "length": L,
                        "mean_a": 100.0 * _mean([_mean(c) for c in ca]),
                        "mean_b": 100.0 * _mean([_mean(c) for c in cb]),
                        **_iv(d, 100.0),
                        "p": t.p,
                        "test": t.method,
                        "discordant": [t.plus, t.minus],
                        "mdd": 100.0 * t.mdd,
                        # No data on so few pairs could reach the level: say so, decide nothing.
                        "too_few": t.min_p > ALPHA,
                    }
                )
        for a, b in _swa_lolcats_pairs(methods):
            by_len = {}
            for L in lengths:
                ca, cb = samples.paired(tasks, a, b, [L])
                if ca:
                    by_len[L] = _iv(paired_bootstrap_ratio(ca, cb, **boot))
            if by_len:
                out["swa_vs_lolcats"].setdefault(f"{a} / {b}", {})[fam] = by_len

    _decide(out["differences"])
    for m, by_len in ppl.items():
        out["ppl"][m] = {}
        for L, p in sorted(by_len.items()):
            kept = [(x, n) for x, n in zip(p["nll"], p["n"]) if n > 0]
            iv = (
                bootstrap_ppl_interval(*zip(*kept), **boot)
                if kept
                else Interval(float("nan"), float("nan"), float("nan"), 0)
            )
            out["ppl"][m][L] = {
                "ppl": iv.estimate,
                "lo": iv.lo,
                "hi": iv.hi,
                "n_tokens": sum(p["n"]),
                "windows": len(p["n"]),
            }
        out["ppl_buckets"][m] = {
            L: {start: math.exp(s / c) for start, (s, c) in sorted(b.items()) if c}
            for L, b in buckets[m].items()
        }
    for m, cells in depth.items():
        out["niah_depth"][m] = {f"{L}|{d}": _mean(v) for (L, d), v in cells.items()}
    out["hybrid"] = _hybrid_summary(rows, samples, boot)
    return out


def _hybrid_summary(rows: list[dict], samples: _Samples, boot: dict) -> dict:
    """``{length: {method: {...}}}`` for runs with hybrid specs: the S-NIAH-1/2/3 average, its recovery
    vs full (paired), and the KV bytes the rows recorded (analytic, batch 1) as a share of full's."""
    methods = {r["method"] for r in rows if r.get("task") in NIAH_TASKS}
    hybrids = set()
    for m in methods:
        try:
            if parse_spec(m).is_hybrid:
                hybrids.add(m)
        except ValueError:
            continue
    if not hybrids:
        return {}
    kv: dict = {}
    for r in rows:
        if r.get("task") in NIAH_TASKS and isinstance(r.get("kv_bytes"), int):
            kv[(r["method"], r["length"])] = r["kv_bytes"]
    tasks = tuple(t for t in NIAH_TASKS if t in samples.by)
    compared = {m for m in methods if m in hybrids or m == "full"}
    compared |= {str(parse_spec(h).base) for h in hybrids if str(parse_spec(h).base) in methods}
    out: dict = {}
    lengths = sorted({r["length"] for r in rows if r.get("task") in NIAH_TASKS})
    for L in lengths:
        by_m = {}
        for m in _order_methods(compared):
            cells = samples.cells(tasks, m, [L])
            if not cells:
                continue
            spec = parse_spec(m)
            entry = {
                "avg": _iv(_average_interval(cells, boot)[0], 100.0, key="mean"),
                "units": len(spec.full_layers) + len(spec.full_heads),
                "tasks": len(cells),
                "kv_bytes": kv.get((m, L)),
            }
            full_kv = kv.get(("full", L))
            if entry["kv_bytes"] is not None and full_kv:
                entry["kv_share"] = entry["kv_bytes"] / full_kv
            if m != "full":
                ca, cb = samples.paired(tasks, m, "full", [L])
                if ca:
                    entry["recovery"] = _iv(paired_bootstrap_ratio(ca, cb, **boot), 100.0)
            by_m[m] = entry
        out[L] = by_m
    return out


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


def _len_label(L: int) -> str:
    if L == 0:
        return "0K"
    return f"{L / 1024:g}K" if L % 512 == 0 else str(L)


def _accuracy_table(s: dict, family: str) -> str:
    """Accuracy per length with Wilson (or, for an average of tasks, bootstrap) intervals and n,
    the stratified average over lengths, and the paired recovery of that average."""
    data = s["accuracy"][family]
    methods = _order_methods(data)
    lengths = sorted({L for m in methods for L in data[m]})
    head = "| method | " + " | ".join(_len_label(L) for L in lengths) + " | avg | recovery vs full |"
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
        "| method | " + " | ".join(_len_label(L) for L in lengths) + " | avg |",
        "|---" * (len(lengths) + 2) + "|",
    ]
    for m in _order_methods(rec):
        cells = [_fmt_iv(rec[m].get(L), "estimate", digits=0, unit="%") for L in lengths + ["avg"]]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ppl_table(ppl: dict) -> str:
    methods = _order_methods(ppl)
    lengths = sorted({L for m in methods for L in ppl[m]})
    lines = [
        "| method | " + " | ".join(f"ppl @ {_len_label(L)}" for L in lengths) + " | × full |",
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
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {_fmt(_mean(ratio), 2)} |")
    return "\n".join(lines)


def _summary_table(s: dict) -> str:
    """One row per method: the headline of each task family, paper-style."""
    acc = s["accuracy"]
    methods = _order_methods(set(s["ppl"]) | {m for fam in acc.values() for m in fam})
    fams = [f for f in HEADLINE_FAMILIES if f in acc]
    head = (
        "| method | "
        + " | ".join(["perplexity"] * bool(s["ppl"]) + [TASK_TITLES[f].split(" (")[0] for f in fams])
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
            "| task | " + " | ".join(_len_label(L) for L in lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        for fam, by_len in by_fam.items():
            cells = [
                f"{_fmt_iv(by_len[L], 'estimate', 2, '×')} <sub>n={by_len[L]['n']}</sub>"
                if L in by_len
                else "–"
                for L in lengths
            ]
            lines.append(f"| {TASK_TITLES[fam].split(' (')[0]} | " + " | ".join(cells) + " |")
            paper = PAPER_REFERENCE.get(fam)
            retrofit = "LoLCATs(+SWA)" if parse_spec(b).kind == "lolcats" else "Liger-GLA(+SWA)"
            if paper and retrofit in paper and parse_spec(b).window == PAPER_WINDOW:
                swa, lol = paper["SWA(256,4)"], paper[retrofit]
                cells = [f"{swa[L] / lol[L]:.2f}×" if L in swa and lol[L] else "–" for L in lengths]
                lines.append(
                    f"| {TASK_TITLES[fam].split(' (')[0]}, paper (Llama-3.1-8B) | " + " | ".join(cells) + " |"
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
            lines += [f"{h} {TASK_TITLES[family]}", "", _accuracy_table(s, family), ""]
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
            f"**{_len_label(L)}**",
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
        lines += [f"**{TASK_TITLES[task].split(' (')[0]}**", ""]
        lines += [
            "| method | " + " | ".join(_len_label(L) for L in lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        for m in _order_methods(by_method):
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
        for m in _order_methods(beyond_total):
            found, n = beyond_total[m]
            if n:
                iv = wilson_interval(found, n)
                lines.append(
                    f"- `{m}`: {found} of {n} ({100 * iv.estimate:.1f}% [{100 * iv.lo:.1f}, {100 * iv.hi:.1f}])"
                )
        lines.append("")
    return lines


def _fmt_p(d: dict) -> str:
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
                f"at {_len_label(d['length'])} {a} {verb} {b}: {_fmt(d['mean_a'])} vs {_fmt(d['mean_b'])}, "
                f"difference {d['estimate']:+.1f}{_fmt_bounds(d)}, "
                f"n={d['n']}, {_fmt_p(d)}"
            )
    few = [f"{_len_label(d['length'])} (n={d['n']})" for d in ds if d.get("too_few")]
    quiet = [
        f"{_len_label(d['length'])} ({_fmt_p(d)}, mdd {_fmt(d['mdd'])})"
        for d in ds
        if not d["beyond_noise"] and not d.get("too_few")
    ]
    if few:
        said.append(f"too few samples to tell at {', '.join(few)}")
    if quiet:
        noun, verb = ("the difference", "is") if len(quiet) == 1 else ("differences", "are")
        every = "at every length: " if not said and len(quiet) == len(ds) > 1 else "at "
        said.append(f"{noun} {every}{', '.join(quiet)} {verb} within noise")
    return f"- {TASK_TITLES[family].split(' (')[0]}: " + "; ".join(said) + "."


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


def _accuracy_series(s: dict, family: str) -> dict[str, dict[str, list[float]]]:
    """Per method, what the accuracy plot draws: x (0K at 256), mean, lo and hi in %."""
    out = {}
    for m in _order_methods(s["accuracy"][family]):
        pts = sorted(s["accuracy"][family][m].items())
        out[m] = {
            "x": [max(L, 256) for L, _ in pts],
            "mean": [c["mean"] for _, c in pts],
            "lo": [c["lo"] for _, c in pts],
            "hi": [c["hi"] for _, c in pts],
        }
    return out


def _accuracy_figure(s: dict, fams: list[str]):
    """One panel per task family: accuracy with its 95% interval as error bars, a legend on each.

    Methods that score the same would hide each other, so each gets its own marker and line
    style and a small horizontal offset (a fraction of an octave on the log axis).
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(fams), figsize=(4.6 * len(fams), 4.0), squeeze=False)
    for ax, f in zip(axes[0], fams):
        series = _accuracy_series(s, f)
        k = len(series)
        for i, (m, ser) in enumerate(series.items()):
            shift = 2 ** (0.07 * (i - (k - 1) / 2))
            yerr = [
                [max(0.0, c - lo) for c, lo in zip(ser["mean"], ser["lo"])],
                [max(0.0, hi - c) for c, hi in zip(ser["mean"], ser["hi"])],
            ]
            ax.errorbar(
                [x * shift for x in ser["x"]],
                ser["mean"],
                yerr=yerr,
                marker=MARKERS[i % len(MARKERS)],
                linestyle=LINESTYLES[i % len(LINESTYLES)],
                markersize=5,
                capsize=3,
                elinewidth=1,
                lw=2 if m == "full" else 1.4,
                alpha=0.9,
                label=m,
            )
        ax.set_xscale("log", base=2)
        xs = sorted({x for ser in series.values() for x in ser["x"]})
        has_0k = any(0 in by for by in s["accuracy"][f].values())
        ax.set_xticks(xs, ["0K" if x == 256 and has_0k else _len_label(x) for x in xs])
        ax.minorticks_off()
        ax.set_title(TASK_TITLES[f].split(" (")[0])
        ax.set_xlabel("context (tokens)")
        ax.set_ylim(-5, 105)
        ax.grid(alpha=0.3)
        # Below the panel: with error bars spanning 0-100, no corner inside it is free of data.
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    axes[0][0].set_ylabel("accuracy (%, 95% interval)")
    fig.tight_layout()
    return fig


def _plots(s: dict, out: Path) -> list[tuple[str, str]]:
    """Write PNGs; return ``(title, filename)`` pairs. Plotting is optional (matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning("matplotlib not installed: report without plots (pip install 'sinkwindow[eval]')")
        return []
    made = []
    acc = s["accuracy"]
    fams = [f for f in HEADLINE_FAMILIES if f in acc]
    if fams:
        fig = _accuracy_figure(s, fams)
        fig.savefig(out / "accuracy_vs_context.png", dpi=110, bbox_inches="tight")  # keeps the legends
        plt.close(fig)
        made.append(
            ("Accuracy against context length (error bars: 95% intervals)", "accuracy_vs_context.png")
        )

    if s["niah_depth"]:
        methods = _order_methods(s["niah_depth"])
        fig, axes = plt.subplots(1, len(methods), figsize=(3.4 * len(methods), 3.4), squeeze=False)
        for ax, m in zip(axes[0], methods):
            cells = s["niah_depth"][m]
            lengths = sorted({int(k.split("|")[0]) for k in cells})
            bins = [0, 20, 40, 60, 80, 101]
            grid = [[float("nan")] * len(lengths) for _ in range(len(bins) - 1)]
            tally = defaultdict(list)
            for k, v in cells.items():
                L, d = k.split("|")
                b = next(i for i in range(len(bins) - 1) if bins[i] <= float(d) < bins[i + 1])
                tally[(b, lengths.index(int(L)))].append(v)
            for (b, j), v in tally.items():
                grid[b][j] = _mean(v)
            im = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto", origin="lower")
            ax.set_xticks(range(len(lengths)), [_len_label(L) for L in lengths])
            ax.set_yticks(
                range(len(bins) - 1), [f"{bins[i]}–{min(bins[i + 1], 100)}%" for i in range(len(bins) - 1)]
            )
            ax.set_title(m, fontsize=10)
            ax.set_xlabel("context")
        axes[0][0].set_ylabel("needle depth")
        fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="S-NIAH accuracy (%)")
        fig.savefig(out / "niah_depth_heatmap.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        made.append(
            ("S-NIAH accuracy by needle depth and context (all three tasks)", "niah_depth_heatmap.png")
        )

    if s["ppl_buckets"]:
        L = max(L for m in s["ppl_buckets"].values() for L in m)
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        for i, m in enumerate(_order_methods(s["ppl_buckets"])):
            curve = s["ppl_buckets"][m].get(L)
            if curve:
                ax.plot(
                    list(curve),
                    list(curve.values()),
                    marker=MARKERS[i % len(MARKERS)],
                    markersize=3,
                    linestyle=LINESTYLES[i % len(LINESTYLES)],
                    label=m,
                )
        ax.set_yscale("log")
        ax.set_xlabel("position of the predicted token")
        ax.set_ylabel("perplexity in bucket")
        ax.set_title(f"Perplexity by position ({_len_label(L)} essay windows)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "ppl_by_position.png", dpi=110)
        plt.close(fig)
        made.append(
            (
                "Perplexity by position: the sink collapse shows where SWA without sinks loses its first tokens",
                "ppl_by_position.png",
            )
        )
    return made


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
) -> str:
    """The report page; ``notes`` (one line each) go right after the introduction."""
    cfg = config or {}
    lines = [f"# sinkwindow report: {cfg.get('model', '?')}", ""]
    # The methods the rows hold: a folder built up in stages holds more than its last run asked for
    # (the config has that run's methods and samples), and cells of several n.
    methods = _order_methods(set(s["ppl"]) | {m for f in s["accuracy"].values() for m in f})
    asked = list(cfg.get("methods") or [])
    which = f"{', '.join(f'`{m}`' for m in asked)} at " if asked and asked != methods else ""
    lines += [
        f"Methods: {', '.join(f'`{m}`' for m in methods or asked)}. Seed {cfg.get('seed', '?')}; "
        f"the last run asked for {which}{cfg.get('samples', '?')} samples per task and length (each cell gives "
        "its n); scores are % correct (0/100 per sample, RULER "
        "string match / BABILong compare_answers); recovery = method ÷ full attention.",
        "",
        "Every number has a 95% interval in brackets and its n: Wilson for one task at one length; a "
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
    lines += _swa_lolcats_section(s)
    lines += _hybrid_section(s)
    lines += _differences_section(s)
    lines += _window_split_section(s)
    for title, fname in plots[:1]:
        lines += [f"![{title}]({fname})", ""]
    if s["ppl"]:
        lines += ["## Perplexity", "", _ppl_table(s["ppl"]), ""]
        lines += [f"![{t}]({f})" for t, f in plots if f.startswith("ppl")] + [""]
    for family in ("niah_single_1", "niah_single_2", "niah_single_3"):
        if family in s["accuracy"]:
            lines += [f"## {TASK_TITLES[family]}", "", _accuracy_table(s, family), ""]
            lines += _recovery_lines(s, family)
    lines += [f"![{t}]({f})" for t, f in plots if f.startswith("niah")] + [""]
    if "babilong" in s["accuracy"]:
        lines += [
            f"## {TASK_TITLES['babilong']}",
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
    lines += list(extra_sections)
    lines += ["## For orientation: the paper's numbers (Llama-3.1-8B, window 256)", ""]
    for fam, rows in PAPER_REFERENCE.items():
        name = TASK_TITLES.get(fam, fam)
        lengths = sorted(next(iter(rows.values())))
        lines += [
            f"**{name}**",
            "",
            "| method | " + " | ".join(_len_label(L) for L in lengths) + " |",
            "|---" * (len(lengths) + 1) + "|",
        ]
        lines += [
            f"| {m} | " + " | ".join(_fmt(float(v[L])) for L in lengths) + " |" for m, v in rows.items()
        ]
        lines.append("")
    devs = cfg.get("deviations") or []
    if devs:
        lines += ["## Deviations from the reference protocols", ""] + [f"- {d}" for d in devs] + [""]
    versions = cfg.get("versions") or {}
    if versions:
        lines += ["Produced with " + ", ".join(f"{k} {v}" for k, v in sorted(versions.items())) + ".", ""]
    return "\n".join(lines)


def _md_to_html(md: str) -> str:
    """A small Markdown subset (headings, tables, images, lists, details) to HTML, no dependency."""
    out, table = [], []

    def flush():
        if table:
            rows = [
                r.strip().strip("|").split("|") for r in table if not set(r.replace("|", "").strip()) <= {"-"}
            ]
            head, body = rows[0], rows[1:]
            out.append(
                "<table><thead><tr>" + "".join(f"<th>{c.strip()}</th>" for c in head) + "</tr></thead><tbody>"
            )
            out.extend("<tr>" + "".join(f"<td>{c.strip()}</td>" for c in r) + "</tr>" for r in body)
            out.append("</tbody></table>")
            table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{html.escape(line[level:].strip())}</h{level}>")
        elif line.startswith("!["):
            alt, src = line[2:].split("](", 1)
            out.append(
                f'<figure><img src="{src.rstrip(")")}" alt="{html.escape(alt)}"><figcaption>{html.escape(alt)}</figcaption></figure>'
            )
        elif line.startswith("- "):
            out.append(f"<li>{html.escape(line[2:]).replace('`', '').replace('**', '')}</li>")
        elif line.startswith("<"):
            out.append(line)
        elif line.strip():
            text = html.escape(line).replace("`", "")
            text = text.replace("**", "")
            out.append(f"<p>{text}</p>")
    flush()
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}"
        "td:first-child,th:first-child{text-align:left;font-family:monospace}th{background:#f3f3f3}"
        "img{max-width:100%}figcaption{color:#666;font-size:90%}sub{color:#888}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>sinkwindow report</title><style>{style}</style></head><body>\n"
        + "\n".join(out)
        + "\n</body></html>\n"
    )


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
    (run / "report.html").write_text(_md_to_html(md))
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
    if run.exists() and not run.is_dir():
        raise ValueError(f"{run} is a file: pass the run folder that holds it")
    if not run.is_dir():
        raise FileNotFoundError(
            f"no run folder {run}: pass a folder written by sinkwindow eval, compare or bench"
        )
    if store is None and not (run / RESULTS_FILE).exists():
        if (run / "bench.jsonl").exists():
            raise ValueError(
                f"{run} is a bench run folder (bench.jsonl): render it with `sinkwindow report {run}`"
            )
        raise FileNotFoundError(
            f"{run} holds no results ({RESULTS_FILE} or bench.jsonl): pass a folder written by sinkwindow "
            f"eval, compare or bench"
        )
    if store is None:
        store = ResultsStore(run)
    rows, lm_rows, foreign = long_context_rows(store.rows())
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
    if reference_run is not None and Path(reference_run).resolve() != run.resolve():
        from .reference_run import reference_section

        extra += reference_section(reference_run, link_from=run)
    from ..runs.sessions import session_lines

    extra += session_lines(run, store.all_rows())
    s = summarize(rows, needles=read_needles(run), trained=_trained_lengths(rows, config))
    plots = _plots(s, run)
    md = markdown_report(s, config if isinstance(config, dict) else {}, plots, extra, notes)
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


def _trained_lengths(rows: list[dict], config: dict) -> dict[str, int]:
    """``{method: sequence length its adapter was trained on}`` for the trained methods in ``rows``:
    the checkpoint named in the run's config, else the adapter shipped for the rows' model."""
    out: dict[str, int] = {}
    checkpoints = (config or {}).get("checkpoints") or {}
    seen = {(r.get("model"), r.get("method")) for r in rows}
    for model, method in sorted(seen, key=str):  # a set: sorted, so the same rows give the same summary
        try:
            spec = parse_spec(method)
        except (TypeError, ValueError):
            continue
        if not spec.is_trained or method in out:
            continue
        try:
            from ..linear.adapters import read_provenance, shipped_adapter
            from ..linear.checkpoint import read_metadata

            given = checkpoints.get(method)
            if given:
                length = (read_metadata(given).get("data") or {}).get("seq_len")
            else:
                path = shipped_adapter(model, spec)
                length = (
                    None if path is None else read_provenance(path).get("train_config", {}).get("seq_len")
                )
        except (ImportError, OSError, ValueError, KeyError):
            length = None
        if isinstance(length, int):
            out[method] = length
    return out


def _short_section(rows: list[dict] | None, folder: Path) -> str | None:
    """The lm-eval section from ``rows``, or from ``folder/results.jsonl``; ``None`` without lm-eval."""
    try:
        from .lmeval import report_section
    except ImportError as err:
        logger.warning("short-task section skipped: %s", err)
        return None
    return report_section(rows if rows is not None else folder)

"""The numbers a long-context report shows, computed from result rows: accuracy per cell with its
interval, recovery against full attention, the paired differences and their exact-test decisions.

(How each interval and test is chosen: ``eval/report.py``'s docstring.) ``summarize`` returns one
plain dict that tables, plots and the reference-run section all render.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict

from ..methods import method_of
from ..runtime.spec import parse_spec
from .stats import (
    ALPHA,
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
from .tasks import BABILONG_TASKS, HEADLINE_FAMILIES, NIAH_TASKS, RULER_CATEGORIES, RULER_TASKS, TASKS
from .window_split import window_split

__all__ = [
    "summarize",
    "plain_mean",
    "method_order",
    "PAPER_REFERENCE",
    "PAPER_WINDOW",
    "MIN_INTERVAL_PAIRS",
    "N_BOOT",
    "ALPHA",
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


# Bootstrap replicates per interval. 2000 puts the 2.5% and 97.5% percentiles 50 replicates from
# the ends, and a whole report still takes well under a second.
N_BOOT = 2000
# A zero-width bootstrap interval from fewer pairs than this says nothing about the noise (at
# n = 10 every resample of ten equal pairs is the same): it is printed as "n too small".
MIN_INTERVAL_PAIRS = 30


def plain_mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def method_order(methods) -> list[str]:
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
    """The tasks a report column averages (``babilong``: QA1-5, a RULER category: its tasks); a
    task's own column is itself."""
    if family in RULER_CATEGORIES:
        return RULER_CATEGORIES[family]
    averaged = tuple(t.name for t in TASKS.values() if t.family == family and t.name != family)
    return averaged or (family,)


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
    methods = method_order(methods)
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
        if not method_of(sa).anchors_comparisons:
            continue
        # Each method says where it stands beside SWA(w, s): the retrofits of the same w, SWA with an
        # adapter, without sinks, evict, linear (sinkwindow.methods, ``rank_against``).
        ranked = [
            (rank, b) for b, sb in specs.items() if (rank := method_of(sb).rank_against(sa)) is not None
        ]
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
    return [(a, b) for a, b in _comparison_pairs(methods) if b != "full" and method_of(b).paper_retrofit]


def summarize(
    rows: list[dict],
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    needles: dict | None = None,
    trained: dict | None = None,
    labels: dict | None = None,
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
    - ``method_labels``: ``labels`` as given, ``{method: what its adapter is}`` from the adapter's
      provenance (e.g. trained at the evaluation length, stronger than the paper's recipe).

    ``n_boot`` and ``seed`` set every bootstrap, so the same rows give the same report.
    """
    samples, ppl, buckets, depth = _collect(rows)
    boot = dict(n_boot=n_boot, seed=seed)
    families = [t for t in samples.by if t in NIAH_TASKS or t in BABILONG_TASKS]
    families += [t for t in samples.by if t not in families]
    if any(t in BABILONG_TASKS for t in samples.by):
        families.append("babilong")
    if any(t in RULER_TASKS for t in samples.by):  # RULER's categories, when more than S-NIAH ran
        families += [c for c, members in RULER_CATEGORIES.items() if any(t in samples.by for t in members)]
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
        "method_labels": dict(labels or {}),
    }
    lengths_of: dict[str, list[int]] = {}
    for fam in families:
        tasks = _family_tasks(fam)
        methods = method_order({m for t in tasks for m in samples.by.get(t, {})})
        lengths = sorted({L for t in tasks for m in methods for L in samples.by.get(t, {}).get(m, {})})
        lengths_of[fam] = lengths
        out["accuracy"][fam], out["accuracy_avg"][fam] = _accuracy(samples, tasks, methods, lengths, boot)
        if "full" in methods:
            out["recovery"][fam] = _recovery(samples, tasks, methods, lengths, boot)
    for fam in (f for f in HEADLINE_FAMILIES if f in lengths_of):
        tasks, lengths = _family_tasks(fam), lengths_of[fam]
        methods = list(out["accuracy"][fam])
        out["differences"] += _differences(samples, fam, tasks, methods, lengths, boot)
        for a, b in _swa_lolcats_pairs(methods):
            by_len = {}
            for L in lengths:
                ca, cb = samples.paired(tasks, a, b, [L])
                if ca:
                    by_len[L] = _iv(paired_bootstrap_ratio(ca, cb, **boot))
            if by_len:
                out["swa_vs_lolcats"].setdefault(f"{a} / {b}", {})[fam] = by_len
    _decide(out["differences"])
    out["ppl"], out["ppl_buckets"] = _perplexity(ppl, buckets, boot)
    for m, cells in depth.items():
        out["niah_depth"][m] = {f"{L}|{d}": plain_mean(v) for (L, d), v in cells.items()}
    out["hybrid"] = _hybrid_summary(rows, samples, boot)
    return out


def _collect(rows: list[dict]):
    """``(samples, ppl, buckets, depth)``: accuracy rows by cell, perplexity rows' NLL sums and
    token counts, their per-position buckets, and S-NIAH scores by (length, depth)."""
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
    return samples, ppl, buckets, depth


def _accuracy(samples: _Samples, tasks, methods, lengths, boot: dict) -> tuple[dict, dict]:
    """One family's ``accuracy`` (per method and length) and ``accuracy_avg`` (over the lengths)."""
    acc, avg = {}, {}
    for m in methods:
        acc[m] = {}
        for L in lengths:
            cells = samples.cells(tasks, m, [L])
            if not cells:
                continue
            if len(cells) == 1 and all(v in (0.0, 1.0) for v in cells[0]):
                iv, ci = wilson_interval(sum(cells[0]), len(cells[0])), "wilson"
            else:  # BABILong's five tasks at one length, or graded scores (LCC's edit similarity)
                iv, ci = _average_interval(cells, boot)
            acc[m][L] = {**_iv(iv, 100.0, key="mean"), "ci": ci}
        cells = samples.cells(tasks, m, lengths)
        avg[m] = {
            **_iv(_average_interval(cells, boot)[0], 100.0, key="mean"),
            "lengths": sorted(acc[m]),
            "complete": len(acc[m]) == len(lengths),
        }
    return acc, avg


def _recovery(samples: _Samples, tasks, methods, lengths, boot: dict) -> dict:
    """Each method ÷ full attention, paired, per length and over all of them (``"avg"``)."""
    rec: dict = {}
    for m in methods:
        if m == "full":
            continue
        rec[m] = {}
        for key, lens in [(L, [L]) for L in lengths] + [("avg", lengths)]:
            ca, cb = samples.paired(tasks, m, "full", lens)
            if ca:
                rec[m][key] = _iv(paired_bootstrap_ratio(ca, cb, **boot), 100.0)
    return rec


def _differences(samples: _Samples, fam: str, tasks, methods, lengths, boot: dict) -> list[dict]:
    """The compared pairs' paired differences at each length: bootstrap interval for display, the
    exact sign test's p-value and minimum detectable difference for the decision (``_decide``)."""
    out = []
    for a, b in _comparison_pairs(methods):
        for L in lengths:
            ca, cb = samples.paired(tasks, a, b, [L])
            if not ca:
                continue
            d = paired_bootstrap_diff(ca, cb, **boot)
            t = paired_sign_test(ca, cb, alpha=ALPHA)
            out.append(
                {
                    "family": fam,
                    "a": a,
                    "b": b,
                    "length": L,
                    "mean_a": 100.0 * plain_mean([plain_mean(c) for c in ca]),
                    "mean_b": 100.0 * plain_mean([plain_mean(c) for c in cb]),
                    **_iv(d, 100.0),
                    "p": t.p,
                    "test": t.method,
                    "discordant": [t.plus, t.minus],
                    "mdd": 100.0 * t.mdd,
                    # No data on so few pairs could reach the level: say so, decide nothing.
                    "too_few": t.min_p > ALPHA,
                }
            )
    return out


def _perplexity(ppl: dict, buckets: dict, boot: dict) -> tuple[dict, dict]:
    """``ppl`` (per method and length, with its interval) and ``ppl_buckets`` (per position)."""
    out, curves = {}, {}
    for m, by_len in ppl.items():
        out[m] = {}
        for L, p in sorted(by_len.items()):
            kept = [(x, n) for x, n in zip(p["nll"], p["n"]) if n > 0]
            nan = Interval(float("nan"), float("nan"), float("nan"), 0)
            iv = bootstrap_ppl_interval(*zip(*kept), **boot) if kept else nan
            out[m][L] = {
                "ppl": iv.estimate,
                "lo": iv.lo,
                "hi": iv.hi,
                "n_tokens": sum(p["n"]),
                "windows": len(p["n"]),
            }
        curves[m] = {
            L: {start: math.exp(s / c) for start, (s, c) in sorted(b.items()) if c}
            for L, b in buckets[m].items()
        }
    return out, curves


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
        for m in method_order(compared):
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

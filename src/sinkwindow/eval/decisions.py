"""The answer a report opens with: SWA against each baseline, decided by exact paired tests.

A run's ``summary.json`` holds one entry per (pair, task family, length) in ``differences``
(:func:`~.summary.summarize`): the paired difference, the exact test's p, Holm's adjusted p and
whether the difference is beyond noise. This module turns the entries of the run's lead SWA method
(the ``a`` of the first compared pair that is not against full attention) into one table, a row per
(baseline, task) and a column per length, so the decisions lead the page instead of sitting below
every cell of every method. It formats what ``summarize`` decided; it decides nothing itself.

It also checks a quick run against the reference run it embeds: which of its samples the reference
holds (same task, length, method and sample index) and whether they scored the same.
"""

from __future__ import annotations

from collections import defaultdict

from .tables import FAMILY_TITLES, format_p, length_label

__all__ = ["agreement_line", "decisions_lines", "lead_method", "opening_lines", "sample_agreement"]


def lead_method(s: dict) -> str | None:
    """The SWA method the decisions are about: ``a`` of the first pair compared with a baseline."""
    return next((d["a"] for d in s.get("differences") or [] if d["b"] != "full"), None)


def _cell(d: dict) -> str:
    """One (baseline, task, length) decision, e.g. ``**+36.7 wins** <sub>p=0.0034 [Holm 0.048]</sub>``."""
    if d.get("too_few"):
        return f"too few to tell <sub>n={d['n']}</sub>"
    p = f"<sub>{format_p(d)}</sub>"
    if d["beyond_noise"]:
        return f"**{d['estimate']:+.1f} {'wins' if d['estimate'] > 0 else 'loses'}** {p}"
    return f"{d['estimate']:+.1f} {p}"


def _tally(b: str, ds: list[dict]) -> str:
    wins = sum(d["beyond_noise"] and d["estimate"] > 0 for d in ds)
    losses = sum(d["beyond_noise"] and d["estimate"] < 0 for d in ds)
    few = sum(bool(d.get("too_few")) for d in ds)
    return (
        f"- against `{b}`: wins {wins}, loses {losses}, no difference {len(ds) - wins - losses - few}"
        + (f", too few to tell {few}" if few else "")
        + f" of {len(ds)} (task, length) cells"
    )


def decisions_lines(s: dict) -> list[str]:
    """Markdown lines: the lead SWA method against each baseline, first one line per baseline counting
    its decisions, then a table with one row per (baseline, task) and one column per length, each cell
    the difference and, in bold, a decision the exact test made.

    Args:
        s: a :func:`~.summary.summarize` dict (or a run's ``summary.json``).

    Returns:
        The lines, or ``[]`` when the run compared no SWA method with a baseline.
    """
    a = lead_method(s)
    ds = [d for d in s.get("differences") or [] if d["a"] == a and d["b"] != "full"]
    if not ds:
        return []
    lengths = sorted({d["length"] for d in ds})
    baselines = list(dict.fromkeys(d["b"] for d in ds))
    cells: dict = defaultdict(dict)
    for d in ds:
        cells[(d["b"], d["family"])][d["length"]] = d
    lines = [
        f"`{a}` against each baseline on the same samples, decided by an exact paired test at 5% after "
        "Holm's correction ('Which differences are larger than their noise' below has the test and the "
        "intervals):",
        "",
        *[_tally(b, [d for d in ds if d["b"] == b]) for b in baselines],
        "",
        f"Difference in points (`{a}` − baseline); bold where the test decides.",
        "",
        "| baseline | task | " + " | ".join(length_label(L) for L in lengths) + " |",
        "|---|---" + "|---" * len(lengths) + "|",
    ]
    for (b, fam), by_len in sorted(cells.items(), key=lambda kv: baselines.index(kv[0][0])):
        row = [_cell(by_len[L]) if L in by_len else "–" for L in lengths]
        lines.append(f"| `{b}` | {FAMILY_TITLES[fam].split(' (')[0]} | " + " | ".join(row) + " |")
    return lines + [""]


def _key(r: dict) -> tuple:
    return (r["task"], r["length"], r["method"], r.get("index"))


def sample_agreement(rows: list[dict], reference_rows: list[dict]) -> dict:
    """How this run's task samples (perplexity rows aside) compare with the reference run's.

    Returns:
        ``{"samples": n, "in_reference": k, "same_score": j, "max_gap": g}``: n task rows here, k of
        them with a row of the same task, length, method and sample index in the reference, j of
        those scoring the same (within 1e-6), g the largest score gap among the k (points).
    """
    ref = {_key(r): r["score"] for r in reference_rows if r["task"] != "ppl"}
    mine = [r for r in rows if r["task"] != "ppl"]
    gaps = [abs(r["score"] - ref[_key(r)]) for r in mine if _key(r) in ref]
    return {
        "samples": len(mine),
        "in_reference": len(gaps),
        "same_score": sum(g <= 1e-6 for g in gaps),
        "max_gap": max(gaps, default=0.0),
    }


def agreement_line(agree: dict, reference_name: str) -> str:
    """One sentence saying whether this run's samples are the reference's and score the same."""
    n, k, same = agree["samples"], agree["in_reference"], agree["same_score"]
    if k == 0:
        return (
            f"None of this run's {n} task samples is in `{reference_name}` (other tasks, lengths or methods)."
        )
    tail = (
        "and every one scores the same there"
        if same == k
        else f"and {same} of them score the same there (largest gap {agree['max_gap']:.1f} points)"
    )
    return (
        f"{k} of this run's {n} task samples are samples of `{reference_name}` (same task, length, method "
        f"and sample index), {tail}."
    )


def _too_few(s: dict) -> tuple[int, int]:
    """(compared cells with too few pairs for the exact test, all compared cells) of a summary."""
    ds = s.get("differences") or []
    return sum(bool(d.get("too_few")) for d in ds), len(ds)


def opening_lines(s: dict, rows: list[dict], reference=None) -> list[str]:
    """The sections a report opens with: the answer, then what this run measured.

    With a reference run (``reference``: a :class:`~.committed_run.Reference`), the answer is the
    reference's decisions and this run is checked against its samples; without one, the answer is
    this run's own decisions, unless no cell had pairs enough to decide anything. Either way, cells too
    small to decide are counted below the answer, never above it.

    Args:
        s: this run's :func:`~.summary.summarize` dict.
        rows: this run's long-context rows.
        reference: the embedded reference run, or ``None``.
    """
    lines: list[str] = []
    if reference is not None:
        table = decisions_lines(reference.summary)
        if table:
            lines += [f"## The answer: what the reference run {reference.name} decides", ""]
            lines += [reference.label, "", *table]
        lines += ["## What this run measured", ""]
        lines += [agreement_line(sample_agreement(rows, reference.rows), reference.name), ""]
    elif _too_few(s)[0] < _too_few(s)[1] and decisions_lines(s):
        lines += ["## The answer: what this run decides", "", *decisions_lines(s)]
        lines += ["## What this run measured", ""]
    few, cells = _too_few(s)
    if few:
        where = "the reference run's, above" if reference is not None else "a run with more samples per cell"
        lines += [
            f"**Too few samples to decide:** {few} of this run's {cells} compared (pair, task, length) cells "
            "hold fewer than the 6 pairs an exact test needs to tell two methods apart, so for them the "
            f"answer is {where}; this run's tables show that the pipeline runs and what it measured.",
            "",
        ]
    return lines

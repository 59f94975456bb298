"""The report's figures from a ``summarize`` dict: accuracy against context length, the needle
depth heatmap and perplexity by position (matplotlib, written as PNG).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from pathlib import Path

from .summary import method_order, plain_mean
from .tables import length_label
from .tasks import FAMILY_TITLES, HEADLINE_FAMILIES

__all__ = ["render_plots", "accuracy_figure", "accuracy_series"]

logger = logging.getLogger(__name__)

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


def accuracy_series(s: dict, family: str) -> dict[str, dict[str, list[float]]]:
    """Per method, what the accuracy plot draws: x (0K at 256), mean, lo and hi in %."""
    out = {}
    for m in method_order(s["accuracy"][family]):
        pts = sorted(s["accuracy"][family][m].items())
        out[m] = {
            "x": [max(L, 256) for L, _ in pts],
            "mean": [c["mean"] for _, c in pts],
            "lo": [c["lo"] for _, c in pts],
            "hi": [c["hi"] for _, c in pts],
        }
    return out


def accuracy_figure(s: dict, fams: list[str]):
    """One panel per task family: accuracy with its 95% interval as error bars, a legend on each.

    Methods that score the same would hide each other, so each gets its own marker and line
    style and a small horizontal offset (a fraction of an octave on the log axis).
    """
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(fams), figsize=(4.6 * len(fams), 4.0), squeeze=False)
    for ax, f in zip(axes[0], fams):
        series = accuracy_series(s, f)
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
        ax.set_xticks(xs, ["0K" if x == 256 and has_0k else length_label(x) for x in xs])
        ax.minorticks_off()
        ax.set_title(FAMILY_TITLES[f].split(" (")[0])
        ax.set_xlabel("context (tokens)")
        ax.set_ylim(-5, 105)
        ax.grid(alpha=0.3)
        # Below the panel: with error bars spanning 0-100, no corner inside it is free of data.
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)
    axes[0][0].set_ylabel("accuracy (%, 95% interval)")
    fig.tight_layout()
    return fig


def render_plots(s: dict, out: Path) -> list[tuple[str, str]]:
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
        fig = accuracy_figure(s, fams)
        fig.savefig(out / "accuracy_vs_context.png", dpi=110, bbox_inches="tight")  # keeps the legends
        plt.close(fig)
        made.append(
            ("Accuracy against context length (error bars: 95% intervals)", "accuracy_vs_context.png")
        )

    if s["niah_depth"]:
        fig = depth_figure(s["niah_depth"])
        fig.savefig(out / "niah_depth_heatmap.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        made.append(
            ("S-NIAH accuracy by needle depth and context (all three tasks)", "niah_depth_heatmap.png")
        )
    if s["ppl_buckets"]:
        fig = ppl_position_figure(s["ppl_buckets"])
        fig.savefig(out / "ppl_by_position.png", dpi=110)
        plt.close(fig)
        made.append(
            (
                "Perplexity by position: the sink collapse shows where SWA without sinks loses its first tokens",
                "ppl_by_position.png",
            )
        )
    return made


def depth_figure(depth: dict):
    """One heatmap per method: S-NIAH accuracy by needle depth (5 bins) and context length.

    ``depth`` maps method -> ``{"L|depth%": score}``.
    """
    import matplotlib.pyplot as plt

    methods = method_order(depth)
    fig, axes = plt.subplots(1, len(methods), figsize=(3.4 * len(methods), 3.4), squeeze=False)
    bins = [0, 20, 40, 60, 80, 101]
    for ax, m in zip(axes[0], methods):
        cells = depth[m]
        lengths = sorted({int(k.split("|")[0]) for k in cells})
        grid = [[float("nan")] * len(lengths) for _ in range(len(bins) - 1)]
        tally = defaultdict(list)
        for k, v in cells.items():
            L, d = k.split("|")
            b = next(i for i in range(len(bins) - 1) if bins[i] <= float(d) < bins[i + 1])
            tally[(b, lengths.index(int(L)))].append(v)
        for (b, j), v in tally.items():
            grid[b][j] = plain_mean(v)
        im = ax.imshow(grid, vmin=0, vmax=100, cmap="RdYlGn", aspect="auto", origin="lower")
        ax.set_xticks(range(len(lengths)), [length_label(L) for L in lengths])
        ax.set_yticks(
            range(len(bins) - 1), [f"{bins[i]}–{min(bins[i + 1], 100)}%" for i in range(len(bins) - 1)]
        )
        ax.set_title(m, fontsize=10)
        ax.set_xlabel("context")
    axes[0][0].set_ylabel("needle depth")
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8, label="S-NIAH accuracy (%)")
    return fig


def ppl_position_figure(buckets: dict):
    """Perplexity per position bucket at the longest window, one line per method (log scale).

    ``buckets`` maps method -> length -> ``{bucket start: perplexity}``.
    """
    import matplotlib.pyplot as plt

    L = max(L for m in buckets.values() for L in m)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for i, m in enumerate(method_order(buckets)):
        curve = buckets[m].get(L)
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
    ax.set_title(f"Perplexity by position ({length_label(L)} essay windows)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig

"""Tables, plots and the report page from a results store.

Every number in a report is recomputed from ``results.jsonl``, so a report can be rebuilt at any time
(``sinkwindow report RUN_DIR``), also from a partial run. Tables follow the paper: accuracy per
context length per method, the recovery rate (method ÷ full attention, %), and averages, each with
its sample count.
"""

from __future__ import annotations

import html
import json
import logging
import math
from collections import defaultdict
from pathlib import Path

from .runner import BABILONG_TASKS, NIAH_TASKS

__all__ = ["summarize", "markdown_report", "write_report", "PAPER_REFERENCE"]

logger = logging.getLogger(__name__)

# Paper numbers (Llama-3.1-8B, window 256), for orientation beside ours (shared/docs/PAPER.md).
PAPER_REFERENCE = {
    "niah_single_3": {
        "full attention": {512: 100, 1024: 99.8, 2048: 100, 4096: 99.8},
        "SWA(256,4)": {512: 100, 1024: 68.0, 2048: 50.2, 4096: 19.6},
        "LoLCATs(+SWA)": {512: 100, 1024: 30.6, 2048: 6.0, 4096: 2.2},
    },
    "babilong": {
        "full attention": {0: 74, 1024: 70, 2048: 67, 4096: 60},
        "SWA(256,4)": {0: 55, 1024: 20, 2048: 19, 4096: 15},
        "LoLCATs(+SWA)": {0: 56, 1024: 22, 2048: 10, 4096: 3},
    },
}

TASK_TITLES = {
    "niah_single_1": "S-NIAH-1 (noise haystack, 7-digit values)",
    "niah_single_2": "S-NIAH-2 (essay haystack, 7-digit values)",
    "niah_single_3": "S-NIAH-3 (essay haystack, UUID values)",
    "babilong": "BABILong QA1–QA5 average",
}


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _order_methods(methods) -> list[str]:
    def key(m: str):
        if m == "full":
            return (0, 0, 0, m)
        parts = m.split(":")
        kind_rank = {"swa": 1, "evict": 2, "lolcats": 3, "linear": 4}.get(parts[0], 5)
        w = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        s = -int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else 0
        return (kind_rank, w, s, m)

    return sorted(set(methods), key=key)


def summarize(rows: list[dict]) -> dict:
    """Aggregate rows into ``{family: {method: {length: {"mean", "n"}}}}`` plus perplexity.

    Families: each S-NIAH task, ``babilong`` (QA1–5 averaged per sample) and ``babilong_qaK``;
    ``ppl`` holds ``{"ppl", "n_tokens", "windows"}`` per length and the per-bucket curve.
    """
    acc: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    ppl: dict = defaultdict(lambda: defaultdict(lambda: {"nll": 0.0, "n": 0, "windows": 0}))
    buckets: dict = defaultdict(lambda: defaultdict(dict))
    depth: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        task, method, length = r["task"], r["method"], r["length"]
        if task == "ppl":
            p = ppl[method][length]
            p["nll"] += r["nll_sum"]
            p["n"] += r["n_tokens"]
            p["windows"] += 1
            b = buckets[method][length]
            size = r["bucket_size"]
            for i, (s, c) in enumerate(zip(r["bucket_nll_sum"], r["bucket_count"])):
                cur = b.setdefault(i * size, [0.0, 0])
                cur[0] += s
                cur[1] += c
            continue
        acc[task][method][length].append(float(r["score"]))
        if task in BABILONG_TASKS:
            acc["babilong"][method][length].append(float(r["score"]))
        if task in NIAH_TASKS and r.get("depth") is not None:
            depth[method][(length, float(r["depth"]))].append(float(r["score"]))

    out: dict = {"accuracy": {}, "ppl": {}, "ppl_buckets": {}, "niah_depth": {}}
    for family, by_method in acc.items():
        out["accuracy"][family] = {
            m: {L: {"mean": _mean(v), "n": len(v)} for L, v in sorted(by_len.items())}
            for m, by_len in by_method.items()
        }
    for m, by_len in ppl.items():
        out["ppl"][m] = {
            L: {
                "ppl": math.exp(p["nll"] / p["n"]) if p["n"] else float("nan"),
                "n_tokens": p["n"],
                "windows": p["windows"],
            }
            for L, p in sorted(by_len.items())
        }
        out["ppl_buckets"][m] = {
            L: {start: math.exp(s / c) for start, (s, c) in sorted(b.items()) if c}
            for L, b in buckets[m].items()
        }
    for m, cells in depth.items():
        out["niah_depth"][m] = {f"{L}|{d}": _mean(v) for (L, d), v in cells.items()}
    return out


def _fmt(x: float, digits: int = 1) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _accuracy_table(family: str, data: dict) -> str:
    methods = _order_methods(data)
    lengths = sorted({L for m in methods for L in data[m]})
    full = data.get("full", {})
    head = "| method | " + " | ".join(_len_label(L) for L in lengths) + " | avg | recovery vs full |"
    sep = "|---" * (len(lengths) + 3) + "|"
    lines = [head, sep]
    for m in methods:
        cells, means = [], []
        for L in lengths:
            c = data[m].get(L)
            if c is None:
                cells.append("–")
                continue
            cells.append(f"{_fmt(c['mean'])} <sub>n={c['n']}</sub>")
            means.append(c["mean"])
        avg = _mean(means) if len(means) == len(lengths) else float("nan")
        full_avg = (
            _mean([full[L]["mean"] for L in lengths if L in full])
            if len(full) >= len(lengths)
            else float("nan")
        )
        rec = (
            100.0 * avg / full_avg if full_avg and not math.isnan(full_avg) and full_avg > 0 else float("nan")
        )
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {_fmt(avg)} | {_fmt(rec)}% |")
    return "\n".join(lines)


def _len_label(L: int) -> str:
    if L == 0:
        return "0K"
    return f"{L / 1024:g}K" if L % 512 == 0 else str(L)


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
            f"{_fmt(ppl[m][L]['ppl'], 2)} <sub>{ppl[m][L]['n_tokens']} tok</sub>" if L in ppl[m] else "–"
            for L in lengths
        ]
        ratio = [ppl[m][L]["ppl"] / full[L]["ppl"] for L in lengths if L in ppl[m] and L in full]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {_fmt(_mean(ratio), 2)} |")
    return "\n".join(lines)


def _summary_table(s: dict) -> str:
    """One row per method: the headline of each task family, paper-style."""
    acc = s["accuracy"]
    methods = _order_methods(set(s["ppl"]) | {m for fam in acc.values() for m in fam})
    fams = [f for f in ("niah_single_1", "niah_single_2", "niah_single_3", "babilong") if f in acc]
    head = (
        "| method | "
        + " | ".join(["perplexity"] * bool(s["ppl"]) + [TASK_TITLES[f].split(" (")[0] for f in fams])
        + " |"
    )
    lines = [head, "|---" * (1 + bool(s["ppl"]) + len(fams)) + "|"]
    full_means = {f: _mean([c["mean"] for c in acc[f].get("full", {}).values()]) for f in fams}
    for m in methods:
        cells = []
        if s["ppl"]:
            by_len = s["ppl"].get(m, {})
            cells.append(" / ".join(_fmt(v["ppl"], 1) for _, v in sorted(by_len.items())) or "–")
        for f in fams:
            by_len = acc[f].get(m)
            if not by_len:
                cells.append("–")
                continue
            mean = _mean([c["mean"] for c in by_len.values()])
            rec = 100 * mean / full_means[f] if full_means[f] and full_means[f] > 0 else float("nan")
            cells.append(f"{_fmt(mean)} ({_fmt(rec, 0)}%)" if m != "full" else _fmt(mean))
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    fams = [f for f in ("niah_single_1", "niah_single_2", "niah_single_3", "babilong") if f in acc]
    if fams:
        fig, axes = plt.subplots(1, len(fams), figsize=(4.2 * len(fams), 3.6), squeeze=False)
        for ax, f in zip(axes[0], fams):
            for m in _order_methods(acc[f]):
                pts = sorted(acc[f][m].items())
                xs = [max(L, 256) for L, _ in pts]
                ax.plot(xs, [c["mean"] for _, c in pts], marker="o", label=m, lw=2 if m == "full" else 1.5)
            ax.set_xscale("log", base=2)
            ax.set_title(TASK_TITLES[f].split(" (")[0])
            ax.set_xlabel("context (tokens; 0K plotted at 256)")
            ax.set_ylim(-5, 105)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("accuracy (%)")
        axes[0][-1].legend(fontsize=8, loc="best")
        fig.tight_layout()
        fig.savefig(out / "accuracy_vs_context.png", dpi=110)
        plt.close(fig)
        made.append(("Accuracy against context length", "accuracy_vs_context.png"))

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
        for m in _order_methods(s["ppl_buckets"]):
            curve = s["ppl_buckets"][m].get(L)
            if curve:
                ax.plot(list(curve), list(curve.values()), marker=".", label=m)
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


def markdown_report(
    s: dict, config: dict | None, plots: list[tuple[str, str]], extra_sections: list[str] = ()
) -> str:
    cfg = config or {}
    lines = [f"# sinkwindow report: {cfg.get('model', '?')}", ""]
    methods = cfg.get("methods") or _order_methods(
        set(s["ppl"]) | {m for f in s["accuracy"].values() for m in f}
    )
    lines += [
        f"Methods: {', '.join(f'`{m}`' for m in methods)}. Seed {cfg.get('seed', '?')}; "
        f"{cfg.get('samples', '?')} samples per task and length; scores are % correct (0/100 per sample, RULER "
        "string match / BABILong compare_answers); recovery = method ÷ full attention.",
        "",
        "## Summary",
        "",
        "Perplexity on Paul Graham essay windows (lower is better); task columns give mean accuracy over all lengths "
        "(recovery vs full in brackets).",
        "",
        _summary_table(s),
        "",
    ]
    for title, fname in plots[:1]:
        lines += [f"![{title}]({fname})", ""]
    if s["ppl"]:
        lines += ["## Perplexity", "", _ppl_table(s["ppl"]), ""]
        lines += [f"![{t}]({f})" for t, f in plots if f.startswith("ppl")] + [""]
    for family in ("niah_single_1", "niah_single_2", "niah_single_3"):
        if family in s["accuracy"]:
            lines += [f"## {TASK_TITLES[family]}", "", _accuracy_table(family, s["accuracy"][family]), ""]
    lines += [f"![{t}]({f})" for t, f in plots if f.startswith("niah")] + [""]
    if "babilong" in s["accuracy"]:
        lines += [
            f"## {TASK_TITLES['babilong']}",
            "",
            _accuracy_table("babilong", s["accuracy"]["babilong"]),
            "",
        ]
        per_task = [t for t in BABILONG_TASKS if t in s["accuracy"]]
        for t in per_task:
            lines += [
                f"<details><summary>{t.replace('babilong_', 'BABILong ').upper()}</summary>",
                "",
                _accuracy_table(t, s["accuracy"][t]),
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
            out.append(f"<li>{html.escape(line[2:])}</li>")
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


def write_report(run_dir: str | Path, extra_sections: list[str] = ()) -> Path:
    """Rebuild ``report.md``, ``report.html``, ``summary.json`` and the PNGs of a run folder."""
    from .results import ResultsStore

    run = Path(run_dir)
    store = ResultsStore(run)
    config = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    s = summarize(store.rows())
    plots = _plots(s, run)
    md = markdown_report(s, config, plots, extra_sections)
    (run / "report.md").write_text(md)
    (run / "report.html").write_text(_md_to_html(md))
    (run / "summary.json").write_text(json.dumps(s, indent=2, default=str))
    return run / "report.md"

"""Rows in, report out: the JSONL schema, the target checks, a Markdown report and Figure-2 plots.

Every measurement is one JSON object per line in ``bench.jsonl``. ``ROW_FIELDS`` are always
present (``None`` where a skipped cell has no number); measured rows carry more (see
``decode.measure_decode`` and ``prefill.measure_prefill``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..jsonl import read_jsonl
from ..methods import method_of
from ..runtime.spec import parse_spec
from .peers import is_peer, peer_kind, peer_window
from .rows import ok_rows, row_models, validate_row
from .targets import check_targets

__all__ = ["markdown_report", "plot_model", "peer_ratios", "write_report", "summary", "fmt_bytes"]

logger = logging.getLogger(__name__)


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _fmt_ctx(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def _table(
    rows: list[dict], kind: str, model: str, cell, methods: list[str], notes: dict[str, int]
) -> list[str]:
    model_rows = [r for r in rows if r["kind"] == kind and r["model"] == model]
    contexts = sorted({r["context"] for r in model_rows})
    lines = ["| context | " + " | ".join(methods) + " |", "|---:|" + "---:|" * len(methods)]
    index = {(r["method"], r["context"]): r for r in model_rows}
    for n in contexts:
        cells = []
        for m in methods:
            r = index.get((m, n))
            if r is None:
                cells.append("")
            elif r["status"] == "ok":
                cells.append(cell(r))
            else:
                note = notes.setdefault(r["reason"], len(notes) + 1)
                cells.append(f"skip [{note}]")
        lines.append(f"| {_fmt_ctx(n)} | " + " | ".join(cells) + " |")
    return lines


def peer_ratios(rows: list[dict], model: str) -> list[dict]:
    """Decode cells of sinkwindow's methods beside a peer's at the same context, as ratios.

    ``peer:mistral-sw:W`` is compared with the windowed methods of the same W (``swa:W:S``,
    ``evict:W:S``); ``peer:static-full:*`` with every method (``full`` is the same attention through
    ``DynamicCache``). Returns ``[{"method", "peer", "context", "ms", "peer_ms", "ratio"}]``.
    """
    decode = ok_rows(rows, "decode", model)
    out = []
    for p in (r for r in decode if is_peer(r["method"])):
        w = peer_window(p["method"])
        for r in decode:
            if is_peer(r["method"]) or r["context"] != p["context"]:
                continue
            spec = parse_spec(r["method"])
            if peer_kind(p["method"]) == "mistral-sw" and (not method_of(spec).windowed or spec.window != w):
                continue
            out.append(
                {
                    "method": r["method"],
                    "peer": p["method"],
                    "context": r["context"],
                    "ms": r["ms_per_token"],
                    "peer_ms": p["ms_per_token"],
                    "ratio": r["ms_per_token"] / p["ms_per_token"],
                }
            )
    return out


def _peer_table(rows: list[dict], model: str) -> list[str]:
    ratios = peer_ratios(rows, model)
    if not ratios:
        return []
    lines = [
        "",
        "### Peers: sinkwindow ÷ peer, decode ms/token at the same context (separate cells of this run)",
        "",
        "`peer:mistral-sw:W`: transformers' own sliding window (Mistral modeling, stock cache) at the same W; "
        "`peer:static-full:*`: full attention in a preallocated `StaticCache` (compiled or eager). "
        "Below 1: sinkwindow is faster.",
        "",
        "| method | peer | context | method ms | peer ms | method ÷ peer |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in sorted(ratios, key=lambda r: (r["peer"], r["context"], r["method"])):
        lines.append(
            f"| {r['method']} | {r['peer']} | {_fmt_ctx(r['context'])} | {r['ms']:.2f} | {r['peer_ms']:.2f} | {r['ratio']:.3f} |"
        )
    return lines


def markdown_report(
    rows: list[dict],
    targets: list[dict] | None = None,
    meta: dict | None = None,
    targets_min: list[dict] | None = None,
) -> str:
    """The run as Markdown: targets, then per model decode, memory and prefill tables."""
    meta = meta or {}
    out = ["# sinkwindow bench: decode throughput, memory and prefill against context length", ""]
    out += _environment_lines(meta)
    out += [
        "",
        "Decode: median of the timed steps after warm-up; contexts above the real-prefill limit build the cache "
        "state directly (same shapes and layout as a real prefill, see `sinkwindow.bench.methods`). "
        "KV bytes: tensor storage held by the cache after the fill (✓: equals the analytic size).",
        "",
    ]
    if targets:
        out += _targets_table(targets, targets_min)
    notes: dict[str, int] = {}
    for model in row_models(rows):
        out += _model_section(rows, model, notes)
    if notes:
        out += ["## Skipped cells", ""]
        out += [f"[{i}] {reason}" + "  " for reason, i in notes.items()]
        out.append("")
    return "\n".join(out)


def _environment_lines(meta: dict) -> list[str]:
    """Versions, device, threads and load, and the measured bandwidth per model."""
    out = []
    env = meta.get("env", {})
    if env:
        out.append(
            f"torch {env.get('torch')}, transformers {env.get('transformers')}, sinkwindow {env.get('sinkwindow')}; "
            f"device {env.get('device_name', env.get('device'))}, torch threads {env.get('threads')} of {env.get('cpu_count')} CPUs; "
            f"1-minute load average {meta.get('loadavg_start', [float('nan')])[0]:.1f} at start, "
            f"{meta.get('loadavg_end', [float('nan')])[0]:.1f} at the end."
        )
    for model, bw in meta.get("bandwidth", {}).items():
        out.append(
            f"Measured bandwidth before {model}: read {bw['read_gbps']:.1f} GB/s, copy {bw['copy_gbps']:.1f} GB/s "
            f"(the roofline uses the larger); batch-1 matmul (GEMV) over distinct weights "
            f"{bw.get('gemv_gbps', float('nan')):.1f} GB/s (torch threads {bw['threads']}, {bw['buffer_bytes'] >> 20} MiB buffers)."
        )
    return out


def _targets_table(targets: list[dict], targets_min: list[dict] | None) -> list[str]:
    verdict = {True: "yes", False: "**no**", None: "n/a"}
    mins = {t["name"]: t for t in targets_min or []}
    out = [
        "## Targets",
        "",
        "Decode times compared by each cell's median step; the last columns repeat the check with each "
        "cell's fastest step (least disturbed by other processes on a shared machine).",
        "",
        "| target | goal | measured (median step) | ok | detail | fastest step | ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in targets:
        m = mins.get(t["name"], {"value": None, "ok": None})
        out.append(
            f"| {t['name']} | {t['goal']} | `{json.dumps(t['value'])}` | {verdict[t['ok']]} | {t['detail']} "
            f"| `{json.dumps(m['value'])}` | {verdict[m['ok']]} |"
        )
    return out + [""]


def _model_section(rows: list[dict], model: str, notes: dict[str, int]) -> list[str]:
    """One model's decode time, KV bytes, peak memory, paired cells, peers and prefill tables."""
    methods = list(dict.fromkeys(r["method"] for r in rows if r["model"] == model))

    def kv_cell(r):
        return fmt_bytes(r["kv_bytes"]) + (" ✓" if r.get("kv_bytes_analytic") == r["kv_bytes"] else "")

    def peak_cell(r):
        return fmt_bytes(
            r["cuda_peak_bytes"] if r.get("cuda_peak_bytes") is not None else r["peak_rss_bytes"]
        )

    out = [f"## {model}", "", "### Decode: ms/token (tokens/s)", ""]
    out += _table(
        rows, "decode", model, lambda r: f"{r['ms_per_token']:.2f} ({r['tokens_per_s']:.1f})", methods, notes
    )
    out += ["", "### Decode: KV/state bytes held by the cache", ""]
    out += _table(rows, "decode", model, kv_cell, methods, notes)
    out += ["", "### Decode: peak RSS (or CUDA peak) over fill + decode", ""]
    out += _table(rows, "decode", model, peak_cell, methods, notes)
    paired = ok_rows(rows, "paired", model)
    if paired:
        out += [
            "",
            "### Paired cells: a windowed method vs a baseline (the unpatched model, or a peer), alternating steps",
            "",
            "| method | baseline | context | method ms (min) | baseline ms (min) | ratio of medians | median of paired ratios |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for r in paired:
            out.append(
                f"| {r['method']} | {r.get('baseline', 'full')} | {r['context']} | {r['ms_per_token']:.2f} ({r['ms_per_token_min']:.2f}) | "
                f"{r['ms_per_token_baseline']:.2f} ({r['ms_per_token_baseline_min']:.2f}) | "
                f"{r['ms_per_token'] / r['ms_per_token_baseline']:.3f} | {r.get('ratio_paired', float('nan')):.3f} |"
            )
    out += _peer_table(rows, model)
    if any(r["kind"] == "prefill" and r["model"] == model for r in rows):
        out += ["", "### Prefill: seconds (tokens/s)", ""]
        out += _table(
            rows,
            "prefill",
            model,
            lambda r: f"{r['prefill_s']:.2f} ({r['tokens_per_s']:.0f})",
            methods,
            notes,
        )
    return out + [""]


def plot_model(rows: list[dict], model: str, out_dir: str | Path) -> list[Path]:
    """Figure 2 for one model: decode throughput and KV memory vs context (log-x), and prefill time.

    Returns:
        Paths written (``decode_<model>.png`` and, with prefill rows, ``prefill_<model>.png``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    safe = model.replace("/", "_").replace(":", "_")
    paths = []
    methods = list(dict.fromkeys(r["method"] for r in rows if r["model"] == model))
    decode = {m: sorted(ok_rows(rows, "decode", model, m), key=lambda r: r["context"]) for m in methods}
    if any(decode.values()):
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for m, rs in decode.items():
            if not rs:
                continue
            xs = [r["context"] for r in rs]
            ax1.plot(xs, [r["tokens_per_s"] for r in rs], marker="o", label=m)
            ax2.plot(xs, [r["kv_bytes"] / 2**20 for r in rs], marker="o", label=m)
        ax1.set(
            xscale="log",
            xlabel="context (tokens)",
            ylabel="decode tokens/s",
            title=f"{model}: decode throughput",
        )
        ax2.set(
            xscale="log",
            yscale="log",
            xlabel="context (tokens)",
            ylabel="KV/state MiB",
            title=f"{model}: KV/state memory",
        )
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
        fig.tight_layout()
        path = out_dir / f"decode_{safe}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    prefill = {m: sorted(ok_rows(rows, "prefill", model, m), key=lambda r: r["context"]) for m in methods}
    if any(prefill.values()):
        fig, ax = plt.subplots(figsize=(5.5, 4.2))
        for m, rs in prefill.items():
            if rs:
                ax.plot([r["context"] for r in rs], [r["prefill_s"] for r in rs], marker="o", label=m)
        ax.set(xlabel="prompt tokens", ylabel="prefill seconds", title=f"{model}: prefill time")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"prefill_{safe}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def summary(
    rows: list[dict],
    targets: list[dict],
    out_dir: str | Path | None = None,
    targets_min: list[dict] | None = None,
) -> dict:
    """The one-line JSON summary a run ends stdout with."""
    out = {
        "out": None if out_dir is None else str(out_dir),
        "rows": len(rows),
        "ok": sum(r["status"] == "ok" for r in rows),
        "skipped": sum(r["status"] == "skipped" for r in rows),
        "targets": {t["name"]: {"ok": t["ok"], "value": t["value"]} for t in targets},
    }
    if targets_min is not None:
        out["targets_min_step"] = {t["name"]: t["ok"] for t in targets_min}
    return out


def _has_min(rows: list[dict]) -> bool:
    return any(r["kind"] == "decode" and r["status"] == "ok" and "ms_per_token_min" in r for r in rows)


def write_report(
    rows: list[dict], out_dir: str | Path, *, meta: dict | None = None, plots: bool = True, **target_kw
) -> dict:
    """Write ``bench.md``, ``targets.json`` and the plots next to ``bench.jsonl``.

    Returns:
        ``summary(...)`` of the run, with ``"files"`` added.
    """
    out_dir = Path(out_dir)
    if meta is None and (out_dir / "meta.json").exists():
        meta = json.loads((out_dir / "meta.json").read_text())
    targets = check_targets(rows, **target_kw)
    # The same checks on each cell's fastest step: on a shared machine, the estimate least
    # disturbed by other processes. Reported beside the median verdicts, never instead of them.
    targets_min = check_targets(rows, **{**target_kw, "stat": "ms_per_token_min"}) if _has_min(rows) else None
    files = [out_dir / "bench.md", out_dir / "targets.json"]
    (out_dir / "bench.md").write_text(markdown_report(rows, targets, meta, targets_min))
    (out_dir / "targets.json").write_text(
        json.dumps({"median_step": targets, "min_step": targets_min}, indent=2)
    )
    if plots:
        try:
            for model in row_models(rows):
                files += plot_model(rows, model, out_dir)
        except ImportError as err:
            logger.warning("no plots: %s", err)
    result = summary(rows, targets, out_dir, targets_min)
    result["files"] = [str(f) for f in files]
    return result


def write_folder_report(run_dir: str | Path) -> Path:
    """Re-render a bench run folder's ``bench.md`` (``sinkwindow report``) from its ``bench.jsonl``.

    Unreadable lines and rows that are not bench rows are skipped with a warning, counted, and
    named in a note at the end of the page.

    Raises:
        ValueError: the file holds no readable bench row.
    """
    run = Path(run_dir)
    path = run / "bench.jsonl"
    rows, bad = read_jsonl(path)
    unreadable = len(bad)
    good = []
    for n, r in enumerate(rows):
        try:
            validate_row(r)
        except (ValueError, TypeError, KeyError) as err:
            if n < 10:
                logger.warning("%s: skipping a row that is not a bench row: %s", path, err)
            continue
        good.append(r)
    if not good:
        raise ValueError(f"{path} holds no readable bench rows: rerun `sinkwindow bench --out {run}`")
    write_report(good, run)
    notes = []
    if unreadable:
        notes.append(f"{unreadable} unreadable line(s) of {path.name} were skipped.")
    if len(rows) > len(good):
        notes.append(f"{len(rows) - len(good)} row(s) of {path.name} that are not bench rows were skipped.")
    if notes:
        with (run / "bench.md").open("a") as f:
            f.write("\n" + "\n".join(f"**Note:** {n}\n" for n in notes))
    return run / "bench.md"

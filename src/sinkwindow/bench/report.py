"""Rows in, report out: the JSONL schema, the target checks, a Markdown report and Figure-2 plots.

Every measurement is one JSON object per line in ``bench.jsonl``. ``ROW_FIELDS`` are always
present (``None`` where a skipped cell has no number); measured rows carry more (see
``decode.measure_decode`` and ``prefill.measure_prefill``).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ..jsonl import read_jsonl
from ..spec import parse_spec
from .peers import is_peer, method_name, peer_kind, peer_window

__all__ = [
    "ROW_FIELDS",
    "ROW_KINDS",
    "validate_row",
    "load_rows",
    "check_targets",
    "TargetBounds",
    "markdown_report",
    "plot_model",
    "peer_ratios",
    "write_report",
    "summary",
    "fmt_bytes",
]

logger = logging.getLogger(__name__)

ROW_FIELDS = (
    "kind",
    "model",
    "method",
    "context",
    "status",
    "reason",
    "ms_per_token",
    "tokens_per_s",
    "kv_bytes",
    "prefill_s",
    "peak_rss_bytes",
)
ROW_KINDS = ("decode", "prefill", "paired")
_NUMBERS_WHEN_OK = ("ms_per_token", "tokens_per_s", "kv_bytes", "peak_rss_bytes")


def validate_row(row: dict) -> None:
    """Raise ``ValueError`` unless ``row`` follows the schema.

    Every row has ``ROW_FIELDS``; ``kind`` is one of ``ROW_KINDS``; ``method`` a method spec or a
    peer's name (``bench.peers``); ``status`` is ``ok`` (the
    numbers are present, non-negative, and ``prefill_s`` is set for prefill rows) or ``skipped``
    (``reason`` is a non-empty string).
    """
    missing = [k for k in ROW_FIELDS if k not in row]
    if missing:
        raise ValueError(f"row lacks {missing}: {row}")
    if row["kind"] not in ROW_KINDS:
        raise ValueError(f"row kind must be one of {ROW_KINDS}, got {row['kind']!r}")
    method_name(row["method"])
    if not isinstance(row["context"], int) or row["context"] <= 0:
        raise ValueError(f"context must be a positive int, got {row['context']!r}")
    if row["status"] == "skipped":
        if not isinstance(row["reason"], str) or not row["reason"]:
            raise ValueError(f"skipped row needs a reason: {row}")
        return
    if row["status"] != "ok":
        raise ValueError(f"status must be 'ok' or 'skipped', got {row['status']!r}")
    for k in _NUMBERS_WHEN_OK:
        v = row[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or not math.isfinite(v):
            raise ValueError(f"{k} must be a finite number >= 0, got {v!r}")
    if not isinstance(row["kv_bytes"], int) or not isinstance(row["peak_rss_bytes"], int):
        raise ValueError("kv_bytes and peak_rss_bytes must be ints")
    if row["kind"] == "prefill" and not isinstance(row["prefill_s"], (int, float)):
        raise ValueError("a prefill row needs prefill_s")
    if row["prefill_s"] is not None and (
        not isinstance(row["prefill_s"], (int, float)) or row["prefill_s"] < 0
    ):
        raise ValueError(f"prefill_s must be None or a number >= 0, got {row['prefill_s']!r}")


def load_rows(path: str | Path) -> list[dict]:
    """Rows of a ``bench.jsonl`` file (or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "bench.jsonl"
    rows, _ = read_jsonl(path)  # a torn or damaged line is left out with a warning naming it
    return rows


def _ok(rows: Iterable[dict], kind: str, model: str | None = None, method: str | None = None) -> list[dict]:
    return [
        r
        for r in rows
        if r["kind"] == kind
        and r["status"] == "ok"
        and (model is None or r["model"] == model)
        and (method is None or r["method"] == method)
    ]


def _by_context(rows: Iterable[dict], key: str = "ms_per_token") -> dict[int, float]:
    return {r["context"]: r[key] for r in rows}


def _models(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["model"] for r in rows))


def _target(name: str, goal: str, value, ok: bool | None, detail: str = "") -> dict:
    return {"name": name, "goal": goal, "value": value, "ok": ok, "detail": detail}


@dataclass(frozen=True)
class TargetBounds:
    """The efficiency targets' thresholds (the issue's numbers).

    Attributes:
        flat_contexts / flat_tolerance: SWA's decode time at the second context within this
            fraction of the first.
        speedup_from: SWA faster than full attention at every context from here, by a growing factor.
        prefill_pair / prefill_ratio_max: SWA's prefill time at the larger context over the smaller
            at most this (linear: 2 for a doubling).
        overhead_tolerance: the patched model at contexts within the window at most this fraction
            slower than the unpatched one.
        roofline_max: a real model's decode within this factor of the weights-bandwidth roofline.
        native_max: ``swa:W:0`` ms/token over transformers' own sliding window at the same W.
    """

    flat_contexts: tuple[int, int] = (1024, 65536)
    flat_tolerance: float = 0.10
    speedup_from: int = 2048
    prefill_pair: tuple[int, int] = (16384, 32768)
    prefill_ratio_max: float = 2.3
    overhead_tolerance: float = 0.10
    roofline_max: float = 2.0
    native_max: float = 1.0


@dataclass(frozen=True)
class _Run:
    """What every target reads: the run's rows and which methods and models it compares."""

    rows: list[dict]
    window_method: str
    full_method: str
    scaling: str | None  # model of the scaling targets
    real: str | None  # model of the roofline target
    stat: str
    bounds: TargetBounds

    @property
    def window(self) -> int:
        return parse_spec(self.window_method).window

    @property
    def base(self) -> str:
        """The paired rows' field holding the baseline's time of ``stat``."""
        return self.stat.replace("ms_per_token", "ms_per_token_baseline")

    def decode(self, method: str, model: str | None = None) -> dict[int, float]:
        return _by_context(_ok(self.rows, "decode", model or self.scaling, method), self.stat)


def check_targets(
    rows: list[dict],
    *,
    window_method: str | None = None,
    full_method: str = "full",
    synthetic_model: str | None = None,
    roofline_model: str | None = None,
    bounds: TargetBounds = TargetBounds(),
    stat: str = "ms_per_token",
) -> list[dict]:
    """Check the issue's efficiency targets against measured rows (ratios within one run).

    Targets whose rows are missing come back with ``ok=None`` and say what is missing.

    Args:
        rows: rows of one run.
        window_method: the SWA method the targets are about (default ``swa:64:4`` if measured,
            else the first ``swa`` method in the rows).
        full_method: the dense baseline (the unpatched model).
        synthetic_model: model for the scaling targets (default ``synthetic`` if present, else
            the first model).
        roofline_model: model for the roofline target (default the first non-synthetic model).
        bounds: the thresholds (:class:`TargetBounds`).
        stat: which decode time to compare: ``"ms_per_token"`` (median step, the default) or
            ``"ms_per_token_min"`` (fastest step: the least disturbed by other processes).

    Returns:
        ``[{"name", "goal", "value", "ok", "detail"}, ...]``.
    """
    if window_method is None:
        swa_methods = [
            r["method"] for r in rows if not is_peer(r["method"]) and parse_spec(r["method"]).kind == "swa"
        ]
        window_method = "swa:64:4" if "swa:64:4" in swa_methods or not swa_methods else swa_methods[0]
    models = _models(rows)
    scaling = synthetic_model or ("synthetic" if "synthetic" in models else (models[0] if models else None))
    real = roofline_model or next((m for m in models if m != "synthetic"), None)
    run = _Run(rows, window_method, full_method, scaling, real, stat, bounds)
    return [
        _flat_target(run),
        _kv_constant_target(run),
        _speedup_target(run),
        _prefill_target(run),
        _overhead_target(run, models),
        _roofline_target(run),
        _native_sliding_target(rows, bounds.native_max, stat),
    ]


def _flat_target(run: _Run) -> dict:
    """``swa_decode_flat``: SWA's decode time does not grow with the context."""
    swa, (a, b), tol = run.decode(run.window_method), run.bounds.flat_contexts, run.bounds.flat_tolerance
    if a not in swa or b not in swa:
        return _target("swa_decode_flat", f"{run.window_method} at {a} and {b}", None, None, "not measured")
    ratio = swa[b] / swa[a]
    return _target(
        "swa_decode_flat",
        f"{run.window_method} ms/token at {b} within {tol:.0%} of {a}",
        round(ratio, 3),
        abs(ratio - 1) <= tol,
        f"{swa[a]:.2f} ms at {a}, {swa[b]:.2f} ms at {b}",
    )


def _kv_constant_target(run: _Run) -> dict:
    """``swa_kv_constant``: one KV size at every context past the window, equal to the analytic one."""
    kv_rows = [
        r for r in _ok(run.rows, "decode", run.scaling, run.window_method) if r["context"] >= run.window
    ]
    distinct = sorted({r["kv_bytes"] for r in kv_rows})
    analytic_ok = all(r.get("kv_bytes_analytic") in (None, r["kv_bytes"]) for r in kv_rows)
    return _target(
        "swa_kv_constant",
        f"{run.window_method} KV bytes identical at every context >= {run.window} (and = analytic)",
        distinct,
        (len(distinct) == 1 and analytic_ok) if kv_rows else None,
        f"{len(kv_rows)} contexts from {min((r['context'] for r in kv_rows), default='-')} "
        f"to {max((r['context'] for r in kv_rows), default='-')}",
    )


def _speedup_target(run: _Run) -> dict:
    """``swa_faster_than_full``: from ``speedup_from`` on, by a growing factor (alternating-step
    cells where there are some, separate cells otherwise)."""
    start = run.bounds.speedup_from
    swa, full = run.decode(run.window_method), run.decode(run.full_method)
    paired_speed = {
        r["context"]: r[run.base] / r[run.stat]
        for r in _ok(run.rows, "paired", run.scaling, run.window_method)
        if r.get("baseline") == run.full_method and r["context"] >= start
    }
    common = sorted(n for n in ({n for n in swa if n in full} | set(paired_speed)) if n >= start)
    speedups = {n: round(paired_speed[n] if n in paired_speed else full[n] / swa[n], 2) for n in common}
    grows = all(speedups[y] >= speedups[x] for x, y in zip(common, common[1:]))
    full_skipped = sorted(
        r["context"]
        for r in run.rows
        if r["kind"] == "decode" and r["model"] == run.scaling and r["method"] == run.full_method
        and r["status"] == "skipped"
    )  # fmt: skip
    return _target(
        "swa_faster_than_full",
        f"{run.window_method} faster than {run.full_method} at every context >= {start}, factor growing",
        speedups,
        (all(s > 1 for s in speedups.values()) and grows) if speedups else None,
        ("growing" if grows else "not monotone")
        + (f"; alternating steps at {sorted(paired_speed)}, separate cells above" if paired_speed else "")
        + (f"; {run.full_method} skipped at {full_skipped[0]}+" if full_skipped else ""),
    )


def _prefill_target(run: _Run) -> dict:
    """``swa_prefill_linear``: SWA's prefill time doubles (at most) with the context; full's grows faster."""
    pre_swa = _by_context(_ok(run.rows, "prefill", run.scaling, run.window_method), "prefill_s")
    pre_full = _by_context(_ok(run.rows, "prefill", run.scaling, run.full_method), "prefill_s")
    (lo, hi), most = run.bounds.prefill_pair, run.bounds.prefill_ratio_max
    if lo not in pre_swa or hi not in pre_swa:
        return _target(
            "swa_prefill_linear", f"{run.window_method} prefill at {lo} and {hi}", None, None, "not measured"
        )
    r_swa = pre_swa[hi] / pre_swa[lo]
    pairs = [(x, y) for x in pre_full for y in pre_full if y == 2 * x]
    full_note, r_full = "full: no doubling pair measured", None
    if pairs:
        x, y = max(pairs)
        r_full = pre_full[y] / pre_full[x]
        full_note = f"full time({y})/time({x}) = {r_full:.2f}"
        if x in pre_swa and y in pre_swa:
            full_note += f" vs {run.window_method} {pre_swa[y] / pre_swa[x]:.2f} on the same pair"
    return _target(
        "swa_prefill_linear",
        f"{run.window_method} prefill time({hi})/time({lo}) <= {most}; full grows faster",
        {"swa": round(r_swa, 3), "full": None if r_full is None else round(r_full, 3)},
        r_swa <= most and (r_full is None or r_full > r_swa),
        full_note,
    )


def _overhead_target(run: _Run, models: list[str]) -> dict:
    """``short_context_overhead``: patching costs little where the window holds everything."""
    tol, overheads = run.bounds.overhead_tolerance, {}
    paired = [
        r
        for r in _ok(run.rows, "paired", None, run.window_method)
        if r.get("baseline") == run.full_method and r["context"] <= run.window
    ]
    for r in paired:
        overheads[f"{r['model']}@{r['context']}"] = round(r[run.stat] / r[run.base], 3)
    for model in models if not paired else ():
        s, f = run.decode(run.window_method, model), run.decode(run.full_method, model)
        for n in sorted(set(s) & set(f)):
            if n <= run.window:
                overheads[f"{model}@{n}"] = round(s[n] / f[n], 3)
    return _target(
        "short_context_overhead",
        f"{run.window_method} (patched) at n <= {run.window} at most {tol:.0%} slower than unpatched",
        overheads,
        all(v <= 1 + tol for v in overheads.values()) if overheads else None,
        "alternating steps, median patched / median unpatched"
        if paired
        else "ms/token patched / unpatched (separate cells)",
    )


def _roofline_target(run: _Run) -> dict:
    """``roofline``: a real model's decode close to the time its weights take to read."""
    most, stat = run.bounds.roofline_max, run.stat
    roof = [r for r in _ok(run.rows, "decode", run.real) if r.get("roofline_ms")] if run.real else []
    if not roof:
        return _target(
            "roofline", f"a real model's decode within {most}x of roofline", None, None, "not measured"
        )
    win = [r for r in roof if r["method"] == run.window_method] or roof
    ratios = {f"{r['method']}@{r['context']}": round(r[stat] / r["roofline_ms"], 2) for r in win}
    detail = (
        f"roofline {statistics.median(r['roofline_ms'] for r in win):.1f} ms/token = "
        f"{win[0]['weight_bytes_per_token'] / 1e6:.0f} MB weights (+ KV) / {win[0]['bandwidth_gbps']:.1f} GB/s; "
        f"{run.window_method} measured {statistics.median(r[stat] for r in win):.1f} ms"
    )
    return _target(
        "roofline",
        f"{run.real} {run.window_method} decode within {most}x of the weights-bandwidth roofline",
        ratios,
        all(r[stat] / r["roofline_ms"] <= most for r in win),
        detail,
    )


def _native_sliding_target(rows: list[dict], native_max: float, stat: str) -> dict:
    """``swa_vs_native_sliding``: sinkwindow's ``swa:W:0`` against transformers' sliding window at equal W."""
    base = stat.replace("ms_per_token", "ms_per_token_baseline")
    ratios: dict[str, float] = {}
    paired_keys = set()
    for r in rows:
        if r["kind"] == "paired" and r["status"] == "ok" and is_peer(r.get("baseline", "")):
            w = peer_window(r["baseline"])
            if w is not None and r["method"] == f"swa:{w}:0":
                key = f"{r['model']}@{r['context']} w{w}"
                ratios[key] = round(r[stat] / r[base], 3)
                paired_keys.add(key)
    peers = [r for r in rows if r["kind"] == "decode" and r["status"] == "ok" and is_peer(r["method"])]
    ours = {(r["model"], r["method"], r["context"]): r for r in _ok(rows, "decode")}
    for p in peers:
        w = peer_window(p["method"])
        mine = ours.get((p["model"], f"swa:{w}:0", p["context"])) if w is not None else None
        key = f"{p['model']}@{p['context']} w{w}"
        if mine is not None and key not in ratios:
            ratios[key] = round(mine[stat] / p[stat], 3)
    return _target(
        "swa_vs_native_sliding",
        f"swa:W:0 decode at most {native_max:g}x transformers' own sliding window (peer:mistral-sw:W) at equal W",
        ratios or None,
        all(v <= native_max for v in ratios.values()) if ratios else None,
        (
            f"ms/token swa:W:0 / peer; alternating steps at {sorted(paired_keys)}, separate cells elsewhere"
            if paired_keys
            else "ms/token swa:W:0 / peer (separate cells)"
        )
        if ratios
        else "not measured: run peer:mistral-sw:W beside swa:W:0 (a Llama-family model)",
    )


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
    decode = _ok(rows, "decode", model)
    out = []
    for p in (r for r in decode if is_peer(r["method"])):
        w = peer_window(p["method"])
        for r in decode:
            if is_peer(r["method"]) or r["context"] != p["context"]:
                continue
            spec = parse_spec(r["method"])
            if peer_kind(p["method"]) == "mistral-sw" and (
                spec.kind not in ("swa", "evict") or spec.window != w
            ):
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
    for model in _models(rows):
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
    paired = _ok(rows, "paired", model)
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
    decode = {m: sorted(_ok(rows, "decode", model, m), key=lambda r: r["context"]) for m in methods}
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
    prefill = {m: sorted(_ok(rows, "prefill", model, m), key=lambda r: r["context"]) for m in methods}
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
            for model in _models(rows):
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

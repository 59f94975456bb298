"""The efficiency targets (paper §4.3 and the issue's numbers), checked on the rows of one run:
SWA's decode time flat in the context, its KV bytes constant, faster than full attention from 2K
with a growing factor, linear prefill, little overhead where the window holds everything, a real
model near its weights-bandwidth roofline, and ``swa:W:0`` no slower than transformers' own
sliding window. Ratios are taken within one run (these machines are noisy)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..methods import METHODS, method_of
from ..runtime.spec import parse_spec
from .peers import is_peer, peer_window
from .rows import by_context, ok_rows, row_models

__all__ = ["TargetBounds", "check_targets"]


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
        return by_context(ok_rows(self.rows, "decode", model or self.scaling, method), self.stat)


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
            r["method"]
            for r in rows
            if not is_peer(r["method"]) and isinstance(method_of(r["method"]), METHODS["swa"])
        ]
        window_method = "swa:64:4" if "swa:64:4" in swa_methods or not swa_methods else swa_methods[0]
    models = row_models(rows)
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
        r for r in ok_rows(run.rows, "decode", run.scaling, run.window_method) if r["context"] >= run.window
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
        for r in ok_rows(run.rows, "paired", run.scaling, run.window_method)
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
    pre_swa = by_context(ok_rows(run.rows, "prefill", run.scaling, run.window_method), "prefill_s")
    pre_full = by_context(ok_rows(run.rows, "prefill", run.scaling, run.full_method), "prefill_s")
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
        for r in ok_rows(run.rows, "paired", None, run.window_method)
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
    roof = [r for r in ok_rows(run.rows, "decode", run.real) if r.get("roofline_ms")] if run.real else []
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
    ours = {(r["model"], r["method"], r["context"]): r for r in ok_rows(rows, "decode")}
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

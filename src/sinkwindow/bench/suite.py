"""The efficiency suite (paper §4.3): every (model, method, context) cell, with caps, into JSONL.

``run_bench(BenchConfig(...))`` measures, for each model:

1. memory bandwidth (for the roofline);
2. decode at every context of the grid: a bounded method (SWA, linear) at all contexts at once,
   steps round-robin across contexts (``measure_decode_interleaved``), so its flatness is judged
   on times taken at the same moments; full attention one context at a time, ascending, under
   the caps;
3. paired cells, decode steps alternating between a windowed method and the unpatched model:
   at n <= w (the smallest and largest such contexts in the grid: what the patch costs) and at
   contexts in ``PAIRED_RANGE`` (where SWA's speedup over full attention is small enough for a
   shared machine's load changes to blur separate measurements); and ``swa:W:0`` against the peer
   ``peer:mistral-sw:W`` (transformers' own sliding window, same W) at the first such context
   beyond W, where the two should be within a few percent;
4. prefill at every context of the prefill grid, method by method after one warm-up: chunked
   methods run all lengths side by side at the same pace (``measure_prefill_interleaved``),
   one-forward methods (full attention, evict's dense prompt) one length at a time.

Peers (``bench.peers``: ``peer:static-full``, ``peer:mistral-sw:W``, named in ``methods``) are
measured like methods, by their own runners, and their rows carry the peer's name as ``method``.

Cells that cannot run are written as ``status == "skipped"`` rows with the reason, never a
crash: a method this install lacks (linear baselines before their conversion exists), a context
past the model's trained positions, a full-attention cache whose projected size exceeds the
memory budget, or a cell whose predicted time exceeds the time cap. Once a method hits a cap,
its longer contexts are skipped too. Bounded methods (SWA) never hit the memory cap: their cost
must not depend on length, and the default grid runs them to 256K.

Rows go to ``DIR/bench.jsonl`` as they are measured (a partial run keeps its rows, and a re-run
with the same settings measures only the missing cells: ``bench.folder``); the
configuration, environment, bandwidth and torch thread count go to ``DIR/meta.json``. With
``threads=None`` the count follows ``sinkwindow.runtime.threads.apply_threads`` (1 on a busy machine).
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..jsonl import append_jsonl
from ..methods import method_of
from ..runs.folder import RunLock, check_run_dir
from ..runs.session_log import start_session
from ..runtime.dtypes import DTYPES
from ..runtime.kv_bytes import kv_geometry
from ..runtime.spec import parse_spec
from ..runtime.threads import apply_threads
from .decode import measure_decode, measure_decode_interleaved, measure_paired
from .folder import BENCH_FILE, bench_settings, cell_key, open_bench_folder
from .memory import current_rss
from .methods import FullRunner, MethodRunner, MethodUnavailable, runner_for
from .peers import is_peer, method_name, peer_kind, peer_window
from .prefill import measure_prefill, measure_prefill_interleaved, warm_up_prefill
from .report import fmt_bytes
from .roofline import measure_bandwidth, roofline_ms, weight_bytes_per_token
from .rows import validate_row
from .synthetic import SYNTHETIC_NAME, SyntheticConfig, build_synthetic

__all__ = [
    "BenchConfig",
    "run_bench",
    "load_bench_model",
    "DEFAULT_CONTEXTS",
    "DEFAULT_PREFILL_CONTEXTS",
    "DEFAULT_METHODS",
    "DEFAULT_MODELS",
    "QUICK",
]

logger = logging.getLogger(__name__)

# The paper's range, 128 to 256K, plus 32 (below every window: the patched-vs-unpatched check).
DEFAULT_CONTEXTS = (32, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
DEFAULT_PREFILL_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_METHODS = ("full", "swa:64:4", "swa:512:4", "linear", "lolcats:64")
DEFAULT_MODELS = (SYNTHETIC_NAME, "smollm2-135m")

# Contexts (beyond the window) where SWA is also timed against full attention step by step.
PAIRED_RANGE = (2048, 8192)

# A grid that finishes in a few minutes on 2 CPU cores and covers every target but swa_vs_native_sliding.
# No peers here: on a loaded 2-core box (smollm2-135m, 2K, 8 steps) one peer cell took 10-15 s with its
# real 2K prefill and the paired swa:64:0-vs-peer cell ~30 s, so peer:mistral-sw:64 (+ the swa:64:0 it
# needs) adds ~1.5 min per model, and peer:static-full costs what full does at every context up to 64K,
# the grid's longest part. Ask for them: --quick --methods full,peer:static-full,swa:64:0,peer:mistral-sw:64,...
QUICK = {
    "contexts": (32, 1024, 2048, 8192, 65536),
    "prefill_contexts": (1024, 2048),
    "steps": 16,
    "methods": ("full", "swa:64:4", "linear"),
}


@dataclass
class BenchConfig:
    """Everything a run depends on; written to ``meta.json`` beside the results.

    Attributes:
        models: ``"synthetic"`` and/or names ``sinkwindow.load`` accepts.
        methods: spec strings (``full``, ``swa:W:S``, ``evict:W:S``, ``linear``, ``lolcats:W``) and
            peers (``peer:static-full``, ``peer:mistral-sw:W``: ``bench.peers``).
        contexts: decode grid (tokens in the cache before the first timed step).
        prefill_contexts: prefill grid; empty to skip prefill.
        steps, warmup: timed and untimed decode steps per cell.
        chunk_size: prefill chunk for chunked methods.
        real_prefill_max: decode cells up to this context run a real prefill (its time is
            recorded as ``prefill_s``); longer ones build the state with the runner's fill.
        time_cap_s: skip a cell predicted to take longer (and the method's longer contexts).
        mem_budget_gib: skip a cell whose cache is projected to exceed this (unbounded methods);
            ``None``: 8 GiB capped at 40% of available RAM on CPU, 80% of free memory on CUDA.
        device: ``auto`` (cuda if present), ``cpu`` or ``cuda[:i]``.
        dtype: ``auto`` (float32 on CPU, bfloat16 on CUDA), ``float32``, ``bfloat16``, ``float16``.
        threads: torch CPU threads (None: ``sinkwindow.runtime.threads.choose_threads``: 1 while other
            processes load the machine, else every core; ``OMP_NUM_THREADS`` wins).
        synthetic: sizes of the synthetic model.
        bandwidth_mib: buffer for the bandwidth measurement (0 disables the roofline).
        seed: token ids seed.
        out: output folder.
        plots: write PNG plots (needs matplotlib).
    """

    models: tuple[str, ...] = DEFAULT_MODELS
    methods: tuple[str, ...] = DEFAULT_METHODS
    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    prefill_contexts: tuple[int, ...] = DEFAULT_PREFILL_CONTEXTS
    steps: int = 32
    warmup: int = 4
    chunk_size: int = 512
    real_prefill_max: int = 4096
    time_cap_s: float = 300.0
    mem_budget_gib: float | None = None
    device: str = "auto"
    dtype: str = "auto"
    threads: int | None = None
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)
    bandwidth_mib: int = 1024
    seed: int = 0
    out: str = "runs/bench"
    plots: bool = True

    def __post_init__(self) -> None:
        self.models = tuple(self.models)
        self.methods = tuple(method_name(m) for m in self.methods)
        self.contexts = tuple(sorted(set(int(c) for c in self.contexts)))
        self.prefill_contexts = tuple(sorted(set(int(c) for c in self.prefill_contexts)))
        if not self.models or not self.methods:
            raise ValueError("need at least one model and one method")
        if any(c <= 0 for c in self.contexts + self.prefill_contexts):
            raise ValueError("contexts must be positive")
        if self.steps <= 0 or self.warmup < 0 or self.chunk_size <= 0:
            raise ValueError(
                f"need steps > 0, warmup >= 0, chunk_size > 0; got {self.steps}, {self.warmup}, {self.chunk_size}"
            )
        if self.time_cap_s <= 0 or (self.mem_budget_gib is not None and self.mem_budget_gib <= 0):
            raise ValueError("time cap and memory budget must be positive")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16; got {self.dtype!r}")
        if self.threads is not None and self.threads <= 0:
            raise ValueError(f"threads must be positive, got {self.threads}")

    @classmethod
    def quick(cls, **overrides) -> BenchConfig:
        """The ``--quick`` grid (a few minutes on 2 cores), with overrides."""
        return cls(**{**QUICK, **overrides})

    def memory_budget_bytes(self) -> int:
        """The memory budget in bytes (resolving the automatic default)."""
        if self.mem_budget_gib is not None:
            return int(self.mem_budget_gib * 2**30)
        device = self.torch_device()
        if device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(device)
            return int(0.8 * free)
        return int(min(8 * 2**30, 0.4 * available_ram()))

    def torch_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32
        return getattr(torch, self.dtype)

    def to_json(self) -> dict:
        d = asdict(self)
        d["synthetic"] = self.synthetic.describe()
        return d


def available_ram() -> int:
    """``MemAvailable`` from /proc/meminfo in bytes (16 GiB where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 16 * 2**30


def environment(device: torch.device) -> dict:
    import transformers

    import sinkwindow

    env = {
        "sinkwindow": sinkwindow.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        env["device_name"] = torch.cuda.get_device_name(device)
    return env


def load_bench_model(name: str, config: BenchConfig):
    """The model to time: the synthetic one built from ``config.synthetic``, or ``sinkwindow.load``."""
    device, dtype = config.torch_device(), config.torch_dtype()
    if name == SYNTHETIC_NAME:
        return build_synthetic(config.synthetic, dtype=dtype, device=device)
    import sinkwindow

    model, _ = sinkwindow.load(name, device=device, dtype=dtype, attn_implementation="sdpa")
    return model


def _max_positions(model) -> int | None:
    return getattr(model.config.get_text_config(decoder=True), "max_position_embeddings", None)


def _skipped(kind: str, method: str, context: int, reason: str) -> dict:
    return {
        "kind": kind,
        "method": method,
        "context": context,
        "status": "skipped",
        "reason": reason,
        "ms_per_token": None,
        "tokens_per_s": None,
        "kv_bytes": None,
        "prefill_s": None,
        "peak_rss_bytes": None,
    }


class _Caps:
    """Per-method time/memory caps: predict a cell's cost from the method's previous cells."""

    def __init__(self, config: BenchConfig, model):
        self.config = config
        self.model = model
        self.history: dict[tuple[str, str], list[tuple[int, float]]] = {}
        self.stopped: dict[tuple[str, str], tuple[int, str]] = {}
        self.budget: int | None = None

    def _budget_bytes(self) -> float:
        if self.budget is None:
            self.budget = self.config.memory_budget_bytes()
        return self.budget

    def _predict(
        self, key: tuple[str, str], n: int, floor: float, ceil: float, runner: MethodRunner
    ) -> float | None:
        """Seconds the cell at n should take, extrapolated from the method's previous cells."""
        past = self.history.get(key, [])
        if not past:
            return None
        n1, t1 = past[-1]
        scale = max(n, n1) / n1
        if key[0] == "decode":
            # A decode step streams the weights and the cache, so its time scales at least like
            # (weights + KV bytes at n) / (weights + KV bytes at n1); with two cells measured,
            # also like their empirical growth (which catches allocator effects beyond bytes).
            weights = weight_bytes_per_token(self.model)
            kv1, kv = runner.analytic_bytes(n1), runner.analytic_bytes(max(n, n1))
            predicted = t1 * (weights + kv) / (weights + kv1)
            if len(past) >= 2:
                n0, t0 = past[-2]
                if n1 > n0 and t0 > 0 and t1 > 0:
                    alpha = min(max(math.log(t1 / t0) / math.log(n1 / n0), floor), ceil)
                    predicted = max(predicted, t1 * scale**alpha)
            return predicted
        alpha = ceil
        if len(past) >= 2:
            n0, t0 = past[-2]
            if n1 > n0 and t0 > 0 and t1 > 0:
                alpha = math.log(t1 / t0) / math.log(n1 / n0)
        alpha = min(max(alpha, floor), ceil)
        return t1 * scale**alpha

    def check(self, kind: str, runner: MethodRunner, n: int) -> str | None:
        key = (kind, runner.name)
        if key in self.stopped and n >= self.stopped[key][0]:
            return self.stopped[key][1]
        limit = _max_positions(self.model)
        extra = self.config.warmup + self.config.steps if kind == "decode" else 0
        if limit is not None and n + extra > limit:
            return f"context {n} (+{extra} decode steps) is beyond the model's {limit} trained positions"
        reason = None
        if not runner.bounded:
            layers = kv_geometry(self.model.config)[0]
            cache = runner.analytic_bytes(n)
            # DynamicCache concatenates one layer's keys (then values) at a time: one layer extra.
            projected = cache * (1 + 1 / layers)
            if kind == "prefill":
                projected += _prefill_activation_bytes(self.model, n)
            if projected > self._budget_bytes():
                reason = (
                    f"projected memory {fmt_bytes(projected)} exceeds the budget of "
                    f"{fmt_bytes(self._budget_bytes())} (--mem-budget-gib)"
                )
        if reason is None:
            # Prefill grows between linearly and quadratically, a decode cell at most about linearly.
            # A soft cap: a cell that still runs long stops the method's longer contexts.
            floor, ceil = (0.0, 1.0) if kind == "decode" else (1.0, 2.0)
            predicted = self._predict(key, n, floor, ceil, runner)
            if predicted is not None and predicted > self.config.time_cap_s:
                reason = f"predicted {predicted:.0f} s exceeds the time cap of {self.config.time_cap_s:g} s (--time-cap)"
        if reason is not None and n < self.stopped.get(key, (n + 1, ""))[0]:
            self.stopped[key] = (n, reason)
        return reason

    def record(self, kind: str, runner: MethodRunner, n: int, seconds: float) -> None:
        self.history.setdefault((kind, runner.name), []).append((n, seconds))


def _prefill_activation_bytes(model, n: int) -> float:
    """Rough peak activations of a one-forward prefill of n tokens (MLP of one layer dominates)."""
    cfg = model.config.get_text_config(decoder=True)
    elem = torch.empty((), dtype=model.dtype).element_size()
    return n * (3 * getattr(cfg, "intermediate_size", 4 * cfg.hidden_size) + 6 * cfg.hidden_size) * elem


def run_bench(
    config: BenchConfig,
    on_row: Callable[[dict], None] | None = None,
    *,
    new_run: bool = False,
    redo: Collection[str] = (),
) -> list[dict]:
    """Run the suite into ``config.out``; return every row the folder holds afterwards.

    A re-run with the same settings measures only the cells with no row yet (``bench.folder``);
    other settings are refused unless ``new_run`` moves the old files aside. ``redo`` measures
    those methods again (their old rows move to ``previous-<time>/``).

    Args:
        config: the grid and caps.
        on_row: called with each row as it is written (the CLI prints progress with it).

    Raises:
        RunMismatchError: the folder holds rows made with other settings.
        RunLockedError: another run is writing the folder.
    """
    out = check_run_dir(config.out)
    device, dtype = config.torch_device(), config.torch_dtype()
    with RunLock(out):
        kept = open_bench_folder(
            out, bench_settings(config.to_json(), str(device)), new_run=new_run, redo=redo
        )
        threads = apply_threads(config.threads)
        start_session(out, device=str(device), threads=threads.to_json(), kept_rows=len(kept))
        return _run_models(config, out, kept, threads, device, dtype, on_row)


def _run_models(
    config: BenchConfig, out: Path, kept: list[dict], threads, device, dtype, on_row
) -> list[dict]:
    meta = {
        "config": config.to_json(),
        "env": environment(device),
        "threads": threads.to_json(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "loadavg_start": os.getloadavg(),
        "bandwidth": {},
        "memory_budget_bytes": config.memory_budget_bytes(),
        "kept_rows": len(kept),
    }
    rows: list[dict] = list(kept)
    done = {cell_key(r) for r in kept}
    jsonl = out / BENCH_FILE

    def emit(row: dict, model_name: str, extra: dict | None = None) -> None:
        row = {
            "model": model_name,
            **row,
            **(extra or {}),
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            "threads_reason": threads.reason,
            "batch": 1,
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }
        if cell_key(row) in done:  # measured (or skipped) by an earlier session of this run
            return
        validate_row(row)
        rows.append(row)
        done.add(cell_key(row))
        append_jsonl(jsonl, row)
        if on_row is not None:
            on_row(row)

    for model_name in config.models:
        todo = _Todo(model_name, done)
        try:
            model = load_bench_model(model_name, config)
        except (FileNotFoundError, ValueError, OSError, ImportError) as err:
            reason = f"model {model_name!r} unavailable: {err}".replace("\n", " ")
            logger.warning(reason)
            for spec in config.methods:
                for n in config.contexts:
                    emit(_skipped("decode", spec, n, reason), model_name)
            continue
        _run_model(model_name, model, config, meta, emit, todo)
        del model
        gc.collect()

    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    meta["loadavg_end"] = os.getloadavg()
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return rows


class _Todo:
    """Which cells of one model still need a measurement (those with no row in the folder)."""

    def __init__(self, model_name: str, done: set[tuple]):
        self.model, self.done = model_name, done

    def __call__(self, kind: str, method: str, n: int, baseline: str | None = None) -> bool:
        return (self.model, kind, method, n, baseline) not in self.done

    def contexts(self, kind: str, method: str, contexts) -> list[int]:
        return [n for n in contexts if self(kind, method, n)]


def _run_model(model_name: str, model, config: BenchConfig, meta: dict, emit, todo: _Todo) -> None:
    """Every cell of one model still to do: decode, then alternating-step pairs, then prefill."""
    bench = _ModelBench(model_name, model, config, meta, emit, todo)
    bench.decode()
    bench.paired()
    bench.prefill()


class _ModelBench:
    """One model's measurements: its method runners (or why each is unavailable), the caps, and
    the emitted rows' extra facts (weights per token, the bandwidth roofline)."""

    def __init__(self, model_name: str, model, config: BenchConfig, meta: dict, emit, todo: _Todo):
        self.name, self.model, self.config, self.emit, self.todo = model_name, model, config, emit, todo
        self.bandwidth = None
        if config.bandwidth_mib > 0:
            self.bandwidth = measure_bandwidth(config.torch_device(), nbytes=config.bandwidth_mib << 20)
            meta["bandwidth"][model_name] = self.bandwidth
            logger.info("bandwidth before %s: %s", model_name, self.bandwidth)
        self.weights = weight_bytes_per_token(model)
        meta.setdefault("weight_bytes_per_token", {})[model_name] = self.weights
        meta.setdefault("rss_after_load", {})[model_name] = current_rss()
        self.runners: dict[str, MethodRunner | str] = {}
        for spec in config.methods:
            try:
                # A peer's preallocated cache needs room for every decode step after the context.
                self.runners[spec] = runner_for(model, spec, headroom=config.warmup + config.steps)
            except MethodUnavailable as err:
                self.runners[spec] = str(err)
                logger.warning("skipping %s: %s", spec, err)
        self.caps = _Caps(config, model)
        self.decode_kw = dict(
            steps=config.steps, warmup=config.warmup, chunk_size=config.chunk_size,
            real_prefill_max=config.real_prefill_max, seed=config.seed,
        )  # fmt: skip

    def emit_decode(self, row: dict) -> None:
        extra = {"weight_bytes_per_token": self.weights}
        if self.bandwidth is not None:
            # One step streams every weight once and reads the cached keys/values once.
            gbps = self.bandwidth["bandwidth_gbps"]
            extra["bandwidth_gbps"] = gbps
            extra["roofline_ms"] = roofline_ms(self.weights + row["kv_bytes"], gbps)
            extra["roofline_ratio"] = row["ms_per_token"] / extra["roofline_ms"]
        self.emit(row, self.name, extra)

    def _allowed(self, kind: str, spec: str, runner, contexts) -> list[int]:
        """The contexts still to do that the caps allow; a skipped row for each one they refuse."""
        pending = []
        for n in self.todo.contexts(kind, runner.name, contexts):
            reason = self.caps.check(kind, runner, n)
            if reason is not None:
                self.emit(_skipped(kind, spec, n, reason), self.name)
            else:
                pending.append(n)
        return pending

    def decode(self) -> None:
        config = self.config
        for spec, runner in self.runners.items():
            if isinstance(runner, str):
                for n in config.contexts:
                    self.emit(_skipped("decode", spec, n, runner), self.name)
                continue
            if runner.bounded:
                # Every context at once, steps round-robin: drift in a shared machine's load hits all
                # contexts alike, so "flat in n" is tested on ratios taken at the same moments.
                pending = self._allowed("decode", spec, runner, config.contexts)
                if pending:
                    with runner:
                        rows = measure_decode_interleaved(runner, pending, **self.decode_kw)
                    for row in rows:
                        self.emit_decode(row)
                gc.collect()
                continue
            # One context at a time, so that the caps can stop an unbounded cache's growth.
            for n in self.todo.contexts("decode", runner.name, config.contexts):
                reason = self.caps.check("decode", runner, n)
                if reason is not None:
                    self.emit(_skipped("decode", spec, n, reason), self.name)
                    continue
                t0 = time.perf_counter()
                with runner:
                    row = measure_decode(runner, n, **self.decode_kw)
                self.caps.record("decode", runner, n, time.perf_counter() - t0)
                self.emit_decode(row)
                gc.collect()

    def paired(self) -> None:
        """Alternating steps against full attention (short contexts and near the crossover), and
        ``swa:W:0`` against transformers' own sliding window of the same W."""
        contexts = self.config.contexts
        baseline = FullRunner(self.model, parse_spec("full"))
        for runner in self.runners.values():
            if isinstance(runner, str) or runner.peer is not None or not method_of(runner.spec).windowed:
                continue
            w = runner.spec.window
            short = [n for n in contexts if n <= w]
            close = [n for n in contexts if PAIRED_RANGE[0] <= n <= PAIRED_RANGE[1] and n > w]
            for n in sorted({short[0], short[-1]} if short else set()) + close:
                if self.caps.check("decode", baseline, n) is not None:
                    continue
                if self.todo("paired", runner.name, n, baseline.name):
                    self.emit(measure_paired(runner, baseline, n, **self.decode_kw), self.name)
                    gc.collect()
        for name, peer in self.runners.items():
            if isinstance(peer, str) or not is_peer(name) or peer_kind(name) != "mistral-sw":
                continue
            w = peer_window(name)
            ours = self.runners.get(f"swa:{w}:0")
            beyond = [n for n in contexts if PAIRED_RANGE[0] <= n <= PAIRED_RANGE[1] and n > w]
            if isinstance(ours, str) or ours is None or not beyond:
                continue
            if self.caps.check("decode", ours, beyond[0]) is None and self.todo(
                "paired", ours.name, beyond[0], peer.name
            ):
                self.emit(measure_paired(ours, peer, beyond[0], **self.decode_kw), self.name)
                gc.collect()

    def prefill(self) -> None:
        config = self.config
        if not config.prefill_contexts:
            return
        for spec, runner in self.runners.items():
            if isinstance(runner, str):
                for n in config.prefill_contexts:
                    self.emit(_skipped("prefill", spec, n, runner), self.name)
                continue
            if not self.todo.contexts("prefill", runner.name, config.prefill_contexts):
                continue
            with runner:
                warm_up_prefill(runner, config.chunk_size)
                if runner.bounded and not method_of(runner.spec).dense_prompt:
                    # Chunked prefills of every length side by side at the same pace (see
                    # measure_prefill_interleaved): time(2n)/time(n) then measures the method.
                    pending = self._allowed("prefill", spec, runner, config.prefill_contexts)
                    rows = (
                        measure_prefill_interleaved(
                            runner, pending, chunk_size=config.chunk_size, seed=config.seed
                        )
                        if pending
                        else ()
                    )
                    for row in rows:
                        self.emit(row, self.name)
                    gc.collect()
                    continue
                for n in self.todo.contexts("prefill", runner.name, config.prefill_contexts):
                    reason = self.caps.check("prefill", runner, n)
                    if reason is not None:
                        self.emit(_skipped("prefill", spec, n, reason), self.name)
                        continue
                    row = measure_prefill(runner, n, chunk_size=config.chunk_size, seed=config.seed)
                    self.caps.record("prefill", runner, n, row["prefill_s"])
                    self.emit(row, self.name)
                    gc.collect()

"""Decode benchmark: ms per token at context n, with the KV/state bytes and peak memory it takes.

Method (gpt-fast's, docs/design.md §4): build the state at context n (a real prefill up to
``real_prefill_max`` tokens, else the runner's ``fill``, which leaves the same cache shapes and
layout, see ``methods``), run ``warmup`` greedy decode steps that are not counted, then time
``steps`` single-token forwards, synchronising the device before every clock read. Each step is
one ``runner.step(token, cache)`` call (``model(token, cache=cache)``, or a peer's compiled step):
embedding, every layer with its cache update and mask, and the LM head; the argmax that picks the
next token is inside the timed region too.

``ms_per_token`` is the median step (robust to other processes sharing the CPU); the mean and
min are recorded beside it. Memory: analytic bytes from the config, tensor bytes held by the cache
after the fill, and the peak RSS (CPU) or ``max_memory_allocated`` (CUDA) over fill + decode.

Two drift-proof variants for a shared machine: ``measure_decode_interleaved`` times one method at
many contexts round-robin (the flatness of bounded methods), and ``measure_paired`` alternates
two methods step by step at one context (what the patch costs; SWA against full attention where
the two are close).
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

from ..runtime.cache import cache_lengths, cache_nbytes
from .memory import PeakMemory
from .methods import MethodRunner

__all__ = ["measure_decode", "measure_decode_interleaved", "measure_paired", "synchronize", "random_ids"]

logger = logging.getLogger(__name__)


def synchronize(device: torch.device) -> None:
    """Wait for queued device work so the clock reads finished work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_ids(vocab: int, n: int, seed: int = 0, batch: int = 1) -> torch.Tensor:
    """``[batch, n]`` token ids drawn uniformly, avoiding ids 0..2 (pad/bos/eos in most vocabularies)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, max(vocab, 4), (batch, n), generator=gen)


@torch.no_grad()
def measure_decode(
    runner: MethodRunner,
    context: int,
    *,
    steps: int = 32,
    warmup: int = 4,
    chunk_size: int = 512,
    real_prefill_max: int = 4096,
    seed: int = 0,
) -> dict:
    """Time ``steps`` greedy decode steps after a context of ``context`` tokens.

    Args:
        runner: an active ``MethodRunner`` (its method is applied to its model).
        context: n, tokens in the cache before the first timed step (the warm-up steps add
            ``warmup`` more; for bounded methods that changes nothing).
        steps: timed single-token steps.
        warmup: untimed steps first (first-call allocations, lazy initialisation).
        chunk_size: prefill chunk for chunked methods.
        real_prefill_max: run a real prefill for n up to this; above it use ``runner.fill``.
        seed: token ids seed.

    Returns:
        One measurement row (see ``report.ROW_FIELDS``), ``status == "ok"``.
    """
    return measure_decode_interleaved(
        runner,
        [context],
        steps=steps,
        warmup=warmup,
        chunk_size=chunk_size,
        real_prefill_max=real_prefill_max,
        seed=seed,
    )[0]


@torch.no_grad()
def measure_decode_interleaved(
    runner: MethodRunner,
    contexts: list[int],
    *,
    steps: int = 32,
    warmup: int = 4,
    chunk_size: int = 512,
    real_prefill_max: int = 4096,
    seed: int = 0,
) -> list[dict]:
    """Decode at several contexts at once: every state is built first, then steps go round-robin.

    For bounded methods (SWA, linear) all states fit in memory together, and timing one step at
    each context in turn (the order flips every round) means a change in the load of a shared
    machine hits every context alike: the ratio of two contexts' times is then a fair test of
    "decode cost does not depend on length". With one context this is a plain sequential
    measurement.

    Each context's fill and warm-up steps run inside their own ``PeakMemory`` block, whose peak is
    the row's ``peak_rss_bytes`` (with one context, the timed steps are inside it too).

    Args:
        runner: an active ``MethodRunner``.
        contexts: the contexts n.
        steps, warmup, chunk_size, real_prefill_max, seed: as in ``measure_decode``.

    Returns:
        One row per context, in the order given.
    """
    if steps <= 0 or warmup < 0 or not contexts or min(contexts) <= 0:
        raise ValueError(f"need steps > 0, warmup >= 0, contexts > 0; got {steps}, {warmup}, {contexts}")
    device = next(runner.model.parameters()).device
    states = []
    for context in contexts:
        st = _fill_state(runner, context, chunk_size, real_prefill_max, seed, device)
        for _ in range(warmup):
            _step(runner, st, device)
        if len(contexts) > 1:
            st["mem"].__exit__(None, None, None)
        states.append(st)
    for i in range(steps):
        for st in states if i % 2 == 0 else reversed(states):
            st["times"].append(_step(runner, st, device))
    if len(contexts) == 1:
        states[0]["mem"].__exit__(None, None, None)
    protocol = "interleaved" if len(contexts) > 1 else "sequential"
    rows = [_decode_row(runner, st, steps, warmup, protocol, chunk_size) for st in states]
    states.clear()
    return rows


def _fill_state(
    runner: MethodRunner, context: int, chunk_size: int, real_prefill_max: int, seed: int, device
) -> dict:
    """One context's decode state: its cache filled with ``context`` random tokens (a real prefill up
    to ``real_prefill_max``, else the runner's fast fill), inside an entered ``PeakMemory`` block."""
    vocab = runner.model.config.get_text_config(decoder=True).vocab_size
    ids = random_ids(vocab, context, seed).to(device)
    real = context <= real_prefill_max
    mem = PeakMemory(device)
    mem.__enter__()
    synchronize(device)
    t0 = time.perf_counter()
    logits, cache = runner.prefill(ids, chunk_size) if real else runner.fill(ids, chunk_size)
    synchronize(device)
    fill_s = time.perf_counter() - t0
    return {
        "context": context,
        "real": real,
        "fill_s": fill_s,
        "cache": cache,
        "token": logits.argmax(-1, keepdim=True),  # [batch, 1]
        "kv_bytes": cache_nbytes(cache),
        "lengths": cache_lengths(cache),
        "seq_length": int(cache.get_seq_length()),
        "mem": mem,
        "times": [],
    }


def _decode_row(
    runner: MethodRunner, st: dict, steps: int, warmup: int, protocol: str, chunk_size: int
) -> dict:
    """The ``decode`` row of one context's state after its timed steps."""
    times, mem, context = st["times"], st["mem"], st["context"]
    median_ms = 1e3 * statistics.median(times)
    return {
        "kind": "decode",
        "method": runner.name,
        **runner.row_fields(),
        "context": context,
        "status": "ok",
        "reason": None,
        "steps": steps,
        "warmup": warmup,
        "protocol": protocol,
        "ms_per_token": median_ms,
        "ms_per_token_mean": 1e3 * statistics.fmean(times),
        "ms_per_token_min": 1e3 * min(times),
        "tokens_per_s": 1e3 / median_ms,
        "kv_bytes": st["kv_bytes"],
        "kv_bytes_analytic": runner.analytic_bytes(context),
        "kv_bytes_end": cache_nbytes(st["cache"]),
        "kv_entries_per_layer": max(st["lengths"], default=0),
        "seq_length": st["seq_length"],
        "fill": "prefill" if st["real"] else "fill",
        "fill_s": st["fill_s"],
        "prefill_s": st["fill_s"] if st["real"] else None,
        "chunk_size": runner.prefill_chunk(context, chunk_size),
        "peak_rss_bytes": mem.peak_rss,
        "rss_before_bytes": mem.rss_before,
        "rss_scope": mem.rss_scope,
        "cuda_peak_bytes": mem.cuda_peak,
    }


def _step(runner: MethodRunner, st: dict, device: torch.device) -> float:
    """One timed greedy decode step on state ``st``; returns seconds."""
    synchronize(device)
    t = time.perf_counter()
    st["token"] = runner.step(st["token"], st["cache"]).argmax(-1, keepdim=True)
    synchronize(device)
    return time.perf_counter() - t


@torch.no_grad()
def measure_paired(
    runner: MethodRunner,
    baseline: MethodRunner,
    context: int,
    *,
    steps: int = 32,
    warmup: int = 4,
    chunk_size: int = 512,
    real_prefill_max: int = 4096,
    seed: int = 0,
) -> dict:
    """Two methods on one model at the same context, decoding alternately, step by step.

    Both states are built (a real prefill up to ``real_prefill_max``, else the runners' fills),
    then decode steps alternate between the methods (patch, step, switch, step; the order flips
    every pair), so a change in the load of a shared machine hits both alike. Used for what the
    patch costs (SWA against the unpatched model at n <= w, where both do the same attention)
    and for SWA's speedup over full attention where the two are close (a few thousand tokens).

    ``ratio`` is the method's median step over the baseline's; ``ratio_paired`` the median of the
    per-pair ratios (noisier when single steps are disturbed).

    Args:
        runner: the method (e.g. SWA(w, s)).
        baseline: the reference on the same model (``full``: the unpatched model), or a peer
            running the same weights (``peer:mistral-sw:W`` for ``swa:W:0``).
        context, steps, warmup, chunk_size, real_prefill_max, seed: as in ``measure_decode``.

    Returns:
        A row with ``kind == "paired"``: ``ms_per_token`` (the method's median step),
        ``ms_per_token_baseline``, their minima, ``ratio``, ``ratio_paired`` and both cache sizes.
    """
    if runner.model is not baseline.model and baseline.peer is None:
        # A peer (bench.peers) runs its own copy of the model's weights; anything else must share it.
        raise ValueError("measure_paired compares two methods on one model, or a method and its peer")
    model = runner.model
    device = next(model.parameters()).device
    ids = random_ids(model.config.get_text_config(decoder=True).vocab_size, context, seed).to(device)
    real = context <= real_prefill_max
    pair = (baseline, runner)
    state: dict[int, list] = {}
    times: dict[int, list[float]] = {0: [], 1: []}
    with PeakMemory(device) as mem:
        for i, r in enumerate(pair):
            with r:
                logits, cache = r.prefill(ids, chunk_size) if real else r.fill(ids, chunk_size)
            state[i] = [logits.argmax(-1, keepdim=True), cache]
        kv_bytes = [cache_nbytes(state[i][1]) for i in (0, 1)]
        for step in range(warmup + steps):
            for i in (0, 1) if step % 2 == 0 else (1, 0):
                with pair[i]:
                    token, cache = state[i]
                    synchronize(device)
                    t = time.perf_counter()
                    state[i][0] = pair[i].step(token, cache).argmax(-1, keepdim=True)
                    synchronize(device)
                    if step >= warmup:
                        times[i].append(time.perf_counter() - t)
        del state
    ratios = [p / b for p, b in zip(times[1], times[0])]
    median_ms = 1e3 * statistics.median(times[1])
    return {
        "kind": "paired",
        "method": runner.name,
        "baseline": baseline.name,
        **{f"baseline_{k}": v for k, v in baseline.row_fields().items()},
        "context": context,
        "status": "ok",
        "reason": None,
        "steps": steps,
        "warmup": warmup,
        "protocol": "alternating",
        "fill": "prefill" if real else "fill",
        "ms_per_token": median_ms,
        "ms_per_token_min": 1e3 * min(times[1]),
        "ms_per_token_baseline": 1e3 * statistics.median(times[0]),
        "ms_per_token_baseline_min": 1e3 * min(times[0]),
        "ratio": statistics.median(times[1]) / statistics.median(times[0]),
        "ratio_paired": statistics.median(ratios),
        "tokens_per_s": 1e3 / median_ms,
        "kv_bytes": kv_bytes[1],
        "kv_bytes_baseline": kv_bytes[0],
        "kv_bytes_analytic": runner.analytic_bytes(context),
        "prefill_s": None,
        "peak_rss_bytes": mem.peak_rss,
        "rss_before_bytes": mem.rss_before,
        "rss_scope": mem.rss_scope,
        "cuda_peak_bytes": mem.cuda_peak,
    }

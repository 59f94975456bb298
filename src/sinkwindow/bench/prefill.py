"""Prefill benchmark: seconds to bring a model from an empty cache to context n.

SWA(w, s) prefills in chunks of c tokens through the bounded cache, O(n (w + c)) time, so its
time must grow linearly with n; full attention runs one forward (SDPA, causal, what an
unpatched model does), O(n^2) in attention. Only the last position's logits are computed, as a
server would before sampling the first token, so the LM head does not blur the comparison.

``measure_prefill_interleaved`` runs chunked prefills of several lengths side by side at the same
pace, so their ratio survives a shared machine's changing load.
"""

from __future__ import annotations

import logging
import time

import torch

from ..runtime.cache import cache_lengths, cache_nbytes
from ..runtime.prefill import prefill
from .decode import random_ids, synchronize
from .memory import PeakMemory
from .methods import MethodRunner

__all__ = ["measure_prefill", "measure_prefill_interleaved", "warm_up_prefill"]

logger = logging.getLogger(__name__)


@torch.no_grad()
def warm_up_prefill(runner: MethodRunner, chunk_size: int, tokens: int = 256) -> None:
    """One short untimed prefill (first-call allocations, kernel selection)."""
    device = next(runner.model.parameters()).device
    ids = random_ids(runner.model.config.get_text_config(decoder=True).vocab_size, tokens, seed=1).to(device)
    runner.prefill(ids, chunk_size)
    synchronize(device)


@torch.no_grad()
def measure_prefill(runner: MethodRunner, context: int, *, chunk_size: int = 512, seed: int = 0) -> dict:
    """Time one real prefill of ``context`` random tokens.

    Args:
        runner: an active ``MethodRunner``.
        context: n, prompt tokens.
        chunk_size: c for chunked methods (full attention always runs one forward).
        seed: token ids seed.

    Returns:
        One row (``kind == "prefill"``): ``prefill_s``, ``tokens_per_s`` (n / prefill_s),
        ``ms_per_token`` (prefill_s / n), the cache's bytes after the prefill and the peak memory.
    """
    if context <= 0:
        raise ValueError(f"context must be positive, got {context}")
    model = runner.model
    device = next(model.parameters()).device
    ids = random_ids(model.config.get_text_config(decoder=True).vocab_size, context, seed).to(device)
    with PeakMemory(device) as mem:
        synchronize(device)
        t0 = time.perf_counter()
        _, cache = runner.prefill(ids, chunk_size)
        synchronize(device)
        prefill_s = time.perf_counter() - t0
        kv_bytes = cache_nbytes(cache)
        lengths = cache_lengths(cache)
        seq_length = int(cache.get_seq_length())
        del cache
    return {
        "kind": "prefill",
        "method": runner.name,
        **runner.row_fields(),
        "context": context,
        "status": "ok",
        "reason": None,
        "protocol": "sequential",
        "prefill_s": prefill_s,
        "ms_per_token": 1e3 * prefill_s / context,
        "tokens_per_s": context / prefill_s,
        "kv_bytes": kv_bytes,
        "kv_bytes_analytic": runner.analytic_bytes(context),
        "kv_entries_per_layer": max(lengths, default=0),
        "seq_length": seq_length,
        "chunk_size": runner.prefill_chunk(context, chunk_size),
        "peak_rss_bytes": mem.peak_rss,
        "rss_before_bytes": mem.rss_before,
        "rss_scope": mem.rss_scope,
        "cuda_peak_bytes": mem.cuda_peak,
    }


@torch.no_grad()
def measure_prefill_interleaved(
    runner: MethodRunner, contexts: list[int], *, chunk_size: int = 512, seed: int = 0
) -> list[dict]:
    """Chunked prefills of several lengths run side by side, chunk by chunk, at the same pace.

    Each step advances the prompt that is least far along (as a fraction of its length) by one
    chunk, so all prompts progress together and finish together: a change in a shared machine's
    load slows every prompt alike, and time(2n) / time(n) measures the method, not the moment.
    A prompt's ``prefill_s`` is the sum of its chunk forwards (each through ``sinkwindow.prefill``
    continuing the same cache), which is a sequential prefill's time less the Python between
    chunks. Only for methods that prefill in chunks (SWA, linear); ``peak_rss_bytes`` is the
    group's (all prompts' bounded caches resident together).

    Returns:
        One ``kind == "prefill"`` row per context (``protocol == "interleaved"``), in the order given.
    """
    if not contexts or min(contexts) <= 0:
        raise ValueError(f"contexts must be positive, got {contexts}")
    model = runner.model
    device = next(model.parameters()).device
    vocab = model.config.get_text_config(decoder=True).vocab_size
    states = [
        {
            "n": n,
            "ids": random_ids(vocab, n, seed).to(device),
            "cache": runner.new_cache(),
            "pos": 0,
            "t": 0.0,
        }
        for n in contexts
    ]
    with PeakMemory(device) as mem:
        while True:
            todo = [st for st in states if st["pos"] < st["n"]]
            if not todo:
                break
            st = min(todo, key=lambda s: s["pos"] / s["n"])
            a, b = st["pos"], min(st["n"], st["pos"] + chunk_size)
            synchronize(device)
            t0 = time.perf_counter()
            prefill(model, st["ids"][:, a:b], chunk_size=chunk_size, cache=st["cache"], return_logits="last")
            synchronize(device)
            st["t"] += time.perf_counter() - t0
            st["pos"] = b
    rows = []
    for st in states:
        n, cache = st["n"], st["cache"]
        rows.append(
            {
                "kind": "prefill",
                "method": runner.name,
                **runner.row_fields(),
                "context": n,
                "status": "ok",
                "reason": None,
                "protocol": "interleaved",
                "prefill_s": st["t"],
                "ms_per_token": 1e3 * st["t"] / n,
                "tokens_per_s": n / st["t"],
                "kv_bytes": cache_nbytes(cache),
                "kv_bytes_analytic": runner.analytic_bytes(n),
                "kv_entries_per_layer": max(cache_lengths(cache), default=0),
                "seq_length": int(cache.get_seq_length()),
                "chunk_size": chunk_size,
                "peak_rss_bytes": mem.peak_rss,
                "rss_before_bytes": mem.rss_before,
                "rss_scope": mem.rss_scope,
                "cuda_peak_bytes": mem.cuda_peak,
            }
        )
    return rows

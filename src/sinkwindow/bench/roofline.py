"""A weights-bandwidth roofline for decoding: bytes read per token / measured memory bandwidth.

At batch 1 a decode step multiplies one vector by every weight matrix, so it must stream every
weight it uses from memory once (plus the KV entries it attends to). No implementation on this
machine can beat ``bytes_per_token / bandwidth``; how close one gets is gpt-fast's "bandwidth
achieved" / nanochat's MBU. The bandwidth is measured here, with torch's own kernels and thread
count, on buffers far larger than any cache:

- ``read``: ``x.sum()`` over the buffer (bytes read / time);
- ``copy``: ``y.copy_(x)`` (bytes read + written / time);
- ``gemv``: ``F.linear(v, W)`` of one vector over distinct weight matrices filling the buffer,
  as a decode step does (bytes of weights / time). Not a bound: what the BLAS behind ``aten::mm``
  achieves at batch 1, which tells a slow kernel apart from Python overhead.

The roofline uses the larger of ``read`` and ``copy``: the best this process was seen to stream.
"""

from __future__ import annotations

import logging
import time

import torch
from transformers import PreTrainedModel

from .decode import synchronize

__all__ = ["measure_bandwidth", "weight_bytes_per_token", "roofline_ms"]

logger = logging.getLogger(__name__)


def measure_bandwidth(
    device: torch.device | str = "cpu", nbytes: int = 1 << 30, repeats: int = 5
) -> dict[str, float]:
    """Memory bandwidth in GB/s (1e9 bytes/s), best of ``repeats``.

    Args:
        device: where to measure.
        nbytes: buffer size; keep it well above the last-level cache.
        repeats: timed repetitions after one warm-up.

    Returns:
        ``{"read_gbps", "copy_gbps", "bandwidth_gbps" (max of read and copy), "gemv_gbps",
        "buffer_bytes", "threads"}``.
    """
    device = torch.device(device)
    n = nbytes // 4
    x = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    y = torch.empty_like(x)
    best = {"read": float("inf"), "copy": float("inf")}
    for i in range(repeats + 1):
        for kind in best:
            synchronize(device)
            t = time.perf_counter()
            if kind == "read":
                x.sum()
            else:
                y.copy_(x)
            synchronize(device)
            if i:  # the first round warms up page tables and kernels
                best[kind] = min(best[kind], time.perf_counter() - t)
    del x, y
    # Decode-shaped matmuls: [1, 1024] x [4096, 1024]^T over distinct 16 MiB matrices (no cache reuse).
    rows, cols = 4096, 1024
    mats = [
        torch.empty(rows, cols, device=device).uniform_() for _ in range(max(1, nbytes // (rows * cols * 4)))
    ]
    v = torch.empty(1, cols, device=device).uniform_()
    gemv = float("inf")
    for i in range(repeats + 1):
        synchronize(device)
        t = time.perf_counter()
        for w in mats:
            torch.nn.functional.linear(v, w)
        synchronize(device)
        if i:
            gemv = min(gemv, time.perf_counter() - t)
    gemv_gbps = len(mats) * rows * cols * 4 / gemv / 1e9
    del mats
    read = n * 4 / best["read"] / 1e9
    copy = 2 * n * 4 / best["copy"] / 1e9
    return {
        "read_gbps": read,
        "copy_gbps": copy,
        "bandwidth_gbps": max(read, copy),
        "gemv_gbps": gemv_gbps,
        "buffer_bytes": n * 4,
        "threads": torch.get_num_threads(),
    }


def weight_bytes_per_token(model: PreTrainedModel) -> int:
    """Bytes of parameters one decode step reads.

    Every parameter is read once, except an input embedding that is not tied to the LM head: the
    lookup reads one row of it, not the matrix. Tied weights (one storage) count once.
    """
    embedding = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    head_weight = head.weight if head is not None else None
    tied = head_weight is not None and head_weight.data_ptr() == embedding.data_ptr()
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if p.data_ptr() == embedding.data_ptr() and not tied:
            total += p.shape[-1] * p.element_size()  # one row
        else:
            total += p.numel() * p.element_size()
    return total


def roofline_ms(bytes_per_token: int, bandwidth_gbps: float) -> float:
    """Lower bound on ms per decoded token: bytes that must stream / bandwidth."""
    return bytes_per_token / (bandwidth_gbps * 1e9) * 1e3

"""The ``mass`` criterion: under full attention, the attention mass each unit's last queries put on
keys SWA(W, S) would drop, captured in one pass (``tuning/capture.py``) for every base."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..runtime.kv_bytes import kv_geometry
from .capture import WeightsCapture, capture_pass
from .criteria import LAST_QUERIES
from .prompts import CalibrationPrompt

__all__ = ["LAST_QUERIES", "mass_scores"]


class _MassCapture(WeightsCapture):
    """Out-of-window attention mass per (window, layer, KV head), summed over the counted queries."""

    def __init__(self, layers: int, kv_heads: int, windows: Sequence[tuple[int, int]], last_queries: int):
        super().__init__(layers)
        self.windows = list(windows)
        self.last_queries = last_queries
        self.sums = torch.zeros(len(self.windows), layers, kv_heads, dtype=torch.float64)
        self.queries = torch.zeros(layers, dtype=torch.long)

    def first_query(self, prompt: CalibrationPrompt, length: int) -> int:
        return max(0, length - self.last_queries)

    def add(self, layer: int, weights: torch.Tensor, pos: torch.Tensor, key_pos: torch.Tensor) -> None:
        heads, m, n = weights.shape
        kv_heads = self.sums.shape[2]
        offset = int(key_pos[0])
        weights = weights.view(kv_heads, heads // kv_heads, m, n).mean(1)  # [Hkv, m, n]
        cum = weights.double().cumsum(-1)
        for w_idx, (window, sinks) in enumerate(self.windows):
            # SWA(W, S) drops absolute positions S .. pos - (W - S) (inclusive): past the sinks,
            # before the recent; as key indices lo .. hi.
            hi = pos - (window - sinks) - offset
            lo = max(0, sinks - offset)
            idx = hi.clamp(min=0)[None, :, None].expand(kv_heads, m, 1)
            mass = cum.gather(-1, idx)[..., 0]
            if lo > 0:
                mass = mass - cum[..., lo - 1]
            mass = torch.where((hi >= lo)[None], mass, torch.zeros_like(mass))
            self.sums[w_idx, layer] += mass.sum(-1).cpu()
        self.queries[layer] += m


def mass_scores(
    model,
    prompts: Sequence[CalibrationPrompt],
    windows: Sequence[tuple[int, int]],
    *,
    last_queries: int = LAST_QUERIES,
    chunk_size: int = 512,
    bar=None,
) -> dict[tuple[int, int], torch.Tensor]:
    """Out-of-window attention mass under full attention, for every ``(W, S)`` in ``windows`` at once.

    The prompts (with their answers but the last token, so the answer's queries count) run once in
    full attention through ``capture_pass``, which computes the softmax of the last ``last_queries``
    queries itself and otherwise calls the model's own attention, so the forward is unchanged.
    A layer with a native sliding window (Gemma 3's local layers, Mistral) is measured as the model
    runs it: its queries see only keys inside that window, so mass beyond it is already zero.
    Leaves the model in full attention, on its original attention implementation.

    Returns:
        ``{(W, S): [layers, kv_heads]}`` float64 mass in [0, 1], averaged over counted queries and
        prompts (and over the query heads of each KV head).
    """
    layers, _, kv_heads, _ = kv_geometry(model.config)
    capture = _MassCapture(layers, kv_heads, windows, last_queries)
    capture_pass(model, prompts, capture, chunk_size=chunk_size, bar=bar)
    counts = capture.queries.clamp(min=1).double()[None, :, None]
    return {ws: capture.sums[i] / counts[0] for i, ws in enumerate(capture.windows)}

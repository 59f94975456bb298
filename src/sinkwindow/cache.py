"""Bounded KV cache for SWA(w, s): sinks plus the most recent keys, never more than w per layer.

Layout of one layer's persisted keys/values (``[batch, kv_heads, n, head_dim]``)::

    slot:      0 .. s-1   |  s .. n-1
    absolute:  0 .. s-1   |  start_recent .. cumulative-1

Before the first eviction the layout is simply absolute ``0..cumulative-1``. After every ``update``
the layer keeps the s sinks and the last ``w - s - 1`` keys: exactly what the next query (which
sees itself as the w-th key) needs. ``update`` returns sinks + recent + the incoming chunk, so every
query of a chunk sees what SWA(w, s) allows it; the mask builder (``masks.slot_positions``) maps the
physical slots back to absolute positions from ``get_mask_sizes``'s ``kv_offset``.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["SinkWindowLayer", "SinkWindowCache", "SlotOffset"]


class SlotOffset(int):
    """A ``kv_offset`` that says "slots below ``sinks`` are the sinks" (our cache's layout).

    transformers passes ``get_mask_sizes``'s offset through to the mask builder untouched, so the
    builder can tell our layout from a stock contiguous cache (whose offset is a plain int).
    """

    def __new__(cls, value: int, sinks: int):
        obj = super().__new__(cls, value)
        obj.sinks = sinks
        return obj


class SinkWindowLayer(DynamicLayer):
    """One layer's bounded cache for SWA(``window``, ``sinks``).

    Args:
        window: w, keys a query sees (sinks and itself included).
        sinks: s, leading tokens kept forever.
        is_sliding: set for layers that keep a model's native sliding window, so transformers'
            mask code sizes the sliding mask against this layer rather than a global one.
    """

    is_croppable = False

    def __init__(self, window: int, sinks: int, is_sliding: bool = False):
        super().__init__()
        if window <= 0 or sinks < 0 or sinks >= window:
            raise ValueError(f"need 0 <= sinks < window, got window={window}, sinks={sinks}")
        self.window = window
        self.sinks = sinks
        self.is_sliding = is_sliding
        self.cumulative_length = 0

    @property
    def max_persisted(self) -> int:
        """Most entries kept between forwards: s sinks + (w - s - 1) recent = w - 1."""
        return self.window - 1

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a chunk, return what its queries may see, then evict.

        Args:
            key_states, value_states: ``[batch, kv_heads, chunk, head_dim]``.

        Returns:
            keys, values ``[batch, kv_heads, n_persisted + chunk, head_dim]`` in slot order.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        full_keys = torch.cat([self.keys, key_states], dim=-2)
        full_values = torch.cat([self.values, value_states], dim=-2)
        self.cumulative_length += key_states.shape[-2]
        self.keys, self.values = self._evict(full_keys), self._evict(full_values)
        return full_keys, full_values

    def _evict(self, states: torch.Tensor) -> torch.Tensor:
        n = states.shape[-2]
        if n <= self.max_persisted:
            return states
        recent = self.max_persisted - self.sinks
        # Clone so the persisted slice does not pin the whole (sinks + recent + chunk) buffer.
        if self.sinks == 0:
            return states[..., n - recent :, :].clone()
        return torch.cat([states[..., : self.sinks, :], states[..., n - recent :, :]], dim=-2)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)``: slot p >= s holds absolute ``kv_offset + p``."""
        persisted = self.keys.shape[-2] if self.is_initialized else 0
        return persisted + query_length, SlotOffset(self.cumulative_length - persisted, self.sinks)

    def get_seq_length(self) -> int:
        """Tokens seen so far (not stored): keeps ``position_ids`` absolute."""
        return self.cumulative_length

    def get_max_length(self) -> int:
        return self.window

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "a sink-window cache has already evicted the keys needed to roll back; assisted/speculative "
            "decoding that crops the cache is not supported with sinkwindow"
        )

    def reset(self) -> None:
        super().reset()
        self.cumulative_length = 0


class SinkWindowCache(Cache):
    """A transformers ``Cache`` made of ``SinkWindowLayer``s (one per decoder layer).

    Args:
        layer_windows: per layer ``(window, sinks, is_sliding)``.
    """

    def __init__(self, layer_windows: list[tuple[int, int, bool]]):
        super().__init__(layers=[SinkWindowLayer(w, s, is_sliding=sl) for w, s, sl in layer_windows])

    def persisted_lengths(self) -> list[int]:
        """Keys each layer holds right now (what decoding memory is made of)."""
        return [layer.keys.shape[-2] if layer.is_initialized else 0 for layer in self.layers]

    def nbytes(self) -> int:
        """Bytes of key and value tensors held right now, all layers."""
        total = 0
        for layer in self.layers:
            if layer.is_initialized:
                total += layer.keys.numel() * layer.keys.element_size()
                total += layer.values.numel() * layer.values.element_size()
        return total


def dynamic_cache_nbytes(cache: DynamicCache) -> int:
    """Bytes of key and value tensors held by any transformers cache of KV layers."""
    total = 0
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        if keys is not None and keys.numel():
            total += keys.numel() * keys.element_size() + layer.values.numel() * layer.values.element_size()
    return total

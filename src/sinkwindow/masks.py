"""Mask functions for SWA(w, s) and the mask builders registered with transformers.

A transformers mask function is ``(batch_idx, head_idx, q_idx, kv_idx) -> bool`` over *absolute*
positions. SWA(w, s) is one overlay composed with the stock primitives::

    causal AND (sink OR recent)      sink: kv < s      recent: kv > q - (w - s)

so query i sees key j iff ``j <= i and (j < s or j > i - (w - s))``: s sinks plus the w - s most
recent keys, itself included (DESIGN.md §1).

Our bounded cache stores keys out of order: physical slots ``0..s-1`` hold the sinks (absolute
``0..s-1``) and slot ``p >= s`` holds absolute ``kv_offset + p`` (see ``cache.SinkWindowLayer``).
The builders map physical slots back to absolute positions before evaluating the mask function;
with ``kv_offset == 0`` (no eviction yet, or no cache) the mapping is the identity.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.masking_utils import (
    and_masks,
    causal_mask_function,
    eager_mask,
    or_masks,
    sdpa_mask,
    sliding_window_overlay,
)

__all__ = [
    "sink_overlay",
    "sink_window_mask_function",
    "slot_positions",
    "build_sink_window_mask",
    "sinkwindow_sdpa_mask",
    "sinkwindow_eager_mask",
    "PLAN_ATTR",
]

# Name of the config attribute that carries the active plan (a plain dict, so configs stay JSON-able).
PLAN_ATTR = "_sinkwindow"


def sink_overlay(sinks: int, token_rank: torch.Tensor | None = None) -> Callable:
    """Overlay admitting the first ``sinks`` tokens.

    Args:
        sinks: s.
        token_rank: optional ``(batch, total_len)`` rank of each position among the row's real
            (non-padding) tokens; with it the sinks are the first s *real* tokens of each row.
    """

    def inner(batch_idx, head_idx, q_idx, kv_idx):
        if token_rank is None:
            return kv_idx < sinks
        return token_rank[batch_idx, kv_idx] < sinks

    return inner


def sink_window_mask_function(window: int, sinks: int, token_rank: torch.Tensor | None = None) -> Callable:
    """The SWA(w, s) mask function over absolute positions: ``causal AND (sink OR recent)``."""
    recent = sliding_window_overlay(window - sinks)  # kv > q - (w - s)
    if sinks == 0:
        return and_masks(causal_mask_function, recent)
    return and_masks(causal_mask_function, or_masks(sink_overlay(sinks, token_rank), recent))


def slot_positions(kv_length: int, kv_offset: int, sink_slots: int, device: torch.device | str) -> torch.Tensor:
    """Absolute position of each physical key slot.

    Args:
        sink_slots: how many leading slots hold the sinks (0 for a contiguous cache).

    Returns:
        ``(kv_length,)`` long tensor: slot p < sink_slots -> p, slot p >= sink_slots -> ``kv_offset + p``.
    """
    slots = torch.arange(kv_length, device=device)
    if kv_offset == 0 or sink_slots == 0:
        return slots + kv_offset
    return torch.where(slots < sink_slots, slots, slots + kv_offset)


def build_sink_window_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int,
    kv_offset: int,
    window: int,
    sinks: int,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Boolean SWA(w, s) mask over the physical key slots.

    Args:
        q_offset: absolute position of the first query.
        kv_offset: the cache's reported offset (see ``slot_positions``).
        attention_mask: optional 2D padding mask ``(batch, total_len)`` over absolute positions
            (1 = real token). Sinks then are each row's first ``sinks`` real tokens.

    Returns:
        ``(batch, 1, q_length, kv_length)`` bool, True where the query attends the key.
    """
    sink_slots = getattr(kv_offset, "sinks", None)
    if sink_slots is None:
        # A contiguous cache (stock DynamicCache / DynamicSlidingWindowLayer). Once it has dropped
        # keys it no longer holds the sinks, nor necessarily the whole window.
        if kv_offset > 0 and (sinks > 0 or kv_length - q_length + 1 < window):
            raise ValueError(
                "this cache has already evicted keys that SWA(w, s) still needs (a stock transformers "
                "sliding-window cache?): pass cache=sinkwindow.make_cache(model) to forward()/generate()"
            )
        sink_slots = 0
    kv_offset = int(kv_offset)
    kv_abs = slot_positions(kv_length, kv_offset, sink_slots, device)
    q_abs = torch.arange(q_length, device=device) + q_offset
    token_rank = None
    padding = None
    if attention_mask is not None:
        attention_mask = attention_mask.to(device=device, dtype=torch.bool)
        if not bool(attention_mask.all()):
            if sinks > 0 and kv_offset > 0:
                raise NotImplementedError(
                    "padding the cache cannot honour: once a bounded cache has evicted keys, its sink slots "
                    "are the first s positions of the batch, not each row's first s real tokens; run "
                    "padded rows one at a time (or without padding) for now"
                )
            padding = attention_mask
            token_rank = attention_mask.long().cumsum(-1) - 1
            # Padding slots get a huge rank so they never count as sinks.
            token_rank = torch.where(attention_mask, token_rank, torch.iinfo(torch.long).max)
    fn = sink_window_mask_function(window, sinks, token_rank)
    b = torch.arange(batch_size, device=device)[:, None, None, None]
    h = torch.zeros(1, dtype=torch.long, device=device)[None, :, None, None]
    q = q_abs[None, None, :, None]
    kv = kv_abs[None, None, None, :]
    mask = fn(b, h, q, kv)
    if padding is not None:
        mask = mask & padding[b, kv]
    return mask.expand(batch_size, 1, q_length, kv_length)


def _plan_for_call(config, local_size: int | None, q_offset: int) -> tuple[int, int] | None:
    """(window, sinks) this mask call should use, or None for the stock causal/sliding mask."""
    plan = getattr(config, PLAN_ATTR, None) if config is not None else None
    if not plan:
        return None
    if local_size is not None and plan["native_sliding"] == "keep":
        # A layer with its own sliding window (Gemma 3 local layers, Mistral): transformers'
        # sliding mask is kv > q - w, which is exactly SWA(w, 0).
        return local_size, 0
    if plan["kind"] == "evict" and q_offset == 0:
        # evict:W:S runs dense attention over the prompt (the first forward) and windows decoding.
        return None
    return plan["window"], plan["sinks"]


def _as_int(x):
    # Keep SlotOffset (an int subclass carrying the cache layout) intact.
    return int(x.item()) if isinstance(x, torch.Tensor) else x


def sinkwindow_sdpa_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    config=None,
    device: torch.device | str = "cpu",
    **kwargs,
) -> torch.Tensor | None:
    """Mask builder registered with ``AttentionMaskInterface`` for ``sinkwindow_sdpa``: bool mask."""
    q_offset, kv_offset = _as_int(q_offset), _as_int(kv_offset)
    choice = _plan_for_call(config, local_size, q_offset)
    if choice is None:
        kv_offset = int(kv_offset)
        return sdpa_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function,
            attention_mask=attention_mask,
            local_size=local_size,
            device=device,
            **kwargs,
        )
    window, sinks = choice
    return build_sink_window_mask(
        batch_size, q_length, kv_length, q_offset, kv_offset, window, sinks, attention_mask, device
    )


def sinkwindow_eager_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable = causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    config=None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    **kwargs,
) -> torch.Tensor | None:
    """Mask builder for ``sinkwindow_eager``: additive float mask (0 / dtype min).

    Eager attention adds the mask to the scores, so a boolean mask would mask nothing (DESIGN §5).
    """
    q_offset, kv_offset = _as_int(q_offset), _as_int(kv_offset)
    choice = _plan_for_call(config, local_size, q_offset)
    if choice is None:
        kv_offset = int(kv_offset)
        kwargs.pop("allow_is_causal_skip", None)
        return eager_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function,
            attention_mask=attention_mask,
            dtype=dtype,
            device=device,
            **kwargs,
        )
    window, sinks = choice
    mask = build_sink_window_mask(
        batch_size, q_length, kv_length, q_offset, kv_offset, window, sinks, attention_mask, device
    )
    zero = torch.zeros((), device=mask.device, dtype=dtype)
    return torch.where(mask, zero, torch.finfo(dtype).min)

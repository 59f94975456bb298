"""Mask functions for SWA(w, s) and the mask builders registered with transformers.

A transformers mask function is ``(batch_idx, head_idx, q_idx, kv_idx) -> bool`` over *absolute*
positions. SWA(w, s) is one overlay composed with the stock primitives::

    causal AND (sink OR recent)      sink: kv < s      recent: kv > q - (w - s)

so query i sees key j iff ``j <= i and (j < s or j > i - (w - s))``: s sinks plus the w - s most
recent keys, itself included (docs/design.md §1).

Positions count each row's *real* tokens (``token_positions``: ``cumsum - 1`` of the padding mask, as
``generate`` computes them), so under padding the sinks are each row's first s real tokens.

Our bounded cache stores keys out of order, and tells the builders where through ``get_mask_sizes``'s
offset (a ``cache.SlotOffset``): either the contiguous layout (physical slots ``0..s-1`` hold the sinks,
slot ``p >= s`` holds ``kv_offset + p``; the identity while ``kv_offset == 0``), or per-row positions of
every slot (padded batches, the static ring buffer). With ``positions="cache"`` a chunk's queries may
also get private sink copies appended after the main slots (``SlotOffset.copies``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from transformers.masking_utils import (
    and_masks,
    causal_mask_function,
    eager_mask,
    or_masks,
    sdpa_mask,
    sliding_window_overlay,
)

from .plan import config_plan

__all__ = [
    "sink_overlay",
    "sink_window_mask_function",
    "slot_positions",
    "token_positions",
    "SlotLayout",
    "slot_layout",
    "table_map",
    "physical_mask_function",
    "build_sink_window_mask",
    "sinkwindow_sdpa_mask",
    "sinkwindow_eager_mask",
]


def sink_overlay(sinks: int) -> Callable:
    """Overlay admitting the first ``sinks`` positions (each row's first s real tokens: positions count
    real tokens only, see ``token_positions``)."""

    def inner(batch_idx, head_idx, q_idx, kv_idx):
        return kv_idx < sinks

    return inner


def sink_window_mask_function(window: int | None, sinks: int) -> Callable:
    """The SWA(w, s) mask function over positions: ``causal AND (sink OR recent)``; ``window=None``: causal."""
    if window is None:
        return causal_mask_function
    recent = sliding_window_overlay(window - sinks)  # kv > q - (w - s)
    if sinks == 0:
        return and_masks(causal_mask_function, recent)
    return and_masks(causal_mask_function, or_masks(sink_overlay(sinks), recent))


def slot_positions(
    kv_length: int, kv_offset: int, sink_slots: int, device: torch.device | str
) -> torch.Tensor:
    """Absolute position of each physical key slot of the contiguous layout.

    Args:
        sink_slots: how many leading slots hold the sinks (0 for a contiguous cache).

    Returns:
        ``(kv_length,)`` long tensor: slot p < sink_slots -> p, slot p >= sink_slots -> ``kv_offset + p``.
    """
    slots = torch.arange(kv_length, device=device)
    if kv_offset == 0 or sink_slots == 0:
        return slots + kv_offset
    return torch.where(slots < sink_slots, slots, slots + kv_offset)


def token_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[batch, columns]`` position of each column among its row's real tokens; -1 for padding.

    The same positions transformers' ``generate`` gives left-padded rows (``cumsum - 1``).
    """
    mask = attention_mask.to(torch.bool)
    return (mask.long().cumsum(-1) - 1).masked_fill(~mask, -1)


def _positions(
    q_length: int,
    kv_length: int,
    q_offset: int,
    kv_offset: int,
    attention_mask: torch.Tensor | None,
    sinks: int,
    window: int | None,
    device,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Positions of the queries ``[batch|1, q]`` and main key slots ``[batch|1, n_main]``, plus sink copies."""
    layout_sinks = getattr(kv_offset, "sinks", None)
    copies = getattr(kv_offset, "copies", 0)
    copy_sinks = layout_sinks if copies else 0
    n_main = kv_length - copies * copy_sinks
    kv_pos = getattr(kv_offset, "kv_pos", None)
    if kv_pos is not None:
        # Our cache's per-row layout (padding, static ring buffer).
        q_pos = kv_offset.q_pos.to(device)
        return q_pos, kv_pos.to(device), copies, copy_sinks
    padded = attention_mask is not None and not bool(attention_mask.all())
    if layout_sinks is not None:
        if padded:
            raise ValueError(
                "padding reached the mask but not the cache: call the patched model itself (its forward pre-hook "
                "hands the attention_mask to the sinkwindow cache), not its inner decoder"
            )
        q_pos = (torch.arange(q_length, device=device) + q_offset)[None]
        return q_pos, slot_positions(n_main, int(kv_offset), layout_sinks, device)[None], copies, copy_sinks
    # A stock transformers cache (contiguous) or no cache. Once it has dropped keys it no longer holds
    # the sinks, nor necessarily the whole window.
    if kv_offset > 0 and window is not None and (sinks > 0 or kv_length - q_length + 1 < window):
        raise ValueError(
            "this cache has already evicted keys that SWA(w, s) still needs (a stock transformers "
            "sliding-window cache?): pass cache=sinkwindow.make_cache(model) to forward()/generate()"
        )
    if padded:
        total = kv_offset + kv_length
        if attention_mask.shape[-1] < total:  # a preallocated cache: unwritten slots count as padding
            attention_mask = torch.nn.functional.pad(attention_mask, (0, total - attention_mask.shape[-1]))
        pos = token_positions(attention_mask.to(device))
        return pos[:, q_offset : q_offset + q_length], pos[:, kv_offset:total], 0, 0
    q_pos = (torch.arange(q_length, device=device) + q_offset)[None]
    return q_pos, (torch.arange(kv_length, device=device) + kv_offset)[None], 0, 0


class SlotLayout(NamedTuple):
    """Where every query and key slot of one attention call sits, as positions.

    What both mask paths read (the boolean SDPA/eager mask here, the FlexAttention BlockMask in
    ``flex``), so they apply one rule to the same positions.

    Attributes:
        q_pos: ``[batch or 1, q_length]`` position of each query among its row's real tokens (-1: padding).
        kv_pos: ``[batch or 1, kv_length]`` position of each main key slot (-1: padding or empty); for
            the sink copies after the main slots (cache position mode), the sink index j of the copy.
        owner: ``[kv_length]`` -1 for main slots, t for the copies that belong to query t; ``None``
            when the call has no copies.
        copy_sinks: sinks per query copy block (0 without copies).
    """

    q_pos: torch.Tensor
    kv_pos: torch.Tensor
    owner: torch.Tensor | None
    copy_sinks: int


def slot_layout(
    q_length: int,
    kv_length: int,
    q_offset: int,
    kv_offset: int,
    window: int | None,
    sinks: int,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> SlotLayout:
    """The ``SlotLayout`` of one call; arguments as ``build_sink_window_mask``'s."""
    q_pos, kv_pos, copies, copy_sinks = _positions(
        q_length, kv_length, q_offset, kv_offset, attention_mask, sinks, window, device
    )
    batch = max(q_pos.shape[0], kv_pos.shape[0])
    q_pos, kv_pos = q_pos.expand(batch, -1), kv_pos.expand(batch, -1)
    if not copies:
        return SlotLayout(q_pos, kv_pos, None, 0)
    # Copy block t holds sinks 0..s-1 for query t: its slots carry the sink's own position j.
    j = torch.arange(copy_sinks, device=device).repeat(copies)
    kv_pos = torch.cat([kv_pos, j[None].expand(batch, -1)], dim=1)
    n_main = kv_length - copies * copy_sinks
    owner = torch.cat(
        [
            torch.full((n_main,), -1, dtype=torch.long, device=device),
            torch.arange(copies, device=device).repeat_interleave(copy_sinks),
        ]
    )
    return SlotLayout(q_pos, kv_pos, owner, copy_sinks)


def table_map(table: torch.Tensor) -> Callable:
    """``(batch_idx, idx) -> position`` read from a ``[batch or 1, n]`` table (batch 1: every row)."""
    per_row = table.shape[0] > 1

    def lookup(batch_idx, idx):
        return table[batch_idx if per_row else 0, idx]

    return lookup


def physical_mask_function(
    fn: Callable,
    q_map: Callable,
    kv_map: Callable,
    owner_map: Callable | None = None,
    copy_sinks: int = 0,
) -> Callable:
    """A mask function over physical ``(batch, head, query index, key slot)`` from one over positions.

    Maps each index to its position (``q_map``/``kv_map``: ``(batch_idx, idx) -> position``, e.g.
    ``table_map`` of a ``SlotLayout``) and applies ``fn`` there. Padding and empty slots (position -1)
    are never seen and padding queries see nothing. With sink copies (``owner_map``: slot -> the
    query owning it, -1 for main slots), main slots holding a sink are hidden and query t sees the
    sinks only through its own copies, where ``fn`` over the sink's position j admits exactly the
    sinks that exist by then (``j <= i``).

    Works on broadcast index grids (the boolean mask) and on the scalar indices FlexAttention
    passes a ``mask_mod``.
    """

    def inner(batch_idx, head_idx, q_idx, kv_idx):
        q = q_map(batch_idx, q_idx)
        kv = kv_map(batch_idx, kv_idx)
        ok = fn(batch_idx, head_idx, q, kv) & (kv >= 0) & (q >= 0)
        if owner_map is None:
            return ok
        owner = owner_map(kv_idx)
        return ok & torch.where(owner < 0, kv >= copy_sinks, owner == q_idx)

    return inner


def build_sink_window_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int,
    kv_offset: int,
    window: int | None,
    sinks: int,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Boolean SWA(w, s) mask over the physical key slots.

    Positions count each row's real tokens only, so under padding the sinks are each row's first s real
    tokens and padding is never attended.

    Args:
        q_offset: column of the first query.
        kv_offset: the cache's reported offset: a ``cache.SlotOffset`` (our layouts, see
            ``cache.SinkWindowLayer``) or a plain int (a stock contiguous cache, or none).
        window: w, or ``None`` for plain causal attention over positions (evict's dense prompt).
        attention_mask: optional 2D padding mask ``(batch, columns)`` (1 = real token), used when the
            offset does not already carry per-row positions.

    Returns:
        ``(batch, 1, q_length, kv_length)`` bool, True where the query attends the key.
    """
    layout = slot_layout(q_length, kv_length, q_offset, kv_offset, window, sinks, attention_mask, device)
    owner = layout.owner
    mask_fn = physical_mask_function(
        sink_window_mask_function(window, sinks),
        table_map(layout.q_pos),
        table_map(layout.kv_pos),
        None if owner is None else (lambda kv_idx: owner[kv_idx]),
        layout.copy_sinks,
    )
    rows = layout.q_pos.shape[0]
    b = torch.arange(rows, device=device)[:, None, None, None]
    h = torch.zeros(1, dtype=torch.long, device=device)[None, :, None, None]
    q_idx = torch.arange(q_length, device=device)[None, None, :, None]
    kv_idx = torch.arange(kv_length, device=device)[None, None, None, :]
    mask = mask_fn(b, h, q_idx, kv_idx)
    return mask.expand(batch_size, 1, q_length, kv_length)


DENSE = "dense"


def _plan_for_call(config, local_size: int | None, q_offset: int) -> tuple[int, int] | str | None:
    """(window, sinks) this mask call should use, ``DENSE`` for causal-only, or None for the stock mask."""
    plan = config_plan(config)
    if plan is None:
        return None
    if local_size is not None and plan.native_sliding == "keep":
        # A layer with its own sliding window (Gemma 3 local layers, Mistral): transformers'
        # sliding mask is kv > q - w, which is exactly SWA(w, 0).
        return local_size, 0
    if plan.spec.dense_prompt and q_offset == 0:
        # evict:W:S runs the model as it is over the prompt (the first forward: dense, or a native
        # layer's own window) and windows decoding.
        return (local_size, 0) if local_size is not None else DENSE
    return plan.window, plan.sinks


def _as_int(x):
    # Keep SlotOffset (an int subclass carrying the cache layout) intact.
    return int(x.item()) if isinstance(x, torch.Tensor) else x


def route_mask_call(
    config, local_size, q_offset, kv_offset
) -> tuple[int, int, tuple[int | None, int] | None]:
    """Shared by both builders: ``(q_offset, kv_offset, (window, sinks) or None)``.

    ``None`` hands the call back to transformers' own builder (no plan, or a dense layer over a
    plain cache); ``window=None`` is dense attention over a cache with a slot layout.
    """
    q_offset, kv_offset = _as_int(q_offset), _as_int(kv_offset)
    choice = _plan_for_call(config, local_size, q_offset)
    if choice is None or (choice == DENSE and getattr(kv_offset, "kv_pos", None) is None):
        return q_offset, int(kv_offset), None
    return q_offset, kv_offset, ((None, 0) if choice == DENSE else choice)


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
    q_offset, kv_offset, window_sinks = route_mask_call(config, local_size, q_offset, kv_offset)
    if window_sinks is None:
        return sdpa_mask(
            batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
            kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
            local_size=local_size, device=device, **kwargs,
        )  # fmt: skip
    return build_sink_window_mask(
        batch_size, q_length, kv_length, q_offset, kv_offset, *window_sinks, attention_mask, device
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

    Eager attention adds the mask to the scores, so a boolean mask would mask nothing (docs/design.md §3.1).
    """
    q_offset, kv_offset, window_sinks = route_mask_call(config, local_size, q_offset, kv_offset)
    if window_sinks is None:
        kwargs.pop("allow_is_causal_skip", None)
        return eager_mask(
            batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
            kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
            dtype=dtype, device=device, **kwargs,
        )  # fmt: skip
    mask = build_sink_window_mask(
        batch_size, q_length, kv_length, q_offset, kv_offset, *window_sinks, attention_mask, device
    )
    zero = torch.zeros((), device=mask.device, dtype=dtype)
    return torch.where(mask, zero, torch.finfo(dtype).min)

"""Hybrid specs: SWA(w, s) everywhere except named layers or KV heads, which keep full attention.

``swa:256:4+full:3,11`` keeps layers 3 and 11 dense; ``swa:256:4+full:11.2`` keeps KV head 2 of
layer 11 dense (and the query heads that share it, GQA), the layer's other heads windowed.

transformers builds one attention mask per forward for all layers of a type, so the mask that
reaches the attention functions is the SWA(w, s) one (``SinkWindowCache.get_mask_sizes`` sizes it
against a windowed layer). A unit that keeps full attention gets its own mask here, inside the
attention function: plain causal attention over the keys its cache layer holds
(``cache.FullAttentionLayer``: every column, in order), with the same per-row positions under
padding, built by the same ``masks.build_sink_window_mask`` with no window. The full mask is built
once per forward and shared by every full unit.

A layer with some full heads (``cache.HybridHeadLayer``) hands attention both stores side by side,
``[SWA slots | full slots]``; each query head sees its own half only: the SWA mask over the first,
the full mask over the second. Its cache holds full-length keys for those heads only.

How the attention function reaches the live cache: the model's forward pre-hook (``patch``) points a
``LiveStep`` shared with every hybrid attention module at the cache of the running forward; the
attention modules carry a ``HybridUnit`` (set by ``install``, removed by ``remove``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .cache import FullAttentionLayer, HybridHeadLayer, SinkWindowCache, SlotOffset
from .masks import build_sink_window_mask

__all__ = ["HybridUnit", "LiveStep", "UNIT_ATTR", "install", "remove", "unit_of", "attention", "full_mask"]

UNIT_ATTR = "_sinkwindow_hybrid"


def _no_cache() -> None:
    return None


@dataclass
class LiveStep:
    """The cache of the forward now running (a weak reference), shared by a model's hybrid units."""

    cache: Callable[[], SinkWindowCache | None] = _no_cache

    def set(self, cache: SinkWindowCache | None) -> None:
        self.cache = weakref.ref(cache) if cache is not None else _no_cache

    def __getstate__(self) -> dict:
        # A copy or a pickle is made between forwards (the step lives only inside one), and neither a
        # weak reference nor a lambda pickles.
        return {"cache": _no_cache}


@dataclass
class HybridUnit:
    """What one attention module of a hybrid runs.

    Attributes:
        layer_idx: the decoder layer.
        full_heads: KV heads with full attention (all of them: a full layer).
        kv_heads: KV heads of the layer.
        live: the model's ``LiveStep``.
    """

    layer_idx: int
    full_heads: tuple[int, ...]
    kv_heads: int
    live: LiveStep

    @property
    def whole_layer(self) -> bool:
        return len(self.full_heads) >= self.kv_heads


def install(
    attention_modules: list[torch.nn.Module], full_kv_heads: list[tuple[int, ...]], kv_heads: int
) -> LiveStep:
    """Mark the attention modules (one per decoder layer, in order) that keep some full attention."""
    live = LiveStep()
    for idx, (module, heads) in enumerate(zip(attention_modules, full_kv_heads)):
        if heads:
            setattr(module, UNIT_ATTR, HybridUnit(idx, tuple(heads), kv_heads, live))
        elif hasattr(module, UNIT_ATTR):
            delattr(module, UNIT_ATTR)
    return live


def remove(model: torch.nn.Module) -> None:
    for module in model.modules():
        if UNIT_ATTR in vars(module):
            delattr(module, UNIT_ATTR)


def unit_of(module: torch.nn.Module) -> HybridUnit | None:
    return vars(module).get(UNIT_ATTR)


def full_mask(layer: FullAttentionLayer, cache: SinkWindowCache, q_length: int, device) -> torch.Tensor:
    """Causal mask of a full-attention store right after its ``update``.

    Returns:
        ``[batch, 1, q_length, n]`` bool over the ``n`` keys the layer holds (all columns so far), the
        last ``q_length`` of which are this forward's queries.
    """
    plan = cache.plan
    n = layer.n_persisted
    memo = cache.full_masks
    key = (n, q_length, str(device))
    if key in memo:
        return memo[key]
    if plan is not None and plan.q_pos is not None:
        kv_pos = layer._real_positions(device).to(device)
        q_pos = plan.q_pos.to(device)
        batch = max(kv_pos.shape[0], q_pos.shape[0])
        offset = SlotOffset(0, 0, kv_pos=kv_pos.expand(batch, -1), q_pos=q_pos.expand(batch, -1))
    else:
        batch, offset = 1, SlotOffset(0, 0)
    mask = build_sink_window_mask(batch, q_length, n, n - q_length, offset, None, 0, None, device)
    memo[key] = mask
    return mask


def _as_bool(mask) -> torch.Tensor | None:
    """The SWA mask the builder made, as bool (eager builders make additive float masks)."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    return mask == 0


def attention(
    module: torch.nn.Module,
    unit: HybridUnit,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask,
    run: Callable,
    additive: bool,
    **kwargs,
):
    """Attention of a unit with full attention: ``run`` (the SDPA or eager function) with this unit's mask.

    Args:
        query: ``[batch, heads, q, head_dim]``; key, value: ``[batch, kv_heads, n, head_dim]`` (for a
            layer with some full heads, ``n = n_swa + n_full``: both stores side by side).
        attention_mask: the SWA(w, s) mask the builder made for the windowed layers.
        run: ``(module, query, key, value, mask, **kwargs) -> (out, weights)``.
        additive: ``run`` wants an additive float mask (eager) rather than a bool one (SDPA).
    """
    cache = unit.live.cache()
    if cache is None or cache.plan is None:
        raise RuntimeError(
            "a hybrid spec's full layers need the step planned on their cache: call the patched model itself "
            "(or sinkwindow.generate / prefill), not its inner decoder"
        )
    layer = cache.layers[unit.layer_idx]
    q_length = query.shape[-2]
    if isinstance(layer, HybridHeadLayer):
        full = full_mask(layer.full, cache, q_length, query.device)
        swa = _as_bool(attention_mask)
        n_swa = key.shape[-2] - full.shape[-1]
        if swa is None or swa.shape[-1] != n_swa:
            raise RuntimeError(f"hybrid layer {unit.layer_idx}: the SWA mask does not match the cache layout")
        heads = query.shape[1]
        groups = heads // unit.kv_heads
        is_full = torch.zeros(unit.kv_heads, dtype=torch.bool, device=query.device)
        is_full[list(unit.full_heads)] = True
        is_full = is_full.repeat_interleave(groups)[
            None, :, None, None
        ]  # query head h -> KV head h // groups
        batch = max(swa.shape[0], full.shape[0])
        mask = torch.cat(
            [
                (swa & ~is_full).expand(batch, heads, q_length, n_swa),
                (full & is_full).expand(batch, heads, q_length, full.shape[-1]),
            ],
            dim=-1,
        )
    else:
        mask = full_mask(layer, cache, q_length, query.device)
    if mask.shape[-1] != key.shape[-2]:
        # A full store must hold every key it returned; anything else is a cache that evicted.
        raise RuntimeError(
            f"hybrid layer {unit.layer_idx}: its full-attention store holds {mask.shape[-1]} keys after the "
            f"update but attention got {key.shape[-2]}: the cache evicted keys of a full layer"
        )
    if additive:
        zero = torch.zeros((), dtype=query.dtype, device=query.device)
        mask = torch.where(mask, zero, torch.finfo(query.dtype).min)
    return run(module, query, key, value, mask, **kwargs)

"""Bounded KV caches for SWA(w, s): sinks plus the most recent keys, never more than w per layer.

Two layouts of one layer's persisted keys/values (``[batch, kv_heads, n, head_dim]``):

- **contiguous** (an unpadded batch, the fast path)::

      slot:      0 .. s-1   |  s .. n-1
      absolute:  0 .. s-1   |  start_recent .. cumulative-1

  Before the first eviction the layout is simply absolute ``0..cumulative-1``; the mask builder maps
  slots back to positions from ``get_mask_sizes``'s offset (a ``SlotOffset``).
- **per-row positions** (once a batch has padding): ``positions[b, slot]`` is the position of the key
  among row b's *real* tokens (-1: padding or empty). Eviction gathers, per row, the keys at positions
  ``< s`` (that row's first s real tokens: its sinks) and the last ``w - s - 1`` real positions, so
  every row keeps exactly its own sinks + recent keys whatever its padding.

After every ``update`` a layer keeps the s sinks and the last ``w - s - 1`` keys: exactly what the next
query (which sees itself as the w-th key) needs. ``update`` returns sinks + recent + the incoming chunk,
so every query of a chunk sees what SWA(w, s) allows it.

**Position modes.** With ``positions="absolute"`` (the paper) keys are cached as the model rotated them.
With ``positions="cache"`` (StreamingLLM) a query at stream position i sits at cache position
``min(i, w - 1)``, its sinks at ``0..s-1`` and its recent keys right below it, so no position ever passes
``w - 1 + chunk``: keys are stored un-rotated and rotated for each forward (``rope.LayerRope``). A query
of a multi-token chunk that is past the window needs its sinks at its *own* distance; those queries get
private copies of the sinks appended after the chunk (``SlotOffset.copies``), which keeps chunked
prefill exactly equal to token-by-token decoding.

**Who plans a step.** Positions and padding are decided once per forward by ``SinkWindowCache.begin_step``
(called by the forward pre-hook ``sinkwindow.apply`` installs, or by ``sinkwindow.generate``); every layer
reads the same ``StepPlan``.

``static_cache.StaticSinkWindowLayer`` is the ring-buffer variant for ``torch.compile``: preallocated
``[batch, heads, w, head_dim]`` buffers written in place, one decode step being a fixed-shape scatter.
It plugs in through the layer hooks (``end_step``, ``load_state``), so this module never asks which
kind of layer it holds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .masks import slot_positions
from .rope import LayerRope
from .spec import MAX_WINDOW

__all__ = [
    "SinkWindowLayer",
    "FullAttentionLayer",
    "HybridHeadLayer",
    "SinkWindowCache",
    "SlotOffset",
    "StepPlan",
    "cache_lengths",
    "cache_nbytes",
]


class SlotOffset(int):
    """A ``kv_offset`` that carries our cache's layout to the mask builder.

    transformers passes ``get_mask_sizes``'s offset through to the mask builder untouched, so the
    builder can tell our layout from a stock contiguous cache (whose offset is a plain int).

    Attributes:
        sinks: the layer's s; in the contiguous layout slots below it are the sinks.
        kv_pos: ``[batch or 1, n_main]`` position of each key slot among its row's real tokens (-1:
            padding/empty), or ``None`` for the contiguous layout (slot p -> p or offset + p).
        q_pos: ``[batch or 1, q]`` position of each query (-1: padding), or ``None`` (contiguous).
        copies: how many queries have private sink copies appended after the main slots (cache
            position mode); the key length is then ``n_main + copies * sinks``.
    """

    def __new__(
        cls,
        value: int,
        sinks: int,
        kv_pos: torch.Tensor | None = None,
        q_pos: torch.Tensor | None = None,
        copies: int = 0,
    ):
        obj = super().__new__(cls, value)
        obj.sinks = sinks
        obj.kv_pos = kv_pos
        obj.q_pos = q_pos
        obj.copies = copies
        return obj


@dataclass
class StepPlan:
    """How one forward of ``q_len`` new columns maps onto positions (shared by every layer).

    Attributes:
        start: columns (tokens, padding included) seen before this forward.
        q_len: columns in this forward.
        q_pos: ``[batch, q_len]`` position of each new column among its row's real tokens (-1 for
            padding); ``None`` for an unpadded batch (positions ``start + arange(q_len)``).
        next_pos: ``[batch]`` real tokens per row after this forward (the next query's position).
        model_pos: ``[batch or 1, q_len]`` the ``position_ids`` the model must use, or ``None`` to leave
            the model's default (absolute, unpadded).
        shift: ``[batch or 1]`` cache mode: real position minus cache position of every non-sink key.
        copy_shift: ``[batch or 1, q_len]`` cache mode: per query, how far past their home positions
            its private sink copies are rotated; ``None`` when no query needs copies.
        dense: evict's dense prompt forward (no window, no copies).
        all_real: no padding in this forward.
    """

    start: int
    q_len: int
    q_pos: torch.Tensor | None = None
    next_pos: torch.Tensor | None = None
    model_pos: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    copy_shift: torch.Tensor | None = None
    dense: bool = False
    all_real: bool = True


class SinkWindowLayer(DynamicLayer):
    """One layer's bounded cache for SWA(``window``, ``sinks``).

    Args:
        window: w, keys a query sees (sinks and itself included).
        sinks: s, leading real tokens kept forever.
        is_sliding: set for layers that keep a model's native sliding window, so transformers'
            mask code sizes the sliding mask against this layer rather than a global one.
        rope: the layer's RoPE when positions are re-assigned inside the cache (``positions="cache"``);
            keys are then stored un-rotated.
    """

    is_croppable = False

    def __init__(self, window: int, sinks: int, is_sliding: bool = False, rope: LayerRope | None = None):
        super().__init__()
        if window <= 0 or sinks < 0 or sinks >= window:
            raise ValueError(f"need 0 <= sinks < window, got window={window}, sinks={sinks}")
        self.window = window
        self.sinks = sinks
        self.is_sliding = is_sliding
        self.rope = rope
        self.cumulative_length = 0
        # [batch, n] real position of each slot once the batch had padding; None: contiguous layout.
        self.positions: torch.Tensor | None = None
        self._cache: SinkWindowCache | None = None

    @property
    def max_persisted(self) -> int:
        """Most entries kept between forwards: s sinks + (w - s - 1) recent = w - 1."""
        return self.window - 1

    @property
    def n_persisted(self) -> int:
        return self.keys.shape[-2] if self.is_initialized else 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        # 4-D empties (not DynamicLayer's 1-D ones) so shapes and positions line up from the start.
        self.device = key_states.device
        b, h, _, dk = key_states.shape
        self.keys = key_states.new_empty((b, h, 0, dk))
        self.values = value_states.new_empty((b, h, 0, value_states.shape[-1]))
        self.is_initialized = True

    def _plan(self, q_len: int) -> StepPlan:
        cache = self._cache
        plan = cache.plan if cache is not None else None
        if plan is not None and plan.start == self.cumulative_length and plan.q_len == q_len:
            return plan
        if cache is None:
            return StepPlan(self.cumulative_length, q_len)
        # No pre-hook ran (the inner decoder called directly): plan an unpadded continuation.
        return cache.begin_step(q_len, implicit=True, start=self.cumulative_length)

    def _real_positions(self, device=None) -> torch.Tensor:
        """``[batch or 1, n_persisted]`` real position of each persisted slot."""
        if self.positions is not None:
            return self.positions
        n = self.n_persisted
        dev = self.keys.device if self.is_initialized else device
        return slot_positions(n, self.cumulative_length - n, self.sinks, dev)[None]

    def _rotation(self, plan: StepPlan, real: torch.Tensor) -> torch.Tensor:
        """Cache position of keys at real positions ``real``: sinks stay home, the rest move down by shift."""
        return torch.where(real < self.sinks, real, real - plan.shift.to(real.device)[:, None])

    def _sink_copies(
        self, keys_pre: torch.Tensor, values: torch.Tensor, positions: torch.Tensor | None, plan: StepPlan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-query sink copies for a chunk in cache mode.

        Args:
            keys_pre, values: ``[batch, heads, N, dim]`` every key this forward sees, un-rotated.
            positions: ``[batch, N]`` their real positions, or ``None`` (contiguous: sinks are slots 0..s-1).

        Returns:
            ``[batch, heads, q_len * s, dim]``: block t holds the sinks rotated to ``j + copy_shift[t]``.
        """
        s, q = self.sinks, plan.q_len
        b, h, n, dk = keys_pre.shape
        dv = values.shape[-1]
        if positions is None:
            idx = torch.arange(s, device=keys_pre.device).clamp(max=n - 1)
            sk, sv = keys_pre[:, :, idx], values[:, :, idx]
        else:
            hit = positions[:, :, None] == torch.arange(s, device=positions.device)  # [B, N, s]
            idx = hit.int().argmax(1)  # missing sinks point at slot 0; the mask hides them (causality)
            sk = keys_pre.gather(2, idx[:, None, :, None].expand(b, h, s, dk))
            sv = values.gather(2, idx[:, None, :, None].expand(b, h, s, dv))
        shift = plan.copy_shift.to(keys_pre.device)
        pos = (torch.arange(s, device=keys_pre.device)[None, None, :] + shift[:, :, None]).reshape(
            shift.shape[0], q * s
        )
        sk = sk[:, :, None].expand(b, h, q, s, dk).reshape(b, h, q * s, dk)
        sv = sv[:, :, None].expand(b, h, q, s, dv).reshape(b, h, q * s, dv)
        return self.rope.rotate(sk, pos), sv

    def _wants_copies(self, plan: StepPlan) -> bool:
        return plan.copy_shift is not None and self.sinks > 0 and self.rope is not None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a chunk, return what its queries may see, then evict.

        Args:
            key_states, value_states: ``[batch, kv_heads, chunk, head_dim]`` (keys rotated by the model).

        Returns:
            keys, values ``[batch, kv_heads, n_persisted + chunk (+ chunk * s sink copies), head_dim]``.
        """
        c = key_states.shape[-2]
        plan = self._plan(c)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if plan.q_pos is not None and self.positions is None:
            self.positions = self._real_positions().expand(key_states.shape[0], -1).clone()
        if self.rope is None:
            full_keys = torch.cat([self.keys, key_states], dim=-2)
            out_keys = full_keys
        else:
            stored = self.rope.unrotate(key_states, plan.model_pos)
            past = self.keys
            if past.shape[-2]:
                past = self.rope.rotate(past, self._rotation(plan, self._real_positions()))
            out_keys = torch.cat([past, key_states], dim=-2)  # the chunk exactly as the model rotated it
            full_keys = torch.cat([self.keys, stored], dim=-2)
        full_values = torch.cat([self.values, value_states], dim=-2)
        out_values = full_values
        full_pos = (
            None
            if self.positions is None
            # The plan lives on the input device; a layer of a dispatched model may sit on another.
            else torch.cat([self.positions, plan.q_pos.to(self.positions.device)], dim=1)
        )
        if self._wants_copies(plan):
            ck, cv = self._sink_copies(full_keys, full_values, full_pos, plan)
            out_keys = torch.cat([out_keys, ck], dim=-2)
            out_values = torch.cat([out_values, cv], dim=-2)
        self.cumulative_length += c
        if full_pos is None:
            self.keys, self.values = self._evict(full_keys), self._evict(full_values)
        else:
            self._evict_rows(full_keys, full_values, full_pos, plan.next_pos)
        return out_keys, out_values

    def _evict(self, states: torch.Tensor) -> torch.Tensor:
        n = states.shape[-2]
        if n <= self.max_persisted:
            return states
        recent = self.max_persisted - self.sinks
        # Clone so the persisted slice does not pin the whole (sinks + recent + chunk) buffer.
        if self.sinks == 0:
            return states[..., n - recent :, :].clone()
        return torch.cat([states[..., : self.sinks, :], states[..., n - recent :, :]], dim=-2)

    def _evict_rows(
        self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, next_pos: torch.Tensor
    ) -> None:
        """Per-row eviction: keep each row's sinks and its last w - s - 1 real positions."""
        n = positions.shape[1]
        if n <= self.max_persisted:
            self.keys, self.values, self.positions = keys, values, positions
            return
        lo = (next_pos.to(positions.device) - (self.window - self.sinks) + 1).clamp(min=self.sinks)
        keep = (positions >= 0) & ((positions < self.sinks) | (positions >= lo[:, None]))
        k = self.max_persisted
        # Kept slots first, in slot order; a row keeping fewer than k fills up with slots marked empty.
        order = torch.argsort((~keep).int(), dim=1, stable=True)[:, :k]
        kept = keep.gather(1, order)
        self.positions = torch.where(kept, positions.gather(1, order), -1)
        b, h, _, dk = keys.shape
        self.keys = keys.gather(2, order[:, None, :, None].expand(b, h, k, dk))
        self.values = values.gather(2, order[:, None, :, None].expand(b, h, k, values.shape[-1]))

    def end_step(self, plan: StepPlan) -> None:
        """Hook run after every planned forward (``SinkWindowCache.end_step``); nothing to do here."""

    def load_state(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor | None) -> None:
        """Take saved tensors back (``SinkWindowCache.load_state_dict``); the dynamic layer rebinds them."""
        self.lazy_initialization(keys, values)
        self.keys, self.values, self.positions = keys, values, positions

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)``; the offset is a ``SlotOffset`` describing the slot layout."""
        plan = self._plan(query_length)
        n = self.n_persisted
        copies = query_length if self._wants_copies(plan) else 0
        kv_length = n + query_length + copies * self.sinks
        offset = self.cumulative_length - n
        if self.positions is None and plan.q_pos is None:
            return kv_length, SlotOffset(offset, self.sinks, copies=copies)
        q_pos = plan.q_pos
        past = self._real_positions(q_pos.device).to(q_pos.device).expand(q_pos.shape[0], -1)
        kv_pos = torch.cat([past, q_pos], dim=1)
        return kv_length, SlotOffset(offset, self.sinks, kv_pos=kv_pos, q_pos=q_pos, copies=copies)

    def get_seq_length(self) -> int:
        """Columns seen so far (not stored): keeps ``position_ids`` absolute."""
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
        self.positions = None

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Beam search: reorder rows (keys, values and their positions)."""
        if self.is_initialized:
            idx = beam_idx.to(self.keys.device)
            self.keys = self.keys.index_select(0, idx)
            self.values = self.values.index_select(0, idx)
            if self.positions is not None:
                self.positions = self.positions.index_select(0, idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.keys = self.keys.repeat_interleave(repeats, dim=0)
            self.values = self.values.repeat_interleave(repeats, dim=0)
            if self.positions is not None:
                self.positions = self.positions.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self.keys = self.keys[indices, ...]
            self.values = self.values[indices, ...]
            if self.positions is not None:
                self.positions = self.positions[indices, ...]


class FullAttentionLayer(SinkWindowLayer):
    """A layer of a hybrid spec that keeps full attention: every key, in column order, never evicted.

    It is a ``SinkWindowLayer`` whose window no context reaches, so it shares the step plan, the
    per-row positions under padding and the slot bookkeeping of its SWA neighbours.
    """

    def __init__(self):
        super().__init__(MAX_WINDOW, 0)

    def get_max_length(self) -> int:
        return -1  # transformers' "grows with the context"


class HybridHeadLayer(SinkWindowLayer):
    """A layer whose KV heads ``full_heads`` keep full attention while the others run SWA(w, s).

    The SWA heads live in this layer's own bounded store (at most w - 1 entries); the full heads in
    ``self.full``, a ``FullAttentionLayer`` that holds every key but only for those heads. So the memory
    is ``(kv_heads - f) * (w - 1) + f * n`` entries, not ``kv_heads * n``.

    ``update`` returns both stores side by side along the key axis, each zero for the other's heads::

        keys[:, swa_heads, :n_swa]   = the SWA store (+ chunk)     keys[:, swa_heads, n_swa:]  = 0
        keys[:, full_heads, n_swa:]  = the full store (+ chunk)    keys[:, full_heads, :n_swa] = 0

    and the attention function (``full_units.attention``) masks each head to its own half.

    Args:
        window, sinks: the SWA heads' w and s.
        full_heads: KV head indices that keep full attention (a proper, non-empty subset).
        kv_heads: KV heads of the layer.
    """

    def __init__(self, window: int, sinks: int, full_heads: tuple[int, ...], kv_heads: int):
        super().__init__(window, sinks)
        if not full_heads or len(full_heads) >= kv_heads or max(full_heads) >= kv_heads:
            raise ValueError(f"full_heads must be a proper subset of range({kv_heads}), got {full_heads}")
        self.kv_heads = kv_heads
        self.full_heads = tuple(sorted(full_heads))
        self.swa_heads = tuple(h for h in range(kv_heads) if h not in self.full_heads)
        self.full = FullAttentionLayer()
        self._head_indices: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Update both stores; ``key_states [batch, kv_heads, chunk, head_dim]`` -> keys ``[batch, kv_heads, n_swa + n_full, head_dim]``."""
        swa, full = self._head_index(key_states.device)
        ks, vs = super().update(key_states.index_select(1, swa), value_states.index_select(1, swa))
        kf, vf = self.full.update(key_states.index_select(1, full), value_states.index_select(1, full))
        return self._side_by_side(ks, kf, swa, full), self._side_by_side(vs, vf, swa, full)

    def _head_index(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The SWA and full KV-head indices on ``device``, made once (``update`` runs every step).

        Kept in a dict so ``cache_nbytes`` (which counts tensor attributes) does not count them.
        """
        key = str(device)
        if key not in self._head_indices:
            self._head_indices[key] = (
                torch.tensor(self.swa_heads, device=device),
                torch.tensor(self.full_heads, device=device),
            )
        return self._head_indices[key]

    def _side_by_side(self, part_s, part_f, swa, full) -> torch.Tensor:
        b, _, n_s, d = part_s.shape
        out = part_s.new_zeros((b, self.kv_heads, n_s + part_f.shape[-2], d))
        out[:, swa, :n_s] = part_s
        out[:, full, n_s:] = part_f
        return out

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        super().reset()
        self.full.reset()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        self.full.reorder_cache(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self.full.batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self.full.batch_select_indices(indices)


class SinkWindowCache(Cache):
    """A transformers ``Cache`` made of ``SinkWindowLayer``s (one per decoder layer).

    Args:
        layer_windows: per layer ``(window, sinks, is_sliding)``.
        positions: ``"absolute"`` (keys cached as rotated) or ``"cache"`` (positions re-assigned inside
            the cache; needs ``ropes``).
        ropes: per layer ``LayerRope`` (cache mode).
        window, sinks: the spec's w and s, which set cache positions (default: the first non-sliding layer's).
        kind: ``"swa"`` or ``"evict"`` (whose first forward is dense).
        full_kv_heads: per layer, the KV heads that keep full attention (a hybrid spec): all of them
            make a ``FullAttentionLayer``, some a ``HybridHeadLayer``, none the usual bounded layer.
        kv_heads: KV heads per layer (needed with ``full_kv_heads``).
    """

    layer_class: type[SinkWindowLayer] = SinkWindowLayer

    def __init__(
        self,
        layer_windows: list[tuple[int, int, bool]],
        *,
        positions: str = "absolute",
        ropes: list[LayerRope] | None = None,
        window: int | None = None,
        sinks: int | None = None,
        kind: str = "swa",
        full_kv_heads: list[tuple[int, ...]] | None = None,
        kv_heads: int | None = None,
    ):
        if positions not in ("absolute", "cache"):
            raise ValueError(f"positions must be 'absolute' or 'cache', got {positions!r}")
        if positions == "cache" and (ropes is None or len(ropes) != len(layer_windows)):
            raise ValueError(
                "positions='cache' needs one LayerRope per layer (sinkwindow.make_cache builds them)"
            )
        full_kv_heads = full_kv_heads or [()] * len(layer_windows)
        if any(full_kv_heads) and (positions != "absolute" or kind != "swa" or kv_heads is None):
            raise ValueError("full-attention units need kind='swa', absolute positions and kv_heads")
        layers = []
        for i, (w, s, sl) in enumerate(layer_windows):
            heads = tuple(full_kv_heads[i])
            if heads and len(heads) >= kv_heads:
                layers.append(FullAttentionLayer())
            elif heads:
                layers.append(HybridHeadLayer(w, s, heads, kv_heads))
            else:
                layers.append(
                    self.layer_class(w, s, is_sliding=sl, rope=ropes[i] if positions == "cache" else None)
                )
        super().__init__(layers=layers)
        for layer in layers:
            layer._cache = self
            if isinstance(layer, HybridHeadLayer):
                layer.full._cache = self
        # transformers sizes the (one) full-attention mask against the first non-sliding layer; for a
        # hybrid that must be a windowed layer, since the full layers build their own (full_units.py). It
        # must be a *global* windowed layer where there is one: under native_sliding="keep" (Gemma 3)
        # the first windowed layer is a native local one, whose longer window would size the mask
        # that the windowed globals get.
        windowed = [i for i, layer in enumerate(layers) if not isinstance(layer, FullAttentionLayer)]
        globals_ = [i for i in windowed if not layer_windows[i][2]]
        self.mask_layer = {
            i: (globals_ or windowed)[0]
            for i, layer in enumerate(layers)
            if isinstance(layer, FullAttentionLayer) and windowed
        }
        main = next(((w, s) for w, s, sl in layer_windows if not sl), layer_windows[0][:2])
        self.window = window if window is not None else main[0]
        self.sinks = sinks if sinks is not None else main[1]
        self.positions = positions
        self.kind = kind
        # Per-row bookkeeping starts with the first padded forward (always, for the static cache).
        self.padded = False
        self.real_seen: torch.Tensor | None = None
        self.plan: StepPlan | None = None
        # A hybrid's full-attention masks of the running forward (full_units.full_mask), by shape.
        self.full_masks: dict = {}
        # What made this cache, set by ``patch.make_cache``: the spec string and native-sliding
        # policy, and a check that the model still runs them (a closure over a weak reference), so a
        # cache used under another spec, or after the model went back to full attention, fails loudly.
        self.made_for: tuple[str, str] | None = None
        self.owner_active: Callable[[], bool] | None = None

    # Fixed-shape ring buffers (``static_cache.StaticSinkWindowCache``): per-row bookkeeping from the start.
    is_static = False

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` of ``layer_idx``; a full layer of a hybrid answers for its windowed neighbours."""
        return super().get_mask_sizes(query_length, self.mask_layer.get(layer_idx, layer_idx))

    def begin_step(
        self,
        q_len: int,
        attention_mask: torch.Tensor | None = None,
        *,
        batch_size: int | None = None,
        device: torch.device | str | None = None,
        implicit: bool = False,
        start: int | None = None,
    ) -> StepPlan:
        """Plan the next forward of ``q_len`` columns; every layer (and the mask builder) reads the plan.

        Args:
            q_len: new columns.
            attention_mask: ``[batch, columns]`` 2-D padding mask (1 = real token) whose last ``q_len``
                columns are this forward's (transformers' convention: all columns so far), or ``None``.
            batch_size, device: of the inputs, when ``attention_mask`` is ``None``.
            implicit: planned by a layer because no pre-hook ran (only an unpadded continuation can be
                inferred that way).
            start: columns seen before this forward (default: ``get_seq_length()``).

        Returns:
            The ``StepPlan``; its ``model_pos`` are the ``position_ids`` to pass the model (``None``: the
            model's default is right).
        """
        if implicit and self.owner_active is not None and not self.owner_active():
            raise ValueError(
                f"this SinkWindowCache was made for {self.made_for[0]}, which its model no longer runs: "
                f"apply that spec again, or make a new cache with sinkwindow.make_cache(model) (no cache for full attention)"
            )
        if implicit and self.positions == "cache":
            raise RuntimeError(
                "positions='cache' re-assigns position_ids every forward: call the patched model itself "
                "(its forward pre-hook plans the step) or sinkwindow.generate, not its inner decoder"
            )
        if start is None:
            start = self.get_seq_length()
        chunk = None
        if attention_mask is not None:
            if attention_mask.ndim != 2:
                raise ValueError(
                    f"sinkwindow caches take a 2-D padding mask [batch, columns], got shape {tuple(attention_mask.shape)}"
                )
            if attention_mask.shape[-1] < q_len:
                raise ValueError(
                    f"attention_mask covers {attention_mask.shape[-1]} columns but the forward has {q_len}: pass the "
                    f"mask of all columns so far (transformers' convention)"
                )
            chunk = attention_mask[:, -q_len:].to(torch.bool)
            device = chunk.device
        all_real = True
        if chunk is not None:
            all_real = bool(chunk.all())
            if all_real and not self.padded and not self.is_static:
                chunk = None
        if batch_size is None:
            batch_size = (
                chunk.shape[0]
                if chunk is not None
                else (self.real_seen.shape[0] if self.real_seen is not None else 1)
            )
        if device is None:
            device = self.real_seen.device if self.real_seen is not None else "cpu"
        if (chunk is not None or self.is_static) and not self.padded:
            self.padded = True
            self.real_seen = torch.full((batch_size,), start, dtype=torch.long, device=device)

        q_pos = next_pos = None
        if self.padded:
            if chunk is None:
                chunk = torch.ones((batch_size, q_len), dtype=torch.bool, device=device)
            before = self.real_seen.to(chunk.device)
            q_pos = (before[:, None] + chunk.long().cumsum(-1) - 1).masked_fill(~chunk, -1)
            next_pos = before + chunk.sum(-1)
            self.real_seen = next_pos
            first, real = before, q_pos

        dense = self.kind == "evict" and start == 0
        model_pos = shift = copy_shift = None
        if self.positions == "cache":
            if not self.padded:
                first = torch.tensor([start], device=device)
                real = (start + torch.arange(q_len, device=device))[None]
            shift = torch.zeros_like(first) if dense else (first - (self.window - 1)).clamp(min=0)
            model_pos = (real - shift[:, None]).clamp(min=0)
            if self.sinks and not dense and q_len > 1:
                # A single query always sits at min(i, w - 1): only chunks can need copies.
                delta = ((real - shift[:, None]) - real.clamp(max=self.window - 1)).masked_fill(real < 0, 0)
                if bool((delta > 0).any()):
                    copy_shift = delta
        elif q_pos is not None:
            model_pos = q_pos.clamp(min=0)
        self.plan = StepPlan(start, q_len, q_pos, next_pos, model_pos, shift, copy_shift, dense, all_real)
        self.full_masks = {}
        return self.plan

    def end_step(self) -> None:
        """Close the planned forward (static layers advance their counters here, outside compiled code)."""
        plan = self.plan
        if plan is None:
            return
        for layer in self.layers:
            layer.end_step(plan)
        self.plan = None
        self.full_masks = {}

    def reset(self) -> None:
        super().reset()
        self.padded = False
        self.real_seen = None
        self.plan = None

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        if self.real_seen is not None:
            self.real_seen = self.real_seen.index_select(0, beam_idx.to(self.real_seen.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        if self.real_seen is not None:
            self.real_seen = self.real_seen.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.real_seen is not None:
            self.real_seen = self.real_seen[indices]

    def state_dict(self) -> dict:
        """Everything needed to resume a stream later (``load_state_dict``); tensors are not copied."""
        return {
            "positions": self.positions,
            "window": self.window,
            "sinks": self.sinks,
            "kind": self.kind,
            "padded": self.padded,
            "real_seen": self.real_seen,
            "layers": [_layer_state(layer) for layer in self.layers],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what ``state_dict`` saved, into a cache built by the same ``make_cache`` call."""
        mine = (self.positions, self.window, self.sinks, self.kind, len(self.layers))
        theirs = (state["positions"], state["window"], state["sinks"], state["kind"], len(state["layers"]))
        if mine != theirs:
            raise ValueError(
                f"cache state is for (positions, window, sinks, kind, layers)={theirs}, this cache is {mine}"
            )
        self.padded, self.real_seen, self.plan = state["padded"], state["real_seen"], None
        for layer, saved in zip(self.layers, state["layers"]):
            if ("full" in saved) != isinstance(layer, HybridHeadLayer):
                raise ValueError(
                    "cache state is for another hybrid layout: build the cache with the same spec"
                )
            _load_layer_state(layer, saved)
            if "full" in saved:
                _load_layer_state(layer.full, saved["full"])

    def persisted_lengths(self) -> list[int]:
        """Keys each layer holds right now (what decoding memory is made of): for a layer with some
        full KV heads, the most any of its heads holds (its full heads' store grows with the context)."""
        return [
            max(layer.n_persisted, layer.full.n_persisted)
            if isinstance(layer, HybridHeadLayer)
            else layer.n_persisted
            for layer in self.layers
        ]

    def window_lengths(self) -> list[int]:
        """Keys each layer's windowed store holds right now: the part SWA(w, s) bounds by w − 1
        (a layer with full KV heads counts its SWA heads only; ``persisted_lengths`` counts all)."""
        return [layer.n_persisted for layer in self.layers]

    def nbytes(self) -> int:
        """Bytes of key and value tensors held right now, all layers (``cache_nbytes``)."""
        return cache_nbytes(self)


def _layer_state(layer: SinkWindowLayer) -> dict:
    state = {
        "keys": layer.keys if layer.is_initialized else None,
        "values": layer.values if layer.is_initialized else None,
        "positions": layer.positions,
        "cumulative_length": layer.cumulative_length,
    }
    if isinstance(layer, HybridHeadLayer):
        state["full"] = _layer_state(layer.full)
    return state


def _load_layer_state(layer: SinkWindowLayer, saved: dict) -> None:
    layer.cumulative_length = saved["cumulative_length"]
    layer.positions = saved["positions"]
    if saved["keys"] is not None:
        layer.load_state(saved["keys"], saved["values"], saved["positions"])


def _layer_tensors(layer) -> list[torch.Tensor]:
    out = []
    for name, value in vars(layer).items():
        if name == "_cache":
            continue
        if isinstance(value, DynamicLayer):  # a hybrid layer's store of full heads
            out.extend(_layer_tensors(value))
            continue
        items = value if isinstance(value, (tuple, list)) else (value,)
        out.extend(t for t in items if isinstance(t, torch.Tensor))
    return out


def cache_nbytes(cache: Cache) -> int:
    """Bytes of the distinct tensor storages any transformers cache holds, all layers.

    The one way sinkwindow counts cache memory (``generate``, the benchmarks, ``check``): every
    tensor attribute of every layer counts (keys and values; a linear-attention layer's S, z and
    FIFO; a ring buffer's slot positions), each storage once, so a ``DynamicCache``, a
    ``SinkWindowCache`` and a ``LinearAttnCache`` are measured alike. For contiguous tensors this is
    ``numel * element_size``.
    """
    seen: set[tuple[int, str]] = set()
    total = 0
    for layer in cache.layers:
        for t in _layer_tensors(layer):
            if t.numel() == 0:
                continue
            storage = t.untyped_storage()
            key = (storage.data_ptr(), str(t.device))
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
    return total


def cache_lengths(cache: Cache) -> list[int]:
    """Key entries each layer holds right now (0 for layers without keys, e.g. pure linear attention)."""
    out = []
    for layer in cache.layers:
        keys = getattr(layer, "keys", None)
        out.append(int(keys.shape[-2]) if isinstance(keys, torch.Tensor) and keys.ndim >= 2 else 0)
    return out

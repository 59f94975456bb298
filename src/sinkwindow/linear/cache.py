"""Constant-size decode cache for converted models: recurrent state (S, z) plus the last w keys/values.

A transformers ``Cache`` whose layers subclass ``CacheLayerMixin``, like the runtime's
``SinkWindowLayer``, so ``model.generate(ids, cache=...)`` and ``sinkwindow.prefill`` drive it
unchanged. What one layer holds after t tokens (docs/linear.md §2.3)::

    S      (b, H, F, D)     Σ φk(k_j) v_jᵀ over every token behind the window, float32
    z      (b, H, F)        Σ φk(k_j), float32
    keys   (b, Hkv, n, D)   the last n = min(t, w) post-RoPE keys, model dtype (hybrid only)
    values (b, Hkv, n, D)

None of it grows with t. The FIFO stays at the Hkv key/value heads (LoLCATs stores it after
``repeat_kv``, 3× larger for SmolLM2); S and z are per query head because the key feature maps are.

A ``liger:W`` layer holds the gated state instead, and no z::

    S      (b, Hkv, D, D)   Σ_j (decays since j) φk(k_j) v_jᵀ over every token so far, float32
    keys   (b, Hkv, n, D)   the last n = min(t, w − 1) post-RoPE keys (the window query brings its own)
    values (b, Hkv, n, D)

Its S is per key/value head because its keys, values and gates are (``ops.chunk_gla``).

The layer does no arithmetic itself: ``update`` only counts tokens and hands the new keys back; the
attention function (``attention.linear_attention_forward``) reads ``state``, advances it with
``ops.window_linear_attn_step`` / ``ops.linear_attn_step`` / ``ops.liger_attn_step`` and writes it back
with ``set_state``. Keys that leave the window need φk, which lives on the attention module, not
on the cache.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from .ops import HybridAttnState, LigerAttnState, LinearAttnState

__all__ = ["LinearAttnCache", "LinearAttnLayer"]

KINDS = ("linear", "lolcats", "liger")


def _kind(window: int | None, kind: str | None) -> str:
    if kind is None:
        kind = "linear" if window is None else "lolcats"
    if kind not in KINDS:
        raise ValueError(f"unknown linear-baseline kind {kind!r}; expected one of {KINDS}")
    if (kind == "linear") != (window is None):
        raise ValueError(f"a {kind!r} layer {'takes no' if kind == 'linear' else 'needs a'} window")
    return kind


class LinearAttnLayer(CacheLayerMixin):
    """One decoder layer's state for a converted model.

    Args:
        window: w for the LoLCATs hybrid (the FIFO keeps the last w tokens) and for Liger (the last
            w − 1), ``None`` for pure linear attention (no FIFO).
        kind: ``"linear"``, ``"lolcats"`` or ``"liger"``; by default ``"linear"`` without a window and
            ``"lolcats"`` with one.
    """

    is_sliding = False
    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, window: int | None = None, kind: str | None = None):
        super().__init__()
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.kind = _kind(window, kind)
        self.window = window
        self.S: torch.Tensor | None = None
        self.z: torch.Tensor | None = None
        # A padded batch keeps one state per row instead (``row_states``): rows have seen different
        # numbers of real tokens, so their windows differ in length and cannot share one tensor.
        self.rows: list | None = None
        self.cumulative_length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Count the incoming tokens and return them unchanged.

        The attention function combines them with ``state``; returning the FIFO here as well would
        make it re-derive which keys are new.

        Args:
            key_states, value_states: (b, Hkv, T, D), post-RoPE.

        Returns:
            The same tensors.
        """
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        return key_states, value_states

    @property
    def state(self) -> HybridAttnState | LinearAttnState | LigerAttnState | None:
        """The state after every token before the current forward, or ``None`` at the start."""
        if self.S is None:
            return None
        if self.kind == "liger":
            return LigerAttnState(self.S, self.keys, self.values)
        if self.window is None:
            return LinearAttnState(self.S, self.z)
        return HybridAttnState(self.S, self.z, self.keys, self.values)

    def set_state(self, state: HybridAttnState | LinearAttnState | LigerAttnState) -> None:
        """Store the state after the current forward (called by the attention function)."""
        if isinstance(state, LigerAttnState) != (self.kind == "liger"):
            raise TypeError(f"a {self.kind} layer got a {type(state).__name__}")
        self.rows = None
        if isinstance(state, LigerAttnState):
            self.S, self.z = state.S, None
        else:
            self.S, self.z = state.S, state.z
        if isinstance(state, HybridAttnState | LigerAttnState):
            if self.window is None:
                raise TypeError("a pure linear-attention layer got a hybrid state")
            # Slice views of the (FIFO + chunk) buffer would pin the whole chunk: keep a copy.
            self.keys, self.values = state.k_win.contiguous().clone(), state.v_win.contiguous().clone()

    def row_states(self, batch: int) -> list:
        """One state (or ``None``) per row, for a padded batch; a batched state is split into rows."""
        if self.rows is not None:
            if len(self.rows) != batch:
                raise ValueError(f"the cache holds {len(self.rows)} rows, the batch has {batch}")
            return list(self.rows)
        state = self.state
        if state is None:
            return [None] * batch
        return [type(state)(*(t[r : r + 1] for t in state)) for r in range(batch)]

    def set_row_states(self, states: list) -> None:
        """Store each row's state after the current forward (called by the attention function)."""
        kinds = {type(st) for st in states if st is not None}
        expected = (
            LigerAttnState if self.kind == "liger" else HybridAttnState if self.window else LinearAttnState
        )
        if kinds - {expected}:
            raise TypeError(f"a {self.kind} layer got {sorted(k.__name__ for k in kinds)}")
        # Slice views of the (FIFO + chunk) buffer would pin the whole chunk: keep copies.
        self.rows = [None if st is None else type(st)(*(t.contiguous().clone() for t in st)) for st in states]
        self.S = self.z = self.keys = self.values = None

    def _map_tensors(self, fn) -> None:
        for name in ("S", "z", "keys", "values"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, fn(t))
        if self.rows is not None:
            self.rows = [None if st is None else type(st)(*(fn(t) for t in st)) for st in self.rows]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # Nothing masks this layer (the kernels are causal by construction); report what
        # ``update`` returns: the new tokens, at absolute offset = tokens seen before them.
        return query_length, self.cumulative_length

    def get_seq_length(self) -> int:
        """Tokens seen so far (not stored): keeps ``position_ids`` absolute."""
        return self.cumulative_length

    def get_max_length(self) -> int:
        # No maximum: the state is constant-size whatever the length.
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "a recurrent linear-attention state cannot be rolled back; assisted/speculative decoding that "
            "crops the cache is not supported for linear baselines"
        )

    def reset(self) -> None:
        self.S = self.z = None
        self.keys = self.values = None
        self.rows = None
        self.is_initialized = False
        self.cumulative_length = 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.rows is not None:
            self.rows = [self.rows[int(i)] for i in beam_idx]
            return
        self._map_tensors(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def offload(self) -> None:
        self._map_tensors(lambda t: t.to("cpu", non_blocking=True))

    def prefetch(self) -> None:
        self._map_tensors(lambda t: t if t.device == self.device else t.to(self.device, non_blocking=True))

    def _tensors(self) -> list[torch.Tensor]:
        held = [t for t in (self.S, self.z, self.keys, self.values) if t is not None]
        for st in self.rows or []:
            if st is not None:
                held += list(st)
        return held

    def nbytes(self) -> int:
        """Bytes held right now: S, z (none for Liger) and the FIFO (of every row, in a padded batch)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def fifo_length(self) -> int:
        """FIFO entries held right now (the longest row's in a padded batch; 0 for pure linear)."""
        if self.rows is not None:
            lengths = [st.k_win.shape[-2] for st in self.rows if st is not None and hasattr(st, "k_win")]
            return max(lengths, default=0)
        return self.keys.shape[-2] if self.keys is not None else 0


class LinearAttnCache(Cache):
    """A ``Cache`` of ``LinearAttnLayer``s, one per decoder layer, for a converted model.

    Args:
        num_layers: decoder layers.
        window: w for ``lolcats:W`` and ``liger:W``, ``None`` for ``linear``.
        kind: as in ``LinearAttnLayer``.
    """

    def __init__(self, num_layers: int, window: int | None = None, kind: str | None = None):
        super().__init__(layers=[LinearAttnLayer(window, kind) for _ in range(num_layers)])
        self.window = window
        self.kind = _kind(window, kind)

    def nbytes(self) -> int:
        """Bytes of state held right now, all layers."""
        return sum(layer.nbytes() for layer in self.layers)

    def persisted_lengths(self) -> list[int]:
        """FIFO entries each layer holds right now (0 for pure linear attention)."""
        return [layer.fifo_length() for layer in self.layers]

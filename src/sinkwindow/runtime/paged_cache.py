"""The paged sink-window cache: SWA(w, s) layers whose storage is blocks of a shared ``kv_pool.KVPool``.

A ``PagedSinkWindowCache`` runs a batch of ``PoolRow`` s (each its own sequence, with its own positions,
sinks and window) through a patched model. Its layers keep the ring layout of
``static_cache.StaticSinkWindowLayer`` (token at position p >= s in logical slot
``s + (p - s) % (w - s)``, sinks in slots ``0..s-1``), but logical slot j lives in block
``table[j // block]`` at offset ``j % block`` of the pool, and a row holds only the blocks its tokens
have reached: ``ceil(min(tokens, w) / block)`` a layer. When the window slides past a whole block
the ring comes back to it and overwrites it in place; the sinks stay pinned in the first block.

Each forward gathers every row's held blocks (``[rows, kv_heads, G, head_dim]``, G = the longest
row's blocks × block), so attention runs over the tokens rows hold, not over w empty slots; shorter
rows are padded with the scratch block, whose slots report position -1 (``get_mask_sizes``), which
the sink-window mask hides exactly as it hides a ring buffer's empty slots. Slot positions are not
stored: they follow from a row's token count (``ring_positions``).

``make_cache(model, pool=..., rows=...)`` builds one; ``PoolRow.seen`` advances after each forward.
Rows carry no padding (a batch is rows of their own lengths, never a padded prompt).

``PagedFullCache`` is full attention (an unpatched model) over the same pool, one row: every token
is kept, in logical order, so the stock causal mask applies; its table grows a block every
``block`` tokens, drawn from what the row was promised (``KVPool.reserve``).
"""

from __future__ import annotations

import math

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .cache import SinkWindowCache, SlotOffset, StepPlan
from .kv_pool import KVPool, PoolRow
from .rope import LayerRope
from .static_cache import StaticSinkWindowLayer

__all__ = ["PagedSinkWindowLayer", "PagedSinkWindowCache", "PagedFullLayer", "PagedFullCache", "ring_positions",
           "pool_shape"]  # fmt: skip


def ring_positions(seen: torch.Tensor, window: int, sinks: int, slots: int) -> torch.Tensor:
    """Position held by each logical slot of rows that have seen ``seen [rows]`` tokens (-1: empty).

    Slot j < s holds token j; slot j in [s, w) holds the latest position p < seen with
    ``s + (p - s) % (w - s) == j``; slots from w on (a partial last block) hold nothing.

    Returns:
        ``[rows, slots]`` long.
    """
    j = torch.arange(slots, device=seen.device)[None]
    n = seen[:, None]
    r, k, m = window - sinks, j - sinks, n - sinks
    later = m - 1 - k  # >= 0 once a token has reached slot j
    recent = sinks + k + r * torch.div(later.clamp(min=0), r, rounding_mode="floor")
    recent_ok = (k >= 0) & (j < window) & (later >= 0)
    sink_ok = (j < sinks) & (j < n)
    return torch.where(sink_ok, j, torch.where(recent_ok, recent, -1))


class PagedSinkWindowLayer(StaticSinkWindowLayer):
    """One layer over pool blocks: writes go into the pool, every forward gathers the rows' blocks.

    It owns no tensors (``is_initialized`` stays False, ``cache_nbytes`` counts nothing here: the
    pool is counted once, by the pool). Planning, the ring index, sink copies and rotations are the
    static ring buffer's.
    """

    def __init__(self, window: int, sinks: int, is_sliding: bool = False, rope: LayerRope | None = None):
        super().__init__(window, sinks, is_sliding=is_sliding, rope=rope)
        self.layer_idx = 0

    @property
    def n_persisted(self) -> int:
        cache = self._cache
        return max((min(r.seen, self.window) for r in cache.rows), default=0) if cache is not None else 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a paged layer's storage is its pool; it never allocates its own")

    def _gather(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows' held blocks as ``[rows, kv_heads, G, head_dim]`` (a view of one ``index_select`` per tensor)."""
        pool, cache = self._cache.pool, self._cache
        idx = cache.gather_index(self.layer_idx)  # [rows, G] flat slot ids
        b, g = idx.shape

        def one(flat: torch.Tensor) -> torch.Tensor:
            return (
                flat.index_select(0, idx.reshape(-1))
                .view(b, g, pool.kv_heads, flat.shape[-1])
                .transpose(1, 2)
            )

        return one(pool.flat_keys), one(pool.flat_values)

    def _write(self, plan: StepPlan, qp: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``keys/values [rows, heads, c, dim]`` of queries at ``qp [rows, c]`` to their slots (``_slots``)."""
        pool, cache = self._cache.pool, self._cache
        if keys.dtype != pool.keys.dtype or keys.shape[1] != pool.kv_heads or keys.shape[-1] != pool.head_dim:
            raise ValueError(
                f"layer {self.layer_idx} gives keys {tuple(keys.shape[1::2])} {keys.dtype}, the KV pool holds "
                f"({pool.kv_heads}, {pool.head_dim}) {pool.keys.dtype}: build the pool for this model (pool_shape)"
            )
        idx = cache.write_index(self, plan, qp).reshape(-1)
        pool.flat_keys.index_copy_(0, idx, keys.transpose(1, 2).reshape(idx.shape[0], keys.shape[1], -1))
        pool.flat_values.index_copy_(
            0, idx, values.transpose(1, 2).reshape(idx.shape[0], values.shape[1], -1)
        )

    def _slots(self, plan: StepPlan, qp: torch.Tensor) -> torch.Tensor:
        """``[rows, c]`` logical slot each token of the forward is written to (-1: it does not survive)."""
        if self._is_decode(plan):
            return self._ring_index(qp)
        # Survivors: each row's sinks and its last w - s tokens; the rest go to the scratch block.
        lo = plan.next_pos.to(qp.device) - (self.window - self.sinks)
        keep = (qp >= 0) & ((qp < self.sinks) | (qp >= lo[:, None]))
        return torch.where(keep, self._ring_index(qp.clamp(min=0)), -1)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode: write the query's key, return the gathered blocks. Chunk: gathered + chunk, then write.

        Args:
            key_states, value_states: ``[rows, kv_heads, chunk, head_dim]``.

        Returns:
            ``[rows, kv_heads, G (+ chunk (+ copies)), head_dim]``, G = gathered slots.
        """
        c = key_states.shape[-2]
        plan = self._plan(c)
        cache = self._cache
        stored = key_states if self.rope is None else self.rope.unrotate(key_states, plan.model_pos)
        qp = plan.q_pos.to(cache.pool.keys.device)
        if self._is_decode(plan):
            self._write(plan, qp, stored, value_states)
            keys, values = self._gather()
            if self.rope is None:
                return keys, values
            after = cache.slot_positions(self.window, self.sinks, after=True)
            return self.rope.rotate(keys, self._rotation(plan, after)), values
        keys, values = self._gather()
        before = cache.slot_positions(self.window, self.sinks)
        past = keys if self.rope is None else self.rope.rotate(keys, self._rotation(plan, before))
        out_keys = torch.cat([past, key_states], dim=-2)
        out_values = torch.cat([values, value_states], dim=-2)
        if self._wants_copies(plan):
            full_pos = torch.cat([before, qp], dim=1)
            ck, cv = self._sink_copies(torch.cat([keys, stored], dim=-2), out_values, full_pos, plan)
            out_keys = torch.cat([out_keys, ck], dim=-2)
            out_values = torch.cat([out_values, cv], dim=-2)
        self._write(plan, qp, stored, value_states)
        return out_keys, out_values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        plan = self._plan(query_length)
        q_pos = plan.q_pos
        slot_pos = self._cache.slot_positions(self.window, self.sinks).to(q_pos.device)
        n = slot_pos.shape[1]
        if self._is_decode(plan):
            # The slot this step overwrites already shows the query's own position.
            idx = self._ring_index(q_pos)
            kv_pos = torch.where(torch.arange(n, device=q_pos.device)[None] == idx, q_pos, slot_pos)
            return n, SlotOffset(0, self.sinks, kv_pos=kv_pos, q_pos=q_pos)
        copies = query_length if self._wants_copies(plan) else 0
        kv_pos = torch.cat([slot_pos, q_pos], dim=1)
        return n + query_length + copies * self.sinks, SlotOffset(0, self.sinks, kv_pos=kv_pos, q_pos=q_pos, copies=copies)  # fmt: skip

    def load_state(self, keys, values, positions) -> None:
        raise NotImplementedError("a paged cache's state is its rows' blocks in the pool: keep the PoolRow")

    def reset(self) -> None:
        self.cumulative_length = 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError(
            "a paged cache does not reorder rows: build one over the rows in the new order"
        )


class PagedSinkWindowCache(SinkWindowCache):
    """``SinkWindowCache`` of ``PagedSinkWindowLayer`` s over ``rows`` of ``pool``.

    Args:
        layer_windows, positions, ropes, window, sinks, kind: as ``SinkWindowCache``.
        pool: the blocks.
        rows: one ``PoolRow`` per batch row (new ones from ``pool.new_row()``; a session's, to continue it).
    """

    layer_class = PagedSinkWindowLayer
    is_static = True

    def __init__(self, layer_windows, *, pool: KVPool, rows: list[PoolRow], **kwargs):
        super().__init__(layer_windows, **kwargs)
        if not rows:
            raise ValueError("a paged cache needs at least one row")
        if any(type(layer) is not PagedSinkWindowLayer for layer in self.layers):
            raise ValueError("a paged cache holds sink-window layers only (no full-attention units)")
        if len(self.layers) != pool.layers:
            raise ValueError(f"the KV pool is for {pool.layers} layers, the model has {len(self.layers)}")
        self.pool, self.rows = pool, list(rows)
        start = max(r.seen for r in self.rows)
        for i, layer in enumerate(self.layers):
            layer.layer_idx, layer.cumulative_length = i, start
        self.padded = True
        self._tables: torch.Tensor | None = None
        self._seen: torch.Tensor | None = None
        self._slot_pos: dict = {}
        self._gather_idx: torch.Tensor | None = None
        self._write_idx: dict = {}

    def begin_step(self, q_len: int, attention_mask: torch.Tensor | None = None, *, batch_size=None, device=None,
                   implicit: bool = False, start: int | None = None) -> StepPlan:  # fmt: skip
        """Plan the forward (``SinkWindowCache.begin_step``), then give every row the blocks it reaches."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("a paged cache takes no padding: every row is a sequence of its own length")
        if batch_size is not None and batch_size != len(self.rows):
            raise ValueError(f"the paged cache has {len(self.rows)} rows but this forward has {batch_size}")
        device = device if device is not None else self.pool.keys.device
        pool = self.pool
        seen = torch.tensor([r.seen for r in self.rows], dtype=torch.long, device=device)
        self.real_seen = seen
        plan = super().begin_step(
            q_len, None, batch_size=len(self.rows), device=device, implicit=implicit, start=start
        )
        for r in self.rows:
            for i, layer in enumerate(self.layers):
                pool.grow(r, i, math.ceil(min(r.seen + q_len, layer.window) / pool.block))
        tables = [r.table(pool.keys.device) for r in self.rows]
        width = max(t.shape[1] for t in tables)
        self._tables = torch.stack([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in tables])
        self._seen, self._slot_pos = seen.to(pool.keys.device), {}
        self._gather_idx, self._write_idx = None, {}
        return plan

    def gather_index(self, layer: int) -> torch.Tensor:
        """``[rows, G]`` flat slot ids (``block * block_size + offset``) of ``layer``'s gathered slots."""
        if self._gather_idx is None:
            b, n_layers, nb = self._tables.shape
            bs = self.pool.block
            offsets = torch.arange(bs, device=self._tables.device)
            self._gather_idx = (self._tables[..., None] * bs + offsets).reshape(b, n_layers, nb * bs)
        return self._gather_idx[:, layer]

    def write_index(self, layer: PagedSinkWindowLayer, plan: StepPlan, qp: torch.Tensor) -> torch.Tensor:
        """``[rows, c]`` flat slot ids where ``layer`` writes the forward's tokens (at ``qp``; the scratch
        block for those that do not survive).

        Computed once a forward for every layer of the same (w, s), whose logical slots agree.
        """
        key = (layer.window, layer.sinks)
        if key not in self._write_idx:
            slots = layer._slots(plan, qp)
            bs = self.pool.block
            safe = slots.clamp(min=0)
            b, n_layers, _ = self._tables.shape
            blk = self._tables.gather(
                2, torch.div(safe, bs, rounding_mode="floor")[:, None].expand(b, n_layers, -1)
            )
            flat = blk * bs + (safe % bs)[:, None]
            self._write_idx[key] = torch.where(slots[:, None] >= 0, flat, 0)
        return self._write_idx[key][:, layer.layer_idx]

    def slot_positions(self, window: int, sinks: int, after: bool = False) -> torch.Tensor:
        """``[rows, G]`` positions in the gathered slots before the forward (``after``: a decode step's, after it)."""
        key = (window, sinks, after)
        if key not in self._slot_pos:
            seen = self._seen + (self.plan.q_len if after else 0)
            slots = self._tables.shape[-1] * self.pool.block
            self._slot_pos[key] = ring_positions(seen, window, sinks, slots)
        return self._slot_pos[key]

    def end_step(self) -> None:
        plan = self.plan
        super().end_step()
        if plan is not None:
            for r in self.rows:
                r.seen += plan.q_len
        self._tables, self._slot_pos, self._gather_idx, self._write_idx = None, {}, None, {}

    def state_dict(self) -> dict:
        raise NotImplementedError("a paged cache's state is its rows' blocks in the pool: keep the PoolRows")

    def nbytes(self) -> int:
        """Bytes of the pool blocks its rows hold."""
        return sum(r.blocks for r in self.rows) * self.pool.block_bytes


class PagedFullLayer(DynamicLayer):
    """One layer of full attention over pool blocks: token t in logical slot t; ``update`` returns all of them."""

    def __init__(self, pool: KVPool, row: PoolRow, layer_idx: int):
        super().__init__()
        self.pool, self.row, self.layer_idx = pool, row, layer_idx
        self.cumulative_length = row.seen

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise RuntimeError("a paged layer's storage is its pool; it never allocates its own")

    def _flat(self, n: int) -> torch.Tensor:
        """Flat slot ids of logical slots ``0..n-1``."""
        bs = self.pool.block
        table = self.row.table(self.pool.keys.device)[self.layer_idx]
        return (table[:, None] * bs + torch.arange(bs, device=table.device)).reshape(-1)[:n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """``key_states [1, kv_heads, c, head_dim]`` -> every key so far ``[1, kv_heads, n + c, head_dim]``."""
        pool, b, c = self.pool, key_states.shape[0], key_states.shape[2]
        if b != 1:
            raise ValueError("a paged full-attention cache holds one sequence")
        n = self.cumulative_length
        pool.grow(self.row, self.layer_idx, math.ceil((n + c) / pool.block))
        flat = self._flat(n + c)
        pool.flat_keys.index_copy_(0, flat[n:], key_states[0].transpose(0, 1))
        pool.flat_values.index_copy_(0, flat[n:], value_states[0].transpose(0, 1))
        self.cumulative_length = n + c
        if self.layer_idx == self.pool.layers - 1:
            self.row.seen = n + c  # the forward's last layer: the row has seen the chunk
        keys = pool.flat_keys.index_select(0, flat).transpose(0, 1)[None]
        return keys, pool.flat_values.index_select(0, flat).transpose(0, 1)[None]

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cumulative_length + query_length, 0


class PagedFullCache(Cache):
    """Full attention (an unpatched model) for one ``PoolRow`` of ``pool``: a stock-layout cache whose
    storage is pool blocks, for ``model(..., past_key_values=cache)``."""

    def __init__(self, pool: KVPool, row: PoolRow):
        super().__init__(layers=[PagedFullLayer(pool, row, i) for i in range(pool.layers)])
        self.pool, self.rows = pool, [row]

    def nbytes(self) -> int:
        return self.rows[0].nbytes


def pool_shape(model) -> dict:
    """``layers, kv_heads, head_dim, dtype, device`` of a model's KV, for ``KVPool(**pool_shape(model))``."""
    tcfg = model.config.get_text_config(decoder=True)
    heads = tcfg.num_attention_heads
    head_dim = getattr(tcfg, "head_dim", None) or tcfg.hidden_size // heads
    devices = {p.device for p in model.parameters()}
    if len(devices) > 1:
        raise ValueError("a KV pool lives on one device: load the model on one device (no device_map split)")
    return {
        "layers": tcfg.num_hidden_layers,
        "kv_heads": getattr(tcfg, "num_key_value_heads", None) or heads,
        "head_dim": head_dim,
        "dtype": model.dtype,
        "device": devices.pop(),
    }

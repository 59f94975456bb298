"""The static sink-window cache: fixed-shape ring buffers, so a decode step compiles (``torch.compile``).

``StaticSinkWindowLayer`` keeps ``[batch, kv_heads, w, head_dim]`` buffers allocated once and written in
place: slots ``0..s-1`` hold the sinks, slots ``s..w-1`` a ring of the last ``w - s`` tokens. It is a
``cache.SinkWindowLayer`` with another storage layout and reuses everything else (planning, masks,
position modes); the shared cache calls its hooks (``end_step``, ``load_state``) and never tests its
type. ``make_cache(model, static=True)`` builds one; ``generate.DecodeStep`` compiles the step.
"""

from __future__ import annotations

import torch

from .cache import SinkWindowCache, SinkWindowLayer, SlotOffset, StepPlan
from .rope import LayerRope

__all__ = ["StaticSinkWindowCache", "StaticSinkWindowLayer", "stack_rows", "take_rows"]


class StaticSinkWindowLayer(SinkWindowLayer):
    """Ring-buffer variant for ``torch.compile``: fixed ``[batch, heads, w, head_dim]`` buffers.

    Slots ``0..s-1`` hold the sinks, slots ``s..w-1`` a ring of the last ``w - s`` tokens (the query
    included once written): token at real position p >= s lives in slot ``s + (p - s) % (w - s)``.
    A decode step scatters one key per row in place and returns the whole buffer, so its shapes never
    change; ``slot_pos`` (``[batch, w]``, -1 = empty) tells the mask where each key came from.

    Multi-token forwards (prefill) take an eager path that returns buffer + chunk and then writes the
    survivors into the ring. Bookkeeping (``cumulative_length``) advances in ``SinkWindowCache.end_step``,
    outside any compiled region, so no Python counter changes inside the compiled step.
    """

    # transformers' generate() pre-builds masks for "compileable" caches before the forward pre-hook that
    # plans our step has run; we compile the decode step ourselves (sinkwindow.runtime.generate), so say no.
    is_compileable = False

    def __init__(self, window: int, sinks: int, is_sliding: bool = False, rope: LayerRope | None = None):
        super().__init__(window, sinks, is_sliding=is_sliding, rope=rope)

    @property
    def max_persisted(self) -> int:
        return self.window

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        b, h, _, dk = key_states.shape
        self.keys = key_states.new_zeros((b, h, self.window, dk))
        self.values = value_states.new_zeros((b, h, self.window, value_states.shape[-1]))
        self.positions = torch.full((b, self.window), -1, dtype=torch.long, device=self.device)
        if not torch.compiler.is_compiling():
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)
            torch._dynamo.mark_static_address(self.positions)
        self.is_initialized = True

    def _ring_index(self, pos: torch.Tensor) -> torch.Tensor:
        s = self.sinks
        return torch.where(pos < s, pos, s + (pos - s) % (self.window - s))

    def _slot_pos(self, batch: int, device) -> torch.Tensor:
        if self.positions is not None:
            return self.positions
        return torch.full((batch, self.window), -1, dtype=torch.long, device=device)

    def _plan(self, q_len: int) -> StepPlan:
        if torch.compiler.is_compiling():
            # Inside a compiled decode step, planned eagerly just before (DecodeStep): checking the
            # step counters here would make every step's counter a recompilation guard.
            return self._cache.plan
        return super()._plan(q_len)

    @staticmethod
    def _is_decode(plan: StepPlan) -> bool:
        return plan.q_len == 1 and plan.all_real and plan.copy_shift is None and not plan.dense

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode: scatter into the ring, return the buffers. Chunk: return buffer + chunk, then write.

        Args:
            key_states, value_states: ``[batch, kv_heads, chunk, head_dim]``.

        Returns:
            ``[batch, kv_heads, w, head_dim]`` for a decode step; ``[batch, kv_heads, w + chunk (+ copies),
            head_dim]`` for a chunk.
        """
        c = key_states.shape[-2]
        plan = self._plan(c)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b, h, _, dk = key_states.shape
        dv = value_states.shape[-1]
        stored = key_states if self.rope is None else self.rope.unrotate(key_states, plan.model_pos)
        if self._is_decode(plan):
            pos = plan.q_pos.to(self.positions.device)  # [B, 1]; the plan is on the input device
            idx = self._ring_index(pos)
            self.keys.scatter_(2, idx[:, None, :, None].expand(b, h, 1, dk), stored)
            self.values.scatter_(2, idx[:, None, :, None].expand(b, h, 1, dv), value_states)
            self.positions.scatter_(1, idx, pos)
            if self.rope is None:
                return self.keys, self.values
            return self.rope.rotate(self.keys, self._rotation(plan, self.positions)), self.values

        past = self.keys
        if self.rope is not None:
            past = self.rope.rotate(past, self._rotation(plan, self.positions))
        out_keys = torch.cat([past, key_states], dim=-2)
        out_values = torch.cat([self.values, value_states], dim=-2)
        if self._wants_copies(plan):
            full_pos = torch.cat([self.positions, plan.q_pos.to(self.positions.device)], dim=1)
            ck, cv = self._sink_copies(torch.cat([self.keys, stored], dim=-2), out_values, full_pos, plan)
            out_keys = torch.cat([out_keys, ck], dim=-2)
            out_values = torch.cat([out_values, cv], dim=-2)
        # Survivors: each row's sinks and its last w - s real tokens; the rest go to a scratch slot.
        qp = plan.q_pos.to(self.positions.device)
        lo = plan.next_pos.to(qp.device) - (self.window - self.sinks)
        keep = (qp >= 0) & ((qp < self.sinks) | (qp >= lo[:, None]))
        idx = torch.where(keep, self._ring_index(qp.clamp(min=0)), self.window)
        ext_k = torch.cat([self.keys, self.keys.new_zeros((b, h, 1, dk))], dim=-2)
        ext_v = torch.cat([self.values, self.values.new_zeros((b, h, 1, dv))], dim=-2)
        ext_p = torch.cat([self.positions, self.positions.new_full((b, 1), -1)], dim=1)
        ext_k.scatter_(2, idx[:, None, :, None].expand(b, h, c, dk), stored)
        ext_v.scatter_(2, idx[:, None, :, None].expand(b, h, c, dv), value_states)
        ext_p.scatter_(1, idx, qp)
        # copy_ (not rebinding) keeps the buffers' addresses, which compiled graphs rely on.
        self.keys.copy_(ext_k[:, :, : self.window])
        self.values.copy_(ext_v[:, :, : self.window])
        self.positions.copy_(ext_p[:, : self.window])
        return out_keys, out_values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        plan = self._plan(query_length)
        q_pos = plan.q_pos
        slot_pos = self._slot_pos(q_pos.shape[0], q_pos.device)
        if self._is_decode(plan):
            # The slot this step will overwrite already shows the query's own position.
            idx = self._ring_index(q_pos)
            arange = torch.arange(self.window, device=q_pos.device)[None]
            kv_pos = torch.where(arange == idx, q_pos, slot_pos)
            return self.window, SlotOffset(0, self.sinks, kv_pos=kv_pos, q_pos=q_pos)
        copies = query_length if self._wants_copies(plan) else 0
        kv_pos = torch.cat([slot_pos, q_pos], dim=1)
        kv_length = self.window + query_length + copies * self.sinks
        return kv_length, SlotOffset(0, self.sinks, kv_pos=kv_pos, q_pos=q_pos, copies=copies)

    def end_step(self, plan: StepPlan) -> None:
        # Counters advance here, outside any compiled region (update() leaves them alone).
        if self.cumulative_length == plan.start:
            self.cumulative_length += plan.q_len

    def load_state(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor | None) -> None:
        # In place: compiled graphs hold the buffers' addresses.
        self.lazy_initialization(keys, values)
        self.keys.copy_(keys)
        self.values.copy_(values)
        self.positions.copy_(positions)

    def reset(self) -> None:
        if self.is_initialized:
            self.keys.zero_()
            self.values.zero_()
            self.positions.fill_(-1)
        self.cumulative_length = 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.is_initialized:
            idx = beam_idx.to(self.keys.device)
            self.keys.copy_(self.keys.index_select(0, idx))
            self.values.copy_(self.values.index_select(0, idx))
            self.positions.copy_(self.positions.index_select(0, idx))

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError(
            "a static sink-window cache has a fixed batch size; build it for the expanded batch "
            "(num_beams * batch) instead of expanding it"
        )

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("a static sink-window cache has a fixed batch size")


class StaticSinkWindowCache(SinkWindowCache):
    """``SinkWindowCache`` of ``StaticSinkWindowLayer`` ring buffers (fixed shapes, for ``torch.compile``)."""

    layer_class = StaticSinkWindowLayer
    is_static = True


def _rows_state(states: list[dict], rows: list[list[int]]) -> dict:
    """The state of a cache whose rows are ``rows[k]`` of ``states[k]``, in order."""
    if not states or not any(rows):
        raise ValueError("no rows to put in the cache")
    pick = [(st, torch.as_tensor(r, dtype=torch.long)) for st, r in zip(states, rows) if r]
    layers = []
    for i in range(len(states[0]["layers"])):
        parts = [(st["layers"][i], idx) for st, idx in pick]
        if any(part["keys"] is None for part, _ in parts):
            raise ValueError("every row must have seen a token before its rows can be stacked")
        layers.append(
            {
                name: torch.cat(
                    [part[name].index_select(0, idx.to(part[name].device)) for part, idx in parts]
                )
                for name in ("keys", "values", "positions")
            }
            # Rows keep their own positions (real_seen, slot positions); the column counter only
            # tells a first forward (evict's dense prompt) from a continuation, so any row's will do.
            | {"cumulative_length": max(part["cumulative_length"] for part, _ in parts)}
        )
    out = dict(states[0])
    out["padded"] = True
    out["real_seen"] = torch.cat(
        [st["real_seen"].index_select(0, idx.to(st["real_seen"].device)) for st, idx in pick]
    )
    out["layers"] = layers
    return out


def stack_rows(into: StaticSinkWindowCache, caches: list[StaticSinkWindowCache]) -> StaticSinkWindowCache:
    """Fill ``into`` (a fresh cache from the same ``make_cache(model, static=True)``) with every row
    of ``caches``, in order: a batch whose rows keep their own positions, sinks and window.

    Each row is decoded exactly as it would be alone: its keys, slot positions and real-token count
    travel with it (``[rows, kv_heads, w, head_dim]`` buffers, ``real_seen [rows]``). What serving
    uses to let requests join a running batch between decode steps.
    """
    states = [c.state_dict() for c in caches]
    into.load_state_dict(_rows_state(states, [list(range(st["real_seen"].shape[0])) for st in states]))
    return into


def take_rows(
    into: StaticSinkWindowCache, cache: StaticSinkWindowCache, rows: list[int]
) -> StaticSinkWindowCache:
    """Fill ``into`` with ``rows`` of ``cache`` (copies), e.g. a batch without the requests that left,
    or one request's row on its own."""
    into.load_state_dict(_rows_state([cache.state_dict()], [list(rows)]))
    return into

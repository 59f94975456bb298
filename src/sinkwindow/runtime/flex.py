"""FlexAttention path for SWA(w, s): block-sparse attention over our cache's slot layout.

``apply(model, spec, attn_implementation="flex")`` registers ``sinkwindow_flex`` (``attention.register_attention``):
an attention function and a mask builder of the same name, like ``sinkwindow_sdpa``. The builder
returns a FlexAttention ``BlockMask`` for the calls where flex pays (``use_flex``) and the family's
own boolean SDPA (or additive eager) mask for the others; the attention function runs whichever it is
given. Both masks come from the same positions (``masks.slot_layout``: the cache's ``SlotOffset``,
sinks first then recent keys, per-row positions under padding, private sink copies in cache position
mode) and the same rule (``masks.physical_mask_function`` over ``masks.sink_window_mask_function``),
so the ``mask_mod`` here and the dense mask cannot disagree.

**Building the BlockMask in O(n·w).** ``create_block_mask`` evaluates the mask on every (query, key)
pair: O(n²) time (0.56 s at 8K on one CPU thread) and, uncompiled, O(n²) memory. Here the block
structure is found in two steps: a conservative bound from each 128-block's smallest and largest
position keeps the key blocks that *may* hold a visible key (causal: some key at or before the
block's last query; SWA: a sink, or a key within w - s of its first query; copies: its own
queries' copies), then the mask function itself is evaluated on exactly those tiles, which
classifies each as empty, partial or full. The bound may keep too many tiles, never too few
(``tests/test_flex.py`` checks the BlockMask against the dense mask on every layout). Block masks are
cached per call shape and positions (``_BlockMaskCache``): repeated calls on the same layout, or a
model's several mask calls in one forward, build once.

**The kernel's ``mask_mod``** reads no table whose size follows the call: inductor's CPU flex
template (torch 2.13) fails to compile such mask_mods once shapes turn dynamic. Each row's positions
are kept as at most ``RUNS`` runs (first slot, end slot, first position: sinks, recent keys, a ring
buffer's wrap, the chunk) in a fixed-size table, the sink copies in closed form, and both are
checked equal to the layout's own tables, slot by slot, when the mask is built; a layout with more
runs runs SDPA. The compiled kernel keeps lengths dynamic and the batch static (one graph per batch
size).

**When flex is chosen** (``use_flex``): for calls with at least ``CPU_MIN_QUERIES`` = 768 queries
(``FlexOptions.min_queries`` overrides it), the SDPA path for the others. The rule is measured, not
guessed: ``benchmarks/prefill_flex.py --crossover`` times what one model call costs each way (the
mask build, once, plus one attention call per layer; SmolLM2-135M: 30 layers, 9 heads x 64, 3 KV
heads; SWA(256, 4); a chunk of q queries over the w - 1 cached keys plus itself; torch 2.13, CPU, one
thread, a loaded 2-core machine, median of 5). Flex over SDPA with the dense mask: 0.17x for a
decode step (q = 1: 10.7 ms vs 1.8 ms), 0.54-0.73x from q = 16 to 512 (an earlier run of 3: 1.03x
at 512), 1.48x at 768, 1.43x at 1024, 2.8x at 2048; the attention op alone at 8K is 9-11x faster,
its mask 17-21x cheaper to build (0.05 s vs 0.8-1.1 s). So decode steps and chunks up to
``prefill``'s default 512 stay on SDPA (the dense mask is small there, and flex's per-call overhead
is larger than the masked keys it skips), and long one-shot forwards and large chunks take flex.

- CPU needs ``torch.compile``: the unfused eager kernel materialises the full score matrix, slower
  than SDPA at every size. ``FlexOptions(compile=False)`` (tests) still runs flex as told.
- CUDA was not measured here; the same threshold applies until a GPU run says otherwise (a masked
  SDPA call gets no fused kernel there, so flex should pay from fewer queries, not more).

**Fallback.** Where flex cannot run (a torch without ``flex_attention``, CPU before torch 2.6, a
compile or kernel error for a shape or device, dropout in training), the call runs the SDPA (or
eager) path with the same mask rule, and one log line says why; a device that failed once stays on
SDPA for the rest of the process. It never falls back to full attention.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .masks import (
    physical_mask_function,
    route_mask_call,
    sink_window_mask_function,
    sinkwindow_eager_mask,
    sinkwindow_sdpa_mask,
    slot_layout,
)
from .plan import config_plan

try:  # torch >= 2.5
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # pragma: no cover - old torch
    BlockMask = flex_attention = None

__all__ = [
    "FLEX_NAME",
    "BLOCK",
    "CPU_MIN_QUERIES",
    "FlexOptions",
    "OPTIONS",
    "flex_unavailable_reason",
    "use_flex",
    "sink_window_block_mask",
    "sinkwindow_flex_mask",
    "flex_attention_forward",
    "fallback_mask",
    "clear_cache",
]

logger = logging.getLogger(__name__)

FLEX_NAME = "sinkwindow_flex"
BLOCK = 128  # FlexAttention's sparse block size (query and key tiles)
# Queries per call from which compiled flex beats SDPA with the dense mask on CPU (module docstring).
CPU_MIN_QUERIES = 768
# Graphs the compiled flex may hold (batch sizes x dtypes x layouts x (w, s)); dynamo's default is 8.
RECOMPILE_LIMIT = 32
# Elements of one batch of tiles evaluated at once while building a BlockMask (bounds its memory).
_TILE_BUDGET = 1 << 24
# Position runs per row (and rows per block of the run table) a kernel's mask_mod holds in closed form
# (``_runs``): sinks, recent keys, the chunk, and a ring buffer's wrap need at most 4.
RUNS = 4
ROWS = 64


@dataclass
class FlexOptions:
    """Process-wide settings of the flex path.

    Attributes:
        compile: run ``torch.compile``d ``flex_attention`` (the fused kernel). ``False`` runs the
            unfused eager kernel, which materialises the scores: for tests on small shapes only.
        min_queries: use flex for calls with at least this many queries; ``None``: the measured
            default (``CPU_MIN_QUERIES``). ``1`` sends every call (decode steps too) through flex.
    """

    compile: bool = True
    min_queries: int | None = None


OPTIONS = FlexOptions()

_WARNED: set[str] = set()
_BROKEN: dict[str, str] = {}  # device type -> why flex failed there
_COMPILED: Callable | None = None


def _warn_once(reason: str) -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        logger.warning("FlexAttention unavailable (%s); running SWA(w, s) through SDPA", reason)


def flex_unavailable_reason(device: torch.device | str) -> str | None:
    """Why flex cannot run on ``device`` in this process (one line), or ``None`` if it can."""
    device = torch.device(device)
    if flex_attention is None:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention (needs 2.5+)"
    if device.type in _BROKEN:
        return _BROKEN[device.type]
    if device.type == "cpu":
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
        if (major, minor) < (2, 6):
            return f"flex_attention runs on CPU from torch 2.6, this is {torch.__version__}"
    return None


def use_flex(q_length: int, device: torch.device | str) -> bool:
    """Whether a call of ``q_length`` queries on ``device`` runs flex (the rule in the module docstring)."""
    if flex_unavailable_reason(device) is not None:
        return False
    threshold = OPTIONS.min_queries if OPTIONS.min_queries is not None else CPU_MIN_QUERIES
    return q_length >= threshold


def _pad(t: torch.Tensor, length: int) -> torch.Tensor:
    """Pad the last dim to ``length`` with -1 (never seen, sees nothing): tiles past the call's end."""
    return torch.nn.functional.pad(t, (0, length - t.shape[-1]), value=-1)


def _block_bounds(pos: torch.Tensor, valid: torch.Tensor, blocks: int):
    """Per block of BLOCK slots: ``(any valid, smallest, largest valid position)``, each ``[rows, blocks]``."""
    rows = pos.shape[0]
    pos = pos.reshape(rows, blocks, BLOCK)
    valid = valid.reshape(valid.shape[0], blocks, BLOCK).expand(rows, -1, -1)
    big = torch.iinfo(pos.dtype).max
    lo = torch.where(valid, pos, big).amin(-1)
    hi = torch.where(valid, pos, -1).amax(-1)
    return valid.any(-1), lo, hi


def _candidate_blocks(q_tab, kv_tab, owner_tab, window, sinks, nq, nk):
    """``[rows, nq, nk]`` bool: key blocks that may hold a key visible to some query of the query block.

    A conservative bound on ``sink_window_mask_function`` (a superset of the tiles it admits): a query
    at i sees key j only if ``0 <= j <= i`` and (``j < s`` or ``j > i - (w - s)``); a copy slot only
    from its own query.
    """
    q_any, q_lo, q_hi = _block_bounds(q_tab, q_tab >= 0, nq)
    main = kv_tab >= 0
    if owner_tab is not None:
        main = main & (owner_tab < 0)
    k_any, k_lo, k_hi = _block_bounds(kv_tab, main, nk)
    cand = q_any[:, :, None] & k_any[:, None, :] & (k_lo[:, None, :] <= q_hi[:, :, None])
    if window is not None:
        near = k_hi[:, None, :] > q_lo[:, :, None] - (window - sinks)
        cand = cand & ((k_lo[:, None, :] < sinks) | near)
    if owner_tab is not None:
        copy = (kv_tab >= 0) & (owner_tab >= 0)
        c_any, o_lo, o_hi = _block_bounds(owner_tab[None].expand_as(kv_tab), copy, nk)
        rows_lo = torch.arange(nq, device=kv_tab.device) * BLOCK
        own = (o_lo[:, None, :] <= rows_lo[None, :, None] + BLOCK - 1) & (
            o_hi[:, None, :] >= rows_lo[None, :, None]
        )
        cand = cand | (q_any[:, :, None] & c_any[:, None, :] & own)
    return cand


def _ordered(selected: torch.Tensor, idx: torch.Tensor, nk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FlexAttention's ``(num_blocks [rows, 1, nq], indices [rows, 1, nq, nk])`` of the selected tiles."""
    rows, nq, k = selected.shape
    order = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True)  # selected first, ascending
    indices = torch.zeros((rows, nq, nk), dtype=torch.int32, device=idx.device)
    indices[..., :k] = idx.gather(-1, order).to(torch.int32)
    return selected.sum(-1).to(torch.int32)[:, None], indices[:, None]


def sink_window_block_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int,
    kv_offset: int,
    window: int | None,
    sinks: int,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
) -> BlockMask | None:
    """The SWA(w, s) ``BlockMask`` over the physical key slots; arguments as ``masks.build_sink_window_mask``.

    Returns:
        A ``BlockMask`` of batch ``batch_size`` (or 1 when every row shares one layout), one head
        (broadcast), ``BLOCK`` x ``BLOCK`` tiles, whose ``mask_mod`` equals the boolean mask; ``None``
        for a layout its ``mask_mod`` cannot express (more than ``RUNS`` position runs in a row).
    """
    layout = slot_layout(q_length, kv_length, q_offset, kv_offset, window, sinks, attention_mask, device)
    return _CACHE.get(layout, window, sinks, q_length, kv_length, batch_size)


def _runs(table: torch.Tensor) -> torch.Tensor | None:
    """Run-length form of a ``[rows, n]`` position table: ``[cap, RUNS, 3]`` (first slot, end slot, position
    of the first slot) of each maximal run where the position goes up by one per slot (-1 slots are in
    none). ``cap`` is a multiple of ``ROWS`` (filler rows hold empty runs). ``None``: a row has more
    than ``RUNS`` runs.
    """
    rows, n = table.shape
    idx = torch.arange(n, device=table.device)
    valid = table >= 0
    d = table - idx  # constant along a run
    cont = torch.zeros_like(valid)
    cont[:, 1:] = valid[:, 1:] & valid[:, :-1] & (d[:, 1:] == d[:, :-1])  # slot continues the previous run
    starts = valid & ~cont
    ends = valid & ~torch.cat([cont[:, 1:], torch.zeros_like(cont[:, :1])], dim=1)  # last slot of a run
    count = starts.sum(1)
    if int(count.max()) > RUNS:
        return None
    k = min(RUNS, n)
    first = torch.argsort((~starts).to(torch.int8), dim=1, stable=True)[:, :k]
    last = torch.argsort((~ends).to(torch.int8), dim=1, stable=True)[:, :k]
    used = torch.arange(k, device=table.device)[None] < count[:, None]
    cap = ROWS * -(-rows // ROWS)
    runs = torch.zeros((cap, RUNS, 3), dtype=torch.long, device=table.device)
    runs[:rows, :k, 0] = torch.where(used, first, 0)
    runs[:rows, :k, 1] = torch.where(used, last + 1, 0)
    runs[:rows, :k, 2] = torch.where(used, table.gather(1, first), 0)
    return runs


def _run_map(runs: torch.Tensor, per_row: bool) -> Callable:
    """``(batch_idx, idx) -> position`` from ``_runs``' form (-1 outside every run)."""

    def lookup(batch_idx, idx):
        r = runs[batch_idx if per_row else 0]
        pos = None
        for k in range(RUNS):
            a, e, p = r[..., k, 0], r[..., k, 1], r[..., k, 2]
            inside = (idx >= a) & (idx < e)
            pos = torch.where(inside, p + (idx - a), -1 if pos is None else pos)
        return pos

    return lookup


def _position_maps(layout, kv_length: int):
    """``(q_map, kv_map, owner_map)`` for the kernel: the layout's positions in closed form.

    inductor's CPU flex template fails to compile (torch 2.13) ``mask_mod``s that read tables whose
    sizes follow the call's lengths or batch once shapes turn dynamic; these maps read only
    fixed-size run tables (``_runs``) and 0-d tensors. They are checked equal to the layout's tables,
    slot by slot; ``None`` when the layout has no such form (more than ``RUNS`` runs in a row).
    """
    rows = layout.q_pos.shape[0]
    q_runs = _runs(layout.q_pos)
    owner = layout.owner
    n_main = kv_length if owner is None else int((owner < 0).sum())
    kv_runs = _runs(layout.kv_pos[:, :n_main])
    if q_runs is None or kv_runs is None:
        return None
    per_row = rows > 1
    q_map, main_map = _run_map(q_runs, per_row), _run_map(kv_runs, per_row)
    owner_map = None
    kv_map = main_map
    if owner is not None:
        dev, cs = layout.kv_pos.device, layout.copy_sinks
        start = torch.tensor(n_main, device=dev)
        stop = torch.tensor(kv_length, device=dev)

        def in_copies(idx):
            return (idx >= start) & (idx < stop)

        def kv_map(batch_idx, idx):  # copy block t holds sinks 0..s-1 (masks.slot_layout)
            return torch.where(in_copies(idx), (idx - start) % cs, main_map(batch_idx, idx))

        def owner_map(idx):
            return torch.where(in_copies(idx), (idx - start) // cs, -1)

    dev = layout.q_pos.device
    b = torch.arange(rows, device=dev)[:, None]
    same = torch.equal(q_map(b, torch.arange(layout.q_pos.shape[1], device=dev)[None]), layout.q_pos)
    kv_idx = torch.arange(kv_length, device=dev)
    same = same and torch.equal(kv_map(b, kv_idx[None]), layout.kv_pos)
    if owner is not None:
        same = same and torch.equal(owner_map(kv_idx), owner)
    if not same:  # cannot happen for a well-formed layout; the dense mask is always right
        logger.warning("flex: closed-form positions differ from the layout's; this call runs SDPA")
        return None
    return q_map, kv_map, owner_map


def _build(layout, window, sinks, q_length, kv_length) -> BlockMask | None:
    rows = layout.q_pos.shape[0]
    maps = _position_maps(layout, kv_length)
    if maps is None:
        return None
    fn = sink_window_mask_function(window, sinks)
    mask_mod = physical_mask_function(fn, *maps, layout.copy_sinks)

    nq, nk = -(-q_length // BLOCK), -(-kv_length // BLOCK)
    q_tab = _pad(layout.q_pos, nq * BLOCK)
    kv_tab = _pad(layout.kv_pos, nk * BLOCK)
    owner_tab = None if layout.owner is None else _pad(layout.owner, nk * BLOCK)
    cand = _candidate_blocks(q_tab, kv_tab, owner_tab, window, sinks, nq, nk)
    k = max(1, int(cand.sum(-1).max()))
    idx = torch.argsort((~cand).to(torch.int8), dim=-1, stable=True)[..., :k]  # candidates first, ascending
    sel = cand.gather(-1, idx)
    partial = torch.zeros_like(sel)
    full = torch.zeros_like(sel)
    dev = q_tab.device
    arange = torch.arange(BLOCK, device=dev)
    b_idx = torch.arange(rows, device=dev)[:, None, None, None, None]
    h_idx = torch.zeros((), dtype=torch.long, device=dev)
    step = max(1, _TILE_BUDGET // (rows * k * BLOCK * BLOCK))
    for a in range(0, nq, step):
        z = min(nq, a + step)
        q_idx = (torch.arange(a, z, device=dev)[:, None] * BLOCK + arange)[None, :, None, :, None]
        kv_idx = (idx[:, a:z, :, None] * BLOCK + arange)[:, :, :, None, :]
        # The kernel's own mask_mod on each candidate tile (indices past the call's ends map to -1).
        tile = mask_mod(b_idx, h_idx, q_idx, kv_idx)  # [rows, z - a, k, BLOCK, BLOCK]
        seen, every = tile.any(-1).any(-1), tile.all(-1).all(-1)
        partial[:, a:z] = sel[:, a:z] & seen & ~every
        full[:, a:z] = sel[:, a:z] & every
    kv_num, kv_indices = _ordered(partial, idx, nk)
    full_num, full_indices = _ordered(full, idx, nk)
    return BlockMask.from_kv_blocks(
        kv_num, kv_indices, full_num, full_indices, BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
        seq_lengths=(q_length, kv_length),
    )  # fmt: skip


class _BlockMaskCache:
    """Block masks by call shape and positions (a few, least recently used first out).

    The key is the shape (rows, lengths, w, s, device); an entry is reused only when the call's
    position tables are equal to those it was built from, so a changed plan never reads a stale mask.
    """

    def __init__(self, size: int = 8):
        self.size = size
        self.entries: OrderedDict = OrderedDict()
        self.hits = self.misses = 0

    def get(self, layout, window, sinks, q_length, kv_length, batch_size) -> BlockMask | None:
        dev = layout.q_pos.device
        key = (str(dev), layout.q_pos.shape[0], q_length, kv_length, window, sinks, layout.copy_sinks)
        for tables, bm in self.entries.get(key, []):
            if all(_same(a, b) for a, b in zip(tables, layout)):
                self.hits += 1
                self.entries.move_to_end(key)
                return bm
        self.misses += 1
        bm = _build(layout, window, sinks, q_length, kv_length)
        self.entries.setdefault(key, []).insert(0, (tuple(layout), bm))
        del self.entries[key][2:]
        self.entries.move_to_end(key)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return bm

    def clear(self) -> None:
        self.entries.clear()
        self.hits = self.misses = 0


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    return a == b


_CACHE = _BlockMaskCache()


def clear_cache() -> None:
    """Drop the cached block masks (and their hit counts)."""
    _CACHE.clear()


def sinkwindow_flex_mask(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int = 0,
    kv_offset: int = 0,
    mask_function: Callable | None = None,
    attention_mask: torch.Tensor | None = None,
    local_size: int | None = None,
    config=None,
    device: torch.device | str = "cpu",
    **kwargs,
):
    """Mask builder registered with ``AttentionMaskInterface`` for ``sinkwindow_flex``.

    Returns a ``BlockMask`` when ``use_flex`` picks flex for this call, else what the family's own
    builder returns (``sinkwindow_sdpa_mask``'s bool mask, or ``sinkwindow_eager_mask``'s additive one
    for families without SDPA). A BlockMask remembers how to build that other mask
    (``fallback_mask``), for a call that flex then refuses.
    """
    plan = config_plan(config)
    # The family's non-flex path (``AttentionPlan.fallback``): its SDPA, else its eager attention.
    builder = sinkwindow_eager_mask if plan is not None and plan.fallback == "eager" else sinkwindow_sdpa_mask
    args = dict(
        batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset, kv_offset=kv_offset,
        attention_mask=attention_mask, local_size=local_size, config=config, device=device, **kwargs,
    )  # fmt: skip
    if mask_function is not None:
        args["mask_function"] = mask_function
    q_off, kv_off, window_sinks = route_mask_call(config, local_size, q_offset, kv_offset)
    if window_sinks is None or not use_flex(q_length, device):
        reason = flex_unavailable_reason(device)
        if reason is not None:
            _warn_once(reason)
        return builder(**args)
    bm = sink_window_block_mask(
        batch_size, q_length, kv_length, q_off, kv_off, *window_sinks, attention_mask, device
    )
    if bm is None:
        _warn_once(f"a slot layout with more than {RUNS} position runs per row")
        return builder(**args)
    bm._sinkwindow_fallback = lambda: builder(**args)
    return bm


def fallback_mask(block_mask):
    """The SDPA (or eager) mask of the call ``block_mask`` was built for (same positions, same rule)."""
    make = getattr(block_mask, "_sinkwindow_fallback", None)
    if make is None:
        raise ValueError(
            "this BlockMask was not made by sinkwindow_flex_mask; there is no mask to fall back to"
        )
    return make()


def _flex_fn() -> Callable:
    global _COMPILED
    if not OPTIONS.compile or torch.compiler.is_compiling():
        # Inside a compiled model dynamo traces flex_attention itself.
        return flex_attention
    if _COMPILED is None:
        _COMPILED = torch.compile(flex_attention)
    return _COMPILED


def _batch_tensors(block_mask) -> list[torch.Tensor]:
    names = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices",
             "q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")  # fmt: skip
    return [t for t in (getattr(block_mask, n, None) for n in names) if isinstance(t, torch.Tensor)]


def flex_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None] | None:
    """Attention through ``flex_attention`` with our BlockMask; ``None`` when flex cannot run this call.

    Args:
        query: ``[batch, heads, q, head_dim]``; key, value: ``[batch, kv_heads, kv, head_dim]``.
        softcap: Gemma 2's attention logit softcap, applied as a ``score_mod`` like its eager attention.

    Returns:
        ``([batch, q, heads, head_dim], None)`` like every transformers attention function, or ``None``
        (logged once) so the caller runs the SDPA path instead.
    """
    reason = flex_unavailable_reason(query.device)
    if reason is None and module.training and dropout > 0:
        reason = "flex_attention has no attention dropout (training with dropout > 0)"
    if reason is not None:
        _warn_once(reason)
        return None
    score_mod = None
    if softcap is not None:

        def score_mod(score, b, h, q_idx, kv_idx):
            return softcap * torch.tanh(score / softcap)

    gqa = query.shape[1] != key.shape[1]
    fn = _flex_fn()
    try:
        if fn is _COMPILED:
            # Lengths go dynamic after the first recompile, the batch stays static (one graph per
            # batch size): inductor's CPU template miscompiles a dynamic batch with per-row mask_mods.
            for t in (query, key, value, *_batch_tensors(block_mask)):
                torch._dynamo.mark_static(t, 0)
            # Past the recompile limit dynamo would run the unfused kernel (n x n scores) without a
            # word; make that an error, so the call falls back to SDPA with a log line instead.
            with torch._dynamo.config.patch(
                recompile_limit=RECOMPILE_LIMIT, fail_on_recompile_limit_hit=True
            ):
                out = fn(
                    query,
                    key,
                    value,
                    score_mod=score_mod,
                    block_mask=block_mask,
                    scale=scaling,
                    enable_gqa=gqa,
                )
        else:
            out = fn(
                query, key, value, score_mod=score_mod, block_mask=block_mask, scale=scaling, enable_gqa=gqa
            )
    except Exception as err:  # a compile or kernel failure: this device runs SDPA from now on
        if torch.compiler.is_compiling():
            raise
        reason = f"flex_attention failed on {query.device.type}: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        _BROKEN[query.device.type] = reason
        _warn_once(reason)
        return None
    return out.transpose(1, 2).contiguous(), None

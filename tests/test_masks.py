"""build_sink_window_mask against the SWA(w, s) formula, over every slot layout the caches report.

Model-free. The expected masks come from the formula itself, written out below over positions the
test derives from the layout on its own (never through ``masks.py``'s helpers): query at position i
sees key j iff ``j <= i and (j < s or j > i - (w - s))``; positions count each row's real tokens, and
padding (position -1) is never seen and sees nothing.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from sinkwindow.runtime.cache import SlotOffset
from sinkwindow.runtime.masks import build_sink_window_mask, sinkwindow_eager_mask, sinkwindow_sdpa_mask
from sinkwindow.runtime.plan import AttentionPlan, bind
from sinkwindow.runtime.reference import reference_mask
from sinkwindow.runtime.spec import parse_spec

# (w, s): sinks from none to w - 1; windows that lengths below are not multiples of.
WINDOWS = [(5, 0), (5, 2), (8, 3), (8, 7), (6, 1)]
WS_IDS = [f"W{w}-S{s}" for w, s in WINDOWS]


def allowed(i: int, j: int, window: int | None, sinks: int) -> bool:
    """The formula, over positions; -1 is padding (or an empty slot)."""
    if i < 0 or j < 0 or j > i:
        return False
    return window is None or j < sinks or j > i - (window - sinks)


def expected(q_pos: list[list[int]], kv_pos: list[list[int]], window: int | None, sinks: int) -> torch.Tensor:
    """``(batch, 1, q, kv)`` bool from per-row query and key positions (lists of lists)."""
    rows = [
        [[allowed(i, j, window, sinks) for j in kv_row] for i in q_row]
        for q_row, kv_row in zip(q_pos, kv_pos)
    ]
    return torch.tensor(rows, dtype=torch.bool)[:, None]


def real_positions(mask_row: list[int]) -> list[int]:
    """Position of each column among the row's real tokens, -1 for padding (counted by hand)."""
    out, seen = [], 0
    for m in mask_row:
        out.append(seen if m else -1)
        seen += bool(m)
    return out


def assert_at_most_window(mask: torch.Tensor, window: int | None) -> None:
    if window is not None:
        assert int(mask.sum(-1).max()) <= window, "a query admits more than W keys"


@pytest.mark.parametrize("window,sinks", WINDOWS, ids=WS_IDS)
@pytest.mark.parametrize("length", [1, 7, 13, 29], ids=lambda n: f"T{n}")
def test_uncached_forward_matches_formula_and_reference(window, sinks, length):
    """One forward over positions 0..L-1: the formula, the fp64 reference's mask, exactly min(i+1, w) keys."""
    mask = build_sink_window_mask(2, length, length, 0, 0, window, sinks)
    pos = [list(range(length))] * 2
    assert mask.shape == (2, 1, length, length) and mask.dtype == torch.bool
    assert torch.equal(mask, expected(pos, pos, window, sinks))
    assert torch.equal(mask[0, 0], reference_mask(length, window, sinks))
    counts = mask[0, 0].sum(-1)
    assert counts.tolist() == [min(i + 1, window) for i in range(length)]


@pytest.mark.parametrize("window,sinks", WINDOWS, ids=WS_IDS)
@pytest.mark.parametrize("q_offset,q_len", [(0, 5), (3, 4), (11, 1), (17, 9)], ids=lambda x: str(x))
def test_query_offset_over_an_uncropped_cache(window, sinks, q_offset, q_len):
    """A cache holding every key (stock DynamicCache, kv_offset 0): queries start at column q_offset."""
    kv_len = q_offset + q_len
    mask = build_sink_window_mask(1, q_len, kv_len, q_offset, 0, window, sinks)
    q_pos = [list(range(q_offset, kv_len))]
    assert torch.equal(mask, expected(q_pos, [list(range(kv_len))], window, sinks))
    assert mask[0, 0].sum(-1).tolist() == [min(i + 1, window) for i in q_pos[0]]


@pytest.mark.parametrize("window,sinks", WINDOWS, ids=WS_IDS)
@pytest.mark.parametrize("seen,chunk", [(0, 3), (2, 5), (9, 1), (13, 4), (29, 11)], ids=lambda x: str(x))
def test_contiguous_bounded_layout(window, sinks, seen, chunk):
    """SinkWindowLayer's contiguous layout: slots 0..s-1 hold the sinks, slot p >= s holds offset + p.

    After ``seen`` tokens the layer persists the sinks and the last w - s - 1 keys (w - 1 in all), then
    appends the chunk; every query still sees exactly min(i + 1, w) keys, so none is missing.
    """
    n = min(seen, window - 1)
    recent = n - min(sinks, n)
    kv_pos = list(range(min(sinks, n))) + list(range(seen - recent, seen)) + list(range(seen, seen + chunk))
    offset = SlotOffset(seen - n, sinks)
    mask = build_sink_window_mask(3, chunk, n + chunk, seen, offset, window, sinks)
    q_pos = [list(range(seen, seen + chunk))]
    assert mask.shape == (3, 1, chunk, n + chunk)
    assert torch.equal(mask[:1], expected(q_pos, [kv_pos], window, sinks))
    assert mask[0, 0].sum(-1).tolist() == [min(i + 1, window) for i in q_pos[0]]
    assert_at_most_window(mask, window)


@pytest.mark.parametrize("window,sinks", WINDOWS, ids=WS_IDS)
@pytest.mark.parametrize("seed", range(4))
def test_per_row_layout_with_padding_and_empty_slots(window, sinks, seed):
    """Padded batches and the static ring buffer: per-row slot positions in any order, -1 for empty slots."""
    g = torch.Generator().manual_seed(seed)
    batch, q_len = 3, 1 + seed * 2
    q_rows, kv_rows = [], []
    for _ in range(batch):
        seen = int(torch.randint(0, 25, (1,), generator=g))
        keep = list(range(min(sinks, seen))) + list(range(max(sinks, seen - (window - sinks - 1)), seen))
        slots = keep + [-1] * int(torch.randint(0, 3, (1,), generator=g))  # unused ring slots
        slots = [slots[k] for k in torch.randperm(len(slots), generator=g).tolist()]
        real = torch.rand(q_len, generator=g) > 0.3  # left/right padding inside the chunk
        q_row, nxt = [], seen
        for r in real.tolist():
            q_row.append(nxt if r else -1)
            nxt += r
        q_rows.append(q_row)
        kv_rows.append(slots + q_row)
    width = max(len(r) for r in kv_rows)
    kv_rows = [r[:-q_len] + [-1] * (width - len(r)) + r[-q_len:] for r in kv_rows]  # same slot count per row
    offset = SlotOffset(0, sinks, kv_pos=torch.tensor(kv_rows), q_pos=torch.tensor(q_rows))
    mask = build_sink_window_mask(batch, q_len, width, 0, offset, window, sinks)
    want = expected(q_rows, kv_rows, window, sinks)
    assert torch.equal(mask, want)
    assert_at_most_window(mask, window)
    kv = torch.tensor(kv_rows)[:, None, None, :].expand_as(mask)
    assert not mask[kv < 0].any(), "an empty or padding slot is attended"
    assert not mask[:, 0][torch.tensor(q_rows) < 0].any(), "a padding query attends something"
    # Every real query sees itself and exactly min(i + 1, w) keys: the layout held all it needs.
    for b, t in itertools.product(range(batch), range(q_len)):
        i = q_rows[b][t]
        if i >= 0:
            assert int(mask[b, 0, t].sum()) == min(i + 1, window)


@pytest.mark.parametrize("window,sinks", [(5, 2), (8, 3), (6, 1)], ids=["W5-S2", "W8-S3", "W6-S1"])
@pytest.mark.parametrize("seen,chunk", [(0, 4), (3, 6), (12, 5), (20, 1)], ids=lambda x: str(x))
def test_cache_position_layout_with_private_sink_copies(window, sinks, seen, chunk):
    """positions='cache': each query sees the sinks only through its own copies, appended after the main slots."""
    n = min(seen, window - 1)
    recent = n - min(sinks, n)
    main = list(range(min(sinks, n))) + list(range(seen - recent, seen)) + list(range(seen, seen + chunk))
    offset = SlotOffset(seen - n, sinks, copies=chunk)
    kv_len = len(main) + chunk * sinks
    mask = build_sink_window_mask(1, chunk, kv_len, seen, offset, window, sinks)
    assert mask.shape == (1, 1, chunk, kv_len)
    q_pos = list(range(seen, seen + chunk))
    for t, i in enumerate(q_pos):
        want_main = [j >= sinks and allowed(i, j, window, sinks) for j in main]
        want_copies = [u == t and allowed(i, j, window, sinks) for u in range(chunk) for j in range(sinks)]
        assert mask[0, 0, t].tolist() == want_main + want_copies
        assert int(mask[0, 0, t].sum()) == min(i + 1, window)


@pytest.mark.parametrize("window,sinks", WINDOWS, ids=WS_IDS)
def test_padding_mask_over_a_plain_cache(window, sinks):
    """No slot layout (stock cache or none) with a 2-D padding mask: positions count real tokens only."""
    pad = [[0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 13, [0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1]]
    attention_mask = torch.tensor(pad)
    pos = [real_positions(r) for r in pad]
    mask = build_sink_window_mask(3, 13, 13, 0, 0, window, sinks, attention_mask)
    assert torch.equal(mask, expected(pos, pos, window, sinks))
    assert_at_most_window(mask, window)
    # The sinks are each row's first s real tokens: row 0's first real column (3) is its position 0.
    if sinks:
        assert bool(mask[0, 0, -1, 3]) and not mask[0, 0, :, :3].any()
    # Decoding the last column against a preallocated cache (mask shorter than the cache: unwritten = padding).
    step = build_sink_window_mask(3, 1, 16, 12, 0, window, sinks, attention_mask)
    assert torch.equal(step[..., :13], mask[:, :, -1:])
    assert not step[..., 13:].any()


def test_window_none_is_causal_over_positions():
    """evict's dense prompt: plain causal attention, over real positions and per-row layouts alike."""
    pad = [[0, 1, 1, 1, 1, 1, 1], [1] * 7]
    pos = [real_positions(r) for r in pad]
    mask = build_sink_window_mask(2, 7, 7, 0, 0, None, 0, torch.tensor(pad))
    assert torch.equal(mask, expected(pos, pos, None, 0))
    offset = SlotOffset(0, 2, kv_pos=torch.tensor([[4, -1, 0, 2, 1, 3]]), q_pos=torch.tensor([[3]]))
    row = build_sink_window_mask(1, 1, 6, 0, offset, None, 2)
    assert row[0, 0, 0].tolist() == [False, False, True, True, True, True]


def test_layouts_that_cannot_hold_swa_are_refused():
    """A stock cache that already evicted keys, and padding that reached the mask but not our cache."""
    with pytest.raises(ValueError, match="make_cache"):
        build_sink_window_mask(1, 1, 8, 20, 12, 8, 2)  # the sinks are gone
    with pytest.raises(ValueError, match="make_cache"):
        build_sink_window_mask(1, 1, 5, 20, 15, 8, 0)  # fewer than w - 1 earlier keys left
    # A stock sliding cache that kept w - 1 keys still serves SWA(w, 0) exactly.
    mask = build_sink_window_mask(1, 1, 8, 20, 13, 8, 0)
    assert torch.equal(mask, expected([[20]], [list(range(13, 21))], 8, 0))
    padded = torch.tensor([[0, 1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="padding reached the mask but not the cache"):
        build_sink_window_mask(1, 6, 6, 0, SlotOffset(0, 2), 4, 2, padded)


def test_registered_builders_follow_the_plan_in_the_config():
    """The sdpa builder returns the bool mask, the eager one the additive 0 / dtype-min form of it."""
    from transformers import LlamaConfig

    cfg = LlamaConfig()
    bind([cfg], AttentionPlan(parse_spec("swa:5:2"), "override", "sinkwindow_sdpa", "sdpa"))
    want = build_sink_window_mask(1, 11, 11, 0, 0, 5, 2)
    assert torch.equal(sinkwindow_sdpa_mask(1, 11, 11, config=cfg), want)
    eager = sinkwindow_eager_mask(1, 11, 11, config=cfg, dtype=torch.float64)
    assert eager.dtype == torch.float64
    assert torch.equal(eager == 0, want)
    assert torch.all(eager[~want] == torch.finfo(torch.float64).min)
    # "keep": a native sliding layer (local_size) gets transformers' own window, i.e. SWA(local, 0).
    bind([cfg], AttentionPlan(parse_spec("swa:5:2"), "keep", "sinkwindow_sdpa", "sdpa"))
    assert torch.equal(
        sinkwindow_sdpa_mask(1, 11, 11, local_size=4, config=cfg),
        build_sink_window_mask(1, 11, 11, 0, 0, 4, 0),
    )

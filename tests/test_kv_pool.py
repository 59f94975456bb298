"""The KV pool and the paged cache: the same keys, positions and logits as the dense cache, and memory
bounded by construction (allocated once, blocks in proportion to tokens held, freed explicitly)."""

from __future__ import annotations

import math
import threading

import pytest
import torch

import sinkwindow
from conftest import VOCAB, tiny_model
from sinkwindow.runtime.cache import SinkWindowCache
from sinkwindow.runtime.generate import DecodeStep
from sinkwindow.runtime.kv_pool import KVPool, PoolFullError
from sinkwindow.runtime.paged_cache import PagedSinkWindowCache, pool_shape, ring_positions
from sinkwindow.serve.engine import Engine, Job
from sinkwindow.serve.sessions import SessionStore

HEADS, DIM = 2, 3


def _reference_held(stream: list[torch.Tensor], window: int, sinks: int) -> dict[int, torch.Tensor]:
    """The obvious reference: position -> key of every token SWA(w, s) keeps after ``stream``
    (its first s tokens and its last w - s), from the list of all keys."""
    n = len(stream)
    keep = set(range(min(sinks, n))) | set(range(max(sinks, n - (window - sinks)), n))
    return {p: stream[p] for p in keep}


def _paged_held(cache: PagedSinkWindowCache, row: int, layer: int = 0) -> dict[int, torch.Tensor]:
    """Position -> key of what the paged cache's ``row`` holds, read through its gather path."""
    r = cache.rows[row]
    w, s = cache.layers[layer].window, cache.layers[layer].sinks
    table = r.table(cache.pool.keys.device)[layer]
    pos = ring_positions(torch.tensor([r.seen]), w, s, table.shape[0] * cache.pool.block)[0]
    flat = (table[:, None] * cache.pool.block + torch.arange(cache.pool.block)).reshape(-1)
    keys = cache.pool.flat_keys[flat]  # [slots, heads, dim]
    return {int(p): keys[i] for i, p in enumerate(pos) if p >= 0}


def _feed(cache, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One planned forward of ``keys [rows, heads, c, dim]`` through every layer (values = keys + 1)."""
    cache.begin_step(keys.shape[2], batch_size=keys.shape[0], device="cpu")
    out = [layer.update(keys, keys + 1) for layer in cache.layers]
    cache.end_step()
    return out[0]


@pytest.mark.parametrize("sinks", [0, 4])
@pytest.mark.parametrize("block", [1, 3, 4, 5])
def test_paged_layer_holds_what_the_dense_layer_and_the_reference_hold(sinks, block):
    """Random chunks across block and window boundaries: the paged blocks hold exactly the sinks and
    the last w - s keys (the reference), a superset by one of the dense layer's w - 1, equal where both hold."""
    window, gen = 12, torch.Generator().manual_seed(block * 10 + sinks)
    pool = KVPool(64, layers=2, kv_heads=HEADS, head_dim=DIM, block=block)
    paged = PagedSinkWindowCache([(window, sinks, False)] * 2, pool=pool, rows=[pool.new_row()])
    dense = SinkWindowCache([(window, sinks, False)] * 2)
    stream: list[torch.Tensor] = []
    while len(stream) < 70:
        c = int(torch.randint(1, 9, (1,), generator=gen))
        keys = torch.randn((1, HEADS, c, DIM), generator=gen)
        _feed(paged, keys)
        _feed(dense, keys)
        stream.extend(keys[0, :, t] for t in range(c))
        want = _reference_held(stream, window, sinks)
        for layer in (0, 1):
            got = _paged_held(paged, 0, layer)
            assert sorted(got) == sorted(want), (len(stream), layer)
            assert all(torch.equal(got[p], want[p]) for p in want)
            d = dense.layers[layer]
            dense_pos = d._real_positions()[0].tolist()
            assert set(dense_pos) <= set(got) and len(got) - len(dense_pos) <= 1
            for i, p in enumerate(dense_pos):
                assert torch.equal(d.keys[0, :, i], got[p]) and torch.equal(d.values[0, :, i], got[p] + 1)
        # Blocks held: what min(tokens, w) slots reach, per layer, never more.
        assert pool.used == 2 * math.ceil(min(len(stream), window) / block)


def test_a_batch_of_rows_of_different_lengths_decodes_each_row_as_alone():
    window, sinks, block = 10, 2, 3
    gen = torch.Generator().manual_seed(7)
    pool = KVPool(80, layers=1, kv_heads=HEADS, head_dim=DIM, block=block)
    streams, rows = [], []
    for n in (1, 9, 23):  # under a block, inside the window, past it
        row = pool.new_row()
        keys = torch.randn((1, HEADS, n, DIM), generator=gen)
        _feed(PagedSinkWindowCache([(window, sinks, False)], pool=pool, rows=[row]), keys)
        streams.append([keys[0, :, t] for t in range(n)])
        rows.append(row)
    batch = PagedSinkWindowCache([(window, sinks, False)], pool=pool, rows=rows)
    for _ in range(12):
        keys = torch.randn((3, HEADS, 1, DIM), generator=gen)
        out_keys, _ = _feed(batch, keys)
        for b, stream in enumerate(streams):
            stream.append(keys[b, :, 0])
            want = _reference_held(stream, window, sinks)
            assert {p: k for p, k in _paged_held(batch, b).items()}.keys() == want.keys()
            # The decode step returned exactly those keys (the query's included), padding aside.
            pos = ring_positions(torch.tensor([len(stream)]), window, sinks, out_keys.shape[2])[0]
            returned = {int(p): out_keys[b, :, i] for i, p in enumerate(pos) if p >= 0}
            assert returned.keys() == want.keys() and all(torch.equal(returned[p], want[p]) for p in want)
    assert (
        pool.used
        == sum(r.blocks for r in rows)
        == sum(math.ceil(min(len(s), window) / block) for s in streams)
    )
    for r in rows:
        pool.release(r)
    assert pool.used == 0 and pool.reserved == 0


@torch.no_grad()
@pytest.mark.parametrize("spec", ["swa:8:2", "swa:8:0", "evict:8:2", "swa:8:2:cache"])
def test_pooled_batch_logits_equal_the_dense_cache_alone(spec):
    model = tiny_model("llama")
    sinkwindow.apply(model, spec)
    pool = KVPool(200, block=3, **pool_shape(model))
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, VOCAB, (1, n), generator=gen) for n in (2, 7, 19)]
    dense, rows = [], []
    for ids in prompts:
        d = sinkwindow.make_cache(model)
        sinkwindow.prefill(model, ids, chunk_size=4, cache=d)
        row = pool.new_row()
        sinkwindow.prefill(
            model, ids, chunk_size=4, cache=sinkwindow.make_cache(model, pool=pool, rows=[row])
        )
        dense.append(d)
        rows.append(row)
    step = DecodeStep(model, sinkwindow.make_cache(model, pool=pool, rows=rows))
    for _ in range(14):
        tokens = torch.randint(1, VOCAB, (3, 1), generator=gen)
        got = step(tokens)
        want = torch.cat([DecodeStep(model, d)(tokens[b : b + 1]) for b, d in enumerate(dense)])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# --- the memory promise, through the engine ---------------------------------------------------


def _run(engine: Engine, job: Job) -> list:
    events, done = [], threading.Event()

    def emit(ev):
        events.append(ev)
        if ev[0] != "token":
            done.set()

    job.emit = emit
    engine.submit(job)
    assert done.wait(60)
    return events


@pytest.fixture
def pooled():
    model = tiny_model("llama")
    sinkwindow.apply(model, "swa:8:2")
    return model


def _budget(model, blocks: int, block: int) -> int:
    return blocks * KVPool(2, block=block, **{**pool_shape(model), "device": "meta"}).block_bytes


def test_pool_is_allocated_once_and_sessions_churn_within_it(pooled):
    layers = pooled.config.num_hidden_layers
    engine = Engine(pooled, chunk_size=4, block_size=3, kv_budget=_budget(pooled, 60, 3),
                    sessions=SessionStore(max_sessions=4)).start()  # fmt: skip
    pool = engine.pool
    ptrs = (pool.keys.data_ptr(), pool.values.data_ptr())
    try:
        # A one-token session holds one block per layer.
        _run(engine, Job(prompt=[5], max_new_tokens=1, session="one"))
        assert [len(t) for t in engine.sessions._sessions["one"].kv_row.tables] == [1] * layers
        assert engine.stats()["pool_blocks_used"] == layers
        gen = torch.Generator().manual_seed(0)
        for i in range(40):  # 10x --max-sessions distinct sessions, plus one-off requests
            n = int(torch.randint(1, 20, (1,), generator=gen))
            prompt = torch.randint(2, VOCAB, (n,), generator=gen).tolist()
            _run(engine, Job(prompt=prompt, max_new_tokens=3, session=f"s{i}"))
            _run(engine, Job(prompt=prompt, max_new_tokens=2))
            stats = engine.stats()
            assert stats["pool_blocks_used"] <= stats["pool_blocks"] and stats["sessions"] <= 4
            held = sum(s.kv_row.blocks for s in engine.sessions._sessions.values())
            assert stats["pool_blocks_used"] == held and stats["pool_blocks_reserved"] == 0
        for sid in [s["id"] for s in engine.sessions.rows()]:
            engine.sessions.drop(sid)
        stats = engine.stats()
        assert stats["pool_blocks_used"] == 0 and stats["pool_blocks_free"] == stats["pool_blocks"]
        assert stats["pool_bytes_used"] == 0 and stats["pool_bytes"] == 59 * pool.block_bytes
    finally:
        engine.stop()
    assert (pool.keys.data_ptr(), pool.values.data_ptr()) == ptrs


def test_a_full_pool_refuses_with_later_and_keeps_serving(pooled):
    layers = pooled.config.num_hidden_layers
    # Room for two sequences at their longest (ceil(8 / 4) = 2 blocks a layer), plus the scratch block.
    engine = Engine(pooled, chunk_size=4, block_size=4, kv_budget=_budget(pooled, 4 * layers + 1, 4))
    a, b = Job(prompt=[3] * 10, max_new_tokens=50), Job(prompt=[4] * 10, max_new_tokens=50)
    engine.submit(a)
    engine.submit(b)
    with pytest.raises(PoolFullError, match="retry later") as err:
        engine.submit(Job(prompt=[5, 6], max_new_tokens=1))
    assert err.value.later
    with pytest.raises(PoolFullError, match="retry later"):  # a refused new session is not kept
        engine.submit(Job(prompt=[5, 6], max_new_tokens=1, session="refused"))
    assert len(engine.sessions) == 0 and engine.stats()["pool_blocks_reserved"] == 4 * layers
    engine.start()
    try:
        for job in (a, b):
            while job._row is not None:
                threading.Event().wait(0.01)
        assert engine.stats()["pool_blocks_used"] == 0
        events = _run(engine, Job(prompt=[5, 6], max_new_tokens=3))
        assert events[-1][:2] == ("done", "length")
        # An idle session is evicted to make room, and the eviction is recorded.
        _run(engine, Job(prompt=[3] * 10, max_new_tokens=1, session="idle1"))
        _run(engine, Job(prompt=[3] * 10, max_new_tokens=1, session="idle2"))
        _run(engine, Job(prompt=[7] * 10, max_new_tokens=2))
        assert engine.stats()["pool_evictions"] == 1 and len(engine.sessions) == 1
        assert "pool is full" in engine.sessions.evicted[-1]["reason"]
    finally:
        engine.stop()


def test_a_budget_under_one_sequence_is_refused_at_start(pooled):
    longest = 2 * pooled.config.num_hidden_layers  # ceil(8 / 4) blocks a layer
    need = (longest + 1) * _budget(pooled, 1, 4)  # + the scratch block
    with pytest.raises(ValueError, match=rf"below one session's KV cache at its longest \({longest} blocks of 4 "
                       rf"tokens, swa:8:2\): give --kv-budget {need} or more"):  # fmt: skip
        Engine(pooled, block_size=4, kv_budget=need - 1)
    assert Engine(pooled, block_size=4, kv_budget=need).pool.usable == longest


@torch.no_grad()
def test_paged_full_attention_equals_the_dynamic_cache():
    model = tiny_model("llama")  # unpatched: full attention
    pool = KVPool(40, block=3, **pool_shape(model))
    row = pool.new_row()
    paged, dense = sinkwindow.make_cache(model, pool=pool, rows=[row]), sinkwindow.make_cache(model)
    ids = torch.randint(1, VOCAB, (1, 17), generator=torch.Generator().manual_seed(2))
    want = sinkwindow.prefill(model, ids, chunk_size=5, cache=dense, return_logits="all").logits
    got = sinkwindow.prefill(model, ids, chunk_size=5, cache=paged, return_logits="all").logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for t in range(9):
        tok = torch.tensor([[t + 3]])
        torch.testing.assert_close(
            DecodeStep(model, paged)(tok), DecodeStep(model, dense)(tok), atol=1e-5, rtol=1e-5
        )
    assert (
        row.seen == 26 and [len(t) for t in row.tables] == [9] * model.config.num_hidden_layers
    )  # ceil(26 / 3)


def test_full_attention_requests_that_cannot_fit_get_the_error_while_the_engine_serves():
    model = tiny_model("llama")
    layers = model.config.num_hidden_layers
    engine = Engine(model, chunk_size=4, block_size=4, kv_budget=_budget(model, 10 * layers + 1, 4))
    try:
        assert engine.pool is not None and not engine.batched
        need = 11 * layers  # 41 tokens: 11 blocks a layer, the pool has 10
        with pytest.raises(
            PoolFullError, match=f"reaches 41 tokens, {need} KV blocks, more than the pool's {10 * layers}"
        ) as err:
            engine.submit(Job(prompt=[3] * 40, max_new_tokens=1))
        assert not err.value.later
        long = Job(prompt=[3] * 20, max_new_tokens=16)  # 36 of the 40 tokens the pool holds
        events, done = [], threading.Event()
        long.emit = lambda ev: (events.append(ev), ev[0] != "token" and done.set())
        engine.submit(long)
        with pytest.raises(PoolFullError, match="retry later") as err:
            engine.submit(Job(prompt=[4] * 8, max_new_tokens=4))
        assert err.value.later
        engine.start()
        assert done.wait(60) and events[-1][:2] == ("done", "length")
        assert engine.stats()["pool_blocks_used"] == 0
        assert _run(engine, Job(prompt=[4] * 8, max_new_tokens=4))[-1][:2] == ("done", "length")
    finally:
        engine.stop()


def test_an_unpooled_session_evicted_frees_its_tensors_without_the_collector():
    """A hybrid keeps per-request caches (its full units grow): eviction empties them at once."""
    from sinkwindow.runtime.cache import cache_nbytes

    model = tiny_model("llama")
    sinkwindow.apply(model, "swa:8:2+full:1")
    engine = Engine(model, chunk_size=4, sessions=SessionStore(max_sessions=1)).start()
    try:
        assert engine.pool is None
        _run(engine, Job(prompt=[3] * 12, max_new_tokens=2, session="a"))
        cache = engine.sessions._sessions["a"].cache
        assert cache_nbytes(cache) > 0
        _run(engine, Job(prompt=[4] * 5, max_new_tokens=2, session="b"))
        assert "a" not in engine.sessions._sessions and cache_nbytes(cache) == 0
    finally:
        engine.stop()


def test_the_default_pool_holds_the_running_requests_and_sessions_at_their_longest(pooled):
    engine = Engine(pooled, max_active=3, block_size=4, sessions=SessionStore(max_sessions=5))
    longest = 2 * pooled.config.num_hidden_layers  # ceil(8 / 4) blocks a layer
    assert engine.pool.usable == (3 + 5) * longest and "--max-active + --max-sessions" in engine.pool_note


@torch.no_grad()
@pytest.mark.parametrize("family", ["gemma3_text", "gemma2", "qwen3"])
def test_paged_cache_gives_generate_tokens_with_native_windows_kept(family):
    """Layers of different windows (native local layers kept at 12) each hold the blocks their own window reaches."""
    model = tiny_model(family)
    sinkwindow.apply(model, "swa:8:2", native_sliding="keep")
    ids = torch.randint(1, VOCAB, (1, 30), generator=torch.Generator().manual_seed(3))
    want = sinkwindow.generate(model, ids, 12, chunk_size=7)[0, 30:].tolist()
    pool = KVPool(200, block=4, **pool_shape(model))
    row = pool.new_row()
    cache = sinkwindow.make_cache(model, pool=pool, rows=[row])
    logits = sinkwindow.prefill(model, ids, chunk_size=7, cache=cache).logits.reshape(1, -1, VOCAB)[:, -1]
    step, got = DecodeStep(model, cache), []
    for _ in range(12):
        got.append(int(logits.argmax(-1)))
        logits = step(logits.argmax(-1)[:, None])
    assert got == want
    windows = [layer.window for layer in cache.layers]
    assert [len(t) for t in row.tables] == [math.ceil(w / 4) for w in windows]  # 41 tokens: every window full

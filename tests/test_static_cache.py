"""The static ring-buffer cache: the same tokens as the dynamic cache and the fp64 reference, fixed buffers
written in place, and a torch.compile'd decode step that compiles once and matches the eager one."""

import pytest
import torch

import sinkwindow
from conftest import VOCAB, tiny_model
from sinkwindow.runtime.generate import DecodeStep, decode_speed
from sinkwindow.runtime.reference import reference_greedy


def _ids(length, batch=1, seed=21):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
@pytest.mark.parametrize("spec", ["swa:8:2", "swa:6:0", "swa:8:2:cache", "evict:8:2", "evict:8:2:cache"])
def test_static_cache_decodes_like_dynamic_and_reference(spec):
    model = tiny_model("llama")
    ids = _ids(21, batch=2)
    want = reference_greedy(model, ids, spec, 15)
    sinkwindow.apply(model, spec)
    for chunk in (1, 5, 64):
        got = sinkwindow.generate(model, ids, 15, chunk_size=chunk, static=True)
        assert torch.equal(got, want), chunk


@torch.no_grad()
def test_static_cache_with_native_sliding_layers_and_padding():
    model = tiny_model("gemma3_text")
    sinkwindow.apply(model, "swa:8:2", native_sliding="keep")
    rows = [_ids(19, seed=1), _ids(6, seed=2)]
    ids = torch.zeros(2, 19, dtype=torch.long)
    mask = torch.zeros(2, 19, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, 19 - r.shape[1] :], mask[b, 19 - r.shape[1] :] = r[0], 1
    cache = sinkwindow.make_cache(model, static=True)
    got = sinkwindow.generate(model, ids, 10, attention_mask=mask, chunk_size=4, cache=cache)
    want = sinkwindow.generate(model, ids, 10, attention_mask=mask, chunk_size=4)
    assert torch.equal(got, want)
    assert [layer.keys.shape[-2] for layer in cache.layers] == [12, 12, 8]  # native window 12, SWA window 8


@torch.no_grad()
def test_buffers_are_fixed_and_written_in_place():
    model = tiny_model("llama")
    sinkwindow.apply(model, "swa:8:2")
    cache = sinkwindow.make_cache(model, static=True)
    sinkwindow.prefill(model, _ids(5), chunk_size=2, cache=cache)
    ptrs = [
        (layer.keys.data_ptr(), layer.values.data_ptr(), layer.positions.data_ptr()) for layer in cache.layers
    ]
    layer0 = cache.layers[0]
    returned = []
    orig = layer0.update

    def update(k, v, *a, **kw):
        keys, values = orig(k, v, *a, **kw)
        returned.append((keys.data_ptr(), keys.shape))
        return keys, values

    layer0.update = update
    step = DecodeStep(model, cache)
    for t in range(30):
        step(torch.tensor([[t % 50 + 1]]))
    assert ptrs == [
        (layer.keys.data_ptr(), layer.values.data_ptr(), layer.positions.data_ptr()) for layer in cache.layers
    ]
    # Every decode step attends over the buffer itself: no new key tensor, no new shape.
    assert set(returned) == {(layer0.keys.data_ptr(), torch.Size([1, 2, 8, 8]))}
    # Slots hold the sinks and the last w - s tokens (the latest query included).
    assert sorted(layer0.positions[0].tolist()) == [0, 1, *range(35 - 6, 35)]
    assert cache.get_seq_length() == 35


@torch.no_grad()
@pytest.mark.parametrize("spec", ["swa:8:2", "swa:8:2:cache"])
def test_compiled_decode_step_matches_eager(spec):
    from torch._dynamo.utils import counters

    model = tiny_model("llama")
    sinkwindow.apply(model, spec)
    prompt = _ids(13, batch=2)
    feed = _ids(12, batch=2, seed=3)
    caches, logits = [], []
    for compile_ in (False, True):
        cache = sinkwindow.make_cache(model, static=True)
        sinkwindow.prefill(model, prompt, chunk_size=5, cache=cache)
        caches.append(cache)
        # fullgraph: the whole decode step traces as one graph; the "eager" backend keeps the test quick
        # (decode_speed measures inductor).
        kw = {"backend": "eager", "fullgraph": True} if compile_ else {}
        step = DecodeStep(model, cache, compile=compile_, **kw)
        torch._dynamo.reset()
        counters.clear()
        logits.append(torch.stack([step(feed[:, t : t + 1]) for t in range(feed.shape[1])]))
        if compile_:
            assert counters["stats"]["unique_graphs"] == 1  # compiled once, no recompilation per token
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)
    for a, b in zip(caches[0].layers, caches[1].layers):
        torch.testing.assert_close(a.keys, b.keys)
        assert torch.equal(a.positions, b.positions)


@torch.no_grad()
def test_decode_speed_reports_eager_and_compiled():
    model = tiny_model("llama")
    res = decode_speed(model, "swa:8:2", context=20, tokens=3, warmup=2, backend="eager")
    assert res["spec"] == "swa:8:2" and res["tokens"] == 3
    assert res["eager_ms_per_token"] > 0 and res["compiled_ms_per_token"] > 0 and res["speedup"] > 0
    assert res["max_abs_logit_diff"] < 1e-4
    assert sinkwindow.active_spec(model).is_full  # the model is left as it was


@torch.no_grad()
@pytest.mark.parametrize("static", [False, True])
def test_cache_state_round_trip_resumes_a_stream(static):
    model = tiny_model("llama")
    sinkwindow.apply(model, "swa:8:2:cache")
    ids = _ids(40)
    whole, _ = sinkwindow.prefill(
        model, ids, chunk_size=3, cache=sinkwindow.make_cache(model, static=static), return_logits="all"
    )
    _, first = sinkwindow.prefill(
        model, ids[:, :23], chunk_size=3, cache=sinkwindow.make_cache(model, static=static)
    )
    resumed = sinkwindow.make_cache(model, static=static)
    resumed.load_state_dict({**first.state_dict()})
    rest, _ = sinkwindow.prefill(model, ids[:, 23:], chunk_size=3, cache=resumed, return_logits="all")
    torch.testing.assert_close(rest, whole[:, 23:], atol=1e-5, rtol=1e-5)


def test_unsupported_uses_are_refused_clearly():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="static=True needs a sink-window spec"):
        sinkwindow.make_cache(model, static=True)
    sinkwindow.apply(model, "swa:8:2")
    with pytest.raises(ValueError, match="fixed shapes.*static=True"):
        DecodeStep(model, sinkwindow.make_cache(model), compile=True)
    cache = sinkwindow.make_cache(model, static=True)
    with torch.no_grad():
        sinkwindow.prefill(model, _ids(5), cache=cache)
    with pytest.raises(NotImplementedError, match="fixed batch size"):
        cache.batch_repeat_interleave(2)
    with pytest.raises(NotImplementedError, match="speculative"):
        cache.crop(-1)


@torch.no_grad()
@pytest.mark.parametrize("spec", ["swa:8:2", "swa:8:2:cache"])
def test_rows_of_different_lengths_decode_together_as_they_do_alone(spec):
    """stack_rows / take_rows: requests join and leave a batch; each row's tokens are its own."""
    from sinkwindow.runtime.generate import select_next
    from sinkwindow.runtime.static_cache import stack_rows, take_rows

    model = tiny_model("llama")
    sinkwindow.apply(model, spec)
    prompts = [_ids(n, seed=n) for n in (3, 11, 26)]
    alone = [sinkwindow.generate(model, p, 9, chunk_size=4, static=True)[0, p.shape[1] :] for p in prompts]
    caches, nxt = [], []
    for p in prompts:
        cache = sinkwindow.make_cache(model, static=True)
        logits, _ = sinkwindow.prefill(model, p, chunk_size=4, cache=cache)
        caches.append(cache)
        nxt.append(select_next(logits))
    batch = stack_rows(sinkwindow.make_cache(model, static=True), caches)
    assert [layer.keys.shape[0] for layer in batch.layers] == [3] * len(batch.layers)
    got = [[int(t)] for t in nxt]
    tokens = torch.stack(nxt)
    rows = [0, 1, 2]
    for step in range(8):
        if step == 4:  # the middle request leaves; the others go on
            batch = take_rows(sinkwindow.make_cache(model, static=True), batch, [0, 2])
            rows, tokens = [0, 2], tokens[[0, 2]]
        logits = DecodeStep(model, batch)(tokens)
        tokens = select_next(logits)[:, None]
        for r, t in zip(rows, tokens[:, 0]):
            got[r].append(int(t))
    for r in (0, 2):
        assert got[r] == alone[r].tolist(), r
    assert got[1] == alone[1][:5].tolist()
    # Each row still holds at most W keys of its own stream.
    one = take_rows(sinkwindow.make_cache(model, static=True), batch, [1])
    assert (
        int(one.real_seen[0]) == prompts[2].shape[1] + 8 and one.layers[0].positions.max() < one.real_seen[0]
    )

"""Hybrid specs (``swa:W:S+full:...``): named layers or KV heads keep full attention, the rest SWA(w, s).

Every path (one-shot, chunked prefill, decoding, padding, eager/SDPA/flex) is held to the float64
reference with a per-layer (per-head) mask; full layers are held to the unpatched model; the cache is
held to its bound layer by layer and head by head, and to the analytic byte count.
"""

from __future__ import annotations

import copy

import pytest
import torch

import sinkwindow
from conftest import VOCAB, tiny_model
from sinkwindow.runtime.cache import FullAttentionLayer, HybridHeadLayer, SinkWindowLayer, cache_nbytes
from sinkwindow.runtime.kv_bytes import analytic_layer_bytes, analytic_state_bytes
from sinkwindow.runtime.reference import reference_greedy, reference_logits
from sinkwindow.runtime.spec import parse_spec, split_specs

LENGTH = 37  # past the window (8) and every tiny config's native window
# Tiny configs: 3 layers, 6 query heads over 2 KV heads (GQA groups of 3).
SPECS = ["swa:8:2+full:1", "swa:8:2+full:0.1", "swa:8:2+full:0,2.0", "swa:6:0+full:2"]
FAMILIES = ["llama", "qwen3", "gemma3_text", "mistral", "phi3", "gpt2"]


def _ids(batch=2, length=LENGTH, seed=3):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _left_padding(batch=2, length=LENGTH):
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, :9] = 0
    return mask


# --- the spec ---------------------------------------------------------------------------------------


def test_hybrid_spec_is_canonical_and_round_trips():
    spec = parse_spec("SWA:256:4+full:27,3,11.2,11.0")
    assert spec.full_layers == (3, 27) and spec.full_heads == ((11, 0), (11, 2))
    assert str(spec) == "swa:256:4+full:3,11.0,11.2,27"
    assert parse_spec(str(spec)) == spec and hash(parse_spec(str(spec))) == hash(spec)
    assert spec.base == parse_spec("swa:256:4") and not spec.base.is_hybrid
    assert spec.full_kv_heads(3, 3) == (0, 1, 2) and spec.full_kv_heads(11, 3) == (0, 2)
    assert spec.full_kv_heads(4, 3) == ()
    assert spec.with_full(layers=(5,)) == parse_spec("swa:256:4+full:5")


@pytest.mark.parametrize(
    "text, words",
    [
        ("swa:64:4+full:", "full:UNITS"),
        ("swa:64:4+half:1", "full:UNITS"),
        ("swa:64:4+full:x", "is not a layer"),
        ("swa:64:4+full:1,1", "named twice"),
        ("swa:64:4+full:1,1.0", "full already"),
        ("evict:64:4+full:1", "only swa"),
        ("swa:64:4:cache+full:1", "only swa"),
        ("lolcats:64+full:1", "only swa"),
    ],
)
def test_bad_hybrid_specs_say_what_to_write(text, words):
    with pytest.raises(ValueError, match=words):
        parse_spec(text)


def test_a_comma_list_keeps_a_hybrids_units_together():
    assert split_specs("full, swa:256:4+full:3,11,27,lolcats:256") == [
        "full",
        "swa:256:4+full:3,11,27",
        "lolcats:256",
    ]
    assert split_specs("swa:8:2+full:1.1, 2,full") == ["swa:8:2+full:1.1, 2", "full"]


def test_units_the_model_lacks_are_refused_in_one_line():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="has 3 layers"):
        sinkwindow.apply(model, "swa:8:2+full:3")
    with pytest.raises(ValueError, match="2 KV heads"):
        sinkwindow.apply(model, "swa:8:2+full:0.2")
    gemma = tiny_model("gemma3_text")  # layers 0 and 1 slide natively (window 12), layer 2 is global
    with pytest.raises(ValueError, match=r"native sliding layer 0 full.*global layers \(2\)"):
        sinkwindow.apply(gemma, "swa:8:2+full:0,2", native_sliding="keep")
    sinkwindow.apply(model, "swa:8:2+full:1")
    with pytest.raises(ValueError, match="static=True"):
        sinkwindow.make_cache(model, static=True)


# --- logits against the float64 reference -----------------------------------------------------------


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("spec", SPECS)
def test_one_shot_and_chunked_logits_equal_the_reference(family, attn, spec):
    model = tiny_model(family, attn)
    ids = _ids()
    ref = reference_logits(model, ids, spec)
    # The units must matter, or this test could not fail: the reference differs from plain SWA.
    assert (ref - reference_logits(model, ids, parse_spec(spec).base)).abs().max() > 1e-3
    with sinkwindow.apply(model, spec):
        torch.testing.assert_close(model(ids).logits.double(), ref, atol=2e-5, rtol=0)
        for chunk in (1, 5):
            logits, _ = sinkwindow.prefill(model, ids, chunk_size=chunk, return_logits="all")
            torch.testing.assert_close(logits.double(), ref, atol=2e-5, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("spec", ["swa:8:2+full:1", "swa:8:2+full:0.1,2"])
def test_left_padded_batches_equal_the_reference(family, spec):
    model = tiny_model(family)
    ids, mask = _ids(), _left_padding()
    ref = reference_logits(model, ids, spec, attention_mask=mask)
    real = mask.bool()
    with sinkwindow.apply(model, spec):
        for chunk in (4, 64):
            logits, _ = sinkwindow.prefill(
                model, ids, chunk_size=chunk, attention_mask=mask, return_logits="all"
            )
            torch.testing.assert_close(logits.double()[real], ref[real], atol=2e-5, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("spec", ["swa:8:2+full:1", "swa:8:2+full:0.1"])
def test_decoding_equals_the_reference_greedy(spec):
    model = tiny_model("llama")
    model.generation_config.eos_token_id = None
    ids = _ids(batch=1, length=20)
    want = reference_greedy(model, ids, spec, 12)
    with sinkwindow.apply(model, spec):
        got = sinkwindow.generate(model, ids, 12, chunk_size=6)
        assert torch.equal(got, want)
        # Plain transformers generate makes the bounded hybrid cache itself.
        hf = model.generate(ids, max_new_tokens=12, do_sample=False, min_new_tokens=12)
        assert torch.equal(hf, want)


@torch.no_grad()
@pytest.mark.parametrize("spec", ["swa:8:2+full:2", "swa:8:2+full:2.1", "swa:8:0+full:2.0"])
def test_keep_hybrids_window_the_globals_and_leave_native_layers_alone(spec):
    # Gemma 3 as the frontier runs it: local layers on their own window, the budget on the globals.
    model = tiny_model("gemma3_text")
    model.generation_config.eos_token_id = None
    ids, mask = _ids(), _left_padding()
    ref = reference_logits(model, ids, spec, native_sliding="keep", attention_mask=mask)
    plain = reference_logits(model, ids, parse_spec(spec).base, native_sliding="keep", attention_mask=mask)
    real = mask.bool()
    assert (ref[real] - plain[real]).abs().max() > 1e-3  # the global units matter
    with sinkwindow.apply(model, spec, native_sliding="keep"):
        for chunk in (5, 64):
            logits, cache = sinkwindow.prefill(
                model, ids, chunk_size=chunk, attention_mask=mask, return_logits="all"
            )
            torch.testing.assert_close(logits.double()[real], ref[real], atol=2e-5, rtol=0)
        per_layer = analytic_layer_bytes(parse_spec(spec), model.config, LENGTH, native_sliding="keep")
        assert [cache_nbytes_layer(layer) for layer in cache.layers] == [b * 2 for b in per_layer]  # batch 2
        want = reference_greedy(model, ids[:1, :20], spec, 8, native_sliding="keep")
        assert torch.equal(sinkwindow.generate(model, ids[:1, :20], 8, chunk_size=6), want)


@torch.no_grad()
@pytest.mark.parametrize("spec", ["swa:8:2+full:1", "swa:8:2+full:1.0,1.1"])
def test_keep_hybrid_with_a_full_global_before_a_windowed_global(spec):
    # Gemma-3-270M's layout in small: a native local layer first, then two globals of which the first
    # is kept full. transformers sizes the globals' one mask against a stand-in for the full layer;
    # that stand-in must be the windowed global (W=8), not the native local layer (window 12), or the
    # windowed global gets a mask for keys its cache never held.
    model = tiny_model("gemma3_text", layer_types=["sliding_attention", "full_attention", "full_attention"])
    ids, mask = _ids(), _left_padding()
    ref = reference_logits(model, ids, spec, native_sliding="keep", attention_mask=mask)
    real = mask.bool()
    with sinkwindow.apply(model, spec, native_sliding="keep"):
        for chunk in (5, 64):  # 5: the local layer holds 16 keys per step, the windowed global 12
            logits, cache = sinkwindow.prefill(
                model, ids, chunk_size=chunk, attention_mask=mask, return_logits="all"
            )
            torch.testing.assert_close(logits.double()[real], ref[real], atol=2e-5, rtol=0)
        assert [type(layer) for layer in cache.layers] == [
            SinkWindowLayer,
            FullAttentionLayer,
            SinkWindowLayer,
        ]


@torch.no_grad()
def test_left_padded_generate_equals_the_reference():
    model = tiny_model("qwen3")
    model.generation_config.eos_token_id = None
    ids, mask = _ids(length=24), _left_padding(length=24)
    want = reference_greedy(model, ids, "swa:8:2+full:0.0,2", 8, attention_mask=mask)
    with sinkwindow.apply(model, "swa:8:2+full:0.0,2"):
        got = sinkwindow.generate(model, ids, 8, attention_mask=mask, chunk_size=5)
    assert torch.equal(got, want)


@torch.no_grad()
def test_flex_path_equals_the_reference():
    model = tiny_model("llama")
    ids = _ids()
    spec = "swa:8:2+full:1,0.0"
    ref = reference_logits(model, ids, spec)
    with sinkwindow.apply(model, spec, attn_implementation="flex"):
        torch.testing.assert_close(model(ids).logits.double(), ref, atol=2e-5, rtol=0)


@torch.no_grad()
def test_full_layers_equal_the_unpatched_model():
    """All layers full is the unpatched model; layer 0 full leaves layer 0's output untouched."""
    model = tiny_model("llama")
    stock = copy.deepcopy(model)
    ids = _ids()
    want = stock(ids, output_hidden_states=True)
    with sinkwindow.apply(model, "swa:8:2+full:0,1,2"):
        torch.testing.assert_close(model(ids).logits, want.logits, atol=1e-5, rtol=0)
    with sinkwindow.apply(model, "swa:8:2+full:0"):
        got = model(ids, output_hidden_states=True).hidden_states
    torch.testing.assert_close(got[1], want.hidden_states[1], atol=1e-5, rtol=0)
    assert (got[2] - want.hidden_states[2]).abs().max() > 1e-3  # layer 1 is windowed


# --- the cache ---------------------------------------------------------------------------------------


@torch.no_grad()
@pytest.mark.parametrize("family", ["gemma3_text", "mistral", "llama"])
@pytest.mark.parametrize(
    "spec,policy",
    [("full", "override"), ("swa:8:2", "override"), ("swa:8:2", "keep"), ("swa:8:2+full:0", "override")],
)
def test_analytic_bytes_follow_native_sliding_layers(family, spec, policy):
    """Full attention on Gemma 3 / Mistral keeps their own windows (transformers' sliding cache
    layers), so its bytes are bounded there; the formula must say so, not count n keys per layer."""
    model = tiny_model(family)
    spec = parse_spec(spec)
    if policy == "keep" and family == "llama":
        pytest.skip("no native sliding layer to keep")
    if not spec.is_full:
        sinkwindow.apply(model, spec, native_sliding=policy)
    cache = sinkwindow.prefill(model, _ids(batch=1), chunk_size=5).cache
    per_layer = analytic_layer_bytes(spec, model.config, LENGTH, native_sliding=policy)
    assert [cache_nbytes_layer(layer) for layer in cache.layers] == per_layer
    total = analytic_state_bytes(spec, model.config, LENGTH, native_sliding=policy)
    assert sum(per_layer) == total
    if not spec.is_full:
        assert cache_nbytes(cache) == total  # our stores hold exactly what they persist
    else:
        # transformers' sliding layers keep a slice of the last chunk's concatenation alive, so the
        # storage may exceed the persisted keys by up to one chunk (5 here) per layer, never more.
        slack = 5 * 2 * 4 * sum(model.config.num_key_value_heads * 8 for _ in per_layer)
        assert total <= cache_nbytes(cache) <= total + slack
    if spec.is_full and family != "llama":  # bounded below n keys on every native sliding layer
        assert sum(per_layer) < analytic_layer_bytes(spec, tiny_model("llama").config, LENGTH)[0] * len(
            per_layer
        )


def cache_nbytes_layer(layer) -> int:
    """Bytes of one cache layer's persisted tensors (its full-length store too, for head hybrids)."""
    own = sum(t.numel() * t.element_size() for t in (layer.keys, layer.values) if t is not None)
    sub = getattr(layer, "full", None)
    return own + (cache_nbytes_layer(sub) if sub is not None else 0)


@torch.no_grad()
@pytest.mark.parametrize("batch", [1, 2])
def test_cache_bound_holds_per_layer_and_head_and_bytes_match_the_formula(batch):
    model = tiny_model("llama")
    spec = parse_spec("swa:8:2+full:1,2.0")
    ids = _ids(batch=batch)
    mask = _left_padding() if batch == 2 else None
    with sinkwindow.apply(model, spec):
        cache = sinkwindow.prefill(model, ids, chunk_size=5, attention_mask=mask).cache
        layers = cache.layers
        assert type(layers[0]) is SinkWindowLayer and layers[0].n_persisted == 7  # W - 1
        assert isinstance(layers[1], FullAttentionLayer) and layers[1].n_persisted == LENGTH
        assert isinstance(layers[2], HybridHeadLayer)
        assert layers[2].keys.shape[1] == 1 and layers[2].n_persisted == 7  # the SWA KV head
        assert layers[2].full.keys.shape[1] == 1 and layers[2].full.n_persisted == LENGTH
        if batch == 1:  # unpadded: exactly the analytic bytes, layer by layer
            per_layer = analytic_layer_bytes(spec, model.config, LENGTH, dtype=torch.float32)
            assert cache_nbytes(cache) == sum(per_layer) == analytic_state_bytes(spec, model.config, LENGTH)
            assert per_layer[1] == analytic_layer_bytes(parse_spec("full"), model.config, LENGTH)[1]
        # Decoding: windowed stores stay put, full stores grow by one a step.
        cache = sinkwindow.make_cache(model)
        sinkwindow.generate(model, ids, 5, attention_mask=mask, cache=cache, chunk_size=5)
        layers = cache.layers
        assert layers[0].n_persisted == 7 and layers[2].n_persisted == 7
        assert layers[1].n_persisted == LENGTH + 5 - 1 and layers[2].full.n_persisted == LENGTH + 5 - 1


@torch.no_grad()
def test_cache_state_round_trips():
    model = tiny_model("llama")
    ids = _ids(batch=1)
    spec = "swa:8:2+full:0.1"
    with sinkwindow.apply(model, spec):
        cache = sinkwindow.prefill(model, ids).cache
        other = sinkwindow.make_cache(model)
        other.load_state_dict(cache.state_dict())
        nxt = torch.tensor([[5]])
        a = model(nxt, cache=cache).logits
        b = model(nxt, cache=other).logits
    torch.testing.assert_close(a, b)


def test_a_cache_of_the_plain_spec_is_refused_under_the_hybrid():
    model = tiny_model("llama")
    with sinkwindow.apply(model, "swa:8:2"):
        cache = sinkwindow.make_cache(model)
    with sinkwindow.apply(model, "swa:8:2+full:1"), pytest.raises(ValueError, match="made for swa:8:2"):
        model(_ids(), cache=cache)


@torch.no_grad()
def test_bench_fill_leaves_the_state_of_a_real_prefill():
    """The benchmark's fast fill: full stores at n keys, windowed ones at W - 1, bytes as analytic."""
    from sinkwindow.bench.methods import FullUnitsRunner, runner_for

    model = tiny_model("llama")
    spec = parse_spec("swa:8:2+full:1,2.0")
    n = 60
    ids = _ids(batch=1, length=n)
    runner = runner_for(model, spec)
    assert isinstance(runner, FullUnitsRunner) and not runner.bounded
    with runner:
        _, cache = runner.fill(ids, chunk_size=4)
        real = sinkwindow.prefill(model, ids, chunk_size=4).cache
        # Layer 2 keeps KV head 0 full: its full head holds n keys, its windowed store W - 1.
        assert cache.persisted_lengths() == real.persisted_lengths() == [7, n, n]
        assert cache.window_lengths() == real.window_lengths() == [7, n, 7]
        assert cache.layers[2].full.n_persisted == real.layers[2].full.n_persisted == n
        assert cache_nbytes(cache) == cache_nbytes(real) == runner.analytic_bytes(n)
        # The next decode step runs at position n over the same shapes as after the real prefill.
        nxt = torch.tensor([[7]])
        assert model(nxt, cache=cache).logits.shape == model(nxt, cache=real).logits.shape
        assert cache.get_seq_length() == real.get_seq_length() == n + 1

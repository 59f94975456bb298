"""Converted models: one forward == chunked prefill == token-by-token decode, the SWA limit, the cache, revert."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache

import sinkwindow
from conftest import logits_in_fresh_process, tiny_model
from sinkwindow.linear import LinearAttnCache, convert, get_retrofit, is_converted, load_linear, revert

W = 8
T = 37  # not a multiple of W
ATOL = 2e-5


pytestmark = pytest.mark.usefixtures("one_thread")


def ids_for(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 101, (1, n), generator=torch.Generator().manual_seed(seed))


def converted(family: str = "llama", spec: str = f"lolcats:{W}", **kw):
    # Kaiming init makes φq and φk differ so the linear term is not a trivial kernel.
    return convert(tiny_model(family), spec, init="kaiming", **kw)


@torch.no_grad()
def decode_logits(model, ids: torch.Tensor) -> tuple[torch.Tensor, LinearAttnCache]:
    cache = sinkwindow.make_cache(model)
    out = [model(ids[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(ids.shape[1])]
    return torch.cat(out, dim=1), cache


@pytest.mark.parametrize(
    "family,spec",
    [
        ("llama", f"lolcats:{W}"),
        ("llama", "linear"),
        ("qwen3", f"lolcats:{W}"),
        ("gemma3_text", f"lolcats:{W}"),
        ("phi3", "linear"),
    ],
    ids=lambda x: x.replace(":", ""),
)
def test_forward_equals_prefill_equals_decode(family, spec):
    model = converted(family, spec)
    ids = ids_for(T)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        dyn = model(ids).logits  # transformers' own DynamicCache: keys before the chunk are context
        chunked, cache = sinkwindow.prefill(model, ids, chunk_size=5, return_logits="all")
    stepped, _ = decode_logits(model, ids)
    assert isinstance(cache, LinearAttnCache)
    for other in (dyn, chunked, stepped):
        torch.testing.assert_close(other, full, atol=ATOL, rtol=0)


def test_prefill_then_decode_continues_the_state():
    model = converted()
    ids = ids_for(T + 9)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        _, cache = sinkwindow.prefill(model, ids[:, :T], chunk_size=11, return_logits="none")
        tail = [model(ids[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(T, T + 9)]
    torch.testing.assert_close(torch.cat(tail, 1), full[:, T:], atol=ATOL, rtol=0)
    assert cache.get_seq_length() == T + 9


def test_generate_with_cache_matches_uncached_greedy():
    model = converted()
    ids = ids_for(20)
    with torch.no_grad():
        out = model.generate(
            ids, cache=sinkwindow.make_cache(model), max_new_tokens=8, do_sample=False, pad_token_id=0
        )
        seq = ids
        for _ in range(8):
            nxt = model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    assert torch.equal(out, seq)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_gamma_one_affine_hybrid_is_swa(family):
    # γ = sigmoid(40) = 1 and λ = 1 − γ = 0: only the softmax window is left, i.e. SWA(w, 0).
    model = tiny_model(family)
    ids = ids_for(45)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        with sinkwindow.apply(model, f"swa:{W}:0"):
            swa = model(ids, use_cache=False).logits
        convert(model, f"lolcats:{W}", affine=True, window_factor_init=40.0, init="kaiming")
        hybrid = model(ids, use_cache=False).logits
        decoded, _ = decode_logits(model, ids)
    assert (full - swa).abs().max() > 1e-2  # the window matters at this length
    torch.testing.assert_close(hybrid, swa, atol=ATOL, rtol=0)
    torch.testing.assert_close(decoded, swa, atol=ATOL, rtol=0)


def test_cache_size_constant_over_2000_steps():
    model = convert(tiny_model("llama"), f"lolcats:{W}")
    cache = sinkwindow.make_cache(model)
    tok = torch.tensor([[5]])
    sizes = set()
    with torch.no_grad():
        for t in range(2000):
            logits = model(tok, cache=cache, use_cache=True).logits
            tok = logits[:, -1:].argmax(-1)
            if t >= W:
                sizes.add((cache.nbytes(), tuple(cache.persisted_lengths())))
    assert cache.get_seq_length() == 2000
    assert len(sizes) == 1, sizes
    nbytes, lengths = sizes.pop()
    assert set(lengths) == {W}
    layer = cache.layers[0]
    H, Hkv = model.config.num_attention_heads, model.config.num_key_value_heads
    D = model.config.hidden_size // H
    assert layer.S.shape == (1, H, D, D) and layer.S.dtype == torch.float32  # F = D (softmax_dim, f = D/2)
    assert layer.keys.shape == (1, Hkv, W, D)  # the FIFO stays at the key/value heads
    assert nbytes == len(cache.layers) * (4 * H * (D * D + D) + 2 * 4 * Hkv * W * D)
    # The one byte counter every report uses (generate, bench, check) sees the (S, z) state too.
    assert sinkwindow.cache_nbytes(cache) == nbytes


def test_states_stay_float32_in_a_bfloat16_model():
    model = convert(tiny_model("llama").to(torch.bfloat16), f"lolcats:{W}")
    _, cache = decode_logits(model, ids_for(12))
    assert cache.layers[0].S.dtype == torch.float32 and cache.layers[0].z.dtype == torch.float32
    assert cache.layers[0].keys.dtype == torch.bfloat16


def test_gqa_one_key_map_per_query_head():
    model = converted()
    attn = model.model.layers[0].self_attn
    H, D = model.config.num_attention_heads, attn.head_dim
    assert attn.feature_map_q.weight.shape == (H, D, D // 2)
    assert attn.feature_map_k.weight.shape == (H, D, D // 2)
    assert attn.window_factors.shape == (1, H, 1, 1)
    names = {n for n, _ in model.named_parameters()}
    assert "model.layers.2.self_attn.feature_map_k.weight" in names


def test_identity_init_maps_start_equal():
    model = convert(tiny_model("llama"), f"lolcats:{W}")
    attn = model.model.layers[1].self_attn
    assert torch.equal(attn.feature_map_q.weight, attn.feature_map_k.weight)
    assert attn.feature_map_q.weight is not attn.feature_map_k.weight
    eye = torch.eye(attn.head_dim)[:, : attn.head_dim // 2]
    assert torch.equal(attn.feature_map_q.weight[0], eye)
    gamma = torch.sigmoid(attn.window_factors)
    torch.testing.assert_close(gamma, torch.full_like(gamma, 0.1))


def test_revert_restores_the_model_exactly():
    model = tiny_model("llama")
    ids = ids_for(T)
    with torch.no_grad():
        before = model(ids).logits
        n_params = len(list(model.parameters()))
        convert(model, "linear")
        assert is_converted(model)
        revert(model)
        after = model(ids).logits
    assert torch.equal(before, after)
    assert not is_converted(model)
    assert len(list(model.parameters())) == n_params
    assert model.config._attn_implementation == "sdpa"
    assert not hasattr(model, "_sinkwindow_cache_factory")
    assert isinstance(sinkwindow.make_cache(model), DynamicCache)


def test_convert_refuses_bad_states():
    model = tiny_model("llama")
    for untrained in ("evict:64:4", "swa:64:4:cache", "swa:64:4+full:0"):  # (swa:64:4 converts: SWA + LoRA)
        with pytest.raises(ValueError, match="sinkwindow.apply"):
            convert(model, untrained)
    with sinkwindow.apply(model, "swa:16:4"), pytest.raises(ValueError, match="patched"):
        convert(model, "linear")
    convert(model, "linear")
    with pytest.raises(ValueError, match="already converted"):
        convert(model, f"lolcats:{W}")
    assert get_retrofit(model).variant.kind == "linear"


def test_load_linear_needs_a_checkpoint():
    with pytest.raises(ValueError, match="sinkwindow train"):
        load_linear(tiny_model("llama"), f"lolcats:{W}", None)


def test_apply_refuses_a_converted_model():
    import sinkwindow
    from sinkwindow.linear import convert, revert

    model = tiny_model("llama")
    convert(model, "lolcats:8")
    with pytest.raises(ValueError, match="revert"):
        sinkwindow.apply(model, "swa:8:2")
    revert(model)
    sinkwindow.apply(model, "swa:8:2")
    assert sinkwindow.active_spec(model).kind == "swa"


@pytest.mark.parametrize("spec", [f"lolcats:{W}", f"liger:{W}"])
@torch.no_grad()
def test_a_saved_converted_model_runs_in_a_fresh_process(spec, tmp_path):
    # A worker gets the converted model by pickle: unpickling registers the linear attention there.
    # lolcats with random feature maps (their weights must travel); liger has no parameters of its own.
    model = converted(spec=spec) if spec.startswith("lolcats") else convert(tiny_model("llama"), spec)
    ids = ids_for(24)
    want = model(ids).logits
    torch.testing.assert_close(logits_in_fresh_process(model, ids, tmp_path), want, atol=0, rtol=0)

"""Position modes: ``absolute`` (the paper) and ``cache`` (StreamingLLM, positions re-assigned inside the
cache). They agree while the stream is shorter than W and differ after; cache mode matches its fp64
reference for any chunking, runs past the model's trained context, and its re-rotated keys equal RoPE
recomputed from scratch."""

import random

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

import sinkwindow
from conftest import VOCAB, tiny_config, tiny_model
from sinkwindow.runtime.reference import reference_logits
from sinkwindow.runtime.rope import LayerRope

W, S = 8, 2
NATIVE = {"mistral", "gemma3_text"}


def _ids(length, batch=1, seed=5):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _llama(seed=0, **overrides):
    """A tiny Llama whose config fields (max_position_embeddings, rope_parameters, ...) can be changed."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config("llama")
    for k, v in overrides.items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)
    return model


@torch.no_grad()
@pytest.mark.parametrize("kind", ["swa", "evict"])
def test_modes_agree_within_the_window_and_differ_after(kind):
    model = tiny_model("llama")
    ids = _ids(3 * W + 5)
    got = {}
    for mode in ("absolute", "cache"):
        sinkwindow.apply(model, f"{kind}:{W}:{S}:{mode}")
        prompt = ids if kind == "swa" else ids[:, :W]
        logits, cache = sinkwindow.prefill(model, prompt, chunk_size=5, return_logits="all")
        steps = (
            []
            if kind == "swa"
            else [model(ids[:, t : t + 1], cache=cache).logits for t in range(W, ids.shape[1])]
        )
        got[mode] = torch.cat([logits, *steps], dim=1)
    # Queries at positions < W see every key at the same distance in both modes...
    torch.testing.assert_close(got["cache"][:, :W], got["absolute"][:, :W], atol=1e-5, rtol=1e-5)
    # ...later ones see their sinks closer in cache mode.
    assert (got["cache"][:, W + 2 :] - got["absolute"][:, W + 2 :]).abs().amax(-1).min() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize(
    "family,attn,native",
    [
        ("llama", "sdpa", "override"),
        ("llama", "eager", "override"),
        ("qwen3", "sdpa", "override"),
        ("phi3", "sdpa", "override"),
        ("mistral", "sdpa", "keep"),
        ("gemma3_text", "sdpa", "override"),
        ("gemma3_text", "eager", "keep"),
    ],
)
def test_cache_mode_matches_fp64_reference_for_any_chunking(family, attn, native):
    model = tiny_model(family, attn)
    ids = _ids(41, batch=2)
    spec = f"swa:{W}:{S}:cache"
    ref = reference_logits(model, ids, spec, native_sliding=native)
    sinkwindow.apply(model, spec, native_sliding=native)
    # A forward without a cache runs through a fresh one (the positions live there).
    torch.testing.assert_close(model(ids).logits.double(), ref, atol=2e-4, rtol=1e-4)
    for chunk in (1, 6, 64):
        logits, _ = sinkwindow.prefill(model, ids, chunk_size=chunk, return_logits="all")
        torch.testing.assert_close(logits.double(), ref, atol=2e-4, rtol=1e-4)


@torch.no_grad()
def test_cache_mode_partial_rotary_matches_reference():
    """Phi-3 style partial RoPE: only the first rotary_dim channels of each key move."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config("phi3")
    cfg.rope_parameters = dict(cfg.rope_parameters, partial_rotary_factor=0.5)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    for name, p in model.named_parameters():
        if name.endswith("qkv_proj.weight"):
            p.mul_(8.0)
    assert 2 * model.model.rotary_emb.inv_freq.shape[0] < cfg.hidden_size // cfg.num_attention_heads
    ids = _ids(33)
    ref = reference_logits(model, ids, f"swa:{W}:{S}:cache")
    sinkwindow.apply(model, f"swa:{W}:{S}:cache")
    logits, _ = sinkwindow.prefill(model, ids, chunk_size=6, return_logits="all")
    torch.testing.assert_close(logits.double(), ref, atol=2e-4, rtol=1e-4)


@torch.no_grad()
def test_cache_mode_generate_matches_reference():
    from sinkwindow.runtime.reference import reference_greedy

    model = tiny_model("qwen2")
    model.generation_config.eos_token_id = None
    ids = _ids(13)
    spec = f"swa:{W}:{S}:cache"
    want = reference_greedy(model, ids, spec, 20)
    sinkwindow.apply(model, spec)
    assert torch.equal(
        model.generate(ids, cache=sinkwindow.make_cache(model), max_new_tokens=20, do_sample=False), want
    )
    assert torch.equal(sinkwindow.generate(model, ids, 20, chunk_size=4), want)


@torch.no_grad()
def test_cache_mode_streams_past_the_trained_context():
    limit = 48
    model = _llama(max_position_embeddings=limit)
    model.generation_config.eos_token_id = None
    seen = []
    rotary = model.model.rotary_emb
    rotary.register_forward_pre_hook(
        lambda m, a, kw: seen.append(int(kw["position_ids"].max())), with_kwargs=True
    )
    prompt = _ids(100)

    sinkwindow.apply(model, "swa:16:4")
    with pytest.raises(ValueError, match="beyond the model's limit of 48.*positions='cache'"):
        sinkwindow.prefill(model, prompt)

    sinkwindow.apply(model, "swa:16:4:cache")
    with pytest.raises(ValueError, match="smaller chunk_size"):
        sinkwindow.prefill(model, prompt, chunk_size=64)
    seen.clear()
    out = sinkwindow.generate(model, prompt, 150, chunk_size=8)  # 250 tokens through a 48-position model
    assert out.shape == (1, 250) and max(seen) < limit
    cache = sinkwindow.make_cache(model)
    out_hf = model.generate(prompt[:, :40], cache=cache, max_new_tokens=60, do_sample=False)
    assert out_hf.shape[1] == 100 and max(seen) < limit
    assert cache.get_seq_length() == 99 and max(cache.persisted_lengths()) == 15


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
            "rope_theta": 10000.0,
        },
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0},
    ],
    ids=lambda r: r["rope_type"],
)
def test_rerotation_equals_rope_from_scratch(rope):
    """Property, over random keys, positions p and moves d: un-rotating the model-rotated key and
    rotating it to p - d gives exactly the model's own RoPE at p - d (R(p - d) = R(-d) R(p))."""
    cfg = tiny_config("llama")
    cfg.rope_parameters = rope
    rot = LlamaRotaryEmbedding(cfg)
    layer = LayerRope(rot.inv_freq, rot.attention_scaling)
    head_dim = cfg.hidden_size // cfg.num_attention_heads

    def model_rope(x, positions):
        cos, sin = rot(x, positions)
        return apply_rotary_pos_emb(x, x, cos, sin)[1]

    rng = random.Random(0)
    for trial in range(40):
        p = rng.randrange(0, 8192)
        pos = torch.tensor([[p, p + 1, p + rng.randrange(2, 64), p + rng.randrange(64, 4096)]])
        moved = (pos - rng.randrange(-4096, 4096)).clamp(min=0)
        k = torch.randn(2, 3, 4, head_dim, generator=torch.Generator().manual_seed(trial))
        k_at_p = model_rope(k, pos)
        torch.testing.assert_close(layer.rotate(k, pos), k_at_p, atol=1e-4, rtol=1e-4)
        back = layer.rotate(layer.unrotate(k_at_p, pos), moved)
        # fp32 angles of positions up to ~12K: both sides round the same cos/sin the same way.
        torch.testing.assert_close(back, model_rope(k, moved), atol=2e-4, rtol=1e-4)


def _stream_cases(n=10, seed=0):
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        window = rng.randrange(3, 13)
        sinks = min(rng.randrange(0, 4), window - 1)
        chunks = [rng.randrange(1, 10) for _ in range(rng.randrange(3, 9))]
        cases.append((window, sinks, chunks))
    return cases


@torch.no_grad()
@pytest.mark.parametrize("window,sinks,chunks", _stream_cases(), ids=lambda x: str(x))
def test_cache_keys_equal_rope_recomputed_from_scratch(window, sinks, chunks):
    """Property, over random windows, sinks and chunkings: every key the cache hands layer 0 is the
    model's own k_proj output rotated, from scratch, to its cache position: sinks at 0..s-1, the rest
    right below the query, sink copies at their own query's distance."""
    model = tiny_model("llama")
    sinkwindow.apply(model, f"swa:{window}:{sinks}:cache")
    ids = _ids(sum(chunks), seed=window + sinks)
    attn = model.model.layers[0].self_attn
    k_pre = attn.k_proj(model.model.layers[0].input_layernorm(model.model.embed_tokens(ids)))
    k_pre = k_pre.view(1, ids.shape[1], -1, attn.head_dim).transpose(1, 2)  # [1, kv_heads, n, d]
    rot = model.model.rotary_emb

    def scratch(real, cache_pos):
        cos, sin = rot(k_pre, cache_pos[None])
        return apply_rotary_pos_emb(k_pre[:, :, real], k_pre[:, :, real], cos, sin)[1]

    cache = sinkwindow.make_cache(model)
    layer = cache.layers[0]
    seen = {}
    orig = layer.update

    def update_kv(k, v, *a, **kw):
        seen["plan"] = cache.plan
        seen["before"] = layer._real_positions().clone()[0]
        keys, values = orig(k, v, *a, **kw)
        seen["keys"] = keys
        return keys, values

    layer.update = update_kv
    start = 0
    for c in chunks:
        with torch.no_grad():
            model(ids[:, start : start + c], cache=cache, use_cache=True)
        plan, before, keys = seen["plan"], seen["before"], seen["keys"]
        shift = int(plan.shift[0])
        home = torch.where(before < sinks, before, before - shift)
        new = torch.arange(start, start + c)
        expected = [scratch(before, home), scratch(new, new - shift)]
        if plan.copy_shift is not None and sinks:
            for t in range(c):
                j = torch.arange(sinks)
                expected.append(scratch(j, j + int(plan.copy_shift[0, t])))
        torch.testing.assert_close(keys, torch.cat(expected, dim=2), atol=2e-5, rtol=1e-5)
        start += c


def test_unsupported_rope_types_are_refused_by_name():
    model = _llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.raises(
        NotImplementedError, match="supports rope_type default, linear, llama3, yarn.*dynamic"
    ):
        sinkwindow.apply(model, "swa:8:2:cache")
    sinkwindow.apply(model, "swa:8:2")  # absolute positions never move a key: any RoPE works
    assert str(sinkwindow.active_spec(model)) == "swa:8:2"


def test_cache_mode_needs_the_patched_forward():
    model = tiny_model("llama")
    sinkwindow.apply(model, "swa:8:2:cache")
    cache = sinkwindow.make_cache(model)
    with pytest.raises(RuntimeError, match="re-assigns position_ids"):
        model.model(_ids(5), cache=cache, use_cache=True)

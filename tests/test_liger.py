"""Liger-GLA(+SWA): GLA and Liger kernels in three forms, their limits, pre-RoPE q/k, the model and its cache."""

from __future__ import annotations

import itertools
import sys

import pytest
import torch
import torch.nn.functional as F

import sinkwindow
from conftest import tiny_model
from sinkwindow.linear import (
    LigerAttnState,
    LinearAttnCache,
    LinearVariant,
    chunk_gla,
    chunk_liger_attn,
    convert,
    get_retrofit,
    gla_step,
    liger_attn_step,
    liger_feature_map,
    liger_gate,
    load_linear,
    naive_quadratic_gla,
    naive_quadratic_liger_attn,
    naive_recurrent_gla,
    naive_recurrent_liger_attn,
    read_metadata,
    repeat_kv,
    revert,
    save_checkpoint,
    unrotate_half,
)
from sinkwindow.linear import attention as linear_attention
from sinkwindow.runtime.rope import rotate_half

F64 = torch.float64
ATOL = 1e-10


pytestmark = pytest.mark.usefixtures("one_thread")


def close(a: torch.Tensor, b: torch.Tensor, atol: float = ATOL) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    err = (a - b).abs().max().item() if a.numel() else 0.0
    assert err <= atol, f"max abs error {err:.3e} > {atol:.0e}"


class Case:
    """Random float64 Liger inputs: post-RoPE q (H heads), k, v (Hkv heads), features from 'pre-RoPE' ones.

    The pre-RoPE vectors are drawn independently of the post-RoPE ones: the kernels only see
    features and gates, so this exercises every input separately. ``gate_scale`` widens the
    pre-RoPE keys, which makes the gates (logsigmoid(k)/16) more negative.
    """

    def __init__(
        self, T: int, H: int = 6, Hkv: int = 2, D: int = 8, b: int = 2, seed: int = 0, gate_scale=4.0
    ):
        gen = torch.Generator().manual_seed(seed)
        self.q = torch.randn(b, H, T, D, generator=gen, dtype=F64)
        self.k = torch.randn(b, Hkv, T, D, generator=gen, dtype=F64)
        self.v = torch.randn(b, Hkv, T, D, generator=gen, dtype=F64)
        q_pre = 2 * torch.randn(b, H, T, D, generator=gen, dtype=F64)
        k_pre = gate_scale * torch.randn(b, Hkv, T, D, generator=gen, dtype=F64)
        self.qf, self.kf, self.g = liger_feature_map(q_pre), liger_feature_map(k_pre), liger_gate(k_pre)
        n = H // Hkv
        self.kh, self.vh, self.kfh, self.gh = (repeat_kv(x, n) for x in (self.k, self.v, self.kf, self.g))

    @property
    def gla(self):
        return self.qf, self.kf, self.v, self.g

    @property
    def gla_h(self):
        return self.qf, self.kfh, self.vh, self.gh

    def step_inputs(self, sl: slice):
        return (x[:, :, sl] for x in (self.q, self.k, self.v, self.qf, self.kf, self.g))


def dense_swa(q, k, v, window):
    """SWA(w, 0): softmax over the last w keys, the query's own included, as a dense masked matrix."""
    T, D = q.shape[-2], q.shape[-1]
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    s = (q @ k.transpose(-1, -2)) * D**-0.5
    return torch.softmax(s.masked_fill(~((j <= i) & (j > i - window)), float("-inf")), -1) @ v


LENGTHS = (1, 15, 17, 50, 133)  # none a multiple of the default chunk (16) except by accident of 1
WINDOWS = (1, 5, 16)


@pytest.mark.parametrize(
    ("T", "C"), [pytest.param(T, C, id=f"T{T}-C{C}") for T, C in itertools.product(LENGTHS, (1, 5, 16, 64))]
)
def test_gla_forms_agree(T: int, C: int) -> None:
    c = Case(T)
    ref, S_ref = naive_recurrent_gla(*c.gla_h)
    close(naive_quadratic_gla(*c.gla_h), ref)
    o, S = chunk_gla(*c.gla, output_final_state=True, chunk_size=C)
    close(o, ref)
    # The state is per key/value head, and every query head of a group holds the same one.
    assert S.shape == (2, 2, 8, 8) and S.dtype == F64
    close(repeat_kv(S, 3), S_ref)
    # Keys expanded to the query heads (Hkv = H) give the same outputs.
    close(chunk_gla(*c.gla_h, chunk_size=C)[0], ref)


@pytest.mark.parametrize(
    ("T", "W"), [pytest.param(T, W, id=f"T{T}-W{W}") for T, W in itertools.product(LENGTHS, WINDOWS)]
)
def test_liger_forms_agree(T: int, W: int) -> None:
    c = Case(T)
    ref = naive_quadratic_liger_attn(c.q, c.kh, c.vh, c.qf, c.kfh, c.gh, W)
    rec, S_rec = naive_recurrent_liger_attn(c.q, c.kh, c.vh, c.qf, c.kfh, c.gh, W)
    close(rec, ref)
    o, state = chunk_liger_attn(c.q, c.k, c.v, c.qf, c.kf, c.g, W, output_final_state=True)
    close(o, ref)
    close(repeat_kv(state.S, 3), S_rec)
    assert state.k_win.shape[-2] == min(T, W - 1)
    state, outs = None, []
    for t in range(T):
        o1, state = liger_attn_step(*c.step_inputs(slice(t, t + 1)), state, W)
        outs.append(o1)
    close(torch.cat(outs, dim=2), ref)
    close(repeat_kv(state.S, 3), S_rec)


def test_liger_window_boundary_matters() -> None:
    """Guards the comparisons above: an off-by-one window gives a clearly different answer."""
    c = Case(40)
    o5 = chunk_liger_attn(c.q, c.k, c.v, c.qf, c.kf, c.g, 5)[0]
    o6 = naive_quadratic_liger_attn(c.q, c.kh, c.vh, c.qf, c.kfh, c.gh, 6)
    assert (o5 - o6).abs().max() > 1e-3


def test_chunked_gla_is_finite_and_exact_at_4096_tokens_with_strongly_negative_gates() -> None:
    T, C = 4096, 16
    gen = torch.Generator().manual_seed(1)
    b, H, Hkv, D = 1, 4, 2, 8
    qf = torch.softmax(torch.randn(b, H, T, D, generator=gen, dtype=F64), -1)
    kf = torch.softmax(torch.randn(b, Hkv, T, D, generator=gen, dtype=F64), -1)
    v = torch.randn(b, Hkv, T, D, generator=gen, dtype=F64)
    # Half the channels forget fast (g from −20 to −80 per token, so a chunk's gates sum to about
    # −800, past exp's float64 range of ±709), half barely at all (g ≈ −1e-3, so the state keeps
    # thousands of tokens there).
    fast = -torch.empty(b, Hkv, T, D // 2, dtype=F64).uniform_(20.0, 80.0, generator=gen)
    slow = -torch.empty(b, Hkv, T, D // 2, dtype=F64).uniform_(0.0, 2e-3, generator=gen)
    g = torch.cat([fast, slow], dim=-1)
    chunk_sums = g.reshape(b, Hkv, T // C, C, D).sum(-2)
    assert chunk_sums.min() < -709  # exp(−Σg) of a factorised chunk form would overflow even in float64
    ref, S_ref = naive_recurrent_gla(qf, repeat_kv(kf, 2), repeat_kv(v, 2), repeat_kv(g, 2))
    o, S = chunk_gla(qf, kf, v, g, output_final_state=True, chunk_size=C)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    close(o, ref)
    close(repeat_kv(S, 2), S_ref)
    # The slow channels really carry memory from far back, so this is not a trivially local sum.
    assert S[..., D // 2 :, :].abs().sum() > 10 * S[..., : D // 2, :].abs().sum()
    # In float32 (the compute dtype of real models) it is finite too, and close to float64.
    o32, S32 = chunk_gla(qf.float(), kf.float(), v.float(), g.float(), output_final_state=True, chunk_size=C)
    assert torch.isfinite(o32).all() and torch.isfinite(S32).all()
    close(o32.double(), ref, atol=1e-4)


@pytest.mark.parametrize(
    ("P", "W", "step"),
    [
        pytest.param(P, W, s, id=f"P{P}-W{W}-S{s}")
        for P, W, s in [(1, 5, 1), (4, 5, 1), (5, 5, 1), (6, 5, 3), (17, 16, 1), (33, 16, 7), (9, 1, 2)]
    ],
)
def test_prefill_then_decode_equals_recurrent(P: int, W: int, step: int) -> None:
    T = 60
    c = Case(T, b=1)
    ref, S_ref = naive_recurrent_liger_attn(c.q, c.kh, c.vh, c.qf, c.kfh, c.gh, W)
    o_pre, state = chunk_liger_attn(*c.step_inputs(slice(0, P)), W, output_final_state=True)
    # The multi-token step from an empty state is the same prefill.
    o_pre2, state2 = liger_attn_step(*c.step_inputs(slice(0, P)), None, W)
    close(o_pre2, o_pre)
    for x, y in zip(state, state2):
        close(x, y)
    outs = [o_pre]
    for t in range(P, T, step):
        o, state = liger_attn_step(*c.step_inputs(slice(t, min(t + step, T))), state, W)
        outs.append(o)
    close(torch.cat(outs, dim=2), ref)
    close(repeat_kv(state.S, 3), S_ref)
    assert torch.equal(state.k_win, c.k[:, :, T - (W - 1) :] if W > 1 else c.k[:, :, :0])


def test_gla_step_continues_any_split() -> None:
    c = Case(40)
    ref, S_ref = naive_recurrent_gla(*c.gla_h)
    state, outs = None, []
    for a, b in [(0, 1), (1, 17), (17, 18), (18, 40)]:
        o, state = gla_step(*(x[:, :, a:b] for x in c.gla), state)
        outs.append(o)
    close(torch.cat(outs, 2), ref)
    close(repeat_kv(state, 3), S_ref)


def test_decode_state_size_constant_over_2000_steps() -> None:
    H, Hkv, D, W, steps = 4, 2, 8, 16, 2000
    gen = torch.Generator().manual_seed(0)
    state, sizes = None, set()
    with torch.no_grad():
        for t in range(steps):
            q, k, v = (torch.randn(1, h, 1, D, generator=gen) for h in (H, Hkv, Hkv))
            q_pre, k_pre = torch.randn(1, H, 1, D, generator=gen), torch.randn(1, Hkv, 1, D, generator=gen)
            o, state = liger_attn_step(
                q, k, v, liger_feature_map(q_pre), liger_feature_map(k_pre), liger_gate(k_pre), state, W
            )
            assert torch.isfinite(o).all()
            assert state.k_win.shape[-2] == min(t + 1, W - 1)
            if t >= W - 2:
                sizes.add(tuple((tuple(x.shape), x.dtype) for x in state))
    assert len(sizes) == 1, sizes
    # fp32 S at the Hkv heads and the window's W − 1 keys and values: nothing grows with t.
    window = ((1, Hkv, W - 1, D), torch.float32)
    assert sizes.pop() == (((1, Hkv, D, D), torch.float32), window, window)


@pytest.mark.parametrize(
    ("T", "W"), [pytest.param(T, W, id=f"T{T}-W{W}") for T, W in [(17, 1), (50, 5), (133, 16)]]
)
def test_mix_one_zero_is_swa(T: int, W: int) -> None:
    c = Case(T)
    swa = dense_swa(c.q, c.kh, c.vh, W)
    close(chunk_liger_attn(c.q, c.k, c.v, c.qf, c.kf, c.g, W, mix=(1.0, 0.0))[0], swa)
    close(naive_quadratic_liger_attn(c.q, c.kh, c.vh, c.qf, c.kfh, c.gh, W, mix=(1.0, 0.0)), swa)
    state, outs = None, []
    for t in range(T):
        o, state = liger_attn_step(*c.step_inputs(slice(t, t + 1)), state, W, mix=(1.0, 0.0))
        outs.append(o)
    close(torch.cat(outs, 2), swa)
    # With the default mix the GLA branch is visible, so the comparisons above can fail.
    assert (chunk_liger_attn(c.q, c.k, c.v, c.qf, c.kf, c.g, W)[0] - swa).abs().max() > 1e-2


def test_zero_gate_is_unnormalised_linear_attention_on_softmax_features() -> None:
    c = Case(50)
    zero = torch.zeros_like(c.g)
    T = 50
    a = (c.qf @ c.kfh.transpose(-1, -2)) * torch.ones(T, T, dtype=torch.bool).tril()
    plain = a @ c.vh  # Σ_{j≤i} (φq_i·φk_j) v_j, no normaliser, no scale
    close(chunk_gla(c.qf, c.kf, c.v, zero)[0], plain)
    close(naive_recurrent_gla(c.qf, c.kfh, c.vh, repeat_kv(zero, 3))[0], plain)
    o_gla_only = chunk_liger_attn(c.q, c.k, c.v, c.qf, c.kf, zero, 5, mix=(0.0, 1.0))[0]
    close(o_gla_only, plain)
    # The real gates decay: the outputs then differ.
    assert (chunk_gla(*c.gla)[0] - plain).abs().max() > 1e-2


def test_chunked_gradients_match_quadratic() -> None:
    c = Case(37, b=1)
    leaves = [t.clone().requires_grad_(True) for t in (c.q, c.k, c.v, c.qf, c.kf, c.g)]
    weights = None
    grads = []
    for form in ("chunk", "naive"):
        q, k, v, qf, kf, g = leaves
        if form == "chunk":
            o, _ = chunk_liger_attn(q, k, v, qf, kf, g, 5, chunk_size=8)
        else:
            o = naive_quadratic_liger_attn(
                q, *(repeat_kv(x, 3) for x in (k, v)), qf, *(repeat_kv(x, 3) for x in (kf, g)), 5
            )
        weights = torch.linspace(-1, 1, o.numel(), dtype=F64).reshape(o.shape) if weights is None else weights
        (o * weights).sum().backward()
        grads.append([t.grad.clone() for t in leaves])
        for t in leaves:
            t.grad = None
    for g_chunk, g_ref in zip(*grads):
        close(g_chunk, g_ref)
    assert grads[0][5].abs().sum() > 0  # the gate gets a gradient


def test_low_precision_inputs_keep_fp32_state() -> None:
    c = Case(40, b=1)
    q, k, v = (x.to(torch.bfloat16) for x in (c.q, c.k, c.v))
    qf, kf, g = (x.float() for x in (c.qf, c.kf, c.g))
    o, state = chunk_liger_attn(q, k, v, qf, kf, g, 5, output_final_state=True)
    assert (
        o.dtype == torch.bfloat16 and state.S.dtype == torch.float32 and state.k_win.dtype == torch.bfloat16
    )
    o1, state = liger_attn_step(
        q[:, :, :1], k[:, :, :1], v[:, :, :1], qf[:, :, :1], kf[:, :, :1], g[:, :, :1], state, 5
    )
    assert o1.dtype == torch.bfloat16 and state.S.dtype == torch.float32
    ref = naive_quadratic_liger_attn(
        *(x.double() for x in (q, repeat_kv(k, 3), repeat_kv(v, 3))), c.qf, c.kfh, c.gh, 5
    )
    close(o.double(), ref, atol=3e-2)  # bf16 inputs and output rounding


def test_features_and_gate() -> None:
    x = 5 * torch.randn(2, 3, 7, 16, dtype=F64)
    phi = liger_feature_map(x)
    assert (phi > 0).all()
    close(phi.sum(-1), torch.ones(2, 3, 7, dtype=F64), atol=1e-14)
    close(repeat_kv(liger_feature_map(x), 2), liger_feature_map(repeat_kv(x, 2)), atol=0)
    g = liger_gate(x)
    assert (g < 0).all()
    close(g, F.logsigmoid(x) / 16, atol=0)
    # Liger pools the k_proj output (b, L, Hkv·D) to Hkv·D: an identity, so the gate is per channel.
    flat = x.transpose(1, 2).reshape(2, 7, 3 * 16)
    close(torch.nn.AdaptiveAvgPool1d(3 * 16)(flat), flat, atol=0)


def test_unrotate_half_inverts_rope_with_scaling_and_partial_rotary() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 16, generator=gen, dtype=F64)
    for r, scaling in [(16, 1.0), (16, 1.3), (8, 1.0), (8, 0.7)]:
        theta = torch.randn(2, 5, r // 2, generator=gen, dtype=F64)
        emb = torch.cat([theta, theta], -1)
        cos, sin = emb.cos() * scaling, emb.sin() * scaling
        xr = x[..., :r] * cos[:, None] + rotate_half(x[..., :r]) * sin[:, None]
        rotated = torch.cat([xr, x[..., r:]], -1)
        close(unrotate_half(rotated, cos, sin), x, atol=1e-14)
        assert (rotated - x).abs().max() > 1e-2


W = 8
T = 37  # not a multiple of W or of the GLA chunk
MODEL_ATOL = 2e-5


def ids_for(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 101, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def decode_logits(model, ids):
    cache = sinkwindow.make_cache(model)
    out = [model(ids[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(ids.shape[1])]
    return torch.cat(out, dim=1), cache


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "smollm3"])
def test_model_forward_equals_prefill_equals_decode(family: str) -> None:
    model = convert(tiny_model(family), f"liger:{W}")
    ids = ids_for(T)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        dyn = model(ids).logits
        chunked, cache = sinkwindow.prefill(model, ids, chunk_size=5, return_logits="all")
    stepped, _ = decode_logits(model, ids)
    assert isinstance(cache, LinearAttnCache)
    for other in (dyn, chunked, stepped):
        torch.testing.assert_close(other, full, atol=MODEL_ATOL, rtol=0)


def test_prefill_then_decode_and_generate() -> None:
    model = convert(tiny_model("llama"), f"liger:{W}")
    ids = ids_for(T + 9)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        _, cache = sinkwindow.prefill(model, ids[:, :T], chunk_size=11, return_logits="none")
        tail = [model(ids[:, t : t + 1], cache=cache, use_cache=True).logits for t in range(T, T + 9)]
        torch.testing.assert_close(torch.cat(tail, 1), full[:, T:], atol=MODEL_ATOL, rtol=0)
        prompt = ids[:, :20]
        kw = dict(max_new_tokens=8, do_sample=False, pad_token_id=0)
        ours = model.generate(prompt, cache=sinkwindow.make_cache(model), **kw)
        stock = model.generate(prompt, **kw)  # a DynamicCache: cached keys are un-rotated from positions
        seq = prompt
        for _ in range(8):
            seq = torch.cat([seq, model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(ours, seq) and torch.equal(stock, seq)


def test_a_sliding_stock_cache_is_refused() -> None:
    # Gemma 3's DynamicCache keeps only its local window on the sliding layers; GLA needs every token.
    model = convert(tiny_model("gemma3_text"), f"liger:{W}")
    with torch.no_grad(), pytest.raises(ValueError, match="make_cache"):
        model.generate(ids_for(20), max_new_tokens=4, do_sample=False, pad_token_id=0)


def _projection_reference(attn, hidden, cos, sin, window):
    """A Llama layer's Liger output computed from the projections themselves (no un-rotation)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    b, L, _ = hidden.shape
    H, D = attn.config.num_attention_heads, attn.head_dim
    n = H // attn.config.num_key_value_heads
    q = attn.q_proj(hidden).view(b, L, -1, D).transpose(1, 2)
    k = attn.k_proj(hidden).view(b, L, -1, D).transpose(1, 2)
    v = attn.v_proj(hidden).view(b, L, -1, D).transpose(1, 2)
    qf, kf, g = torch.softmax(q, -1), torch.softmax(k, -1), F.logsigmoid(k) / 16
    q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)
    o = naive_quadratic_liger_attn(
        q_rot,
        repeat_kv(k_rot, n),
        repeat_kv(v, n),
        qf,
        repeat_kv(kf, n),
        repeat_kv(g, n),
        window,
        scale=attn.scaling,
    )
    return attn.o_proj(o.transpose(1, 2).reshape(b, L, H * D))


def test_pre_rope_q_k_equal_the_projections() -> None:
    # float64 end to end: un-rotating the model's (cos, sin) must give the projections back exactly.
    model = convert(tiny_model("llama").double(), f"liger:{W}")
    seen = []

    def keep(module, args, kwargs, output):
        seen.append((module, kwargs["hidden_states"], kwargs["position_embeddings"], output[0]))

    hooks = [m.register_forward_hook(keep, with_kwargs=True) for m in get_retrofit(model).modules]
    with torch.no_grad():
        model(ids_for(T), use_cache=False)
        for h in hooks:
            h.remove()
        assert len(seen) == model.config.num_hidden_layers
        for attn, hidden, (cos, sin), out in seen:
            close(out, _projection_reference(attn, hidden, cos, sin, W))


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi", "smollm3"])
def test_pre_rope_is_what_the_family_rotates(family: str, monkeypatch) -> None:
    # Record the family's own RoPE inputs (after q/k norms, before partial-rotary pass-through) and
    # the pre-RoPE vectors the attention function derives: they must agree layer by layer.
    model = convert(tiny_model(family), f"liger:{W}")
    attn_cls = type(get_retrofit(model).modules[0])
    mod = sys.modules[attn_cls.__module__]
    rotated_in, derived = [], []
    real_rope, real_features = mod.apply_rotary_pos_emb, linear_attention.liger_features

    def rope(q, k, cos, sin, *args, **kwargs):
        rotated_in.append((q.detach(), k.detach()))
        return real_rope(q, k, cos, sin, *args, **kwargs)

    def features(variant, q_pre, k_pre):
        derived.append((q_pre, k_pre))
        return real_features(variant, q_pre, k_pre)

    monkeypatch.setattr(mod, "apply_rotary_pos_emb", rope)
    monkeypatch.setattr(linear_attention, "liger_features", features)
    with torch.no_grad():
        model(ids_for(T), use_cache=False)
    layers = get_retrofit(model).modules
    rope_layers = [i for i, m in enumerate(layers) if getattr(m, "use_rope", True)]
    assert len(derived) == len(layers) and len(rotated_in) == len(rope_layers) > 0
    for (q_in, k_in), i in zip(rotated_in, rope_layers):
        q_pre, k_pre = derived[i]
        r = q_in.shape[-1]  # Phi rotates only the first r channels
        torch.testing.assert_close(q_pre[..., :r], q_in.float(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(k_pre[..., :r], k_in.float(), atol=1e-5, rtol=1e-5)


def test_convert_adds_no_parameters_and_reverts() -> None:
    model = tiny_model("llama")
    ids = ids_for(T)
    with torch.no_grad():
        before = model(ids).logits
    names = [n for n, _ in model.named_parameters()]
    convert(model, f"liger:{W}")
    assert [n for n, _ in model.named_parameters()] == names
    rf = get_retrofit(model)
    assert rf.variant == LinearVariant(kind="liger", window=W)
    assert rf.variant.feature_map == "softmax" and rf.variant.mix == (0.5, 0.5)
    assert isinstance(sinkwindow.make_cache(model), LinearAttnCache)
    with torch.no_grad():
        assert (model(ids).logits - before).abs().max() > 1e-3
    revert(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)


def test_convert_refuses_lolcats_options_and_other_rope_conventions() -> None:
    with pytest.raises(ValueError, match="no learned feature maps"):
        convert(tiny_model("llama"), f"liger:{W}", feature_map="hedgehog")
    with pytest.raises(ValueError, match="liger:W options"):
        LinearVariant(kind="lolcats", window=W, mix=(1.0, 0.0))
    # GLM rotates interleaved pairs: un-rotating it as rotate_half would give wrong features.
    with pytest.raises(ValueError, match="rotate_half"):
        convert(tiny_model("glm"), f"liger:{W}")


def test_model_mix_one_zero_is_swa() -> None:
    model = tiny_model("llama")
    ids = ids_for(45)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        with sinkwindow.apply(model, f"swa:{W}:0"):
            swa = model(ids, use_cache=False).logits
        convert(model, f"liger:{W}", mix=(1.0, 0.0))
        got = model(ids, use_cache=False).logits
        decoded, _ = decode_logits(model, ids)
    assert (full - swa).abs().max() > 1e-2  # the window matters at this length
    torch.testing.assert_close(got, swa, atol=MODEL_ATOL, rtol=0)
    torch.testing.assert_close(decoded, swa, atol=MODEL_ATOL, rtol=0)


def test_model_cache_bytes_constant_over_2000_steps() -> None:
    model = convert(tiny_model("llama"), f"liger:{W}")
    cache = sinkwindow.make_cache(model)
    tok = torch.tensor([[5]])
    sizes = set()
    with torch.no_grad():
        for t in range(2000):
            tok = model(tok, cache=cache, use_cache=True).logits[:, -1:].argmax(-1)
            if t >= W:
                sizes.add((cache.nbytes(), sinkwindow.cache_nbytes(cache), tuple(cache.persisted_lengths())))
    assert cache.get_seq_length() == 2000
    assert len(sizes) == 1, sizes
    nbytes, counted, lengths = sizes.pop()
    assert counted == nbytes and set(lengths) == {W - 1}
    H, Hkv = model.config.num_attention_heads, model.config.num_key_value_heads
    D = model.config.hidden_size // H
    layer = cache.layers[0]
    assert layer.S.shape == (1, Hkv, D, D) and layer.S.dtype == torch.float32 and layer.z is None
    assert nbytes == len(cache.layers) * (4 * Hkv * D * D + 2 * 4 * Hkv * (W - 1) * D)


def test_states_stay_float32_in_a_bfloat16_model() -> None:
    model = convert(tiny_model("llama").to(torch.bfloat16), f"liger:{W}")
    _, cache = decode_logits(model, ids_for(12))
    assert cache.layers[0].S.dtype == torch.float32 and cache.layers[0].keys.dtype == torch.bfloat16


def test_checkpoint_round_trip(tmp_path) -> None:
    from safetensors.torch import load_file

    from sinkwindow.linear.lora import LIGER_LORA, add_lora

    model = convert(tiny_model("llama"), f"liger:{W}", mix=(0.25, 0.75))
    bare = save_checkpoint(model, tmp_path / "bare")
    assert load_file(str(bare)) == {}  # nothing to store before LoRA
    add_lora(model, r=LIGER_LORA["r"], alpha=LIGER_LORA["alpha"], targets=LIGER_LORA["targets"])
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    ids = ids_for(41)
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
    path = save_checkpoint(model, tmp_path / "ckpt")
    meta = read_metadata(tmp_path / "ckpt")
    assert meta["spec"] == f"liger:{W}" and meta["variant"]["kind"] == "liger"
    assert meta["variant"]["mix"] == [0.25, 0.75] and meta["lora"]["targets"] == [
        "k_proj",
        "q_proj",
        "v_proj",
    ]
    names = set(load_file(str(path)))
    assert names and all(".lora_" in n for n in names) and not any("o_proj" in n for n in names)
    fresh = load_linear(tiny_model("llama"), f"liger:{W}", tmp_path / "ckpt")
    assert get_retrofit(fresh).variant.mix == (0.25, 0.75)
    with torch.no_grad():
        assert torch.equal(fresh(ids, use_cache=False).logits, want)
    with pytest.raises(ValueError, match=f"not 'lolcats:{W}'"):
        load_linear(tiny_model("llama"), f"lolcats:{W}", tmp_path / "ckpt")


def test_state_types_are_checked_by_the_cache_layer() -> None:
    cache = LinearAttnCache(2, W, kind="liger")
    S = torch.zeros(1, 2, 8, 8)
    kv = torch.zeros(1, 2, W - 1, 8)
    cache.layers[0].set_state(LigerAttnState(S, kv, kv))
    assert isinstance(cache.layers[0].state, LigerAttnState) and cache.persisted_lengths() == [W - 1, 0]
    with pytest.raises(TypeError):
        LinearAttnCache(1, W).layers[0].set_state(LigerAttnState(S, kv, kv))

"""Linear-attention kernels: quadratic == chunked == recurrent, limits of the hybrid, feature maps."""

from __future__ import annotations

import itertools

import pytest
import torch

from sinkwindow.linear import (
    ACTIVATIONS,
    FEATURE_MAPS,
    HedgehogFeatureMap,
    HybridAttnState,
    chunk_linear_attn,
    chunk_window_linear_attn,
    linear_attn_step,
    naive_quadratic_linear_attn,
    naive_quadratic_window_linear_attn,
    naive_recurrent_linear_attn,
    naive_recurrent_window_linear_attn,
    prefill_state,
    repeat_kv,
    window_linear_attn_past_window,
    window_linear_attn_step,
    window_softmax_terms,
)

F64 = torch.float64
ATOL = 1e-10


class Case:
    """Random float64 inputs: q at H heads, k/v at Hkv heads, per-head ω, kaiming-init feature maps."""

    def __init__(self, T: int, H: int = 3, Hkv: int | None = None, D: int = 16, b: int = 2, seed: int = 0):
        Hkv = H if Hkv is None else Hkv
        g = torch.Generator().manual_seed(seed)
        self.q = torch.randn(b, H, T, D, generator=g, dtype=F64)
        self.k = torch.randn(b, Hkv, T, D, generator=g, dtype=F64)
        self.v = torch.randn(b, Hkv, T, D, generator=g, dtype=F64)
        self.omega = torch.empty(H, dtype=F64).uniform_(-2.0, 2.0, generator=g)
        torch.manual_seed(seed)
        # Kaiming rather than identity init so that q and k maps differ and the kernel is not trivial.
        self.fq = HedgehogFeatureMap(H, D, init="kaiming", dtype=F64)
        self.fk = HedgehogFeatureMap(H, D, init="kaiming", dtype=F64)
        self.kh = repeat_kv(self.k, H // Hkv)
        self.vh = repeat_kv(self.v, H // Hkv)
        with torch.no_grad():
            self.qf = self.fq(self.q)
            self.kf = self.fk(self.kh)


def close(a: torch.Tensor, b: torch.Tensor, atol: float = ATOL) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    err = (a - b).abs().max().item() if a.numel() else 0.0
    assert err <= atol, f"max abs error {err:.3e} > {atol:.0e}"


def dense_swa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Plain sliding-window softmax attention SWA(w), query included, as a dense masked softmax."""
    T, D = q.shape[-2], q.shape[-1]
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    s = (q @ k.transpose(-1, -2)) * D**-0.5
    s = s.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def shift(x: torch.Tensor, n: int) -> torch.Tensor:
    """Shift the sequence axis right by n, zeros in front."""
    return torch.nn.functional.pad(x, (0, 0, n, 0))[:, :, : x.shape[-2]]


LENGTHS = (1, 63, 65, 200)
WINDOWS = (1, 16, 64)
HYBRID = [
    pytest.param(T, W, affine, id=f"T{T}-W{W}-{'affine' if affine else 'lam1'}")
    for T, W, affine in itertools.product(LENGTHS, WINDOWS, (False, True))
]


@pytest.mark.parametrize(
    ("T", "C"), [pytest.param(T, C, id=f"T{T}-C{C}") for T, C in itertools.product(LENGTHS, (16, 64))]
)
def test_linear_forms_agree(T: int, C: int) -> None:
    c = Case(T)
    ref = naive_quadratic_linear_attn(c.qf, c.kf, c.vh)
    o_rec, (S_rec, z_rec) = naive_recurrent_linear_attn(c.qf, c.kf, c.vh)
    o_chunk, state = chunk_linear_attn(c.qf, c.kf, c.vh, chunk_size=C, output_final_state=True)
    close(o_rec, ref)
    close(o_chunk, ref)
    close(state.S, S_rec)
    close(state.z, z_rec)
    assert state.S.dtype == F64


@pytest.mark.parametrize(("T", "W", "affine"), HYBRID)
def test_hybrid_forms_agree(T: int, W: int, affine: bool) -> None:
    c = Case(T)
    ref, weights = naive_quadratic_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, W, c.omega, affine)
    o_rec, (S_rec, z_rec) = naive_recurrent_window_linear_attn(
        c.q, c.kh, c.vh, c.qf, c.kf, W, c.omega, affine
    )
    o_chunk, state = chunk_window_linear_attn(
        c.q, c.kh, c.vh, c.qf, c.kf, W, c.omega, affine, output_final_state=True
    )
    close(o_rec, ref)
    close(o_chunk, ref)
    close(state.S, S_rec)
    close(state.z, z_rec)
    close(weights.sum(-1), torch.ones_like(weights[..., 0]))
    close(weights @ c.vh, ref)


@pytest.mark.parametrize(("T", "W", "block"), [(200, 16, 1), (200, 64, 5), (65, 16, 200), (130, 64, 64)])
def test_chunked_hybrid_any_block_size(T: int, W: int, block: int) -> None:
    """Window blocks and linear chunks of any size (smaller, larger than w or than L) give the same outputs."""
    c = Case(T)
    ref, _ = naive_quadratic_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, W, c.omega)
    o, state = chunk_window_linear_attn(
        c.q, c.kh, c.vh, c.qf, c.kf, W, c.omega, output_final_state=True, block=block
    )
    close(o, ref)
    n = T - W
    close(state.S, torch.einsum("bhlf,bhld->bhfd", c.kf[:, :, :n], c.vh[:, :, :n]))


@pytest.mark.parametrize(
    ("T", "W", "Hkv", "block"),
    [(200, 16, 3, 64), (200, 64, 1, 7), (65, 64, 3, 64), (64, 64, 3, 64), (10, 16, 3, 64), (129, 1, 1, 5)],
)
def test_past_window_form_equals_chunked_tail(T: int, W: int, Hkv: int, block: int) -> None:
    """Stage 1's fast path: window terms in blocks + re-indexed linear term == chunk_window_linear_attn[w:]."""
    c = Case(T, Hkv=Hkv)
    ref, _ = chunk_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, W, c.omega, affine=True)
    n = max(T - W, 0)
    terms = window_softmax_terms(c.q, c.kh, c.vh, W, block=block)
    assert terms[0].shape == (*c.q.shape[:2], n, c.q.shape[-1]) and terms[1].shape == (*c.q.shape[:2], n)
    o = window_linear_attn_past_window(
        c.qf[:, :, T - n :], c.kf[:, :, :n], c.vh[:, :, :n], terms, c.omega, affine=True, chunk_size=block
    )
    close(o, ref[:, :, T - n :])
    if n:
        # The skipped queries really are pure softmax attention over their causal prefix.
        close(ref[:, :, :W], dense_swa(c.q, c.kh, c.vh, T)[:, :, :W])


def test_hybrid_window_boundary_matters() -> None:
    """Guards the comparisons above: an off-by-one window gives a clearly different answer."""
    c = Case(65)
    o16, _ = chunk_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, 16, c.omega)
    o17, _ = naive_quadratic_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, 17, c.omega)
    assert (o16 - o17).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("T", "W"),
    [pytest.param(T, W, id=f"T{T}-W{W}-H9") for T, W in itertools.product((63, 65, 200), (1, 16, 64))],
)
def test_gqa_recurrent_decode_matches_quadratic(T: int, W: int) -> None:
    c = Case(T, H=9, Hkv=3, b=1)
    ref, _ = naive_quadratic_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, W, c.omega)
    state, outs = None, []
    for t in range(T):
        sl = slice(t, t + 1)
        o, state = window_linear_attn_step(
            c.q[:, :, sl], c.k[:, :, sl], c.v[:, :, sl], state, c.fq, c.fk, W, c.omega
        )
        outs.append(o)
    close(torch.cat(outs, dim=2), ref)
    # The window lives at the 3 key/value heads; S and z at the 9 query heads.
    assert state.k_win.shape == (1, 3, min(T, W), 16)
    assert state.S.shape == (1, 9, 16, 16)
    _, (S_rec, z_rec) = naive_recurrent_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, W, c.omega)
    close(state.S, S_rec)
    close(state.z, z_rec)


@pytest.mark.parametrize(
    ("P", "W", "step"),
    [
        pytest.param(P, W, step, id=f"P{P}-W{W}-S{step}-H9")
        for P, W, step in [
            (1, 16, 1),
            (15, 16, 1),
            (16, 16, 1),
            (17, 16, 1),
            (50, 16, 1),
            (50, 16, 7),
            (9, 64, 5),
        ]
    ],
)
def test_prefill_then_decode_equals_recurrent(P: int, W: int, step: int) -> None:
    T = 80
    c = Case(T, H=9, Hkv=3, b=1)
    ref, (S_ref, z_ref) = naive_recurrent_window_linear_attn(
        c.q, c.kh, c.vh, c.qf, c.kf, W, c.omega, affine=True
    )

    p = slice(0, P)
    o_pre, final = chunk_window_linear_attn(
        c.q[:, :, p],
        c.kh[:, :, p],
        c.vh[:, :, p],
        c.qf[:, :, p],
        c.kf[:, :, p],
        W,
        c.omega,
        True,
        output_final_state=True,
    )
    state = prefill_state(c.k[:, :, p], c.v[:, :, p], c.kf[:, :, p], W)
    close(state.S, final.S)
    close(state.z, final.z)
    assert state.k_win.shape[-2] == min(P, W)

    # The same prompt through the multi-token step from an empty state must give the same state.
    o_pre2, state2 = window_linear_attn_step(
        c.q[:, :, p], c.k[:, :, p], c.v[:, :, p], None, c.fq, c.fk, W, c.omega, True
    )
    close(o_pre2, o_pre)
    for a, b in zip(state, state2):
        close(a, b)

    outs = [o_pre]
    for t in range(P, T, step):
        sl = slice(t, min(t + step, T))
        o, state = window_linear_attn_step(
            c.q[:, :, sl], c.k[:, :, sl], c.v[:, :, sl], state, c.fq, c.fk, W, c.omega, True
        )
        outs.append(o)
    close(torch.cat(outs, dim=2), ref)
    close(state.S, S_ref)
    close(state.z, z_ref)
    assert torch.equal(state.k_win, c.k[:, :, T - W :])


@pytest.mark.parametrize(
    ("P", "step"), [pytest.param(P, s, id=f"P{P}-S{s}") for P, s in [(1, 1), (63, 1), (65, 5)]]
)
def test_linear_prefill_then_decode_equals_recurrent(P: int, step: int) -> None:
    T = 100
    c = Case(T)
    ref, (S_ref, z_ref) = naive_recurrent_linear_attn(c.qf, c.kf, c.vh)
    p = slice(0, P)
    o_pre, state = chunk_linear_attn(c.qf[:, :, p], c.kf[:, :, p], c.vh[:, :, p], output_final_state=True)
    outs = [o_pre]
    for t in range(P, T, step):
        sl = slice(t, min(t + step, T))
        o, state = linear_attn_step(c.qf[:, :, sl], c.kf[:, :, sl], c.vh[:, :, sl], state)
        outs.append(o)
    close(torch.cat(outs, dim=2), ref)
    close(state.S, S_ref)
    close(state.z, z_ref)


@pytest.mark.parametrize(
    ("T", "W"), [pytest.param(T, W, id=f"T{T}-W{W}") for T, W in itertools.product((65, 200), WINDOWS)]
)
def test_hybrid_gamma_to_one_affine_is_swa(T: int, W: int) -> None:
    c = Case(T)
    swa = dense_swa(c.q, c.kh, c.vh, W)
    big = torch.full_like(c.omega, 30.0)  # γ = 1 − 9e-14, λ = 1 − γ
    o_chunk, _ = chunk_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, W, big, affine=True)
    o_quad, _ = naive_quadratic_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, W, big, affine=True)
    close(o_chunk, swa)
    close(o_quad, swa)
    # Without the limit the linear term is visible, so the comparison above can fail.
    o_mixed, _ = chunk_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, W, c.omega, affine=True)
    if T > W:
        assert (o_mixed - swa).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("T", "W"), [pytest.param(T, W, id=f"T{T}-W{W}") for T, W in itertools.product((65, 200), WINDOWS)]
)
def test_hybrid_linear_part_is_shifted_linear_attn(T: int, W: int) -> None:
    c = Case(T)
    tiny = torch.full_like(c.omega, -40.0)  # γ ≈ 4e-18, λ = 1
    o_hyb, _ = chunk_window_linear_attn(c.q, c.kh, c.vh, c.qf, c.kf, W, tiny)
    # eps = 0: a shifted query i ≥ w always sees key 0, so its denominator is positive.
    ref_quad = naive_quadratic_linear_attn(c.qf, shift(c.kf, W), shift(c.vh, W), eps=0.0)
    ref_chunk, _ = chunk_linear_attn(c.qf, shift(c.kf, W), shift(c.vh, W), eps=0.0, chunk_size=32)
    close(o_hyb[:, :, W:], ref_quad[:, :, W:])
    close(o_hyb[:, :, W:], ref_chunk[:, :, W:])
    # Before any key has left the window, only the window term exists, whatever γ.
    close(o_hyb[:, :, :W], dense_swa(c.q, c.kh, c.vh, W)[:, :, :W])


def test_chunked_hybrid_gradients_match_quadratic() -> None:
    c = Case(65, b=1)
    leaves = [t.clone().requires_grad_(True) for t in (c.q, c.kh, c.vh, c.qf, c.kf, c.omega)]
    grads = []
    for fn in (chunk_window_linear_attn, naive_quadratic_window_linear_attn):
        o, _ = fn(*leaves[:5], 16, leaves[5], affine=True)
        (o * torch.linspace(-1, 1, o.numel(), dtype=F64).reshape(o.shape)).sum().backward()
        grads.append([t.grad.clone() for t in leaves])
        for t in leaves:
            t.grad = None
    for g_chunk, g_quad in zip(*grads):
        close(g_chunk, g_quad)
    assert grads[0][5].abs().min() > 0  # every head's γ gets a gradient through both terms


def test_low_precision_inputs_keep_fp32_state() -> None:
    c = Case(70, H=9, Hkv=3, b=1)
    q, k, v = (x.to(torch.bfloat16) for x in (c.q, c.k, c.v))
    fq, fk = c.fq.float(), c.fk.float()
    qf, kf = fq(q), fk(repeat_kv(k, 3))
    assert qf.dtype == torch.float32
    o, final = chunk_window_linear_attn(
        q, repeat_kv(k, 3), repeat_kv(v, 3), qf, kf, 16, c.omega.float(), output_final_state=True
    )
    assert o.dtype == torch.bfloat16 and final.S.dtype == torch.float32
    ref, _ = naive_quadratic_window_linear_attn(
        *(x.double() for x in (q, repeat_kv(k, 3), repeat_kv(v, 3), qf, kf)), 16, c.omega
    )
    close(o.double(), ref, atol=2e-2)  # bf16 output rounding
    state = prefill_state(k, v, kf, 16)
    o1, state = window_linear_attn_step(
        q[:, :, -1:], k[:, :, -1:], v[:, :, -1:], state, fq, fk, 16, c.omega.float()
    )
    assert o1.dtype == torch.bfloat16
    assert state.S.dtype == torch.float32 and state.k_win.dtype == torch.bfloat16


def _state_bytes(state: HybridAttnState) -> int:
    return sum(t.numel() * t.element_size() for t in state)


def test_decode_state_size_constant_over_2000_steps() -> None:
    H, Hkv, D, W, steps = 4, 2, 8, 16, 2000
    g = torch.Generator().manual_seed(0)
    fq, fk = HedgehogFeatureMap(H, D), HedgehogFeatureMap(H, D)
    hybrid, linear = None, None
    sizes = set()
    with torch.no_grad():
        for t in range(steps):
            q = torch.randn(1, H, 1, D, generator=g)
            k = torch.randn(1, Hkv, 1, D, generator=g)
            v = torch.randn(1, Hkv, 1, D, generator=g)
            o, hybrid = window_linear_attn_step(q, k, v, hybrid, fq, fk, W, -2.1972245773362196)
            assert hybrid.k_win.shape[-2] == min(t + 1, W)
            ol, linear = linear_attn_step(fq(q), fk(repeat_kv(k, H // Hkv)), repeat_kv(v, H // Hkv), linear)
            if t >= W - 1:
                sizes.add(
                    (
                        _state_bytes(hybrid),
                        tuple(tuple(x.shape) for x in hybrid),
                        linear.S.shape,
                        linear.z.shape,
                    )
                )
            assert torch.isfinite(o).all() and torch.isfinite(ol).all()
    assert len(sizes) == 1
    nbytes = next(iter(sizes))[0]
    # fp32 S (H·F·D) and z (H·F) plus the fp32 window at Hkv heads: nothing grows with t.
    assert nbytes == 4 * (H * D * D + H * D + 2 * Hkv * W * D)
    assert torch.isclose(hybrid.z.sum(), torch.tensor(2.0 * H * (steps - W)), rtol=1e-5)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_feature_map_shapes_and_positivity(activation: str) -> None:
    H, D = 9, 64
    fm = HedgehogFeatureMap(H, D, activation=activation, init="kaiming")
    expansion = ACTIVATIONS[activation][1]
    f = D // 2 if expansion == 2 else D
    assert fm.weight.shape == (H, D, f)
    assert fm.out_features == expansion * f
    x = 3 * torch.randn(2, H, 37, D)
    phi = fm(x)
    assert phi.shape == (2, H, 37, fm.out_features)
    assert (phi > 0).all()
    if activation == "softmax_dim":
        close(phi[..., :f].sum(-1), torch.ones(2, H, 37), atol=1e-5)
        close(phi[..., f:].sum(-1), torch.ones(2, H, 37), atol=1e-5)
        assert (phi @ phi.transpose(-1, -2)).max() <= 2 + 1e-6
    if activation == "exp_dim":
        close(phi[..., :f].amax(-1), torch.ones(2, H, 37), atol=0)
        close(phi[..., f:].amax(-1), torch.ones(2, H, 37), atol=0)
    if activation == "relu":
        assert fm.bias is not None and fm.bias.shape == (H, f)
    with pytest.raises(ValueError):
        fm(torch.randn(1, H + 1, 3, D))


def test_feature_map_identity_init_uses_first_f_coordinates() -> None:
    H, D = 9, 64
    fm = HedgehogFeatureMap(H, D)
    assert fm.init == "identity" and fm.activation == "softmax_dim" and fm.bias is None
    assert sum(p.numel() for p in fm.parameters()) == 9 * 64 * 32
    x = torch.randn(2, H, 11, D, dtype=F64)
    close(fm.project(x), x[..., :32], atol=0)
    u = x[..., :32]
    close(fm(x), torch.cat([torch.softmax(u, -1), torch.softmax(-u, -1)], dim=-1), atol=1e-15)
    for h in range(H):
        assert torch.equal(fm.weight[h], torch.eye(D, 32))
    kaiming = HedgehogFeatureMap(H, D, init="kaiming")
    assert not torch.equal(kaiming.weight[0], torch.eye(D, 32))
    t2r = HedgehogFeatureMap(H, D, activation="relu")
    close(t2r(x), x.clamp(min=1e-12), atol=0)


def test_feature_map_registry_and_validation() -> None:
    for name, make in FEATURE_MAPS.items():
        fm = make(3, 16)
        assert fm(torch.randn(1, 3, 5, 16)).shape[-1] == fm.out_features, name
    assert FEATURE_MAPS["t2r"](3, 16).activation == "relu"
    with pytest.raises(ValueError):
        HedgehogFeatureMap(3, 16, activation="elu")
    with pytest.raises(ValueError):
        HedgehogFeatureMap(3, 16, init="zeros")

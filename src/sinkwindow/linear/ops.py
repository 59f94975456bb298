"""Linear-attention kernels: pure linear attention and the LoLCATs sliding-window hybrid.

Each operator comes in three forms that compute the same numbers (to ~1e-15 in float64):

1. Quadratic, O(L²) (``naive.py``): build the (L, L) weight matrix and mask it. The reference, and
   the only form that returns the attention weights.
2. Chunked, O(L·C) (``chunk_linear_attn``, ``chunk_window_linear_attn``): for training and prefill. The
   sequence is cut into chunks of C tokens (zero-padded at the end, so any length works); the
   linear part carries an F×D state across chunks and is exact within a chunk with a causal mask.
   For the hybrid, C = w: the softmax window of any query then lies in its own chunk and the one
   before, and the linear part is plain causal linear attention on keys and values shifted right by
   w (key j is "linear" for query i exactly when j + w ≤ i).
3. Recurrent (``linear_attn_step``, ``window_linear_attn_step``): for decoding. The state is S = Σ φk vᵀ
   (F × D) and z = Σ φk (F); the hybrid adds a FIFO of the last ≤ w keys and values, whose keys
   enter S and z only when they leave the window. ``prefill_state`` builds that state from a
   prompt, so prefill-then-decode gives the same outputs as decoding every token.

The hybrid (docs/linear.md §1.3), for query i, window W(i) = {i−w < j ≤ i}, γ = sigmoid(ω), λ = 1 (or
1 − γ with ``affine=True``)::

    y_i = (γ Σ_{j∈W(i)} exp(s_ij − m_i) v_j + λ φq_i S_{i−w}) / (γ Σ_{j∈W(i)} exp(s_ij − m_i) + λ φq_i·z_{i−w})

with m_i the max score over the window. The normaliser quirk: m_i is *not* a log-sum-exp shift,
because the linear term is not multiplied by exp(−m_i). The window's largest weight is therefore
pinned at γ whatever the scores, and the feature maps learn their scale relative to it. LoLCATs
trains this way and its checkpoints assume it; do not fix it. It also means the denominator is
at least γ > 0, so the hybrid needs no eps; pure linear attention adds eps = 1e-12.

Conventions:

- q, k, v are (b, H, L, D), post-RoPE; q_feat, k_feat = φq(q), φk(k) are (b, H, L, F).
- Grouped-query attention: the chunked kernels take keys and values already expanded to H heads
  with ``repeat_kv`` (LoLCATs maps keys *after* the repeat, one key map per query head). The
  decode functions keep the FIFO at the Hkv key/value heads, as the model cache would, and expand
  on use; S and z are per query head.
- Compute runs in float32, or float64 when any input is float64. Outputs are cast back to
  ``v.dtype``. States (S, z) stay in the compute dtype: bf16 accumulation of z drifts by percents
  over 1e5 tokens (docs/linear.md §2.3, §7.2).

Liger-GLA(+SWA) (``chunk_gla``, ``gla_step``, ``chunk_liger_attn``, ``liger_attn_step``) adds no
parameters to the model. Its linear branch is gated linear attention (GLA) on feature maps that
are a plain softmax over the head dimension of the *pre-RoPE* query and key, with a per-channel
forget gate computed from the pre-RoPE key::

    φq_t = softmax(q_t), φk_t = softmax(k_t), g_t = logsigmoid(k_t) / 16      (all ≤ 0 for g)
    S_t  = diag(exp g_t) S_{t−1} + φk_t v_tᵀ                                  (F × D, F = D)
    o_t  = φq_tᵀ S_t                                                           (scale 1, no normaliser)

The decay acts on the key (feature) axis. The layer outputs 0.5 · SWA_w + 0.5 · GLA, where SWA_w is
plain softmax attention of the post-RoPE query over the last w post-RoPE keys (its own included),
normalised on its own; the two branches share nothing but v. Because k, v and g are per key/value
head, so is S: under GQA the state is kept at the Hkv heads and every query head of a group reads
the same S, which is exact (not an approximation) and Hkv/H the size of a per-query-head state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "GLA_CHUNK",
    "HybridAttnState",
    "LIGER_GATE_NORMALIZER",
    "LIGER_MIX",
    "LigerAttnState",
    "LinearAttnState",
    "chunk_gla",
    "chunk_window_linear_attn",
    "chunk_liger_attn",
    "chunk_linear_attn",
    "gla_step",
    "window_linear_attn_past_window",
    "window_linear_attn_step",
    "liger_attn_step",
    "liger_feature_map",
    "liger_gate",
    "linear_attn_step",
    "prefill_state",
    "repeat_kv",
    "unrotate_half",
    "window_softmax_terms",
]

FeatureMap = Callable[[torch.Tensor], torch.Tensor]


class LinearAttnState(NamedTuple):
    """Recurrent state of causal linear attention.

    Attributes:
        S: (b, H, F, D), Σ_j φk_j v_jᵀ.
        z: (b, H, F), Σ_j φk_j.
    """

    S: torch.Tensor
    z: torch.Tensor


class HybridAttnState(NamedTuple):
    """Decode state of the hybrid: linear state of the keys behind the window, plus the window.

    Invariant after t tokens: ``k_win``/``v_win`` hold the last min(t, w) tokens, oldest first, and
    S, z sum over every earlier token. Its size is bounded by w, whatever t.

    Attributes:
        S: (b, H, F, D), in the compute dtype.
        z: (b, H, F), in the compute dtype.
        k_win: (b, Hkv, n, D), n ≤ w, post-RoPE keys in the model dtype.
        v_win: (b, Hkv, n, D).
    """

    S: torch.Tensor
    z: torch.Tensor
    k_win: torch.Tensor
    v_win: torch.Tensor


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """Expand key/value heads for grouped-query attention, as transformers' ``repeat_kv`` does.

    Args:
        x: (b, Hkv, L, D).
        n_rep: H // Hkv.

    Returns:
        (b, Hkv * n_rep, L, D); query head h reads key/value head h // n_rep.
    """
    if n_rep == 1:
        return x
    b, h, L, d = x.shape
    return x[:, :, None].expand(b, h, n_rep, L, d).reshape(b, h * n_rep, L, d)


def _compute_dtype(*xs: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32


def _mixing_factors(
    window_factor: torch.Tensor | float,
    num_heads: int,
    affine: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | float]:
    """γ = sigmoid(ω) and λ as (1, H, 1, 1) tensors (λ may be the float 1.0)."""
    omega = torch.as_tensor(window_factor, dtype=dtype, device=device).reshape(1, -1, 1, 1)
    if omega.shape[1] not in (1, num_heads):
        raise ValueError(f"window_factor must have 1 or {num_heads} elements, got {omega.shape[1]}")
    gamma = torch.sigmoid(omega)
    return gamma, (1 - gamma) if affine else 1.0


def _pad_to(x: torch.Tensor, length: int) -> torch.Tensor:
    """Zero-pad the sequence axis (-2) of (b, H, L, ·) at the end up to ``length``."""
    return F.pad(x, (0, 0, 0, length - x.shape[-2]))


def _chunk_causal_linear(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    chunk_size: int,
    initial_state: LinearAttnState | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numerator and denominator of inclusive causal linear attention, chunk by chunk.

    Args:
        q_feat, k_feat: (b, H, L, F), L a multiple of ``chunk_size``, in the compute dtype.
        v: (b, H, L, D).
        chunk_size: C.
        initial_state: added to every query's prefix state, or None.

    Returns:
        num: (b, H, L, D), φq_i·S_i with S_i = S0 + Σ_{j≤i} φk_j v_jᵀ.
        den: (b, H, L), φq_i·z_i.
    """
    b, H, L, Fd = q_feat.shape
    D = v.shape[-1]
    n, C = L // chunk_size, chunk_size
    qc = q_feat.reshape(b, H, n, C, Fd)
    kc = k_feat.reshape(b, H, n, C, Fd)
    vc = v.reshape(b, H, n, C, D)

    kv = torch.einsum("bhncf,bhncd->bhnfd", kc, vc)  # [b, H, n, F, D]
    ks = kc.sum(-2)  # [b, H, n, F]
    # Exclusive prefix sums: what every chunk before c contributes. Shifting before the cumsum
    # (rather than cumsum − own term) avoids cancellation in float32.
    S_prev = F.pad(kv, (0, 0, 0, 0, 1, 0))[:, :, :-1].cumsum(2)
    z_prev = F.pad(ks, (0, 0, 1, 0))[:, :, :-1].cumsum(2)
    if initial_state is not None:
        S_prev = S_prev + initial_state.S[:, :, None].to(S_prev.dtype)
        z_prev = z_prev + initial_state.z[:, :, None].to(z_prev.dtype)

    causal = torch.ones(C, C, dtype=torch.bool, device=q_feat.device).tril()
    a = torch.einsum("bhncf,bhnkf->bhnck", qc, kc) * causal  # [b, H, n, C, C]
    num = torch.einsum("bhncf,bhnfd->bhncd", qc, S_prev) + a @ vc
    den = torch.einsum("bhncf,bhnf->bhnc", qc, z_prev) + a.sum(-1)
    return num.reshape(b, H, L, D), den.reshape(b, H, L)


def chunk_linear_attn(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    eps: float = 1e-12,
    chunk_size: int = 64,
    initial_state: LinearAttnState | tuple[torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, LinearAttnState | None]:
    """Causal linear attention y_i = φq_i S_i / (φq_i·z_i + eps), including key i, in O(L·C).

    Args:
        q_feat: (b, H, L, F).
        k_feat: (b, H, L, F).
        v: (b, H, L, D), expanded to H heads (``repeat_kv``) under grouped-query attention.
        eps: normaliser guard (LoLCATs 1e-12). Harmless here since the sum runs in float32 or
            wider; in float16 it would underflow (docs/linear.md §7.3).
        chunk_size: C; capped at L. Any L works: the tail is zero-padded and the padding has
            φk = 0, v = 0.
        initial_state: (S, z) of tokens before this call, or None.
        output_final_state: also return the state after the last token.

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
        final_state: ``LinearAttnState`` with S (b, H, F, D) and z (b, H, F) in float32 (float64
            for float64 inputs), or None.
    """
    dt = _compute_dtype(q_feat, k_feat, v)
    L = q_feat.shape[-2]
    if initial_state is not None:
        initial_state = LinearAttnState(*initial_state)
    C = max(1, min(chunk_size, L))
    Lp = -(-L // C) * C
    qf, kf, vv = (_pad_to(x.to(dt), Lp) for x in (q_feat, k_feat, v))
    num, den = _chunk_causal_linear(qf, kf, vv, C, initial_state)
    o = (num / (den + eps)[..., None])[:, :, :L].to(v.dtype)
    if not output_final_state:
        return o, None
    S = torch.einsum("bhlf,bhld->bhfd", kf, vv)
    z = kf.sum(-2)
    if initial_state is not None:
        S, z = S + initial_state.S.to(dt), z + initial_state.z.to(dt)
    return o, LinearAttnState(S, z)


def _window_terms(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    scale: float,
    q_start: int,
    block: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Window numerator and denominator, without γ, for queries at positions q_start … q_start + T − 1.

    num_i = Σ_{i−w<j≤i, j≥0} exp(s_ij − m_i) v_j, den_i = Σ exp(s_ij − m_i), m_i the max score over
    the window. Queries run in blocks of ``block`` against the w + block keys covering their
    windows: block c holds queries q_start + c·B + a (a < B) and keys q_start + c·B − w + t
    (t < w + B), and key t is in query a's window iff a < t ≤ a + w and the key exists (≥ 0). That
    is w + B keys per query instead of the 2w of a chunk pair.

    Args:
        q: (b, H, T, D), the queries' absolute positions start at ``q_start`` ≤ L − T.
        k, v: (b, H, L, D), positions 0 … L − 1, L ≥ q_start + T.
        window: w ≥ 1.
        scale: score scale.
        q_start: position of the first query.
        block: B, queries per block.

    Returns:
        num: (b, H, T, D), den: (b, H, T), in q's dtype (the caller picks the compute dtype).
    """
    b, H, T, D = q.shape
    if T == 0:
        return q.new_zeros(b, H, 0, D), q.new_zeros(b, H, 0)
    B = max(1, min(block, T))
    n = -(-T // B)
    lo = q_start - window  # position of key slot 0 of block 0
    k_use, v_use = k[:, :, max(lo, 0) : q_start + T], v[:, :, max(lo, 0) : q_start + T]
    front = max(-lo, 0)
    back = n * B + window - front - k_use.shape[-2]
    kp = F.pad(k_use, (0, 0, front, back))
    vp = F.pad(v_use, (0, 0, front, back))
    qb = _pad_to(q, n * B).reshape(b, H, n, B, D)
    kb = kp.unfold(2, window + B, B)  # [b, H, n, D, w + B]
    vb = vp.unfold(2, window + B, B).transpose(-1, -2)  # [b, H, n, w + B, D]
    a = torch.arange(B, device=q.device)[:, None]
    t = torch.arange(window + B, device=q.device)[None, :]
    key_pos = lo + B * torch.arange(n, device=q.device)[:, None, None] + t  # [n, 1, w + B]
    outside = ~((t > a) & (t <= a + window)) | (key_pos < 0)  # [n, B, w + B]
    s = torch.matmul(qb, kb) * scale
    # Each query keeps its own key (t = a + w), so the max is finite; padded queries see only
    # padded keys and are dropped below.
    s = s.masked_fill(outside, float("-inf"))
    e = torch.exp(s - s.amax(-1, keepdim=True))
    num = torch.matmul(e, vb).reshape(b, H, n * B, D)[:, :, :T]
    den = e.sum(-1).reshape(b, H, n * B)[:, :, :T]
    return num, den


def _linear_past_window(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    chunk_size: int,
    initial_state: LinearAttnState | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hybrid's linear term for the n queries past the window (i ≥ w), re-indexed by i' = i − w.

    Query i sees keys j ≤ i − w, so this is inclusive causal linear attention of those queries
    against the first n keys, in chunks of ``chunk_size`` (any n: the tail is zero-padded).

    Args:
        q_feat: (b, H, n, F), φq of queries w … w + n − 1.
        k_feat: (b, H, n, F), φk of keys 0 … n − 1; v: (b, H, n, D); all in the compute dtype.

    Returns:
        num (b, H, n, D) and den (b, H, n).
    """
    n = q_feat.shape[-2]
    C = max(1, min(chunk_size, n))
    Lp = -(-n // C) * C
    num, den = _chunk_causal_linear(*(_pad_to(x, Lp) for x in (q_feat, k_feat, v)), C, initial_state)
    return num[:, :, :n], den[:, :, :n]


def chunk_window_linear_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    window: int,
    window_factor: torch.Tensor | float,
    affine: bool = False,
    scale: float | None = None,
    initial_state: LinearAttnState | tuple[torch.Tensor, torch.Tensor] | None = None,
    output_final_state: bool = False,
    block: int | None = None,
) -> tuple[torch.Tensor, LinearAttnState | None]:
    """LoLCATs hybrid (sliding-window softmax + linear attention, one normaliser) in O(L·w).

    Matches ``naive_quadratic_window_linear_attn``. The window term runs in query blocks against the w +
    block keys covering them (``_window_terms``); the linear term is causal linear attention of
    the queries past the window against the keys before the last w, in chunks of ``block``. Any L
    works. Differentiable in every input, ω included (the window term runs with gradients, unlike
    LoLCATs' ``_sw_linear`` fallback, docs/linear.md §7.1).

    Args:
        q: (b, H, L, D).
        k, v: (b, H, L, D), expanded to H heads (``repeat_kv``) under grouped-query attention.
        q_feat, k_feat: (b, H, L, F), φq(q) and φk(k).
        window: w ≥ 1, keys in the softmax window, the query's own included.
        window_factor: ω, a scalar or H mixing logits (shape (H,) or (1, H, 1, 1)); γ = sigmoid(ω).
        affine: λ = 1 − γ if True, else λ = 1.
        scale: score scale for the window term, 1/√D by default. The linear term has none.
        initial_state: (S, z) of tokens that are behind the window of every query in this call,
            added to each query's linear term. Tokens still inside some query's window must be
            passed as part of q/k/v instead (``window_linear_attn_step`` does this with its FIFO).
        output_final_state: also return the state of the tokens behind the window after the last
            query, i.e. keys j < L − w (plus ``initial_state``).
        block: queries per window block and chunk of the linear term. Default: w/2 within
            [64, 128], the fastest forward + backward measured on one CPU thread at SmolLM2 shapes
            (w = 64: 64; w = 256: 128, 2.3× faster than the previous chunk-pair layout).

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
        final_state: ``LinearAttnState`` with S (b, H, F, D) and z (b, H, F) in float32 (float64
            for float64 inputs), or None.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    dt = _compute_dtype(q, k, v, q_feat, k_feat)
    b, H, L, D = q.shape
    scale = D**-0.5 if scale is None else scale
    if initial_state is not None:
        initial_state = LinearAttnState(*(t.to(dt) for t in initial_state))
    gamma, lam = _mixing_factors(window_factor, H, affine, dt, q.device)
    q_, k_, v_, qf, kf = (x.to(dt) for x in (q, k, v, q_feat, k_feat))

    if block is None:
        block = min(128, max(64, window // 2))
    num_w, den_w = _window_terms(q_, k_, v_, window, scale, 0, block)

    # Linear term: query i sees keys j ≤ i − w (and the initial state). Re-indexed by i' = i − w,
    # the queries past the window run plain inclusive causal linear attention against the keys
    # before the last w; the first w queries see only the initial state.
    n_head = min(window, L)
    n_tail = L - n_head
    if initial_state is not None:
        head_num = torch.einsum("bhlf,bhfd->bhld", qf[:, :, :n_head], initial_state.S)
        head_den = torch.einsum("bhlf,bhf->bhl", qf[:, :, :n_head], initial_state.z)
    else:
        head_num = qf.new_zeros(b, H, n_head, D)
        head_den = qf.new_zeros(b, H, n_head)
    num_l, den_l = head_num, head_den
    if n_tail:
        tail_num, tail_den = _linear_past_window(
            qf[:, :, window:], kf[:, :, :n_tail], v_[:, :, :n_tail], block, initial_state
        )
        num_l = torch.cat([head_num, tail_num], dim=2)
        den_l = torch.cat([head_den, tail_den], dim=2)

    lam_ = lam if isinstance(lam, float) else lam.reshape(1, H, 1)
    o = (gamma * num_w + lam * num_l) / (gamma.reshape(1, H, 1) * den_w + lam_ * den_l)[..., None]
    o = o.to(v.dtype)
    if not output_final_state:
        return o, None
    S = torch.einsum("bhlf,bhld->bhfd", kf[:, :, :n_tail], v_[:, :, :n_tail])
    z = kf[:, :, :n_tail].sum(-2)
    if initial_state is not None:
        S, z = S + initial_state.S, z + initial_state.z
    return o, LinearAttnState(S, z)


def window_softmax_terms(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    scale: float | None = None,
    block: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hybrid's window term without γ, for the queries that have a linear term (i ≥ w).

    For query i ≥ w: num_i = Σ_{i−w<j≤i} exp(s_ij − m_i) v_j and den_i = Σ exp(s_ij − m_i), m_i the
    window's max score, so the hybrid's output is (γ·num + λ·num_l) / (γ·den + λ·den_l). Queries
    i < w are left out: their window is the whole causal prefix and they have no linear term, so
    the hybrid equals softmax attention there whatever the feature maps and γ are (stage 1 gets
    no gradient from them). Queries run in blocks of ``block`` against the w + block keys that
    cover their windows, which is cheaper than the chunk-pair layout of ``chunk_window_linear_attn`` (2w
    keys per query) for w > block. Nothing here depends on trained parameters, so stage 1 runs it
    under ``no_grad`` and only the linear term is differentiated.

    Args:
        q: (b, H, L, D).
        k, v: (b, H, L, D), expanded to H heads.
        window: w ≥ 1.
        scale: score scale, 1/√D by default.
        block: queries per block.

    Returns:
        num: (b, H, max(L − w, 0), D) and den: (b, H, max(L − w, 0)), for queries w … L − 1, in
        float32 (float64 for float64 inputs).
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    dt = _compute_dtype(q, k, v)
    L, D = q.shape[-2], q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    q_, k_, v_ = (x.to(dt) for x in (q, k, v))
    start = min(window, L)
    return _window_terms(q_[:, :, start:], k_, v_, window, scale, start, block)


def window_linear_attn_past_window(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    window_terms: tuple[torch.Tensor, torch.Tensor],
    window_factor: torch.Tensor | float,
    affine: bool = False,
    chunk_size: int = 64,
) -> torch.Tensor:
    """The hybrid's outputs for queries w … L − 1, given their window terms: stage 1's fast path.

    Equals ``chunk_window_linear_attn(...)[0][:, :, w:]``. Query i ≥ w sees keys j ≤ i − w through the
    linear term, which after re-indexing i' = i − w is plain inclusive causal linear attention of
    the queries past the window against the keys before the last w, so no shift or padding to a
    multiple of w is needed and the chunk size is free (64 beats w for large windows).

    Args:
        q_feat: (b, H, L − w, F), φq of queries w … L − 1.
        k_feat: (b, H, L − w, F), φk of keys 0 … L − w − 1 (expanded to H heads).
        v: (b, H, L − w, D), values 0 … L − w − 1.
        window_terms: (num, den) from ``window_softmax_terms``: (b, H, L − w, D) and (b, H, L − w).
        window_factor: ω, scalar or H logits; γ = sigmoid(ω).
        affine: λ = 1 − γ instead of 1.
        chunk_size: chunk of the linear term.

    Returns:
        (b, H, L − w, D) in the compute dtype (float32, or float64 for float64 inputs).
    """
    num_w, den_w = window_terms
    dt = _compute_dtype(q_feat, k_feat, v, num_w)
    b, H, n, _ = q_feat.shape
    gamma, lam = _mixing_factors(window_factor, H, affine, dt, q_feat.device)
    if n == 0:
        return num_w.to(dt)
    num_l, den_l = _linear_past_window(*(x.to(dt) for x in (q_feat, k_feat, v)), chunk_size, None)
    lam_ = lam if isinstance(lam, float) else lam.reshape(1, H, 1)
    num = gamma * num_w.to(dt) + lam * num_l
    den = gamma.reshape(1, H, 1) * den_w.to(dt) + lam_ * den_l
    return num / den[..., None]


def linear_attn_step(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    state: LinearAttnState | None = None,
    eps: float = 1e-12,
) -> tuple[torch.Tensor, LinearAttnState]:
    """Advance causal linear attention by T ≥ 1 new tokens.

    Args:
        q_feat, k_feat: (b, H, T, F).
        v: (b, H, T, D), expanded to H heads under grouped-query attention.
        state: the state after the earlier tokens, or None at the start.
        eps: normaliser guard.

    Returns:
        o: (b, H, T, D) in ``v.dtype``.
        state: the updated ``LinearAttnState`` (compute dtype).
    """
    if q_feat.shape[-2] > 1:
        o, new_state = chunk_linear_attn(
            q_feat, k_feat, v, eps=eps, initial_state=state, output_final_state=True
        )
        assert new_state is not None
        return o, new_state
    dt = _compute_dtype(q_feat, k_feat, v)
    phi_q, phi_k, v_ = q_feat.to(dt), k_feat.to(dt), v.to(dt)
    S = torch.einsum("bhtf,bhtd->bhfd", phi_k, v_)
    z = phi_k.sum(-2)
    if state is not None:
        S, z = S + state.S.to(dt), z + state.z.to(dt)
    num = torch.einsum("bhtf,bhfd->bhtd", phi_q, S)
    den = torch.einsum("bhtf,bhf->bht", phi_q, z) + eps
    return (num / den[..., None]).to(v.dtype), LinearAttnState(S, z)


def window_linear_attn_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: HybridAttnState | None,
    feature_map_q: FeatureMap,
    feature_map_k: FeatureMap,
    window: int,
    window_factor: torch.Tensor | float,
    affine: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, HybridAttnState]:
    """Advance the hybrid by T ≥ 1 new tokens (LoLCATs ``update_for_decoding``, docs/linear.md §2.3).

    T = 1 is the decode step: keys that leave the window are mapped by φk and folded into S and z,
    the new key joins the FIFO, and the query attends over the FIFO (softmax) and S, z (linear).
    T > 1 (chunked prefill, speculative drafts, or a prompt with ``state=None``) runs
    ``chunk_window_linear_attn`` over the FIFO followed by the new tokens, with S, z as initial state.

    Args:
        q: (b, H, T, D), post-RoPE.
        k, v: (b, Hkv, T, D), post-RoPE, *not* expanded; H must be a multiple of Hkv.
        state: the state after the earlier tokens, or None at the start of a sequence.
        feature_map_q, feature_map_k: φq, φk, (b, H, n, D) -> (b, H, n, F). φk is called on keys
            after ``repeat_kv`` and only when they leave the window (or, for T > 1, on the FIFO).
        window, window_factor, affine, scale: as in ``chunk_window_linear_attn``.

    Returns:
        o: (b, H, T, D) in ``v.dtype``.
        state: the updated ``HybridAttnState``; S, z in the compute dtype, FIFO in ``k.dtype``.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    H, Hkv = q.shape[1], k.shape[1]
    if H % Hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({Hkv})")
    n_rep = H // Hkv
    k_ctx, v_ctx = k, v
    if state is not None:
        k_ctx = torch.cat([state.k_win.to(k.dtype), k], dim=-2)
        v_ctx = torch.cat([state.v_win.to(v.dtype), v], dim=-2)
    n_old = k_ctx.shape[-2] - k.shape[-2]
    if q.shape[-2] > 1:
        # The FIFO's n_old tokens run as a prefix with zero queries whose outputs are dropped;
        # each prefix row keeps its own key, so its denominator is ≥ γ and it cannot make NaNs.
        k_h, v_h = repeat_kv(k_ctx, n_rep), repeat_kv(v_ctx, n_rep)
        q_ctx = F.pad(q, (0, 0, n_old, 0))
        phi_q_ctx = F.pad(feature_map_q(q), (0, 0, n_old, 0))
        initial = None if state is None else LinearAttnState(state.S, state.z)
        o, final = chunk_window_linear_attn(
            q_ctx, k_h, v_h, phi_q_ctx, feature_map_k(k_h), window, window_factor, affine, scale,
            initial_state=initial, output_final_state=True,
        )  # fmt: skip
        assert final is not None
        n_drop = k_ctx.shape[-2] - min(k_ctx.shape[-2], window)
        return o[:, :, n_old:], HybridAttnState(final.S, final.z, k_ctx[:, :, n_drop:], v_ctx[:, :, n_drop:])

    dt = _compute_dtype(q, k, v)
    D = q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    gamma, lam = _mixing_factors(window_factor, H, affine, dt, q.device)
    phi_q = feature_map_q(q).to(dt)  # [b, H, 1, F]
    if state is not None:
        S, z = state.S.to(dt), state.z.to(dt)
    else:
        S = phi_q.new_zeros(*phi_q.shape[:2], phi_q.shape[-1], D)
        z = phi_q.new_zeros(*phi_q.shape[:2], phi_q.shape[-1])
    n_out = k_ctx.shape[-2] - window
    if n_out > 0:
        phi_k = feature_map_k(repeat_kv(k_ctx[:, :, :n_out], n_rep)).to(dt)
        S = S + torch.einsum("bhlf,bhld->bhfd", phi_k, repeat_kv(v_ctx[:, :, :n_out], n_rep).to(dt))
        z = z + phi_k.sum(-2)
        k_ctx, v_ctx = k_ctx[:, :, n_out:], v_ctx[:, :, n_out:]

    s = torch.einsum("bhtd,bhnd->bhtn", q.to(dt), repeat_kv(k_ctx, n_rep).to(dt)) * scale
    a = gamma * torch.exp(s - s.amax(-1, keepdim=True))  # [b, H, 1, n]
    lam_ = lam if isinstance(lam, float) else lam.reshape(1, H, 1)
    num = a @ repeat_kv(v_ctx, n_rep).to(dt) + lam * torch.einsum("bhtf,bhfd->bhtd", phi_q, S)
    den = a.sum(-1) + lam_ * torch.einsum("bhtf,bhf->bht", phi_q, z)
    o = (num / den[..., None]).to(v.dtype)
    return o, HybridAttnState(S, z, k_ctx, v_ctx)


def prefill_state(
    k: torch.Tensor,
    v: torch.Tensor,
    k_feat: torch.Tensor,
    window: int,
) -> HybridAttnState:
    """Decode state after a prompt whose outputs came from ``chunk_window_linear_attn`` (LoLCATs ``update``).

    S, z sum over the prompt's first P − w tokens (none if P ≤ w); the FIFO holds the last min(P, w).

    Args:
        k, v: (b, Hkv, P, D), the prompt's post-RoPE keys and values, *not* expanded.
        k_feat: (b, H, P, F), φk(repeat_kv(k)), as passed to ``chunk_window_linear_attn``.
        window: w.

    Returns:
        ``HybridAttnState`` with S (b, H, F, D) and z (b, H, F) in float32 (float64 for float64
        inputs), and the FIFO in ``k.dtype``.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    H, Hkv, P = k_feat.shape[1], k.shape[1], k.shape[-2]
    if H % Hkv:
        raise ValueError(f"feature heads ({H}) must be a multiple of key/value heads ({Hkv})")
    dt = _compute_dtype(k, v, k_feat)
    n_lin = max(P - window, 0)
    kf = k_feat[:, :, :n_lin].to(dt)
    S = torch.einsum("bhlf,bhld->bhfd", kf, repeat_kv(v[:, :, :n_lin], H // Hkv).to(dt))
    z = kf.sum(-2)
    return HybridAttnState(S, z, k[:, :, n_lin:], v[:, :, n_lin:])


# Liger-GLA(+SWA): gated linear attention plus a separately normalised sliding window.

# Weights of (sliding-window softmax, gated linear attention) in the output. Liger's sources call
# the even split important; the weights are fixed, not learned.
LIGER_MIX = (0.5, 0.5)
# g = logsigmoid(k) / 16: the divisor keeps the decay per step close to 1 (|g| ≤ |k| / 16).
LIGER_GATE_NORMALIZER = 16.0
# Tokens per chunk of ``chunk_gla``. The intra-chunk term costs O(C·F) per token and memory
# (b, Hkv, L, C, F); the state recurrence runs L / C sequential steps. 16 balances the two.
GLA_CHUNK = 16


class LigerAttnState(NamedTuple):
    """Decode state of Liger-GLA(+SWA) after t tokens; its size does not depend on t once t ≥ w − 1.

    The GLA branch has folded every token into S already; the window branch needs only the keys the
    next query's window reaches back to, i.e. the last w − 1 (the query brings its own).

    Attributes:
        S: (b, Hkv, F, D), Σ_j (Π_{j<s≤t} diag(exp g_s)) φk_j v_jᵀ, in the compute dtype.
        k_win: (b, Hkv, n, D), n = min(t, w − 1), post-RoPE keys in the model dtype, oldest first.
        v_win: (b, Hkv, n, D).
    """

    S: torch.Tensor
    k_win: torch.Tensor
    v_win: torch.Tensor


def unrotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Undo transformers' rotate_half RoPE: the vector the model rotated, from the rotated one.

    The model computed x_rot = x·cos + rotate_half(x)·sin on the first r = ``cos.shape[-1]``
    channels (partial rotary leaves the rest alone), with any ``attention_scaling`` already
    multiplied into cos and sin. Since cos and sin repeat over the two halves, x_rot·cos −
    rotate_half(x_rot)·sin = x·(cos² + sin²) channel by channel, hence the division (by 1 for
    plain RoPE, by the scaling² for YaRN and the like).

    Args:
        x: (b, h, T, D), post-RoPE.
        cos, sin: (b, T, r), the ``position_embeddings`` the model applied, r ≤ D and even.

    Returns:
        (b, h, T, D), pre-RoPE, in float32 (float64 for float64 inputs).
    """
    dt = _compute_dtype(x, cos, sin)
    r = cos.shape[-1]
    c, s_ = cos.to(dt)[:, None], sin.to(dt)[:, None]
    xr = x[..., :r].to(dt)
    x1, x2 = xr.chunk(2, dim=-1)
    rot = torch.cat((-x2, x1), dim=-1)
    out = (xr * c - rot * s_) / (c * c + s_ * s_)
    if r == x.shape[-1]:
        return out
    return torch.cat((out, x[..., r:].to(dt)), dim=-1)


def liger_feature_map(x: torch.Tensor) -> torch.Tensor:
    """Liger's parameter-free feature map φ(x) = softmax(x) over the head dimension.

    Args:
        x: (b, h, L, D), a pre-RoPE query or key.

    Returns:
        (b, h, L, D), positive and summing to one per token, in float32 (float64 for float64 input).
        It commutes with ``repeat_kv``, so keys are mapped at their Hkv heads.
    """
    return torch.softmax(x.to(_compute_dtype(x)), dim=-1)


def liger_gate(k: torch.Tensor, normalizer: float = LIGER_GATE_NORMALIZER) -> torch.Tensor:
    """Liger's forget gate in log space, g = logsigmoid(pool(k)) / normalizer, per channel.

    Liger pools the k_proj output (b, L, Hkv·D) with ``AdaptiveAvgPool1d(Hkv·D)``: the output size
    equals the input size, so the pool is the identity and g is an elementwise function of the
    pre-RoPE key, shaped like it.

    Args:
        k: (b, Hkv, L, D), pre-RoPE keys.
        normalizer: 16 in Liger.

    Returns:
        (b, Hkv, L, D), all < 0 (decay exp g in (0, 1)), float32 (float64 for float64 input).
    """
    return F.logsigmoid(k.to(_compute_dtype(k))) / normalizer


def _gla_heads(q_feat: torch.Tensor, k_feat: torch.Tensor) -> tuple[int, int]:
    H, Hkv = q_feat.shape[1], k_feat.shape[1]
    if H % Hkv:
        raise ValueError(f"query heads ({H}) must be a multiple of key/value heads ({Hkv})")
    return Hkv, H // Hkv


def chunk_gla(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = GLA_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated linear attention o_t = scale · φq_tᵀ S_t, S_t = diag(exp g_t) S_{t−1} + φk_t v_tᵀ, chunked.

    Matches ``naive_recurrent_gla`` for any length, however negative the gates. Inside a chunk of
    C tokens, with b_t = Σ_{chunk start ≤ s ≤ t} g_s (log decay, non-increasing)::

        o_t = scale · [ (φq_t ⊙ exp b_t)ᵀ S_prev + Σ_{j ≤ t in chunk} Σ_f φq_t,f φk_j,f exp(b_t,f − b_j,f) v_j ]
        S_next = diag(exp b_last) S_prev + Σ_j (φk_j ⊙ exp(b_last − b_j)) v_jᵀ

    Every exponent here is ≤ 0, so nothing can overflow: the intra-chunk weights are formed pair
    by pair (a (C, C, F) block per chunk) instead of as (φq e^b)(φk e^−b)ᵀ, whose factor e^−b
    overflows float32 once a chunk's gates sum below about −88 (and float64 below −709), which
    strongly negative gates reach in a few tokens. The price is O(C·F) work and memory per token
    for that block, hence the small chunk. The state then runs through the L / C chunk
    boundaries in a loop.

    Args:
        q_feat: (b, H, L, F).
        k_feat: (b, Hkv, L, F), H a multiple of Hkv (Hkv = H for keys already expanded).
        v: (b, Hkv, L, D).
        g: (b, Hkv, L, F), log decays ≤ 0 (positive values work too, but grow the state).
        scale: multiplies the output (Liger: 1).
        initial_state: (b, Hkv, F, D), S before the first token, or None for zeros.
        output_final_state: also return S after the last token.
        chunk_size: C, capped at L; any L works (the tail is padded with k = v = 0 and g = 0, which
            leaves the state unchanged).

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
        final_state: (b, Hkv, F, D) in float32 (float64 for float64 inputs), or None.
    """
    dt = _compute_dtype(q_feat, k_feat, v, g)
    b, H, L, Fd = q_feat.shape
    Hkv, G = _gla_heads(q_feat, k_feat)
    D = v.shape[-1]
    S = (
        q_feat.new_zeros(b, Hkv, Fd, D, dtype=dt)
        if initial_state is None
        else initial_state.to(device=q_feat.device, dtype=dt)
    )
    if L == 0:
        return v.new_zeros(b, H, 0, D), (S if output_final_state else None)
    C = max(1, min(chunk_size, L))
    n = -(-L // C)
    Lp = n * C
    q_, k_, v_, g_ = (_pad_to(x.to(dt), Lp) for x in (q_feat, k_feat, v, g))
    qc = q_.reshape(b, Hkv, G, n, C, Fd) * scale  # query head h = kv·G + group index, as repeat_kv
    kc = k_.reshape(b, Hkv, n, C, Fd)
    vc = v_.reshape(b, Hkv, n, C, D)
    bc = g_.reshape(b, Hkv, n, C, Fd).cumsum(-2)  # [b, Hkv, n, C, F]

    # Intra-chunk, pair by pair: exponent b_t − b_j ≤ 0 for j ≤ t. Pairs j > t (positive exponents
    # that could overflow) are set to −inf before the exp, not masked after it.
    causal = torch.ones(C, C, dtype=torch.bool, device=q_feat.device).tril()[:, :, None]  # [t, j, 1]
    expo = (bc[..., :, None, :] - bc[..., None, :, :]).masked_fill(~causal, float("-inf"))
    k_pair = kc[..., None, :, :] * torch.exp(expo)  # [b, Hkv, n, C(t), C(j), F]
    a = torch.einsum("bkgntf,bkntjf->bkgntj", qc, k_pair)
    o = torch.einsum("bkgntj,bknjd->bkgntd", a, vc)

    # Across chunks: each chunk's own contribution to the state, decayed to its last token.
    last = bc[..., -1, :]  # [b, Hkv, n, F]
    dS = torch.einsum("bkncf,bkncd->bknfd", kc * torch.exp(last[..., None, :] - bc), vc)
    decay = torch.exp(last)[..., None]  # [b, Hkv, n, F, 1]
    prev = []
    for c in range(n):
        prev.append(S)
        S = decay[:, :, c] * S + dS[:, :, c]
    S_prev = torch.stack(prev, dim=2)  # [b, Hkv, n, F, D], the state entering each chunk
    o = o + torch.einsum("bkgncf,bknfd->bkgncd", qc * torch.exp(bc)[:, :, None], S_prev)
    o = o.reshape(b, H, Lp, D)[:, :, :L].to(v.dtype)
    return o, (S if output_final_state else None)


def gla_step(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    state: torch.Tensor | None = None,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advance gated linear attention by T ≥ 1 tokens; T = 1 is the O(F·D) decode step.

    Args:
        q_feat: (b, H, T, F).
        k_feat, g: (b, Hkv, T, F).
        v: (b, Hkv, T, D).
        state: S (b, Hkv, F, D) after the earlier tokens, or None at the start.
        scale: output scale.

    Returns:
        o: (b, H, T, D) in ``v.dtype``.
        state: the new S, (b, Hkv, F, D) in the compute dtype.
    """
    if q_feat.shape[-2] != 1:
        o, S = chunk_gla(q_feat, k_feat, v, g, scale, state, output_final_state=True)
        assert S is not None
        return o, S
    dt = _compute_dtype(q_feat, k_feat, v, g)
    b, H, _, Fd = q_feat.shape
    Hkv, G = _gla_heads(q_feat, k_feat)
    D = v.shape[-1]
    k_t, v_t, g_t = k_feat[:, :, 0].to(dt), v[:, :, 0].to(dt), g[:, :, 0].to(dt)
    S = k_t[..., :, None] * v_t[..., None, :]
    if state is not None:
        S = torch.exp(g_t)[..., None] * state.to(dt) + S
    o = torch.einsum("bkgf,bkfd->bkgd", q_feat.reshape(b, Hkv, G, Fd).to(dt), S) * scale
    return o.reshape(b, H, 1, D).to(v.dtype), S


def _mix_weights(mix: tuple[float, float]) -> tuple[float, float]:
    if len(mix) != 2:
        raise ValueError(f"mix must be (window weight, GLA weight), got {mix!r}")
    return float(mix[0]), float(mix[1])


def chunk_liger_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    g: torch.Tensor,
    window: int,
    mix: tuple[float, float] = LIGER_MIX,
    scale: float | None = None,
    state: LigerAttnState | None = None,
    output_final_state: bool = False,
    chunk_size: int = GLA_CHUNK,
    block: int | None = None,
) -> tuple[torch.Tensor, LigerAttnState | None]:
    """Liger-GLA(+SWA) over T new tokens: mix[0] · SWA_w(q, k, v) + mix[1] · GLA(φq, φk, v, g).

    Matches ``naive_quadratic_liger_attn``. The window branch runs in query blocks against the
    w + block keys covering them (as the LoLCATs window term does), over the state's FIFO followed
    by the new tokens; the GLA branch is ``chunk_gla`` continuing the state's S. Differentiable in
    every input. Any T works.

    Args:
        q: (b, H, T, D), post-RoPE.
        k, v: (b, Hkv, T, D), post-RoPE, *not* expanded; H a multiple of Hkv.
        q_feat: (b, H, T, F), φq of the pre-RoPE queries (``liger_feature_map``).
        k_feat, g: (b, Hkv, T, F), φk and the gate of the pre-RoPE keys (``liger_gate``).
        window: w ≥ 1, keys in the softmax window, the query's own included.
        mix: weights of the window and GLA branches; (0.5, 0.5) in Liger.
        scale: score scale of the window branch, 1/√D by default. The GLA branch has none.
        state: the state after the earlier tokens, or None at the start.
        output_final_state: also return the state after the last token.
        chunk_size: chunk of the GLA branch.
        block: queries per window block; default w/2 within [64, 128].

    Returns:
        o: (b, H, T, D) in ``v.dtype``.
        state: ``LigerAttnState`` (S in float32 or float64, FIFO in ``k.dtype``), or None.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    Hkv, G = _gla_heads(q, k)
    a, c = _mix_weights(mix)
    dt = _compute_dtype(q, k, v, q_feat, k_feat, g)
    T, D = q.shape[-2], q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    k_ctx, v_ctx = k, v
    if state is not None:
        k_ctx = torch.cat([state.k_win.to(k.dtype), k], dim=-2)
        v_ctx = torch.cat([state.v_win.to(v.dtype), v], dim=-2)
    n_old = k_ctx.shape[-2] - T
    if block is None:
        block = min(128, max(64, window // 2))
    num, den = _window_terms(
        q.to(dt), repeat_kv(k_ctx, G).to(dt), repeat_kv(v_ctx, G).to(dt), window, scale, n_old, block
    )
    o_gla, S = chunk_gla(
        q_feat, k_feat, v, g, 1.0, None if state is None else state.S, output_final_state, chunk_size
    )
    o = (a * num / den[..., None] + c * o_gla.to(dt)).to(v.dtype)
    if not output_final_state:
        return o, None
    keep = min(k_ctx.shape[-2], window - 1)
    n_ctx = k_ctx.shape[-2]
    return o, LigerAttnState(S, k_ctx[:, :, n_ctx - keep :], v_ctx[:, :, n_ctx - keep :])


def liger_attn_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    g: torch.Tensor,
    state: LigerAttnState | None,
    window: int,
    mix: tuple[float, float] = LIGER_MIX,
    scale: float | None = None,
) -> tuple[torch.Tensor, LigerAttnState]:
    """Advance Liger-GLA(+SWA) by T ≥ 1 tokens; T = 1 is the constant-cost decode step.

    For T = 1: the GLA state decays and takes the new token (``gla_step``), the query attends by
    softmax over the FIFO plus its own key (at most w keys), and the FIFO keeps the last w − 1.
    T > 1 (chunked prefill, or a prompt with ``state=None``) runs ``chunk_liger_attn``.

    Args:
        q, k, v, q_feat, k_feat, g, window, mix, scale: as in ``chunk_liger_attn``, for the new
            tokens only.
        state: the state after the earlier tokens, or None at the start of a sequence.

    Returns:
        o: (b, H, T, D) in ``v.dtype``.
        state: the updated ``LigerAttnState``.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    if q.shape[-2] != 1:
        o, new = chunk_liger_attn(
            q, k, v, q_feat, k_feat, g, window, mix, scale, state=state, output_final_state=True
        )
        assert new is not None
        return o, new
    Hkv, G = _gla_heads(q, k)
    a, c = _mix_weights(mix)
    dt = _compute_dtype(q, k, v, q_feat, k_feat, g)
    D = q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    o_gla, S = gla_step(q_feat, k_feat, v, g, None if state is None else state.S)
    k_ctx, v_ctx = k, v
    if state is not None:
        k_ctx = torch.cat([state.k_win.to(k.dtype), k], dim=-2)[:, :, -window:]
        v_ctx = torch.cat([state.v_win.to(v.dtype), v], dim=-2)[:, :, -window:]
    s = torch.einsum("bhtd,bhnd->bhtn", q.to(dt), repeat_kv(k_ctx, G).to(dt)) * scale
    o_win = torch.softmax(s, dim=-1) @ repeat_kv(v_ctx, G).to(dt)
    o = (a * o_win + c * o_gla.to(dt)).to(v.dtype)
    keep = min(k_ctx.shape[-2], window - 1)
    n_ctx = k_ctx.shape[-2]
    return o, LigerAttnState(S, k_ctx[:, :, n_ctx - keep :], v_ctx[:, :, n_ctx - keep :])

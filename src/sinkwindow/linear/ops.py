"""Linear-attention kernels: pure linear attention and the LoLCATs sliding-window hybrid.

Each operator comes in three forms that compute the same numbers (to ~1e-15 in float64):

1. Quadratic, O(L²) (``naive.py``): build the (L, L) weight matrix and mask it. The reference, and
   the only form that returns the attention weights.
2. Chunked, O(L·C) (``chunk_linear_attn``, ``chunk_hybrid_attn``): for training and prefill. The
   sequence is cut into chunks of C tokens (zero-padded at the end, so any length works); the
   linear part carries an F×D state across chunks and is exact within a chunk with a causal mask.
   For the hybrid, C = w: the softmax window of any query then lies in its own chunk and the one
   before, and the linear part is plain causal linear attention on keys and values shifted right by
   w (key j is "linear" for query i exactly when j + w ≤ i).
3. Recurrent (``linear_attn_step``, ``hybrid_attn_step``): for decoding. The state is S = Σ φk vᵀ
   (F × D) and z = Σ φk (F); the hybrid adds a FIFO of the last ≤ w keys and values, whose keys
   enter S and z only when they leave the window. ``prefill_state`` builds that state from a
   prompt, so prefill-then-decode gives the same outputs as decoding every token.

The hybrid (LINEAR.md §1.3), for query i, window W(i) = {i−w < j ≤ i}, γ = sigmoid(ω), λ = 1 (or
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
  over 1e5 tokens (LINEAR.md §2.3, §7.3).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = [
    "HybridAttnState",
    "LinearAttnState",
    "chunk_hybrid_attn",
    "chunk_linear_attn",
    "hybrid_attn_past_window",
    "hybrid_attn_step",
    "linear_attn_step",
    "prefill_state",
    "repeat_kv",
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
            wider; in float16 it would underflow (LINEAR.md §7.4).
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


def chunk_hybrid_attn(
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

    Matches ``naive_quadratic_hybrid_attn``. The window term runs in query blocks against the w +
    block keys covering them (``_window_terms``); the linear term is causal linear attention of
    the queries past the window against the keys before the last w, in chunks of ``block``. Any L
    works. Differentiable in every input, ω included (the window term runs with gradients, unlike
    LoLCATs' ``_sw_linear`` fallback, LINEAR.md §7.1).

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
            passed as part of q/k/v instead (``hybrid_attn_step`` does this with its FIFO).
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
        C = max(1, min(block, n_tail))
        Lp = -(-n_tail // C) * C
        tail = (_pad_to(x, Lp) for x in (qf[:, :, window:], kf[:, :, :n_tail], v_[:, :, :n_tail]))
        tail_num, tail_den = _chunk_causal_linear(*tail, C, initial_state)
        num_l = torch.cat([head_num, tail_num[:, :, :n_tail]], dim=2)
        den_l = torch.cat([head_den, tail_den[:, :, :n_tail]], dim=2)

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
    cover their windows, which is cheaper than the chunk-pair layout of ``chunk_hybrid_attn`` (2w
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


def hybrid_attn_past_window(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    window_terms: tuple[torch.Tensor, torch.Tensor],
    window_factor: torch.Tensor | float,
    affine: bool = False,
    chunk_size: int = 64,
) -> torch.Tensor:
    """The hybrid's outputs for queries w … L − 1, given their window terms: stage 1's fast path.

    Equals ``chunk_hybrid_attn(...)[0][:, :, w:]``. Query i ≥ w sees keys j ≤ i − w through the
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
    C = max(1, min(chunk_size, n))
    Lp = -(-n // C) * C
    num_l, den_l = _chunk_causal_linear(*(_pad_to(x.to(dt), Lp) for x in (q_feat, k_feat, v)), C, None)
    lam_ = lam if isinstance(lam, float) else lam.reshape(1, H, 1)
    num = gamma * num_w.to(dt) + lam * num_l[:, :, :n]
    den = gamma.reshape(1, H, 1) * den_w.to(dt) + lam_ * den_l[:, :, :n]
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


def hybrid_attn_step(
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
    """Advance the hybrid by T ≥ 1 new tokens (LoLCATs ``update_for_decoding``, LINEAR.md §2.3).

    T = 1 is the decode step: keys that leave the window are mapped by φk and folded into S and z,
    the new key joins the FIFO, and the query attends over the FIFO (softmax) and S, z (linear).
    T > 1 (chunked prefill, speculative drafts, or a prompt with ``state=None``) runs
    ``chunk_hybrid_attn`` over the FIFO followed by the new tokens, with S, z as initial state.

    Args:
        q: (b, H, T, D), post-RoPE.
        k, v: (b, Hkv, T, D), post-RoPE, *not* expanded; H must be a multiple of Hkv.
        state: the state after the earlier tokens, or None at the start of a sequence.
        feature_map_q, feature_map_k: φq, φk, (b, H, n, D) -> (b, H, n, F). φk is called on keys
            after ``repeat_kv`` and only when they leave the window (or, for T > 1, on the FIFO).
        window, window_factor, affine, scale: as in ``chunk_hybrid_attn``.

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
        o, final = chunk_hybrid_attn(
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
    """Decode state after a prompt whose outputs came from ``chunk_hybrid_attn`` (LoLCATs ``update``).

    S, z sum over the prompt's first P − w tokens (none if P ≤ w); the FIFO holds the last min(P, w).

    Args:
        k, v: (b, Hkv, P, D), the prompt's post-RoPE keys and values, *not* expanded.
        k_feat: (b, H, P, F), φk(repeat_kv(k)), as passed to ``chunk_hybrid_attn``.
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

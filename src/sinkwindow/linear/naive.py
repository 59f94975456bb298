"""Slow, obvious references for the kernels in ``ops.py``; tests compare against these in float64.

Every function here either builds the full (L, L) score matrix (``naive_quadratic_*``) or walks the
sequence one token at a time in a Python loop (``naive_recurrent_*``). None is meant to be fast.

Conventions, shared with ``ops.py``:

- q, k, v: (b, H, L, D), post-RoPE, keys and values already expanded to the H query heads with
  ``repeat_kv`` (grouped-query attention is the caller's business here).
- q_feat, k_feat: (b, H, L, F), the feature maps φq(q) and φk(k).
- g: (b, H, L, F), GLA's per-channel log decays (Liger: logsigmoid(pre-RoPE k) / 16).
- Computation runs in float64 when any input is float64, else in float32; outputs are cast back to
  ``v.dtype`` and states stay in the compute dtype.
"""

from __future__ import annotations

import torch

__all__ = [
    "naive_quadratic_gla",
    "naive_quadratic_window_linear_attn",
    "naive_quadratic_liger_attn",
    "naive_quadratic_linear_attn",
    "naive_recurrent_gla",
    "naive_recurrent_window_linear_attn",
    "naive_recurrent_liger_attn",
    "naive_recurrent_linear_attn",
]


def _dtype(*xs: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(x.dtype == torch.float64 for x in xs) else torch.float32


def _factors(
    window_factor: torch.Tensor | float,
    num_heads: int,
    affine: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | float]:
    omega = torch.as_tensor(window_factor, dtype=dtype, device=device).reshape(1, -1, 1, 1)
    if omega.shape[1] not in (1, num_heads):
        raise ValueError(f"window_factor must have 1 or {num_heads} elements, got {omega.shape[1]}")
    gamma = torch.sigmoid(omega)
    return gamma, (1 - gamma) if affine else 1.0


def naive_quadratic_linear_attn(
    q_feat: torch.Tensor, k_feat: torch.Tensor, v: torch.Tensor, eps: float = 1e-12
) -> torch.Tensor:
    """Causal linear attention y_i = φq_i·Σ_{j≤i} φk_j v_jᵀ / (φq_i·Σ_{j≤i} φk_j + eps), O(L²).

    Args:
        q_feat: (b, H, L, F).
        k_feat: (b, H, L, F).
        v: (b, H, L, D).
        eps: added to the normaliser (LoLCATs ``linear_attention``); the only guard against a zero
            denominator in the pure-linear variant.

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
    """
    dt = _dtype(q_feat, k_feat, v)
    L = q_feat.shape[-2]
    a = torch.einsum("bhif,bhjf->bhij", q_feat.to(dt), k_feat.to(dt))
    a = a * torch.ones(L, L, dtype=torch.bool, device=a.device).tril()
    o = (a @ v.to(dt)) / (a.sum(-1, keepdim=True) + eps)
    return o.to(v.dtype)


def naive_quadratic_window_linear_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    window: int,
    window_factor: torch.Tensor | float,
    affine: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LoLCATs sliding-window + linear hybrid (docs/linear.md §1.3, §2.1), O(L²).

    For query i, window W(i) = {i−w < j ≤ i} and linear set L(i) = {j ≤ i−w}::

        a_sm[i, j] = γ·exp(s_ij − max_{j'∈W(i)} s_ij')   for j ∈ W(i), s = q·k·scale
        a_ln[i, j] = λ·φq_i·φk_j                          for j ∈ L(i)
        y_i        = Σ_j (a_sm + a_ln)[i, j] v_j / Σ_j (a_sm + a_ln)[i, j]

    The max is over the window only and the linear term is not rescaled by it: this pins the
    window's peak weight at γ. It is what LoLCATs trains with; do not "fix" it into a true
    log-sum-exp.

    Args:
        q, k, v: (b, H, L, D).
        q_feat, k_feat: (b, H, L, F).
        window: w ≥ 1, the number of keys in the softmax window, the query's own key included.
        window_factor: ω, the mixing logit, a scalar or H values (shape (H,) or (1, H, 1, 1));
            γ = sigmoid(ω).
        affine: λ = 1 − γ if True, else λ = 1 (LoLCATs default).
        scale: score scale, 1/√D by default.

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
        weights: (b, H, L, L), the normalised hybrid weights (rows sum to one), in the compute
            dtype; the attention-transfer cross-entropy loss compares these with softmax weights.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    dt = _dtype(q, k, v, q_feat, k_feat)
    H, L, D = q.shape[1], q.shape[-2], q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    gamma, lam = _factors(window_factor, H, affine, dt, q.device)
    i = torch.arange(L, device=q.device)[:, None]
    j = torch.arange(L, device=q.device)[None, :]
    in_window = (j <= i) & (j > i - window)
    in_linear = j <= i - window

    s = torch.einsum("bhid,bhjd->bhij", q.to(dt), k.to(dt)) * scale
    s = s.masked_fill(~in_window, float("-inf"))
    a_sm = gamma * torch.exp(s - s.amax(-1, keepdim=True))
    a_ln = lam * torch.einsum("bhif,bhjf->bhij", q_feat.to(dt), k_feat.to(dt)) * in_linear
    a = a_sm + a_ln
    weights = a / a.sum(-1, keepdim=True)
    return (weights @ v.to(dt)).to(v.dtype), weights


def naive_recurrent_linear_attn(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    eps: float = 1e-12,
    initial_state: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Causal linear attention, one token at a time: S += φk vᵀ, z += φk, y = φq S / (φq·z + eps).

    Args:
        q_feat, k_feat: (b, H, L, F).
        v: (b, H, L, D).
        eps: normaliser guard.
        initial_state: (S (b, H, F, D), z (b, H, F)) of earlier tokens, or None for zeros.

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
        (S, z): the state after the last token, in the compute dtype.
    """
    dt = _dtype(q_feat, k_feat, v)
    b, H, L, F = q_feat.shape
    D = v.shape[-1]
    if initial_state is None:
        S = q_feat.new_zeros(b, H, F, D, dtype=dt)
        z = q_feat.new_zeros(b, H, F, dtype=dt)
    else:
        S, z = initial_state[0].to(dt), initial_state[1].to(dt)
    outs = []
    for t in range(L):
        phi_q, phi_k, v_t = q_feat[:, :, t].to(dt), k_feat[:, :, t].to(dt), v[:, :, t].to(dt)
        S = S + phi_k[..., :, None] * v_t[..., None, :]
        z = z + phi_k
        num = torch.einsum("bhf,bhfd->bhd", phi_q, S)
        den = (phi_q * z).sum(-1, keepdim=True) + eps
        outs.append(num / den)
    return torch.stack(outs, dim=2).to(v.dtype), (S, z)


def naive_recurrent_window_linear_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    window: int,
    window_factor: torch.Tensor | float,
    affine: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """The hybrid as a decoder runs it (docs/linear.md §2.3), one token at a time with a FIFO of w keys.

    Per token: if the FIFO holds w entries, pop the oldest into S and z; push the new token; then
    y = (γ Σ_fifo exp(s − max s) v + λ φq S) / (γ Σ_fifo exp(s − max s) + λ φq·z).

    Args:
        q, k, v: (b, H, L, D).
        q_feat, k_feat: (b, H, L, F).
        window, window_factor, affine, scale: as in ``naive_quadratic_window_linear_attn``.

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
        (S, z): the state of the keys that left the window, (b, H, F, D) and (b, H, F), in the
            compute dtype. The FIFO then holds the last min(L, w) tokens.
    """
    dt = _dtype(q, k, v, q_feat, k_feat)
    b, H, L, D = q.shape
    F = q_feat.shape[-1]
    scale = D**-0.5 if scale is None else scale
    gamma, lam = _factors(window_factor, H, affine, dt, q.device)
    gamma = gamma.reshape(1, -1, 1)
    if not isinstance(lam, float):
        lam = lam.reshape(1, -1, 1)
    S = q.new_zeros(b, H, F, D, dtype=dt)
    z = q.new_zeros(b, H, F, dtype=dt)
    fifo: list[int] = []
    outs = []
    for t in range(L):
        if len(fifo) == window:
            j = fifo.pop(0)
            S = S + k_feat[:, :, j].to(dt)[..., :, None] * v[:, :, j].to(dt)[..., None, :]
            z = z + k_feat[:, :, j].to(dt)
        fifo.append(t)
        k_win, v_win = k[:, :, fifo].to(dt), v[:, :, fifo].to(dt)  # (b, H, n, D)
        s = torch.einsum("bhd,bhnd->bhn", q[:, :, t].to(dt), k_win) * scale
        a = gamma * torch.exp(s - s.amax(-1, keepdim=True))
        phi_q = q_feat[:, :, t].to(dt)
        num = torch.einsum("bhn,bhnd->bhd", a, v_win) + lam * torch.einsum("bhf,bhfd->bhd", phi_q, S)
        den = a.sum(-1, keepdim=True) + lam * (phi_q * z).sum(-1, keepdim=True)
        outs.append(num / den)
    return torch.stack(outs, dim=2).to(v.dtype), (S, z)


def naive_quadratic_gla(
    q_feat: torch.Tensor, k_feat: torch.Tensor, v: torch.Tensor, g: torch.Tensor, scale: float = 1.0
) -> torch.Tensor:
    """Gated linear attention as one masked (L, L) matrix, O(L²·F).

    With the whole sequence's log decay b_i = Σ_{s≤i} g_s::

        o_i = scale · Σ_{j≤i} (Σ_f φq_i,f φk_j,f exp(b_i,f − b_j,f)) v_j

    which is the unrolled recurrence S_t = diag(exp g_t) S_{t−1} + φk_t v_tᵀ, o_t = scale · φq_tᵀ S_t.
    Exponents are ≤ 0 on the causal pairs, but b_i − b_j is a difference of two long sums, so keep
    sequences short (the recurrent form is the reference at long lengths).

    Args:
        q_feat, k_feat: (b, H, L, F).
        v: (b, H, L, D).
        g: (b, H, L, F), log decays.
        scale: output scale.

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
    """
    dt = _dtype(q_feat, k_feat, v, g)
    L = q_feat.shape[-2]
    b = g.to(dt).cumsum(-2)
    causal = torch.ones(L, L, dtype=torch.bool, device=q_feat.device).tril()[:, :, None]
    expo = (b[:, :, :, None, :] - b[:, :, None, :, :]).masked_fill(~causal, float("-inf"))
    a = torch.einsum("bhif,bhjf,bhijf->bhij", q_feat.to(dt), k_feat.to(dt), torch.exp(expo))
    return (scale * a @ v.to(dt)).to(v.dtype)


def naive_recurrent_gla(
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated linear attention one token at a time: S = diag(exp g_t) S + φk_t v_tᵀ, o_t = scale · φq_tᵀ S.

    Args:
        q_feat, k_feat: (b, H, L, F).
        v: (b, H, L, D).
        g: (b, H, L, F), log decays (the decay is on the key/feature axis of S).
        scale: output scale.
        initial_state: S (b, H, F, D) of earlier tokens, or None for zeros.

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
        S: (b, H, F, D) after the last token, in the compute dtype.
    """
    dt = _dtype(q_feat, k_feat, v, g)
    b, H, L, F = q_feat.shape
    D = v.shape[-1]
    S = q_feat.new_zeros(b, H, F, D, dtype=dt) if initial_state is None else initial_state.to(dt)
    outs = []
    for t in range(L):
        k_t, v_t = k_feat[:, :, t].to(dt), v[:, :, t].to(dt)
        S = torch.exp(g[:, :, t].to(dt))[..., :, None] * S + k_t[..., :, None] * v_t[..., None, :]
        outs.append(scale * torch.einsum("bhf,bhfd->bhd", q_feat[:, :, t].to(dt), S))
    out = torch.stack(outs, dim=2) if outs else v.new_zeros(b, H, 0, D, dtype=dt)
    return out.to(v.dtype), S


def naive_quadratic_liger_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    g: torch.Tensor,
    window: int,
    mix: tuple[float, float] = (0.5, 0.5),
    scale: float | None = None,
) -> torch.Tensor:
    """Liger-GLA(+SWA), O(L²): mix[0] · dense sliding-window softmax + mix[1] · ``naive_quadratic_gla``.

    The window branch is softmax attention with scores q·k·scale masked to i − w < j ≤ i and
    normalised over that window alone; the GLA branch has scale 1 and no normaliser.

    Args:
        q, k, v: (b, H, L, D), post-RoPE (k, v expanded to H heads).
        q_feat, k_feat, g: (b, H, L, F), from the pre-RoPE q and k.
        window: w ≥ 1.
        mix: (window weight, GLA weight).
        scale: window score scale, 1/√D by default.

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    dt = _dtype(q, k, v, q_feat, k_feat, g)
    L, D = q.shape[-2], q.shape[-1]
    scale = D**-0.5 if scale is None else scale
    i = torch.arange(L, device=q.device)[:, None]
    j = torch.arange(L, device=q.device)[None, :]
    s = torch.einsum("bhid,bhjd->bhij", q.to(dt), k.to(dt)) * scale
    s = s.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
    swa = torch.softmax(s, dim=-1) @ v.to(dt)
    gla = naive_quadratic_gla(q_feat.to(dt), k_feat.to(dt), v.to(dt), g.to(dt))
    return (mix[0] * swa + mix[1] * gla).to(v.dtype)


def naive_recurrent_liger_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_feat: torch.Tensor,
    k_feat: torch.Tensor,
    g: torch.Tensor,
    window: int,
    mix: tuple[float, float] = (0.5, 0.5),
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Liger-GLA(+SWA) as a decoder runs it, one token at a time with a FIFO of the last w − 1 keys.

    Per token: S = diag(exp g_t) S + φk_t v_tᵀ; the query attends by softmax over the FIFO plus its
    own key; o_t = mix[0] · window output + mix[1] · φq_tᵀ S; then the FIFO keeps the last w − 1.

    Args:
        as in ``naive_quadratic_liger_attn``.

    Returns:
        o: (b, H, L, D) in ``v.dtype``.
        S: (b, H, F, D), the GLA state after the last token, in the compute dtype.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    dt = _dtype(q, k, v, q_feat, k_feat, g)
    b, H, L, D = q.shape
    F = q_feat.shape[-1]
    scale = D**-0.5 if scale is None else scale
    S = q.new_zeros(b, H, F, D, dtype=dt)
    fifo: list[int] = []
    outs = []
    for t in range(L):
        k_t, v_t = k_feat[:, :, t].to(dt), v[:, :, t].to(dt)
        S = torch.exp(g[:, :, t].to(dt))[..., :, None] * S + k_t[..., :, None] * v_t[..., None, :]
        idx = [*fifo, t]
        s = torch.einsum("bhd,bhnd->bhn", q[:, :, t].to(dt), k[:, :, idx].to(dt)) * scale
        swa = torch.einsum("bhn,bhnd->bhd", torch.softmax(s, dim=-1), v[:, :, idx].to(dt))
        gla = torch.einsum("bhf,bhfd->bhd", q_feat[:, :, t].to(dt), S)
        outs.append(mix[0] * swa + mix[1] * gla)
        fifo = idx[max(0, len(idx) - (window - 1)) :] if window > 1 else []
    return torch.stack(outs, dim=2).to(v.dtype), S

"""Stage 1, attention transfer (docs/linear.md §3): train feature maps and γ to mimic softmax attention.

The base model is frozen and runs its own softmax attention under ``torch.no_grad`` in
``"transfer"`` mode: each layer returns the teacher's output (teacher forcing, so every layer sees
the original hidden states) and records its detached q, k, v and teacher output. Because the
layers are then independent, all students are computed *after* the forward in one batched kernel
call, with the layers folded into the head axis (L layers × H heads): one kernel call over 270
heads instead of 30 calls over 9, which on CPU is several times faster than the per-layer loop
LoLCATs runs. ``layer_group`` bounds the memory of that call.

For the hybrid, only what depends on trained parameters is differentiated: the window's softmax
terms run under ``no_grad`` (γ multiplies them afterwards), the first w queries are skipped (their
student output is the teacher's exactly), and the linear term runs over the remaining queries with
its own chunk size (``window_linear_attn_past_window``). ``reference_transfer_loss`` is the slow twin:
layer by layer, every query, ``chunk_window_linear_attn`` with gradients throughout; tests hold the two
to the same loss and gradients.

Loss (LoLCATs ``distill_attention_xent_mse``, xent factor 0): ``mse_factor`` × mean over layers of
the MSE between student and teacher outputs (b, H, L, D), before ``o_proj``. The cross-entropy on
attention weights is not implemented (the chunked kernel never forms them).

The teacher is plain causal softmax attention in float32 with the model's score scale. Every layer
is converted, so for models with native sliding layers (Gemma 3, Mistral) the teacher matches the
original only for sequences within that window, and Gemma 2's logit soft-capping is not applied.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from transformers import PreTrainedModel

from ..linear.attention import Retrofit, TransferRecord
from ..linear.convert import get_retrofit, set_mode
from ..linear.feature_maps import ACTIVATIONS, HedgehogFeatureMap
from ..linear.naive import naive_quadratic_window_linear_attn
from ..linear.ops import (
    chunk_linear_attn,
    chunk_window_linear_attn,
    repeat_kv,
    window_linear_attn_past_window,
    window_softmax_terms,
)
from ..methods import method_of

__all__ = [
    "collect_records",
    "linear_share",
    "prepare_transfer",
    "reference_transfer_loss",
    "transfer_parameters",
    "transfer_step",
]

MSE_FACTOR = 1000.0
# Query block of the window terms and chunk of the linear term in stage 1's fast path. On one CPU
# thread at SmolLM2 shapes (270 heads, L = 1024, w = 256), 128 beat 64 and 256 in both.
BLOCK = 128


def transfer_parameters(model: PreTrainedModel, train_window_factor: bool = True) -> list[nn.Parameter]:
    """Feature-map weights (and window factors) of every converted layer."""
    params = []
    for attn in get_retrofit(model).modules:
        params += list(attn.feature_map_q.parameters()) + list(attn.feature_map_k.parameters())
        if train_window_factor and hasattr(attn, "window_factors"):
            params.append(attn.window_factors)
    return params


def prepare_transfer(model: PreTrainedModel, train_window_factor: bool = True) -> list[nn.Parameter]:
    """Freeze everything but the feature maps (and γ); return the trainable parameters."""
    for p in model.parameters():
        p.requires_grad_(False)
    params = transfer_parameters(model, train_window_factor)
    for p in params:
        p.requires_grad_(True)
    return params


@torch.no_grad()
def collect_records(model: PreTrainedModel, input_ids: torch.Tensor) -> list[TransferRecord]:
    """Run the frozen model with teacher forcing and return every layer's ``TransferRecord``.

    Only the decoder runs (no LM head: stage 1 never needs logits).
    """
    rf = get_retrofit(model)
    set_mode(model, "transfer")
    try:
        model.get_decoder()(input_ids=input_ids, use_cache=False)
        records = list(rf.records)
    finally:
        set_mode(model, "student")
    return records


def _windowed_features(variant) -> bool:
    """True for a retrofit whose learned features cover the keys past a softmax window (LoLCATs);
    pure linear attention has no window, Liger and SWA + LoRA no learned features."""
    return method_of(variant.spec).feature_maps and variant.window is not None


def _stacked_features(maps: list[HedgehogFeatureMap], x: torch.Tensor) -> torch.Tensor:
    """φ of several layers' maps at once: ``x`` (b, G·H, L, D) -> (b, G·H, L, F), differentiable."""
    act = ACTIVATIONS[maps[0].activation][0]
    weight = torch.cat([m.weight for m in maps], dim=0).float()  # [G·H, D, f]
    u = torch.einsum("hdf,bhld->bhlf", weight, x.float())
    if maps[0].bias is not None:
        u = u + torch.cat([m.bias for m in maps], dim=0).float()[None, :, None, :]
    return act(u, eps=maps[0].eps)


def _group_student(rf: Retrofit, recs: list[TransferRecord]) -> tuple[torch.Tensor, int]:
    """Student outputs of a group of layers in one kernel call.

    Returns:
        o: (b, G·H, L − skip, D) float32, the outputs of queries ``skip`` … L − 1.
        skip: leading queries left out. For the hybrid these are the first w, whose window is
            their whole causal prefix: the student equals the teacher there exactly, whatever the
            parameters, so they add nothing to the loss or its gradient. Their window terms do
            not depend on trained parameters either, so they run under ``no_grad`` and only the
            linear term is differentiated (``window_linear_attn_past_window``).
    """
    mods = [rf.modules[r.layer] for r in recs]
    n_rep = recs[0].q.shape[1] // recs[0].k.shape[1]
    q = torch.cat([r.q for r in recs], dim=1).float()
    k = torch.cat([repeat_kv(r.k, n_rep) for r in recs], dim=1).float()
    v = torch.cat([repeat_kv(r.v, n_rep) for r in recs], dim=1).float()
    variant = rf.variant
    if _windowed_features(variant):
        w, L = variant.window, q.shape[-2]
        skip = min(w, L)
        with torch.no_grad():
            terms = window_softmax_terms(q, k, v, w, scale=recs[0].scaling, block=BLOCK)
        phi_q = _stacked_features([m.feature_map_q for m in mods], q[:, :, skip:])
        phi_k = _stacked_features([m.feature_map_k for m in mods], k[:, :, : L - skip])
        omega = torch.cat([m.window_factors.reshape(-1) for m in mods])
        o = window_linear_attn_past_window(
            phi_q, phi_k, v[:, :, : L - skip], terms, omega, affine=variant.affine, chunk_size=BLOCK
        )
        return o, skip
    phi_q = _stacked_features([m.feature_map_q for m in mods], q)
    phi_k = _stacked_features([m.feature_map_k for m in mods], k)
    o, _ = chunk_linear_attn(phi_q, phi_k, v, eps=variant.eps)
    return o, 0


def reference_transfer_loss(model: PreTrainedModel, input_ids: torch.Tensor, mse_factor: float = MSE_FACTOR):
    """Slow twin of ``transfer_step``'s loss: layer by layer, every query, the full chunked kernel.

    Differentiable; ``transfer_step`` must give the same loss and gradients.
    """
    rf = get_retrofit(model)
    recs = collect_records(model, input_ids)
    total = 0.0
    for r in recs:
        attn = rf.modules[r.layer]
        n_rep = r.q.shape[1] // r.k.shape[1]
        k, v = repeat_kv(r.k, n_rep).float(), repeat_kv(r.v, n_rep).float()
        q = r.q.float()
        if _windowed_features(rf.variant):
            o, _ = chunk_window_linear_attn(
                q, k, v, attn.feature_map_q(q), attn.feature_map_k(k), rf.variant.window,
                attn.window_factors, affine=rf.variant.affine, scale=r.scaling,
            )  # fmt: skip
        else:
            o, _ = chunk_linear_attn(attn.feature_map_q(q), attn.feature_map_k(k), v, eps=rf.variant.eps)
        total = total + (o.float() - r.target).square().mean()
    return mse_factor * total / len(recs)


def _groups(recs: list[TransferRecord], size: int | None) -> list[list[TransferRecord]]:
    # Layers batch together only when their shapes and score scale agree (Gemma-style models may
    # vary head counts or scales per layer).
    out: list[list[TransferRecord]] = []
    for r in recs:
        key = (tuple(r.q.shape), tuple(r.k.shape), r.scaling)
        last = out[-1] if out else None
        if (
            last
            and (tuple(last[0].q.shape), tuple(last[0].k.shape), last[0].scaling) == key
            and (size is None or len(last) < size)
        ):
            last.append(r)
        else:
            out.append([r])
    return out


def transfer_step(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    labels: torch.Tensor | None = None,
    scale: float = 1.0,
    backward: bool = True,
    mse_factor: float = MSE_FACTOR,
    layer_group: int | None = None,
) -> dict:
    """One stage-1 micro-batch: teacher-forced forward, batched students, MSE, backward.

    Args:
        model: a converted model; only parameters with ``requires_grad`` receive gradients.
        input_ids: (b, L).
        labels: ignored (stage 1 matches attention outputs on every token).
        scale: multiplies the loss before backward (1 / gradient-accumulation steps).
        backward: run backward (False for evaluation).
        mse_factor: LoLCATs scales the MSE by 1000.
        layer_group: layers per kernel call (``None``: all at once); each group runs backward
            before the next is built, which bounds peak memory.

    Returns:
        ``{"loss": mse_factor × mean layer MSE, "layer_mse": [per layer]}``.
    """
    rf = get_retrofit(model)
    recs = collect_records(model, input_ids)
    n = len(recs)
    layer_mse: list[float] = [0.0] * n
    total = 0.0
    grad = backward and torch.is_grad_enabled()
    for group in _groups(recs, layer_group):
        with torch.set_grad_enabled(grad):
            o, skip = _group_student(rf, group)
            b, GH, n_q, D = o.shape
            L = n_q + skip
            target = torch.cat([r.target[:, :, skip:] for r in group], dim=1)
            # Mean over all L queries: the skipped ones contribute zero error (see _group_student).
            sq = (o - target).square().reshape(b, len(group), GH // len(group), n_q, D)
            mse = sq.sum(dim=(0, 2, 3, 4)) / (b * (GH // len(group)) * L * D)
            loss = mse_factor * mse.sum() / n
            if grad and loss.requires_grad:  # a sequence no longer than w has nothing to train
                (loss * scale).backward()
        for r, m in zip(group, mse.detach().tolist()):
            layer_mse[r.layer] = m
        total += float(loss.detach())
    return {"loss": total, "layer_mse": layer_mse}


@torch.no_grad()
def linear_share(model: PreTrainedModel, input_ids: torch.Tensor) -> list[float]:
    """Per layer, the mean share of the hybrid's normaliser taken by the linear term (docs/linear.md §1.3).

    Over queries i ≥ w (the only ones with a linear term). At identity init with Gaussian-like q, k
    it is 92–99%; attention transfer should shrink it. Quadratic (naive) kernel: keep inputs short.

    Returns:
        One value per layer in [0, 1]; empty for pure linear attention.
    """
    rf = get_retrofit(model)
    variant = rf.variant
    if not _windowed_features(variant):
        return []
    out = []
    for r in collect_records(model, input_ids):
        attn = rf.modules[r.layer]
        n_rep = r.q.shape[1] // r.k.shape[1]
        k, v = repeat_kv(r.k, n_rep), repeat_kv(r.v, n_rep)
        _, w = naive_quadratic_window_linear_attn(
            r.q, k, v, attn.feature_map_q(r.q), attn.feature_map_k(k), variant.window, attn.window_factors,
            affine=variant.affine, scale=r.scaling,
        )  # fmt: skip
        n = w.shape[-1]
        if n <= variant.window:
            out.append(0.0)
            continue
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        share = (w * (j <= i - variant.window)).sum(-1)[..., variant.window :]
        out.append(float(share.mean()))
    return out

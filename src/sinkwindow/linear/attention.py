"""The attention function converted models run, registered with transformers' ``AttentionInterface``.

A converted model keeps its own attention modules and their forward code: projections, q/k norms,
RoPE and ``o_proj`` all run as before. Only the call to the attention kernel changes, because the
model's config names ``ATTN_NAME`` as its attention implementation. ``linear_attention_forward``
then receives post-RoPE queries (b, H, L, D) and keys/values (b, Hkv, L, D), exactly what SDPA would
get, and reads the learned pieces from the module itself (``feature_map_q``, ``feature_map_k``,
``window_factors``, added by ``convert``). GQA follows LoLCATs (LINEAR.md §1.1): keys and values are
expanded with ``repeat_kv`` before the key map, so there is one key map per query head.

The attention function is not handed the cache, so ``convert`` adds a forward pre-hook to every
attention module that keeps the ``cache`` keyword argument on the module for the duration of its
forward (and a hook that drops it afterwards). With a ``LinearAttnCache`` the function advances the
constant-size state; with no cache it runs the chunked kernel over the whole input; with a stock
cache (``DynamicCache``, which ``model(ids)`` creates by default) it treats the keys the cache
returns before the new ones as context, which is correct but grows like a normal KV cache.

Two modes (``Retrofit.mode``):

- ``"student"``: the retrofit, Hedgehog linear attention or the LoLCATs hybrid.
- ``"transfer"``: stage 1 teacher forcing (LINEAR.md §3). The layer returns the *teacher's*
  softmax output, so every later layer sees the original model's hidden states, and records the
  detached q, k, v and teacher output; ``transfer.py`` then computes all layers' student outputs
  in one batched kernel call and the MSE against the teachers. Gradients never cross layers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..attributes import RETROFIT_ATTR
from ..spec import MethodSpec
from .cache import LinearAttnCache
from .feature_maps import FEATURE_MAPS
from .ops import (
    HybridAttnState,
    LinearAttnState,
    chunk_hybrid_attn,
    chunk_linear_attn,
    hybrid_attn_step,
    linear_attn_step,
    prefill_state,
    repeat_kv,
)

__all__ = [
    "ATTN_NAME",
    "DEFAULT_WINDOW_FACTOR",
    "LinearVariant",
    "Retrofit",
    "TransferRecord",
    "linear_attention_forward",
    "linear_attention_mask",
    "softmax_attention",
    "student_attention",
]

ATTN_NAME = "sinkwindow_linear"
# logit(0.1): LoLCATs' "w01" init, γ = 0.1 for the window term (LINEAR.md §1.3).
DEFAULT_WINDOW_FACTOR = math.log(0.1 / 0.9)
CACHE_ATTR = "_sinkwindow_cache"


@dataclass(frozen=True)
class LinearVariant:
    """What a conversion builds; recorded in every checkpoint (LINEAR.md §7.5, §11).

    Attributes:
        kind: ``"lolcats"`` (sliding-window softmax + linear, one normaliser) or ``"linear"``
            (pure Hedgehog linear attention).
        window: w for ``lolcats``, ``None`` for ``linear``.
        feature_map: a key of ``FEATURE_MAPS`` (``hedgehog`` = softmax_dim, ``hedgehog_exp``,
            ``t2r``).
        feature_dim: f, the projection size; ``None`` gives the map's default (D/2 for Hedgehog).
        init: ``"identity"`` (what every LoLCATs command runs) or ``"kaiming"``.
        window_factor_init: ω at init; γ = sigmoid(ω).
        affine: λ = 1 − γ instead of 1 (LoLCATs default False).
        eps: guard added to the pure-linear normaliser; the hybrid's is ≥ γ and needs none.
    """

    kind: str
    window: int | None = None
    feature_map: str = "hedgehog"
    feature_dim: int | None = None
    init: str = "identity"
    window_factor_init: float = DEFAULT_WINDOW_FACTOR
    affine: bool = False
    eps: float = 1e-12

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "lolcats"):
            raise ValueError(f"linear baselines are 'linear' or 'lolcats:W', got kind {self.kind!r}")
        if (self.kind == "lolcats") != (self.window is not None):
            raise ValueError(f"'{self.kind}' {'needs' if self.kind == 'lolcats' else 'takes no'} window")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(
                f"unknown feature map {self.feature_map!r}; expected one of {sorted(FEATURE_MAPS)}"
            )

    @property
    def spec(self) -> MethodSpec:
        return MethodSpec(self.kind, window=self.window)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> LinearVariant:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


class TransferRecord(NamedTuple):
    """One layer's stage-1 inputs, kept by the attention function in ``"transfer"`` mode.

    Attributes:
        layer: index of the decoder layer.
        q: (b, H, L, D), post-RoPE, detached.
        k, v: (b, Hkv, L, D), post-RoPE, detached, not expanded.
        target: (b, H, L, D) float32, the teacher's softmax attention output (before ``o_proj``).
        scaling: the score scale the model uses.
    """

    layer: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    target: torch.Tensor
    scaling: float


@dataclass
class Retrofit:
    """Model-level state of a conversion (``model._sinkwindow_linear``), shared by its layers.

    Attributes:
        variant: what was built.
        mode: ``"student"`` or ``"transfer"``.
        records: ``TransferRecord``s of the current forward in ``"transfer"`` mode.
        impl: the attention implementation the model ran before conversion (restored by ``revert``).
        lora: the LoRA settings once ``finetune.add_lora`` ran, else ``None``.
        num_layers: decoder layers (for the cache).
    """

    variant: LinearVariant
    impl: str
    num_layers: int
    mode: str = "student"
    records: list[TransferRecord] = field(default_factory=list)
    lora: dict | None = None
    modules: list = field(default_factory=list, repr=False)
    hooks: list = field(default_factory=list, repr=False)

    def make_cache(self) -> LinearAttnCache:
        return LinearAttnCache(self.num_layers, self.variant.window)


def softmax_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float | None = None
) -> torch.Tensor:
    """Causal softmax attention in float32, the stage-1 teacher.

    Args:
        query: (b, H, L, D).
        key, value: (b, Hkv, L, D).
        scaling: score scale (1/√D by default).

    Returns:
        (b, H, L, D) float32.
    """
    n_rep = query.shape[1] // key.shape[1]
    k = repeat_kv(key, n_rep).float()
    v = repeat_kv(value, n_rep).float()
    return F.scaled_dot_product_attention(query.float(), k, v, is_causal=True, scale=scaling)


def student_attention(
    module: torch.nn.Module,
    variant: LinearVariant,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    state: HybridAttnState | LinearAttnState | None = None,
    output_state: bool = False,
) -> tuple[torch.Tensor, HybridAttnState | LinearAttnState | None]:
    """The retrofit's attention over T new tokens, continuing ``state``.

    Args:
        module: the attention module holding ``feature_map_q``/``feature_map_k`` (and
            ``window_factors`` for the hybrid).
        query: (b, H, T, D), post-RoPE.
        key, value: (b, Hkv, T, D), post-RoPE, not expanded.
        scaling: score scale of the window term.
        state: state after the earlier tokens, or ``None``.
        output_state: also return the state after these tokens.

    Returns:
        o: (b, H, T, D) in ``value.dtype``.
        state: the new state, or ``None`` if not asked for and not needed.
    """
    n_rep = query.shape[1] // key.shape[1]
    fq, fk = module.feature_map_q, module.feature_map_k
    if variant.kind == "lolcats":
        if state is None and not output_state:
            # Training and one-shot forwards: the chunked kernel, no state bookkeeping.
            k_h, v_h = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
            o, _ = chunk_hybrid_attn(
                query, k_h, v_h, fq(query), fk(k_h), variant.window, module.window_factors,
                affine=variant.affine, scale=scaling,
            )  # fmt: skip
            return o, None
        return hybrid_attn_step(
            query, key, value, state, fq, fk, variant.window, module.window_factors,
            affine=variant.affine, scale=scaling,
        )  # fmt: skip
    k_h, v_h = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    phi_q, phi_k = fq(query), fk(k_h)
    if state is None and not output_state:
        return chunk_linear_attn(phi_q, phi_k, v_h, eps=variant.eps)[0], None
    return linear_attn_step(phi_q, phi_k, v_h, state, eps=variant.eps)


def _context_state(
    module: torch.nn.Module, variant: LinearVariant, key: torch.Tensor, value: torch.Tensor
) -> HybridAttnState | LinearAttnState:
    """State equivalent to having run ``key``/``value`` (b, Hkv, n, D) through the retrofit."""
    n_rep = module.feature_map_k.num_heads // key.shape[1]
    k_feat = module.feature_map_k(repeat_kv(key, n_rep))
    if variant.kind == "lolcats":
        return prefill_state(key, value, k_feat, variant.window)
    S = torch.einsum("bhlf,bhld->bhfd", k_feat, repeat_kv(value, n_rep).to(k_feat.dtype))
    return LinearAttnState(S, k_feat.sum(-2))


def linear_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """``AttentionInterface`` entry for converted models.

    Args:
        module: the model's attention module (``convert`` added the feature maps to it).
        query: (b, H, T, D), post-RoPE.
        key, value: (b, Hkv, n, D) as the cache returned them: n = T for ``LinearAttnCache`` and
            for no cache, n ≥ T for a stock cache (the first n − T are earlier tokens).
        attention_mask: ignored; the kernels are causal by construction and padded batches are
            refused by ``linear_attention_mask`` (LINEAR.md §7.6).
        scaling: score scale of the window term.

    Returns:
        (b, T, H, D) attention output in the model dtype, and ``None`` for the weights.
    """
    retrofit: Retrofit = getattr(module, RETROFIT_ATTR)
    if retrofit.mode == "transfer":
        with torch.no_grad():
            target = softmax_attention(query, key, value, scaling)
        retrofit.records.append(
            TransferRecord(module.layer_idx, query.detach(), key.detach(), value.detach(), target, scaling)
        )
        # Teacher forcing: later layers see the original model's hidden states.
        return target.to(query.dtype).transpose(1, 2).contiguous(), None

    cache = module.__dict__.get(CACHE_ATTR)
    layer = cache.layers[module.layer_idx] if isinstance(cache, LinearAttnCache) else None
    T = query.shape[-2]
    if layer is not None:
        o, state = student_attention(
            module, retrofit.variant, query, key, value, scaling, layer.state, output_state=True
        )
        layer.set_state(state)
    else:
        n_old = key.shape[-2] - T
        state = None
        if n_old > 0:
            state = _context_state(module, retrofit.variant, key[:, :, :n_old], value[:, :, :n_old])
            key, value = key[:, :, n_old:], value[:, :, n_old:]
        o, _ = student_attention(module, retrofit.variant, query, key, value, scaling, state)
    return o.to(query.dtype).transpose(1, 2).contiguous(), None


def linear_attention_mask(*args, attention_mask: torch.Tensor | None = None, **kwargs) -> None:
    """Mask builder registered under ``ATTN_NAME``: no mask, but refuse padded batches.

    The kernels are causal by construction, so no (L, L) mask is ever built. Padding would need
    −inf window scores and φk = 0 at pad keys, which LoLCATs does not do either (LINEAR.md §7.6).
    """
    if attention_mask is not None and attention_mask.dtype == torch.bool and not bool(attention_mask.all()):
        raise NotImplementedError(
            "linear-attention baselines do not support padded batches yet; run one sequence at a time "
            "(batch size 1, or equal-length rows without padding)"
        )
    return None

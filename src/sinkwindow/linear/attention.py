"""The attention function converted models run, registered with transformers' ``AttentionInterface``.

A converted model keeps its own attention modules and their forward code: projections, q/k norms,
RoPE and ``o_proj`` all run as before. Only the call to the attention kernel changes, because the
model's config names ``ATTN_NAME`` as its attention implementation. ``linear_attention_forward``
then receives post-RoPE queries (b, H, L, D) and keys/values (b, Hkv, L, D), exactly what SDPA would
get, and reads the learned pieces from the module itself (``feature_map_q``, ``feature_map_k``,
``window_factors``, added by ``convert``). GQA follows LoLCATs (docs/linear.md §1.1): keys and values are
expanded with ``repeat_kv`` before the key map, so there is one key map per query head.

The attention function is not handed the cache, so ``convert`` adds a forward pre-hook to every
attention module that keeps the ``cache`` keyword argument on the module for the duration of its
forward (and a hook that drops it afterwards). With a ``LinearAttnCache`` the function advances the
constant-size state; with no cache it runs the chunked kernel over the whole input; with a stock
cache (``DynamicCache``, which ``model(ids)`` creates by default) it treats the keys the cache
returns before the new ones as context, which is correct but grows like a normal KV cache.

Two modes (``Retrofit.mode``):

- ``"student"``: the retrofit, Hedgehog linear attention, the LoLCATs hybrid or Liger.
- ``"transfer"``: stage 1 teacher forcing (docs/linear.md §3). The layer returns the *teacher's*
  softmax output, so every later layer sees the original model's hidden states, and records the
  detached q, k, v and teacher output; ``sinkwindow.train.transfer`` then computes all layers' student outputs
  in one batched kernel call and the MSE against the teachers. Gradients never cross layers.

Liger (``liger:W``) needs the *pre-RoPE* query and key for its feature maps and gate, but the
attention function is handed them after RoPE. It gets them back by inverting the rotation: the
same forward pre-hook that keeps the cache also keeps the ``position_embeddings`` (cos, sin) the
decoder layer passed to the attention module, and ``ops.unrotate_half`` undoes exactly that
rotation. This was chosen over hooking the projections because it needs no per-family code: it
recovers the vector the model rotates whatever came before (q/k norms as in Qwen 3 and Gemma 3,
fused qkv projections, biases, clipping, LoRA on the projections), gradients flow through it to
the projections, and it costs a few elementwise operations. It relies on the family using
transformers' rotate_half convention, which ``convert`` checks against the family's own
``apply_rotary_pos_emb`` before converting (tests also check it against the projections). For
keys a stock cache returns from earlier forwards there are no cos, sin at hand; those are
un-rotated with the model's RoPE frequencies (``rope.LayerRope``) at positions 0 … n − 1. A stock
cache that dropped tokens (Gemma 3's sliding layers) is refused: GLA needs every token.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface

from ..runtime.attributes import RETROFIT_ATTR
from ..runtime.spec import MethodSpec
from .cache import LinearAttnCache
from .feature_maps import FEATURE_MAPS
from .ops import (
    LIGER_GATE_NORMALIZER,
    LIGER_MIX,
    HybridAttnState,
    LigerAttnState,
    LinearAttnState,
    chunk_gla,
    chunk_liger_attn,
    chunk_linear_attn,
    chunk_window_linear_attn,
    liger_attn_step,
    liger_feature_map,
    liger_gate,
    linear_attn_step,
    prefill_state,
    repeat_kv,
    unrotate_half,
    window_linear_attn_step,
)

__all__ = [
    "ATTN_NAME",
    "DEFAULT_WINDOW_FACTOR",
    "LIGER_FEATURE_MAP",
    "LinearVariant",
    "Retrofit",
    "TransferRecord",
    "linear_attention_forward",
    "linear_attention_mask",
    "liger_features",
    "pre_rope",
    "register",
    "softmax_attention",
    "student_attention",
]

ATTN_NAME = "sinkwindow_linear"
# logit(0.1): LoLCATs' "w01" init, γ = 0.1 for the window term (docs/linear.md §1.3).
DEFAULT_WINDOW_FACTOR = math.log(0.1 / 0.9)
CACHE_ATTR = "_sinkwindow_cache"
# Where the pre-hook keeps the attention module's (cos, sin) during its forward (Liger only).
ROPE_ATTR = "_sinkwindow_rope"
# Liger's feature map: softmax over the head dimension of the pre-RoPE q and k, no parameters.
LIGER_FEATURE_MAP = "softmax"
KINDS = ("linear", "lolcats", "liger", "swa")
# Fields only Liger uses; left out of other kinds' checkpoint metadata, which stays as it was.
_LIGER_FIELDS = ("mix", "gate_normalizer")
# Feature-map fields, which SWA + LoRA (kind "swa") has none of.
_FEATURE_FIELDS = ("feature_map", "feature_dim", "init", "window_factor_init", "affine", "eps")


@dataclass(frozen=True)
class LinearVariant:
    """What a conversion builds; recorded in every checkpoint (docs/linear.md §7.4, §8).

    Attributes:
        kind: ``"lolcats"`` (sliding-window softmax + linear, one normaliser), ``"linear"``
            (pure Hedgehog linear attention) or ``"liger"`` (Liger-GLA(+SWA): sliding-window
            softmax + gated linear attention, each normalised on its own, no new parameters).
        window: w for ``lolcats`` and ``liger``, ``None`` for ``linear``.
        feature_map: a key of ``FEATURE_MAPS`` (``hedgehog`` = softmax_dim, ``hedgehog_exp``,
            ``t2r``); for ``liger`` always ``"softmax"`` (``LIGER_FEATURE_MAP``, the default for it).
            ``None`` picks the kind's default.
        feature_dim: f, the projection size; ``None`` gives the map's default (D/2 for Hedgehog).
        init: ``"identity"`` (what every LoLCATs command runs) or ``"kaiming"``.
        window_factor_init: ω at init; γ = sigmoid(ω).
        affine: λ = 1 − γ instead of 1 (LoLCATs default False).
        eps: guard added to the pure-linear normaliser; the hybrid's is ≥ γ and needs none.
        mix: Liger only: weights of the window and the GLA branch, (0.5, 0.5) as in Liger;
            (1, 0) leaves SWA(w, 0).
        gate_normalizer: Liger only: g = logsigmoid(k) / gate_normalizer (16).
        sinks: ``swa`` only: S of SWA(w, S). Kind ``swa`` is the equal-budget control of the
            linear baselines: the model's own softmax attention under SWA(w, S) (``sinkwindow.apply``)
            plus LoRA trained with ``lolcats:W``'s stage-2 recipe; it has no feature maps.
    """

    kind: str
    window: int | None = None
    feature_map: str | None = None
    feature_dim: int | None = None
    init: str = "identity"
    window_factor_init: float = DEFAULT_WINDOW_FACTOR
    affine: bool = False
    eps: float = 1e-12
    mix: tuple[float, float] = LIGER_MIX
    gate_normalizer: float = LIGER_GATE_NORMALIZER
    sinks: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"trained baselines are 'linear', 'lolcats:W', 'liger:W' or 'swa:W:S' (+ LoRA), got kind {self.kind!r}"
            )
        if (self.kind == "linear") == (self.window is not None):
            raise ValueError(f"'{self.kind}' {'takes no' if self.kind == 'linear' else 'needs a'} window")
        if self.window is not None and self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        # A checkpoint's JSON gives a list; keep the variant hashable and comparable.
        object.__setattr__(self, "mix", tuple(float(m) for m in self.mix))
        object.__setattr__(self, "gate_normalizer", float(self.gate_normalizer))
        if len(self.mix) != 2:
            raise ValueError(f"mix must be (window weight, GLA weight), got {self.mix!r}")
        if self.sinks < 0 or (self.sinks and self.kind != "swa"):
            raise ValueError(f"sinks are an swa:W:S option (>= 0), got {self.sinks} for {self.kind}")
        if self.kind == "swa":
            defaults = LinearVariant("lolcats", window=1)
            if any(
                getattr(self, f) != getattr(defaults, f) for f in _FEATURE_FIELDS if f != "feature_map"
            ) or (self.feature_map not in (None, "hedgehog")):
                raise ValueError("swa:W:S + LoRA has no feature maps or window factors; drop those options")
            if self.mix != LIGER_MIX or self.gate_normalizer != LIGER_GATE_NORMALIZER:
                raise ValueError("mix and gate_normalizer are liger:W options, not swa's")
            object.__setattr__(self, "feature_map", None)
            if self.window <= self.sinks:
                raise ValueError(f"swa:W:S needs W > S, got W={self.window}, S={self.sinks}")
            return
        if self.kind == "liger":
            if self.feature_map is None:
                object.__setattr__(self, "feature_map", LIGER_FEATURE_MAP)
            own = (LIGER_FEATURE_MAP, None, "identity", DEFAULT_WINDOW_FACTOR, False)
            have = (self.feature_map, self.feature_dim, self.init, self.window_factor_init, self.affine)
            if have != own:
                raise ValueError(
                    "liger:W has no learned feature maps (softmax over the pre-RoPE q and k) and no window "
                    "factors; feature_map, feature_dim, init, window_factor_init and affine are lolcats:W and "
                    f"linear options (got {dict(zip(('feature_map', 'feature_dim', 'init', 'window_factor_init', 'affine'), have))})"
                )
            if self.gate_normalizer <= 0:
                raise ValueError(f"gate_normalizer must be > 0, got {self.gate_normalizer}")
            return
        if self.feature_map is None:
            object.__setattr__(self, "feature_map", "hedgehog")
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(
                f"unknown feature map {self.feature_map!r}; expected one of {sorted(FEATURE_MAPS)}"
            )
        if self.mix != LIGER_MIX or self.gate_normalizer != LIGER_GATE_NORMALIZER:
            raise ValueError(f"mix and gate_normalizer are liger:W options, not {self.kind}'s")

    @property
    def spec(self) -> MethodSpec:
        if self.kind == "swa":
            return MethodSpec("swa", window=self.window, sinks=self.sinks)
        return MethodSpec(self.kind, window=self.window)

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.kind == "swa":
            return {"kind": "swa", "window": self.window, "sinks": self.sinks}
        d.pop("sinks")
        if self.kind == "liger":
            d["mix"] = list(self.mix)
        else:
            for name in _LIGER_FIELDS:
                d.pop(name)
        return d

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
        lora: the LoRA settings once ``lora.add_lora`` ran, else ``None``.
        num_layers: decoder layers (for the cache).
        ropes: Liger only: each layer's ``rope.LayerRope``, to un-rotate keys that a stock cache
            hands back from earlier forwards; ``None`` where the model's RoPE cannot be rebuilt
            (then only a ``LinearAttnCache`` or no cache works).
    """

    variant: LinearVariant
    impl: str
    num_layers: int
    mode: str = "student"
    records: list[TransferRecord] = field(default_factory=list)
    lora: dict | None = None
    ropes: list | None = field(default=None, repr=False)
    modules: list = field(default_factory=list, repr=False)
    hooks: list = field(default_factory=list, repr=False)

    def make_cache(self) -> LinearAttnCache:
        return LinearAttnCache(self.num_layers, self.variant.window, kind=self.variant.kind)

    def __setstate__(self, state: dict) -> None:
        # Unpickled in a process that never converted a model (a worker): the model it belongs to
        # names ATTN_NAME as its attention, which must exist there too.
        self.__dict__.update(state)
        register()


def register() -> None:
    """Register ``ATTN_NAME`` with transformers' attention and mask interfaces (idempotent)."""
    AttentionInterface.register(ATTN_NAME, linear_attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, linear_attention_mask)


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


def pre_rope(
    x: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor] | None, rotated: bool = True
) -> torch.Tensor:
    """The pre-RoPE heads of a post-RoPE query or key, from the (cos, sin) the model rotated them with.

    Args:
        x: (b, h, T, D), post-RoPE.
        position_embeddings: (cos, sin), each (b, T, r), as the decoder layer passed them.
        rotated: False for a layer that skips RoPE (SmolLM3's NoPE layers, ``use_rope=False``,
            which still receive cos and sin): x is returned as it is.

    Returns:
        (b, h, T, D) in float32 (float64 for float64 input).

    Raises:
        ValueError: no (cos, sin) were captured (the module got no ``position_embeddings``
            keyword), so the rotation cannot be undone.
    """
    if not rotated:
        return x.to(torch.promote_types(x.dtype, torch.float32))
    if position_embeddings is None:
        raise ValueError(
            "liger:W needs the pre-RoPE q and k, but the attention module received no position_embeddings "
            "keyword to undo RoPE with"
        )
    cos, sin = position_embeddings
    return unrotate_half(x, cos, sin)


def liger_features(
    variant: LinearVariant, q_pre: torch.Tensor, k_pre: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Liger's φq (b, H, T, D), φk and gate g (b, Hkv, T, D) from the pre-RoPE q (b, H, T, D), k (b, Hkv, T, D)."""
    return liger_feature_map(q_pre), liger_feature_map(k_pre), liger_gate(k_pre, variant.gate_normalizer)


def student_attention(
    module: torch.nn.Module,
    variant: LinearVariant,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    state: HybridAttnState | LinearAttnState | LigerAttnState | None = None,
    output_state: bool = False,
    features: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, HybridAttnState | LinearAttnState | LigerAttnState | None]:
    """The retrofit's attention over T new tokens, continuing ``state``.

    Args:
        module: the attention module holding ``feature_map_q``/``feature_map_k`` (and
            ``window_factors`` for the hybrid); Liger reads nothing from it.
        query: (b, H, T, D), post-RoPE.
        key, value: (b, Hkv, T, D), post-RoPE, not expanded.
        scaling: score scale of the window term.
        state: state after the earlier tokens, or ``None``.
        output_state: also return the state after these tokens.
        features: Liger only, and required for it: (φq, φk, g) of the new tokens from
            ``liger_features`` on the pre-RoPE q and k.

    Returns:
        o: (b, H, T, D) in ``value.dtype``.
        state: the new state, or ``None`` if not asked for and not needed.
    """
    if variant.kind == "liger":
        if features is None:
            raise ValueError("liger:W attention needs the (φq, φk, g) of the pre-RoPE q and k")
        phi_q, phi_k, gate = features
        if state is None and not output_state:
            o, _ = chunk_liger_attn(
                query, key, value, phi_q, phi_k, gate, variant.window, variant.mix, scale=scaling
            )
            return o, None
        return liger_attn_step(
            query, key, value, phi_q, phi_k, gate, state, variant.window, variant.mix, scale=scaling
        )
    n_rep = query.shape[1] // key.shape[1]
    fq, fk = module.feature_map_q, module.feature_map_k
    if variant.kind == "lolcats":
        if state is None and not output_state:
            # Training and one-shot forwards: the chunked kernel, no state bookkeeping.
            k_h, v_h = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
            o, _ = chunk_window_linear_attn(
                query, k_h, v_h, fq(query), fk(k_h), variant.window, module.window_factors,
                affine=variant.affine, scale=scaling,
            )  # fmt: skip
            return o, None
        return window_linear_attn_step(
            query, key, value, state, fq, fk, variant.window, module.window_factors,
            affine=variant.affine, scale=scaling,
        )  # fmt: skip
    k_h, v_h = repeat_kv(key, n_rep), repeat_kv(value, n_rep)
    phi_q, phi_k = fq(query), fk(k_h)
    if state is None and not output_state:
        return chunk_linear_attn(phi_q, phi_k, v_h, eps=variant.eps)[0], None
    return linear_attn_step(phi_q, phi_k, v_h, state, eps=variant.eps)


def _liger_context_state(
    retrofit: Retrofit, layer: int, key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor
) -> LigerAttnState:
    """Liger's state after earlier tokens whose post-RoPE ``key``/``value`` (b, Hkv, n, D) a stock
    cache returned, at ``positions`` (1, n)."""
    if not getattr(retrofit.modules[layer], "use_rope", True):
        k_pre = key.to(torch.promote_types(key.dtype, torch.float32))
    elif retrofit.ropes is None:
        raise ValueError(
            "liger:W with a stock cache must un-rotate the cached keys, and this model's RoPE cannot be "
            "rebuilt: pass cache=sinkwindow.make_cache(model)"
        )
    else:
        k_pre = retrofit.ropes[layer].unrotate(
            key.to(torch.promote_types(key.dtype, torch.float32)), positions
        )
    phi_k, gate = liger_feature_map(k_pre), liger_gate(k_pre, retrofit.variant.gate_normalizer)
    b, Hkv, n, D = key.shape
    # The state is the GLA state after the keys; queries of zero give it without any outputs.
    _, S = chunk_gla(phi_k.new_zeros(b, Hkv, n, D), phi_k, value, gate, output_final_state=True)
    keep = min(n, retrofit.variant.window - 1)
    return LigerAttnState(S, key[:, :, n - keep :], value[:, :, n - keep :])


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
        attention_mask: ``None``, or the (b, T) padding flags of a padded batch from
            ``linear_attention_mask`` (the kernels are causal by construction); a padded batch runs
            row by row (``_row_attention``), each row with its own state in the cache.
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
    variant = retrofit.variant
    n_old = 0 if layer is not None else key.shape[-2] - T
    # linear_attention_mask hands over the new tokens' padding flags (b, T), or None.
    valid = attention_mask if isinstance(attention_mask, torch.Tensor) and attention_mask.ndim == 2 else None
    if valid is not None and valid.shape != (query.shape[0], T):
        raise ValueError(f"padding flags {tuple(valid.shape)} do not match the batch and the {T} new tokens")
    features = None
    if variant.kind == "liger":
        rope, rotated = module.__dict__.get(ROPE_ATTR), getattr(module, "use_rope", True)
        features = liger_features(
            variant, pre_rope(query, rope, rotated), pre_rope(key[:, :, n_old:], rope, rotated)
        )
    if layer is not None and (valid is not None or layer.rows is not None):
        o, states = _row_attention(
            module, variant, query, key, value, scaling, valid, layer.row_states(query.shape[0]),
            features, output_state=True,
        )  # fmt: skip
        layer.set_row_states(states)
        return o.to(query.dtype).transpose(1, 2).contiguous(), None
    if valid is not None:
        if n_old > 0:
            raise NotImplementedError(
                f"a padded batch with a {type(cache).__name__} of earlier tokens: pass "
                "cache=sinkwindow.make_cache(model) (each row then keeps its own state)"
            )
        o, _ = _row_attention(
            module, variant, query, key, value, scaling, valid, [None] * query.shape[0], features,
            output_state=False,
        )  # fmt: skip
        return o.to(query.dtype).transpose(1, 2).contiguous(), None
    if layer is not None:
        o, state = student_attention(
            module, variant, query, key, value, scaling, layer.state, output_state=True, features=features
        )
        layer.set_state(state)
    else:
        state = None
        if n_old > 0:
            k_old, v_old = key[:, :, :n_old], value[:, :, :n_old]
            if variant.kind == "liger":
                # A stock cache must hold every earlier token (positions 0 … n_old − 1): the GLA
                # state needs them all. A sliding one (Gemma 3's local layers) drops some.
                pos = kwargs.get("position_ids")
                first = int(pos.reshape(-1)[0]) if pos is not None else n_old
                if first != n_old:
                    raise ValueError(
                        f"liger:W got {n_old} cached keys before position {first} from a "
                        f"{type(cache).__name__} that dropped some: pass cache=sinkwindow.make_cache(model)"
                    )
                positions = torch.arange(n_old, device=key.device)[None]
                state = _liger_context_state(retrofit, module.layer_idx, k_old, v_old, positions)
            else:
                state = _context_state(module, variant, k_old, v_old)
            key, value = key[:, :, n_old:], value[:, :, n_old:]
        o, _ = student_attention(module, variant, query, key, value, scaling, state, features=features)
    return o.to(query.dtype).transpose(1, 2).contiguous(), None


def linear_attention_mask(
    *args, attention_mask: torch.Tensor | None = None, q_length: int | None = None, **kwargs
) -> torch.Tensor | None:
    """Mask builder registered under ``ATTN_NAME``: the new tokens' padding flags, or ``None``.

    The kernels are causal by construction, so no (L, L) mask is ever built. A padded batch gets
    its (b, T) ``True``-for-real-token flags of the T new tokens (the last T columns of the
    padding mask, which covers every column so far), and ``linear_attention_forward`` runs each
    row's real tokens on their own (LoLCATs does not mask pads at all, docs/linear.md §7.5).
    """
    if attention_mask is None or attention_mask.ndim != 2 or bool(attention_mask.all()):
        return None
    if q_length is None:
        cache_position = kwargs.get("cache_position")
        q_length = cache_position.shape[0] if cache_position is not None else attention_mask.shape[-1]
    return attention_mask[:, -q_length:].to(torch.bool)


def _row_attention(
    module: torch.nn.Module,
    variant: LinearVariant,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
    valid: torch.Tensor | None,
    states: list,
    features: tuple[torch.Tensor, ...] | None,
    output_state: bool,
) -> tuple[torch.Tensor, list]:
    """A padded batch, one row at a time: each row's real tokens through ``student_attention`` with
    that row's own state, so every row computes what it computes alone (a pad key never enters a
    window, a feature sum or a gated state). Pad queries get zeros.

    Args:
        query: (b, H, T, D); key, value: (b, Hkv, T, D), the new tokens only.
        valid: (b, T) bool, ``True`` at real tokens, or ``None`` (all real: decoding a padded batch).
        states: one state (or ``None``) per row.
        features: Liger's (φq, φk, g) of the new tokens, batched; sliced per row here.

    Returns:
        (b, H, T, D) in ``value.dtype``, and the rows' new states.
    """
    out = torch.zeros(query.shape[:-1] + (value.shape[-1],), dtype=value.dtype, device=value.device)
    new_states = list(states)
    for r in range(query.shape[0]):
        idx = None if valid is None else valid[r].nonzero().squeeze(-1)
        if idx is not None and idx.numel() == 0:
            continue  # a chunk of pads only: nothing to attend, the state waits

        def take(x: torch.Tensor, r=r, idx=idx) -> torch.Tensor:
            return x[r : r + 1] if idx is None else x[r : r + 1].index_select(2, idx)

        feats = None if features is None else tuple(take(f) for f in features)
        o, st = student_attention(
            module, variant, take(query), take(key), take(value), scaling, states[r],
            output_state=output_state, features=feats,
        )  # fmt: skip
        if idx is None:
            out[r : r + 1] = o
        else:
            out[r : r + 1, :, idx] = o
        new_states[r] = st
    return out, new_states

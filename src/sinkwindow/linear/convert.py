"""Swap a transformers causal LM's attention for a linear-attention retrofit, in place and reversibly.

``convert(model, "lolcats:64")`` does four things, none of which copies model forward code:

1. adds ``feature_map_q``, ``feature_map_k`` (``HedgehogFeatureMap``, H heads each, identity init,
   the key map a copy of the query map) and, for the hybrid, ``window_factors`` (1, H, 1, 1) to
   every decoder layer's attention module, so they appear in ``state_dict`` beside ``q_proj``
   (``liger:W`` adds nothing: its feature maps and gate have no parameters);
2. registers ``linear_attention_forward`` and a no-mask builder with transformers under
   ``ATTN_NAME`` and switches the model's attention implementation to it;
3. adds a forward pre-hook (and a cleanup hook) to each attention module that hands the ``cache``
   keyword to the attention function, which advances the constant-size state (and, for Liger, the
   ``position_embeddings`` it undoes RoPE with);
4. sets ``model._sinkwindow_cache_factory`` so ``sinkwindow.make_cache(model)`` returns a
   ``LinearAttnCache``.

``revert(model)`` undoes all four (and removes LoRA adapters if ``lora.add_lora`` injected
them), leaving the original model bit for bit.
"""

from __future__ import annotations

import copy
import inspect
import logging
import sys

import torch
import torch.nn as nn
from transformers import PreTrainedModel

from ..runtime.attributes import CACHE_FACTORY_ATTR
from ..runtime.capability import check_supported, text_config
from ..runtime.patching import active_spec, apply
from ..runtime.rope import rope_for_model, rotate_half
from ..runtime.spec import MethodSpec, parse_spec
from .attention import (
    ATTN_NAME,
    CACHE_ATTR,
    DEFAULT_WINDOW_FACTOR,
    RETROFIT_ATTR,
    ROPE_ATTR,
    LinearVariant,
    Retrofit,
    register,
)
from .feature_maps import FEATURE_MAPS
from .ops import LIGER_GATE_NORMALIZER, LIGER_MIX

__all__ = ["attention_modules", "convert", "get_retrofit", "is_converted", "revert", "set_mode"]

logger = logging.getLogger(__name__)

NEW_PARAM_NAMES = ("feature_map_q", "feature_map_k", "window_factors")
MODES = ("student", "transfer")


def attention_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The self-attention module of every decoder layer, in layer order.

    Raises:
        ValueError: if the model has no ``layers[i].self_attn`` structure (not a supported decoder).
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no decoder layers (expected model.layers[i].self_attn)")
    mods = [layer.self_attn for layer in layers]
    for i, m in enumerate(mods):
        if getattr(m, "layer_idx", i) != i:
            raise ValueError(f"attention module {i} reports layer_idx={m.layer_idx}; cannot map cache layers")
    return mods


def is_converted(model: PreTrainedModel) -> bool:
    return getattr(model, RETROFIT_ATTR, None) is not None


def get_retrofit(model: PreTrainedModel) -> Retrofit:
    """The model's ``Retrofit`` state.

    Raises:
        ValueError: if the model was not converted.
    """
    rf = getattr(model, RETROFIT_ATTR, None)
    if rf is None:
        raise ValueError(
            "model is not converted to a linear-attention baseline; call sinkwindow.linear.convert first"
        )
    return rf


def set_mode(model: PreTrainedModel, mode: str) -> None:
    """Switch a converted model between ``"student"`` (the retrofit) and ``"transfer"`` (stage 1)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    rf = get_retrofit(model)
    rf.mode = mode
    rf.records.clear()


def _capture_cache(module: nn.Module, args: tuple, kwargs: dict) -> None:
    # Decoder layers of every supported family pass the cache by keyword.
    module.__dict__[CACHE_ATTR] = kwargs.get("cache", kwargs.get("past_key_values"))


def _capture_rope(module: nn.Module, args: tuple, kwargs: dict) -> None:
    # Liger un-rotates q and k with the very (cos, sin) the module rotates them with.
    module.__dict__[ROPE_ATTR] = kwargs.get("position_embeddings")


def _release_cache(module: nn.Module, args: tuple, kwargs: dict, output) -> None:
    # Do not keep a finished generation's cache alive through the module.
    module.__dict__.pop(CACHE_ATTR, None)
    module.__dict__.pop(ROPE_ATTR, None)


def _rope_convention_error(attn: nn.Module) -> str | None:
    """Why ``ops.unrotate_half`` would not invert this attention module's RoPE, or ``None``.

    Liger recovers pre-RoPE q and k by undoing x·cos + rotate_half(x)·sin. The family's own
    ``apply_rotary_pos_emb`` (the global its forward calls) is run once on random float64 inputs
    and must give exactly that; interleaved conventions (GLM) or other position schemes fail here
    rather than silently computing the wrong features.
    """
    forward = inspect.unwrap(type(attn).forward)
    fn = forward.__globals__.get("apply_rotary_pos_emb")
    if fn is None:
        fn = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
    name = type(attn).__name__
    if fn is None:
        return f"{name} applies no apply_rotary_pos_emb, so its pre-RoPE q and k cannot be recovered"
    D = attn.head_dim
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 3, D, generator=g, dtype=torch.float64)
    theta = torch.randn(1, 3, D // 2, generator=g, dtype=torch.float64)
    emb = torch.cat([theta, theta], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    try:
        got, _ = fn(x, x, cos, sin)
    except Exception as err:  # noqa: BLE001 - any failure means "not the convention we invert"
        return f"{name}'s apply_rotary_pos_emb does not take (q, k, cos, sin) ({err})"
    want = x * cos[:, None] + rotate_half(x) * sin[:, None]
    if got.shape != want.shape or not torch.allclose(got, want, atol=1e-12, rtol=0):
        return f"{name}'s RoPE is not transformers' rotate_half convention, which liger:W inverts"
    return None


def convert(
    model: PreTrainedModel,
    spec: str | MethodSpec,
    *,
    feature_map: str | None = None,
    feature_dim: int | None = None,
    init: str = "identity",
    window_factor_init: float = DEFAULT_WINDOW_FACTOR,
    affine: bool = False,
    eps: float = 1e-12,
    mix: tuple[float, float] = LIGER_MIX,
    gate_normalizer: float = LIGER_GATE_NORMALIZER,
    seed: int | None = 0,
) -> PreTrainedModel:
    """Convert ``model`` in place to a linear-attention baseline and return it.

    Base weights are untouched and keep their ``requires_grad``; the new parameters (feature maps,
    window factors) require grad. Training (``sinkwindow.train``) freezes what it needs.
    ``liger:W`` adds no parameters; its only trainable weights are the LoRA adapters the trainer
    adds later.

    Args:
        model: a transformers causal LM of a supported family, not patched by ``sinkwindow.apply``.
        spec: ``"lolcats:W"`` (hybrid), ``"linear"`` (pure Hedgehog) or ``"liger:W"``
            (Liger-GLA(+SWA)).
        feature_map: ``"hedgehog"`` (softmax_dim, LoLCATs default), ``"hedgehog_exp"`` or ``"t2r"``;
            ``None`` is ``"hedgehog"`` (and ``"softmax"``, the only choice, for Liger).
        feature_dim: f (default D/2 for Hedgehog, so F = D).
        init: ``"identity"`` (LoLCATs ``--lk_zero_init``) or ``"kaiming"``.
        window_factor_init: ω at init (logit(0.1)); γ = sigmoid(ω).
        affine: λ = 1 − γ instead of 1; with a large ω the hybrid then reduces to SWA(w).
        eps: pure-linear normaliser guard.
        mix: Liger: weights of its window and GLA branches, (0.5, 0.5); (1, 0) gives SWA(w, 0).
        gate_normalizer: Liger: g = logsigmoid(k) / gate_normalizer.
        seed: seeds the ``kaiming`` init (identity init is deterministic); ``None`` leaves the RNG.

    Returns:
        The same model.

    Raises:
        ValueError: wrong spec, unsupported model (for Liger also a RoPE it cannot invert), already
            converted or patched.
    """
    # A trained variant's name (@NAME) labels its tensors, not what is built.
    spec = parse_spec(spec).without_adapter
    _check_convertible(model, spec)
    if spec.kind == "swa":
        return _convert_swa_lora(model, spec)
    variant = LinearVariant(
        kind=spec.kind,
        window=spec.window,
        feature_map=feature_map,
        feature_dim=feature_dim,
        init=init,
        window_factor_init=float(window_factor_init),
        affine=affine,
        eps=eps,
        mix=mix,
        gate_normalizer=gate_normalizer,
    )
    mods = attention_modules(model)
    rf = Retrofit(variant=variant, impl=model.config._attn_implementation, num_layers=len(mods))
    if variant.kind == "liger":
        _liger_ropes(model, rf, mods, spec)
    else:
        _add_feature_maps(model, mods, variant, seed)
    return _install(model, rf, mods, spec, text_config(model).num_attention_heads)


def _check_convertible(model: PreTrainedModel, spec: MethodSpec) -> None:
    """Refuse a spec ``convert`` does not build, an unsupported model, or one converted or patched."""
    if not (spec.is_linear or _is_swa_lora(spec)):
        raise ValueError(
            f"convert() builds trained baselines ('linear', 'lolcats:W', 'liger:W', 'swa:W:S' for SWA + LoRA); "
            f"use sinkwindow.apply for {spec}"
        )
    check_supported(model)
    if is_converted(model):
        raise ValueError(
            f"model is already converted to {get_retrofit(model).variant.spec}; call revert() first"
        )
    if not active_spec(model).is_full:
        raise ValueError(
            f"model is patched with {active_spec(model)}; restore it with sinkwindow.apply(model, 'full') first"
        )


def _convert_swa_lora(model: PreTrainedModel, spec: MethodSpec) -> PreTrainedModel:
    """SWA + LoRA: the model's own attention under SWA(w, s); the record only carries the LoRA
    settings (``lora.add_lora``) and what ``revert`` must undo."""
    variant = LinearVariant("swa", window=spec.window, sinks=spec.sinks)
    apply(model, spec)
    rf = Retrofit(
        variant=variant, impl=model.config._attn_implementation, num_layers=len(attention_modules(model))
    )
    setattr(model, RETROFIT_ATTR, rf)
    logger.info("converted %s to %s + LoRA", type(model).__name__, spec)
    return model


def _liger_ropes(model: PreTrainedModel, rf: Retrofit, mods: list[nn.Module], spec: MethodSpec) -> None:
    """Liger adds no parameters, but inverts the RoPE of its keys: refuse a convention it cannot invert,
    and keep the rotary tables for the stock-cache fallback where the model has them."""
    for attn in mods:
        reason = _rope_convention_error(attn)
        if reason:
            raise ValueError(f"cannot convert to {spec}: {reason}")
    try:
        rf.ropes = rope_for_model(model, getattr(text_config(model), "layer_types", None))
    except NotImplementedError as err:
        logger.info("%s: no stock-cache fallback (%s); decode with sinkwindow.make_cache(model)", spec, err)


def _add_feature_maps(
    model: PreTrainedModel, mods: list[nn.Module], variant: LinearVariant, seed: int | None
) -> None:
    """Hedgehog feature maps on every attention module (and LoLCATs' window factors ω, ``[1, H, 1, 1]``)."""
    H = text_config(model).num_attention_heads
    ref = next(model.parameters())
    if seed is not None and variant.init != "identity":
        torch.manual_seed(seed)
    for attn in mods:
        D = attn.head_dim
        fm = FEATURE_MAPS[variant.feature_map](
            H, D, feature_dim=variant.feature_dim, init=variant.init, device=ref.device
        )
        attn.feature_map_q = fm
        # LoLCATs deep-copies the query map: both start equal and train apart.
        attn.feature_map_k = copy.deepcopy(fm)
        if variant.kind == "lolcats":
            attn.window_factors = nn.Parameter(
                torch.full((1, H, 1, 1), float(variant.window_factor_init), device=ref.device)
            )


def _is_swa_lora(spec: MethodSpec) -> bool:
    """A plain SWA(w, s) spec (no hybrid units, absolute positions): what SWA + LoRA trains on."""
    return spec.kind == "swa" and spec.positions == "absolute" and not (spec.full_layers or spec.full_heads)


def _install(
    model: PreTrainedModel, rf: Retrofit, mods: list[nn.Module], spec: MethodSpec, H: int
) -> PreTrainedModel:
    """Steps 2-4 of ``convert``: hooks, attention implementation, cache factory."""
    for attn in mods:
        setattr(attn, RETROFIT_ATTR, rf)
        rf.hooks.append(attn.register_forward_pre_hook(_capture_cache, with_kwargs=True))
        if rf.variant.kind == "liger":
            rf.hooks.append(attn.register_forward_pre_hook(_capture_rope, with_kwargs=True))
        rf.hooks.append(attn.register_forward_hook(_release_cache, with_kwargs=True, always_call=True))
        rf.modules.append(attn)
    register()
    model.set_attn_implementation(ATTN_NAME)
    setattr(model, RETROFIT_ATTR, rf)
    setattr(model, CACHE_FACTORY_ATTR, rf.make_cache)
    logger.info("converted %s to %s (%d layers, %d query heads)", type(model).__name__, spec, len(mods), H)
    return model


def revert(model: PreTrainedModel) -> PreTrainedModel:
    """Undo ``convert`` (and LoRA adapters): the model runs its original attention again.

    Raises:
        ValueError: if the model was not converted.
    """
    rf = get_retrofit(model)
    if rf.lora is not None:
        from .lora import remove_lora  # noqa: PLC0415 - peft is optional

        remove_lora(model)
    if rf.variant.kind == "swa":
        delattr(model, RETROFIT_ATTR)
        apply(model, "full")
        return model
    for h in rf.hooks:
        h.remove()
    for attn in rf.modules:
        for name in NEW_PARAM_NAMES:
            if hasattr(attn, name):
                delattr(attn, name)
        attn.__dict__.pop(RETROFIT_ATTR, None)
        attn.__dict__.pop(CACHE_ATTR, None)
        attn.__dict__.pop(ROPE_ATTR, None)
    model.set_attn_implementation(rf.impl)
    delattr(model, RETROFIT_ATTR)
    model.__dict__.pop(CACHE_FACTORY_ATTR, None)
    return model

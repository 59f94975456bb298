"""Whether sinkwindow can patch a model, decided by capability rather than by family name.

A model can be patched when its attention and masks go through the transformers seams
``patching.apply`` plugs into (``unsupported_reason`` lists the checks); the checks read class flags
and the global names its forward functions' bytecode refers to, and only a family without the flag
costs a forward of a tiny copy (``probe``). Also here: the decoder's config and layers as those
checks find them, which the patching and the cache factory read too.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from .attributes import BASE_CLASS_ATTR
from .probe import probe_routing

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "TESTED_MODEL_TYPES",
    "REFUSED_MODEL_TYPES",
    "MASK_ENTRY_POINTS",
    "all_configs",
    "base_class",
    "base_of",
    "check_supported",
    "decoder_layers",
    "dispatches_attention",
    "kv_heads_of",
    "native_sliding_layers",
    "text_config",
    "unsupported_reason",
]

# Decoder-only families the test suite runs through every runtime contract on a tiny config (identity for
# `full`, the fp64 reference, chunked prefill, the bounded cache, generate). Support itself is decided by
# capability (`unsupported_reason`), so families beyond this list are accepted when they pass its checks.
TESTED_MODEL_TYPES = (
    "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3_text", "gemma3", "gemma2", "phi", "olmo", "olmo2",
    "granite", "gpt_neox", "smollm3", "cohere", "cohere2", "mixtral", "qwen3_moe", "starcoder2", "glm", "helium",
    "gpt2", "stablelm",
)  # fmt: skip


SUPPORTED_MODEL_TYPES = TESTED_MODEL_TYPES  # the name older callers import


# Families that pass the capability checks but fail a runtime contract test, with the reason.
REFUSED_MODEL_TYPES: dict[str, str] = {
    "gpt_oss": (
        "its attention adds learned per-head sink logits (s_aux) that the float64 reference behind every "
        "sinkwindow test does not model (max |Δlogit| 0.16 on a tiny config); use a family without learned sinks"
    ),
}


# Mask builders of transformers.masking_utils that look up our builder in AttentionMaskInterface.
MASK_ENTRY_POINTS = frozenset({"create_causal_mask", "create_sliding_window_causal_mask"})


def text_config(model: PreTrainedModel):
    """The decoder's config (the text config of multimodal wrappers such as Gemma 3)."""
    return model.config.get_text_config(decoder=True)


def _global_names(fn: Callable) -> set[str]:
    """Global names a function's bytecode refers to, nested code (comprehensions, closures) included.

    Decorators that keep ``__wrapped__`` (``functools.wraps``) are looked through.
    """
    code = getattr(inspect.unwrap(fn), "__code__", None)
    names: set[str] = set()
    stack = [code] if code is not None else []
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return names


@functools.cache
def _forward_names(cls: type) -> frozenset[str]:
    """Global names ``cls.forward`` refers to, following ``super().forward`` up the MRO (wrapper subclasses)."""
    names: set[str] = set()
    owners = [c for c in cls.__mro__ if "forward" in vars(c)]
    for owner in owners:
        own = _global_names(vars(owner)["forward"])
        names |= own
        if "super" not in own:
            break
    return frozenset(names)


def dispatches_attention(module: torch.nn.Module) -> bool:
    """Whether the module's forward picks its attention function from transformers' AttentionInterface."""
    return "ALL_ATTENTION_FUNCTIONS" in _forward_names(type(module))


def decoder_layers(
    model: PreTrainedModel, n_layers: int
) -> tuple[torch.nn.Module, torch.nn.ModuleList] | None:
    """The decoder and its list of ``n_layers`` blocks (``layers`` in most families, ``h`` in GPT-2).

    ``get_decoder()`` first (it picks the text model of multimodal wrappers); some heads answer with
    themselves (Llama 4's ``base_model_prefix`` names a checkpoint prefix), so then the first
    submodel that owns such a list.
    """
    decoder = model.get_decoder()
    candidates = [decoder] + [
        m for m in model.modules() if isinstance(m, PreTrainedModel) and m is not decoder
    ]
    for candidate in candidates:
        for child in candidate.children():
            if isinstance(child, torch.nn.ModuleList) and len(child) == n_layers:
                return candidate, child
    return None


def _probe_layers(tiny: PreTrainedModel) -> list[list[torch.nn.Module]] | None:
    """For each decoder layer of a probe's tiny copy, the modules that may compute its attention."""
    n = tiny.config.get_text_config(decoder=True).num_hidden_layers
    found = decoder_layers(tiny, n)
    return None if found is None else [list(layer.modules()) for layer in found[1]]


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why sinkwindow cannot patch ``model`` (one line that names what to do), or ``None`` if it can.

    Support is by capability: the model must route attention and masks through the seams ``apply``
    plugs into. In order:

    1. transformers marks the class backend-compatible (``_supports_attention_backend``: it documents
       that the model uses the attention and mask interfaces and passes their arguments through), or
       a probe forward of a tiny copy shows every layer calling a sentinel attention function and
       the mask built through the mask interface (``probe.probe_routing``);
    2. transformers can switch its attention implementation (``_can_set_attn_implementation``; without
       it ``set_attn_implementation`` only logs a warning and the patch would silently not apply);
    3. the decoder's forward builds its masks with ``create_causal_mask`` and/or
       ``create_sliding_window_causal_mask``, which look our mask builder up by name, and not with
       ``create_chunked_causal_mask`` (chunked layers have no SWA(w, s) counterpart to keep);
    4. the config keeps attention causal and self-only (no ``use_bidirectional_attention``, no
       ``add_cross_attention``);
    5. every decoder layer holds an attention module whose forward dispatches through
       ``ALL_ATTENTION_FUNCTIONS`` (hybrids with recurrent, convolution or linear-attention layers fail);
    6. the family is not in ``REFUSED_MODEL_TYPES`` (passes 1-5 but fails a runtime contract test).

    The checks read class flags and the global names the forward functions' bytecode refers to; only
    a family without the flag costs a forward (of a tiny copy).
    """
    cls = base_class(model)  # the model's own class, not the context-manager mixin
    tcfg = text_config(model)
    model_type = tcfg.model_type
    remote = cls.__module__.startswith("transformers_modules")
    fix = (
        "load it with transformers' own implementation (trust_remote_code=False)"
        if remote
        else "use a family whose attention goes through these interfaces (e.g. llama, qwen3, gemma3)"
    )
    if not getattr(cls, "_supports_attention_backend", False):
        # The flag is transformers' promise, not the only evidence: a probe forward decides.
        found_by_probe = probe_routing(model, _probe_layers)
        if found_by_probe is not None:
            return (
                f"transformers does not mark {cls.__name__} as attention-backend compatible "
                f"(_supports_attention_backend=False), and {found_by_probe}; {fix}"
            )
    can_set = getattr(cls, "_can_set_attn_implementation", None)
    if can_set is not None and not can_set():
        return (
            f"transformers cannot switch the attention implementation of {cls.__name__} (its modeling code "
            f"does not call ALL_ATTENTION_FUNCTIONS.get_interface), so the sink-window attention would never "
            f"run; {fix}"
        )
    n_layers = tcfg.num_hidden_layers
    found = decoder_layers(model, n_layers)
    if found is None:
        return (
            f"cannot find the {n_layers} decoder layers of {cls.__name__} to check that their attention "
            f"goes through AttentionInterface; {fix}"
        )
    decoder, layers = found
    mask_calls = _forward_names(type(decoder))
    if not MASK_ENTRY_POINTS & mask_calls:
        return (
            f"{type(decoder).__name__}.forward builds its attention masks itself instead of through "
            f"create_causal_mask/create_sliding_window_causal_mask, so the sink-window mask would never "
            f"apply; {fix}"
        )
    if "create_chunked_causal_mask" in mask_calls:
        return (
            f"{type(decoder).__name__} has chunked-attention layers (create_chunked_causal_mask), which "
            f"SWA(w, s) would silently replace and native_sliding='keep' cannot keep; {fix}"
        )
    if getattr(tcfg, "use_bidirectional_attention", False) or getattr(tcfg, "add_cross_attention", False):
        return (
            f"this {model_type!r} config makes attention bidirectional or adds cross-attention, and SWA(w, s) "
            f"is a causal self-attention mask; use a causal LM config"
        )
    # Every layer, not every layer class: hybrids (MiniMax) build one layer class around different mixers.
    for i, layer in enumerate(layers):
        if not any(dispatches_attention(m) for m in layer.modules()):
            return (
                f"layer {i} of {type(decoder).__name__} ({type(layer).__name__}) computes no attention "
                f"through AttentionInterface (a recurrent, convolution or linear-attention layer, or "
                f"hand-written attention), so SWA(w, s) cannot reach it; {fix}"
            )
    if model_type in REFUSED_MODEL_TYPES:
        return REFUSED_MODEL_TYPES[model_type]
    return None


def check_supported(model: PreTrainedModel) -> None:
    """Raise a one-line error saying why ``model`` cannot be patched and what to do (see ``unsupported_reason``)."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            f"sinkwindow patches transformers PreTrainedModel instances, got {type(model).__name__}"
        )
    if getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(
            f"{model.config.model_type!r} is an encoder-decoder model: SWA(w, s) applies to decoder-only "
            f"causal LMs; use a decoder-only model"
        )
    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"unsupported architecture {model.config.model_type!r}: {reason}")


def native_sliding_layers(config) -> list[bool]:
    """Which decoder layers have their own sliding window (Gemma 3 local layers, Mistral, ...)."""
    n = config.num_hidden_layers
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return [t == "sliding_attention" for t in layer_types]
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return [True] * n
    return [False] * n


def all_configs(model: PreTrainedModel) -> list:
    seen, out = set(), []
    for cfg in (model.config, text_config(model)):
        if id(cfg) not in seen:
            seen.add(id(cfg))
            out.append(cfg)
    return out


def kv_heads_of(model: PreTrainedModel) -> int:
    tcfg = text_config(model)
    return getattr(tcfg, "num_key_value_heads", None) or tcfg.num_attention_heads


def base_of(cls: type) -> type:
    """The model's own class under the context subclass (``cls`` itself when it is not one)."""
    return cls.__dict__.get(BASE_CLASS_ATTR, cls)


def base_class(model: PreTrainedModel) -> type:
    """The model's own class, under the context-manager subclass ``apply`` swaps in."""
    return base_of(type(model))

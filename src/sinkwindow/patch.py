"""Apply SWA(w, s) to a transformers model through its own extension points.

``apply`` registers three attention implementations with transformers, ``sinkwindow_sdpa``,
``sinkwindow_eager`` and ``sinkwindow_flex`` (FlexAttention with a block-sparse mask where it pays,
see ``flex``), each as an attention function (``AttentionInterface``: the stock SDPA function, the
model's own eager function, or flex) **and** a mask builder of the same name
(``AttentionMaskInterface``). Registering only the attention would make ``create_causal_mask``
find no builder and silently pass no mask at all (docs/design.md §2). What a patched model runs is one
immutable ``plan.AttentionPlan`` on the model (``plan_of(model)``); the mask builders, which
transformers hands only the config, read the same object back with ``plan.config_plan(config)``.

A forward pre-hook on the patched model plans each step on our cache (``SinkWindowCache.begin_step``):
it hands the cache the 2-D padding mask, and the model the ``position_ids`` it must use (real-token
positions under padding; cache positions for ``positions="cache"``). So ``model(...)`` and
``model.generate(...)`` honour padding and both position modes with no other change.

No model forward code is copied or modified; ``apply(model, "full")`` or leaving the ``with``
block restores the original implementation (and removes the hooks). Which models can be patched is
decided by capability (``unsupported_reason``): their attention and masks must go through these
interfaces, whatever the family's name.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import sys
import types
import weakref
from collections.abc import Callable

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from . import flex, hybrid
from .attributes import CACHE_FACTORY_ATTR, HYBRID_ATTR, RETROFIT_ATTR
from .cache import SinkWindowCache
from .masks import sinkwindow_eager_mask, sinkwindow_sdpa_mask, token_positions
from .paged_cache import PagedFullCache, PagedSinkWindowCache
from .plan import PLAN_ATTR, AttentionPlan, bind, plan_of, unbind
from .probe import probe_routing
from .rope import rope_for_model
from .spec import MethodSpec, parse_spec
from .static_cache import StaticSinkWindowCache

__all__ = [
    "apply",
    "make_cache",
    "active_spec",
    "active_native_sliding",
    "base_class",
    "SUPPORTED_MODEL_TYPES",
    "NATIVE_SLIDING_POLICIES",
    "check_supported",
    "check_positions",
    "max_positions",
    "unsupported_reason",
    "TESTED_MODEL_TYPES",
    "REFUSED_MODEL_TYPES",
    "text_config",
]

logger = logging.getLogger(__name__)

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
NATIVE_SLIDING_POLICIES = ("override", "keep")

# Model attributes of the context manager: what the latest apply() replaced, and the open blocks' specs.
_ENTERED_FROM_ATTR = "_sinkwindow_entered_from"
_BLOCKS_ATTR = "_sinkwindow_blocks"
# The handles of the model's two forward hooks, kept on the model so a deep copy or an unpickled copy
# carries handles to its own hooks (torch's handles pickle and copy with their dicts).
_HOOKS_ATTR = "_sinkwindow_hooks"
SDPA_NAME = "sinkwindow_sdpa"
EAGER_NAME = "sinkwindow_eager"
FLEX_NAME = flex.FLEX_NAME
# What ``attn_implementation`` accepts for the flex path (transformers' own name included).
FLEX_ALIASES = ("flex", "flex_attention", FLEX_NAME)


def eager_attention_for(module: torch.nn.Module) -> Callable:
    """The model's own eager attention function (it may softcap or scale differently per family)."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return fn if fn is not None else _generic_eager


def _generic_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Plain eager attention for families whose modeling file has no ``eager_attention_forward``."""
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


def sinkwindow_eager_attention(module, query, key, value, attention_mask, **kwargs):
    """``sinkwindow_eager``: the model's eager attention; the mask carries the window."""
    unit, eager = hybrid.unit_of(module), eager_attention_for(module)
    if unit is not None:  # a layer or KV heads of a hybrid spec that keep full attention
        return hybrid.attention(
            module, unit, query, key, value, attention_mask, eager, additive=True, **kwargs
        )
    return eager(module, query, key, value, attention_mask, **kwargs)


def sinkwindow_sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """``sinkwindow_sdpa``: transformers' SDPA attention; the mask carries the window."""
    unit = hybrid.unit_of(module)
    if unit is not None:
        return hybrid.attention(
            module, unit, query, key, value, attention_mask, sdpa_attention_forward, additive=False, **kwargs
        )
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def sinkwindow_flex_attention(module, query, key, value, attention_mask, **kwargs):
    """``sinkwindow_flex``: FlexAttention when the mask builder made a BlockMask, else the family's own path.

    The builder (``flex.sinkwindow_flex_mask``) hands short calls (decode steps) a boolean SDPA mask, or
    an additive float mask for families without SDPA; a BlockMask that flex then refuses is replaced by
    that same mask (``flex.fallback_mask``), never by none.
    """
    if flex.BlockMask is not None and isinstance(attention_mask, flex.BlockMask):
        # A hybrid's full units mask per head over their own keys: the SDPA/eager path below.
        out = (
            None
            if hybrid.unit_of(module)
            else flex.flex_attention_forward(module, query, key, value, attention_mask, **kwargs)
        )
        if out is not None:
            return out
        attention_mask = flex.fallback_mask(attention_mask)
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dtype != torch.bool:
        return sinkwindow_eager_attention(module, query, key, value, attention_mask, **kwargs)
    return sinkwindow_sdpa_attention(module, query, key, value, attention_mask, **kwargs)


def _register() -> None:
    # Idempotent: GeneralInterface.register only updates a dict.
    AttentionInterface.register(SDPA_NAME, sinkwindow_sdpa_attention)
    AttentionInterface.register(EAGER_NAME, sinkwindow_eager_attention)
    AttentionInterface.register(FLEX_NAME, sinkwindow_flex_attention)
    AttentionMaskInterface.register(SDPA_NAME, sinkwindow_sdpa_mask)
    AttentionMaskInterface.register(EAGER_NAME, sinkwindow_eager_mask)
    AttentionMaskInterface.register(FLEX_NAME, flex.sinkwindow_flex_mask)


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


def _dispatches_attention(module: torch.nn.Module) -> bool:
    """Whether the module's forward picks its attention function from transformers' AttentionInterface."""
    return "ALL_ATTENTION_FUNCTIONS" in _forward_names(type(module))


def _decoder_layers(
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
    found = _decoder_layers(tiny, n)
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
    found = _decoder_layers(model, n_layers)
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
        if not any(_dispatches_attention(m) for m in layer.modules()):
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


def _own_configs(model: PreTrainedModel) -> None:
    """Give ``model`` config objects of its own before the plan and attention implementation go on them.

    transformers hands one config object to every model built from it (``from_config(cfg)`` twice,
    or a model and its copy made with the same config): a plan set on a shared config would switch
    the masks, and ``set_attn_implementation`` the attention, of every other model on it. So each
    module that holds the model's config (or its text config) gets the model's private copy.
    """
    main = model.config
    text = text_config(model)
    new_main = copy.deepcopy(main)
    swap = {id(main): new_main}
    if text is not main:
        swap[id(text)] = new_main.get_text_config(decoder=True)
    for module in model.modules():
        cfg = module.__dict__.get("config")
        if cfg is not None and id(cfg) in swap:
            module.config = swap[id(cfg)]


# generate() arguments that turn on assisted decoding (candidate tokens verified, then the cache cropped).
_ASSISTED = ("prompt_lookup_num_tokens", "assistant_model", "assistant_early_exit")


class _SinkWindowContext:
    """Mixed into the model's class by ``apply`` so ``with apply(model, spec):`` restores on exit.

    ``apply`` notes what ran before it (``_ENTERED_FROM_ATTR``); entering a block pushes that on the
    model's block stack and leaving pops it, so plain calls never grow the stack and a block returns to
    the spec it interrupted, ``full`` blocks included.
    """

    def __enter__(self):
        self.__dict__.setdefault(_BLOCKS_ATTR, []).append(self.__dict__.pop(_ENTERED_FROM_ATTR, None))
        return self

    def _supports_default_dynamic_cache(self) -> bool:
        # While patched, generate() builds no DynamicCache of its own: the first forward runs with no
        # cache, the pre-hook makes the bounded one, and generate carries on with the cache the model
        # returned. So plain model.generate(ids) and pipelines keep SWA(w, s)'s memory bound with no
        # cache= argument. Unpatched (a ``full`` block), the family's own answer.
        if plan_of(self) is None:
            return _base_of(type(self))._supports_default_dynamic_cache()
        return False

    def generate(self, *args, **kwargs):
        # Assisted decoding (prompt lookup, an assistant model) drafts tokens and then crops the cache
        # back to the accepted ones. A bounded SWA(w, s) cache has already evicted what cropping would
        # have to restore, so transformers fails deep inside; say why before anything runs.
        config = kwargs.get("generation_config")
        asked = [
            name
            for name in _ASSISTED
            if kwargs.get(name) is not None
            or (config is not None and getattr(config, name, None) is not None)
        ]
        plan = plan_of(self)
        if asked and plan is not None:
            raise ValueError(
                f"assisted decoding ({', '.join(asked)}) crops the cache back after each draft, which a bounded "
                f"{plan.spec} cache cannot do (the keys are already evicted): generate "
                f"without it, or run it under full attention (sinkwindow.apply(model, 'full'))"
            )
        return super().generate(*args, **kwargs)

    def __reduce_ex__(self, protocol):
        # This class is made at run time (named after the family, for save_pretrained and reprs), so
        # pickle cannot find it by name: rebuild it from the family's class instead. What else a
        # patched model holds travels in its state (plan, hooks, hybrid units); the configs' binding
        # is redone by the first forward, as for a deep copy.
        return _new_patched, (_base_of(type(self)),), self.__getstate__()

    def __exit__(self, *exc) -> None:
        blocks = self.__dict__.get(_BLOCKS_ATTR) or [None]
        previous = blocks.pop()
        if previous is not None:
            spec, native_sliding, implementation = previous
            _apply(self, spec, native_sliding=native_sliding, attn_implementation=implementation, push=False)
            return
        if plan_of(self) is not None:
            _restore(self)
        if not blocks:  # the outermost block: the model's own class again
            self.__dict__.pop(_BLOCKS_ATTR, None)
            self.__class__ = _base_of(type(self))


_CONTEXT_CLASSES: dict[type, type] = {}


def _context_class(cls: type) -> type:
    cls = _base_of(cls)
    if cls not in _CONTEXT_CLASSES:
        # The family's own name: save_pretrained writes it into config.architectures, and logs and
        # reprs should show the model, not our mixin.
        _CONTEXT_CLASSES[cls] = type(
            cls.__name__,
            (_SinkWindowContext, cls),
            {"_sinkwindow_base": cls, "__qualname__": cls.__qualname__},
        )
    return _CONTEXT_CLASSES[cls]


def _new_patched(base: type) -> PreTrainedModel:
    """An empty instance of ``base``'s context class, for unpickling (its state is set after)."""
    _register()  # a fresh process (a worker) has not run apply: its attention names must exist
    cls = _context_class(base)
    return cls.__new__(cls)


def _base_of(cls: type) -> type:
    """The model's own class under the context subclass (``cls`` itself when it is not one)."""
    return cls.__dict__.get("_sinkwindow_base", cls)


def active_spec(model: PreTrainedModel) -> MethodSpec:
    """The spec a model currently runs (``full`` when unpatched)."""
    plan = plan_of(model)
    return plan.spec if plan else parse_spec("full")


def active_native_sliding(model: PreTrainedModel) -> str:
    """The native-sliding policy the model was patched with (``"override"`` when unpatched)."""
    plan = plan_of(model)
    return plan.native_sliding if plan else "override"


def base_class(model: PreTrainedModel) -> type:
    """The model's own class, under the context-manager subclass ``apply`` swaps in."""
    return _base_of(type(model))


def apply(
    model: PreTrainedModel,
    spec: str | MethodSpec,
    *,
    native_sliding: str = "override",
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """Patch ``model`` in place to run ``spec`` and return it.

    Usable as a context manager for every spec, ``full`` included: ``with sinkwindow.apply(model,
    "swa:64:4") as m: ...`` restores on exit what ran before (the spec of the block or plain call it
    interrupted, else the original attention); leaving the outermost block gives the model its own
    class back. ``apply(model, "full")`` restores the original attention at any time; the model then
    stays under a subclass of its own class (same name, same behaviour) so that it can open a block.
    A patched model deep-copies and pickles (``torch.save``, worker processes, Ray tasks) with its
    method: the copy runs the same spec and restores on its own.

    Args:
        model: a transformers causal LM of a supported family.
        spec: ``"swa:W:S"``, ``"evict:W:S"``, ``"full"`` or a ``MethodSpec``.
        native_sliding: what SWA(w, s) does to layers that already have a sliding window (Gemma 3's
            local layers, Mistral): ``"override"`` (default) applies SWA(w, s) to every layer, as the
            paper does; ``"keep"`` leaves native sliding layers on their own window (no sinks) and
            applies SWA(w, s) to the global layers only.
        attn_implementation: ``"sdpa"``, ``"eager"`` or ``"flex"`` (also ``"flex_attention"``); default:
            follow the model's current one (``"sdpa"`` or ``"eager"``; any other, a model loaded with
            ``"flex_attention"`` included, gets SDPA). ``"flex"`` runs FlexAttention with a block-sparse SWA(w, s) mask for calls of at least ``flex.CPU_MIN_QUERIES`` queries
            (long one-shot and chunked prefills, where it was measured faster than SDPA) and the SDPA
            path (eager for families without SDPA) for the others, decode steps included; where flex
            cannot run it falls back to that path with one log line (``sinkwindow.flex``).

    Raises:
        ValueError: unsupported architecture or bad spec.
    """
    return _apply(
        model, spec, native_sliding=native_sliding, attn_implementation=attn_implementation, push=True
    )


def _apply(
    model: PreTrainedModel, spec, *, native_sliding: str, attn_implementation: str | None, push: bool
) -> PreTrainedModel:
    """``apply``; ``push`` records the spec it replaces so that leaving a ``with`` block returns to it."""
    spec = parse_spec(spec)
    if native_sliding not in NATIVE_SLIDING_POLICIES:
        raise ValueError(f"native_sliding must be one of {NATIVE_SLIDING_POLICIES}, got {native_sliding!r}")
    if attn_implementation is not None and attn_implementation not in _REQUESTABLE:
        raise ValueError(
            f"attn_implementation must be 'sdpa', 'eager' or 'flex' (or None to follow the model), "
            f"got {attn_implementation!r}"
        )
    check_supported(model)
    current = plan_of(model)
    if getattr(model, RETROFIT_ATTR, None) is not None:
        # A converted model's attention is the linear baseline's; patching on top would mix both.
        raise ValueError(
            "this model is converted to a linear-attention baseline: call sinkwindow.linear.revert(model) "
            "before applying another method"
        )

    if push:
        # What a ``with`` block entered with this call returns to (None: full attention); the
        # implementation too, so a block interrupting one that ran on flex returns to flex.
        model.__dict__[_ENTERED_FROM_ATTR] = (
            (current.spec, current.native_sliding, current.attention) if current else None
        )
    if spec.is_full:
        if current:
            _restore(model)
        # Kept (or put) under the context class so ``with apply(model, "full"):`` works too; the
        # outermost block's exit gives the model its own class back.
        model.__class__ = _context_class(type(model))
        return model
    if spec.is_trained:
        raise ValueError(
            f"{spec} is a trained method: load it with sinkwindow.use_method(model, '{spec}', checkpoint=...) "
            f"(or sinkwindow.load(name, method='{spec}', checkpoint=...)) instead of apply()"
        )
    if spec.positions == "cache":
        rope_for_model(model, getattr(text_config(model), "layer_types", None))  # unsupported RoPE: fail now
    full_kv_heads = _full_kv_heads(model, spec, native_sliding)
    _warn_shrunk_local_windows(model, spec, native_sliding)

    cls = _base_of(type(model))
    restores = current.restores if current else model.config._attn_implementation
    name = _attention_name(cls, attn_implementation, restores)
    _register()
    if current is None:
        _own_configs(model)
    plan = AttentionPlan(
        spec=spec,
        native_sliding=native_sliding,
        attention=name,
        restores=restores,
        # The path of calls flex does not take (decode steps, refusals): the family's SDPA, else eager.
        fallback=("sdpa" if getattr(cls, "_supports_sdpa", False) else "eager")
        if name == FLEX_NAME
        else None,
        full_kv_heads=None if full_kv_heads is None else tuple(tuple(h) for h in full_kv_heads),
    )
    model.__dict__[PLAN_ATTR] = plan
    bind(all_configs(model), plan)
    model.set_attn_implementation(name)
    hybrid.remove(model)
    model.__dict__[HYBRID_ATTR] = None
    if full_kv_heads is not None:
        _, layers = _decoder_layers(model, text_config(model).num_hidden_layers)
        modules = [next(m for m in layer.modules() if _dispatches_attention(m)) for layer in layers]
        model.__dict__[HYBRID_ATTR] = hybrid.install(modules, full_kv_heads, kv_heads_of(model))
    _install_hooks(model)
    model.__class__ = _context_class(type(model))
    return model


_SHRINK_WARNED: set[tuple[str, int, int]] = set()


def shrunk_local_windows(model: PreTrainedModel, spec: MethodSpec, native_sliding: str) -> int | None:
    """The native window that ``spec`` would shrink on a model with local *and* global layers.

    Such a model (Gemma 2/3: ``layer_types`` with both kinds) was trained with its local layers on a
    short window; under ``native_sliding="override"`` a smaller W puts them below it. ``None`` when
    nothing is shrunk (no native local layers, ``keep``, or W at least the native window).
    """
    tcfg = text_config(model)
    types = set(getattr(tcfg, "layer_types", None) or ())
    native = getattr(tcfg, "sliding_window", None)
    if native_sliding != "override" or not native or not {"sliding_attention", "full_attention"} <= types:
        return None
    return native if spec.window is not None and spec.window < native else None


def _warn_shrunk_local_windows(model: PreTrainedModel, spec: MethodSpec, native_sliding: str) -> None:
    # Measured: on gemma3-270m at 4K, swa:256:4 over its 512-token local layers scored 0 of 90
    # S-NIAH samples (with or without its global layers kept full; the answers degenerate into
    # repetition), while native_sliding="keep" kept the model coherent. One line per model and W.
    native = shrunk_local_windows(model, spec, native_sliding)
    key = (text_config(model).model_type, native or 0, spec.window or 0)
    if native is None or key in _SHRINK_WARNED:
        return
    _SHRINK_WARNED.add(key)
    logger.warning(
        "%s: W=%d puts its native local layers (trained on %d-token windows) on a shorter window; on "
        "gemma3-270m this broke retrieval at 4K. Consider native_sliding='keep' (--native-sliding keep) "
        "or W >= %d",
        key[0],
        spec.window,
        native,
        native,
    )


def kv_heads_of(model: PreTrainedModel) -> int:
    tcfg = text_config(model)
    return getattr(tcfg, "num_key_value_heads", None) or tcfg.num_attention_heads


def _full_kv_heads(
    model: PreTrainedModel, spec: MethodSpec, native_sliding: str
) -> list[tuple[int, ...]] | None:
    """Per decoder layer, the KV heads a hybrid spec keeps full (``None`` for a spec without units)."""
    if not spec.is_hybrid:
        return None
    tcfg = text_config(model)
    n_layers, kv_heads = tcfg.num_hidden_layers, kv_heads_of(model)
    spec.check_units(n_layers, kv_heads)
    heads = [spec.full_kv_heads(i, kv_heads) for i in range(n_layers)]
    if native_sliding == "keep":
        # "keep" leaves native sliding layers on their own window, so only the global layers (SWA(w, s)
        # under this spec) can be kept full: a local layer made full would see distances it never
        # saw in training, which is what "keep" is there to avoid.
        local = [i for i, is_native in enumerate(native_sliding_layers(tcfg)) if is_native and heads[i]]
        if local:
            globals_ = [i for i, is_native in enumerate(native_sliding_layers(tcfg)) if not is_native]
            raise ValueError(
                f"{spec} keeps native sliding layer{'s' if len(local) > 1 else ''} {', '.join(map(str, local))} "
                f"full, but native_sliding='keep' leaves those on their own window: choose units among the "
                f"global layers ({', '.join(map(str, globals_)) or 'none'}), or use native_sliding='override'"
            )
    return heads


# What ``apply(attn_implementation=...)`` takes; anything else is refused rather than run as SDPA.
_REQUESTABLE = ("sdpa", "eager", SDPA_NAME, EAGER_NAME, *FLEX_ALIASES)


def _attention_name(cls: type, requested: str | None, current: str) -> str:
    """``sinkwindow_sdpa``, ``sinkwindow_eager`` or ``sinkwindow_flex`` for a model of class ``cls`` now running ``current``."""
    if requested in FLEX_ALIASES:
        # Only when asked for: a model loaded with "flex_attention" keeps the SDPA/eager path below.
        return FLEX_NAME
    base = requested or current
    if base not in ("sdpa", "eager", SDPA_NAME, EAGER_NAME):
        logger.info("attention %r has no sink-window mask path; using SDPA", base)
        base = "sdpa"
    if base in ("sdpa", SDPA_NAME) and not getattr(cls, "_supports_sdpa", False):
        # Stock SDPA drops what such families add to their eager attention (Gemma 2's logit softcap).
        if requested in ("sdpa", SDPA_NAME):
            raise ValueError(
                f"transformers does not support SDPA for {cls.__name__} (_supports_sdpa=False): "
                f"use attn_implementation='eager'"
            )
        logger.info("%s does not support SDPA; using its eager attention", cls.__name__)
        base = "eager"
    return EAGER_NAME if base in ("eager", EAGER_NAME) else SDPA_NAME


def _restore(model: PreTrainedModel) -> None:
    """Undo ``apply``: hooks, hybrid wrappers, the configs' plan, the attention implementation."""
    plan = plan_of(model)
    for handle in model.__dict__.pop(_HOOKS_ATTR, []):
        handle.remove()
    hybrid.remove(model)
    unbind(all_configs(model))
    model.set_attn_implementation(plan.restores)
    model.__dict__.pop(PLAN_ATTR, None)
    model.__dict__.pop(HYBRID_ATTR, None)


def make_cache(model: PreTrainedModel, *, static: bool = False, pool=None, rows=None) -> Cache:
    """A cache for the model's active spec.

    For ``swa``/``evict`` a ``SinkWindowCache`` whose layers never persist more than w - 1 keys
    (w with the current query); for ``full`` (unpatched) a stock ``DynamicCache``.

    Args:
        static: a ``StaticSinkWindowCache`` of fixed-shape ring buffers (``w`` slots a layer, allocated
            on the first forward) for ``torch.compile``d decoding.
        pool, rows: a ``paged_cache.PagedSinkWindowCache`` whose layers store ``rows`` (``kv_pool.PoolRow``,
            one per batch row) in blocks of ``pool`` (``kv_pool.KVPool``): what serving runs on. For
            ``full``, a ``paged_cache.PagedFullCache`` of one row.
    """
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"make_cache takes a transformers PreTrainedModel, got {type(model).__name__}")
    factory = getattr(model, CACHE_FACTORY_ATTR, None)
    if factory is not None and pool is not None:
        raise ValueError("a linear-attention retrofit keeps a constant state of its own: it takes no KV pool")
    if factory is not None:
        # Converted models (the linear baselines) bring their own constant-size cache.
        return factory()
    plan = plan_of(model)
    if plan is None:
        if pool is not None:
            if rows is None or len(rows) != 1:
                raise ValueError("a paged full-attention cache holds one sequence: give rows=[one PoolRow]")
            return PagedFullCache(pool, rows[0])
        if static:
            raise ValueError("static=True needs a sink-window spec: sinkwindow.apply(model, 'swa:W:S') first")
        return DynamicCache(config=model.config)
    spec = plan.spec
    tcfg = text_config(model)
    if plan.native_sliding == "keep":
        native = native_sliding_layers(tcfg)
        native_window = getattr(tcfg, "sliding_window", None)
    else:
        native = [False] * tcfg.num_hidden_layers
        native_window = None
    layers = [
        (native_window, 0, True) if is_native else (spec.window, spec.sinks, False) for is_native in native
    ]
    ropes = rope_for_model(model, getattr(tcfg, "layer_types", None)) if spec.positions == "cache" else None
    if (static or pool is not None) and spec.is_hybrid:
        raise ValueError(
            f"static=True has fixed-size ring buffers of w slots, but {spec}'s full layers grow: use the default "
            f"dynamic cache (static=False), or the plain {spec.base}"
        )
    cls = StaticSinkWindowCache if static else SinkWindowCache
    extra = {}
    if pool is not None:
        cls, extra = PagedSinkWindowCache, {"pool": pool, "rows": rows}
    if spec.is_hybrid:
        extra = {
            "full_kv_heads": list(plan.full_kv_heads),
            "kv_heads": kv_heads_of(model),
        }
    cache = cls(
        layers,
        positions=spec.positions,
        ropes=ropes,
        window=spec.window,
        sinks=spec.sinks,
        kind=spec.kind,
        **extra,
    )
    cache.made_for = plan.made_for
    ref = weakref.ref(model)

    def owner_active() -> bool:
        owner = ref()
        now = plan_of(owner) if owner is not None else None
        return now is not None and now.made_for == cache.made_for

    cache.owner_active = owner_active
    return cache


def _install_hooks(model: PreTrainedModel) -> None:
    if _HOOKS_ATTR in model.__dict__:
        return
    model.__dict__[_HOOKS_ATTR] = [
        model.register_forward_pre_hook(_plan_forward, with_kwargs=True),
        model.register_forward_hook(_close_forward, with_kwargs=True),
    ]


def max_positions(model: PreTrainedModel) -> int | None:
    """Positions the model was trained for (``max_position_embeddings``), or ``None`` if it has no limit."""
    return getattr(text_config(model), "max_position_embeddings", None)


def check_positions(model: PreTrainedModel, n: int) -> None:
    """Refuse to run absolute positions ``0..n-1`` past the model's trained limit.

    SWA(w, s) keeps absolute positions, so a stream past ``max_position_embeddings`` would rotate keys
    by angles the model never saw; ``positions="cache"`` re-assigns positions inside the cache instead.
    """
    limit = max_positions(model)
    if limit is not None and n > limit:
        plan = plan_of(model)
        spec = plan.spec if plan else None
        alt = (
            f"{spec.kind}:{spec.window}:{spec.sinks}:cache"
            if spec is not None and spec.is_windowed
            else "swa:W:S:cache"
        )
        raise ValueError(
            f"{n} positions pass the model's limit of {limit} (max_position_embeddings): shorten the prompt or "
            f"max_new_tokens, or use {alt} (positions re-assigned inside the cache, so streams run past the limit)"
        )


def _bounded_cache(model: PreTrainedModel, plan: AttentionPlan, cache, kwargs: dict):
    """The cache this forward must run on, so that SWA(w, s)'s memory bound always holds.

    - No cache (``use_cache`` not False): ``make_cache(model)``. So ``model(ids)`` returns a bounded cache,
      and plain ``model.generate(ids)`` and pipelines (whose generate makes no cache of its own for a
      patched model, see ``_SinkWindowContext``) keep at most w entries a layer with no ``cache=``.
    - A stock cache (``DynamicCache``, ``StaticCache``, ...): refused, since it grows with the context
      (or, for Gemma-style sliding layers, drops the sinks).
    - A ``SinkWindowCache`` made under another spec or native-sliding policy: refused.
    """
    spec, made_for = plan.spec, plan.made_for
    if isinstance(cache, SinkWindowCache):
        if cache.made_for is not None and cache.made_for != made_for:
            raise ValueError(
                f"this SinkWindowCache was made for {cache.made_for[0]} (native_sliding={cache.made_for[1]}), but the "
                f"model runs {made_for[0]} (native_sliding={made_for[1]}): make a new one with sinkwindow.make_cache(model)"
            )
        return cache
    if cache is None:
        use_cache = kwargs.get("use_cache")
        if use_cache is None:
            use_cache = getattr(text_config(model), "use_cache", True)
        if not use_cache and spec.positions != "cache" and not spec.is_hybrid:
            # (cache positions live in the cache; a hybrid's full layers build their masks from it)
            return None
    else:
        raise ValueError(
            f"a {type(cache).__name__} grows with the context, so {spec}'s memory bound would be lost: pass "
            f"cache=sinkwindow.make_cache(model), or no cache at all (a patched model makes its own)"
        )
    cache = make_cache(model)
    kwargs.pop("past_key_values", None)
    kwargs["cache"] = cache
    kwargs["use_cache"] = True
    return cache


def _plan_forward(module, args, kwargs):
    """Forward pre-hook: plan the step on our cache and hand the model the positions it must use.

    - Padding: the cache learns each row's real tokens from the 2-D ``attention_mask`` (its sinks are
      each row's first s real tokens), and the model gets ``position_ids`` counting real tokens only
      (what ``generate`` computes for left padding) when none were given.
    - ``positions="cache"``: ``position_ids`` are always the cache positions (any given are replaced),
      and a forward without a cache runs through a fresh one, since the positions live there.
    """
    plan = plan_of(module)
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if plan is None:
        if isinstance(cache, SinkWindowCache):
            raise ValueError(
                f"this model runs full attention, but the cache is a SinkWindowCache made for {cache.made_for[0]}: "
                f"apply that spec first (sinkwindow.apply(model, '{cache.made_for[0]}')), or pass no cache"
            )
        return None
    x = kwargs.get("input_ids", args[0] if args else None)
    if x is None:
        x = kwargs.get("inputs_embeds")
    if x is None:
        return None
    q_len = x.shape[1]
    if q_len == 0:
        raise ValueError("empty input: a forward needs at least one token (give a non-empty prompt)")
    mask = kwargs.get("attention_mask")
    _check_inputs(kwargs.get("input_ids", args[0] if args else None), mask, cache, x.shape[0])
    # A deep copy of a patched model carries its plan but not its configs' binding: bind them here.
    bind(all_configs(module), plan)
    spec = plan.spec
    cache = _bounded_cache(module, plan, cache, kwargs)
    if not isinstance(cache, SinkWindowCache):
        padded = isinstance(mask, torch.Tensor) and mask.ndim == 2 and not bool(mask.all())
        if padded and kwargs.get("position_ids") is None:
            kwargs["position_ids"] = token_positions(mask)[:, -q_len:].clamp(min=0)
        return args, kwargs
    if isinstance(mask, torch.Tensor) and mask.ndim != 2:
        raise ValueError("sinkwindow caches take a 2-D padding mask, not a prepared 4-D attention mask")
    step = cache.begin_step(q_len, mask, batch_size=x.shape[0], device=x.device)
    live = module.__dict__.get(HYBRID_ATTR)
    if live is not None:
        live.set(cache)
    if spec.positions == "absolute":
        last = int(step.next_pos.max()) if step.next_pos is not None else step.start + q_len
        check_positions(module, last)
    if step.model_pos is not None and (spec.positions == "cache" or kwargs.get("position_ids") is None):
        kwargs["position_ids"] = step.model_pos.expand(x.shape[0], -1)
    return args, kwargs


def _check_inputs(input_ids, mask, cache, batch: int) -> None:
    """One line for inputs the model would otherwise fail on deep inside (or silently misread)."""
    if isinstance(input_ids, torch.Tensor) and (input_ids.is_floating_point() or input_ids.is_complex()):
        raise ValueError(
            f"input_ids must be integer token ids (torch.long), got {input_ids.dtype}: pass the tokenizer's ids"
        )
    if isinstance(mask, torch.Tensor) and mask.ndim == 2 and mask.shape[0] != batch:
        raise ValueError(
            f"attention_mask has {mask.shape[0]} rows for a batch of {batch}: give one padding-mask row per sequence"
        )
    if isinstance(cache, SinkWindowCache) and cache.get_seq_length() > 0:
        held = next((layer.keys.shape[0] for layer in cache.layers if layer.is_initialized), batch)
        if held != batch:
            raise ValueError(
                f"the cache holds {held} sequences but this forward has {batch}: continue a cache with the same batch, "
                f"or start a new one (sinkwindow.make_cache(model))"
            )


def _close_forward(module, args, kwargs, output):
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    if isinstance(cache, SinkWindowCache):
        cache.end_step()
    live = module.__dict__.get(HYBRID_ATTR)
    if live is not None:
        live.set(None)
    return None

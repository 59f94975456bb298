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
import logging

from transformers import PreTrainedModel

from . import full_units
from .attention import FLEX_NAME, REQUESTABLE, attention_name, register_attention
from .attributes import BASE_CLASS_ATTR, HYBRID_ATTR, RETROFIT_ATTR
from .capability import (
    all_configs,
    base_class,
    base_of,
    check_supported,
    decoder_layers,
    dispatches_attention,
    kv_heads_of,
    native_sliding_layers,
    text_config,
)
from .hooks import install_hooks, remove_hooks
from .plan import PLAN_ATTR, AttentionPlan, bind, plan_of, unbind
from .rope import rope_for_model
from .spec import MethodSpec, parse_spec

__all__ = [
    "apply",
    "active_spec",
    "active_native_sliding",
    "base_class",
    "NATIVE_SLIDING_POLICIES",
    "shrunk_local_windows",
]

logger = logging.getLogger(__name__)

NATIVE_SLIDING_POLICIES = ("override", "keep")

# Model attributes of the context manager: what the latest apply() replaced, and the open blocks' specs.
_ENTERED_FROM_ATTR = "_sinkwindow_entered_from"
_BLOCKS_ATTR = "_sinkwindow_blocks"


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
            return base_of(type(self))._supports_default_dynamic_cache()
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
        return _new_patched, (base_of(type(self)),), self.__getstate__()

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
            self.__class__ = base_of(type(self))


_CONTEXT_CLASSES: dict[type, type] = {}


def _context_class(cls: type) -> type:
    cls = base_of(cls)
    if cls not in _CONTEXT_CLASSES:
        # The family's own name: save_pretrained writes it into config.architectures, and logs and
        # reprs should show the model, not our mixin.
        _CONTEXT_CLASSES[cls] = type(
            cls.__name__,
            (_SinkWindowContext, cls),
            {BASE_CLASS_ATTR: cls, "__qualname__": cls.__qualname__},
        )
    return _CONTEXT_CLASSES[cls]


def _new_patched(base: type) -> PreTrainedModel:
    """An empty instance of ``base``'s context class, for unpickling (its state is set after)."""
    register_attention()  # a fresh process (a worker) has not run apply: its attention names must exist
    cls = _context_class(base)
    return cls.__new__(cls)


def active_spec(model: PreTrainedModel) -> MethodSpec:
    """The spec a model currently runs (``full`` when unpatched)."""
    plan = plan_of(model)
    return plan.spec if plan else parse_spec("full")


def active_native_sliding(model: PreTrainedModel) -> str:
    """The native-sliding policy the model was patched with (``"override"`` when unpatched)."""
    plan = plan_of(model)
    return plan.native_sliding if plan else "override"


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
            cannot run it falls back to that path with one log line (``sinkwindow.runtime.flex``).

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
    if attn_implementation is not None and attn_implementation not in REQUESTABLE:
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

    cls = base_of(type(model))
    restores = current.restores if current else model.config._attn_implementation
    name = attention_name(cls, attn_implementation, restores)
    register_attention()
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
    full_units.remove(model)
    model.__dict__[HYBRID_ATTR] = None
    if full_kv_heads is not None:
        _, layers = decoder_layers(model, text_config(model).num_hidden_layers)
        modules = [next(m for m in layer.modules() if dispatches_attention(m)) for layer in layers]
        model.__dict__[HYBRID_ATTR] = full_units.install(modules, full_kv_heads, kv_heads_of(model))
    install_hooks(model)
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


def _restore(model: PreTrainedModel) -> None:
    """Undo ``apply``: hooks, hybrid wrappers, the configs' plan, the attention implementation."""
    plan = plan_of(model)
    remove_hooks(model)
    full_units.remove(model)
    unbind(all_configs(model))
    model.set_attn_implementation(plan.restores)
    model.__dict__.pop(PLAN_ATTR, None)
    model.__dict__.pop(HYBRID_ATTR, None)

"""The forward hooks a patched model carries, and the position limit they enforce.

A forward pre-hook plans each step on our cache (``SinkWindowCache.begin_step``): it hands the cache
the 2-D padding mask, and the model the ``position_ids`` it must use (real-token positions under
padding; cache positions for ``positions="cache"``). So ``model(...)`` and ``model.generate(...)``
honour padding and both position modes with no other change; a forward hook closes the step.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .attributes import HYBRID_ATTR
from .cache import SinkWindowCache
from .capability import all_configs, text_config
from .make_cache import make_cache
from .masks import token_positions
from .plan import AttentionPlan, bind, plan_of

__all__ = ["HOOKS_ATTR", "check_positions", "install_hooks", "max_positions", "remove_hooks"]

# The handles of the model's two forward hooks, kept on the model so a deep copy or an unpickled copy
# carries handles to its own hooks (torch's handles pickle and copy with their dicts).
HOOKS_ATTR = "_sinkwindow_hooks"


def install_hooks(model: PreTrainedModel) -> None:
    if HOOKS_ATTR in model.__dict__:
        return
    model.__dict__[HOOKS_ATTR] = [
        model.register_forward_pre_hook(_plan_forward, with_kwargs=True),
        model.register_forward_hook(_close_forward, with_kwargs=True),
    ]


def remove_hooks(model: PreTrainedModel) -> None:
    """Take off the two hooks ``install_hooks`` put on ``model`` (nothing when it has none)."""
    for handle in model.__dict__.pop(HOOKS_ATTR, []):
        handle.remove()


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

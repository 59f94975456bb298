"""``make_cache``: the cache a patched model's active spec needs (bounded for SWA(w, s) and evict)."""

from __future__ import annotations

import weakref

from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicCache

from .attributes import CACHE_FACTORY_ATTR
from .cache import SinkWindowCache
from .capability import kv_heads_of, native_sliding_layers, text_config
from .paged_cache import PagedFullCache, PagedSinkWindowCache
from .plan import plan_of
from .rope import rope_for_model
from .static_cache import StaticSinkWindowCache

__all__ = ["make_cache"]


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

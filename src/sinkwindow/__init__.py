"""sinkwindow: training-free sliding-window attention with attention sinks, SWA(w, s), for any
transformers 5.x causal LM, and the evaluation that shows what it costs.

    >>> import sinkwindow
    >>> model, tok = sinkwindow.load("smollm2-135m")
    >>> sinkwindow.apply(model, "swa:64:4")           # 4 sinks + 60 recent keys per query
    >>> logits, cache = sinkwindow.prefill(model, ids, chunk_size=256)
    >>> out = model.generate(ids, cache=sinkwindow.make_cache(model), max_new_tokens=32)

Importing the package has no side effects; attention implementations are registered with
transformers the first time ``apply`` runs.
"""

from ._lazy import lazy_package

__version__ = "0.1.0"

# Public names by the module that defines them; each loads on first use (see _lazy.py).
__all__ = lazy_package(
    __name__,
    {
        ".runtime.cache": ["SinkWindowCache", "SinkWindowLayer", "cache_nbytes"],
        ".runtime.generate": ["DecodeStep", "decode_speed", "generate"],
        ".models.loading": ["DEFAULT_MODEL", "PACKAGED_MODELS", "list_models", "load"],
        ".runtime.capability": ["SUPPORTED_MODEL_TYPES"],
        ".runtime.patching": ["active_spec", "apply"],
        ".runtime.make_cache": ["make_cache"],
        ".runtime.plan": ["AttentionPlan", "plan_of"],
        ".runtime.prefill": ["PrefillResult", "prefill"],
        ".runtime.spec": ["MethodSpec", "parse_spec"],
        ".runtime.static_cache": ["StaticSinkWindowCache"],
    },
)
__all__.append("__version__")

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

from .cache import SinkWindowCache, SinkWindowLayer, cache_nbytes
from .generate import DecodeStep, decode_speed, generate
from .models import DEFAULT_MODEL, PACKAGED_MODELS, list_models, load
from .patch import SUPPORTED_MODEL_TYPES, active_spec, apply, make_cache
from .prefill import PrefillResult, prefill
from .spec import MethodSpec, parse_spec
from .static_cache import StaticSinkWindowCache

__version__ = "0.1.0"

__all__ = [
    "MethodSpec",
    "parse_spec",
    "apply",
    "active_spec",
    "make_cache",
    "prefill",
    "PrefillResult",
    "load",
    "list_models",
    "SinkWindowCache",
    "SinkWindowLayer",
    "SUPPORTED_MODEL_TYPES",
    "PACKAGED_MODELS",
    "DEFAULT_MODEL",
    "__version__",
    "StaticSinkWindowCache",
    "cache_nbytes",
    "generate",
    "DecodeStep",
    "decode_speed",
]

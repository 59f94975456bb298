"""What a method must hold in memory, from the model's config alone, and what a cache holds.

The one place that counts cache bytes, in the core so that evaluation, tuning and the benchmarks
share it without importing one another:

- ``analytic_state_bytes`` / ``analytic_layer_bytes``: what a method must hold at context n, from
  the config alone (``kv_geometry``: layers, heads, KV heads, head dim).
- ``cache_nbytes``: the bytes of the storages a cache object really holds (a view that pins a
  larger buffer counts at the buffer's size, which is what memory pays); defined beside the
  caches in ``cache.py`` and re-exported here.

Measured memory (resident set, CUDA peaks) is the benchmark's: ``sinkwindow.bench.memory``.
"""

from __future__ import annotations

import torch

from .cache import cache_nbytes
from .spec import MethodSpec

__all__ = [
    "analytic_layer_bytes",
    "analytic_state_bytes",
    "cache_nbytes",
    "kv_geometry",
    "native_windows",
]


def kv_geometry(config) -> tuple[int, int, int, int]:
    """``(layers, query_heads, kv_heads, head_dim)`` of a decoder config (text config for VLMs)."""
    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, heads, kv_heads, head_dim


def native_windows(config) -> list[int | None]:
    """Per decoder layer, the model's own sliding window (Gemma 3 local layers, Mistral), else None."""
    from .capability import native_sliding_layers

    config = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    window = getattr(config, "sliding_window", None)
    return [window if sliding and window else None for sliding in native_sliding_layers(config)]


def analytic_layer_bytes(
    spec: MethodSpec,
    config,
    context: int,
    *,
    dtype: torch.dtype = torch.float32,
    batch: int = 1,
    native_sliding: str = "override",
) -> list[int]:
    """Per decoder layer, the KV bytes of ``full``, ``swa``/``evict`` or a hybrid after ``context`` tokens.

    A KV head that keeps full attention holds ``context`` keys and values; a windowed one
    ``min(context, W - 1)`` (see ``analytic_state_bytes``). A layer with a native sliding window w
    (Gemma 3's local layers) holds ``min(context, w - 1)`` under ``full`` (the unpatched model:
    transformers' sliding cache layers) and under ``native_sliding="keep"``; ``override`` (the
    default, as ``apply``) windows it by the spec like every other layer.
    """
    if not (spec.is_full or spec.is_windowed):
        raise ValueError(f"per-layer KV bytes cover full, swa and evict (and their hybrids), not {spec}")
    if native_sliding not in ("override", "keep"):
        raise ValueError(f"native_sliding is 'override' or 'keep', got {native_sliding!r}")
    layers, _, kv_heads, head_dim = kv_geometry(config)
    per_head_token = 2 * batch * head_dim * torch.empty((), dtype=dtype).element_size()
    native = native_windows(config)
    out = []
    for layer in range(layers):
        if native[layer] is not None and (spec.is_full or native_sliding == "keep"):
            out.append(per_head_token * kv_heads * min(context, native[layer] - 1))
            continue
        full = len(spec.full_kv_heads(layer, kv_heads))
        windowed = 0 if spec.is_full else min(context, spec.window - 1)
        out.append(per_head_token * (full * context + (kv_heads - full) * windowed))
    return out


def analytic_state_bytes(
    spec: MethodSpec,
    config,
    context: int,
    *,
    dtype: torch.dtype = torch.float32,
    batch: int = 1,
    native_sliding: str = "override",
) -> int:
    """Bytes of the KV cache a method must hold after ``context`` tokens, from the model config alone.

    - ``full``: n keys and values per layer; ``min(n, w - 1)`` on a layer with a native sliding
      window w (the unpatched model's cache; also under ``native_sliding="keep"``).
    - ``swa:W:S`` / ``evict:W:S``: ``min(n, W - 1)`` (the s sinks plus W - S - 1 recent keys; the
      query brings the W-th, see ``SinkWindowLayer``).
    - ``swa:W:S+full:...``: n per KV head that keeps full attention, ``min(n, W - 1)`` per other head
      (``analytic_layer_bytes``).

    The linear retrofits keep a recurrent state instead: their classes in ``sinkwindow.methods``
    count it (``method_of(spec).state_bytes``, which answers for every method).

    Args:
        spec: the method.
        config: the model's (text) config.
        context: n, tokens seen.
        dtype: dtype of cached keys/values (the model's).
        batch: rows.
        native_sliding: ``apply``'s policy for native sliding layers (``override`` or ``keep``).

    Returns:
        Bytes, summed over layers.
    """
    if not (spec.is_full or spec.is_windowed):
        raise ValueError(
            f"{spec} keeps a recurrent state, not a KV cache: count it with sinkwindow.methods.method_of(spec).state_bytes"
        )
    # One formula for key/value caches, layer by layer (hybrids, native sliding layers).
    return sum(
        analytic_layer_bytes(spec, config, context, dtype=dtype, batch=batch, native_sliding=native_sliding)
    )

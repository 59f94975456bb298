"""What runs inside a forward: the method spec, the plan a patched model carries, the masks, the
caches, the attention implementations and the class swap that puts them on a model, chunked prefill,
decoding, and the float64 reference they are all tested against.

The runtime knows nothing of evaluation, benchmarks, training, tuning, serving or the command
line (``tests/test_layering.py`` keeps it so). One concept a module:

- ``spec``: ``MethodSpec`` parsing and validation (no torch).
- ``plan``: the immutable ``AttentionPlan`` a patched model runs.
- ``patching``: ``apply``, the class-swap context (nesting, restore, pickling).
- ``attention``: the attention functions and mask builders registered with transformers.
- ``capability``: which models can be patched (``unsupported_reason``), and their decoder's shape.
- ``hooks``: the forward hooks that plan each step on the cache; the position limit.
- ``make_cache``: the cache a patched model's spec needs.
- ``masks``, ``flex``, ``full_units`` (the KV heads a hybrid spec keeps full), ``rope``.
- ``cache``, ``static_cache``: the bounded KV caches; ``kv_bytes``: what a cache holds, in bytes.
- ``prefill``, ``generate``: chunked prefill and decoding.
- ``reference``: the float64 twin, independent of everything above but ``spec``.
- ``method``: switching a model between methods (sink-window specs and the trained baselines).
- ``probe``, ``attributes``, ``threads``, ``notices``.

Importing the package imports nothing else (no torch).
"""

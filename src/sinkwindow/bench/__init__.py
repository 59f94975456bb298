"""Efficiency benchmarks (paper §4.3): decode throughput, prefill time and memory vs context.

Imports the core (``sinkwindow``); the core never imports this package.

    >>> from sinkwindow.bench import BenchConfig, run_bench, write_report
    >>> rows = run_bench(BenchConfig.quick(out="runs/bench"))
    >>> write_report(rows, "runs/bench")

Pieces, usable on their own: ``build_synthetic`` (the paper's 4-layer model), ``runner_for``
(a method's or a peer's setup and fast state fill, ``bench.peers``), ``measure_decode`` /
``measure_prefill`` (one row each),
``measure_bandwidth`` / ``weight_bytes_per_token`` (the roofline), ``PeakMemory`` (measured
memory; ``analytic_state_bytes`` (KV caches; every method: ``sinkwindow.methods.method_of(spec).state_bytes``) and ``cache_nbytes`` come from the core's ``sinkwindow.runtime.kv_bytes``),
``check_targets`` / ``write_report``.
"""

from .._lazy import lazy_package

# Public names by the module that defines them; each loads on first use (see _lazy.py).
__all__ = lazy_package(
    __name__,
    {
        "..runtime.cache": ["cache_lengths"],
        "..runtime.kv_bytes": ["analytic_state_bytes", "cache_nbytes"],
        ".decode": ["measure_decode", "measure_decode_interleaved", "measure_paired"],
        ".memory": ["PeakMemory"],
        ".methods": ["PEERS", "RUNNERS", "MethodRunner", "MethodUnavailable", "runner_for"],
        ".prefill": ["measure_prefill", "measure_prefill_interleaved"],
        ".report": ["markdown_report", "write_report"],
        ".rows": ["ROW_FIELDS", "load_rows", "validate_row"],
        ".roofline": ["measure_bandwidth", "roofline_ms", "weight_bytes_per_token"],
        ".suite": ["DEFAULT_CONTEXTS", "DEFAULT_METHODS", "DEFAULT_MODELS", "BenchConfig", "run_bench"],
        ".synthetic": ["SyntheticConfig", "build_synthetic"],
        ".targets": ["TargetBounds", "check_targets"],
    },
)

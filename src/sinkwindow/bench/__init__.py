"""Efficiency benchmarks (paper §4.3): decode throughput, prefill time and memory vs context.

Imports the core (``sinkwindow``); the core never imports this package.

    >>> from sinkwindow.bench import BenchConfig, run_bench, write_report
    >>> rows = run_bench(BenchConfig.quick(out="runs/bench"))
    >>> write_report(rows, "runs/bench")

Pieces, usable on their own: ``build_synthetic`` (the paper's 4-layer model), ``runner_for``
(a method's or a peer's setup and fast state fill, ``bench.peers``), ``measure_decode`` /
``measure_prefill`` (one row each),
``measure_bandwidth`` / ``weight_bytes_per_token`` (the roofline), ``analytic_state_bytes`` /
``cache_nbytes`` / ``PeakMemory`` (memory), ``check_targets`` / ``write_report``.
"""

from ..cache import cache_lengths, cache_nbytes
from .decode import measure_decode, measure_decode_interleaved, measure_paired
from .memory import PeakMemory, analytic_state_bytes
from .methods import PEERS, RUNNERS, MethodRunner, MethodUnavailable, runner_for
from .prefill import measure_prefill, measure_prefill_interleaved
from .report import ROW_FIELDS, check_targets, load_rows, markdown_report, validate_row, write_report
from .roofline import measure_bandwidth, roofline_ms, weight_bytes_per_token
from .suite import DEFAULT_CONTEXTS, DEFAULT_METHODS, DEFAULT_MODELS, BenchConfig, run_bench
from .synthetic import SyntheticConfig, build_synthetic

__all__ = [
    "BenchConfig",
    "run_bench",
    "DEFAULT_CONTEXTS",
    "DEFAULT_METHODS",
    "DEFAULT_MODELS",
    "SyntheticConfig",
    "build_synthetic",
    "MethodRunner",
    "MethodUnavailable",
    "RUNNERS",
    "PEERS",
    "runner_for",
    "measure_decode",
    "measure_decode_interleaved",
    "measure_paired",
    "measure_prefill",
    "measure_prefill_interleaved",
    "measure_bandwidth",
    "weight_bytes_per_token",
    "roofline_ms",
    "PeakMemory",
    "analytic_state_bytes",
    "cache_nbytes",
    "cache_lengths",
    "ROW_FIELDS",
    "validate_row",
    "load_rows",
    "check_targets",
    "markdown_report",
    "write_report",
]

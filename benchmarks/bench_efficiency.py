"""Decode throughput, prefill time and memory against context length (paper §4.3, Figure 2).

The same as ``sinkwindow bench``; run from the repository root:

    python benchmarks/bench_efficiency.py --quick --out runs/bench-quick
    python benchmarks/bench_efficiency.py --model synthetic --methods full,swa:64:4 --contexts 1K,64K

Ends stdout with one JSON line summarising the run and the efficiency targets.
"""

import sys

from sinkwindow.bench.cli import main

if __name__ == "__main__":
    sys.exit(main())

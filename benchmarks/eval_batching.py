"""Long-context evaluation throughput, one sample at a time vs a left-padded batch, in one run.

    python benchmarks/eval_batching.py --methods swa:256:4 full --lengths 1024 4096 --samples 8 \\
        --batch-size 8 --threads 1 --out benchmarks/out/eval_batching.json

For every (method, length) the same S-NIAH-2 samples run through ``run_eval`` twice, with batch size 1
and with ``--batch-size``, into fresh folders; the script reports samples/s of each, their ratio, and
whether the predictions are identical (they must be). Prints a table and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

import sinkwindow
from sinkwindow.eval.runner import EvalConfig, run_eval


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--methods", nargs="+", default=["swa:256:4", "full"])
    p.add_argument("--lengths", nargs="+", type=int, default=[1024, 4096])
    p.add_argument("--task", default="niah_single_2")
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/out/eval_batching.json")
    args = p.parse_args(argv)
    if min(args.samples, args.batch_size, args.threads) < 1:
        raise SystemExit("error: --samples, --batch-size and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    pair = sinkwindow.load(args.model)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            for length in args.lengths:
                result = {"method": method, "length": length, "samples": args.samples}
                preds = {}
                for bs in (1, args.batch_size):
                    cfg = EvalConfig(
                        model=args.model, methods=[method], tasks=[args.task], lengths=[length],
                        samples=args.samples, batch_size=bs,
                    )  # fmt: skip
                    t0 = time.perf_counter()
                    store = run_eval(
                        cfg, Path(tmp) / f"{method}-{length}-{bs}", model_and_tokenizer=pair, progress=False
                    )
                    wall = time.perf_counter() - t0
                    result[f"samples_per_s_bs{bs}"] = round(args.samples / wall, 4)
                    preds[bs] = [
                        (r["index"], r["prediction"]) for r in sorted(store.rows(), key=lambda r: r["index"])
                    ]
                result["speedup"] = round(
                    result[f"samples_per_s_bs{args.batch_size}"] / result["samples_per_s_bs1"], 2
                )
                result["identical_predictions"] = preds[1] == preds[args.batch_size]
                rows.append(result)
                print(
                    f"{method:<12} {length:>6}  bs1 {result['samples_per_s_bs1']:.3f}/s  "
                    f"bs{args.batch_size} {result[f'samples_per_s_bs{args.batch_size}']:.3f}/s  "
                    f"x{result['speedup']:.2f}  identical={result['identical_predictions']}",
                    flush=True,
                )
    out = {"model": args.model, "task": args.task, "batch_size": args.batch_size, "threads": args.threads,
           "torch": torch.__version__, "rows": rows}  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

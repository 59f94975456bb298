"""Table 1 on one model: full attention vs SWA(w, s) on the six short-context tasks, via lm-eval.

    python benchmarks/short_tasks.py --out runs/short-tasks                      # full splits
    python benchmarks/short_tasks.py --limit 500 --limit mmlu=9 --out runs/short # >= 500 items per task

Reads local copies of the six tasks from ``--data-dir`` (the files docs/data.md lists), evaluates every
(task, method) pair once on one loaded model (methods are switched with ``sinkwindow.apply``),
appends rows to ``OUT/results.jsonl`` (a rerun resumes), writes ``OUT/short_tasks.md`` and
prints the table; the last stdout line is one JSON object with the numbers.

``--limit`` counts items per task; for MMLU lm-eval applies it per subject (57 of them), so
``mmlu=9`` gives 513 questions. A limit keeps the first N items of each split, as lm-eval does.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import torch

from sinkwindow.eval.lmeval import SHORT_TASKS, recovery_table, run_lmeval, short_data_available

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "short"


def _limits(values: list[str] | None) -> dict | int | None:
    """``["500", "mmlu=9"]`` -> ``{"*": 500, "mmlu": 9}``."""
    if not values:
        return None
    out: dict[str, int] = {}
    for v in values:
        for part in v.split(","):
            task, sep, n = part.partition("=")
            out[task if sep else "*"] = int(n if sep else task)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument(
        "--methods", default="full,swa:64:4", help="comma-separated specs; full first (default: %(default)s)"
    )
    p.add_argument("--tasks", default=",".join(SHORT_TASKS))
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument(
        "--limit", action="append", help="N (every task) or task=N; repeatable (default: full splits)"
    )
    p.add_argument("--out", type=Path, default=Path("runs/short-tasks"))
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument(
        "--max-batch-tokens", type=int, default=4096, help="cap batch x prompt tokens (long MMLU prompts)"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("lm_eval", "datasets", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if not short_data_available(args.data_dir):
        print(
            f"short-task data not found in {args.data_dir} (docs/data.md lists the files it needs)",
            file=sys.stderr,
        )
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    rows = run_lmeval(
        args.model,
        [m for m in args.methods.split(",") if m],
        [t for t in args.tasks.split(",") if t],
        data_dir=args.data_dir,
        limit=_limits(args.limit),
        out_dir=args.out,
        batch_size=args.batch_size,
        max_batch_tokens=args.max_batch_tokens or None,
        device=args.device,
    )
    md, data = recovery_table(rows)
    print(md)
    summary = {
        "model": args.model,
        "out": str(args.out),
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": [
            {
                k: r.get(k)
                for k in (
                    "task",
                    "method",
                    "metric",
                    "value",
                    "stderr",
                    "n",
                    "limit",
                    "num_fewshot",
                    "seconds",
                )
            }
            for r in rows
        ],
        "table": data["models"].get(args.model),
    }
    print(json.dumps(summary, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

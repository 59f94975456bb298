"""Recompute the first samples of a committed long run with the current code and compare row by row.

A refactor of the evaluation path (task registry, decoding, scheduler, reports) must not move a
single result. This runs the reference run's own settings (seed, chunk size, decode cap, BABILong
facts, the shipped adapters) for the first ``--samples`` indices of each cell asked for, into a
fresh folder, and compares every recomputed row with the committed row of the same key: the score,
the prediction (generation tasks) or the NLL sum (perplexity, to ``--ppl-rtol``).

    python benchmarks/recheck_reference.py --methods full,swa:256:4 --lengths 512,1024 \
        --babilong-lengths 0,1024 --ppl-lengths 2048 --samples 2 --out /tmp/recheck

Prints one line per mismatch and a summary; writes ``recheck.json`` into ``--out``; exits 1 on
any mismatch or missing reference row.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from sinkwindow.eval.results import ResultsStore
from sinkwindow.eval.runner import EvalConfig, run_eval
from sinkwindow.jsonl import read_jsonl

REFERENCE = Path(__file__).parent / "results" / "2026-12-02-smollm2-long"
KEY = ("model", "task", "method", "length", "seed", "index")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", type=Path, default=REFERENCE)
    ap.add_argument("--methods", default="full,swa:256:4,evict:256:4,lolcats:256")
    ap.add_argument("--tasks", default=None, help="default: the reference run's")
    ap.add_argument("--lengths", type=_ints, default=[512, 1024])
    ap.add_argument("--babilong-lengths", type=_ints, default=[0, 1024])
    ap.add_argument("--ppl-lengths", type=_ints, default=[2048])
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--ppl-rtol", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    ref_cfg = json.loads((args.reference / "config.json").read_text())
    config = EvalConfig(
        model=ref_cfg["model"],
        methods=args.methods.split(","),
        tasks=args.tasks.split(",") if args.tasks else ref_cfg["tasks"],
        lengths=args.lengths,
        babilong_lengths=args.babilong_lengths,
        ppl_lengths=args.ppl_lengths,
        # The reference's window count: which essay windows are taken depends on how many.
        ppl_windows=ref_cfg["ppl_windows"],
        samples=args.samples,
        seed=ref_cfg["seed"],
        chunk_size=ref_cfg["chunk_size"],
        native_sliding=ref_cfg["native_sliding"],
        niah_max_new_tokens=ref_cfg["niah_max_new_tokens"],
        ppl_bucket=ref_cfg["ppl_bucket"],
        babilong_facts=ref_cfg["babilong_facts"],
        babilong_chat=ref_cfg["babilong_chat"],
        threads=args.threads,
    )
    store: ResultsStore = run_eval(config, str(args.out), progress=True)
    ref_rows, _ = read_jsonl(args.reference / "results.jsonl")
    reference = {tuple(r[k] for k in KEY): r for r in ref_rows}
    compared, mismatches, missing = 0, [], []
    for row in store.rows():
        key = tuple(row[k] for k in KEY)
        ref = reference.get(key)
        if ref is None:
            missing.append(key)
            continue
        compared += 1
        if row["task"] == "ppl":
            same = math.isclose(row["nll_sum"], ref["nll_sum"], rel_tol=args.ppl_rtol)
            what = f"nll_sum {row['nll_sum']!r} vs {ref['nll_sum']!r}"
        else:
            same = row["score"] == ref["score"] and row["prediction"] == ref["prediction"]
            what = f"score {row['score']} vs {ref['score']}, prediction {row['prediction']!r} vs {ref['prediction']!r}"
        if not same:
            mismatches.append({"key": key, "detail": what})
            print("MISMATCH", key, what)
    summary = {
        "reference": str(args.reference),
        "compared": compared,
        "mismatches": len(mismatches),
        "missing_in_reference": [list(k) for k in missing],
        "methods": config.methods,
        "lengths": {"niah": args.lengths, "babilong": args.babilong_lengths, "ppl": args.ppl_lengths},
        "samples": args.samples,
        "details": mismatches,
    }
    (args.out / "recheck.json").write_text(json.dumps(summary, indent=2, default=str))
    print(
        f"{compared} rows compared with {args.reference.name}: {len(mismatches)} differ, {len(missing)} not in it"
    )
    return 1 if mismatches or missing else 0


if __name__ == "__main__":
    sys.exit(main())

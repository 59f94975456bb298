"""Train a LoLCATs baseline on CPU and evaluate it beside SWA(w, s) and full attention.

    python benchmarks/train_lolcats.py --out runs/lolcats64-smollm2 \\
        --data "$ALPACA" \\
        --transfer-tokens 64k --finetune-tokens 64k --threads 1

Both phases resume: rerunning the command continues training where it stopped (or skips it when
done) and skips evaluation rows already in ``<out>/eval/results.jsonl``. Evaluation goes through
``sinkwindow.eval.runner`` (perplexity, S-NIAH, BABILong). Prints a table and ends with one JSON line. Not run by the unit tests.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

import sinkwindow
from sinkwindow.eval.results import ResultsStore
from sinkwindow.eval.runner import EvalConfig, run_eval
from sinkwindow.train.cli import parse_tokens
from sinkwindow.train.trainer import TrainConfig, train_baseline


def summarize(rows: list[dict]) -> dict:
    """(method, task, length) -> mean score; perplexity pooled over windows (exp of total NLL / tokens)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["method"], r["task"], r["length"])].append(r)
    out = {}
    for key, rs in sorted(groups.items()):
        if key[1] == "ppl":
            score = math.exp(sum(r["nll_sum"] for r in rs) / sum(r["n_tokens"] for r in rs))
        else:
            score = sum(r["score"] for r in rs) / len(rs)
        out["|".join(map(str, key))] = {"score": round(score, 3), "n": len(rs)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--method", default="lolcats:64")
    # docs/data.md: the alpaca-cleaned JSONL the baselines train on; "essays" needs no download.
    p.add_argument("--data", default="essays", help="training JSONL (docs/data.md), or 'essays'")
    p.add_argument("--out", default="runs/lolcats64-smollm2")
    p.add_argument("--transfer-tokens", type=parse_tokens, default=parse_tokens("64k"))
    p.add_argument("--finetune-tokens", type=parse_tokens, default=parse_tokens("64k"))
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr-finetune", type=float, default=1e-3)
    p.add_argument("--eval-every", type=int, default=32)
    p.add_argument("--val-batches", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--max-minutes", type=float, default=None, help="training time this session (resumable)")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument(
        "--compare", nargs="*", default=["full", "swa:64:4"], help="methods beside the trained one"
    )
    p.add_argument(
        "--extra-checkpoint", action="append", default=[], help="METHOD=PATH, e.g. linear=runs/linear"
    )
    p.add_argument(
        "--tasks",
        nargs="+",
        default=[
            "ppl",
            "niah_single_1",
            "niah_single_2",
            "niah_single_3",
            *(f"babilong_qa{i}" for i in range(1, 6)),
        ],
    )
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--babilong-lengths", type=int, nargs="+", default=[0, 1024, 2048])
    p.add_argument("--niah-max-new-tokens", type=int, default=None, help="default: the answer's length + 16")
    p.add_argument("--ppl-lengths", type=int, nargs="+", default=[2048])
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--ppl-windows", type=int, default=4)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument(
        "--merge-results",
        nargs="*",
        default=[],
        help="other results folders (same config) to add to the table",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(args.threads)
    spec = str(sinkwindow.parse_spec(args.method))
    out = Path(args.out)

    t0 = time.perf_counter()
    summary = None
    if not args.skip_train:
        model, tok = sinkwindow.load(args.model)
        summary = train_baseline(
            model, tok, spec, out, TrainConfig(data=args.data, transfer_tokens=args.transfer_tokens,
            finetune_tokens=args.finetune_tokens, seq_len=args.seq_len, grad_accum=args.grad_accum,
            lr_finetune=args.lr_finetune, eval_every=args.eval_every, save_every=8,
            val_batches=args.val_batches, max_minutes=args.max_minutes, model_name=args.model),
        )  # fmt: skip
        if not summary["finished"]:
            print(f"training stopped early; rerun to resume from {out}")
            print(json.dumps({"finished": False, "out": str(out)}))
            return 0
        del model
    elif (out / "summary.json").exists():
        summary = json.loads((out / "summary.json").read_text())
    train_s = time.perf_counter() - t0

    checkpoints = {spec: str(out)}
    for item in args.extra_checkpoint:
        m, _, path = item.partition("=")
        checkpoints[str(sinkwindow.parse_spec(m))] = path
    # The trained baselines first: their rows are the new ones, the references may exist elsewhere.
    methods = list(checkpoints) + [str(sinkwindow.parse_spec(m)) for m in args.compare]
    t1 = time.perf_counter()
    config = EvalConfig(
        model=args.model, methods=methods, tasks=args.tasks, lengths=args.lengths, ppl_lengths=args.ppl_lengths,
        babilong_lengths=args.babilong_lengths, samples=args.samples, ppl_windows=args.ppl_windows,
        chunk_size=args.chunk_size, checkpoints=checkpoints, niah_max_new_tokens=args.niah_max_new_tokens,
    )  # fmt: skip
    rows = run_eval(config, str(out / "eval")).rows()
    for folder in args.merge_results:
        rows += [r for r in ResultsStore(folder).rows() if r["method"] not in methods]
    table = summarize(rows)
    print(f"\n{'method':<12} {'task':<16} {'length':>6} {'score':>9} {'n':>3}")
    for key, v in table.items():
        method, task, length = key.split("|")
        print(f"{method:<12} {task:<16} {length:>6} {v['score']:>9.3f} {v['n']:>3}")
    budget = None
    if summary is not None:
        budget = {
            name: {k: st[k] for k in ("steps", "tokens", "wall_s", "first_val", "best_val")}
            for name, st in summary["stages"].items()
        }
    print(
        json.dumps(
            {
                "method": spec,
                "model": args.model,
                "data": (summary or {}).get("data"),
                "budget": budget,
                "results": table,
                "train_session_s": round(train_s, 1),
                "eval_s": round(time.perf_counter() - t1, 1),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

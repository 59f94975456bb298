"""Training throughput of the linear baselines: stage 1 (attention transfer) and stage 2 (LoRA), tokens/s.

    python benchmarks/train_speed.py --method lolcats:256 --steps 3 --threads 1 --out benchmarks/out/train_speed.json

Stage 1 is timed three ways on the same random 1,024-token chunks, in one run:

- ``fast``: ``transfer_step`` as the trainer runs it (window terms under no_grad in query blocks,
  the first w queries skipped, the linear term differentiated on its own);
- ``batched``: the previous trainer's step (commit 961e809): all layers folded into one
  ``chunk_window_linear_attn`` call with gradients through the window term, every query;
- ``reference``: ``reference_transfer_loss``, layer by layer, then backward.

The teacher forward (the frozen model, once per chunk) is timed on its own too, since it bounds what
any student-side speed-up can reach. Stage 2 runs ``lm_step`` (forward and backward to the LoRA
weights). The paths are interleaved chunk by chunk (every path runs chunk i before any runs chunk
i + 1), so load drifting on a shared machine hits them alike; the first round is a warm-up and is not
counted. Prints a table and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

import sinkwindow
from sinkwindow.linear import convert
from sinkwindow.linear.convert import get_retrofit
from sinkwindow.linear.lora import add_lora
from sinkwindow.linear.ops import chunk_window_linear_attn, repeat_kv
from sinkwindow.train.finetune import lm_step
from sinkwindow.train.transfer import (
    MSE_FACTOR,
    _stacked_features,
    collect_records,
    prepare_transfer,
    reference_transfer_loss,
    transfer_step,
)


def batched_step(model, ids) -> float:
    """The stage-1 step before the fast path: one chunk_window_linear_attn over every layer, all queries."""
    rf = get_retrofit(model)
    recs = collect_records(model, ids)
    mods = [rf.modules[r.layer] for r in recs]
    n_rep = recs[0].q.shape[1] // recs[0].k.shape[1]
    q = torch.cat([r.q for r in recs], dim=1).float()
    k = torch.cat([repeat_kv(r.k, n_rep) for r in recs], dim=1).float()
    v = torch.cat([repeat_kv(r.v, n_rep) for r in recs], dim=1).float()
    phi_q = _stacked_features([m.feature_map_q for m in mods], q)
    phi_k = _stacked_features([m.feature_map_k for m in mods], k)
    omega = torch.cat([m.window_factors.reshape(-1) for m in mods])
    o, _ = chunk_window_linear_attn(q, k, v, phi_q, phi_k, rf.variant.window, omega, scale=recs[0].scaling)
    target = torch.cat([r.target for r in recs], dim=1)
    loss = MSE_FACTOR * (o - target).square().mean()
    loss.backward()
    return float(loss)


def interleaved(paths: dict, chunks, tokens: int) -> dict:
    """Median seconds per chunk of every path, the paths taking turns on each chunk."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for i, x in enumerate(chunks):
        for name, fn in paths.items():
            t = time.perf_counter()
            fn(x)
            if i:  # the first round warms up allocators and kernels
                times[name].append(time.perf_counter() - t)
    out = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        out[name] = {"s_per_chunk": round(med, 3), "tokens_per_s": round(tokens / med, 1), "n": len(ts)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--method", default="lolcats:256")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=3, help="timed chunks per path (after one warm-up)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip", nargs="*", default=[], help="paths to leave out: batched reference finetune")
    p.add_argument("--out", default="benchmarks/out/train_speed.json")
    args = p.parse_args(argv)
    if args.steps < 1 or args.seq_len < 2 or args.threads < 1:
        raise SystemExit("error: --steps and --threads must be >= 1 and --seq-len >= 2")
    torch.set_num_threads(args.threads)

    model, _ = sinkwindow.load(args.model, dtype=torch.float32)
    convert(model, args.method)
    params = prepare_transfer(model)
    g = torch.Generator().manual_seed(0)
    chunks = [
        torch.randint(0, model.config.vocab_size, (1, args.seq_len), generator=g)
        for _ in range(args.steps + 1)
    ]

    def zero():
        for q in params:
            q.grad = None

    def teacher(x):
        with torch.no_grad():
            collect_records(model, x)

    paths = {"teacher": teacher, "fast": lambda x: (transfer_step(model, x), zero())}
    if "batched" not in args.skip and get_retrofit(model).variant.kind == "lolcats":
        paths["batched"] = lambda x: (batched_step(model, x), zero())
    if "reference" not in args.skip:
        paths["reference"] = lambda x: (reference_transfer_loss(model, x).backward(), zero())
    rows = interleaved(paths, chunks, args.seq_len)
    if "finetune" not in args.skip:
        # Stage 2 changes the model (LoRA), so it runs after the stage-1 paths.
        for q in model.parameters():
            q.requires_grad_(False)
        add_lora(model, r=8, alpha=16)
        rows.update(interleaved({"finetune": lambda x: lm_step(model, x, x.clone())}, chunks, args.seq_len))

    print(
        f"{args.model} {args.method}, {args.seq_len} tokens per chunk, {args.threads} thread(s), median of {args.steps}"
    )
    print(f"{'path':<10} {'s/chunk':>8} {'tok/s':>8}")
    for k, r in rows.items():
        print(f"{k:<10} {r['s_per_chunk']:>8.2f} {r['tokens_per_s']:>8.1f}")
    ratios = {}
    for base in ("batched", "reference"):
        if base in rows:
            ratios[f"fast_vs_{base}"] = round(rows[base]["s_per_chunk"] / rows["fast"]["s_per_chunk"], 2)
    result = {
        "model": args.model,
        "method": args.method,
        "seq_len": args.seq_len,
        "threads": args.threads,
        "torch": torch.__version__,
        "rows": rows,
        "ratios": ratios,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""SmolLM2 decode against the weights-bandwidth roofline: eager vs compiled static-cache steps, and where the time goes.

    python benchmarks/decode_roofline.py --threads 1 --out benchmarks/out/decode_roofline.json

One process, one model, in this order:

1. memory bandwidth (``bench.roofline.measure_bandwidth``: read, copy, and decode-shaped
   matrix-vector products), so the roofline is this machine's, measured now;
2. ``sinkwindow.decode_speed``: decode steps through the static ring-buffer cache, eager and
   ``torch.compile``d (inductor, fixed shapes, gpt-fast style), alternating blocks so that load drift
   hits both alike; median ms/token of each;
3. a ``torch.profiler`` table of one block of eager steps: self CPU time per op, grouped into the
   matrix products (the weights' bytes must stream through them) and everything else (the per-op
   overhead a compiled step could fuse away).

Roofline = bytes one step must read (every weight once, plus the KV cache it attends over) /
bandwidth. Prints a table; ``--out`` gets the JSON, and the last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

import sinkwindow
from sinkwindow.bench.roofline import measure_bandwidth, roofline_ms, weight_bytes_per_token
from sinkwindow.methods import method_of
from sinkwindow.runtime.generate import DecodeStep, decode_speed

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear", "aten::matmul", "aten::mv")


def profile_steps(model, spec: str, context: int, steps: int) -> dict:
    """Self CPU time per op over ``steps`` eager static-cache decode steps at ``context``."""
    from torch.profiler import ProfilerActivity, profile

    sinkwindow.apply(model, spec)
    try:
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(1, vocab, (1, context), generator=g)
        cache = sinkwindow.make_cache(model, static=True)
        sinkwindow.prefill(model, prompt, chunk_size=256, cache=cache, return_logits="none")
        step = DecodeStep(model, cache)
        feed = torch.randint(1, vocab, (1, steps + 2), generator=g)
        for i in range(2):  # warm-up
            step(feed[:, i : i + 1])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            for i in range(2, steps + 2):
                step(feed[:, i : i + 1])
            wall = time.perf_counter() - t0
    finally:
        sinkwindow.apply(model, "full")
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total_us = sum(e.self_cpu_time_total for e in events)
    ops = sorted(
        (
            {
                "op": e.key,
                "calls_per_step": e.count / steps,
                "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            }
            for e in events
        ),
        key=lambda r: -r["self_ms_per_step"],
    )
    matmul_ms = sum(r["self_ms_per_step"] for r in ops if r["op"] in MATMUL_OPS)
    return {
        "steps": steps,
        "wall_ms_per_step_profiled": wall / steps * 1e3,
        "self_ms_per_step": total_us / 1e3 / steps,
        "matmul_ms_per_step": matmul_ms,
        "ops_per_step": sum(e.count for e in events) / steps,
        "top": ops[:12],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--spec", default="swa:256:4")
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--tokens", type=int, default=48, help="timed steps per path (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--profile-steps", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--bandwidth-mib", type=int, default=1024)
    p.add_argument("--out", default="benchmarks/out/decode_roofline.json")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = sinkwindow.load(args.model, dtype=torch.float32)

    bw = measure_bandwidth(nbytes=args.bandwidth_mib * 2**20)
    weights = weight_bytes_per_token(model)
    kv = method_of(args.spec).state_bytes(model.config, args.context, dtype=torch.float32)
    roof = roofline_ms(weights + kv, bw["bandwidth_gbps"])
    t0 = time.perf_counter()
    speed = decode_speed(model, args.spec, context=args.context, tokens=args.tokens, rounds=args.rounds)
    prof = profile_steps(model, args.spec, args.context, args.profile_steps)
    gemv_ms = weights / (bw["gemv_gbps"] * 1e9) * 1e3
    res = {
        "model": args.model,
        "spec": args.spec,
        "context": args.context,
        "threads": args.threads,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "torch": torch.__version__,
        "bandwidth": bw,
        "weight_bytes": weights,
        "kv_bytes": kv,
        "roofline_ms": roof,
        "gemv_floor_ms": gemv_ms,
        "decode": speed,
        "eager_over_roofline": speed["eager_ms_per_token"] / roof,
        "compiled_over_roofline": speed["compiled_ms_per_token"] / roof,
        "profile": prof,
        "seconds": time.perf_counter() - t0,
    }
    print(
        f"{args.model} {args.spec} at {args.context} tokens, {args.threads} thread(s)\n"
        f"  bandwidth: read {bw['read_gbps']:.1f}, copy {bw['copy_gbps']:.1f}, decode-shaped gemv "
        f"{bw['gemv_gbps']:.1f} GB/s\n"
        f"  roofline: {(weights + kv) / 1e6:.0f} MB / {bw['bandwidth_gbps']:.1f} GB/s = {roof:.1f} ms/token; "
        f"the weights through gemv at its measured rate alone: {gemv_ms:.1f} ms ({gemv_ms / roof:.2f}x)\n"
        f"  eager static cache: {speed['eager_ms_per_token']:.1f} ms/token ({res['eager_over_roofline']:.2f}x roofline)\n"
        f"  compiled (inductor): {speed['compiled_ms_per_token']:.1f} ms/token ({res['compiled_over_roofline']:.2f}x; "
        f"compile {speed['compile_s']:.0f} s; speedup {speed['speedup']:.2f}x)\n"
        f"  eager profile: {prof['ops_per_step']:.0f} ops/step, matrix products {prof['matmul_ms_per_step']:.1f} of "
        f"{prof['self_ms_per_step']:.1f} ms self time per step"
    )
    for r in prof["top"][:8]:
        print(
            f"    {r['op']:<32} {r['self_ms_per_step']:7.2f} ms/step  {r['calls_per_step']:6.0f} calls/step"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(json.dumps({k: res[k] for k in ("roofline_ms", "eager_over_roofline", "compiled_over_roofline")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One trained-gate step (``calibrate --criterion gates``): the blocked gated forward against the dense reference.

    python benchmarks/gate_step.py                          # SmolLM2, 4K, swa:256:4, one thread
    python benchmarks/gate_step.py --length 2k --spec swa:320:64 --out benchmarks/out/gate_step.json

A gate step is one gated forward of a calibration-length prompt through the frozen model (every
layer's attention computed twice: its own and SWA(w, s)), the distillation loss and the backward
pass into the gates. ``tuning/gates.py`` computes it two ways: the dense reference (``block=None``,
both sides under n x n boolean masks) and the blocked path (causal side through SDPA's causal
kernel, windowed side a block of queries at a time against only the keys it can see). For each
(blocked first, so the dense one's larger peak cannot hide its own), one step is timed in
CPU-seconds and wall seconds with its peak RSS over the step (``bench.memory.PeakMemory``), and the
two steps' hidden states and gate gradients are compared. Random token ids: the cost does not
depend on which tokens they are.

Prints a table, writes JSON (``--out``) and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import sinkwindow
from sinkwindow.bench.memory import PeakMemory
from sinkwindow.cli.args import integer, size
from sinkwindow.runtime.kv_bytes import kv_geometry
from sinkwindow.tuning.gates import GATE_BLOCK, gated_forward


def step(model, ids, target, alpha0, spec, block):
    """One gate step's forward + backward: seconds (CPU, wall), peak RSS, hidden states, α grads."""
    alpha = {i: a.clone().requires_grad_() for i, a in alpha0.items()}
    with PeakMemory() as mem:
        cpu, wall = time.process_time(), time.perf_counter()
        hidden = gated_forward(model, ids, alpha, spec, block=block).float()
        loss = F.mse_loss(hidden, target) + 0.05 * torch.stack(list(alpha.values())).mean()
        loss.backward()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    grads = torch.stack([alpha[i].grad for i in sorted(alpha)])
    return {"cpu_s": round(cpu, 2), "wall_s": round(wall, 2), "peak_rss_gib": round(mem.peak_rss / 2**30, 2),
            "rss_scope": mem.rss_scope}, hidden.detach(), grads  # fmt: skip


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--length", type=size(2, what="--length"), default=4096, help="prompt tokens (4k = 4096)")
    ap.add_argument("--spec", default="swa:256:4", help="the streaming side, swa:W:S")
    ap.add_argument("--block", type=integer(1, what="--block"), default=GATE_BLOCK,
                    help="queries per block of the blocked path")  # fmt: skip
    ap.add_argument("--threads", type=integer(1, 4096, what="--threads"), default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, _ = sinkwindow.load(args.model)
    for p in model.parameters():
        p.requires_grad_(False)
    n_layers, _, kv_heads, _ = kv_geometry(model.config)
    ids = torch.randint(
        0, model.config.vocab_size, (1, args.length), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        target = model(ids, use_cache=False, output_hidden_states=True).hidden_states[-1].float()
    alpha0 = {i: torch.rand(kv_heads, generator=torch.Generator().manual_seed(i)) for i in range(n_layers)}
    runs, outs = {}, {}
    for name, block in (("blocked", args.block), ("dense", None)):
        runs[name], *outs[name] = step(model, ids, target, alpha0, args.spec, block)
        print(f"{name:8s} {runs[name]['cpu_s']:8.1f} CPU-s {runs[name]['wall_s']:8.1f} s "
              f"peak RSS {runs[name]['peak_rss_gib']:6.2f} GiB ({runs[name]['rss_scope']})", flush=True)  # fmt: skip
    (hb, gb), (hd, gd) = outs["blocked"], outs["dense"]
    result = {
        "model": args.model, "length": args.length, "spec": args.spec, "block": args.block,
        "threads": args.threads, "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__, "runs": runs,
        "speedup_cpu": round(runs["dense"]["cpu_s"] / runs["blocked"]["cpu_s"], 2),
        "max_abs_hidden_diff": float((hb - hd).abs().max()),
        "max_rel_grad_diff": float((gb - gd).abs().max() / gd.abs().max()),
    }  # fmt: skip
    print(f"dense / blocked: {result['speedup_cpu']}x CPU; hidden states differ by at most "
          f"{result['max_abs_hidden_diff']:.2e}, gate gradients by {result['max_rel_grad_diff']:.2e} of their largest")  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

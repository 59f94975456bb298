"""Train the retrofits at the paper's budget on a lent GPU, in one command of at most 10 minutes.

LoLCATs trains 20M tokens of attention transfer and 20M of LoRA; Liger 20M of LoRA (docs/linear.md).
On this CPU that is weeks; on one H200 it fits a single device call. The script runs
``sinkwindow train`` for each method (resumable, ``--device cuda``, larger micro-batches at the
same tokens per optimiser step), splits the wall-clock budget between them by tokens, and copies
what a later session needs back into ``--out``, one archive per method (the device returns at
most 8 files): the finished adapter (``model.safetensors``), or the last step and its trainer
state to resume from, plus ``config.json``, ``summary.json`` and the logs.

On the device (nothing can be downloaded there: carry the wheels, the data and the model, whose
GGUF travels in parts under the 64 MiB limit)::

    pip install --no-index --no-deps carry/wheels/*.whl   # transformers >= 5.20, gguf, peft
    PYTHONUNBUFFERED=1 python benchmarks/gpu_paper_budget.py --gguf-parts 'carry/smollm2.gguf.part*' \\
        --data carry/alpaca.jsonl --minutes 8.5 --out $OUT

Then, here: unpack ``<method>.tar`` into a run folder (``tar -xf liger-256.tar -C runs/liger-gpu``);
``benchmarks/export_adapter.py --run runs/liger-gpu ...`` ships a finished one, and an unfinished one
resumes from the same folder with the same command (on the GPU, or here). ``--smoke`` runs the whole script on the
CPU with budgets of a few steps (what its test does).
"""

from __future__ import annotations

import argparse
import glob
import json
import shutil
import sys
import tarfile
import time
from pathlib import Path

PAPER_TOKENS = 20_000_000
# (method, stage-1 tokens, stage-2 tokens) at the paper's budget.
RUNS = {"liger:256": (0, PAPER_TOKENS), "lolcats:256": (PAPER_TOKENS, PAPER_TOKENS)}
# Kept from each run for the way back (the device returns files at most two folders down).
KEEP = ("summary.json", "config.json", "model.safetensors")
KEEP_STAGE = ("log.jsonl", "last.safetensors", "trainer.pt")


def assemble_gguf(pattern: str, into: Path) -> Path:
    """Concatenate the parts matching ``pattern`` (sorted by name) into one ``.gguf``."""
    parts = sorted(glob.glob(pattern))
    if not parts:
        raise SystemExit(f"no GGUF parts match {pattern!r}")
    into.parent.mkdir(parents=True, exist_ok=True)
    with into.open("wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, out)
    return into


def train_one(method: str, tokens: tuple[int, int], args, model: str, minutes: float, work: Path) -> dict:
    """One ``sinkwindow train`` run into ``work/<method>``; its summary (or the reason it failed)."""
    from sinkwindow.cli import main as sinkwindow

    transfer, finetune = tokens
    run = work / method.replace(":", "-")
    argv = ["train", "--model", model, "--method", method, "--data", args.data, "--device", args.device,
            "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
            "--grad-accum", str(args.grad_accum), "--eval-every", str(args.eval_every),
            "--val-batches", str(args.val_batches), "--max-minutes", f"{minutes:.2f}",
            "--finetune-tokens", str(finetune), "--no-progress", "--out", str(run)]  # fmt: skip
    if transfer:
        argv += ["--transfer-tokens", str(transfer)]
    t0 = time.perf_counter()
    code = sinkwindow(argv)
    summary_path = run / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return {"method": method, "exit": code, "seconds": round(time.perf_counter() - t0, 1), "run": str(run),
            "finished": summary.get("finished"), "stages": summary.get("stages", {})}  # fmt: skip


def bring_back(run: Path, out: Path) -> list[str]:
    """Pack what a later session needs from ``run`` into ``out/<run name>.tar`` (the device returns
    at most 8 files); the archive keeps the run folder's layout, so it unpacks into one."""
    names = [n for n in KEEP if (run / n).exists()]
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    for stage in ("transfer", "finetune"):
        for n in KEEP_STAGE:
            # A finished run's adapter is model.safetensors: its stage checkpoints stay behind.
            if summary.get("finished") and n != "log.jsonl":
                continue
            if (run / stage / n).exists():
                names.append(f"{stage}/{n}")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / f"{run.name}.tar", "w") as tar:
        for n in names:
            tar.add(run / n, arcname=n)
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", default="smollm2-135m", help="a model sinkwindow.load takes (default: %(default)s)"
    )
    ap.add_argument(
        "--gguf-parts", default=None, help="glob of a GGUF's parts, joined in name order (overrides --model)"
    )
    ap.add_argument("--data", required=True, help="the training JSONL (Alpaca), carried to the device")
    ap.add_argument("--methods", default=",".join(RUNS), help="default: %(default)s")
    ap.add_argument(
        "--minutes", type=float, default=8.5, help="wall-clock budget for all runs (default: %(default)s)"
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=8, help="chunks per micro-batch (default: %(default)s)")
    ap.add_argument(
        "--grad-accum", type=int, default=1, help="8 x 1 = LoLCATs' 8 chunks per step (default: %(default)s)"
    )
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--val-batches", type=int, default=20)
    ap.add_argument(
        "--smoke", action="store_true", help="a few steps of each stage, on --device cpu, to test the script"
    )
    ap.add_argument("--out", type=Path, required=True, help="the folder that comes back ($OUT on the device)")
    args = ap.parse_args(argv)

    work = Path("/tmp/sinkwindow-gpu-train") if not args.smoke else args.out / "_work"
    model = str(assemble_gguf(args.gguf_parts, work / "model.gguf")) if args.gguf_parts else args.model
    methods = [m for m in args.methods.split(",") if m]
    budgets = {}
    for m in methods:
        # Another window of the same method trains at the same budget (the smoke test's small ones).
        transfer, finetune = RUNS.get(m) or RUNS["liger:256" if m.startswith("liger") else "lolcats:256"]
        if args.smoke:  # two optimiser steps per stage
            step = args.seq_len * args.batch_size * args.grad_accum
            transfer, finetune = (2 * step if transfer else 0), 2 * step
        budgets[m] = (transfer, finetune)
    total = sum(t + f for t, f in budgets.values())
    t_start, report = time.perf_counter(), {"model": model, "device": args.device, "runs": []}
    for m in methods:
        spent = (time.perf_counter() - t_start) / 60
        left_tokens = sum(
            t + f for mm, (t, f) in budgets.items() if mm not in [r["method"] for r in report["runs"]]
        )
        # The time left, shared by the runs left in proportion to their tokens.
        minutes = max(0.5, (args.minutes - spent) * sum(budgets[m]) / max(left_tokens, 1))
        result = train_one(m, budgets[m], args, model, minutes, work)
        result["returned"] = bring_back(Path(result["run"]), args.out)
        report["runs"].append(result)
        print(json.dumps(result), flush=True)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    report["tokens_asked"] = total
    (args.out / "gpu_report.json").write_text(json.dumps(report, indent=2))
    print(
        json.dumps({"out": str(args.out), "finished": [r["method"] for r in report["runs"] if r["finished"]]})
    )
    return 0 if all(r["exit"] == 0 for r in report["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())

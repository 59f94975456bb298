"""Validation cross-entropy of trained checkpoints on a larger held-out set than they were chosen on.

A run keeps the checkpoint with the best validation loss; when that loss came from 4 chunks, the
best-vs-final gap can be noise. This recomputes the loss of any checkpoints of one method on the
first ``--val-chunks`` validation chunks of the training data, packed exactly as the trainer packs
them (``train.data.load_training_data``: the same rows, seed and sequence length), batch 1, so the
first rows of a longer validation set are the shorter one's and a number here equals the trainer's
on the same chunks (a run validated on 20 chunks reproduces its logged loss).

    python benchmarks/revalidate.py --method lolcats:256 --data "$ALPACA" --val-chunks 20 \\
        --checkpoint best=src/sinkwindow/linear/adapters/smollm2-135m--lolcats256.safetensors \\
        --checkpoint last=/tmp/lolcats-last.safetensors --out benchmarks/results/<date>-revalidate/lolcats.json

Prints one line per checkpoint and ends with one JSON line; ``--out`` also writes that JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import sinkwindow
from sinkwindow.linear.adapters import file_sha256
from sinkwindow.train.data import load_training_data
from sinkwindow.train.finetune import lm_step


def _named(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=PATH, e.g. best=run/finetune/best.safetensors")
    return name, path


@torch.no_grad()
def val_loss(model, data, chunks: int) -> float:
    """Mean next-token loss over the first ``chunks`` validation chunks, one at a time (the trainer's)."""
    model.eval()
    n = min(chunks, len(data.val_ids))
    losses = [
        lm_step(model, data.val_ids[i : i + 1], data.val_labels[i : i + 1], backward=False)["loss"]
        for i in range(n)
    ]
    return sum(losses) / len(losses)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--method", required=True, help="the checkpoints' spec, e.g. lolcats:256")
    p.add_argument("--data", required=True, help="the training JSONL the run used (docs/data.md)")
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--val-chunks", type=int, default=20)
    p.add_argument("--checkpoint", type=_named, action="append", required=True, metavar="NAME=PATH")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    record = {"model": args.model, "method": args.method, "val_chunks": args.val_chunks, "seq_len": args.seq_len,
              "data": Path(args.data).name, "data_sha256": file_sha256(args.data), "checkpoints": {}}  # fmt: skip
    data = None
    for name, path in args.checkpoint:
        t0 = time.perf_counter()
        model, tok = sinkwindow.load(args.model, method=args.method, checkpoint=path)
        if data is None:
            data = load_training_data(tok, args.data, seq_len=args.seq_len, max_train_tokens=args.seq_len,
                                      val_chunks=args.val_chunks)  # fmt: skip
        loss = val_loss(model, data, args.val_chunks)
        record["checkpoints"][name] = {"file": Path(path).name, "sha256": file_sha256(path), "val_loss": loss}
        print(f"{name}: {loss:.4f} on {min(args.val_chunks, len(data.val_ids))} chunks ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr)  # fmt: skip
        del model
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())

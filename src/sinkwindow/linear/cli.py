"""``sinkwindow train``: convert a model to a linear-attention baseline and train it in two stages.

    sinkwindow train --model smollm2-135m --method lolcats:64 --tokens 1M --out runs/lolcats64
    sinkwindow train ... --data ../shared/data/alpaca/alpaca_cleaned_partial_20230323.jsonl
    sinkwindow train ... --max-minutes 60      # stop resumably; rerun the same command to continue

The trained baseline is then a method like any other:
``sinkwindow generate --method lolcats:64 --checkpoint runs/lolcats64 --prompt ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import re

from ..models import add_model_argument

__all__ = ["parse_tokens", "register"]

# LoLCATs' GPU recipe: 2 epochs of ~10M Alpaca tokens per stage (LINEAR.md §6).
PAPER_TOKENS = 20_000_000


def parse_tokens(text: str) -> int:
    """``"1M"``, ``"500k"``, ``"2.5M"``, ``"100000"`` -> tokens."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgG]?)\s*", str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"not a token count: {text!r} (e.g. 500k, 1M, 2.5M)")
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def _cmd_train(args: argparse.Namespace) -> int:
    import torch

    import sinkwindow

    from ..spec import parse_spec
    from .trainer import train_baseline

    spec = parse_spec(args.method)
    if not spec.is_linear:
        raise ValueError(f"sinkwindow train trains the linear baselines (lolcats:W, linear), not {spec}")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.paper_budget:
        transfer, finetune = PAPER_TOKENS, PAPER_TOKENS
    else:
        # --tokens is the whole budget, split 1:2 like LINEAR.md's CPU defaults (1-2M / 2-5M).
        transfer = args.transfer_tokens if args.transfer_tokens is not None else args.tokens // 3
        finetune = (
            args.finetune_tokens if args.finetune_tokens is not None else args.tokens - args.tokens // 3
        )
    if args.no_finetune:
        finetune = 0
    out = args.out or f"runs/{args.model.replace('/', '_')}-{str(spec).replace(':', '')}"
    model, tok = sinkwindow.load(args.model, dtype=torch.float32)
    logging.getLogger(__name__).info("training %s: %d + %d tokens into %s", spec, transfer, finetune, out)
    summary = train_baseline(
        model,
        tok,
        str(spec),
        out,
        data=args.data,
        transfer_tokens=transfer,
        finetune_tokens=finetune,
        seq_len=args.seq_len,
        grad_accum=args.grad_accum,
        lr_transfer=args.lr_transfer,
        lr_finetune=args.lr_finetune,
        eval_every=args.eval_every,
        save_every=args.save_every,
        val_batches=args.val_batches,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        layer_group=args.layer_group,
        max_minutes=args.max_minutes,
        resume=not args.restart,
        progress=not args.no_progress,
        convert_options={"affine": args.affine, "init": args.init, "feature_map": args.feature_map},
        model_name=args.model,
    )
    if summary["finished"]:
        print(f"trained {spec}: checkpoint {summary['checkpoint']}")
        print(
            f"use it: sinkwindow generate --model {args.model} --method {spec} --checkpoint {out} --prompt '...'"
        )
    else:
        print(f"stopped after --max-minutes; rerun the same command to resume from {out}")
    print(json.dumps(summary))
    return 0


def register(subparsers) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="train a linear-attention baseline (lolcats:W, linear): attention transfer, then LoRA",
        description="Convert a model to a linear-attention baseline and train it: stage 1 attention transfer "
        "(feature maps + window factors, MSE to the softmax outputs), stage 2 LoRA on q/k/v/o (next-token loss). "
        "Resumable: rerun the same command to continue.",
    )
    add_model_argument(p)
    p.add_argument("--method", default="lolcats:64", help="lolcats:W or linear (default: %(default)s)")
    p.add_argument(
        "--tokens",
        type=parse_tokens,
        default=parse_tokens("1M"),
        help="total training tokens, split 1:2 between the stages (default: 1M)",
    )
    p.add_argument(
        "--transfer-tokens", type=parse_tokens, default=None, help="stage-1 tokens (overrides the split)"
    )
    p.add_argument(
        "--finetune-tokens", type=parse_tokens, default=None, help="stage-2 tokens (overrides the split)"
    )
    p.add_argument("--no-finetune", action="store_true", help="stage 1 only (attention transfer)")
    p.add_argument("--paper-budget", action="store_true", help="LoLCATs' GPU budget: 20M tokens per stage")
    p.add_argument(
        "--data",
        default="essays",
        help="JSONL (Alpaca instruction/input/output, prompt/completion or text), .txt, or 'essays' (offline default)",
    )
    p.add_argument("--out", default=None, help="run folder (default: runs/<model>-<method>)")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per packed chunk (default: %(default)s)")
    p.add_argument(
        "--grad-accum", type=int, default=8, help="chunks per optimiser step (default: %(default)s)"
    )
    p.add_argument(
        "--lr-transfer", type=float, default=1e-2, help="stage-1 learning rate (default: %(default)s)"
    )
    p.add_argument(
        "--lr-finetune", type=float, default=1e-4, help="stage-2 learning rate (default: %(default)s)"
    )
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16)
    p.add_argument(
        "--eval-every",
        type=int,
        default=100,
        help="optimiser steps between validations (default: %(default)s)",
    )
    p.add_argument(
        "--save-every",
        type=int,
        default=10,
        help="optimiser steps between resumable saves (default: %(default)s)",
    )
    p.add_argument("--val-batches", type=int, default=8, help="validation chunks (default: %(default)s)")
    p.add_argument(
        "--layer-group", type=int, default=None, help="stage 1: layers per batched kernel call (default: all)"
    )
    p.add_argument(
        "--feature-map", default="hedgehog", help="hedgehog | hedgehog_exp | t2r (default: %(default)s)"
    )
    p.add_argument(
        "--init", default="identity", help="feature-map init: identity | kaiming (default: %(default)s)"
    )
    p.add_argument("--affine", action="store_true", help="λ = 1 − γ instead of 1")
    p.add_argument("--max-minutes", type=float, default=None, help="stop resumably after this many minutes")
    p.add_argument("--restart", action="store_true", help="ignore an existing run in --out and start over")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_train)

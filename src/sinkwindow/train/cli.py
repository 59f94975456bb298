"""``sinkwindow train``: convert a model to a linear-attention baseline and train it in two stages.

    sinkwindow train --model smollm2-135m --method lolcats:64 --tokens 1M --out runs/lolcats64
    sinkwindow train ... --data alpaca_cleaned.jsonl   # instruction/input/output rows
    sinkwindow train ... --max-minutes 60      # stop resumably; rerun the same command to continue

The trained baseline is then a method like any other:
``sinkwindow generate --method lolcats:64 --checkpoint runs/lolcats64 --prompt ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from ..cli import args as cli_args
from ..models import resolve
from ..runtime.threads import set_threads
from .plateau import describe

__all__ = ["parse_tokens", "register", "FEATURE_MAP_NAMES"]

# LoLCATs' GPU recipe: 2 epochs of ~10M Alpaca tokens per stage (docs/linear.md §6). Exact, not "20M":
# sizes mean k = 1024 here, as everywhere in the CLI.
PAPER_TOKENS = 20_000_000
# = feature_maps.FEATURE_MAPS' keys (a test keeps them equal; that module imports torch).
FEATURE_MAP_NAMES = ("hedgehog", "hedgehog_exp", "t2r")

# A token count, k = 1024 and M = 1024**2 like every size of the CLI: "1M" is 1,048,576 tokens.
# (Before the shared vocabulary it meant 10**6 here; write 1000000 to get that exact budget.)
parse_tokens = cli_args.size(0, what="token count")
DEFAULT_TOKENS = 2**20  # --tokens when not given: 1M


def _data_source(text: str) -> str:
    """``--data``: ``essays`` or a file that exists."""
    if str(text).strip() == "essays":
        return "essays"
    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(
            f"training data {path} {'is a folder' if path.is_dir() else 'not found'}: give a .jsonl/.json/.txt file, or essays"
        )
    return str(path)


def _checkpoint_file(text: str) -> str:
    """``--start-from``: a ``.safetensors`` file or a folder holding one, checked before any model loads."""
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"no checkpoint at {path}")
    return str(path)


def _cmd_train(args: argparse.Namespace) -> int:
    import torch

    import sinkwindow

    from ..runtime.spec import parse_spec
    from .trainer import train_baseline

    spec = parse_spec(args.method)
    set_threads(args.threads)
    transfer, finetune = _stage_budgets(args, str(spec))
    if args.start_from is not None:
        _check_start_from(args.start_from)
    out = args.out or f"runs/{args.model.replace('/', '_')}-{str(spec).replace(':', '')}"
    device = resolve.resolve_device(args.device)  # the trainer follows the model's device
    model, tok = sinkwindow.load(args.model, dtype=torch.float32, device=device)
    logging.getLogger(__name__).info("training %s: %d + %d tokens into %s", spec, transfer, finetune, out)
    summary = train_baseline(model, tok, str(spec), out, _train_config(args, transfer, finetune))
    _say_how_it_ended(summary, args, str(spec), out)
    return 0


def _stage_budgets(args: argparse.Namespace, spec: str) -> tuple[int, int]:
    """``(stage-1 tokens, stage-2 tokens)`` from the budget flags; flags that another flag would
    override in silence are refused instead."""
    from .trainer import recipe_for

    single_stage = recipe_for(spec).stages == ("finetune",)
    given = [f for f, v in (("--tokens", args.tokens), ("--transfer-tokens", args.transfer_tokens),
                            ("--finetune-tokens", args.finetune_tokens)) if v is not None]  # fmt: skip
    if args.paper_budget and given:
        raise ValueError(
            f"--paper-budget sets the token budget itself: drop {', '.join(given)}, or --paper-budget"
        )
    if args.no_finetune and args.finetune_tokens is not None:
        raise ValueError(
            "--no-finetune skips stage 2, so --finetune-tokens would not be used: drop one of them"
        )
    if single_stage and args.transfer_tokens is not None:
        raise ValueError(f"{spec} has no attention-transfer stage (one LoRA stage): drop --transfer-tokens")
    if args.no_finetune and args.lr_finetune_drop_at is not None:
        raise ValueError(
            "--no-finetune skips stage 2, so --lr-finetune-drop-at would not be used: drop one of them"
        )
    if single_stage and args.lr_transfer_drop_at is not None:
        raise ValueError(
            f"{spec} has no attention-transfer stage (one LoRA stage): drop --lr-transfer-drop-at"
        )
    if single_stage and args.no_finetune:
        raise ValueError(
            f"{spec} trains in its one LoRA stage only: --no-finetune would leave nothing to train"
        )
    tokens = DEFAULT_TOKENS if args.tokens is None else args.tokens
    if args.paper_budget:
        transfer, finetune = (0 if single_stage else PAPER_TOKENS), PAPER_TOKENS
    elif single_stage:
        # Liger has no attention transfer: the whole budget goes to its one LoRA stage.
        transfer = 0
        finetune = args.finetune_tokens if args.finetune_tokens is not None else tokens
    else:
        # --tokens is the whole budget, split 1:2 like the CPU defaults of docs/linear.md §6 (1-2M / 2-5M).
        transfer = args.transfer_tokens if args.transfer_tokens is not None else tokens // 3
        finetune = args.finetune_tokens if args.finetune_tokens is not None else tokens - tokens // 3
    if args.no_finetune:
        finetune = 0
    if transfer + finetune == 0:
        raise ValueError("nothing to train: give --tokens, --transfer-tokens or --finetune-tokens above 0")
    return transfer, finetune


def _check_start_from(path: str) -> None:
    """Before the model loads and the run folder exists: a finished run's file holds LoRA."""
    from ..linear.checkpoint import read_metadata

    if read_metadata(path).get("lora"):
        raise ValueError(
            f"--start-from {path} holds LoRA adapters (a finished run): give a stage-1 checkpoint, "
            f"a run's transfer/best.safetensors"
        )


def _train_config(args: argparse.Namespace, transfer: int, finetune: int):
    from .trainer import TrainConfig

    return TrainConfig(
        data=args.data,
        transfer_tokens=transfer,
        finetune_tokens=finetune,
        seq_len=args.seq_len,
        grad_accum=args.grad_accum,
        batch_size=args.batch_size,
        gradient_checkpointing=args.gradient_checkpointing,
        lr_transfer=args.lr_transfer,
        lr_finetune=args.lr_finetune,
        lr_transfer_drop_at=args.lr_transfer_drop_at,
        lr_finetune_drop_at=args.lr_finetune_drop_at,
        eval_every=args.eval_every,
        save_every=args.save_every,
        val_batches=args.val_batches,
        lora_r=args.lora_r,
        lora_alpha=args.lora_alpha,
        layer_group=args.layer_group,
        max_minutes=args.max_minutes,
        resume=not args.no_resume,
        progress=not args.no_progress,
        convert_options={"affine": args.affine, "init": args.init, "feature_map": args.feature_map},
        model_name=args.model,
        start_from=args.start_from,
    )


def _say_how_it_ended(summary: dict, args: argparse.Namespace, spec: str, out: str) -> None:
    """The curves, the checkpoint and how to use it (or how to resume), then the summary as JSON."""
    try:
        from .curves import plot_curves

        curves = plot_curves(out)
    except ImportError as err:  # matplotlib is an extra; the checkpoint matters more than the plot
        logging.getLogger(__name__).warning("no curves.png: %s (pip install 'sinkwindow[eval]')", err)
    else:
        if curves is not None:
            print(f"loss curves: {curves}")
    for stage, result in summary["stages"].items():
        judged = result.get("plateau")
        if judged:
            print(f"{stage}, {describe(judged)}")
    if summary["finished"]:
        print(f"trained {spec}: checkpoint {summary['checkpoint']}")
        print(
            f"use it: sinkwindow generate --model {args.model} --method {spec} --checkpoint {out} --prompt '...'"
        )
    else:
        print(
            f"stopped (--max-minutes or a signal) with the last finished step saved; rerun the same command to resume from {out}"
        )
    print(json.dumps(summary))


def register(subparsers) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train",
        help="train a linear-attention baseline (lolcats:W, linear: attention transfer, then LoRA; liger:W: LoRA only)",
        description="Convert a model to a linear-attention baseline and train it: stage 1 attention transfer "
        "(feature maps + window factors, MSE to the softmax outputs), stage 2 LoRA on q/k/v/o (next-token loss). "
        "Resumable: rerun the same command to continue.",
    )
    cli_args.add_model(p)
    cli_args.add_method(
        p,
        "lolcats:64",
        kind=cli_args.linear_method,
        help="lolcats:W, liger:W or linear (default: %(default)s)",
    )
    _add_budget_flags(p)
    _add_optimiser_flags(p)
    _add_stage1_flags(p)
    cli_args.add_out(p, help="run folder (default: runs/<model>-<method>)")
    p.add_argument(
        "--max-minutes",
        type=cli_args.real(0, what="--max-minutes"),
        default=None,
        help="stop resumably after this many minutes",
    )
    cli_args.add_no_resume(p, "--restart", help="ignore an existing run in --out and start over")
    cli_args.add_device(p)
    cli_args.add_threads(p)
    cli_args.add_no_progress(p)
    p.set_defaults(func=_cmd_train)


def _add_budget_flags(p: argparse.ArgumentParser) -> None:
    """What the run trains on, and how much: tokens per stage, data source, chunk length."""
    g = p.add_argument_group("data and token budget")
    g.add_argument(
        "--tokens",
        type=cli_args.size(1, what="--tokens"),
        default=None,
        help=f"total training tokens, split 1:2 between the stages; {cli_args.SIZE_HELP}, so 1M = 1,048,576 "
        "(default: 1M)",
    )
    g.add_argument(
        "--transfer-tokens", type=parse_tokens, default=None, help="stage-1 tokens (overrides the split)"
    )
    g.add_argument(
        "--finetune-tokens", type=parse_tokens, default=None, help="stage-2 tokens (overrides the split)"
    )
    g.add_argument("--no-finetune", action="store_true", help="stage 1 only (attention transfer)")
    g.add_argument(
        "--paper-budget", action="store_true", help="LoLCATs' GPU budget: 20,000,000 tokens per stage"
    )
    g.add_argument(
        "--data",
        type=_data_source,
        default="essays",
        help="JSONL (Alpaca instruction/input/output, prompt/completion or text), .txt, or 'essays' (offline default)",
    )
    g.add_argument(
        "--seq-len",
        type=cli_args.integer(2, what="--seq-len"),
        default=1024,
        help="tokens per packed chunk (default: %(default)s)",
    )


def _add_optimiser_flags(p: argparse.ArgumentParser) -> None:
    """Steps, learning rates, LoRA, validation and saves."""
    g = p.add_argument_group("optimisation")
    g.add_argument(
        "--batch-size",
        type=cli_args.integer(1, what="--batch-size"),
        default=1,
        help="chunks per micro-batch; a GPU takes more (default: %(default)s, as LoLCATs)",
    )
    g.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="stage 2 recomputes each decoder layer's forward in the backward pass instead of keeping its "
        "activations: far less memory on long chunks (a LoRA step at 4,096 tokens passed 18 GB without it), "
        "about a third more compute, the same losses",
    )
    g.add_argument(
        "--grad-accum",
        type=cli_args.integer(1, what="--grad-accum"),
        default=8,
        help="chunks per optimiser step (default: %(default)s)",
    )
    g.add_argument(
        "--lr-transfer",
        type=cli_args.real(0, what="--lr-transfer"),
        default=1e-2,
        help="stage-1 learning rate (default: %(default)s)",
    )
    g.add_argument(
        "--lr-finetune",
        type=cli_args.real(0, what="--lr-finetune"),
        default=None,
        help="LoRA-stage learning rate (default: the method's recipe, 1e-4 for lolcats/linear, 1e-3 for liger)",
    )
    for stage, what in (("transfer", "stage-1"), ("finetune", "LoRA-stage")):
        g.add_argument(
            f"--lr-{stage}-drop-at",
            type=cli_args.integer(1, what=f"--lr-{stage}-drop-at"),
            default=None,
            metavar="STEP",
            help=f"cut the {what} learning rate once, by the plateau schedule's factor (0.1), from this "
            "optimiser step on: for a run whose validation still falls too slowly at a constant rate "
            "for the schedule to fire; a resumed run must repeat it (default: the schedule alone)",
        )
    g.add_argument("--lora-r", type=cli_args.integer(1, what="--lora-r"), default=8)
    g.add_argument(
        "--lora-alpha",
        type=cli_args.real(0, what="--lora-alpha"),
        default=None,
        help="LoRA alpha (default: the method's recipe, 16 for lolcats/linear, 8 for liger)",
    )
    g.add_argument(
        "--eval-every",
        type=cli_args.integer(1, what="--eval-every"),
        default=100,
        help="optimiser steps between validations (default: %(default)s)",
    )
    g.add_argument(
        "--save-every",
        type=cli_args.integer(1, what="--save-every"),
        default=10,
        help="optimiser steps between resumable saves (default: %(default)s)",
    )
    g.add_argument(
        "--val-batches",
        type=cli_args.integer(1, what="--val-batches"),
        default=8,
        help="validation chunks (default: %(default)s)",
    )


def _add_stage1_flags(p: argparse.ArgumentParser) -> None:
    """The feature maps' form and initialisation, and where stage 1 starts from."""
    g = p.add_argument_group("stage 1 (attention transfer)")
    g.add_argument(
        "--layer-group",
        type=cli_args.integer(1, what="--layer-group"),
        default=None,
        help="stage 1: layers per batched kernel call (default: all)",
    )
    g.add_argument(
        "--feature-map", choices=FEATURE_MAP_NAMES, default="hedgehog", help="default: %(default)s"
    )
    g.add_argument(
        "--init",
        choices=("identity", "kaiming"),
        default="identity",
        help="feature-map init (default: %(default)s)",
    )
    g.add_argument("--affine", action="store_true", help="λ = 1 − γ instead of 1")
    g.add_argument(
        "--start-from",
        type=_checkpoint_file,
        default=None,
        help="a stage-1 checkpoint (transfer/best.safetensors of another run) to start from instead of the "
        "initialisation, e.g. to continue the paper recipe's attention transfer on longer --seq-len",
    )

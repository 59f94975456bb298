"""Export a finished training run as an adapter shipped with the package, with its provenance.

    python benchmarks/export_adapter.py --run benchmarks/training/lolcats256-smollm2 \\
        --model smollm2-135m --method lolcats:256 --command "sinkwindow train ..." \\
        --label "the paper's recipe: 1,024-token chunks, ..."

Writes ``src/sinkwindow/linear/adapters/<model>--<spec>.safetensors`` (the run's retrofit tensors:
feature maps, window factors, LoRA; nothing of the base model) and ``.json`` beside it: the data
file and its sha256, token budgets, steps, seed, validation losses, the training command, the
sinkwindow commit, the file's sha256, and logits on a fixed prompt so that a test can prove the
shipped file still reproduces what was exported. Prints the provenance and ends with one JSON line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

import sinkwindow
from sinkwindow.linear.adapters import (
    ADAPTER_DIR,
    PACKAGE_BUDGET_BYTES,
    adapter_stem,
    file_sha256,
    probe_logits,
    verify_adapter,
)
from sinkwindow.linear.checkpoint import read_metadata, resolve_checkpoint

PROBE_TEXT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the "
    "request.\n\n### Instruction:\nName three primary colours.\n\n### Response:\n"
)
# fp32 on CPU: thread counts and BLAS paths move logits by ~1e-5; an adapter change moves them by far more.
PROBE_ATOL = 2e-3


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _sha256(path: Path) -> str | None:
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--run", required=True, help="finished `sinkwindow train` folder (holds model.safetensors)"
    )
    p.add_argument("--model", default="smollm2-135m", help="packaged model it was trained on")
    p.add_argument("--method", required=True, help="spec, e.g. lolcats:256")
    p.add_argument("--command", required=True, help="the exact training command, for the record")
    p.add_argument(
        "--data-file", default=None, help="training data file (for its sha256); default: from the run"
    )
    p.add_argument(
        "--label",
        required=True,
        help="what this adapter is, as reports name it beside the method "
        "(e.g. 'trained on 4,096-token chunks: stronger than the paper's recipe')",
    )
    args = p.parse_args(argv)

    run = Path(args.run)
    src = run / "model.safetensors"
    if not src.is_file():
        raise SystemExit(f"error: {src} does not exist: the run has not finished both stages")
    meta = read_metadata(resolve_checkpoint(src))
    # A variant (METHOD@NAME) is trained as its plain method: swa:256:4@lora's run holds swa:256:4.
    if sinkwindow.parse_spec(meta["spec"]) != sinkwindow.parse_spec(args.method).without_adapter:
        raise SystemExit(f"error: {src} holds {meta['spec']}, not {args.method}")
    summary = json.loads((run / "summary.json").read_text())
    config = json.loads((run / "config.json").read_text())
    data = config.get("data", {})
    # Runs record their data by file name and sha256; older runs recorded a path on their machine.
    data_file = Path(args.data_file or data.get("path") or data.get("source", ""))
    data_name = data_file.name
    data_sha = _sha256(data_file) if data_file.is_file() else data.get("sha256")
    if data_sha is None:
        raise SystemExit(
            f"error: {data_file} not found and {run}/config.json records no sha256: pass --data-file"
        )

    ADAPTER_DIR.mkdir(parents=True, exist_ok=True)
    dst = ADAPTER_DIR / f"{adapter_stem(args.model, args.method)}.safetensors"
    shutil.copyfile(src, dst)
    total = sum(f.stat().st_size for f in ADAPTER_DIR.glob("*.safetensors"))
    if total > PACKAGE_BUDGET_BYTES:
        dst.unlink()
        raise SystemExit(
            f"error: with {src} ({src.stat().st_size / 2**20:.1f} MiB) the shipped adapters would hold "
            f"{total / 2**20:.1f} MiB, over the {PACKAGE_BUDGET_BYTES / 2**20:.0f} MiB package budget: ship a smaller "
            "adapter or retire one"
        )

    torch.manual_seed(0)
    model, tok = sinkwindow.load(args.model, method=args.method, checkpoint=dst)
    ids = tok(PROBE_TEXT, return_tensors="pt").input_ids
    vocab = model.config.vocab_size
    vocab_ids = list(range(0, vocab, max(1, vocab // 32)))
    stages = summary["stages"]
    provenance = {
        "model": args.model,
        "spec": str(sinkwindow.parse_spec(args.method)),
        "label": args.label,
        "file": dst.name,
        "sha256": file_sha256(dst),
        "bytes": dst.stat().st_size,
        "data": dict(data, source=data_name, file=data_name, sha256=data_sha),
        "tokens": {k: v["tokens"] for k, v in stages.items()},
        "steps": {k: v["steps"] for k, v in stages.items()},
        "val_loss": {
            k: {"first": v["first_val"], "best": v["best_val"], "best_step": v["best_step"]}
            for k, v in stages.items()
        },
        "wall_s": {k: v["wall_s"] for k, v in stages.items()},
        "seed": data.get("seed"),
        "train_config": config,
        "command": args.command,
        "sinkwindow_commit": _git_commit(),
        "torch": torch.__version__,
        "probe": {
            "text": PROBE_TEXT,
            "input_ids": ids[0].tolist(),
            "vocab_ids": vocab_ids,
            "logits": probe_logits(model, ids, vocab_ids),
            "atol": PROBE_ATOL,
        },
    }
    dst.with_suffix(".json").write_text(json.dumps(provenance, indent=1) + "\n")
    check = verify_adapter(dst, model)
    short = {k: v for k, v in provenance.items() if k not in ("probe", "train_config")}
    print(json.dumps(short, indent=2), file=sys.stderr)
    print(json.dumps({"adapter": str(dst), **check}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

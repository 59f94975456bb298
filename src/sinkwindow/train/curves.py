"""Training curves of a ``sinkwindow train`` run folder, so a reader can see whether each stage has
flattened: validation loss against tokens, one panel per stage, with the training loss faint behind.

A run folder holds one ``log.jsonl`` per stage (``transfer/``, ``finetune/``; Liger has only the
second). A resumed run re-logs the steps after its last save, so the last row of each step wins.
Written as ``curves.png`` by ``sinkwindow train`` whenever it stops (finished or ``--max-minutes``).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

from ..jsonl import read_jsonl

__all__ = ["read_log", "lr_drops", "plot_curves", "CURVES_FILE"]

logger = logging.getLogger(__name__)

CURVES_FILE = "curves.png"
STAGES = {
    "transfer": ("stage 1: attention transfer", "validation MSE x 1000 (outputs vs softmax)"),
    "finetune": ("stage 2: LoRA finetuning", "validation cross-entropy (nats/token)"),
}
# Training losses are per step and noisy; a centred running mean of this many steps shows the trend.
SMOOTH = 33


def read_log(path: str | Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """``(validation, training)`` as sorted ``(tokens, loss)`` pairs, the last row per step kept.

    Unreadable lines (a torn last line after a kill) are skipped.
    """
    val: dict[int, tuple[int, float]] = {}
    train: dict[int, tuple[int, float]] = {}
    for line in Path(path).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(row, dict) or "step" not in row or "tokens" not in row:
            continue
        for key, into in (("val_loss", val), ("train_loss", train)):
            x = row.get(key)
            if isinstance(x, int | float) and math.isfinite(x):
                into[int(row["step"])] = (int(row["tokens"]), float(x))
    return sorted(val.values()), sorted(train.values())


def lr_drops(path: str | Path) -> list[tuple[int, float, float]]:
    """``(tokens, lr before, lr after)`` of each learning-rate drop a stage logged (``lr_drop_at``)."""
    drops = {}
    for row in read_jsonl(path)[0]:
        drop = row.get("lr_drop")
        if isinstance(drop, dict) and "tokens" in row:
            drops[int(row["step"])] = (int(row["tokens"]), float(drop["from"]), float(drop["to"]))
    return [drops[s] for s in sorted(drops)]


def _smooth(ys: list[float], n: int = SMOOTH) -> list[float]:
    half = n // 2
    return [
        sum(ys[max(0, i - half) : i + half + 1]) / len(ys[max(0, i - half) : i + half + 1])
        for i in range(len(ys))
    ]


def plot_curves(run_dir: str | Path, out: str | Path | None = None) -> Path | None:
    """Write the curves of ``run_dir``'s stages to ``out`` (default ``run_dir/curves.png``).

    Returns the path, or ``None`` when no stage has logged a validation loss yet.

    Raises:
        ImportError: matplotlib is missing (``pip install 'sinkwindow[eval]'``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = Path(run_dir)
    stages = []
    for name, (title, ylabel) in STAGES.items():
        log = run / name / "log.jsonl"
        if log.is_file():
            val, train = read_log(log)
            if val:
                stages.append((title, ylabel, val, train, lr_drops(log)))
    if not stages:
        return None
    fig, axes = plt.subplots(1, len(stages), figsize=(6 * len(stages), 4), squeeze=False)
    for ax, (title, ylabel, val, train, drops) in zip(axes[0], stages):
        if train:
            tx, ty = zip(*train)
            ax.plot(tx, _smooth(list(ty)), color="0.7", lw=1, label=f"training (mean of {SMOOTH} steps)")
        vx, vy = zip(*val)
        ax.plot(vx, vy, "o-", ms=3, color="C0", label="validation")
        for tokens, before, after in drops:
            ax.axvline(tokens, color="C3", ls="--", lw=1, label=f"learning rate {before:.1g} -> {after:.1g}")
        best = min(range(len(vy)), key=vy.__getitem__)
        ax.annotate(
            f"best {vy[best]:.3g}",
            (vx[best], vy[best]),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
        )
        ax.set(title=f"{title} ({vx[-1]:,} tokens)", xlabel="training tokens", ylabel=ylabel)
        if max(vy) > 10 * min(vy) > 0:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(run.name)
    fig.tight_layout()
    path = Path(out) if out is not None else run / CURVES_FILE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""Training curves: a resumed log keeps the last row per step, torn lines are skipped, and the plot
has one panel per stage that logged a validation loss."""

from __future__ import annotations

import json

import pytest

from sinkwindow.train.curves import plot_curves, read_log

pytest.importorskip("matplotlib")


def write_log(path, rows, torn=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(text + ('{"step": 9, "tok' if torn else ""))


def test_a_resumed_log_keeps_the_last_row_of_each_step(tmp_path):
    rows = [
        {"step": 0, "tokens": 0, "val_loss": 3.0},
        {"step": 1, "tokens": 10, "train_loss": 2.9},
        {"step": 2, "tokens": 20, "train_loss": 2.8},
        {"step": 2, "tokens": 20, "val_loss": 2.5},
        # killed after the save at step 1: the resumed run runs step 2 again
        {"step": 2, "tokens": 20, "train_loss": 2.7},
        {"step": 2, "tokens": 20, "val_loss": 2.4},
        {"step": 3, "tokens": 30, "train_loss": float("nan")},
    ]
    write_log(tmp_path / "log.jsonl", rows, torn=True)
    val, train = read_log(tmp_path / "log.jsonl")
    assert val == [(0, 3.0), (20, 2.4)]
    assert train == [(10, 2.9), (20, 2.7)]


def test_plot_has_a_panel_per_stage_with_validation(tmp_path):
    import matplotlib.pyplot as plt

    assert plot_curves(tmp_path) is None  # nothing logged yet: no file
    assert not (tmp_path / "curves.png").exists()
    write_log(
        tmp_path / "finetune" / "log.jsonl",
        [{"step": s, "tokens": 8 * s, "val_loss": 2.0 / (1 + s)} for s in range(5)],
    )
    write_log(
        tmp_path / "transfer" / "log.jsonl", [{"step": 0, "tokens": 0, "train_loss": 1.0}]
    )  # no validation yet
    seen = []
    real_subplots = plt.subplots

    def spy(*a, **k):
        fig, axes = real_subplots(*a, **k)
        seen.append(axes)
        return fig, axes

    plt.subplots = spy
    try:
        path = plot_curves(tmp_path)
    finally:
        plt.subplots = real_subplots
    assert path == tmp_path / "curves.png" and path.stat().st_size > 0
    (ax,) = seen[0][0]
    assert "LoRA" in ax.get_title() and "32 tokens" in ax.get_title()
    assert list(ax.lines[-1].get_ydata()) == [2.0 / (1 + s) for s in range(5)]

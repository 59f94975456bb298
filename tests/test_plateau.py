"""Whether a training stage has flattened (train/plateau.py): the window, the change, and the exact
paired test on per-chunk validation losses, on hand-made logs."""

from __future__ import annotations

import json

import pytest

from sinkwindow.train.plateau import ALPHA, min_pairs, plateau


def _write(tmp_path, rows):
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{torn")
    return path


def _val(step, losses, key="k"):
    return {"step": step, "tokens": step * 10, "val_loss": sum(losses) / len(losses), "val_losses": losses,
            "val_key": key}  # fmt: skip


def test_the_window_is_the_last_fifth_on_the_final_validation_set(tmp_path):
    rows = [_val(s, [3.0, 3.0], key="old") for s in (0, 90)] + [
        _val(s, [2.0 - s / 1000] * 2) for s in (50, 80, 90, 100)
    ]
    rows.append({"step": 100, "tokens": 1000, "train_loss": 1.0})  # training rows do not count
    got = plateau(_write(tmp_path, rows))
    # Steps >= 80 of 100 on key "k" (the "old" row at step 90 is replaced by the later one of that step).
    assert (got["from_step"], got["to_step"], got["validations"]) == (80, 100, 3)
    assert got["first"] == pytest.approx(1.92) and got["final"] == pytest.approx(1.9)
    assert got["change"] == pytest.approx(-0.02) and got["relative"] == pytest.approx(-0.02 / 1.92)
    assert got["slope_per_100"] == pytest.approx(-0.1)


def test_a_shift_every_chunk_shares_is_not_flat_and_scattered_changes_are(tmp_path):
    a = [2.0 + 0.1 * i for i in range(20)]
    falling = plateau(_write(tmp_path, [_val(80, a), _val(100, [x - 0.01 for x in a])]))
    assert falling["chunks"] == 20 and falling["mean_chunk_change"] == pytest.approx(-0.01)
    assert falling["p"] == pytest.approx(2 / 2**20) and falling["flat"] is False  # exact signed-rank
    scattered = [x + (0.01 if i % 2 else -0.01) * (1 + i % 3) for i, x in enumerate(a)]
    flat = plateau(_write(tmp_path, [_val(80, a), _val(100, scattered)]))
    assert flat["p"] > 0.05 and flat["flat"] is True
    same = plateau(_write(tmp_path, [_val(80, a), _val(100, a)]))
    assert same["p"] == 1.0 and same["flat"] is True


def test_too_few_validations_or_no_per_chunk_losses(tmp_path):
    assert plateau(_write(tmp_path, [_val(100, [2.0])])) is None
    assert plateau(_write(tmp_path, [_val(10, [2.2]), _val(100, [2.0])]))["from_step"] == 10  # the last two
    assert plateau(_write(tmp_path, [])) is None
    old_style = [{"step": s, "tokens": s, "val_loss": 2.0 - s / 1000} for s in (80, 100)]
    got = plateau(_write(tmp_path, old_style))
    assert got["change"] == pytest.approx(-0.02) and got["flat"] is None and got["p"] is None


def test_too_few_chunks_to_ever_reject_give_no_verdict(tmp_path):
    # Five chunks that all fell: the smallest p the exact test has (2 / 2**5 = 0.0625) is above 0.05,
    # so "flat" would be said of any change; no verdict, and the reason names the fix.
    a = [2.0, 2.1, 1.9, 2.2, 1.8]
    got = plateau(_write(tmp_path, [_val(80, a), _val(100, [x - 0.5 for x in a])]))
    assert got["p"] == pytest.approx(0.0625) and got["min_p"] == pytest.approx(0.0625)
    assert got["flat"] is None and "--val-batches" in got["undecided"]
    # Six chunks can reject: the same uniform fall is "still moving".
    b = a + [2.05]
    six = plateau(_write(tmp_path, [_val(80, b), _val(100, [x - 0.5 for x in b])]))
    assert six["flat"] is False and "undecided" not in six
    assert min_pairs() == 6 and 2 / 2 ** min_pairs() <= ALPHA < 2 / 2 ** (min_pairs() - 1)
    # Chunks that did not move at all are flat whatever their number.
    assert plateau(_write(tmp_path, [_val(80, a[:2]), _val(100, a[:2])]))["flat"] is True


def test_the_paired_test_starts_at_the_first_validation_with_per_chunk_losses(tmp_path):
    # A run resumed under a trainer that logs per-chunk losses has them only from then on: the test
    # pairs the first validation in the window that has them with the final one.
    a = [2.0 + 0.1 * i for i in range(8)]
    rows = [
        {"step": 80, "tokens": 800, "val_loss": 2.5, "val_key": "k"},
        _val(90, a),
        _val(100, [x - 0.01 for x in a]),
    ]
    got = plateau(_write(tmp_path, rows))
    assert got["from_step"] == 80 and got["first"] == 2.5  # the window's change still spans it
    assert got["paired_from_step"] == 90 and got["chunks"] == 8 and got["flat"] is False

"""Whether a training stage has flattened (train/plateau.py): the window, the change, and the exact
paired test on per-chunk validation losses, on hand-made logs."""

from __future__ import annotations

import json

import pytest

from sinkwindow.train.plateau import ALPHA, TOLERANCE, describe, min_pairs, plateau


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


def test_settled_is_equivalence_within_the_tolerance_both_ways(tmp_path):
    a = [2.0 + 0.1 * i for i in range(20)]  # mean 2.95: the 0.5% tolerance is 0.01475 nats

    def judged(after):
        return plateau(_write(tmp_path, [_val(80, a), _val(100, after)]))

    # A fall every chunk shares: real (not flat), but smaller than the tolerance on every chunk.
    small = judged([x - 0.01 for x in a])
    assert small["tolerance"] == TOLERANCE == 0.005
    assert small["flat"] is False and small["settled"] is True
    assert small["p_settled"] == pytest.approx(1 / 2**20)  # one-sided exact, every shifted chunk agrees
    # The same shared change beyond the tolerance, down or up, is not settled.
    for shift in (-0.02, +0.02):
        moved = judged([x + shift for x in a])
        assert moved["settled"] is False and moved["p_settled"] == pytest.approx(1.0)
    # Chunks that scatter by ±0.1-0.3 with no common drift: flat, yet too noisy to show that the
    # loss moved by less than 0.015, so not settled. The two verdicts answer different questions.
    scattered = judged([x + (0.1 if i % 2 else -0.1) * (1 + i % 3) for i, x in enumerate(a)])
    assert scattered["flat"] is True and scattered["settled"] is False
    # A looser tolerance settles it.
    loose = plateau(_write(tmp_path, [_val(80, a), _val(100, [x - 0.02 for x in a])]), tolerance=0.01)
    assert loose["settled"] is True


def test_too_few_chunks_to_settle_give_no_verdict(tmp_path):
    # One-sided, the exact test's smallest p on n chunks is 1 / 2**n: 4 chunks cannot reach 0.05.
    a = [2.0, 2.1, 1.9, 2.2]
    got = plateau(_write(tmp_path, [_val(80, a), _val(100, a)]))
    assert got["settled"] is None and got["p_settled"] is None
    five = plateau(_write(tmp_path, [_val(80, a + [2.05]), _val(100, a + [2.05])]))
    assert five["settled"] is True and five["p_settled"] == pytest.approx(1 / 2**5)
    # Logs without per-chunk losses have no paired test of either kind.
    old_style = [{"step": s, "tokens": s, "val_loss": 2.0} for s in (80, 100)]
    assert plateau(_write(tmp_path, old_style))["settled"] is None


def test_describe_names_the_verdict_a_window_passed(tmp_path):
    a = [2.0 + 0.1 * i for i in range(20)]

    def line(after):
        return describe(plateau(_write(tmp_path, [_val(80, a), _val(100, after)])))

    assert line([x - 0.01 for x in a]).endswith(
        "(-0.34%): settled: moved by less than ±0.5% (p = 9.54e-07); no-change p = 1.91e-06 over 20 chunks"
    )
    assert ": still moving; no-change p = 1.91e-06" in line([x - 0.05 for x in a])
    assert line(a).startswith("steps 80-100: validation 2.95 -> 2.95 (+0.00%): flat; no-change p = 1")
    old_style = [{"step": s, "tokens": s, "val_loss": 2.0} for s in (80, 100)]
    assert describe(plateau(_write(tmp_path, old_style))).endswith(": no per-chunk losses to test")

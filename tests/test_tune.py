"""The hybrid search: the window grid, budget enforcement, the Pareto frontier, seeds that cannot
meet, the whole search on a tiny model, and the ``sinkwindow tune`` command."""

from __future__ import annotations

import argparse
import itertools
import json
import random

import pytest
import torch

from conftest import eval_pair
from sinkwindow import parse_spec
from sinkwindow.cli.args import byte_size
from sinkwindow.runtime.kv_bytes import analytic_state_bytes
from sinkwindow.tuning import (
    CAL_SEED,
    EVAL_SEEDS,
    HELDOUT_SEED,
    pareto_front,
    plan_candidates,
    tune,
    window_grid,
)
from sinkwindow.tuning.measure import EVAL_PPL_WINDOWS, measure, ppl_splits
from sinkwindow.tuning.tune import TuneConfig

CONTEXT = 512
# The tiny pair: 2 layers x 2 KV heads x head_dim 8, float32 -> 64 bytes per KV head per token.
# swa:64:4 holds 63 tokens a head (16,128 B); a full layer at 512 tokens adds 2 * 64 * (512 - 63).
BUDGET = 80_000


@pytest.fixture(scope="module")
def pair():
    return eval_pair()


def _brute_front(points):
    """Non-dominated points by definition: nothing else is at most as large in bytes and at least as good."""
    keep = []
    for i, (b, s) in enumerate(points):
        keep.append(
            not any(b2 <= b and s2 >= s and (b2, s2) != (b, s) for j, (b2, s2) in enumerate(points) if j != i)
        )
    return keep


def test_byte_sizes():
    assert byte_size("24MiB") == 24 * 2**20
    assert byte_size("512KiB") == 512 * 1024
    assert byte_size("1.5GiB") == 1610612736
    assert byte_size("24MB") == 24_000_000
    assert byte_size("4096") == 4096
    for bad in ("", "24 parsecs", "1e6", "MiB"):
        with pytest.raises(argparse.ArgumentTypeError, match="KiB/MiB/GiB"):
            byte_size(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="cannot be negative"):
        byte_size("-1MiB")


def test_window_grid_is_powers_of_two_below_the_context():
    assert window_grid(4096) == [64, 128, 256, 512, 1024, 2048]
    assert window_grid(5000) == [64, 128, 256, 512, 1024, 2048, 4096]
    assert window_grid(64) == []
    with pytest.raises(ValueError, match="positive"):
        window_grid(0)


def test_pareto_front_matches_a_brute_force_filter():
    rng = random.Random(0)
    for _ in range(200):
        pts = [(rng.randint(1, 8), rng.choice([0.0, 0.25, 0.5, 0.75, 1.0])) for _ in range(rng.randint(1, 9))]
        assert pareto_front(pts) == _brute_front(pts), pts
    assert pareto_front([(1, 0.5), (2, 0.5), (2, 0.9), (3, 0.1)]) == [True, False, True, False]


def test_candidates_use_all_the_budget_and_never_more(pair):
    config = pair[0].config
    plan = plan_candidates(config, CONTEXT, BUDGET, windows=[32, 64, 128, 256, 1024], sinks=(0, 4))
    assert plan, "some window must fit"
    for base, k in plan:
        spec_k = base.with_full(layers=range(k))
        assert analytic_state_bytes(spec_k, config, CONTEXT) <= BUDGET
        if k < 2:  # one more full layer would not fit
            assert analytic_state_bytes(base.with_full(layers=range(k + 1)), config, CONTEXT) > BUDGET
    assert {(b.window, b.sinks): k for b, k in plan} == {(32, 0): 1, (32, 4): 1, (64, 0): 1, (64, 4): 1,
                                                          (128, 0): 0, (128, 4): 0, (256, 0): 0, (256, 4): 0}  # fmt: skip
    heads = dict((str(b), k) for b, k in plan_candidates(config, CONTEXT, BUDGET, windows=[128], by="head"))
    assert heads == {"swa:128:4": 1}  # a KV head costs half a layer: one fits where no layer does
    with pytest.raises(ValueError, match="below the cheapest candidate, swa:32:0 .* raise --kv-budget"):
        plan_candidates(config, CONTEXT, 1000, windows=[32, 64], sinks=(0, 4))


def test_the_seeds_never_meet():
    assert CAL_SEED != HELDOUT_SEED
    assert CAL_SEED not in EVAL_SEEDS and HELDOUT_SEED not in EVAL_SEEDS and 42 in EVAL_SEEDS


def test_ppl_windows_are_disjoint_and_clear_of_evaluation(pair):
    cal, held = ppl_splits(pair[1], 256, 3, 2)
    assert len(cal) == 3 and len(held) == 2 and not set(cal) & set(held)
    assert min(cal + held) >= EVAL_PPL_WINDOWS
    with pytest.raises(ValueError, match="fewer --samples"):
        ppl_splits(pair[1], 256, 10**6, 2)


def test_measure_scores_with_the_runner_and_a_wilson_interval(pair):
    model, tok = pair
    m = measure(model, tok, "swa:64:4", "niah_single_1", CONTEXT, 3, CAL_SEED)
    assert m.n == 3 and m.metric == "accuracy" and 0.0 <= m.lo <= m.score <= m.hi <= 1.0
    assert m.seed == CAL_SEED and set(m.per_task) == {"niah_single_1"}


@pytest.fixture(scope="module")
def tuned(pair, tmp_path_factory):
    model, tok = pair
    out = tmp_path_factory.mktemp("tune")
    search = TuneConfig(windows=[32, 64, 128], sinks=(0, 4), samples=2, heldout_samples=2, calib_samples=2)
    res = tune(model, tok, BUDGET, CONTEXT, "niah_single_2", search, progress=False, out=out)
    return res, out


def test_no_candidate_within_the_budget_costs_more(tuned, pair):
    res, _ = tuned
    config = pair[0].config
    inside = [c for c in res.candidates if c.in_budget]
    assert len(inside) >= 6
    for c in inside:
        assert c.kv_bytes == analytic_state_bytes(parse_spec(c.spec), config, CONTEXT) <= BUDGET
    full = next(c for c in res.candidates if c.spec == "full")
    assert not full.in_budget and not full.on_frontier and full.score is not None  # measured, for context
    # Every base of the grid, K = 0 .. its K_max, each once.
    assert sorted((c.window, c.sinks, c.k) for c in inside) == sorted(
        [(w, s, 0) for w, s in itertools.product([32, 64, 128], [0, 4])]
        + [(32, 0, 1), (32, 4, 1), (64, 0, 1), (64, 4, 1)]
    )


def test_the_frontier_is_the_non_dominated_set(tuned):
    res, _ = tuned
    inside = [c for c in res.candidates if c.in_budget]
    assert [c.on_frontier for c in inside] == _brute_front([(c.kv_bytes, c.score) for c in inside])
    best = next(c for c in inside if c.spec == res.best)
    assert best.on_frontier and best.score == max(c.score for c in inside)


def test_winner_full_and_base_are_reported_on_held_out_samples(tuned):
    res, _ = tuned
    base = str(parse_spec(res.best).base) if res.best != "full" else None
    assert set(res.heldout) == {res.best, "full", *([base] if base else [])}
    assert set(res.calibration) == set(res.heldout)
    assert res.seeds["calibration"] == CAL_SEED and res.seeds["heldout"] == HELDOUT_SEED
    for spec, m in res.heldout.items():
        assert m.seed == HELDOUT_SEED and m.n == 2 and 0.0 <= m.lo <= m.score <= m.hi <= 1.0
        assert res.calibration[spec].seed == CAL_SEED


def test_units_come_from_one_scoring_per_base(tuned):
    res, _ = tuned
    # Only bases the budget gives a full unit are scored, each once, for every unit.
    assert set(res.unit_scores) == {"swa:32:0", "swa:32:4", "swa:64:0", "swa:64:4"}
    for base, scores in res.unit_scores.items():
        assert scores["units"] == ["0", "1"] and len(scores["mass"]) == 2
        chosen = next(c for c in res.candidates if c.spec.startswith(base + "+full:"))
        assert chosen.units == [scores["units"][max(range(2), key=lambda i: (scores["mass"][i], -i))]]


def test_outputs_are_written(tuned):
    res, out = tuned
    frontier = json.loads((out / "frontier.json").read_text())
    saved = json.loads((out / "tune.json").read_text())
    assert frontier["best"] == saved["best"] == res.best
    assert [c["spec"] for c in frontier["candidates"]] == [c.spec for c in res.candidates]
    assert all(
        {"kv_bytes", "score", "n", "on_frontier", "in_budget"} <= set(c) for c in frontier["candidates"]
    )
    assert saved["seeds"]["calibration"] != saved["seeds"]["heldout"]
    assert saved["settings"]["sinks"] == [0, 4] and (out / "frontier.png").stat().st_size > 1000


def test_tune_refuses_shared_or_evaluation_seeds_and_bad_values(pair):
    model, tok = pair
    with pytest.raises(ValueError, match="both 7000000"):
        tune(model, tok, BUDGET, CONTEXT, "niah", TuneConfig(seed=CAL_SEED, heldout_seed=CAL_SEED))
    with pytest.raises(ValueError, match="held-out seed 42 .* tune on the test set"):
        tune(model, tok, BUDGET, CONTEXT, "niah", TuneConfig(heldout_seed=42))
    with pytest.raises(ValueError, match="context must be a positive"):
        tune(model, tok, BUDGET, 0)
    with pytest.raises(ValueError, match="unknown task"):
        tune(model, tok, BUDGET, CONTEXT, "squad")
    with pytest.raises(ValueError, match="cheapest candidate"):
        tune(model, tok, 100, CONTEXT)


def test_ppl_search_uses_disjoint_windows(pair):
    model, tok = pair
    search = TuneConfig(windows=[32], samples=1, heldout_samples=1, calib_samples=1, calib_length=512)
    res = tune(model, tok, BUDGET, 256, "ppl", search, progress=False)
    windows = res.seeds["ppl_windows"]
    assert not set(windows["calibration"]) & set(windows["heldout"])
    assert all(c.score is not None and c.score < 0 for c in res.candidates)  # negative NLL
    m = res.heldout[res.best]
    assert m.metric == "neg_nll" and m.lo <= m.score <= m.hi and m.windows == windows["heldout"]
    assert torch.isfinite(torch.tensor(m.score))


def test_tune_command_writes_its_files_and_one_json_line(eval_pair_folder, tmp_path, capsys):
    from sinkwindow.cli import main

    out = tmp_path / "tune"
    rc = main(["tune", "--model", str(eval_pair_folder), "--kv-budget", "80KB", "--context", "512", "--task",
               "niah_single_1", "--windows", "32,64", "--samples", "1", "--heldout-samples", "1",
               "--calib-samples", "1", "--out", str(out), "--no-progress", "--threads", "1"])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    info = json.loads(printed.strip().splitlines()[-1])
    assert info["kv_budget_bytes"] == 80_000 and info["seeds"] == {
        "calibration": CAL_SEED,
        "heldout": HELDOUT_SEED,
    }
    assert "best:" in printed and info["best"] in printed
    for name in ("frontier.json", "frontier.png", "tune.json"):
        assert (out / name).is_file()
    assert "torch" in json.loads((out / "tune.json").read_text())["provenance"]["versions"]
    # Ranked by trained gates instead: the same run folder, the earlier files moved aside.
    rc = main(["tune", "--model", str(eval_pair_folder), "--kv-budget", "80KB", "--context", "512", "--task",
               "niah_single_1", "--windows", "32,64", "--units", "head", "--criterion", "gates", "--samples", "1",
               "--heldout-samples", "1", "--calib-samples", "1", "--out", str(out), "--no-progress",
               "--threads", "1"])  # fmt: skip
    assert rc == 0
    saved = json.loads((out / "tune.json").read_text())
    assert saved["settings"]["criterion"] == "gates" and any(out.glob("previous-*/tune.json"))
    assert all("gates" in s for s in saved["unit_scores"].values())


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--kv-budget", "lots"], "is not a byte size"),
        (["--kv-budget", "0"], "must be more than 0 bytes"),
        ([], "the following arguments are required: --kv-budget"),
        (["--kv-budget", "24MiB", "--context", "0"], "--context: must be >= 1 tokens"),
        (["--kv-budget", "24MiB", "--context", "100"], "too short for niah"),
        (["--kv-budget", "24MiB", "--task", "squad"], "unknown task 'squad'"),
        (["--kv-budget", "24MiB", "--sinks", "4,,0"], "single commas"),
        (["--kv-budget", "24MiB", "--sinks", "-1"], "must be >= 0"),
        (["--kv-budget", "24MiB", "--seed", "42"], "tune on the test set"),
        (["--kv-budget", "24MiB", "--heldout-seed", "7000000"], "both 7000000"),
        (["--kv-budget", "24MiB", "--windows", "8k", "--context", "4k"], "give windows below it"),
        (["--kv-budget", "24MiB", "--units", "expert"], "invalid choice"),
        (["--kv-budget", "1KiB", "--context", "512", "--model", "{model}"], "below the cheapest candidate"),
    ],
)
def test_tune_bad_input_fails_in_one_line(eval_pair_folder, tmp_path, capsys, monkeypatch, argv, fragment):
    from sinkwindow.cli import main

    monkeypatch.chdir(tmp_path)
    argv = [a.format(model=eval_pair_folder) for a in argv]
    rc = main(["tune", *argv, "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and fragment in errors[0], err
    assert list(tmp_path.iterdir()) == []  # nothing written

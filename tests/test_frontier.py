"""The KV-budget frontier: each point fits its budget, plain SWA takes the largest W that fits, the
hybrids their most units, recovery is paired against full attention, and a rerun reuses everything."""

from __future__ import annotations

import importlib
import json
import re

import pytest
import torch

from conftest import eval_pair
from sinkwindow import parse_spec
from sinkwindow.runtime.kv_bytes import analytic_state_bytes
from sinkwindow.runtime.spec import MethodSpec
from sinkwindow.tuning.frontier import FrontierConfig, frontier, largest_window, max_units

# The module, not the function the package exports under the same name.
frontier_mod = importlib.import_module("sinkwindow.tuning.frontier")

CONTEXT = 512  # tiny-pair S-NIAH prompts of ~380-420 tokens
CONFIG = FrontierConfig(budgets=(0.4, 0.75), sinks=(0, 4), stream_window=64, samples=2, calib_samples=1)


@pytest.fixture(scope="module")
def pair():
    return eval_pair()


@pytest.fixture(scope="module")
def drawn(pair, tmp_path_factory):
    model, tok = pair
    out = tmp_path_factory.mktemp("frontier")
    return frontier(model, tok, CONTEXT, CONFIG, out, name="tiny", progress=False), out


def test_every_point_fits_its_budget_and_takes_all_the_budget_allows(drawn, pair):
    points, _ = drawn
    config, full = pair[0].config, analytic_state_bytes(MethodSpec("full"), pair[0].config, CONTEXT)
    assert {(p.budget, p.selection) for p in points} >= {(0.4, "swa"), (0.4, "heads-nll"), (0.75, "layers")}
    for p in points:
        spec = parse_spec(p.spec)
        assert p.kv_bytes == analytic_state_bytes(spec, config, CONTEXT) <= p.budget * full
        assert p.kv_fraction == pytest.approx(p.kv_bytes / full, abs=1e-4)
        if p.selection == "swa":
            # The largest window: one more slot would not fit.
            assert (
                largest_window(config, CONTEXT, int(p.budget * full), spec.sinks, torch.float32)
                == spec.window
            )
            bigger = parse_spec(f"swa:{spec.window + 1}:{spec.sinks}")
            assert analytic_state_bytes(bigger, config, CONTEXT) > p.budget * full
        else:
            by = "layer" if p.selection == "layers" else "head"
            base = spec.base
            assert base.window == 64 and base.sinks in (0, 4)
            kept = len(spec.full_layers) * (1 if by == "layer" else 2) + len(spec.full_heads)
            assert kept == max_units(base, config, by, CONTEXT, int(p.budget * full), torch.float32) > 0


def test_recovery_is_the_paired_s_niah_average_against_full(drawn):
    points, out = drawn
    rows = [json.loads(line) for line in (out / "eval" / "results.jsonl").read_text().splitlines()]
    score = {(r["method"], r["task"], r["index"]): r["score"] for r in rows}
    tasks = ("niah_single_1", "niah_single_2", "niah_single_3")
    full_mean = sum(score[("full", t, i)] for t in tasks for i in range(2)) / 6
    for p in points:
        assert p.n == 6 and set(p.accuracy) == set(tasks)
        mine = sum(score[(p.spec, t, i)] for t in tasks for i in range(2)) / 6
        if full_mean > 0:
            assert p.recovery == pytest.approx(100 * mine / full_mean)
        else:  # a random tiny model finds no needle under full attention: no ratio is given
            assert p.recovery is None
        assert p.p_vs_full is not None and 0 <= p.p_vs_full <= 1
    saved = json.loads((out / "frontier.json").read_text())
    assert saved["context"] == CONTEXT and len(saved["points"]) == len(points)
    # Decoded up to the answer's tokens + 16 (as tune does), not RULER's 128: every method alike.
    ran = json.loads((out / "eval" / "config.json").read_text())
    assert ran["niah_max_new_tokens"] is None
    table = (out / "frontier.md").read_text()
    assert all(f"`{p.spec}`" in table for p in points) and (out / "frontier.png").stat().st_size > 1000


def test_a_rerun_calibrates_and_evaluates_nothing_again(drawn, pair, monkeypatch):
    points, out = drawn
    model, tok = pair
    rows_before = (out / "eval" / "results.jsonl").read_text()

    def no_calibration(*args, **kwargs):
        raise AssertionError("calibrated again")

    monkeypatch.setattr(frontier_mod, "calibrate", no_calibration)
    monkeypatch.setattr(frontier_mod, "mean_nlls", no_calibration)
    again = frontier(model, tok, CONTEXT, CONFIG, out, name="tiny", progress=False)
    assert [(p.spec, p.recovery) for p in again] == [(p.spec, p.recovery) for p in points]
    assert (out / "eval" / "results.jsonl").read_text() == rows_before


def test_lost_points_come_back_from_the_memo_without_running_the_model(drawn, pair, monkeypatch, tmp_path):
    # A stop inside a calibration keeps every finished run (calibration/runs.jsonl) but no point file.
    points, out = drawn
    model, tok = pair
    memo = [json.loads(line) for line in (out / "calibration" / "runs.jsonl").read_text().splitlines()]
    # Budgets shared their runs: each was computed once (the gates' state is kept after every step).
    keys = [json.dumps(r["key"], sort_keys=True) for r in memo if r["key"]["kind"] != "gates-progress"]
    assert len(keys) == len(set(keys))
    assert {r["key"]["kind"] for r in memo} == {"nll", "gates", "gates-progress", "mass", "retrieval"}
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "calibration").mkdir()
    (copy / "calibration" / "runs.jsonl").write_text((out / "calibration" / "runs.jsonl").read_text())
    (copy / "eval").mkdir()
    for name in ("results.jsonl", "config.json", "fingerprint.json"):
        if (out / "eval" / name).exists():
            (copy / "eval" / name).write_text((out / "eval" / name).read_text())
    (copy / "fingerprint.json").write_text((out / "fingerprint.json").read_text())
    from sinkwindow.tuning import gates
    from sinkwindow.tuning import nll as nll_mod

    def no_model(*args, **kwargs):
        raise AssertionError("ran the model again")

    monkeypatch.setattr(nll_mod, "answer_nll", no_model)
    monkeypatch.setattr(gates, "train_gates", no_model)
    monkeypatch.setattr(importlib.import_module("sinkwindow.tuning.mass"), "mass_scores", no_model)
    monkeypatch.setattr(importlib.import_module("sinkwindow.tuning.retrieval"), "retrieval_scores", no_model)
    again = frontier(model, tok, CONTEXT, CONFIG, copy, name="tiny", progress=False)
    assert [(p.budget, p.selection, p.spec) for p in again] == [
        (p.budget, p.selection, p.spec) for p in points
    ]


def test_a_point_costs_every_run_it_used_also_those_an_earlier_point_paid_for(drawn):
    points, out = drawn
    memo = [json.loads(line) for line in (out / "calibration" / "runs.jsonl").read_text().splitlines()]
    assert all(
        r["cpu_s"] > 0 for r in memo if r["key"]["kind"] != "gates-progress"
    )  # its CPU is in its value
    by = {(p.budget, p.selection): p for p in points}
    first, second = by[(0.4, "heads-retrieval")], by[(0.75, "heads-nll")]
    # The first head point ran everything it used: it spent here what it costs alone.
    assert first.calib_cpu_minutes == pytest.approx(first.calib_cpu_minutes_here, abs=2e-4)
    # The second heads-nll budget reuses the first's single-head NLLs: it spent less here than alone.
    # ... and its cost alone counts them: every single-head NLL on both sink bases (swa:64:0 and swa:64:4).
    single_head = re.compile(r"swa:64:[04]\+full:\d+\.\d+")
    singles = sum(
        r["cpu_s"] for r in memo if r["key"]["kind"] == "nll" and single_head.fullmatch(r["key"]["spec"])
    )
    assert sum(bool(single_head.fullmatch(r["key"]["spec"])) for r in memo if r["key"]["kind"] == "nll") == 8
    assert second.calib_cpu_minutes * 60 >= singles - 0.01
    # Runs it found cost nothing here: alone - here is at least their recorded CPU (no timing compared).
    assert (second.calib_cpu_minutes - second.calib_cpu_minutes_here) * 60 >= singles - 0.02
    assert "alone / here" in (out / "frontier.md").read_text()


def test_selections_go_cheapest_first_each_evaluated_before_the_next(pair, tmp_path, monkeypatch):
    model, tok = pair
    evaluated = []
    real = frontier_mod.write_frontier

    def record(points, out, **kw):
        evaluated.append([(p.selection, p.n) for p in points])
        return real(points, out, **kw)

    monkeypatch.setattr(frontier_mod, "write_frontier", record)
    cfg = FrontierConfig(budgets=(0.75,), selections=("layers", "swa"), sinks=(4,), stream_window=64, samples=1,
                         calib_samples=1)  # fmt: skip
    frontier(model, tok, CONTEXT, cfg, tmp_path, name="tiny", progress=False)
    assert evaluated == [[("swa", 3)], [("swa", 3), ("layers", 3)]]


def test_bad_frontier_settings_are_refused(pair, tmp_path):
    model, tok = pair
    with pytest.raises(ValueError, match="unknown selection"):
        frontier(model, tok, CONTEXT, FrontierConfig(selections=("heads",)), tmp_path, name="tiny")
    with pytest.raises(ValueError, match=r"fractions of full attention's KV bytes in \(0, 1\]"):
        frontier(model, tok, CONTEXT, FrontierConfig(budgets=(1.5,)), tmp_path, name="tiny")
    with pytest.raises(ValueError, match="tune on the test set"):
        frontier(model, tok, CONTEXT, FrontierConfig(seed=42), tmp_path, name="tiny")


def test_frontier_cli_parses_budgets_and_selections():
    from sinkwindow.cli import build_parser

    args = build_parser().parse_args(
        ["frontier", "--budgets", "0.5,0.125", "--selections", "swa,heads-gates,heads-retrieval"]
    )
    assert (
        args.budgets == [0.125, 0.5]
        and args.selections == ["swa", "heads-gates", "heads-retrieval"]
        and args.context == 4096
    )
    assert args.pool == 20 and build_parser().parse_args(["frontier", "--pool", "8"]).pool == 8
    for bad in (["--budgets", "2"], ["--selections", "heads"], ["--pool", "0"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["frontier", *bad])


def test_recovery_pairs_samples_per_task_and_weights_tasks_equally():
    from sinkwindow.tuning.frontier import FrontierPoint, measure_points

    def rows(method, scores_by_task):
        return [{"method": method, "task": t, "length": CONTEXT, "index": i, "score": s}
                for t, scores in scores_by_task.items() for i, s in enumerate(scores)]  # fmt: skip

    full = {"niah_single_1": [100, 100, 0, 100], "niah_single_2": [100, 100], "niah_single_3": [100, 0]}
    mine = {"niah_single_1": [100, 0, 0, 100, 100], "niah_single_2": [0, 100], "niah_single_3": [100, 0]}
    point = FrontierPoint(0.25, "swa", "swa:64:4", 10, 0.0, 0.0)
    measure_points([point], rows("full", full) + rows("swa:64:4", mine), CONTEXT, 40)
    # Pairs only where both ran (index 4 of task 1 has no full row); each task's mean counts once.
    assert point.n == 8 and point.kv_fraction == 0.25
    assert point.accuracy == {"niah_single_1": 50.0, "niah_single_2": 50.0, "niah_single_3": 50.0}
    want = (0.5 + 0.5 + 0.5) / (0.75 + 1.0 + 0.5)
    assert point.recovery == pytest.approx(100 * want) and point.lo <= point.recovery <= point.hi
    assert point.p_vs_full is not None and point.p_vs_full > 0.05  # 2 discordant pairs of 8


def test_each_point_is_tested_against_the_best_at_its_budget(tmp_path):
    from sinkwindow.tuning.frontier import (
        FrontierConfig,
        FrontierPoint,
        best_point,
        measure_points,
        write_frontier,
    )

    def rows(method, scores):
        return [{"method": method, "task": "niah_single_1", "length": CONTEXT, "index": i, "score": s}
                for i, s in enumerate(scores)]  # fmt: skip

    full = [100] * 8
    # At 0.25: A finds 6 of 8, B 4 (B wins sample 0, loses samples 1-3: 1 / 3 against A), C 2 (and
    # only 7 samples run: pairs are the samples both ran). At 0.5, D and E tie at 5 of 8: the cheaper
    # calibration (E) is the best.
    a, b, c = (
        [0, 100, 100, 100, 100, 100, 100, 0],
        [100, 0, 0, 0, 100, 100, 100, 0],
        [100, 100, 0, 0, 0, 0, 0],
    )
    d, e = [100] * 5 + [0] * 3, [0] * 3 + [100] * 5
    points = [
        FrontierPoint(0.25, "swa", "swa:8:4", 10, 0.0, 1.0),
        FrontierPoint(0.25, "heads-nll", "swa:4:2+full:0.0", 10, 0.0, 50.0),
        FrontierPoint(0.25, "layers", "swa:4:2+full:1", 10, 0.0, 9.0),
        FrontierPoint(0.5, "heads-nll", "swa:4:2+full:0.0,1.0", 20, 0.0, 50.0),
        FrontierPoint(0.5, "heads-gates", "swa:4:2+full:0.0,1.1", 20, 0.0, 30.0),
    ]
    specs = [p.spec for p in points]
    data = rows("full", full) + [r for spec, sc in zip(specs, (a, b, c, d, e)) for r in rows(spec, sc)]
    measure_points(points, data, CONTEXT, 40)
    pa, pb, pc, pd, pe = points
    assert best_point(points[:3]) is pa and pa.vs_best is None
    # One task of 0/1 scores: McNemar's exact test, 1 of 4 discordant pairs one way: p = 2 * 5/16.
    assert pb.vs_best == {"selection": "swa", "spec": "swa:8:4", "wins": 1, "losses": 3, "n": 8, "p": 0.625}
    assert pc.vs_best["n"] == 7 and (pc.vs_best["wins"], pc.vs_best["losses"]) == (1, 5)
    assert best_point(points[3:]) is pe and pe.vs_best is None
    assert (pd.vs_best["selection"], pd.vs_best["wins"], pd.vs_best["losses"]) == ("heads-gates", 3, 3)
    assert pd.vs_best["p"] == 1.0
    write_frontier(points, tmp_path, context=CONTEXT, model="m", config=FrontierConfig(), full_bytes=40)
    table = (tmp_path / "frontier.md").read_text().split("## At each budget")[1]
    assert "| 0.25 | **swa** | `swa:8:4` | 75.0 [" in table and "| 1 / 3, p 0.62 |" in table
    assert "| 0.5 | **heads-gates** |" in table and "| 0.5 | heads-nll | `swa:4:2+full:0.0,1.0` |" in table
    record = json.loads((tmp_path / "frontier.json").read_text())
    assert [p["vs_best"] is None for p in record["points"]] == [True, False, False, False, True]


def test_a_point_counts_the_needles_beyond_its_streaming_window_and_what_full_found_there(tmp_path):
    from sinkwindow.tuning.frontier import FrontierConfig, FrontierPoint, measure_points, write_frontier

    # Prompts of 100 tokens; swa:20:4 sees positions 0-3 and 84-99 from the last one. Needles at
    # [1, 3) (a sink), [90, 97) (recent), [50, 57) and [83, 90) (its first token one short): two beyond.
    needles = {0: [1, 3], 1: [90, 97], 2: [50, 57], 3: [83, 90]}

    def rows(method, scores):
        return [{"method": method, "task": "niah_single_1", "length": CONTEXT, "index": i, "score": s,
                 "needle_tokens": needles[i], "n_prompt_tokens": 100} for i, s in enumerate(scores)]  # fmt: skip

    full = rows("full", [100, 100, 100, 0])
    plain = FrontierPoint(0.25, "swa", "swa:20:4", 10, 0.0, 0.0)
    hybrid = FrontierPoint(0.25, "heads-nll", "swa:20:4+full:1.0", 10, 0.0, 0.0)
    mine = rows("swa:20:4", [100, 100, 0, 0]) + rows("swa:20:4+full:1.0", [0, 100, 100, 100])
    measure_points([plain, hybrid], full + mine, CONTEXT, 40)
    assert plain.beyond_window == {"window": [20, 4], "n": 2, "found": 0, "full_found": 1}
    assert hybrid.beyond_window == {"window": [20, 4], "n": 2, "found": 2, "full_found": 1}
    write_frontier(
        [plain, hybrid], tmp_path, context=CONTEXT, model="m", config=FrontierConfig(), full_bytes=40
    )
    table = (tmp_path / "frontier.md").read_text()
    assert "| 0 (1) of 2 |" in table and "| 2 (1) of 2 |" in table
    # Per task, the spec's score and full attention's on the same samples (S-NIAH-2/3 not run here).
    assert plain.accuracy == {"niah_single_1": 50.0} and plain.full_accuracy == {"niah_single_1": 75.0}
    assert "| 50.0 / – / – (75.0 / – / –) |" in table and "| 75.0 / – / – (75.0 / – / –) |" in table
    # Rows written without needle positions: unknown, not "none beyond".
    bare = [{k: v for k, v in r.items() if k != "needle_tokens"} for r in full + mine]
    again = FrontierPoint(0.25, "swa", "swa:20:4", 10, 0.0, 0.0)
    measure_points([again], bare, CONTEXT, 40)
    assert again.beyond_window is None and again.n == 4
    write_frontier([again], tmp_path, context=CONTEXT, model="m", config=FrontierConfig(), full_bytes=40)
    assert "| – |" in (tmp_path / "frontier.md").read_text()


def test_frontier_command_writes_its_files_and_one_json_line(eval_pair_folder, tmp_path, capsys):
    from sinkwindow.cli import main

    out = tmp_path / "frontier"
    rc = main(["frontier", "--model", str(eval_pair_folder), "--context", "512", "--budgets", "0.4",
               "--selections", "swa", "--sinks", "0,4", "--samples", "1", "--calib-samples", "1",
               "--out", str(out), "--no-progress", "--threads", "1"])  # fmt: skip
    assert rc == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (
        last["points"] == 1 and (out / "frontier.md").is_file() and (out / "eval" / "results.jsonl").is_file()
    )
    assert (
        main(["frontier", "--model", str(eval_pair_folder), "--seed", "42", "--out", str(tmp_path / "x")])
        == 2
    )
    assert "tune on the test set" in capsys.readouterr().err and not (tmp_path / "x").exists()


def test_a_folder_keeps_one_calibration_setting(pair, tmp_path):
    from sinkwindow.runs.folder import RunMismatchError

    model, tok = pair
    one = FrontierConfig(budgets=(0.4,), selections=("swa",), sinks=(0, 4), samples=1, calib_samples=1)
    frontier(model, tok, CONTEXT, one, tmp_path, name="tiny", progress=False)
    # More budgets or samples add to the folder; other sinks would reuse stale calibrations: refused.
    frontier(model, tok, CONTEXT, FrontierConfig(**{**one.__dict__, "budgets": (0.4, 0.75)}), tmp_path, name="tiny",
             progress=False)  # fmt: skip
    other = FrontierConfig(**{**one.__dict__, "sinks": (4,)})
    with pytest.raises(RunMismatchError, match=r"sinks: \[0, 4\] -> \[4\]"):
        frontier(model, tok, CONTEXT, other, tmp_path, name="tiny", progress=False)
    points = frontier(model, tok, CONTEXT, other, tmp_path, name="tiny", progress=False, new_run=True)
    assert [parse_spec(p.spec).sinks for p in points] == [4]
    assert any(p.name.startswith("previous-") for p in tmp_path.iterdir())


def test_keep_puts_the_budget_on_the_global_layers(pair, tmp_path):
    # Gemma 3's local layers keep their 80-token window at every point; W and the units act on globals.
    from test_calibrate import _tiny_gemma3

    model, tok = _tiny_gemma3(len(pair[1])), pair[1]
    cfg = FrontierConfig(budgets=(0.5,), selections=("swa", "heads-nll"), sinks=(4,), stream_window=64, samples=1,
                         calib_samples=1, native_sliding="keep")  # fmt: skip
    points = frontier(model, tok, CONTEXT, cfg, tmp_path, name="tiny-gemma3", progress=False)
    full = analytic_state_bytes(MethodSpec("full"), model.config, CONTEXT)
    assert {p.selection for p in points} == {"swa", "heads-nll"}
    for p in points:
        spec = parse_spec(p.spec)
        assert (
            p.kv_bytes == analytic_state_bytes(spec, model.config, CONTEXT, native_sliding="keep") <= full / 2
        )
        if p.selection == "swa":
            budget = int(0.5 * full)
            assert spec.window == largest_window(model.config, CONTEXT, budget, 4, torch.float32, "keep")
            # Under override the local layers would hold W - 1 keys too, more than their own 79: W fits less.
            assert largest_window(model.config, CONTEXT, budget, 4, torch.float32) < spec.window
        else:
            assert {layer for layer, _ in spec.full_heads} | set(spec.full_layers) <= {1, 3}
    ran = json.loads((tmp_path / "eval" / "config.json").read_text())
    assert ran["native_sliding"] == "keep"
    assert "native sliding layers kept" in (tmp_path / "frontier.md").read_text()


def test_frontier_evaluates_on_workers_with_the_serial_rows_and_refuses_dirty_source(
    eval_pair_folder, tmp_path, capsys, monkeypatch
):
    """--workers runs the evaluation's cells in worker processes with the rows a serial run writes;
    rows from uncommitted source are refused, or with --allow-dirty carry the diff's sha256."""
    from sinkwindow.cli import main
    from sinkwindow.eval.results import ResultsStore
    from sinkwindow.runs import provenance

    argv = ["frontier", "--model", str(eval_pair_folder), "--context", "512", "--budgets", "0.4",
            "--selections", "swa", "--sinks", "0,4", "--samples", "2", "--calib-samples", "1",
            "--no-progress", "--threads", "1"]  # fmt: skip

    def rows(out):
        got = ResultsStore(out / "eval").rows()
        return sorted((r["method"], r["task"], r["index"], r["prediction"], r["score"]) for r in got)

    assert main([*argv, "--out", str(tmp_path / "serial")]) == 0
    assert main([*argv, "--out", str(tmp_path / "workers"), "--workers", "2"]) == 0
    assert rows(tmp_path / "workers") == rows(tmp_path / "serial") and len(rows(tmp_path / "serial")) == 12
    sessions = (tmp_path / "workers" / "eval" / "sessions.jsonl").read_text()
    assert "2 local worker process" in sessions
    # The calibration's NLL runs went to the workers too: the same point, and its cost "here" holds
    # the CPU the workers spent on its runs (this process ran none of them).
    serial, spread = (
        json.loads((tmp_path / d / "frontier.json").read_text())["points"] for d in ("serial", "workers")
    )
    assert [p["spec"] for p in spread] == [p["spec"] for p in serial]
    runs = [
        json.loads(line)
        for line in (tmp_path / "workers" / "calibration" / "runs.jsonl").read_text().splitlines()
    ]
    assert len(runs) == 2 and all(r["key"]["kind"] == "nll" and r["cpu_s"] > 0 for r in runs)
    assert spread[0]["calib_cpu_minutes_here"] * 60 >= sum(r["cpu_s"] for r in runs) - 0.01
    # Other calibration settings in the same folder: refused in one line naming --new-run, which works.
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "serial"), "--pool", "3"]) == 2
    assert "greedy_pool: 20 -> 3" in capsys.readouterr().err
    assert main([*argv, "--out", str(tmp_path / "serial"), "--pool", "3", "--new-run"]) == 0
    assert [d.name[:9] for d in (tmp_path / "serial").glob("previous-*")] == ["previous-"]

    monkeypatch.setattr(
        provenance, "source_state", lambda: {"commit": "abc", "dirty": True, "diff_sha256": "d" * 64}
    )
    monkeypatch.delenv("SINKWINDOW_ALLOW_DIRTY", raising=False)
    capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "dirty")]) == 2
    assert "uncommitted changes" in capsys.readouterr().err and not (tmp_path / "dirty").exists()
    assert main([*argv, "--out", str(tmp_path / "dirty"), "--allow-dirty"]) == 0
    assert {r["source_diff"] for r in ResultsStore(tmp_path / "dirty" / "eval").rows()} == {"d" * 64}


def test_a_rerun_that_adds_a_selection_writes_the_points_it_had_before_calibrating(
    pair, tmp_path, monkeypatch
):
    # heads-nll sorts before layers: a rerun adding it must not rewrite frontier.* without layers' point
    # while heads-nll calibrates (a run stopped there would leave the folder showing less than it had).
    model, tok = pair
    first = FrontierConfig(budgets=(0.75,), selections=("swa", "layers"), sinks=(4,), stream_window=64, samples=1,
                           calib_samples=1)  # fmt: skip
    frontier(model, tok, CONTEXT, first, tmp_path, name="tiny", progress=False)
    had = json.loads((tmp_path / "frontier.json").read_text())["points"]

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt("stopped in the new selection's calibration")

    monkeypatch.setattr(frontier_mod, "calibrate", stopped)
    again = FrontierConfig(budgets=(0.75,), selections=("swa", "heads-nll", "layers"), sinks=(4,), stream_window=64,
                           samples=1, calib_samples=1)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        frontier(model, tok, CONTEXT, again, tmp_path, name="tiny", progress=False)
    now = json.loads((tmp_path / "frontier.json").read_text())["points"]
    assert [(p["selection"], p["spec"], p["n"]) for p in now] == [
        (p["selection"], p["spec"], p["n"]) for p in had
    ]
    assert [p["selection"] for p in now] == ["swa", "layers"]

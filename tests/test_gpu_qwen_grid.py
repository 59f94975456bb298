"""The prepared GPU script for the Qwen grid (benchmarks/gpu_qwen_grid.py), without a GPU: its plan
(methods, tasks, lengths, samples, order, commands the real CLI parses) and, on a tiny model with the
S-NIAH family standing in for RULER, a stopped call and its resume from what came back."""

from __future__ import annotations

import importlib.util
import json
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_qwen_grid.py"
HYBRIDS = "swa:256:4+full:3.0,11.1;swa:256:4+full:3.0,11.1,17.0,20.1"


@pytest.fixture
def script():
    spec = importlib.util.spec_from_file_location("gpu_qwen_grid", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flag(argv: list[str], name: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == name]


def test_plan_is_the_full_grid_length_by_length(script, tmp_path):
    args = script.parse_args(["--hybrids", HYBRIDS, "--out", str(tmp_path)])
    methods = [*script.BASE_METHODS, *script.hybrid_specs(args.hybrids)]
    steps = script.plan(args, methods)
    assert [(s["name"], s["length"]) for s in steps] == [
        (name, n) for n in (4096, 8192, 16384, 32768) for name in ("ruler", "lcc")
    ]
    ruler = {
        "niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
        "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe",
    }  # fmt: skip
    for s in steps:
        argv = s["argv"]
        assert argv[:2] == ["eval", "ruler" if s["name"] == "ruler" else "code"]
        tasks = _flag(argv, "--tasks")[0].split(",")
        assert set(tasks) == (ruler if s["name"] == "ruler" else {"lcc"}) and len(tasks) == len(set(tasks))
        assert _flag(argv, "--methods") == [
            "full", "swa:256:4", "swa:1024:4", "evict:1024:4",
            "swa:256:4+full:3.0,11.1", "swa:256:4+full:3.0,11.1,17.0,20.1",
        ]  # fmt: skip
        assert _flag(argv, "--lengths") == [str(s["length"])] and _flag(argv, "--samples") == ["30"]
        assert _flag(argv, "--seed") == ["42"] and _flag(argv, "--device") == ["cuda"]
        assert _flag(argv, "--out") == [str(args.work / s["name"])]
        assert s["rows"] == 6 * len(tasks) * 30
    assert sum(s["rows"] for s in steps) == 4 * 6 * (11 + 1) * 30


def test_hybrids_come_from_the_flag_then_the_environment(script, monkeypatch):
    monkeypatch.setenv("QWEN_HYBRIDS", "swa:256:4+full:1.1;swa:256:4+full:2.0,2.1")
    assert script.hybrid_specs(None) == ["swa:256:4+full:1.1", "swa:256:4+full:2.0,2.1"]
    assert script.hybrid_specs(HYBRIDS) == HYBRIDS.split(";")
    with pytest.raises(SystemExit, match="two head hybrids"):
        script.hybrid_specs("swa:256:4+full:1.1")
    with pytest.raises(SystemExit, match="not a hybrid"):
        script.hybrid_specs("swa:256:4;swa:256:4+full:1.1")


def test_the_committed_calibration_gives_the_default_hybrids(script, monkeypatch):
    monkeypatch.delenv("QWEN_HYBRIDS", raising=False)
    committed = script.committed_hybrids()
    if not committed:
        pytest.skip(f"no committed calibration in {script.CALIBRATION}")
    assert script.hybrid_specs(None) == committed and len(set(committed)) == 2


def test_every_command_parses_with_the_real_cli(script, tmp_path):
    """No invented flag: each step's argv is what `sinkwindow eval` accepts, tasks and methods included."""
    from sinkwindow.cli import build_parser

    parser = build_parser()
    families = parser._subparsers._group_actions[0].choices["eval"]._subparsers._group_actions[0].choices
    missing = {"ruler", "code"} - set(families)
    if missing:
        pytest.skip(
            f"eval {' and '.join(sorted(missing))} not in this checkout yet (the RULER / LCC task branches)"
        )
    args = script.parse_args(["--hybrids", HYBRIDS, "--out", str(tmp_path), "--batch-size", "16"])
    for step in script.plan(args, [*script.BASE_METHODS, *script.hybrid_specs(args.hybrids)]):
        ns = parser.parse_args(step["argv"])
        assert ns.family == step["argv"][1] and ns.lengths == [step["length"]] and ns.samples == 30
        assert ns.tasks == _flag(step["argv"], "--tasks")[0].split(",") and ns.batch_size == 16
        assert ns.dtype == "bfloat16" and ns.no_progress


def test_rows_come_back_a_fresh_machine_resumes_and_the_time_limit_stops(
    script, tiny_folder, tmp_path, monkeypatch
):
    # S-NIAH-1 stands in for RULER (the same runner and results); tiny lengths, one sample.
    monkeypatch.setattr(script, "GRID", {"ruler": ("niah", ("niah_single_1",))})
    monkeypatch.setattr(script, "BASE_METHODS", ("full", "swa:64:4"))
    common = ["--model", str(tiny_folder), "--hybrids", "swa:64:4+full:0.0;swa:64:4+full:0.0,1.1",
              "--samples", "1", "--device", "cpu", "--dtype", "float32", "--progress-every", "5"]  # fmt: skip
    out1 = tmp_path / "out1"
    assert script.main([*common, "--lengths", "512", "--work", str(tmp_path / "w1"), "--out", str(out1)]) == 0
    # At most 8 files come back: the archive and the progress file.
    assert sorted(p.name for p in out1.iterdir()) == ["progress.json", "qwen_grid.tar.gz"]
    progress = json.loads((out1 / "progress.json").read_text())
    assert progress["state"] == "finished" and progress["rows"] == progress["rows_planned"] == 4
    with tarfile.open(out1 / "qwen_grid.tar.gz") as tar:
        assert {"ruler/results.jsonl", "ruler/config.json"} <= set(tar.getnames())
        rows = [json.loads(x) for x in tar.extractfile("ruler/results.jsonl").read().splitlines()]
    assert sorted(r["method"] for r in rows) == sorted(
        ["full", "swa:64:4", "swa:64:4+full:0.0", "swa:64:4+full:0.0,1.1"]
    )
    # A fresh machine given the archive has the 512 step done; a budget already spent stops the next
    # step, and what the folder holds still comes back.
    out2 = tmp_path / "out2"
    argv = [*common, "--lengths", "512,1024", "--work", str(tmp_path / "w2"), "--minutes", "0"]
    assert script.main([*argv, "--resume", str(out1 / "qwen_grid.tar.gz"), "--out", str(out2)]) == 3
    progress = json.loads((out2 / "progress.json").read_text())
    assert progress["state"].startswith("stopped at the time limit")
    assert [(s["length"], s["done"], s["rows"]) for s in progress["steps"]] == [(512, 4, 4), (1024, 0, 4)]

"""A benchmark run folder resumes and is never truncated: same settings measure only the missing
cells, other settings are refused, --new-run and --redo move old rows aside (bench.folder)."""

from __future__ import annotations

import json

import pytest

from sinkwindow.bench import BenchConfig, SyntheticConfig, run_bench
from sinkwindow.bench.folder import cell_key
from sinkwindow.runs.folder import RunMismatchError

TINY = SyntheticConfig(layers=2, hidden=48, heads=6, kv_heads=2, vocab=101, max_positions=4096)


def config(tmp_path, **kw) -> BenchConfig:
    base = dict(
        models=("synthetic",), methods=("full", "swa:16:4"), contexts=(8, 40), prefill_contexts=(32,),
        steps=2, warmup=1, chunk_size=8, synthetic=TINY, bandwidth_mib=0, out=str(tmp_path), plots=False,
        threads=1,
    )  # fmt: skip
    return BenchConfig(**{**base, **kw})


def lines(tmp_path) -> list[str]:
    return (tmp_path / "bench.jsonl").read_text().splitlines()


def test_a_rerun_with_the_same_settings_measures_nothing_and_keeps_every_row(tmp_path):
    first = run_bench(config(tmp_path))
    before = lines(tmp_path)
    assert len(before) == len(first) >= 6  # decode x2 x2, prefill x2, paired
    seen = []
    again = run_bench(config(tmp_path), on_row=seen.append)
    assert seen == [] and lines(tmp_path) == before
    assert [cell_key(r) for r in again] == [cell_key(r) for r in first]
    sessions = (tmp_path / "sessions.jsonl").read_text().splitlines()
    assert len(sessions) == 2 and json.loads(sessions[1])["kept_rows"] == len(first)


def test_a_run_cut_short_resumes_with_only_the_missing_cells(tmp_path):
    first = run_bench(config(tmp_path))
    keys = {cell_key(r) for r in first}
    kept = lines(tmp_path)[:3]
    # A kill mid-append leaves a torn last line: it is cut off and its cell measured again.
    (tmp_path / "bench.jsonl").write_text("\n".join(kept) + "\n" + kept[-1][:25])
    seen = []
    rows = run_bench(config(tmp_path), on_row=seen.append)
    assert lines(tmp_path)[:3] == kept  # what was finished is never rewritten
    assert len(seen) == len(first) - 3
    assert {cell_key(r) for r in seen}.isdisjoint({cell_key(json.loads(x)) for x in kept})
    assert [cell_key(r) for r in rows] == [cell_key(json.loads(x)) for x in lines(tmp_path)]
    assert {cell_key(r) for r in rows} == keys and len(rows) == len(keys)  # every cell once


def test_other_settings_are_refused_naming_what_differs_and_the_folder_is_untouched(tmp_path):
    run_bench(config(tmp_path))
    before = lines(tmp_path)
    with pytest.raises(RunMismatchError, match=r"steps: 2 -> 3.*--new-run"):
        run_bench(config(tmp_path, steps=3))
    assert lines(tmp_path) == before
    # --plots and --out change no measurement: no refusal.
    run_bench(config(tmp_path, plots=True))
    assert lines(tmp_path) == before


def test_new_run_moves_the_old_files_aside_and_starts_over(tmp_path):
    run_bench(config(tmp_path))
    before = lines(tmp_path)
    rows = run_bench(config(tmp_path, steps=3), new_run=True)
    (previous,) = tmp_path.glob("previous-*")
    assert (previous / "bench.jsonl").read_text().splitlines() == before
    assert (previous / "fingerprint.json").exists() and (previous / "sessions.jsonl").exists()
    assert all(r["steps"] == 3 for r in rows if r["status"] == "ok" and r["kind"] == "decode")
    assert len(lines(tmp_path)) == len(before)


def test_redo_measures_one_method_again_and_keeps_the_others(tmp_path):
    first = run_bench(config(tmp_path))
    others = [x for x in lines(tmp_path) if json.loads(x)["method"] != "swa:16:4"]
    seen = []
    rows = run_bench(config(tmp_path), on_row=seen.append, redo=["swa:16:4"])
    assert seen and all(r["method"] == "swa:16:4" for r in seen)
    assert lines(tmp_path)[: len(others)] == others
    (previous,) = tmp_path.glob("previous-*")
    moved = [json.loads(x) for x in (previous / "bench.jsonl").read_text().splitlines()]
    assert moved and {r["method"] for r in moved} == {"swa:16:4"}
    assert sorted(map(cell_key, rows), key=str) == sorted(map(cell_key, first), key=str)


def test_rows_with_no_record_of_their_settings_are_refused(tmp_path):
    (tmp_path / "bench.jsonl").write_text('{"model": "synthetic"}\n')
    with pytest.raises(RunMismatchError, match="no record of their settings"):
        run_bench(config(tmp_path))
    assert lines(tmp_path) == ['{"model": "synthetic"}']


def test_the_cli_refuses_a_mismatch_in_one_line_and_resumes_otherwise(tmp_path, capsys):
    from sinkwindow.cli import main

    argv = ["bench", "--model", "synthetic", "--methods", "full", "--contexts", "8", "--prefill-contexts", "none",
            "--steps", "2", "--warmup", "1", "--layers", "2", "--hidden", "48", "--heads", "6", "--vocab", "101",
            "--bandwidth-mib", "0", "--threads", "1", "--no-plots", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    n = len(lines(tmp_path))
    capsys.readouterr()
    assert main([*argv[:-2], "--steps", "3", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "other settings" in err[0] and "--new-run" in err[0]
    assert main(argv) == 0 and len(lines(tmp_path)) == n

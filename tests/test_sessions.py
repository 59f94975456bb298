"""The session log of a run folder: each invocation with work to do logs its start, each row when it
was written, and a session's wall time (start to its last row) survives a kill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sinkwindow.eval.report import write_report
from sinkwindow.eval.runner import EvalConfig, run_eval
from sinkwindow.runs.session_log import machine_info, read_sessions, session_lines, session_summary

pytest.importorskip("sinkwindow.eval.generators.haystack")


def test_rows_go_to_the_session_that_wrote_them():
    sessions = [
        {"started": "2026-12-02T10:00:00+00:00", "argv": ["a"]},
        {"started": "2026-12-02T12:00:00+00:00", "argv": ["b"]},
        {"started": "2026-12-02T15:00:00+00:00", "argv": ["c"]},  # killed before its first row
    ]
    rows = [
        {"written": "2026-12-02T10:30:00+00:00"},
        {"written": "2026-12-02T11:15:30+00:00"},
        {"written": "2026-12-02T12:00:00+00:00"},  # at the start of the second: the second's
        {"written": "2026-12-02T13:00:00+00:00"},
        {"score": 1.0},  # before sessions were logged: nobody's
        {"written": "2026-12-02T09:00:00+00:00"},  # before any logged start: nobody's
    ]
    got = session_summary(sessions, rows)
    assert [s["rows"] for s in got] == [2, 2, 0]
    assert [s["wall_s"] for s in got] == [4530.0, 3600.0, 0.0]
    assert [s["argv"] for s in got] == [["a"], ["b"], ["c"]]


def test_machine_info_names_cores_and_cpu():
    info = machine_info("cpu")
    assert info["cores"] >= 1 and info["cpu"] and "gpu" not in info
    # The versions of the libraries whose kernels decide the last digits, read without importing.
    import torch
    import transformers

    assert info["libraries"] == {"torch": torch.__version__, "transformers": transformers.__version__}
    if Path("/proc/cpuinfo").exists():
        assert info["cpu_id"].startswith("family ") and isinstance(info["avx512"], bool)


def test_each_invocation_with_work_logs_a_session_and_the_report_sums_them(tiny_pair, tmp_path):
    base = dict(
        model="tiny", methods=["swa:16:4"], tasks=["niah_single_1"], lengths=[512], babilong_lengths=[0],
        ppl_lengths=[256], ppl_windows=1, niah_max_new_tokens=4, chunk_size=64, babilong_chat=False,
    )  # fmt: skip
    run_eval(EvalConfig(samples=1, **base), tmp_path, model_and_tokenizer=tiny_pair, progress=False)
    run_eval(EvalConfig(samples=3, **base), tmp_path, model_and_tokenizer=tiny_pair, progress=False)
    run_eval(
        EvalConfig(samples=3, **base), tmp_path, model_and_tokenizer=tiny_pair, progress=False
    )  # nothing left
    sessions = read_sessions(tmp_path)
    assert len(sessions) == 2
    assert [s["samples_to_run"] for s in sessions] == [1, 2]
    assert [s["rows_before"] for s in sessions] == [0, 1]
    assert sessions[0]["machine"]["cores"] >= 1 and {"scheduler", "argv", "commit"} <= set(sessions[0])
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert all("written" in r for r in rows)
    assert [s["rows"] for s in session_summary(sessions, rows)] == [1, 2]
    md = write_report(tmp_path).read_text()
    assert "## Sessions" in md and "Written in 2 session(s)" in md
    assert session_lines(tmp_path / "nowhere", rows) == []

"""The long-context task registry: one entry per task, read by every consumer, and cheap to import."""

import subprocess
import sys

import pytest

from sinkwindow.eval import tasks
from sinkwindow.eval.runner import EvalConfig, plan, plan_size, planned_keys
from sinkwindow.eval.tasks import TASKS, get_task


def test_registry_names_every_task_once_with_its_group_and_report_column():
    ruler_only = ("niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "niah_multivalue",
                  "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2")  # fmt: skip
    assert ("ppl", "niah_single_1", "niah_single_2", "niah_single_3",
                               *(f"babilong_qa{i}" for i in range(1, 6)), "lcc", *ruler_only) == tasks.ALL_TASKS  # fmt: skip
    assert {"ppl": ("ppl",), "niah": tasks.NIAH_TASKS, "babilong": tasks.BABILONG_TASKS,
                            "code": ("lcc",), "ruler": (*tasks.NIAH_TASKS, *ruler_only)} == tasks.GROUPS  # fmt: skip
    # A run that names no tasks runs the paper's; lcc and the RULER-only tasks only when asked for.
    assert tasks.ALL_TASKS[: -1 - len(ruler_only)] == tasks.DEFAULT_TASKS
    assert EvalConfig(model="m").tasks == list(tasks.DEFAULT_TASKS)
    assert all(name == t.name for name, t in TASKS.items())
    # QA1-5 share one report column; every other task is its own.
    assert {t.family for t in TASKS.values() if t.group == "babilong"} == {"babilong"}
    assert all(TASKS[t].family == t for t in ruler_only)
    # The summary table shows RULER's categories, not a column per RULER-only task.
    assert tasks.HEADLINE_FAMILIES == ("niah_single_1", "niah_single_2", "niah_single_3", "babilong", "lcc",
                                       "ruler_retrieval", "ruler_multihop", "ruler_aggregation", "ruler_qa")  # fmt: skip
    assert sorted(t for c in tasks.RULER_CATEGORIES.values() for t in c) == sorted(tasks.GROUPS["ruler"])
    with pytest.raises(ValueError, match="unknown task 'niah_single_4'; choose from ppl, niah_single_1"):
        get_task("niah_single_4")


def test_importing_the_registry_imports_neither_torch_nor_a_generator():
    # Flag parsing reads names and limits from it; --help must stay fast.
    code = (
        "import sys, sinkwindow.eval.tasks; "
        "print(sorted(m for m in ('torch', 'numpy', 'sinkwindow.eval.generators.niah', 'sinkwindow.eval.generators.babilong', 'sinkwindow.eval.generators.code') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_plan_asks_each_task_for_its_lengths_counts_and_batch():
    config = EvalConfig(model="m", methods=["full"], tasks=["ppl", "niah_single_1", "babilong_qa1"],
                        lengths=[512, 1024], babilong_lengths=[0], ppl_lengths=[256], samples=3,
                        ppl_windows=2, batch_size=2)  # fmt: skip
    cells = plan(config)
    by_task = {}
    for c in cells:
        by_task.setdefault(c.task, []).append((c.length, c.indices))
    assert by_task["ppl"] == [(256, (0,)), (256, (1,))]  # one window per cell
    assert by_task["niah_single_1"] == [(512, (0, 1)), (512, (2,)), (1024, (0, 1)), (1024, (2,))]
    assert by_task["babilong_qa1"] == [(0, (0, 1)), (0, (2,))]
    assert plan_size(config) == 2 + 6 + 3 == len(planned_keys(config))


def test_deviations_are_those_of_the_tasks_run_each_once():
    niah_only = EvalConfig(model="m", tasks=["niah_single_1", "niah_single_2"], niah_max_new_tokens=None)
    lines = tasks.deviations(niah_only)
    assert len(lines) == len(set(lines)) and any(d.startswith("S-NIAH decodes at most") for d in lines)
    assert not any(d.startswith("BABILong") for d in lines)
    babilong_only = EvalConfig(model="m", tasks=["babilong_qa1"], lengths=[1024])
    assert not any("S-NIAH" in d for d in tasks.deviations(babilong_only))  # no S-NIAH ran


def test_task_settings_reach_only_their_own_rows_fingerprint():
    from sinkwindow.eval.fingerprint import row_settings

    settings = {"model": "m", "niah_max_new_tokens": 128, "babilong_chat": True, "ppl_bucket": 128}
    assert "niah_max_new_tokens" in row_settings(settings, "niah_single_3", "full")
    assert "babilong_chat" not in row_settings(settings, "niah_single_3", "full")
    assert set(row_settings(settings, "ppl", "full")) == {"model", "ppl_bucket", "method"}
    assert tasks.tasks_using("babilong_data") == frozenset(tasks.BABILONG_TASKS)


def test_summary_columns_follow_the_registry_one_per_task_and_babilong_averaged():
    from sinkwindow.eval.summary import summarize

    rows = [
        {"task": t, "method": m, "length": 1024, "seed": 0, "index": i, "score": 100.0 * ((i + k) % 2)}
        for k, t in enumerate(("niah_single_1", "babilong_qa1", "babilong_qa2"))
        for m in ("full", "swa:64:4")
        for i in range(4)
    ]
    acc = summarize(rows, n_boot=50)["accuracy"]
    assert set(acc) == {"niah_single_1", "babilong_qa1", "babilong_qa2", "babilong"}
    # A task's own column holds its rows; the average holds both QA tasks' (8 samples).
    assert acc["babilong_qa1"]["full"][1024]["n"] == 4 and acc["babilong_qa2"]["swa:64:4"][1024]["n"] == 4
    assert acc["babilong"]["full"][1024]["mean"] == 50.0


def test_lcc_is_run_by_name_from_eval_code_and_compare_tasks():
    from sinkwindow.cli import build_parser
    from sinkwindow.eval.cli import _compare_config

    args = build_parser().parse_args(["eval", "code", "--lengths", "1k", "--out", "o"])
    assert (args.family, args.lengths, args.tasks) == ("code", [1024], None)
    assert tasks.group_tasks("code") == ("lcc",)
    compare = build_parser().parse_args(["compare", "--tasks", "lcc,niah_single_3", "--methods", "full"])
    assert compare.tasks == ["lcc", "niah_single_3"]
    assert _compare_config(compare, "quick").tasks == ["lcc", "niah_single_3"]
    # A group name stands for its tasks; no --tasks is the paper's set, without lcc.
    assert build_parser().parse_args(["compare", "--tasks", "babilong"]).tasks == list(tasks.BABILONG_TASKS)
    default = build_parser().parse_args(["compare", "--methods", "full"])
    assert _compare_config(default, "quick").tasks == list(tasks.DEFAULT_TASKS)
    for bad in (
        ["compare", "--tasks", "lcc,,ppl"],
        ["compare", "--tasks", "lcd"],
        ["eval", "code", "--lengths", "200"],
    ):
        with pytest.raises(SystemExit):
            build_parser().parse_args(bad)

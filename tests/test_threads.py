"""The thread-count rule (``sinkwindow.runtime.threads``): decided from the request, OMP_NUM_THREADS and the load."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest
import torch

from sinkwindow.runtime import threads
from sinkwindow.runtime.threads import choose_threads


@pytest.mark.parametrize(
    "requested,env,cores,busy,expected,reason",
    [
        (3, {"OMP_NUM_THREADS": "1"}, 2, 2.3, 3, "--threads"),  # the flag beats everything
        (None, {"OMP_NUM_THREADS": "4"}, 2, 0.1, 4, "OMP_NUM_THREADS"),
        (None, {"OMP_NUM_THREADS": "2"}, 2, 3.0, 2, "OMP_NUM_THREADS"),  # set on purpose: honoured
        (None, {}, 2, 2.3, 1, "other work running"),
        (None, {}, 2, 1.0, 1, "other work running"),  # one single-thread job: the other core
        (None, {}, 2, 0.5, 1, "other work running"),  # half a core taken: busy
        (None, {}, 2, 0.49, 2, "idle machine, every core"),
        (None, {}, 2, 0.0, 2, "idle machine, every core"),
        (None, {}, 16, 3.0, 13, "other work running"),  # a big box leaves 3 cores to the others
        (None, {}, 16, 15.6, 1, "other work running"),
        (None, {}, 16, 40.0, 1, "other work running"),  # never below one thread
        (None, {}, 1, 5.0, 1, "idle machine, every core"),  # one core: one thread either way
        (None, {"OMP_NUM_THREADS": ""}, 2, 2.0, 1, "other work running"),  # empty: not set
        (None, {"OMP_NUM_THREADS": "auto"}, 2, 0.0, 2, "idle machine, every core"),  # not a count
        (None, {"OMP_NUM_THREADS": "0"}, 2, 2.0, 1, "other work running"),
    ],
    ids=lambda v: (
        str(v).replace(" ", "_") if not isinstance(v, dict) else "-".join(f"{k}={x}" for k, x in v.items())
    ),
)
def test_choose_threads(requested, env, cores, busy, expected, reason):
    choice = choose_threads(requested, cores=cores, busy=busy, env=env)
    assert (choice.threads, choice.reason) == (expected, reason)


def test_unknown_busy_counts_as_idle(monkeypatch):
    monkeypatch.setattr(threads, "busy_cores", lambda: None)  # no /proc/stat, no load average
    assert choose_threads(cores=4, env={}).threads == 4


def test_choose_threads_reads_the_machine_when_not_told(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "busy_cores", lambda: 1.04)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    choice = choose_threads()
    assert choice.threads == 1
    assert choice.describe() == "torch threads: 1 (2 cores, 1.0 busy: other work running)"


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="busy_cores samples /proc/stat")
def test_busy_cores_sees_a_running_process_and_not_itself():
    """A child spinning one core reads as about one busy core; this process's own spinning does not
    count. (Other tests may run beside this one, so only bounds that their load cannot break.)"""
    ctx = multiprocessing.get_context("spawn")
    child = ctx.Process(target=_spin, args=(6.0,))
    child.start()
    try:
        time.sleep(1.0)  # let it start spinning
        assert threads.busy_cores(1.0) >= 0.7
    finally:
        child.terminate()
        child.join()
    # This process spinning (another thread of it): its own time is taken out of the machine's.
    baseline = threads.busy_cores(1.0)
    spinner = threading.Thread(target=_spin, args=(1.5,))
    spinner.start()
    try:
        with_own_spin = threads.busy_cores(1.0)
    finally:
        spinner.join()
    assert with_own_spin < baseline + 0.5


def test_busy_cores_falls_back_to_the_load_average(monkeypatch):
    monkeypatch.setattr(threads, "_cpu_counters", lambda: None)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1.7, 1.0, 0.5))
    assert threads.busy_cores() == 1.7


def test_apply_threads_decides_once_and_says_so_once(monkeypatch, capsys):
    from sinkwindow.runtime.notices import show_notices

    show_notices()  # what the CLI does; a library caller sees nothing unless it configures logging
    monkeypatch.setattr(threads, "_CHOSEN", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    try:
        first = threads.apply_threads()
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # a later change does not move a running process
        again = threads.apply_threads()
        assert first is again and torch.get_num_threads() == 1
        err = capsys.readouterr().err
        assert err.count("torch threads: 1") == 1 and "OMP_NUM_THREADS" in err
        # Changed behind its back (by a library, or an earlier run in this process): set back, so the
        # recorded count is the one in use.
        torch.set_num_threads(2)
        assert threads.apply_threads() is first and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_eval_records_threads_outside_the_fingerprint(tiny_folder):
    from sinkwindow.eval.fingerprint import run_settings
    from sinkwindow.eval.runner import EvalConfig

    one = EvalConfig(model=str(tiny_folder), methods=["full"], tasks=["ppl"], threads=1)
    two = EvalConfig(model=str(tiny_folder), methods=["full"], tasks=["ppl"], threads=2)
    assert one.to_dict()["threads"] == 1
    assert run_settings(one) == run_settings(two)
    with pytest.raises(ValueError, match="threads"):
        EvalConfig(model=str(tiny_folder), methods=["full"], tasks=["ppl"], threads=0)


def test_a_serial_eval_writes_its_thread_count_to_config_json(tiny_pair, tmp_path, monkeypatch):
    import json

    from sinkwindow.eval.runner import EvalConfig, run_eval

    monkeypatch.setattr(threads, "_CHOSEN", None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = EvalConfig(
        model="tiny", methods=["full"], tasks=["babilong_qa1"], babilong_lengths=[0], samples=1,
        babilong_chat=False,
    )  # fmt: skip
    run_eval(cfg, tmp_path, model_and_tokenizer=tiny_pair, progress=False)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["torch_threads"] == {
        "threads": 1,
        "cores": threads.available_cores(),
        "reason": "OMP_NUM_THREADS",
    }
    fingerprint = json.loads((tmp_path / "fingerprint.json").read_text())["settings"]
    assert not any("thread" in key for key in fingerprint)


def test_an_automatic_count_is_re_decided_between_cells_and_an_asked_one_is_kept(monkeypatch, caplog):
    """make demo on a fresh clone chose 1 thread in its first busy seconds and kept it for 20 minutes."""
    import logging

    monkeypatch.setattr(threads, "_CHOSEN", None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    load = {"busy": 1.0}
    monkeypatch.setattr(threads, "busy_cores", lambda seconds=0.25: load["busy"])
    before = torch.get_num_threads()
    try:
        assert threads.apply_threads(quiet=True).threads == 1
        assert threads.rechoose_threads() is None  # still busy: no change, nothing logged
        load["busy"] = 0.0
        with caplog.at_level(logging.WARNING, logger="sinkwindow.runtime.threads"):
            changed = threads.rechoose_threads()
            assert changed is not None and changed.threads == 2 and torch.get_num_threads() == 2
            assert threads.rechoose_threads() is None  # logged once per change
        assert caplog.text.count("torch threads 1 -> 2") == 1
        monkeypatch.setattr(threads, "_CHOSEN", None)
        threads.apply_threads(1, quiet=True)  # --threads 1: kept whatever the machine does
        assert threads.rechoose_threads() is None and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_set_threads_sets_a_given_count_and_leaves_it_alone_for_none():
    import torch

    from sinkwindow.runtime.threads import set_threads

    before = torch.get_num_threads()
    try:
        set_threads(None)
        assert torch.get_num_threads() == before
        set_threads(2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_every_thread_count_is_set_through_the_threads_module():
    import ast
    from pathlib import Path

    import sinkwindow

    package = Path(sinkwindow.__file__).parent
    calls = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "threads.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in ("set_num_threads", "sched_getaffinity")
    ]
    assert calls == []

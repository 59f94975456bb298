"""The thread-count rule (``sinkwindow.threads``): decided from the request, OMP_NUM_THREADS and the load."""

from __future__ import annotations

import pytest
import torch

from sinkwindow import threads
from sinkwindow.threads import choose_threads


@pytest.mark.parametrize(
    "requested,env,cores,load,expected,reason",
    [
        (3, {"OMP_NUM_THREADS": "1"}, 2, 2.3, 3, "--threads"),  # the flag beats everything
        (None, {"OMP_NUM_THREADS": "4"}, 2, 0.1, 4, "OMP_NUM_THREADS"),
        (None, {"OMP_NUM_THREADS": "2"}, 2, 3.0, 2, "OMP_NUM_THREADS"),  # set on purpose: honoured
        (None, {}, 2, 2.3, 1, "other work running"),
        (None, {}, 2, 1.5, 1, "other work running"),  # at cores - 0.5: busy
        (None, {}, 2, 1.49, 2, "idle machine, every core"),
        (None, {}, 16, 3.0, 16, "idle machine, every core"),
        (None, {}, 16, 15.6, 1, "other work running"),
        (None, {}, 1, 5.0, 1, "idle machine, every core"),  # one core: one thread either way
        (None, {}, 4, None, 4, "idle machine, every core"),  # no load average on this platform
        (None, {"OMP_NUM_THREADS": ""}, 2, 2.0, 1, "other work running"),  # empty: not set
        (None, {"OMP_NUM_THREADS": "auto"}, 2, 0.0, 2, "idle machine, every core"),  # not a count
        (None, {"OMP_NUM_THREADS": "0"}, 2, 2.0, 1, "other work running"),
    ],
    ids=lambda v: (
        str(v).replace(" ", "_") if not isinstance(v, dict) else "-".join(f"{k}={x}" for k, x in v.items())
    ),
)
def test_choose_threads(requested, env, cores, load, expected, reason, monkeypatch):
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (load, load, load))
    choice = choose_threads(requested, cores=cores, load=load, env=env)
    assert (choice.threads, choice.reason) == (expected, reason)


def test_choose_threads_reads_the_machine_when_not_told(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (2.3, 2.0, 1.0))
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    choice = choose_threads()
    assert choice.threads == 1
    assert choice.describe() == "torch threads: 1 (2 cores, load 2.3: other work running)"


def test_apply_threads_decides_once_and_prints_once(monkeypatch, capsys):
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

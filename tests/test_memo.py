"""The calibration memo: finished runs survive the process, a stopped calibration resumes at the run it
was in with the same result, and what it stores is what a fresh computation gives."""

from __future__ import annotations

import json

import pytest

from conftest import eval_pair
from sinkwindow.tuning import CAL_SEED, calibrate, calibration_prompts
from sinkwindow.tuning import nll as nll_mod
from sinkwindow.tuning.memo import Memo, prompts_digest
from sinkwindow.tuning.nll import mean_nll, nll_key

LENGTH = 512  # tiny-pair S-NIAH prompts of ~380-420 tokens: well past the windows below


@pytest.fixture(scope="module")
def pair():
    return eval_pair()


def test_memo_keeps_finished_runs_across_processes_and_skips_a_torn_line(tmp_path):
    path = tmp_path / "runs.jsonl"
    memo = Memo(path)
    memo.put({"kind": "nll", "spec": "swa:64:4"}, 1.5)
    memo.put({"spec": "swa:64:0", "kind": "nll"}, 2.5)
    with pytest.raises(ValueError, match="not None"):
        memo.put({"kind": "nll"}, None)
    with path.open("a") as f:
        f.write('{"key": {"kind": "nll", "spec": "swa:6')  # a crash mid-write
    again = Memo(path)
    assert len(again) == 2
    assert again.get({"spec": "swa:64:4", "kind": "nll"}) == 1.5  # key order does not matter
    assert again.get({"kind": "nll", "spec": "swa:64:0"}) == 2.5
    assert again.get({"kind": "nll", "spec": "swa:64:8"}) is None
    assert again.hits == 2
    in_memory = Memo(None)
    in_memory.put({"a": 1}, [1, 2])
    assert in_memory.get({"a": 1}) == [1, 2] and in_memory.path is None


def test_a_tally_counts_every_run_used_with_the_cpu_it_cost_where_it_was_computed(tmp_path):
    memo = Memo(tmp_path / "runs.jsonl")
    memo.put({"run": 1}, 0.5, cpu_s=60.0)  # computed before any tally, e.g. by an earlier point
    with memo.tally() as outer:
        assert memo.get({"run": 1}) == 0.5
        with memo.tally() as inner:
            memo.put({"run": 2}, 0.25, cpu_s=30.0)
            assert memo.get({"run": 2}) == 0.25  # used twice, counted once
        assert memo.get({"run": 3}) is None  # not computed: costs nothing
    assert outer.cpu_s == 90.0 and outer.computed_cpu_s == 30.0
    assert inner.cpu_s == 30.0 and inner.computed_cpu_s == 30.0
    with Memo(tmp_path / "runs.jsonl").tally() as t:  # the cost is kept on disk with the run
        pass
    again = Memo(tmp_path / "runs.jsonl")
    with again.tally() as t:
        again.get({"run": 1}), again.get({"run": 2})
    assert t.cpu_s == 90.0 and t.computed_cpu_s == 0.0


def test_a_scoped_memo_finds_only_its_own_scope(tmp_path):
    path = tmp_path / "runs.jsonl"
    Memo(path, scope={"model": "a"}).put({"kind": "nll"}, 1.0)
    assert Memo(path, scope={"model": "a"}).get({"kind": "nll"}) == 1.0
    assert Memo(path, scope={"model": "b"}).get({"kind": "nll"}) is None
    assert Memo(path).get({"kind": "nll"}) is None


def test_prompt_digest_changes_with_any_token(pair):
    prompts = calibration_prompts(pair[1], samples=2, length=LENGTH)
    other = calibration_prompts(pair[1], samples=2, length=LENGTH, seed=CAL_SEED + 1)
    assert prompts_digest(prompts) == prompts_digest(calibration_prompts(pair[1], samples=2, length=LENGTH))
    assert prompts_digest(prompts) != prompts_digest(other)
    assert prompts_digest(prompts) != prompts_digest(prompts[:1])


def test_mean_nll_from_the_memo_equals_a_fresh_run_and_touches_no_model(pair, tmp_path, monkeypatch):
    model, tok = pair
    prompts = calibration_prompts(tok, samples=2, length=LENGTH)
    memo = Memo(tmp_path / "runs.jsonl")
    fresh = mean_nll(model, "swa:64:4", prompts, 128, None)
    stored = mean_nll(model, "swa:64:4", prompts, 128, None, memo=memo)
    assert stored == pytest.approx(fresh, abs=1e-6)
    row = json.loads((tmp_path / "runs.jsonl").read_text().splitlines()[0])
    assert row["key"] == nll_key("swa:64:4", prompts, 128, "override") and row["value"] == stored

    def no_model(*a, **k):
        raise AssertionError("the memo had this run")

    monkeypatch.setattr(nll_mod, "answer_nll", no_model)
    assert mean_nll(model, "swa:64:4", prompts, 128, None, memo=Memo(tmp_path / "runs.jsonl")) == stored
    with pytest.raises(AssertionError, match="memo had"):  # another chunk size is another run
        mean_nll(model, "swa:64:4", prompts, 64, None, memo=memo)


def _counting(monkeypatch, stop_after: int | None = None) -> list:
    """Count the prompt passes ``answer_nll`` makes; raise after ``stop_after`` of them (a stop)."""
    calls = []
    real = nll_mod.answer_nll

    def counted(model, prompt, chunk_size=512):
        if stop_after is not None and len(calls) >= stop_after:
            raise KeyboardInterrupt
        calls.append(1)
        return real(model, prompt, chunk_size)

    monkeypatch.setattr(nll_mod, "answer_nll", counted)
    return calls


def test_a_stopped_greedy_calibration_resumes_where_it_stopped_with_the_same_answer(
    pair, tmp_path, monkeypatch
):
    model, tok = pair
    args = dict(by="head", select="greedy", pool=4, samples=2, length=LENGTH, progress=False, sinks=[0, 4])
    whole = calibrate(model, tok, "swa:64:4", 2, **args)
    with monkeypatch.context() as m:  # a memo also runs a spec met twice (greedy, then the sinks) once
        whole_calls = _counting(m)
        in_memory = calibrate(model, tok, "swa:64:4", 2, memo=Memo(None), **args)
    assert in_memory.spec == whole.spec and in_memory.steps == whole.steps
    path = tmp_path / "runs.jsonl"
    with monkeypatch.context() as m:
        _counting(m, stop_after=9)  # part-way through the first base's single-head scores
        with pytest.raises(KeyboardInterrupt):
            calibrate(model, tok, "swa:64:4", 2, memo=Memo(path), **args)
    kinds = [json.loads(line)["key"]["kind"] for line in path.read_text().splitlines()]
    kept = kinds.count("nll")
    assert kinds == ["mass"] + ["nll"] * 4  # 9 passes of 2 prompts: 4 whole runs kept, the one in flight lost
    with monkeypatch.context() as m:
        resumed_calls = _counting(m)
        resumed = calibrate(model, tok, "swa:64:4", 2, memo=Memo(path), **args)
    assert resumed.spec == whole.spec and resumed.chosen == whole.chosen and resumed.steps == whole.steps
    assert resumed.scores["nll"] == pytest.approx(whole.scores["nll"], abs=1e-9)
    assert len(resumed_calls) == len(whole_calls) - 2 * kept
    with monkeypatch.context() as m:  # everything is kept now: a rerun runs nothing
        again_calls = _counting(m)
        again = calibrate(model, tok, "swa:64:4", 2, memo=Memo(path), **args)
    assert again_calls == [] and again.spec == whole.spec


def test_gates_are_trained_once_per_base_and_prompts(pair, tmp_path, monkeypatch):
    model, tok = pair
    memo = Memo(tmp_path / "runs.jsonl")
    first = calibrate(model, tok, "swa:64:4", 1, by="head", criterion="gates", samples=1, length=LENGTH,
                      progress=False, memo=memo)  # fmt: skip
    from sinkwindow.tuning import gates

    def no_training(*a, **k):
        raise AssertionError("the memo had these gates")

    monkeypatch.setattr(gates, "train_gates", no_training)
    # Another K on the same prompts and base: the same gates, read back.
    second = calibrate(model, tok, "swa:64:4", 3, by="head", criterion="gates", samples=1, length=LENGTH,
                       progress=False, memo=Memo(tmp_path / "runs.jsonl"))  # fmt: skip
    assert second.scores["gates"] == first.scores["gates"] and second.gate_losses == first.gate_losses
    assert second.chosen[:1] == first.chosen
    with pytest.raises(AssertionError, match="memo had these gates"):  # other prompts: trained again
        calibrate(model, tok, "swa:64:4", 1, by="head", criterion="gates", samples=2, length=LENGTH,
                  progress=False, memo=memo)  # fmt: skip


def test_a_stopped_gate_training_resumes_at_its_last_step(pair, tmp_path, monkeypatch):
    from sinkwindow.tuning import calibrate as calibrate_fn
    from sinkwindow.tuning import gates

    model, tok = pair
    args = dict(by="head", criterion="gates", samples=1, length=LENGTH, progress=False)
    whole = calibrate_fn(model, tok, "swa:64:4", 2, **args)
    real, calls = gates.gated_forward, []

    def stops_at_step_25(*a, **k):
        if len(calls) == 25:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*a, **k)

    path = tmp_path / "runs.jsonl"
    with monkeypatch.context() as m:
        m.setattr(gates, "gated_forward", stops_at_step_25)
        with pytest.raises(KeyboardInterrupt):
            calibrate_fn(model, tok, "swa:64:4", 2, memo=Memo(path), **args)
    kept = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["value"]["step"] for r in kept if r["key"]["kind"] == "gates-progress"] == list(range(1, 26))
    calls.clear()
    with monkeypatch.context() as m:
        m.setattr(gates, "gated_forward", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
        resumed = calibrate_fn(model, tok, "swa:64:4", 2, memo=Memo(path), **args)
    assert len(calls) == len(whole.gate_losses) - 25  # only the steps left
    assert resumed.chosen == whole.chosen and resumed.gate_losses[:25] == whole.gate_losses[:25]
    assert resumed.scores["gates"] == pytest.approx(whole.scores["gates"], abs=1e-6)

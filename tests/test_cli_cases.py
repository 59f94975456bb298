"""CLI cases of the input audit (issue 34): no flag but the method may change what a command returns."""

from __future__ import annotations

import json

import pytest

from sinkwindow.cli import main

PROMPT = " ".join(f"w{2 + (7 * i) % 97}" for i in range(30))


def _tokens(capsys, argv) -> list[str]:
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    info = json.loads(out[-1])
    return out[:-1], info


@pytest.fixture
def lolcats_checkpoint(tmp_path, tiny_folder):
    """An untrained lolcats:8 checkpoint for the tiny model (its output, not its quality, is tested)."""
    import sinkwindow
    from sinkwindow.linear import convert, save_checkpoint

    model, _ = sinkwindow.load(str(tiny_folder))
    return save_checkpoint(convert(model, "lolcats:8"), tmp_path / "lolcats8.safetensors")


@pytest.mark.parametrize(
    "method", ["full", "swa:8:2", "evict:8:2", "swa:8:2:cache", "swa:8:2+full:1", "lolcats:8"]
)
def test_generate_does_not_depend_on_chunk_size(method, tiny_folder, lolcats_checkpoint, capsys):
    """``generate --method evict:W:S`` used to prefill ``ids[:, :-1]`` above the chunk size and run the
    last prompt token as a windowed decode step, so its answer changed with ``--chunk-size``."""
    extra = ["--checkpoint", str(lolcats_checkpoint)] if method.startswith("lolcats") else []
    runs = []
    for chunk in ("4", "7", "64"):
        text, info = _tokens(
            capsys,
            ["generate", "--model", str(tiny_folder), "--method", method, "--prompt", PROMPT,
             "--max-new-tokens", "6", "--chunk-size", chunk, "--no-progress", *extra],
        )  # fmt: skip
        assert 16 < info["prompt_tokens"] < 64  # longer than two of the chunk sizes
        runs.append(text)
    assert runs[0] == runs[1] == runs[2]


def test_generate_evict_equals_the_library_generate(tiny_folder, capsys):
    import torch

    import sinkwindow

    text, _ = _tokens(
        capsys,
        ["generate", "--model", str(tiny_folder), "--method", "evict:8:2", "--prompt", PROMPT,
         "--max-new-tokens", "6", "--chunk-size", "4", "--no-progress"],
    )  # fmt: skip
    model, tok = sinkwindow.load(str(tiny_folder), method="evict:8:2")
    ids = tok(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = sinkwindow.generate(model, ids, 6, chunk_size=1024, eos_token_id=tok.eos_token_id)
    assert text[0] == tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def test_a_ray_address_where_nothing_listens_fails_in_seconds(tiny_folder, tmp_path, capsys):
    """``--ray 127.0.0.1:6390`` with nothing there used to hang for minutes ("Failed to connect to GCS");
    now a TCP probe refuses it in one line (a hang would stall this test rather than fail an assert)."""
    import socket

    pytest.importorskip("ray")
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rc = main(["eval", "ppl", "--model", str(tiny_folder), "--methods", "full", "--lengths", "16", "--samples", "1",
               "--ray", f"127.0.0.1:{port}", "--no-progress", "--out", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and f"nothing answers at Ray address 127.0.0.1:{port}" in err


@pytest.mark.parametrize(
    "spec, said",
    [
        ("swa:+64", "malformed method 'swa:+64': before '+' must come swa:W[:S]"),
        ("liger:0", "e.g. liger:64)"),
    ],
)
def test_spec_messages_name_what_was_typed(spec, said):
    import sinkwindow

    with pytest.raises(ValueError) as err:
        sinkwindow.parse_spec(spec)
    assert said in str(err.value)


def test_help_texts_say_what_the_code_does(capsys):
    for argv, want, unwanted in [
        (["--help"], "liger:W", None),
        (["bench", "--help"], "(default: 512)", "(default: None)"),
        (["eval", "ppl", "--help"], "ppl, the only task", "niah_single_3"),
        (["eval", "niah", "--help"], "/proc/stat", "1-minute load"),
    ]:
        assert main(argv) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert want in out and (unwanted is None or unwanted not in out), argv


def test_hybrid_units_and_missing_paths_are_refused_before_the_model_loads(
    tiny_folder, tmp_path, capsys, monkeypatch
):
    import sinkwindow.models.loading as models

    loads = []
    monkeypatch.setattr(
        models, "_load_gguf", lambda *a, **k: loads.append(a) or (_ for _ in ()).throw(AssertionError)
    )
    rc = main(["eval", "ppl", "--model", str(tiny_folder), "--methods", "swa:8:2+full:99", "--lengths", "16",
               "--samples", "1", "--no-progress", "--out", str(tmp_path / "run")])  # fmt: skip
    assert rc == 2 and "names layer 99, but the model has" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    missing = str(tmp_path / "no" / "such" / "model")
    rc = main(["generate", "--model", missing, "--prompt", "w2", "--max-new-tokens", "1", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "no model folder or file at" in err and "offline" not in err


def test_train_on_too_few_rows_says_what_the_rows_are_for(tmp_path, tiny_folder, capsys):
    data = tmp_path / "one.jsonl"
    data.write_text('{"instruction": "Say hi.", "output": "hi"}\n')
    rc = main(["train", "--model", str(tiny_folder), "--method", "lolcats:8", "--data", str(data), "--tokens", "64",
               "--no-progress", "--out", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "has 1 row(s), but its first 200 are held out for validation" in err


def test_start_from_a_finished_run_is_refused_before_the_model_loads(tiny_folder, tmp_path, capsys):
    import sinkwindow
    from sinkwindow.linear import convert, save_checkpoint
    from sinkwindow.linear.lora import add_lora

    model, _ = sinkwindow.load(str(tiny_folder))
    convert(model, "lolcats:8")
    add_lora(model)
    finished = save_checkpoint(model, tmp_path / "finished.safetensors")
    out = tmp_path / "run"
    rc = main(["train", "--model", str(tiny_folder), "--method", "lolcats:8", "--start-from", str(finished),
               "--tokens", "64", "--no-progress", "--out", str(out)])  # fmt: skip
    assert rc == 2 and "holds LoRA adapters (a finished run)" in capsys.readouterr().err
    assert not out.exists()


def test_a_negative_byte_size_is_refused_by_its_own_check(capsys):
    # argparse alone reads "-5MiB" as an option and says "expected one argument".
    rc = main(["tune", "--kv-budget", "-5MiB", "--context", "4k", "--task", "niah", "--out", "x"])
    err = capsys.readouterr().err
    assert rc == 2 and "cannot be negative" in err and "expected one argument" not in err


def test_checkpoint_messages_name_the_methods_asked(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [
        "compare",
        "--methods",
        "full,liger:256",
        "--checkpoint",
        f"liger:256={empty}",
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2
    assert f"sinkwindow train --method liger:256 --data DATA --out {empty}" in capsys.readouterr().err
    ckpt = tmp_path / "a.safetensors"
    ckpt.write_bytes(b"")
    argv = [
        "compare",
        "--methods",
        "lolcats:256,liger:256",
        "--checkpoint",
        str(ckpt),
        "--out",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "several (lolcats:256, liger:256)" in err and f"--checkpoint lolcats:256={ckpt}" in err
    assert "lolcats:64" not in err


def test_the_second_audit_gets_one_line_errors_from_the_cli(tiny_folder, tmp_path, capsys, monkeypatch):
    """Cases of the second input audit (tools/input_audit.py) that were tracebacks or taken in silence."""
    import torch

    monkeypatch.setenv("SINKWINDOW_ALLOW_DIRTY", "1")  # the source may be mid-edit; these runs write no rows

    data = tmp_path / "lm"
    data.mkdir()
    cases = [
        (["eval", "ppl", "--model", str(tiny_folder), "--methods", "full", "--lengths", "16", "--samples",
          "99999999999999999999", "--out", str(tmp_path / "a")], "must be at most 1,000,000,000,000,000"),
        (["train", "--model", str(tiny_folder), "--method", "lolcats:8", "--tokens", "99999999999999999999",
          "--out", str(tmp_path / "b")], "too large a size"),
        (["bench", "--model", str(tmp_path / "no" / "such"), "--methods", "swa:8:2", "--out", str(tmp_path / "c")],
         "no model folder or file at"),
        (["generate", "--model", str(tiny_folder), "--prompt", "w2 w3", "--chat", "--no-progress"],
         "has no chat template"),
        (["eval", "lm-eval", "--model", str(tiny_folder), "--methods", "swa:8:2", "--tasks", "mmlu_bogus",
          "--data-dir", str(data), "--out", str(tmp_path / "d")], "unknown MMLU subject"),
        (["eval", "lm-eval", "--model", str(tiny_folder), "--methods", "swa:8:2", "--tasks", "arc_easy",
          "--limit", "piqa=2", "--data-dir", str(data), "--out", str(tmp_path / "e")], "--limit names piqa"),
    ]  # fmt: skip
    if not torch.cuda.is_available():
        cases.append((["bench", "--model", "synthetic", "--device", "cuda", "--out", str(tmp_path / "f")],
                      "CUDA is not available"))  # fmt: skip
    for argv, said in cases:
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and said in err and "Traceback" not in err, (argv, err)
    assert not any((tmp_path / x).exists() for x in "abcdef")


def test_the_second_audit_flags_overridden_in_silence_and_unnamed_files(tiny_folder, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "a", "output": "b"}\n{torn\n')
    text = tmp_path / "file.txt"
    text.write_text("not a model\n")
    train = ["train", "--model", str(tiny_folder), "--out", str(tmp_path / "t")]
    cases = [
        ([*train, "--method", "lolcats:8", "--no-finetune", "--finetune-tokens", "2k"], "--no-finetune skips stage 2"),
        ([*train, "--method", "lolcats:8", "--paper-budget", "--tokens", "1k"], "drop --tokens"),
        ([*train, "--method", "liger:8", "--transfer-tokens", "2k"], "no attention-transfer stage"),
        ([*train, "--method", "liger:8", "--lr-transfer-drop-at", "5"], "drop --lr-transfer-drop-at"),
        ([*train, "--method", "lolcats:8", "--no-finetune", "--lr-finetune-drop-at", "5"], "would not be used"),
        ([*train, "--method", "lolcats:8", "--tokens", "3k", "--lr-finetune-drop-at", "50"],
         "drop at step 50 (--lr-finetune-drop-at) would never happen"),
        ([*train, "--method", "lolcats:8", "--data", str(bad), "--tokens", "1k"], f"{bad}:2 is not a JSON row"),
        (["generate", "--model", str(text), "--prompt", "w2", "--no-progress"], "is a file but not a model"),
        (["tune", "--model", str(tiny_folder), "--kv-budget", "64KiB", "--context", "256", "--task", "niah",
          "--calib-length", "4k", "--out", str(tmp_path / "u")], "--calib-length 4096 is beyond the model's 1024"),
        (["tune", "--model", str(tiny_folder), "--kv-budget", "64KiB", "--context", "256", "--task", "niah",
          "--seed", "8000000", "--heldout-seed", "8000000", "--out", str(tmp_path / "u")], "--heldout-seed 8000001"),
        (["--method", "swa:8:2", "generate"], "options go after it"),
        (["serve", "--model", str(tiny_folder), "--threads", "1000000"], "between 1 and 4096"),
    ]  # fmt: skip
    for argv, said in cases:
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc == 2 and said in err and "Traceback" not in err, (argv, err)
    assert not (tmp_path / "t").exists() and not (tmp_path / "u").exists()

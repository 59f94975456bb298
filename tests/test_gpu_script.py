"""The prepared GPU script (benchmarks/gpu_paper_budget.py), run end to end on the CPU with --smoke:
both retrofits train at the micro-batch asked, and what comes back unpacks into a run folder whose
adapter loads."""

from __future__ import annotations

import importlib.util
import json
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_paper_budget.py"


@pytest.fixture
def script():
    spec = importlib.util.spec_from_file_location("gpu_paper_budget", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def alpaca(tmp_path):
    rows = [{"instruction": f"w{i % 90 + 1} w{(i * 7) % 90 + 1}", "input": "", "output": " ".join(["w3"] * (i % 9 + 2))}
            for i in range(400)]  # fmt: skip
    path = tmp_path / "alpaca.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_smoke_run_trains_both_and_brings_back_archives_that_resume(
    script, tiny_folder, alpaca, tmp_path, capsys
):
    out = tmp_path / "out"
    rc = script.main(["--model", str(tiny_folder), "--data", str(alpaca), "--methods", "liger:16,lolcats:16",
                      "--device", "cpu", "--seq-len", "32", "--batch-size", "2", "--eval-every", "1",
                      "--val-batches", "2", "--smoke", "--out", str(out)])  # fmt: skip
    assert rc == 0
    report = json.loads((out / "gpu_report.json").read_text())
    assert [r["method"] for r in report["runs"]] == ["liger:16", "lolcats:16"]
    assert all(r["finished"] and r["exit"] == 0 for r in report["runs"])
    assert set(report["runs"][1]["stages"]) == {"transfer", "finetune"}
    # Two optimiser steps of 2 chunks x 32 tokens each: --batch-size reaches the trainer.
    for stage in (*report["runs"][1]["stages"].values(), report["runs"][0]["stages"]["finetune"]):
        assert stage["steps"] == 2 and stage["tokens"] == 2 * 2 * 32
    # At most 8 files come back from the device: one archive per method and the report.
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
        "gpu_report.json",
        "liger-16.tar",
        "lolcats-16.tar",
    ]
    run = tmp_path / "unpacked"
    with tarfile.open(out / "lolcats-16.tar") as tar:
        assert "model.safetensors" in tar.getnames() and "transfer/log.jsonl" in tar.getnames()
        tar.extractall(run, filter="data")
    import sinkwindow
    from sinkwindow.linear.convert import is_converted

    model, _ = sinkwindow.load(
        str(tiny_folder), method="lolcats:16", checkpoint=str(run / "model.safetensors")
    )
    assert is_converted(model)
    capsys.readouterr()


def test_gguf_parts_join_in_name_order(script, tmp_path):
    for i, chunk in enumerate((b"GGUF", b"-body-", b"end")):
        (tmp_path / f"m.gguf.part{i}").write_bytes(chunk)
    joined = script.assemble_gguf(str(tmp_path / "m.gguf.part*"), tmp_path / "w" / "m.gguf")
    assert joined.read_bytes() == b"GGUF-body-end"
    with pytest.raises(SystemExit, match="no GGUF parts"):
        script.assemble_gguf(str(tmp_path / "none*"), tmp_path / "x.gguf")

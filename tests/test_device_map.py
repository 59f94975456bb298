"""Large models: ``device_map`` placement through accelerate, on CPU.

A CPU-only machine cannot split a model over GPUs, but it can make accelerate dispatch one: a map
with ``disk`` entries leaves those layers' weights on ``meta`` and streams them in through
accelerate's hooks at every forward, the same hook path a GPU + CPU offload takes. The runtime
must give the dispatched model exactly the logits and tokens of the model loaded whole, and the
map must change neither a run's fingerprint nor its rows.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

import sinkwindow
from sinkwindow.cli import main
from sinkwindow.eval.fingerprint import device_map_kind, run_settings
from sinkwindow.eval.runner import EvalConfig, _loader
from sinkwindow.eval.scheduler import gpus_needed
from sinkwindow.runtime.prefill import input_device

# Every top-level module of conftest's tiny Llama (3 layers): two layers and the head offloaded to
# disk, the embedding too, so no input can take its device from the first weight.
OFFLOAD = {
    "model.embed_tokens": "disk",
    "model.layers.0": "cpu",
    "model.layers.1": "disk",
    "model.layers.2": "disk",
    "model.norm": "cpu",
    "model.rotary_emb": "cpu",
    "lm_head": "disk",
}


def _ids(batch: int = 2, n: int = 41) -> tuple[torch.Tensor, torch.Tensor]:
    """``[batch, n]`` random ids and a left-padding mask (row 1 has 5 pads)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 101, (batch, n), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    return ids, mask


def _run(model, spec: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked, padded prefill logits ``[2, 41, vocab]`` and 6 greedy tokens per row under ``spec``."""
    ids, mask = _ids()
    sinkwindow.apply(model, spec)
    logits = sinkwindow.prefill(model, ids, chunk_size=7, attention_mask=mask, return_logits="all").logits
    tokens = sinkwindow.generate(model, ids, 6, attention_mask=mask, chunk_size=7)
    return logits, tokens


@pytest.fixture
def offload_file(tmp_path):
    path = tmp_path / "map.json"
    path.write_text(json.dumps(OFFLOAD))
    return path


def test_auto_on_cpu_is_the_model_loaded_whole(tiny_folder):
    whole, _ = sinkwindow.load(str(tiny_folder))
    placed, _ = sinkwindow.load(str(tiny_folder), device_map="auto")
    # One device: transformers places without hooks, and hf_device_map is only set by a dispatch.
    assert {p.device.type for p in placed.parameters()} == {"cpu"}
    assert input_device(placed) == torch.device("cpu")
    for got, want in zip(_run(placed, "swa:8:2"), _run(whole, "swa:8:2")):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("spec", ["swa:8:2", "full", "swa:8:2+full:1"])
def test_offloaded_model_gives_the_same_logits_and_tokens(tiny_folder, offload_file, spec):
    whole, _ = sinkwindow.load(str(tiny_folder))
    placed, _ = sinkwindow.load(str(tiny_folder), device_map=str(offload_file))
    assert placed.hf_device_map == OFFLOAD
    assert placed.get_input_embeddings().weight.device.type == "meta"  # streamed in by its hook
    assert input_device(placed) == torch.device("cpu")
    got, want = _run(placed, spec), _run(whole, spec)
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
    assert torch.equal(got[1], want[1])


def test_device_and_device_map_together_are_refused(tiny_folder):
    with pytest.raises(ValueError, match="both given: drop device"):
        sinkwindow.load(str(tiny_folder), device="cpu", device_map="auto")


@pytest.mark.parametrize(
    "bad,fragment",
    [("everywhere", "neither auto"), ({"model": "gpu"}, "is not a device"), ({}, "is empty")],
)
def test_unknown_device_maps_name_what_works(tiny_folder, bad, fragment):
    with pytest.raises(ValueError, match=fragment):
        sinkwindow.load(str(tiny_folder), device_map=bad)


def test_missing_accelerate_names_the_pip_command(tiny_folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerate", None)  # what `import accelerate` sees when it is absent
    with pytest.raises(ModuleNotFoundError, match="pip install accelerate"):
        sinkwindow.load(str(tiny_folder), device_map="auto")


def test_gguf_models_are_placed_from_their_converted_copy(tiny_folder, tmp_path, monkeypatch):
    """A GGUF is de-quantised whole, saved as safetensors, and placed from that copy; with no writable
    cache for the copy, a device map is refused in one line instead of placing nothing."""
    import transformers

    from sinkwindow.models import loading as models

    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF")
    real = transformers.AutoModelForCausalLM.from_pretrained
    real_tok = transformers.AutoTokenizer.from_pretrained

    # Stand-ins for transformers' GGUF reader: the tiny folder plays the de-quantised weights.
    def model_from(source, *args, gguf_file=None, **kwargs):
        if gguf_file is not None:
            assert "device_map" not in kwargs  # de-quantisation runs whole, on CPU
            return real(tiny_folder, *args, **kwargs)
        return real(source, *args, **kwargs)

    def tok_from(source, *args, gguf_file=None, **kwargs):
        return real_tok(tiny_folder if gguf_file is not None else source, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model_from)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", tok_from)
    # The 4-byte stand-in is no readable GGUF: skip the header check the stand-in reader makes moot.
    monkeypatch.setattr(models, "_check_gguf", lambda path: None)
    monkeypatch.setenv("SINKWINDOW_CACHE", str(tmp_path / "cache"))
    placed, _ = sinkwindow.load(str(gguf), device_map=OFFLOAD)
    assert placed.hf_device_map == OFFLOAD
    assert (models._converted_dir(gguf) / "model.safetensors").is_file()

    def read_only(*args, **kwargs):
        raise PermissionError("read-only file system")

    monkeypatch.setenv("SINKWINDOW_CACHE", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(models, "_save_converted", read_only)
    with pytest.raises(PermissionError, match="set SINKWINDOW_CACHE to a writable folder"):
        sinkwindow.load(str(gguf), device_map="auto")


def test_check_passes_on_an_offloaded_model(tiny_folder, offload_file, capsys):
    rc = main(
        ["check", "--model", str(tiny_folder), "--method", "swa:8:2", "--device-map", str(offload_file)]
    )
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and report["ok"], report


def test_device_map_kind():
    assert device_map_kind({"": "cpu"}) == "cpu"
    assert device_map_kind(OFFLOAD) == "cpu"  # disk weights compute on the CPU here
    assert device_map_kind({"model.layers.0": 0, "model.layers.1": "cpu"}) == "cuda"  # offloaded to a GPU
    assert device_map_kind({"": "cuda:1"}) == "cuda"
    assert device_map_kind({"": "mps"}) == "mps"


def test_strategies_count_as_cuda_where_there_is_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device_map_kind("balanced") == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert device_map_kind("auto") == "cpu"


def test_the_fingerprint_does_not_see_the_map(tiny_folder, offload_file):
    model = str(tiny_folder)
    base = run_settings(EvalConfig(model=model, methods=["full"], tasks=["ppl"]))
    for device_map in ("auto", "sequential", str(offload_file), {"": "cpu"}):
        cfg = EvalConfig(model=model, methods=["full"], tasks=["ppl"], device_map=device_map)
        assert run_settings(cfg) == base
    placed, _ = sinkwindow.load(model, device_map=OFFLOAD)
    cfg = EvalConfig(model=model, methods=["full"], tasks=["ppl"], device_map=OFFLOAD)
    assert run_settings(cfg, placed) == base  # a given offloaded model counts by where it computes
    # A GPU map is a device of another kind, which can round differently: that does count.
    gpu = EvalConfig(model=model, methods=["full"], tasks=["ppl"], device_map={"": 0})
    assert run_settings(gpu)["device"] == "cuda" != base["device"]


def test_the_config_records_the_map_and_every_worker_loads_with_it(tiny_folder, offload_file):
    cfg = EvalConfig(model=str(tiny_folder), methods=["full"], tasks=["ppl"], device_map=str(offload_file))
    assert cfg.to_dict()["device_map"] == OFFLOAD  # the file's contents, not its path
    load_fn = _loader(cfg)
    assert load_fn.keywords["device_map"] == OFFLOAD and "device" not in load_fn.keywords
    with pytest.raises(ValueError, match="device and device_map both set"):
        EvalConfig(model=str(tiny_folder), device="cpu", device_map="auto")


def test_ray_tasks_ask_for_the_gpus_of_the_map(monkeypatch):
    assert gpus_needed("cuda:0") == 1 and gpus_needed("cpu") == 0 and gpus_needed(None) == 0
    assert gpus_needed(None, {"model.layers.0": 0, "model.layers.1": 1, "lm_head": "cpu"}) == 2
    assert gpus_needed(None, {"": "cuda:3"}) == 4  # a task's GPUs are numbered from 0
    assert gpus_needed(None, OFFLOAD) == 0
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert gpus_needed(None, "auto") == 4


def test_eval_with_a_device_map_resumes_a_run_made_on_one_device(tiny_folder, tmp_path, capsys):
    """The map is recorded, and a run placed another way resumes the same rows instead of refusing."""
    out = tmp_path / "run"
    common = ["eval", "ppl", "--model", str(tiny_folder), "--methods", "full,swa:8:2", "--lengths", "24",
              "--samples", "1", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main([*common, "--device-map", "auto"]) == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["device_map"] == "auto" and saved["device"] is None
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    capsys.readouterr()
    assert main([*common, "--device", "cpu"]) == 0  # same fingerprint: nothing to redo
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["results"] == len(rows) == 2
    assert [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()] == rows


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and err.strip().splitlines()[-1] == lines[0], err
    assert "Traceback" not in err
    return lines[0]


COMMANDS = [
    ["eval", "niah", "--out", "{tmp}/r"],
    ["eval", "babilong", "--out", "{tmp}/r"],
    ["eval", "ppl", "--out", "{tmp}/r"],
    ["eval", "lm-eval"],
    ["compare"],
    ["check"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c[:2]).replace("--out", "").strip("-"))
@pytest.mark.parametrize(
    "flags,fragment",
    [
        (["--device-map", "auto", "--device", "cpu"], "--device-map and --device both given: drop --device"),
        (["--device", "cpu", "--device-map", "balanced"], "the device map decides where each layer goes"),
        (["--device-map", "everywhere"], "is neither auto, balanced"),
        (["--device-map", "{tmp}/bad.json"], "is not a device: use a GPU index"),
        (["--device-map", "{tmp}/list.json"], "must hold one JSON object"),
    ],
    ids=["map-then-device", "device-then-map", "unknown", "bad-device", "not-an-object"],
)
def test_device_map_errors_are_one_line(tmp_path, monkeypatch, capsys, command, flags, fragment):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "bad.json").write_text(json.dumps({"model": "gpu"}))
    (tmp_path / "list.json").write_text("[0, 1]")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    argv = [a.format(tmp=tmp_path) for a in [*command, *flags]]
    assert main(argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert line.startswith("sinkwindow") and fragment in line, line
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: "-".join(c[:2]).replace("--out", "").strip("-"))
def test_device_map_without_accelerate_is_one_line(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "accelerate", None)
    argv = [a.format(tmp=tmp_path) for a in [*command, "--device-map", "auto"]]
    assert main(argv) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "needs accelerate, which is not installed: pip install accelerate" in line, line
    assert list(tmp_path.iterdir()) == []

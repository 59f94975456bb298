"""``sinkwindow check``: passes on sound runtimes, fails loudly (and names the check) on broken ones."""

import json

import pytest
import torch

import sinkwindow
import sinkwindow.models.loading  # the skipif below reads it at collection, before any test imports it
import sinkwindow.runtime.masks as masks
from conftest import QK_WEIGHTS, QWEN, skip_without_qwen, tiny_config, tiny_model
from sinkwindow.cli import main
from sinkwindow.cli.check import (
    check_model,
    default_layers,
    default_seq_len,
    truncate_layers,
    validate_options,
)
from sinkwindow.runtime.cache import SinkWindowLayer

ALL_CHECKS = {
    "sdpa_vs_reference",
    "eager_vs_reference",
    "eager_vs_sdpa",
    "prefill_vs_one_shot",
    "decode_vs_one_shot",
    "cache_entries",
    "swa_differs_from_full",
}


def _deep_model(family: str, layer_types: list[str]):
    """A tiny random model of ``family`` with more layers than the reference copy keeps by default."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = tiny_config(family)
    cfg.num_hidden_layers = len(layer_types)
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = layer_types
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(QK_WEIGHTS):
                p.mul_(8.0)  # as conftest.tiny_model: attention patterns must matter
    return model.eval()


@pytest.mark.parametrize("spec", ["swa:8:2", "swa:8:0"])
@pytest.mark.parametrize("family", ["llama", "qwen3", "mistral", "gemma3_text"])
def test_check_passes_on_sound_runtime(family, spec):
    model = tiny_model(family)
    report = check_model(model, spec)
    assert report.ok, report.table()
    assert {c.name for c in report.checks} == ALL_CHECKS
    assert report.seq_len == default_seq_len(8) > 8
    # The sequence runs past the window, so every layer's cache fills to exactly W - 1.
    assert report.cache_entries == [7] * model.config.num_hidden_layers
    row = {c.name: c for c in report.checks}
    assert row["swa_differs_from_full"].value > row["swa_differs_from_full"].tolerance
    for name in ALL_CHECKS - {"cache_entries", "swa_differs_from_full"}:
        assert row[name].value <= row[name].tolerance
    assert json.loads(json.dumps(report.to_json()))["ok"] is True


def test_check_cache_positions_and_kept_native_window():
    assert check_model(tiny_model("llama"), "swa:8:2:cache").ok
    model = tiny_model("gemma3_text")  # sliding, sliding, full; native window 12
    report = check_model(model, "swa:8:2", native_sliding="keep")
    assert report.ok, report.table()
    assert report.cache_bounds == [11, 11, 7]
    assert report.cache_entries == [11, 11, 7]


def test_check_skips_sdpa_for_eager_only_family():
    report = check_model(tiny_model("gemma2", "eager"), "swa:8:2")
    assert report.ok, report.table()
    status = {c.name: c.status for c in report.checks}
    assert status["sdpa_vs_reference"] == "skip"
    assert status["eager_vs_reference"] == "pass"


@torch.no_grad()
def test_truncate_layers_is_the_model_without_its_upper_layers():
    model = tiny_model("llama")
    ids = torch.randint(1, 100, (1, 19), generator=torch.Generator().manual_seed(0))
    before = model(ids).logits
    twin = truncate_layers(model, 2)
    assert twin.config.num_hidden_layers == 2 and len(twin.model.layers) == 2
    # Its logits are the original's hidden state after layer 2, through the final norm and LM head.
    hidden = model(ids, output_hidden_states=True).hidden_states[2]
    torch.testing.assert_close(
        twin(ids).logits, model.lm_head(model.model.norm(hidden)), atol=1e-5, rtol=1e-5
    )
    # The original is untouched and shares no parameters with the copy.
    assert model.config.num_hidden_layers == 3 and len(model.model.layers) == 3
    torch.testing.assert_close(model(ids).logits, before, atol=0, rtol=0)
    assert twin.model.layers[0].self_attn.q_proj.weight is not model.model.layers[0].self_attn.q_proj.weight
    with pytest.raises(ValueError, match="between 1 and 3"):
        truncate_layers(model, 4)


def test_reference_copy_keeps_every_layer_type():
    types = ["sliding_attention"] * 5 + ["full_attention"] + ["sliding_attention"] * 2
    gemma = _deep_model("gemma3_text", types)
    assert default_layers(gemma) == 6  # Gemma 3's first global layer is the sixth
    assert default_layers(_deep_model("llama", ["full_attention"] * 8)) == 4
    report = check_model(gemma, "swa:8:2", native_sliding="keep")
    assert report.ok, report.table()
    assert report.reference_layers == 6 and report.layers == 8
    assert "first 6 of 8 layers" in report.checks[0].label
    assert truncate_layers(gemma, 6).config.layer_types == types[:6]


def test_check_truncated_reference_passes():
    report = check_model(tiny_model("llama"), "swa:8:2", layers=2)
    assert report.ok and report.reference_layers == 2


def test_check_fails_when_window_is_off_by_one(monkeypatch):
    fast = masks.sink_window_mask_function
    monkeypatch.setattr(
        masks, "sink_window_mask_function", lambda w, s: fast(None if w is None else w + 1, s)
    )
    report = check_model(tiny_model("llama"), "swa:8:2")
    assert not report.ok
    assert {"sdpa_vs_reference", "eager_vs_reference"} <= set(report.failed)
    assert "cache_entries" not in report.failed
    assert "FAILED: sdpa_vs_reference" in report.table()


def test_check_fails_when_cache_keeps_an_extra_entry(monkeypatch):
    monkeypatch.setattr(SinkWindowLayer, "max_persisted", property(lambda self: self.window))
    report = check_model(tiny_model("llama"), "swa:8:2")
    # The mask still hides the extra key, so only the cache bound can catch the lost memory bound.
    assert report.failed == ["cache_entries"]
    assert report.cache_entries == [8, 8, 8]


def test_check_fails_when_mask_does_not_apply(monkeypatch):
    monkeypatch.setattr(masks, "sink_window_mask_function", lambda w, s: masks.causal_mask_function)
    report = check_model(tiny_model("llama"), "swa:8:2")
    assert "swa_differs_from_full" in report.failed
    assert "sdpa_vs_reference" in report.failed


@torch.no_grad()
def test_check_leaves_the_model_as_it_found_it():
    model = tiny_model("llama")
    ids = torch.randint(1, 100, (1, 30), generator=torch.Generator().manual_seed(0))
    before = model(ids).logits
    check_model(model, "swa:8:2")
    assert sinkwindow.active_spec(model).is_full and model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(model(ids).logits, before, atol=0, rtol=0)
    sinkwindow.apply(model, "swa:6:1", attn_implementation="eager")
    check_model(model, "swa:8:2")
    assert str(sinkwindow.active_spec(model)) == "swa:6:1"
    assert model.config._attn_implementation == "sinkwindow_eager"


@pytest.mark.parametrize(
    "spec,kwargs,match",
    [
        ("evict:8:2", {}, "verifies swa"),
        ("full", {}, "verifies swa"),
        ("swa:8:2", {"seq_len": 9}, "at least W \\+ 2 = 10"),
        ("swa:8:2", {"layers": 0}, "at least 1"),
        ("swa:8:2", {"layers": 4}, "between 1 and 3"),
        ("swa:8:2", {"seq_len": 2000}, "limit of 1024"),
    ],
)
def test_check_rejects_bad_options(spec, kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_model(tiny_model("llama"), spec, **kwargs)


def test_validate_options_before_loading():
    assert str(validate_options("swa:64", None, None)) == "swa:64:4"
    with pytest.raises(ValueError, match="--seq-len"):
        validate_options("swa:64:4", 65, None)


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def test_cli_check_passes_and_ends_with_json(tiny_folder, capsys):
    rc = main(["check", "--model", str(tiny_folder), "--method", "swa:8:2", "--layers", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    result = _last_json(out)
    assert result["ok"] is True and result["failed"] == [] and result["reference_layers"] == 2
    assert {c["name"] for c in result["checks"]} == ALL_CHECKS
    assert "SWA ≠ full" in out and "cache entries per layer" in out


def test_cli_check_exits_1_and_names_the_failure(tiny_folder, capsys, monkeypatch):
    monkeypatch.setattr(SinkWindowLayer, "max_persisted", property(lambda self: self.window))
    rc = main(["check", "--model", str(tiny_folder), "--method", "swa:8:2"])
    out = capsys.readouterr().out
    assert rc == 1
    result = _last_json(out)
    assert result["ok"] is False and result["failed"] == ["cache_entries"]
    assert "FAIL" in out


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--method", "swa:8:2", "--seq-len", "5"], "seq_len (--seq-len) must be at least W + 2"),
        (["--method", "lolcats:8"], "verifies swa"),
        (["--method", "swa:8:2", "--layers", "9"], "between 1 and 3"),
    ],
)
def test_cli_check_bad_input_is_one_line(tiny_folder, capsys, argv, match):
    rc = main(["check", "--model", str(tiny_folder), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "Traceback" not in err
    # One line (transformers' weight-loading bar may come before it, when the model had to load first).
    last = err.splitlines()[-1]
    assert last.startswith("sinkwindow: error:") and match in last
    assert sum(line.startswith("sinkwindow:") for line in err.splitlines()) == 1


@pytest.mark.slow
def test_check_smollm2(smollm2):
    model, _ = smollm2
    report = check_model(model, "swa:64:4", name="smollm2-135m")
    assert report.ok, report.table()
    assert report.reference_layers == 4 and report.layers == 30
    assert report.cache_entries == [63] * 30
    assert sinkwindow.active_spec(model).is_full


@pytest.mark.slow
@pytest.mark.skipif(
    not sinkwindow.models.loading.is_installed(sinkwindow.PACKAGED_MODELS["gemma3-270m"]),
    reason="gemma3-270m wheels not installed (sinkwindow models prints the pip command)",
)
def test_check_gemma3_270m():
    model, _ = sinkwindow.load("gemma3-270m")
    report = check_model(model, "swa:64:4", name="gemma3-270m")
    assert report.ok, report.table()
    assert report.layers == 18 and report.cache_entries == [63] * 18


@pytest.mark.slow
def test_cli_check_qwen2_5_coder(capsys):
    """`sinkwindow check` on the packaged Qwen2.5-Coder-0.5B (Qwen2, 14/2 heads), by its name."""
    skip_without_qwen()
    # A small window and a two-layer fp64 reference keep it short (~18 CPU-seconds with the load).
    rc = main(["check", "--model", QWEN, "--method", "swa:32:4", "--layers", "2"])
    out = capsys.readouterr().out
    result = _last_json(out)
    assert rc == 0 and result["ok"] is True, out
    assert result["layers"] == 24 and result["reference_layers"] == 2
    assert result["cache_entries"] == [31] * 24


def test_check_holds_hybrid_specs_to_the_reference_and_their_own_bounds():
    """Full layers are bounded by the sequence, windowed ones by W - 1; the copy reaches the units."""
    model = tiny_model("llama")
    report = check_model(model, "swa:8:2+full:1,2.0", layers=None)
    assert report.ok, report.failed
    assert report.cache_bounds == [7, report.seq_len, 7]
    assert report.cache_entries == report.cache_bounds
    # A one-layer reference copy leaves unit 1 out of the reference but not out of the other checks.
    report = check_model(model, "swa:8:2+full:1", layers=1)
    assert report.ok and report.reference_layers == 1


def test_a_full_layer_that_evicts_fails_loudly(monkeypatch):
    from sinkwindow.runtime.cache import FullAttentionLayer

    # Loud, not a silently windowed "full" layer.
    monkeypatch.setattr(FullAttentionLayer, "max_persisted", property(lambda self: 7))
    with pytest.raises(RuntimeError, match="evicted keys of a full layer"):
        check_model(tiny_model("llama"), "swa:8:2+full:1")

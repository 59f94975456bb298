"""Adapters shipped with the package: lookup by packaged model and spec, provenance, sha256, probe logits."""

from __future__ import annotations

import json

import pytest
import torch

import sinkwindow
from conftest import tiny_model
from sinkwindow.linear import adapters, convert, save_checkpoint
from sinkwindow.linear.adapters import (
    PACKAGE_BUDGET_BYTES,
    adapter_stem,
    file_sha256,
    list_adapters,
    probe_logits,
    shipped_adapter,
    verify_adapter,
)
from sinkwindow.runtime.method import MODEL_NAME_ATTR, use_method

SHIPPED = list_adapters()


def _tagged(name: str = "tiny", seed: int = 0):
    model = tiny_model("llama", seed=seed)
    setattr(model, MODEL_NAME_ATTR, name)
    return model


@pytest.fixture
def shipped_dir(tmp_path, monkeypatch):
    """A temporary adapter folder holding one tiny lolcats:8 adapter for the model named 'tiny'."""
    monkeypatch.setattr(adapters, "ADAPTER_DIR", tmp_path)
    trained = convert(_tagged(), "lolcats:8", init="kaiming", seed=3)
    path = save_checkpoint(trained, tmp_path / f"{adapter_stem('tiny', 'lolcats:8')}.safetensors")
    ids = torch.arange(2, 40)[None]
    vocab_ids = [0, 5, 17, 63]
    prov = {
        "sha256": file_sha256(path),
        "probe": {
            "input_ids": ids[0].tolist(),
            "vocab_ids": vocab_ids,
            "logits": probe_logits(trained, ids, vocab_ids),
            "atol": 1e-5,
        },
    }
    path.with_suffix(".json").write_text(json.dumps(prov))
    return path, trained, ids


def test_use_method_finds_the_shipped_adapter(shipped_dir):
    path, trained, ids = shipped_dir
    assert shipped_adapter("tiny", "lolcats:8") == path
    assert shipped_adapter("tiny", "lolcats:16") is None and shipped_adapter(None, "lolcats:8") is None
    model = use_method(_tagged(), "lolcats:8")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, trained(ids).logits, rtol=0, atol=0)
    assert verify_adapter(path, model)["max_abs_logit_diff"] == 0.0
    # Switching back to full attention reverts the retrofit completely.
    base = _tagged()
    use_method(model, "full")
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, base(ids).logits)


def test_explicit_checkpoint_overrides_the_shipped_one(shipped_dir, tmp_path_factory):
    path, trained, ids = shipped_dir
    other = convert(_tagged(), "lolcats:8", init="kaiming", seed=11)
    ckpt = save_checkpoint(other, tmp_path_factory.mktemp("run") / "model.safetensors")
    model = use_method(_tagged(), "lolcats:8", checkpoint=ckpt)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, other(ids).logits, rtol=0, atol=0)
        assert (model(ids).logits - trained(ids).logits).abs().max() > 1e-4
    with pytest.raises(ValueError, match="probe logits differ"):
        verify_adapter(path, model)


def test_tampered_adapter_fails_its_sha256(shipped_dir):
    path, _, _ = shipped_dir
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256"):
        verify_adapter(path)


def test_no_adapter_and_no_checkpoint_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(adapters, "ADAPTER_DIR", tmp_path)
    with pytest.raises(ValueError, match="sinkwindow train"):
        use_method(_tagged(), "lolcats:8")


@pytest.mark.parametrize("spec", ["swa:8:2", "full", "evict:8:2"])
def test_a_checkpoint_for_a_method_that_runs_none_is_refused(tmp_path, spec):
    # Before: swa:8:2 with an SWA + LoRA checkpoint loaded nothing and ran the untrained model.
    model = tiny_model("llama")
    with pytest.raises(ValueError, match=r"takes no trained adapter.*@NAME"):
        use_method(model, spec, checkpoint=tmp_path / "model.safetensors")
    assert sinkwindow.active_spec(model).is_full


@pytest.mark.parametrize("entry", SHIPPED, ids=[a["file"] for a in SHIPPED])
def test_shipped_file_matches_its_provenance(entry):
    assert file_sha256(entry["path"]) == entry["sha256"]
    assert entry["bytes"] <= PACKAGE_BUDGET_BYTES
    for key in ("label", "data", "tokens", "steps", "val_loss", "seed", "command", "sinkwindow_commit"):
        assert key in entry, key


def test_shipped_adapters_fit_the_package_budget_together():
    assert SHIPPED, "no adapter ships with the package"
    assert sum(entry["bytes"] for entry in SHIPPED) <= PACKAGE_BUDGET_BYTES


@pytest.mark.slow
@pytest.mark.parametrize("entry", SHIPPED, ids=[a["file"] for a in SHIPPED])
def test_shipped_adapter_reproduces_its_export_logits(entry):
    import sinkwindow

    model, _ = sinkwindow.load(entry["model"], method=entry["spec"])
    got = verify_adapter(entry["path"], model)
    assert got["max_abs_logit_diff"] <= entry["probe"]["atol"]


def test_allow_untrained_converts_only_when_nothing_is_shipped(shipped_dir, tmp_path_factory, monkeypatch):
    from sinkwindow.linear import is_converted

    path, trained, ids = shipped_dir
    model = use_method(_tagged(), "lolcats:8", allow_untrained=True)  # shipped: the trained adapter
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, trained(ids).logits, rtol=0, atol=0)
    monkeypatch.setattr(adapters, "ADAPTER_DIR", tmp_path_factory.mktemp("none"))
    untrained = use_method(_tagged(), "lolcats:8", allow_untrained=True)
    assert is_converted(untrained)
    with torch.no_grad():
        assert (untrained(ids).logits - trained(ids).logits).abs().max() > 1e-4

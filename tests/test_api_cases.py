"""Python API cases of the input audit (issue 34): silent wrong results turned into right ones or errors."""

from __future__ import annotations

import pytest
import torch

import sinkwindow
from conftest import VOCAB, tiny_model


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_a_layer_with_full_kv_heads_reports_what_its_full_heads_hold():
    """``persisted_lengths`` under ``+full:L.H`` used to say W − 1 while the full head held every key."""
    model = tiny_model("llama")
    spec = "swa:8:2+full:1.1"
    sinkwindow.apply(model, spec)
    _, cache = sinkwindow.prefill(model, _ids(30), chunk_size=7)
    held, window = cache.persisted_lengths(), cache.window_lengths()
    assert held[1] == 30 and window[1] == 7  # layer 1: KV head 1 holds all 30, the SWA head 7 (W − 1)
    assert [h for i, h in enumerate(held) if i != 1] == [7] * (len(held) - 1)
    assert cache.layers[1].full.keys.shape[-2] == 30


def test_check_verifies_the_full_heads_of_a_hybrid_by_head(monkeypatch):
    from sinkwindow.cli.check import check_model
    from sinkwindow.runtime.cache import SinkWindowCache

    spec = sinkwindow.parse_spec("swa:8:2+full:1.1")
    report = check_model(tiny_model("llama"), spec, seq_len=40, name="tiny")
    by = {r.name: r for r in report.checks}
    assert by["cache_entries"].status == "pass", by["cache_entries"].detail
    # A cache that under-reports its full heads (what persisted_lengths did) now fails the check.
    monkeypatch.setattr(SinkWindowCache, "persisted_lengths", SinkWindowCache.window_lengths)
    report = check_model(tiny_model("llama"), spec, seq_len=40, name="tiny")
    by = {r.name: r for r in report.checks}
    assert (
        by["cache_entries"].status == "fail" and "full KV heads hold 7 entries" in by["cache_entries"].detail
    )


@pytest.mark.parametrize("impl", ["bogus", "flash_attention_2", ""])
def test_unknown_attn_implementation_is_refused(impl):
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="attn_implementation must be 'sdpa', 'eager' or 'flex'"):
        sinkwindow.apply(model, "swa:8:2", attn_implementation=impl)
    assert sinkwindow.active_spec(model).is_full  # nothing was patched


@torch.no_grad()
def test_bad_inputs_get_one_line_naming_what_was_expected():
    model = sinkwindow.apply(tiny_model("llama"), "swa:8:2")
    ids = _ids(12)
    with pytest.raises(
        ValueError, match=r"input_ids must be integer token ids \(torch.long\), got torch.float32"
    ):
        model(ids.float())
    with pytest.raises(ValueError, match="attention_mask has 2 rows for a batch of 1"):
        model(ids, attention_mask=torch.ones(2, 12, dtype=torch.long))
    _, cache = sinkwindow.prefill(model, ids, chunk_size=8)
    with pytest.raises(ValueError, match="the cache holds 1 sequences but this forward has 2"):
        model(torch.cat([ids, ids])[:, :1], cache=cache)


def test_unreadable_model_and_checkpoint_files_get_one_line(tmp_path):
    from sinkwindow.linear import convert, load_checkpoint, save_checkpoint
    from sinkwindow.models.loading import _check_gguf

    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(ValueError, match="is not a GGUF file"):
        _check_gguf(text)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x01")  # a header cut after its version
    with pytest.raises(ValueError, match="is not a readable GGUF file .*truncated"):
        _check_gguf(cut)

    good = save_checkpoint(convert(tiny_model("llama"), "lolcats:8"), tmp_path / "good.safetensors")
    empty = tmp_path / "empty.safetensors"
    empty.write_bytes(b"")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-64])
    for bad in (empty, truncated):
        with pytest.raises(ValueError, match="safetensors checkpoint|tensors cannot be read"):
            load_checkpoint(tiny_model("llama"), bad)


@torch.no_grad()
def test_assisted_decoding_is_refused_up_front_and_plain_generate_still_works():
    """prompt_lookup_num_tokens used to fail inside transformers ("Assisted decoding requires a cache")."""
    model = sinkwindow.apply(tiny_model("llama"), "swa:8:2")
    ids = _ids(20)
    with pytest.raises(ValueError, match=r"assisted decoding \(prompt_lookup_num_tokens\) crops the cache"):
        model.generate(ids, max_new_tokens=4, do_sample=False, prompt_lookup_num_tokens=3)
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 24)
    with sinkwindow.apply(model, "full"):  # unpatched, transformers' own assisted decoding runs
        again = model.generate(ids, max_new_tokens=4, do_sample=False, prompt_lookup_num_tokens=3)
    assert again.shape[1] == 24


def test_a_hub_id_without_a_network_fails_at_once_with_the_fix(monkeypatch):
    # The hub client would retry for about a minute; a failed 3 s connect decides before it starts.
    import socket

    import transformers

    import sinkwindow
    from sinkwindow.models import loading as models

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: (_ for _ in ()).throw(OSError("down")))
    calls = []
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: calls.append(a) or 1 / 0
    )
    assert models.hub_reachable() is False
    with pytest.raises(FileNotFoundError, match="cannot be reached and it is not in the local hub cache"):
        sinkwindow.load("someone/no-such-model-xyz")
    assert calls == []


def test_the_second_audit_gets_one_line_errors_from_the_api():
    """Cases of the second input audit (tools/input_audit.py): each failed deep inside, or was taken."""
    model = tiny_model("llama")
    sinkwindow.apply(model, "swa:8:2")
    ids = torch.randint(1, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    cases = [
        (lambda: sinkwindow.parse_spec("swa:８:２"), ValueError, "is not an integer"),
        (lambda: sinkwindow.parse_spec("swa:1_0:2"), ValueError, "is not an integer"),
        (lambda: sinkwindow.parse_spec("swa:8:2+full:１"), ValueError, "is not a layer"),
        (lambda: sinkwindow.MethodSpec("swa", True, 0), ValueError, "window W must be a positive integer"),
        (lambda: sinkwindow.generate(model, torch.tensor([[5, VOCAB + 7]]), 2), ValueError, "outside the model's vocabulary"),
        (lambda: sinkwindow.generate(model, torch.tensor([[5, -1]]), 2), ValueError, "token id -1"),
        (lambda: sinkwindow.generate(model, [[2, 3, 4]], 2), TypeError, "must be a torch.Tensor"),
        (lambda: sinkwindow.generate("model", ids, 2), TypeError, "PreTrainedModel"),
        (lambda: sinkwindow.generate(model, ids, 2, do_sample=True, top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
        (lambda: sinkwindow.prefill(model, ids.float(), chunk_size=4), ValueError, "integer token ids"),
        (lambda: sinkwindow.make_cache("model"), TypeError, "PreTrainedModel"),
        (lambda: sinkwindow.generate(model, ids, 2.5), TypeError, "max_new_tokens must be an int"),
        (lambda: sinkwindow.generate(model, ids, 2, eos_token_id="w1"), TypeError, "eos_token_id must be a token id"),
        (lambda: sinkwindow.prefill(model, ids, chunk_size=2.5), TypeError, "chunk_size must be an int"),
        (lambda: sinkwindow.prefill(model, ids, chunk_size="8"), TypeError, "chunk_size must be an int"),
        (lambda: sinkwindow.load("smollm2-135m", checkpoint="x.safetensors"), ValueError, "without a method"),
    ]  # fmt: skip
    for call, kind, said in cases:
        with pytest.raises(kind, match=said):
            call()
    if not torch.cuda.is_available():
        from sinkwindow.models.loading import check_device

        with pytest.raises(ValueError, match="CUDA is not available here"):
            check_device("cuda")

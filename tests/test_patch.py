"""apply(): identity cases, the fp64 reference, the silent no-mask failure, restoring, bad input."""

import pytest
import torch

import sinkwindow
from conftest import FAMILIES, VOCAB, tiny_model
from sinkwindow.patch import native_sliding_layers, text_config
from sinkwindow.reference import reference_logits, reference_mask

NATIVE = {"mistral", "gemma3_text"}
IMPLS = ["sdpa", "eager"]


def _ids(length, batch=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=g)


@torch.no_grad()
@pytest.mark.parametrize("attn", IMPLS)
@pytest.mark.parametrize("family", FAMILIES)
def test_full_and_wide_window_reproduce_unpatched(family, attn):
    model = tiny_model(family, attn)
    ids = _ids(37)
    base = model(ids).logits
    # Native sliding layers keep their own window so that W >= L is an exact identity there too.
    mode = "keep" if family in NATIVE else "override"
    for spec in ("swa:37:4", "swa:64:0", "swa:500:16"):
        sinkwindow.apply(model, spec, native_sliding=mode)
        torch.testing.assert_close(model(ids).logits, base, atol=1e-5, rtol=1e-5)
    sinkwindow.apply(model, "full")
    assert (
        type(model).__name__ == type(model).__mro__[0].__name__ and "SinkWindow" not in type(model).__name__
    )
    assert model.config._attn_implementation == attn
    torch.testing.assert_close(model(ids).logits, base, atol=0, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("attn", IMPLS)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("length,window,sinks", [(29, 8, 2), (45, 16, 4), (33, 8, 0)], ids=lambda x: str(x))
def test_swa_matches_fp64_reference(family, attn, length, window, sinks):
    model = tiny_model(family, attn)
    ids = _ids(length)
    spec = f"swa:{window}:{sinks}"
    modes = ["override", "keep"] if family in NATIVE else ["override"]
    for mode in modes:
        ref = reference_logits(model, ids, spec, native_sliding=mode)
        sinkwindow.apply(model, spec, native_sliding=mode)
        got = model(ids).logits
        torch.testing.assert_close(got.double(), ref, atol=2e-4, rtol=1e-4)
        sinkwindow.apply(model, "full")


@torch.no_grad()
@pytest.mark.parametrize("attn", IMPLS)
@pytest.mark.parametrize("family", FAMILIES)
def test_mask_really_applies(family, attn):
    """Guards DESIGN §2's silent failure: attention registered without a mask builder masks nothing."""
    model = tiny_model(family, attn)
    ids = _ids(40)
    spec = "swa:8:2"
    mode = "override"
    base = model(ids).logits
    sinkwindow.apply(model, spec, native_sliding=mode)
    swa = model(ids).logits
    # Identical while every query still sees everything it would under full attention...
    if family not in NATIVE:
        torch.testing.assert_close(swa[:, :8], base[:, :8], atol=1e-5, rtol=1e-5)
    # ...and clearly different once the sequence is longer than the window.
    assert (swa[:, 12:] - base[:, 12:]).abs().max() > 1e-2


def test_reference_mask_formula():
    m = reference_mask(10, 5, 2)
    for i in range(10):
        row = [j for j in range(10) if m[i, j]]
        expected = [j for j in range(10) if j <= i and (j < 2 or j > i - 3)]
        assert row == expected
        assert len(row) <= 5
    assert reference_mask(6, None, 0).sum() == 21


def test_context_manager_restores():
    model = tiny_model("llama")
    ids = _ids(30)
    with torch.no_grad():
        base = model(ids).logits
        with sinkwindow.apply(model, "swa:8:2") as patched:
            assert patched is model
            assert sinkwindow.active_spec(model) == sinkwindow.parse_spec("swa:8:2")
            assert (model(ids).logits - base).abs().max() > 1e-3
        assert sinkwindow.active_spec(model).is_full
        assert model.config._attn_implementation == "sdpa"
        assert not hasattr(model.config, "_sinkwindow")
        torch.testing.assert_close(model(ids).logits, base, atol=0, rtol=0)


def test_reapply_switches_spec_and_leaves_config_alone():
    model = tiny_model("gemma3_text")
    tcfg = text_config(model)
    original = list(tcfg.layer_types)
    sinkwindow.apply(model, "swa:8:2")
    sinkwindow.apply(model, "swa:16:4", native_sliding="keep")
    assert sinkwindow.active_spec(model) == sinkwindow.parse_spec("swa:16:4")
    assert tcfg.layer_types == original  # Gemma 3 reads layer_types every forward (per-type RoPE)
    assert native_sliding_layers(tcfg) == [True, True, False]
    cache = sinkwindow.make_cache(model)
    assert [(layer.window, layer.sinks, layer.is_sliding) for layer in cache.layers] == [
        (12, 0, True),
        (12, 0, True),
        (16, 4, False),
    ]
    sinkwindow.apply(model, "full")
    assert tcfg.layer_types == original and sinkwindow.active_spec(model).is_full


@torch.no_grad()
def test_stock_sliding_cache_that_lost_the_sinks_is_refused():
    """Gemma 3's default cache slides its local layers without sinks: SWA(w, s) cannot run on it."""
    from transformers import DynamicCache

    model = tiny_model("gemma3_text")
    sinkwindow.apply(model, "swa:8:2")
    stock = DynamicCache(config=model.config)
    model(_ids(20), cache=stock, use_cache=True)
    with pytest.raises(ValueError, match="make_cache"):
        model(_ids(1), cache=stock, use_cache=True)


def test_unsupported_architecture_names_supported_ones():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'.*llama.*qwen2"):
        sinkwindow.apply(model, "swa:8:2")
    with pytest.raises(TypeError):
        sinkwindow.apply(torch.nn.Linear(2, 2), "swa:8:2")


def test_bad_spec_and_linear_spec_rejected():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="smaller than the window"):
        sinkwindow.apply(model, "swa:4:4")
    with pytest.raises(ValueError, match="trained linear-attention baseline"):
        sinkwindow.apply(model, "lolcats:64")
    with pytest.raises(ValueError, match="native_sliding"):
        sinkwindow.apply(model, "swa:8:2", native_sliding="sometimes")
    assert sinkwindow.active_spec(model).is_full


def test_unknown_model_name():
    with pytest.raises(ValueError, match="unknown model 'no-such-model'.*smollm2-135m"):
        sinkwindow.load("no-such-model")

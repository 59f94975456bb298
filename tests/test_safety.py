"""Safe by default: the memory bound holds without a cache= argument, and misuse fails in one line."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

import sinkwindow
from conftest import tiny_model
from sinkwindow.runtime.reference import reference_greedy

W, S = 8, 2
SPEC = f"swa:{W}:{S}"


def _ids(n: int, b: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, 100, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def no_dynamic_cache(monkeypatch):
    """Fail the test if anything builds a transformers DynamicCache (the unbounded default)."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("a DynamicCache was built: the memory bound is lost")

    monkeypatch.setattr(DynamicCache, "__init__", refuse)


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3"])
def test_plain_generate_keeps_the_cache_within_the_window(family, no_dynamic_cache):
    model = tiny_model(family)
    ids = _ids(30)
    want = reference_greedy(model, ids, SPEC, max_new_tokens=12)
    sinkwindow.apply(model, SPEC)
    model.generation_config.eos_token_id = None  # the reference never stops at EOS
    out = model.generate(ids, max_new_tokens=12, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(out.sequences, want)
    assert isinstance(out.past_key_values, sinkwindow.SinkWindowCache)
    assert max(out.past_key_values.persisted_lengths()) == W - 1


@torch.no_grad()
def test_plain_forward_returns_a_bounded_cache(no_dynamic_cache):
    model = sinkwindow.apply(tiny_model("llama"), SPEC)
    cache = model(_ids(40)).past_key_values
    assert isinstance(cache, sinkwindow.SinkWindowCache) and max(cache.persisted_lengths()) == W - 1
    assert model(_ids(40), use_cache=False).past_key_values is None


@torch.no_grad()
def test_pipeline_generates_on_the_bounded_cache(tiny_folder, no_dynamic_cache):
    from transformers import pipeline

    model, tok = sinkwindow.load(str(tiny_folder), method=SPEC)
    model.generation_config.eos_token_id = None
    prompt = " ".join(f"w{i % 90 + 2}" for i in range(30))
    pipe = pipeline("text-generation", model=model, tokenizer=tok)
    text = pipe(prompt, max_new_tokens=6, do_sample=False, return_full_text=False)[0]["generated_text"]
    ids = tok(prompt, return_tensors="pt").input_ids
    want = model.generate(ids, cache=sinkwindow.make_cache(model), max_new_tokens=6, do_sample=False)
    assert text.split() == tok.decode(want[0, ids.shape[1] :], skip_special_tokens=True).split()
    assert len(text.split()) == 6


@torch.no_grad()
def test_a_stock_cache_is_refused_while_a_window_spec_runs():
    model = sinkwindow.apply(tiny_model("llama"), SPEC)
    stock = DynamicCache(config=model.config)
    with pytest.raises(ValueError, match="grows with the context.*make_cache"):
        model(_ids(20), cache=stock)
    with pytest.raises(ValueError, match="grows with the context"):
        model.generate(_ids(20), cache=DynamicCache(config=model.config), max_new_tokens=2)
    assert stock.get_seq_length() == 0


@torch.no_grad()
def test_a_cache_made_for_another_spec_is_refused():
    model = sinkwindow.apply(tiny_model("llama"), SPEC)
    cache = sinkwindow.make_cache(model)
    sinkwindow.apply(model, "swa:16:2")
    with pytest.raises(ValueError, match=f"made for {SPEC}.*runs swa:16:2"):
        model(_ids(20), cache=cache)
    sinkwindow.apply(model, SPEC, native_sliding="keep")
    with pytest.raises(ValueError, match="native_sliding"):
        model(_ids(20), cache=cache)


@torch.no_grad()
def test_a_sink_window_cache_on_an_unpatched_model_is_refused():
    model = sinkwindow.apply(tiny_model("llama"), SPEC)
    cache = sinkwindow.make_cache(model)
    model(_ids(20), cache=cache)
    sinkwindow.apply(model, "full")
    with pytest.raises(ValueError, match=f"made for {SPEC}, which its model no longer runs"):
        model(_ids(1), cache=cache)


def test_nested_blocks_restore_the_outer_spec():
    model = tiny_model("llama")
    with sinkwindow.apply(model, SPEC):
        with sinkwindow.apply(model, "swa:16:4", native_sliding="keep"):
            with sinkwindow.apply(model, "evict:8:1"):
                assert str(sinkwindow.active_spec(model)) == "evict:8:1"
            assert str(sinkwindow.active_spec(model)) == "swa:16:4"
            assert sinkwindow.make_cache(model).made_for == ("swa:16:4", "keep")
        assert str(sinkwindow.active_spec(model)) == SPEC
        assert sinkwindow.make_cache(model).made_for == (SPEC, "override")
    assert sinkwindow.active_spec(model).is_full
    assert type(model).__name__ == "LlamaForCausalLM" and model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("outer,inner", [("flex", None), ("eager", "sdpa"), ("flex", "eager")])
def test_nested_blocks_restore_the_outer_attention_implementation(outer, inner):
    model = tiny_model("llama")
    with sinkwindow.apply(model, SPEC, attn_implementation=outer):
        ran = model.config._attn_implementation
        assert outer in ran
        with sinkwindow.apply(model, "swa:16:4", attn_implementation=inner):
            pass
        assert model.config._attn_implementation == ran and str(sinkwindow.active_spec(model)) == SPEC
    assert model.config._attn_implementation == "sdpa"


@torch.no_grad()
def test_empty_prompts_are_refused():
    model = sinkwindow.apply(tiny_model("llama"), SPEC)
    empty = torch.zeros(1, 0, dtype=torch.long)
    with pytest.raises(ValueError, match="non-empty"):
        sinkwindow.generate(model, empty, max_new_tokens=3)
    with pytest.raises(ValueError, match="non-empty"):
        sinkwindow.prefill(model, empty)
    with pytest.raises(ValueError, match="at least one token"):
        model(empty)


@torch.no_grad()
def test_prompt_plus_new_tokens_past_the_position_limit_is_refused():
    model = sinkwindow.apply(tiny_model("llama"), SPEC)
    limit = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"limit of {limit}.*swa:{W}:{S}:cache"):
        sinkwindow.generate(model, _ids(20), max_new_tokens=limit)
    model.generation_config.eos_token_id = None
    with pytest.raises(ValueError, match=f"limit of {limit}"):
        model.generate(_ids(limit - 2), max_new_tokens=5, do_sample=False)
    # Cache positions never pass w - 1 + chunk, so the same stream is allowed there.
    sinkwindow.apply(model, f"{SPEC}:cache")
    out = sinkwindow.generate(model, _ids(limit - 2), max_new_tokens=5)
    assert out.shape[1] == limit + 3


@pytest.mark.parametrize(
    "family,spec,policy,warned",
    [
        ("gemma3_text", "swa:8:2", "override", 12),  # local layers trained on 12: shrunk to 8
        ("gemma3_text", "swa:8:2+full:1", "override", 12),
        ("gemma3_text", "swa:8:2", "keep", None),  # local layers keep their own window
        ("gemma3_text", "swa:12:2", "override", None),  # not shorter than the native window
        ("gemma2", "swa:8:2", "override", 12),
        ("mistral", "swa:8:2", "override", None),  # every layer sliding: SWA replaces one window
        ("llama", "swa:8:2", "override", None),
    ],
)
def test_shrinking_native_local_windows_is_warned_about_once(
    family, spec, policy, warned, caplog, monkeypatch
):
    from sinkwindow.runtime import patching as patch

    monkeypatch.setattr(patch, "_SHRINK_WARNED", set())
    model = tiny_model(family)
    assert patch.shrunk_local_windows(model, sinkwindow.parse_spec(spec), policy) == warned
    with caplog.at_level("WARNING", logger="sinkwindow.runtime.patching"):
        sinkwindow.apply(model, spec, native_sliding=policy)
        sinkwindow.apply(model, "full")
        sinkwindow.apply(model, spec, native_sliding=policy)
    lines = [r for r in caplog.records if "native local layers" in r.getMessage()]
    assert len(lines) == (1 if warned else 0)
    if warned:
        assert (
            f"trained on {warned}-token windows" in lines[0].getMessage() and "keep" in lines[0].getMessage()
        )

"""Smoke tests on the real Qwen2.5-Coder-0.5B-Instruct (the second packaged model: Qwen2, 24 layers,
14 query / 2 KV heads). Each test is a few seconds to ~20 s on one CPU thread; they skip, naming the
pip command, when its six chunk wheels are not installed."""

import pytest
import torch

import sinkwindow
from sinkwindow.models.packaged import packaged_name

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

PROSE = (
    "def fibonacci(n):\n    # the n-th Fibonacci number, iteratively\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
)


def test_qwen_loads_as_the_packaged_qwen2(qwen_coder):
    from sinkwindow.runtime.method import model_name

    model, tok = qwen_coder
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.num_hidden_layers == 24
    assert (cfg.num_attention_heads, cfg.num_key_value_heads) == (14, 2)
    assert cfg.max_position_embeddings == 32768
    assert model_name(model) == "qwen2.5-coder-0.5b"
    # The converted cache's folder is one of the names the packaged model goes by.
    assert packaged_name(cfg.name_or_path) == "qwen2.5-coder-0.5b"
    ids = tok("def add(a, b):\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert "a + b" in tok.decode(out[0, ids.shape[1] :])  # a coder model, not noise


@torch.no_grad()
def test_qwen_swa_prefill_and_generate_keep_the_cache_bound(qwen_coder):
    model, tok = qwen_coder
    ids = tok(PROSE * 12, return_tensors="pt").input_ids
    assert ids.shape[1] > 2 * 256
    with sinkwindow.apply(model, "swa:256:4"):
        _, cache = sinkwindow.prefill(model, ids, chunk_size=200)
        assert max(cache.persisted_lengths()) == 255 and len(cache.persisted_lengths()) == 24
        cache = sinkwindow.make_cache(model)
        out = model.generate(ids, cache=cache, max_new_tokens=8, do_sample=False)
        assert out.shape[1] == ids.shape[1] + 8
        # generate filled this cache (not one of its own), and it stayed bound: W - 1 keys plus
        # at most the current query's.
        assert all(255 <= n <= 256 for n in cache.persisted_lengths())
    assert sinkwindow.active_spec(model).is_full


@torch.no_grad()
def test_qwen_a_window_past_the_length_is_full_attention(qwen_coder):
    model, tok = qwen_coder
    ids = tok(PROSE * 4, return_tensors="pt").input_ids
    assert ids.shape[1] <= 512
    full = model(ids, use_cache=False).logits
    with sinkwindow.apply(model, "swa:512:4"):
        windowed = model(ids, use_cache=False).logits
        chunked, _ = sinkwindow.prefill(model, ids, chunk_size=64, return_logits="all")
    torch.testing.assert_close(windowed, full, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(chunked, full, atol=2e-3, rtol=1e-3)


def test_qwen_full_attention_finds_the_s_niah_1_needle_at_1k(qwen_coder, tmp_path):
    """One RULER S-NIAH-1 sample at 1K (seed 42, its first), through the evaluation runner."""
    from sinkwindow.eval.runner import EvalConfig, run_eval

    config = EvalConfig(
        model="qwen2.5-coder-0.5b",
        methods=["full"],
        tasks=["niah_single_1"],
        lengths=[1024],
        samples=1,
        niah_max_new_tokens=None,
    )
    (row,) = run_eval(config, tmp_path / "run", model_and_tokenizer=qwen_coder).rows()
    assert row["n_prompt_tokens"] <= 1024 - 128
    assert row["score"] == 100.0, row["prediction"]
    assert row["answer"][0] in row["prediction"]

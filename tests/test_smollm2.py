"""Smoke tests on the real SmolLM2-135M (the embedded default model)."""

import pytest
import torch

import sinkwindow
from sinkwindow.eval.perplexity import essay_token_windows, perplexity

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def essay_2k(smollm2):
    pytest.importorskip("sinkwindow.eval.haystack")
    _, tok = smollm2
    return essay_token_windows(tok, 2048, 1)[0]


def test_perplexity_ordering_sinks_matter(smollm2, essay_2k):
    """full < swa:256:4 < swa:64:4 << swa:64:0 on 2,048 tokens of Paul Graham essays."""
    model, _ = smollm2
    ppl = {}
    for spec in ("full", "swa:256:4", "swa:64:4", "swa:64:0"):
        sinkwindow.apply(model, spec)
        ppl[spec] = perplexity(model, essay_2k, chunk_size=512).ppl
    sinkwindow.apply(model, "full")
    assert ppl["full"] < ppl["swa:256:4"] < ppl["swa:64:4"], ppl
    assert ppl["swa:64:0"] > 1.5 * ppl["swa:64:4"], ppl  # without sinks, SWA collapses
    assert 5 < ppl["full"] < 60, ppl  # a sane language model, not noise


@torch.no_grad()
def test_smollm2_bounded_cache_generate_matches_masked_forward(smollm2):
    model, tok = smollm2
    ids = tok("The quick brown fox jumps over the lazy dog. " * 12, return_tensors="pt").input_ids
    with sinkwindow.apply(model, "swa:32:4"):
        one_shot = model(ids, use_cache=False).logits[:, -1]
        logits, cache = sinkwindow.prefill(model, ids, chunk_size=13)
        torch.testing.assert_close(logits, one_shot, atol=1e-3, rtol=1e-4)
        assert max(cache.persisted_lengths()) == 31
        out = model.generate(ids, cache=sinkwindow.make_cache(model), max_new_tokens=8, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 8

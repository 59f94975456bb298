"""The ``retrieval`` criterion: attention on the needle while the answer is written, against the
eager attention weights, a planted uniform layer, the prompts' needle spans, and calibrate's use."""

from __future__ import annotations

import pytest
import torch

from conftest import eager_attentions, eval_pair, tiny_gemma_local_global
from sinkwindow.tuning import calibrate, calibration_prompts
from sinkwindow.tuning.memo import Memo
from sinkwindow.tuning.retrieval import retrieval_scores

LENGTH = 512


@pytest.fixture(scope="module")
def prompts(tiny_pair):
    return calibration_prompts(tiny_pair[1], samples=3, length=LENGTH)


def _direct(model, prompts, kv_heads: int) -> torch.Tensor:
    """Slow twin: one unchunked eager forward per prompt; per query head, the answer rows' weight on the
    needle span, averaged over the rows, then over prompts; per KV head the largest of its query heads."""
    out = 0
    for p in prompts:
        ids = torch.cat([p.input_ids, p.answer_ids[:, :-1]], dim=1)
        n, a = p.input_ids.shape[1], p.answer_ids.shape[1]
        start, end = p.needle
        per_layer = []
        for attn in eager_attentions(model, ids):
            rows = attn[0, :, n - 1 : n - 1 + a].double()  # [H, a, keys]: the queries that write the answer
            per_layer.append(rows[..., start:end].sum(-1).mean(-1))  # [H]
        out = out + torch.stack(per_layer) / len(prompts)
    layers, heads = out.shape
    return out.view(layers, kv_heads, heads // kv_heads).amax(-1)


def test_prompts_know_where_their_needle_is(tiny_pair, prompts):
    _, tok = tiny_pair
    for p in prompts:
        start, end = p.needle
        assert 0 < start < end <= p.input_ids.shape[1]
        # The span holds the answer's text: what a retrieval head must copy.
        assert tok.decode(p.input_ids[0, start:end]).strip() == tok.decode(p.answer_ids[0]).strip()


def test_retrieval_equals_the_eager_attention_weights(tiny_pair, prompts):
    model, _ = tiny_pair
    got = retrieval_scores(model, prompts, chunk_size=96)  # chunks: the answer rows span a chunk border
    want = _direct(model, prompts, kv_heads=2)
    assert got.shape == (2, 2)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert bool((got > 0).all() and (got <= 1).all())


def test_retrieval_of_a_uniform_layer_is_the_needle_share(prompts):
    """Planted: layer 1 with zero queries attends uniformly, so each answer row's weight on the needle
    is (needle tokens) / (keys it sees)."""
    model, _ = eval_pair()
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.weight.zero_()
    got = retrieval_scores(model, prompts)
    want = 0.0
    for p in prompts:
        n, a = p.input_ids.shape[1], p.answer_ids.shape[1]
        start, end = p.needle
        keys = torch.arange(n - 1, n - 1 + a, dtype=torch.float64) + 1
        want += float(((end - start) / keys).mean()) / len(prompts)
    torch.testing.assert_close(got[1], torch.full((2,), want, dtype=torch.float64), atol=1e-6, rtol=0)


def test_retrieval_on_native_sliding_layers_sees_only_the_window(tiny_pair, prompts):
    """Gemma 3: a local layer whose window has moved past the needle cannot put weight on it, and the
    chunked capture still equals the one-shot eager weights (where the native window is in the mask)."""
    model = tiny_gemma_local_global(len(tiny_pair[1]))
    got = retrieval_scores(model, prompts, chunk_size=96)
    torch.testing.assert_close(got, _direct(model, prompts, kv_heads=2), atol=1e-5, rtol=0)
    # Prompts whose needle lies outside the local window for every answer query: nothing to see there.
    far = [p for p in prompts if p.input_ids.shape[1] - p.needle[1] > 80]
    assert far  # two of the three fixture prompts; the third's needle ends 78 tokens from the end
    assert bool((retrieval_scores(model, far, chunk_size=96)[0] == 0).all())
    assert bool((got[1] > 0).all())


def test_retrieval_criterion_keeps_the_heads_that_look_at_the_needle(tiny_pair, tmp_path):
    model, tok = tiny_pair
    memo = Memo(tmp_path / "runs.jsonl")
    res = calibrate(model, tok, "swa:64:4", 2, by="head", criterion="retrieval", samples=3, length=LENGTH,
                    progress=False, memo=memo)  # fmt: skip
    scores = res.scores["retrieval"]
    grid = retrieval_scores(model, calibration_prompts(tok, samples=3, length=LENGTH))
    assert scores == pytest.approx(grid.flatten().tolist(), abs=1e-12)
    order = sorted(range(4), key=lambda i: (-scores[i], i))
    assert res.chosen == [res.units[i] for i in order[:2]]
    assert set(res.scores) == {"retrieval", "mass"}  # the mass is always reported beside
    # By layer: a layer scores its best KV head.
    by_layer = calibrate(model, tok, "swa:64:4", 1, criterion="retrieval", samples=3, length=LENGTH,
                         progress=False, memo=memo)  # fmt: skip
    assert by_layer.scores["retrieval"] == pytest.approx(grid.amax(-1).tolist(), abs=1e-12)
    # The pass is kept: a second calibration on the same prompts reads it back.
    kept = [line for line in (tmp_path / "runs.jsonl").read_text().splitlines() if '"retrieval"' in line]
    assert len(kept) == 1

"""Batches with padding: every row of a padded batch gives what it gives alone (logits and tokens), in
one-shot forwards, chunked prefill, generate() and beam search; each row keeps its own first s real
tokens as sinks."""

import pytest
import torch

import sinkwindow
from conftest import VOCAB, tiny_model
from sinkwindow.runtime.reference import reference_greedy, reference_logits

LENGTHS = [30, 19, 9, 3]  # one row shorter than the sinks + window, one shorter than W


def _rows(lengths=LENGTHS, seed=0):
    return [
        torch.randint(1, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed + n)) for n in lengths
    ]


def _batch(rows, side="left"):
    """``(ids, mask)`` padded with token 0 on ``side``."""
    width = max(r.shape[1] for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        n = r.shape[1]
        cols = slice(width - n, width) if side == "left" else slice(0, n)
        ids[b, cols], mask[b, cols] = r[0], 1
    return ids, mask


def _real(logits, mask, b):
    return logits[b, mask[b].bool()]


def _no_eos(model):
    # HF generate suppresses EOS until min_new_tokens; the references below never do.
    model.generation_config.eos_token_id = None
    return model


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("spec", ["swa:8:2", "swa:6:0", "swa:8:2:cache", "evict:8:2"])
def test_padded_prefill_rows_equal_rows_alone(family, spec):
    model = tiny_model(family)
    rows = _rows()
    ids, mask = _batch(rows)
    ref = reference_logits(model, ids, spec, attention_mask=mask)
    sinkwindow.apply(model, spec)
    alone = [sinkwindow.prefill(model, r, chunk_size=64, return_logits="all").logits[0] for r in rows]
    for chunk in (1, 7, 64):
        logits, cache = sinkwindow.prefill(
            model, ids, chunk_size=chunk, attention_mask=mask, return_logits="all"
        )
        for b in range(len(rows)):
            torch.testing.assert_close(_real(logits, mask, b), alone[b], atol=2e-5, rtol=1e-5)
            torch.testing.assert_close(
                _real(logits, mask, b).double(), _real(ref, mask, b), atol=2e-4, rtol=1e-4
            )
        assert max(cache.persisted_lengths()) <= 7
    # A one-shot forward without a cache honours the padding too (positions from the mask).
    if sinkwindow.parse_spec(spec).positions == "absolute":
        one_shot = model(ids, attention_mask=mask, use_cache=False).logits
        for b in range(len(rows)):
            torch.testing.assert_close(_real(one_shot, mask, b), alone[b], atol=2e-5, rtol=1e-5)


@torch.no_grad()
@pytest.mark.parametrize("spec", ["swa:8:2", "swa:8:2:cache"])
def test_right_padding_scores_like_rows_alone(spec):
    model = tiny_model("llama")
    rows = _rows()
    ids, mask = _batch(rows, side="right")
    sinkwindow.apply(model, spec)
    logits, _ = sinkwindow.prefill(model, ids, chunk_size=5, attention_mask=mask, return_logits="all")
    for b, r in enumerate(rows):
        alone = sinkwindow.prefill(model, r, chunk_size=5, return_logits="all").logits[0]
        torch.testing.assert_close(_real(logits, mask, b), alone, atol=2e-5, rtol=1e-5)


@torch.no_grad()
def test_each_row_keeps_its_own_sinks_and_recent():
    model = tiny_model("llama")
    rows = _rows()
    ids, mask = _batch(rows)
    w, s = 8, 2
    sinkwindow.apply(model, f"swa:{w}:{s}")
    _, cache = sinkwindow.prefill(model, ids, chunk_size=4, attention_mask=mask)
    for layer in cache.layers:
        assert layer.keys.shape[-2] == w - 1
        for b, r in enumerate(rows):
            n = r.shape[1]
            held = sorted(p for p in layer.positions[b].tolist() if p >= 0)
            expected = sorted(set(range(min(s, n))) | set(range(max(0, n - (w - s - 1)), n)))
            assert held == expected


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("spec", ["swa:8:2", "swa:8:2:cache", "evict:8:2"])
def test_generate_left_padded_equals_rows_alone_and_reference(family, spec):
    model = _no_eos(tiny_model(family))
    rows = _rows([21, 9, 3])
    ids, mask = _batch(rows)
    want = reference_greedy(model, ids, spec, 12, attention_mask=mask)
    sinkwindow.apply(model, spec)
    got = model.generate(
        ids, attention_mask=mask, cache=sinkwindow.make_cache(model), max_new_tokens=12, do_sample=False
    )
    assert torch.equal(got, want)
    for b, r in enumerate(rows):
        alone = model.generate(r, cache=sinkwindow.make_cache(model), max_new_tokens=12, do_sample=False)
        assert torch.equal(alone[0, -12:], got[b, -12:])
    # sinkwindow's own loop (chunked prefill, then one token at a time) agrees.
    ours = sinkwindow.generate(model, ids, 12, attention_mask=mask, chunk_size=4)
    assert torch.equal(ours, got)


@torch.no_grad()
def test_full_attention_baseline_through_our_loop_honours_padding():
    model = tiny_model("llama")
    rows = _rows([21, 9, 3])
    ids, mask = _batch(rows)
    got = sinkwindow.generate(model, ids, 8, attention_mask=mask, chunk_size=5)
    for b, r in enumerate(rows):
        assert torch.equal(sinkwindow.generate(model, r, 8)[0, -8:], got[b, -8:])


@torch.no_grad()
def test_beam_search_on_padded_batch_equals_rows_alone():
    model = _no_eos(tiny_model("llama"))
    rows = _rows([21, 9])
    ids, mask = _batch(rows)
    sinkwindow.apply(model, "swa:8:2")
    kw = dict(max_new_tokens=8, num_beams=3, do_sample=False, length_penalty=0.0)
    got = model.generate(ids, attention_mask=mask, cache=sinkwindow.make_cache(model), **kw)
    for b, r in enumerate(rows):
        alone = model.generate(r, cache=sinkwindow.make_cache(model), **kw)
        assert torch.equal(alone[0, -8:], got[b, -8:])


@torch.no_grad()
def test_padding_errors_are_clear():
    model = tiny_model("llama")
    rows = _rows([12, 5])
    sinkwindow.apply(model, "swa:8:2")
    ids, mask = _batch(rows, side="right")
    with pytest.raises(ValueError, match="right padding cannot be continued.*left"):
        sinkwindow.generate(model, ids, 3, attention_mask=mask)
    with pytest.raises(ValueError, match="attention_mask must match input_ids"):
        sinkwindow.prefill(model, ids, attention_mask=mask[:, :-1])
    cache = sinkwindow.make_cache(model)
    four_d = torch.ones(2, 1, ids.shape[1], ids.shape[1], dtype=torch.bool)
    with pytest.raises(ValueError, match="2-D padding mask"):
        model(ids, attention_mask=four_d, cache=cache, use_cache=True)
    # The inner decoder skips the hook that hands the cache the padding: refused, not silently wrong.
    with pytest.raises(ValueError, match="padding reached the mask but not the cache"):
        model.model(ids, attention_mask=mask, cache=sinkwindow.make_cache(model), use_cache=True)

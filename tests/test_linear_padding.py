"""Padded batches on the linear baselines: every row of a left-padded batch gives what it gives
alone (logits, generated tokens, cache contents), through prefill chunks that split rows anywhere,
decoding, and a plain forward; a stock cache with padding is refused in one line."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache

import sinkwindow
from conftest import tiny_model
from sinkwindow.linear import LinearAttnCache, convert

W = 8
SPECS = [f"lolcats:{W}", f"liger:{W}", "linear"]
LENGTHS = (23, 9, 3)  # longer than W, shorter than W, shorter than the first prefill chunk


pytestmark = pytest.mark.usefixtures("one_thread")


def model_for(spec: str, family: str = "llama"):
    kw = {} if spec.startswith("liger") else {"init": "kaiming"}
    return convert(tiny_model(family), spec, **kw).double()


def rows(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 101, (1, n), generator=g) for n in LENGTHS]


def left_padded(prompts: list[torch.Tensor], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(p.shape[1] for p in prompts)
    ids = torch.full((len(prompts), n), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, p in enumerate(prompts):
        ids[b, n - p.shape[1] :] = p[0]
        mask[b, n - p.shape[1] :] = 1
    return ids, mask


@pytest.mark.parametrize(
    "spec,family",
    [
        *((s, "llama") for s in SPECS),
        (f"liger:{W}", "qwen3"),
        ("linear", "phi3"),
        (f"lolcats:{W}", "smollm3"),
    ],
    ids=lambda x: x.replace(":", ""),
)
def test_prefill_and_decode_of_a_padded_batch_equal_each_row_alone(spec, family):
    model = model_for(spec, family)
    prompts = rows()
    ids, mask = left_padded(prompts)
    steps = torch.randint(1, 101, (len(prompts), 4), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        # Chunks of 5 split the rows at different real positions; the first chunk of the
        # shortest row is all padding.
        last, cache = sinkwindow.prefill(model, ids, chunk_size=5, attention_mask=mask)
        assert isinstance(cache, LinearAttnCache)
        tail, m = [], mask
        for t in range(steps.shape[1]):
            m = torch.cat([m, m.new_ones((m.shape[0], 1))], 1)
            pos = (m.cumsum(1) - 1)[:, -1:]
            tail.append(
                model(
                    steps[:, t : t + 1], cache=cache, use_cache=True, attention_mask=m, position_ids=pos
                ).logits
            )
        for b, p in enumerate(prompts):
            alone, one = sinkwindow.prefill(model, p, chunk_size=5)
            torch.testing.assert_close(last[b], alone[0], atol=1e-10, rtol=0)
            for t in range(steps.shape[1]):
                got = model(steps[b : b + 1, t : t + 1], cache=one, use_cache=True).logits
                torch.testing.assert_close(tail[t][b], got[0], atol=1e-10, rtol=0)
            # The cache holds that row's own state: the same S (and z, FIFO) as the row alone.
            for layer, solo in zip(cache.layers, one.layers):
                mine = layer.rows[b]
                for x, y in zip(mine, solo.state):
                    torch.testing.assert_close(x, y, atol=1e-10, rtol=0)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.replace(":", ""))
def test_generate_on_a_padded_batch_gives_each_rows_tokens(spec):
    model = model_for(spec)
    prompts = rows(2)
    ids, mask = left_padded(prompts)
    with torch.no_grad():
        out = sinkwindow.generate(model, ids, 6, attention_mask=mask, chunk_size=4)
        for b, p in enumerate(prompts):
            alone = sinkwindow.generate(model, p, 6, chunk_size=4)
            assert out[b, ids.shape[1] :].tolist() == alone[0, p.shape[1] :].tolist()


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.replace(":", ""))
def test_a_plain_padded_forward_equals_each_row_at_its_real_tokens(spec):
    model = model_for(spec)
    prompts = rows(3)
    ids, mask = left_padded(prompts)
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        got = model(ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        for b, p in enumerate(prompts):
            alone = model(p, use_cache=False).logits
            torch.testing.assert_close(got[b, ids.shape[1] - p.shape[1] :], alone[0], atol=1e-10, rtol=0)
            assert torch.isfinite(got[b]).all()


def test_a_stock_cache_with_padding_is_refused_in_one_line():
    model = model_for(f"lolcats:{W}")
    ids, mask = left_padded(rows())
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :5], attention_mask=mask[:, :5], cache=cache, use_cache=True)
        with pytest.raises(NotImplementedError, match="make_cache"):
            model(ids[:, 5:], attention_mask=mask, cache=cache, use_cache=True)


def test_padded_cache_bytes_and_reorder_follow_the_rows():
    model = model_for(f"lolcats:{W}")
    prompts = rows()
    ids, mask = left_padded(prompts)
    with torch.no_grad():
        _, cache = sinkwindow.prefill(model, ids, chunk_size=5, attention_mask=mask)
        solo = [sinkwindow.prefill(model, p, chunk_size=5).cache for p in prompts]
    assert cache.nbytes() == sum(c.nbytes() for c in solo)
    assert cache.persisted_lengths() == [max(min(n, W) for n in LENGTHS)] * len(cache.layers)
    layer = cache.layers[0]
    first = layer.rows[0]
    layer.reorder_cache(torch.tensor([2, 1, 0]))
    assert layer.rows[2] is first

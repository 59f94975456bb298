"""The FlexAttention path (``attn_implementation="flex"``) against its slow twins: the SDPA path (same
positions, dense boolean mask) and the fp64 reference.

Model tests run flex uncompiled (``FlexOptions(compile=False)``: the unfused kernel, exact and fast
enough at these sizes) and, unless a test says otherwise, for every call (``min_queries=1``), so
decode steps, padded batches, chunked prefill, cache position mode and the static ring buffer all go
through a BlockMask. The BlockMask itself is checked tile by tile against the dense mask on every slot
layout the caches report.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_mask

import sinkwindow
from conftest import VOCAB, has_native_sliding, tiny_model
from sinkwindow.runtime import flex
from sinkwindow.runtime.cache import SlotOffset
from sinkwindow.runtime.masks import build_sink_window_mask
from sinkwindow.runtime.plan import AttentionPlan, bind, config_plan, plan_of
from sinkwindow.runtime.reference import reference_greedy, reference_logits
from sinkwindow.runtime.spec import parse_spec

W, S = 8, 2


@pytest.fixture(autouse=True)
def flex_everywhere(monkeypatch):
    """Uncompiled flex for every call; fresh block-mask cache, failure record and log-once set."""
    monkeypatch.setattr(flex, "OPTIONS", flex.FlexOptions(compile=False, min_queries=1))
    monkeypatch.setattr(flex, "_BROKEN", {})
    monkeypatch.setattr(flex, "_WARNED", set())
    flex.clear_cache()
    yield
    flex.clear_cache()


def _ids(length, batch=1, seed=7):
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _left_padded(lengths, seed=0):
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, width - n :] = _ids(n, seed=seed + n)[0]
        mask[b, width - n :] = 1
    return ids, mask


def _real(logits, mask, b):
    return logits[b, mask[b].bool()]


class _MaskSpy:
    """Records the type of every mask the flex builder hands the model ("block" or "dense").

    ``apply`` registers ``flex.sinkwindow_flex_mask`` as it finds it, so the spy replaces that name.
    """

    def __init__(self, monkeypatch):
        self.kinds: list[str] = []
        build = flex.sinkwindow_flex_mask

        def spy(*args, **kwargs):
            out = build(*args, **kwargs)
            self.kinds.append("block" if isinstance(out, BlockMask) else "dense")
            return out

        monkeypatch.setattr(flex, "sinkwindow_flex_mask", spy)


# --- The BlockMask against the dense mask, on every layout -----------------------------------------


def _assert_block_mask_is_exact(bm: BlockMask, dense: torch.Tensor) -> None:
    """``bm``'s mask_mod equals ``dense`` everywhere, its listed tiles cover every True, full tiles are all True."""
    rows, _, q_len, kv_len = dense.shape
    got = create_mask(bm.mask_mod, bm.kv_num_blocks.shape[0], 1, q_len, kv_len, device="cpu")
    assert torch.equal(got.expand_as(dense), dense)
    block = flex.BLOCK
    listed = bm.to_dense().bool().repeat_interleave(block, -2).repeat_interleave(block, -1)
    assert not (dense & ~listed[..., :q_len, :kv_len]).any(), "a visible key lies in a skipped tile"
    nq, nk = -(-q_len // block), -(-kv_len // block)
    pad = torch.nn.functional.pad(dense, (0, nk * block - kv_len, 0, nq * block - q_len))
    tiles = pad.reshape(rows, 1, nq, block, nk, block)
    for r in range(bm.full_kv_num_blocks.shape[0]):
        for i in range(nq):
            for j in bm.full_kv_indices[r, 0, i, : int(bm.full_kv_num_blocks[r, 0, i])].tolist():
                assert tiles[r, 0, i, :, j].all(), "a tile marked full hides a key"


@pytest.mark.parametrize("window,sinks", [(256, 4), (130, 0), (40, 3)])
@pytest.mark.parametrize("seen,chunk", [(0, 300), (0, 129), (600, 200), (1000, 1)])
def test_block_mask_equals_dense_mask_contiguous(window, sinks, seen, chunk):
    """One-shot (empty cache) and chunks over the contiguous bounded layout (sinks, then recent keys)."""
    n = min(seen, window - 1)
    offset = SlotOffset(seen - n, sinks)
    args = (1, chunk, n + chunk, seen, offset, window, sinks)
    bm = flex.sink_window_block_mask(*args)
    _assert_block_mask_is_exact(bm, build_sink_window_mask(*args))
    # Linear in n: a query block lists its sink block and the blocks its window touches, never all.
    assert int((bm.kv_num_blocks + bm.full_kv_num_blocks).max()) <= 2 + -(-window // flex.BLOCK) + 1


def test_block_mask_equals_dense_mask_with_padding_and_copies():
    """Per-row positions (left padding, a row with fewer real tokens than the sinks), and cache-mode copies."""
    w, s = 140, 4
    mask = torch.zeros(3, 300, dtype=torch.long)
    mask[0, 40:] = 1
    mask[1, :] = 1
    mask[2, 297:] = 1
    args = (3, 300, 300, 0, 0, w, s, mask)
    bm = flex.sink_window_block_mask(*args)
    assert bm.kv_num_blocks.shape[0] == 3  # one row each: the sinks differ
    _assert_block_mask_is_exact(bm, build_sink_window_mask(*args))
    seen, chunk = 500, 150
    offset = SlotOffset(seen - (w - 1), s, copies=chunk)
    args = (1, chunk, w - 1 + chunk + chunk * s, seen, offset, w, s)
    _assert_block_mask_is_exact(flex.sink_window_block_mask(*args), build_sink_window_mask(*args))


def test_block_mask_dense_window_and_unrepresentable_layout(caplog):
    """evict's dense prompt (``window=None``); a layout with too many position runs falls back to the dense mask."""
    args = (1, 260, 260, 0, 0, None, 0)
    _assert_block_mask_is_exact(flex.sink_window_block_mask(*args), build_sink_window_mask(*args))
    scattered = torch.tensor([[1, 0] * 130])  # 130 runs of one real token: no closed form
    assert flex.sink_window_block_mask(1, 260, 260, 0, 0, 64, 2, scattered) is None
    from transformers import LlamaConfig

    cfg = LlamaConfig()
    bind([cfg], AttentionPlan(parse_spec("swa:64:2"), "override", flex.FLEX_NAME, "sdpa", fallback="sdpa"))
    with caplog.at_level(logging.WARNING, logger="sinkwindow.runtime.flex"):
        out = flex.sinkwindow_flex_mask(1, 260, 260, attention_mask=scattered, config=cfg)
        flex.sinkwindow_flex_mask(1, 260, 260, attention_mask=scattered, config=cfg)
    assert torch.equal(out, build_sink_window_mask(1, 260, 260, 0, 0, 64, 2, scattered))
    assert len([r for r in caplog.records if "position runs" in r.getMessage()]) == 1


def test_block_masks_are_cached_per_shape_and_positions():
    args = (1, 300, 300, 0, SlotOffset(0, 4), 64, 4)
    a = flex.sink_window_block_mask(*args)
    assert flex.sink_window_block_mask(*args) is a  # same shape, same positions: built once
    assert (flex._CACHE.hits, flex._CACHE.misses) == (1, 1)
    # Same shape, other positions: built anew, and exact for its own positions.
    moved = (1, 300, 300, 50, SlotOffset(50, 4), 64, 4)
    b = flex.sink_window_block_mask(*moved)
    assert b is not a and (flex._CACHE.hits, flex._CACHE.misses) == (1, 2)
    _assert_block_mask_is_exact(b, build_sink_window_mask(*moved))
    _assert_block_mask_is_exact(flex.sink_window_block_mask(*args), build_sink_window_mask(*args))


# --- Models: flex against the SDPA path and the fp64 reference ----------------------------------


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma3_text", "gemma2", "gpt2"])
def test_flex_matches_sdpa_path_and_fp64_reference(family, monkeypatch):
    """One-shot and chunked prefill; Gemma 2 (eager only) softcaps through a score_mod."""
    model = tiny_model(family)
    ids = _ids(45)
    modes = ["override", "keep"] if has_native_sliding(model) else ["override"]
    spy = _MaskSpy(monkeypatch)
    bound = max(W, getattr(model.config.get_text_config(), "sliding_window", None) or 0) - 1
    for mode in modes:
        spec = f"swa:{W}:{S}"
        ref = reference_logits(model, ids, spec, native_sliding=mode)
        sinkwindow.apply(model, spec, native_sliding=mode)
        dense = model(ids).logits
        sinkwindow.apply(model, spec, native_sliding=mode, attn_implementation="flex")
        assert model.config._attn_implementation == flex.FLEX_NAME
        got = model(ids).logits
        torch.testing.assert_close(got, dense, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(got.double(), ref, atol=2e-4, rtol=1e-4)
        for chunk in (4, 13):  # chunks smaller and larger than W, over the bounded cache
            logits, cache = sinkwindow.prefill(model, ids, chunk_size=chunk, return_logits="all")
            torch.testing.assert_close(logits.double(), ref, atol=2e-4, rtol=1e-4)
            assert max(cache.persisted_lengths()) <= bound
        sinkwindow.apply(model, "full")
    assert spy.kinds and set(spy.kinds) == {"block"}
    assert model.config._attn_implementation == ("eager" if family == "gemma2" else "sdpa")


@torch.no_grad()
@pytest.mark.parametrize("spec", ["swa:8:2", "swa:8:2:cache", "evict:8:2"])
def test_flex_padded_batches_equal_rows_alone_and_reference(spec):
    model = tiny_model("llama")
    lengths = [30, 19, 9, 3]
    ids, mask = _left_padded(lengths)
    ref = reference_logits(model, ids, spec, attention_mask=mask)
    sinkwindow.apply(model, spec, attn_implementation="flex")
    for chunk in (1, 7, 64):
        logits, _ = sinkwindow.prefill(model, ids, chunk_size=chunk, attention_mask=mask, return_logits="all")
        for b in range(len(lengths)):
            torch.testing.assert_close(
                _real(logits, mask, b).double(), _real(ref, mask, b), atol=2e-4, rtol=1e-4
            )


@torch.no_grad()
@pytest.mark.parametrize(
    "family,spec", [("llama", "swa:8:2"), ("llama", "swa:8:2:cache"), ("gemma3_text", "swa:6:0")]
)
def test_flex_cache_mode_and_decode_match_reference(family, spec):
    """Chunked prefill (cache mode: private sink copies through the BlockMask), then decode steps through flex."""
    model = tiny_model(family)
    model.generation_config.eos_token_id = None
    ids = _ids(23, batch=2)
    want = reference_greedy(model, ids, spec, 12)
    ref = reference_logits(model, ids, spec)
    sinkwindow.apply(model, spec, attn_implementation="flex")
    logits, _ = sinkwindow.prefill(model, ids, chunk_size=6, return_logits="all")
    torch.testing.assert_close(logits.double(), ref, atol=2e-4, rtol=1e-4)
    assert torch.equal(sinkwindow.generate(model, ids, 12, chunk_size=5), want)
    got = model.generate(ids, cache=sinkwindow.make_cache(model), max_new_tokens=12, do_sample=False)
    assert torch.equal(got, want)


@torch.no_grad()
def test_flex_static_ring_buffer_with_padding_matches_reference(monkeypatch):
    model = tiny_model("llama")
    ids, mask = _left_padded([21, 9])
    want = reference_greedy(model, ids, "swa:8:2", 10, attention_mask=mask)
    sinkwindow.apply(model, "swa:8:2", attn_implementation="flex")
    spy = _MaskSpy(monkeypatch)
    sinkwindow.apply(model, "swa:8:2", attn_implementation="flex")
    got = sinkwindow.generate(model, ids, 10, attention_mask=mask, chunk_size=4, static=True)
    assert torch.equal(got, want)
    assert spy.kinds and set(spy.kinds) == {"block"}  # ring slots in wrapped order: still a BlockMask


@torch.no_grad()
def test_calls_below_the_threshold_take_the_sdpa_path(monkeypatch):
    """The measured rule: long prefills run flex, short chunks and decode steps the dense SDPA mask."""
    monkeypatch.setattr(flex, "OPTIONS", flex.FlexOptions(compile=False))  # the default threshold
    threshold = flex.CPU_MIN_QUERIES
    assert (
        flex.use_flex(threshold, "cpu")
        and not flex.use_flex(threshold - 1, "cpu")
        and not flex.use_flex(1, "cpu")
    )
    model = tiny_model("llama")
    ids = _ids(threshold + 40)
    sinkwindow.apply(model, "swa:16:4")
    dense_logits, _ = sinkwindow.prefill(model, ids, chunk_size=threshold, return_logits="all")
    spy = _MaskSpy(monkeypatch)
    sinkwindow.apply(model, "swa:16:4", attn_implementation="flex")
    logits, cache = sinkwindow.prefill(model, ids, chunk_size=threshold, return_logits="all")
    assert spy.kinds == ["block", "dense"]  # the full first chunk, then the 40-token rest
    torch.testing.assert_close(logits, dense_logits, atol=2e-5, rtol=1e-5)
    model(ids[:, :1], cache=cache, use_cache=True)
    assert spy.kinds[-1] == "dense"


@torch.no_grad()
def test_flex_failure_falls_back_to_sdpa_with_one_log_line(monkeypatch, caplog):
    """A kernel that refuses (old torch, unsupported shape or device): the SDPA path, never full attention."""
    model = tiny_model("llama")
    ids = _ids(40)
    sinkwindow.apply(model, "swa:8:2")
    dense = model(ids).logits
    sinkwindow.apply(model, "full")
    full = model(ids).logits

    def refuse(*args, **kwargs):
        raise RuntimeError("no kernel for this shape")

    monkeypatch.setattr(flex, "flex_attention", refuse)
    sinkwindow.apply(model, "swa:8:2", attn_implementation="flex")
    with caplog.at_level(logging.WARNING, logger="sinkwindow.runtime.flex"):
        first = model(ids).logits
        again, _ = sinkwindow.prefill(model, ids, chunk_size=9, return_logits="all")
    torch.testing.assert_close(first, dense, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(again, dense, atol=2e-5, rtol=1e-5)
    assert (first - full).abs().max() > 1e-2  # still windowed
    lines = [r.getMessage() for r in caplog.records if r.name == "sinkwindow.runtime.flex"]
    assert len(lines) == 1 and "no kernel for this shape" in lines[0] and "SDPA" in lines[0]
    assert flex.flex_unavailable_reason("cpu") is not None  # the device stays on SDPA


def test_attn_implementation_names():
    from sinkwindow.runtime.attention import attention_name as _attention_name

    model = tiny_model("llama")
    cls = type(model)
    for name in ("flex", "flex_attention", flex.FLEX_NAME):
        assert _attention_name(cls, name, "sdpa") == flex.FLEX_NAME
    # Flex only when asked for: a model loaded with "flex_attention" keeps running the SDPA path.
    assert _attention_name(cls, None, "flex_attention") == sinkwindow.runtime.attention.SDPA_NAME
    with sinkwindow.apply(model, "swa:8:2", attn_implementation="flex"):
        assert model.config._attn_implementation == flex.FLEX_NAME
        assert plan_of(model).fallback == "sdpa" and config_plan(model.config) is plan_of(model)
    assert model.config._attn_implementation == "sdpa" and plan_of(model) is None
    assert config_plan(model.config) is None
    gemma2 = tiny_model("gemma2")
    sinkwindow.apply(gemma2, "swa:8:2", attn_implementation="flex")
    # No SDPA for Gemma 2: its short calls run its own eager attention (with the softcap).
    assert plan_of(gemma2).fallback == "eager"


@pytest.mark.slow
@torch.no_grad()
def test_compiled_flex_on_smollm2_matches_sdpa(smollm2, monkeypatch):
    """The compiled kernel (what runs by default) on the real model, one-shot and chunked past the threshold."""
    monkeypatch.setattr(flex, "OPTIONS", flex.FlexOptions())
    model, _ = smollm2
    n = flex.CPU_MIN_QUERIES + 300
    ids = torch.randint(1, 1000, (1, n), generator=torch.Generator().manual_seed(0))
    out = {}
    for impl in ("sdpa", "flex"):
        sinkwindow.apply(model, "swa:256:4", attn_implementation=impl)
        one, _ = sinkwindow.prefill(model, ids, chunk_size=n, return_logits="all")
        chunked, _ = sinkwindow.prefill(model, ids, chunk_size=flex.CPU_MIN_QUERIES, return_logits="all")
        out[impl] = (one, chunked)
        sinkwindow.apply(model, "full")
    assert not flex._BROKEN, flex._BROKEN
    for a, b in zip(out["sdpa"], out["flex"]):
        torch.testing.assert_close(b, a, atol=1e-3, rtol=1e-3)

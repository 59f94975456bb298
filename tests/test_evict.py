"""evict:W:S, the dense-prefill-then-evict ablation (kvpress StreamingLLMPress, attention_sinks, old HF
SinkCache): the prompt runs the model as it is, decoding sees only sinks + recent, and on long prompts
it is a different method from SWA(W, S)."""

import pytest
import torch

import sinkwindow
from conftest import VOCAB, tiny_model
from sinkwindow.runtime.reference import reference_greedy, reference_logits

W, S = 8, 2


def _ids(length, seed=11):
    return torch.randint(1, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


class _KeyCount:
    """Records how many keys each forward's layer 0 attends over and keeps afterwards."""

    def __init__(self, cache):
        self.read, self.kept = [], []
        layer = cache.layers[0]
        orig = layer.update

        def update(k, v, *a, **kw):
            keys, values = orig(k, v, *a, **kw)
            self.read.append(keys.shape[-2])
            self.kept.append(layer.n_persisted)
            return keys, values

        layer.update = update


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "mistral", "gemma3_text"])
@pytest.mark.parametrize("positions", ["absolute", "cache"])
def test_prompt_logits_equal_full_attention(family, positions):
    model = tiny_model(family)
    ids = _ids(40)
    full = model(ids).logits
    sinkwindow.apply(model, f"evict:{W}:{S}:{positions}")
    cache = sinkwindow.make_cache(model)
    watch = _KeyCount(cache)
    # prefill() runs evict's prompt as one forward whatever the chunk size.
    logits, cache = sinkwindow.prefill(model, ids, chunk_size=5, cache=cache, return_logits="all")
    torch.testing.assert_close(logits, full, atol=2e-5, rtol=1e-5)
    assert watch.read == [40] and watch.kept == [W - 1]
    torch.testing.assert_close(model(ids).logits, full, atol=2e-5, rtol=1e-5)  # a plain forward too


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("positions", ["absolute", "cache"])
def test_decode_steps_see_only_sinks_and_recent(family, positions):
    model = tiny_model(family)
    prompt, n_new = 30, 14
    ids = _ids(prompt + n_new)
    spec = f"evict:{W}:{S}:{positions}"
    ref = reference_logits(model, ids, spec, prompt_length=prompt)  # prompt rows dense, later rows SWA
    sinkwindow.apply(model, spec)
    cache = sinkwindow.make_cache(model)
    watch = _KeyCount(cache)
    logits, cache = sinkwindow.prefill(model, ids[:, :prompt], cache=cache, return_logits="all")
    steps = [model(ids[:, t : t + 1], cache=cache).logits for t in range(prompt, prompt + n_new)]
    got = torch.cat([logits, *steps], dim=1)
    torch.testing.assert_close(got.double(), ref, atol=2e-4, rtol=1e-4)
    assert watch.read[1:] == [W] * n_new  # each decode step: s sinks + (w - s - 1) recent + itself
    assert set(watch.kept) == {W - 1}


@torch.no_grad()
@pytest.mark.parametrize("positions", ["absolute", "cache"])
def test_generate_matches_reference(positions):
    model = tiny_model("qwen2")
    model.generation_config.eos_token_id = None
    ids = _ids(25)
    spec = f"evict:{W}:{S}:{positions}"
    want = reference_greedy(model, ids, spec, 15)
    sinkwindow.apply(model, spec)
    got = model.generate(ids, cache=sinkwindow.make_cache(model), max_new_tokens=15, do_sample=False)
    assert torch.equal(got, want)
    assert torch.equal(sinkwindow.generate(model, ids, 15, chunk_size=4), want)


@torch.no_grad()
def test_evict_differs_from_swa_on_long_prompts_only():
    model = tiny_model("llama")
    results = {}
    for length in (W, 40):
        ids = _ids(length)
        for spec in (f"evict:{W}:{S}", f"swa:{W}:{S}"):
            sinkwindow.apply(model, spec)
            logits, cache = sinkwindow.prefill(model, ids, chunk_size=16, return_logits="all")
            step = model(torch.tensor([[7]]), cache=cache).logits
            results[length, spec.split(":")[0]] = torch.cat([logits, step], dim=1)
    # A prompt no longer than W: full attention is SWA(W, S), so the two methods coincide.
    torch.testing.assert_close(results[W, "evict"], results[W, "swa"], atol=1e-5, rtol=1e-5)
    # A long prompt: queries past W (and the first decoded token) see different keys and hidden states.
    diff = (results[40, "evict"] - results[40, "swa"]).abs().amax(-1)[0]
    assert (diff[:W] < 1e-5).all() and (diff[W + 4 :] > 1e-3).all()


@torch.no_grad()
def test_continuing_a_prompt_is_windowed():
    """Only the first forward is dense: a second prompt (a chat turn) on the same cache sees sinks + recent."""
    model = tiny_model("llama")
    ids = _ids(36)
    spec = f"evict:{W}:{S}"
    ref = reference_logits(model, ids, spec, prompt_length=20)
    sinkwindow.apply(model, spec)
    first, cache = sinkwindow.prefill(model, ids[:, :20], return_logits="all")
    second, cache = sinkwindow.prefill(model, ids[:, 20:], chunk_size=5, cache=cache, return_logits="all")
    torch.testing.assert_close(torch.cat([first, second], 1).double(), ref, atol=2e-4, rtol=1e-4)

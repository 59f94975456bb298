"""Trained head gates (DuoAttention's criterion): the gated forward is SWA at α = 0 and full at α = 1,
and training moves the gates of a frozen model while keeping them in [0, 1]."""

from __future__ import annotations

import pytest
import torch

import sinkwindow
from conftest import VOCAB, tiny_model
from sinkwindow.runtime.reference import reference_logits
from sinkwindow.tuning.gates import gated_forward, train_gates

SPEC = "swa:8:2"


def _ids(n=30, seed=3):
    return torch.randint(1, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def _alpha(model, value):
    layers, kv = model.config.num_hidden_layers, model.config.num_key_value_heads
    return {i: torch.full((kv,), value) for i in range(layers)}


@torch.no_grad()
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_gates_at_zero_are_swa_and_at_one_full_attention(family):
    model = tiny_model(family)
    ids = _ids()
    head = model.get_output_embeddings()
    full = model(ids).logits.double()
    swa = reference_logits(model, ids, SPEC)  # the fp64 reference of SWA(8, 2)
    at_one = head(gated_forward(model, ids, _alpha(model, 1.0), SPEC)).double()
    at_zero = head(gated_forward(model, ids, _alpha(model, 0.0), SPEC)).double()
    torch.testing.assert_close(at_one, full, atol=2e-4, rtol=1e-4)
    torch.testing.assert_close(at_zero, swa, atol=2e-4, rtol=1e-4)
    assert (full - swa).abs().max() > 1e-2  # the window matters on this prompt
    # One head gated alone changes the output only through that head's layer onwards.
    one = _alpha(model, 0.0)
    one[1][0] = 1.0
    mixed = head(gated_forward(model, ids, one, SPEC)).double()
    assert (mixed - at_zero).abs().max() > 1e-4 and (mixed - at_one).abs().max() > 1e-4
    assert model.config._attn_implementation == "sdpa"  # restored


def test_training_moves_gates_inside_the_unit_interval_and_leaves_the_model_frozen():
    model = tiny_model("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = train_gates(model, [_ids(seed=s) for s in range(3)], SPEC, steps=12, lr=0.1, l1=0.5)
    flat = [a for layer in result.alpha for a in layer]
    assert len(result.alpha) == model.config.num_hidden_layers and all(0.0 <= a <= 1.0 for a in flat)
    assert min(flat) < 1.0  # the L1 pull moved them from the all-full start
    assert result.losses[-1]["l1"] < result.losses[0]["l1"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.requires_grad for p in model.parameters())
    # Scores: a KV head's own gate, a layer's mean.
    assert result.scores([(0, 1)]) == [result.alpha[0][1]]
    assert result.scores([2]) == [pytest.approx(sum(result.alpha[2]) / len(result.alpha[2]))]


def test_gates_refuse_a_spec_that_is_not_plain_swa():
    model = tiny_model("llama")
    for bad in ("evict:8:2", "swa:8:2+full:1", "full"):
        with pytest.raises(ValueError, match="plain swa:W:S"):
            train_gates(model, [_ids()], bad, steps=1)
    assert sinkwindow.active_spec(model).is_full


@torch.no_grad()
def test_gates_on_native_sliding_layers_run_as_the_model_does():
    # Gemma 3: layers 0 and 1 slide natively (window 12), layer 2 is global; the prompt (30) is longer.
    model = tiny_model("gemma3_text")
    ids = _ids()
    head = model.get_output_embeddings()
    full = model(ids).logits.double()  # the unpatched model: local layers on their own window
    at_one = head(gated_forward(model, ids, _alpha(model, 1.0), SPEC)).double()
    torch.testing.assert_close(at_one, full, atol=2e-4, rtol=1e-4)
    override = head(gated_forward(model, ids, _alpha(model, 0.0), SPEC)).double()
    torch.testing.assert_close(override, reference_logits(model, ids, SPEC), atol=2e-4, rtol=1e-4)
    # "keep": only the global layer is gated; at 0 it is apply(SPEC, native_sliding="keep").
    keep = head(gated_forward(model, ids, {2: torch.zeros(model.config.num_key_value_heads)}, SPEC)).double()
    want = reference_logits(model, ids, SPEC, native_sliding="keep")
    torch.testing.assert_close(keep, want, atol=2e-4, rtol=1e-4)
    assert (want - override).abs().max() > 1e-3 and (want - full).abs().max() > 1e-3


def test_keep_trains_only_the_global_layers_gates():
    model = tiny_model("gemma3_text")
    result = train_gates(model, [_ids(seed=s) for s in range(2)], SPEC, steps=6, lr=0.1, l1=0.5,
                         native_sliding="keep")  # fmt: skip
    assert result.alpha[0] == result.alpha[1] == [1.0, 1.0]  # native layers: untouched, at init
    assert min(result.alpha[2]) < 1.0
    with pytest.raises(ValueError, match="no head to gate"):
        train_gates(tiny_model("mistral"), [_ids()], SPEC, steps=1, native_sliding="keep")


def test_a_stopped_training_resumed_from_its_json_state_ends_where_one_run_ends():
    import json

    model = tiny_model("llama")
    prompts = [_ids(seed=s) for s in range(3)]
    whole = train_gates(model, prompts, SPEC, steps=7, lr=0.1, l1=0.5)
    states = []
    train_gates(model, prompts, SPEC, steps=7, lr=0.1, l1=0.5, on_step=states.append)
    assert [st["step"] for st in states] == list(range(1, 8))
    stopped = json.loads(json.dumps(states[3]))  # what a memo line keeps, after step 4
    assert stopped["alpha"] != whole.alpha  # the gates had further to go
    resumed = train_gates(model, prompts, SPEC, steps=7, lr=0.1, l1=0.5, resume=stopped)
    assert resumed.losses[:4] == whole.losses[:4] and len(resumed.losses) == 7
    for a, b in zip(resumed.losses[4:], whole.losses[4:]):
        assert a["distill"] == pytest.approx(b["distill"], rel=1e-5, abs=1e-9)
    assert torch.allclose(torch.tensor(resumed.alpha), torch.tensor(whole.alpha), atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
@pytest.mark.parametrize("spec,block", [(SPEC, 5), (SPEC, 256), ("swa:12:0", 7), ("swa:16:6", 1)])
def test_the_blocked_gated_forward_agrees_with_the_dense_reference_and_its_gradients(family, spec, block):
    # Blocks that do not divide the prompt (31), one wider than it, one query each; Gemma 3's local
    # layers (window 12) take the blocked path on their "full" side too.
    model = tiny_model(family)
    ids = _ids(n=31)
    layers, kv = model.config.num_hidden_layers, model.config.num_key_value_heads
    gen = torch.Generator().manual_seed(0)
    grads, hidden = [], []
    probe = torch.randn(model.config.hidden_size, generator=gen)  # a loss no final norm flattens
    start = {i: torch.rand(kv, generator=gen) for i in range(layers)}  # the same α for both
    for b in (None, block):
        alpha = {i: a.clone().requires_grad_() for i, a in start.items()}
        out = gated_forward(model, ids, alpha, spec, block=b)
        (out.float() @ probe).sum().backward()
        hidden.append(out.detach().double())
        grads.append(torch.stack([alpha[i].grad for i in range(layers)]).double())
    torch.testing.assert_close(hidden[1], hidden[0], atol=2e-5, rtol=1e-4)
    scale = grads[0].abs().max()
    assert scale > 1e-3  # the gates do move the loss
    torch.testing.assert_close(grads[1], grads[0], atol=1e-4 * float(scale), rtol=1e-3)


def test_the_gated_forward_refuses_a_block_of_no_queries():
    with pytest.raises(ValueError, match="block is a number of queries"):
        gated_forward(tiny_model("llama"), _ids(), _alpha(tiny_model("llama"), 1.0), SPEC, block=0)

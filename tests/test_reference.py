"""The reference for the reference: ``sinkwindow.runtime.reference`` with ``full`` equals the stock model in float64.

Every fast path is tested against ``reference.py``; this checks that the reference itself reproduces the
unmodified model (its scaling, softcap, GQA, native sliding layers and padding positions) and does not
merely agree with our masks.
"""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import EAGER_ONLY, FAMILIES, VOCAB, tiny_model
from sinkwindow.runtime.reference import reference_logits

# Longer than every tiny config's native window (12 for Gemma/Cohere 2, 24 for Mistral).
LENGTH = 37


def _ids(batch=2, seed=5):
    return torch.randint(1, VOCAB, (batch, LENGTH), generator=torch.Generator().manual_seed(seed))


def _left_padding():
    mask = torch.ones(2, LENGTH, dtype=torch.long)
    mask[1, :6] = 0
    return mask


@torch.no_grad()
@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in EAGER_ONLY])
def test_reference_full_equals_stock_sdpa_model_in_float64(family):
    """Against stock SDPA (torch's kernel, not ours), unpadded and left-padded, to float64 rounding."""
    model = tiny_model(family, "sdpa")
    stock = copy.deepcopy(model).double()
    ids = _ids()
    torch.testing.assert_close(reference_logits(model, ids, "full"), stock(ids).logits, atol=1e-10, rtol=0)
    mask = _left_padding()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # what generate gives left-padded rows
    want = stock(ids, attention_mask=mask, position_ids=positions).logits
    got = reference_logits(model, ids, "full", attention_mask=mask)
    real = mask.bool()  # padding columns' outputs are never used
    torch.testing.assert_close(got[real], want[real], atol=1e-10, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("family", FAMILIES)
def test_reference_full_equals_stock_eager_model_in_float64(family):
    """Against each family's own eager attention (Gemma 2's softcap included).

    transformers' eager functions take the softmax in float32 even in a float64 model, so agreement is
    at float32 rounding of the attention weights (about 1e-7), not 1e-10; a wrong scale, softcap or
    mask moves the logits by 1e-3 or more.
    """
    model = tiny_model(family, "eager")
    stock = copy.deepcopy(model).double()
    ids = _ids()
    torch.testing.assert_close(reference_logits(model, ids, "full"), stock(ids).logits, atol=5e-7, rtol=0)


@torch.no_grad()
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_reference_runs_moe_models_on_their_default_experts_kernel(family):
    """MoE models default to grouped_mm experts, which have no float64 kernel; the reference switches them."""
    from transformers import AutoModelForCausalLM

    import sinkwindow
    from conftest import tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family))
    assert model.config._experts_implementation != "eager"
    ids = _ids(batch=1)
    want = reference_logits(model, ids, "swa:8:2")
    assert model.config._experts_implementation != "eager"  # the user's model is left alone
    sinkwindow.apply(model, "swa:8:2")
    torch.testing.assert_close(model(ids).logits.double(), want, atol=1e-5, rtol=0)

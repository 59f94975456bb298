"""benchmarks/liger_state_growth.py: chunk-continued perplexity and the state norms it reports."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import torch

import sinkwindow
from conftest import tiny_model
from sinkwindow.eval.perplexity import token_nll
from sinkwindow.linear import convert

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "liger_state_growth.py"


def _script():
    spec = importlib.util.spec_from_file_location("liger_state_growth", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@torch.no_grad()
def test_chunk_perplexities_are_the_one_pass_nll_of_their_tokens() -> None:
    model = convert(tiny_model("llama"), "liger:8")
    ids = torch.randint(1, 101, (1, 23), generator=torch.Generator().manual_seed(0))
    rows = _script().measure(model, ids, chunk=7)["chunks"]
    nll = token_nll(model, ids, chunk_size=23)  # [22]: one pass, no chunk boundary
    assert [(r["start"], r["end"]) for r in rows] == [(0, 7), (7, 14), (14, 21), (21, 23)]
    for r in rows:
        want = math.exp(float(nll[r["start"] : min(r["end"], 22)].mean()))
        assert math.isclose(r["ppl"], want, rel_tol=1e-4), (r, want)


@torch.no_grad()
def test_state_norms_are_the_cache_states_after_each_chunk() -> None:
    model = convert(tiny_model("llama"), "liger:8")
    ids = torch.randint(1, 101, (1, 16), generator=torch.Generator().manual_seed(1))
    rows = _script().measure(model, ids, chunk=8)["chunks"]
    _, cache = sinkwindow.prefill(model, ids[:, :8], chunk_size=8, return_logits="none")
    first = [float(layer.S.float().norm()) for layer in cache.layers]
    assert rows[0]["state_norm"] == first
    assert all(x > 0 for x in first)
    # The second chunk continues the same state: the norms change from the first chunk's.
    assert rows[1]["state_norm"] != first

"""Smoke tests on the real SmolLM2-135M (the embedded default model)."""

import pytest
import torch

import sinkwindow
from sinkwindow.eval.perplexity import essay_token_windows, perplexity

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def essay_2k(smollm2):
    pytest.importorskip("sinkwindow.eval.generators.haystack")
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


def test_eval_cli_end_to_end_tiny(smollm2, tmp_path):
    """`sinkwindow eval niah` on the real model at a tiny size: rows, config and report land."""
    import json

    from sinkwindow.cli import main

    out = tmp_path / "run"
    rc = main(
        [
            "eval",
            "niah",
            "--tasks",
            "niah_single_2",
            "--lengths",
            "512",
            "--samples",
            "1",
            "--methods",
            "full,swa:64:4",
            "--niah-max-new-tokens",
            "auto",
            "--no-progress",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [(r["method"], r["task"], r["length"]) for r in rows] == [
        ("full", "niah_single_2", 512),
        ("swa:64:4", "niah_single_2", 512),
    ]
    assert all(r["score"] in (0.0, 100.0) and r["n_prompt_tokens"] <= 512 - 128 for r in rows)
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == "smollm2-135m" and config["versions"]["transformers"]
    assert "S-NIAH-2" in (out / "report.md").read_text()


def test_batched_evaluation_equals_one_at_a_time(smollm2, tmp_path):
    """Predictions and scores of a left-padded batch equal one-at-a-time decoding, on the real model."""
    from sinkwindow.eval.runner import EvalConfig, run_eval
    from sinkwindow.linear import convert, revert, save_checkpoint

    model, tok = smollm2
    # An untrained lolcats:64 adapter is enough here: the question is batching, not quality.
    convert(model, "lolcats:64")
    ckpt = save_checkpoint(model, tmp_path / "lolcats64" / "model.safetensors")
    revert(model)
    kw = dict(
        model="smollm2-135m",
        methods=["full", "swa:64:4", "evict:64:4", "lolcats:64"],
        tasks=["niah_single_2", "babilong_qa1"],
        lengths=[1024],
        babilong_lengths=[0],
        samples=3,
        niah_max_new_tokens=12,
        checkpoints={"lolcats:64": str(ckpt)},
    )
    rows = {}
    for bs in (1, 3):
        store = run_eval(EvalConfig(**kw, batch_size=bs), tmp_path / f"bs{bs}", model_and_tokenizer=smollm2)
        rows[bs] = {(r["method"], r["task"], r["index"]): (r["prediction"], r["score"]) for r in store.rows()}
    assert len(rows[1]) == 4 * 2 * 3 and rows[1] == rows[3]

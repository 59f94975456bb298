"""The paper's efficiency model (§4.3): a small Llama-style transformer with random weights.

The paper times a 4-layer transformer with embedding 1024 and 16 heads from 128 to 256K tokens of
context. Decode cost does not depend on what the weights are, only on their shapes, so a random
model built from a ``LlamaConfig`` (no download) is the faithful stand-in. Every size is a knob.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

__all__ = ["SyntheticConfig", "build_synthetic", "SYNTHETIC_NAME"]

SYNTHETIC_NAME = "synthetic"


@dataclass(frozen=True)
class SyntheticConfig:
    """Sizes of the synthetic model; the defaults are the paper's (§4.3).

    Attributes:
        layers: decoder layers (paper: 4).
        hidden: embedding width (paper: 1024).
        heads: query heads (paper: 16).
        kv_heads: key/value heads; ``None`` means ``heads`` (multi-head attention, as the paper).
        intermediate: MLP width; ``None`` means Llama's 8/3 x hidden rounded up to a multiple of
            256 (2816 for hidden 1024; tiny test models round to a multiple of ``hidden``). The
            paper does not give it.
        vocab: vocabulary size (the paper does not give it; Llama's 32000). The LM head is read
            once per decoded token, so it sets part of the length-independent cost.
        max_positions: RoPE table length; must cover the longest context plus the decode steps.
        seed: weight initialisation seed.
    """

    layers: int = 4
    hidden: int = 1024
    heads: int = 16
    kv_heads: int | None = None
    intermediate: int | None = None
    vocab: int = 32000
    max_positions: int = 1 << 19
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "vocab", "max_positions"):
            if getattr(self, name) <= 0:
                raise ValueError(f"synthetic model: {name} must be positive, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(
                f"synthetic model: hidden ({self.hidden}) must be a multiple of heads ({self.heads})"
            )
        if self.kv_heads is not None and (self.kv_heads <= 0 or self.heads % self.kv_heads):
            raise ValueError(
                f"synthetic model: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.intermediate is not None and self.intermediate <= 0:
            raise ValueError(f"synthetic model: intermediate must be positive, got {self.intermediate}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def mlp_width(self) -> int:
        if self.intermediate is not None:
            return self.intermediate
        multiple = min(256, self.hidden)
        return -(-(8 * self.hidden // 3) // multiple) * multiple

    def to_llama_config(self) -> LlamaConfig:
        return LlamaConfig(
            vocab_size=self.vocab,
            hidden_size=self.hidden,
            intermediate_size=self.mlp_width,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads or self.heads,
            max_position_embeddings=self.max_positions,
            tie_word_embeddings=False,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
        )

    def describe(self) -> dict:
        """The sizes as a JSON-able dict (what results files record)."""
        return {**asdict(self), "head_dim": self.head_dim, "mlp_width": self.mlp_width}


def build_synthetic(
    config: SyntheticConfig | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
) -> LlamaForCausalLM:
    """Build the synthetic model with random weights, in eval mode.

    Args:
        config: sizes (default: the paper's 4 layers, 1024 wide, 16 heads).
        dtype: parameter dtype.
        device: where the model lives.
        attn_implementation: ``"sdpa"`` (default) or ``"eager"``.

    Returns:
        A ``LlamaForCausalLM``; ``model.config.sinkwindow_synthetic`` records the sizes.
    """
    config = config or SyntheticConfig()
    torch.manual_seed(config.seed)
    llama_cfg = config.to_llama_config()
    model = LlamaForCausalLM._from_config(llama_cfg, attn_implementation=attn_implementation, dtype=dtype)
    model.config.sinkwindow_synthetic = config.describe()
    return model.to(device).eval()

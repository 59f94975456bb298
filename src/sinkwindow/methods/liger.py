"""``liger:W``: Liger-GLA(+SWA), 0.5 softmax over the last W keys + 0.5 gated linear attention over
every key, each normalised on its own; no new parameters, trained with LoRA."""

from __future__ import annotations

from .linear import LINEAR_STATE_BYTES, WindowedRetrofit

__all__ = ["Liger"]


class Liger(WindowedRetrofit):
    kind = "liger"
    paper_rank = 1
    family = "Liger-GLA(+SWA)"
    # No new parameters: softmax over the pre-RoPE q and k is its feature map, LoRA its only training.
    train_stages = ("finetune",)
    feature_maps = False

    def recurrent_bytes(self, config, batch: int, feature_dim: int | None) -> int:
        """The gated state: per layer and KV head, one [D, D] float32 matrix."""
        from ..runtime.kv_bytes import kv_geometry  # noqa: PLC0415

        layers, _, kv_heads, head_dim = kv_geometry(config)
        return layers * batch * kv_heads * head_dim * head_dim * LINEAR_STATE_BYTES

    def window_keys(self, context: int) -> int:
        return min(context, self.spec.window - 1)

"""``linear``: pure linear attention (Hedgehog feature maps), a trained retrofit of the model.

The retrofits (``linear``, ``lolcats``, ``liger``) keep a constant recurrent state instead of a KV
cache; ``state_bytes`` counts it here (``LinearBase.recurrent_bytes``) beside the softmax window
the hybrids add."""

from __future__ import annotations

from ..runtime.spec import MethodSpec
from .base import Method

__all__ = ["LINEAR_STATE_BYTES", "LinearBase", "Linear", "WindowedRetrofit"]

# sinkwindow.linear keeps the recurrent state (S, z) in float32 whatever the model dtype (bf16
# accumulation of z drifts over long streams, docs/linear.md §7.2).
LINEAR_STATE_BYTES = 4


class LinearBase(Method):
    """A trained linear-attention retrofit: it is converted in, never patched."""

    adapter = "retrofit"
    # LoLCATs' recipe: attention transfer (the feature maps learn softmax), then LoRA fine-tuning.
    train_stages = ("transfer", "finetune")
    feature_maps = True

    @property
    def label(self) -> str:
        tail = f"@{self.spec.adapter}" if self.spec.adapter else ""
        window = f" w={self.spec.window}" if self.spec.window else ""
        return f"{self.family}{window}{tail}"

    def state_bytes(
        self,
        config,
        context: int,
        *,
        dtype=None,
        batch: int = 1,
        native_sliding: str = "override",
        feature_dim: int | None = None,
    ) -> int:
        """The recurrent state (float32) plus the softmax window's keys/values, summed over layers.

        ``feature_dim``: F, the feature size; default ``head_dim`` (what ``linear.convert`` builds).
        """
        import torch  # noqa: PLC0415

        from ..runtime.kv_bytes import kv_geometry  # noqa: PLC0415

        layers, _, kv_heads, head_dim = kv_geometry(config)
        per_token = (
            2 * batch * kv_heads * head_dim * torch.empty((), dtype=dtype or torch.float32).element_size()
        )
        return self.recurrent_bytes(config, batch, feature_dim) + layers * per_token * self.window_keys(
            context
        )

    def recurrent_bytes(self, config, batch: int, feature_dim: int | None) -> int:
        """The constant state: per layer and head, S [F, D] and z [F], float32."""
        from ..runtime.kv_bytes import kv_geometry  # noqa: PLC0415

        layers, heads, _, head_dim = kv_geometry(config)
        feats = feature_dim or head_dim
        return layers * batch * heads * (feats * head_dim + feats) * LINEAR_STATE_BYTES

    def window_keys(self, context: int) -> int:
        """Keys (and values) the softmax window holds after ``context`` tokens; none for pure linear."""
        return 0


class Linear(LinearBase):
    kind = "linear"
    family = "linear (Hedgehog)"

    def rank_against(self, anchor: MethodSpec) -> float | None:
        return 4


class WindowedRetrofit(LinearBase):
    """A paper retrofit with a softmax window of W keys beside its linear part (lolcats, liger)."""

    # Its place beside SWA(W, s) of the same W (LoLCATs first, as the paper's tables).
    paper_rank: float = 0

    @property
    def exact_view(self) -> tuple[int, int] | None:
        return self.spec.window, 0  # its last W keys, by softmax

    @property
    def paper_retrofit(self) -> bool:
        return True

    def rank_against(self, anchor: MethodSpec) -> float | None:
        return self.paper_rank if self.spec.window == anchor.window else None

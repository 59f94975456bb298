"""``swa:W:S``: SWA(W, S), S attention sinks + the W - S most recent keys, prompt and decoding alike.

It may carry a LoRA adapter trained under SWA (``swa:W:S@NAME``)."""

from __future__ import annotations

from ..runtime.spec import MethodSpec
from .base import Method

__all__ = ["Swa"]


class Swa(Method):
    kind = "swa"
    family = "SWA"
    adapter = "lora"
    windowed = True
    # The equal-budget control of the retrofits: LoRA fine-tuning only, no attention transfer.
    train_stages = ("finetune",)

    @property
    def takes_full_units(self) -> bool:
        return self.spec.positions == "absolute"  # units keep their absolute positions too

    @property
    def trainable(self) -> bool:
        return self.spec.positions == "absolute"  # what a LoRA adapter is trained under

    @property
    def exact_view(self) -> tuple[int, int] | None:
        return self.spec.window, self.spec.sinks

    @property
    def anchors_comparisons(self) -> bool:
        return self.spec.sinks > 0

    def rank_against(self, anchor: MethodSpec) -> float | None:
        same_w = self.spec.window == anchor.window and self.spec.positions == anchor.positions
        if (
            same_w
            and self.spec.sinks == anchor.sinks
            and self.spec.adapter != anchor.adapter
            and not anchor.adapter
        ):
            return 1.5  # SWA(w, s) against itself with a trained adapter: what training buys
        if same_w and self.spec.sinks == 0 and not self.spec.adapter:
            return 2  # the sinks' worth
        return None

    @property
    def label(self) -> str:
        pos = ", cache positions" if self.spec.positions == "cache" else ""
        tail = f"@{self.spec.adapter}" if self.spec.adapter else ""
        return f"SWA({self.spec.window}, {self.spec.sinks}{pos}){tail}"

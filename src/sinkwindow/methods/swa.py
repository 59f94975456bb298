"""``swa:W:S``: SWA(W, S), S attention sinks + the W - S most recent keys, prompt and decoding alike.

It may carry a LoRA adapter trained under SWA (``swa:W:S@NAME``)."""

from __future__ import annotations

from .base import Method

__all__ = ["Swa"]


class Swa(Method):
    kind = "swa"
    family = "SWA"
    adapter = "lora"
    windowed = True

    @property
    def label(self) -> str:
        pos = ", cache positions" if self.spec.positions == "cache" else ""
        tail = f"@{self.spec.adapter}" if self.spec.adapter else ""
        return f"SWA({self.spec.window}, {self.spec.sinks}{pos}){tail}"

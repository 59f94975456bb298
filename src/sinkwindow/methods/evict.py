"""``evict:W:S``: dense attention over the prompt, then sinks + recent keys while decoding
(kvpress StreamingLLMPress, attention_sinks, the old HF SinkCache)."""

from __future__ import annotations

from ..runtime.spec import MethodSpec
from .base import Method

__all__ = ["Evict"]


class Evict(Method):
    kind = "evict"
    family = "evict"
    windowed = True
    # The prompt is one dense forward whatever the chunk size asked; the cache evicts afterwards.
    dense_prompt = True

    @property
    def exact_view(self) -> tuple[int, int] | None:
        return self.spec.window, self.spec.sinks

    def rank_against(self, anchor: MethodSpec) -> float | None:
        same = (self.spec.window, self.spec.positions, self.spec.sinks) == (
            anchor.window,
            anchor.positions,
            anchor.sinks,
        )
        return 3 if same else None

    @property
    def label(self) -> str:
        pos = ", cache positions" if self.spec.positions == "cache" else ""
        return f"evict({self.spec.window}, {self.spec.sinks}{pos})"

"""``evict:W:S``: dense attention over the prompt, then sinks + recent keys while decoding
(kvpress StreamingLLMPress, attention_sinks, the old HF SinkCache)."""

from __future__ import annotations

from .base import Method

__all__ = ["Evict"]


class Evict(Method):
    kind = "evict"
    family = "evict"
    windowed = True
    # The prompt is one dense forward whatever the chunk size asked; the cache evicts afterwards.
    dense_prompt = True

    @property
    def label(self) -> str:
        pos = ", cache positions" if self.spec.positions == "cache" else ""
        return f"evict({self.spec.window}, {self.spec.sinks}{pos})"

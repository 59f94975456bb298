"""``lolcats:W``: LoLCATs, softmax over the last W keys + linear attention over everything older,
one shared normaliser; a trained retrofit."""

from __future__ import annotations

from .linear import LinearBase

__all__ = ["Lolcats"]


class Lolcats(LinearBase):
    kind = "lolcats"
    family = "LoLCATs(+SWA)"

    def window_keys(self, context: int) -> int:
        return min(context, self.spec.window)

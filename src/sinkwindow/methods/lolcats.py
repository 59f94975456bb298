"""``lolcats:W``: LoLCATs, softmax over the last W keys + linear attention over everything older,
one shared normaliser; a trained retrofit."""

from __future__ import annotations

from .linear import WindowedRetrofit

__all__ = ["Lolcats"]


class Lolcats(WindowedRetrofit):
    kind = "lolcats"
    paper_rank = 0
    family = "LoLCATs(+SWA)"

    def window_keys(self, context: int) -> int:
        return min(context, self.spec.window)

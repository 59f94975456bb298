"""``full``: the unmodified model, dense causal attention and a growing KV cache."""

from __future__ import annotations

from .base import Method

__all__ = ["Full"]


class Full(Method):
    kind = "full"
    family = "full"

    @property
    def label(self) -> str:
        return "full"

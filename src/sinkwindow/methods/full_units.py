"""``swa:W:S+full:UNITS``: SWA(W, S) except the named layers or KV heads, which keep full attention.

A wrapper over the SWA method of the spec's base: it patches and caches as one plan (the runtime
reads the units from the spec), and labels itself with its units."""

from __future__ import annotations

from .swa import Swa

__all__ = ["FullUnits"]


class FullUnits(Swa):
    """The hybrid: ``inner`` is the plain SWA(W, S) the units are taken out of."""

    family = "SWA+full"
    adapter = None
    train_stages = ()

    @property
    def trainable(self) -> bool:
        return False

    def __init__(self, spec) -> None:
        if not spec.is_hybrid:
            raise ValueError(f"{spec} names no full-attention units (e.g. swa:256:4+full:3,11)")
        super().__init__(spec)
        self.inner = Swa(spec.base)

    @property
    def exact_view(self) -> tuple[int, int] | None:
        return None  # its full units see every key

    @property
    def anchors_comparisons(self) -> bool:
        return False  # compared with the plain SWA it extends instead

    @property
    def label(self) -> str:
        return f"{self.inner.label}+full:{str(self.spec).partition('+full:')[2]}"

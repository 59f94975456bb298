"""Units a hybrid keeps full: a decoder layer (``11``) or one KV head of a layer (``(11, 2)``,
spelt ``11.2`` as in the spec grammar ``swa:256:4+full:11.2``), and the hybrid spec they make."""

from __future__ import annotations

from collections.abc import Sequence

from ..methods import method_of
from ..runtime.kv_bytes import kv_geometry, native_windows
from ..runtime.spec import MethodSpec, parse_spec

__all__ = [
    "UNIT_KINDS",
    "Unit",
    "unit_label",
    "parse_unit",
    "model_units",
    "spec_with_units",
    "check_base_spec",
]


UNIT_KINDS = ("layer", "head")


Unit = int | tuple[int, int]


def unit_label(unit: Unit) -> str:
    """``11`` -> ``"11"``, ``(11, 2)`` -> ``"11.2"`` (the spec grammar's spelling)."""
    return str(unit) if isinstance(unit, int) else f"{unit[0]}.{unit[1]}"


def parse_unit(text: str) -> Unit:
    """``"11"`` -> ``11``, ``"11.2"`` -> ``(11, 2)``."""
    layer, dot, head = str(text).partition(".")
    return (int(layer), int(head)) if dot else int(layer)


def model_units(config, by: str = "layer", native_sliding: str = "override") -> list[Unit]:
    """Every unit of a model a hybrid may keep full: its layers ``[0, 1, ...]`` or its KV heads
    ``[(0, 0), (0, 1), ...]``. Under ``native_sliding="keep"`` only the global layers' (native
    sliding layers keep their own window: ``patch.apply`` refuses units on them)."""
    if by not in UNIT_KINDS:
        raise ValueError(f"units are {' or '.join(UNIT_KINDS)}, got {by!r}")
    layers, _, kv_heads, _ = kv_geometry(config)
    native = native_windows(config)
    keep = [i for i in range(layers) if native_sliding != "keep" or native[i] is None]
    if by == "layer":
        return keep
    return [(layer, h) for layer in keep for h in range(kv_heads)]


def spec_with_units(base: MethodSpec | str, units: Sequence[Unit], kv_heads: int | None = None) -> MethodSpec:
    """``base`` with ``units`` kept full; a layer whose every KV head is named becomes a full layer.

    Args:
        kv_heads: KV heads per layer (needed only to merge complete layers; ``None``: never merge).
    """
    base = parse_spec(base).base
    layers = sorted(u for u in units if isinstance(u, int))
    heads = sorted(tuple(u) for u in units if not isinstance(u, int))
    if kv_heads:
        by_layer: dict[int, set[int]] = {}
        for layer, h in heads:
            by_layer.setdefault(layer, set()).add(h)
        whole = {layer for layer, hs in by_layer.items() if len(hs) >= kv_heads}
        layers = sorted(set(layers) | whole)
        heads = [(layer, h) for layer, h in heads if layer not in whole]
    return base.with_full(layers=layers, heads=heads)


def check_base_spec(method: MethodSpec | str) -> MethodSpec:
    """The plain ``swa:W:S`` a hybrid is built on; anything else raises ValueError naming the fix."""
    spec = parse_spec(method)
    if not method_of(spec).takes_full_units:
        raise ValueError(
            f"hybrids keep some units full on top of swa:W:S (absolute positions), not {spec}: "
            f"give e.g. --method swa:256:4"
        )
    if spec.is_hybrid:
        raise ValueError(
            f"{spec} already names full units: give the plain {spec.base} and let calibration choose them"
        )
    return spec

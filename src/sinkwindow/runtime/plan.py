"""The plan a patched model runs: one immutable ``AttentionPlan``, and the one way to read it.

``apply`` decides everything a patched forward needs once (the spec, the native-sliding policy,
the attention implementation it registered, the KV heads a hybrid keeps full) and freezes it in an
``AttentionPlan``. Every reader asks :func:`plan_of` for it::

    plan_of(model)      -> AttentionPlan | None      the model's plan (None: unpatched)
    config_plan(config) -> AttentionPlan | None      the same object, from a config

The second form exists because transformers hands its mask builders (``AttentionMaskInterface``)
the config and nothing else. The plan is *bound* to the model's own config objects in a table
here rather than written into them: a config's ``__dict__`` is what ``save_pretrained`` serialises
(a patched model saves a plain config) and what ``copy.deepcopy`` copies; and ``apply`` first gives
the model configs of its own (``patch._own_configs``), so a plan never reaches another model built
from the same config. A deep copy of a patched model carries the plan on the model and rebinds it
to its own configs on its first forward (``patch``'s pre-hook calls :func:`bind`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass

from .attributes import PLAN_ATTR
from .spec import MethodSpec

__all__ = ["AttentionPlan", "PLAN_ATTR", "bind", "config_plan", "plan_of", "unbind"]


@dataclass(frozen=True)
class AttentionPlan:
    """What a patched model runs, fixed by ``apply``.

    Attributes:
        spec: the method (``swa``/``evict``, W, S, position mode, full-attention units).
        native_sliding: ``"override"`` (SWA(w, s) on every layer) or ``"keep"`` (layers with their own
            sliding window keep it, as SWA(w_native, 0)).
        attention: the registered implementation the model runs (``sinkwindow_sdpa``,
            ``sinkwindow_eager`` or ``sinkwindow_flex``).
        fallback: under ``sinkwindow_flex``, the path of the calls flex does not take (``"sdpa"`` or
            ``"eager"``); ``None`` otherwise.
        full_kv_heads: per decoder layer, the KV heads a hybrid spec keeps full (``None``: no units).
        restores: the attention implementation the model ran before it was patched, which
            ``apply(model, "full")`` gives back.
    """

    spec: MethodSpec
    native_sliding: str
    attention: str
    restores: str
    fallback: str | None = None
    full_kv_heads: tuple[tuple[int, ...], ...] | None = None

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def window(self) -> int | None:
        return self.spec.window

    @property
    def sinks(self) -> int:
        return self.spec.sinks

    @property
    def positions(self) -> str:
        return self.spec.positions

    @property
    def made_for(self) -> tuple[str, str]:
        """What a cache made under this plan is tied to: (spec, native-sliding policy)."""
        return str(self.spec), self.native_sliding


def plan_of(model) -> AttentionPlan | None:
    """The plan ``model`` runs, or ``None`` when it is not patched (full attention)."""
    plan = getattr(model, PLAN_ATTR, None)
    return plan if isinstance(plan, AttentionPlan) else None


# id(config) -> (weak reference to that config, its plan). Keyed by id because configs define
# __eq__ (so they are unhashable); the weak reference both checks that an id was not reused and
# drops the entry when its config is collected.
_BOUND: dict[int, tuple[weakref.ref, AttentionPlan]] = {}


def config_plan(config) -> AttentionPlan | None:
    """The plan bound to ``config`` (a patched model's own config or text config), else ``None``."""
    if config is None:
        return None
    entry = _BOUND.get(id(config))
    if entry is None or entry[0]() is not config:
        return None
    return entry[1]


def bind(configs: Iterable, plan: AttentionPlan) -> None:
    """Make ``config_plan(c)`` return ``plan`` for each of ``configs`` (idempotent, cheap when bound)."""
    for config in configs:
        key = id(config)
        entry = _BOUND.get(key)
        if entry is not None and entry[0]() is config and entry[1] is plan:
            continue

        def drop(ref, key=key):
            current = _BOUND.get(key)
            if current is not None and current[0] is ref:
                del _BOUND[key]

        _BOUND[key] = (weakref.ref(config, drop), plan)


def unbind(configs: Iterable) -> None:
    """Remove any plan bound to ``configs``: their mask builders fall back to transformers' own."""
    for config in configs:
        entry = _BOUND.get(id(config))
        if entry is not None and entry[0]() is config:
            del _BOUND[id(config)]

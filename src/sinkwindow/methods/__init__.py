"""One small class per attention method, registered by kind.

``METHODS`` maps each spec kind to its class; ``method_of(spec)`` gives the object for a spec (a
hybrid ``swa:W:S+full:...`` gets the ``FullUnits`` wrapper). Adding a method is one file here and
one line in ``METHODS`` (CONTRIBUTING.md, "Adding a method").

- ``base``: ``Method``, the interface (``INTERFACE`` lists its members).
- ``full``, ``swa``, ``evict``: the unmodified model and the sink-window methods the runtime patches.
- ``linear``, ``lolcats``, ``liger``: the trained linear-attention retrofits.
- ``full_units``: the hybrid wrapper.

Importing the package imports no torch.
"""

from __future__ import annotations

from ..runtime.spec import MethodSpec, parse_spec
from .base import INTERFACE, Method
from .evict import Evict
from .full import Full
from .full_units import FullUnits
from .liger import Liger
from .linear import Linear
from .lolcats import Lolcats
from .swa import Swa

__all__ = ["METHODS", "HYBRID", "INTERFACE", "Method", "method_of"]

METHODS: dict[str, type[Method]] = {
    "full": Full,
    "swa": Swa,
    "evict": Evict,
    "linear": Linear,
    "lolcats": Lolcats,
    "liger": Liger,
}
# The wrapper a spec with full-attention units gets, whatever its kind's class.
HYBRID: type[Method] = FullUnits


def method_of(spec: str | MethodSpec) -> Method:
    """The method object for ``spec`` (a string is parsed first).

    Raises:
        ValueError: a bad spec, or a kind no class is registered for.
    """
    spec = parse_spec(spec)
    if spec.is_hybrid:
        return HYBRID(spec)
    cls = METHODS.get(spec.kind)
    if cls is None:
        raise ValueError(
            f"no method class registered for {spec.kind!r}: add one to sinkwindow.methods.METHODS"
        )
    return cls(spec)

"""Package attributes that load their module on first use (PEP 562), so that ``import sinkwindow``
and ``sinkwindow --help`` do not pay for torch and transformers before anything needs them.

Each package's ``__init__`` names its public attributes and the submodule that defines them::

    __all__ = lazy_package(__name__, {".cache": ["SinkWindowCache", "cache_nbytes"], ...})

Where a public name equals a submodule's name (``sinkwindow.prefill`` the function, defined in
``sinkwindow/prefill.py``), the import system would bind the module over the package attribute as
soon as anything imports that submodule; the package keeps the function instead, as it did when
it imported everything eagerly.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping, Sequence

__all__ = ["lazy_package"]


class _LazyPackage(types.ModuleType):
    def __getattr__(self, name: str):
        module = self.__dict__.get("_lazy_exports", {}).get(name)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, self.__name__), name)
        types.ModuleType.__setattr__(self, name, value)  # later lookups skip __getattr__
        return value

    def __setattr__(self, name: str, value) -> None:
        exports = self.__dict__.get("_lazy_exports", {})
        if (
            name in exports
            and isinstance(value, types.ModuleType)
            and value.__name__ == f"{self.__name__}.{name}"
        ):
            # The import system binding submodule ``name``: keep the public attribute of that name.
            value = getattr(value, name)
        types.ModuleType.__setattr__(self, name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(self.__dict__) | set(self.__dict__.get("_lazy_exports", {})))


def lazy_package(package: str, exports: Mapping[str, Sequence[str]]) -> list[str]:
    """Make ``package`` load each public name from its module on first access; returns ``__all__``.

    Args:
        package: the package's ``__name__``.
        exports: ``{relative or absolute module: [names it defines]}``.
    """
    module = sys.modules[package]
    table = {name: mod for mod, names in exports.items() for name in names}
    module.__dict__["_lazy_exports"] = table
    module.__class__ = _LazyPackage
    return list(table)

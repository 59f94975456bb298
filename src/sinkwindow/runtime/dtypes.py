"""The dtypes a model may run in, by the names users type (``--dtype``, run configs), in one place.

No torch at import: the command line validates names before anything loads.
"""

from __future__ import annotations

__all__ = ["DTYPES", "torch_dtype"]

# float32 first: the default everywhere, and the dtype the float64 reference's tolerances are set for.
DTYPES = ("float32", "bfloat16", "float16")


def torch_dtype(name: str):
    """The ``torch.dtype`` of a name in :data:`DTYPES`.

    Raises:
        KeyError: a name not in :data:`DTYPES` (callers word the error for their flag or field).
    """
    import torch

    if name not in DTYPES:
        raise KeyError(name)
    return getattr(torch, name)

"""What a command's flags name, made concrete once the command runs: the checkpoint of each trained
method (:func:`resolve_checkpoints`), the torch device (:func:`resolve_device`), and whether a model
goes on one device or through a device map (:func:`resolve_placement`).

``cli_args`` only parses and range-checks flags (nothing there touches torch or the machine); the
commands call these after parsing, and library code that takes the same user-facing names (the
lm-eval runner) calls them too.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["resolve_checkpoints", "resolve_device", "resolve_placement"]


def resolve_checkpoints(
    given: Sequence[tuple[str | None, str]] | None, methods: Sequence[str], *, add_methods: bool = True
) -> tuple[list[str], dict[str, str]]:
    """Match ``--checkpoint`` values with the methods: ``(methods, {method: path})``.

    ``METHOD=PATH`` names its method, which is appended to ``methods`` when missing and
    ``add_methods`` (else refused). A bare ``PATH`` belongs to the one trained baseline among
    ``methods``, and is refused when there is none or several.

    Raises:
        ValueError: naming the fix.
    """
    from ..runtime.spec import parse_spec

    methods = list(methods)
    out: dict[str, str] = {}
    for spec, path in given or []:
        if spec is None:
            linear = [m for m in methods if parse_spec(m).is_trained]
            if len(linear) != 1:
                if linear:
                    fix = f"write METHOD=PATH for each (e.g. --checkpoint {linear[0]}={path})"
                    which = f"several ({', '.join(linear)})"
                else:
                    fix = f"write METHOD=PATH with the trained method it holds (e.g. --checkpoint lolcats:256={path})"
                    which = "none"
                raise ValueError(
                    f"--checkpoint {path}: a bare PATH needs exactly one trained baseline among the methods, "
                    f"found {which}; {fix}"
                )
            spec = linear[0]
        if spec in out and out[spec] != path:
            raise ValueError(f"two checkpoints for {spec} ({out[spec]}, {path}): keep one")
        out[spec] = path
        if spec not in methods:
            if not add_methods:
                raise ValueError(
                    f"--checkpoint {spec}={path} is for {spec}, which is not the method run here "
                    f"({', '.join(methods)}): use --method {spec}"
                )
            methods.append(spec)
    return methods, out


def resolve_device(name: str | None) -> str:
    """A concrete torch device for ``name``; ``auto`` (or ``None``) picks cuda when present.

    The one device resolver: the commands and the lm-eval model (``--model_args device=...``) use it,
    so an accelerator this machine lacks is refused everywhere rather than quietly run on the CPU.

    Raises:
        ValueError: an accelerator that this machine does not have.
    """
    import torch  # noqa: PLC0415 - kept out of parse time

    from .loading import check_device

    if name is None or name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        check_device(name)
    except ValueError as err:
        raise ValueError(f"--{err}".replace("use cpu", "use --device cpu")) from None
    return name


def resolve_placement(
    device_name: str | None, device_map_value: str | dict | None
) -> tuple[str | None, str | dict | None]:
    """``(device, device map)`` of a command: one of them, the other ``None``.

    ``--device`` puts the whole model on one device; ``--device-map`` lets accelerate place each
    layer, so the two together are refused rather than one silently ignored.

    Raises:
        ValueError: both given, or an accelerator this machine lacks (:func:`resolve_device`).
    """
    if device_map_value is not None:
        if device_name is not None:
            raise ValueError(
                "--device-map and --device both given: drop --device (the device map decides where each layer goes)"
            )
        return None, device_map_value
    return (None if device_name is None else resolve_device(device_name)), None

"""Names of the peers: other implementations the benchmark times beside sinkwindow's methods, in one run.

A peer is named in ``--methods`` next to the method specs (it is not a spec: only the benchmark
knows it):

- ``peer:static-full``: full attention through transformers' ``StaticCache`` (preallocated, written
  in place), the decode step compiled on CUDA and eager on CPU; ``peer:static-full:compiled`` or
  ``peer:static-full:eager`` choose. Rows name the resolved one, so a run never mixes the two.
- ``peer:mistral-sw:W``: transformers' own sliding window, the model's weights in
  ``MistralForCausalLM`` with ``sliding_window = W`` and its stock cache (Llama-family models only).
  It computes what ``swa:W:0`` does (the same logits bit for bit in one forward; decode steps
  differ by about 2e-5 in fp32), so ``swa:W:0`` ÷ peer is what
  sinkwindow's cache and masks cost over transformers' own.

The runners are in ``methods`` (``FullStaticRunner``, ``MistralSlidingRunner``). This module only
parses names, and imports no torch.
"""

from __future__ import annotations

__all__ = [
    "PEER_PREFIX",
    "PEER_KINDS",
    "PEER_HELP",
    "is_peer",
    "parse_peer",
    "peer_kind",
    "peer_window",
    "method_name",
]

PEER_PREFIX = "peer:"
PEER_KINDS = ("static-full", "mistral-sw")
COMPILE_CHOICES = ("compiled", "eager")
PEER_HELP = "peer:static-full[:compiled|:eager], peer:mistral-sw:W"


def is_peer(name: str) -> bool:
    """Whether ``name`` names a peer (``peer:...``), well formed or not."""
    return str(name).strip().lower().startswith(PEER_PREFIX)


def parse_peer(name: str) -> str:
    """The canonical spelling of a peer name.

    Raises:
        ValueError: not a peer this benchmark knows, with the names it does.
    """
    text = str(name).strip().lower()
    parts = text.split(":")
    kind = parts[1] if len(parts) > 1 else ""
    if kind == "static-full" and (len(parts) == 2 or (len(parts) == 3 and parts[2] in COMPILE_CHOICES)):
        return text
    if kind == "mistral-sw" and len(parts) == 3:
        if parts[2].isdigit() and int(parts[2]) >= 2:
            return f"{PEER_PREFIX}mistral-sw:{int(parts[2])}"
        raise ValueError(f"{name!r}: W must be an integer >= 2, e.g. peer:mistral-sw:64")
    raise ValueError(f"unknown peer {name!r}: the peers are {PEER_HELP}")


def peer_kind(name: str) -> str:
    """``"static-full"`` or ``"mistral-sw"``."""
    return parse_peer(name).split(":")[1]


def peer_window(name: str) -> int | None:
    """W of ``peer:mistral-sw:W``; ``None`` for a peer without a window."""
    parts = parse_peer(name).split(":")
    return int(parts[2]) if parts[1] == "mistral-sw" else None


def method_name(name: str) -> str:
    """A method spec or a peer name, canonical (``"swa:64"`` -> ``"swa:64:4"``).

    Raises:
        ValueError: neither.
    """
    if is_peer(name):
        return parse_peer(name)
    from ..runtime.spec import parse_spec

    return str(parse_spec(name))

"""Method specs: the one string that names what attention a model runs.

Grammar (case-insensitive, ``:``-separated)::

    full                      dense causal attention, the unmodified model
    swa:W[:S][:POS]           SWA(W, S): S sinks + the W-S most recent keys (query included);
                              S defaults to 4, POS is ``absolute`` (default, the paper) or ``cache``
    evict:W[:S][:POS]         dense attention over the prompt, then sinks + recent while decoding
                              (kvpress StreamingLLMPress / attention_sinks / old HF SinkCache)
    linear                    pure linear attention (Hedgehog feature maps), needs training
    lolcats:W                 LoLCATs hybrid: softmax over the last W keys + linear attention over
                              everything older, one shared normaliser; needs training
    liger:W                   Liger-GLA(+SWA): 0.5 · softmax over the last W keys + 0.5 · gated linear
                              attention over every key, each normalised on its own; no new
                              parameters, trained with LoRA
    METHOD@NAME               a trained variant: ``swa:W:S@NAME`` is SWA(W, S) plus the LoRA adapter
                              NAME (trained with ``sinkwindow train --method swa:W:S``), and
                              ``lolcats:W@NAME`` (likewise ``liger``, ``linear``) an adapter other
                              than the one trained with the paper's recipe (e.g. on longer sequences).
                              It loads a shipped adapter of that name or ``--checkpoint METHOD@NAME=PATH``
    swa:W:S+full:UNITS        a hybrid: SWA(W, S) except the named units, which keep full attention.
                              A unit is a layer (``11``) or one KV head of a layer (``11.2``), comma
                              separated: ``swa:256:4+full:3,11,27`` or ``swa:256:4+full:11.2,17.0``

A spec is a frozen dataclass: hashable, comparable, and ``str(spec)`` gives back its canonical
string, which is what results files record.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "MethodSpec",
    "parse_spec",
    "SPEC_KINDS",
    "POSITION_MODES",
    "MAX_WINDOW",
    "FULL_SUFFIX",
    "ADAPTER_SEP",
    "split_specs",
]

SPEC_KINDS = ("full", "swa", "evict", "linear", "lolcats", "liger")
POSITION_MODES = ("absolute", "cache")
DEFAULT_SINKS = 4
# Past this a window is not a memory bound but a typo: positions are tensors of int64, and no model
# has a context anywhere near 2**31 tokens.
MAX_WINDOW = 2**31 - 1

# A spec's numbers: ASCII digits only (a sign for W and S, so their range check can name the bound).
_DIGITS = re.compile(r"[0-9]+")
_INTEGER = re.compile(r"-?[0-9]+")
_GRAMMAR = (
    "full | swa:W[:S][:absolute|cache][+full:L,L.H,...] | evict:W[:S][:absolute|cache] | linear | lolcats:W | "
    "liger:W, a trained one with @NAME (swa:W:S@NAME, lolcats:W@NAME)"
)
# What separates a method from the name of its trained adapter.
ADAPTER_SEP = "@"
_ADAPTER_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")
# What separates a hybrid's SWA part from the units that keep full attention.
FULL_SUFFIX = "+full:"


@dataclass(frozen=True)
class MethodSpec:
    """A validated attention method.

    Attributes:
        kind: one of ``SPEC_KINDS``.
        window: W, the number of keys a query sees (sinks included) for ``swa``/``evict``; the
            softmax window for ``lolcats`` and ``liger``; ``None`` for ``full`` and ``linear``.
        sinks: S, the number of leading tokens every query keeps seeing (``swa``/``evict``).
        positions: ``"absolute"`` keeps every token's original position (RoPE applied once, the
            paper); ``"cache"`` re-assigns positions inside the cache (StreamingLLM).
    """

    kind: str
    window: int | None = None
    sinks: int = 0
    positions: str = "absolute"
    full_layers: tuple[int, ...] = ()
    full_heads: tuple[tuple[int, int], ...] = ()
    adapter: str = ""

    def __post_init__(self) -> None:
        self._check_units()
        self._check_adapter()
        if self.kind not in SPEC_KINDS:
            raise ValueError(f"unknown method kind {self.kind!r}; expected one of: {_GRAMMAR}")
        if self.positions not in POSITION_MODES:
            raise ValueError(
                f"unknown position mode {self.positions!r}; use 'absolute' (the paper) or 'cache' (StreamingLLM)"
            )
        if self.kind in ("full", "linear"):
            if self.window is not None or self.sinks:
                raise ValueError(f"'{self.kind}' takes no window or sinks")
            return
        if (
            self.window is None
            or not isinstance(self.window, int)
            or isinstance(self.window, bool)
            or self.window <= 0
        ):
            example = f"{self.kind}:64" if self.kind in ("lolcats", "liger") else f"{self.kind}:64:4"
            raise ValueError(f"window W must be a positive integer, got {self.window!r} (e.g. {example})")
        if self.window > MAX_WINDOW:
            raise ValueError(
                f"window W={self.window} is larger than any context a model can have (max {MAX_WINDOW}): "
                f"use 'full' for unbounded attention, or a window such as swa:4096:4"
            )
        if not isinstance(self.sinks, int) or isinstance(self.sinks, bool) or self.sinks < 0:
            raise ValueError(
                f"sinks S must be an integer >= 0, got {self.sinks!r} (e.g. swa:64:4, or swa:64:0)"
            )
        if self.kind in ("lolcats", "liger"):
            if self.sinks:
                raise ValueError(f"{self.kind}:W takes no sinks")
            return
        if self.sinks >= self.window:
            raise ValueError(
                f"sinks S={self.sinks} must be smaller than the window W={self.window}: the window counts "
                f"the sinks and needs room for the query itself (try swa:{max(self.window, self.sinks + 1)}:{self.sinks} "
                f"or fewer sinks)"
            )

    def _check_units(self) -> None:
        """Hybrid units: sorted, unique, non-negative; heads of a full layer are refused as redundant."""
        if not (self.full_layers or self.full_heads):
            return
        if self.kind != "swa" or self.positions != "absolute":
            raise ValueError(
                f"only swa:W:S (absolute positions) takes '+full:' units, not {self.kind}"
                f"{':' + self.positions if self.positions != 'absolute' else ''}: e.g. swa:256:4+full:3,11"
            )
        layers, heads = tuple(self.full_layers), tuple(tuple(h) for h in self.full_heads)
        for x in layers + tuple(v for h in heads for v in h):
            if not isinstance(x, int) or isinstance(x, bool) or x < 0:
                raise ValueError(f"full-attention units are layer indices >= 0 (or LAYER.KV_HEAD), got {x!r}")
        if len(set(layers)) != len(layers) or len(set(heads)) != len(heads):
            raise ValueError(f"a full-attention unit is named twice in {self._units_text(layers, heads)}")
        both = sorted({layer for layer, _ in heads} & set(layers))
        if both:
            raise ValueError(
                f"layer {both[0]} is full already: name either the layer ({both[0]}) or some of its heads ({both[0]}.H), not both"
            )
        object.__setattr__(self, "full_layers", tuple(sorted(layers)))
        object.__setattr__(self, "full_heads", tuple(sorted(heads)))

    def _check_adapter(self) -> None:
        """``@NAME``: lower-case letters, digits and '-'; on a trained kind or a plain SWA(w, s)."""
        if not self.adapter:
            return
        if not _ADAPTER_RE.fullmatch(self.adapter):
            raise ValueError(
                f"adapter name {self.adapter!r}: use up to 32 lower-case letters, digits and '-' (e.g. lora, len4k)"
            )
        plain_swa = self.kind == "swa" and self.positions == "absolute" and not self.is_hybrid
        if not (plain_swa or self.kind in ("linear", "lolcats", "liger")):
            raise ValueError(
                f"@{self.adapter} names a trained adapter: it goes on swa:W:S (absolute positions, no +full units), "
                f"lolcats:W, liger:W or linear, not {self.without_adapter}"
            )

    @property
    def without_adapter(self) -> MethodSpec:
        """The spec with no ``@NAME``: the method a checkpoint of this variant was trained as."""
        return MethodSpec(
            self.kind, self.window, self.sinks, self.positions, self.full_layers, self.full_heads
        )

    @property
    def is_trained(self) -> bool:
        """True when running the spec needs trained tensors: the linear baselines and any ``@NAME``."""
        return self.is_linear or bool(self.adapter)

    @staticmethod
    def _units_text(layers, heads) -> str:
        units = [(layer, -1) for layer in layers] + list(heads)
        return ",".join(str(layer) if h < 0 else f"{layer}.{h}" for layer, h in sorted(units))

    @property
    def is_hybrid(self) -> bool:
        """True when some layers or KV heads keep full attention (``swa:W:S+full:...``)."""
        return bool(self.full_layers or self.full_heads)

    @property
    def base(self) -> MethodSpec:
        """The spec without its full-attention units (``swa:256:4`` for ``swa:256:4+full:3``)."""
        return MethodSpec(self.kind, self.window, self.sinks, self.positions)

    def with_full(self, layers=(), heads=()) -> MethodSpec:
        """The same SWA part with these units full (replacing any it had)."""
        return MethodSpec(
            self.kind, self.window, self.sinks, self.positions, tuple(layers), tuple(tuple(h) for h in heads)
        )

    def full_kv_heads(self, layer_idx: int, kv_heads: int) -> tuple[int, ...]:
        """KV heads of layer ``layer_idx`` that keep full attention: all, some, or none (``()``)."""
        if self.kind == "full":
            return tuple(range(kv_heads))
        if layer_idx in self.full_layers:
            return tuple(range(kv_heads))
        return tuple(h for layer, h in self.full_heads if layer == layer_idx)

    def check_units(self, n_layers: int, kv_heads: int) -> None:
        """Refuse units a model of ``n_layers`` layers and ``kv_heads`` KV heads does not have."""
        for layer in self.full_layers + tuple(layer for layer, _ in self.full_heads):
            if layer >= n_layers:
                raise ValueError(
                    f"{self} names layer {layer}, but the model has {n_layers} layers (0..{n_layers - 1})"
                )
        for layer, h in self.full_heads:
            if h >= kv_heads:
                raise ValueError(
                    f"{self} names KV head {layer}.{h}, but the model has {kv_heads} KV heads a layer (0..{kv_heads - 1})"
                )

    @property
    def is_full(self) -> bool:
        return self.kind == "full"

    @property
    def is_windowed(self) -> bool:
        """True for the softmax sink+window methods (``swa``, ``evict``) that the runtime patches."""
        return self.kind in ("swa", "evict")

    @property
    def is_linear(self) -> bool:
        """True for the trained linear-attention baselines (``linear``, ``lolcats``, ``liger``)."""
        return self.kind in ("linear", "lolcats", "liger")

    @property
    def dense_prompt(self) -> bool:
        """True when the prompt runs as one dense forward and the window applies to decoding only (``evict``)."""
        return self.kind == "evict"

    @property
    def recent(self) -> int:
        """W - S: how many of the most recent keys (the query included) a query sees."""
        if self.window is None:
            raise ValueError(f"'{self}' has no window")
        return self.window - self.sinks

    @property
    def kv_budget(self) -> int | None:
        """The most key/value entries a decoding step reads per layer (``None``: unbounded)."""
        return self.window if self.is_windowed else None

    def __str__(self) -> str:
        tail = f"{ADAPTER_SEP}{self.adapter}" if self.adapter else ""
        if self.kind in ("full", "linear"):
            return self.kind + tail
        if self.kind in ("lolcats", "liger"):
            return f"{self.kind}:{self.window}{tail}"
        if tail:
            return f"{self.kind}:{self.window}:{self.sinks}{tail}"
        text = f"{self.kind}:{self.window}:{self.sinks}"
        if self.positions != "absolute":
            text += f":{self.positions}"
        if self.is_hybrid:
            text += FULL_SUFFIX + self._units_text(self.full_layers, self.full_heads)
        return text


def parse_spec(text: str | MethodSpec) -> MethodSpec:
    """Parse a method string (``"full"``, ``"swa:64:4"``, ``"evict:256:4:cache"``, ``"lolcats:64"``, ``"liger:64"``).

    Raises:
        ValueError: naming the grammar, for malformed strings or invalid values.
    """
    if isinstance(text, MethodSpec):
        return text
    if not isinstance(text, str) or not text.strip():
        raise ValueError(
            f"method spec must be a non-empty string like 'swa:64:4'; got {text!r}. Grammar: {_GRAMMAR}"
        )
    rest, at, adapter = text.strip().lower().partition(ADAPTER_SEP)
    if at:
        if not adapter.strip():
            raise ValueError(f"malformed method {text!r}: name the adapter after '@' (e.g. swa:256:4@lora)")
        spec = parse_spec(rest)
        return MethodSpec(
            spec.kind,
            spec.window,
            spec.sinks,
            spec.positions,
            spec.full_layers,
            spec.full_heads,
            adapter.strip(),
        )
    body, sep, units = rest.partition("+")
    if sep:
        return _parse_hybrid(text, body, units)
    parts = [p.strip() for p in body.split(":")]
    kind, args = parts[0], parts[1:]
    if kind not in SPEC_KINDS:
        raise ValueError(f"unknown method {text!r}; expected {_GRAMMAR}")
    if kind in ("full", "linear"):
        if args:
            raise ValueError(f"'{kind}' takes no arguments; got {text!r}")
        return MethodSpec(kind)

    positions = "absolute"
    if args and args[-1] in POSITION_MODES:
        if kind in ("lolcats", "liger"):
            raise ValueError(f"{kind}:W takes no position mode; got {text!r}")
        positions = args.pop()
    ints: list[int] = []
    for a in args:
        # Plain ASCII digits only: int() would also take "1_0" and "８" (typos read as windows).
        if not _INTEGER.fullmatch(a.strip()):
            raise ValueError(f"malformed method {text!r}: {a!r} is not an integer. Grammar: {_GRAMMAR}")
        ints.append(int(a))
    if kind in ("lolcats", "liger"):
        if len(ints) != 1:
            raise ValueError(f"malformed method {text!r}: expected {kind}:W (e.g. {kind}:64)")
        return MethodSpec(kind, window=ints[0])
    if len(ints) not in (1, 2):
        raise ValueError(
            f"malformed method {text!r}: expected {kind}:W[:S][:absolute|cache] (e.g. {kind}:64:4)"
        )
    window = ints[0]
    sinks = ints[1] if len(ints) == 2 else DEFAULT_SINKS
    return MethodSpec(kind, window=window, sinks=sinks, positions=positions)


def _parse_hybrid(text: str, body: str, units: str) -> MethodSpec:
    """``swa:W:S+full:3,11.2`` -> the SWA spec with layer 3 and KV head 2 of layer 11 full."""
    try:
        base = parse_spec(body)
    except ValueError as err:
        # Name what the user typed, not the part before '+' ('swa:+64' is not about 'swa:').
        raise ValueError(
            f"malformed method {text!r}: before '+' must come swa:W[:S] ({err}); a hybrid reads "
            f"swa:256:4+full:3,11"
        ) from None
    head, _, items = units.partition(":")
    if head.strip() != "full" or not items.strip():
        raise ValueError(
            f"malformed method {text!r}: after '+' comes full:UNITS, e.g. swa:256:4+full:3,11 (layers) "
            f"or swa:256:4+full:11.2 (KV head 2 of layer 11)"
        )
    layers: list[int] = []
    heads: list[tuple[int, int]] = []
    for item in (i.strip() for i in items.split(",")):
        layer, dot, h = item.partition(".")
        try:
            if not _DIGITS.fullmatch(layer.strip()) or (dot and not _DIGITS.fullmatch(h.strip())):
                raise ValueError(item)
            if dot:
                heads.append((int(layer), int(h)))
            else:
                layers.append(int(layer))
        except ValueError:
            raise ValueError(
                f"malformed method {text!r}: {item!r} is not a layer (11) or a layer's KV head (11.2)"
            ) from None
    if base.kind != "swa":
        raise ValueError(f"only swa:W:S takes '+full:' units, not {base.kind} ({text!r})")
    return base.with_full(layers, heads)


def split_specs(text: str) -> list[str]:
    """Split a comma list of specs: ``"full,swa:256:4+full:3,11"`` -> ``["full", "swa:256:4+full:3,11"]``.

    A comma followed by a digit continues a hybrid's unit list; any other comma starts a new spec
    (every spec starts with a letter). Items are stripped; empty ones are kept for the caller to refuse.
    """
    return [part.strip() for part in re.split(r",(?!\s*\d)", str(text))]

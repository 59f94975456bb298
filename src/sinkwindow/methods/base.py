"""``Method``: what one attention method is, in one place.

A method object wraps a parsed ``MethodSpec`` and answers everything the layers above the runtime
ask of a method: how a model is put into it (``patch``), the cache it decodes with
(``make_cache``), how a prompt goes in (``prefill``; ``dense_prompt`` for evict) and tokens come out
(``decode``), the bytes its state holds (``state_bytes``), how reports name it (``family``,
``label``) and which trained adapters it takes (``adapter``). Each kind subclasses it in its own
file and is registered by name in ``sinkwindow.methods.METHODS``.

The runtime sits below this layer (``tests/test_layering.py``), so it cannot ask these objects:
its own mechanisms read the spec's predicates (``MethodSpec.is_windowed``, ``dense_prompt``, ...),
and ``tests/test_methods.py`` checks that every class agrees with them.
"""

from __future__ import annotations

import os
from typing import ClassVar

from ..runtime.spec import MethodSpec

__all__ = ["Method", "INTERFACE"]

# Every member a method class answers (tests/test_methods.py asks each registered class for all).
INTERFACE = (
    "kind",
    "family",
    "label",
    "adapter",
    "trained",
    "windowed",
    "dense_prompt",
    "patch",
    "make_cache",
    "prefill",
    "decode",
    "state_bytes",
    "exact_view",
    "anchors_comparisons",
    "paper_retrofit",
    "rank_against",
    "trainable",
    "train_stages",
    "feature_maps",
    "takes_full_units",
)


class Method:
    """One attention method; subclasses set the class attributes and override what differs.

    Attributes:
        kind: the spec kind this class runs (``MethodSpec.kind``).
        family: the method's name in tables, without parameters (``SWA``, ``LoLCATs(+SWA)``).
        adapter: the trained tensors it takes: ``"lora"`` (an optional ``@NAME`` LoRA adapter),
            ``"retrofit"`` (a linear-attention retrofit it cannot run without) or ``None``.
        windowed: a softmax sink+window method the runtime patches (bounded KV cache).
        dense_prompt: the prompt runs as one dense forward, the window applies to decoding only.
    """

    kind: ClassVar[str] = ""
    family: ClassVar[str] = ""
    adapter: ClassVar[str | None] = None
    windowed: ClassVar[bool] = False
    dense_prompt: ClassVar[bool] = False
    # Training (``sinkwindow train``): the stages its recipe runs, ``()`` for a method never trained,
    # and whether its retrofit has learned feature maps (whose options training passes on).
    train_stages: ClassVar[tuple[str, ...]] = ()
    feature_maps: ClassVar[bool] = False

    def __init__(self, spec: MethodSpec) -> None:
        if spec.kind != self.kind:
            raise ValueError(f"{type(self).__name__} runs {self.kind!r} specs, not {spec}")
        self.spec = spec

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.spec)!r})"

    @property
    def trained(self) -> bool:
        """True when running it needs trained tensors (a retrofit, or a named ``@NAME`` adapter)."""
        return self.adapter == "retrofit" or bool(self.spec.adapter)

    @property
    def takes_full_units(self) -> bool:
        """True when a hybrid (``+full:UNITS``) can be built on it: what tuning searches over."""
        return False

    @property
    def trainable(self) -> bool:
        """True when ``sinkwindow train`` can train this spec (its recipe has stages)."""
        return bool(self.train_stages)

    @property
    def label(self) -> str:
        """The method with its parameters, as reports name it (``SWA(256, 4)``)."""
        tail = f"@{self.spec.adapter}" if self.spec.adapter else ""
        return f"{self.family}{tail}"

    @property
    def exact_view(self) -> tuple[int, int] | None:
        """``(w, s)``: the keys its first decoded token sees exactly (s sinks plus w - s recent), or
        ``None`` for a method that sees every key or none exactly."""
        return None

    @property
    def anchors_comparisons(self) -> bool:
        """True for SWA(w, s) with sinks, the method reports compare everything else against."""
        return False

    @property
    def paper_retrofit(self) -> bool:
        """True for the paper's trained baselines beside SWA (LoLCATs(+SWA), Liger-GLA(+SWA))."""
        return False

    def rank_against(self, anchor: MethodSpec) -> float | None:
        """Where this method stands among those a report sets beside the SWA ``anchor`` (lower
        first), or ``None`` when it is no comparison for it."""
        return None

    def patch(
        self,
        model,
        *,
        checkpoint: str | os.PathLike | None = None,
        native_sliding: str = "override",
        allow_untrained: bool = False,
    ):
        """Put ``model`` into this method in place (whatever it ran before) and return it."""
        from ..runtime.method import use_method  # noqa: PLC0415 - torch only when used

        return use_method(
            model,
            self.spec,
            checkpoint=checkpoint,
            native_sliding=native_sliding,
            allow_untrained=allow_untrained,
        )

    def make_cache(self, model, **kwargs):
        """The cache a model ``patch`` put into this method decodes with (``runtime.make_cache``)."""
        from ..runtime.make_cache import make_cache  # noqa: PLC0415

        return make_cache(model, **kwargs)

    def prefill(self, model, input_ids, **kwargs):
        """Run a ``[batch, n]`` prompt into the cache (``runtime.prefill``; evict's prompt runs dense)."""
        from ..runtime.prefill import prefill  # noqa: PLC0415

        return prefill(model, input_ids, **kwargs)

    def decode(self, model, input_ids, max_new_tokens: int, **kwargs):
        """Prefill ``[batch, n]`` and decode ``max_new_tokens`` tokens (``runtime.generate``)."""
        from ..runtime.generate import generate  # noqa: PLC0415

        return generate(model, input_ids, max_new_tokens, **kwargs)

    def state_bytes(
        self,
        config,
        context: int,
        *,
        dtype=None,
        batch: int = 1,
        native_sliding: str = "override",
        feature_dim: int | None = None,
    ) -> int:
        """Bytes the method holds after ``context`` tokens, from the config alone (summed over layers);
        ``dtype`` is the model's (default float32), ``batch`` the rows.

        A KV-cache method's is ``runtime.kv_bytes.analytic_state_bytes``; ``feature_dim`` is the
        linear retrofits' (refused here: a KV cache has no feature map).
        """
        import torch  # noqa: PLC0415

        from ..runtime.kv_bytes import analytic_state_bytes  # noqa: PLC0415

        if feature_dim is not None:
            raise ValueError(f"{self.spec} keeps a KV cache, no linear features: drop feature_dim")

        return analytic_state_bytes(
            self.spec,
            config,
            context,
            dtype=dtype or torch.float32,
            batch=batch,
            native_sliding=native_sliding,
        )

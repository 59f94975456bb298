"""``use_method``: the one way to put a loaded model into a method, whatever it ran before.

A model moves between methods in place (evaluation runs full, SWA and the trained baselines on
one loaded copy): a linear retrofit is reverted first, then full attention is restored, then the
new method is patched in (``apply``) or its trained adapter is converted in (``load_linear``).
Every caller that switches methods (``load``, the evaluation runner, the lm-eval model) goes
through here, so no two of them can disagree about what "switching" means.
"""

from __future__ import annotations

import logging
import os

from transformers import PreTrainedModel

from .attributes import MODEL_NAME_ATTR, RETROFIT_ATTR
from .patching import apply
from .spec import MethodSpec, parse_spec

__all__ = ["MODEL_NAME_ATTR", "model_name", "use_method"]

logger = logging.getLogger(__name__)


def model_name(model: PreTrainedModel) -> str | None:
    """The name ``sinkwindow.load`` loaded ``model`` by (``smollm2-135m``), or ``None``."""
    return getattr(model, MODEL_NAME_ATTR, None)


def use_method(
    model: PreTrainedModel,
    spec: str | MethodSpec,
    *,
    checkpoint: str | os.PathLike | None = None,
    native_sliding: str = "override",
    allow_untrained: bool = False,
) -> PreTrainedModel:
    """Put ``model`` into ``spec`` in place and return it.

    Args:
        model: a causal LM, possibly patched or converted by an earlier call.
        spec: any method spec (``full``, ``swa:W:S``, ``evict:W:S``, ``lolcats:W``, ``linear``).
        checkpoint: trained adapter for a linear baseline; ``None`` uses the adapter shipped for
            the packaged model ``model`` was loaded as, if there is one.
        native_sliding: as in ``apply``.
        allow_untrained: for a linear baseline with no checkpoint and none shipped, convert it at
            its initialisation instead of refusing: right for timing and memory (the efficiency
            benchmark), meaningless for accuracy.

    Returns:
        The model (the same object) running ``spec``.

    Raises:
        ValueError: a linear baseline with no checkpoint and none shipped, a checkpoint for a method
            that runs no trained tensors, or a bad spec.
    """
    spec = parse_spec(spec)
    if checkpoint is not None and not spec.is_trained:
        # It would be ignored: the method runs no trained tensors, so the result would be the untrained one's.
        raise ValueError(
            f"{spec} takes no trained adapter, so checkpoint={str(checkpoint)!r} would be ignored: give the method "
            f"it was trained as (SWA + LoRA is {spec.base}@NAME, e.g. swa:256:4@lora; or lolcats:W, liger:W, linear)"
        )
    if getattr(model, RETROFIT_ATTR, None) is not None:
        from ..linear import revert  # noqa: PLC0415 - the linear stack (peft) is optional

        revert(model)
    apply(model, "full")
    if spec.is_trained:
        from ..linear import convert, load_linear, shipped_adapter  # noqa: PLC0415

        if checkpoint is None and allow_untrained and shipped_adapter(model_name(model), spec) is None:
            logger.warning(
                "%s: no trained adapter for this model; converting it untrained (timing only)", spec
            )
            return convert(model, spec)
        return load_linear(model, spec, checkpoint, model_name=model_name(model))
    if not spec.is_full:
        apply(model, spec, native_sliding=native_sliding)
    return model

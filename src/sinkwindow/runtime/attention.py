"""The attention implementations sinkwindow registers with transformers, and which one a model gets.

Three names, ``sinkwindow_sdpa``, ``sinkwindow_eager`` and ``sinkwindow_flex`` (FlexAttention with a
block-sparse mask where it pays, see ``flex``), each registered as an attention function
(``AttentionInterface``: the stock SDPA function, the model's own eager function, or flex) **and** a
mask builder of the same name (``AttentionMaskInterface``). Registering only the attention would
make ``create_causal_mask`` find no builder and silently pass no mask at all (docs/design.md §2).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

from . import flex, full_units
from .masks import sinkwindow_eager_mask, sinkwindow_sdpa_mask

__all__ = [
    "SDPA_NAME",
    "EAGER_NAME",
    "FLEX_NAME",
    "FLEX_ALIASES",
    "REQUESTABLE",
    "attention_name",
    "eager_attention_for",
    "register_attention",
    "sinkwindow_eager_attention",
    "sinkwindow_flex_attention",
    "sinkwindow_sdpa_attention",
]

logger = logging.getLogger(__name__)

SDPA_NAME = "sinkwindow_sdpa"
EAGER_NAME = "sinkwindow_eager"
FLEX_NAME = flex.FLEX_NAME
# What ``attn_implementation`` accepts for the flex path (transformers' own name included).
FLEX_ALIASES = ("flex", "flex_attention", FLEX_NAME)


def eager_attention_for(module: torch.nn.Module) -> Callable:
    """The model's own eager attention function (it may softcap or scale differently per family)."""
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    return fn if fn is not None else _generic_eager


def _generic_eager(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Plain eager attention for families whose modeling file has no ``eager_attention_forward``."""
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, value).transpose(1, 2).contiguous()
    return out, weights


def sinkwindow_eager_attention(module, query, key, value, attention_mask, **kwargs):
    """``sinkwindow_eager``: the model's eager attention; the mask carries the window."""
    unit, eager = full_units.unit_of(module), eager_attention_for(module)
    if unit is not None:  # a layer or KV heads of a hybrid spec that keep full attention
        return full_units.attention(
            module, unit, query, key, value, attention_mask, eager, additive=True, **kwargs
        )
    return eager(module, query, key, value, attention_mask, **kwargs)


def sinkwindow_sdpa_attention(module, query, key, value, attention_mask, **kwargs):
    """``sinkwindow_sdpa``: transformers' SDPA attention; the mask carries the window."""
    unit = full_units.unit_of(module)
    if unit is not None:
        return full_units.attention(
            module, unit, query, key, value, attention_mask, sdpa_attention_forward, additive=False, **kwargs
        )
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def sinkwindow_flex_attention(module, query, key, value, attention_mask, **kwargs):
    """``sinkwindow_flex``: FlexAttention when the mask builder made a BlockMask, else the family's own path.

    The builder (``flex.sinkwindow_flex_mask``) hands short calls (decode steps) a boolean SDPA mask, or
    an additive float mask for families without SDPA; a BlockMask that flex then refuses is replaced by
    that same mask (``flex.fallback_mask``), never by none.
    """
    if flex.BlockMask is not None and isinstance(attention_mask, flex.BlockMask):
        # A hybrid's full units mask per head over their own keys: the SDPA/eager path below.
        out = (
            None
            if full_units.unit_of(module)
            else flex.flex_attention_forward(module, query, key, value, attention_mask, **kwargs)
        )
        if out is not None:
            return out
        attention_mask = flex.fallback_mask(attention_mask)
    if isinstance(attention_mask, torch.Tensor) and attention_mask.dtype != torch.bool:
        return sinkwindow_eager_attention(module, query, key, value, attention_mask, **kwargs)
    return sinkwindow_sdpa_attention(module, query, key, value, attention_mask, **kwargs)


def register_attention() -> None:
    # Idempotent: GeneralInterface.register only updates a dict.
    AttentionInterface.register(SDPA_NAME, sinkwindow_sdpa_attention)
    AttentionInterface.register(EAGER_NAME, sinkwindow_eager_attention)
    AttentionInterface.register(FLEX_NAME, sinkwindow_flex_attention)
    AttentionMaskInterface.register(SDPA_NAME, sinkwindow_sdpa_mask)
    AttentionMaskInterface.register(EAGER_NAME, sinkwindow_eager_mask)
    AttentionMaskInterface.register(FLEX_NAME, flex.sinkwindow_flex_mask)


# What ``apply(attn_implementation=...)`` takes; anything else is refused rather than run as SDPA.
REQUESTABLE = ("sdpa", "eager", SDPA_NAME, EAGER_NAME, *FLEX_ALIASES)


def attention_name(cls: type, requested: str | None, current: str) -> str:
    """``sinkwindow_sdpa``, ``sinkwindow_eager`` or ``sinkwindow_flex`` for a model of class ``cls`` now running ``current``."""
    if requested in FLEX_ALIASES:
        # Only when asked for: a model loaded with "flex_attention" keeps the SDPA/eager path below.
        return FLEX_NAME
    base = requested or current
    if base not in ("sdpa", "eager", SDPA_NAME, EAGER_NAME):
        logger.info("attention %r has no sink-window mask path; using SDPA", base)
        base = "sdpa"
    if base in ("sdpa", SDPA_NAME) and not getattr(cls, "_supports_sdpa", False):
        # Stock SDPA drops what such families add to their eager attention (Gemma 2's logit softcap).
        if requested in ("sdpa", SDPA_NAME):
            raise ValueError(
                f"transformers does not support SDPA for {cls.__name__} (_supports_sdpa=False): "
                f"use attn_implementation='eager'"
            )
        logger.info("%s does not support SDPA; using its eager attention", cls.__name__)
        base = "eager"
    return EAGER_NAME if base in ("eager", EAGER_NAME) else SDPA_NAME

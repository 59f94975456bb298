"""The slow twin of the runtime: dense float64 attention masked straight from the formula.

Nothing here goes through transformers' mask code or our cache. The attention function builds the
SWA(w, s) pattern itself from ``j <= i and (j < s or j > i - (w - s))`` over positions ``0..L-1``
of an uncached forward, and token-by-token decoding re-runs the whole sequence every step. Tests
compare the fast path (masks + bounded cache + chunked prefill) against this.
"""

from __future__ import annotations

import copy

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import AttentionMaskInterface

from .spec import MethodSpec, parse_spec

__all__ = ["reference_mask", "reference_attention", "reference_model", "reference_logits", "reference_greedy"]

REFERENCE_NAME = "sinkwindow_reference"
_REF_ATTR = "_sinkwindow_reference"


def reference_mask(length: int, window: int | None, sinks: int) -> torch.Tensor:
    """``(length, length)`` bool: query i sees key j iff j <= i and (j < s or j > i - (w - s))."""
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    allowed = j <= i
    if window is not None:
        allowed = allowed & ((j < sinks) | (j > i - (window - sinks)))
    return allowed


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Dense masked attention in float64 for an uncached forward over positions ``0..L-1``.

    Args:
        query: ``[batch, heads, L, head_dim]``; key, value: ``[batch, kv_heads, L, head_dim]``.

    Returns:
        ``([batch, L, heads, head_dim], weights)`` like every transformers attention function.
    """
    plan = getattr(module.config, _REF_ATTR)
    length = query.shape[-2]
    if key.shape[-2] != length:
        raise ValueError("the reference runs uncached forwards only (use_cache=False)")
    window, sinks = plan["window"], plan["sinks"]
    native = _native_window(module)
    if native is not None and plan["native_sliding"] == "keep":
        window, sinks = native, 0
    elif window is None and native is not None:
        # The unpatched model itself: native sliding layers see their own w keys (SWA(w, 0)).
        window, sinks = native, 0
    groups = getattr(module, "num_key_value_groups", 1)
    q, k, v = query.double(), repeat_kv(key, groups).double(), repeat_kv(value, groups).double()
    scaling = scaling if scaling is not None else q.shape[-1] ** -0.5
    scores = q @ k.transpose(-1, -2) * scaling
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    allowed = reference_mask(length, window, sinks).to(scores.device)
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = (weights @ v).to(query.dtype)
    return out.transpose(1, 2).contiguous(), weights


def _native_window(module) -> int | None:
    """The layer's own sliding window, if the architecture gives it one (read from the config)."""
    from .patch import native_sliding_layers

    cfg = module.config
    layer_types = getattr(cfg, _REF_ATTR)["layer_types"]
    if layer_types is not None:
        return cfg.sliding_window if layer_types[module.layer_idx] == "sliding_attention" else None
    if getattr(cfg, "sliding_window", None) is not None and native_sliding_layers(cfg)[module.layer_idx]:
        return cfg.sliding_window
    return None


def _reference_mask_builder(*args, **kwargs):
    # The reference attention masks by itself; transformers must not pass it anything.
    return None


def reference_model(model: PreTrainedModel, spec: str | MethodSpec, native_sliding: str = "override"):
    """A float64 deep copy of ``model`` (unpatched) that runs ``spec`` through ``reference_attention``."""
    from .patch import _all_configs, apply  # local: patch imports nothing from here

    spec = parse_spec(spec)
    if not (spec.is_full or spec.kind == "swa"):
        raise ValueError(f"the reference covers full and swa specs, not {spec}")
    AttentionInterface.register(REFERENCE_NAME, reference_attention)
    AttentionMaskInterface.register(REFERENCE_NAME, _reference_mask_builder)
    ref = copy.deepcopy(model)
    apply(ref, "full")
    ref = ref.double().eval()
    plan = {
        "window": spec.window,
        "sinks": spec.sinks,
        "native_sliding": native_sliding,
        "layer_types": getattr(ref.config.get_text_config(decoder=True), "layer_types", None),
    }
    for cfg in _all_configs(ref):
        setattr(cfg, _REF_ATTR, plan)
    ref.set_attn_implementation(REFERENCE_NAME)
    return ref


@torch.no_grad()
def reference_logits(
    model: PreTrainedModel, input_ids: torch.Tensor, spec: str | MethodSpec, native_sliding: str = "override"
) -> torch.Tensor:
    """``[batch, L, vocab]`` float64 logits of one uncached reference forward."""
    ref = reference_model(model, spec, native_sliding)
    return ref(input_ids, use_cache=False).logits


@torch.no_grad()
def reference_greedy(
    model: PreTrainedModel, input_ids: torch.Tensor, spec: str | MethodSpec, max_new_tokens: int
) -> torch.Tensor:
    """Greedy decoding by re-running the whole sequence each step (no cache). ``[batch, L + n]``."""
    ref = reference_model(model, spec)
    ids = input_ids
    for _ in range(max_new_tokens):
        nxt = ref(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=-1)
    return ids

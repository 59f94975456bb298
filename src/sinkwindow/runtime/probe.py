"""Whether a model family routes attention and masks through transformers' interfaces, by running it.

transformers marks most families ``_supports_attention_backend``; a family without the flag may
still route everything through ``AttentionInterface`` and ``AttentionMaskInterface`` (StableLM in
transformers 5 does). Rather than refuse it on the flag alone, :func:`probe_routing` builds a tiny
copy of the model's class from a shrunk copy of its config, selects a sentinel attention
implementation, runs one short forward, and checks what happened:

- the sentinel attention function was called once by each decoder layer's attention module;
- the sentinel mask builder was consulted (the decoder builds its mask through the interface).

Both sentinels delegate to transformers' own SDPA functions, so the forward is an ordinary one.
The probe costs a model of a few thousand parameters and one forward of 6 tokens.
"""

from __future__ import annotations

import copy
import logging

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

__all__ = ["PROBE_NAME", "probe_routing", "tiny_copy_config"]

logger = logging.getLogger(__name__)

PROBE_NAME = "sinkwindow_probe"
PROBE_TOKENS = 6
# What the sentinels record during one probe forward (None outside a probe).
_calls: dict | None = None


def _probe_attention(module, query, key, value, attention_mask, **kwargs):
    if _calls is not None:
        _calls["attention"].add(id(module))
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def _probe_mask(*args, **kwargs):
    if _calls is not None:
        _calls["mask"] += 1
    return sdpa_mask(*args, **kwargs)


def _register() -> None:
    AttentionInterface.register(PROBE_NAME, _probe_attention)
    AttentionMaskInterface.register(PROBE_NAME, _probe_mask)


# Widths a tiny copy takes where its config has the field: 2 query heads of 8 dims over 1 KV head.
_TINY_WIDTHS = {
    "hidden_size": 16,
    "n_embd": 16,
    "d_model": 16,
    "num_attention_heads": 2,
    "n_head": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "intermediate_size": 32,
    "moe_intermediate_size": 32,
    "n_inner": 32,
    "ffn_dim": 32,
}
_TINY_VOCAB = 128


def tiny_copy_config(config, layers: int = 2, shrink_widths: bool = True):
    """A copy of ``config`` (the model's own, wrappers included) with ``layers`` decoder layers, a
    128-token vocabulary and, with ``shrink_widths``, 16-wide layers; the rest is kept."""
    cfg = copy.deepcopy(config)
    text = cfg.get_text_config(decoder=True)
    for name in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(getattr(text, name, None), int):
            n = getattr(text, name)
            setattr(text, name, min(n, layers))
    n_layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    if isinstance(getattr(text, "layer_types", None), list) and n_layers:
        # Keep one layer of each type where the first layers do not show them all.
        kinds = list(dict.fromkeys(text.layer_types))
        text.layer_types = (kinds + text.layer_types)[: max(n_layers, len(kinds))]
        for name in ("num_hidden_layers", "n_layer"):
            if isinstance(getattr(text, name, None), int):
                setattr(text, name, len(text.layer_types))
    if isinstance(getattr(text, "vocab_size", None), int) and text.vocab_size > _TINY_VOCAB:
        text.vocab_size = _TINY_VOCAB
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(text, name, None)
            if isinstance(value, int) and value >= _TINY_VOCAB:
                setattr(text, name, 0)
            elif isinstance(value, list):
                setattr(text, name, [v if v < _TINY_VOCAB else 0 for v in value])
    if shrink_widths:
        for name, value in _TINY_WIDTHS.items():
            if isinstance(getattr(text, name, None), int) and getattr(text, name) > value:
                setattr(text, name, value)
        if isinstance(getattr(text, "num_key_value_heads", None), int) and isinstance(
            getattr(text, "num_attention_heads", None), int
        ):
            text.num_key_value_heads = min(text.num_key_value_heads, text.num_attention_heads)
    return cfg


def _build(cls: type[PreTrainedModel], config) -> PreTrainedModel:
    config._attn_implementation = PROBE_NAME
    with torch.device("cpu"):
        model = cls(config)
    model.config._attn_implementation = PROBE_NAME
    for sub in model.modules():
        cfg = getattr(sub, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = PROBE_NAME
    return model.eval()


def probe_routing(model: PreTrainedModel, attention_modules) -> str | None:
    """Run a tiny copy of ``model``'s class under sentinel attention and mask functions.

    Args:
        model: the model whose family is probed (its weights are not used).
        attention_modules: ``fn(tiny_model) -> list[list[nn.Module]]``, for each decoder layer of the
            tiny copy the modules that may compute its attention (``patch`` passes its finder).

    Returns:
        ``None`` when every decoder layer called the sentinel attention function and the mask was
        built through the mask interface; otherwise one line saying what bypassed them.
    """
    global _calls
    _register()
    cls = type(model)
    built, errors = None, []
    for shrink in (True, False):
        try:
            built = _build(cls, tiny_copy_config(model.config, shrink_widths=shrink))
            break
        except Exception as err:  # a family with constraints on its widths: try its own widths
            errors.append(f"{type(err).__name__}: {err}".splitlines()[0])
    if built is None:
        return f"a tiny copy of {cls.__name__} to probe could not be built ({'; '.join(errors)})"
    layers = attention_modules(built)
    if layers is None:
        return f"the probe cannot find the decoder layers of {cls.__name__}"
    vocab = built.config.get_text_config(decoder=True).vocab_size
    ids = (torch.arange(PROBE_TOKENS) % (vocab - 1) + 1).unsqueeze(0)
    _calls = {"attention": set(), "mask": 0}
    try:
        with torch.no_grad():
            built(input_ids=ids, use_cache=False)
        calls = _calls
    except Exception as err:
        first = f"{type(err).__name__}: {err}".splitlines()[0]
        return f"the probe forward of a tiny {cls.__name__} failed ({first[:200]})"
    finally:
        _calls = None
    silent = [i for i, modules in enumerate(layers) if not any(id(m) in calls["attention"] for m in modules)]
    if silent:
        return (
            f"a probe forward of a tiny {cls.__name__} shows decoder layer(s) {silent} computing attention "
            f"without calling AttentionInterface"
        )
    if calls["mask"] == 0:
        return (
            f"a probe forward of a tiny {cls.__name__} shows its decoder building masks without consulting "
            f"AttentionMaskInterface"
        )
    logger.debug("probe: %s routes attention and masks through transformers' interfaces", cls.__name__)
    return None

"""LoRA adapters on a converted model's attention projections, through peft (docs/linear.md §4).

Stage 2 of training adds them (``sinkwindow.train``); loading a trained baseline adds them again
before its tensors go in (``checkpoint.load_linear``), and ``revert`` takes them out.

Liger (``liger:W``) has only this stage, with its own settings (``LIGER_LORA``): r = 8 on q, k and v
(``o_proj`` stays frozen), alpha 8, trained at lr 1e-3.

LoRA adapters are injected with ``peft.inject_adapter_in_model``, which replaces the targeted
``nn.Linear``s by peft's LoRA layers inside the existing modules. The model stays the same
``PreTrainedModel`` (no ``PeftModel`` wrapper), so ``sinkwindow.prefill``, ``generate`` and the
attention hooks keep working, and ``revert`` can put the original linears back exactly.
Feature maps and window factors stay frozen (LoLCATs ``finetune_lora_qkvo_alpaca_clean``).
"""

from __future__ import annotations

import logging

import torch.nn as nn
from transformers import PreTrainedModel

from .convert import get_retrofit

__all__ = ["DEFAULT_LORA", "LIGER_LORA", "add_lora", "lora_parameters", "remove_lora"]

logger = logging.getLogger(__name__)

# LoLCATs: r = 8, alpha = 16, dropout 0, q/k/v/o in every layer. Phi-3 fuses q/k/v into qkv_proj.
DEFAULT_LORA = {
    "r": 8,
    "alpha": 16,
    "dropout": 0.0,
    "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj"],
}
# Liger: r = 8 with peft's default alpha (8, so scale 1), dropout 0, on q, k and v only. A fused
# qkv_proj (Phi-3) holds exactly those three.
LIGER_LORA = {
    "r": 8,
    "alpha": 8,
    "dropout": 0.0,
    "targets": ["q_proj", "k_proj", "v_proj", "qkv_proj"],
}


def add_lora(
    model: PreTrainedModel,
    r: int = 8,
    alpha: float = 16,
    dropout: float = 0.0,
    targets: list[str] | tuple[str, ...] = tuple(DEFAULT_LORA["targets"]),
) -> list[nn.Parameter]:
    """Inject LoRA adapters into the attention projections of a converted model.

    Afterwards only the LoRA weights require grad: base weights, feature maps and window factors
    are frozen.

    Args:
        model: a converted model (``convert``) without adapters.
        r, alpha, dropout: LoRA rank, scale numerator (scale = alpha / r) and dropout.
        targets: attention projection names; those a family lacks are skipped.

    Returns:
        The LoRA parameters (what the optimiser trains).
    """
    from peft import LoraConfig, inject_adapter_in_model

    rf = get_retrofit(model)
    if rf.lora is not None:
        raise ValueError("LoRA adapters are already injected")
    present = sorted(
        {n.rsplit(".", 1)[-1] for n, _ in model.named_modules() if ".self_attn." in n} & set(targets)
    )
    if not present:
        raise ValueError(f"no attention projection named {list(targets)} in {type(model).__name__}")
    pattern = r".*\.self_attn\.(" + "|".join(present) + r")$"
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=pattern, bias="none")
    inject_adapter_in_model(config, model)
    rf.lora = {"r": r, "alpha": alpha, "dropout": dropout, "targets": present}
    for p in model.parameters():
        p.requires_grad_(False)
    params = lora_parameters(model)
    for p in params:
        p.requires_grad_(True)
    logger.info("LoRA r=%d on %s: %d trainable parameters", r, present, sum(p.numel() for p in params))
    return params


def lora_parameters(model: PreTrainedModel) -> list[nn.Parameter]:
    return [p for n, p in model.named_parameters() if ".lora_" in n]


def remove_lora(model: PreTrainedModel) -> None:
    """Replace every peft LoRA layer by the linear it wraps (exactly the original weights)."""
    from peft.tuners.lora import LoraLayer

    targets = [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, module.get_base_layer())
    model.__dict__.pop("peft_config", None)
    rf = get_retrofit(model)
    rf.lora = None

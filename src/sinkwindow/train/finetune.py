"""Stage 2, low-rank adjusting (docs/linear.md §4): the next-token loss the LoRA adapters train on.

The adapters themselves (``add_lora``, the LoLCATs and Liger settings) live in ``linear.lora``,
because loading a trained baseline needs them too.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

__all__ = ["lm_step"]


def lm_step(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    scale: float = 1.0,
    backward: bool = True,
) -> dict:
    """One next-token micro-batch: loss on ``labels`` (−100 ignored), backward scaled by ``scale``.

    Args:
        input_ids, labels: (b, L).

    Returns:
        ``{"loss": float}``, the unscaled mean loss.
    """
    out = model(input_ids=input_ids, labels=labels, use_cache=False)
    if backward:
        (out.loss * scale).backward()
    return {"loss": float(out.loss.detach())}

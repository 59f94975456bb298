"""The ``retrieval`` criterion: under full attention, how much of its attention each head puts on the
needle's value while the model writes the answer, captured in one pass (``tuning/capture.py``).

Retrieval heads (Wu et al., "Retrieval Head Mechanistically Explains Long-Context Factuality",
arXiv 2404.15574) are the few heads that copy the needle into the answer; RazorAttention (arXiv
2407.15891) keeps such heads' KV whole and windows the rest, training-free. The paper's score counts
answer tokens whose top-attended key is the same token in the needle; this one is its soft form, the
attention weight on the needle value's tokens, so it is defined on four calibration prompts and
does not depend on the needle tokenising alike inside the haystack and in the answer.

A KV head scores the *largest* score of the query heads that share it (a KV head kept full serves all
of them, so one query head that retrieves is reason enough), a layer the largest of its KV heads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..runtime.kv_bytes import kv_geometry
from .capture import WeightsCapture, capture_pass
from .prompts import CalibrationPrompt

__all__ = ["retrieval_scores"]


class _NeedleCapture(WeightsCapture):
    """Per (layer, query head): the answer queries' weight on the needle's value, summed over prompts
    (each prompt's answer queries averaged)."""

    def __init__(self, layers: int, heads: int):
        super().__init__(layers)
        self.sums = torch.zeros(layers, heads, dtype=torch.float64)

    def first_query(self, prompt: CalibrationPrompt, length: int) -> int:
        # The queries that write the answer: the prompt's last token (it predicts the answer's first
        # token) through the answer's second-to-last.
        return length - prompt.answer_ids.shape[1]

    def add(self, layer: int, weights: torch.Tensor, pos: torch.Tensor, key_pos: torch.Tensor) -> None:
        (start, end), answer = self.prompt.needle, self.prompt.answer_ids.shape[1]
        offset, n = int(key_pos[0]), weights.shape[-1]
        lo, hi = max(0, start - offset), min(n, end - offset)
        if hi <= lo:  # a native sliding layer whose window no longer holds the needle: it cannot look
            return
        self.sums[layer] += weights[..., lo:hi].double().sum(-1).sum(-1).cpu() / answer


def retrieval_scores(
    model, prompts: Sequence[CalibrationPrompt], *, chunk_size: int = 512, bar=None
) -> torch.Tensor:
    """Needle-copying attention per KV head, under full attention, on prompts with known needles.

    Each prompt runs once (with its answer but the last token) through ``capture_pass``; for every
    query head, the weight the answer's queries put on the needle value's tokens
    (``CalibrationPrompt.needle``), averaged over the answer's tokens and then over prompts. Prompts
    that do not know their needle (``needle=None``) are left out.

    Returns:
        ``[layers, kv_heads]`` float64 in [0, 1]: per KV head, the largest of its query heads' scores.

    Raises:
        ValueError: no prompt knows where its needle is.
    """
    prompts = [p for p in prompts if p.needle is not None]
    if not prompts:
        raise ValueError(
            "the retrieval criterion needs prompts that know their needle's tokens (calibration_prompts)"
        )
    layers, heads, kv_heads, _ = kv_geometry(model.config)
    capture = _NeedleCapture(layers, heads)
    capture_pass(model, prompts, capture, chunk_size=chunk_size, bar=bar)
    per_head = capture.sums / len(prompts)
    return per_head.view(layers, kv_heads, heads // kv_heads).amax(-1)

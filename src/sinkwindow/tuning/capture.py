"""One full-attention pass over calibration prompts that shows each layer's softmax weights to a
capture: an attention function of our own (registered with transformers' ``AttentionInterface``)
computes the weights of the queries that count and then calls the model's own attention, so the
forward, its logits and its cache are unchanged. The ``mass`` and ``retrieval`` criteria are captures.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..runtime.method import use_method
from ..runtime.prefill import prefill
from .prompts import CalibrationPrompt

__all__ = ["CAPTURE_ATTENTION", "WeightsCapture", "capture_pass"]


CAPTURE_ATTENTION = "sinkwindow_capture"


class WeightsCapture:
    """What a pass hands its softmax weights to; a criterion subclasses it.

    Subclasses say which queries count (``first_query``) and what to keep of their weights (``add``).
    The pass tracks positions: on a plain layer the key holds the whole prefix; on a native sliding
    layer (Gemma 3's local layers, through transformers' sliding cache) only its last ``n`` positions,
    so key index j sits at absolute position ``end - n + j``, ``end`` being the tokens this layer has
    seen, and a query attends only to keys less than the layer's ``sliding_window`` behind it.
    """

    def __init__(self, layers: int):
        self.prompt: CalibrationPrompt | None = None  # the prompt running now
        self.first = 0  # absolute position of the first query that counts, this prompt
        self.seen = torch.zeros(layers, dtype=torch.long)  # tokens each layer has attended, this prompt

    def first_query(self, prompt: CalibrationPrompt, length: int) -> int:
        """Absolute position of the first query whose weights ``add`` needs (``length``: tokens run)."""
        raise NotImplementedError

    def add(self, layer: int, weights: torch.Tensor, pos: torch.Tensor, key_pos: torch.Tensor) -> None:
        """Keep what the criterion needs of one attention call.

        Args:
            weights: ``[H, m, n]`` float32 softmax weights of the ``m`` counted queries over the ``n``
                keys the layer holds, per query head.
            pos: ``[m]`` absolute positions of those queries.
            key_pos: ``[n]`` absolute positions of the keys.
        """
        raise NotImplementedError

    def start_prompt(self, prompt: CalibrationPrompt, length: int) -> None:
        """A new prompt of ``length`` tokens run: no token seen yet."""
        self.prompt = prompt
        self.first = self.first_query(prompt, length)
        self.seen.zero_()

    def record(self, module, query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> None:
        """Softmax weights of the counted queries of one attention call, handed to ``add``.

        ``query`` ``[1, H, q, D]`` and ``key`` ``[1, Hkv, n, D]`` (RoPE applied).
        """
        if query.shape[0] != 1:
            raise ValueError("attention weights are captured one prompt at a time")
        layer = module.layer_idx
        heads, q_len = query.shape[1], query.shape[2]
        kv_heads, n = key.shape[1], key.shape[2]
        end = int(self.seen[layer]) + q_len
        self.seen[layer] = end
        offset = end - n  # absolute position of key index 0
        pos = torch.arange(end - q_len, end, device=query.device)  # absolute query positions
        sel = pos >= self.first
        if not bool(sel.any()):
            return
        pos = pos[sel]
        q = query[0][:, sel].float()  # [H, m, D]
        k = key[0].float().repeat_interleave(heads // kv_heads, dim=0)  # [H, n, D]: q head h -> kv h // G
        scores = q @ k.transpose(-1, -2) * (kwargs.get("scaling") or q.shape[-1] ** -0.5)
        softcap = kwargs.get("softcap")
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        key_pos = torch.arange(n, device=q.device) + offset
        visible = key_pos[None] <= pos[:, None]  # [m, n]
        native = kwargs.get("sliding_window")
        if native:
            visible &= key_pos[None] > pos[:, None] - native
        weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
        self.add(layer, weights, pos, key_pos)


# The capture the attention function writes to while a pass runs (one at a time).
_ACTIVE: WeightsCapture | None = None
_INNER = None


def _capture_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention registered as ``sinkwindow_capture``: the model's own, weights recorded on the side."""
    if _ACTIVE is None:
        raise RuntimeError("sinkwindow_capture attention runs only inside capture_pass")
    with torch.no_grad():
        _ACTIVE.record(module, query, key, kwargs)
    return _INNER(module, query, key, value, attention_mask, **kwargs)


@torch.no_grad()
def capture_pass(
    model, prompts: Sequence[CalibrationPrompt], capture: WeightsCapture, *, chunk_size: int = 512, bar=None
) -> None:
    """Run each prompt with its answer but the last token (so the answer's queries count) in full
    attention, in chunks through the cache, with ``capture`` shown every layer's weights.

    Leaves the model in full attention, on its original attention implementation.
    """
    global _ACTIVE, _INNER
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    from ..runtime.attention import eager_attention_for

    if _ACTIVE is not None:
        raise RuntimeError("one capture pass at a time")
    use_method(model, "full")
    previous = model.config._attn_implementation
    eager = previous == "eager"
    inner = (lambda m, *a, **k: eager_attention_for(m)(m, *a, **k)) if eager else sdpa_attention_forward
    AttentionInterface.register(CAPTURE_ATTENTION, _capture_attention)
    AttentionMaskInterface.register(CAPTURE_ATTENTION, eager_mask if eager else sdpa_mask)
    _ACTIVE, _INNER = capture, inner
    model.set_attn_implementation(CAPTURE_ATTENTION)
    try:
        for p in prompts:
            ids = torch.cat([p.input_ids, p.answer_ids[:, :-1]], dim=1)
            capture.start_prompt(p, ids.shape[1])
            prefill(model, ids, chunk_size=chunk_size, return_logits="last")
            if bar is not None:
                bar.update(1)
    finally:
        _ACTIVE, _INNER = None, None
        model.set_attn_implementation(previous)

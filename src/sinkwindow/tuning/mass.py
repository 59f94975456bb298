"""The ``mass`` criterion: under full attention, the attention mass each unit's last queries put on
keys SWA(W, S) would drop, captured by an attention function of our own in one pass for every base."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import torch

from ..memory import kv_geometry
from ..method import use_method
from ..prefill import prefill
from .prompts import CalibrationPrompt

__all__ = ["LAST_QUERIES", "MASS_ATTENTION", "mass_scores"]


# The last queries of an S-NIAH prompt are the question, the answer prefix and the answer itself:
# the positions that must reach back to the needle. Earlier queries read the haystack, which is
# mostly local text, and would drown the retrieval signal in their number.
LAST_QUERIES = 64


MASS_ATTENTION = "sinkwindow_mass"


class _MassCapture:
    """Out-of-window attention mass per (window, layer, KV head), summed over the counted queries."""

    def __init__(self, layers: int, kv_heads: int, windows: Sequence[tuple[int, int]], inner):
        self.windows = list(windows)
        self.sums = torch.zeros(len(self.windows), layers, kv_heads, dtype=torch.float64)
        self.queries = torch.zeros(layers, dtype=torch.long)
        self.first = 0  # position of the first query that counts, set per prompt
        self.seen = torch.zeros(layers, dtype=torch.long)  # tokens each layer has attended, this prompt
        self.inner = inner

    def start_prompt(self, first: int) -> None:
        """A new prompt: queries from absolute position ``first`` on count, and no token is seen yet."""
        self.first = first
        self.seen.zero_()

    def record(self, module, query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> None:
        """Add the mass of the counted queries of one attention call.

        ``query`` ``[1, H, q, D]`` and ``key`` ``[1, Hkv, n, D]`` (RoPE applied). On a plain layer
        the key holds the whole prefix; on a native sliding layer (Gemma 3's local layers, through
        transformers' sliding cache) only its last ``n`` positions, so key index j sits at absolute
        position ``end - n + j``, ``end`` being the tokens this layer has seen, and a query attends
        only to keys less than the layer's ``sliding_window`` behind it, as the model does.
        """
        if query.shape[0] != 1:
            raise ValueError("attention mass is measured one prompt at a time")
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
        m = int(pos.numel())
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
        weights = weights.view(kv_heads, heads // kv_heads, m, n).mean(1)  # [Hkv, m, n]
        cum = weights.double().cumsum(-1)
        for w_idx, (window, sinks) in enumerate(self.windows):
            # SWA(W, S) drops absolute positions S .. pos - (W - S) (inclusive): past the sinks,
            # before the recent; as key indices lo .. hi.
            hi = pos - (window - sinks) - offset
            lo = max(0, sinks - offset)
            idx = hi.clamp(min=0)[None, :, None].expand(kv_heads, m, 1)
            mass = cum.gather(-1, idx)[..., 0]
            if lo > 0:
                mass = mass - cum[..., lo - 1]
            mass = torch.where((hi >= lo)[None], mass, torch.zeros_like(mass))
            self.sums[w_idx, layer] += mass.sum(-1).cpu()
        self.queries[layer] += m


# The capture the attention function writes to while mass_scores runs (one at a time).
_ACTIVE: _MassCapture | None = None


def _mass_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention registered as ``sinkwindow_mass``: the model's own attention, mass recorded on the side."""
    capture = _ACTIVE
    if capture is None:
        raise RuntimeError("sinkwindow_mass attention runs only inside mass_scores")
    with torch.no_grad():
        capture.record(module, query, key, kwargs)
    return capture.inner(module, query, key, value, attention_mask, **kwargs)


def _eager_for(module):
    # The family's own eager attention (softcapping, scaling); transformers' plain one otherwise.
    fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if fn is None:
        from transformers.models.llama.modeling_llama import eager_attention_forward as fn
    return fn


@torch.no_grad()
def mass_scores(
    model,
    prompts: Sequence[CalibrationPrompt],
    windows: Sequence[tuple[int, int]],
    *,
    last_queries: int = LAST_QUERIES,
    chunk_size: int = 512,
    bar=None,
) -> dict[tuple[int, int], torch.Tensor]:
    """Out-of-window attention mass under full attention, for every ``(W, S)`` in ``windows`` at once.

    The prompts (with their answers but the last token, so the answer's queries count) run once in
    full attention through an attention function of our own (``sinkwindow_mass``, registered with
    transformers' ``AttentionInterface``) that computes the softmax of the last ``last_queries``
    queries itself and otherwise calls the model's own attention, so the forward is unchanged.
    A layer with a native sliding window (Gemma 3's local layers, Mistral) is measured as the model
    runs it: its queries see only keys inside that window, so mass beyond it is already zero.
    Leaves the model in full attention, on its original attention implementation.

    Returns:
        ``{(W, S): [layers, kv_heads]}`` float64 mass in [0, 1], averaged over counted queries and
        prompts (and over the query heads of each KV head).
    """
    global _ACTIVE
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask

    use_method(model, "full")
    layers, _, kv_heads, _ = kv_geometry(model.config)
    previous = model.config._attn_implementation
    eager = previous == "eager"
    inner = (lambda m, *a, **k: _eager_for(m)(m, *a, **k)) if eager else sdpa_attention_forward
    AttentionInterface.register(MASS_ATTENTION, _mass_attention)
    AttentionMaskInterface.register(MASS_ATTENTION, eager_mask if eager else sdpa_mask)
    capture = _MassCapture(layers, kv_heads, windows, inner)
    _ACTIVE = capture
    model.set_attn_implementation(MASS_ATTENTION)
    try:
        for p in prompts:
            ids = torch.cat([p.input_ids, p.answer_ids[:, :-1]], dim=1)
            capture.start_prompt(max(0, ids.shape[1] - last_queries))
            prefill(model, ids, chunk_size=chunk_size, return_logits="last")
            if bar is not None:
                bar.update(1)
    finally:
        _ACTIVE = None
        model.set_attn_implementation(previous)
    counts = capture.queries.clamp(min=1).double()[None, :, None]
    return {ws: capture.sums[i] / counts[0] for i, ws in enumerate(capture.windows)}

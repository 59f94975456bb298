"""OpenAI's logit adjustments (presence/frequency penalties, logit_bias) and token log-probabilities.

OpenAI's definition, over the tokens generated so far in this answer (not the prompt)::

    logits[j] -= c[j] * frequency_penalty + (c[j] > 0) * presence_penalty
    logits[j] += logit_bias[j]

where ``c[j]`` counts token ``j`` in the answer. :class:`Sampler` keeps ``c`` as one ``[vocab]``
tensor updated per token (the fast path); :func:`adjust_reference` recomputes the same thing with a
loop over the answer's tokens (the slow obvious reference the tests compare it with).

Log-probabilities (``logprobs``) are those of the distribution the adjusted logits give at
temperature 1, before temperature and top_p: the model's belief after the penalties and biases the
client asked for, whatever the sampling settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["SamplingParams", "Sampler", "adjust_reference", "top_logprobs"]


@dataclass
class SamplingParams:
    """What a request asks of token choice beyond temperature/top_p.

    Args:
        presence_penalty: subtracted once from every token already in the answer (-2..2).
        frequency_penalty: subtracted per occurrence in the answer (-2..2).
        logit_bias: token id -> value added to its logit (-100..100).
        logprobs: ``None``: no log-probabilities; ``k >= 0``: the chosen token's and the top ``k``.
    """

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None

    def adjusts(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)


def adjust_reference(logits: list[float], answer: list[int], params: SamplingParams) -> list[float]:
    """The adjusted logits of one row (a plain list), by a loop over the answer's tokens."""
    out = list(logits)
    seen: set[int] = set()
    for token in answer:
        out[token] -= params.frequency_penalty
        if token not in seen:
            out[token] -= params.presence_penalty
            seen.add(token)
    for token, bias in params.logit_bias.items():
        out[token] += bias
    return out


class Sampler:
    """The per-answer state of :class:`SamplingParams`: token counts and the bias row."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.counts: torch.Tensor | None = None  # [vocab] float32, on the logits' device
        self.bias: torch.Tensor | None = None  # [vocab] float32

    def _state(self, logits: torch.Tensor) -> None:
        vocab = logits.shape[-1]
        self.counts = torch.zeros(vocab, dtype=torch.float32, device=logits.device)
        if self.params.logit_bias:
            self.bias = torch.zeros(vocab, dtype=torch.float32, device=logits.device)
            ids = torch.tensor(list(self.params.logit_bias), device=logits.device)
            values = torch.tensor(
                list(self.params.logit_bias.values()), dtype=torch.float32, device=logits.device
            )
            self.bias[ids] = values

    def adjust(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [1, vocab]`` with the penalties and biases applied (float32)."""
        if not self.params.adjusts():
            return logits
        if self.counts is None:
            self._state(logits)
        p = self.params
        out = (
            logits.float()
            - self.counts * p.frequency_penalty
            - (self.counts > 0).float() * p.presence_penalty
        )
        return out + self.bias if self.bias is not None else out

    def observe(self, token: int) -> None:
        """Count ``token`` as generated (penalties apply to it from the next step on)."""
        if self.counts is not None:
            self.counts[token] += 1


def top_logprobs(logits: torch.Tensor, token: int, k: int) -> dict:
    """The chosen ``token``'s log-probability and the ``k`` most likely tokens' under ``logits [1, vocab]``.

    Returns:
        ``{"logprob": float, "top": [(token_id, logprob), ...]}`` (``top`` most likely first).
    """
    # Floored at OpenAI's -9999.0: JSON has no -Infinity.
    lp = torch.log_softmax(logits.float()[0], dim=-1).clamp_min(-9999.0)
    out = {"logprob": float(lp[token]), "top": []}
    if k > 0:
        values, ids = lp.topk(min(k, lp.shape[-1]))
        out["top"] = [(int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist())]
    return out

"""Perplexity on essay text: at a fixed context, and streamed far past the window.

The text is run through ``sinkwindow.prefill`` in chunks, so the bounded cache is exercised exactly
as in decoding, and per-token negative log-likelihoods are collected per chunk (the full logits of
a long text never exist at once). NLLs are also summed per position bucket, which is where the sink
collapse shows: SWA(w, 0) is fine until the first tokens leave the window, then its loss jumps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..runtime.prefill import prefill

__all__ = ["PerplexityResult", "token_nll", "perplexity", "essay_token_windows"]


@dataclass
class PerplexityResult:
    """Per-window perplexity with per-bucket sums.

    Attributes:
        n_tokens: scored tokens (context - 1).
        nll_sum: summed NLL (nats).
        bucket_size: width of a position bucket in tokens.
        bucket_nll_sum / bucket_count: per bucket, indexed by ``position // bucket_size`` of the
            *predicted* token.
    """

    n_tokens: int
    nll_sum: float
    bucket_size: int
    bucket_nll_sum: list[float] = field(default_factory=list)
    bucket_count: list[int] = field(default_factory=list)

    @property
    def nll(self) -> float:
        return self.nll_sum / max(self.n_tokens, 1)

    @property
    def ppl(self) -> float:
        return math.exp(self.nll)


@torch.no_grad()
def token_nll(
    model,
    input_ids: torch.Tensor,
    chunk_size: int = 256,
    cache=None,
    on_chunk: Callable[[int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """NLL of every next token through chunked prefill.

    Args:
        input_ids: ``[1, n]``.
        cache: fill this cache (``sinkwindow.make_cache``) instead of a fresh one, so a caller can
            look at it between chunks.
        on_chunk: called as ``on_chunk(start, logits[1, c, vocab])`` after each chunk is scored.

    Returns:
        ``[n - 1]`` float32: entry t is ``-log p(x_{t+1} | x_{<=t})``.
    """
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError("token_nll scores one sequence at a time: input_ids must be [1, n]")
    n = input_ids.shape[1]
    out = torch.empty(n - 1, dtype=torch.float32)
    targets = input_ids[0]

    def score(start: int, logits: torch.Tensor) -> None:
        c = logits.shape[1]
        end = min(start + c, n - 1)  # the last position predicts nothing
        if end > start:
            lp = F.log_softmax(logits[0, : end - start].float(), dim=-1)
            tgt = targets[start + 1 : end + 1].to(lp.device)
            out[start:end] = -lp.gather(-1, tgt[:, None])[:, 0].cpu()
        if on_chunk is not None:
            on_chunk(start, logits)

    prefill(model, input_ids, chunk_size=chunk_size, cache=cache, return_logits="none", on_chunk=score)
    return out


def perplexity(
    model, input_ids: torch.Tensor, chunk_size: int = 256, bucket_size: int = 256
) -> PerplexityResult:
    """Perplexity of one ``[1, n]`` window with per-bucket NLL sums."""
    nll = token_nll(model, input_ids, chunk_size)
    positions = torch.arange(1, nll.shape[0] + 1)  # position of the predicted token
    n_buckets = int(positions[-1]) // bucket_size + 1 if nll.numel() else 0
    bucket = positions // bucket_size
    sums = torch.zeros(n_buckets, dtype=torch.float64).index_add_(0, bucket, nll.double())
    counts = torch.zeros(n_buckets, dtype=torch.long).index_add_(0, bucket, torch.ones_like(bucket))
    return PerplexityResult(
        n_tokens=int(nll.numel()),
        nll_sum=float(nll.double().sum()),
        bucket_size=bucket_size,
        bucket_nll_sum=sums.tolist(),
        bucket_count=counts.tolist(),
    )


def essay_token_windows(tokenizer, context: int, count: int, text: str | None = None) -> list[torch.Tensor]:
    """``count`` disjoint ``[1, context]`` windows of essay tokens, each starting at a document start.

    Gemma-style tokenizers add ``<bos>`` (needed at the start of every window, docs/design.md §3.2);
    the window length counts it.
    """
    from .generators.haystack import load_essays

    windows: list[torch.Tensor] = []
    pieces = [t for _, t in load_essays()] if text is None else [text]
    ids: list[int] = []
    for piece in pieces:
        ids.extend(tokenizer(piece, add_special_tokens=False).input_ids)
        ids.extend(tokenizer("\n\n", add_special_tokens=False).input_ids)
    bos = bos_prefix(tokenizer)
    body = context - len(bos)
    for i in range(count):
        chunk = ids[i * body : (i + 1) * body]
        if len(chunk) < body:
            break
        windows.append(torch.tensor([bos + chunk]))
    if len(windows) < count:
        raise ValueError(
            f"essay text holds only {len(windows)} windows of {context} tokens; asked for {count}"
        )
    return windows


def bos_prefix(tokenizer) -> list[int]:
    probe = tokenizer("a", add_special_tokens=True).input_ids
    plain = tokenizer("a", add_special_tokens=False).input_ids
    # Whatever the tokenizer adds in front by itself (Gemma: <bos>; SmolLM2: nothing).
    return probe[: len(probe) - len(plain)] if probe[-len(plain) :] == plain else []

"""Greedy decoding for the generation tasks: a prompt through chunked prefill and the method's
cache, then one token at a time (:func:`greedy_generate`), or several prompts as one left-padded
batch (:func:`greedy_generate_batch`, token-identical per row to decoding each alone).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..runtime.make_cache import make_cache
from ..runtime.prefill import input_device, prefill

__all__ = ["greedy_generate", "greedy_generate_batch", "encode_prompt", "eos_ids", "decode_prepared"]


@torch.no_grad()
def greedy_generate(
    model, input_ids: torch.Tensor, max_new_tokens: int, eos_ids: Sequence[int], chunk_size: int
) -> list[int]:
    """Greedy continuation of ``input_ids`` ``[1, n]`` through the method's cache.

    The prompt goes through chunked prefill (O(n·w) for SWA), then tokens are decoded one by one;
    decoding stops at any of ``eos_ids``.
    """
    logits, cache = prefill(model, input_ids, chunk_size=chunk_size, cache=make_cache(model))
    eos = set(eos_ids)
    out: list[int] = []
    nxt = int(logits[0].argmax())
    device = input_ids.device
    for _ in range(max_new_tokens):
        if nxt in eos:
            break
        out.append(nxt)
        if len(out) == max_new_tokens:
            break
        step = model(torch.tensor([[nxt]], device=device), cache=cache, use_cache=True)
        nxt = int(step.logits[0, -1].argmax())
    return out


@torch.no_grad()
def greedy_generate_batch(
    model,
    prompts: Sequence[torch.Tensor],
    max_new_tokens: Sequence[int],
    eos_ids: Sequence[int],
    chunk_size: int,
    pad_id: int,
) -> list[list[int]]:
    """``greedy_generate`` for several prompts at once: one left-padded batch, per-row EOS and caps.

    The rows go through chunked prefill with a padding mask (each row keeps its own first s real
    tokens as sinks, and positions count real tokens only) and batched greedy decoding
    (``sinkwindow.generate``) up to the largest cap; each row is then cut at its first EOS and at
    its own cap. Greedy decoding is causal, so the tokens a row would have produced alone are
    exactly its first ones here; tests hold batched and one-at-a-time predictions equal.

    Args:
        prompts: ``[1, n_i]`` token ids per row.
        max_new_tokens: each row's cap.
        pad_id: filler for the padding (never attended to).

    Returns:
        The new tokens of each row, without the EOS.
    """
    from ..runtime.generate import generate

    if len(prompts) == 1:
        return [greedy_generate(model, prompts[0], max_new_tokens[0], eos_ids, chunk_size)]
    n = max(p.shape[1] for p in prompts)
    device = prompts[0].device
    ids = torch.full((len(prompts), n), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(prompts), n), dtype=torch.long, device=device)
    for b, p in enumerate(prompts):
        ids[b, n - p.shape[1] :] = p[0]
        mask[b, n - p.shape[1] :] = 1
    out = generate(
        model,
        ids,
        max(max_new_tokens),
        attention_mask=mask,
        chunk_size=chunk_size,
        eos_token_id=list(eos_ids),
        pad_token_id=pad_id,
    )
    eos = set(eos_ids)
    rows = []
    for b, cap in enumerate(max_new_tokens):
        new: list[int] = []
        for t in out[b, n:].tolist()[:cap]:
            if t in eos:
                break
            new.append(t)
        rows.append(new)
    return rows


def eos_ids(tokenizer, model) -> list[int]:
    """The ids that end a generation: the tokenizer's EOS and the generation config's."""
    ids = set()
    for src in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(i) for i in src)
    return sorted(ids)


def encode_prompt(tokenizer, text: str, chat_wrapped: bool) -> torch.Tensor:
    # A chat template already carries BOS where the model wants it; raw prompts get the
    # tokenizer's own special tokens (Gemma needs <bos>, SmolLM2 adds none).
    return tokenizer(text, return_tensors="pt", add_special_tokens=not chat_wrapped).input_ids


def decode_prepared(model, tokenizer, prepared: Sequence, chunk_size: int, eos: Sequence[int]) -> list[dict]:
    """Rows of prepared samples (``Task.prepare``: ids ``[1, n]``, cap, finish), decoded as one batch."""
    device = input_device(model)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)
    preds = greedy_generate_batch(
        model,
        [ids.to(device) for ids, _, _ in prepared],
        [cap for _, cap, _ in prepared],
        eos,
        chunk_size,
        pad,
    )
    return [
        finish(tokenizer.decode(p, skip_special_tokens=True)) for (_, _, finish), p in zip(prepared, preds)
    ]

"""Chunked prefill through the bounded cache: O(n * (w + c)) time, O(w + c) KV memory.

A one-shot forward over n tokens builds an n x n mask (128K tokens: 16 GB of booleans) and keeps n
keys per layer. Feeding the prompt in chunks of c tokens through ``SinkWindowCache`` gives every
query exactly the keys SWA(w, s) allows (the cache returns sinks + recent + chunk) while nothing
larger than ``w - 1 + c`` keys per layer ever exists.

The result does not depend on c: padded batches (``attention_mask``) and ``positions="cache"`` (whose
chunk queries get private sink copies, see ``cache``) give the same logits for any chunking, which the
tests check against the fp64 reference. ``evict:W:S`` is the exception by definition: its prompt is one
dense forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from .cache import SinkWindowCache
from .capability import text_config
from .make_cache import make_cache
from .masks import token_positions
from .patching import active_spec

__all__ = ["prefill", "PrefillResult", "check_context", "input_device"]

logger = logging.getLogger(__name__)


def _hook_device(module: torch.nn.Module) -> torch.device | None:
    """The ``execution_device`` of accelerate's hook on ``module`` (``None``: no such hook)."""
    hook = getattr(module, "_hf_hook", None)
    for h in getattr(hook, "hooks", [hook]):  # several hooks come as one SequentialHook
        where = getattr(h, "execution_device", None)
        if where is not None:
            return torch.device(f"cuda:{where}" if isinstance(where, int) else where)
    return None


def input_device(model: PreTrainedModel) -> torch.device:
    """Where a forward's ``input_ids`` go: the device the input embeddings compute on.

    On one device that is the embedding weight's. On a model accelerate dispatched
    (``device_map``), an offloaded embedding weight is on ``meta`` until its hook streams it in, so
    the hook's ``execution_device`` decides: the embedding's own, else that of the closest module
    above it that has one. The layers' hooks move activations between devices from there.
    """
    embeddings = model.get_input_embeddings()
    weight = getattr(embeddings, "weight", None)
    found = _hook_device(embeddings)
    if found is None and (weight is None or weight.device.type == "meta"):
        path = next((name for name, m in model.named_modules() if m is embeddings), "")
        parts = path.split(".") if path else []
        for k in range(len(parts) - 1, -1, -1):  # "model.embed_tokens" -> "model" -> ""
            found = _hook_device(model.get_submodule(".".join(parts[:k])))
            if found is not None:
                break
    if found is not None:
        return found
    return weight.device if weight is not None else next(model.parameters()).device


@dataclass
class PrefillResult:
    """What ``prefill`` returns.

    Attributes:
        logits: ``[batch, n, vocab]`` if ``return_logits="all"``, ``[batch, vocab]`` (the last
            position) if ``"last"``, else ``None``.
        cache: the filled cache, ready for ``model.generate(..., cache=cache)`` or further chunks.
    """

    logits: torch.Tensor | None
    cache: Cache

    def __iter__(self):
        # Lets callers unpack: ``logits, cache = prefill(...)``.
        return iter((self.logits, self.cache))


def check_token_ids(model: PreTrainedModel, input_ids) -> None:
    """One line for what the embedding would fail on deep inside: not a model, not a tensor of
    ``[batch, n]`` integer ids, or ids outside the vocabulary (checked once per call, not per forward)."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(
            f"model must be a transformers PreTrainedModel (sinkwindow.load gives one), got {type(model).__name__}"
        )
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids must be a torch.Tensor [batch, n] of token ids, got {type(input_ids).__name__}: "
            f"use tokenizer(text, return_tensors='pt').input_ids"
        )
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise ValueError(
            f"input_ids must be integer token ids (torch.long), got {input_ids.dtype}: pass the tokenizer's ids"
        )
    embeddings = model.get_input_embeddings()
    vocab = getattr(embeddings, "num_embeddings", None)
    if vocab is not None and input_ids.numel():
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ValueError(
                f"input_ids hold token id {bad}, outside the model's vocabulary of {vocab} (ids 0..{vocab - 1})"
            )


def check_context(model: PreTrainedModel, total_length: int, chunk_size: int | None = None) -> None:
    """Raise if the positions the model will see run past what it was trained on.

    With absolute positions that is the stream length; with ``positions="cache"`` only the cache
    positions count (at most ``w - 1 + chunk - 1``), so a stream may run past the trained context.
    """
    limit = getattr(text_config(model), "max_position_embeddings", None)
    if limit is None:
        return
    spec = active_spec(model)
    if spec.positions == "cache":
        first = total_length if spec.dense_prompt else 0  # evict's dense prompt keeps its positions
        reach = max(first, spec.window - 1 + (chunk_size or 1))
        if reach > limit:
            raise ValueError(
                f"positions='cache' puts a chunk of {chunk_size} tokens at cache positions up to {reach - 1}, beyond "
                f"the model's limit of {limit} positions (max_position_embeddings); use a smaller chunk_size or window"
            )
        return
    if total_length > limit:
        raise ValueError(
            f"context of {total_length} tokens is beyond the model's limit of {limit} positions "
            f"(max_position_embeddings); shorten the input, or stream it with positions='cache' "
            f"(e.g. swa:{spec.window or 256}:{spec.sinks or 4}:cache)"
        )


@torch.no_grad()
def prefill(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    chunk_size: int = 512,
    cache: Cache | None = None,
    attention_mask: torch.Tensor | None = None,
    return_logits: str = "last",
    on_chunk: Callable[[int, torch.Tensor], None] | None = None,
    progress: bool = False,
) -> PrefillResult:
    """Run ``input_ids`` through ``model`` in chunks, filling a bounded cache.

    Args:
        model: a model patched with ``sinkwindow.apply`` (an unpatched one gets a growing cache).
        input_ids: ``[batch, n]`` token ids.
        chunk_size: c, tokens per forward.
        cache: continue filling this cache instead of a fresh one.
        attention_mask: ``[batch, n]`` padding mask of ``input_ids`` (1 = real token); left padding for
            prompts that will be continued, right padding is fine for scoring. Each row then keeps its
            own first s real tokens as sinks and positions count real tokens only, so every row gives
            what it gives alone. Logits at padding positions are meaningless. Columns a continued
            ``cache`` already holds count as real.
        return_logits: ``"last"``, ``"all"`` or ``"none"``.
        on_chunk: called as ``on_chunk(start, logits[batch, c, vocab])`` after each chunk, so a
            caller can score a stream without keeping all logits.
        progress: show a tqdm bar.

    Returns:
        ``PrefillResult(logits, cache)``.
    """
    check_token_ids(model, input_ids)
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool):
        raise TypeError(f"chunk_size must be an int (tokens per forward), got {chunk_size!r}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    if return_logits not in ("last", "all", "none"):
        raise ValueError(f"return_logits must be 'last', 'all' or 'none', got {return_logits!r}")
    if input_ids.ndim != 2 or input_ids.shape[1] == 0:
        raise ValueError(
            f"input_ids must be a non-empty [batch, n] prompt, got shape {tuple(input_ids.shape)}"
        )
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask must match input_ids {tuple(input_ids.shape)}, got {tuple(attention_mask.shape)}"
        )
    cache = cache if cache is not None else make_cache(model)
    start0 = cache.get_seq_length()
    n = input_ids.shape[1]
    if active_spec(model).dense_prompt and start0 == 0:
        # evict:W:S is dense over the prompt by definition: one forward, then the cache evicts.
        chunk_size = max(n, 1)
    check_context(model, start0 + n, chunk_size)
    past_mask = None
    if attention_mask is not None:
        # transformers' convention: the mask covers every column so far.
        past_mask = attention_mask.new_ones((attention_mask.shape[0], start0))
    kept: list[torch.Tensor] = []
    last = None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc="prefill", unit="tok", leave=False)
    device = input_device(model)
    for start in range(0, n, chunk_size):
        chunk = input_ids[:, start : start + chunk_size].to(device)
        keep = None if (return_logits == "all" or on_chunk is not None) else 1
        extra = {}
        if attention_mask is not None:
            mask = torch.cat([past_mask, attention_mask[:, : start + chunk.shape[1]]], 1).to(device)
            extra["attention_mask"] = mask
            if not isinstance(cache, SinkWindowCache):
                # A stock cache (the unpatched model): positions count real tokens, as generate() does.
                extra["position_ids"] = token_positions(mask)[:, -chunk.shape[1] :].clamp(min=0)
        out = model(chunk, cache=cache, use_cache=True, logits_to_keep=keep or 0, **extra)
        logits = out.logits
        if on_chunk is not None:
            on_chunk(start0 + start, logits)
        if return_logits == "all":
            kept.append(logits)
        last = logits[:, -1]
        if bar is not None:
            bar.update(chunk.shape[1])
    if bar is not None:
        bar.close()
    if return_logits == "all":
        return PrefillResult(torch.cat(kept, dim=1), cache)
    if return_logits == "last":
        return PrefillResult(last, cache)
    return PrefillResult(None, cache)

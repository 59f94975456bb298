"""A model's decoding state in bytes, measured on the cache object a real prefill leaves behind.

Every cache kind is measured alike: the tensors reachable from the cache object (attributes, dicts,
lists and tuples, nested cache layers), each distinct storage counted once at its full size (a view
that pins a larger buffer costs the buffer). That covers transformers' ``DynamicCache`` of stock
attention layers (keys, values), its linear-attention layers (Mamba2's and Qwen3-Next's convolution
and recurrent states, LFM2's convolution state), sinkwindow's ``SinkWindowCache`` and the
retrofits' ``LinearAttnCache`` (S, z and the window's FIFO).
"""

from __future__ import annotations

import torch

__all__ = ["state_tensors", "state_nbytes", "measure_state_bytes", "STATE_SOURCE"]

# What every row's ``state_bytes_source`` says, with the prefill's length filled in.
STATE_SOURCE = "cache-object after prefill at {n} tokens"

# Attributes that point back at a model or a config, never at state: not walked.
_SKIP = {"config", "model", "_cache"}


def state_tensors(obj) -> list[torch.Tensor]:
    """Every tensor reachable from ``obj`` through attributes, dicts, lists and tuples, each object once."""
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif hasattr(item, "__dict__") and not isinstance(item, (type, torch.nn.Module)):
            stack.extend(v for k, v in vars(item).items() if k not in _SKIP)
    return out


def state_nbytes(cache) -> int:
    """Bytes of the distinct storages the tensors of ``cache`` live in (empty tensors cost nothing)."""
    total, storages = 0, set()
    for t in state_tensors(cache):
        if t.numel() == 0:
            continue
        storage = t.untyped_storage()
        key = (storage.data_ptr(), str(t.device))
        if key not in storages:
            storages.add(key)
            total += storage.nbytes()
    return total


@torch.no_grad()
def measure_state_bytes(model, n_tokens: int, *, chunk_size: int = 512, input_ids=None) -> int:
    """The state ``model`` (in whatever method it runs) holds after a prefill of ``n_tokens`` tokens.

    The prefill is the evaluation's own (``sinkwindow.prefill`` into ``make_cache(model)``), so the
    cache measured is the one the task's samples decode from. ``input_ids`` ``[1, n]``: the prompt
    to use; default ``n_tokens`` seeded token ids (the state's size does not depend on them).
    """
    from ...runtime.make_cache import make_cache
    from ...runtime.prefill import input_device, prefill

    if input_ids is None:
        vocab = model.get_input_embeddings().weight.shape[0]
        gen = torch.Generator().manual_seed(n_tokens)
        input_ids = torch.randint(0, vocab, (1, n_tokens), generator=gen)
    input_ids = input_ids[:, :n_tokens].to(input_device(model))
    result = prefill(model, input_ids, chunk_size=chunk_size, cache=make_cache(model), return_logits="none")
    return state_nbytes(result.cache)

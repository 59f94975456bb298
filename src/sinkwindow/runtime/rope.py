"""RoPE as the cache sees it: rotate cached keys to new positions without running the model.

``positions="cache"`` (StreamingLLM) gives every key a position inside the cache rather than its
position in the stream, so keys must be re-rotated as the window slides. We take the model's own
frequencies (``inv_freq``) and ``attention_scaling`` from its rotary-embedding module
(``model.model.rotary_emb``) and apply the ``rotate_half`` convention every supported family uses::

    rope(x, p) = (x * cos(p * f) + rotate_half(x) * sin(p * f)) * attention_scaling

on the first ``rotary_dim = 2 * len(inv_freq)`` channels (partial rotary, as Phi-3 does), the rest
passing through. Because R(p) R(q) = R(p + q), a key rotated at p moves to p - d with R(-d): the
cache stores keys *un-rotated* (pre-RoPE) and rotates them afresh for each forward, so no rounding
error accumulates however long the stream (KeyRerotationPress re-rotates the rotated keys instead).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LayerRope", "SUPPORTED_ROPE_TYPES", "rope_for_model", "rotate_half"]

# RoPE variants whose frequencies are fixed at load time. "dynamic" and "longrope" recompute them from
# the longest position in each forward, so a key rotated under one forward's frequencies could not be
# moved under another's.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` over the last dimension (transformers' convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@dataclass(frozen=True)
class LayerRope:
    """One layer's rotary embedding.

    Attributes:
        inv_freq: ``(rotary_dim // 2,)`` float32 inverse frequencies, as the model computes them.
        scaling: ``attention_scaling``, the factor transformers multiplies cos and sin by (1 for default RoPE).
    """

    inv_freq: torch.Tensor
    scaling: float = 1.0

    @property
    def rotary_dim(self) -> int:
        return 2 * self.inv_freq.shape[-1]

    def _cos_sin(self, positions: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(device=device, dtype=torch.float32)[..., None] * self.inv_freq.to(
            device, torch.float32
        )
        emb = torch.cat((freqs, freqs), dim=-1)  # [B|1, n, rotary_dim]
        return emb.cos()[:, None], emb.sin()[:, None]  # broadcast over heads

    def _apply(self, x: torch.Tensor, positions: torch.Tensor, sign: float, factor: float) -> torch.Tensor:
        rd = self.rotary_dim
        cos, sin = self._cos_sin(positions, x.device)
        xr = x[..., :rd].float()
        out = (xr * cos + sign * rotate_half(xr) * sin) * factor
        if rd == x.shape[-1]:
            return out.to(x.dtype)
        return torch.cat((out.to(x.dtype), x[..., rd:]), dim=-1)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate un-rotated keys to ``positions``.

        Args:
            x: ``[batch, heads, n, head_dim]``.
            positions: ``[batch or 1, n]`` (any integer or float values, negative ones included).

        Returns:
            ``[batch, heads, n, head_dim]`` in ``x``'s dtype, exactly what the model's own RoPE gives.
        """
        return self._apply(x, positions, 1.0, self.scaling)

    def unrotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Inverse of ``rotate``: keys the model rotated at ``positions`` back to pre-RoPE."""
        return self._apply(x, positions, -1.0, 1.0 / self.scaling)


def _rotary_module(model: torch.nn.Module) -> torch.nn.Module:
    for name, module in model.named_modules():
        if name.endswith("rotary_emb") and any(
            k.endswith("inv_freq") for k, _ in module.named_buffers(recurse=False)
        ):
            return module
    raise NotImplementedError(
        f"positions='cache' needs the model's rotary embedding (a 'rotary_emb' module with inv_freq); "
        f"{type(model).__name__} has none"
    )


def rope_for_model(model: torch.nn.Module, layer_types: list[str] | None = None) -> list[LayerRope]:
    """Each decoder layer's RoPE, read from the model's rotary-embedding module.

    Args:
        model: a transformers causal LM.
        layer_types: ``config.layer_types`` when the model keeps per-type RoPE (Gemma 3's local and
            global layers use different bases).

    Raises:
        NotImplementedError: for RoPE types whose frequencies change with the input length
            (``dynamic``, ``longrope``), or models without a rotary embedding.
    """
    rot = _rotary_module(model)
    n_layers = model.config.get_text_config(decoder=True).num_hidden_layers
    rope_type = getattr(rot, "rope_type", "default")
    types = rope_type if isinstance(rope_type, dict) else {None: rope_type}
    bad = {t for t in types.values() if t not in SUPPORTED_ROPE_TYPES}
    if bad:
        raise NotImplementedError(
            f"positions='cache' supports rope_type {', '.join(SUPPORTED_ROPE_TYPES)}; this model uses "
            f"{', '.join(sorted(bad))}, whose frequencies depend on the input length, so cached keys cannot be "
            f"re-rotated consistently. Use positions='absolute' (e.g. swa:W:S)"
        )
    out = []
    for i in range(n_layers):
        lt = layer_types[i] if layer_types is not None else None
        if lt is not None and hasattr(rot, f"{lt}_inv_freq"):
            inv_freq = getattr(rot, f"{lt}_inv_freq")
            scaling = getattr(rot, f"{lt}_attention_scaling", 1.0)
        else:
            inv_freq = rot.inv_freq
            scaling = getattr(rot, "attention_scaling", 1.0)
        out.append(LayerRope(inv_freq.detach().float().clone(), float(scaling)))
    return out

"""Learned feature maps φ for linear attention: Hedgehog (LoLCATs) and T2R.

A feature map sends a post-RoPE, post-``repeat_kv`` query or key head vector x (D) to a
non-negative feature vector φ(x) (F), so that φ(q)·φ(k) can stand in for exp(q·k/√D). One map has
its own weights for every query head (LoLCATs ``untied_head_einsum``); a layer holds two of them,
``feature_map_q`` and ``feature_map_k``, which start equal and train apart.

    u    = einsum('hdf,bhld->bhlf', W, x) (+ b)            W: (H, D, f)
    φ(x) = act(u).clamp(min=eps)

Activations (``ACTIVATIONS``):

- ``softmax_dim`` (default, LoLCATs ``SoftmaxDim``): concat(softmax(u), softmax(−u)), F = 2f. Each
  half sums to one, so 0 < φq·φk ≤ 2 and nothing can overflow in half precision.
- ``exp_dim`` (LoLCATs ``Exp``): concat(exp(u − max u), exp(−u + min u)), F = 2f.
- ``relu`` (T2R, LoLCATs ``lk_t2r``): ReLU(u + b), F = f.

The two exponential variants rescale each half per token, which does not cancel in the attention
normaliser: they are different kernels, not rescalings of one another (docs/linear.md §7.4). Record the
activation with any checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn as nn

__all__ = [
    "ACTIVATIONS",
    "FEATURE_MAPS",
    "HedgehogFeatureMap",
    "exp_dim",
    "relu",
    "softmax_dim",
]

INITS = ("identity", "kaiming")


def softmax_dim(u: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Hedgehog map as LoLCATs runs it: two softmaxes, each normalised on its own.

    Args:
        u: projected features, shape ``(..., f)``.
        eps: floor that keeps every feature strictly positive (the pure-linear normaliser divides
            by φq·z).

    Returns:
        Features of shape ``(..., 2f)``.
    """
    return torch.cat([torch.softmax(u, dim=-1), torch.softmax(-u, dim=-1)], dim=-1).clamp(min=eps)


def exp_dim(u: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Hedgehog [exp(u), exp(−u)] stabilised by a per-token max (and min) shift, LoLCATs ``Exp``.

    Args:
        u: projected features, shape ``(..., f)``.
        eps: positivity floor.

    Returns:
        Features of shape ``(..., 2f)``; each half peaks at exactly 1.
    """
    u_max = u.amax(dim=-1, keepdim=True)
    u_min = u.amin(dim=-1, keepdim=True)
    return torch.cat([torch.exp(u - u_max), torch.exp(-u + u_min)], dim=-1).clamp(min=eps)


def relu(u: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """T2R map ReLU(u), floored at ``eps`` as LoLCATs ``ReLU`` does so no key is exactly zero.

    Args:
        u: projected features (bias already added), shape ``(..., f)``.
        eps: positivity floor.

    Returns:
        Features of shape ``(..., f)``.
    """
    return torch.relu(u).clamp(min=eps)


# name -> (activation, output features per projected feature)
ACTIVATIONS: dict[str, tuple[Callable[..., torch.Tensor], int]] = {
    "softmax_dim": (softmax_dim, 2),
    "exp_dim": (exp_dim, 2),
    "relu": (relu, 1),
}


class HedgehogFeatureMap(nn.Module):
    """Per-head learned feature map φ(x) = act(x W_h + b_h), LoLCATs ``FeatureMapMLP`` + activation.

    Args:
        num_heads: H, the number of query heads. Key maps also have H heads because LoLCATs maps
            keys after ``repeat_kv`` (one key map per query head, docs/linear.md §1.1).
        head_dim: D, the input size.
        feature_dim: f, the projection size. Defaults to ``D // 2`` for the exponential activations
            (so F = 2f = D) and to ``D`` for ``relu`` (T2R).
        activation: a key of ``ACTIVATIONS``.
        init: ``"identity"`` sets each head's (D, f) slice to I[:, :f], so u = x[..., :f] (what
            every LoLCATs command runs, via ``--lk_zero_init``); ``"kaiming"`` is LoLCATs' class
            default, ``kaiming_uniform_`` on the whole (H, D, f) tensor.
        bias: add a learned (H, f) bias before the activation, zero at init. Defaults to True for
            ``relu`` (T2R) and False otherwise (LoLCATs configs set ``bias: false``).
        eps: positivity floor of the activation.
        device, dtype: where the weights live.

    Attributes:
        weight: (H, D, f).
        bias: (H, f) or ``None``.
        out_features: F, the size of φ(x).
    """

    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        feature_dim: int | None = None,
        activation: str = "softmax_dim",
        init: str = "identity",
        bias: bool | None = None,
        eps: float = 1e-12,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; expected one of {sorted(ACTIVATIONS)}")
        if init not in INITS:
            raise ValueError(f"unknown init {init!r}; expected one of {INITS}")
        act, expansion = ACTIVATIONS[activation]
        if feature_dim is None:
            feature_dim = head_dim if expansion == 1 else head_dim // 2
        if feature_dim <= 0:
            raise ValueError(f"feature_dim must be positive, got {feature_dim}")
        if bias is None:
            bias = activation == "relu"
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.feature_dim = feature_dim
        self.activation = activation
        self.init = init
        self.eps = eps
        self.out_features = expansion * feature_dim
        self._act = act
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim, feature_dim, **factory))
        self.bias = nn.Parameter(torch.empty(num_heads, feature_dim, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Re-initialise the weights according to ``self.init``; the bias always starts at zero."""
        with torch.no_grad():
            if self.init == "identity":
                # eye_ on a (D, f) slice writes I[:, :f] (or I[:D, :] when f > D).
                for w in self.weight:
                    nn.init.eye_(w)
            else:
                # The same call as LoLCATs: fan_in of a 3-D tensor is D * f, not D.
                nn.init.kaiming_uniform_(self.weight)
            if self.bias is not None:
                self.bias.zero_()

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """The linear part u = x W_h (+ b_h).

        Args:
            x: (b, H, L, D).

        Returns:
            u: (b, H, L, f), in the promoted dtype of ``x`` and the weights but at least float32.
        """
        dtype = _feature_dtype(x.dtype, self.weight.dtype)
        u = torch.einsum("hdf,bhld->bhlf", self.weight.to(dtype), x.to(dtype))
        if self.bias is not None:
            u = u + self.bias.to(dtype)[None, :, None, :]
        return u

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map query or key heads to features.

        Args:
            x: (b, H, L, D), post-RoPE and already expanded to H heads.

        Returns:
            φ(x): (b, H, L, F), strictly positive, in float32 (float64 if ``x`` or the weights are
            float64). Not cast back to the model dtype: the kernels consume float32, and float16
            would flush the 1e-12 floor to zero (docs/linear.md §7.3).
        """
        if x.shape[1] != self.num_heads or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"expected x of shape (b, {self.num_heads}, L, {self.head_dim}), got {tuple(x.shape)}"
            )
        return self._act(self.project(x), eps=self.eps)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_dim={self.head_dim}, feature_dim={self.feature_dim}, "
            f"out_features={self.out_features}, activation={self.activation!r}, init={self.init!r}, "
            f"bias={self.bias is not None}"
        )


def _feature_dtype(*dtypes: torch.dtype) -> torch.dtype:
    return torch.float64 if torch.float64 in dtypes else torch.float32


# name -> constructor taking (num_heads, head_dim, **kwargs); what a method spec or checkpoint names.
FEATURE_MAPS: dict[str, Callable[..., nn.Module]] = {
    "hedgehog": HedgehogFeatureMap,
    "hedgehog_exp": partial(HedgehogFeatureMap, activation="exp_dim"),
    "t2r": partial(HedgehogFeatureMap, activation="relu"),
}

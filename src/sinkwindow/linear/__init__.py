"""Linear-attention retrofits (Hedgehog, LoLCATs, Liger): kernels, conversion, constant-size cache, training.

    >>> from sinkwindow.linear import convert, revert, load_linear
    >>> convert(model, "lolcats:64")                 # in place; feature maps + γ per layer
    >>> convert(other, "liger:64")                   # Liger-GLA(+SWA): no new parameters
    >>> cache = sinkwindow.make_cache(model)         # LinearAttnCache: (S, z) + last 64 keys
    >>> model = load_linear(model, "lolcats:64", "runs/lolcats64")   # a trained baseline

``ops`` holds the fast forms (chunked for training and prefill, recurrent for decoding; Liger's
gated linear attention among them) and ``naive`` their slow quadratic and token-by-token references; ``feature_maps`` the learned maps φ.
``attention``/``convert`` swap a model's attention through transformers' ``AttentionInterface``;
``cache`` is the decode state; ``transfer`` (stage 1), ``finetune`` (stage 2, LoRA via peft),
``trainer``, ``data`` and ``checkpoint`` train and store the baselines; ``cli`` adds ``train``.
"""

from sinkwindow.linear.adapters import list_adapters, shipped_adapter
from sinkwindow.linear.attention import ATTN_NAME, LinearVariant
from sinkwindow.linear.cache import LinearAttnCache, LinearAttnLayer
from sinkwindow.linear.checkpoint import load_checkpoint, load_linear, read_metadata, save_checkpoint
from sinkwindow.linear.convert import convert, get_retrofit, is_converted, revert
from sinkwindow.linear.feature_maps import (
    ACTIVATIONS,
    FEATURE_MAPS,
    HedgehogFeatureMap,
    exp_dim,
    relu,
    softmax_dim,
)
from sinkwindow.linear.naive import (
    naive_quadratic_gla,
    naive_quadratic_hybrid_attn,
    naive_quadratic_liger_attn,
    naive_quadratic_linear_attn,
    naive_recurrent_gla,
    naive_recurrent_hybrid_attn,
    naive_recurrent_liger_attn,
    naive_recurrent_linear_attn,
)
from sinkwindow.linear.ops import (
    HybridAttnState,
    LigerAttnState,
    LinearAttnState,
    chunk_gla,
    chunk_hybrid_attn,
    chunk_liger_attn,
    chunk_linear_attn,
    gla_step,
    hybrid_attn_past_window,
    hybrid_attn_step,
    liger_attn_step,
    liger_feature_map,
    liger_gate,
    linear_attn_step,
    prefill_state,
    repeat_kv,
    unrotate_half,
    window_softmax_terms,
)

__all__ = [
    "ACTIVATIONS",
    "ATTN_NAME",
    "LinearAttnCache",
    "LinearAttnLayer",
    "LinearVariant",
    "list_adapters",
    "shipped_adapter",
    "convert",
    "get_retrofit",
    "is_converted",
    "load_checkpoint",
    "load_linear",
    "read_metadata",
    "revert",
    "save_checkpoint",
    "FEATURE_MAPS",
    "HedgehogFeatureMap",
    "HybridAttnState",
    "LigerAttnState",
    "LinearAttnState",
    "chunk_gla",
    "chunk_hybrid_attn",
    "chunk_liger_attn",
    "chunk_linear_attn",
    "exp_dim",
    "gla_step",
    "hybrid_attn_past_window",
    "hybrid_attn_step",
    "liger_attn_step",
    "liger_feature_map",
    "liger_gate",
    "linear_attn_step",
    "naive_quadratic_gla",
    "naive_quadratic_hybrid_attn",
    "naive_quadratic_liger_attn",
    "naive_quadratic_linear_attn",
    "naive_recurrent_gla",
    "naive_recurrent_hybrid_attn",
    "naive_recurrent_liger_attn",
    "naive_recurrent_linear_attn",
    "prefill_state",
    "relu",
    "repeat_kv",
    "softmax_dim",
    "unrotate_half",
    "window_softmax_terms",
]

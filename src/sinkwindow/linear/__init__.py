"""Linear-attention retrofits (Hedgehog, LoLCATs, Liger): kernels, conversion, constant-size cache, adapters.

    >>> from sinkwindow.linear import convert, revert, load_linear
    >>> convert(model, "lolcats:64")                 # in place; feature maps + γ per layer
    >>> convert(other, "liger:64")                   # Liger-GLA(+SWA): no new parameters
    >>> cache = sinkwindow.make_cache(model)         # LinearAttnCache: (S, z) + last 64 keys
    >>> model = load_linear(model, "lolcats:64", "runs/lolcats64")   # a trained baseline

``ops`` holds the fast forms (chunked for training and prefill, recurrent for decoding; Liger's
gated linear attention among them) and ``naive`` their slow quadratic and token-by-token references; ``feature_maps`` the learned maps φ.
``attention``/``convert`` swap a model's attention through transformers' ``AttentionInterface``;
``cache`` is the decode state; ``lora`` the LoRA adapters (peft), ``checkpoint`` and ``adapters``
store and ship the trained baselines. Training them is ``sinkwindow.train``'s job.
"""

from .._lazy import lazy_package

# Public names by the module that defines them; each loads on first use (see _lazy.py).
__all__ = lazy_package(
    __name__,
    {
        ".adapters": ["list_adapters", "shipped_adapter"],
        ".attention": ["ATTN_NAME", "LinearVariant"],
        ".cache": ["LinearAttnCache", "LinearAttnLayer"],
        ".checkpoint": ["load_checkpoint", "load_linear", "read_metadata", "save_checkpoint"],
        ".convert": ["convert", "get_retrofit", "is_converted", "revert"],
        ".lora": ["DEFAULT_LORA", "LIGER_LORA", "add_lora", "lora_parameters", "remove_lora"],
        ".feature_maps": [
            "ACTIVATIONS",
            "FEATURE_MAPS",
            "HedgehogFeatureMap",
            "exp_dim",
            "relu",
            "softmax_dim",
        ],
        ".naive": [
            "naive_quadratic_gla",
            "naive_quadratic_window_linear_attn",
            "naive_quadratic_liger_attn",
            "naive_quadratic_linear_attn",
            "naive_recurrent_gla",
            "naive_recurrent_window_linear_attn",
            "naive_recurrent_liger_attn",
            "naive_recurrent_linear_attn",
        ],
        ".ops": [
            "HybridAttnState",
            "LigerAttnState",
            "LinearAttnState",
            "chunk_gla",
            "chunk_window_linear_attn",
            "chunk_liger_attn",
            "chunk_linear_attn",
            "gla_step",
            "window_linear_attn_past_window",
            "window_linear_attn_step",
            "liger_attn_step",
            "liger_feature_map",
            "liger_gate",
            "linear_attn_step",
            "prefill_state",
            "repeat_kv",
            "unrotate_half",
            "window_softmax_terms",
        ],
    },
)

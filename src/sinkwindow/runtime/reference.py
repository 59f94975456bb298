"""The slow twin of the runtime: dense float64 attention masked straight from the formula.

Nothing here goes through transformers' mask code or our cache. The attention function builds the
SWA(w, s) pattern itself from ``j <= i and (j < s or j > i - (w - s))`` over the positions of an
uncached forward, and token-by-token decoding re-runs the whole sequence every step. Tests compare
the fast path (masks + bounded cache + chunked prefill) against this.

- **Padding**: positions count each row's real tokens (``cumsum - 1``); padding keys are never seen.
- **evict:W:S**: queries of the prompt (the first ``prompt_length`` columns) see every earlier key;
  later queries see SWA(w, s).
- **Hybrid specs** (``swa:W:S+full:...``): the named layers, or the query heads of the named KV heads,
  see every earlier key; the rest SWA(w, s).
- **positions="cache"**: a query at position i sits at ``min(i, w - 1)`` with its recent keys right
  below it, so only its distance to the sinks changes: the reference rotates each sink key, per query,
  by ``max(0, i - (w - 1))`` more, with RoPE recomputed in float64 from the model's ``inv_freq``.
"""

from __future__ import annotations

import copy

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import repeat_kv
from transformers.masking_utils import AttentionMaskInterface

from .spec import MethodSpec, parse_spec

__all__ = ["reference_mask", "reference_attention", "reference_model", "reference_logits", "reference_greedy"]

REFERENCE_NAME = "sinkwindow_reference"
_REF_ATTR = "_sinkwindow_reference"


def reference_mask(
    length: int,
    window: int | None,
    sinks: int,
    prompt_length: int | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Query i sees key j iff j <= i and (j < s or j > i - (w - s)), over positions.

    Args:
        prompt_length: evict: queries in the first ``prompt_length`` columns see every earlier key.
        positions: ``(batch, length)`` position of each column among its row's real tokens (-1 =
            padding); default ``0..length-1``.

    Returns:
        ``(length, length)`` bool, or ``(batch, length, length)`` with ``positions``.
    """
    pos = torch.arange(length)[None] if positions is None else positions
    i = pos[:, :, None]
    j = pos[:, None, :]
    real = (i >= 0) & (j >= 0)
    causal = (j <= i) & real
    allowed = causal
    if window is not None:
        allowed = causal & ((j < sinks) | (j > i - (window - sinks)))
    if prompt_length is not None:
        in_prompt = (torch.arange(length) < prompt_length)[None, :, None]
        allowed = torch.where(in_prompt, causal, allowed)
    return allowed[0] if positions is None else allowed


def _rope_rotate(x: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [..., head_dim]`` by ``delta`` (broadcast to ``x[..., 0]``) positions, float64."""
    rd = 2 * inv_freq.shape[-1]
    ang = delta.double()[..., None] * inv_freq.double()
    cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
    xr = x[..., :rd]
    half = rd // 2
    rot = torch.cat((-xr[..., half:], xr[..., :half]), dim=-1)
    out = xr * cos + rot * sin
    return torch.cat((out, x[..., rd:].expand(*out.shape[:-1], -1)), dim=-1)


def reference_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Dense masked attention in float64 for an uncached forward over L columns.

    Positions are ``0..L-1``, or each row's real-token positions set by ``_run`` under padding.

    Args:
        query: ``[batch, heads, L, head_dim]``; key, value: ``[batch, kv_heads, L, head_dim]``.

    Returns:
        ``([batch, L, heads, head_dim], weights)`` like every transformers attention function.
    """
    plan = getattr(module.config, _REF_ATTR)
    length = query.shape[-2]
    if key.shape[-2] != length:
        raise ValueError("the reference runs uncached forwards only (use_cache=False)")
    window, sinks = plan["window"], plan["sinks"]
    prompt_length = plan.get("prompt_length")
    native = _native_window(module)
    rerotate = plan["positions"] == "cache"
    if native is not None and plan["native_sliding"] == "keep":
        window, sinks, prompt_length, rerotate = native, 0, None, False
    elif window is None and native is not None:
        # The unpatched model itself: native sliding layers see their own w keys (SWA(w, 0)).
        window, sinks = native, 0
    batch = query.shape[0]
    pos = plan.get("token_pos")
    pos = torch.arange(length)[None].expand(batch, -1) if pos is None else pos
    pos = pos.to(query.device)
    groups = getattr(module, "num_key_value_groups", 1)
    q, k, v = query.double(), repeat_kv(key, groups).double(), repeat_kv(value, groups).double()
    scaling = scaling if scaling is not None else q.shape[-1] ** -0.5
    scores = q @ k.transpose(-1, -2) * scaling
    if rerotate and sinks and window is not None:
        # Per query i, sink keys sit (w - 1) - j away instead of i - j: rotate them max(0, i - w + 1) further.
        delta = (pos - (window - 1)).clamp(min=0)
        if prompt_length is not None:
            delta[:, :prompt_length] = 0
        inv_freq = plan["inv_freq"][module.layer_idx].to(query.device)
        k_rot = _rope_rotate(k[:, :, None, :, :], delta[:, None, :, None], inv_freq)  # [B, H, Lq, Lk, D]
        moved = torch.einsum("bhid,bhijd->bhij", q, k_rot) * scaling
        is_sink = ((pos >= 0) & (pos < sinks))[:, None, None, :]
        scores = torch.where(is_sink, moved, scores)
    softcap = kwargs.get("softcap")
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    allowed = reference_mask(length, window, sinks, None, pos.cpu())
    if prompt_length is not None:
        # evict's prompt runs the unmodified model: dense, or a native sliding layer's own window.
        as_is = reference_mask(length, native, 0, None, pos.cpu())
        in_prompt = (torch.arange(length) < prompt_length)[None, :, None]
        allowed = torch.where(in_prompt, as_is, allowed)
    full_heads = (plan.get("full_kv_heads") or {}).get(module.layer_idx)
    if full_heads:
        # The query heads of these KV heads (h uses KV head h // groups) see every earlier key.
        dense = reference_mask(length, None, 0, None, pos.cpu())
        per_head = torch.zeros(q.shape[1], dtype=torch.bool)
        per_head[[h for h in range(q.shape[1]) if h // groups in full_heads]] = True
        allowed = torch.where(per_head[None, :, None, None], dense[:, None], allowed[:, None])
    else:
        allowed = allowed[:, None]
    allowed = allowed.to(scores.device)
    # Padding queries see themselves only (their outputs are never used; this keeps them finite).
    allowed = allowed | (
        torch.eye(length, dtype=torch.bool, device=scores.device)[None, None] & (pos < 0)[:, None, :, None]
    )
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    out = (weights @ v).to(query.dtype)
    return out.transpose(1, 2).contiguous(), weights


def _native_window(module) -> int | None:
    """The layer's own sliding window, if the architecture gives it one (read from the config)."""
    from .capability import native_sliding_layers

    cfg = module.config
    layer_types = getattr(cfg, _REF_ATTR)["layer_types"]
    if layer_types is not None:
        return cfg.sliding_window if layer_types[module.layer_idx] == "sliding_attention" else None
    if getattr(cfg, "sliding_window", None) is not None and native_sliding_layers(cfg)[module.layer_idx]:
        return cfg.sliding_window
    return None


def _reference_mask_builder(*args, **kwargs):
    # The reference attention masks by itself; transformers must not pass it anything.
    return None


def reference_model(model: PreTrainedModel, spec: str | MethodSpec, native_sliding: str = "override"):
    """A float64 deep copy of ``model`` (unpatched) that runs ``spec`` through ``reference_attention``."""
    from .capability import all_configs, kv_heads_of
    from .patching import apply  # local: patch imports nothing from here
    from .rope import rope_for_model

    spec = parse_spec(spec)
    if not (spec.is_full or spec.is_windowed):
        raise ValueError(f"the reference covers full, swa and evict specs, not {spec}")
    AttentionInterface.register(REFERENCE_NAME, reference_attention)
    AttentionMaskInterface.register(REFERENCE_NAME, _reference_mask_builder)
    ref = copy.deepcopy(model)
    apply(ref, "full")
    ref = ref.double().eval()
    if getattr(ref.config, "_experts_implementation", None) not in (None, "eager"):
        # MoE experts default to grouped_mm kernels, which have no float64 path: run them as plain loops.
        ref.set_experts_implementation("eager")
    tcfg = ref.config.get_text_config(decoder=True)
    layer_types = getattr(tcfg, "layer_types", None)
    kv_heads = kv_heads_of(ref)
    if spec.is_hybrid:
        spec.check_units(tcfg.num_hidden_layers, kv_heads)
    plan = {
        "window": spec.window,
        "sinks": spec.sinks,
        "native_sliding": native_sliding,
        "layer_types": layer_types,
        "positions": spec.positions,
        "kind": spec.kind,
        "inv_freq": [r.inv_freq for r in rope_for_model(ref, layer_types)]
        if spec.positions == "cache"
        else None,
        "prompt_length": None,
        "token_pos": None,
        "full_kv_heads": {i: spec.full_kv_heads(i, kv_heads) for i in range(tcfg.num_hidden_layers)}
        if spec.is_hybrid
        else None,
    }
    for cfg in all_configs(ref):
        setattr(cfg, _REF_ATTR, plan)
    ref.set_attn_implementation(REFERENCE_NAME)
    return ref


def _run(ref, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, prompt_length: int | None):
    from .masks import token_positions

    plan = getattr(ref.config.get_text_config(decoder=True), _REF_ATTR)
    pos = None if attention_mask is None else token_positions(attention_mask)
    plan["token_pos"] = pos
    plan["prompt_length"] = prompt_length if plan["kind"] == "evict" else None
    try:
        position_ids = None if pos is None else pos.clamp(min=0)
        return ref(input_ids, position_ids=position_ids, use_cache=False).logits
    finally:
        plan["token_pos"] = None
        plan["prompt_length"] = None


@torch.no_grad()
def reference_logits(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    spec: str | MethodSpec,
    native_sliding: str = "override",
    attention_mask: torch.Tensor | None = None,
    prompt_length: int | None = None,
) -> torch.Tensor:
    """``[batch, L, vocab]`` float64 logits of one uncached reference forward.

    Args:
        attention_mask: ``[batch, L]`` padding mask (1 = real token); positions count real tokens.
        prompt_length: for ``evict``: how many leading columns were the (dense) prompt; default all.
    """
    ref = reference_model(model, spec, native_sliding)
    return _run(
        ref, input_ids, attention_mask, prompt_length if prompt_length is not None else input_ids.shape[1]
    )


@torch.no_grad()
def reference_greedy(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    spec: str | MethodSpec,
    max_new_tokens: int,
    attention_mask: torch.Tensor | None = None,
    native_sliding: str = "override",
) -> torch.Tensor:
    """Greedy decoding by re-running the whole sequence each step (no cache). ``[batch, L + n]``.

    For ``evict`` the given ids are the dense prompt; with ``attention_mask`` (left padding) generated
    tokens count as real.
    """
    ref = reference_model(model, spec, native_sliding)
    ids, mask, prompt = input_ids, attention_mask, input_ids.shape[1]
    for _ in range(max_new_tokens):
        nxt = _run(ref, ids, mask, prompt)[:, -1].argmax(-1, keepdim=True)
        ids = torch.cat([ids, nxt], dim=-1)
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
    return ids

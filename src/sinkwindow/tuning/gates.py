"""Trained head gates, DuoAttention's way: which KV heads need full attention, learned on a frozen model.

DuoAttention (arXiv 2410.10819) gives every KV head one gate α ∈ [0, 1] that mixes the head's
full-attention output with its streaming (sinks + recent) output, and optimises the gates alone,
the model frozen, so that the last hidden states stay those of full attention while an L1 term
pulls every α towards 0. Heads whose α stays high are retrieval heads: they keep full attention.

Here the streaming side is SWA(w, s) exactly as the runtime runs it, and the gated forward is the
slow, obvious one: for each layer, attention is computed twice densely over the whole calibration
prompt (a causal mask and the SWA(w, s) mask of ``reference.reference_mask``) through
transformers' own SDPA function, and each query head's output is ``α·full + (1 − α)·swa`` with the
α of its KV head. So α = 0 everywhere is SWA(w, s) and α = 1 is full attention (tested), and the
cost is two attentions per layer on prompts of a few thousand tokens: calibration, not serving.

:func:`train_gates` returns α per ``(layer, kv_head)``; ``calibrate --criterion gates`` ranks heads by
it. Calibration prompts come from ``prompts.calibration_prompts`` (a seed no evaluation uses).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..memory import kv_geometry
from ..reference import reference_mask
from ..spec import MethodSpec, parse_spec

__all__ = ["GATES_NAME", "GateResult", "gated_attention", "gated_forward", "train_gates"]

logger = logging.getLogger(__name__)

GATES_NAME = "sinkwindow_gates"


@dataclass
class _GateState:
    """What the gated attention reads during a forward: α per layer ``[kv_heads]`` and the SWA shape."""

    alpha: dict[int, torch.Tensor]
    window: int
    sinks: int
    masks: dict = field(default_factory=dict)

    def mask(self, q_len: int, k_len: int, device, kind: str) -> torch.Tensor:
        key = (q_len, k_len, str(device), kind)
        if key not in self.masks:
            if q_len != k_len:
                raise ValueError("the gated forward runs whole prompts without a cache (q_len == k_len)")
            window = None if kind == "full" else self.window
            self.masks[key] = reference_mask(k_len, window, self.sinks).to(device)[None, None]
        return self.masks[key]


_STATE: _GateState | None = None


def gated_attention(module, query, key, value, attention_mask, **kwargs):
    """``α·full + (1 − α)·swa`` per query head, α of its KV head (``query [B, H, n, d]``).

    Returns:
        ``([B, n, H, d], None)`` as transformers' attention functions do.
    """
    state = _STATE
    if state is None:
        raise RuntimeError("the gated attention runs only inside gated_forward()")
    n, m = query.shape[-2], key.shape[-2]
    full, _ = sdpa_attention_forward(
        module, query, key, value, state.mask(n, m, query.device, "full"), **kwargs
    )
    swa, _ = sdpa_attention_forward(
        module, query, key, value, state.mask(n, m, query.device, "swa"), **kwargs
    )
    alpha = state.alpha[module.layer_idx]  # [kv_heads]
    per_query = alpha.repeat_interleave(query.shape[1] // alpha.shape[0]).to(full.dtype)  # [H]
    a = per_query[None, None, :, None]
    return a * full + (1 - a) * swa, None


AttentionInterface.register(GATES_NAME, gated_attention)


def gated_forward(model: PreTrainedModel, input_ids: torch.Tensor, alpha: dict[int, torch.Tensor],
                  spec: MethodSpec | str) -> torch.Tensor:  # fmt: skip
    """Last hidden states ``[1, n, hidden]`` of ``model`` (unpatched, full attention) with every
    layer's attention gated by ``alpha[layer] [kv_heads]`` between full and ``spec``'s SWA(w, s)."""
    global _STATE
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    configs = {id(c): c for c in (model.config, model.config.get_text_config(decoder=True))}.values()
    before = [c._attn_implementation for c in configs]
    _STATE = _GateState(alpha, spec.window, spec.sinks)
    try:
        for c in configs:
            c._attn_implementation = GATES_NAME
        out = model(input_ids, use_cache=False, output_hidden_states=True)
    finally:
        for c, impl in zip(configs, before):
            c._attn_implementation = impl
        _STATE = None
    return out.hidden_states[-1]


@dataclass
class GateResult:
    """Trained gates: ``alpha[layer][kv_head]`` in [0, 1], and the loss curve (distillation, L1)."""

    alpha: list[list[float]]
    losses: list[dict] = field(default_factory=list)

    def scores(self, units: Sequence) -> list[float]:
        """α of each unit: a KV head's own, a layer's mean over its heads."""
        return [
            sum(self.alpha[u]) / len(self.alpha[u]) if isinstance(u, int) else self.alpha[u[0]][u[1]]
            for u in units
        ]


def train_gates(
    model: PreTrainedModel,
    prompts: Sequence[torch.Tensor],
    spec: MethodSpec | str,
    *,
    steps: int = 50,
    lr: float = 0.05,
    l1: float = 0.05,
    init: float = 1.0,
    seed: int = 0,
    progress: bool = False,
) -> GateResult:
    """Optimise one gate per KV head on the frozen ``model`` (unpatched: full attention).

    Loss per step (one prompt, in turn): mean squared distance of the gated model's last hidden
    states to full attention's, plus ``l1`` × the mean α. α starts at ``init`` (DuoAttention: 1,
    every head full) and is clamped to [0, 1] after each Adam step.

    Args:
        prompts: token ids ``[1, n]`` (calibration prompts; none an evaluation uses).
        spec: the streaming side, a plain ``swa:W:S``.
    """
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    if spec.kind != "swa" or spec.is_hybrid or spec.window is None:
        raise ValueError(f"gates mix full attention with a plain swa:W:S, got {spec}")
    if not prompts:
        raise ValueError("give at least one calibration prompt")
    torch.manual_seed(seed)
    n_layers, _, kv_heads, _ = kv_geometry(model.config)
    alpha = {i: torch.full((kv_heads,), float(init), requires_grad=True) for i in range(n_layers)}
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    targets = []
    with torch.no_grad():
        for ids in prompts:
            targets.append(model(ids, use_cache=False, output_hidden_states=True).hidden_states[-1].float())
    opt = torch.optim.Adam(alpha.values(), lr=lr)
    losses = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc="gates", unit="step")
    try:
        for step in range(steps):
            k = step % len(prompts)
            hidden = gated_forward(model, prompts[k], alpha, spec).float()
            distill = F.mse_loss(hidden, targets[k])
            reg = torch.stack(list(alpha.values())).mean()
            loss = distill + l1 * reg
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for a in alpha.values():
                    a.clamp_(0.0, 1.0)
            losses.append({"step": step, "distill": float(distill.detach()), "l1": float(reg.detach())})
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        for p in params:
            p.requires_grad_(True)
    return GateResult([a.detach().tolist() for a in alpha.values()], losses)

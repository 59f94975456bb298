"""Trained head gates, DuoAttention's way: which KV heads need full attention, learned on a frozen model.

DuoAttention (arXiv 2410.10819) gives every KV head one gate α ∈ [0, 1] that mixes the head's
full-attention output with its streaming (sinks + recent) output, and optimises the gates alone,
the model frozen, so that the last hidden states stay those of full attention while an L1 term
pulls every α towards 0. Heads whose α stays high are retrieval heads: they keep full attention.

Here the streaming side is SWA(w, s) exactly as the runtime runs it. For each layer attention is
computed twice over the whole calibration prompt through transformers' own SDPA function, and each
query head's output is ``α·full + (1 − α)·swa`` with the α of its KV head. So α = 0 everywhere is
SWA(w, s) and α = 1 is full attention (tested). Two ways to compute the two sides, tested to agree
(hidden states and the gates' gradients):

- the reference (``block=None``): both sides dense, under the n × n masks of
  ``reference.reference_mask``;
- the default (``block=GATE_BLOCK``): the causal side as SDPA's own causal kernel (no mask), and a
  windowed side one block of queries at a time against only the keys that block can see (the
  sinks and the last ``w − s + block`` positions). One gate step on a 4K-token prompt of
  SmolLM2-135M, SWA(256, 4), one thread: 197 CPU-s and 11.3 GiB peak dense, 93 CPU-s and 7.0 GiB
  blocked (``benchmarks/gate_step.py``; most of what is left is the causal side and the autograd
  activations of 30 layers).

A layer with its own sliding window (Gemma 3's local layers) runs as the model runs it: its "full"
side is its native window (what the unpatched model computes), and under ``native_sliding="keep"``
it is not gated at all (it keeps that window, as ``apply(..., native_sliding="keep")`` leaves it),
so only the global layers' heads get gates.

:func:`train_gates` returns α per ``(layer, kv_head)``; ``calibrate --criterion gates`` ranks heads by
it. Calibration prompts come from ``prompts.calibration_prompts`` (a seed no evaluation uses).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ..methods import method_of
from ..runtime.kv_bytes import kv_geometry, native_windows
from ..runtime.reference import reference_mask
from ..runtime.spec import MethodSpec, parse_spec

__all__ = [
    "GATE_BLOCK",
    "GATES_NAME",
    "GateResult",
    "GateTraining",
    "gated_attention",
    "gated_forward",
    "train_gates",
]

logger = logging.getLogger(__name__)

GATES_NAME = "sinkwindow_gates"
# Queries per block of the windowed side (``block=None``: the dense reference).
GATE_BLOCK = 256


@dataclass
class _GateState:
    """What the gated attention reads during a forward: α per gated layer ``[kv_heads]``, the SWA
    shape, and each layer's native window (``None``: a global layer)."""

    alpha: dict[int, torch.Tensor]
    window: int
    sinks: int
    native: list[int | None]
    block: int | None = GATE_BLOCK
    masks: dict = field(default_factory=dict)

    def attend(self, module, query, key, value, window: int | None, sinks: int, **kwargs) -> torch.Tensor:
        """Attention of ``query [B, H, n, d]`` over ``key``/``value`` ``[B, KV, n, d]`` under
        causal (``window=None``) or SWA(window, sinks): ``[B, n, H, d]``."""
        n = query.shape[-2]
        if self.block is None:
            out, _ = sdpa_attention_forward(
                module, query, key, value, self.mask(n, query.device, window, sinks), **kwargs
            )
            return out
        if window is None or window >= n:  # every key in reach: SDPA's causal kernel, no mask
            out, _ = sdpa_attention_forward(module, query, key, value, None, **kwargs)
            return out
        return _banded(module, query, key, value, self.bands(n, query.device, window, sinks), **kwargs)

    def bands(
        self, n: int, device, window: int, sinks: int
    ) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
        """The blocked path's plan over ``n`` queries, the same for every layer so built once:
        per block of queries ``[b0, b1)``, the keys it can see (``[0, s)`` and
        ``[b0 − (w − s) + 1, b1)``) and its ``[1, 1, b1 − b0, keys]`` bool mask, as
        ``reference_mask`` masks those pairs."""
        key = ("bands", n, str(device), window, sinks, self.block)
        if key not in self.masks:
            recent, plan = window - sinks, []
            for b0 in range(0, n, self.block):
                b1 = min(n, b0 + self.block)
                lo = max(0, b0 - recent + 1)  # the oldest recent key any query of the block sees
                keys = (
                    torch.arange(b1)
                    if lo <= sinks
                    else torch.cat([torch.arange(sinks), torch.arange(lo, b1)])
                )
                i, j = torch.arange(b0, b1)[:, None], keys[None, :]
                mask = (j <= i) & ((j < sinks) | (j > i - recent))
                plan.append((b0, b1, keys.to(device), mask[None, None].to(device)))
            self.masks[key] = plan
        return self.masks[key]

    def mask(self, k_len: int, device, window: int | None, sinks: int) -> torch.Tensor:
        """``[1, 1, k_len, k_len]`` bool: causal (``window=None``) or SWA(window, sinks)."""
        key = (k_len, str(device), window, sinks)
        if key not in self.masks:
            self.masks[key] = reference_mask(k_len, window, sinks).to(device)[None, None]
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
    if n != m:
        raise ValueError("the gated forward runs whole prompts without a cache (q_len == k_len)")
    kwargs.pop("sliding_window", None)  # the masks below carry every window
    layer = module.layer_idx
    native = state.native[layer]
    # The unpatched model's own attention: causal, or a local layer's native window SWA(w_native, 0).
    full = state.attend(module, query, key, value, native, 0, **kwargs)
    if layer not in state.alpha:  # a native layer under "keep": not gated, it keeps its window
        return full, None
    swa = state.attend(module, query, key, value, state.window, state.sinks, **kwargs)
    alpha = state.alpha[layer]  # [kv_heads]
    per_query = alpha.repeat_interleave(query.shape[1] // alpha.shape[0]).to(full.dtype)  # [H]
    a = per_query[None, None, :, None]
    return a * full + (1 - a) * swa, None


def _banded(module, query, key, value, bands, **kwargs) -> torch.Tensor:
    """SWA(window, sinks) over a whole prompt, one block of queries at a time against only the keys
    it can see (``_GateState.bands``).

    Args:
        query: ``[B, H, n, d]``; key, value: ``[B, KV, n, d]`` (same n: no cache).

    Returns:
        ``[B, n, H, d]``.
    """
    outs = []
    for b0, b1, keys, mask in bands:
        out, _ = sdpa_attention_forward(
            module, query[:, :, b0:b1], key[:, :, keys], value[:, :, keys], mask, **kwargs
        )
        outs.append(out)
    return torch.cat(outs, dim=1)


AttentionInterface.register(GATES_NAME, gated_attention)


def gated_forward(model: PreTrainedModel, input_ids: torch.Tensor, alpha: dict[int, torch.Tensor],
                  spec: MethodSpec | str, *, block: int | None = GATE_BLOCK) -> torch.Tensor:  # fmt: skip
    """Last hidden states ``[1, n, hidden]`` of ``model`` (unpatched, full attention) with each layer
    of ``alpha`` gated by ``alpha[layer] [kv_heads]`` between the model's own attention and ``spec``'s
    SWA(w, s); a layer missing from ``alpha`` (a native sliding layer under "keep") runs as it is.
    ``block=None`` computes both sides densely (the reference); an int, windows ``block`` queries at
    a time."""
    global _STATE
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    if block is not None and block < 1:
        raise ValueError(f"block is a number of queries (>= 1) or None, got {block}")
    configs = {id(c): c for c in (model.config, model.config.get_text_config(decoder=True))}.values()
    before = [c._attn_implementation for c in configs]
    _STATE = _GateState(alpha, spec.window, spec.sinks, native_windows(model.config), block)
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


@dataclass(frozen=True)
class GateTraining:
    """How :func:`train_gates` trains: ``steps`` Adam steps at ``lr`` with ``l1`` × the mean α added,
    α starting at ``init``, torch seeded with ``seed``; ``block``: :func:`gated_forward`'s (``None``:
    the dense reference); ``native_sliding``: ``"keep"`` leaves native sliding layers ungated on their
    own window (their α stay at ``init`` and count in no loss), as ``apply`` leaves them;
    ``"override"`` gates every layer."""

    steps: int = 50
    lr: float = 0.05
    l1: float = 0.05
    init: float = 1.0
    seed: int = 0
    progress: bool = False
    native_sliding: str = "override"
    block: int | None = GATE_BLOCK


def train_gates(
    model: PreTrainedModel,
    prompts: Sequence[torch.Tensor],
    spec: MethodSpec | str,
    config: GateTraining | None = None,
    *,
    resume: dict | None = None,
    on_step: Callable[[dict], None] | None = None,
    **settings,
) -> GateResult:
    """Optimise one gate per KV head on the frozen ``model`` (unpatched: full attention).

    Loss per step (one prompt, in turn): mean squared distance of the gated model's last hidden
    states to full attention's, plus ``l1`` × the mean α. α starts at ``init`` (DuoAttention: 1,
    every head full) and is clamped to [0, 1] after each Adam step.

    Args:
        prompts: token ids ``[1, n]`` (calibration prompts; none an evaluation uses).
        spec: the streaming side, a plain ``swa:W:S``.
        config: how to train (:class:`GateTraining`); ``settings`` override its fields by name.
        on_step: called after every step with the training state, JSON (``step``: steps done,
            ``alpha``, ``opt``: the optimiser's state, ``losses``). One step on a 4K-token prompt of
            SmolLM2-135M takes about 1.5 CPU-minutes and 7 GiB, so a calibration keeps each state
            (``calibrate``'s memo).
        resume: such a state: the training goes on from it, with the result of one run.
    """
    cfg = replace(config or GateTraining(), **settings)
    steps, init = cfg.steps, cfg.init
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    if not method_of(spec).takes_full_units or spec.is_hybrid:
        raise ValueError(f"gates mix full attention with a plain swa:W:S, got {spec}")
    if not prompts:
        raise ValueError("give at least one calibration prompt")
    torch.manual_seed(cfg.seed)
    n_layers, _, kv_heads, _ = kv_geometry(model.config)
    native = native_windows(model.config)
    gated = [i for i in range(n_layers) if cfg.native_sliding != "keep" or native[i] is None]
    if not gated:
        raise ValueError("every layer slides natively: under native_sliding='keep' there is no head to gate")
    alpha = {i: torch.full((kv_heads,), float(init), requires_grad=True) for i in gated}
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    targets = []
    with torch.no_grad():
        for ids in prompts:
            targets.append(model(ids, use_cache=False, output_hidden_states=True).hidden_states[-1].float())
    opt = torch.optim.Adam(alpha.values(), lr=cfg.lr)
    losses: list[dict] = []
    start = 0
    if resume is not None:
        start, losses = int(resume["step"]), list(resume["losses"])
        with torch.no_grad():
            for i in gated:
                alpha[i].copy_(torch.tensor(resume["alpha"][i], dtype=alpha[i].dtype))
        opt.load_state_dict(_from_json(resume["opt"]))
    bar = None
    if cfg.progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, initial=start, desc="gates", unit="step")
    try:
        for step in range(start, steps):
            k = step % len(prompts)
            hidden = gated_forward(model, prompts[k], alpha, spec, block=cfg.block).float()
            distill = F.mse_loss(hidden, targets[k])
            reg = torch.stack(list(alpha.values())).mean()
            loss = distill + cfg.l1 * reg
            opt.zero_grad()
            loss.backward()
            opt.step()
            with torch.no_grad():
                for a in alpha.values():
                    a.clamp_(0.0, 1.0)
            losses.append({"step": step, "distill": float(distill.detach()), "l1": float(reg.detach())})
            if on_step is not None:
                on_step({"step": step + 1, "alpha": _rows(alpha, n_layers, kv_heads, init),
                         "opt": _to_json(opt.state_dict()), "losses": list(losses)})  # fmt: skip
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
        for p in params:
            p.requires_grad_(True)
    return GateResult(_rows(alpha, n_layers, kv_heads, init), losses)


def _rows(alpha: dict[int, torch.Tensor], n_layers: int, kv_heads: int, init: float) -> list[list[float]]:
    """α per layer, ungated layers at ``init`` so every layer has a row."""
    return [alpha[i].detach().tolist() if i in alpha else [float(init)] * kv_heads for i in range(n_layers)]


def _to_json(obj):
    """An optimiser state dict as JSON: tensors as ``{"tensor": values, "dtype": name}``."""
    if isinstance(obj, torch.Tensor):
        return {"tensor": obj.tolist(), "dtype": str(obj.dtype).removeprefix("torch.")}
    if isinstance(obj, dict):
        return {str(k): [type(k).__name__, _to_json(v)] for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_to_json(v) for v in obj]
    return obj


def _from_json(obj):
    """The inverse of :func:`_to_json` (keys back to their types: Adam's state is keyed by int)."""
    if isinstance(obj, dict) and set(obj) == {"tensor", "dtype"}:
        return torch.tensor(obj["tensor"], dtype=getattr(torch, obj["dtype"]))
    if isinstance(obj, dict):
        return {(int(k) if t == "int" else k): _from_json(v) for k, (t, v) in obj.items()}
    if isinstance(obj, list):
        return [_from_json(v) for v in obj]
    return obj

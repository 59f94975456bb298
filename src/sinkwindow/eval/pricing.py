"""Dry runs: the cells a sweep would run, the tokens they would process, and the GPU time that takes.

:func:`sweep_plan` turns run configs (or model names on a shared base config) into cells
(``runner.plan``), then counts tokens from the token budgets and prices them with explicit
assumptions (:class:`Throughput`). Nothing is loaded or tokenized, so the counts are what the
budgets allow, not what a tokenizer would measure:

- S-NIAH: ``length - 128`` prompt tokens (RULER sizes the haystack with 128 reserved for the
  answer), decoding up to the config's cap (``None``, "auto": ``auto_decode_tokens``).
- BABILong: ``length`` prompt tokens (essay filler up to ``length - 300`` plus the question and
  template), ``babilong_0k_tokens`` at 0K; up to 20 decoded.
- Perplexity: ``length`` tokens of prefill per window, nothing decoded.

Decoding is counted to the cap for every row, so decode tokens and time are upper bounds (a run
stops at EOS). Time is prefill at a fraction of the GPU's peak FLOPs (2 FLOPs per parameter per
token; attention's own FLOPs, a few percent to ~20% at 4K, are left out) plus one decode step per
generated position of a cell, each the time to read the weights or a fixed per-step overhead,
whichever is larger (a cell's rows decode together). A model too large for one GPU is spread over
``gpus`` of them (``device_map="auto"``: layers in sequence, so no faster), and GPU-hours count
every GPU held.

:data:`PAPER_MODELS` lists the 11 base models of the paper's comparison and :func:`paper_configs`
the long-context grid the paper ran on Llama-3.1-8B, so ``sweep_plan(PAPER_MODELS)`` prices that
grid on all eleven.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

from .runner import EvalConfig, plan
from .tasks import BABILONG_TASKS, NIAH_TASKS, TASKS

__all__ = [
    "PaperModel",
    "PAPER_MODELS",
    "PAPER_LONG_METHODS",
    "KNOWN_SIZES",
    "KNOWN_CONTEXTS",
    "Throughput",
    "paper_configs",
    "cell_tokens",
    "sweep_plan",
    "format_sweep_plan",
]


@dataclass(frozen=True)
class PaperModel:
    """One base model of the paper's comparison.

    Attributes:
        params_b: parameters, in billions (from the model card).
        context: the context length it was trained for (``max_position_embeddings``).
        source: ``"named"`` where the paper's summaries name the model; otherwise the inference
            that puts it in the list (the summaries give the count, 11, the range and the
            families, not every name).
    """

    name: str
    hub_id: str
    params_b: float
    context: int
    family: str
    source: str


# The paper: 11 base models "from Phi-1.5-1.3B to Qwen2.5-72B-Instruct and Llama-3.1-70B", families
# Phi, Mistral, Llama, Qwen, QwQ, each compared against the retrofits published for it. The
# summaries name eight; the other three are the bases of the compared retrofits they leave
# unnamed. Phi-1.5 was trained on 2K contexts: its 4K cells run past it (``sweep_plan`` says so).
PAPER_MODELS: tuple[PaperModel, ...] = (
    PaperModel("Phi-1.5", "microsoft/phi-1_5", 1.42, 2048, "phi", "named"),
    PaperModel("Llama-3.2-3B", "meta-llama/Llama-3.2-3B", 3.21, 131072, "llama", "inferred: Llamba's base"),
    PaperModel("Llama-2-7B", "meta-llama/Llama-2-7b-hf", 6.74, 4096, "llama", "named (DiJiang's base)"),
    PaperModel(
        "Mistral-7B", "mistralai/Mistral-7B-v0.1", 7.24, 32768, "mistral", "named family (SUPRA, LoLCATs)"
    ),
    PaperModel(
        "Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct", 7.62, 32768, "qwen", "inferred: ARWKV's base"
    ),
    PaperModel(
        "Llama-3-8B",
        "meta-llama/Meta-Llama-3-8B",
        8.03,
        8192,
        "llama",
        "inferred: LoLCATs, Liger, Mamba-in-Llama",
    ),
    PaperModel("Llama-3.1-8B", "meta-llama/Llama-3.1-8B", 8.03, 131072, "llama", "named (long-context runs)"),
    PaperModel("Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B-Instruct", 32.8, 32768, "qwen", "named (QRWKV6)"),
    PaperModel("QwQ-32B", "Qwen/QwQ-32B", 32.8, 40960, "qwen", "named family (QRWKV6)"),
    PaperModel("Llama-3.1-70B", "meta-llama/Llama-3.1-70B", 70.6, 131072, "llama", "named"),
    PaperModel("Qwen2.5-72B-Instruct", "Qwen/Qwen2.5-72B-Instruct", 72.7, 32768, "qwen", "named"),
)

# Parameters (billions) by model name, for names given as plain strings.
KNOWN_SIZES: dict[str, float] = {
    "smollm2-135m": 0.135,
    "gemma3-270m": 0.268,
    "qwen2.5-coder-0.5b": 0.494,
    **{m.hub_id: m.params_b for m in PAPER_MODELS},
    **{m.name: m.params_b for m in PAPER_MODELS},
}

# Trained context lengths by model name, to flag lengths past them.
KNOWN_CONTEXTS: dict[str, int] = {
    "smollm2-135m": 8192,
    "gemma3-270m": 32768,
    "qwen2.5-coder-0.5b": 32768,
    **{m.hub_id: m.context for m in PAPER_MODELS},
    **{m.name: m.context for m in PAPER_MODELS},
}

# The paper's long-context methods: full attention and SWA(w, 4) at the three windows it reports.
PAPER_LONG_METHODS = ("full", "swa:128:4", "swa:256:4", "swa:512:4")


def paper_configs(model: str, *, methods: Iterable[str] = PAPER_LONG_METHODS) -> list[EvalConfig]:
    """The paper's long-context grid for ``model``: S-NIAH-1/2/3 and BABILong QA1-5.

    S-NIAH at 0.5K-4K with 500 samples each (RULER's default; the paper's scores are multiples of
    0.2), BABILong at 0K-4K with its 100-question subset; bf16 on cuda. Two configs, since one
    config draws one sample count for every task.
    """
    common = dict(model=model, methods=list(methods), device="cuda", dtype="bfloat16", seed=42)
    return [
        EvalConfig(**common, tasks=list(NIAH_TASKS), lengths=[512, 1024, 2048, 4096], samples=500),
        EvalConfig(
            **common,
            tasks=list(BABILONG_TASKS),
            lengths=[0, 1024, 2048, 4096],
            babilong_lengths=[0, 1024, 2048, 4096],
            samples=100,
        ),
    ]


@dataclass(frozen=True)
class Throughput:
    """What a dry run assumes about the hardware and the software's efficiency on it.

    The defaults are one H100 SXM (80 GB, 989 dense bf16 TFLOP/s, 3.35 TB/s) running transformers'
    eager decoding loop.

    Attributes:
        prefill_mfu: the fraction of peak FLOPs prefill reaches.
        bandwidth_efficiency: the fraction of memory bandwidth a decode step reaches.
        decode_step_overhead_s: the least a decode step takes, whatever the model (Python,
            kernel launches: transformers' per-token loop).
        bytes_per_param: 2 for bf16 weights.
        memory_headroom: the weights times this must fit on the GPUs (KV cache, activations).
        auto_decode_tokens: S-NIAH decode tokens when the cap is ``None`` (the answer + 16).
        babilong_0k_tokens: prompt tokens of a BABILong sample at 0K (facts and question only).
    """

    gpu: str = "H100-80GB"
    gpu_memory_gb: float = 80.0
    peak_tflops: float = 989.0
    prefill_mfu: float = 0.3
    memory_tb_per_s: float = 3.35
    bandwidth_efficiency: float = 0.6
    decode_step_overhead_s: float = 0.03
    bytes_per_param: float = 2.0
    memory_headroom: float = 1.3
    auto_decode_tokens: int = 32
    babilong_0k_tokens: int = 300

    def gpus(self, params_b: float) -> int:
        """GPUs one model copy needs."""
        need = params_b * 1e9 * self.bytes_per_param * self.memory_headroom
        return max(1, math.ceil(need / (self.gpu_memory_gb * 1e9)))

    def prefill_seconds(self, params_b: float, tokens: int) -> float:
        return 2 * params_b * 1e9 * tokens / (self.peak_tflops * 1e12 * self.prefill_mfu)

    def decode_seconds(self, params_b: float, steps: int) -> float:
        read = (
            params_b * 1e9 * self.bytes_per_param / (self.memory_tb_per_s * 1e12 * self.bandwidth_efficiency)
        )
        return steps * max(read, self.decode_step_overhead_s)


def cell_tokens(config: EvalConfig, cell, throughput: Throughput = Throughput()) -> tuple[int, int, int]:
    """``(prompt tokens, decoded tokens, decode steps)`` of one cell, from its token budgets."""
    rows = len(cell.indices)
    prompt, cap = TASKS[cell.task].token_budget(config, cell.length, throughput)
    return rows * prompt, rows * cap, cap


def _as_configs(item, base: EvalConfig | None) -> tuple[list[EvalConfig], float | None]:
    if isinstance(item, EvalConfig):
        return [item], KNOWN_SIZES.get(item.model)
    if isinstance(item, PaperModel):
        configs = (
            paper_configs(item.hub_id) if base is None else [dataclasses.replace(base, model=item.hub_id)]
        )
        return configs, item.params_b
    if isinstance(item, str):
        configs = paper_configs(item) if base is None else [dataclasses.replace(base, model=item)]
        return configs, KNOWN_SIZES.get(item)
    raise ValueError(f"sweep_plan takes EvalConfigs, model names or PaperModels, got {type(item).__name__}")


def sweep_plan(
    configs_or_models: Iterable[EvalConfig | str | PaperModel],
    *,
    base: EvalConfig | None = None,
    throughput: Throughput = Throughput(),
    params_b: Mapping[str, float] | None = None,
) -> dict:
    """Cells, tokens and GPU-hours of a sweep, without loading anything.

    Args:
        configs_or_models: run configs as they are, or models (names, hub ids, :class:`PaperModel`)
            run with ``base`` (``None``: :func:`paper_configs`).
        throughput: the assumptions; they are returned with the plan.
        params_b: model sizes in billions of parameters, for models :data:`KNOWN_SIZES` lacks
            (a model of unknown size gets token counts but no hours).

    Returns:
        ``{"assumptions", "models": [per model: model, params_b, gpus, cells, samples,
        prompt_tokens, decode_tokens, hours, gpu_hours, past_context], "total": {...}}``;
        ``hours`` is the time on one model copy, ``gpu_hours`` that times its ``gpus``, and
        ``past_context`` the lengths beyond the context the model was trained for.
    """
    sizes = {**KNOWN_SIZES, **(params_b or {})}
    per_model: dict[str, dict] = {}
    for item in configs_or_models:
        configs, size = _as_configs(item, base)
        for config in configs:
            size_here = sizes.get(config.model, size)
            entry = per_model.setdefault(
                config.model,
                {
                    "model": config.model,
                    "params_b": size_here,
                    "gpus": throughput.gpus(size_here) if size_here else None,
                    "cells": 0,
                    "samples": 0,
                    "prompt_tokens": 0,
                    "decode_tokens": 0,
                    "hours": 0.0 if size_here else None,
                    "gpu_hours": 0.0 if size_here else None,
                    "past_context": [],
                },
            )
            context = KNOWN_CONTEXTS.get(config.model)
            for cell in plan(config):
                prompt, decoded, steps = cell_tokens(config, cell, throughput)
                entry["cells"] += 1
                entry["samples"] += len(cell.indices)
                entry["prompt_tokens"] += prompt
                entry["decode_tokens"] += decoded
                if context is not None and cell.length > context and cell.length not in entry["past_context"]:
                    entry["past_context"].append(cell.length)
                if size_here:
                    seconds = throughput.prefill_seconds(size_here, prompt) + throughput.decode_seconds(
                        size_here, steps
                    )
                    entry["hours"] += seconds / 3600
                    entry["gpu_hours"] += seconds / 3600 * entry["gpus"]
    models = list(per_model.values())
    known = [m for m in models if m["gpu_hours"] is not None]
    total = {
        "models": len(models),
        "cells": sum(m["cells"] for m in models),
        "samples": sum(m["samples"] for m in models),
        "prompt_tokens": sum(m["prompt_tokens"] for m in models),
        "decode_tokens": sum(m["decode_tokens"] for m in models),
        "gpu_hours": sum(m["gpu_hours"] for m in known),
        "unsized_models": [m["model"] for m in models if m["gpu_hours"] is None],
    }
    return {"assumptions": asdict(throughput), "models": models, "total": total}


def format_sweep_plan(plan_: dict) -> str:
    """A Markdown table of :func:`sweep_plan`'s result, with its assumptions under it."""

    def num(x) -> str:
        return "?" if x is None else f"{x:,}" if isinstance(x, int) else f"{x:,.1f}"

    lines = [
        "| model | params (B) | GPUs | cells | samples | prompt tokens | decode tokens (max) | GPU-hours |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in plan_["models"]:
        lines.append(
            f"| {m['model']} | {num(m['params_b'])} | {num(m['gpus'])} | {num(m['cells'])} | "
            f"{num(m['samples'])} | {num(m['prompt_tokens'])} | {num(m['decode_tokens'])} | {num(m['gpu_hours'])} |"
        )
    t = plan_["total"]
    lines.append(
        f"| **total** ({t['models']} models) | | | {num(t['cells'])} | {num(t['samples'])} | "
        f"{num(t['prompt_tokens'])} | {num(t['decode_tokens'])} | {num(t['gpu_hours'])} |"
    )
    a = plan_["assumptions"]
    lines.append(
        f"\nAssumed: {a['gpu']} ({a['gpu_memory_gb']:g} GB, {a['peak_tflops']:g} TFLOP/s, "
        f"{a['memory_tb_per_s']:g} TB/s); prefill at {a['prefill_mfu']:.0%} of peak; decode steps at "
        f"{a['bandwidth_efficiency']:.0%} of bandwidth, at least {a['decode_step_overhead_s'] * 1000:g} ms each; "
        f"{a['bytes_per_param']:g} bytes/parameter x {a['memory_headroom']:g} headroom per GPU. Decoding "
        f"counted to the cap (an upper bound)."
    )
    for m in plan_["models"]:
        if m["past_context"]:
            lengths = ", ".join(str(n) for n in sorted(m["past_context"]))
            lines.append(f"{m['model']}: lengths {lengths} are past the context it was trained for.")
    if t["unsized_models"]:
        lines.append(f"No size known for {', '.join(t['unsized_models'])}: give params_b for GPU-hours.")
    return "\n".join(lines)

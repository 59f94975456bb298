"""What ``sinkwindow train`` trains, stage by stage: the recipe of each spec and ``train_baseline``.

Which stages run, and the LoRA settings, come from the spec (``recipe_for``): ``lolcats:W`` and
``linear`` run attention transfer then LoRA on q/k/v/o (alpha 16, lr 1e-4); ``liger:W`` has no
feature maps to transfer and runs a single LoRA stage on q/k/v (alpha 8, lr 1e-3); ``swa:W:S``
trains LoRA on the unmodified attention (the equal-budget control). Each stage runs through the
resumable loop of ``train/stage.py``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from ..linear.attention import DEFAULT_WINDOW_FACTOR
from ..linear.checkpoint import load_checkpoint, read_metadata, save_checkpoint
from ..linear.lora import DEFAULT_LORA, LIGER_LORA
from ..methods import method_of
from ..runs.folder import RunLock
from ..runs.session_log import start_session
from .data import load_training_data
from .plateau import plateau
from .stage import StageConfig, StageResult, run_stage

__all__ = ["Recipe", "TrainConfig", "recipe_for", "train_baseline"]

logger = logging.getLogger(__name__)

StepFn = Callable[..., dict]


@dataclass(frozen=True)
class Recipe:
    """How a baseline trains, by spec kind (what ``train_baseline`` uses where it is not told).

    Attributes:
        stages: ``("transfer", "finetune")`` or ``("finetune",)``.
        lr_finetune: AdamW learning rate of the LoRA stage.
        lora_alpha: LoRA scale numerator (scale = alpha / r).
        lora_targets: attention projections that get LoRA (those a family lacks are skipped).
    """

    stages: tuple[str, ...]
    lr_finetune: float
    lora_alpha: float
    lora_targets: tuple[str, ...]


def recipe_for(spec: str) -> Recipe:
    """The training recipe of a linear baseline: LoLCATs' two stages, or Liger's single LoRA stage."""
    method = method_of(spec)
    if not method.trainable:
        raise ValueError(f"{spec} is not trained: train lolcats:W, liger:W, linear, or swa:W:S (SWA + LoRA)")
    lora = DEFAULT_LORA if method.feature_maps or method.adapter == "lora" else LIGER_LORA
    # A recipe with an attention transfer fine-tunes at 1e-4 after it; LoRA alone (Liger, and the
    # SWA control: lolcats:W's stage 2 as it was run, benchmarks/training/README.md) at 1e-3.
    lr = 1e-4 if "transfer" in method.train_stages else 1e-3
    return Recipe(method.train_stages, lr, lora["alpha"], tuple(lora["targets"]))


# Feature-map options every ``sinkwindow train`` passes, at values that mean "not set". Liger has no
# feature maps, so these are dropped for it; any other value is passed on and refused by ``convert``.
_UNSET_FEATURE_OPTIONS = {
    "feature_map": ("hedgehog", None),
    "feature_dim": (None,),
    "init": ("identity",),
    "affine": (False,),
    "window_factor_init": (DEFAULT_WINDOW_FACTOR,),
}


def _convert_options(spec: str, options: dict | None) -> dict:
    opts = dict(options or {})
    if not method_of(spec).feature_maps:
        for name, unset in _UNSET_FEATURE_OPTIONS.items():
            if name in opts and opts[name] in unset:
                del opts[name]
    return opts


def _start_from(model: PreTrainedModel, path: str | os.PathLike) -> dict:
    """Load a stage-1 checkpoint into a converted ``model``; return what to record of it.

    Raises:
        ValueError: the checkpoint holds LoRA (a finished run, not a stage-1 state) or another variant.
    """
    from ..linear.adapters import file_sha256
    from ..linear.checkpoint import resolve_checkpoint

    p = resolve_checkpoint(path)
    meta = read_metadata(p)
    if meta.get("lora"):
        raise ValueError(f"{p} holds LoRA adapters: start from a stage-1 (transfer) checkpoint instead")
    load_checkpoint(model, p)
    return {"file": p.name, "sha256": file_sha256(p), "spec": meta["spec"], "steps": meta.get("step")}


@dataclass
class TrainConfig:
    """How ``train_baseline`` trains (what ``sinkwindow train``'s flags set).

    Attributes:
        data: ``"essays"``, a JSONL/.txt path (``train.data.load_training_data``), or ``None``.
        transfer_tokens, finetune_tokens: stage budgets; ``finetune_tokens=0`` skips stage 2.
        batch_size: packed chunks per micro-batch (LoLCATs: 1; a GPU takes more, at the same tokens
            per optimiser step when ``grad_accum`` shrinks by as much).
        lr_finetune, lora_alpha, lora_targets: ``None`` takes the spec's recipe (``recipe_for``):
            1e-4, 16, q/k/v/o for LoLCATs and Hedgehog; 1e-3, 8, q/k/v for Liger.
        convert_options: keyword arguments of ``convert``. For Liger the feature-map options at
            their unset values (what the CLI always passes) are dropped.
        start_from: a stage-1 checkpoint of the same spec (feature maps and window factors, no
            LoRA) that a fresh run starts from instead of the initialisation, e.g. the paper
            recipe's attention transfer continued on longer sequences. Ignored once the run has
            saved state of its own (a resume continues from that).
        lr_transfer_drop_at, lr_finetune_drop_at: the stage's optimiser step from which its
            learning rate is cut once by the plateau schedule's factor (``StageConfig.lr_drop_at``);
            ``None`` leaves the schedule to the plateau rule alone, as the recipes do.
        max_minutes: stop resumably after this long (over both stages).
        resume: continue a run found in the folder; ``False`` starts over.
        model_name: what checkpoints record as the model (a registry name, not a machine path).
        gradient_checkpointing: stage 2 recomputes each decoder layer's forward during the backward
            pass (transformers' own gradient checkpointing) instead of keeping its activations: the
            same losses, far less memory on long chunks, more compute. Not a result-changing setting.
    """

    data: str | None = "essays"
    transfer_tokens: int = 1_000_000
    finetune_tokens: int = 2_000_000
    seq_len: int = 1024
    grad_accum: int = 8
    batch_size: int = 1
    lr_transfer: float = 1e-2
    lr_finetune: float | None = None
    lr_transfer_drop_at: int | None = None
    lr_finetune_drop_at: int | None = None
    eval_every: int = 100
    save_every: int = 10
    val_batches: int = 8
    lora_r: int = 8
    lora_alpha: float | None = None
    lora_targets: list[str] | tuple[str, ...] | None = None
    layer_group: int | None = None
    max_minutes: float | None = None
    resume: bool = True
    progress: bool = True
    convert_options: dict | None = None
    model_name: str | None = None
    start_from: str | os.PathLike | None = None
    gradient_checkpointing: bool = False


def train_baseline(
    model: PreTrainedModel,
    tokenizer,
    spec: str,
    out_dir: str | os.PathLike,
    config: TrainConfig | None = None,
) -> dict:
    """Convert ``model`` to ``spec`` and train it in its recipe's stages; write ``out_dir/model.safetensors``.

    For ``lolcats:W`` and ``linear``, stage 1 (attention transfer) trains feature maps and γ on
    ``transfer_tokens``; stage 2 trains LoRA (r = ``lora_r``) on q/k/v/o with next-token loss on
    ``finetune_tokens`` (0 skips it). Both read the same packed chunks from the start, as LoLCATs
    does. ``liger:W`` has no stage 1 (``transfer_tokens`` is ignored) and trains LoRA on q/k/v on
    ``finetune_tokens``. Rerunning with the same folder resumes where the last session stopped.

    Returns:
        The run summary (also ``out_dir/summary.json``); ``"finished"`` is False when
        ``max_minutes`` ran out first.

    Raises:
        ValueError: Liger with no ``finetune_tokens`` (it has nothing else to train).
    """
    from ..linear.convert import convert, is_converted

    cfg = _resolved(spec, config or TrainConfig())
    recipe = recipe_for(spec)
    out = Path(out_dir)
    # One writer per run folder: two trainers on one folder would interleave their saves. (A run
    # refused below, e.g. on unreadable data, leaves no folder: RunLock removes one it made empty.)
    with RunLock(out):
        t_start = time.perf_counter()
        packed = load_training_data(
            tokenizer,
            cfg.data,
            seq_len=cfg.seq_len,
            max_train_tokens=max(cfg.transfer_tokens, cfg.finetune_tokens),
            val_chunks=cfg.val_batches,
        )
        device = next(model.parameters()).device.type
        start_session(out, device=device, spec=str(spec), threads=torch.get_num_threads())
        record = _run_record(spec, cfg, packed.info, list(recipe.stages), device)
        if not is_converted(model):
            convert(model, spec, **cfg.convert_options)
        if cfg.start_from is not None:
            record["start_from"] = _start_from(model, cfg.start_from)
        (out / "config.json").write_text(json.dumps(record, indent=2))
        meta = {"data": packed.info, "model_name": cfg.model_name, "start_from": record.get("start_from")}

        def remaining() -> float | None:
            spent = (time.perf_counter() - t_start) / 60
            return None if cfg.max_minutes is None else max(0.0, cfg.max_minutes - spent)

        summary: dict = {"spec": str(spec), "model": cfg.model_name, "data": packed.info, "stages": {}}
        finished, resume2 = True, cfg.resume
        if "transfer" in recipe.stages:
            r1, resume2 = _transfer_stage(model, packed, cfg, out, meta, remaining())
            summary["stages"]["transfer"] = asdict(r1) | {"plateau": plateau(out / "transfer" / "log.jsonl")}
            finished = r1.finished
        if finished and cfg.finetune_tokens > 0:
            r2 = _finetune_stage(model, packed, cfg, out, meta, remaining(), resume2)
            summary["stages"]["finetune"] = asdict(r2) | {"plateau": plateau(out / "finetune" / "log.jsonl")}
            finished = r2.finished
        summary["finished"] = finished
        summary["session_wall_s"] = round(time.perf_counter() - t_start, 1)
        if finished:
            tokens = {k: v["tokens"] for k, v in summary["stages"].items()}
            ckpt = save_checkpoint(
                model, out / "model.safetensors", **meta, budget=tokens, stages=summary["stages"]
            )
            summary["checkpoint"] = str(ckpt)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary


def _run_record(spec: str, cfg: TrainConfig, data: dict, stages: list[str], device: str) -> dict:
    """What ``config.json`` records about a run: everything that produced its checkpoint."""
    return {
        "spec": str(spec),
        "model": cfg.model_name,
        "data": data,
        **{
            k: getattr(cfg, k)
            for k in (
                "transfer_tokens",
                "finetune_tokens",
                "seq_len",
                "grad_accum",
                "batch_size",
                "gradient_checkpointing",
                "lr_transfer",
                "lr_finetune",
                "lr_transfer_drop_at",
                "lr_finetune_drop_at",
            )
        },
        "lora": {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "targets": list(cfg.lora_targets)},
        "stages": stages,
        "convert_options": cfg.convert_options,
        "threads": torch.get_num_threads(),
        "device": device,
    }


def _resolved(spec: str, cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the recipe's values where it leaves them unset, and no stage-1 budget for a
    recipe without stage 1."""
    from dataclasses import replace

    recipe = recipe_for(spec)
    cfg = replace(
        cfg,
        lr_finetune=recipe.lr_finetune if cfg.lr_finetune is None else cfg.lr_finetune,
        lora_alpha=recipe.lora_alpha if cfg.lora_alpha is None else cfg.lora_alpha,
        lora_targets=list(recipe.lora_targets if cfg.lora_targets is None else cfg.lora_targets),
        convert_options=_convert_options(spec, cfg.convert_options),
    )
    if "transfer" not in recipe.stages:
        if cfg.lr_transfer_drop_at is not None:
            raise ValueError(f"{spec} has no attention-transfer stage: drop lr_transfer_drop_at")
        if cfg.finetune_tokens <= 0:
            raise ValueError(f"{spec} trains only LoRA (no attention transfer): give finetune_tokens > 0")
        if cfg.transfer_tokens:
            logger.info(
                "%s has no attention-transfer stage; ignoring transfer_tokens=%d", spec, cfg.transfer_tokens
            )
        cfg = replace(cfg, transfer_tokens=0)
    for stage, lr, tokens, at in (
        ("transfer", cfg.lr_transfer, cfg.transfer_tokens, cfg.lr_transfer_drop_at),
        ("finetune", cfg.lr_finetune, cfg.finetune_tokens, cfg.lr_finetune_drop_at),
    ):
        # Before the model is converted or a folder written; run_stage checks it again on the data.
        if at is not None and tokens > 0:
            _stage_config(stage, lr, tokens, cfg, None, at).check_lr_drop(cfg.seq_len)
    return cfg


def _stage_config(
    stage: str, lr: float, tokens: int, cfg: TrainConfig, max_minutes: float | None, lr_drop_at: int | None
) -> StageConfig:
    return StageConfig(
        stage, lr=lr, tokens=tokens, grad_accum=cfg.grad_accum, batch_size=cfg.batch_size, eval_every=cfg.eval_every,
        save_every=cfg.save_every, val_batches=cfg.val_batches, max_minutes=max_minutes, lr_drop_at=lr_drop_at,
    )  # fmt: skip


def _transfer_stage(
    model, packed, cfg: TrainConfig, out: Path, meta: dict, max_minutes
) -> tuple[StageResult, bool]:
    """Stage 1, attention transfer: its result, and whether stage 2 may resume (not after stage 1
    was extended: stage 2 was trained on top of the old stage-1 maps, so it starts over)."""
    from .transfer import prepare_transfer, transfer_step

    params = prepare_transfer(model)
    s1 = _stage_config(
        "transfer", cfg.lr_transfer, cfg.transfer_tokens, cfg, max_minutes, cfg.lr_transfer_drop_at
    )

    def step1(m, x, y, scale=1.0, backward=True):
        return transfer_step(m, x, y, scale=scale, backward=backward, layer_group=cfg.layer_group)

    done1 = out / "transfer" / "done.json"
    steps_before = json.loads(done1.read_text())["steps"] if cfg.resume and done1.exists() else None
    r1 = run_stage(
        model, params, step1, packed, s1, out / "transfer", meta, resume=cfg.resume, progress=cfg.progress
    )
    return r1, cfg.resume and (steps_before is None or steps_before == r1.steps)


def _finetune_stage(
    model, packed, cfg: TrainConfig, out: Path, meta: dict, max_minutes, resume: bool
) -> StageResult:
    """Stage 2: LoRA on the frozen (converted) model, next-token loss."""
    from ..linear.lora import add_lora, lora_parameters
    from .finetune import lm_step

    for p in model.parameters():
        p.requires_grad_(False)
    add_lora(model, r=cfg.lora_r, alpha=cfg.lora_alpha, targets=cfg.lora_targets)
    s2 = _stage_config(
        "finetune", cfg.lr_finetune, cfg.finetune_tokens, cfg, max_minutes, cfg.lr_finetune_drop_at
    )
    params = lora_parameters(model)
    if cfg.gradient_checkpointing:
        # Non-reentrant: the frozen base gives the checkpointed inputs no grad, which the reentrant form needs.
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    try:
        return run_stage(
            model, params, lm_step, packed, s2, out / "finetune", meta, resume=resume, progress=cfg.progress
        )
    finally:
        if cfg.gradient_checkpointing:
            model.activation_checkpointing_disable()

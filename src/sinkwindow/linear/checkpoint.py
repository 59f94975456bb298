"""Checkpoints of trained baselines: only the retrofit's tensors, plus what built them.

One ``.safetensors`` file holds the feature maps, window factors and LoRA weights (never the base
model's weights, like LoLCATs ``save_trainable_weights``; a ``liger:W`` file holds only LoRA, as
Liger adds no other parameters); its metadata holds a JSON document with the variant (kind,
window, feature map, activation, init, feature dim, affine, eps, and Liger's mix and gate), the LoRA
settings, the base model's shape signature and training facts (stage, steps, tokens, data, losses).
Loading converts a fresh model from that metadata, so a checkpoint cannot be loaded into the wrong
variant (docs/linear.md §7.4, §8).

A checkpoint path is a file, or a folder: a training run (``model.safetensors``, else the best
stage checkpoint inside) or a stage folder (``best.safetensors``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from transformers import PreTrainedModel

from ..models.packaged import packaged_name
from ..runtime.attributes import MODEL_NAME_ATTR
from ..runtime.capability import text_config
from ..runtime.spec import MethodSpec, parse_spec
from .attention import LinearVariant
from .convert import convert, get_retrofit, is_converted

__all__ = [
    "FORMAT",
    "load_checkpoint",
    "load_linear",
    "model_signature",
    "read_metadata",
    "resolve_checkpoint",
    "retrofit_state_dict",
    "save_checkpoint",
]

logger = logging.getLogger(__name__)

FORMAT = "sinkwindow-linear/1"
META_KEY = "sinkwindow_linear"
_RETROFIT_MARKERS = (".feature_map_q.", ".feature_map_k.", ".window_factors", ".lora_")
_CANDIDATES = (
    "model.safetensors",
    "finetune/best.safetensors",
    "transfer/best.safetensors",
    "best.safetensors",
    "last.safetensors",
)


def retrofit_state_dict(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The tensors a conversion added (feature maps, window factors, LoRA), by parameter name."""
    return {n: p.detach() for n, p in model.named_parameters() if any(m in n for m in _RETROFIT_MARKERS)}


def model_signature(model: PreTrainedModel) -> dict:
    """Shape facts a checkpoint must agree with, plus the model's name for the record."""
    cfg = text_config(model)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {
        "model_type": cfg.model_type,
        "num_hidden_layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
        "head_dim": head_dim,
        "vocab_size": cfg.vocab_size,
        # A packaged model records its registry name: its paths belong to one machine.
        "name_or_path": getattr(model, MODEL_NAME_ATTR, None)
        or str(getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "")),
    }


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """The ``.safetensors`` file a path names (a file, a training run folder or a stage folder).

    Raises:
        FileNotFoundError: nothing usable at ``path``.
    """
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if p.is_dir():
        for name in _CANDIDATES:
            if (p / name).is_file():
                return p / name
        raise FileNotFoundError(f"no checkpoint in {p} (looked for {', '.join(_CANDIDATES)})")
    raise FileNotFoundError(f"no checkpoint at {p}")


def save_checkpoint(model: PreTrainedModel, path: str | os.PathLike, **extra) -> Path:
    """Write the retrofit tensors and metadata of a converted model to ``path`` (atomically).

    Args:
        model: a converted model.
        path: a ``.safetensors`` file, or a folder (the file is then ``model.safetensors``).
        **extra: JSON-serialisable training facts stored with the metadata.

    Returns:
        The file written.
    """
    from safetensors.torch import save_file

    rf = get_retrofit(model)
    p = Path(path)
    if p.suffix != ".safetensors":
        p = p / "model.safetensors"
    p.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        "spec": str(rf.variant.spec),
        "variant": rf.variant.to_dict(),
        "lora": rf.lora,
        "model": model_signature(model),
        **extra,
    }
    tensors = {n: t.contiguous().cpu() for n, t in retrofit_state_dict(model).items()}
    tmp = p.with_name(p.name + ".tmp")
    save_file(tensors, str(tmp), metadata={META_KEY: json.dumps(meta)})
    os.replace(tmp, p)
    return p


def read_metadata(path: str | os.PathLike) -> dict:
    """The JSON metadata of a checkpoint.

    Raises:
        ValueError: the file is not a sinkwindow linear-baseline checkpoint.
    """
    from safetensors import safe_open

    p = resolve_checkpoint(path)
    try:
        with safe_open(str(p), framework="pt") as f:
            raw = (f.metadata() or {}).get(META_KEY)
    except Exception as err:  # noqa: BLE001 - SafetensorError and OSError alike: the file is unusable
        raise ValueError(
            f"{p} is not a readable safetensors checkpoint ({type(err).__name__}: {err}): it is not a "
            f"safetensors file, or it is damaged (empty, truncated); give a checkpoint that sinkwindow train wrote"
        ) from err
    if raw is None:
        raise ValueError(f"{p} is not a sinkwindow linear-baseline checkpoint (no {META_KEY!r} metadata)")
    meta = json.loads(raw)
    if meta.get("format") != FORMAT:
        raise ValueError(f"{p} has format {meta.get('format')!r}; this version reads {FORMAT!r}")
    return meta


def _check_signature(model: PreTrainedModel, meta: dict, path: Path) -> None:
    want, have = meta["model"], model_signature(model)
    bad = [k for k in want if k != "name_or_path" and want[k] != have.get(k)]
    if bad:
        diffs = ", ".join(f"{k}: checkpoint {want[k]} vs model {have.get(k)}" for k in bad)
        raise ValueError(f"{path} was trained on a different model ({diffs})")
    trained_on, loading_into = want.get("name_or_path"), have["name_or_path"]
    if trained_on and loading_into and _identity(trained_on) != _identity(loading_into):
        logger.warning("%s was trained on %s, loading into %s", path, trained_on, loading_into)


def _identity(name_or_path: str) -> str:
    """A packaged model's registry name whatever path it was loaded from (site-packages, the
    conversion cache: paths that differ between machines); anything else as given."""
    return packaged_name(name_or_path) or name_or_path


def load_checkpoint(model: PreTrainedModel, path: str | os.PathLike, strict: bool = True) -> dict:
    """Load a trained baseline into ``model``, converting it (and adding LoRA) as the checkpoint says.

    Args:
        model: an unconverted model, or one already converted to the checkpoint's variant.
        path: checkpoint file or folder (``resolve_checkpoint``).
        strict: require the checkpoint's tensors and the model's retrofit tensors to match exactly.

    Returns:
        The checkpoint's metadata.

    Raises:
        ValueError: wrong model, wrong variant, or tensors that do not match.
    """
    from safetensors.torch import load_file

    p = resolve_checkpoint(path)
    meta = read_metadata(p)
    _check_signature(model, meta, p)
    variant = LinearVariant.from_dict(meta["variant"])
    if is_converted(model):
        have = get_retrofit(model).variant
        if have != variant:
            raise ValueError(f"model is converted to {have}, but {p} holds {variant}")
    else:
        opts = variant.to_dict()
        kind, window = opts.pop("kind"), opts.pop("window")
        convert(model, MethodSpec(kind, window=window, sinks=opts.pop("sinks", 0)), **opts)
    rf = get_retrofit(model)
    if meta.get("lora") and rf.lora is None:
        from .lora import add_lora  # noqa: PLC0415 - peft is optional

        lora = meta["lora"]
        add_lora(
            model, r=lora["r"], alpha=lora["alpha"], dropout=lora.get("dropout", 0.0), targets=lora["targets"]
        )
    try:
        tensors = load_file(str(p))
    except Exception as err:  # noqa: BLE001 - a header that reads but data that does not
        raise ValueError(
            f"{p} holds a header but its tensors cannot be read ({type(err).__name__}: {err}): export or train it again"
        ) from err
    params = dict(model.named_parameters())
    own = set(retrofit_state_dict(model))
    missing, unexpected = sorted(own - set(tensors)), sorted(set(tensors) - set(params))
    if strict and (missing or unexpected):
        raise ValueError(f"{p} does not match the model: missing {missing[:4]}, unexpected {unexpected[:4]}")
    with torch.no_grad():
        for name, t in tensors.items():
            if name in params:
                params[name].copy_(t.to(params[name].device, params[name].dtype))
    return meta


def load_linear(
    model: PreTrainedModel,
    spec: str | MethodSpec,
    checkpoint: str | os.PathLike | None,
    model_name: str | None = None,
) -> PreTrainedModel:
    """Convert ``model`` to the trained baseline ``spec`` from ``checkpoint`` (what ``sinkwindow.load`` calls).

    With no ``checkpoint``, the adapter shipped with the package for (``model_name``, ``spec``) is
    used (``adapters.shipped_adapter``); an explicit checkpoint always wins. The model is put in
    eval mode with every parameter frozen.

    Raises:
        ValueError: no checkpoint and none shipped (the baseline must be trained first), or one
            for another spec.
    """
    from .adapters import list_adapters, shipped_adapter

    spec = parse_spec(spec)
    if checkpoint is None:
        checkpoint = shipped_adapter(model_name, spec)
    if checkpoint is None:
        shipped = ", ".join(f"{Path(a['path']).stem.replace('--', ' ')}" for a in list_adapters()) or "none"
        raise ValueError(
            f"'{spec}' is a trained baseline and none ships for {model_name or 'this model'} (shipped: {shipped}): "
            f"train it with `sinkwindow train --model <model> --method {spec.without_adapter} --tokens 1M "
            f"--out runs/{str(spec.without_adapter).replace(':', '')}`, then pass checkpoint=<that folder> "
            f"(CLI: --checkpoint)"
        )
    meta = read_metadata(checkpoint)
    if parse_spec(meta["spec"]) != spec.without_adapter:
        raise ValueError(
            f"{resolve_checkpoint(checkpoint)} holds a '{meta['spec']}' baseline, not '{spec.without_adapter}'"
        )
    load_checkpoint(model, checkpoint)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()

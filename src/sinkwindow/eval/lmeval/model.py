"""``SinkWindowLM``: lm-eval's ``HFLM`` over a model loaded by :func:`sinkwindow.load`, running a method.

Importing this module registers the class as lm-eval model ``sinkwindow`` (``@register_model``
at module level, as lm-eval's own ``hf`` is registered in ``lm_eval/models/huggingface.py``).
The package's ``__init__`` also registers it lazily, by path, so ``get_model("sinkwindow")``
works once ``sinkwindow.eval.lmeval`` is imported without importing this module (and lm-eval's
``HFLM``) before a model is asked for.

lm-eval's stock ``lm_eval`` command cannot find the model: lm-eval 0.4 has no plugin mechanism for
models (no entry points; its registry holds what has been imported), and nothing imports sinkwindow
in that process. ``sinkwindow-lm-eval`` is lm-eval's own CLI with the model registered first: run
``sinkwindow-lm-eval --model sinkwindow --model_args pretrained=smollm2-135m,method=swa:64:4 ...``.
"""

from __future__ import annotations

import logging
from typing import Any

try:
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM
except ImportError as err:  # the CLI's error handler turns the name into the pip command
    raise ModuleNotFoundError(
        "lm-evaluation-harness is not installed: pip install 'sinkwindow[lmeval]' (lm-eval>=0.4.9,<0.5)",
        name="lm_eval",
    ) from err

from .constants import DEFAULT_MAX_BATCH_TOKENS, MODEL_NAME

__all__ = ["SinkWindowLM", "register", "resolve_dtype", "switch_method"]

logger = logging.getLogger(__name__)


def _drop_custom_dataset_notice(record: logging.LogRecord) -> bool:
    return "Custom kwargs can be passed to `--metadata`" not in str(record.msg)


# HFLM warns whenever it is given a loaded model; SinkWindowLM always gives it one (the model
# sinkwindow.load built, running a method), so the warnings say nothing to our users.
_LOADED_MODEL_NOTICES = (
    "`pretrained` model kwarg is not of type `str`",
    "Passed an already-initialized model",
)


def _drop_loaded_model_notice(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith(_LOADED_MODEL_NOTICES)


def quiet_lm_eval_notices() -> None:
    """Drop lm-eval's notice that a custom_dataset task takes ``--metadata`` (it comes once per
    task, 57 times for MMLU) and HFLM's warnings about being given a loaded model."""
    task_logger = logging.getLogger("lm_eval.api.task")
    if _drop_custom_dataset_notice not in task_logger.filters:
        task_logger.addFilter(_drop_custom_dataset_notice)
    hf_logger = logging.getLogger("lm_eval.models.huggingface")
    if _drop_loaded_model_notice not in hf_logger.filters:
        hf_logger.addFilter(_drop_loaded_model_notice)


def resolve_dtype(dtype: Any):
    """A ``torch.dtype`` from ``float32``/``float16``/``bfloat16``/``auto`` (float32) or a dtype."""
    import torch

    from sinkwindow.runtime.dtypes import torch_dtype

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.float32
    try:
        return torch_dtype(str(dtype))
    except KeyError:
        raise ValueError(f"dtype must be float32, float16, bfloat16 or auto, got {dtype!r}") from None


def switch_method(model, method: str, checkpoint: str | None = None):
    """``model`` running ``method`` (``sinkwindow.runtime.method.use_method``)."""
    from sinkwindow.runtime.method import use_method

    return use_method(model, method, checkpoint=checkpoint)


@register_model(MODEL_NAME)
class SinkWindowLM(HFLM):
    """lm-eval ``HFLM`` over a model loaded by :func:`sinkwindow.load`, running a method spec.

    ``--model sinkwindow --model_args pretrained=smollm2-135m,method=swa:64:4`` on lm-eval's
    CLI; ``lolcats:W`` / ``linear`` also take ``checkpoint=PATH`` (a trained baseline).

    Args:
        pretrained: packaged name, hub id, folder or ``.gguf`` path, or a loaded
            ``PreTrainedModel`` (then ``tokenizer`` is required).
        method: spec string (``full``, ``swa:64:4``, ``lolcats:64`` ...).
        checkpoint: training checkpoint for the linear-attention baselines.
        tokenizer: tokenizer instance; default: the one :func:`sinkwindow.load` returns.
        device: ``cpu``/``cuda[:i]``; CUDA falls back to CPU when absent. Not used with ``device_map``.
        device_map: let accelerate place the layers (``sinkwindow.load(device_map=...)``):
            ``auto``, ``balanced``, ``sequential`` ... or ``{module: device}``.
        dtype: ``float32`` (default), ``bfloat16``, ``float16`` or ``auto`` (float32).
        data_dir: ignored here; read by the offline tasks from the task metadata, which lm-eval's
            CLI fills from ``--model_args``, so one ``--model_args`` can carry it.
        max_batch_tokens: cap on batch size x padded length for loglikelihood batches (``None``:
            plain ``batch_size``). lm-eval keeps full-vocabulary logits for the whole padded batch,
            so 16 five-shot MMLU prompts of ~4K tokens need over 12 GB with a 49K vocabulary.
        **kwargs: the rest of ``HFLM``'s arguments (``batch_size``, ``max_length`` ...).
    """

    def __init__(
        self,
        pretrained: Any = "smollm2-135m",
        method: str | None = "full",
        checkpoint: str | None = None,
        tokenizer: Any = None,
        device: str | None = "cpu",
        dtype: Any = "float32",
        data_dir: str | None = None,
        device_map: str | dict | None = None,
        max_batch_tokens: int | None = DEFAULT_MAX_BATCH_TOKENS,
        **kwargs: Any,
    ) -> None:
        import sinkwindow
        from sinkwindow.models import resolve

        del data_dir
        # The map decides where each layer goes; HFLM then feeds inputs to model.device.
        placement = (
            {"device_map": device_map}
            if device_map is not None
            else {"device": resolve.resolve_device(device)}
        )
        method = str(sinkwindow.parse_spec(method or "full"))
        if isinstance(pretrained, str):
            model, loaded_tok = sinkwindow.load(
                pretrained,
                method=method,
                checkpoint=checkpoint,
                dtype=resolve_dtype(dtype),
                **placement,
            )
            if tokenizer is None or isinstance(tokenizer, str):
                if isinstance(tokenizer, str):
                    logger.warning(
                        "ignoring tokenizer=%r: using the tokenizer sinkwindow.load returns", tokenizer
                    )
                tokenizer = loaded_tok
            self.model_name = pretrained
        else:
            if tokenizer is None:
                raise ValueError("a loaded model needs its tokenizer: SinkWindowLM(model, tokenizer=tok)")
            self.model_name = getattr(pretrained.config, "_name_or_path", "") or type(pretrained).__name__
            model = switch_method(pretrained, method, checkpoint)
        for key in ("backend", "parallelize", "tp_plan"):
            if kwargs.pop(key, None) not in (None, False, "causal", "default"):
                raise ValueError(f"SinkWindowLM does not support {key}")
        super().__init__(pretrained=model, tokenizer=tokenizer, backend="causal", **kwargs)
        if getattr(model, "hf_device_map", None):
            from sinkwindow.runtime.prefill import input_device

            # HFLM sends inputs to model.device, the first weight's, which is meta when offloaded.
            self._device = input_device(model)
        self.method = method
        self.max_batch_tokens = int(max_batch_tokens) if max_batch_tokens else None

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
        """HFLM's scoring, run in groups whose batch size keeps ``batch x length <= max_batch_tokens``.

        ``requests`` are ``((context, continuation), context_ids, continuation_ids)``; results come
        back in request order. Reduced batch sizes are powers of two, so there are few groups.
        """
        full_bs = self.batch_size
        if not self.max_batch_tokens or full_bs == "auto" or override_bs is not None or not requests:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm, override_bs=override_bs)
        groups: dict[int, list[int]] = {}
        for i, (_, ctx, cont) in enumerate(requests):
            length = max(1, min(len(ctx) + len(cont), self.max_length + 1))
            fit = min(int(full_bs), self.max_batch_tokens // length)
            bs = int(full_bs) if fit == int(full_bs) else 1 << (max(fit, 1).bit_length() - 1)
            groups.setdefault(bs, []).append(i)
        if list(groups) == [full_bs]:
            return super()._loglikelihood_tokens(requests, disable_tqdm=disable_tqdm)
        out: list = [None] * len(requests)
        try:
            for bs, idx in sorted(groups.items()):
                self.batch_size_per_gpu = bs
                part = super()._loglikelihood_tokens([requests[i] for i in idx], disable_tqdm=disable_tqdm)
                for i, r in zip(idx, part):
                    out[i] = r
        finally:
            self.batch_size_per_gpu = full_bs
        return out

    def set_method(self, method: str, checkpoint: str | None = None) -> None:
        """Put the loaded model into ``method`` in place: patch (``swa``/``evict``), restore
        (``full``) or convert with a trained ``checkpoint`` (``lolcats:W``/``linear``); no reload."""
        from sinkwindow import parse_spec

        self._model = switch_method(self.model, method, checkpoint)
        self.method = str(parse_spec(method))

    def get_model_info(self) -> dict:
        info = super().get_model_info()
        info.update({"sinkwindow_model": str(self.model_name), "sinkwindow_method": self.method})
        return info


def register() -> type:
    """:class:`SinkWindowLM`, registered as lm-eval model ``sinkwindow`` (importing this module did that)."""
    quiet_lm_eval_notices()
    return SinkWindowLM


quiet_lm_eval_notices()

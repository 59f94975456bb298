"""Short-context evaluation through lm-evaluation-harness (lm-eval 0.4.x): the paper's Table 1.

MMLU (5-shot), ARC-Challenge, ARC-Easy, HellaSwag, PIQA and WinoGrande, scored by lm-eval itself;
this module only supplies the model, the offline task configs and the bookkeeping.

- :class:`SinkWindowLM` (lm-eval model name ``sinkwindow``) is an ``HFLM`` that loads through
  :func:`sinkwindow.load` and runs any method spec; ``set_method`` switches the loaded model to
  another one in place (``sinkwindow.apply``, or a linear baseline converted from its checkpoint). lm-eval has no plugin discovery, so the class is registered when
  :func:`register` runs; the ``sinkwindow-lm-eval`` console script (:func:`cli_evaluate`) does that
  and then hands over to lm-eval's own CLI.
- Online, the stock task names load from the hub. With a data folder, the ``*_local`` twins in
  ``lmeval_tasks/`` read local files in the hub schemas instead (see its ``utils.py``).
- :func:`run_lmeval` evaluates (task, method) pairs on one loaded model and appends one row per
  pair to ``OUT/results.jsonl``, skipping pairs already there; :func:`recovery_table` turns rows into
  the paper's layout (per-task scores, average, MMLU and average recovery), which
  :func:`write_table` keeps in ``OUT/short_tasks.md`` and :func:`report_section` hands to reports.

Metrics follow the field (Mamba, LoLCATs): ``acc_norm`` for ARC-Challenge and HellaSwag, ``acc``
for the rest; rows keep both. Recovery is ``100 * method / full`` on the same metric and items.
lm-eval is an optional dependency (``pip install sinkwindow[lmeval]``); it is imported lazily so
that building the CLI stays cheap.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import args as cli_args
from ..linear.adapters import shipped_adapter
from .lmeval_tasks import TASKS_DIR
from .lmeval_tasks import utils as _local

__all__ = [
    "SHORT_TASKS",
    "TASK_LABELS",
    "HEADLINE_METRIC",
    "DEFAULT_FEWSHOT",
    "PAPER_RECOVERY",
    "TASKS_DIR",
    "SinkWindowLM",  # noqa: F822 - built on first access (module __getattr__), once lm-eval is imported
    "register",
    "cli_evaluate",
    "register_lmeval_subcommand",
    "resolve_task",
    "run_lmeval",
    "recovery_table",
    "read_rows",
    "report_section",
    "write_table",
    "short_data_available",
]

logger = logging.getLogger(__name__)

MODEL_NAME = "sinkwindow"
SUITE = "lm-eval"
RESULTS_FILE = "results.jsonl"
TABLE_FILE = "short_tasks.md"
TABLE_JSON = "short_tasks.json"

# Table 1's task order and column labels.
SHORT_TASKS: tuple[str, ...] = ("mmlu", "arc_challenge", "arc_easy", "hellaswag", "piqa", "winogrande")
TASK_LABELS = {
    "mmlu": "MMLU",
    "arc_challenge": "ARC-C",
    "arc_easy": "ARC-E",
    "hellaswag": "HellaSwag",
    "piqa": "PIQA",
    "winogrande": "WinoGrande",
}
# The field's convention (EVAL_SPECS §4.3): length-normalised accuracy where endings differ a lot in length.
HEADLINE_METRIC = {"arc_challenge": "acc_norm", "hellaswag": "acc_norm"}
DEFAULT_FEWSHOT = {"mmlu": 5}
# Batch size x padded length per loglikelihood batch: ~0.8 GB of float32 logits at a 49K vocabulary.
DEFAULT_MAX_BATCH_TOKENS = 4096
# SWA(64, 4) in the paper, averaged over 11 base models.
PAPER_RECOVERY = {"mmlu_recovery": 93.2, "average_recovery": 99.0}


def headline_metric(task: str) -> str:
    """The metric Table 1 reports for ``task`` (MMLU subjects and categories count as ``mmlu``)."""
    return HEADLINE_METRIC.get(_family(task), "acc")


def _family(task: str) -> str:
    return "mmlu" if task.startswith("mmlu") else task


def default_fewshot(task: str) -> int:
    return DEFAULT_FEWSHOT.get(_family(task), 0)


def resolve_task(task: str, local: bool) -> str:
    """The lm-eval task name for a stock name: itself online, its ``*_local`` twin offline.

    ``mmlu_<subject>`` and ``mmlu_<category>`` map to ``mmlu_local_<...>`` so quick runs can pick a
    subject. Names that already end in ``_local`` pass through.
    """
    if not local or task.endswith("_local") or task.startswith("mmlu_local"):
        return task
    if task == "mmlu":
        return "mmlu_local"
    if task.startswith("mmlu_"):
        return "mmlu_local_" + task[len("mmlu_") :]
    if task in _local.LOCAL_FILES:
        return f"{task}_local"
    raise ValueError(
        f"no offline config for task {task!r}: with --data-dir use {', '.join(SHORT_TASKS)} or mmlu_<subject>"
    )


def _canonical(lm_task: str) -> str:
    """Stock task name of an lm-eval task name (``arc_easy_local`` -> ``arc_easy``)."""
    if lm_task.startswith("mmlu_local"):
        return "mmlu" + lm_task[len("mmlu_local") :]
    return lm_task.removesuffix("_local")


def short_data_available(data_dir: str | os.PathLike | None) -> bool:
    """True when ``data_dir`` holds the local files of all six tasks."""
    if data_dir is None or not Path(data_dir).is_dir():
        return False
    try:
        for task in SHORT_TASKS:
            _local.find_files(task, data_dir)
    except (FileNotFoundError, KeyError):
        return False
    return True


# ---------------------------------------------------------------------------- the lm-eval model

_MODEL_CLASS: type | None = None


def _build_model_class() -> type:
    from lm_eval.models.huggingface import HFLM

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
            device: ``cpu``/``cuda[:i]``; CUDA falls back to CPU when absent.
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
            max_batch_tokens: int | None = DEFAULT_MAX_BATCH_TOKENS,
            **kwargs: Any,
        ) -> None:
            import sinkwindow

            del data_dir
            device = _resolve_device(device)
            method = str(sinkwindow.parse_spec(method or "full"))
            if isinstance(pretrained, str):
                model, loaded_tok = sinkwindow.load(
                    pretrained,
                    method=method,
                    checkpoint=checkpoint,
                    device=device,
                    dtype=_resolve_dtype(dtype),
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
                model = _switch_method(pretrained, method, checkpoint)
            for key in ("backend", "parallelize", "tp_plan"):
                if kwargs.pop(key, None) not in (None, False, "causal", "default"):
                    raise ValueError(f"SinkWindowLM does not support {key}")
            super().__init__(pretrained=model, tokenizer=tokenizer, backend="causal", **kwargs)
            self.method = method
            self.max_batch_tokens = int(max_batch_tokens) if max_batch_tokens else None

        def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, override_bs: int | None = None):
            """HFLM's scoring, run in groups whose batch size keeps ``batch x length <= max_batch_tokens``.

            ``requests`` are ``((context, continuation), context_ids, continuation_ids)``; results come
            back in request order. Reduced batch sizes are powers of two, so there are few groups.
            """
            full_bs = self.batch_size
            if not self.max_batch_tokens or full_bs == "auto" or override_bs is not None or not requests:
                return super()._loglikelihood_tokens(
                    requests, disable_tqdm=disable_tqdm, override_bs=override_bs
                )
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
                    part = super()._loglikelihood_tokens(
                        [requests[i] for i in idx], disable_tqdm=disable_tqdm
                    )
                    for i, r in zip(idx, part):
                        out[i] = r
            finally:
                self.batch_size_per_gpu = full_bs
            return out

        def set_method(self, method: str, checkpoint: str | None = None) -> None:
            """Put the loaded model into ``method`` in place: patch (``swa``/``evict``), restore
            (``full``) or convert with a trained ``checkpoint`` (``lolcats:W``/``linear``); no reload."""
            self._model = _switch_method(self.model, method, checkpoint)
            self.method = str(_parse(method))

        def get_model_info(self) -> dict:
            info = super().get_model_info()
            info.update({"sinkwindow_model": str(self.model_name), "sinkwindow_method": self.method})
            return info

    SinkWindowLM.__module__ = __name__
    SinkWindowLM.__qualname__ = "SinkWindowLM"
    return SinkWindowLM


def register() -> type:
    """Import lm-eval, build :class:`SinkWindowLM` and register it as model ``sinkwindow`` (idempotent)."""
    global _MODEL_CLASS
    if _MODEL_CLASS is None:
        try:
            from lm_eval.api.registry import register_model
        except ImportError as err:
            raise ImportError(
                "lm-evaluation-harness is not installed: pip install 'sinkwindow[lmeval]' (lm-eval>=0.4.9,<0.5)"
            ) from err
        cls = _build_model_class()
        register_model(MODEL_NAME)(cls)
        _quiet_custom_dataset_notice()
        _MODEL_CLASS = cls
    return _MODEL_CLASS


def _drop_custom_dataset_notice(record: logging.LogRecord) -> bool:
    return "Custom kwargs can be passed to `--metadata`" not in str(record.msg)


def _quiet_custom_dataset_notice() -> None:
    # lm-eval warns once per custom_dataset task that it takes --metadata: 57 times for MMLU.
    task_logger = logging.getLogger("lm_eval.api.task")
    if _drop_custom_dataset_notice not in task_logger.filters:
        task_logger.addFilter(_drop_custom_dataset_notice)


def __getattr__(name: str) -> Any:
    # ``SinkWindowLM`` subclasses lm-eval's HFLM, so it exists only once lm-eval is imported.
    if name == "SinkWindowLM":
        return register()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _resolve_device(device: str | None) -> str:
    import torch

    if not device or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        logger.warning("device %s requested but CUDA is not available: using cpu", device)
        return "cpu"
    return device


def _resolve_dtype(dtype: Any):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.float32
    try:
        return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[str(dtype)]
    except KeyError:
        raise ValueError(f"dtype must be float32, float16, bfloat16 or auto, got {dtype!r}") from None


def _parse(method: str):
    from sinkwindow import parse_spec

    return parse_spec(method)


def _switch_method(model, method: str, checkpoint: str | None = None):
    """``model`` running ``method`` (``sinkwindow.switch.use_method``)."""
    from sinkwindow.switch import use_method

    return use_method(model, method, checkpoint=checkpoint)


# ---------------------------------------------------------------------------- the stock CLI


def cli_evaluate(argv: Sequence[str] | None = None) -> int:
    """``sinkwindow-lm-eval``: lm-eval's own CLI with model ``sinkwindow`` registered; the exit code.

    Also adds ``--include_path`` pointing at the offline task configs (unless one is given), and
    takes ``--data-dir DIR`` (exported as ``$SINKWINDOW_SHORT_DATA`` for those configs)::

        sinkwindow-lm-eval --model sinkwindow --model_args pretrained=smollm2-135m,method=swa:64:4 \\
            --tasks arc_easy_local,piqa_local --data-dir ../shared/data/short --limit 50 --device cpu

    User errors (a missing ``--data-dir``, lm-eval not installed, a bad value) print one line and
    give exit code 2; ``--debug`` (ours, not passed on) shows the traceback instead.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    debug = cli_args.wants_debug(args)
    if debug:
        args.remove("--debug")
    return cli_args.run_reporting_errors(lambda: _cli_evaluate(args), prog="sinkwindow-lm-eval", debug=debug)


def _cli_evaluate(args: list[str]) -> int:
    for flag in ("--data-dir", "--data_dir"):
        for i, arg in enumerate(args):
            if arg == flag and i + 1 < len(args):
                value = args[i + 1]
                del args[i : i + 2]
            elif arg.startswith(flag + "="):
                value = arg.split("=", 1)[1]
                del args[i]
            else:
                continue
            folder = Path(value).expanduser().resolve()
            if not folder.is_dir():
                raise FileNotFoundError(
                    f"{flag} {value}: no such folder; give the folder of the short tasks' JSONL"
                )
            os.environ[_local.DATA_ENV] = str(folder)
            break
    takes_include = bool(args) and args[0] not in ("-h", "--help")  # bare or help: lm-eval prints help
    if takes_include and not any(a == "--include_path" or a.startswith("--include_path=") for a in args):
        args += ["--include_path", str(TASKS_DIR)]
    register()
    from lm_eval.__main__ import cli_evaluate as _lm_eval_cli

    saved = sys.argv
    sys.argv = [saved[0] if saved else "sinkwindow-lm-eval", *args]
    try:
        _lm_eval_cli()
    except SystemExit as exit_:  # lm-eval's argparse: usage errors keep their own message
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    finally:
        sys.argv = saved
    return 0


# ---------------------------------------------------------------------------- running


def _task_manager(data_dir: Path | None):
    from lm_eval.tasks import TaskManager

    _quiet_custom_dataset_notice()
    if data_dir is None:
        return TaskManager()
    # Only our folder: indexing lm-eval's thousands of stock YAMLs costs seconds and is not needed.
    try:
        return TaskManager(
            include_path=str(TASKS_DIR), include_defaults=False, metadata={"data_dir": str(data_dir)}
        )
    except TypeError:  # a TaskManager without include_defaults: index the stock tasks too
        return TaskManager(include_path=str(TASKS_DIR), metadata={"data_dir": str(data_dir)})


def _limit_for(limit: Any, task: str) -> int | float | None:
    if isinstance(limit, Mapping):
        value = limit.get(task, limit.get(_family(task), limit.get("*")))
    else:
        value = limit
    if value is None:
        return None
    value = float(value)
    if value <= 0:
        raise ValueError(f"limit must be positive, got {value}")
    return int(value) if value >= 1 and value == int(value) else value


def _row_key(row: Mapping) -> tuple:
    return (
        row.get("model"),
        row.get("task"),
        row.get("method"),
        row.get("limit"),
        row.get("num_fewshot"),
        row.get("source"),
    )


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a results file or of ``DIR/results.jsonl``; unreadable lines are skipped with a warning."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.exists():
        return []
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                # A run killed mid-write leaves a partial last line; the pair is simply redone.
                logger.warning("%s:%d: skipping an unreadable line", path, n)
    return rows


def _append_row(path: Path, row: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _num(x: Any) -> float | None:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _extract_row(res: dict, lm_task: str) -> dict:
    """Metrics of ``lm_task`` from a ``simple_evaluate`` result (a task or a group such as MMLU)."""
    entry = res.get("groups", {}).get(lm_task) or res["results"][lm_task]
    metrics, stderrs = {}, {}
    for key, value in entry.items():
        if "," not in key or key == "alias":
            continue
        name, _filter = key.split(",", 1)
        if name.endswith("_stderr"):
            stderrs[name.removesuffix("_stderr")] = _num(value)
        elif _num(value) is not None:
            metrics[name] = _num(value)
    n_samples = res.get("n-samples", {})
    n = sum(int(v.get("effective", 0)) for v in n_samples.values())
    out: dict[str, Any] = {"metrics": metrics, "stderrs": stderrs, "n": n}
    subgroups = {}
    for name, sub in res.get("results", {}).items():
        if name != lm_task and name in res.get("groups", {}) and "acc,none" in sub:
            subgroups[_canonical(name)] = _num(sub["acc,none"])
    if subgroups:
        out["subgroups"] = subgroups
    return out


def run_lmeval(
    model_name: str = "smollm2-135m",
    methods: Sequence[str] = ("full", "swa:64:4"),
    tasks: Sequence[str] | None = SHORT_TASKS,
    data_dir: str | os.PathLike | None = None,
    limit: int | float | Mapping[str, int | float | None] | None = None,
    out_dir: str | os.PathLike | None = None,
    *,
    num_fewshot: int | None = None,
    batch_size: int | str = 8,
    checkpoints: Mapping[str, str] | str | None = None,
    device: str = "cpu",
    dtype: str = "float32",
    max_length: int | None = None,
    max_batch_tokens: int | None = DEFAULT_MAX_BATCH_TOKENS,
    bootstrap_iters: int = 1000,
    resume: bool = True,
    model_and_tokenizer: tuple[Any, Any] | None = None,
) -> list[dict]:
    """Evaluate every (task, method) pair with lm-eval; one row each, appended to ``OUT/results.jsonl``.

    One model is loaded (or ``model_and_tokenizer`` used) and switched between methods in place:
    patched with :func:`sinkwindow.apply`, or converted to a trained linear baseline with its
    checkpoint and reverted afterwards. A passed-in model is left running the method it came with.
    Pairs whose row (same model, task, method, limit, shots, data source) is already in the file
    are not rerun, so an interrupted run resumes.

    Args:
        model_name: what :func:`sinkwindow.load` takes; also the row's ``model``.
        methods: method specs; put ``full`` in to get recovery rates.
        tasks: stock names (``SHORT_TASKS``, ``mmlu_<subject>``); lm-eval task names work too;
            ``None``: all six.
        data_dir: folder of local files (``../shared/data/short`` layout) -> offline ``*_local``
            tasks; ``None``: stock tasks from the hub.
        limit: items per task (per MMLU subject, as lm-eval counts), a fraction, or
            ``{task: limit}`` (key ``"*"`` for the rest); ``None``: full splits.
        out_dir: where ``results.jsonl`` goes; ``None``: nothing is written.
        num_fewshot: shots for every task; default 5 for MMLU and 0 otherwise (the paper).
        batch_size: lm-eval batch size (int, or ``"auto"`` on GPU).
        max_batch_tokens: also cap batch size x prompt length (long 5-shot MMLU prompts); ``None``: off.
        checkpoints: ``{method: path}`` for linear baselines, or one path for all of them.
        model_and_tokenizer: ``sinkwindow.load``'s result, to reuse instead of loading ``model_name``.

    Returns:
        The rows of all requested pairs (reused ones included), in run order::

            {"suite": "lm-eval", "model", "task", "method", "metric", "value", "stderr",
             "metrics": {"acc", "acc_norm"}, "stderrs": {...}, "n", "limit", "num_fewshot",
             "source": "local"|"hub", "lm_eval_task", "batch_size", "seconds", "time",
             "lm_eval_version", ["subgroups": {"mmlu_stem": ...}]}

        ``value`` is a fraction in [0, 1], as lm-eval reports it.
    """
    import sinkwindow

    register()
    import lm_eval

    specs = [str(sinkwindow.parse_spec(m)) for m in methods]
    tasks = SHORT_TASKS if tasks is None else tasks
    for spec in specs:
        if (
            sinkwindow.parse_spec(spec).is_linear
            and _checkpoint_for(checkpoints, spec) is None
            and shipped_adapter(model_name, spec) is None
        ):
            raise ValueError(
                f"{spec} is a trained baseline: pass checkpoints={{'{spec}': PATH}} (CLI: --checkpoint)"
            )
    if not specs:
        raise ValueError("no methods to evaluate")
    local = data_dir is not None
    data_path = _local.resolve_data_dir(data_dir) if local else None
    plan = []
    for task in tasks:
        lm_task = resolve_task(task, local)
        canonical = _canonical(lm_task)
        if local:
            # Fail before loading any model when a file is missing.
            _local.find_files(_family(canonical), data_path)
        shots = num_fewshot if num_fewshot is not None else default_fewshot(canonical)
        plan.append((canonical, lm_task, shots, _limit_for(limit, canonical)))

    results_path = Path(out_dir) / RESULTS_FILE if out_dir is not None else None
    done = {}
    if resume and results_path is not None:
        for row in read_rows(results_path):
            if row.get("suite") == SUITE:
                done[_row_key(row)] = row

    source = "local" if local else "hub"
    version = getattr(lm_eval, "__version__", "unknown")
    rows: list[dict] = []
    lm = None
    tm = None
    given = model_and_tokenizer[0] if model_and_tokenizer is not None else None
    came_with = str(sinkwindow.active_spec(given)) if given is not None else None
    lm_kwargs = {"batch_size": batch_size, "max_length": max_length, "max_batch_tokens": max_batch_tokens}
    try:
        # Task-major order, switching methods on one model in between: an interrupted run still
        # holds complete (full, method) pairs for the tasks it finished.
        for canonical, lm_task, shots, lim in plan:
            for spec in specs:
                key = (model_name, canonical, spec, lim, shots, source)
                if key in done:
                    logger.info("reusing %s / %s from %s", canonical, spec, results_path)
                    rows.append(done[key])
                    continue
                ckpt = _checkpoint_for(checkpoints, spec)
                if lm is None:
                    cls = register()
                    if given is not None:
                        lm = cls(
                            pretrained=given,
                            tokenizer=model_and_tokenizer[1],
                            method=spec,
                            checkpoint=ckpt,
                            **lm_kwargs,
                        )
                    else:
                        lm = cls(
                            pretrained=model_name,
                            method=spec,
                            checkpoint=ckpt,
                            device=device,
                            dtype=dtype,
                            **lm_kwargs,
                        )
                elif lm.method != spec:
                    lm.set_method(spec, ckpt)
                if tm is None:
                    tm = _task_manager(data_path)
                row = _evaluate(lm, tm, lm_task, shots, lim, bootstrap_iters, batch_size)
                row.update(
                    {
                        "suite": SUITE,
                        "model": model_name,
                        "task": canonical,
                        "method": spec,
                        "limit": lim,
                        "num_fewshot": shots,
                        "source": source,
                        "lm_eval_task": lm_task,
                        "batch_size": batch_size,
                        "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                        "lm_eval_version": version,
                    }
                )
                if local:
                    files = _local.find_files(_family(canonical), data_path)
                    row["data"] = {split: str(path) for split, path in files.items()}
                row = _ordered(row)
                if results_path is not None:
                    _append_row(results_path, row)
                    write_table(out_dir)
                rows.append(row)
                logger.info(
                    "%s / %s: %s = %.4f (n=%d, %.0fs)",
                    canonical,
                    spec,
                    row["metric"],
                    row["value"],
                    row["n"],
                    row["seconds"],
                )
    finally:
        if given is not None and lm is not None:
            _switch_method(given, came_with)  # hand the caller's model back as it came
    if out_dir is not None:
        write_table(out_dir)
    return rows


_ROW_ORDER = (
    "suite", "model", "task", "method", "metric", "value", "stderr", "metrics", "stderrs", "n", "limit",
    "num_fewshot", "source", "lm_eval_task", "batch_size", "seconds", "time", "lm_eval_version",
)  # fmt: skip


def _ordered(row: dict) -> dict:
    """The row with its keys in schema order (the JSONL stays readable by eye)."""
    return {**{k: row[k] for k in _ROW_ORDER if k in row}, **row}


def _evaluate(lm, tm, lm_task: str, shots: int, limit, bootstrap_iters: int, batch_size) -> dict:
    """One ``simple_evaluate`` call; the row's metric fields."""
    import lm_eval

    logger.info("lm-eval %s (%d-shot, limit %s) with %s", lm_task, shots, limit, lm.method)
    t0 = time.perf_counter()
    # None keeps the config's own default (mmlu_local: 5, the rest: 0) without lm-eval logging an
    # "overwriting num_fewshot" warning for each of MMLU's 57 subtasks.
    config_shots = 5 if lm_task.startswith("mmlu_local") else 0
    res = lm_eval.simple_evaluate(
        model=lm,
        tasks=[lm_task],
        num_fewshot=None if shots == config_shots else shots,
        limit=limit,
        task_manager=tm,
        bootstrap_iters=bootstrap_iters,
        log_samples=False,
        batch_size=batch_size,
    )
    extracted = _extract_row(res, lm_task)
    metric = headline_metric(_canonical(lm_task))
    if metric not in extracted["metrics"]:
        metric = "acc"
    row = {
        "metric": metric,
        "value": extracted["metrics"].get(metric),
        "stderr": extracted["stderrs"].get(metric),
        **extracted,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    return row


def _checkpoint_for(checkpoints: Mapping[str, str] | str | None, spec: str) -> str | None:
    from sinkwindow import parse_spec

    if not parse_spec(spec).is_linear:
        return None
    if isinstance(checkpoints, Mapping):
        return checkpoints.get(spec)
    return checkpoints


# ---------------------------------------------------------------------------- the table


def _pick_rows(rows: Iterable[Mapping], baseline: str) -> dict[str, dict[str, dict[str, Mapping]]]:
    """``{model: {task: {method: row}}}``: the latest baseline row per (model, task), and for each
    other method its latest row on the same items (limit, shots, n, source) as that baseline."""
    rows = [
        r
        for r in rows
        if r.get("suite", SUITE) == SUITE and r.get("value") is not None and r.get("task") in TASK_LABELS
    ]
    latest_base: dict[tuple, Mapping] = {}
    for r in rows:
        if r["method"] == baseline:
            latest_base[(r.get("model"), r["task"])] = r
    out: dict[str, dict[str, dict[str, Mapping]]] = {}
    for r in rows:
        model, task = r.get("model"), r["task"]
        base = latest_base.get((model, task))
        slot = out.setdefault(str(model), {}).setdefault(task, {})
        if base is None:
            slot[r["method"]] = r
            continue
        same = all(r.get(k) == base.get(k) for k in ("limit", "num_fewshot", "n", "source"))
        if r["method"] == baseline:
            slot[baseline] = base
        elif same:
            slot[r["method"]] = r
        else:
            logger.warning(
                "not comparing %s / %s (limit %s, n %s) with %s (limit %s, n %s): different items",
                task,
                r["method"],
                r.get("limit"),
                r.get("n"),
                baseline,
                base.get("limit"),
                base.get("n"),
            )
    return out


def _metric_value(row: Mapping, metric: str) -> float | None:
    if row.get("metric") == metric and row.get("value") is not None:
        return float(row["value"])
    value = (row.get("metrics") or {}).get(metric)
    return None if value is None else float(value)


def recovery_table(
    rows: Iterable[Mapping],
    baseline: str = "full",
    metrics: Mapping[str, str] | None = None,
) -> tuple[str, dict]:
    """Table 1 of the paper from result rows: scores, average, MMLU and average recovery.

    Scores are percentages (``100 * value``). For each method and task, recovery is
    ``100 * method / baseline`` on the same metric (``metrics`` overrides ``HEADLINE_METRIC``) and
    the same items. The average is the mean over the tasks that both the method and the baseline
    have; "average recovery" is ``100 * average(method) / average(baseline)`` over those tasks, and
    ``mean_task_recovery`` (in the dict) the mean of the per-task recoveries.

    Returns:
        ``(markdown, data)``; ``data = {"baseline", "metrics", "paper", "models": {model: {"tasks",
        "n", "methods": {method: {"scores", "recovery", "average", "average_recovery",
        "mean_task_recovery", "mmlu_recovery"}}}}}``. Missing values are ``None``.
    """
    chosen = {**{t: headline_metric(t) for t in SHORT_TASKS}, **(metrics or {})}
    picked = _pick_rows(rows, baseline)
    data: dict[str, Any] = {
        "baseline": baseline,
        "metrics": chosen,
        "paper": dict(PAPER_RECOVERY),
        "models": {},
    }
    parts = []
    for model, by_task in picked.items():
        tasks = [t for t in SHORT_TASKS if t in by_task]
        methods: list[str] = []
        for t in tasks:
            for m in by_task[t]:
                if m not in methods:
                    methods.append(m)
        methods.sort(key=lambda m: m != baseline)  # stable: baseline first, then first-seen order
        base_scores = {
            t: _pct(_metric_value(by_task[t][baseline], chosen[t])) for t in tasks if baseline in by_task[t]
        }
        entry = {"tasks": tasks, "n": {}, "limit": {}, "methods": {}}
        for t in tasks:
            ref = by_task[t].get(baseline) or next(iter(by_task[t].values()))
            entry["n"][t] = ref.get("n")
            entry["limit"][t] = ref.get("limit")
        for m in methods:
            scores = {
                t: _pct(_metric_value(by_task[t][m], chosen[t])) if m in by_task[t] else None for t in tasks
            }
            recovery = {
                t: (
                    100.0 * scores[t] / base_scores[t]
                    if scores[t] is not None and base_scores.get(t)
                    else None
                )
                for t in tasks
            }
            both = [t for t in tasks if scores[t] is not None and base_scores.get(t) is not None]
            avg = _mean([scores[t] for t in tasks if scores[t] is not None])
            avg_both = _mean([scores[t] for t in both])
            base_avg = _mean([base_scores[t] for t in both])
            entry["methods"][m] = {
                "scores": scores,
                "recovery": recovery,
                "average": avg,
                "average_tasks": len([t for t in tasks if scores[t] is not None]),
                "average_recovery": 100.0 * avg_both / base_avg if both and base_avg else None,
                "mean_task_recovery": _mean(
                    [recovery[t] for t in both if recovery[t] is not None]
                ),  # a 0 baseline has none
                "mmlu_recovery": recovery.get("mmlu"),
            }
        data["models"][model] = entry
        parts.append(_markdown(model, entry, chosen, baseline, len(picked) > 1))
    if not parts:
        return "_No short-task results yet._\n", data
    footer = (
        f"\nMetric: {', '.join(f'{TASK_LABELS[t]} {chosen[t]}' for t in SHORT_TASKS)}. "
        f"Cells: score % (recovery % = 100 × method ÷ {baseline}, same metric, same items). "
        f"Avg. recovery = 100 × Avg.(method) ÷ Avg.({baseline}). Paper, SWA(64, 4) over 11 base models: "
        f"MMLU recovery {PAPER_RECOVERY['mmlu_recovery']}, 6-task average recovery {PAPER_RECOVERY['average_recovery']}.\n"
    )
    return "\n".join(parts) + footer, data


def _pct(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _markdown(model: str, entry: dict, chosen: Mapping[str, str], baseline: str, heading: bool) -> str:
    tasks = entry["tasks"]
    header = ["method", *(TASK_LABELS[t] for t in tasks), "Avg.", "MMLU recovery", "Avg. recovery"]
    lines = []
    if heading:
        lines.append(f"#### {model}\n")
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for m, v in entry["methods"].items():
        cells = [f"**{m}**" if m == baseline else m]
        for t in tasks:
            score, rec = v["scores"][t], v["recovery"][t]
            cells.append(_fmt(score) if m == baseline or rec is None else f"{_fmt(score)} ({_fmt(rec)})")
        avg = _fmt(v["average"])
        if v["average_tasks"] < len(tasks):
            avg += f" ({v['average_tasks']} tasks)"
        cells += [avg, _fmt(v["mmlu_recovery"]), _fmt(v["average_recovery"])]
        lines.append("| " + " | ".join(cells) + " |")
    sizes = ", ".join(
        f"{TASK_LABELS[t]} {entry['n'][t]}" + (f" (limit {entry['limit'][t]})" if entry["limit"][t] else "")
        for t in tasks
    )
    lines.append(f"\nItems per task: {sizes}.")
    return "\n".join(lines) + "\n"


def write_table(out_dir: str | os.PathLike, baseline: str = "full") -> tuple[str, dict]:
    """(Re)write ``OUT/short_tasks.md`` and ``OUT/short_tasks.json`` from ``OUT/results.jsonl``."""
    out = Path(out_dir)
    md, data = recovery_table(read_rows(out), baseline=baseline)
    out.mkdir(parents=True, exist_ok=True)
    (out / TABLE_FILE).write_text("### Short-context tasks (lm-eval)\n\n" + md, encoding="utf-8")
    (out / TABLE_JSON).write_text(json.dumps(data, indent=2), encoding="utf-8")
    return md, data


def report_section(source: str | os.PathLike | Iterable[Mapping], baseline: str = "full") -> str | None:
    """Markdown for the compare report's short-task section, or ``None`` when there are no rows.

    ``source`` is a run folder, a results file, or rows.
    """
    rows = read_rows(source) if isinstance(source, (str, os.PathLike)) else list(source)
    rows = [r for r in rows if r.get("suite") == SUITE]
    if not rows:
        return None
    md, _ = recovery_table(rows, baseline=baseline)
    return "## Short-context tasks (lm-eval)\n\n" + md


# ---------------------------------------------------------------------------- `sinkwindow eval lm-eval`


def _limit_value(text: str, task: str | None = None) -> int | float:
    where = f" for {task}" if task else ""
    try:
        value = float(text) if "." in text else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"limit{where} must be a count or a fraction, got {text!r} (e.g. 100, 0.1, or 100,mmlu=2)"
        ) from None
    if isinstance(value, int) and value < 1:
        raise argparse.ArgumentTypeError(f"limit{where} must be >= 1 items, got {value}")
    if isinstance(value, float) and not 0 < value < 1:
        # lm-eval reads a limit below 1 as a fraction of the task and anything else as a count.
        raise argparse.ArgumentTypeError(
            f"a fractional limit{where} must be in (0, 1), got {value}; write a count as an integer"
        )
    return value


def _parse_limit(text: str | None) -> int | float | dict | None:
    """``--limit``: ``"100"``, ``"0.1"`` (a fraction of each task) or ``"100,mmlu=2"`` (a bare number is
    every other task's limit). Counts must be >= 1 and fractions in (0, 1)."""
    if text is None:
        return None
    text = str(text).strip()
    if not text:
        raise argparse.ArgumentTypeError("--limit is empty: give a count, a fraction or task=N,task=N")
    if "=" not in text:
        return _limit_value(text)
    out: dict[str, float | int] = {}
    for part in text.split(","):
        task, sep, value = part.partition("=")
        task, value = (task.strip(), value.strip()) if sep else ("*", task.strip())
        if not task or not value:
            raise argparse.ArgumentTypeError(
                f"bad --limit item {part!r}: use N or task=N, separated by commas"
            )
        if task in out:
            raise argparse.ArgumentTypeError(f"--limit gives {task if task != '*' else 'the default'} twice")
        out[task] = _limit_value(value, None if task == "*" else task)
    return out


def _task_items(text: str) -> list[str]:
    """``--tasks a,b``: names, none empty."""
    items = [t.strip() for t in str(text).split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"give task names separated by single commas, e.g. {','.join(SHORT_TASKS[:2])} (or all)"
        )
    return items


def _batch_size(text: str) -> int | str:
    """``--batch-size``: an integer >= 1, ``auto`` or ``auto:N`` (lm-eval's own forms)."""
    text = str(text).strip()
    if text == "auto" or (text.startswith("auto:") and text[5:].isdigit() and int(text[5:]) >= 1):
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"batch size must be an integer >= 1, auto or auto:N; got {text!r}")


def _cmd_lmeval(args: argparse.Namespace) -> int:
    methods = list(args.methods)
    if not args.no_baseline and "full" not in methods:
        methods = ["full", *methods]
    methods, checkpoints = cli_args.resolve_checkpoints(args.checkpoint, methods)
    tasks = [t for group in args.tasks or [] for t in group] or list(SHORT_TASKS)
    if tasks in (["all"], ["short"]):
        tasks = list(SHORT_TASKS)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    rows = run_lmeval(
        args.model,
        methods,
        tasks,
        data_dir=args.data_dir,
        limit=args.limit,
        out_dir=args.out,
        num_fewshot=args.num_fewshot,
        batch_size=args.batch_size,
        checkpoints=checkpoints or None,
        device=cli_args.resolve_device(args.device),
        dtype=args.dtype,
        max_length=args.max_length,
        max_batch_tokens=args.max_batch_tokens or None,
        resume=not args.no_resume,
    )
    md, data = recovery_table(rows)
    print(md)
    print(json.dumps({"out": str(args.out), "rows": len(rows), "models": data["models"]}, default=str))
    return 0


def register_lmeval_subcommand(eval_subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``lm-eval`` to the ``sinkwindow eval`` subcommands; returns its parser."""
    p = eval_subparsers.add_parser(
        "lm-eval",
        help="short-context tasks (MMLU 5-shot, ARC-C/E, HellaSwag, PIQA, WinoGrande) through lm-eval, with recovery",
        description=(
            "Score methods on the paper's short-context tasks with lm-evaluation-harness and print Table 1 "
            "(per-task scores, average, MMLU and average recovery vs full attention). Rows are appended to "
            "OUT/results.jsonl; pairs already there are skipped."
        ),
    )
    cli_args.add_model(p)
    cli_args.add_methods(
        p,
        ["swa:64:4"],
        help="method specs, comma-separated and/or repeated (default: swa:64:4); full is added unless --no-baseline",
    )
    p.add_argument("--no-baseline", action="store_true", help="do not add the full-attention baseline")
    p.add_argument(
        "--tasks",
        action="append",
        type=_task_items,
        help=f"comma-separated tasks (default: all six: {','.join(SHORT_TASKS)}); mmlu_<subject> works too",
    )
    p.add_argument(
        "--data-dir",
        type=cli_args.existing_dir("--data-dir"),
        default=None,
        help="folder with local JSONL in the hub schemas (e.g. ../shared/data/short); default: stock tasks from the hub",
    )
    p.add_argument(
        "--limit",
        type=_parse_limit,
        default=None,
        help="items per task (per MMLU subject) >= 1, a fraction in (0, 1), or task=N,task=N",
    )
    cli_args.add_out(p, "runs/lm-eval", help="run folder for results.jsonl and the table")
    p.add_argument(
        "--num-fewshot",
        type=cli_args.integer(0, what="--num-fewshot"),
        default=None,
        help="shots for every task (default: MMLU 5, others 0)",
    )
    p.add_argument(
        "--batch-size", type=_batch_size, default="8", help="lm-eval batch size (default: %(default)s)"
    )
    cli_args.add_checkpoint(p)
    cli_args.add_device(p)
    cli_args.add_dtype(p)
    p.add_argument(
        "--max-length",
        type=cli_args.integer(1, what="--max-length"),
        default=None,
        help="truncate prompts to this many tokens (default: model's)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=cli_args.integer(0, what="--max-batch-tokens"),
        default=DEFAULT_MAX_BATCH_TOKENS,
        help="cap batch size x prompt tokens, 0 for none (default: %(default)s)",
    )
    cli_args.add_threads(p)
    cli_args.add_no_resume(p, help="rerun pairs already in results.jsonl")
    p.set_defaults(func=_cmd_lmeval)
    return p


if __name__ == "__main__":
    sys.exit(cli_evaluate())

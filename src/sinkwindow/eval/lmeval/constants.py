"""Table 1's tasks as the lm-eval model, runner, table and CLI name them.

The task names, column labels, headline metrics, default shots and the names of lm-eval's own
tasks live here, apart from ``model.py``, ``runner.py``, ``table.py`` and ``cli.py``, so that those
import this module and not each other. Only the standard library and the task folder's
``utils.py`` (itself standard library only) are imported: no lm-eval, no torch.
"""

from __future__ import annotations

from .tasks import utils as _local

__all__ = [
    "MODEL_NAME",
    "SUITE",
    "TABLE_FILE",
    "TABLE_JSON",
    "CACHE_DIR",
    "SHORT_TASKS",
    "TASK_LABELS",
    "HEADLINE_METRIC",
    "DEFAULT_FEWSHOT",
    "DEFAULT_MAX_BATCH_TOKENS",
    "PAPER_RECOVERY",
    "PAPER_TABLE1",
    "family",
    "headline_metric",
    "default_fewshot",
    "resolve_task",
    "canonical",
]

# lm-eval's name of SinkWindowLM (``--model sinkwindow``).
MODEL_NAME = "sinkwindow"
# The ``suite`` of every row: it tells lm-eval rows from long-context ones in a results file.
SUITE = "lm-eval"
TABLE_FILE = "short_tasks.md"
TABLE_JSON = "short_tasks.json"
# lm-eval's response caches of the pairs in flight (a stopped pair resumes from them).
CACHE_DIR = "lm-eval-cache"

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
# The field's convention (docs/evaluation.md §3.2): length-normalised accuracy where endings
# differ a lot in length.
HEADLINE_METRIC = {"arc_challenge": "acc_norm", "hellaswag": "acc_norm"}
DEFAULT_FEWSHOT = {"mmlu": 5}
# Batch size x padded length per loglikelihood batch: ~0.8 GB of float32 logits at a 49K vocabulary.
DEFAULT_MAX_BATCH_TOKENS = 4096
# SWA(64, 4) in the paper, averaged over 11 base models.
PAPER_RECOVERY = {"mmlu_recovery": 93.2, "average_recovery": 99.0}
# The paper's Table 1 rows for the methods sinkwindow runs, by spec kind: (label, finetune tokens,
# MMLU recovery, 6-task average recovery). Hedgehog is our ``linear``.
PAPER_TABLE1 = {
    "swa": ("SWA(64, 4)", "0", 93.2, 99.0),
    "lolcats": ("LoLCATs", "40M", 83.2, 97.5),
    "liger": ("Liger-GLA", "20M", 62.2, 92.0),
    "linear": ("Hedgehog", "40M", 36.9, 73.9),
}


def family(task: str) -> str:
    """``mmlu`` for MMLU and its subjects and categories; other tasks are their own family."""
    return "mmlu" if task.startswith("mmlu") else task


def headline_metric(task: str) -> str:
    """The metric Table 1 reports for ``task`` (MMLU subjects and categories count as ``mmlu``)."""
    return HEADLINE_METRIC.get(family(task), "acc")


def default_fewshot(task: str) -> int:
    """The paper's shots: 5 for MMLU, 0 for the rest."""
    return DEFAULT_FEWSHOT.get(family(task), 0)


def resolve_task(task: str, local: bool) -> str:
    """The lm-eval task name for a stock name: itself online, its ``*_local`` twin offline.

    ``mmlu_<subject>`` and ``mmlu_<category>`` map to ``mmlu_local_<...>`` so quick runs can pick a
    subject. Names that already end in ``_local`` pass through.

    Raises:
        ValueError: offline, a task with no local config (naming the ones there are).
    """
    if not local or task.endswith("_local") or task.startswith("mmlu_local"):
        return task
    if task == "mmlu":
        return "mmlu_local"
    if task.startswith("mmlu_"):
        name = "mmlu_local_" + task[len("mmlu_") :]
        from .tasks import TASKS_DIR

        if not any((TASKS_DIR / f"{prefix}{name}.yaml").is_file() for prefix in ("", "_")):
            raise ValueError(
                f"unknown MMLU subject or category in {task!r}: use mmlu, mmlu_<subject> (e.g. mmlu_astronomy) "
                f"or mmlu_<category> (mmlu_stem, mmlu_humanities, mmlu_social_sciences, mmlu_other)"
            )
        return name
    if task in _local.LOCAL_FILES:
        return f"{task}_local"
    raise ValueError(
        f"no offline config for task {task!r}: with --data-dir use {', '.join(SHORT_TASKS)} or mmlu_<subject>"
    )


def canonical(lm_task: str) -> str:
    """Stock task name of an lm-eval task name (``arc_easy_local`` -> ``arc_easy``)."""
    if lm_task.startswith("mmlu_local"):
        return "mmlu" + lm_task[len("mmlu_local") :]
    return lm_task.removesuffix("_local")

"""Short-context evaluation through lm-evaluation-harness (lm-eval 0.4.x): the paper's Table 1.

MMLU (5-shot), ARC-Challenge, ARC-Easy, HellaSwag, PIQA and WinoGrande, scored by lm-eval itself;
this package only supplies the model, the offline task configs and the bookkeeping:

- ``model.py``: :class:`SinkWindowLM` (lm-eval model ``sinkwindow``), an ``HFLM`` that loads
  through :func:`sinkwindow.load` and runs any method spec; ``set_method`` switches the loaded
  model to another one in place. Importing this package registers it with lm-eval (see below).
- ``runner.py``: :func:`run_lmeval` evaluates (task, method) pairs on one loaded model, one row
  per pair, through the results store (``eval/results.py``): fingerprinted, resumable, locked.
- ``table.py``: :func:`recovery_table` (per-task scores, average, MMLU and average recovery),
  kept in ``OUT/short_tasks.md`` by :func:`write_table` and handed to reports by
  :func:`report_section`.
- ``cli.py``: ``sinkwindow eval lm-eval`` and the ``sinkwindow-lm-eval`` console script
  (:func:`cli_evaluate`, lm-eval's own CLI with our model and tasks).
- ``tasks/``: the offline ``*_local`` task configs, reading local files in the hub schemas.
- ``constants.py``: task names, labels, metrics and shots that all of the above share.

Online, the stock task names load from the hub; with a data folder, the ``*_local`` twins do.
Metrics follow the field (Mamba, LoLCATs): ``acc_norm`` for ARC-Challenge and HellaSwag, ``acc``
for the rest; rows keep both. lm-eval is optional (``pip install sinkwindow[lmeval]``): without
it this package still imports (the CLI names the pip command when a command needs it).
"""

from __future__ import annotations

from typing import Any

from .cli import cli_evaluate, register_lmeval_subcommand
from .constants import (
    DEFAULT_FEWSHOT,
    DEFAULT_MAX_BATCH_TOKENS,
    HEADLINE_METRIC,
    MODEL_NAME,
    PAPER_RECOVERY,
    SHORT_TASKS,
    SUITE,
    TASK_LABELS,
    default_fewshot,
    headline_metric,
    resolve_task,
)
from .runner import LmEvalConfig, run_lmeval, short_data_available
from .table import read_rows, recovery_table, report_section, write_table
from .tasks import TASKS_DIR

__all__ = [
    "SHORT_TASKS",
    "TASK_LABELS",
    "HEADLINE_METRIC",
    "DEFAULT_FEWSHOT",
    "DEFAULT_MAX_BATCH_TOKENS",
    "PAPER_RECOVERY",
    "MODEL_NAME",
    "SUITE",
    "TASKS_DIR",
    "SinkWindowLM",  # noqa: F822 - imported on first access (module __getattr__): it needs lm-eval
    "register",  # noqa: F822 - likewise
    "cli_evaluate",
    "register_lmeval_subcommand",
    "default_fewshot",
    "headline_metric",
    "resolve_task",
    "LmEvalConfig",
    "run_lmeval",
    "recovery_table",
    "read_rows",
    "report_section",
    "write_table",
    "short_data_available",
]

_MODEL_PATH = f"{__name__}.model:SinkWindowLM"


def _register_lazily() -> None:
    """Register ``sinkwindow`` with lm-eval by path, as ``lm_eval/models/__init__.py`` registers its
    own models: ``get_model("sinkwindow")`` then imports ``model.py`` (where ``@register_model``
    replaces the path with the class). lm-eval without a lazy registry (< 0.4.10) gets the class
    now; without lm-eval nothing happens."""
    try:
        # lm-eval's own models first: get_model imports them only while the registry is empty,
        # so registering ours alone would hide "hf" and the rest.
        import lm_eval.models  # noqa: F401
        from lm_eval.api import registry
    except ImportError:
        return
    lazy = getattr(registry, "model_registry", None)
    if lazy is None or not hasattr(lazy, "register"):
        from . import model  # noqa: F401 - registers the class at import

        return
    if MODEL_NAME not in lazy:
        lazy.register(MODEL_NAME, target=_MODEL_PATH)


def __getattr__(name: str) -> Any:
    # The model class subclasses lm-eval's HFLM, so it is imported only when asked for.
    if name in ("SinkWindowLM", "register"):
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_register_lazily()

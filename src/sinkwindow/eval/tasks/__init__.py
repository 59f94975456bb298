"""The long-context tasks by name: the registry the runner, the fingerprint, the sweep planner, the
report and ``tune`` read (as ``bench.methods.RUNNERS`` is for the efficiency benchmark).

Adding a task is one file here (a :class:`~.base.Task` subclass and its instances) and one entry in
:data:`TASKS`. Importing this package is cheap (no torch, no generators): the data modules are
imported when a task builds its samples, so flag parsing can use the names and limits.

Tasks:
    ``ppl``                              perplexity of essay windows at each length (chunked stream)
    ``niah_single_1/2/3``                RULER S-NIAH (greedy decoding, string match, 0/100)
    ``babilong_qa1`` .. ``babilong_qa5`` BABILong (greedy decoding, compare_answers, 0/100)
    ``lcc``                              LongBench-LCC-style next line of stdlib code (edit similarity
                                         0-100, exact match beside it); run only when named
    ``niah_multikey_1/2/3``, ``niah_multivalue``, ``niah_multiquery``, ``vt``, ``cwe``, ``fwe``
                                         RULER's other synthetic tasks (string_match_all, 0-100);
                                         run only when named
    ``qa_1``, ``qa_2``                   RULER's SQuAD / HotpotQA QA on given data (string_match_part)

Groups: ``ppl``, ``niah`` (S-NIAH-1/2/3), ``babilong``, ``code`` and ``ruler`` (every RULER task,
S-NIAH included; ``eval ruler`` leaves QA out unless ``--ruler-qa-data`` is given).
"""

from __future__ import annotations

from .babilong import BABILONG, BABILONG_MIN_LENGTH, BABILONG_PROMPT_RESERVE
from .base import Task
from .lcc import LCC, LCC_ANSWER_TOKENS, LCC_MIN_LENGTH
from .niah import NIAH, NIAH_ANSWER_TOKENS, NIAH_MIN_LENGTH
from .ppl import PERPLEXITY, PPL_MIN_LENGTH
from .ruler import RULER, RULER_CATEGORIES, RULER_CATEGORY_TITLES, RULER_QA

__all__ = [
    "Task",
    "TASKS",
    "GROUPS",
    "ALL_TASKS",
    "DEFAULT_TASKS",
    "RULER_TASKS",
    "RULER_CATEGORIES",
    "RULER_QA",
    "NIAH_TASKS",
    "BABILONG_TASKS",
    "FAMILY_TITLES",
    "HEADLINE_FAMILIES",
    "get_task",
    "group_tasks",
    "tasks_using",
    "deviations",
    "NIAH_ANSWER_TOKENS",
    "NIAH_MIN_LENGTH",
    "BABILONG_PROMPT_RESERVE",
    "BABILONG_MIN_LENGTH",
    "PPL_MIN_LENGTH",
    "LCC_ANSWER_TOKENS",
    "LCC_MIN_LENGTH",
]

TASKS: dict[str, Task] = {t.name: t for t in (PERPLEXITY, *NIAH, *BABILONG, LCC, *RULER)}

ALL_TASKS: tuple[str, ...] = tuple(TASKS)
# What a run that names no tasks runs (EvalConfig's default, compare): the paper's protocol.
DEFAULT_TASKS: tuple[str, ...] = tuple(t.name for t in TASKS.values() if t.default)
GROUPS: dict[str, tuple[str, ...]] = {}
for _t in TASKS.values():
    GROUPS[_t.group] = (*GROUPS.get(_t.group, ()), _t.name)
NIAH_TASKS = GROUPS["niah"]
BABILONG_TASKS = GROUPS["babilong"]
# The RULER-only tasks; the `ruler` group runs them after S-NIAH-1/2/3.
RULER_TASKS = GROUPS["ruler"]
GROUPS["ruler"] = (*NIAH_TASKS, *RULER_TASKS)
# Report columns of the accuracy tasks, in table order, and their titles; RULER's categories
# average their tasks (summary.py adds them when RULER-only rows are present).
FAMILY_TITLES: dict[str, str] = {t.family: t.title for t in TASKS.values() if t.family != "ppl"}
FAMILY_TITLES.update(RULER_CATEGORY_TITLES)
# The summary table's columns: a RULER-only task shows in its category, not in a column of its own.
HEADLINE_FAMILIES: tuple[str, ...] = tuple(f for f in FAMILY_TITLES if f not in RULER_TASKS)


def get_task(name: str) -> Task:
    """The task called ``name``; a one-line ``ValueError`` naming the known ones otherwise."""
    try:
        return TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}") from None


def group_tasks(group: str) -> tuple[str, ...]:
    """The tasks ``sinkwindow eval GROUP`` runs by default (``niah``: S-NIAH-1/2/3; ``ruler``: all
    of RULER's tasks)."""
    return GROUPS[group]


def tasks_using(key: str) -> frozenset[str]:
    """The tasks whose rows the run setting ``key`` changes (empty: not a task setting)."""
    return frozenset(t.name for t in TASKS.values() if key in t.setting_keys)


def deviations(config) -> list[str]:
    """The run's deviations from the source benchmarks, over its tasks, each line once, in order."""
    out: list[str] = []
    for name in config.tasks:
        for line in TASKS[name].deviations(config):
            if line not in out:
                out.append(line)
    return out

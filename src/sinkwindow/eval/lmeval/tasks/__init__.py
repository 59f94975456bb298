"""Offline lm-eval task configs: the stock short-context tasks, reading local files.

``arc_easy_local``, ``arc_challenge_local``, ``hellaswag_local``, ``piqa_local``,
``winogrande_local`` and the group ``mmlu_local`` (57 ``mmlu_local_<subject>`` tasks under
``mmlu_local_{stem,other,social_sciences,humanities}``) copy the prompts, splits and metrics of
lm-eval's ``arc_easy``, ``arc_challenge``, ``hellaswag``, ``piqa``, ``winogrande`` and ``mmlu``;
only the data source differs (``custom_dataset: !function utils.load_local``). Point lm-eval at
this folder with ``TaskManager(include_path=TASKS_DIR)`` or ``--include_path``.
"""

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent

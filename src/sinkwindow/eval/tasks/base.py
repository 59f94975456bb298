"""What the long-context evaluation needs to know of one task (:class:`Task`).

A task says which lengths and how many samples a run asks of it, builds its samples from the
tokenizer and the seed, turns a sample into a prompt and a decode cap, scores the prediction into a
row, names the settings that change its rows (the fingerprint) and what it does differently from
its source benchmark (the run's deviations). The runner, the fingerprint, the sweep planner and the
report read tasks only through this interface; ``eval/tasks/__init__.py`` holds the registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["Task", "Prepared"]

# (prompt ids [1, n], decode cap, finish(prediction text) -> row fields)
Prepared = tuple[Any, int, Callable[[str], dict]]


@dataclass(frozen=True)
class Task:
    """One long-context task. Subclasses fill in the samples and the scoring.

    Attributes:
        name: the task's name in rows, ``--tasks`` and reports (``niah_single_2``).
        group: the family ``sinkwindow eval GROUP`` runs (``niah``, ``babilong``, ``ppl``).
        family: the report column its rows go to: its own name, or one shared by tasks the report
            averages (``babilong`` for QA1–QA5).
        title: the report's title of that column.
        min_length: the smallest length worth running (checked while parsing flags).
        setting_keys: the run settings that change this task's rows (``fingerprint.run_settings``).
        default: whether a run that names no tasks (``EvalConfig``'s default, ``compare``) runs it;
            a task outside the paper's protocol is asked for by name (``--tasks``).
    """

    name: str
    group: str
    family: str
    title: str
    min_length: int
    setting_keys: tuple[str, ...] = ()
    default: bool = True

    def lengths(self, config) -> list[int]:
        """The lengths ``config`` asks of this task."""
        return list(config.lengths)

    def count(self, config) -> int:
        """Samples per length."""
        return config.samples

    def batch_size(self, batch_size: int) -> int:
        """Samples of one cell, given the run's batch size."""
        return batch_size

    def settings(self, config) -> dict[str, Any]:
        """Values of :attr:`setting_keys` for ``config`` (the fingerprint's task part)."""
        return {}

    def deviations(self, config) -> list[str]:
        """How this run of the task differs from its source benchmark, in words (shared lines are
        said once per run)."""
        return []

    def token_budget(self, config, length: int, throughput) -> tuple[int, int]:
        """``(prompt tokens, decode cap)`` of one sample, for the sweep's cost estimate."""
        raise NotImplementedError

    def build_samples(self, tokenizer, length: int, config) -> list:
        """Every sample of one length (``count(config)`` of them, index order)."""
        raise NotImplementedError

    def prepare(self, tokenizer, sample, config) -> Prepared:
        """A sample's prompt ids ``[1, n]``, its decode cap and the function that scores its prediction."""
        raise NotImplementedError

    def run(self, model, tokenizer, length: int, indices, config, state: dict) -> list[dict]:
        """Rows of the samples ``indices`` at ``length``, decoded greedily as one batch.

        Args:
            state: caches kept across the cells one model copy runs; the samples of each
                (task, length) are built once into ``state["samples"]``, ``state["eos"]`` holds
                the EOS ids.
        """
        from ..decoding import decode_prepared

        cache = state.setdefault("samples", {})
        key = (self.name, length)
        if key not in cache:
            cache[key] = self.build_samples(tokenizer, length, config)
        prepared = [self.prepare(tokenizer, cache[key][i], config) for i in indices]
        return decode_prepared(model, tokenizer, prepared, config.chunk_size, state["eos"])

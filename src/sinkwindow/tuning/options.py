"""How a tuning front end runs, apart from what it computes (nothing here changes a number)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """Attributes:
    name: the model's name in the records (default: its config's ``name_or_path``).
    progress: show tqdm bars.
    new_run: start the folder over (its files move to ``previous-<time>/``).
    workers / ray: where runs go (local worker processes or Ray tasks; ``nll.mean_nlls``,
        ``eval.scheduler``); the numbers are the same as a serial run's.
    model_factory: a picklable ``() -> (model, tokenizer)`` the workers load their copy with.
    source_diff: the sha256 of uncommitted source changes the run may compute with
        (``runs.check_clean_source``), recorded in every row.
    """

    name: str | None = None
    progress: bool = True
    new_run: bool = False
    workers: int | str | None = None
    ray: str | bool | None = None
    model_factory: Callable[[], tuple] | None = None
    source_diff: str | None = None

    def refuse_unused(self, command: str, used: tuple[str, ...]) -> RunOptions:
        """``self``, after refusing any option set away from its default that ``command`` does not use."""
        default = RunOptions()
        unused = [
            f.name
            for f in fields(self)
            if f.name not in used and getattr(self, f.name) != getattr(default, f.name)
        ]
        if unused:
            raise ValueError(f"{command} does not take {', '.join(unused)}: drop it")
        return self

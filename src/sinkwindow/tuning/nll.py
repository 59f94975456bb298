"""The ``nll`` criterion: the teacher-forced answer's NLL under a method, each unit's NLL gain when it
alone keeps full attention, and greedy selection that re-scores given the units already kept.

A calibration is hundreds of NLL runs (four 4K-token prompts each, about a minute on one thread),
and within a greedy step or a set of single-unit scores they do not depend on one another:
:func:`mean_nlls` takes a batch of specs and, given :class:`NllWorkers`, sends the runs its memo does
not hold to the evaluation's schedulers (``eval/scheduler.py``: local worker processes, each with its
own model copy, or Ray tasks), keeping each run in the memo as it comes back. Without workers the
runs go one after another in this process; the values are the same either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..runtime.make_cache import make_cache
from ..runtime.method import use_method
from ..runtime.prefill import prefill
from ..runtime.spec import MethodSpec, parse_spec
from .memo import Memo, prompts_digest
from .prompts import CalibrationPrompt
from .units import Unit, check_base_spec, spec_with_units

__all__ = [
    "answer_nll",
    "mean_nll",
    "mean_nlls",
    "NllWorkers",
    "nll_workers",
    "nll_key",
    "nll_scores",
    "base_gains",
]


@torch.no_grad()
def answer_nll(model, prompt: CalibrationPrompt, chunk_size: int = 512) -> float:
    """Mean NLL (nats) of the gold answer tokens after the prompt, under the model's active method.

    The prompt goes through chunked prefill keeping only the last position's logits (the lm head
    over every prompt position would cost a fifth of the run), then the answer is teacher-forced
    through the same cache.
    """
    answer = prompt.answer_ids
    last, cache = prefill(
        model, prompt.input_ids, chunk_size=chunk_size, cache=make_cache(model), return_logits="last"
    )
    logits = [last[:, None]]
    if answer.shape[1] > 1:
        rest, _ = prefill(model, answer[:, :-1], chunk_size=chunk_size, cache=cache, return_logits="all")
        logits.append(rest)
    lp = F.log_softmax(torch.cat(logits, dim=1)[0].float(), dim=-1)  # [a, vocab]
    return float(-lp.gather(-1, answer[0].to(lp.device)[:, None]).mean())


def nll_key(spec: MethodSpec | str, prompts: Sequence[CalibrationPrompt], chunk_size: int,
            native_sliding: str) -> dict:  # fmt: skip
    """What a mean answer NLL depends on, within one model: its :class:`Memo` key."""
    return {"kind": "nll", "spec": str(spec), "native_sliding": native_sliding, "chunk_size": chunk_size,
            "prompts": prompts_digest(prompts)}  # fmt: skip


def mean_nll(
    model,
    spec: MethodSpec,
    prompts: Sequence[CalibrationPrompt],
    chunk_size: int,
    bar,
    native_sliding: str = "override",
    memo: Memo | None = None,
) -> float:
    """Mean of ``answer_nll`` over ``prompts`` with ``model`` put into ``spec`` (left there).

    With a ``memo`` holding this run (``nll_key``) the stored NLL comes back and the model is not
    touched; a computed one is stored there before it is returned.
    """
    key = None if memo is None else nll_key(spec, prompts, chunk_size, native_sliding)
    if key is not None and (hit := memo.get(key)) is not None:
        if bar is not None:
            bar.update(len(prompts))
        return float(hit)
    t0 = time.process_time()
    use_method(model, spec, native_sliding=native_sliding)
    total = 0.0
    for p in prompts:
        total += answer_nll(model, p, chunk_size)
        if bar is not None:
            bar.update(1)
    nll = total / len(prompts)
    if key is not None:
        memo.put(key, nll, time.process_time() - t0)
    return nll


@dataclass(frozen=True)
class NllWorkers:
    """Where a batch of NLL runs goes besides this process (:func:`mean_nlls`).

    Attributes:
        scheduler: an ``eval.scheduler.Scheduler`` (``make_scheduler(workers, ray)``).
        load: ``() -> (model, tokenizer)``, picklable: how each worker gets its own model copy.
    """

    scheduler: Any
    load: Callable[[], tuple]


def nll_workers(
    workers: int | str | None, ray: str | bool | None, load: Callable[[], tuple]
) -> NllWorkers | None:
    """The :class:`NllWorkers` ``--workers N`` / ``--ray [ADDRESS]`` ask for (neither: ``None``, this
    process). Runs are handed out in batch order (no method affinity: each run is its own spec)."""
    if workers is None and ray in (None, False):
        return None
    from ..eval.scheduler import make_scheduler

    return NllWorkers(make_scheduler(workers, ray, keep_method=False), load)


@dataclass(frozen=True)
class _NllJob:
    """What a worker needs besides its model: the prompts and how to run them."""

    prompts: tuple
    chunk_size: int
    native_sliding: str


def _nll_cell(job: _NllJob, cell, model_and_tokenizer: tuple, state: dict) -> list[dict]:
    """One NLL run where a scheduler put it: ``cell.method`` on every prompt, with its CPU seconds."""
    t0 = time.process_time()
    nll = mean_nll(model_and_tokenizer[0], parse_spec(cell.method), job.prompts, job.chunk_size, None,
                   job.native_sliding)  # fmt: skip
    return [{"nll": nll, "cpu_s": time.process_time() - t0}]


def mean_nlls(
    model,
    specs: Sequence[MethodSpec | str],
    prompts: Sequence[CalibrationPrompt],
    chunk_size: int,
    bar=None,
    native_sliding: str = "override",
    memo: Memo | None = None,
    workers: NllWorkers | None = None,
) -> list[float]:
    """:func:`mean_nll` of each spec, in order (a spec given twice runs once).

    Without ``workers`` the runs go one after another here (``model`` is left in the last one). With
    ``workers`` the runs the memo does not hold go out as one batch and ``model`` is not touched;
    each is kept in the memo, with the CPU seconds its worker spent, as soon as it comes back, so a
    stopped batch loses only the runs in flight.

    Raises:
        CellsFailedError: runs that failed in their workers after the scheduler's retries.
    """
    unique = list(dict.fromkeys(str(s) for s in specs))
    if workers is None:
        found = {
            s: mean_nll(model, parse_spec(s), prompts, chunk_size, bar, native_sliding, memo) for s in unique
        }
        return [found[str(s)] for s in specs]
    from ..eval.scheduler import Cell, CellJob, CellsFailedError

    found: dict[str, float] = {}
    todo: list[str] = []
    for s in unique:
        hit = None if memo is None else memo.get(nll_key(s, prompts, chunk_size, native_sliding))
        if hit is None:
            todo.append(s)
        else:
            found[s] = float(hit)
            if bar is not None:
                bar.update(len(prompts))
    if todo:
        length = int(prompts[0].input_ids.shape[1])
        cells = [Cell("calibration", s, "nll", length, 0, (i,)) for i, s in enumerate(todo)]
        job = CellJob(_NllJob(tuple(prompts), chunk_size, native_sliding), workers.load, _nll_cell)

        def done(cell, rows: list[dict]) -> None:
            found[cell.method] = float(rows[0]["nll"])
            if memo is not None:
                memo.put(nll_key(cell.method, prompts, chunk_size, native_sliding), found[cell.method],
                         rows[0]["cpu_s"], elsewhere=True)  # fmt: skip
            if bar is not None:
                bar.update(len(prompts))

        failures = workers.scheduler.run(job, cells, done)
        if failures:
            raise CellsFailedError(failures)
    return [found[str(s)] for s in specs]


def nll_scores(
    model,
    base: MethodSpec | str,
    prompts: Sequence[CalibrationPrompt],
    units: Sequence[Unit],
    *,
    bar=None,
    **run,
) -> tuple[float, list[float]]:
    """NLL gain of each unit kept full alone: ``nll(base) - nll(base+full:unit)``.

    ``run``: how the runs go, by :class:`~.criteria.ScoringRun`'s fields (``chunk_size``,
    ``native_sliding``, ``memo``: finished runs to reuse and keep, ``workers``: where the runs go,
    :func:`mean_nlls`). Leaves the model in full attention.

    Returns:
        ``(nll of base, [gain per unit])``, nats per answer token, averaged over prompts.
    """
    from .criteria import ScoringRun

    return base_gains(ScoringRun(model, prompts, [base], units, **run), base, bar)


def base_gains(run, base: MethodSpec | str, bar=None) -> tuple[float, list[float]]:
    """:func:`nll_scores` of ``run``'s units on one of its bases (a :class:`~.criteria.ScoringRun`)."""
    base = check_base_spec(base)
    try:
        ref, *nlls = mean_nlls(run.model, [base, *(spec_with_units(base, [u]) for u in run.units)], run.prompts,
                               run.chunk_size, bar, run.native_sliding, run.memo, run.workers)  # fmt: skip
        gains = [ref - v for v in nlls]
    finally:
        use_method(run.model, "full")
    return ref, gains

"""The ``nll`` criterion: the teacher-forced answer's NLL under a method, each unit's NLL gain when it
alone keeps full attention, and greedy selection that re-scores given the units already kept."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ..method import use_method
from ..patch import make_cache
from ..prefill import prefill
from ..spec import MethodSpec
from .memo import Memo, prompts_digest
from .prompts import CalibrationPrompt
from .units import Unit, check_base_spec, spec_with_units, unit_label

__all__ = ["answer_nll", "mean_nll", "nll_key", "nll_scores", "greedy_select", "greedy_runs"]


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


def nll_scores(
    model,
    base: MethodSpec | str,
    prompts: Sequence[CalibrationPrompt],
    units: Sequence[Unit],
    *,
    chunk_size: int = 512,
    bar=None,
    native_sliding: str = "override",
    memo: Memo | None = None,
) -> tuple[float, list[float]]:
    """NLL gain of each unit kept full alone: ``nll(base) - nll(base+full:unit)``.

    Leaves the model in full attention. ``memo``: finished runs to reuse and keep (``mean_nll``).

    Returns:
        ``(nll of base, [gain per unit])``, nats per answer token, averaged over prompts.
    """
    base = check_base_spec(base)
    try:
        ref = mean_nll(model, base, prompts, chunk_size, bar, native_sliding, memo)
        gains = [
            ref - mean_nll(model, spec_with_units(base, [u]), prompts, chunk_size, bar, native_sliding, memo)
            for u in units
        ]
    finally:
        use_method(model, "full")
    return ref, gains


def greedy_select(
    candidates: Sequence[Unit],
    k: int,
    nll_of: Callable[[list[Unit]], float],
    *,
    first: dict[Unit, float] | None = None,
) -> tuple[list[Unit], list[dict]]:
    """Forward selection: keep adding the candidate whose addition gives the lowest NLL.

    Args:
        candidates: the units that may be kept, in the order that breaks ties (best single first).
        k: units to keep, at most ``len(candidates)``.
        nll_of: mean NLL with a list of units kept full (on top of the base).
        first: NLL of each candidate kept alone, when already known (step 1 then costs nothing).

    Returns:
        ``(chosen, steps)``: the units in the order they were added, and per step
        ``{"added": label, "nll": NLL with the units so far, "tried": {label: NLL}}``.
    """
    if not 0 <= k <= len(candidates):
        raise ValueError(f"K={k} units asked from a pool of {len(candidates)}: give a --pool of at least K")
    chosen: list[Unit] = []
    steps: list[dict] = []
    for step in range(k):
        rest = [u for u in candidates if u not in chosen]
        if step == 0 and first is not None:
            tried = {u: float(first[u]) for u in rest}
        else:
            tried = {u: float(nll_of([*chosen, u])) for u in rest}
        best = min(rest, key=lambda u: (tried[u], rest.index(u)))  # ties: the earlier candidate
        chosen.append(best)
        steps.append(
            {
                "added": unit_label(best),
                "nll": tried[best],
                "tried": {unit_label(u): v for u, v in tried.items()},
            }
        )
    return chosen, steps


def greedy_runs(pool: int, k: int) -> int:
    """Prompt passes greedy selection adds to the single-unit scores (step 1 reuses them)."""
    return sum(pool - i for i in range(1, k))

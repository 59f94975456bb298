"""The one way tuning measures a spec: the evaluation runner's cells (``eval/runner.py``).

A :class:`SampleSet` names what is measured (a task family at one context, a seed or essay windows,
the decoding settings); :func:`eval_config` turns it into the runner's ``EvalConfig``. ``tune``
scores its candidates in memory (:func:`measure`: ``runner.plan`` / ``runner.run_cell``, the
samples built once for every spec), ``frontier`` in a resumable run folder (:func:`measure_in_folder`:
``runner.run_eval``); the rows are the runner's either way.

S-NIAH and BABILong scores are fractions in [0, 1] with Wilson 95% intervals; S-NIAH decodes the
answer's length + 16 tokens (the runner's ``auto`` cap) unless told otherwise, and BABILong uses the
seeded bAbI generator (``babilong_facts="generated"``) because the released questions do not depend
on the seed. ``ppl`` scores the negative NLL per token (nats) on essay windows chosen by
:func:`ppl_splits`, with a bootstrap interval over windows.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..runtime.method import use_method
from ..runtime.spec import MethodSpec, parse_spec

__all__ = [
    "EVAL_PPL_WINDOWS",
    "Measurement",
    "SampleSet",
    "eval_config",
    "family_tasks",
    "measure",
    "measure_all",
    "measure_in_folder",
    "ppl_splits",
]

# `sinkwindow eval ppl` reads essay windows 0..9 by default (--samples 10); tuning never reads them.
EVAL_PPL_WINDOWS = 10


def family_tasks(task: str) -> tuple[str, ...]:
    """The runner tasks a family averages: ``niah`` -> S-NIAH-1/2/3, ``babilong`` -> QA1-5, ``ppl``."""
    from ..eval.tasks import ALL_TASKS, GROUPS

    if task in GROUPS:
        return GROUPS[task]
    if task in ALL_TASKS:
        return (task,)
    raise ValueError(f"unknown task {task!r}: choose from {', '.join(GROUPS)} (or one runner task)")


@dataclass(frozen=True)
class SampleSet:
    """What a spec is measured on.

    Attributes:
        task: a family (``niah``, ``babilong``, ``ppl``) or one runner task.
        samples: per task (ppl: ignored; ``windows`` says which).
        seed: the samples' seed (S-NIAH, BABILong; ``None`` for ppl).
        windows: essay-window indices (ppl; see :func:`ppl_splits`).
        batch_size: samples decoded as one batch (default: the runner's).
        name: the model's name in the rows.
        niah_max_new_tokens: the decoding cap; ``None``: the answer's tokens + 16.
    """

    task: str
    context: int
    samples: int
    seed: int | None
    windows: Sequence[int] | None = None
    chunk_size: int = 512
    batch_size: int | None = None
    name: str = "model"
    native_sliding: str = "override"
    niah_max_new_tokens: int | None = None


@dataclass
class Measurement:
    """One spec's score on one sample set.

    Attributes:
        score: S-NIAH / BABILong: mean of 0/1 scores (every task has the same n, so this is also
            the task average); ppl: negative NLL per token (nats).
        lo, hi: 95% interval (Wilson for accuracy, bootstrap over windows for ppl).
        n: samples (all tasks together) or windows.
        per_task: each task's mean.
        seed: the samples' seed (``None`` for ppl, whose windows are in ``windows``).
    """

    spec: str
    metric: str
    score: float
    lo: float
    hi: float
    n: int
    per_task: dict[str, float] = field(default_factory=dict)
    seed: int | None = None
    windows: list[int] | None = None
    seconds: float = 0.0


def eval_config(samples: SampleSet, specs: Sequence[str], *, workers=None, ray=None):
    """The runner's ``EvalConfig`` for ``specs`` on ``samples`` (BABILong from the seeded generator)."""
    from ..eval.runner import EvalConfig

    tasks = family_tasks(samples.task)
    babilong = (
        {"babilong_lengths": [samples.context], "babilong_facts": "generated"}
        if any(t.startswith("babilong") for t in tasks)
        else {}
    )
    return EvalConfig(model=samples.name, methods=list(specs), tasks=list(tasks), lengths=[samples.context],
                      samples=samples.samples, seed=samples.seed, chunk_size=samples.chunk_size,
                      native_sliding=samples.native_sliding, niah_max_new_tokens=samples.niah_max_new_tokens,
                      batch_size=samples.batch_size, workers=workers, ray=ray, **babilong)  # fmt: skip


def ppl_splits(tokenizer, context: int, calibration: int, heldout: int) -> tuple[list[int], list[int]]:
    """Essay-window indices for calibration and held-out perplexity at ``context`` tokens.

    Held-out takes the last ``heldout`` windows of the essay stream, calibration the ``calibration``
    before them; neither touches the first ``EVAL_PPL_WINDOWS`` (``sinkwindow eval ppl``'s).
    """
    from ..eval.generators.haystack import load_essays
    from ..eval.perplexity import bos_prefix

    sep = len(tokenizer("\n\n", add_special_tokens=False).input_ids)
    total = sum(len(tokenizer(t, add_special_tokens=False).input_ids) + sep for _, t in load_essays())
    available = total // (context - len(bos_prefix(tokenizer)))
    first = available - heldout - calibration
    if first < EVAL_PPL_WINDOWS:
        raise ValueError(
            f"the essays hold {available} windows of {context} tokens; {EVAL_PPL_WINDOWS} are evaluation's, "
            f"leaving {max(0, available - EVAL_PPL_WINDOWS)} for {calibration} calibration + {heldout} held-out: "
            f"ask for fewer --samples / --heldout-samples, or a shorter --context"
        )
    return list(range(first, first + calibration)), list(range(available - heldout, available))


def _essay_windows(tokenizer, context: int, indices: Sequence[int], state: dict) -> list[torch.Tensor]:
    from ..eval.perplexity import essay_token_windows

    # Tokenising the essays takes about a second; every candidate reads the same windows.
    cache = state.setdefault("essay_windows", {})
    need = max(indices) + 1
    if len(cache.get(context, ())) < need:
        cache[context] = essay_token_windows(tokenizer, context, need)
    return [cache[context][i] for i in indices]


def measure(
    model, tokenizer, spec: MethodSpec | str, task: str, context: int, samples: int, seed: int | None,
    **options,
) -> Measurement:  # fmt: skip
    """Score ``spec`` on ``samples`` samples per task of ``task`` (a family or one runner task).

    ``options``: the other fields of :class:`SampleSet` (``windows`` for ppl, ``chunk_size``,
    ``batch_size``, ``name``, ...), and ``state``: the eval runner's per-model cache (built samples,
    current method); pass the same dict for every spec measured on the same seed, so samples are
    built once.
    """
    state = options.pop("state", None)
    return measure_on(model, tokenizer, spec, SampleSet(task, context, samples, seed, **options), state)


@torch.no_grad()
def measure_on(
    model, tokenizer, spec: MethodSpec | str, samples: SampleSet, state: dict | None = None
) -> Measurement:
    """:func:`measure` of one spec on a :class:`SampleSet`."""
    from ..eval.stats import wilson_interval

    spec = str(parse_spec(spec))
    tasks = family_tasks(samples.task)
    state = {} if state is None else state
    t0 = time.perf_counter()
    if tasks == ("ppl",):
        return _measure_ppl(model, tokenizer, spec, samples, state, t0)
    from ..eval.runner import default_batch_size, plan, run_cell

    cfg = eval_config(samples, [spec])
    # Something else may have switched the model since this state last saw it: switch again.
    state.pop("method", None)
    rows = []
    for cell in plan(cfg, batch_size=default_batch_size(cfg, model)):
        rows += run_cell(cfg, cell, (model, tokenizer), state)
    scores = [r["score"] / 100.0 for r in rows]
    interval = wilson_interval(sum(scores), len(scores))
    per_task = {t: sum(r["score"] for r in rows if r["task"] == t) / 100.0 / samples.samples for t in tasks}
    return Measurement(
        spec, "accuracy", interval.estimate, interval.lo, interval.hi, interval.n, per_task, samples.seed, None,
        round(time.perf_counter() - t0, 2),
    )  # fmt: skip


def _measure_ppl(model, tokenizer, spec: str, samples: SampleSet, state: dict, t0: float) -> Measurement:
    """The negative NLL per token of ``spec`` on the essay windows ``samples.windows``."""
    from ..eval.perplexity import perplexity
    from ..eval.stats import bootstrap_ppl_interval

    if not samples.windows:
        raise ValueError("ppl is measured on essay windows: give their indices (ppl_splits)")
    use_method(model, spec)
    nll, count = [], []
    for w in _essay_windows(tokenizer, samples.context, samples.windows, state):
        res = perplexity(model, w, chunk_size=samples.chunk_size)
        nll.append(res.nll_sum)
        count.append(res.n_tokens)
    ppl = bootstrap_ppl_interval(nll, count)
    return Measurement(
        spec, "neg_nll", -math.log(ppl.estimate), -math.log(ppl.hi), -math.log(ppl.lo), len(nll),
        {"ppl": -sum(nll) / sum(count)}, None, list(samples.windows), round(time.perf_counter() - t0, 2),
    )  # fmt: skip


def measure_all(
    model, tokenizer, specs: Sequence[str], samples: SampleSet, progress: bool = False
) -> dict[str, Measurement]:
    """:func:`measure` of each spec on one sample set (samples built once), with a tqdm bar if asked."""
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(specs), desc="candidates", unit="spec")
    state: dict = {}
    out = {}
    try:
        for spec in specs:
            if bar is not None:
                bar.set_postfix_str(spec)
            out[spec] = measure_on(model, tokenizer, spec, samples, state)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return out


def measure_in_folder(model_and_tokenizer: tuple, specs: Sequence[str], samples: SampleSet, out, options):
    """Every spec on ``samples`` through ``runner.run_eval`` into the resumable run folder ``out``;
    its results store. ``options`` (a ``RunOptions``): progress, workers or Ray, the workers' model
    factory and the source diff the rows record."""
    from ..eval.runner import run_eval

    cfg = eval_config(samples, specs, workers=options.workers, ray=options.ray)
    return run_eval(cfg, str(out), model_and_tokenizer=model_and_tokenizer, progress=options.progress,
                    model_factory=options.model_factory, source_diff=options.source_diff)  # fmt: skip

"""The baseline run: B under full attention, B under SWA at C's memory (and two neighbours), and C,
on the same samples, into one run folder.

The base's rows are the evaluation runner's own cells (``runner.plan`` + ``runner.run_cell``), so a
retrofit candidate (``lolcats:256``) gives exactly the rows ``compare`` gives for that method. A
candidate model of its own runs the same tasks on the same prompts as it is (no ``use_method``: its
layers are not attention sinkwindow can patch), one sample at a time. Every row adds what the
comparison needs: its ``role``, the measured ``state_bytes`` and how they were measured, and, for
SWA rows, the chosen window and why. ``baseline.json`` records the choice and the state curves.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ...models.loading import load
from ...runs.folder import RunLock, check_run_dir
from ...runs.provenance import utc_now
from ...runtime.method import use_method
from ..decoding import eos_ids
from ..fingerprint import model_identity, run_settings
from ..results import ResultsStore
from ..runner import EvalConfig, default_batch_size, plan, planned_keys, run_cell
from ..tasks import BABILONG_TASKS, NIAH_TASKS, TASKS
from .candidate import Candidate, check_same_prompts, check_same_vocab, load_candidate, parse_candidate
from .state import STATE_SOURCE, measure_state_bytes
from .window import equal_memory_window, neighbour_windows, swa_bound_bytes

__all__ = ["BaselineConfig", "run_baseline", "BASELINE_FILE", "QUICK"]

logger = logging.getLogger(__name__)

BASELINE_FILE = "baseline.json"
# compare --quick's S-NIAH and BABILong cells (eval/cli.py COMPARE_SIZES["quick"]).
QUICK = dict(lengths=[512, 2048], babilong_lengths=[0, 1024], ppl_lengths=[2048], ppl_windows=1, samples=2)


@dataclass
class BaselineConfig:
    """What a baseline run is asked (``baseline.json`` records it).

    Attributes:
        candidate: a model (hub id, folder, ``.gguf``) or a retrofit spec of the base (``lolcats:256``).
        base: the transformer the candidate came from.
        tasks: any registry tasks (default: S-NIAH-1/2/3 and BABILong QA1-5).
        lengths: every task's lengths; ``None``: ``compare --quick``'s (S-NIAH 0.5K, 2K; BABILong 0K, 1K).
        samples: per task and length; ``None``: the quick size's 2.
        sinks: S of SWA(W, S).
        state_lengths: contexts the state-bytes plot measures; ``None``: powers of two up to the
            longest evaluated context, and that context.
    """

    candidate: str
    base: str
    tasks: list[str] = field(default_factory=lambda: [*NIAH_TASKS, *BABILONG_TASKS])
    lengths: list[int] | None = None
    samples: int | None = None
    seed: int = 42
    chunk_size: int = 512
    sinks: int = 4
    checkpoints: dict[str, str] = field(default_factory=dict)
    trust_remote_code: bool = False
    dtype: str | None = None
    device: str | None = None
    batch_size: int | None = None
    state_lengths: list[int] | None = None

    def eval_config(self, model: str, methods: list[str]) -> EvalConfig:
        """The runner's config for ``model`` under ``methods`` (validates tasks, lengths, checkpoints)."""
        sizes = dict(QUICK, niah_max_new_tokens=None)
        if self.lengths is not None:
            sizes.update(lengths=self.lengths, babilong_lengths=self.lengths, ppl_lengths=self.lengths)
        if self.samples is not None:
            sizes["samples"] = self.samples
        cfg = EvalConfig(
            model=model, methods=methods, tasks=list(self.tasks), seed=self.seed, chunk_size=self.chunk_size,
            checkpoints=dict(self.checkpoints), dtype=self.dtype, device=self.device,
            batch_size=self.batch_size, **sizes,
        )  # fmt: skip
        for name in cfg.tasks:
            task = TASKS[name]
            short = [
                n
                for n in task.lengths(cfg)
                if n < task.min_length and not (n == 0 and task.group == "babilong")
            ]
            if short:
                raise ValueError(f"{name} needs lengths >= {task.min_length} tokens, got {short}")
        return cfg


def _prompts(cfg: EvalConfig, tokenizer, state: dict) -> dict[tuple, list]:
    """``{(task, length): [prompt ids [1, n] per sample]}``, building the samples into ``state``
    as ``Task.run`` would (so the run reuses them). Perplexity has no prompts: left out."""
    out = {}
    cache = state.setdefault("samples", {})
    for name in cfg.tasks:
        task = TASKS[name]
        if task.group == "ppl":
            continue
        for length in task.lengths(cfg):
            if (name, length) not in cache:
                cache[(name, length)] = task.build_samples(tokenizer, length, cfg)
            out[(name, length)] = [task.prepare(tokenizer, s, cfg)[0] for s in cache[(name, length)]]
    return out


def _contexts(cfg: EvalConfig, prompts: dict) -> dict[tuple, int]:
    """Where each (task, length)'s state is measured: the length (prompt + answer budget), or for
    BABILong's 0K (facts only, no budget) its longest prompt."""
    out = {}
    for name in cfg.tasks:
        for length in TASKS[name].lengths(cfg):
            longest = max((p.shape[-1] for p in prompts.get((name, length), ())), default=length)
            out[(name, length)] = length or longest
    return out


class _StateMeter:
    """Measured state bytes, remembered by (role, method, context): one prefill each."""

    def __init__(self, chunk_size: int):
        self.chunk_size = chunk_size
        self.seen: dict[tuple, int] = {}

    def __call__(self, model, key: tuple, n: int) -> int:
        if (*key, n) not in self.seen:
            self.seen[(*key, n)] = measure_state_bytes(model, n, chunk_size=self.chunk_size)
        return self.seen[(*key, n)]


def _switch(model, spec: str, cfg: EvalConfig, state: dict):
    """Put the base into ``spec`` and tell the runner's per-model state (``run_cell`` then skips it)."""
    use_method(model, spec, checkpoint=cfg.checkpoints.get(spec), native_sliding=cfg.native_sliding)
    state["method"] = spec
    return model


def _choose_window(config: BaselineConfig, base_model, budget: int, context: int, meter, state, cfg) -> dict:
    """SWA's W at ``budget`` bytes from the base's per-token KV bytes, confirmed by a measured prefill.

    A measured cache above the budget (a cache keeping more than its analytic bound) steps W down
    until it fits.
    """
    dtype = base_model.dtype
    window = equal_memory_window(base_model.config, budget, config.sinks, dtype)
    for _ in range(8):
        spec = f"swa:{window}:{config.sinks}"
        measured = meter(_switch(base_model, spec, cfg, state), ("base", spec), context)
        if measured <= budget or window <= config.sinks + 1:
            break
        per_token = max(1, swa_bound_bytes(base_model.config, window, config.sinks, dtype) // (window - 1))
        window = max(config.sinks + 1, window - -(-(measured - budget) // per_token))
    return {
        "window": window,
        "sinks": config.sinks,
        "budget_bytes": budget,
        "budget_context": context,
        "swa_bound_bytes_analytic": swa_bound_bytes(base_model.config, window, config.sinks, dtype),
        "swa_bytes_measured": measured,
        "within_window_at_context": window - 1 >= context,
        # A window past the context is full attention at every length evaluated: not run again.
        "neighbours": [n for n in neighbour_windows(window, config.sinks) if n - 1 < context],
        "neighbours_left_out": [n for n in neighbour_windows(window, config.sinks) if n - 1 >= context],
        "why": f"largest W whose SWA(W, {config.sinks}) cache bound ((W - 1) tokens x the base's per-token KV "
        f"bytes, every layer) is <= the candidate's state, {budget:,} bytes measured after a prefill of {context} tokens; "
        f"the base's SWA cache measured the same way after {context} tokens holds {measured:,} bytes",
    }


def _roles(cand: Candidate, choice: dict, sinks: int) -> dict[str, dict]:
    """``{method on the base: role}`` and the candidate's, in table order."""
    w = choice["window"]
    out = {"full": {"role": "base-full"}}
    for n in sorted({*choice["neighbours"], w}):
        out[f"swa:{n}:{sinks}"] = {
            "role": "base-swa" if n == w else "base-swa-neighbour",
            "window_choice": choice["why"]
            if n == w
            else f"power-of-two neighbour of the equal-memory W = {w}",
        }
    if cand.is_method:
        out[cand.spec] = {"role": "candidate"}
    return out


def _row_extra(meter, model, key: tuple, n: int, info: dict) -> dict:
    return {
        **info,
        "state_bytes": meter(model, key, n),
        "state_bytes_source": STATE_SOURCE.format(n=n),
        "state_context": n,
    }


def _candidate_cell(cfg: EvalConfig, cell, pair: tuple, state: dict) -> list[dict]:
    """``run_cell`` for a candidate model of its own: the task on the model as it is (no method switch)."""
    model, tokenizer = pair
    t0 = time.perf_counter()
    rows = TASKS[cell.task].run(model, tokenizer, cell.length, cell.indices, cfg, state)
    seconds = round((time.perf_counter() - t0) / len(cell.indices), 3)
    base = {"model": cell.model, "task": cell.task, "method": cell.method, "length": cell.length,
            "seed": cell.seed, "fingerprint": cell.fingerprint}  # fmt: skip
    for i, row in zip(cell.indices, rows):
        row.update(base, index=i, seconds=seconds)
    return rows


def _settings(config: BaselineConfig, cfg_b: EvalConfig, base_model, cand: Candidate, cand_model) -> dict:
    """The base's run settings plus the candidate's identity and the sink count: a resume with
    another candidate, another file behind it or other sinks is refused."""
    settings = run_settings(cfg_b, base_model)
    settings["candidate"] = cand.name
    settings["baseline_sinks"] = config.sinks
    if not cand.is_method:
        settings["candidate_file"] = model_identity(cand.name, cand_model)
    return settings


def _run_cells(store, cells, fn, extra, on_row) -> None:
    for cell in cells:
        rows = fn(cell)
        info = extra(cell)
        for row in rows:
            if store.has(row):
                continue
            row = {**row, **info, "written": utc_now("microseconds")}
            store.append(row)
            if on_row is not None:
                on_row(row)


def _state_curves(
    config, cfg_b, base_model, cand_pair, cand: Candidate, choice, meter, state, lengths
) -> dict:
    """State bytes against context for B full, B SWA at equal memory and C: ``{label: [[n, bytes], ...]}``."""
    swa = f"swa:{choice['window']}:{config.sinks}"
    curves = {}
    for label, spec in (("B full", "full"), (f"B SWA({choice['window']}, {config.sinks})", swa)):
        model = _switch(base_model, spec, cfg_b, state)
        curves[label] = [[n, meter(model, ("base", spec), n)] for n in lengths]
    if cand.is_method:
        model, key = _switch(base_model, cand.spec, cfg_b, state), ("base", cand.spec)
    else:
        model, key = cand_pair[0], ("candidate", "full")
    curves[f"C {cand.name}"] = [[n, meter(model, key, n)] for n in lengths]
    return curves


def _curve_lengths(config: BaselineConfig, context: int) -> list[int]:
    if config.state_lengths:
        return sorted(set(config.state_lengths))
    return sorted({*(1 << k for k in range(7, 20) if (1 << k) < context), context})


def _load_pairs(config: BaselineConfig, cand: Candidate, base_pair, cand_pair):
    """``(base pair, candidate pair)``: loaded unless given; a retrofit candidate is the base itself."""
    dtype = getattr(torch, config.dtype or "float32")
    device = config.device or "cpu"
    if base_pair is None:
        base_pair = load(config.base, dtype=dtype, device=device)
    if cand.is_method:
        return base_pair, base_pair
    if cand_pair is None:
        cand_pair = load_candidate(
            cand.name, trust_remote_code=config.trust_remote_code, dtype=dtype, device=device
        )
    check_same_vocab(base_pair[1], cand_pair[1], config.base, cand.name)
    return base_pair, cand_pair


def _check_samples(cfg_b, base_tok, cfg_c, cand_tok, states: dict) -> dict:
    """Build both sides' samples (kept for the run) and refuse any prompt that differs; the base's prompts."""
    base_prompts = _prompts(cfg_b, base_tok, states["base"])
    if cfg_c is not None:
        cand_prompts = _prompts(cfg_c, cand_tok, states["candidate"])
        for (task, length), ids in base_prompts.items():
            for i, (a, b) in enumerate(zip(ids, cand_prompts[(task, length)])):
                check_same_prompts(a, b, f"sample {i} of {task} at {length}")
    return base_prompts


def run_baseline(
    config: BaselineConfig,
    out: str | Path,
    *,
    base_pair: tuple | None = None,
    candidate_pair: tuple | None = None,
    new_run: bool = False,
    source_diff: str | None = None,
    on_row=None,
) -> dict:
    """Run (or resume) the pair into ``out``; returns what ``baseline.json`` records.

    Raises:
        ValueError: bad input (tokenizers that differ, a budget below every window, a bad task length,
            a retrofit without its checkpoint), one line each.
        RunMismatchError: ``out`` holds a baseline run with other settings.
    """
    out = check_run_dir(out)
    cand = parse_candidate(config.candidate)
    if not cand.is_method and cand.name == config.base:
        raise ValueError(
            f"--candidate and --base are both {cand.name}: its rows would be the base's own full-attention rows; "
            "give the candidate model (a copy in another folder compares a model with itself)"
        )
    config.eval_config(
        config.base, ["full", *([cand.spec] if cand.is_method else [])]
    )  # refuse bad input early
    base_pair, cand_pair = _load_pairs(config, cand, base_pair, candidate_pair)
    states = {"base": {"eos": eos_ids(base_pair[1], base_pair[0])}}
    if not cand.is_method:
        states["candidate"] = {"eos": eos_ids(cand_pair[1], cand_pair[0]), "method": "full"}
    probe = config.eval_config(config.base, ["full"])
    cfg_c0 = None if cand.is_method else config.eval_config(cand.name, ["full"])
    contexts = _contexts(probe, _check_samples(probe, base_pair[1], cfg_c0, cand_pair[1], states))
    context = max(contexts.values())
    meter = _StateMeter(config.chunk_size)
    if cand.is_method:
        budget = meter(_switch(base_pair[0], cand.spec, probe, states["base"]), ("base", cand.spec), context)
    else:
        budget = meter(cand_pair[0], ("candidate", "full"), context)
    choice = _choose_window(config, base_pair[0], budget, context, meter, states["base"], probe)
    roles = _roles(cand, choice, config.sinks)
    cfg_b = config.eval_config(config.base, list(roles))
    cfg_c = None if cand.is_method else config.eval_config(cand.name, ["full"])
    settings = _settings(config, cfg_b, base_pair[0], cand, cand_pair[0])
    record = {"config": asdict(config), "candidate_kind": "method" if cand.is_method else "model",
              "eval_context": context, "choice": choice, "roles": roles}  # fmt: skip
    stamp = {} if source_diff is None else {"source_diff": source_diff}
    with RunLock(out):
        store = ResultsStore(out, {"kind": "baseline", **record, "base_config": cfg_b.to_dict()},
                             settings=settings, new_run=new_run)  # fmt: skip
        store.select(planned_keys(cfg_b) + (planned_keys(cfg_c) if cfg_c else []))
        _run_base(cfg_b, store, settings, base_pair, states["base"], roles, contexts, meter, stamp, on_row)
        if cfg_c is not None:
            _run_candidate(
                cfg_c, store, settings, cand_pair, states["candidate"], contexts, meter, stamp, on_row
            )
        lengths = _curve_lengths(config, context)
        record["state_curves"] = _state_curves(config, cfg_b, base_pair[0], cand_pair, cand, choice, meter,
                                               states["base"], lengths)  # fmt: skip
        (out / BASELINE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True, default=str))
    use_method(base_pair[0], "full")
    return record


def _run_base(cfg_b, store, settings, pair, state, roles, contexts, meter, stamp, on_row) -> None:
    cells = plan(cfg_b, settings=settings, done=store, batch_size=default_batch_size(cfg_b, pair[0]))

    def extra(cell) -> dict:
        n = contexts.get((cell.task, cell.length), cell.length)
        return {**stamp, **_row_extra(meter, pair[0], ("base", cell.method), n, roles[cell.method])}

    _run_cells(store, cells, lambda cell: run_cell(cfg_b, cell, pair, state), extra, on_row)


def _run_candidate(cfg_c, store, settings, pair, state, contexts, meter, stamp, on_row) -> None:
    # One sample a cell: a foreign model's batched, left-padded decoding is not ours to vouch for.
    cells = plan(cfg_c, settings=settings, done=store, batch_size=1)

    def extra(cell) -> dict:
        n = contexts.get((cell.task, cell.length), cell.length)
        return {**stamp, **_row_extra(meter, pair[0], ("candidate", "full"), n, {"role": "candidate"})}

    _run_cells(store, cells, lambda cell: _candidate_cell(cfg_c, cell, pair, state), extra, on_row)

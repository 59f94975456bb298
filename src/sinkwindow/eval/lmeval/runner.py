"""``run_lmeval``: every (task, method) pair through lm-eval, one row each.

Each pair is a cell (``eval/scheduler.py``): by default they run one after another on one loaded
model, switched between methods in place; ``workers`` / ``ray`` spread them over processes that
each load their own copy. Only the calling process writes rows.

Rows go through the same results store as the long-context evaluation (``eval/results.py``):
``OUT/results.jsonl`` with ``fingerprint.json`` (the settings that can change an lm-eval row,
``fingerprint.lmeval_settings``) and ``config.json`` beside it, under the folder's run lock. A
rerun with the same settings skips the pairs already there; one with other settings (shots,
limit, data files, checkpoint, dtype, ...) is refused naming them, and ``new_run=True`` moves the
old rows aside and starts over in place. Unreadable lines are skipped with a warning.
"""

from __future__ import annotations

import datetime as _dt
import functools
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...runs.folder import RunLock, check_run_dir
from ...runs.provenance import utc_now
from ...runs.session_log import start_session
from ..fingerprint import lmeval_row_fingerprint, lmeval_settings
from ..results import ResultsStore, check_redo, check_resume, row_key
from ..scheduler import (
    Cell,
    CellJob,
    CellsFailedError,
    PickledModel,
    Scheduler,
    SerialScheduler,
    make_scheduler,
)
from .constants import (
    CACHE_DIR,
    DEFAULT_MAX_BATCH_TOKENS,
    SHORT_TASKS,
    SUITE,
    TABLE_FILE,
    TABLE_JSON,
    canonical,
    default_fewshot,
    family,
    headline_metric,
    resolve_task,
)
from .table import write_table
from .tasks import TASKS_DIR
from .tasks import utils as _local

__all__ = ["LmEvalConfig", "run_lmeval", "short_data_available"]

logger = logging.getLogger(__name__)


def short_data_available(data_dir: str | os.PathLike | None) -> bool:
    """True when ``data_dir`` holds the local files of all six tasks."""
    if data_dir is None or not Path(data_dir).is_dir():
        return False
    try:
        for task in SHORT_TASKS:
            _local.find_files(task, data_dir)
    except (FileNotFoundError, KeyError):
        return False
    return True


def _task_manager(data_dir: Path | None):
    from lm_eval.tasks import TaskManager

    from .model import quiet_lm_eval_notices

    quiet_lm_eval_notices()
    if data_dir is None:
        return TaskManager()
    # Only our folder: indexing lm-eval's thousands of stock YAMLs costs seconds and is not needed.
    try:
        return TaskManager(
            include_path=str(TASKS_DIR), include_defaults=False, metadata={"data_dir": str(data_dir)}
        )
    except TypeError:  # a TaskManager without include_defaults: index the stock tasks too
        return TaskManager(include_path=str(TASKS_DIR), metadata={"data_dir": str(data_dir)})


def _limit_for(limit: Any, task: str) -> int | float | None:
    if isinstance(limit, Mapping):
        value = limit.get(task, limit.get(family(task), limit.get("*")))
    else:
        value = limit
    if value is None:
        return None
    value = float(value)
    if value <= 0:
        raise ValueError(f"limit must be positive, got {value}")
    return int(value) if value >= 1 and value == int(value) else value


def _num(x: Any) -> float | None:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def _extract_row(res: dict, lm_task: str) -> dict:
    """Metrics of ``lm_task`` from a ``simple_evaluate`` result (a task or a group such as MMLU)."""
    entry = res.get("groups", {}).get(lm_task) or res["results"][lm_task]
    metrics, stderrs = {}, {}
    for key, value in entry.items():
        if "," not in key or key == "alias":
            continue
        name, _filter = key.split(",", 1)
        if name.endswith("_stderr"):
            stderrs[name.removesuffix("_stderr")] = _num(value)
        elif _num(value) is not None:
            metrics[name] = _num(value)
    n_samples = res.get("n-samples", {})
    n = sum(int(v.get("effective", 0)) for v in n_samples.values())
    out: dict[str, Any] = {"metrics": metrics, "stderrs": stderrs, "n": n}
    subgroups = {}
    for name, sub in res.get("results", {}).items():
        if name != lm_task and name in res.get("groups", {}) and "acc,none" in sub:
            subgroups[canonical(name)] = _num(sub["acc,none"])
    if subgroups:
        out["subgroups"] = subgroups
    return out


def _item_scores(samples: Mapping[str, list[dict]], metrics: Sequence[str]) -> dict | None:
    """Per-item scores from ``simple_evaluate``'s logged samples, for paired intervals in the table.

    Returns ``{"ids": ["<lm task>:<doc id>", ...], "scores": {metric: [0/1 per item]}}`` sorted by
    id (one entry per MMLU question across its subject tasks), or ``None`` when nothing was logged.
    The mean of ``scores[m]`` is the row's ``metrics[m]``: lm-eval's MMLU group weighs subjects by
    their size, i.e. averages over questions.
    """
    items = []
    for task_name, logged in samples.items():
        for s in logged:
            items.append((f"{task_name}:{s['doc_id']}", s))
    if not items:
        return None
    items.sort(key=lambda kv: kv[0])

    def compact(x) -> float | int:
        x = float(x)
        return int(x) if x.is_integer() else x

    return {
        "ids": [k for k, _ in items],
        "scores": {m: [compact(s[m]) for _, s in items] for m in metrics if all(m in s for _, s in items)},
    }


def _evaluate(
    lm, tm, lm_task: str, shots: int, limit, bootstrap_iters: int, batch_size, cache: str | None = None
) -> dict:
    """One ``simple_evaluate`` call; the row's metric fields.

    ``cache``: lm-eval's response cache (``use_cache``: a path prefix, ``_rank0.db`` appended). Each
    answered request is stored as it is computed, so a pair stopped midway resumes from what it
    had; the requests are keyed by their text only, so one cache must serve one (task, method,
    settings) and nothing else.
    """
    import lm_eval
    from lm_eval.api.model import CacheHook

    logger.info("lm-eval %s (%d-shot, limit %s) with %s", lm_task, shots, limit, lm.method)
    t0 = time.perf_counter()
    # None keeps the config's own default (mmlu_local: 5, the rest: 0) without lm-eval logging an
    # "overwriting num_fewshot" warning for each of MMLU's 57 subtasks.
    config_shots = 5 if lm_task.startswith("mmlu_local") else 0
    try:
        res = lm_eval.simple_evaluate(
            model=lm,
            tasks=[lm_task],
            num_fewshot=None if shots == config_shots else shots,
            limit=limit,
            task_manager=tm,
            bootstrap_iters=bootstrap_iters,
            log_samples=True,  # per-item scores: the table's paired intervals need them
            batch_size=batch_size,
            use_cache=cache,
        )
    finally:
        # CachingLM hooks itself into the model: close its database and unhook, or the next pair
        # (another method) would write its answers into this pair's cache.
        hook = getattr(lm, "cache_hook", None)
        if getattr(hook, "dbdict", None) is not None:
            hook.dbdict.close()
        lm.set_cache_hook(CacheHook(None))
    extracted = _extract_row(res, lm_task)
    items = _item_scores(res.get("samples") or {}, list(extracted["metrics"]))
    metric = headline_metric(canonical(lm_task))
    if metric not in extracted["metrics"]:
        metric = "acc"
    return {
        "metric": metric,
        "value": extracted["metrics"].get(metric),
        "stderr": extracted["stderrs"].get(metric),
        **extracted,
        **({"items": items} if items is not None else {}),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _checkpoint_for(checkpoints: Mapping[str, str] | str | None, spec: str) -> str | None:
    from sinkwindow import parse_spec

    if not parse_spec(spec).is_trained:
        return None
    if isinstance(checkpoints, Mapping):
        return checkpoints.get(spec)
    return checkpoints


def _file_safe(method: str) -> str:
    """``method`` as a file name part (``swa:64:4`` -> ``swa-64-4``)."""
    return "".join(c if c.isalnum() else "-" for c in method)


def _pair_key(model_name: str, task: str, method: str) -> tuple:
    """The results store's key of a (task, method) row: no length, seed or index."""
    return row_key({"model": model_name, "task": task, "method": method})


@dataclass
class LmEvalConfig:
    """What :func:`run_lmeval` evaluates, and how (``sinkwindow eval lm-eval``'s flags).

    Attributes:
        model: what :func:`sinkwindow.load` takes; also the row's ``model``.
        methods: method specs; put ``full`` in to get recovery rates.
        tasks: stock names (``SHORT_TASKS``, ``mmlu_<subject>``); lm-eval task names work too;
            ``None``: all six.
        data_dir: folder of local files (the layout docs/data.md gives) -> offline ``*_local``
            tasks; ``None``: stock tasks from the hub.
        limit: items per task (per MMLU subject, as lm-eval counts), a fraction, or
            ``{task: limit}`` (key ``"*"`` for the rest); ``None``: full splits.
        num_fewshot: shots for every task; default 5 for MMLU and 0 otherwise (the paper).
        batch_size: lm-eval batch size (int, or ``"auto"`` on GPU); not part of the fingerprint.
        checkpoints: ``{method: path}`` for linear baselines, or one path for all of them.
        device_map: let accelerate place the model's layers instead of ``device`` (which is then
            not used): ``auto``, ``balanced``, ``sequential`` ... or ``{module: device}``
            (``sinkwindow.load``). The fingerprint records only the device kind it computes on.
        max_batch_tokens: also cap batch size x prompt length (long 5-shot MMLU prompts); ``None``:
            off. Not part of the fingerprint either.
        resume: ``False`` reruns pairs already in the folder (their new rows are appended; the
            table uses the latest). The settings are checked all the same.
        workers: run the pairs in local worker processes (``eval/scheduler.py``), each loading
            its own model copy with one torch thread: a count, or ``"auto"`` (one per core).
            Rows are the same as a serial run's and only this process writes them; neither this
            nor ``ray`` is part of the fingerprint.
        ray: run the pairs as Ray tasks: ``True`` (a local instance) or a cluster address.
    """

    model: str = "smollm2-135m"
    methods: Sequence[str] = ("full", "swa:64:4")
    tasks: Sequence[str] | None = SHORT_TASKS
    data_dir: str | os.PathLike | None = None
    limit: int | float | Mapping[str, int | float | None] | None = None
    num_fewshot: int | None = None
    batch_size: int | str = 8
    checkpoints: Mapping[str, str] | str | None = None
    device: str = "cpu"
    device_map: str | dict | None = None
    dtype: str = "float32"
    max_length: int | None = None
    max_batch_tokens: int | None = DEFAULT_MAX_BATCH_TOKENS
    bootstrap_iters: int = 1000
    resume: bool = True
    workers: int | str | None = None
    ray: str | bool | None = None


def run_lmeval(
    config: LmEvalConfig,
    out_dir: str | os.PathLike | None = None,
    model_and_tokenizer: tuple[Any, Any] | None = None,
    *,
    new_run: bool = False,
    redo: Sequence[str] = (),
    check_only: bool = False,
    on_start: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Evaluate every (task, method) pair with lm-eval; one row each, appended to ``OUT/results.jsonl``.

    One model is loaded (or ``model_and_tokenizer`` used) and switched between methods in place:
    patched with :func:`sinkwindow.apply`, or converted to a trained linear baseline with its
    checkpoint and reverted afterwards. A passed-in model is left running the method it came with.
    With ``workers`` or ``ray``, each worker process does the same on its own copy.

    With ``out_dir``, the rows go through the results store: every row carries ``fingerprint``,
    the hash of the settings that can change it (``fingerprint.lmeval_settings``), recorded in
    ``OUT/fingerprint.json``. Pairs already there with the same fingerprint are not rerun, so an
    interrupted run resumes; a folder whose rows were made with other settings is refused before
    any model loads. The run holds the folder's lock.

    Args:
        out_dir: the run folder; ``None``: nothing is written.
        model_and_tokenizer: ``sinkwindow.load``'s result, to reuse instead of loading the model
            (workers each get a pickled copy of it).
        new_run: move the folder's rows, config, fingerprint and reports to ``previous-<time>/``
            first, and start over in place.
        redo: methods to run again: their rows move to ``previous-<time>/`` and their recorded
            checkpoints are forgotten (a retrained baseline); other rows are kept.
        check_only: stop after checking that ``out_dir`` can resume with these settings
            (raising like a real run would), before anything loads or runs; returns ``[]``.
        on_start: with ``out_dir``, called once before the first pair runs with what this session
            runs (the entry it adds to ``OUT/sessions.jsonl``: ``pairs_to_run``, ``rows_before``,
            ``scheduler``); not called when every pair is already there.

    Returns:
        The rows of all requested pairs (reused ones included), in run order::

            {"suite": "lm-eval", "model", "task", "method", "metric", "value", "stderr",
             "metrics": {"acc", "acc_norm"}, "stderrs": {...}, "n", "limit", "num_fewshot",
             "source": "local"|"hub", "lm_eval_task", "batch_size", "seconds", "time",
             "lm_eval_version", "fingerprint", ["data": {split: path}], ["subgroups": {"mmlu_stem": ...}],
             "items": {"ids": [...], "scores": {"acc": [0/1 per item], ...}}}

        ``value`` is a fraction in [0, 1], as lm-eval reports it.

    Raises:
        RunMismatchError: ``out_dir`` holds rows made with other settings (names them).
        RunLockedError: another run is writing ``out_dir``.
        FileNotFoundError: a local data file is missing (before any model loads).
    """
    specs, plan, data_path = _plan_pairs(config)
    given = model_and_tokenizer[0] if model_and_tokenizer is not None else None
    # A resume picks a stopped pair up from its cache; any other start computes afresh. Not on Ray:
    # a task on another node would write (or fail to write) a path of the driver's disk.
    resumable = out_dir is not None and config.resume and not config.ray
    cache_dir = Path(out_dir).resolve() / CACHE_DIR if resumable else None
    pairs = _make_pairs(config, specs, plan, data_path, given, cache_dir)
    # A pair runs for minutes and a method switch costs seconds: start pairs in plan order (no
    # method affinity), so a stopped run holds full's row beside every other method's.
    scheduler = make_scheduler(
        config.workers, config.ray, model_and_tokenizer=model_and_tokenizer, keep_method=False
    )
    load = pairs.loader()
    if model_and_tokenizer is not None and not isinstance(scheduler, SerialScheduler):
        load = PickledModel(model_and_tokenizer)  # each worker gets its own copy to switch
    job = CellJob(pairs, load=load, cell_fn=_run_pair, close=functools.partial(_hand_back, pairs))
    if out_dir is None:
        return _run_pairs(pairs, scheduler, job, None, resume=False)
    out = check_run_dir(out_dir)
    redo = check_redo(redo, specs)
    if not new_run:
        check_resume(out, pairs.settings, redo)  # refuse before spending the model load
    if check_only:
        return []
    with RunLock(out):
        store = ResultsStore(
            out, _run_record(config, pairs, given), settings=pairs.settings, new_run=new_run, redo=redo
        )
        if store.previous is not None:
            # The table was made from the rows that just moved: it goes with them.
            for name in (TABLE_FILE, TABLE_JSON):
                if (out / name).exists():
                    shutil.move(str(out / name), str(store.previous / name))
        store.select({_pair_key(config.model, name, spec) for name, *_ in plan for spec in specs})
        # Starting over (or redoing a method) keeps no half-done answers.
        if new_run or not config.resume:
            shutil.rmtree(out / CACHE_DIR, ignore_errors=True)
        for method in redo:
            pairs.drop_caches(method=method)

        def begin(cells: list[Cell]) -> None:
            session = start_session(
                out,
                device=pairs.device,
                threads="per worker"
                if config.workers is not None or config.ray is not None
                else "this process",
                scheduler=scheduler.describe(len(cells)),
                pairs_to_run=len(cells),
                rows_before=len(store.all_rows()),
            )
            if on_start is not None:
                on_start(session)

        rows = _run_pairs(pairs, scheduler, job, store, resume=config.resume, on_start=begin)
        write_table(out, rows=store.rows())
    return rows


def _plan_pairs(config: LmEvalConfig) -> tuple[list[str], list[tuple], Path | None]:
    """``(specs, plan, data folder)``: the methods once each (checked for a checkpoint), and per task
    ``(name, lm-eval task, shots, limit, files)``. Fails before any model loads when a trained
    method has no checkpoint or a local file is missing."""
    import sinkwindow

    from ...linear.adapters import shipped_adapter  # imports torch: not at --help time

    # A method or task named twice runs once (its second turn would not see the first one's row).
    specs = list(dict.fromkeys(str(sinkwindow.parse_spec(m)) for m in config.methods))
    if not specs:
        raise ValueError("no methods to evaluate")
    for spec in specs:
        if (
            sinkwindow.parse_spec(spec).is_trained
            and _checkpoint_for(config.checkpoints, spec) is None
            and shipped_adapter(config.model, spec) is None
        ):
            raise ValueError(
                f"{spec} is a trained baseline: pass checkpoints={{'{spec}': PATH}} (CLI: --checkpoint)"
            )
    local = config.data_dir is not None
    data_path = _local.resolve_data_dir(config.data_dir) if local else None
    plan: list[tuple] = []
    for task in SHORT_TASKS if config.tasks is None else config.tasks:
        lm_task = resolve_task(task, local)
        name = canonical(lm_task)
        if any(name == planned for planned, *_ in plan):
            continue
        files = _local.find_files(family(name), data_path) if local else None
        shots = config.num_fewshot if config.num_fewshot is not None else default_fewshot(name)
        plan.append((name, lm_task, shots, _limit_for(config.limit, name), files))
    return specs, plan, data_path


def _make_pairs(config: LmEvalConfig, specs, plan, data_path, given, cache_dir: Path | None) -> _Pairs:
    """The pairs' shared facts: placement, fingerprint settings, lm-eval's arguments."""
    import lm_eval

    import sinkwindow
    from sinkwindow.models.resolve import resolve_device

    from .model import resolve_dtype

    device, device_map = config.device, config.device_map
    if device_map is not None:
        from sinkwindow.models.loading import load_device_map

        from ..fingerprint import device_map_kind

        device_map = load_device_map(device_map)
        device = device_map_kind(device_map)  # placement does not change results: only the kind counts
    elif given is None:
        device = resolve_device(device)
    local = data_path is not None
    settings = lmeval_settings(
        config.model,
        specs,
        {name: {"num_fewshot": shots, "limit": lim, "files": files} for name, _, shots, lim, files in plan},
        model=given,
        dtype=str(resolve_dtype(config.dtype)).removeprefix("torch."),
        device=device,
        checkpoints={spec: _checkpoint_for(config.checkpoints, spec) for spec in specs},
        data_source="local" if local else "hub",
        max_length=config.max_length,
        bootstrap_iters=config.bootstrap_iters,
    )
    lm_kwargs = {"batch_size": config.batch_size, "max_length": config.max_length,
                 "max_batch_tokens": config.max_batch_tokens}  # fmt: skip
    return _Pairs(
        model_name=config.model,
        specs=specs,
        plan=plan,
        settings=settings,
        data_path=data_path,
        checkpoints=config.checkpoints,
        lm_kwargs=lm_kwargs,
        device=device if given is None else settings["device"],
        device_map=device_map,
        dtype=config.dtype,
        bootstrap_iters=config.bootstrap_iters,
        came_with=None if given is None else str(sinkwindow.active_spec(given)),
        source="local" if local else "hub",
        version=getattr(lm_eval, "__version__", "unknown"),
        cache_dir=cache_dir,
    )


def _run_record(config: LmEvalConfig, pairs: _Pairs, given) -> dict:
    """The run's ``config.json``."""
    return {
        "kind": "lm-eval",
        "model": config.model,
        "methods": pairs.specs,
        "tasks": [name for name, *_ in pairs.plan],
        "data_dir": None if pairs.data_path is None else str(pairs.data_path),
        "limit": config.limit,
        "num_fewshot": config.num_fewshot,
        "batch_size": config.batch_size,
        "max_batch_tokens": config.max_batch_tokens,
        "max_length": config.max_length,
        "device": pairs.device,
        "device_map": pairs.device_map if given is None else None,
        "dtype": config.dtype if given is None else pairs.settings["dtype"],
        "workers": config.workers,
        "ray": config.ray,
    }


@dataclass(frozen=True)
class _Pairs:
    """The (task, method) pairs of one ``run_lmeval`` call: what every process running them needs.

    It travels to local and Ray workers as the ``CellJob`` config, so it holds no model.
    """

    model_name: str
    specs: list[str]
    plan: list[tuple]  # (task, lm-eval task, shots, limit, {split: path} | None)
    settings: dict
    data_path: Path | None
    checkpoints: Mapping[str, str] | str | None
    lm_kwargs: dict
    device: str
    device_map: str | dict | None
    dtype: Any
    bootstrap_iters: int
    came_with: str | None = None  # the method a caller's model runs, handed back at the end
    source: str = "hub"
    version: str = "unknown"
    cache_dir: Path | None = None  # the run folder's response caches; None: no cache

    def cache_prefix(self, cell: Cell) -> str | None:
        """The response cache of ``cell``'s pair (lm-eval appends ``_rank0.db``), named by its row
        fingerprint, so a cache is only ever read by the same (task, method) with the same settings."""
        if self.cache_dir is None or cell.fingerprint is None:
            return None
        return str(self.cache_dir / f"{cell.task}--{_file_safe(cell.method)}--{cell.fingerprint}")

    def drop_caches(self, cell: Cell | None = None, method: str | None = None) -> None:
        """Delete the response cache of ``cell`` (its row is stored: the cache has no further use),
        or every cache of ``method`` (whatever settings made it: a method being redone)."""
        if self.cache_dir is None:
            return
        if cell is not None:
            pattern = Path(self.cache_prefix(cell)).name + "_rank*.db"
        else:
            pattern = f"*--{_file_safe(method)}--*_rank*.db"
        for path in self.cache_dir.glob(pattern):
            path.unlink(missing_ok=True)

    def loader(self):
        """``() -> (model, tokenizer)``: ``model_name`` as ``sinkwindow.load`` places it; picklable."""
        import sinkwindow

        from .model import resolve_dtype

        placement = (
            {"device_map": self.device_map} if self.device_map is not None else {"device": self.device}
        )
        return functools.partial(
            sinkwindow.load, self.model_name, dtype=resolve_dtype(self.dtype), **placement
        )

    def cells(self, done: Mapping[tuple, dict]) -> tuple[list[Cell], dict[tuple, dict]]:
        """``(cells to run, rows reused)``: one cell per pair ``done`` lacks, task-major, so an
        interrupted run still holds complete (full, method) pairs for the tasks it finished (the
        scheduler starts cells in this order: see ``_run_pairs``' caller)."""
        cells, reused = [], {}
        for name, *_ in self.plan:
            for spec in self.specs:
                fp = lmeval_row_fingerprint(self.settings, name, spec)
                row = done.get((_pair_key(self.model_name, name, spec), fp))
                if row is not None:
                    reused[(name, spec)] = row
                else:
                    cells.append(
                        Cell(self.model_name, spec, name, length=0, seed=0, indices=(0,), fingerprint=fp)
                    )
        return cells, reused


def _run_pair(pairs: _Pairs, cell: Cell, model_and_tokenizer: tuple, state: dict) -> list[dict]:
    """One (task, method) pair through lm-eval (a ``CellJob.cell_fn``): its row, in a list.

    ``state`` keeps the lm-eval model and task manager of this model copy, so later pairs switch
    the method in place (patch, restore, or convert a trained baseline) instead of reloading.
    """
    from .model import SinkWindowLM

    spec, name = cell.method, cell.task
    _, lm_task, shots, lim, files = next(p for p in pairs.plan if p[0] == name)
    ckpt = _checkpoint_for(pairs.checkpoints, spec)
    lm = state.get("lm")
    if lm is None:
        model, tok = model_and_tokenizer
        lm = state["lm"] = SinkWindowLM(
            pretrained=model, tokenizer=tok, method=spec, checkpoint=ckpt, **pairs.lm_kwargs
        )
    elif lm.method != spec:
        lm.set_method(spec, ckpt)
    if "tm" not in state:
        state["tm"] = _task_manager(pairs.data_path)
    batch_size = pairs.lm_kwargs["batch_size"]
    cache = pairs.cache_prefix(cell)
    row = _evaluate(lm, state["tm"], lm_task, shots, lim, pairs.bootstrap_iters, batch_size, cache)
    row.update(
        {
            "suite": SUITE,
            "model": pairs.model_name,
            "task": name,
            "method": spec,
            "limit": lim,
            "num_fewshot": shots,
            "source": pairs.source,
            "lm_eval_task": lm_task,
            "batch_size": batch_size,
            "time": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "lm_eval_version": pairs.version,
            "fingerprint": cell.fingerprint,
        }
    )
    if files is not None:
        row["data"] = {split: str(path) for split, path in files.items()}
    return [row]


def _hand_back(pairs: _Pairs, model_and_tokenizer: tuple, state: dict) -> None:
    """Leave a caller's model running the method it came with (``CellJob.close``)."""
    from .model import switch_method

    if "lm" in state and pairs.came_with is not None:
        switch_method(model_and_tokenizer[0], pairs.came_with)


def _run_pairs(
    pairs: _Pairs,
    scheduler: Scheduler,
    job: CellJob,
    store: ResultsStore | None,
    resume: bool,
    on_start: Callable[[list[Cell]], None] | None = None,
) -> list[dict]:
    """Every pair's row, in plan order; pairs ``store`` holds (same fingerprint) are reused unless
    ``resume`` is off, and new rows are appended to it (by this process) as each pair finishes,
    stamped ``written`` (``runs/session_log.py`` reads a session's wall time from it). ``on_start``
    gets the cells left to run, before the first, when there are any."""
    done: dict[tuple, dict] = {}
    if store is not None and resume:
        for r in store.all_rows():
            if r.get("suite") == SUITE:
                done[(row_key(r), r.get("fingerprint"))] = r  # the latest row of a pair wins
    cells, rows = pairs.cells(done)
    for name, spec in rows:
        logger.info("reusing %s / %s from %s", name, spec, store.path)

    def on_result(cell: Cell, out: list[dict]) -> None:
        (row,) = out
        if store is not None:
            row = {**row, "written": utc_now("microseconds")}
            store.append(row)
            write_table(store.dir, rows=store.rows())
        pairs.drop_caches(cell)
        rows[(cell.task, cell.method)] = row
        logger.info(
            "%s / %s: %s = %.4f (n=%d, %.0fs)",
            cell.task, cell.method, row["metric"], row["value"], row["n"], row["seconds"],
        )  # fmt: skip

    if cells and on_start is not None:
        on_start(cells)
    failures = scheduler.run(job, cells, on_result) if cells else []
    if pairs.cache_dir is not None and pairs.cache_dir.is_dir() and not any(pairs.cache_dir.iterdir()):
        pairs.cache_dir.rmdir()
    if failures:
        raise CellsFailedError(failures)
    return [rows[(name, spec)] for name, *_ in pairs.plan for spec in pairs.specs]

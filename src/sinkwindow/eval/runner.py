"""Run the long-context evaluation for one model and several methods into a results store.

The run is a list of cells (:func:`plan`): one method × task × length × a batch of sample
indices each. A scheduler (``eval/scheduler.py``) runs :func:`run_cell` on every cell: one after
another in this process (the default), in local worker processes (``workers``) or as Ray tasks
(``ray``). Each model copy is loaded once and, for every method, patched (``apply``), converted
(the trained linear baselines) or left as it is (``full``). Samples are generated from the
tokenizer and the seed, so every method, and every worker, sees the same prompts. Only this
process writes the results: each finished cell's rows are appended to ``results.jsonl`` as the
cell finishes. A re-run with the same settings skips what is already there; one with settings
that change results (``eval/fingerprint.py``) is refused unless ``new_run=True``. The run holds the
folder's lock (``runs.RunLock``) from start to end, whichever scheduler runs the cells.

The tasks (perplexity, S-NIAH-1/2/3, BABILong QA1-5) come from the registry in ``eval/tasks/``:
the runner asks a task for its lengths, sample counts and rows, and never branches on its name.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field

import torch

from ..linear.adapters import shipped_adapter
from ..models.loading import load, load_device_map
from ..runs.folder import RunLock, check_run_dir
from ..runs.provenance import utc_now
from ..runs.session_log import start_session
from ..runtime.dtypes import DTYPES
from ..runtime.method import use_method
from ..runtime.prefill import input_device
from ..runtime.spec import parse_spec
from ..runtime.threads import apply_threads, rechoose_threads
from .decoding import eos_ids
from .fingerprint import device_map_kind, row_fingerprint, run_settings
from .results import ResultsStore, check_redo, check_resume, row_key
from .scheduler import (
    Cell,
    CellJob,
    CellsFailedError,
    PickledModel,
    Scheduler,
    SerialScheduler,
    make_scheduler,
)
from .tasks import ALL_TASKS, DEFAULT_TASKS, NIAH_TASKS, RULER_QA, RULER_TASKS, TASKS, deviations

__all__ = [
    "EvalConfig",
    "run_eval",
    "run_cell",
    "plan",
    "planned_keys",
    "DTYPES",
]

logger = logging.getLogger(__name__)

# Samples per batch when none is asked for. CPU: decode is where batching pays (a 4K prefill already
# fills the matrix units), and 8 rows of a 4K full-attention cache stay under 2 GB for SmolLM2;
# see benchmarks/eval_batching.py. GPU: wide batches are cheap.
DEFAULT_BATCH = {"cpu": 8, "cuda": 32}


@dataclass
class EvalConfig:
    """Everything that defines a run (written to ``config.json``).

    Attributes:
        tasks: the tasks to run (default: ``tasks.DEFAULT_TASKS``, the paper's; ``lcc`` and the
            RULER-only tasks, ``niah_multikey_1`` .. ``fwe``, ``qa_1``, ``qa_2``, run when named).
        lengths: token budgets for NIAH, RULER, BABILong and LCC (BABILong ``0`` means 0K: facts only).
        ruler_qa_data: folder with RULER's ``squad.json`` / ``hotpotqa.json`` for ``qa_1`` / ``qa_2``
            (nothing is downloaded); in the fingerprint of those rows only, as a folder identity.
        ppl_lengths: window lengths for perplexity.
        samples: samples per (task, length); ``ppl_windows`` essay windows per perplexity length.
        niah_max_new_tokens: decoding cap for NIAH. RULER decodes up to 128 tokens (and the haystack
            is always sized with 128 reserved). ``None`` ("auto") decodes the reference answer's
            token count + 16, which is all string matching can use; both stop at EOS. Anything
            below 128 is recorded as a deviation.
        niah_depths: ``"random"`` (RULER's draws, the default) or ``"stratified"``: a cell's needle
            depths spread evenly (``niah.generate_niah``); recorded in the fingerprint when not random.
        checkpoints: trained checkpoints for linear baselines, by method string.
        babilong_chat: wrap BABILong prompts in the model's chat template (BABILong does this for
            instruct models).
        babilong_facts: ``"real"``: BABILong's bAbI test questions (the shipped en-10k files,
            BABILong's 100-question subset first, then the other test questions in file order);
            ``"generated"``: sinkwindow's seeded bAbI generator (recorded as a deviation).
        babilong_data: a folder replacing the shipped files: a bAbI folder (``qaN_*_test.txt``)
            or a BABILong JSON folder as the hub dataset ships it (``[data/]qa1/0k.json``),
            whose published samples are used verbatim. Needs ``babilong_facts="real"``.
        dtype: ``float32``, ``bfloat16`` or ``float16`` for the model the runner loads; ``None``:
            float32, or the given model's own dtype (a given model must match a dtype that is set).
        device: where the runner puts the model it loads (``cpu``, ``cuda``, ``cuda:1``, ``auto``);
            ``None``: cpu, or wherever the given model is.
        device_map: instead of ``device``, let accelerate place the layers of the model the runner
            loads (``sinkwindow.load(device_map=...)``), for a model larger than one GPU: ``auto``,
            ``balanced``, ``balanced_low_0``, ``sequential`` or a ``{module: device}`` dict (a JSON
            file's path is read into one here, so ``config.json`` records the map itself). Every
            worker loads with the same map. In the fingerprint only as the device kind it computes
            on (``fingerprint.device_map_kind``): placement does not change results.
        batch_size: samples of one (task, length, method) decoded as one left-padded batch;
            ``None``: ``DEFAULT_BATCH`` for the device (perplexity windows always run one at a
            time). Not part of the run's fingerprint: it must not change results.
        workers: run the cells in local worker processes, each with its own model copy: a count,
            or ``"auto"`` (one per core, at most one per cell); ``None``: in this process.
        ray: run the cells as Ray tasks: ``True`` for a local Ray instance, or a cluster address.
            Neither ``workers`` nor ``ray`` is part of the fingerprint: where a cell runs must
            not change its rows.
        threads: torch CPU threads of a run in this process; ``None``: ``sinkwindow.runtime.threads``
            chooses (1 while other processes load the machine, else every core). Workers get
            their own (one each by default, ``eval/scheduler.py``). The count used goes to
            ``config.json`` as ``torch_threads``; it is not part of the fingerprint: threads do
            not change results.
    """

    model: str = "smollm2-135m"
    methods: list[str] = field(default_factory=lambda: ["full", "swa:64:4", "swa:64:0", "swa:256:4"])
    tasks: list[str] = field(default_factory=lambda: list(DEFAULT_TASKS))
    lengths: list[int] = field(default_factory=lambda: [512, 1024, 2048, 4096])
    babilong_lengths: list[int] | None = None
    ppl_lengths: list[int] = field(default_factory=lambda: [2048])
    samples: int = 10
    ppl_windows: int = 2
    seed: int = 42
    chunk_size: int = 512
    niah_max_new_tokens: int | None = 128
    niah_depths: str = "random"
    babilong_chat: bool = True
    native_sliding: str = "override"
    checkpoints: dict[str, str] = field(default_factory=dict)
    ppl_bucket: int = 128
    babilong_facts: str = "real"
    babilong_data: str | None = None
    ruler_qa_data: str | None = None
    dtype: str | None = None
    device: str | None = None
    device_map: str | dict | None = None
    batch_size: int | None = None
    workers: int | str | None = None
    ray: str | bool | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device is not None and self.device != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, ValueError):
                raise ValueError(
                    f"unknown device {self.device!r}: use cpu, cuda, cuda:N, mps or auto"
                ) from None
        if self.device_map is not None:
            if self.device is not None:
                raise ValueError(
                    "device and device_map both set: drop device (the device map decides where each layer goes)"
                )
            self.device_map = load_device_map(self.device_map)
        if self.batch_size is not None and (not isinstance(self.batch_size, int) or self.batch_size < 1):
            raise ValueError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if self.threads is not None and (
            not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1
        ):
            raise ValueError(f"threads must be a positive integer, got {self.threads!r}")
        if self.workers not in (None, "auto") and (
            not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 1
        ):
            raise ValueError(f"workers must be a positive integer or 'auto', got {self.workers!r}")
        if self.ray is not None and not isinstance(self.ray, (bool, str)):
            raise ValueError(f"ray must be True (a local Ray instance) or an address, got {self.ray!r}")
        if isinstance(self.ray, str) and not self.ray.strip():
            raise ValueError("ray: give a Ray address (ray://host:10001, auto), or True for a local instance")
        if self.ray not in (None, False) and self.workers is not None:
            raise ValueError(
                "choose one of --workers N (local processes) and --ray [ADDRESS] (a Ray cluster)"
            )
        self.methods = [str(parse_spec(m)) for m in self.methods]
        if self.babilong_facts not in ("real", "generated"):
            raise ValueError(f"babilong_facts must be 'real' or 'generated', got {self.babilong_facts!r}")
        if self.babilong_data is not None:
            if self.babilong_facts != "real":
                raise ValueError("--babilong-data holds real facts: drop it, or use --babilong-facts real")
            from .generators.babilong import babilong_data_kind

            babilong_data_kind(self.babilong_data)  # a one-line error now, not after the model loads
            self.babilong_data = str(self.babilong_data)
        unknown = [t for t in self.tasks if t not in ALL_TASKS]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; choose from {', '.join(ALL_TASKS)}")
        _check_ruler(self)
        if self.samples <= 0 or self.ppl_windows <= 0:
            raise ValueError("samples and ppl_windows must be positive")
        for m in self.methods:
            spec = parse_spec(m)
            if spec.is_trained and m not in self.checkpoints and shipped_adapter(self.model, spec) is None:
                raise ValueError(
                    f"method {m} is a trained baseline: give its checkpoint (--checkpoint {m}=PATH); "
                    f"train one with `sinkwindow train --method {m}`"
                )

    def to_dict(self) -> dict:
        return asdict(self)


def _check_ruler(config: EvalConfig) -> None:
    """One-line refusals for the RULER-only tasks: no length at or above a task's minimum (lengths
    below it are skipped and said in the deviations), and S-NIAH's stratified depths, which they do
    not implement."""
    ruler = [t for t in config.tasks if t in RULER_TASKS]
    for task in ruler:
        least = TASKS[task].min_length
        if not TASKS[task].lengths(config):
            raise ValueError(
                f"task {task} needs a length >= {least}, got {config.lengths}: add one or drop the task"
            )
    qa = [t for t in ruler if t in RULER_QA]
    if qa and config.ruler_qa_data is None:
        raise ValueError(
            f"{', '.join(qa)} need RULER's QA data: give --ruler-qa-data DIR (squad.json, hotpotqa.json), "
            f"or drop the task(s)"
        )
    if qa:
        from .generators.ruler_qa import read_qa

        config.ruler_qa_data = str(config.ruler_qa_data)
        for task in qa:
            read_qa(task, config.ruler_qa_data)  # a one-line error now, not after the model loads
    if ruler and config.niah_depths != "random":
        raise ValueError(
            f"niah_depths={config.niah_depths!r} applies to {', '.join(NIAH_TASKS)} only: drop "
            f"--depths {config.niah_depths} or the tasks {', '.join(ruler)}"
        )


def plan_size(config: EvalConfig) -> int:
    total = 0
    for task in config.tasks:
        total += TASKS[task].count(config) * len(TASKS[task].lengths(config))
    return total * len(config.methods)


def _load_device(config: EvalConfig) -> str:
    if config.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return config.device or "cpu"


def planned_keys(config: EvalConfig) -> list[tuple]:
    """Row keys (``results.KEY_FIELDS``) of every sample ``config`` asks for, in run order."""
    keys = []
    for method in config.methods:
        for task in config.tasks:
            n = TASKS[task].count(config)
            for length in TASKS[task].lengths(config):
                keys += [(config.model, task, method, length, config.seed, i) for i in range(n)]
    return keys


def default_batch_size(config: EvalConfig, model=None) -> int:
    """``config.batch_size``, else ``DEFAULT_BATCH`` for the device of ``model`` (or of the config)."""
    if config.batch_size:
        return config.batch_size
    if model is not None:
        kind = input_device(model).type
    elif config.device_map is not None:
        kind = device_map_kind(config.device_map)
    else:
        kind = torch.device(_load_device(config)).type
    return DEFAULT_BATCH.get(kind, 1)


def plan(
    config: EvalConfig,
    *,
    settings: dict | None = None,
    done: ResultsStore | None = None,
    batch_size: int | None = None,
) -> list[Cell]:
    """The cells of ``config``, in run order (method, task, length, then sample index).

    Each cell holds the samples decoded as one batch: up to ``batch_size`` of them (default:
    :func:`default_batch_size`), one for perplexity windows. The linear baselines batch too: their
    attention runs each row's real tokens with that row's own state (``linear/attention.py``).

    Args:
        settings: the run's settings (``fingerprint.run_settings``), to give each cell its rows'
            fingerprint; ``None`` leaves it unset (a dry run).
        done: a results store; samples it already holds (same key and fingerprint) are left out.
    """
    batch_size = batch_size or default_batch_size(config)
    cells = []
    for method in config.methods:
        for task in config.tasks:
            fp = row_fingerprint(settings, task, method) if settings is not None else None
            n = TASKS[task].count(config)
            bs = TASKS[task].batch_size(batch_size)
            for length in TASKS[task].lengths(config):
                todo = list(range(n))
                if done is not None:
                    base = {"model": config.model, "task": task, "method": method, "length": length}
                    todo = [
                        i
                        for i in todo
                        if not done.has({**base, "seed": config.seed, "index": i, "fingerprint": fp})
                    ]
                for start in range(0, len(todo), bs):
                    cells.append(
                        Cell(
                            config.model,
                            method,
                            task,
                            length,
                            config.seed,
                            tuple(todo[start : start + bs]),
                            fp,
                        )
                    )
    return cells


def run_cell(
    config: EvalConfig, cell: Cell, model_and_tokenizer: tuple, state: dict | None = None
) -> list[dict]:
    """The rows of one cell: its samples run on ``model_and_tokenizer`` under the cell's method.

    Every scheduler runs this (in this process, in a local worker, in a Ray task); it only reads
    the config and writes nothing.

    Args:
        state: caches kept across the cells that one model copy runs (the method it is in, the
            samples of each (task, length), the EOS ids); ``None``: a fresh one, so the model is
            switched and the samples built for this cell alone.

    Returns:
        One row per index of ``cell``, in its order, with the key fields, ``fingerprint`` and
        ``seconds`` (the cell's time divided among its samples).
    """
    model, tokenizer = model_and_tokenizer
    state = {} if state is None else state
    try:
        if state.get("method") != cell.method:
            state["method"] = None  # unknown until the switch is done (an error leaves it so)
            model = use_method(
                model,
                cell.method,
                checkpoint=config.checkpoints.get(cell.method),
                native_sliding=config.native_sliding,
            )
            state["method"] = cell.method
        if "eos" not in state:
            state["eos"] = eos_ids(tokenizer, model)
        t0 = time.perf_counter()
        rows = TASKS[cell.task].run(model, tokenizer, cell.length, cell.indices, config, state)
    except BaseException:
        state["method"] = None  # a failed switch or forward may leave the model half-patched
        raise
    seconds = round((time.perf_counter() - t0) / len(cell.indices), 3)
    base = {
        "model": cell.model,
        "task": cell.task,
        "method": cell.method,
        "length": cell.length,
        "seed": cell.seed,
        "fingerprint": cell.fingerprint,
        "kv_bytes": _kv_bytes(model, cell.method, cell.length, config.native_sliding),
    }
    for i, row in zip(cell.indices, rows):
        row.update(base, index=i, seconds=seconds)
    return rows


def _kv_bytes(model, method: str, length: int, native_sliding: str = "override") -> int | None:
    """Analytic bytes of the method's attention state at ``length`` tokens, batch 1 (what a row's memory costs)."""
    from ..methods import method_of

    try:
        return method_of(method).state_bytes(
            model.config, length, dtype=model.dtype, native_sliding=native_sliding
        )
    except (ValueError, AttributeError):
        return None


def _restore_full(model_and_tokenizer: tuple, state: dict) -> None:
    """Leave a model the caller gave us in full attention again (``CellJob.close``)."""
    if "method" in state and state["method"] != "full":
        use_method(model_and_tokenizer[0], "full")
        state["method"] = "full"


def _loader(config: EvalConfig):
    """``() -> (model, tokenizer)`` loading ``config.model`` as the serial path does; picklable.

    A device map travels as it is (a strategy or a dict), so each worker places its copy the same way.
    """
    dtype = getattr(torch, config.dtype or "float32")
    if config.device_map is not None:
        return functools.partial(load, config.model, device_map=config.device_map, dtype=dtype)
    return functools.partial(load, config.model, device=_load_device(config), dtype=dtype)


def run_eval(
    config: EvalConfig,
    out_dir: str,
    model_and_tokenizer: tuple | None = None,
    progress: bool = True,
    on_row: Callable[[dict], None] | None = None,
    *,
    new_run: bool = False,
    redo: Collection[str] = (),
    scheduler: Scheduler | None = None,
    model_factory: Callable[[], tuple] | None = None,
    on_start: Callable[[dict], None] | None = None,
    source_diff: str | None = None,
) -> ResultsStore:
    """Run (or resume) every (method, task, length, sample) of ``config`` into ``out_dir``.

    ``source_diff``: the sha256 of uncommitted source changes this run was allowed to compute with
    (``runs.check_clean_source``); every row it writes records it.

    Every row carries ``fingerprint``, the hash of the settings that can change it
    (``eval/fingerprint.py``); the folder records them in ``fingerprint.json``. A resume with the
    same settings redoes nothing that is done, also when it asks for fewer (or more) tasks,
    lengths or samples. The settings are checked before the model loads.

    Where the cells run follows ``config.workers`` / ``config.ray`` (or ``scheduler``); the rows
    are the same wherever they run, and only this process writes them, as each cell finishes.

    Args:
        model_and_tokenizer: the model to run on. Local or Ray workers each get a pickled copy
            of it (fine for small models; give ``model_factory`` for large ones).
        new_run: start over in place: the folder's old results, config and reports move to
            ``previous-<UTC time>/``.
        redo: methods of ``config`` to run again: their rows move to ``previous-<UTC time>/`` and
            their recorded checkpoints are forgotten (a retrained baseline); other rows are kept.
        scheduler: overrides ``config.workers`` / ``config.ray`` (``eval/scheduler.py``).
        model_factory: a picklable ``() -> (model, tokenizer)`` that workers call once each;
            default: load ``config.model`` on ``config.device`` in ``config.dtype``.
        on_start: called once before the first cell with what this session runs (the entry it
            adds to ``sessions.jsonl``: ``samples_to_run``, ``rows_before``, ``scheduler``, a
            line saying where the cells run); not called when nothing is left to run.

    Returns:
        The results store, its :attr:`~ResultsStore.selection` set to the cells ``config`` asked
        for: ``store.rows()`` and ``len(store)`` cover those (done before or now), not the other
        rows the folder may hold (``store.all_rows()``).

    Raises:
        RunMismatchError: the folder's results were made with other settings (names them).
        RunLockedError: another run is writing the folder.
        CellsFailedError: cells that failed after their retries (local or Ray workers); every
            other cell's rows are in the store.
        MissingExtraError: ``ray`` asked for and Ray not installed.
    """
    check_run_dir(out_dir)
    given = model_and_tokenizer[0] if model_and_tokenizer is not None else None
    settings = run_settings(config, given)
    redo = check_redo(redo, config.methods)
    if not new_run:
        check_resume(out_dir, settings, redo)  # refuse before spending the model load
    if scheduler is None:
        scheduler = make_scheduler(config.workers, config.ray)
    load_fn = model_factory or _loader(config)
    if isinstance(scheduler, SerialScheduler):
        choice = apply_threads(config.threads)  # before the load, which computes too
        threads = {"threads": choice.threads, "cores": choice.cores, "reason": choice.reason}
        if scheduler.model_and_tokenizer is None:
            scheduler = SerialScheduler(model_and_tokenizer or load_fn())
        batch_model = scheduler.model_and_tokenizer[0]
    else:
        if model_factory is None and model_and_tokenizer is not None:
            load_fn = PickledModel(model_and_tokenizer)
        batch_model = given
        threads = {"threads": None, "reason": "per worker, set by the scheduler"}
    job = CellJob(config, load=load_fn, cell_fn=run_cell, close=_restore_full)
    with RunLock(out_dir):
        store = ResultsStore(
            out_dir,
            {
                "kind": "long-context",
                **config.to_dict(),
                "torch_threads": threads,
                "deviations": deviations(config),
            },
            settings=settings,
            new_run=new_run,
            redo=redo,
        )
        store.select(planned_keys(config))
        cells = plan(
            config, settings=settings, done=store, batch_size=default_batch_size(config, batch_model)
        )
        if cells:
            session = start_session(
                out_dir,
                device=config.device,
                threads=threads.get("threads") or "per worker",
                scheduler=scheduler.describe(len(cells)),
                samples_to_run=sum(len(c.indices) for c in cells),
                rows_before=len(store.all_rows()),
            )
            if on_start is not None:
                on_start(session)
        _run_cells(config, store, cells, scheduler, job, progress, on_row, source_diff)
    return store


def _run_cells(
    config: EvalConfig,
    store: ResultsStore,
    cells: list[Cell],
    scheduler: Scheduler,
    job: CellJob,
    progress: bool,
    on_row: Callable[[dict], None] | None,
    source_diff: str | None = None,
) -> None:
    """Run ``cells`` on ``scheduler``; append each finished cell's rows to ``store`` here, the driver."""
    stamp = {} if source_diff is None else {"source_diff": source_diff}
    total = plan_size(config)
    todo = sum(len(c.indices) for c in cells)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, initial=total - todo, desc="evaluating", unit="sample")
    finished = 0

    def on_result(cell: Cell, rows: list[dict]) -> None:
        nonlocal finished
        wanted = set(cell.keys)
        for row in rows:
            # Only the cell's own samples, and each once: a retried cell whose first try got
            # through after all must not write its rows twice.
            if row_key(row) not in wanted or store.has(row):
                continue
            # When it was written: a session's wall time is read back from its last row (sessions.py).
            store.append({**row, **stamp, "written": utc_now("microseconds")})
            if on_row is not None:
                on_row(row)
        finished += 1
        if bar is not None:
            bar.update(len(cell.indices))
            bar.set_postfix_str(f"cells {finished}/{len(cells)}; {cell.label()}")
        if isinstance(scheduler, SerialScheduler):
            # Between cells, an automatic thread count follows the machine (threads do not change
            # results, only how long the next cell takes; workers keep their one thread).
            rechoose_threads()

    try:
        failures = scheduler.run(job, cells, on_result)
    finally:
        if bar is not None:
            bar.close()
    if failures:
        raise CellsFailedError(failures)

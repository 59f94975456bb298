"""Where the cells of a sweep run: in this process, in local worker processes, or on a Ray cluster.

A sweep is a list of :class:`Cell` (model × method × task × length × a batch of sample indices).
Every scheduler runs the same cell function on each cell (``runner.run_cell``) and hands the rows
back to the driver through ``on_result``, as cells finish, in any order. Only the driver writes the
results store, so its resume, fingerprint and lock rules are the same whatever runs the cells.

- :class:`SerialScheduler`: one cell after another, in this process, on one model.
- :class:`LocalScheduler`: N worker processes (spawn), each loading its own model copy once and
  running with its own torch thread count.
- :class:`RayScheduler`: each cell a Ray task with its resources and ``max_retries``; a worker
  process keeps the model it loaded for the tasks that follow (``pip install 'sinkwindow[ray]'``).

A worker that dies in the middle of a cell, or a cell that raises, is retried (``max_retries``
times, on a new worker when one died), then reported as a :class:`CellFailure`; the driver raises
:class:`CellsFailedError` once every other cell is done. No cell is lost, and the driver writes a
sample at most once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import traceback
import uuid
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..runtime.threads import available_cores, set_threads

__all__ = [
    "Cell",
    "CellJob",
    "CellFailure",
    "CellsFailedError",
    "MissingExtraError",
    "Scheduler",
    "SerialScheduler",
    "LocalScheduler",
    "RayScheduler",
    "make_scheduler",
    "available_cores",
    "gpus_needed",
    "RAY_EXTRA",
]

logger = logging.getLogger(__name__)

RAY_EXTRA = "pip install 'sinkwindow[ray]'"
DEFAULT_RETRIES = 2


@dataclass(frozen=True)
class Cell:
    """One unit of work: some samples of one (model, method, task, length), run as one batch.

    Attributes:
        indices: the sample indices (a batch decoded together; one for perplexity windows).
        fingerprint: the rows' ``fingerprint`` (``fingerprint.row_fingerprint``); ``None`` in a
            plan made without settings (a dry run).
    """

    model: str
    method: str
    task: str
    length: int
    seed: int
    indices: tuple[int, ...]
    fingerprint: str | None = None

    @property
    def keys(self) -> list[tuple]:
        """The row keys (``results.KEY_FIELDS`` order) of the samples this cell produces."""
        return [(self.model, self.task, self.method, self.length, self.seed, i) for i in self.indices]

    def label(self) -> str:
        first, last = self.indices[0], self.indices[-1]
        span = str(first) if first == last else f"{first}-{last}"
        return f"{self.method} {self.task} {self.length} #{span}"


@dataclass(frozen=True)
class CellJob:
    """What every worker needs: the config, how to get a model, and what to run on each cell.

    Everything here must pickle (it travels to spawned processes and Ray workers), so ``load`` and
    ``cell_fn`` are module-level functions or ``functools.partial`` of them.

    Attributes:
        load: ``() -> (model, tokenizer)``, called once per worker.
        cell_fn: ``(config, cell, model_and_tokenizer, state) -> list[row]``; ``state`` is a dict
            the scheduler keeps per model copy, for the function's caches.
        close: ``(model_and_tokenizer, state) -> None``, called on a model that outlives the run
            (the serial path's given model), e.g. to restore full attention.
        token: tells one job from another (a Ray worker process may outlive a run).
    """

    config: Any
    load: Callable[[], tuple]
    cell_fn: Callable[..., list[dict]]
    close: Callable[[tuple, dict], None] | None = None
    token: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(frozen=True)
class CellFailure:
    """A cell that did not finish after all its tries."""

    cell: Cell
    reason: str
    attempts: int


class CellsFailedError(RuntimeError):
    """Some cells failed after their retries; every other cell's rows are in the store."""

    def __init__(self, failures: Sequence[CellFailure]):
        self.failures = list(failures)
        shown = "; ".join(f"{f.cell.label()} ({f.reason})" for f in self.failures[:3])
        more = f"; and {len(self.failures) - 3} more" if len(self.failures) > 3 else ""
        tries = max(f.attempts for f in self.failures)
        super().__init__(
            f"{len(self.failures)} cell(s) failed after {tries} tries: {shown}{more}; the finished rows "
            f"are kept, re-run the same command to retry the rest"
        )


class MissingExtraError(ImportError, ValueError):
    """An optional dependency is not installed (a ``ValueError`` too: the CLI prints one line)."""


OnResult = Callable[[Cell, list[dict]], None]


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


class Scheduler(ABC):
    """Runs a job's cell function on every cell and passes each cell's rows to ``on_result``."""

    @abstractmethod
    def describe(self, n_cells: int) -> str:
        """One line saying where ``n_cells`` cells will run (for the CLI to print)."""

    @abstractmethod
    def run(self, job: CellJob, cells: Sequence[Cell], on_result: OnResult) -> list[CellFailure]:
        """Run every cell; call ``on_result(cell, rows)`` in this process as each one finishes.

        Returns:
            The cells that failed after their retries (empty when all finished).
        """


class SerialScheduler(Scheduler):
    """One cell after another in this process, in plan order.

    A cell that raises stops the run with its traceback, as a run in one process always did: here
    an error is a bug or bad input, not a lost worker, and trying again would only repeat it.

    Args:
        model_and_tokenizer: the model to run on; ``None``: ``job.load()`` once.
    """

    def __init__(self, model_and_tokenizer: tuple | None = None):
        self.model_and_tokenizer = model_and_tokenizer

    def describe(self, n_cells: int) -> str:
        return f"{n_cells} cell(s) in this process"

    def run(self, job: CellJob, cells: Sequence[Cell], on_result: OnResult) -> list[CellFailure]:
        given = self.model_and_tokenizer is not None
        mt = self.model_and_tokenizer if given else job.load()
        state: dict = {}
        try:
            for cell in cells:
                on_result(cell, job.cell_fn(job.config, cell, mt, state))
        finally:
            if given and job.close is not None:
                job.close(mt, state)
        return []


class PickledModel:
    """A ``load`` that unpickles a model the caller already had (one private copy per worker)."""

    def __init__(self, model_and_tokenizer: tuple):
        # Plain pickle to bytes now: sent through a multiprocessing pipe, torch's reductions would
        # move the weights into shared memory, and workers converting their model in place (the
        # linear baselines merge LoRA weights) would then write into one another's copy.
        self.payload = pickle.dumps(model_and_tokenizer)

    def __call__(self) -> tuple:
        return pickle.loads(self.payload)


# How often a worker checks that its driver still lives: a killed driver (SIGKILL, a closed
# session) cannot terminate its workers, and a worker deep in a long cell would not see the broken
# pipe until that cell ends, computing for no one on a shared machine.
DRIVER_POLL_S = 1.0


def _exit_with_driver(poll_s: float = DRIVER_POLL_S) -> None:
    """Start a daemon thread that ends this process as soon as its parent is gone (it is re-parented)."""
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=watch, name="sinkwindow-driver-watch", daemon=True).start()


def _worker_main(conn, payload: bytes, threads: int) -> None:
    """A local worker: load the model once, then run the cells the driver sends until told to stop."""
    import signal

    # Ctrl-C reaches the whole process group; the driver decides what stops (it terminates us).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_driver()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # its Rust pool would use every core
    set_threads(threads)
    job: CellJob = pickle.loads(payload)
    try:
        mt = job.load()
    except BaseException as err:  # noqa: BLE001 - the driver re-raises it; this process just ends
        try:
            conn.send(("load_error", err))
        except Exception:  # noqa: BLE001 - an exception that does not pickle goes as its line
            conn.send(("load_error", RuntimeError(_one_line(err))))
        return
    state: dict = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the driver is gone
            return
        if msg is None:
            return
        idx, cell = msg
        try:
            rows = job.cell_fn(job.config, cell, mt, state)
        except Exception as err:  # noqa: BLE001 - reported to the driver, which retries the cell
            conn.send(("error", idx, _one_line(err), traceback.format_exc()))
            continue
        conn.send(("done", idx, rows))


def _drain(conn) -> list:
    """The messages waiting on ``conn``; a closed pipe (its worker died) just ends the list."""
    out = []
    try:
        while conn.poll():
            out.append(conn.recv())
    except (EOFError, OSError):
        pass
    return out


def _next_cell(pending: Sequence[int], cells: Sequence[Cell], method: str | None) -> int:
    """The pending cell (an index into ``cells``) a free worker runs next: the first of ``method``
    when there is one, else the first pending; ``method=None``: always the first (plan order)."""
    return next((i for i in pending if cells[i].method == method), pending[0])


@dataclass
class _Worker:
    proc: Any
    conn: Any
    cell: int | None = None  # the cell in flight
    method: str | None = None  # the method of its last cell (sending it more of those saves switches)


class LocalScheduler(Scheduler):
    """N worker processes on this machine, each with its own model copy and torch thread count.

    Args:
        workers: how many processes; ``"auto"``: one per core, at most one per cell.
        threads: torch threads per worker; ``None``: the cores divided among the workers (at least 1).
        max_retries: tries after the first for a cell whose worker died or that raised.
        cores: the cores to plan for; ``None``: :func:`available_cores`.
        keep_method: hand a free worker the first pending cell of the method it last ran, when
            there is one (a switch into a linear baseline converts the model: worth saving when
            cells take seconds). ``False``: always the first pending cell, so cells start in plan
            order (cells that take minutes, where a stopped run should hold whole plan prefixes).
    """

    def __init__(
        self,
        workers: int | str = "auto",
        *,
        threads: int | None = None,
        max_retries: int = DEFAULT_RETRIES,
        cores: int | None = None,
        keep_method: bool = True,
    ):
        if workers != "auto" and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
            raise ValueError(f"workers must be a positive integer or 'auto', got {workers!r}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be 0 or more, got {max_retries!r}")
        self.workers = workers
        self.threads = threads
        self.max_retries = max_retries
        self.cores = cores or available_cores()
        self.keep_method = keep_method

    def sizes(self, n_cells: int) -> tuple[int, int]:
        """``(workers, torch threads each)`` for ``n_cells`` cells."""
        n = self.cores if self.workers == "auto" else self.workers
        n = max(1, min(n, n_cells))
        return n, self.threads or max(1, self.cores // n)

    def describe(self, n_cells: int) -> str:
        n, threads = self.sizes(n_cells)
        if self.workers == "auto":
            how = "one per core"
        elif n < self.workers:
            how = f"{self.workers} asked, no more than there are cells"
        else:
            how = "as asked"
        return (
            f"{n_cells} cell(s) on {n} local worker process(es) ({how}; {self.cores} core(s)), "
            f"{threads} torch thread(s) each"
        )

    def run(self, job: CellJob, cells: Sequence[Cell], on_result: OnResult) -> list[CellFailure]:
        if not cells:
            return []
        n, threads = self.sizes(len(cells))
        logger.info("%s", self.describe(len(cells)))
        pool = _Pool(self, job, cells, on_result, n, threads)
        clean = False
        try:
            for _ in range(n):
                pool.spawn()
            while len(pool.finished) < len(cells):
                pool.step()
            clean = True
        finally:
            pool.stop(clean)
        return pool.failures


class _Pool:
    """The local workers of one ``LocalScheduler.run``: which cell each holds, each cell's tries,
    and what finished or failed.

    A death with a cell in flight uses up one of that cell's tries, so those are bounded; a worker
    that dies holding none (killed while loading its model) is replaced too, but only so often: a
    machine that kills every worker must not loop forever.
    """

    def __init__(self, scheduler: LocalScheduler, job: CellJob, cells: Sequence[Cell], on_result: OnResult,
                 n: int, threads: int) -> None:  # fmt: skip
        import multiprocessing as mp

        self.scheduler, self.cells, self.on_result, self.n, self.threads = (
            scheduler,
            cells,
            on_result,
            n,
            threads,
        )
        self.ctx = mp.get_context("spawn")
        self.payload = pickle.dumps(job)
        self.pending = deque(range(len(cells)))
        self.attempts = [0] * len(cells)
        self.finished: set[int] = set()
        self.failures: list[CellFailure] = []
        self.workers: list[_Worker] = []
        self.idle_deaths = 0

    def spawn(self) -> None:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker_main, args=(child, self.payload, self.threads), daemon=True)
        proc.start()
        child.close()  # the worker holds the other end; recv() sees EOF when it dies
        self.workers.append(_Worker(proc, parent))

    def give_back(self, w: _Worker, reason: str) -> None:
        """The worker's cell goes back to the queue, or fails when its tries are spent."""
        idx, w.cell = w.cell, None
        if idx is None or idx in self.finished:
            return
        if self.attempts[idx] > self.scheduler.max_retries:
            self.failures.append(CellFailure(self.cells[idx], reason, self.attempts[idx]))
            self.finished.add(idx)
        else:
            label = self.cells[idx].label()
            logger.warning("cell %s: %s; retrying (try %d)", label, reason, self.attempts[idx] + 1)
            self.pending.appendleft(idx)

    def assign(self, w: _Worker) -> None:
        pick = _next_cell(self.pending, self.cells, w.method if self.scheduler.keep_method else None)
        self.pending.remove(pick)
        try:
            w.conn.send((pick, self.cells[pick]))
        except OSError:  # it just died: the cell goes back untried, the death is seen below
            self.pending.appendleft(pick)
            return
        self.attempts[pick] += 1
        w.cell, w.method = pick, self.cells[pick].method

    def handle(self, w: _Worker, msg) -> None:
        kind = msg[0]
        if kind == "load_error":
            raise msg[1]
        idx = msg[1]
        if idx != w.cell:  # not what it was given: ignore rather than write anything twice
            return
        if kind == "done":
            w.cell = None
            self.finished.add(idx)
            self.on_result(self.cells[idx], msg[2])
        else:
            logger.debug("cell %s raised in worker %s:\n%s", self.cells[idx].label(), w.proc.pid, msg[3])
            self.give_back(w, msg[2])

    def step(self) -> None:
        """Hand out cells, wait for a message or a death (at most 5 s), read them, replace the dead."""
        from multiprocessing.connection import wait

        for w in self.workers:
            if w.cell is None and self.pending and w.proc.is_alive():
                self.assign(w)
        wait([w.conn for w in self.workers] + [w.proc.sentinel for w in self.workers], timeout=5.0)
        for w in list(self.workers):
            for msg in _drain(w.conn):
                self.handle(w, msg)
            if w.proc.is_alive():
                continue
            w.proc.join(timeout=10)
            self.workers.remove(w)
            w.conn.close()
            self.idle_deaths += w.cell is None
            self.give_back(w, f"worker died (exit code {w.proc.exitcode})")
        busy = sum(w.cell is not None for w in self.workers)
        while self.pending and len(self.workers) < min(self.n, busy + len(self.pending)):
            if self.idle_deaths > self.n * (self.scheduler.max_retries + 1):
                raise RuntimeError(
                    "local workers keep dying before they finish a cell; see the log above, or run without --workers"
                )
            self.spawn()

    def stop(self, clean: bool) -> None:
        """Done: idle workers are told to stop. Interrupted or failed: they are stopped now, their
        cells in flight are simply not written (a re-run does them)."""
        for w in self.workers:
            if clean:
                with contextlib.suppress(OSError):  # already gone
                    w.conn.send(None)
            else:
                w.proc.terminate()
        for w in self.workers:
            w.proc.join(timeout=30)
            if w.proc.is_alive():
                w.proc.terminate()
                w.proc.join(timeout=10)
            w.conn.close()


# The model a Ray worker process loaded, kept for the tasks that follow in the same process.
_RAY_WORKER: dict[str, Any] = {}


def _ray_cell(job: CellJob, cell: Cell, threads: int) -> list[dict]:
    """One cell as a Ray task; the model is loaded once per worker process and job."""
    if _RAY_WORKER.get("token") != job.token:
        _RAY_WORKER.clear()  # a model of an earlier job would only hold memory
        set_threads(threads)
        _RAY_WORKER.update(token=job.token, mt=job.load(), state={})
    return job.cell_fn(job.config, cell, _RAY_WORKER["mt"], _RAY_WORKER["state"])


def gpus_needed(device: str | None, device_map: str | dict | None = None) -> int:
    """GPUs one model copy needs, for a Ray task's ``num_gpus``.

    ``device``: 1 for cuda, else 0. A ``{module: device}`` map: its highest GPU index + 1 (a task
    with k GPUs sees them as 0 .. k-1, so that is what the map can name). A strategy (``auto`` ...)
    spreads over every GPU the worker sees: as many as this machine has, since Ray cannot ask for
    "all of a node's"; give a map, or ``RayScheduler(num_gpus=...)``, to ask for another count.
    """
    if device_map is None:
        return 1 if str(device or "cpu").startswith("cuda") else 0
    if isinstance(device_map, str):
        import torch

        return torch.cuda.device_count()
    indices = []
    for where in device_map.values():
        if isinstance(where, int):
            indices.append(where)
        elif str(where).startswith("cuda"):
            indices.append(int(str(where).partition(":")[2] or 0))
    return max(indices) + 1 if indices else 0


def _import_ray():
    try:
        import ray
    except ImportError:
        raise MissingExtraError(f"--ray needs Ray, which is not installed: {RAY_EXTRA}") from None
    return ray


# How long a Ray address may take to accept a TCP connection before it counts as not there.
PROBE_SECONDS = 5.0


def _probe(address: str, timeout: float = PROBE_SECONDS) -> None:
    """Refuse, within seconds, a Ray address where nothing listens.

    ``ray.init`` retries a missing GCS for minutes ("Failed to connect to GCS") before it fails;
    a TCP connect to the address's host and port tells at once. ``auto`` (the cluster this machine
    belongs to) is left to Ray.

    Raises:
        ValueError: a malformed address, or nothing accepting connections there.
    """
    import socket

    if address == "auto":
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(
            f"Ray address {address!r} has no port: give host:port or ray://host:port (e.g. ray://head:10001)"
        )
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=timeout).close()
    except OSError as err:
        raise ValueError(
            f"nothing answers at Ray address {address} ({err.strerror or err}): start the cluster "
            f"(`ray start --head`) or give its address; --ray alone starts a local instance"
        ) from None


class RayScheduler(Scheduler):
    """Each cell a Ray task, on the cluster at ``address`` or on a local Ray instance.

    Usage statistics (``RAY_USAGE_STATS_ENABLED=0``) and the dashboard are off unless the
    environment says otherwise. A Ray instance this scheduler started is shut down at the end; one
    already initialised by the caller is used and left running.

    Args:
        address: a Ray address (``ray://host:10001``, ``auto``); ``None``: a local instance.
        num_cpus, num_gpus: each task's resources; ``num_gpus`` ``None``: what the config's
            placement needs (:func:`gpus_needed`): 1 when its device is cuda, the GPUs its device
            map spans, else 0. A task runs with ``max(1, int(num_cpus))`` torch threads.
        max_retries: Ray's retries of a task whose worker died or that raised.
        local_cpus: CPUs of the local instance (``None``: :func:`available_cores`).
        runtime_env: passed to ``ray.init`` (a cluster may need ``working_dir`` or ``pip``).

    Raises:
        MissingExtraError: Ray is not installed (names the extra).
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        num_cpus: float = 1,
        num_gpus: float | None = None,
        max_retries: int = DEFAULT_RETRIES,
        local_cpus: int | None = None,
        runtime_env: dict | None = None,
    ):
        _import_ray()  # fail now, before any model loads
        if num_cpus <= 0:
            raise ValueError(f"num_cpus must be positive, got {num_cpus!r}")
        self.address = address or None
        if self.address is not None:
            _probe(self.address)
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        self.max_retries = max_retries
        self.local_cpus = local_cpus
        self.runtime_env = runtime_env

    def _gpus(self, config) -> float:
        if self.num_gpus is not None:
            return self.num_gpus
        return gpus_needed(getattr(config, "device", None), getattr(config, "device_map", None))

    def describe(self, n_cells: int) -> str:
        where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
        gpus = f", {self.num_gpus} GPU(s)" if self.num_gpus else ""
        return f"{n_cells} cell(s) as Ray tasks on {where} ({self.num_cpus} CPU(s){gpus} each)"

    def run(self, job: CellJob, cells: Sequence[Cell], on_result: OnResult) -> list[CellFailure]:
        if not cells:
            return []
        ray = _import_ray()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        started = not ray.is_initialized()
        if started:
            kw: dict[str, Any] = {"include_dashboard": False, "runtime_env": self.runtime_env}
            if self.address:
                ray.init(address=self.address, **kw)
            else:
                ray.init(num_cpus=self.local_cpus or available_cores(), **kw)
        logger.info("%s", self.describe(len(cells)))
        try:
            job_ref = ray.put(job)
            task = ray.remote(_ray_cell).options(
                num_cpus=self.num_cpus,
                num_gpus=self._gpus(job.config),
                max_retries=self.max_retries,
                retry_exceptions=True,
            )
            threads = max(1, int(self.num_cpus))
            refs = {task.remote(job_ref, cell, threads): i for i, cell in enumerate(cells)}
            waiting = list(refs)
            failures = []
            while waiting:
                done, waiting = ray.wait(waiting, num_returns=1)
                for ref in done:
                    cell = cells[refs[ref]]
                    try:
                        rows = ray.get(ref)
                    except Exception as err:  # noqa: BLE001 - Ray already retried it; report the cell
                        cause = getattr(err, "cause", None) or err
                        failures.append(CellFailure(cell, _one_line(cause), self.max_retries + 1))
                        continue
                    on_result(cell, rows)
            return failures
        finally:
            if started:
                ray.shutdown()


def make_scheduler(
    workers: int | str | None = None,
    ray: str | bool | None = None,
    *,
    model_and_tokenizer: tuple | None = None,
    keep_method: bool = True,
) -> Scheduler:
    """The scheduler ``--workers N`` / ``--ray [ADDRESS]`` ask for; neither: :class:`SerialScheduler`.

    Args:
        workers: ``None``: serial; ``"auto"`` or a count: :class:`LocalScheduler`.
        ray: ``True`` (a local instance) or an address: :class:`RayScheduler`.
        model_and_tokenizer: the serial scheduler's model.
        keep_method: :class:`LocalScheduler`'s method affinity (``False``: plan order).

    Raises:
        ValueError: both asked for.
        MissingExtraError: Ray asked for and not installed.
    """
    if ray not in (None, False) and workers is not None:
        raise ValueError("choose one of --workers N (local processes) and --ray [ADDRESS] (a Ray cluster)")
    if ray not in (None, False):
        return RayScheduler(None if ray is True else str(ray))
    if workers is not None:
        return LocalScheduler(workers, keep_method=keep_method)
    return SerialScheduler(model_and_tokenizer)

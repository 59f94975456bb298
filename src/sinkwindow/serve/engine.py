"""The serving engine: one worker thread owns the model and turns requests into tokens.

Scheduling is continuous: requests join the running set and leave it between steps. Each turn of
the loop gives every request still reading its prompt one prefill chunk (``chunk_size`` tokens, on
its own cache: a long prompt never stalls the others), then runs one decode step for every request
that is generating. Either way a request's tokens are those of ``sinkwindow.generate`` on that
prompt alone with the same chunk size.

**Memory.** Under a plain ``swa``/``evict`` spec the engine allocates its KV memory once, at start:
a ``kv_pool.KVPool`` of ``kv_budget`` bytes (default ``default_kv_budget``) in blocks of
``block_size`` tokens of one layer. Every request and session draws blocks from it
(``paged_cache.PagedSinkWindowCache``): a sequence holds ``ceil(min(tokens, w) / block)`` blocks a
layer, so a one-token session holds one block per layer and none ever more than w slots; the
window's blocks are recycled in place as it slides. A request is admitted with a reservation of
every block it can reach (prompt + ``max_new_tokens``, bounded by w); when the pool cannot give them,
idle sessions are evicted least recently used first, and if that is not enough ``submit`` raises
``PoolFullError`` (``later``: retry, the server answers 429; else the request can never fit, 400).
Blocks go back to the pool explicitly when a request ends or a session is evicted or deleted;
nothing on the request path allocates KV memory. The generating requests decode as **one batched
forward** over their rows' blocks (each row with its own positions, sinks and window), attending
over the tokens rows hold (padded to the longest row), not over w empty slots.

Other specs (full attention, hybrids, linear retrofits) keep per-request caches and decode each
request in a forward of its own (no pool): a hybrid's full units grow with the context (bounded by
the model's positions and ``--max-prompt-tokens``), a linear retrofit's state is constant.

``stats()`` (served as ``/health``) gives: ``active``, ``queued``, ``sessions``, ``batched_decode``
(whether decoding is batched), ``decode_batch`` (rows now), ``peak_decode_batch``, ``kv_pool``
(whether a pool is in use) and, with a pool, ``pool_block_tokens`` (tokens a block holds, one
layer), ``pool_blocks`` (blocks that can be handed out), ``pool_blocks_used``, ``pool_blocks_free``,
``pool_blocks_reserved`` (free but promised to admitted requests), ``pool_bytes``,
``pool_bytes_used``, ``pool_bytes_free`` and ``pool_evictions`` (sessions evicted to make room).

Events reach the caller through ``Job.emit`` (called on the worker thread):
``("token", id)``, then one ``("done", reason, info)`` with reason ``"stop"``, ``"length"`` or
``"cancelled"``, or ``("error", message, info)``.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from ..methods import method_of
from ..runtime.attributes import CACHE_FACTORY_ATTR
from ..runtime.generate import DecodeStep, select_next
from ..runtime.hooks import check_positions, max_positions
from ..runtime.kv_pool import KVPool, PoolFullError, PoolRow
from ..runtime.make_cache import make_cache
from ..runtime.paged_cache import pool_shape
from ..runtime.patching import active_spec
from ..runtime.plan import plan_of
from ..runtime.prefill import input_device, prefill
from .sampling import Sampler, SamplingParams, top_logprobs
from .sessions import Session, SessionStore

__all__ = ["Engine", "Job", "EngineBusyError", "PoolFullError", "default_kv_budget"]

logger = logging.getLogger(__name__)
_ids = itertools.count(1)


class EngineBusyError(RuntimeError):
    """The queue of waiting requests is full."""


@dataclass
class Job:
    """One request: prompt tokens, how to pick tokens, and where its events go.

    Args:
        prompt: token ids to feed (a session's continuation: only the new ones).
        max_new_tokens: tokens to generate (0: only feed the prompt, for a session).
        temperature: 0 for greedy; else sampling with ``top_p`` and ``seed``.
        stop_ids: token ids that end the answer (the model's eos).
        session: a session id whose cache the prompt continues.
        emit: called with each event, on the worker thread.
        sampling: penalties, logit_bias and logprobs (default: none).
        watch: called on the worker thread with each generated token and its log-probabilities
            (``None`` unless ``sampling.logprobs``) *before* the token is fed: ``None`` to go on, or,
            when a stop string has ended the answer, how many generated tokens lie wholly before it
            (see :meth:`Engine._end` for what a session keeps then).
    """

    prompt: list[int]
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop_ids: frozenset[int] = frozenset()
    session: str | None = None
    emit: Callable[[tuple], None] = lambda event: None
    sampling: SamplingParams | None = None
    watch: Callable[[int, dict | None], int | None] | None = None
    id: str = field(default_factory=lambda: f"job-{next(_ids)}")
    # Worker state.
    cancel_reason: str | None = None
    generated: int = 0
    last_token: int | None = None
    prompt_tokens: int = 0
    _pending: list[int] = field(default_factory=list)
    _cache: object = None
    _step: DecodeStep | None = None
    _logits: torch.Tensor | None = None
    _next: torch.Tensor | None = None  # [1] the token to feed next (batched decoding)
    _generator: torch.Generator | None = None
    _session: Session | None = None
    _sampler: Sampler | None = None
    stop_keep: int | None = None  # set when a stop string ended the answer (see ``watch``)
    _row: PoolRow | None = None  # its blocks in the engine's pool (pooled engines)

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the worker to end this request at its next step (a disconnect, a stop string)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason


GiB = 2**30
# The default pool: a share of what the device has free at start, so the server leaves room for the
# model's activations, the allocator and the rest of the machine (vLLM sizes its pool from
# --gpu-memory-utilization the same way, llama.cpp allocates its slots at start).
CPU_SHARE, CPU_CAP = 0.25, 4 * GiB
CUDA_SHARE = 0.5


def default_kv_budget(device: torch.device) -> tuple[int, str]:
    """Bytes of the KV pool when ``--kv-budget`` is not given, and how they were chosen (one phrase)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * CUDA_SHARE), f"{CUDA_SHARE:.0%} of the {free / GiB:.1f} GiB free on {device}"
    import psutil

    avail = psutil.virtual_memory().available
    return int(min(avail * CPU_SHARE, CPU_CAP)), (
        f"{CPU_SHARE:.0%} of the {avail / GiB:.1f} GiB of available RAM, at most {CPU_CAP // GiB} GiB"
    )


class Engine:
    """Runs :class:`Job` s on ``model`` in a worker thread.

    Args:
        model: a model patched with ``sinkwindow.apply`` (or unpatched, for full attention).
        max_active: requests that advance together; more wait in the queue.
        max_queue: waiting requests beyond which :meth:`submit` refuses (``EngineBusyError``).
        chunk_size: prompt tokens per prefill step.
        sessions: the store of conversations (default: 64 sessions).
        kv_budget: bytes of the KV pool (every spec but hybrids and linear retrofits); default: what
            ``max_active + sessions.max_sessions`` sequences at their longest hold, at most
            ``default_kv_budget`` (a share of the free memory).
        block_size: tokens per pool block (of one layer).

    Raises:
        ValueError: ``kv_budget`` cannot hold one sequence at its longest (w tokens in every windowed
            layer; one block a layer for full attention).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        max_active: int = 8,
        max_queue: int = 64,
        chunk_size: int = 512,
        sessions: SessionStore | None = None,
        kv_budget: int | None = None,
        block_size: int = 16,
    ):
        if max_active < 1 or max_queue < 0 or chunk_size < 1 or block_size < 1:
            raise ValueError("max_active, chunk_size and block_size must be at least 1, max_queue at least 0")
        self.model = model
        self.spec = active_spec(model)
        self.max_active = max_active
        self.max_queue = max_queue
        self.chunk_size = chunk_size
        self.sessions = sessions if sessions is not None else SessionStore()
        self.device = input_device(model)
        self._queue: deque[Job] = deque()
        self._active: list[Job] = []
        self.pool: KVPool | None = None
        self.pool_note = ""
        self.windows: list[int | None] = []  # per layer, None: full attention
        if not self.spec.is_hybrid and getattr(model, CACHE_FACTORY_ATTR, None) is None:
            self._make_pool(kv_budget, block_size)
        # The generating requests of a pooled sink-window engine decode as rows of one forward.
        self.batched = self.pool is not None and plan_of(model) is not None
        self._rows: list[Job] = []  # the requests in the decode batch, in row order
        self._batch = None
        self.peak_batch = 0  # the most rows one decode forward has served
        self.pool_evictions = 0
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.last_evicted: list[dict] = []
        self.heartbeat = time.monotonic()  # the worker's last turn of its loop (or wait)
        self.sessions.on_evict = self._forget_session

    def alive(self, stall_s: float) -> tuple[bool, str]:
        """Whether the worker serves: its thread runs and, with work waiting, it turned within ``stall_s``."""
        if self._thread is None or not self._thread.is_alive():
            return False, "the engine's worker thread is not running"
        with self._cv:
            busy = bool(self._queue or self._active)
        age = time.monotonic() - self.heartbeat
        if busy and age > stall_s:
            return False, f"the engine has not stepped for {age:.0f} s with requests waiting"
        return True, "ok"

    def _make_pool(self, kv_budget: int | None, block_size: int) -> None:
        shape = pool_shape(self.model)
        full = plan_of(self.model) is None
        self.windows = [None] * shape["layers"] if full else [layer.window for layer in make_cache(self.model, static=True).layers]  # fmt: skip
        probe = KVPool(2, block=block_size, **{**shape, "device": "meta"})
        # A windowed sequence at its longest holds w slots a layer; full attention grows with its tokens
        # (up to the model's positions), so its pool needs one block a layer and a request longer than
        # the pool holds gets a 400.
        longest = shape["layers"] if full else probe.blocks_for(max(self.windows), self.windows)
        if kv_budget is None:
            kv_budget, how = default_kv_budget(torch.device(shape["device"]))
            # No more than every running request and kept session at its longest could use.
            limit = max_positions(self.model) or 0
            most = probe.blocks_for(limit, self.windows) if full else longest
            enough = ((self.max_active + self.sessions.max_sessions) * most + 1) * probe.block_bytes
            if most and enough < kv_budget:
                kv_budget, how = (
                    enough,
                    f"--max-active + --max-sessions sequences at their longest, under {how}",
                )
        else:
            how = "--kv-budget"
        blocks = kv_budget // probe.block_bytes
        if blocks - 1 < longest:
            need = (longest + 1) * probe.block_bytes
            raise ValueError(
                f"--kv-budget {kv_budget} is below one session's KV cache at its longest ({longest} blocks of "
                f"{block_size} tokens, {self.spec}): give --kv-budget {need} or more"
            )
        self.pool = KVPool(blocks, block=block_size, **shape)
        reach = (
            f"{self.pool.usable // shape['layers'] * block_size} tokens of full attention in all"
            if full
            else f"{self.pool.usable // longest} sequences at their longest ({longest} blocks each)"
        )
        self.pool_note = (
            f"KV pool: {self.pool.nbytes / 2**20:.1f} MiB ({how}), {self.pool.usable} blocks of {block_size} "
            f"tokens, {reach}"
        )
        logger.info("%s", self.pool_note)

    def start(self) -> Engine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="sinkwindow-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Cancel every request (each gets ``("done", "cancelled")``) and end the worker."""
        with self._cv:
            self._stopping = True
            for job in [*self._queue, *self._active]:
                job.cancel("cancelled")
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def stats(self) -> dict:
        """The counts ``/health`` serves (keys in the module docstring)."""
        with self._cv:
            out = {"active": len(self._active), "queued": len(self._queue), "sessions": len(self.sessions),
                   "batched_decode": self.batched, "decode_batch": len(self._rows), "peak_decode_batch": self.peak_batch,
                   "kv_pool": self.pool is not None}  # fmt: skip
        if self.pool is not None:
            out |= self.pool.stats() | {"pool_evictions": self.pool_evictions}
        return out

    def check_length(self, job: Job) -> None:
        """Refuse a request whose positions run past the model's (``ValueError``, one line)."""
        if self.spec.positions == "cache":
            return
        seen = self.sessions.tokens_seen(job.session) if job.session is not None else 0
        seen += 1 if seen else 0  # + the pending token
        check_positions(self.model, seen + len(job.prompt) + job.max_new_tokens)

    def submit(self, job: Job) -> None:
        """Queue ``job``.

        Raises:
            EngineBusyError: the queue is full.
            SessionBusyError: its session is answering another request.
            PoolFullError: the KV pool cannot hold it now (``later``) or ever.
            ValueError: prompt + new tokens run past the model's positions, or nothing to do.
        """
        if not job.prompt and job.session is None:
            raise ValueError("the prompt gives no tokens: give some text")
        self.check_length(job)
        with self._cv:
            if self._stopping:
                raise EngineBusyError("the server is shutting down")
            if len(self._queue) + len(self._active) >= self.max_queue + self.max_active:
                raise EngineBusyError(
                    f"{len(self._active)} requests are running and {len(self._queue)} waiting (--max-queue): retry later"
                )
            if job.session is not None:
                job._session = self.sessions.reserve(job.session)
            try:
                self._admit(job)
            except BaseException:
                if job._session is not None:
                    self.sessions.abandon(job._session)
                raise
            self._queue.append(job)
            self._cv.notify_all()

    def _admit(self, job: Job) -> None:
        """Reserve the pool blocks ``job`` can reach, evicting idle sessions (LRU) to make room."""
        if self.pool is None:
            return
        s = job._session
        if s is not None and s.kv_row is None:
            s.kv_row = self.pool.new_row()
        row = s.kv_row if s is not None else self.pool.new_row()
        seen = row.seen + (len(s.pending) if s is not None else 0)
        total = seen + len(job.prompt) + job.max_new_tokens
        need = self.pool.blocks_for(total, self.windows) - row.blocks
        while True:
            try:
                self.pool.reserve(row, need)
                break
            except PoolFullError as err:
                if err.later and self._evict_one():
                    continue
                if s is None:
                    self.pool.release(row)
                if err.later:
                    raise PoolFullError(f"{err}: retry later, or with fewer max_tokens", True) from None
                raise PoolFullError(
                    f"the request reaches {total} tokens, {need + row.blocks} KV blocks, more than the pool's "
                    f"{self.pool.usable} (--kv-budget): shorten the prompt or max_tokens",
                    False,
                ) from None
        job._row = row

    def _evict_one(self) -> bool:
        """Evict the least recently used idle session to free its blocks; whether there was one."""
        notes = self.sessions.evict_idle(1, "its KV blocks were needed by a new request (the pool is full)")
        self.pool_evictions += len(notes)
        for note in notes:
            logger.warning("evicted session %s (%s)", note["id"], note["reason"])
        return bool(notes)

    def _forget_session(self, s: Session) -> None:
        """A session left the store: its blocks go back to the pool now, not when the collector runs."""
        if s.kv_row is not None and self.pool is not None:
            self.pool.release(s.kv_row)
        _drop(s.cache)
        s.kv_row, s.cache = None, None

    def _loop(self) -> None:
        with torch.no_grad():
            while True:
                try:
                    if not self._turn():
                        return
                except Exception:  # a bug outside any one request: log it, end the running ones, go on
                    logger.exception("the engine's loop failed; ending the running requests")
                    self._rows, self._batch = [], None
                    for job in list(self._active):
                        try:
                            self._fail(job, RuntimeError("the engine failed while serving this request"))
                        except Exception:  # its emit or session bookkeeping failed too: drop it
                            logger.exception("request %s could not be ended cleanly", job.id)
                            with self._cv:
                                if job in self._active:
                                    self._active.remove(job)

    def _turn(self) -> bool:
        """One turn of the loop: admit, prefill/decode each running request; False once stopped."""
        with self._cv:
            while not self._queue and not self._active and not self._stopping:
                self.heartbeat = time.monotonic()
                self._cv.wait(1.0)
            self.heartbeat = time.monotonic()
            if self._stopping and not self._queue and not self._active:
                return False
            while self._queue and len(self._active) < self.max_active:
                job = self._queue.popleft()
                try:  # a request that cannot start (a bad seed...) fails alone
                    self._active.append(self._begin(job))
                except Exception as err:
                    self._fail(job, err)
            running = list(self._active)
        for job in running:
            if self.batched and job in self._rows:
                continue  # advanced by the batched step below
            try:
                finished = self._advance(job)
                if finished:
                    self._end(job, ("done", job.cancel_reason or finished))
            except Exception as err:  # one request's failure (stepping or finishing) must not stop the others
                self._fail(job, err)
        if self._rows:
            try:
                self._batched_step()
            except Exception as err:  # the batch's forward failed: end its requests, keep serving
                for job in list(self._rows):
                    self._fail(job, err)
        return True

    def _begin(self, job: Job) -> Job:
        s = job._session
        if self.pool is not None:
            job._cache = make_cache(self.model, pool=self.pool, rows=[job._row])
        elif s is not None and s.cache is not None:
            job._cache = s.cache
        else:
            job._cache = make_cache(self.model)
        job._pending = [*s.pending, *job.prompt] if s is not None else list(job.prompt)
        job.prompt_tokens = len(job.prompt)
        if not job._pending and job.max_new_tokens > 0:
            raise ValueError("nothing to continue from: give a prompt (the session has no pending token)")
        if job.temperature > 0 and job.seed is not None:
            try:
                job._generator = torch.Generator(device=self.device).manual_seed(job.seed)
            except (RuntimeError, ValueError, OverflowError):
                raise ValueError(f"seed {job.seed} is outside torch.Generator's range 0..2**64-1") from None
        job._sampler = Sampler(job.sampling or SamplingParams())
        job._step = DecodeStep(self.model, job._cache)
        return job

    def _advance(self, job: Job) -> str | None:
        """One unit of work; the finish reason once the job is done, else ``None``."""
        if job.cancel_reason is not None:
            return job.cancel_reason
        if job._pending:
            n = min(self.chunk_size, len(job._pending))
            if method_of(self.spec).dense_prompt and job._cache.get_seq_length() == 0:
                n = len(job._pending)  # evict:W:S runs the whole prompt dense, as generate() does
            ids = torch.tensor([job._pending[:n]], device=self.device)
            job._pending = job._pending[n:]
            job._logits = prefill(self.model, ids, chunk_size=n, cache=job._cache).logits
            return None
        if job.generated >= job.max_new_tokens:
            return "length"
        nxt, finished = self._pick(job, job._logits)
        if finished:
            return finished
        if self.batched:
            self._join(job, nxt)
            return None
        job._logits = job._step(nxt[:, None])
        return None

    def _pick(self, job: Job, logits: torch.Tensor) -> tuple[torch.Tensor, str | None]:
        """Choose, emit and count ``job``'s next token from ``logits [1, vocab]``; the finish reason if it ends the answer."""
        logits = job._sampler.adjust(logits)
        nxt = select_next(
            logits,
            do_sample=job.temperature > 0,
            temperature=job.temperature if job.temperature > 0 else 1.0,
            top_p=job.top_p,
            generator=job._generator,
        )
        token = int(nxt[0])
        job.generated += 1
        job.last_token = token
        job._sampler.observe(token)
        k = job._sampler.params.logprobs
        info = top_logprobs(logits, token, k) if k is not None else None
        job.emit(("token", token, info))
        if token in job.stop_ids:
            return nxt, "stop"
        if job.watch is not None and (keep := job.watch(token, info)) is not None:
            job.stop_keep = keep
            return nxt, "stop"
        if job.generated >= job.max_new_tokens:
            return nxt, "length"
        return nxt, None

    def _rebatch(self) -> None:
        """The decode batch's cache over the rows of the requests now in it (no copy: rows are block tables)."""
        rows = [job._row for job in self._rows]
        self._batch = make_cache(self.model, pool=self.pool, rows=rows) if rows else None

    def _join(self, job: Job, nxt: torch.Tensor) -> None:
        """Put ``job`` (its prompt read, its first token chosen) into the decode batch."""
        self._rows.append(job)
        self._rebatch()
        job._cache, job._next = None, nxt  # (its _step stays: it marks a request that began)

    def _leave(self, job: Job) -> None:
        self._rows.remove(job)
        self._rebatch()

    def _batched_step(self) -> None:
        """One decode forward for every row of the batch; rows that finish leave it."""
        for job in [j for j in self._rows if j.cancel_reason is not None]:
            self._leave(job)
            self._end(job, ("done", job.cancel_reason))
        if not self._rows:
            return
        tokens = torch.stack([job._next for job in self._rows])  # [rows, 1]
        self.peak_batch = max(self.peak_batch, len(self._rows))
        logits = DecodeStep(self.model, self._batch)(tokens)  # [rows, vocab]
        done = []
        for job, row in zip(list(self._rows), logits):
            try:  # one row's choice failing (its sampler, its stop watch) fails that request alone
                nxt, finished = self._pick(job, row[None])
            except Exception as err:
                done.append((job, err))
                continue
            job._next = nxt
            if finished:
                done.append((job, finished))
        for job, finished in done:
            self._leave(job)
            if isinstance(finished, Exception):
                self._fail(job, finished)
            else:
                self._end(job, ("done", job.cancel_reason or finished))

    def _fail(self, job: Job, err: Exception) -> None:
        logger.error("request %s failed: %s: %s", job.id, type(err).__name__, err)
        if job in self._rows:
            self._leave(job)
        self._end(job, ("error", f"{type(err).__name__}: {err}".splitlines()[0]), broken=True)

    def _end(self, job: Job, event: tuple, broken: bool = False) -> None:
        with self._cv:
            if job in self._active:
                self._active.remove(job)
        s = job._session
        evicted: list[dict] = []
        if s is not None:
            # A stop string: the client was shown the answer up to it, so the session keeps no more.
            # The token that completed it is the pending one (never fed); when the stop began in an
            # earlier token, that one and those after it are in the cache already and a ring buffer
            # cannot take them back, so the session starts afresh rather than keep unseen text.
            # (An exact rollback needs a copy of the rows from where the stop may begin: a block
            # pool with copy-on-write could give it.)
            cut = job.stop_keep is not None and job.stop_keep < job.generated - 1
            if broken and job._step is None:
                pass  # it failed before it began: the session is as it was
            elif broken or job._pending or cut:
                # Cut off inside the prompt (or failed): the cache no longer matches a token stream.
                self._forget_session(s)
                s.pending, s.tokens = [], 0
                why = (
                    "a stop string began before its last token" if cut else "its turn ended inside the prompt"
                )
                logger.warning("session %s: reset (%s)", s.id, why)
            elif job.stop_keep is not None:
                s.cache = job._cache if self.pool is None else None
                s.tokens += len(s.pending) + len(job.prompt) + job.stop_keep
                s.pending = []
                s.turns += 1
            else:
                fed = len(s.pending) + len(job.prompt) + max(job.generated - 1, 0)
                s.cache = job._cache if self.pool is None else None
                s.tokens += fed
                s.pending = [job.last_token] if job.generated else []
                s.turns += 1
            if self.pool is not None and s.kv_row is not None:
                self.pool.unpromise(s.kv_row)  # it keeps the blocks it holds, not the promise
            evicted = self.sessions.release(s)
            for note in evicted:
                logger.warning("evicted session %s (%s)", note["id"], note["reason"])
        elif job._row is not None:
            self.pool.release(job._row)  # back to the free list now
        self.last_evicted = evicted
        if s is None or s.cache is not job._cache:
            _drop(job._cache)
        job._cache = job._step = job._logits = job._row = None
        job.emit((*event, {"evicted_sessions": evicted, "session": s.row() if s is not None else None}))


def _drop(cache) -> None:
    """Free an unpooled cache's tensors now: its layers point back at it (a reference cycle), so
    dropping the last reference would leave them to the cycle collector. Pooled caches hold none."""
    if cache is not None and not hasattr(cache, "pool") and hasattr(cache, "reset"):
        cache.reset()

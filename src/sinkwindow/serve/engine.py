"""The serving engine: one worker thread owns the model and turns requests into tokens.

Scheduling is continuous: requests join the running set and leave it between steps. Each turn of
the loop gives every request still reading its prompt one prefill chunk (``chunk_size`` tokens, on
its own cache: a long prompt never stalls the others), then runs one decode step for every request
that is generating. Under a plain ``swa``/``evict`` spec those decode steps are **one batched
forward**: the rows live in one static ring-buffer cache (``static_cache.stack_rows``), each row
with its own positions, sinks and window, so a request joins after its prefill and leaves when it
ends (``take_rows``) without touching the others. Other specs (full attention, hybrids, linear
retrofits) decode each request in a forward of its own. Either way every request's cache holds at
most W keys per windowed layer (a hybrid's full units grow), and its tokens are those of
``sinkwindow.generate`` on that prompt alone with the same chunk size.

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

from ..generate import DecodeStep, select_next
from ..patch import active_spec, check_positions, make_cache
from ..prefill import input_device, prefill
from ..static_cache import StaticSinkWindowCache, StaticSinkWindowLayer, stack_rows, take_rows
from .sampling import Sampler, SamplingParams, top_logprobs
from .sessions import Session, SessionStore

__all__ = ["Engine", "Job", "EngineBusyError"]

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

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the worker to end this request at its next step (a disconnect, a stop string)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason


class Engine:
    """Runs :class:`Job` s on ``model`` in a worker thread.

    Args:
        model: a model patched with ``sinkwindow.apply`` (or unpatched, for full attention).
        max_active: requests that advance together; more wait in the queue.
        max_queue: waiting requests beyond which :meth:`submit` refuses (``EngineBusyError``).
        chunk_size: prompt tokens per prefill step.
        sessions: the store of conversations (default: 64 sessions, no byte budget).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        max_active: int = 8,
        max_queue: int = 64,
        chunk_size: int = 512,
        sessions: SessionStore | None = None,
    ):
        if max_active < 1 or max_queue < 0 or chunk_size < 1:
            raise ValueError("max_active and chunk_size must be at least 1, max_queue at least 0")
        self.model = model
        self.spec = active_spec(model)
        self.max_active = max_active
        self.max_queue = max_queue
        self.chunk_size = chunk_size
        self.sessions = sessions if sessions is not None else SessionStore()
        self.device = input_device(model)
        self._queue: deque[Job] = deque()
        self._active: list[Job] = []
        # One batched decode step over rows of one static cache, where every layer is a ring buffer
        # (make_cache refuses static=True where some layer grows: a hybrid's full units).
        try:
            probe = make_cache(model, static=True)
        except ValueError:
            probe = None
        self.batched = isinstance(probe, StaticSinkWindowCache) and all(
            type(layer) is StaticSinkWindowLayer for layer in probe.layers
        )
        self._rows: list[Job] = []  # the requests in the decode batch, in row order
        self._batch: StaticSinkWindowCache | None = None
        self.peak_batch = 0  # the most rows one decode forward has served
        self._cv = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.last_evicted: list[dict] = []
        self.heartbeat = time.monotonic()  # the worker's last turn of its loop (or wait)

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
        with self._cv:
            return {"active": len(self._active), "queued": len(self._queue), "sessions": len(self.sessions),
                    "batched_decode": self.batched, "decode_batch": len(self._rows), "peak_decode_batch": self.peak_batch}  # fmt: skip

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
            self._queue.append(job)
            self._cv.notify_all()

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
        fresh = lambda: make_cache(self.model, static=self.batched)  # noqa: E731
        if s is not None:
            job._cache = s.cache if s.cache is not None else fresh()
            job._pending = [*s.pending, *job.prompt]
        else:
            job._cache = fresh()
            job._pending = list(job.prompt)
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
            if self.spec.kind == "evict" and job._cache.get_seq_length() == 0:
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

    def _join(self, job: Job, nxt: torch.Tensor) -> None:
        """Put ``job`` (its prompt read, its first token chosen) into the decode batch."""
        caches = [job._cache] if self._batch is None else [self._batch, job._cache]
        self._batch = stack_rows(make_cache(self.model, static=True), caches)
        self._rows.append(job)
        job._cache, job._next = None, nxt

    def _leave(self, job: Job) -> None:
        """Take ``job``'s row out of the batch; its own cache is that row (a session keeps it)."""
        i = self._rows.index(job)
        job._cache = take_rows(make_cache(self.model, static=True), self._batch, [i])
        rest = [k for k in range(len(self._rows)) if k != i]
        self._batch = take_rows(make_cache(self.model, static=True), self._batch, rest) if rest else None
        self._rows.pop(i)

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
            self._rows.remove(job)  # its row is dropped with the batch below
            self._batch = None if not self._rows else self._batch
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
                s.cache, s.pending, s.tokens = None, [], 0
                why = (
                    "a stop string began before its last token" if cut else "its turn ended inside the prompt"
                )
                logger.warning("session %s: reset (%s)", s.id, why)
            elif job.stop_keep is not None:
                s.cache = job._cache
                s.tokens += len(s.pending) + len(job.prompt) + job.stop_keep
                s.pending = []
                s.turns += 1
            else:
                fed = len(s.pending) + len(job.prompt) + max(job.generated - 1, 0)
                s.cache = job._cache
                s.tokens += fed
                s.pending = [job.last_token] if job.generated else []
                s.turns += 1
            evicted = self.sessions.release(s)
            for note in evicted:
                logger.warning("evicted session %s (%s)", note["id"], note["reason"])
        self.last_evicted = evicted
        job._cache = job._step = job._logits = None
        job.emit((*event, {"evicted_sessions": evicted, "session": s.row() if s is not None else None}))

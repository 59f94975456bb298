"""The Starlette application: OpenAI's routes over an :class:`~.engine.Engine`.

Every request passes :class:`~.security.Guard` (API keys, Host, content type); its body is read up
to ``max_request_bytes``, then parsed, checked (:mod:`.protocol`) and tokenized on a worker thread
of the threadpool, never on the event loop, so a huge or slow request delays nobody else. It is
queued on the engine; its tokens come back through an ``asyncio.Queue`` fed from the engine's
worker thread. A client that disconnects (streamed or not) cancels its request at the engine's
next step, and the server goes on serving the others. Every failure is OpenAI's error body with a
4xx/5xx status, never a traceback; ``/health`` answers 503 once the engine no longer serves.

Sessions belong to the API key that made them: their ids are kept as ``owner/id`` (owner: a hash
of the key), so another key neither sees nor reaches them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .answer import AnswerText
from .chat import ChatTemplateError, render_continuation, render_first
from .engine import Engine, EngineBusyError, Job, PoolFullError
from .protocol import (
    SESSION_ID,
    APIError,
    GenerationRequest,
    chunk_body,
    completion_body,
    error_body,
    parse_request,
)
from .sampling import SamplingParams
from .security import ANONYMOUS, Guard, TooLarge, read_body
from .sessions import SessionBusyError

__all__ = ["build_app"]

logger = logging.getLogger(__name__)

# How often a waiting handler checks whether its client has gone.
_POLL_S = 0.5
# A prompt of more characters than this many times --max-prompt-tokens is refused before tokenizing
# (no tokenizer gives fewer than one token per 16 characters of text).
_CHARS_PER_TOKEN = 16


def _error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def _owner(request: Request) -> str:
    return getattr(request.state, "owner", ANONYMOUS)


class _Server:
    def __init__(self, engine: Engine, tokenizer, served: list[str], max_prompt_tokens: int | None,
                 max_request_bytes: int, health_stall_s: float):  # fmt: skip
        self.engine = engine
        self.tok = tokenizer
        self.served = served
        self.max_prompt_tokens = max_prompt_tokens
        self.max_request_bytes = max_request_bytes
        self.health_stall_s = health_stall_s
        eos = getattr(engine.model.generation_config, "eos_token_id", None)
        eos = tokenizer.eos_token_id if eos is None else eos
        self.stop_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        # Token ids a request may name: those both the tokenizer and the model's logits have.
        self.vocab = min(len(tokenizer), getattr(engine.model.config, "vocab_size", None) or len(tokenizer))
        self.started = int(time.time())

    async def health(self, request: Request) -> JSONResponse:
        ok, why = self.engine.alive(self.health_stall_s)
        body = {"status": "ok" if ok else "error", "model": self.served[0], "method": str(self.engine.spec),
                **self.engine.stats()}  # fmt: skip
        if not ok:
            body["error"] = error_body(why, "server_error")["error"]
        return JSONResponse(body, status_code=200 if ok else 503)

    async def models(self, request: Request) -> JSONResponse:
        data = [{"id": m, "object": "model", "created": self.started, "owned_by": "sinkwindow",
                 "sinkwindow": {"method": str(self.engine.spec)}} for m in self.served]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})

    async def sessions(self, request: Request) -> JSONResponse:
        store, prefix = self.engine.sessions, _owner(request) + "/"
        return JSONResponse({"object": "list", "data": _own(store.rows(), prefix),
                             "evicted": _own(list(store.evicted), prefix),
                             "max_sessions": store.max_sessions,
                             "kv_budget": pool.nbytes if (pool := self.engine.pool) is not None else store.kv_budget})  # fmt: skip

    async def delete_session(self, request: Request) -> JSONResponse:
        sid = request.path_params["session_id"]
        if not SESSION_ID.fullmatch(sid):
            return _error(
                APIError(400, "a session id is 1 to 64 characters of A-Z a-z 0-9 . _ -", param="session_id")
            )
        try:
            note = self.engine.sessions.drop(f"{_owner(request)}/{sid}")
        except SessionBusyError:
            msg = f"session {sid!r} is answering a request: cancel it first"
            return _error(APIError(409, msg, type="conflict_error", code="session_busy"))
        if note is None:
            return _error(
                APIError(404, f"no session {sid!r}", type="not_found_error", code="session_not_found")
            )
        return JSONResponse({"id": sid, "object": "session", "deleted": True})

    async def completions(self, request: Request):
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request):
        return await self._generate(request, chat=True)

    def _check_chars(self, req: GenerationRequest) -> None:
        if self.max_prompt_tokens is None:
            return
        chars = sum(len(m["content"]) for m in req.messages) if req.chat else len(req.prompt)
        if not isinstance(req.prompt, list) and chars > _CHARS_PER_TOKEN * self.max_prompt_tokens:
            raise APIError(400, f"the prompt has {chars} characters, more than {_CHARS_PER_TOKEN} per token of this "
                           f"server's limit of {self.max_prompt_tokens} tokens (--max-prompt-tokens)",
                           param="messages" if req.chat else "prompt", code="context_length_exceeded")  # fmt: skip

    def _chat_text(self, req: GenerationRequest, continuing: bool) -> str:
        if not getattr(self.tok, "chat_template", None):
            raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions")
        try:
            if not continuing:
                return render_first(self.tok, req.messages)
            pending = self.engine.sessions.pending(req.session)
            ended = pending and pending[-1] in self.stop_ids
            text = self.tok.decode(pending, skip_special_tokens=False) if ended else None
            return render_continuation(self.tok, req.messages, text)
        except ChatTemplateError as err:
            raise APIError(400, str(err), param="messages") from None

    def _tokens(self, req: GenerationRequest) -> list[int]:
        self._check_chars(req)
        continuing = req.session is not None and self.engine.sessions.tokens_seen(req.session) > 0
        if req.chat:
            ids = self.tok(self._chat_text(req, continuing), add_special_tokens=False).input_ids
        elif isinstance(req.prompt, list):
            ids = list(req.prompt)
            if max(ids) >= self.vocab:
                raise APIError(400, f"prompt holds token id {max(ids)}, beyond the vocabulary of {self.vocab}",
                               param="prompt")  # fmt: skip
        else:
            # A session's continuation is the same stream: no second BOS.
            ids = self.tok(req.prompt, add_special_tokens=not continuing).input_ids
        if not ids and not (continuing and self.engine.sessions.pending(req.session)):
            raise APIError(400, "the prompt gives no tokens with this tokenizer (and there is no session to "
                           "continue): give some text", param="prompt")  # fmt: skip
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise APIError(400, f"the prompt has {len(ids)} tokens, more than this server's limit of "
                           f"{self.max_prompt_tokens} (--max-prompt-tokens)", param="prompt",
                           code="context_length_exceeded")  # fmt: skip
        bad = [t for t in req.logit_bias if t >= self.vocab]
        if bad:
            raise APIError(400, f"logit_bias names token id {bad[0]}, beyond the vocabulary of {self.vocab}",
                           param="logit_bias")  # fmt: skip
        return ids

    def _prepare(self, raw: bytes, chat: bool, owner: str) -> tuple[GenerationRequest, list[int]]:
        """Parse, check and tokenize one request (runs in the threadpool, off the event loop)."""
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as err:  # bad JSON or UTF-8; nesting deeper than Python's stack
            msg = "nested too deeply" if isinstance(err, RecursionError) else str(err).splitlines()[0][:200]
            raise APIError(400, f"the request body is not valid JSON ({msg})") from None
        req = parse_request(body, chat=chat, served=self.served)
        if req.session is not None:
            req.session = f"{owner}/{req.session}"
        return req, self._tokens(req)

    async def _generate(self, request: Request, *, chat: bool):
        try:
            try:
                raw = await read_body(request, self.max_request_bytes)
            except TooLarge:
                raise APIError(413, f"the request body is over {self.max_request_bytes} bytes (--max-request-bytes)",
                               code="request_too_large") from None  # fmt: skip
            req, prompt = await anyio.to_thread.run_sync(self._prepare, raw, chat, _owner(request))
            answer = _Answer(self, req, _owner(request))
            job = Job(
                prompt=prompt, max_new_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                seed=req.seed, stop_ids=self.stop_ids, session=req.session, emit=answer.emit,
                watch=answer.text.watch,
                sampling=SamplingParams(req.presence_penalty, req.frequency_penalty, req.logit_bias, req.logprobs),
            )  # fmt: skip
            answer.job = job
            try:
                self.engine.submit(job)
            except EngineBusyError as err:
                raise APIError(429, str(err), type="server_busy_error", code="server_busy") from None
            except PoolFullError as err:  # 429: it fits once others end; 400: it never fits
                raise APIError(429 if err.later else 400, str(err), type="server_busy_error" if err.later
                               else "invalid_request_error", param=None if err.later else "max_tokens",
                               code="kv_pool_full") from None  # fmt: skip
            except SessionBusyError:
                msg = f"session {req.session.split('/', 1)[1]!r} is answering another request: wait for it"
                raise APIError(
                    409, msg, type="conflict_error", param="session_id", code="session_busy"
                ) from None
            except ValueError as err:
                raise APIError(400, str(err), param="max_tokens", code="context_length_exceeded") from None
        except APIError as err:
            return _error(err)
        if req.stream:
            return StreamingResponse(answer.stream(request), media_type="text/event-stream")
        return await answer.whole(request)


def _own(rows: list[dict], prefix: str) -> list[dict]:
    """The rows (sessions, evictions) of the caller's own sessions, under the ids the caller gave."""
    return [{**r, "id": r["id"][len(prefix) :]} for r in rows if r["id"].startswith(prefix)]


_STOPPED = "the server stopped before the answer was finished"


class _Answer:
    """One request's events turned into OpenAI's answer, streamed or whole."""

    def __init__(self, server: _Server, req: GenerationRequest, owner: str):
        self.server, self.req, self.owner = server, req, owner
        self.text = AnswerText(server.tok, req.stop, req.logprobs, req.chat)
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.job: Job | None = None

    def emit(self, event: tuple) -> None:
        """The engine's ``Job.emit`` (worker thread): tokens become text here, then go to the loop."""
        if event[0] == "token":
            event = self.text.token(event[1], event[2])
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def _usage(self) -> dict:
        p, c = self.job.prompt_tokens, self.job.generated
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _extra(self, info: dict) -> dict:
        prefix = self.owner + "/"
        session = info.get("session")
        return {"token_ids": self.text.ids, "method": str(self.server.engine.spec),
                "evicted_sessions": _own(info.get("evicted_sessions", []), prefix),
                "session": _own([session], prefix)[0] if session else None}  # fmt: skip

    async def _next(self, request: Request, poll: bool = True):
        """The next event; cancels the job (and returns None) once the client has gone.

        A streamed answer does not poll: Starlette's StreamingResponse listens for the disconnect
        itself and closes the generator (whose ``finally`` cancels the job).
        """
        if not poll:
            return await self.events.get()
        while True:
            try:
                return await asyncio.wait_for(self.events.get(), _POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    self.job.cancel("cancelled")
                    return None

    async def whole(self, request: Request) -> JSONResponse:
        text, entries = [], []
        while True:
            ev = await self._next(request)
            if ev is None:
                return JSONResponse(error_body("the client disconnected"), status_code=499)
            if ev[0] == "piece":
                text.append(ev[1])
                entries += ev[2]
                continue
            if ev[0] == "error":
                return JSONResponse(
                    error_body(f"generation failed: {ev[1]}", "server_error"), status_code=500
                )
            if ev[1] == "cancelled":
                return JSONResponse(error_body(_STOPPED, "server_error"), status_code=503)
            tail, rest = self.text.finish()
            body = completion_body(self.req, "".join(text) + tail, ev[1], self._usage(), self._extra(ev[2]),
                                   self.text.render(entries + rest))  # fmt: skip
            return JSONResponse(body)

    async def stream(self, request: Request):
        def sse(payload: dict) -> str:
            return f"data: {json.dumps(payload)}\n\n"

        first, req = True, self.req
        try:
            while True:
                ev = await self._next(request, poll=False)
                if ev[0] == "piece":
                    if ev[1] or ev[2] or (first and req.chat):
                        yield sse(chunk_body(req, ev[1], None, first=first, logprobs=self.text.render(ev[2])))
                        first = False
                    continue
                if ev[0] == "error" or ev[1] == "cancelled":
                    # A cut-off stream says so (an error event), then ends as streams end.
                    why = f"generation failed: {ev[1]}" if ev[0] == "error" else _STOPPED
                    yield sse(error_body(why, "server_error"))
                    break
                tail, rest = self.text.finish()
                if tail or rest:
                    yield sse(chunk_body(req, tail, None, first=first, logprobs=self.text.render(rest)))
                    first = False
                yield sse(chunk_body(req, None, ev[1], first=first, extra=self._extra(ev[2])))
                if req.include_usage:
                    yield sse(chunk_body(req, None, None, usage=self._usage()))
                break
            yield "data: [DONE]\n\n"
        finally:
            # A client gone mid-stream closes this generator: end the request at the next step.
            self.job.cancel("cancelled")


def build_app(
    engine: Engine,
    tokenizer,
    served: list[str],
    *,
    max_prompt_tokens: int | None = None,
    api_keys: list[str] | tuple = (),
    loopback_only: bool = True,
    max_request_bytes: int = 1 << 20,
    health_stall_s: float = 60.0,
) -> Starlette:
    """The ASGI app serving ``engine`` under the model names ``served`` (the first is the main one).

    Args:
        api_keys: keys a request must bear (``Authorization: Bearer KEY``); none: no check.
        loopback_only: the server listens on loopback only: refuse a Host header naming another host.
        max_request_bytes: longest request body (413 past it).
        health_stall_s: ``/health`` answers 503 once the engine has not stepped for this long with work waiting.

    The engine starts with the app and stops (cancelling what runs) when the app shuts down.
    """
    server = _Server(engine, tokenizer, served, max_prompt_tokens, max_request_bytes, health_stall_s)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    async def not_found(request: Request, exc) -> JSONResponse:
        return JSONResponse(error_body(f"no route {request.method} {request.url.path}", "not_found_error"),
                            status_code=getattr(exc, "status_code", 404))  # fmt: skip

    async def server_error(request: Request, exc) -> JSONResponse:
        logger.exception("unhandled error on %s", request.url.path, exc_info=exc)
        return JSONResponse(
            error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500
        )

    routes = [
        Route("/health", server.health, methods=["GET"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/v1/sessions", server.sessions, methods=["GET"]),
        Route("/v1/sessions/{session_id:path}", server.delete_session, methods=["DELETE"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
    ]
    guard = Middleware(Guard, keys=list(api_keys), loopback_only=loopback_only)
    return Starlette(routes=routes, lifespan=lifespan, middleware=[guard],
                     exception_handlers={404: not_found, 405: not_found, 500: server_error})  # fmt: skip

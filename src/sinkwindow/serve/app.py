"""The Starlette application: OpenAI's routes over an :class:`~.engine.Engine`.

Each request is checked (:mod:`.protocol`), tokenized here, and queued on the engine; its tokens
come back through an ``asyncio.Queue`` fed from the worker thread. A client that disconnects
(streamed or not) cancels its request at the engine's next step, and the server goes on serving
the others. Every failure is OpenAI's error body with a 4xx/5xx status, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from .engine import Engine, EngineBusyError, Job
from .protocol import APIError, GenerationRequest, chunk_body, completion_body, error_body, parse_request
from .sessions import SessionBusyError
from .text import IncrementalDecoder, StopMatcher

__all__ = ["build_app"]

logger = logging.getLogger(__name__)

# How often a waiting handler checks whether its client has gone.
_POLL_S = 0.5


def _error(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


class _Server:
    def __init__(self, engine: Engine, tokenizer, served: list[str], max_prompt_tokens: int | None):
        self.engine = engine
        self.tok = tokenizer
        self.served = served
        self.max_prompt_tokens = max_prompt_tokens
        eos = getattr(engine.model.generation_config, "eos_token_id", None)
        eos = tokenizer.eos_token_id if eos is None else eos
        self.stop_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self.started = int(time.time())

    async def health(self, request: Request) -> JSONResponse:
        spec = self.engine.spec
        return JSONResponse(
            {"status": "ok", "model": self.served[0], "method": str(spec), **self.engine.stats()}
        )

    async def models(self, request: Request) -> JSONResponse:
        data = [{"id": m, "object": "model", "created": self.started, "owned_by": "sinkwindow",
                 "sinkwindow": {"method": str(self.engine.spec)}} for m in self.served]  # fmt: skip
        return JSONResponse({"object": "list", "data": data})

    async def sessions(self, request: Request) -> JSONResponse:
        store = self.engine.sessions
        return JSONResponse({"object": "list", "data": store.rows(), "evicted": list(store.evicted),
                             "max_sessions": store.max_sessions, "kv_budget": store.kv_budget})  # fmt: skip

    async def delete_session(self, request: Request) -> JSONResponse:
        sid = request.path_params["session_id"]
        try:
            note = self.engine.sessions.drop(sid)
        except SessionBusyError as err:
            return _error(APIError(409, str(err), type="conflict_error", code="session_busy"))
        if note is None:
            return _error(
                APIError(404, f"no session {sid!r}", type="not_found_error", code="session_not_found")
            )
        return JSONResponse({"id": sid, "object": "session", "deleted": True})

    async def completions(self, request: Request):
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request):
        return await self._generate(request, chat=True)

    def _tokens(self, req: GenerationRequest) -> list[int]:
        continuing = req.session is not None and self.engine.sessions.tokens_seen(req.session) > 0
        if req.chat:
            if not getattr(self.tok, "chat_template", None):
                raise APIError(400, "this model's tokenizer has no chat template: use /v1/completions")
            text = self.tok.apply_chat_template(req.messages, tokenize=False, add_generation_prompt=True)
            ids = self.tok(text, add_special_tokens=False).input_ids
        elif isinstance(req.prompt, list):
            ids = list(req.prompt)
            vocab = len(self.tok)
            if max(ids) >= vocab:
                raise APIError(
                    400, f"prompt holds token id {max(ids)}, beyond the vocabulary of {vocab}", param="prompt"
                )
        else:
            # A session's continuation is the same stream: no second BOS.
            ids = self.tok(req.prompt, add_special_tokens=not continuing).input_ids
        if not ids and req.session is None:
            raise APIError(
                400, "the prompt gives no tokens with this tokenizer: give some text", param="prompt"
            )
        if self.max_prompt_tokens is not None and len(ids) > self.max_prompt_tokens:
            raise APIError(400, f"the prompt has {len(ids)} tokens, more than this server's limit of "
                           f"{self.max_prompt_tokens} (--max-prompt-tokens)", param="prompt",
                           code="context_length_exceeded")  # fmt: skip
        return ids

    async def _generate(self, request: Request, *, chat: bool):
        try:
            try:
                body = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise APIError(400, f"the request body is not valid JSON ({err})") from None
            req = parse_request(body, chat=chat, served=self.served)
            prompt = self._tokens(req)
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()
            job = Job(
                prompt=prompt, max_new_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p,
                seed=req.seed, stop_ids=self.stop_ids, session=req.session,
                emit=lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev),
            )  # fmt: skip
            try:
                self.engine.submit(job)
            except EngineBusyError as err:
                raise APIError(429, str(err), type="server_busy_error", code="server_busy") from None
            except SessionBusyError as err:
                raise APIError(
                    409, str(err), type="conflict_error", param="session_id", code="session_busy"
                ) from None
            except ValueError as err:
                raise APIError(400, str(err), param="max_tokens", code="context_length_exceeded") from None
        except APIError as err:
            return _error(err)
        answer = _Answer(self, req, job)
        if req.stream:
            return StreamingResponse(answer.stream(request, events), media_type="text/event-stream")
        return await answer.whole(request, events)


class _Answer:
    """One request's tokens turned into text, streamed or whole."""

    def __init__(self, server: _Server, req: GenerationRequest, job: Job):
        self.server, self.req, self.job = server, req, job
        self.decoder = IncrementalDecoder(server.tok)
        self.stops = StopMatcher(req.stop)
        self.ids: list[int] = []

    def _text(self, token: int) -> str:
        self.ids.append(token)
        safe, stopped = self.stops.feed(self.decoder.push(token))
        if stopped:
            self.job.cancel("stop")
        return safe

    def _tail(self) -> str:
        """The text held back at the end: an undecoded last character, a tail that was not a stop."""
        if self.stops.stopped:
            return ""
        return self.stops.feed(self.decoder.flush())[0] + self.stops.flush()

    def _usage(self) -> dict:
        p, c = self.job.prompt_tokens, self.job.generated
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _extra(self, info: dict) -> dict:
        return {"token_ids": self.ids, "method": str(self.server.engine.spec), **info}

    async def _next(self, request: Request, events: asyncio.Queue, poll: bool = True):
        """The next event; cancels the job (and returns None) once the client has gone.

        A streamed answer does not poll: Starlette's StreamingResponse listens for the disconnect
        itself and closes the generator (whose ``finally`` cancels the job).
        """
        if not poll:
            return await events.get()
        while True:
            try:
                return await asyncio.wait_for(events.get(), _POLL_S)
            except TimeoutError:
                if await request.is_disconnected():
                    self.job.cancel("cancelled")
                    return None

    async def whole(self, request: Request, events: asyncio.Queue) -> JSONResponse:
        text = []
        while True:
            ev = await self._next(request, events)
            if ev is None:
                return JSONResponse(error_body("the client disconnected"), status_code=499)
            if ev[0] == "token":
                text.append(self._text(ev[1]))
                continue
            if ev[0] == "error":
                return JSONResponse(
                    error_body(f"generation failed: {ev[1]}", "server_error"), status_code=500
                )
            text.append(self._tail())
            return JSONResponse(
                completion_body(self.req, "".join(text), ev[1], self._usage(), self._extra(ev[2]))
            )

    async def stream(self, request: Request, events: asyncio.Queue):
        def sse(payload: dict) -> str:
            return f"data: {json.dumps(payload)}\n\n"

        first = True
        try:
            while True:
                ev = await self._next(request, events, poll=False)
                if ev[0] == "token":
                    piece = self._text(ev[1])
                    if piece or (first and self.req.chat):
                        yield sse(chunk_body(self.req, piece, None, first=first))
                        first = False
                    continue
                if ev[0] == "error":
                    yield sse(error_body(f"generation failed: {ev[1]}", "server_error"))
                    break
                tail = self._tail()
                if tail:
                    yield sse(chunk_body(self.req, tail, None, first=first))
                    first = False
                yield sse(chunk_body(self.req, None, ev[1], first=first, extra=self._extra(ev[2])))
                if self.req.include_usage:
                    yield sse(chunk_body(self.req, None, None, usage=self._usage()))
                break
            yield "data: [DONE]\n\n"
        finally:
            # A client gone mid-stream closes this generator: end the request at the next step.
            self.job.cancel("cancelled")


def build_app(
    engine: Engine, tokenizer, served: list[str], *, max_prompt_tokens: int | None = None
) -> Starlette:
    """The ASGI app serving ``engine`` under the model names ``served`` (the first is the main one).

    The engine starts with the app and stops (cancelling what runs) when the app shuts down.
    """
    server = _Server(engine, tokenizer, served, max_prompt_tokens)

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
        Route("/v1/sessions/{session_id}", server.delete_session, methods=["DELETE"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Route("/v1/chat/completions", server.chat_completions, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: not_found, 500: server_error})  # fmt: skip

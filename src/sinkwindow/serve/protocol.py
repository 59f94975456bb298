"""The OpenAI request and response shapes the server speaks, and its errors.

Requests are checked field by field into a :class:`GenerationRequest`; anything wrong raises
:class:`APIError`, which the app turns into OpenAI's error body
(``{"error": {"message", "type", "param", "code"}}``) with a 4xx status. Unknown fields are
ignored, as OpenAI's clients send many (``user``, ``logit_bias``...); fields that would change the
answer and are not supported (``n`` > 1, ``logprobs``, tools) are refused rather than ignored.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

__all__ = ["APIError", "GenerationRequest", "parse_request", "error_body", "completion_body", "chunk_body"]

# OpenAI's default when max_tokens is not given is "as many as fit"; a server must bound it.
DEFAULT_MAX_TOKENS = 256


class APIError(Exception):
    """An error answered as OpenAI's error body with ``status``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
):
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


@dataclass
class GenerationRequest:
    """What one completions or chat request asks for."""

    chat: bool
    model: str
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    session: str | None = None
    id: str = ""
    created: int = 0


def _number(body: dict, name: str, default, low: float, high: float | None = None, integer: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if integer:
        ok = ok and float(value).is_integer()
    if not ok or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        kind = "an integer" if integer else "a number"
        raise APIError(400, f"{name} must be {kind} {bound}, got {value!r}", param=name)
    return int(value) if integer else float(value)


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
            raise APIError(400, f"messages[{i}] needs a role of system, developer, user or assistant",
                           param=f"messages[{i}].role")  # fmt: skip
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise APIError(
                    400,
                    f"messages[{i}].content: only text parts are supported",
                    param=f"messages[{i}].content",
                )
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": content})
    return out


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # one prompt in a list
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    ):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise APIError(400, "one prompt per request: send the others as their own requests", param="prompt")
    raise APIError(400, "prompt must be a string or a list of token ids", param="prompt")


def parse_request(body, *, chat: bool, served: list[str]) -> GenerationRequest:
    """Check an OpenAI completions (``chat=False``) or chat completions body.

    Raises:
        APIError: naming the field and what it must be; 404 for a model this server does not serve.
    """
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, f"model is required: this server serves {', '.join(served)}", param="model")
    if model not in served:
        raise APIError(404, f"the model {model!r} does not exist here: this server serves {', '.join(served)}",
                       type="not_found_error", param="model", code="model_not_found")  # fmt: skip
    if _number(body, "n", 1, 1, integer=True) != 1:
        raise APIError(400, "n must be 1: send one request per answer", param="n")
    for name in ("logprobs", "top_logprobs", "tools", "functions", "echo", "suffix"):
        if body.get(name) not in (None, False, [], 0):
            raise APIError(400, f"{name} is not supported by this server", param=name)
    limit_name = (
        "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    )
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (
        isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= 4
    ):
        raise APIError(400, "stop must be a string or a list of up to 4 strings", param="stop")
    options = body.get("stream_options") or {}
    session = body.get("session_id")
    if session is not None and (not isinstance(session, str) or not session or len(session) > 256):
        raise APIError(
            400, "session_id must be a non-empty string of at most 256 characters", param="session_id"
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, "stream must be true or false", param="stream")
    return GenerationRequest(
        chat=chat,
        model=model,
        prompt=None if chat else _prompt(body),
        messages=_messages(body) if chat else None,
        max_tokens=_number(body, limit_name, DEFAULT_MAX_TOKENS, 0, integer=True),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        seed=_number(body, "seed", None, 0, integer=True),
        stop=list(stop or []),
        stream=stream,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        session=session,
        id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
        created=int(time.time()),
    )


def completion_body(req: GenerationRequest, text: str, finish: str, usage: dict, extra: dict) -> dict:
    """The whole answer: a ``text_completion`` or a ``chat.completion``."""
    if req.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                  "finish_reason": finish}  # fmt: skip
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {
        "id": req.id,
        "object": "chat.completion" if req.chat else "text_completion",
        "created": req.created,
        "model": req.model,
        "choices": [choice],
        "usage": usage,
        "sinkwindow": extra,
    }


def chunk_body(req: GenerationRequest, text: str | None, finish: str | None, *, first: bool = False,
               usage: dict | None = None, extra: dict | None = None) -> dict:  # fmt: skip
    """One server-sent event of a streamed answer (``usage`` alone: the final usage chunk)."""
    if usage is not None and text is None and finish is None:
        choices = []
    elif req.chat:
        delta = {"role": "assistant", "content": text or ""} if first else ({"content": text} if text else {})
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
    out = {
        "id": req.id,
        "object": "chat.completion.chunk" if req.chat else "text_completion",
        "created": req.created,
        "model": req.model,
        "choices": choices,
    }
    if usage is not None:
        out["usage"] = usage
    if extra is not None:
        out["sinkwindow"] = extra
    return out

"""The OpenAI request and response shapes the server speaks, and its errors.

Requests are checked field by field into a :class:`GenerationRequest`; anything wrong raises
:class:`APIError`, which the app turns into OpenAI's error body
(``{"error": {"message", "type", "param", "code"}}``) with a 4xx status. :data:`FIELDS` says what
happens to every field of OpenAI's schemas: implemented, refused unless it has its default (``n`` >
1, tools, ``response_format``...), or accepted with no effect on the answer (``user``,
``metadata``...); a field outside the table is refused, never ignored.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass, field

__all__ = [
    "APIError",
    "FIELDS",
    "GenerationRequest",
    "parse_request",
    "error_body",
    "completion_body",
    "chunk_body",
]

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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None  # top tokens per token (None: no logprobs)
    id: str = ""
    created: int = 0


# Every field of OpenAI's current request schemas (completions and chat), what this server does
# with it, and why. tests/test_serve_api.py walks the installed ``openai`` package's TypedDicts
# and fails on a field missing here; a field not in this table is refused as unknown.
IMPLEMENTED = "implemented"
REFUSED = "refused unless default"
NO_EFFECT = "accepted, no effect on the answer"

FIELDS: dict[str, tuple[str, str]] = {
    "model": (IMPLEMENTED, "must name the served model"),
    "prompt": (IMPLEMENTED, "completions: one string or one list of token ids"),
    "messages": (IMPLEMENTED, "chat: text messages of system, developer, user, assistant"),
    "max_tokens": (IMPLEMENTED, "default 256: a server must bound the answer"),
    "max_completion_tokens": (IMPLEMENTED, "chat: as max_tokens"),
    "temperature": (IMPLEMENTED, "0..2; 0 is greedy"),
    "top_p": (IMPLEMENTED, "0..1"),
    "seed": (IMPLEMENTED, "0..2**64-1 (torch.Generator.manual_seed)"),
    "stop": (IMPLEMENTED, "up to 4 strings; the answer ends before the first"),
    "stream": (IMPLEMENTED, "server-sent events"),
    "stream_options": (IMPLEMENTED, "include_usage; include_obfuscation has no effect (no padding sent)"),
    "presence_penalty": (IMPLEMENTED, "-2..2, OpenAI's definition (serve/sampling.py)"),
    "frequency_penalty": (IMPLEMENTED, "-2..2, OpenAI's definition (serve/sampling.py)"),
    "logit_bias": (IMPLEMENTED, "token id -> -100..100 added to its logit"),
    "logprobs": (IMPLEMENTED, "completions: 0..5 top tokens; chat: true/false"),
    "top_logprobs": (IMPLEMENTED, "chat: 0..20, with logprobs true"),
    "session_id": (IMPLEMENTED, "sinkwindow's extension: continue a kept cache"),
    "n": (REFUSED, "one answer per request"),
    "best_of": (REFUSED, "one answer per request"),
    "echo": (REFUSED, "the prompt is not returned"),
    "suffix": (REFUSED, "no fill-in-the-middle"),
    "tools": (REFUSED, "no tool calling"),
    "tool_choice": (REFUSED, "no tool calling"),
    "functions": (REFUSED, "no function calling"),
    "function_call": (REFUSED, "no function calling"),
    "parallel_tool_calls": (REFUSED, "no tool calling"),
    "response_format": (REFUSED, 'no constrained decoding: only {"type": "text"}'),
    "audio": (REFUSED, "text only"),
    "modalities": (REFUSED, "text only"),
    "prediction": (REFUSED, "no predicted outputs"),
    "web_search_options": (REFUSED, "no web search"),
    "reasoning_effort": (REFUSED, "not a reasoning model"),
    "verbosity": (REFUSED, "no verbosity control"),
    "moderation": (REFUSED, "no moderation"),
    "user": (NO_EFFECT, "an end-user id for the caller's own records"),
    "safety_identifier": (NO_EFFECT, "an end-user id for the caller's own records"),
    "metadata": (NO_EFFECT, "the caller's tags; nothing is stored"),
    "store": (NO_EFFECT, "nothing is stored"),
    "service_tier": (NO_EFFECT, "one tier"),
    "prompt_cache_key": (NO_EFFECT, "a caching hint; sessions keep caches explicitly"),
    "prompt_cache_retention": (NO_EFFECT, "a caching hint; sessions keep caches explicitly"),
    "prompt_cache_options": (NO_EFFECT, "a caching hint; sessions keep caches explicitly"),
}

# What a refused field may be: its default (or a value meaning the same).
_DEFAULTS: dict[str, tuple] = {
    "n": (1,), "best_of": (1,), "echo": (False,), "suffix": ("",), "tools": ([],), "tool_choice": ("none",),
    "functions": ([],), "function_call": ("none",), "parallel_tool_calls": (), "response_format": ({"type": "text"},),
    "audio": (), "modalities": (["text"],), "prediction": (), "web_search_options": (), "reasoning_effort": (),
    "verbosity": (), "moderation": (),
}  # fmt: skip
_CHAT_ONLY = {"messages", "max_completion_tokens", "top_logprobs"}
_COMPLETIONS_ONLY = {"prompt", "best_of", "echo", "suffix"}
SESSION_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_SEED = 2**64 - 1
_MAX_TOKENS = 2**31 - 1
_MAX_STOP_CHARS = 256


def _number(body: dict, name: str, default, low: float, high: float, integer: bool = False):
    value = body.get(name, default)
    if value is None:
        return default
    if integer:
        ok = isinstance(value, int) or (
            isinstance(value, float) and math.isfinite(value) and value.is_integer()
        )
    else:
        ok = isinstance(value, int | float) and (isinstance(value, int) or math.isfinite(value))
    # Compared as Python numbers (exact for any int, never an OverflowError).
    if not ok or isinstance(value, bool) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise APIError(
            400, f"{name} must be {kind} between {low} and {high}, got {str(value)[:40]}", param=name
        )
    return int(value) if integer else float(value)


def check_json(value) -> None:
    """Refuse strings that are not Unicode text (a lone surrogate such as ``"\\ud800"``), walking iteratively."""
    todo = [value]
    while todo:
        v = todo.pop()
        items = v.items() if isinstance(v, dict) else ((None, x) for x in v) if isinstance(v, list) else ()
        if isinstance(v, str):
            items = [(None, v)]
        for k, x in items:
            for text in (k, x):
                if isinstance(text, str):
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError:
                        raise APIError(400, "a string in the request holds a lone surrogate (e.g. \\ud800): "
                                       "send valid Unicode") from None  # fmt: skip
            if isinstance(x, dict | list):
                todo.append(x)


def _refusals(body: dict, chat: bool) -> None:
    for name in body:
        entry = FIELDS.get(name)
        wrong_endpoint = (chat and name in _COMPLETIONS_ONLY) or (not chat and name in _CHAT_ONLY)
        if entry is None or wrong_endpoint:
            where = "/v1/chat/completions" if chat else "/v1/completions"
            raise APIError(400, f"unknown field {name[:40]!r} for {where}: this server refuses what it does not "
                           "implement", param=name[:40])  # fmt: skip
        value = body[name]
        if entry[0] == REFUSED and value is not None and value not in _DEFAULTS[name]:
            raise APIError(400, f"{name} is not supported by this server ({entry[1]})", param=name)


def _text_field(body: dict, name: str) -> None:
    if body.get(name) is not None and not isinstance(body[name], str):
        raise APIError(400, f"{name} must be a string", param=name)


def _metadata(body: dict) -> None:
    for name in ("user", "safety_identifier", "service_tier", "prompt_cache_key", "prompt_cache_retention"):
        _text_field(body, name)
    meta = body.get("metadata")
    if meta is not None and not (
        isinstance(meta, dict) and len(meta) <= 16 and all(isinstance(v, str) for v in meta.values())
    ):
        raise APIError(400, "metadata must be an object of up to 16 string values", param="metadata")
    if body.get("store") is not None and not isinstance(body["store"], bool):
        raise APIError(400, "store must be true or false", param="store")
    if body.get("prompt_cache_options") is not None and not isinstance(body["prompt_cache_options"], dict):
        raise APIError(400, "prompt_cache_options must be an object", param="prompt_cache_options")


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "developer"):
            raise APIError(400, f"messages[{i}] needs a role of system, developer, user or assistant "
                           "(no tool messages)", param=f"messages[{i}].role")  # fmt: skip
        extra = sorted(set(m) - {"role", "content"})
        if extra:
            raise APIError(400, f"messages[{i}].{extra[0][:40]} is not supported: give role and content",
                           param=f"messages[{i}].{extra[0][:40]}")  # fmt: skip
        content = m.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       and set(p) <= {"type", "text"} for p in content):  # fmt: skip
                raise APIError(400, f"messages[{i}].content: only text parts are supported",
                               param=f"messages[{i}].content")  # fmt: skip
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string", param=f"messages[{i}].content")
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": content})
    return out


def _token_list(value) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= _MAX_TOKENS for t in value)
    )


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # one prompt in a list
    if isinstance(prompt, str) or _token_list(prompt):
        return prompt
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise APIError(400, "one prompt per request: send the others as their own requests", param="prompt")
    raise APIError(400, "prompt must be a string or a non-empty list of token ids", param="prompt")


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and not (
        isinstance(stop, list)
        and len(stop) <= 4
        and all(isinstance(s, str) and len(s) <= _MAX_STOP_CHARS for s in stop)
    ):
        raise APIError(400, f"stop must be a string or a list of up to 4 strings of at most {_MAX_STOP_CHARS} "
                       "characters", param="stop")  # fmt: skip
    return list(stop or [])


def _logit_bias(body: dict) -> dict[int, float]:
    bias = body.get("logit_bias")
    if bias is None:
        return {}
    if not isinstance(bias, dict) or len(bias) > 1024:
        raise APIError(400, "logit_bias must be an object of up to 1024 {token id: bias}", param="logit_bias")
    out = {}
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 9):
            raise APIError(400, f"logit_bias keys must be token ids, got {key[:20]!r}", param="logit_bias")
        out[int(key)] = _number({"logit_bias": value}, "logit_bias", 0.0, -100, 100)
    return out


def _logprobs(body: dict, chat: bool) -> int | None:
    """How many top tokens to return with each token's log-probability (``None``: no logprobs)."""
    if not chat:
        if isinstance(body.get("logprobs"), bool):
            raise APIError(
                400, "logprobs must be an integer between 0 and 5 for completions", param="logprobs"
            )
        return None if body.get("logprobs") is None else _number(body, "logprobs", None, 0, 5, integer=True)
    on = body.get("logprobs")
    if on is not None and not isinstance(on, bool):
        raise APIError(400, "logprobs must be true or false", param="logprobs")
    top = _number(body, "top_logprobs", None, 0, 20, integer=True)
    if top is not None and not on:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    return (top or 0) if on else None


# Below this, logits / temperature overflow float32 (softmax of inf: NaN); 0 means greedy.
_MIN_TEMPERATURE = 1e-4


def _temperature(body: dict) -> float:
    value = _number(body, "temperature", 1.0, 0.0, 2.0)
    if 0 < value < _MIN_TEMPERATURE:
        raise APIError(400, f"temperature must be 0 (greedy) or at least {_MIN_TEMPERATURE}, got {value}",
                       param="temperature")  # fmt: skip
    return value


def _stream(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise APIError(400, "stream must be true or false", param="stream")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not (isinstance(options, dict) and set(options) <= {"include_usage", "include_obfuscation"}
            and all(isinstance(v, bool) or v is None for v in options.values())):  # fmt: skip
        raise APIError(400, "stream_options may hold include_usage and include_obfuscation, true or false",
                       param="stream_options")  # fmt: skip
    return stream, bool(options.get("include_usage"))


def parse_request(body, *, chat: bool, served: list[str]) -> GenerationRequest:
    """Check an OpenAI completions (``chat=False``) or chat completions body, every field against :data:`FIELDS`.

    Raises:
        APIError: naming the field and what it must be; 404 for a model this server does not serve.
    """
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    check_json(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, f"model is required: this server serves {', '.join(served)}", param="model")
    if model not in served:
        raise APIError(404, f"the model {model[:80]!r} does not exist here: this server serves {', '.join(served)}",
                       type="not_found_error", param="model", code="model_not_found")  # fmt: skip
    _refusals(body, chat)
    _metadata(body)
    limit_name = (
        "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    )
    session = body.get("session_id")
    if session is not None and not (isinstance(session, str) and SESSION_ID.fullmatch(session)):
        raise APIError(400, "session_id must be 1 to 64 characters of A-Z a-z 0-9 . _ -", param="session_id")
    stream, include_usage = _stream(body)
    return GenerationRequest(
        chat=chat,
        model=model,
        prompt=None if chat else _prompt(body),
        messages=_messages(body) if chat else None,
        max_tokens=_number(body, limit_name, DEFAULT_MAX_TOKENS, 0, _MAX_TOKENS, integer=True),
        temperature=_temperature(body),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        seed=_number(body, "seed", None, 0, MAX_SEED, integer=True),
        stop=_stop(body),
        stream=stream,
        include_usage=include_usage,
        session=session,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=_logit_bias(body),
        logprobs=_logprobs(body, chat),
        id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
        created=int(time.time()),
    )


def completion_body(
    req: GenerationRequest, text: str, finish: str, usage: dict, extra: dict, logprobs: dict | None = None
) -> dict:
    """The whole answer: a ``text_completion`` or a ``chat.completion``."""
    if req.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                  "finish_reason": finish}  # fmt: skip
    else:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
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
               usage: dict | None = None, extra: dict | None = None, logprobs: dict | None = None) -> dict:  # fmt: skip
    """One server-sent event of a streamed answer (``usage`` alone: the final usage chunk)."""
    if usage is not None and text is None and finish is None:
        choices = []
    elif req.chat:
        delta = {"role": "assistant", "content": text or ""} if first else ({"content": text} if text else {})
        choices = [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish}]
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

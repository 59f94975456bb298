"""Who may talk to the server: API keys, the Host header, JSON bodies, and a byte limit on them.

:class:`Guard` is ASGI middleware in front of every route:

- with API keys, every request needs ``Authorization: Bearer KEY`` (401 otherwise), compared in
  constant time against every key; the caller's *owner* tag (a hash of its key, never the key) goes
  to ``scope["state"]["owner"]``, and sessions are kept per owner;
- on a loopback bind, the ``Host`` header must name a loopback host (421 otherwise): a web page
  whose DNS name rebinds to 127.0.0.1 cannot reach the server through the victim's browser;
- a POST must say ``Content-Type: application/json`` (415 otherwise): a browser sends a
  cross-origin ``text/plain`` form as a "simple request" without asking first.

:func:`read_body` reads a body incrementally and refuses it (413) past a byte limit, before parsing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json

__all__ = ["Guard", "is_loopback", "keys_from", "owner_of", "read_body", "TooLarge"]

ANONYMOUS = "anonymous"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, without port) is this machine's loopback."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The host of a ``Host`` header: ``name``, ``name:port``, ``[v6]`` or ``[v6]:port``."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else ""
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def keys_from(flags: list[str] | None, env: str | None) -> list[str]:
    """The API keys: ``--api-key`` flags, then ``SINKWINDOW_API_KEY`` (comma-separated); blanks dropped."""
    keys = [k.strip() for k in (flags or [])] + [k.strip() for k in (env or "").split(",")]
    return [k for k in keys if k]


def owner_of(key: str) -> str:
    """A tag naming the holder of ``key`` (a hash: the key itself is never stored or shown)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class Guard:
    """ASGI middleware: keys, Host and content type checked before any route runs."""

    def __init__(self, app, keys: list[str], loopback_only: bool):
        self.app = app
        self.keys = [(k.encode(), owner_of(k)) for k in keys]
        self.loopback_only = loopback_only

    def _owner(self, headers: dict[bytes, bytes]) -> str | None:
        if not self.keys:
            return ANONYMOUS
        given = headers.get(b"authorization", b"")
        scheme, _, token = given.partition(b" ")
        owner = None
        for key, tag in self.keys:  # every key compared, in constant time: no early exit
            if hmac.compare_digest(token.strip(), key) and scheme.lower() == b"bearer":
                owner = tag
        return owner

    def _refusal(self, scope, headers: dict[bytes, bytes]) -> tuple[int, str, str] | None:
        host = headers.get(b"host", b"").decode("latin-1")
        if self.loopback_only and not is_loopback(_host_name(host)):
            return (
                421,
                f"the Host header {host[:80]!r} does not name this loopback server",
                "misdirected_request",
            )
        if scope["method"] == "POST":
            ctype = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
            if ctype != "application/json":
                return (
                    415,
                    "send the request body as Content-Type: application/json",
                    "unsupported_media_type",
                )
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        owner = self._owner(headers)
        if owner is None:
            return await _reply(send, 401, "Incorrect API key provided: send Authorization: Bearer KEY",
                                "invalid_api_key")  # fmt: skip
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            return await _reply(send, *refusal)
        scope.setdefault("state", {})["owner"] = owner
        return await self.app(scope, receive, send)


async def _reply(send, status: int, message: str, code: str) -> None:
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class TooLarge(Exception):
    """A request body past the byte limit."""


async def read_body(request, limit: int) -> bytes:
    """The body of ``request``, read a chunk at a time; ``TooLarge`` as soon as it passes ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge
        parts.append(chunk)
    return b"".join(parts)

"""Conversations that keep their cache between requests, within a count and a byte budget.

A session is append-only: each request's prompt continues the tokens the session has already
seen, so a conversation can go on for ever in the memory of one bounded cache (StreamingLLM's
use case). On a pooled engine a session's memory is its ``kv_row``: blocks of the engine's KV pool,
as many as its tokens reach (at most w a windowed layer). The last generated token of a turn has not been fed yet; it is kept as ``pending``
and fed first next turn. Idle sessions beyond ``max_sessions`` or ``kv_budget`` bytes are evicted,
least recently used first, and each eviction is recorded (``evicted``) so the server can say
which it dropped; ``on_evict`` (set by the engine) gives an evicted session's blocks back at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from transformers.cache_utils import Cache

from ..runtime.cache import cache_nbytes
from ..runtime.kv_pool import PoolRow

__all__ = ["Session", "SessionBusyError", "SessionStore"]


class SessionBusyError(RuntimeError):
    """A request for a session that another request is using."""


@dataclass
class Session:
    """One conversation's state: its cache, the token not yet fed, and counts."""

    id: str
    cache: Cache | None = None  # engines without a KV pool
    kv_row: PoolRow | None = None  # its blocks in the engine's KV pool
    pending: list[int] = field(default_factory=list)
    tokens: int = 0  # tokens the cache has seen (positions so far)
    turns: int = 0
    created: float = field(default_factory=time.time)
    last_used: float = field(default_factory=time.time)
    busy: bool = False

    def kv_bytes(self) -> int:
        if self.kv_row is not None:
            return self.kv_row.nbytes
        return 0 if self.cache is None else cache_nbytes(self.cache)

    def row(self) -> dict:
        return {
            "id": self.id,
            "tokens": self.tokens,
            "turns": self.turns,
            "kv_cache_bytes": self.kv_bytes(),
            "kv_blocks": self.kv_row.blocks if self.kv_row is not None else None,
            "busy": self.busy,
            "created": int(self.created),
            "last_used": int(self.last_used),
        }


class SessionStore:
    """Sessions by id, thread-safe; at most ``max_sessions`` and ``kv_budget`` bytes kept idle."""

    def __init__(self, max_sessions: int = 64, kv_budget: int | None = None, history: int = 100):
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        self.max_sessions = max_sessions
        self.kv_budget = kv_budget
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.evicted: deque[dict] = deque(maxlen=history)
        self.on_evict: Callable[[Session], None] | None = None

    def reserve(self, session_id: str) -> Session:
        """The session (new if unknown), marked busy until :meth:`release`.

        Raises:
            SessionBusyError: another request holds it.
        """
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                s = self._sessions[session_id] = Session(session_id)
            if s.busy:
                raise SessionBusyError(f"session {session_id!r} is answering another request: wait for it")
            s.busy = True
            return s

    def release(self, session: Session) -> list[dict]:
        """Mark ``session`` idle, then evict over the limits; return the evictions this made."""
        with self._lock:
            session.busy = False
            session.last_used = time.time()
            return self._enforce()

    def abandon(self, session: Session) -> None:
        """Release a session reserved for a request that was refused; one it created is removed again
        (so refused requests never push real sessions out under ``max_sessions``)."""
        with self._lock:
            session.busy = False
            if session.turns == 0 and session.tokens == 0 and self._sessions.get(session.id) is session:
                del self._sessions[session.id]
                if self.on_evict is not None:
                    self.on_evict(session)

    def drop(self, session_id: str, reason: str = "deleted") -> dict | None:
        with self._lock:
            s = self._sessions.get(session_id)
            if s is None:
                return None
            if s.busy:
                raise SessionBusyError(f"session {session_id!r} is answering a request: cancel it first")
            return self._evict(s, reason)

    def _evict(self, s: Session, reason: str) -> dict:
        del self._sessions[s.id]
        note = {
            "id": s.id,
            "reason": reason,
            "tokens": s.tokens,
            "kv_cache_bytes": s.kv_bytes(),
            "at": int(time.time()),
        }
        self.evicted.append(note)
        if self.on_evict is not None:
            self.on_evict(s)
        return note

    def evict_idle(self, n: int, reason: str) -> list[dict]:
        """Evict up to ``n`` idle sessions, least recently used first; the evictions made."""
        with self._lock:
            idle = sorted((s for s in self._sessions.values() if not s.busy), key=lambda s: s.last_used)
            return [self._evict(s, reason) for s in idle[:n]]

    def _enforce(self) -> list[dict]:
        out = []
        idle = sorted((s for s in self._sessions.values() if not s.busy), key=lambda s: s.last_used)
        while len(self._sessions) > self.max_sessions and idle:
            out.append(self._evict(idle.pop(0), f"more than --max-sessions {self.max_sessions}"))
        if self.kv_budget is not None:
            total = sum(s.kv_bytes() for s in self._sessions.values())
            while total > self.kv_budget and idle:
                s = idle.pop(0)
                total -= s.kv_bytes()
                out.append(self._evict(s, f"sessions' KV caches over --kv-budget {self.kv_budget} bytes"))
        return out

    def tokens_seen(self, session_id: str) -> int:
        """Tokens the session's cache has seen (0 for an unknown session), without measuring caches."""
        with self._lock:
            s = self._sessions.get(session_id)
            return 0 if s is None else s.tokens

    def pending(self, session_id: str) -> list[int]:
        """The session's generated token not fed yet (``[]`` for none, or an unknown session)."""
        with self._lock:
            s = self._sessions.get(session_id)
            return [] if s is None else list(s.pending)

    def rows(self) -> list[dict]:
        with self._lock:
            return [s.row() for s in self._sessions.values()]

    def __len__(self) -> int:
        return len(self._sessions)

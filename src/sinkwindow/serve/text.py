"""Text from a token stream: incremental detokenizing, and stop strings held back until decided.

``IncrementalDecoder`` decodes a short tail of the stream (the tokens since the last emitted
text, plus a few before them for context) and emits only what is new, never half a character
(a ``"\\ufffd"`` at the end means a multi-byte character is still incomplete). It keeps no more
than that tail, so a stream of any length costs constant memory, as the cache does.
"""

from __future__ import annotations

__all__ = ["IncrementalDecoder", "StopMatcher"]

# Tokens kept before the unread ones: enough for a tokenizer's merge rules to space words correctly.
_CONTEXT = 4


class IncrementalDecoder:
    """``push(token) -> new text`` over a growing token stream (the TGI/vLLM prefix-offset scheme)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] were decoded already, as context
        self.read = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        new = after[len(before) :]
        # Keep a few tokens of context, drop the rest: memory stays constant over the stream.
        keep_from = max(len(self.ids) - _CONTEXT, 0)
        self.ids = self.ids[keep_from:]
        self.prefix = 0
        self.read = len(self.ids)
        return new

    def flush(self) -> str:
        """What is left undecoded at the end of the stream (an incomplete character, decoded as is)."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.read = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""


class StopMatcher:
    """Text through ``feed``, held back while it may be the start of a stop string.

    ``feed(text) -> (safe, stopped)``: ``safe`` may be shown now; ``stopped`` is True once a stop
    string appeared (``safe`` then ends just before it and nothing more is shown).
    """

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.buffer = ""
        self.stopped = False

    def feed(self, text: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        self.buffer += text
        hits = [i for i in (self.buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            safe, self.buffer, self.stopped = self.buffer[: min(hits)], "", True
            return safe, True
        if self.hold == 0:
            safe, self.buffer = self.buffer, ""
            return safe, False
        # Hold back only a tail that could still begin a stop string.
        cut = len(self.buffer)
        for k in range(1, min(self.hold, len(self.buffer)) + 1):
            tail = self.buffer[-k:]
            if any(s.startswith(tail) for s in self.stops):
                cut = len(self.buffer) - k
        safe, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return safe, False

    def flush(self) -> str:
        safe, self.buffer = ("" if self.stopped else self.buffer), ""
        return safe

"""One answer's tokens turned into the text the client is shown, its stop, and its logprobs.

:meth:`AnswerText.token` runs on the engine's worker thread, for each token as it is chosen and
*before* it is fed: so when a stop string completes, the engine learns it at that very token and
feeds no more (:meth:`AnswerText.watch`), and a session keeps nothing the client was not shown
(see ``Engine._end``). Each token's text offset is kept, so the tokens lying wholly before the stop
are known. The token holding the stop's first character is not kept, so text of that token shown
before the stop (``"c"`` of a token ``"c\n"`` under stop ``"\n"``) is not in the session either:
it keeps a little less than it showed, never more.

Log-probabilities go out with the text they belong to: a token's entry is sent with the piece of
text that first reaches past its start (a token held back as a possible stop string waits), and
entries of tokens after a stop string are never sent.
"""

from __future__ import annotations

from .text import IncrementalDecoder, StopMatcher

__all__ = ["AnswerText"]


class AnswerText:
    """Decoding, stop strings and logprob entries of one answer (``logprobs``: top-k, or ``None``)."""

    def __init__(self, tokenizer, stops: list[str], logprobs: int | None, chat: bool):
        self.tok = tokenizer
        self.decoder = IncrementalDecoder(tokenizer)
        self.stops = StopMatcher(stops)
        self.logprobs, self.chat = logprobs, chat
        self.ids: list[int] = []
        self.raw = 0  # characters decoded so far
        self.shown = 0  # characters passed to the client (raw[:shown]; a stop string begins at shown)
        self.ends: list[int | None] = []  # each token's end offset (None: its text is not complete yet)
        self.waiting: list[tuple[int, dict | None, int]] = []  # logprob entries not sent yet
        self.stop_keep: int | None = None

    def token(self, token: int, info: dict | None) -> tuple:
        """Worker thread: take ``token``; the event for the client: ``("piece", text, entries)``."""
        self.ids.append(token)
        start = self.raw
        text = self.decoder.push(token)
        self.raw += len(text)
        self.ends.append(None)
        if text:  # every token without complete text so far ends where this text ends
            for i in range(len(self.ends) - 1, -1, -1):
                if self.ends[i] is not None:
                    break
                self.ends[i] = self.raw
        if self.logprobs is not None:
            self.waiting.append((token, info, start))
        safe, stopped = self.stops.feed(text)
        self.shown += len(safe)
        if stopped:
            self.stop_keep = sum(1 for end in self.ends if end is not None and end <= self.shown)
        return ("piece", safe, self._release())

    def watch(self, token: int, info: dict | None) -> int | None:
        """The engine's ``Job.watch``: tokens wholly before the stop string once one ended the answer."""
        return self.stop_keep

    def _release(self, everything: bool = False) -> list:
        out = [e for e in self.waiting if everything or e[2] < self.shown]
        self.waiting = self.waiting[len(out) :]
        return out

    def finish(self) -> tuple[str, list]:
        """After the last token: the text held back at the end, and the entries left to send."""
        if self.stops.stopped:
            return "", []
        tail = self.stops.feed(self.decoder.flush())[0]
        tail += "" if self.stops.stopped else self.stops.flush()
        self.shown += len(tail)
        return tail, self._release(everything=not self.stops.stopped)

    def render(self, entries: list) -> dict | None:
        """OpenAI's ``logprobs`` object for ``entries`` (chat: ``content``; completions: parallel lists)."""
        if self.logprobs is None:
            return None
        text = lambda t: self.tok.decode([t], skip_special_tokens=False)  # noqa: E731
        if self.chat:
            content = []
            for token, info, _ in entries:
                s = text(token)
                top = [
                    {"token": text(t), "logprob": lp, "bytes": list(text(t).encode())}
                    for t, lp in info["top"]
                ]
                content.append(
                    {"token": s, "logprob": info["logprob"], "bytes": list(s.encode()), "top_logprobs": top}
                )
            return {"content": content, "refusal": None}
        return {
            "tokens": [text(t) for t, _, _ in entries],
            "token_logprobs": [info["logprob"] for _, info, _ in entries],
            "top_logprobs": [{text(t): lp for t, lp in info["top"]} for _, info, _ in entries],
            "text_offset": [start for _, _, start in entries],
        }

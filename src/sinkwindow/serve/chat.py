"""A chat session's turns as one continuous conversation under the model's chat template.

The first turn renders its messages as the template does. A later turn must not render them
afresh: many templates open every conversation with a default system prompt (SmolLM2's "You are a
helpful AI assistant named SmolLM..."), which would land in the middle of the session's stream. A
continuation is rendered behind a stand-in conversation that already has a system prompt, a user
turn and an assistant turn, and only the text after the stand-in assistant's content is kept: the
template's own end of the previous assistant turn, then the new messages and the generation
prompt. If the previous answer ended on the end-of-turn token (the session's pending token), the
rendered end of turn begins with that token's text, which the stream already holds: it is cut.
"""

from __future__ import annotations

__all__ = ["render_first", "render_continuation", "ChatTemplateError"]

# Stand-in content, found again in the rendering (no template rewrites a plain word).
_MARK = "sinkwindowturnmark"
_LEAD = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": _MARK},
]


class ChatTemplateError(ValueError):
    """The model's chat template refused the messages (its own message)."""


def _render(tok, messages: list[dict]) -> str:
    try:
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as err:  # jinja's TemplateError, or a template's raise_exception
        raise ChatTemplateError(f"the chat template refused these messages: {err}".splitlines()[0]) from None


def render_first(tok, messages: list[dict]) -> str:
    """The text of a conversation's first turn (the template's own rendering)."""
    return _render(tok, messages)


def render_continuation(tok, messages: list[dict], pending_text: str | None) -> str:
    """The text that continues a session with ``messages`` (the new ones only).

    Args:
        pending_text: the text of the session's pending token when it ended the previous answer
            (an end-of-turn token), else ``None``.
    """
    full = _render(tok, _LEAD + messages)
    at = full.rfind(_MARK)
    if at < 0:
        raise ChatTemplateError(
            "the chat template drops assistant messages: a session cannot continue a chat"
        )
    tail = full[at + len(_MARK) :]
    if pending_text and tail.startswith(pending_text):
        tail = tail[len(pending_text) :]
    return tail

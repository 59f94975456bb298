"""What a long run tells its user as it goes: the thread count it chose, a training validation, a
signal it caught.

Library code never prints; it logs these lines to :data:`NOTICES`, a logger of their own so that the
CLI can show them as plain lines on stderr (:func:`show_notices`) while other INFO logging stays off
unless ``--verbose``. A program that imports sinkwindow sees them only if it configures logging.
"""

from __future__ import annotations

import logging
import sys

__all__ = ["NOTICES", "show_notices"]

NOTICES = logging.getLogger("sinkwindow.runtime.notices")


def show_notices(stream=None) -> None:
    """Print :data:`NOTICES` lines as they are, on ``stream`` (default: the current ``sys.stderr``).

    Idempotent: a second call (another command run in the same process) replaces the handler, so
    each line is shown once, on the stream of the latest call.
    """
    for handler in list(NOTICES.handlers):
        if getattr(handler, "_sinkwindow_notices", False):
            NOTICES.removeHandler(handler)
    handler = _StderrHandler(stream)
    handler._sinkwindow_notices = True
    NOTICES.addHandler(handler)
    NOTICES.setLevel(logging.INFO)
    NOTICES.propagate = False  # shown once, not again through a root handler


class _StderrHandler(logging.StreamHandler):
    """A stream handler that looks ``sys.stderr`` up at each line when no stream was given, so a
    replaced stderr (pytest's capture, a redirect) gets the lines."""

    def __init__(self, stream=None) -> None:
        super().__init__(stream or sys.stderr)
        self._fixed = stream is not None
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if not self._fixed:
            self.stream = sys.stderr
        super().emit(record)
        self.flush()

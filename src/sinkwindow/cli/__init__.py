"""The ``sinkwindow`` command: its parser and entry point (``app``: ``build_parser``, ``main``), flag declarations (``args``), one-line
errors (``errors``) and the ``check`` command. ``python -m sinkwindow.cli`` runs it too.

Nothing below the command line imports this package (``tests/test_layering.py``); each area's
``<area>/cli.py`` registers its own subcommand and belongs to this layer.
"""

from .._lazy import lazy_package

__all__ = lazy_package(__name__, {".app": ["build_parser", "main"]})

"""``python -m sinkwindow.eval.lmeval``: the ``sinkwindow-lm-eval`` console script."""

import sys

from .cli import cli_evaluate

sys.exit(cli_evaluate())

"""``python -m sinkwindow.cli``: the ``sinkwindow`` command."""

import sys

from .app import main

sys.exit(main())

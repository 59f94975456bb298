"""Models: the packaged ones (``packaged``), loading any of them or a local checkpoint (``loading``),
the essays their evaluations read (``essays``), and what a command's model flags name, made concrete
(``resolve``: checkpoints, device, placement).

Above the runtime (loading a trained baseline switches methods), below evaluation and the CLI.
Importing the package imports nothing else (no torch).
"""

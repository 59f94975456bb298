"""Sample generators, one module per source: each draws a task's samples (prompt, answers, the
evidence that sizes it) from a seed, with no model. The rule: ``eval/generators/<source>.py`` makes
the samples, ``eval/tasks/<task>.py`` registers them as a ``Task`` (budget, decoding, score), and
scorers that are not a generator's own (``eval/code_sim.py``) stay in ``eval/``.

Importing the package imports nothing else.
"""

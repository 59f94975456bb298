"""``sinkwindow baseline``: bring your own sub-quadratic model, get SWA at equal memory beside it.

A candidate C (a linear-attention retrofit, a state-space or hybrid model, or one of sinkwindow's own
retrofits of the base) is run beside its base transformer B under full attention and under
SWA(W, 4) at the W whose bounded KV cache holds no more bytes than C's decoding state, with the two
neighbouring power-of-two windows, on the same samples, into one run folder.

- ``state.py``: C's (and B's) decoding state in bytes, measured on the cache object after a prefill.
- ``window.py``: the equal-memory window and its neighbours.
- ``candidate.py``: what C is (a retrofit spec of B, or a model of its own), loading it, and the
  check that C and B tokenize the samples alike.
- ``run.py``: the run (the evaluation runner's cells, one results store).
- ``report.py``: the pair's table, paired exact tests with Holm's correction, the memory plot.
- ``cli.py``: the command.
"""

"""How many torch CPU threads a command uses: a safe default on a shared machine, chosen once per process.

OpenMP threads wait for each other at the end of every op, spinning. When other processes hold the
cores, each of our threads keeps getting descheduled while its siblings spin, and a decode step of
many small ops pays that at every op: on a loaded 2-core box, 2 threads made decode 10-20x slower
than 1. So, unless told otherwise, a command uses one thread when the machine is busy and every
core when it is idle (:func:`choose_threads`), and says which on stderr (:func:`apply_threads`).

Threads never change results (every kernel gives the same numbers at any count): runs record the
count beside their results, never in a results fingerprint.
"""

from __future__ import annotations

import os
import sys
from typing import NamedTuple

__all__ = ["ThreadChoice", "available_cores", "choose_threads", "apply_threads", "BUSY_MARGIN"]

# The machine counts as busy when the 1-minute load average is within half a core of the core
# count. The average lags: a process that started t seconds ago adds only 1 - exp(-t/60) to it (0.4
# after 30 s), so a box whose cores other jobs just filled reads a little under its core count; an
# idle box (this process starting, a shell) reads well below cores - 0.5.
BUSY_MARGIN = 0.5


class ThreadChoice(NamedTuple):
    """The count, and why (printed and recorded)."""

    threads: int
    cores: int
    load: float | None
    reason: str

    def describe(self) -> str:
        """``"torch threads: 1 (2 cores, load 2.3: other work running)"``."""
        load = "" if self.load is None else f", load {self.load:.1f}"
        return f"torch threads: {self.threads} ({self.cores} cores{load}: {self.reason})"

    def to_json(self) -> dict:
        return self._asdict()


def available_cores() -> int:
    """CPU cores this process may use (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _load_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return None


def choose_threads(
    requested: int | None = None,
    *,
    cores: int | None = None,
    load: float | None = None,
    env: dict | None = None,
) -> ThreadChoice:
    """The thread count to use, in this order: ``requested`` (``--threads``), ``OMP_NUM_THREADS`` if
    set to a positive integer, 1 if the 1-minute load average is at least ``cores - BUSY_MARGIN``
    (other processes hold the cores), else every core.

    Args:
        requested: what the user asked for, or ``None``.
        cores: cores to plan for (default :func:`available_cores`).
        load: the 1-minute load average (default ``os.getloadavg()[0]``; unknown: treated as idle).
        env: environment to read ``OMP_NUM_THREADS`` from (default ``os.environ``).
    """
    cores = cores if cores is not None else available_cores()
    load = load if load is not None else _load_1m()
    env = os.environ if env is None else env
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be positive, got {requested}")
        return ThreadChoice(requested, cores, load, "--threads")
    omp = str(env.get("OMP_NUM_THREADS", "")).strip()
    if omp.isdigit() and int(omp) > 0:
        return ThreadChoice(int(omp), cores, load, "OMP_NUM_THREADS")
    if cores > 1 and load is not None and load >= cores - BUSY_MARGIN:
        return ThreadChoice(1, cores, load, "other work running")
    return ThreadChoice(cores, cores, load, "idle machine, every core")


_CHOSEN: ThreadChoice | None = None


def apply_threads(requested: int | None = None, *, quiet: bool = False) -> ThreadChoice:
    """Choose (:func:`choose_threads`), ``torch.set_num_threads`` and print the choice on stderr.

    Meant to be called once per process, by the command (``bench``, ``eval``, ``compare``); a later
    call with no request returns the first choice unchanged and prints nothing, so the count never
    changes under a running measurement. An explicit ``requested`` always applies.
    """
    global _CHOSEN
    import torch

    if _CHOSEN is not None and requested in (None, _CHOSEN.threads):
        if torch.get_num_threads() != _CHOSEN.threads:
            # Something in this process changed it since (a library, an earlier --threads): the
            # count recorded with the results must be the one the measurement runs with.
            torch.set_num_threads(_CHOSEN.threads)
        return _CHOSEN

    choice = choose_threads(requested)
    torch.set_num_threads(choice.threads)
    if not quiet:
        print(choice.describe(), file=sys.stderr, flush=True)
    _CHOSEN = choice
    return choice

"""How many torch CPU threads a command uses: a safe default on a shared machine, chosen once per process.

OpenMP threads wait for each other at the end of every op, spinning. When other processes hold the
cores, each of our threads keeps getting descheduled while its siblings spin, and a decode step of
many small ops pays that at every op: on a loaded 2-core box, 2 threads made decode 10-20x slower
than 1. So, unless told otherwise, a command leaves the cores other processes use now to them and
takes the rest (at least one; :func:`choose_threads`), and says which on stderr (:func:`apply_threads`).

"Now" is a short sample of the machine's CPU counters (:func:`busy_cores`), not the 1-minute load
average: that average lags a minute behind, so right after a package install (``make demo`` on a
fresh machine) an idle box read as busy and the demo ran on one core, and a job started a few
seconds ago read as absent.

Threads never change results (every kernel gives the same numbers at any count): runs record the
count beside their results, never in a results fingerprint.
"""

from __future__ import annotations

import logging
import math
import os
import time
from typing import NamedTuple

from .notices import NOTICES

__all__ = [
    "set_threads",
    "ThreadChoice",
    "available_cores",
    "busy_cores",
    "choose_threads",
    "apply_threads",
    "rechoose_threads",
    "BUSY_MARGIN",
]

logger = logging.getLogger(__name__)

# A core counts as taken by other work once they keep more than half of it busy: 0.4 cores of a
# shell or a finishing install is noise; a single-thread job reads 0.9-1.0.
BUSY_MARGIN = 0.5
SAMPLE_SECONDS = 0.25


class ThreadChoice(NamedTuple):
    """The count, and why (printed and recorded)."""

    threads: int
    cores: int
    busy: float | None
    reason: str

    def describe(self) -> str:
        """``"torch threads: 1 (2 cores, 1.0 busy: other work running)"``."""
        busy = "" if self.busy is None else f", {self.busy:.1f} busy"
        return f"torch threads: {self.threads} ({self.cores} cores{busy}: {self.reason})"

    def to_json(self) -> dict:
        return self._asdict()


def available_cores() -> int:
    """CPU cores this process may use (its affinity mask, else the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def set_threads(threads: int | None) -> None:
    """``torch.set_num_threads(threads)`` for a count given outright (``--threads N`` of a command that
    chooses no count of its own, a worker's share of the cores); ``None`` or 0 leaves torch's as it is.

    Every thread count a command or worker sets goes through here or :func:`apply_threads`.
    """
    if threads:
        import torch

        torch.set_num_threads(threads)


def _cpu_counters() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs from ``/proc/stat``; ``None`` where there is none."""
    try:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])  # guest time is already inside user


def busy_cores(seconds: float = SAMPLE_SECONDS) -> float | None:
    """How many cores processes other than this one keep busy, over the next ``seconds``.

    Samples ``/proc/stat`` before and after a sleep and takes this process's own CPU time out.
    Where ``/proc/stat`` is missing, falls back to the 1-minute load average (lagging, see the
    module docstring); ``None`` where neither exists.
    """
    before, own_before, t0 = _cpu_counters(), _own_cpu(), time.monotonic()
    if before is None:
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):  # not on every platform
            return None
    time.sleep(seconds)
    after, own_after, t1 = _cpu_counters(), _own_cpu(), time.monotonic()
    if after is None or after[1] <= before[1]:
        return None
    cpus = os.cpu_count() or 1
    busy = (after[0] - before[0]) / (after[1] - before[1]) * cpus  # cores busy, all processes
    own = (own_after - own_before) / max(t1 - t0, 1e-9)
    return max(0.0, busy - own)


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system


def choose_threads(
    requested: int | None = None,
    *,
    cores: int | None = None,
    busy: float | None = None,
    env: dict | None = None,
) -> ThreadChoice:
    """The thread count to use, in this order: ``requested`` (``--threads``), ``OMP_NUM_THREADS`` if
    set to a positive integer, else the cores other processes leave free: every core when they keep
    less than ``BUSY_MARGIN`` of one busy, one fewer for each further core they take, at least 1.

    Args:
        requested: what the user asked for, or ``None``.
        cores: cores to plan for (default :func:`available_cores`).
        busy: cores other processes keep busy (default :func:`busy_cores`; unknown: treated as idle).
        env: environment to read ``OMP_NUM_THREADS`` from (default ``os.environ``).
    """
    cores = cores if cores is not None else available_cores()
    env = os.environ if env is None else env
    if requested is not None:
        if requested < 1:
            raise ValueError(f"threads must be positive, got {requested}")
        return ThreadChoice(requested, cores, busy, "--threads")
    omp = str(env.get("OMP_NUM_THREADS", "")).strip()
    if omp.isdigit() and int(omp) > 0:
        return ThreadChoice(int(omp), cores, busy, "OMP_NUM_THREADS")
    busy = busy if busy is not None else busy_cores()
    taken = 0 if busy is None else math.floor(busy + BUSY_MARGIN)  # 0.5 of a core takes it
    threads = max(1, cores - taken)
    if threads < cores:
        return ThreadChoice(threads, cores, busy, "other work running")
    return ThreadChoice(cores, cores, busy, "idle machine, every core")


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
        NOTICES.info(choice.describe())
    _CHOSEN = choice
    return choice


# Where a count came from that the user set: never re-decided.
_ASKED = ("--threads", "OMP_NUM_THREADS")


def rechoose_threads() -> ThreadChoice | None:
    """Re-decide an automatic choice from a fresh sample of the machine, between units of work.

    A long evaluation chose its count once, in its first seconds: on a fresh clone another process
    (an install finishing) made it pick 1 thread and keep it for 20 minutes on a machine that was
    soon idle. Call this between cells (never inside a timed measurement): a count the user set
    (``--threads``, ``OMP_NUM_THREADS``) is kept; an automatic one follows the machine, and each
    change is logged once. Returns the new choice when the count changed, else ``None``.
    """
    global _CHOSEN
    if _CHOSEN is None or _CHOSEN.reason in _ASKED:
        return None
    import torch

    choice = choose_threads(None)
    if choice.threads == _CHOSEN.threads:
        return None
    logger.warning("torch threads %d -> %d (%s)", _CHOSEN.threads, choice.threads, choice.reason)
    torch.set_num_threads(choice.threads)
    _CHOSEN = choice
    return choice

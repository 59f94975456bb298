"""Measured memory: the process's resident set and its peak over a block.

``PeakMemory`` gives the process's peak resident set over a block (Linux lets us reset the
high-water mark through ``/proc/self/clear_refs``), or CUDA's ``max_memory_allocated``. What a
method must hold by the config alone (``analytic_state_bytes``) and what a cache object holds
(``cache_nbytes``) are the core's, in ``sinkwindow.runtime.kv_bytes``: evaluation and tuning use them too.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import resource
import sys

import torch

__all__ = ["PeakMemory", "current_rss", "peak_rss", "reset_peak_rss"]

logger = logging.getLogger(__name__)


def _proc_status(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def current_rss() -> int:
    """Resident set size of this process now, in bytes (0 where /proc is missing)."""
    return _proc_status("VmRSS") or 0


def peak_rss() -> int:
    """Peak resident set size since the last ``reset_peak_rss`` (or since start), in bytes."""
    hwm = _proc_status("VmHWM")
    if hwm is not None:
        return hwm
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss is bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _malloc_trim() -> None:
    # Hand freed heap pages back to the OS so the previous measurement's buffers do not count as
    # this one's resident baseline.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def reset_peak_rss() -> bool:
    """Reset the peak-RSS high-water mark to the current RSS (Linux >= 4.0).

    Returns:
        True if the reset worked; otherwise ``peak_rss`` keeps meaning "since process start".
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakMemory:
    """Peak memory over a ``with`` block.

    On CPU: process peak RSS over the block (``rss_scope == "block"``) where the kernel allows a
    reset, else since process start (``"process"``). On CUDA: ``torch.cuda.max_memory_allocated``
    after ``reset_peak_memory_stats``, plus the RSS numbers.

    Attributes:
        rss_before: RSS at entry, bytes (weights, interpreter, allocator slack).
        peak_rss: peak RSS, bytes.
        rss_scope: ``"block"`` or ``"process"``.
        cuda_peak: peak CUDA bytes allocated in the block, or None off CUDA.
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.rss_before = 0
        self.peak_rss = 0
        self.rss_scope = "process"
        self.cuda_peak: int | None = None

    def __enter__(self) -> PeakMemory:
        gc.collect()
        _malloc_trim()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(self.device)
        self.rss_before = current_rss()
        self.rss_scope = "block" if reset_peak_rss() else "process"
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.cuda_peak = int(torch.cuda.max_memory_allocated(self.device))
        self.peak_rss = peak_rss()

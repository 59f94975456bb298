"""The SWA window at equal memory: the largest W whose bounded KV cache fits a byte budget.

SWA(W, S) keeps at most W − 1 keys and values per layer (the S sinks among them; the query brings
the W-th), so once the context passes W its cache stops growing at ``analytic_state_bytes`` of
``swa:W:S`` at context W. That bound is non-decreasing in W, so the largest W that fits is found by
bisection (``equal_memory_window``) and checked against a linear scan in the tests.
"""

from __future__ import annotations

__all__ = ["swa_bound_bytes", "equal_memory_window", "neighbour_windows", "MAX_WINDOW"]

# Past this a window is no bound at all for any model sinkwindow evaluates (1M tokens).
MAX_WINDOW = 1 << 20


def swa_bound_bytes(config, window: int, sinks: int, dtype) -> int:
    """Bytes the cache of SWA(``window``, ``sinks``) holds once the context has passed the window."""
    from ...runtime.kv_bytes import analytic_state_bytes
    from ...runtime.spec import parse_spec

    return analytic_state_bytes(parse_spec(f"swa:{window}:{sinks}"), config, window, dtype=dtype)


def equal_memory_window(config, budget: int, sinks: int, dtype) -> int:
    """The largest W whose bounded SWA(W, ``sinks``) cache holds at most ``budget`` bytes.

    Raises:
        ValueError: not even the smallest window (``sinks`` + 1) fits (one line naming the budget).
    """
    lo = sinks + 1
    if swa_bound_bytes(config, lo, sinks, dtype) > budget:
        raise ValueError(
            f"the candidate's state ({budget:,} bytes) is smaller than SWA({lo}, {sinks})'s cache "
            f"({swa_bound_bytes(config, lo, sinks, dtype):,} bytes) on the base: no window fits at equal memory"
        )
    hi = MAX_WINDOW
    if swa_bound_bytes(config, hi, sinks, dtype) <= budget:
        return hi
    while hi - lo > 1:  # invariant: lo fits, hi does not
        mid = (lo + hi) // 2
        if swa_bound_bytes(config, mid, sinks, dtype) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def neighbour_windows(window: int, sinks: int) -> list[int]:
    """The powers of two just below and just above ``window`` (strictly), each larger than ``sinks``."""
    below = 1 << (window.bit_length() - 1)
    if below == window:
        below //= 2
    above = 1 << window.bit_length()
    return [w for w in (below, above) if w > sinks]

"""Intervals for the numbers in a report: Wilson for proportions, bootstrap for everything else.

Every function returns an :class:`Interval` (estimate, lo, hi, n) at a two-sided level (95% by
default). Nothing here knows about tasks or methods: the report (``report.py``) decides which
samples form a cell and which samples pair up.

- One cell of 0/1 scores (or of scores in [0, 1] such as RULER's partial string match, whose mean
  is treated as a proportion): :func:`wilson_interval`. Unlike the normal approximation it never
  leaves [0, 1] and does not collapse to zero width at 0/n or n/n.
- An average over samples, or over several cells (an average across tasks or lengths):
  :func:`bootstrap_mean_interval`. Several cells are resampled *within* each cell (stratified), so
  each cell keeps its own n and the average stays an equal-weight average of cell means.
- Two methods on the same samples (same task, length, index): :func:`paired_bootstrap_ratio`
  (recovery = method ÷ full, and the paper's SWA ÷ LoLCATs) and :func:`paired_bootstrap_diff`.
  Pairs are resampled together, so what both methods find hard cancels out of the noise.
  :func:`exceeds_noise` says whether such an interval excludes the null value (for display).
- Decisions on paired scores: :func:`paired_sign_test`, the exact sign-flip test (for one cell of 0/1
  scores, McNemar's exact test on the discordant pairs; for an average over cells, the same test
  stratified by cell weights, exact by convolution), and :func:`holm` over a family of tests.
  A bootstrap over ten binary pairs cannot carry a decision; these tests can, and they say when
  too few pairs could never reject (``TestResult.min_p``).
- Perplexity over windows: :func:`bootstrap_ppl_interval` resamples (nll_sum, n_tokens) pairs.

Bootstrap intervals are percentile intervals over ``n_boot`` replicates drawn with
``numpy.random.default_rng(seed)``, so the same inputs and seed give the same interval. They are
too narrow for very small cells (with n = 2 the resamples can only take three values), which is
why every interval is reported with its n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

__all__ = [
    "Interval",
    "bootstrap_mean_interval",
    "bootstrap_ppl_interval",
    "equal_weight_size",
    "exceeds_noise",
    "holm",
    "paired_sign_test",
    "TestResult",
    "paired_bootstrap_diff",
    "paired_bootstrap_ratio",
    "wilson_interval",
]

NAN = float("nan")

# Flags an Interval can carry. A ratio whose denominator mean is 0 has no estimate; one where only
# some replicates hit a zero denominator has an estimate but an interval that may reach +inf; one
# whose numerator is all zero takes its upper bound from Wilson instead of the bootstrap.
ZERO_DENOMINATOR = "zero_denominator"
UNSTABLE_DENOMINATOR = "unstable_denominator"
NO_SUCCESS = "no_success"


class Interval(NamedTuple):
    """A point estimate with a two-sided interval.

    Attributes:
        estimate: the statistic on the data as observed.
        lo, hi: interval bounds (``nan`` when undefined, e.g. n = 0).
        n: number of samples (pairs for paired statistics, windows for perplexity), summed over
            cells for stratified statistics.
        flag: ``None``, or why the interval is degenerate (``"zero_denominator"``,
            ``"unstable_denominator"``).
    """

    estimate: float
    lo: float
    hi: float
    n: int
    flag: str | None = None

    @property
    def width(self) -> float:
        return self.hi - self.lo

    def scaled(self, factor: float) -> Interval:
        """The same interval in other units (e.g. ×100 for percent)."""
        return self._replace(estimate=self.estimate * factor, lo=self.lo * factor, hi=self.hi * factor)


def wilson_interval(successes: float, n: int, z: float = 1.96) -> Interval:
    """Wilson score interval for a proportion p̂ = successes / n.

    With z the normal quantile (1.96 for 95%)::

        centre = (p̂ + z²/2n) / (1 + z²/n)
        half   = z / (1 + z²/n) · sqrt(p̂(1 − p̂)/n + z²/4n²)
        [lo, hi] = [centre − half, centre + half]

    ``successes`` may be fractional (the sum of scores in [0, 1]); the mean is then treated as a
    proportion of n trials. At p̂ = 0 the lower bound is exactly 0 and at p̂ = 1 the upper bound is
    exactly 1 (rounding is clamped).

    Raises:
        ValueError: for n < 0, or successes outside [0, n].
    """
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got successes={successes}, n={n}")
    if n == 0:
        return Interval(NAN, NAN, NAN, 0)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # centre + half is 1 in exact arithmetic at p̂ = 1, but rounds to 1 − 1e-16 for some n (6): the
    # interval would then end below its own estimate.
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return Interval(p, lo, hi, n)


def equal_weight_size(sizes: Sequence[int]) -> float:
    """Effective sample size of an equal-weight average over cells of ``sizes`` samples:
    n_eff = C² / Σ 1/n_c, so that at a common rate p the average's variance is p(1 − p) / n_eff
    (the pooled n when the sizes are equal)."""
    return len(sizes) ** 2 / sum(1 / n for n in sizes)


def _as_cells(values) -> list[np.ndarray]:
    """A flat sequence becomes one cell; a sequence of sequences stays a list of cells."""
    if len(values) and all(isinstance(v, (Sequence, np.ndarray)) for v in values):
        cells = [np.asarray(v, dtype=float) for v in values]
    else:
        cells = [np.asarray(values, dtype=float)]
    for i, c in enumerate(cells):
        if c.ndim != 1:
            raise ValueError(f"cell {i} must be a flat list of numbers, got shape {c.shape}")
    return cells


def _percentile(reps: np.ndarray, level: float) -> tuple[float, float]:
    """Percentile interval of bootstrap replicates, ``nan`` replicates dropped.

    Linear interpolation between order statistics, except when a replicate is ±inf: then the
    nearest order statistic, because interpolating towards inf gives nan.
    """
    reps = reps[~np.isnan(reps)]
    if reps.size == 0:
        return NAN, NAN
    q = [(1 - level) / 2, (1 + level) / 2]
    method = "linear" if np.isfinite(reps).all() else "inverted_cdf"
    lo, hi = np.quantile(reps, q, method=method)
    return float(lo), float(hi)


def _check_level(level: float, n_boot: int) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), e.g. 0.95; got {level}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")


def _resampled_means(cells: list[np.ndarray], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """(n_boot,) equal-weight averages of cell means, each cell resampled with replacement."""
    total = np.zeros(n_boot)
    for c in cells:
        idx = rng.integers(0, c.size, size=(n_boot, c.size))
        total += c[idx].mean(axis=1)
    return total / len(cells)


def bootstrap_mean_interval(
    values: Sequence[float] | Sequence[Sequence[float]],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Percentile bootstrap interval of a mean, or of an average of cell means (stratified).

    ``values`` is either one flat list of samples, or a list of cells (one list per task or
    length). For cells c = 1..C with samples x_c, the estimate is the equal-weight average of cell
    means, m = (1/C) Σ_c mean(x_c); each replicate draws |x_c| samples with replacement from every
    cell and recomputes m. A cell of 4 samples therefore contributes a 4-sample noise, however
    many samples the other cells have.

    Raises:
        ValueError: when there is no cell, or a cell is empty.
    """
    _check_level(level, n_boot)
    cells = _as_cells(values)
    if not cells or any(c.size == 0 for c in cells):
        raise ValueError("every cell needs at least one sample")
    estimate = float(np.mean([c.mean() for c in cells]))
    reps = _resampled_means(cells, n_boot, np.random.default_rng(seed))
    return Interval(estimate, *_percentile(reps, level), sum(c.size for c in cells))


def _paired_cells(a, b) -> tuple[list[np.ndarray], list[np.ndarray]]:
    ca, cb = _as_cells(a), _as_cells(b)
    if len(ca) != len(cb) or any(x.shape != y.shape for x, y in zip(ca, cb)):
        raise ValueError("paired samples need the same cells and the same number of samples in each cell")
    if not ca or any(c.size == 0 for c in ca):
        raise ValueError("every cell needs at least one pair")
    return ca, cb


def _paired_replicates(ca, cb, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(n_boot,) replicate averages of a and of b, with pair indices shared between a and b."""
    rng = np.random.default_rng(seed)
    ra, rb = np.zeros(n_boot), np.zeros(n_boot)
    for x, y in zip(ca, cb):
        idx = rng.integers(0, x.size, size=(n_boot, x.size))
        ra += x[idx].mean(axis=1)
        rb += y[idx].mean(axis=1)
    return ra / len(ca), rb / len(cb)


def paired_bootstrap_ratio(
    a: Sequence[float] | Sequence[Sequence[float]],
    b: Sequence[float] | Sequence[Sequence[float]],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Ratio mean(a) / mean(b) of paired samples, with a percentile interval over resampled pairs.

    a[i] and b[i] are the same sample (task, length, index) under two methods; with cells (as in
    :func:`bootstrap_mean_interval`) the means are equal-weight averages of cell means and pairs
    are resampled within each cell. Each replicate draws pair indices once and uses them for both
    a and b.

    Denominator zero: when mean(b) = 0 the ratio has no finite value; the estimate is +inf
    (mean(a) > 0) or nan (0/0), lo and hi are nan and ``flag`` is ``"zero_denominator"``. When
    mean(b) > 0 but some replicates draw only zeros of b, those replicates count as +inf (or are
    dropped for 0/0), so hi may be inf, and ``flag`` is ``"unstable_denominator"``.

    Numerator all zero (a method that never succeeded): every replicate is 0, a zero-width
    interval that would claim certainty. The upper bound is then the Wilson upper bound of a's rate
    (on the equal-weight effective size n_eff = C² / Σ 1/n_c) over mean(b), and ``flag`` is
    ``"no_success"``; b's own noise is left out, which the Wilson bound's width dwarfs here.
    """
    _check_level(level, n_boot)
    ca, cb = _paired_cells(a, b)
    n = sum(c.size for c in ca)
    ma = float(np.mean([c.mean() for c in ca]))
    mb = float(np.mean([c.mean() for c in cb]))
    if mb == 0:
        return Interval(math.inf if ma > 0 else NAN, NAN, NAN, n, ZERO_DENOMINATOR)
    if all((c == 0).all() for c in ca):
        z = NormalDist().inv_cdf(0.5 + level / 2)
        hi = wilson_interval(0, equal_weight_size([c.size for c in ca]), z=z).hi
        return Interval(0.0, 0.0, hi / mb, n, NO_SUCCESS)
    ra, rb = _paired_replicates(ca, cb, n_boot, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        reps = ra / rb
    flag = UNSTABLE_DENOMINATOR if (rb == 0).any() else None
    return Interval(ma / mb, *_percentile(reps, level), n, flag)


def paired_bootstrap_diff(
    a: Sequence[float] | Sequence[Sequence[float]],
    b: Sequence[float] | Sequence[Sequence[float]],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Difference mean(a) − mean(b) of paired samples, with a percentile interval over resampled pairs.

    Same pairing and stratification as :func:`paired_bootstrap_ratio`; the replicate statistic is
    (1/C) Σ_c mean(a*_c − b*_c), with a* and b* drawn at the same indices.
    """
    _check_level(level, n_boot)
    ca, cb = _paired_cells(a, b)
    estimate = float(np.mean([x.mean() - y.mean() for x, y in zip(ca, cb)]))
    ra, rb = _paired_replicates(ca, cb, n_boot, seed)
    return Interval(estimate, *_percentile(ra - rb, level), sum(c.size for c in ca))


def exceeds_noise(interval: Interval, null: float = 0.0) -> bool:
    """True when the interval excludes ``null`` (0 for a difference, 1 for a ratio).

    An undefined interval (nan bounds) never exceeds its noise.
    """
    lo, hi = interval.lo, interval.hi
    if math.isnan(lo) or math.isnan(hi):
        return False
    # Bounds computed by averaging carry rounding residue (2.7e-15 for a tie): compare with a margin.
    tol = TOLERANCE * max(1.0, abs(null), abs(lo), abs(hi))
    return lo > null + tol or hi < null - tol


def bootstrap_ppl_interval(
    nll_sums: Sequence[float],
    n_tokens: Sequence[int],
    *,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """Perplexity exp(Σ nll / Σ n) over windows, with a bootstrap interval over windows.

    Window w contributes nll_sums[w] (summed negative log-likelihood, nats) over n_tokens[w]
    predicted tokens. A replicate draws windows with replacement, keeping each window's pair
    together, and recomputes exp(Σ nll* / Σ n*): long windows weigh more, as in the estimate.
    ``n`` of the result is the number of windows.

    Raises:
        ValueError: when the lists differ in length, are empty, or a window has no token.
    """
    _check_level(level, n_boot)
    nll = np.asarray(nll_sums, dtype=float)
    cnt = np.asarray(n_tokens, dtype=float)
    if nll.shape != cnt.shape or nll.ndim != 1 or nll.size == 0:
        raise ValueError("need one (nll_sum, n_tokens) pair per window, at least one window")
    if (cnt <= 0).any():
        raise ValueError("every window needs n_tokens > 0")
    estimate = math.exp(nll.sum() / cnt.sum())
    idx = np.random.default_rng(seed).integers(0, nll.size, size=(n_boot, nll.size))
    reps = np.exp(nll[idx].sum(axis=1) / cnt[idx].sum(axis=1))
    return Interval(estimate, *_percentile(reps, level), int(nll.size))


# Floats that should be equal but come from averaging (a bootstrap bound of 2.7e-15 over five
# tasks that all tie) are compared with this relative tolerance, never with a bare ``> 0``.
TOLERANCE = 1e-9
# The level of every decision the reports make, after Holm's correction within its family.
ALPHA = 0.05


class TestResult(NamedTuple):
    """An exact paired test of ``mean(a) == mean(b)``.

    Attributes:
        p: two-sided p-value.
        n: pairs.
        plus, minus: pairs where a > b and where a < b (the discordant pairs of 0/1 scores).
        method: how ``p`` was computed (``"exact sign test"``, ``"stratified exact sign-flip"`` or
            ``"sign-flip, Monte Carlo N"``).
        min_p: the smallest p-value any outcome on these pairs could give (every pair discordant one
            way). When it exceeds the level, no data on these pairs could reject: too few pairs.
        mdd: the smallest |mean(a) − mean(b)| (in the scores' units) that could reach ``p <= alpha``:
            the fewest pairs that must all differ one way, at their smallest weights.
    """

    p: float
    n: int
    plus: int
    minus: int
    method: str
    min_p: float
    mdd: float


def paired_sign_test(
    a: Sequence[float] | Sequence[Sequence[float]],
    b: Sequence[float] | Sequence[Sequence[float]],
    *,
    alpha: float = 0.05,
    max_states: int = 200_000,
    n_mc: int = 200_000,
    seed: int = 0,
) -> TestResult:
    """Exact test of a paired difference of means, by flipping the sign of each pair's difference.

    The statistic is the report's difference, T = (1/C) Σ_c mean_c(a − b) over C cells (one cell:
    the plain mean difference), i.e. Σ_i w_i·d_i with w_i = 1/(C·n_c). Under the null each pair's
    two scores are exchangeable, so every d_i is +|d_i| or −|d_i| with probability 1/2,
    independently. p = P(|T*| ≥ |T|). Pairs are grouped by |w_i·d_i|; within a group the number of
    positive signs is Binomial(m, 1/2), and the groups are convolved exactly. For 0/1 scores in one
    cell that is McNemar's exact test (the two-sided binomial test on the discordant pairs). Only
    when the convolution would hold more than ``max_states`` values (many distinct fractional
    differences) is p estimated from ``n_mc`` random sign flips (seeded), and ``method`` says so.

    Args:
        a, b: one cell (a flat sequence) or several cells, paired index by index.
        alpha: the level that ``min_p`` and ``mdd`` refer to.

    Raises:
        ValueError: unpaired or empty cells.
    """
    ca, cb = _paired_cells(a, b)
    C = len(ca)
    w = np.concatenate([np.full(x.size, 1.0 / (C * x.size)) for x in ca])
    d = np.concatenate([x - y for x, y in zip(ca, cb)])
    n = int(d.size)
    plus, minus = int((d > 0).sum()), int((d < 0).sum())
    v = np.abs(w * d)
    scale = float(v.max()) if v.size else 0.0
    nz = v > TOLERANCE * max(scale, 1e-300)
    min_p = min(1.0, 2.0 * 0.5**n)
    k_need = max(1, math.ceil(1 - math.log2(alpha)))
    mdd = float(np.sort(w)[:k_need].sum()) if n >= k_need else NAN
    if not nz.any():
        return TestResult(1.0, n, plus, minus, "exact sign test", min_p, mdd)
    t_obs = abs(float((w * d)[nz].sum()))
    keys = np.round(v[nz] / scale, 9)
    groups: dict[float, list[int]] = {}
    for key, sign in zip(keys, np.sign(d[nz])):
        g = groups.setdefault(float(key), [0, 0])
        g[0] += 1
        g[1] += sign > 0
    tol = TOLERANCE * t_obs + 1e-12
    states = 1
    for m, _ in groups.values():
        states *= m + 1
    if states <= max_states:
        p = _exact_flip_p(groups, (t_obs - tol) / scale)
        method = "exact sign test" if len(groups) == 1 else "stratified exact sign-flip"
    else:
        p = _monte_carlo_flip_p((w * np.abs(d))[nz], t_obs - tol, n_mc, seed)
        method = f"sign-flip, Monte Carlo {n_mc}"
    return TestResult(min(1.0, float(p)), n, plus, minus, method, min_p, mdd)


def _exact_flip_p(groups: dict[float, list[int]], threshold: float) -> float:
    """P(|T| >= threshold) for T = sum over groups of key * (2 X - m), X ~ Binomial(m, 1/2), exactly.

    The distribution is built one group at a time as ``{value: probability}`` (values rounded to 9
    decimals, so equal sums from different groups meet).
    """
    from scipy.stats import binom

    dist = {0.0: 1.0}
    for key, (m, _) in groups.items():
        xs = np.arange(m + 1)
        contrib, pmf = key * (2 * xs - m), binom.pmf(xs, m, 0.5)
        nxt: dict[float, float] = {}
        for t0, p0 in dist.items():
            for c, pc in zip(contrib, pmf):
                t = round(t0 + float(c), 9)
                nxt[t] = nxt.get(t, 0.0) + p0 * float(pc)
        dist = nxt
    return sum(pr for t, pr in dist.items() if abs(t) >= threshold)


def _monte_carlo_flip_p(values: np.ndarray, threshold: float, n_mc: int, seed: int) -> float:
    """P(|sum of +-values| >= threshold) from ``n_mc`` seeded random sign flips (add-one estimate)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_mc, 10_000):
        k = min(10_000, n_mc - start)
        signs = rng.integers(0, 2, size=(k, values.size)) * 2 - 1
        hits += int((np.abs(signs @ values) >= threshold).sum())
    return (hits + 1) / (n_mc + 1)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order (NaN stays NaN and is not counted).

    Reject hypothesis i at family-wise level alpha when ``holm(ps)[i] <= alpha``.
    """
    idx = [i for i, p in enumerate(pvalues) if not math.isnan(p)]
    order = sorted(idx, key=lambda i: pvalues[i])
    m = len(order)
    out = [NAN] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out

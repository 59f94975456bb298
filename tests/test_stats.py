"""Interval math: Wilson against the formula's published values, bootstrap on hand cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sinkwindow.eval.stats import (
    Interval,
    bootstrap_mean_interval,
    bootstrap_ppl_interval,
    exceeds_noise,
    holm,
    paired_bootstrap_diff,
    paired_bootstrap_ratio,
    paired_sign_test,
    wilson_interval,
)

# 95% Wilson bounds, solved by hand from (p̂ − p)² = z² p(1 − p) / n with z = 1.96 (the quadratic's
# two roots); they agree with the usual published tables to 4 decimals.
WILSON_95 = {
    (0, 10): (0.0, 0.277540),
    (5, 10): (0.236590, 0.763410),
    (10, 10): (0.722460, 1.0),
    (1, 3): (0.061490, 0.792345),
    (9, 10): (0.595844, 0.982124),
}


@pytest.mark.parametrize("x,n", list(WILSON_95), ids=[f"{x}of{n}" for x, n in WILSON_95])
def test_wilson_matches_hand_values(x, n):
    iv = wilson_interval(x, n)
    lo, hi = WILSON_95[(x, n)]
    assert iv.estimate == x / n and iv.n == n
    assert iv.lo == pytest.approx(lo, abs=1e-6) and iv.hi == pytest.approx(hi, abs=1e-6)
    assert iv.lo <= iv.estimate <= iv.hi


def test_wilson_edges_stay_inside_the_unit_interval_without_collapsing():
    assert wilson_interval(0, 10).lo == 0.0 and wilson_interval(0, 10).hi > 0.2
    assert wilson_interval(10, 10).hi == 1.0 and wilson_interval(10, 10).lo < 0.8
    assert wilson_interval(1, 3).lo > 0 and wilson_interval(9, 10).hi < 1
    # Exact ends at every n, not only where the rounding happens to land on them (n = 6 did not).
    for n in range(1, 200):
        assert wilson_interval(n, n).hi == 1.0 and wilson_interval(0, n).lo == 0.0
    # More samples, narrower interval, same p̂.
    assert wilson_interval(50, 100).width < wilson_interval(5, 10).width
    # A wider z gives a wider interval.
    assert wilson_interval(5, 10, z=2.576).width > wilson_interval(5, 10).width


def test_wilson_takes_fractional_successes_and_rejects_impossible_counts():
    iv = wilson_interval(2.5, 5)
    assert iv.estimate == 0.5 and iv.lo == pytest.approx(wilson_interval(5, 10).lo, abs=0.1)
    assert math.isnan(wilson_interval(0, 0).lo)
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(11, 10)
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(-1, 10)


def test_wilson_covers_about_95_percent():
    rng = np.random.default_rng(0)
    p, n, trials = 0.3, 40, 400
    hits = 0
    for _ in range(trials):
        iv = wilson_interval(int(rng.binomial(n, p)), n)
        hits += iv.lo <= p <= iv.hi
    assert 0.90 <= hits / trials <= 0.99


def test_bootstrap_is_deterministic_under_a_seed():
    x = [0.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.25]
    a = bootstrap_mean_interval(x, n_boot=500, seed=3)
    assert a == bootstrap_mean_interval(x, n_boot=500, seed=3)
    assert a != bootstrap_mean_interval(x, n_boot=500, seed=4)
    assert a.estimate == pytest.approx(np.mean(x)) and a.n == len(x)


def test_bootstrap_of_a_constant_sample_has_zero_width():
    iv = bootstrap_mean_interval([0.1] * 7)
    assert iv.lo == iv.hi == iv.estimate


def test_bootstrap_two_samples_hand_case():
    # Resampled means of [0, 1] are 0, 0.5, 1 with probability 1/4, 1/2, 1/4: the 2.5% and 97.5%
    # percentiles are the extremes.
    iv = bootstrap_mean_interval([0.0, 1.0])
    assert (iv.lo, iv.estimate, iv.hi) == (0.0, 0.5, 1.0)


def test_stratified_bootstrap_resamples_within_cells():
    # Each cell is constant, so a within-cell resample cannot move the average; pooling the same
    # six numbers would.
    cells = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    strat = bootstrap_mean_interval(cells)
    assert (strat.estimate, strat.lo, strat.hi, strat.n) == (0.5, 0.5, 0.5, 6)
    pooled = bootstrap_mean_interval([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    assert pooled.width > 0.3


def test_stratified_average_weighs_cells_equally_and_small_cells_add_noise():
    big, small = [1.0] * 30 + [0.0] * 10, [1.0, 0.0, 0.0, 0.0]
    iv = bootstrap_mean_interval([big, small])
    assert iv.estimate == pytest.approx((0.75 + 0.25) / 2)
    # The 4-sample cell keeps its own noise: the average's interval is wider than with a
    # 40-sample cell of the same mean in its place.
    wide_small = [1.0] * 10 + [0.0] * 30
    assert iv.width > bootstrap_mean_interval([big, wide_small]).width


def test_bootstrap_rejects_empty_cells():
    with pytest.raises(ValueError, match="at least one sample"):
        bootstrap_mean_interval([[1.0], []])
    with pytest.raises(ValueError, match="at least one sample"):
        bootstrap_mean_interval([])


def test_bootstrap_mean_covers_about_95_percent():
    rng = np.random.default_rng(1)
    hits, trials = 0, 200
    for t in range(trials):
        iv = bootstrap_mean_interval(rng.normal(2.0, 1.0, size=40), n_boot=400, seed=t)
        hits += iv.lo <= 2.0 <= iv.hi
    assert 0.88 <= hits / trials <= 0.99


def test_paired_ratio_of_identical_arrays_is_exactly_one():
    # Two zeros in twelve: no replicate draws only zeros, so no replicate is 0/0.
    x = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.3, 1.0, 1.0, 1.0, 0.5, 1.0]
    iv = paired_bootstrap_ratio(x, x)
    assert (iv.estimate, iv.lo, iv.hi, iv.flag) == (1.0, 1.0, 1.0, None)
    assert not exceeds_noise(iv, null=1.0)


def test_paired_ratio_of_a_scaled_copy_is_the_scale():
    b = [0.0, 1.0, 0.5, 1.0]
    iv = paired_bootstrap_ratio([2 * v for v in b], b)
    assert iv.estimate == iv.lo == iv.hi == 2.0 and exceeds_noise(iv, null=1.0)


def test_paired_ratio_hand_case_and_cells():
    # a / b = (1/2) / 1 = 0.5 with b constant: the interval is the bootstrap of mean(a) / 1.
    a, b = [0.0, 1.0], [1.0, 1.0]
    iv = paired_bootstrap_ratio(a, b)
    assert (iv.lo, iv.estimate, iv.hi) == (0.0, 0.5, 1.0)
    # Cells: ratio of equal-weight averages of cell means, ((1 + 0)/2) / ((1 + 1)/2).
    iv = paired_bootstrap_ratio([[1.0, 1.0], [0.0, 0.0]], [[1.0, 1.0], [1.0, 1.0]])
    assert (iv.estimate, iv.lo, iv.hi, iv.n) == (0.5, 0.5, 0.5, 4)


def test_paired_ratio_with_a_zero_denominator_flags_instead_of_crashing():
    iv = paired_bootstrap_ratio([1.0, 0.0, 1.0], [0.0, 0.0, 0.0])
    assert iv.estimate == math.inf and math.isnan(iv.lo) and iv.flag == "zero_denominator"
    assert not exceeds_noise(iv, null=1.0)
    iv = paired_bootstrap_ratio([0.0, 0.0], [0.0, 0.0])
    assert math.isnan(iv.estimate) and iv.flag == "zero_denominator"
    # Mean of b is 1/8 > 0, but a third of the replicates draw no 1 from b: hi reaches inf.
    b = [1.0] + [0.0] * 7
    iv = paired_bootstrap_ratio([1.0] * 8, b)
    assert iv.estimate == 8.0 and iv.flag == "unstable_denominator" and iv.hi == math.inf
    assert math.isfinite(iv.lo) and iv.lo >= 1.0


def test_paired_ratio_of_a_method_that_never_succeeds_keeps_an_upper_bound():
    # 0 of 10 against 8 of 10: not the bootstrap's [0, 0] but Wilson's upper bound on 0/10 over 0.8.
    iv = paired_bootstrap_ratio([0.0] * 10, [1.0] * 8 + [0.0] * 2)
    assert (iv.estimate, iv.lo, iv.n, iv.flag) == (0.0, 0.0, 10, "no_success")
    # Wilson at p̂ = 0: hi = z² / (n + z²), z = 1.95996 for 95%.
    assert iv.hi == pytest.approx(1.96**2 / (10 + 1.96**2) / 0.8, rel=1e-4)
    assert exceeds_noise(iv, null=1.0)  # still clearly below full
    # Cells of 30 and 10: the equal-weight effective size is 2² / (1/30 + 1/10) = 30.
    iv = paired_bootstrap_ratio([[0.0] * 30, [0.0] * 10], [[1.0] * 30, [1.0] * 10])
    assert iv.hi == pytest.approx(1.96**2 / (30 + 1.96**2), rel=1e-4) and iv.n == 40
    # One success anywhere: the bootstrap again.
    assert paired_bootstrap_ratio([1.0] + [0.0] * 9, [1.0] * 10).flag is None


def test_paired_diff_uses_the_pairing():
    # b varies a lot from sample to sample, a is b + 0.1: the paired difference is exactly 0.1
    # whatever the resample, although a and b alone have wide intervals.
    b = [0.0, 0.9, 0.2, 0.8, 0.1, 0.7]
    a = [v + 0.1 for v in b]
    iv = paired_bootstrap_diff(a, b)
    assert iv.estimate == pytest.approx(0.1)
    assert iv.width < 1e-12 and exceeds_noise(iv)
    assert bootstrap_mean_interval(b).width > 0.3


def test_paired_diff_hand_case_and_noise():
    # One pair differs by 1, one by 0: resampled mean differences are 0, 0.5, 1.
    iv = paired_bootstrap_diff([1.0, 1.0], [0.0, 1.0])
    assert (iv.lo, iv.estimate, iv.hi) == (0.0, 0.5, 1.0)
    assert not exceeds_noise(iv)
    assert exceeds_noise(paired_bootstrap_diff([1.0] * 10, [0.0] * 10))
    assert exceeds_noise(paired_bootstrap_diff([0.0] * 10, [1.0] * 10))


def test_paired_inputs_must_match():
    with pytest.raises(ValueError, match="same number of samples"):
        paired_bootstrap_diff([1.0, 0.0], [1.0])
    with pytest.raises(ValueError, match="same cells"):
        paired_bootstrap_ratio([[1.0], [0.0]], [[1.0]])


def test_exceeds_noise():
    assert exceeds_noise(Interval(0.3, 0.1, 0.5, 10))
    assert exceeds_noise(Interval(-0.3, -0.5, -0.1, 10))
    assert not exceeds_noise(Interval(0.3, -0.1, 0.5, 10))
    assert not exceeds_noise(Interval(0.0, 0.0, 0.0, 10))
    assert not exceeds_noise(Interval(float("nan"), float("nan"), float("nan"), 0))
    assert exceeds_noise(Interval(2.0, 1.2, 3.0, 10), null=1.0)


def test_ppl_interval_weighs_windows_by_tokens():
    # Both windows at 2 nats/token: exp(2) whatever the resample.
    iv = bootstrap_ppl_interval([200.0, 100.0], [100, 50])
    assert iv.estimate == iv.lo == iv.hi == pytest.approx(math.exp(2.0)) and iv.n == 2
    # Windows at 3 and 1 nats/token over 100 tokens each: exp(2), and the replicates are
    # exp(3), exp(2), exp(1) with probability 1/4, 1/2, 1/4.
    iv = bootstrap_ppl_interval([300.0, 100.0], [100, 100])
    assert iv.estimate == pytest.approx(math.exp(2.0))
    assert (iv.lo, iv.hi) == (pytest.approx(math.exp(1.0)), pytest.approx(math.exp(3.0)))
    # Token-weighted, not an average of per-window perplexities.
    iv = bootstrap_ppl_interval([300.0, 10.0], [100, 10])
    assert iv.estimate == pytest.approx(math.exp(310 / 110))


def test_ppl_interval_rejects_bad_windows():
    with pytest.raises(ValueError, match="one \\(nll_sum, n_tokens\\) pair"):
        bootstrap_ppl_interval([1.0], [1, 2])
    with pytest.raises(ValueError, match="n_tokens > 0"):
        bootstrap_ppl_interval([1.0], [0])


def test_interval_scaled():
    iv = wilson_interval(5, 10).scaled(100)
    assert iv.estimate == 50.0 and iv.lo == pytest.approx(23.659, abs=1e-3) and iv.n == 10


def _cells(plus: list[int], minus: list[int], n: int) -> tuple[list[list[int]], list[list[int]]]:
    """Cells of n pairs with the given discordant counts (a wins ``plus``, b wins ``minus``)."""
    a, b = [], []
    for p, m in zip(plus, minus):
        rest = n - p - m
        a.append([1] * p + [0] * m + [1] * (rest // 2) + [0] * (rest - rest // 2))
        b.append([0] * p + [1] * m + [1] * (rest // 2) + [0] * (rest - rest // 2))
    return a, b


def test_babilong_1k_case_is_not_significant():
    """The reference run's BABILong 1K: 16 vs 7 discordant pairs over five tasks of 30, p = 0.093,
    where the bootstrap's lower bound was 2.7e-15 and got called beyond noise."""
    from scipy.stats import binomtest

    a, b = _cells([4, 3, 3, 3, 3], [2, 2, 1, 1, 1], 30)
    t = paired_sign_test(a, b)
    assert (t.plus, t.minus, t.n) == (16, 7, 150)
    assert t.p == pytest.approx(binomtest(7, 23, 0.5).pvalue, rel=1e-12) and t.p == pytest.approx(
        0.0931, abs=1e-4
    )
    assert t.p > 0.05
    assert not exceeds_noise(Interval(0.06, 2.7e-15, 0.12, 150))  # rounding residue is not > 0


def test_ten_pairs_and_all_equal_pairs():
    t = paired_sign_test([1, 0, 0, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0, 0, 0])
    assert (t.plus, t.minus) == (0, 3) and t.p == pytest.approx(0.25)
    assert t.min_p == pytest.approx(2 / 2**10) and t.mdd == pytest.approx(0.6)
    same = paired_sign_test([1, 0, 1, 1], [1, 0, 1, 1])
    assert same.p == 1.0 and same.plus == same.minus == 0
    assert paired_sign_test([1] * 5, [0] * 5).min_p > 0.05  # five pairs can never reach 5%


@pytest.mark.parametrize("seed", range(5))
def test_sign_test_is_mcnemar_exact(seed):
    from scipy.stats import binomtest

    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, 2, 40), rng.integers(0, 2, 40)
    t = paired_sign_test(a.tolist(), b.tolist())
    k, m = int(((a == 1) & (b == 0)).sum()), int((a != b).sum())
    assert t.p == pytest.approx(binomtest(k, m, 0.5).pvalue, rel=1e-9)


def test_stratified_test_equals_brute_force_enumeration():
    """Unequal cells weigh their pairs 1/(C n_c): the convolution equals enumerating every flip."""
    import itertools

    a = [[1, 1, 0, 1], [1, 0, 0, 1, 1, 0, 1], [0.5, 1.0, 0.0]]
    b = [[0, 1, 1, 0], [0, 0, 1, 0, 1, 0, 0], [0.0, 0.0, 0.5]]
    w, d = [], []
    for x, y in zip(a, b):
        for xi, yi in zip(x, y):
            w.append(1 / (3 * len(x)))
            d.append(xi - yi)
    t_obs = abs(sum(wi * di for wi, di in zip(w, d)))
    nz = [(wi, di) for wi, di in zip(w, d) if di != 0]
    hits = sum(
        abs(sum(s * wi * abs(di) for s, (wi, di) in zip(signs, nz))) >= t_obs - 1e-12
        for signs in itertools.product((1, -1), repeat=len(nz))
    )
    got = paired_sign_test(a, b)
    assert got.method == "stratified exact sign-flip"
    assert got.p == pytest.approx(hits / 2 ** len(nz), rel=1e-9)
    mc = paired_sign_test(a, b, max_states=1)  # forced onto the Monte Carlo path
    assert mc.method.startswith("sign-flip, Monte Carlo") and mc.p == pytest.approx(got.p, abs=0.01)


def test_holm_step_down():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, float("nan"), 0.001])[2] == pytest.approx(0.002)
    assert math.isnan(holm([float("nan")])[0])

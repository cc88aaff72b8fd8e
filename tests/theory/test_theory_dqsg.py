"""DQSG / NDQSG (002_87c17e3716ede1d0.txt): the worked example, nested decoding, Theorem 6 (bound, exact
closed form against numerical integration and against a Monte Carlo run of the encoder/decoder), (9), Lemma 3."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import integrate, stats

from gradstat.theory import dqsg

Z4 = 3.890592  # two-sided 99.99 % normal quantile


def test_worked_example_of_fig3():
    s = dqsg.nested_encode(-4.2, 0.3, delta1=1.0, delta2=3.0, alpha=1.0)
    assert s == pytest.approx(-1.0)
    assert dqsg.nested_decode(s, 0.3, -3.4, 1.0, 3.0, 1.0) == pytest.approx(-4.3, abs=1e-12)


def test_worked_example_ambiguity_is_resolved_by_the_coarse_bin_of_y():
    # s = -1 with u = 0.3 is produced by every x_hat = -4.3 + 3m; y picks the one in its coarse bin.
    # (The paper lists -4.3, -1.3, 2.7; the third member of that family is 1.7: 2.7 + 0.3 = 3 encodes to s = 0.)
    for y, expected in [(-3.4, -4.3), (-1.0, -1.3), (1.5, 1.7), (4.4, 4.7)]:
        assert dqsg.nested_encode(expected, 0.3, 1.0, 3.0) == pytest.approx(-1.0)
        assert dqsg.nested_decode(-1.0, 0.3, y, 1.0, 3.0) == pytest.approx(expected, abs=1e-12)
    assert dqsg.nested_encode(2.7, 0.3, 1.0, 3.0) == pytest.approx(0.0)


def test_index_alphabet_has_delta2_over_delta1_symbols():
    rng = np.random.default_rng(1)
    x = rng.normal(scale=50.0, size=100_000)
    u = rng.uniform(-1 / 6, 1 / 6, size=x.size)
    s = dqsg.nested_encode(x, u, 1 / 3, 1.0)
    assert set(np.round(s * 3).astype(int)) == {-1, 0, 1}


def test_decoding_is_exact_inside_the_safe_radius():
    """|z| < (Delta2 - Delta1)/(2 alpha) => p = 0 (Theorem 6): with alpha = 1 the error is the dither error."""
    rng = np.random.default_rng(2)
    d1, d2 = 0.25, 1.0
    x = rng.normal(scale=10.0, size=200_000)
    radius = dqsg.nested_safe_radius(d1, d2, 1.0)
    z = rng.uniform(-radius, radius, size=x.size) * 0.999
    u = rng.uniform(-d1 / 2, d1 / 2, size=x.size)
    x_hat = dqsg.nested_decode(dqsg.nested_encode(x, u, d1, d2), u, x - z, d1, d2)
    assert np.max(np.abs(x_hat - x)) <= d1 / 2 + 1e-12


GRID = list(itertools.product([1 / 3, 0.5, 1.0], [2, 3, 5], [0.5, 0.8, 1.0], np.geomspace(0.01, 3.0, 9).tolist()))


def test_exact_failure_probability_is_below_the_theorem6_bound_on_a_grid():
    for d1, ratio, alpha, sigma in GRID:
        p = dqsg.nested_failure_probability(d1, ratio * d1, alpha, sigma)
        assert 0.0 <= p <= dqsg.nested_failure_bound(d1, ratio * d1, alpha, sigma) + 1e-15


def test_exact_failure_probability_matches_numerical_integration():
    """Independent route: integrate the Gaussian tail over the uniform dither with scipy.integrate.quad."""
    for d1, ratio, alpha, sigma in GRID[::3]:
        d2, s = ratio * d1, alpha * sigma
        half = d1 / 2

        def tail(u: float, d2: float = d2, s: float = s) -> float:
            return stats.norm.sf((d2 / 2 - u) / s) + stats.norm.cdf((-d2 / 2 - u) / s)

        expected = integrate.quad(tail, -half, half, epsabs=1e-15, epsrel=1e-12)[0] / d1
        got = dqsg.nested_failure_probability(d1, d2, alpha, sigma)
        assert got == pytest.approx(expected, rel=1e-7, abs=1e-15)


def _simulated_failures(d1, d2, alpha, sigma, n, rng):
    """Run the encoder (6) and decoder (7) with side information y = x - z; count wrong coarse bins."""
    x = rng.normal(scale=5.0, size=n)
    z = rng.normal(scale=sigma, size=n)
    u = rng.uniform(-d1 / 2, d1 / 2, size=n)
    x_hat = dqsg.nested_decode(dqsg.nested_encode(x, u, d1, d2, alpha), u, x - z, d1, d2, alpha)
    t = alpha * x + u
    e = t - dqsg.quantize(t, d1)
    correct = (x - z) + alpha * (alpha * z - e)  # App. E: the reconstruction when Q2(alpha z - e) = 0
    return np.abs(x_hat - correct) > alpha * d2 / 4


@pytest.mark.parametrize("d1, d2, alpha, sigma", [(1 / 3, 1.0, 1.0, 0.2), (0.5, 1.0, 0.8, 0.3), (1.0, 3.0, 1.0, 0.9)])
def test_exact_failure_probability_matches_monte_carlo(d1, d2, alpha, sigma):
    """400,000 encode/decode round trips; agreement within 99.99 % normal CI of the binomial proportion. The
    same data reject a version that forgets the two-sided tail (p/2), so the check can fail."""
    rng = np.random.default_rng(3)
    fails = _simulated_failures(d1, d2, alpha, sigma, 400_000, rng)
    p_hat = fails.mean()
    p = dqsg.nested_failure_probability(d1, d2, alpha, sigma)
    half_width = Z4 * math.sqrt(p * (1 - p) / fails.size)
    assert abs(p_hat - p) <= half_width
    assert abs(p_hat - p / 2) > half_width


def test_error_variance_9_matches_monte_carlo_for_both_alphas():
    """Per-element error of successful decodes (no failures occur here: |alpha z + u| <= Delta2/2 w.p. ~1):
    (9) within 5 standard errors of the sample variance; both alphas give Delta1^2/12."""
    rng = np.random.default_rng(4)
    d1, d2, sigma = 1 / 3, 3.0, 0.2
    one, alpha2 = dqsg.nested_alphas(d1, sigma)
    assert one == 1.0 and alpha2 is not None
    for alpha in (one, alpha2):
        n = 400_000
        x = rng.normal(size=n)
        z = rng.normal(scale=sigma, size=n)
        u = rng.uniform(-d1 / 2, d1 / 2, size=n)
        err = dqsg.nested_decode(dqsg.nested_encode(x, u, d1, d2, alpha), u, x - z, d1, d2, alpha) - x
        var = dqsg.nested_error_variance(d1, alpha, sigma)
        se = math.sqrt((np.mean(err**4) - np.mean(err**2) ** 2) / n)
        assert abs(np.mean(err**2) - var) <= 5 * se
        assert var == pytest.approx(d1**2 / 12, rel=1e-12)


def test_second_alpha_exists_only_when_sigma_is_large_enough():
    assert dqsg.nested_alphas(1.0, 0.2) == (1.0, None)
    assert dqsg.nested_alphas(1.0, 1.0)[1] == pytest.approx(math.sqrt(11 / 12))


def test_failure_probability_is_zero_without_noise():
    assert dqsg.nested_failure_probability(1.0, 2.0, 1.0, 0.0) == 0.0


def test_dqsg_conditional_error_matches_monte_carlo():
    """E[||g_tilde - g||^2 | g] = ||g||_inf^2 n Delta^2 / 12 (Lemma 3 proof): 20,000 dithers, 4 standard errors."""
    rng = np.random.default_rng(5)
    g = rng.standard_t(3, size=200)
    kappa, delta = np.max(np.abs(g)), 1 / 3
    u = rng.uniform(-delta / 2, delta / 2, size=(20_000, g.size))
    g_tilde = kappa * dqsg.dithered_quantize(g / kappa, u, delta)
    err = ((g_tilde - g) ** 2).sum(axis=1)
    expected = dqsg.conditional_error(g, delta)
    assert abs(err.mean() - expected) <= 4 * err.std(ddof=1) / math.sqrt(err.size)
    # a half-dithered quantizer (dither not subtracted) has a different, larger error: the check tells them apart
    half = ((kappa * dqsg.half_dithered_quantize(g / kappa, u, delta) - g) ** 2).sum(axis=1)
    assert half.mean() > expected * 1.2


def test_gaussian_model_bound_3_holds_by_simulation():
    """(3): n Delta^2/12 E||g||_inf^2 <= (Delta^2/3) ln(sqrt2 n) n sigma^2 + (n Delta^2/6) ||mu||_inf^2."""
    rng = np.random.default_rng(6)
    n, sigma, delta = 500, 0.3, 0.25
    mu = rng.normal(size=n)
    g = mu + sigma * rng.standard_normal((4000, n))
    excess = n * delta**2 / 12 * np.mean(np.max(np.abs(g), axis=1) ** 2)
    bound = dqsg.excess_variance_bound(n, delta, n * sigma**2, float(np.max(np.abs(mu))))
    assert excess <= bound


def test_partition_bound_4_reduces_to_3_and_decreases_in_k():
    n, delta, v, m = 1000, 0.5, 2.0, 0.3
    eq3 = delta**2 / 3 * math.log(math.sqrt(2) * n) * v + n * delta**2 / 6 * m**2
    assert dqsg.excess_variance_bound(n, delta, v, m, partitions=1) == pytest.approx(eq3, rel=1e-14)
    values = [dqsg.excess_variance_bound(n, delta, v, m, partitions=k) for k in (1, 2, 10, 100)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))


def test_lemma3_and_second_moment_factor():
    assert dqsg.variance_bound(12, 0.5, 2.0, 1.0) == pytest.approx(12 * 0.25 / 12 * 2.0 + 1.0)
    assert dqsg.second_moment_factor(12, 0.5) == pytest.approx(1.25)


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: dqsg.nested_encode(1.0, 0.0, 1.0, 2.5), "delta2/delta1"),
        (lambda: dqsg.nested_encode(1.0, 0.0, 1.0, 1.0), "delta2/delta1"),
        (lambda: dqsg.nested_failure_probability(1.0, 3.0, 0.0, 1.0), "alpha"),
        (lambda: dqsg.nested_failure_bound(1.0, 3.0, 1.2, 1.0), "alpha"),
        (lambda: dqsg.nested_failure_bound(1.0, 3.0, 1.0, -1.0), "sigma_z"),
        (lambda: dqsg.quantize(1.0, 0.0), "delta"),
        (lambda: dqsg.conditional_error([], 0.5), "g"),
        (lambda: dqsg.conditional_error([1.0, float("nan")], 0.5), "g"),
        (lambda: dqsg.excess_variance_bound(10, 0.5, 1.0, 1.0, partitions=11), "partitions"),
    ],
)
def test_bad_arguments_are_named(call, word):
    with pytest.raises(ValueError, match=word):
        call()

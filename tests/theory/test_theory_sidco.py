"""SIDCo closed forms about k_hat and convergence (001_ac87256369ec7547.txt, Sec. 2.2, (13), (43), (45))."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from gradstat.theory import sidco


def test_binomial_interval_of_k_hat_covers_simulated_exceedances():
    """Draw 1,000 vectors of d = 10,000 exponential magnitudes, threshold at the exact quantile, count the
    exceedances: the 95 % interval must cover 95 % of them (coverage checked within a 99.99 % binomial band)."""
    rng = np.random.default_rng(41)
    d, ratio, reps = 10_000, 0.01, 1_000
    eta = -math.log(ratio)  # exact 1 - ratio quantile of Exp(1)
    counts = (rng.exponential(size=(reps, d)) > eta).sum(axis=1)
    lo, hi = sidco.exceedance_count_interval(d, ratio, 0.95)
    coverage = np.mean((counts >= lo) & (counts <= hi))
    nominal = stats.binom.cdf(hi, d, ratio) - stats.binom.cdf(lo - 1, d, ratio)
    assert nominal >= 0.95
    assert abs(coverage - nominal) <= 3.9 * math.sqrt(nominal * (1 - nominal) / reps)
    assert abs(counts.mean() - sidco.exceedance_count_mean(d, ratio)) <= 3.9 * math.sqrt(d * ratio / reps)


def test_ratio_error_for_exponentials_has_a_closed_form():
    """True Exp(1), fitted Exp(2): eta_hat = 2 log(1/delta), F(eta_hat) = 1 - delta^2, so the error is
    delta^2 - delta."""
    for ratio in (0.1, 0.01, 0.001):
        err = sidco.ratio_error(ratio, stats.expon(scale=1.0).cdf, stats.expon(scale=2.0).ppf)
        assert err == pytest.approx(ratio**2 - ratio, rel=1e-9)
        assert sidco.ratio_error(ratio, stats.expon().cdf, stats.expon().ppf) == pytest.approx(0.0, abs=1e-12)


def test_ratio_error_accepts_the_project_distributions():
    from gradstat.theory.distributions import Exponential, Gamma

    err = sidco.ratio_error(0.01, Gamma(shape=0.5, scale=1.0).cdf, Exponential(scale=1.0).ppf)
    eta_hat = -math.log(0.01)
    assert err == pytest.approx(0.99 - stats.gamma(a=0.5).cdf(eta_hat), rel=1e-9)


def test_iteration_order_and_convergence_bound():
    assert sidco.iterations_to_sgd_rate(0.01, 0.2) == pytest.approx(1 / (1e-4 * 0.64))
    f, L, s2, delta, it = 3.0, 2.0, 5.0, 0.01, 99
    expected = (4 * f + L * s2) / (2 * 10) + 4 * L**2 * s2 * (1 - delta) / (delta**2 * 100)
    assert sidco.convergence_bound(f, L, s2, delta, it) == pytest.approx(expected)


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: sidco.exceedance_count_interval(100, 1.0), "ratio"),
        (lambda: sidco.exceedance_count_interval(100, 0.1, 1.0), "confidence"),
        (lambda: sidco.iterations_to_sgd_rate(0.1, 1.0), "tolerance"),
        (lambda: sidco.convergence_bound(1.0, 0.0, 1.0, 0.1, 10), "smoothness"),
        (lambda: sidco.ratio_error(0.1, stats.expon().cdf, lambda q: np.inf), "fitted_ppf"),
    ],
)
def test_bad_arguments_are_named(call, word):
    with pytest.raises(ValueError, match=word):
        call()

"""Wangni et al. 2018 optimal keep probabilities: hit the density and minimise the variance."""

from __future__ import annotations

import numpy as np
import pytest

from gradstat.theory import wangni


def _vectors():
    rng = np.random.default_rng(11)
    yield rng.standard_cauchy(2000), 0.05
    yield rng.standard_normal(500), 0.3
    yield np.r_[rng.laplace(size=300), np.zeros(200)], 0.5  # zeros are never kept
    yield np.r_[100.0, 50.0, np.ones(98)], 0.1  # two saturated coordinates


@pytest.mark.parametrize("g, density", list(_vectors()))
def test_probabilities_hit_the_target_density(g, density):
    p, lam = wangni.optimal_probabilities(g, density)
    assert p.sum() == pytest.approx(density * g.size, rel=1e-12)
    assert np.all((p >= 0) & (p <= 1))
    assert np.all(p[g == 0] == 0)
    free = p < 1
    np.testing.assert_allclose(p[free], np.abs(g[free]) / lam, rtol=1e-12)
    assert np.all(np.abs(g[~free]) >= lam * (1 - 1e-12))


def _best_feasible_perturbation(g, p, rng, tries=400):
    """Smallest variance found over random moves of mass between two coordinates (sum and bounds kept)."""
    base = wangni.variance(g, p)
    live = np.flatnonzero(g)
    best = base
    for _ in range(tries):
        i, j = rng.choice(live, size=2, replace=False)
        room = min(1 - p[i], p[j] - 1e-9)
        if room <= 0:
            continue
        q = p.copy()
        step = rng.uniform(0, 1) * min(room, 0.05)
        q[i] += step
        q[j] -= step
        best = min(best, wangni.variance(g, q))
    return base, best


@pytest.mark.parametrize("g, density", list(_vectors()))
def test_no_feasible_perturbation_lowers_the_variance(g, density):
    rng = np.random.default_rng(12)
    p, _ = wangni.optimal_probabilities(g, density)
    base, best = _best_feasible_perturbation(g, p, rng)
    assert best >= base * (1 - 1e-12)


def test_the_perturbation_check_detects_a_wrong_solution():
    """p proportional to g^2 (a plausible mistake) at the same density is beaten by some perturbation."""
    rng = np.random.default_rng(13)
    g = rng.standard_normal(500)
    density = 0.02
    p = g**2 / np.sum(g**2) * density * g.size
    assert p.max() <= 1
    base, best = _best_feasible_perturbation(g, p, rng)
    assert best < base * (1 - 1e-6)


def test_variance_formula_and_uniform_baseline():
    g = np.array([3.0, -1.0, 0.0, 2.0])
    p = np.array([1.0, 0.5, 0.0, 0.25])
    assert wangni.variance(g, p) == pytest.approx(0 + 1.0 * 1 + 0 + 4.0 * 3)
    rng = np.random.default_rng(14)
    g = rng.standard_cauchy(1000)
    p, _ = wangni.optimal_probabilities(g, 0.1)
    assert wangni.variance(g, p) < wangni.variance(g, np.full(g.size, 0.1))


@pytest.mark.parametrize(
    "call, word",
    [
        (lambda: wangni.optimal_probabilities(np.r_[1.0, np.zeros(9)], 0.2), "density"),
        (lambda: wangni.optimal_probabilities(np.ones(5), 0.0), "density"),
        (lambda: wangni.optimal_probabilities(np.zeros(5), 0.5), "all-zero"),
        (lambda: wangni.variance([1.0, 2.0], [0.0, 1.0]), "p"),
        (lambda: wangni.variance([1.0, 2.0], [0.5]), "shape"),
    ],
)
def test_bad_arguments_are_named(call, word):
    with pytest.raises(ValueError, match=word):
        call()

"""DQSG/NDQSG Theorem 5 (App. D): the convergence bound of distributed SGD with dithered gradients, by hand and on
a problem that meets its assumptions (convex, l-smooth, a ball of radius R, bounded gradients and variance)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gradstat.theory.dqsg import dithered_quantize, theorem5_gap_bound, theorem5_step, theorem5_variance


def test_theorem5_by_hand():
    assert theorem5_variance(12, 0.5, 2.0, 3.0) == pytest.approx(2.0 * (1 + 12 * 0.25 / 12) + 12 * 9 * 0.25 / 12)
    assert theorem5_gap_bound(2.0, 8.0, 4, 100, 1.5) == pytest.approx(2 * math.sqrt(16 / 400) + 1.5 * 4 / 100)
    gamma = 2.0 / math.sqrt(8.0 / 4) * math.sqrt(2 / 100)
    assert theorem5_step(2.0, 8.0, 4, 100, 1.5) == pytest.approx(1 / (1.5 + 1 / gamma))
    assert theorem5_step(2.0, 0.0, 4, 100, 1.5) == pytest.approx(1 / 1.5)


@pytest.mark.parametrize("bad", [{"workers": 0}, {"steps": 0}, {"radius": 0.0}, {"sigma2": -1.0}])
def test_bad_inputs_get_clear_errors(bad):
    args = {"radius": 1.0, "sigma2": 1.0, "workers": 2, "steps": 10, "smoothness": 1.0, **bad}
    with pytest.raises(ValueError, match=next(iter(bad))):
        theorem5_gap_bound(**args)


def test_the_bound_holds_where_its_assumptions_are_met():
    """L(w) = ||w - w*||^2 / 2 (l = 1) on the ball ||w|| <= R around w_0 = 0, ||w*|| = R/2, so ||grad L|| <= B =
    1.5 R on the ball; each of P workers adds N(0, V/n) noise per coordinate and sends kappa (Delta q - u), kappa =
    ||g||_inf (Alg. 1); the server averages, steps with theorem5_step and projects. Over 300 runs the mean gap of
    the averaged iterate (99 % upper limit) lies below the bound, and the bound is below L(w_0) - L*."""
    n, P, T, R, V, delta = 8, 4, 200, 2.0, 4.0, 0.5
    gen = np.random.default_rng(11)
    w_star = gen.normal(size=n)
    w_star *= 0.5 * R / np.linalg.norm(w_star)
    sigma2 = theorem5_variance(n, delta, V, 1.5 * R)
    eta = theorem5_step(R, sigma2, P, T, 1.0)
    gaps = []
    for _ in range(300):
        w, total = np.zeros(n), np.zeros(n)
        for _ in range(T):
            sent = []
            for _ in range(P):
                g = (w - w_star) + gen.normal(scale=math.sqrt(V / n), size=n)
                kappa = np.abs(g).max()
                u = gen.uniform(-delta / 2, delta / 2, size=n)
                sent.append(kappa * dithered_quantize(g / kappa, u, delta))
            w = w - eta * np.mean(sent, axis=0)
            norm = np.linalg.norm(w)
            w = w if norm <= R else w * (R / norm)
            total += w
        gaps.append(0.5 * float(np.sum((total / T - w_star) ** 2)))
    mean, half = float(np.mean(gaps)), 2.6 * float(np.std(gaps)) / math.sqrt(len(gaps))
    bound = theorem5_gap_bound(R, sigma2, P, T, 1.0)
    assert mean + half <= bound < 0.5 * float(np.sum(w_star**2))

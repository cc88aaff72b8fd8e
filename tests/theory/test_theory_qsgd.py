"""QSGD / TernGrad stochastic quantizer (002_87c17e3716ede1d0.txt Sec. 2.1.1, Lemma 2; Alistarh et al. Lemma 3.1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import trapezoid  # np.trapezoid is numpy >= 2.0 only, np.trapz is gone from numpy 2.4

from gradstat.theory import dqsg, qsgd


def _stochastic_quantize(x: np.ndarray, M: int, scale: float, rng: np.random.Generator) -> np.ndarray:
    """Eq. (1) of 002 written out: round |x|/scale up to (l+1)/M with probability M|x|/scale - l."""
    r = np.abs(x) / scale
    low = np.floor(r * M)
    up = rng.uniform(size=x.shape) < r * M - low
    return np.sign(x) * scale * (low + up) / M


def test_lemma31_factor():
    assert qsgd.variance_bound(100, 1) == 10.0  # min(100, 10)
    assert qsgd.variance_bound(100, 20) == 0.25  # min(0.25, 0.5)


@pytest.mark.parametrize("M", [1, 2, 5])
def test_element_variance_matches_simulation_of_1_and_of_half_dithering(M):
    """Per-element variance formula vs 60,000 draws of eq. (1) and of the half-dithered quantizer with
    Delta = 1/M (Lemma 2); 4 standard errors of the mean squared error (99.99 %)."""
    rng = np.random.default_rng(M)
    x = np.linspace(-1, 1, 23)
    expected = qsgd.element_variance(x, M, 1.0)
    draws = 60_000
    direct = (_stochastic_quantize(np.broadcast_to(x, (draws, x.size)), M, 1.0, rng) - x) ** 2
    u = rng.uniform(-0.5 / M, 0.5 / M, size=(draws, x.size))
    half = (dqsg.half_dithered_quantize(x, u, 1.0 / M) - x) ** 2
    for sq in (direct, half):
        se = sq.std(axis=0, ddof=1) / math.sqrt(draws)
        assert np.all(np.abs(sq.mean(axis=0) - expected) <= 4 * se + 1e-12)
    # a formula with the ceiling instead of the floor level would be far off at interior points
    wrong = (np.abs(x) - np.ceil(np.abs(x) * M) / M) * ((np.ceil(np.abs(x) * M) + 1) / M - np.abs(x))
    assert np.max(np.abs(direct.mean(axis=0) - wrong)) > 0.01


@pytest.mark.parametrize("M", [1, 3, 8])
def test_variance_range_and_uniform_average(M):
    x = np.linspace(-1, 1, 200_001)
    var = qsgd.element_variance(x, M, 1.0)
    assert var.min() == pytest.approx(0.0, abs=1e-15)
    assert var.max() == pytest.approx(1 / (4 * M**2), rel=1e-6)
    assert trapezoid(var, x) / 2 == pytest.approx(qsgd.uniform_average_variance(M), rel=1e-6)
    assert qsgd.uniform_average_variance(M) == 2 * qsgd.dithered_average_variance(M)


def test_total_variance_respects_lemma31_for_random_vectors():
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 3000))
        s = int(rng.integers(1, 60))
        v = rng.standard_t(2, size=n)
        if not v.any():
            continue
        assert qsgd.total_variance(v, s, "l2") <= qsgd.variance_bound(n, s) * float(v @ v) * (1 + 1e-12)


def test_terngrad_variance_closed_form():
    v = np.array([0.5, -2.0, 1.0, 0.0])
    assert qsgd.terngrad_variance(v) == pytest.approx(0.5 * 1.5 + 0 + 1.0 * 1.0 + 0)


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda: qsgd.element_variance([2.0], 1, 1.0), ValueError, "scale"),
        (lambda: qsgd.element_variance([0.5], 0, 1.0), ValueError, "M"),
        (lambda: qsgd.total_variance([0.0, 0.0], 2), ValueError, "all-zero"),
        (lambda: qsgd.total_variance([1.0], 2, norm="l1"), ValueError, "norm"),
        (lambda: qsgd.variance_bound(10, 0), ValueError, "s"),
    ],
)
def test_bad_arguments_are_named(call, exc, word):
    with pytest.raises(exc, match=word):
        call()

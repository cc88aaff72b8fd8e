"""Top-k contraction, exact best-k error and the compressibility power-law fits (001_ac87256369ec7547.txt,
Definition 1, (1), (2), (42))."""

from __future__ import annotations

import numpy as np
import pytest

from gradstat.theory import sparsification as sp


def _power_law_vector(d: int, p: float, seed: int, noise: float = 0.3) -> np.ndarray:
    """|g|_(j) ~ j^-p with log-normal multiplicative noise, random signs, shuffled."""
    rng = np.random.default_rng(seed)
    g = np.arange(1, d + 1.0) ** -p * np.exp(noise * rng.standard_normal(d)) * rng.choice([-1.0, 1.0], d)
    rng.shuffle(g)
    return g


def test_best_k_error_matches_direct_topk():
    rng = np.random.default_rng(21)
    g = rng.standard_normal(300)
    all_k = sp.best_k_error(g)
    for k in (0, 1, 17, 299, 300):
        kept = np.argsort(-np.abs(g))[:k]
        rest = np.delete(g, kept)
        assert sp.best_k_error(g, k) == pytest.approx(np.linalg.norm(rest), rel=1e-12, abs=1e-12)
        assert all_k[k] == pytest.approx(np.linalg.norm(rest), rel=1e-12, abs=1e-12)
    np.testing.assert_allclose(sp.best_k_error(g, np.array([3, 5])), all_k[[3, 5]])


def test_topk_contraction_holds_for_every_k():
    rng = np.random.default_rng(22)
    for g in (rng.standard_normal(1000), rng.standard_cauchy(1000), np.ones(1000)):
        errs = sp.best_k_error(g) ** 2
        bounds = np.array([sp.topk_contraction(k, g.size) for k in range(g.size + 1)]) * float(g @ g)
        assert np.all(errs <= bounds * (1 + 1e-12) + 1e-12)
    # equality for a constant vector: the contraction factor is tight
    assert sp.best_k_error(np.ones(10), 3) ** 2 == pytest.approx(sp.topk_contraction(3, 10) * 10)


@pytest.mark.parametrize("p", [0.6, 0.8, 1.2])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_magnitude_fit_recovers_p(p, seed):
    """d = 100,000, 30 % log-normal noise: p recovered within 0.02 (observed spread about 0.008)."""
    fit = sp.fit_magnitude_decay(_power_law_vector(100_000, p, seed))
    assert fit.p == pytest.approx(p, abs=0.02)
    assert fit.compressible
    assert fit.r2 > 0.99


def test_magnitude_fit_is_exact_on_an_exact_power_law_and_detects_wrong_sorting(monkeypatch):
    g = 3.0 * np.arange(1, 5001.0) ** -0.9
    fit = sp.fit_magnitude_decay(g[::-1])
    assert fit.p == pytest.approx(0.9, rel=1e-10)
    assert fit.c == pytest.approx(3.0, rel=1e-10)
    # the same check on an implementation that sorts ascending fails loudly
    monkeypatch.setattr(sp.np, "sort", lambda a: np.asarray(sorted(a))[::-1])
    assert sp.fit_magnitude_decay(g).p < 0


@pytest.mark.parametrize("p", [0.8, 1.2])
def test_best_k_fit_recovers_p(p):
    """sigma_k ~ c2 k^(1/2 - p) fitted on k <= d/100 (away from the finite-length bend): within 0.03."""
    fit = sp.fit_best_k_decay(_power_law_vector(100_000, p, 5), rank_range=(1, 1000))
    assert fit.p == pytest.approx(p, abs=0.03)


def test_flat_vector_is_not_compressible():
    rng = np.random.default_rng(23)
    fit = sp.fit_magnitude_decay(rng.uniform(0.9, 1.0, 10_000))
    assert not fit.compressible


def test_envelope_constant_is_the_smallest_bound():
    g = _power_law_vector(10_000, 0.8, 7)
    c1 = sp.envelope_constant(g, 0.8)
    mags = np.sort(np.abs(g))[::-1] * np.arange(1, g.size + 1) ** 0.8
    assert np.all(mags <= c1 * (1 + 1e-12))
    assert mags.max() == pytest.approx(c1)


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda: sp.best_k_error([], 0), ValueError, "g"),
        (lambda: sp.best_k_error([1.0, np.inf], 0), ValueError, "g"),
        (lambda: sp.best_k_error([1.0, 2.0], 3), ValueError, "k"),
        (lambda: sp.best_k_error([1.0, 2.0], 1.5), TypeError, "k"),
        (lambda: sp.fit_magnitude_decay([1.0, 0.0, 0.0]), ValueError, "nonzero"),
        (lambda: sp.fit_best_k_decay(np.ones(10), rank_range=(5, 20)), ValueError, "rank_range"),
        (lambda: sp.topk_contraction(5, 4), ValueError, "k"),
    ],
)
def test_bad_arguments_are_named(call, exc, word):
    with pytest.raises(exc, match=word):
        call()

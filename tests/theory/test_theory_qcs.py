"""QCS closed forms (000_4b111efa75352b2d.txt, (10)-(18)): identities, known values, the optimal (k, Q) search
against brute force, and a Monte Carlo check that (10) bounds the error of a numpy QCS."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.linalg import hadamard

from gradstat.theory import qcs

GAMMAS = np.geomspace(1e-3, 1e3, 61)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
@pytest.mark.parametrize("Q", [1, 3, 100])
def test_gamma_with_one_row_is_n_minus_one(n, Q):
    assert qcs.gamma(n, 1, Q) == n - 1


def test_gamma_known_value():
    # n/k - 1 + n/(4Q^2) * ln(k)/(k-1) by hand: 256/32 - 1 + 256/64 * ln 32 / 31
    assert qcs.gamma(256, 32, 4) == pytest.approx(7 + 4 * math.log(32) / 31, rel=1e-14)


def test_gamma_decreases_in_q_towards_projection_term():
    values = [qcs.gamma(256, 32, Q) for Q in (1, 2, 4, 8, 1000)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    assert values[-1] == pytest.approx(256 / 32 - 1, abs=1e-4)


def test_gain_formula():
    assert qcs.gain(256, 32, 4) == pytest.approx(256 * 32 / (32 * math.log2(9)), rel=1e-14)
    # QCS-2 (k = n, Q = 1) has the gain of QSGD with ternary codes: 32 / log2(3)
    assert qcs.gain(500, 500, 1) == pytest.approx(32 / math.log2(3), rel=1e-14)


def test_exact_gain_counts_codes_scale_and_seed():
    # 256 codes of ceil(log2 3) = 2 bits, one 32-bit scale, one 64-bit seed
    assert qcs.exact_gain(256, 256, 1) == pytest.approx(256 * 32 / (256 * 2 + 32 + 64))
    assert qcs.exact_gain(256, 256, 1, packing="ideal") == pytest.approx(256 * 32 / (256 * math.log2(3) + 96))
    assert qcs.exact_gain(256, 32, None, seed_bits=0) == pytest.approx(256 * 32 / (32 + 32))
    assert qcs.exact_gain(256, 32, 4) < qcs.gain(256, 32, 4)


def _brute_force(n: int, target: float, q_max: int) -> tuple[float, int, int]:
    ks = np.arange(1, n + 1)[:, None]
    qs = np.arange(1, q_max + 1)[None, :]
    gain = n * 32 / (ks * np.log2(2 * qs + 1))
    gam = np.where(ks > 1, n / ks - 1 + n / (4.0 * qs**2) * np.log(ks) / np.maximum(ks - 1, 1), n - 1.0)
    gam = np.where(gain >= target, gam, np.inf)
    i, j = np.unravel_index(np.argmin(gam), gam.shape)
    return float(gam[i, j]), int(i + 1), int(j + 1)


@pytest.mark.parametrize("target", [12.0, 20.0, 32.0, 50.0, 200.0, 1000.0])
def test_optimal_pair_matches_brute_force(target):
    """Exhaustive search over every k in 1..64 and Q in 1..40000 finds the same minimum."""
    n = 64
    best = qcs.optimal_pair(n, target)
    gam, k, Q = _brute_force(n, target, 40000)
    assert best.gamma == pytest.approx(gam, rel=1e-12)
    assert (best.k, best.Q) == (k, Q)
    assert best.gain >= target


def test_min_gamma_curve_is_monotone_and_vectorised():
    gains = np.geomspace(1.0, 2000.0, 300)
    gam, k, Q, achieved = qcs.min_gamma_curve(256, gains)
    assert gam.shape == k.shape == Q.shape == achieved.shape == (300,)
    assert np.all(achieved >= gains)
    assert np.all(np.diff(gam) >= -1e-12)  # a higher target can only cost variance
    one = qcs.optimal_pair(256, float(gains[150]))
    assert (one.k, one.Q) == (k[150], Q[150])


def test_unreachable_gain_has_no_pair():
    top = 64 * 32 / math.log2(3)  # k = 1, Q = 1
    gam, k, _, _ = qcs.min_gamma_curve(64, np.array([top * 1.01]))
    assert np.isinf(gam[0]) and k[0] == 0
    with pytest.raises(ValueError, match="target_gain"):
        qcs.optimal_pair(64, top * 1.01)


def test_mmse_alpha_and_lemma3():
    assert qcs.mmse_alpha(3.0) == 0.25
    assert qcs.mmse_error_factor(3.0) == 0.75


@pytest.mark.parametrize("gamma", GAMMAS)
def test_eta_unbiased_at_optimal_beta_is_gamma_gamma_plus_one(gamma):
    beta, eta = qcs.optimal_feedback_unbiased(gamma)
    bound = qcs.residual_bound_unbiased(gamma, beta)
    assert bound.valid
    assert bound.value == pytest.approx(gamma * (gamma + 1), rel=1e-9)
    assert eta == pytest.approx(gamma * (gamma + 1), rel=1e-14)


def test_optimal_etas_are_ordered_on_a_grid():
    for gamma in GAMMAS:
        eta_u = qcs.optimal_feedback_unbiased(gamma)[1]
        eta_m = qcs.optimal_feedback_mmse(gamma)[1]
        assert eta_u < eta_m < qcs.karimireddy_residual_bound(gamma)


@pytest.mark.parametrize("gamma", [0.05, 0.5, 2.0, 20.0])
def test_beta_u_star_minimises_15(gamma):
    limit = min(1.0, 2.0 / (1.0 + gamma))
    betas = np.linspace(limit * 1e-3, limit * (1 - 1e-3), 4001)
    values = [qcs.residual_bound_unbiased(gamma, b).value for b in betas]
    assert min(values) >= gamma * (gamma + 1) * (1 - 1e-12)
    assert min(values) == pytest.approx(gamma * (gamma + 1), rel=1e-4)


def test_eta_mmse_at_beta_one_is_eta_m_star():
    for gamma in GAMMAS:
        assert qcs.residual_bound_mmse(gamma, 1.0).value == pytest.approx(
            qcs.optimal_feedback_mmse(gamma)[1], rel=1e-12
        )


def test_eta_mmse_as_printed_has_no_bound_where_the_base_is_not_positive():
    edge = 1 - math.sqrt(math.sqrt(2) - 1)  # gamma = 1: base = sqrt 2 - (1-beta)^2 - 1 vanishes here
    below = qcs.residual_bound_mmse(1.0, edge - 1e-6)
    above = qcs.residual_bound_mmse(1.0, edge + 1e-6)
    assert not below.valid and below.value == math.inf and "base" in below.reason
    assert above.valid and math.isfinite(above.value)


def _worst_case_residual(gamma: float, beta: float, steps: int) -> list[float]:
    """||r_t||^2 / B of weighted feedback (14) with the deterministic compressor C(z) = (1 - s) z, s =
    sqrt(gamma/(gamma+1)), which meets Lemma 3 (13) with equality, on a constant gradient with ||g||^2 = B = 1."""
    s = math.sqrt(gamma / (gamma + 1.0))
    g = np.array([0.6, -0.8])
    r, out = np.zeros(2), []
    for _ in range(steps):
        z = g + beta * r
        r = (1 - beta) * r + s * z  # e = z - C(z) = s z
        out.append(float(r @ r))
    return out


@pytest.mark.parametrize("gamma", [0.5, 1.0, 3.264])
@pytest.mark.parametrize("beta", [0.05, 0.2, 0.6, 1.0])
def test_minkowski_mmse_bound_holds_and_is_attained_by_the_worst_case_compressor(gamma, beta):
    """The derived bound is never exceeded by a compressor that meets (13) with equality, and that compressor
    approaches it (so a smaller formula, e.g. without beta^2, would be violated here)."""
    eta = qcs.residual_bound_mmse_minkowski(gamma, beta).value
    path = _worst_case_residual(gamma, beta, 20_000)
    assert max(path) <= eta * (1 + 1e-9)
    assert path[-1] == pytest.approx(eta, rel=1e-6)


def test_minkowski_mmse_bound_is_18_at_beta_one_and_finite_where_16_as_printed_is_not():
    for gamma in GAMMAS:
        assert qcs.residual_bound_mmse_minkowski(gamma, 1.0).value == pytest.approx(
            qcs.optimal_feedback_mmse(gamma)[1], rel=1e-12
        )
    assert not qcs.residual_bound_mmse(1.0, 0.2).valid
    assert math.isfinite(qcs.residual_bound_mmse_minkowski(1.0, 0.2).value)


def test_eta_unbiased_outside_the_lemma_range_has_no_bound():
    assert not qcs.residual_bound_unbiased(3.0, 0.5).valid  # 2/(1+gamma) = 0.5
    assert qcs.residual_bound_unbiased(3.0, 0.5).value == math.inf
    assert not qcs.residual_bound_unbiased(0.5, 1.0).valid  # beta = 1 excluded by (15)
    assert qcs.residual_bound_unbiased(3.0, 0.49).valid
    assert float(qcs.residual_bound_unbiased(2.0, 0.3)) == pytest.approx(2 / (1 - (0.49 + 0.18)))


@pytest.mark.parametrize(
    "call, exc, word",
    [
        (lambda: qcs.gamma(0, 1, 1), ValueError, "n"),
        (lambda: qcs.gamma(8, 0, 1), ValueError, "k"),
        (lambda: qcs.gamma(8, 9, 1), ValueError, "k"),
        (lambda: qcs.gamma(8, 2, 0), ValueError, "Q"),
        (lambda: qcs.gamma(8, 2.5, 1), TypeError, "k"),
        (lambda: qcs.residual_bound_unbiased(1.0, 0.0), ValueError, "beta"),
        (lambda: qcs.residual_bound_mmse(1.0, 1.5), ValueError, "beta"),
        (lambda: qcs.residual_bound_mmse(-1.0, 0.5), ValueError, "gamma"),
        (lambda: qcs.mmse_alpha(float("nan")), ValueError, "gamma"),
        (lambda: qcs.min_gamma_curve(8, np.array([1.0, -2.0])), ValueError, "gains"),
        (lambda: qcs.exact_gain(8, 2, 1, packing="zip"), ValueError, "packing"),
    ],
)
def test_bad_arguments_are_named(call, exc, word):
    with pytest.raises(exc, match=word):
        call()


def _qcs_relative_errors(g: np.ndarray, k: int, Q: int, trials: int, rng: np.random.Generator) -> np.ndarray:
    """Unbiased QCS written out from (1), (4), (6), (8) with alpha = 1, in numpy."""
    n = g.size
    H = hadamard(n)[:k].astype(np.float64)
    r = rng.choice([-1.0, 1.0], size=(trials, n))
    u = rng.uniform(-0.5, 0.5, size=(trials, k))
    v = (r * g) @ H.T / math.sqrt(k)
    scale = np.abs(v).max(axis=1, keepdims=True) / Q
    q = np.floor(v / scale + u + 0.5)
    g_hat = r * ((scale * (q - u)) @ H) / math.sqrt(k)
    return ((g_hat - g) ** 2).sum(axis=1) / (g @ g)


def test_gamma_bounds_simulated_qcs_and_the_quantization_term_is_needed():
    """Theorem 2 P2: E||e||^2/||g||^2 <= gamma. 20,000 trials per vector; the mean is compared with 4 standard
    errors (99.99 % two-sided). The same data refute a gamma without its quantization term (n/k - 1), so the
    check would catch that mistake."""
    rng = np.random.default_rng(20260101)
    n, k, Q = 64, 16, 2
    gam = qcs.gamma(n, k, Q)
    for g in (rng.standard_normal(n), np.eye(n)[0], np.r_[np.ones(4), np.zeros(n - 4)]):
        e = _qcs_relative_errors(g, k, Q, 20000, rng)
        se = e.std(ddof=1) / math.sqrt(e.size)
        assert e.mean() + 4 * se <= gam
        assert e.mean() - 4 * se > n / k - 1

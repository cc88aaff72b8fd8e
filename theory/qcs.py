"""Quantized Compressive Sampling (QCS): variance factor, compression gain, optimal (k, Q), MMSE scaling and the
residual bounds of weighted error feedback.

Source: Abdi & Fekri, *Quantized Compressive Sampling of Stochastic Gradients* (``QCS (Abdi & Fekri)``),
equations (10)-(18) and Remark 3. Notation: ``n`` block length, ``k`` rows of the Hadamard matrix kept,
``Q`` quantizer range (codes in ``{-Q, ..., Q}``), ``b`` bits per uncompressed value.

"No bound" convention: the residual bounds (15)/(16) return a :class:`ResidualBound` whose ``value`` is
``math.inf`` and ``valid`` is False, with ``reason`` saying why, whenever the paper's formula gives no finite bound
for the arguments (outside the lemma's range of the feedback weight, or a printed base <= 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gradstat.theory import _checks
from gradstat.theory.bits import qcs_bits

__all__ = [
    "gamma",
    "gain",
    "exact_gain",
    "OptimalPair",
    "optimal_pair",
    "min_gamma_curve",
    "mmse_alpha",
    "mmse_error_factor",
    "ResidualBound",
    "residual_bound_unbiased",
    "residual_bound_mmse",
    "optimal_feedback_unbiased",
    "optimal_feedback_mmse",
    "karimireddy_residual_bound",
]

_Q_CAP = 2.0**52
"""Largest quantizer range the optimal search considers; beyond it the Q-term of (10) is below float resolution."""


def _check_nkq(n: object, k: object, Q: object) -> tuple[int, int, int]:
    n = _checks.integer("n", n, minimum=1)
    k = _checks.integer("k", k, minimum=1, maximum=n)
    Q = _checks.integer("Q", Q, minimum=1)
    return n, k, Q


def _gamma_unchecked(n: int, k: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """Vectorised (10) on arrays of k (>= 1) and Q (>= 1) that broadcast together."""
    k = np.asarray(k, dtype=np.float64)
    Q = np.asarray(Q, dtype=np.float64)
    km1 = np.where(k > 1, k - 1.0, 1.0)
    q_term = np.where(k > 1, n / (4.0 * Q * Q) * np.log(k) / km1, 0.0)
    return n / k - 1.0 + q_term


def gamma(n: int, k: int, Q: int) -> float:
    """Variance factor of unbiased QCS: ``E||g - g_hat||^2 <= gamma ||g||^2``.

    Source: QCS (Abdi & Fekri), Theorem 2, eq. (10)::

        gamma = n/k - 1 + (n / (4 Q^2)) * log(k) / (k - 1)   for k >= 2   (natural log)
        gamma = n - 1                                          for k = 1

    Parameters
    ----------
    n : block length, integer >= 1.
    k : rows kept (compressed length), integer in ``[1, n]``.
    Q : quantizer range (codes in ``{-Q..Q}``), integer >= 1.

    Returns
    -------
    float, dimensionless, >= 0.
    """
    n, k, Q = _check_nkq(n, k, Q)
    return float(_gamma_unchecked(n, np.array(k), np.array(Q)))


def gain(n: int, k: int, Q: int, value_bits: int = 32) -> float:
    """Compression gain of QCS with the scale factor ignored, as printed.

    Source: QCS (Abdi & Fekri), eq. (11): ``gain = n b / (k log2(2Q + 1))`` (fractional bits per code).

    Parameters
    ----------
    n, k, Q : as in :func:`gamma`.
    value_bits : b, bits per uncompressed value (32 for float32), integer >= 1.

    Returns
    -------
    float, uncompressed bits over compressed bits.
    """
    n, k, Q = _check_nkq(n, k, Q)
    value_bits = _checks.integer("value_bits", value_bits, minimum=1)
    return n * value_bits / (k * math.log2(2 * Q + 1))


def exact_gain(
    n: int,
    k: int,
    Q: int | None,
    value_bits: int = 32,
    scale_bits: int = 32,
    seed_bits: int = 64,
    packing: str = "fixed",
) -> float:
    """Compression gain of one QCS block counting everything that is sent: codes, scale factor and seed.

    Source: QCS (Abdi & Fekri), eq. (11) and Algorithm 1 (the receiver needs ``q``, the scale ``varsigma``
    and the seed from which it regenerates ``r`` and ``u``); bit count from :func:`gradstat.theory.bits.qcs_bits`.

    Parameters
    ----------
    n, k : as in :func:`gamma`.
    Q : quantizer range, or None for the 1-bit variant (5) (one sign bit per code).
    value_bits : bits per uncompressed value.
    scale_bits : bits of the scale factor (one per block).
    seed_bits : bits of the seed material sent per block (0 if both sides derive it from shared state).
    packing : ``"fixed"`` (``ceil(log2(2Q+1))`` bits per code) or ``"ideal"`` (``log2(2Q+1)``, codes packed).

    Returns
    -------
    float, ``n * value_bits / bits_sent``.
    """
    n = _checks.integer("n", n, minimum=1)
    value_bits = _checks.integer("value_bits", value_bits, minimum=1)
    return n * value_bits / qcs_bits(n, k, Q, scale_bits=scale_bits, seed_bits=seed_bits, packing=packing)


@dataclass(frozen=True)
class OptimalPair:
    """Result of :func:`optimal_pair`: the valid (k, Q) of least gamma at a target gain."""

    k: int
    Q: int
    gamma: float
    gain: float


def _best_q(n: int, ks: np.ndarray, gains: np.ndarray, value_bits: int) -> np.ndarray:
    """Largest integer Q >= 1 with ``gain(n, k, Q) >= target``, for every (target, k); 0 where none exists.

    ``gain >= target``  <=>  ``log2(2Q + 1) <= n b / (k target)``; gamma decreases in Q, so the largest such Q
    is the best for that k.
    """
    budget = n * value_bits / (np.outer(gains, ks))  # bits allowed per code, shape (m, n)
    with np.errstate(over="ignore"):
        q = np.floor((np.exp2(np.minimum(budget, 60.0)) - 1.0) / 2.0)
    q = np.minimum(q, _Q_CAP)
    # guard float rounding at the boundary: the chosen Q must really meet the target
    over = np.log2(2.0 * q + 1.0) > budget * (1.0 + 1e-12)
    q = np.where(over, q - 1.0, q)
    return np.where(q >= 1.0, q, 0.0)


def min_gamma_curve(
    n: int, gains: np.ndarray, value_bits: int = 32
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Least QCS variance factor achievable at each target gain (the QCS curve of Fig. 3).

    Source: QCS (Abdi & Fekri), Theorem 2 (10), gain (11) and the discussion after it / Fig. 3.

    A pair is *valid* for a target ``G`` when ``k`` is an integer in ``1..n``, ``Q`` is an integer >= 1 and
    ``gain(n, k, Q) >= G`` by (11) (fractional bits per code, scale factor ignored, as in the paper). For each
    ``k`` the best valid ``Q`` is the largest one (gamma decreases in Q), so the search is one vectorised pass over
    ``k`` for all targets at once: O(len(gains) * n) time. Ties in gamma go to the smallest k.

    Parameters
    ----------
    n : block length, integer >= 1.
    gains : target gains, array-like of reals > 0, shape (m,).
    value_bits : b, bits per uncompressed value.

    Returns
    -------
    gamma_min, k_opt, Q_opt, achieved_gain : arrays of shape (m,). Where no valid pair exists (target above
    ``n b / log2(3)``), gamma_min and achieved_gain are inf and k_opt, Q_opt are 0. Q_opt is float64 (it can
    exceed the int64 range for tiny targets; it is capped at 2**52, where the Q-term of (10) is negligible).
    """
    n = _checks.integer("n", n, minimum=1)
    value_bits = _checks.integer("value_bits", value_bits, minimum=1)
    g = _checks.vector("gains", gains)
    if np.any(g <= 0):
        raise ValueError(f"gains must be > 0, got minimum {g.min():g}")
    ks = np.arange(1, n + 1, dtype=np.float64)
    gamma_min = np.full(g.shape, np.inf)
    k_opt = np.zeros(g.shape, dtype=np.int64)
    q_opt = np.zeros(g.shape)
    rows = max(1, (1 << 22) // n)  # bound the (targets x k) working arrays to ~4M elements
    for start in range(0, g.size, rows):
        sl = slice(start, start + rows)
        q = _best_q(n, ks, g[sl], value_bits)
        gam = np.where(q >= 1.0, _gamma_unchecked(n, ks[None, :], np.maximum(q, 1.0)), np.inf)
        j = np.argmin(gam, axis=1)
        best = gam[np.arange(gam.shape[0]), j]
        found = np.isfinite(best)
        gamma_min[sl] = best
        k_opt[sl] = np.where(found, j + 1, 0)
        q_opt[sl] = np.where(found, q[np.arange(q.shape[0]), j], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        achieved = np.where(k_opt > 0, n * value_bits / (np.maximum(k_opt, 1) * np.log2(2.0 * q_opt + 1.0)), np.inf)
    return gamma_min, k_opt, q_opt, achieved


def optimal_pair(n: int, target_gain: float, value_bits: int = 32) -> OptimalPair:
    """The valid (k, Q) minimising gamma (10) subject to gain (11) >= ``target_gain``.

    Source: QCS (Abdi & Fekri), Theorem 2 and the discussion after (11). Validity as in
    :func:`min_gamma_curve`.

    Raises
    ------
    ValueError if no valid pair reaches the target (it must not exceed ``n * value_bits / log2(3)``).
    """
    target_gain = _checks.positive("target_gain", target_gain)
    gam, k, q, achieved = min_gamma_curve(n, np.array([target_gain]), value_bits)
    if k[0] == 0:
        top = n * value_bits / math.log2(3)
        raise ValueError(f"target_gain must be <= n*value_bits/log2(3) = {top:.6g} for n={n}; got {target_gain:g}")
    return OptimalPair(k=int(k[0]), Q=int(q[0]), gamma=float(gam[0]), gain=float(achieved[0]))


def mmse_alpha(gamma: float) -> float:
    """Reconstruction scale of MMSE-QCS: ``alpha = 1 / (gamma + 1)``.

    Source: QCS (Abdi & Fekri), eq. (12). ``gamma`` >= 0 is the factor of (10).
    """
    gamma = _checks.nonnegative("gamma", gamma)
    return 1.0 / (gamma + 1.0)


def mmse_error_factor(gamma: float) -> float:
    """MMSE-QCS error bound factor: ``E||e||^2 <= (1 - alpha) ||g||^2 = gamma/(gamma+1) ||g||^2``.

    Source: QCS (Abdi & Fekri), Lemma 3, eq. (13) with alpha from (12).
    """
    return 1.0 - mmse_alpha(gamma)


@dataclass(frozen=True)
class ResidualBound:
    """A bound ``E||r_t||^2 <= value * B`` on the error-feedback residual (Lemma 4), or the absence of one.

    Attributes
    ----------
    value : eta, or ``math.inf`` when the formula gives no bound for these arguments.
    valid : True when ``value`` is a bound the paper states.
    reason : empty when valid, else why there is no bound.
    """

    value: float
    valid: bool
    reason: str = ""

    def __float__(self) -> float:
        return self.value


def _check_feedback(gamma: object, beta: object) -> tuple[float, float]:
    gamma = _checks.nonnegative("gamma", gamma)
    beta = _checks.real("beta", beta, low=0.0, high=1.0, low_open=True)
    return gamma, beta


def residual_bound_unbiased(gamma: float, beta: float) -> ResidualBound:
    """Residual bound eta of weighted error feedback with unbiased QCS.

    Source: QCS (Abdi & Fekri), Lemma 4, eq. (15)::

        eta = gamma / (1 - ((1 - beta)^2 + beta^2 gamma)),   valid for 0 < beta < min(1, 2 / (1 + gamma)).

    Parameters
    ----------
    gamma : variance factor (10), >= 0.
    beta : feedback weight (QCS beta), in (0, 1].

    Returns
    -------
    ResidualBound; no bound (inf) when beta is outside the lemma's range (beta = 1, or beta >= 2/(1+gamma)).
    """
    gamma, beta = _check_feedback(gamma, beta)
    limit = min(1.0, 2.0 / (1.0 + gamma))
    if beta >= limit:
        return ResidualBound(
            math.inf, False, f"beta={beta:g} outside (0, min(1, 2/(1+gamma))) = (0, {limit:g}) of Lemma 4 (15)"
        )
    return ResidualBound(gamma / (1.0 - ((1.0 - beta) ** 2 + beta**2 * gamma)), True)


def residual_bound_mmse(gamma: float, beta: float) -> ResidualBound:
    """Residual bound eta of weighted error feedback with MMSE-QCS, computed as printed.

    Source: QCS (Abdi & Fekri), Lemma 4, eq. (16)::

        eta = gamma / (sqrt(gamma + 1) - (1 - beta)^2 - sqrt(gamma))^2,   0 < beta <= 1.

    As printed the base ``sqrt(gamma+1) - (1-beta)^2 - sqrt(gamma)`` is <= 0 for small beta (e.g. gamma = 1,
    beta <= 0.357); squaring would then turn a meaningless negative base into a finite number, so there the
    function reports no bound instead.

    Returns
    -------
    ResidualBound; no bound (inf) where the printed base is <= 0.
    """
    gamma, beta = _check_feedback(gamma, beta)
    base = math.sqrt(gamma + 1.0) - (1.0 - beta) ** 2 - math.sqrt(gamma)
    if base <= 0.0:
        return ResidualBound(
            math.inf, False, f"printed base sqrt(gamma+1) - (1-beta)^2 - sqrt(gamma) = {base:.6g} <= 0 in (16)"
        )
    return ResidualBound(gamma / base**2, True)


def residual_bound_mmse_minkowski(gamma: float, beta: float) -> ResidualBound:
    """Residual bound for MMSE-QCS feedback derived from Lemma 3 by Minkowski's inequality (valid for 0 < beta <= 1).

    Source: derived here from QCS (Abdi & Fekri) eq. (14a-d) and Lemma 3 (13); it is the reading of Lemma 4
    (16) that agrees with the paper's text ("all values of 0 <= beta <= 1 are viable" for MMSE-QCS) and with
    Remark 2 (18) at beta = 1, where (16) as printed has a base that turns negative for small beta.

    Derivation, with ||X|| = sqrt(E||X||^2) (a norm on random vectors) and s = sqrt(1 - alpha) =
    sqrt(gamma / (gamma + 1)) by (12)-(13): e_t = z_t - zhat_t satisfies ||e_t|| <= s ||z_t|| (13), and
    z_t = g_t + beta r_t, so by (14d) and Minkowski

        ||r_{t+1}|| <= (1 - beta) ||r_t|| + s (sqrt(B) + beta ||r_t||) = (1 - beta (1 - s)) ||r_t|| + s sqrt(B).

    From r_0 = 0 this never exceeds the fixed point s sqrt(B) / (beta (1 - s)), hence
    E||r_t||^2 <= eta B with

        eta = s^2 / (beta^2 (1 - s)^2) = gamma / (beta^2 (sqrt(gamma + 1) - sqrt(gamma))^2).

    No independence between g and r is assumed. The bound is attained by the deterministic compressor
    C(z) = (1 - s) z (which meets (13) with equality) on a constant gradient, so it cannot be improved without
    further assumptions. At beta = 1 it equals eta_m* of (18).
    """
    gamma, beta = _check_feedback(gamma, beta)
    return ResidualBound(gamma / (beta * (math.sqrt(gamma + 1.0) - math.sqrt(gamma))) ** 2, True)


def optimal_feedback_unbiased(gamma: float) -> tuple[float, float]:
    """Feedback weight minimising (15) and the minimum: ``beta_u* = 1/(gamma+1)``, ``eta_u* = gamma (gamma+1)``.

    Source: QCS (Abdi & Fekri), Remark 2, eq. (17). Returns ``(beta_u*, eta_u*)``.
    """
    gamma = _checks.nonnegative("gamma", gamma)
    return 1.0 / (gamma + 1.0), gamma * (gamma + 1.0)


def optimal_feedback_mmse(gamma: float) -> tuple[float, float]:
    """Feedback weight minimising (16) and the minimum: ``beta_m* = 1``,
    ``eta_m* = gamma / (sqrt(gamma+1) - sqrt(gamma))^2``.

    Source: QCS (Abdi & Fekri), Remark 2, eq. (18). Returns ``(beta_m*, eta_m*)``.
    """
    gamma = _checks.nonnegative("gamma", gamma)
    return 1.0, gamma / (math.sqrt(gamma + 1.0) - math.sqrt(gamma)) ** 2


def karimireddy_residual_bound(gamma: float) -> float:
    """Residual bound of Karimireddy et al. (2019, Lemma 3) for MMSE-QCS: ``eta_k = 4 gamma (gamma + 1)``.

    Source: QCS (Abdi & Fekri), Remark 3 (their delta equals ``1/(gamma+1)``).
    """
    gamma = _checks.nonnegative("gamma", gamma)
    return 4.0 * gamma * (gamma + 1.0)

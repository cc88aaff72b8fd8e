"""SIDCo's closed forms about the achieved ratio and convergence (the thresholds themselves live in
``theory.thresholds``).

Source: ``SIDCo (Abdelmoniem et al.)``: Sec. 2.2 (the number of exceedances of the threshold is binomial),
Lemma 3 eq. (13), App. C eqs. (42)-(45); the gamma threshold's three forms of App. A, eqs. (14), (22) and
(23)/(15) (:func:`gamma_threshold`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy import optimize, special, stats

from gradstat.theory import _checks

__all__ = [
    "GAMMA_THRESHOLD_FORMS",
    "gamma_threshold",
    "exceedance_count_mean",
    "exceedance_count_interval",
    "iterations_to_sgd_rate",
    "convergence_bound",
    "ratio_error",
]


def exceedance_count_mean(d: int, ratio: float) -> float:
    """Mean number of elements above the exact threshold: ``E[k_hat] = d delta``.

    Source: SIDCo (Abdelmoniem et al.), Sec. 2.2 and App. C (``K_hat ~ Binomial(d, delta)`` under the true law).
    """
    d = _checks.integer("d", d, minimum=1)
    ratio = _checks.unit_open("ratio", ratio)
    return d * ratio


def exceedance_count_interval(d: int, ratio: float, confidence: float = 0.95) -> tuple[int, int]:
    """Central ``confidence`` interval of ``k_hat ~ Binomial(d, delta)``: the number of elements of a vector of
    ``d`` iid draws from the true distribution that exceed its exact ``1 - delta`` quantile.

    Source: SIDCo (Abdelmoniem et al.), Sec. 2.2 / App. C (binomial law of the exceedances).

    Returns
    -------
    (low, high) : integers with ``P(low <= k_hat <= high) >= confidence``. Divide by ``d delta`` for ``k_hat/k``.
    """
    d = _checks.integer("d", d, minimum=1)
    ratio = _checks.unit_open("ratio", ratio)
    confidence = _checks.unit_open("confidence", confidence)
    lo, hi = stats.binom.interval(confidence, d, ratio)
    return int(lo), int(hi)


def iterations_to_sgd_rate(ratio: float, tolerance: float = 0.0) -> float:
    """Order of the number of iterations after which SIDCo's rate matches SGD: ``1 / (delta^2 (1 - eps)^2)``.

    Source: SIDCo (Abdelmoniem et al.), Lemma 3, eq. (13) (an O(.) statement: the constant is 1 here, so use this
    for comparisons between settings, not as an absolute count).

    Parameters
    ----------
    ratio : delta, target ratio in (0, 1). tolerance : eps of (12), in [0, 1).
    """
    ratio = _checks.unit_open("ratio", ratio)
    tolerance = _checks.real("tolerance", tolerance, low=0.0, high=1.0, high_open=True)
    return 1.0 / (ratio**2 * (1.0 - tolerance) ** 2)


def convergence_bound(f_gap: float, smoothness: float, second_moment: float, ratio: float, iterations: int) -> float:
    """Bound on ``min_i E||grad f(x_i)||^2`` of threshold sparsification with error compensation::

        (4 (f(x_0) - f*) + L sigma^2) / (2 sqrt(I + 1)) + 4 L^2 sigma^2 (1 - delta) / (delta^2 (I + 1))

    Source: SIDCo (Abdelmoniem et al.), App. C, eq. (43) (from Karimireddy et al. 2019, Theorem II).

    Parameters
    ----------
    f_gap : ``f(x_0) - f*`` >= 0. smoothness : L_0 > 0. second_moment : sigma_0^2, bound on ``E||g||^2``, >= 0.
    ratio : delta in (0, 1). iterations : I >= 0.
    """
    f_gap = _checks.nonnegative("f_gap", f_gap)
    smoothness = _checks.positive("smoothness", smoothness)
    second_moment = _checks.nonnegative("second_moment", second_moment)
    ratio = _checks.unit_open("ratio", ratio)
    iterations = _checks.integer("iterations", iterations, minimum=0)
    first = (4.0 * f_gap + smoothness * second_moment) / (2.0 * math.sqrt(iterations + 1))
    second = 4.0 * smoothness**2 * second_moment * (1.0 - ratio) / (ratio**2 * (iterations + 1))
    return first + second


def ratio_error(
    ratio: float, true_cdf: Callable[[np.ndarray], np.ndarray], fitted_ppf: Callable[[np.ndarray], np.ndarray]
) -> float:
    """Error of the achieved ratio when the threshold comes from a fitted instead of the true distribution::

        delta_hat - delta = F_G(eta(delta)) - F_G(eta_hat(delta)),   eta_hat = F_hat^{-1}(1 - delta)

    with ``F_G(eta(delta)) = 1 - delta`` exactly (``eta`` is the true quantile).

    Source: SIDCo (Abdelmoniem et al.), App. C, eqs. (44)-(45). ``F`` are cdfs of the magnitude ``|G|``.

    Parameters
    ----------
    ratio : delta in (0, 1).
    true_cdf : cdf of ``|G|`` under the true distribution (e.g. ``Gamma(...).cdf`` or a scipy frozen ``.cdf``).
    fitted_ppf : quantile function of the fitted distribution of ``|G|``.

    Returns
    -------
    float: ``delta_hat - delta`` (positive: more elements kept than targeted).
    """
    ratio = _checks.unit_open("ratio", ratio)
    eta_hat = float(np.asarray(fitted_ppf(np.asarray(1.0 - ratio))))
    if not math.isfinite(eta_hat):
        raise ValueError(f"fitted_ppf(1 - ratio) must be finite, got {eta_hat}")
    return (1.0 - ratio) - float(np.asarray(true_cdf(np.asarray(eta_hat))))


GAMMA_THRESHOLD_FORMS = ("exact", "fixed-point", "approx")
"""The forms of :func:`gamma_threshold`: the exact quantile (14), the fixed point of (22), the approximation (23)
that gives (15)."""


def gamma_threshold(shape: float, scale: float, ratio: float, form: str = "exact") -> float:
    """Threshold ``eta`` with ``P(|G| > eta) = delta`` for ``|G| ~ Gamma(alpha, beta)``, in one of three forms.

    Source: SIDCo (Abdelmoniem et al.), Cor. 1.2 and its proof (App. A). With ``x = eta / beta``:

    - ``exact``: (14), ``x = P^{-1}(alpha, 1 - delta)`` (the inverse regularized incomplete gamma; the reference);
    - ``fixed-point``: (22), the root of ``x = -log(delta Gamma(alpha)) - (1 - alpha) log(x)``, which the paper
      derives from the tail bound (21) for ``alpha <= 1`` and then loosens; solved here (its right side decreases
      in x, so the root is unique);
    - ``approx``: (23), ``x = -log(delta) - log(Gamma(alpha))``, i.e. (15) ``eta = -beta (log(delta) +
      log(Gamma(alpha)))`` as the paper uses it (clipped at 0).

    At alpha = 0.3, delta = 0.01: exact 2.64, fixed point 2.79, approx 3.51 (units of beta); all three agree at
    alpha = 1 (the exponential law).

    Parameters
    ----------
    shape : alpha > 0 (``fixed-point`` and ``approx`` need alpha <= 1, where (21) holds). scale : beta > 0.
    ratio : delta in (0, 1). form : one of :data:`GAMMA_THRESHOLD_FORMS`.
    """
    shape = _checks.positive("shape", shape)
    scale = _checks.positive("scale", scale)
    ratio = _checks.unit_open("ratio", ratio)
    form = _checks.choice("form", form, GAMMA_THRESHOLD_FORMS)
    if form == "exact":
        return scale * float(special.gammaincinv(shape, 1.0 - ratio))
    if shape > 1.0:
        raise ValueError(f"the {form} form of the gamma threshold needs shape <= 1 (SIDCo (21)), got {shape}")
    c = -math.log(ratio) - special.gammaln(shape)
    if form == "approx" or shape == 1.0:
        return scale * float(max(c, 0.0))

    def gap(x: float) -> float:  # increasing in x: 1 + (1 - alpha) / x > 0
        return x + (1.0 - shape) * math.log(x) - c

    low, high = 1e-300, max(c, 1.0) + 1.0
    return scale * float(optimize.brentq(gap, low, high, xtol=1e-14, rtol=1e-14))

"""Convergence terms of QCS (with and without weighted error feedback) and of distributed DQSG.

Sources: QCS (Abdi & Fekri), Lemma 5, eq. (22), Lemma 6, eq. (23) (assumptions (19) L-smooth f and (20)
``E||g||^2 <= B``); DQSG/NDQSG (Abdi & Fekri), Theorem 5 and eq. (5), App. D.
"""

from __future__ import annotations

import math

from gradstat.theory import _checks

__all__ = [
    "qcs_average_gradient_bound",
    "qcs_rate_no_feedback",
    "qcs_average_gradient_bound_feedback",
    "qcs_rate_feedback",
    "dqsg_variance",
    "dqsg_iterations",
    "dqsg_step_size",
    "dqsg_time_increase",
]


def _common(f_gap: object, smoothness: object, grad_bound: object) -> tuple[float, float, float]:
    return (
        _checks.nonnegative("f_gap", f_gap),
        _checks.positive("smoothness", smoothness),
        _checks.nonnegative("grad_bound", grad_bound),
    )


def qcs_average_gradient_bound(
    f_gap: float, smoothness: float, step: float, gamma: float, grad_bound: float, iterations: int, mmse: bool = False
) -> float:
    """Lemma 5: bound on ``(1/T) sum_t E||grad f(w_t)||^2`` of SGD with QCS, no error feedback::

        unbiased:  (f(w_0) - f*) / (T mu) + (L/2) mu (1 + gamma) B
        MMSE:      (1 + gamma) (f(w_0) - f*) / (T mu) + (L/2) mu B

    Source: QCS (Abdi & Fekri), Lemma 5.

    Parameters
    ----------
    f_gap : ``f(w_0) - f*``. smoothness : L. step : mu > 0. gamma : (10). grad_bound : B of (20).
    iterations : T >= 1. mmse : MMSE-QCS instead of unbiased QCS.
    """
    f_gap, smoothness, grad_bound = _common(f_gap, smoothness, grad_bound)
    step = _checks.positive("step", step)
    gamma = _checks.nonnegative("gamma", gamma)
    iterations = _checks.integer("iterations", iterations, minimum=1)
    if mmse:
        return (1.0 + gamma) * f_gap / (iterations * step) + smoothness / 2.0 * step * grad_bound
    return f_gap / (iterations * step) + smoothness / 2.0 * step * (1.0 + gamma) * grad_bound


def qcs_rate_no_feedback(f_gap: float, smoothness: float, gamma: float, grad_bound: float, iterations: int) -> float:
    """Eq. (22): ``min_t E||grad f(w_t)||^2 <= (f(w_0) - f* + (L/2)(1 + gamma) B) / sqrt(T)``.

    Source: QCS (Abdi & Fekri), eq. (22) (step ``mu = 1/sqrt(T)`` in Lemma 5).
    """
    f_gap, smoothness, grad_bound = _common(f_gap, smoothness, grad_bound)
    gamma = _checks.nonnegative("gamma", gamma)
    iterations = _checks.integer("iterations", iterations, minimum=1)
    return (f_gap + smoothness / 2.0 * (1.0 + gamma) * grad_bound) / math.sqrt(iterations)


def qcs_average_gradient_bound_feedback(
    f_gap: float, smoothness: float, step: float, eta: float, grad_bound: float, iterations: int
) -> float:
    """Lemma 6: with weighted error feedback,
    ``(1/T) sum_t E||grad f(w_t)||^2 <= (f(w_0) - f*) / (T mu / 2) + L B (mu + 4 L eta mu^2)``.

    Source: QCS (Abdi & Fekri), Lemma 6; ``eta`` from (15) or (16) (:mod:`gradstat.theory.qcs`). An infinite eta
    (no bound) gives an infinite result.
    """
    f_gap, smoothness, grad_bound = _common(f_gap, smoothness, grad_bound)
    step = _checks.positive("step", step)
    eta = _checks.real("eta", eta, low=0.0) if eta != math.inf else math.inf
    iterations = _checks.integer("iterations", iterations, minimum=1)
    return f_gap / (iterations * step / 2.0) + smoothness * grad_bound * (step + 4.0 * smoothness * eta * step**2)


def qcs_rate_feedback(
    f_gap: float, smoothness: float, grad_bound: float, eps: float, eta: float, iterations: int
) -> float:
    """Eq. (23), step ``mu = sqrt(1 + eps) / sqrt(T)``::

        min_t E||grad f||^2 <= (f(w_0) - f* + (L/2) B (1 + eps)) / sqrt(T)
                               + L^2 B (1 + eps)^2 / (sqrt(1 + eps) - 1) * eta / T

    Source: QCS (Abdi & Fekri), eq. (23). ``eps > 0``.
    """
    f_gap, smoothness, grad_bound = _common(f_gap, smoothness, grad_bound)
    eps = _checks.positive("eps", eps)
    eta = _checks.real("eta", eta, low=0.0) if eta != math.inf else math.inf
    iterations = _checks.integer("iterations", iterations, minimum=1)
    first = (f_gap + smoothness / 2.0 * grad_bound * (1.0 + eps)) / math.sqrt(iterations)
    second = smoothness**2 * grad_bound * (1.0 + eps) ** 2 / (math.sqrt(1.0 + eps) - 1.0) * eta / iterations
    return first + second


def dqsg_variance(n: int, delta: float, sg_variance: float, grad_bound: float) -> float:
    """Theorem 5's ``sigma^2 = V (1 + n Delta^2 / 12) + n B Delta^2 / 12``.

    Source: DQSG/NDQSG (Abdi & Fekri), Theorem 5 and App. D. ``V`` bounds ``E||g_p - grad L||^2``; ``B`` bounds
    ``||grad L||`` as stated in the theorem (App. D uses it in place of ``E||g||^2``).
    """
    n = _checks.integer("n", n, minimum=1)
    delta = _checks.positive("delta", delta)
    sg_variance = _checks.nonnegative("sg_variance", sg_variance)
    grad_bound = _checks.nonnegative("grad_bound", grad_bound)
    return sg_variance * (1.0 + n * delta**2 / 12.0) + n * grad_bound * delta**2 / 12.0


def dqsg_iterations(radius: float, sigma2: float, eps: float, workers: int) -> float:
    """Theorem 5's ``T = 2.5 R^2 sigma^2 / (eps^2 P)`` steps to reach accuracy eps on P workers.

    Source: DQSG/NDQSG (Abdi & Fekri), Theorem 5 / App. D.
    """
    radius = _checks.nonnegative("radius", radius)
    sigma2 = _checks.nonnegative("sigma2", sigma2)
    eps = _checks.positive("eps", eps)
    workers = _checks.integer("workers", workers, minimum=1)
    return 2.5 * radius**2 * sigma2 / (eps**2 * workers)


def dqsg_step_size(eps: float, smoothness: float, sigma2: float, workers: int) -> float:
    """Theorem 5's constant step ``eta_t = eps / (ell + 1.1 sigma^2 / P)``.

    Source: DQSG/NDQSG (Abdi & Fekri), Theorem 5.
    """
    eps = _checks.positive("eps", eps)
    smoothness = _checks.nonnegative("smoothness", smoothness)
    sigma2 = _checks.nonnegative("sigma2", sigma2)
    workers = _checks.integer("workers", workers, minimum=1)
    denom = smoothness + 1.1 * sigma2 / workers
    if denom == 0:
        raise ValueError("smoothness and sigma2 cannot both be 0 (the step would be infinite)")
    return eps / denom


def dqsg_time_increase(n: int, delta: float, grad_bound: float, sg_variance: float) -> float:
    """Relative increase of training time from quantization: ``(T - T_c)/T_c = (n Delta^2/12)(1 + B/V)``.

    Source: DQSG/NDQSG (Abdi & Fekri), eq. (5). ``V > 0``.
    """
    n = _checks.integer("n", n, minimum=1)
    delta = _checks.positive("delta", delta)
    grad_bound = _checks.nonnegative("grad_bound", grad_bound)
    sg_variance = _checks.positive("sg_variance", sg_variance)
    return n * delta**2 / 12.0 * (1.0 + grad_bound / sg_variance)

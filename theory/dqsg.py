"""Dithered (DQSG), half-dithered and nested dithered (NDQSG) quantization: the scalar quantizer maths, the
variance results and the decoding-failure probability of nested quantization with side information.

Source: Abdi & Fekri, *Nested Dithered Quantization for Communication Reduction in Distributed Training*
(``DQSG/NDQSG (Abdi & Fekri)``): Sec. 2.1 (dithered / half-dithered quantization), eq. (2) and Lemma 3 (DQSG),
(3), (4), Sec. 3.2 eqs. (6)-(7) (nested encode / decode), Theorem 6 eq. (8), eq. (9) and App. E (its proof).

Rounding: ``Q(v) = Delta * round(v / Delta)`` with ties rounded up (``floor(v/Delta + 1/2)``); the paper only
says "nearest integer", and ties have probability zero under a continuous dither. The encode/decode functions
are pure numpy maths on floats or arrays, so a compressor can cross-check its tensors against them.

Notation (Theorem 6): the worker's gradient is ``g = g_tilde + z`` where ``g_tilde`` is the side information at
the receiver and ``z`` has ``E z_i^2 = sigma_z^2``; ``0 < alpha <= 1`` is the shrinkage factor.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from gradstat.theory import _checks

__all__ = [
    "quantize",
    "dithered_quantize",
    "half_dithered_quantize",
    "conditional_error",
    "variance_bound",
    "excess_variance_bound",
    "second_moment_factor",
    "sum_uniform_moment",
    "half_dither_error_moment",
    "printed_half_dither_moment",
    "nesting_ratio",
    "theorem5_variance",
    "theorem5_gap_bound",
    "theorem5_step",
    "nested_encode",
    "nested_decode",
    "nested_safe_radius",
    "nested_failure_bound",
    "nested_failure_probability",
    "nested_error_variance",
    "nested_alphas",
]

ArrayLike = float | np.ndarray


def quantize(v: ArrayLike, delta: float) -> ArrayLike:
    """Uniform quantizer centred on 0: ``Q(v) = Delta * round(v / Delta)`` (DQSG/NDQSG (Abdi & Fekri), Sec. 2.1)."""
    delta = _checks.positive("delta", delta)
    return delta * np.floor(np.asarray(v, dtype=np.float64) / delta + 0.5)


def dithered_quantize(x: ArrayLike, u: ArrayLike, delta: float) -> ArrayLike:
    """Dithered quantization ``x_tilde = Q(x + u) - u`` (DQSG/NDQSG (Abdi & Fekri), Sec. 2.1, Definition).

    With ``u ~ U[-Delta/2, Delta/2]`` independent of ``x`` and no overload, the error is ``U[-Delta/2, Delta/2]``
    and independent of ``x`` (Theorem 1, Schuchman).
    """
    u = np.asarray(u, dtype=np.float64)
    return quantize(np.asarray(x, dtype=np.float64) + u, delta) - u


def half_dithered_quantize(x: ArrayLike, u: ArrayLike, delta: float) -> ArrayLike:
    """Half-dithered quantization ``x_h = Q(x + u)`` (dither not subtracted; DQSG/NDQSG (Abdi & Fekri), Sec. 2.1).

    With ``Delta = 1/M`` and ``u ~ U[-1/(2M), 1/(2M)]`` it is QSGD's M-level stochastic quantizer (Lemma 2).
    """
    return quantize(np.asarray(x, dtype=np.float64) + np.asarray(u, dtype=np.float64), delta)


def conditional_error(g: np.ndarray, delta: float) -> float:
    """Exact conditional error of DQSG: ``E[||g_tilde - g||^2 | g] = ||g||_inf^2 n Delta^2 / 12``.

    Source: DQSG/NDQSG (Abdi & Fekri), App. B (proof of Lemma 3 / eq. (3)), with ``kappa = ||g||_inf`` (2).

    Parameters
    ----------
    g : the gradient block, array-like of shape (n,), finite.
    delta : quantization step Delta (= 1/M), > 0.
    """
    g = _checks.vector("g", g)
    delta = _checks.positive("delta", delta)
    return float(np.max(np.abs(g)) ** 2 * g.size * delta**2 / 12.0)


def variance_bound(n: int, delta: float, second_moment: float, sg_variance: float) -> float:
    """Lemma 3 P2: ``E||g_tilde - grad L||^2 <= (n Delta^2 / 12) E||g||^2 + E||g - grad L||^2``.

    Source: DQSG/NDQSG (Abdi & Fekri), Lemma 3.

    Parameters
    ----------
    n : gradient length. delta : step Delta. second_moment : ``E||g||^2``. sg_variance : ``E||g - grad L||^2``.
    """
    n = _checks.integer("n", n, minimum=1)
    delta = _checks.positive("delta", delta)
    second_moment = _checks.nonnegative("second_moment", second_moment)
    sg_variance = _checks.nonnegative("sg_variance", sg_variance)
    return n * delta**2 / 12.0 * second_moment + sg_variance


def excess_variance_bound(n: int, delta: float, sg_variance: float, grad_linf: float, partitions: int = 1) -> float:
    """Excess variance of DQSG under the Gaussian SG-noise model, with ``K`` equal partitions::

        (Delta^2 / 6) [2 ln(sqrt(2) n / K) E||g - grad L||^2 + n ||grad L||_inf^2]

    Source: DQSG/NDQSG (Abdi & Fekri), eq. (4); with ``K = 1`` it is eq. (3):
    ``(Delta^2/3) ln(sqrt(2) n) E||g - grad L||^2 + (n Delta^2/6) ||grad L||_inf^2``.

    Parameters
    ----------
    n : gradient length. delta : step. sg_variance : ``E||g - grad L||^2`` (>= 0).
    grad_linf : ``||grad L||_inf`` (>= 0). partitions : K, integer in ``[1, n]``.
    """
    n = _checks.integer("n", n, minimum=1)
    partitions = _checks.integer("partitions", partitions, minimum=1, maximum=n)
    delta = _checks.positive("delta", delta)
    sg_variance = _checks.nonnegative("sg_variance", sg_variance)
    grad_linf = _checks.nonnegative("grad_linf", grad_linf)
    return delta**2 / 6.0 * (2.0 * math.log(math.sqrt(2.0) * n / partitions) * sg_variance + n * grad_linf**2)


def second_moment_factor(n: int, delta: float) -> float:
    """``E||g_tilde||^2 <= (1 + n Delta^2 / 12) E||g||^2`` (DQSG/NDQSG (Abdi & Fekri), Sec. 3.1 and App. C)."""
    n = _checks.integer("n", n, minimum=1)
    delta = _checks.positive("delta", delta)
    return 1.0 + n * delta**2 / 12.0


def sum_uniform_moment(order: int, terms: int, delta: float) -> float:
    """``E[(u_1 + ... + u_terms)^order]`` for i.i.d. ``u_j ~ U[-Delta/2, Delta/2]`` (exact, from the uniform's
    moments ``E[u^j] = (Delta/2)^j / (j + 1)`` for even j and 0 for odd j, convolved term by term).

    Parameters
    ----------
    order : moment order >= 0. terms : number of uniforms summed, >= 0. delta : the step Delta > 0.
    """
    order = _checks.integer("order", order, minimum=0)
    terms = _checks.integer("terms", terms, minimum=0)
    delta = _checks.positive("delta", delta)
    one = [(delta / 2.0) ** j / (j + 1) if j % 2 == 0 else 0.0 for j in range(order + 1)]
    acc = [1.0] + [0.0] * order  # moments of an empty sum (the constant 0)
    for _ in range(terms):
        acc = [sum(math.comb(m, j) * acc[j] * one[m - j] for j in range(m + 1)) for m in range(order + 1)]
    return acc[order]


def half_dither_error_moment(order: int, k: int, delta: float) -> float:
    """``E[eps^order]`` of the half-dithered error ``eps = x - Q(x + u)`` with the dither ``u`` a sum of ``k``
    i.i.d. ``U[-Delta/2, Delta/2]``, for ``1 <= order <= k``: independent of x, and equal to the moment of a sum
    of ``k + 1`` such uniforms (the rounding error of ``x + u`` is then uniform and independent of ``u``'s first
    k moments; Gray & Stockham, *Dithered quantizers*, IEEE Trans. Inf. Theory 1993, Theorem 2). So
    ``E[eps^2] = (k + 1) Delta^2 / 12`` for ``k >= 2`` and every odd moment is 0.

    Source: DQSG/NDQSG (Abdi & Fekri), Sec. 2.1.1, which prints "the k-th moment ... (k + 1) Delta^2 / 12": that
    value is the second moment, and only for k >= 2 (with one uniform, k = 1, the second moment is
    ``Delta^2 f (1 - f)`` and depends on x's position f in its cell); see :func:`printed_half_dither_moment`.

    Raises
    ------
    ValueError : ``order`` outside ``1..k`` (the moment then depends on x).
    """
    k = _checks.integer("k", k, minimum=1)
    order = _checks.integer("order", order, minimum=1, maximum=k)
    return sum_uniform_moment(order, k + 1, delta)


def printed_half_dither_moment(k: int, delta: float) -> float:
    """The paper's statement as printed: "the k-th moment of the quantization error ... ``E[eps^k | x] = E[eps^k]
    = (k + 1) Delta^2 / 12``" for a dither summing k uniforms (DQSG/NDQSG (Abdi & Fekri), Sec. 2.1.1). A misprint:
    :func:`half_dither_error_moment` gives the k-th moment (0 for odd k, ``(k + 1) Delta^2 / 12`` only for the
    second moment at k >= 2). Kept so the validation can show the disagreement as measured."""
    k = _checks.integer("k", k, minimum=1)
    delta = _checks.positive("delta", delta)
    return (k + 1) * delta**2 / 12.0


def theorem5_variance(n: int, delta: float, variance: float, grad_bound: float) -> float:
    """``sigma^2 = V (1 + n Delta^2 / 12) + n B^2 Delta^2 / 12``: the variance of the dithered gradient of one worker.

    Source: DQSG/NDQSG (Abdi & Fekri), Theorem 5 and App. D. The quantization adds ``n Delta^2 kappa^2 / 12`` with
    ``kappa = ||g||_inf <= ||g||``, and ``E||g||^2 <= V + ||grad L||^2 <= V + B^2``: the paper prints ``n B
    Delta^2 / 12``, which holds only when B bounds ``||grad L||^2`` (its Theorem 5 states ``||grad L|| <= B``); here
    B is the bound on the gradient's norm and enters squared.

    Parameters
    ----------
    n : dimension >= 1. delta : Delta > 0. variance : V >= 0, ``E||g_p - grad L||^2 <= V``. grad_bound : B >= 0.
    """
    n = _checks.integer("n", n, minimum=1)
    delta = _checks.positive("delta", delta)
    variance = _checks.nonnegative("variance", variance)
    grad_bound = _checks.nonnegative("grad_bound", grad_bound)
    return variance * (1.0 + n * delta**2 / 12.0) + n * grad_bound**2 * delta**2 / 12.0


def theorem5_step(radius: float, sigma2: float, workers: int, steps: int, smoothness: float) -> float:
    """The step size of App. D: ``eta = 1 / (l + 1/gamma)`` with ``gamma = R / (sigma / sqrt(P)) sqrt(2 / T)``
    (Bubeck, *Convex Optimization: Algorithms and Complexity*, 2015, Sec. 6.1, Theorem 6.3).

    Source: DQSG/NDQSG (Abdi & Fekri), App. D. ``sigma2 = 0`` gives ``1 / l``."""
    radius = _checks.positive("radius", radius)
    sigma2 = _checks.nonnegative("sigma2", sigma2)
    workers = _checks.integer("workers", workers, minimum=1)
    steps = _checks.integer("steps", steps, minimum=1)
    smoothness = _checks.positive("smoothness", smoothness)
    if sigma2 == 0.0:
        return 1.0 / smoothness
    gamma = radius / math.sqrt(sigma2 / workers) * math.sqrt(2.0 / steps)
    return 1.0 / (smoothness + 1.0 / gamma)


def theorem5_gap_bound(radius: float, sigma2: float, workers: int, steps: int, smoothness: float) -> float:
    """``E[L(mean of w_1..w_T)] - L(w*) <= R sqrt(2 sigma^2 / (P T)) + l R^2 / T``: projected SGD on a convex,
    l-smooth L over a convex set of radius R (around w_0) with the step of :func:`theorem5_step` and the average
    of P workers' dithered gradients, each of variance ``sigma^2`` (:func:`theorem5_variance`).

    Source: DQSG/NDQSG (Abdi & Fekri), Theorem 5 and App. D (Bubeck 2015, Theorem 6.3)."""
    radius = _checks.positive("radius", radius)
    sigma2 = _checks.nonnegative("sigma2", sigma2)
    workers = _checks.integer("workers", workers, minimum=1)
    steps = _checks.integer("steps", steps, minimum=1)
    smoothness = _checks.positive("smoothness", smoothness)
    return radius * math.sqrt(2.0 * sigma2 / (workers * steps)) + smoothness * radius**2 / steps


def nesting_ratio(delta1: float, delta2: float) -> int:
    """The integer ``k = Delta2 / Delta1 > 1`` of a nested pair (DQSG/NDQSG (Abdi & Fekri), Sec. 2.2)."""
    delta1 = _checks.positive("delta1", delta1)
    delta2 = _checks.positive("delta2", delta2)
    ratio = delta2 / delta1
    k = round(ratio)
    if k < 2 or abs(ratio - k) > 1e-9 * ratio:
        raise ValueError(
            f"delta2/delta1 must be an integer > 1 for nested quantizers, got {delta2:g}/{delta1:g} = {ratio:g}"
        )
    return int(k)


def _check_alpha(alpha: object) -> float:
    return _checks.real("alpha", alpha, low=0.0, high=1.0, low_open=True)


def nested_encode(x: ArrayLike, u: ArrayLike, delta1: float, delta2: float, alpha: float = 1.0) -> ArrayLike:
    """Nested dithered encoder: ``t = alpha x + u``, ``s = Q1(t) - Q2(t)``.

    Source: DQSG/NDQSG (Abdi & Fekri), eq. (6). ``s`` is returned as a value (a multiple of Delta1 with
    ``|s| <= Delta2/2``); the index sent is ``s / Delta1``, one of ``Delta2/Delta1`` symbols.

    Parameters
    ----------
    x : values to send (float or array). u : dither, ``U[-Delta1/2, Delta1/2]``, same shape.
    delta1, delta2 : fine and coarse steps, ``Delta2 = k Delta1`` with integer ``k > 1``.
    alpha : shrinkage factor in (0, 1].
    """
    nesting_ratio(delta1, delta2)
    alpha = _check_alpha(alpha)
    t = alpha * np.asarray(x, dtype=np.float64) + np.asarray(u, dtype=np.float64)
    return quantize(t, delta1) - quantize(t, delta2)


def nested_decode(
    s: ArrayLike, u: ArrayLike, y: ArrayLike, delta1: float, delta2: float, alpha: float = 1.0
) -> ArrayLike:
    """Nested decoder with side information ``y``: ``r = s - u - alpha y``, ``x_hat = y + alpha (r - Q2(r))``.

    Source: DQSG/NDQSG (Abdi & Fekri), eq. (7). Worked example (Fig. 3): ``Delta1 = 1, Delta2 = 3, alpha = 1,
    x = -4.2, u = 0.3`` encodes to ``s = -1`` and decodes with ``y = -3.4`` to ``x_hat = -4.3``.
    """
    nesting_ratio(delta1, delta2)
    alpha = _check_alpha(alpha)
    r = np.asarray(s, dtype=np.float64) - np.asarray(u, dtype=np.float64) - alpha * np.asarray(y, dtype=np.float64)
    return np.asarray(y, dtype=np.float64) + alpha * (r - quantize(r, delta2))


def _check_nested(delta1: object, delta2: object, alpha: object, sigma_z: object) -> tuple[float, float, float, float]:
    d1, d2 = _checks.positive("delta1", delta1), _checks.positive("delta2", delta2)
    nesting_ratio(d1, d2)
    return (
        d1,
        d2,
        _check_alpha(alpha),
        _checks.nonnegative("sigma_z", sigma_z),
    )


def nested_safe_radius(delta1: float, delta2: float, alpha: float = 1.0) -> float:
    """Noise radius below which nested decoding never fails: ``|z| < (Delta2 - Delta1) / (2 alpha)`` gives p = 0.

    Source: DQSG/NDQSG (Abdi & Fekri), Theorem 6 (after (8)).
    """
    nesting_ratio(delta1, delta2)
    alpha = _check_alpha(alpha)
    return (float(delta2) - float(delta1)) / (2.0 * alpha)


def nested_failure_bound(delta1: float, delta2: float, alpha: float, sigma_z: float) -> float:
    """Theorem 6 bound on the per-element decoding-failure probability::

        p = Pr(|alpha z + u| > Delta2/2) <= Delta1^2 / (3 Delta2^2) + 4 alpha^2 sigma_z^2 / Delta2^2

    Source: DQSG/NDQSG (Abdi & Fekri), Theorem 6, eq. (8) (Chebyshev on ``alpha z + u``; holds for any z with
    ``E z^2 = sigma_z^2``). May exceed 1, in which case it says nothing.
    """
    delta1, delta2, alpha, sigma_z = _check_nested(delta1, delta2, alpha, sigma_z)
    return delta1**2 / (3.0 * delta2**2) + 4.0 * alpha**2 * sigma_z**2 / delta2**2


def _integrated_sf(x: float) -> float:
    """``G(x) = x Phi_bar(x) - phi(x)``, an antiderivative of the normal survival function ``Phi_bar``."""
    return x * stats.norm.sf(x) - stats.norm.pdf(x)


def nested_failure_probability(delta1: float, delta2: float, alpha: float, sigma_z: float) -> float:
    """Exact decoding-failure probability ``Pr(|alpha z + u| > Delta2/2)`` for Gaussian ``z ~ N(0, sigma_z^2)``
    and ``u ~ U[-Delta1/2, Delta1/2]`` independent.

    Source: DQSG/NDQSG (Abdi & Fekri), Theorem 6 / App. E define p; this evaluates it in closed form. With
    ``s = alpha sigma_z``, ``a = Delta2/2`` and ``G(x) = x Phi_bar(x) - phi(x)`` (``G' = Phi_bar``)::

        p = 2 Pr(alpha z + u > a) = (2 s / Delta1) [G((a + Delta1/2)/s) - G((a - Delta1/2)/s)]

    and ``p = 0`` when ``s = 0`` (then ``|u| <= Delta1/2 < Delta2/2``).
    """
    delta1, delta2, alpha, sigma_z = _check_nested(delta1, delta2, alpha, sigma_z)
    s = alpha * sigma_z
    if s == 0.0:
        return 0.0
    a = delta2 / 2.0
    hi = (a + delta1 / 2.0) / s
    lo = (a - delta1 / 2.0) / s
    p = 2.0 * s / delta1 * (_integrated_sf(hi) - _integrated_sf(lo))
    return float(min(max(p, 0.0), 1.0))


def nested_error_variance(delta1: float, alpha: float, sigma_z: float) -> float:
    """Per-element error variance of NDQSG when decoding succeeds: ``alpha^2 Delta1^2/12 + (1 - alpha^2)^2 sigma_z^2``.

    Source: DQSG/NDQSG (Abdi & Fekri), eq. (9) and App. E.
    """
    delta1 = _checks.positive("delta1", delta1)
    alpha = _check_alpha(alpha)
    sigma_z = _checks.nonnegative("sigma_z", sigma_z)
    return alpha**2 * delta1**2 / 12.0 + (1.0 - alpha**2) ** 2 * sigma_z**2


def nested_alphas(delta1: float, sigma_z: float) -> tuple[float, float | None]:
    """The two shrinkage factors that give the variance of dithered quantization with step Delta1 in (9):
    ``alpha = 1`` and ``alpha = sqrt(1 - Delta1^2 / (12 sigma_z^2))``.

    Source: DQSG/NDQSG (Abdi & Fekri), remark after (9). The second exists only when
    ``Delta1^2 < 12 sigma_z^2``; otherwise it is returned as None.

    Returns
    -------
    (1.0, alpha_2 or None)
    """
    delta1 = _checks.positive("delta1", delta1)
    sigma_z = _checks.nonnegative("sigma_z", sigma_z)
    if delta1**2 >= 12.0 * sigma_z**2:
        return 1.0, None
    return 1.0, math.sqrt(1.0 - delta1**2 / (12.0 * sigma_z**2))

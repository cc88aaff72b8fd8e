"""Unbiased random sparsification (Wangni et al. 2018): variance for given keep probabilities and the optimal
probabilities for a target density.

Source: Wangni, Wang, Liu & Zhang 2018, *Gradient Sparsification for Communication-Efficient Distributed
Optimization*, as used in QCS (Abdi & Fekri) (Fig. 3 and Sec. 2): coordinate ``i`` is kept with probability
``p_i`` and sent as ``g_i / p_i``, so the estimate is unbiased with variance ``sum_i g_i^2 (1/p_i - 1)``.
Minimising that variance at an expected density ``sum_i p_i = rho d`` gives the thresholded form
``p_i = min(1, |g_i| / lambda)`` (the closed form of Wangni et al., Sec. 3), ``lambda`` set by the density.
"""

from __future__ import annotations

import numpy as np

from gradstat.theory import _checks

__all__ = ["variance", "optimal_probabilities"]


def variance(g: np.ndarray, p: np.ndarray) -> float:
    """``E||g_hat - g||^2 = sum_i g_i^2 (1/p_i - 1)`` of unbiased random sparsification.

    Coordinates with ``g_i = 0`` contribute 0 whatever ``p_i`` (including 0).

    Parameters
    ----------
    g : gradient, shape (d,), finite.
    p : keep probabilities, shape (d,), in (0, 1] wherever ``g_i != 0`` and in [0, 1] elsewhere.
    """
    g = _checks.vector("g", g)
    p = _checks.vector("p", p)
    if p.shape != g.shape:
        raise ValueError(f"p must have the shape of g {g.shape}, got {p.shape}")
    if np.any((p < 0) | (p > 1)):
        raise ValueError(f"p must lie in [0, 1], got range [{p.min():g}, {p.max():g}]")
    live = g != 0
    if np.any(p[live] == 0):
        raise ValueError("p must be > 0 wherever g is nonzero (an unbiased estimate must be able to keep it)")
    return float(np.sum(g[live] ** 2 * (1.0 / p[live] - 1.0)))


def optimal_probabilities(g: np.ndarray, density: float) -> tuple[np.ndarray, float]:
    """Keep probabilities of least variance at expected density ``density``: ``p_i = min(1, |g_i| / lambda)``.

    Source: Wangni et al. 2018, Sec. 3 (closed form by thresholding ``|g_i| / lambda``). ``lambda`` solves
    ``sum_i min(1, |g_i|/lambda) = density * d``: with magnitudes sorted in decreasing order ``a_1 >= a_2 >= ...``
    and ``j`` the number of saturated coordinates (``p = 1``), ``lambda = (sum_{i > j} a_i) / (density d - j)`` for
    the smallest ``j`` with ``a_{j+1} <= lambda``. Vectorised, O(d log d).

    Parameters
    ----------
    g : gradient, shape (d,), finite, not all zero.
    density : target expected fraction of coordinates kept, in (0, 1]; ``density * d`` must not exceed the number
        of nonzero coordinates (zeros are never kept).

    Returns
    -------
    (p, lambda) : probabilities of shape (d,) summing to ``density * d``, and the threshold (units of ``g``).
    """
    g = _checks.vector("g", g, nonzero=True)
    density = _checks.real("density", density, low=0.0, high=1.0, low_open=True)
    d = g.size
    budget = density * d
    a = np.sort(np.abs(g))[::-1]
    nnz = int(np.count_nonzero(a))
    if budget > nnz * (1 + 1e-12):
        raise ValueError(
            f"density must be <= nonzero fraction {nnz / d:g} of g (zeros are never kept), got {density:g}"
        )
    if budget >= nnz:  # every nonzero coordinate kept with certainty
        return (g != 0).astype(np.float64), float(a[nnz - 1])
    tail = np.cumsum(a[::-1])[::-1]  # tail[j] = sum_{i >= j} a_i (0-based)
    js = np.arange(int(np.floor(budget)) + 1)
    ok = a[js] * (budget - js) <= tail[js] * (1 + 1e-12)
    j = int(js[np.argmax(ok)])
    lam = tail[j] / (budget - j)
    return np.minimum(1.0, np.abs(g) / lam), float(lam)

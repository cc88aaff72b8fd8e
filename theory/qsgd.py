"""QSGD's stochastic quantizer (and TernGrad, its M = 1 case): per-element variance and Lemma 3.1's bound.

Sources: Alistarh et al. 2017, *QSGD*, Lemma 3.1, as quoted in QCS (Abdi & Fekri) (discussion of Fig. 3);
the quantizer (1) and its variance in DQSG/NDQSG (Abdi & Fekri), Sec. 2.1.1 and Lemma 2.

The quantizer with ``M`` levels per sign maps ``x_i`` (scaled by ``scale``, so that ``|x_i| / scale <= 1``) to
``sign(x_i) l/M`` or ``sign(x_i) (l+1)/M`` (times ``scale``) with the probabilities of (1). QSGD scales by the l2
norm; TernGrad and 002's Lemma 2 by the l_inf norm.
"""

from __future__ import annotations

import math

import numpy as np

from gradstat.theory import _checks

__all__ = [
    "NORMS",
    "variance_bound",
    "element_variance",
    "total_variance",
    "terngrad_variance",
    "uniform_average_variance",
    "dithered_average_variance",
]

NORMS = ("l2", "linf")


def variance_bound(n: int, s: int) -> float:
    """QSGD variance factor: ``E||Q_s(v) - v||^2 <= min(n / s^2, sqrt(n) / s) ||v||^2`` (l2 scaling).

    Source: Alistarh et al. 2017, Lemma 3.1 (quoted in QCS (Abdi & Fekri), Fig. 3 discussion).
    """
    n = _checks.integer("n", n, minimum=1)
    s = _checks.integer("s", s, minimum=1)
    return min(n / s**2, math.sqrt(n) / s)


def element_variance(x: np.ndarray, M: int, scale: float) -> np.ndarray:
    """Per-element variance of the M-level stochastic quantizer::

        scale^2 (r - l/M) ((l+1)/M - r),   r = |x| / scale in [l/M, (l+1)/M]

    Source: DQSG/NDQSG (Abdi & Fekri), Sec. 2.1.1, eq. (1) and the variance display after Lemma 2. It lies in
    ``[0, scale^2 / (4 M^2)]``.

    Parameters
    ----------
    x : values, array-like, finite, with ``|x| <= scale``.
    M : levels per sign, integer >= 1 (TernGrad: 1).
    scale : the normaliser (``||v||_2`` for QSGD, ``||v||_inf`` for TernGrad), > 0.

    Returns
    -------
    ndarray of the same shape as ``x``, in squared units of ``x``.
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("x must be finite")
    M = _checks.integer("M", M, minimum=1)
    scale = _checks.positive("scale", scale)
    r = np.abs(x) / scale
    if np.any(r > 1.0 + 1e-12):
        raise ValueError(f"|x| must be <= scale={scale:g}; got max |x| = {np.abs(x).max():g}")
    r = np.minimum(r, 1.0)
    lo = np.minimum(np.floor(r * M), M - 1) / M
    return scale**2 * (r - lo) * (lo + 1.0 / M - r)


def total_variance(v: np.ndarray, M: int, norm: str = "l2") -> float:
    """Exact ``E[||Q(v) - v||^2 | v]`` of the stochastic quantizer scaled by the chosen norm of ``v``.

    Source: DQSG/NDQSG (Abdi & Fekri), Sec. 2.1.1 (per-element variance summed); with ``norm="l2"`` this is the
    quantity Alistarh et al. bound in Lemma 3.1 (see :func:`variance_bound`).

    Parameters
    ----------
    v : vector, array-like of shape (n,), finite, not all zero.
    M : levels per sign (QSGD's s).
    norm : ``"l2"`` (QSGD) or ``"linf"`` (TernGrad, 002's Lemma 2).
    """
    v = _checks.vector("v", v, nonzero=True)
    norm = _checks.choice("norm", norm, NORMS)
    scale = float(np.linalg.norm(v)) if norm == "l2" else float(np.max(np.abs(v)))
    return float(element_variance(v, M, scale).sum())


def terngrad_variance(v: np.ndarray) -> float:
    """TernGrad's ``E[||tern(v) - v||^2 | v] = sum_i |v_i| (||v||_inf - |v_i|)``: the M = 1, l_inf case.

    Source: DQSG/NDQSG (Abdi & Fekri), Sec. 2.1.1 (TernGrad is the stochastic quantizer with M = 1).
    """
    return total_variance(v, 1, norm="linf")


def uniform_average_variance(M: int) -> float:
    """Average per-element variance of the stochastic quantizer for ``x`` uniform on ``[-1, 1]``: ``1/(6 M^2)``.

    Source: DQSG/NDQSG (Abdi & Fekri), Sec. 2.1.1 (twice the dithered ``Delta^2/12`` with ``Delta = 1/M``).
    """
    M = _checks.integer("M", M, minimum=1)
    return 1.0 / (6.0 * M**2)


def dithered_average_variance(M: int) -> float:
    """Per-element error variance of (subtractive) dithered quantization with ``Delta = 1/M``: ``Delta^2/12``.

    Source: DQSG/NDQSG (Abdi & Fekri), Theorem 1 (Schuchman) and Lemma 3.
    """
    M = _checks.integer("M", M, minimum=1)
    return 1.0 / (12.0 * M**2)

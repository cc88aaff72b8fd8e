"""Top-k sparsification: contraction factor, exact best-k error, and the compressibility power law.

Sources: SIDCo, ``SIDCo (Abdelmoniem et al.)``: Definition 1 eq. (1) (sorted magnitudes ``g~_j <= c1 j^-p``,
``p > 1/2``), eq. (2) (best-k error ``sigma_k(g) = ||g - T_k{g}||_2 <= c2 k^(1/2 - p)``) and App. C eq. (42)
(``E||T_k{g} - g||^2 <= (1 - delta) E||g||^2``, ``delta = k/d``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gradstat.theory import _checks

__all__ = [
    "topk_contraction",
    "best_k_error",
    "PowerLawFit",
    "fit_magnitude_decay",
    "fit_best_k_decay",
    "envelope_constant",
]


def topk_contraction(k: int, d: int) -> float:
    """Contraction factor of Top-k: ``||g - T_k{g}||^2 <= (1 - k/d) ||g||^2`` for every g.

    Source: SIDCo (Abdelmoniem et al.), App. C eq. (42) (the d - k smallest squares average at most the mean).
    """
    d = _checks.integer("d", d, minimum=1)
    k = _checks.integer("k", k, minimum=0, maximum=d)
    return 1.0 - k / d


def best_k_error(g: np.ndarray, k: int | np.ndarray | None = None) -> float | np.ndarray:
    """Exact best-k (Top-k) approximation error ``sigma_k(g) = ||g - T_k{g}||_2``.

    Source: SIDCo (Abdelmoniem et al.), eq. (2) (definition of ``sigma_k``).

    Parameters
    ----------
    g : vector, shape (d,), finite.
    k : one k in ``[0, d]``, an integer array of them, or None for all ``k = 0..d``.

    Returns
    -------
    float for a scalar k, else ndarray (shape of k, or (d+1,) for None), in units of g.
    """
    g = _checks.vector("g", g)
    d = g.size
    sq = np.sort(g * g)  # ascending: dropping the k largest leaves the first d - k
    kept_out = np.concatenate(([0.0], np.cumsum(sq)))  # kept_out[m] = sum of the m smallest squares
    if k is None:
        ks = np.arange(d + 1)
    else:
        ks = np.asarray(k)
        if not np.issubdtype(ks.dtype, np.integer):
            raise TypeError(f"k must be an integer or integer array, got dtype {ks.dtype}")
        if np.any((ks < 0) | (ks > d)):
            raise ValueError(f"k must lie in [0, d={d}], got range [{ks.min()}, {ks.max()}]")
    err = np.sqrt(kept_out[d - ks])
    return float(err) if np.ndim(err) == 0 else err


@dataclass(frozen=True)
class PowerLawFit:
    """Least-squares fit of ``log y = log c - slope * log j`` on log-spaced ranks.

    Attributes
    ----------
    p : the decay exponent of Definition 1 (for the best-k fit, recovered from ``slope = p - 1/2``).
    c : the constant (``c1`` for magnitudes, ``c2`` for best-k errors) of the fitted line (not an envelope;
        see :func:`envelope_constant`).
    r2 : coefficient of determination of the log-log fit.
    n_points : ranks used in the fit.
    compressible : ``p > 1/2`` (Definition 1).
    """

    p: float
    c: float
    r2: float
    n_points: int

    @property
    def compressible(self) -> bool:
        return self.p > 0.5


def _log_ranks(lo: int, hi: int, points: int) -> np.ndarray:
    """Distinct integer ranks in ``[lo, hi]``, log-spaced, at most ``points`` of them."""
    return np.unique(np.round(np.geomspace(lo, hi, num=min(points, hi - lo + 1))).astype(np.int64))


def _loglog_fit(ranks: np.ndarray, values: np.ndarray) -> tuple[float, float, float]:
    x, y = np.log(ranks), np.log(values)
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    ss = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid**2)) / ss if ss > 0 else 1.0
    return float(slope), float(intercept), r2


def _rank_range(name: str, rank_range: tuple[int, int] | None, top: int) -> tuple[int, int]:
    if rank_range is None:
        return 1, top
    lo = _checks.integer(f"{name}[0]", rank_range[0], minimum=1)
    hi = _checks.integer(f"{name}[1]", rank_range[1], minimum=lo + 1, maximum=top)
    return lo, hi


def fit_magnitude_decay(g: np.ndarray, rank_range: tuple[int, int] | None = None, points: int = 256) -> PowerLawFit:
    """Fit the power law ``g~_j = c1 j^-p`` of Definition 1 to the sorted magnitudes of ``g``.

    Source: SIDCo (Abdelmoniem et al.), Definition 1, eq. (1); App. B.1 / Fig. 7(a) for its use on gradients.
    The line is fitted by least squares in log-log coordinates on ``points`` log-spaced ranks (so every decade
    of ranks weighs the same), over nonzero magnitudes only.

    Parameters
    ----------
    g : vector, shape (d,), finite, with at least 2 nonzero elements.
    rank_range : (first, last) ranks (1-based, inclusive) to fit; default all nonzero ranks.
    points : number of log-spaced ranks, >= 2.
    """
    g = _checks.vector("g", g)
    points = _checks.integer("points", points, minimum=2)
    mags = np.sort(np.abs(g))[::-1]
    nnz = int(np.count_nonzero(mags))
    if nnz < 2:
        raise ValueError(f"g must have at least 2 nonzero elements to fit a decay, got {nnz}")
    lo, hi = _rank_range("rank_range", rank_range, nnz)
    ranks = _log_ranks(lo, hi, points)
    slope, intercept, r2 = _loglog_fit(ranks, mags[ranks - 1])
    return PowerLawFit(p=-slope, c=math.exp(intercept), r2=r2, n_points=int(ranks.size))


def fit_best_k_decay(g: np.ndarray, rank_range: tuple[int, int] | None = None, points: int = 256) -> PowerLawFit:
    """Fit ``sigma_k(g) = c2 k^(1/2 - p)`` of eq. (2) to the exact best-k errors; returns p and c2.

    Source: SIDCo (Abdelmoniem et al.), eq. (2); App. B.1 / Fig. 7(b). Log-log least squares on log-spaced k
    where ``sigma_k > 0``. For a finite vector ``sigma_k`` drops to 0 at ``k = nnz``, bending the curve near
    the end; restrict ``rank_range`` (e.g. ``(1, d // 10)``) to fit the power-law part. Default: ``1..nnz-1``.

    Parameters
    ----------
    g : vector, shape (d,), finite, with at least 3 nonzero elements.
    rank_range : (first, last) k to fit; default ``(1, nnz - 1)``.
    points : number of log-spaced k, >= 2.
    """
    g = _checks.vector("g", g)
    points = _checks.integer("points", points, minimum=2)
    nnz = int(np.count_nonzero(g))
    if nnz < 3:
        raise ValueError(f"g must have at least 3 nonzero elements to fit a decay, got {nnz}")
    lo, hi = _rank_range("rank_range", rank_range, nnz - 1)
    ks = _log_ranks(lo, hi, points)
    slope, intercept, r2 = _loglog_fit(ks, np.asarray(best_k_error(g, ks)))
    return PowerLawFit(p=0.5 - slope, c=math.exp(intercept), r2=r2, n_points=int(ks.size))


def envelope_constant(g: np.ndarray, p: float) -> float:
    """Smallest ``c1`` with ``g~_j <= c1 j^-p`` for every rank j: ``max_j g~_j j^p``.

    Source: SIDCo (Abdelmoniem et al.), Definition 1, eq. (1) (the bound form of the power law).
    """
    g = _checks.vector("g", g)
    p = _checks.real("p", p)
    mags = np.sort(np.abs(g))[::-1]
    return float(np.max(mags * np.arange(1, g.size + 1, dtype=np.float64) ** p))

"""Generalized Pareto fits of |g| (or of peak-over-threshold exceedances): moment matching and the exact MLE.

Moment matching is SIDCo 001_ac87256369ec7547.txt, Cor. 1.3 (29)/(35) and Lemma 2 (8)-(9):
alpha = (1 - mu^2 / var) / 2, beta = mu (mu^2 / var + 1) / 2 (scipy's c = alpha). It needs a finite variance
(alpha < 1/2), and the sample variance only settles when the fourth moment is finite (alpha < 1/4), hence the
warning above 1/4.

The exact MLE ("there are no closed-form ML estimators", SIDCo B.3.2) is computed by Grimshaw's (1993)
reduction to one dimension: with theta = alpha / beta, the likelihood maximised over alpha for fixed theta is at
alpha(theta) = mean(log(1 + theta y)), which leaves the profile log-likelihood per observation
l(theta) = -log(alpha(theta) / theta) - alpha(theta) - 1 on theta > -1 / max(y). It is maximised by a vectorised
evaluation of l on a grid of theta over a strided subsample (the start), then by safeguarded Newton steps on all
the data (closed-form first and second derivatives, backtracking, alpha > -1 kept, where the MLE exists), all in
torch float64 on the data's device.
"""

from __future__ import annotations

import math

import torch

from gradstat.theory.estimators.estimate import Estimate
from gradstat.theory.estimators.exceedances import Exceedances, noise_floor

MM_RELIABLE_SHAPE = 0.25
MM_WARNING = "moment matching is unreliable for shape >= 1/4 (infinite 4th moment)"
MLE_MAX_ITER = 60
MLE_TOLERANCE = 1e-10
"""Newton stops when a step changes theta by less than MLE_TOLERANCE * (|theta| + 1e-3) (normalised data)."""
BOUNDARY_WARNING = (
    "no generalized Pareto MLE: the likelihood grows without bound as shape -> -1 (bounded or "
    "tied data); the returned shape is the boundary -1"
)
NEAR_CONSTANT_WARNING = (
    "the data are constant within the rounding of the reductions (variance at or below {floor:.2g} mean^2): the "
    "generalized Pareto shape is not identifiable; mean^2 / var clipped at {ratio:.3g}, not converged"
)
_BOUNDARY = 1e-6
_GRID_SAMPLE = 8192
_THETA_FLOOR = 1e-7  # |theta| (normalised) kept above this: the profile has a removable singularity at 0


def moment_matching(data: Exceedances) -> Estimate:
    """SIDCo (35) / (8)-(9): alpha = (1 - mu^2/var)/2, beta = mu (mu^2/var + 1)/2 from the sample mean and
    variance (n - 1 divisor) of the used values.

    A variance within the rounding of the reductions (constant or near-constant data) is degenerate: mu^2 / var is
    clipped at 1 / floor (a very negative, finite shape whose upper end point is just above the mean),
    ``converged`` is false and a flag says so. Computed on normalised values: the shape is invariant and the
    scale equivariant under scaling."""
    floor = noise_floor(data.x.dtype)
    mu = data.mean()
    var = data.var()
    degenerate = ~(var > floor * mu * mu)  # also catches NaN
    ratio = torch.where(degenerate, torch.full_like(mu, 1.0 / floor), mu * mu / torch.where(degenerate, mu, var))
    shape = 0.5 * (1.0 - ratio)
    scale = 0.5 * mu * (ratio + 1.0) * data.unit
    return Estimate(
        params={"shape": shape, "scale": scale},
        converged=~degenerate,
        flags=[
            (shape >= MM_RELIABLE_SHAPE, MM_WARNING),
            (degenerate, NEAR_CONSTANT_WARNING.format(floor=floor, ratio=1.0 / floor)),
        ],
        degenerate=degenerate,
    )


def _profile(y: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Profile log-likelihood per observation l(theta) for each theta (shape (K,)) over y (shape (n,))."""
    k = torch.log1p(theta[:, None] * y[None, :]).mean(dim=1)
    ell = -torch.log(k / theta) - k - 1.0
    return torch.where(k > -1.0, ell, torch.full_like(ell, -math.inf))


def _sums(y: torch.Tensor, theta: float) -> tuple[float, float, float]:
    """alpha(theta) = mean log(1 + theta y) and its derivatives' ingredients m1 = mean y/(1 + theta y),
    m2 = mean (y/(1 + theta y))^2, read back as floats (one synchronisation)."""
    t = theta * y
    w = y / (1.0 + t)
    k, m1, m2 = torch.stack([torch.log1p(t).mean(), w.mean(), (w * w).mean()]).tolist()
    return k, m1, m2


def _ell(theta: float, k: float) -> float:
    return -math.log(k / theta) - k - 1.0 if k > -1.0 and k / theta > 0 else -math.inf


def _start(y: torch.Tensor, y_max: float) -> float:
    """Best theta of a grid, evaluated on a strided subsample in one vectorised pass."""
    stride = max(1, y.numel() // _GRID_SAMPLE)
    sub = y[::stride]
    pos = torch.logspace(-3, 3, 49, dtype=y.dtype, device=y.device)
    neg = -(1.0 - torch.pow(2.0, -torch.arange(1, 9, dtype=y.dtype, device=y.device))) / y_max
    grid = torch.cat([neg, pos])
    return float(grid[torch.argmax(_profile(sub, grid))])


def _away_from_zero(theta: float, direction: float) -> float:
    if abs(theta) >= _THETA_FLOOR:
        return theta
    return math.copysign(_THETA_FLOOR, direction if direction != 0 else 1.0)


def mle(data: Exceedances) -> Estimate:
    """Exact GP maximum likelihood (location 0) by Grimshaw's profile likelihood in theta = shape / scale.

    Reads the used values (compaction) and synchronises once per Newton iteration; typically 4-8 iterations,
    each one pass over the data. ``converged`` is false when the iteration limit is reached or the maximum sits
    on the boundary alpha -> -1 (no MLE there).
    """
    y = data.values()
    mean = y.mean()
    y = y / mean  # dimensionless theta, mean 1
    y_max = float(y.max())
    lower = -1.0 / y_max
    theta = _away_from_zero(_start(y, y_max), 1.0)
    k, m1, m2 = _sums(y, theta)
    ell = _ell(theta, k)
    converged = False
    iterations = 0
    for iterations in range(1, MLE_MAX_ITER + 1):
        grad = 1.0 / theta - m1 / k - m1
        hess = -1.0 / (theta * theta) + (m2 * k + m1 * m1) / (k * k) + m2
        step = -grad / hess if hess < 0 else math.copysign(0.1 * max(abs(theta), 1e-3), grad)
        accepted = False
        for _ in range(60):  # backtracking: stay in the domain and never decrease the likelihood
            cand = theta + step
            if cand <= lower:
                step = 0.5 * (lower - theta)
                continue
            cand = _away_from_zero(cand, step)
            kc, m1c, m2c = _sums(y, cand)
            ellc = _ell(cand, kc)
            if ellc >= ell - 1e-13 * abs(ell):
                accepted = True
                break
            step *= 0.5
        if not accepted:
            converged = abs(grad) * (abs(theta) + 1e-3) < 1e-8
            break
        small = abs(cand - theta) <= MLE_TOLERANCE * (abs(theta) + 1e-3)
        theta, k, m1, m2, ell = cand, kc, m1c, m2c, ellc
        if small:
            converged = True
            break
    shape = torch.tensor(k, dtype=torch.float64, device=y.device)
    scale = (k / theta) * mean.to(torch.float64) * data.unit
    at_boundary = k <= -1.0 + _BOUNDARY
    return Estimate(
        params={"shape": shape, "scale": scale},
        iterations=iterations,
        converged=converged and not at_boundary,
        flags=[
            (shape <= -0.5, "generalized Pareto MLE shape <= -1/2: the estimator is not regular there"),
            (torch.tensor(at_boundary), BOUNDARY_WARNING),
        ],
    )

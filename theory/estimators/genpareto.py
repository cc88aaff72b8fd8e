"""Generalized Pareto fits of |g| (or of peak-over-threshold exceedances): moment matching and the exact MLE.

Moment matching is SIDCo (Abdelmoniem et al.), Cor. 1.3 (29)/(35) and Lemma 2 (8)-(9):
alpha = (1 - mu^2 / var) / 2, beta = mu (mu^2 / var + 1) / 2 (scipy's c = alpha). It needs a finite variance
(alpha < 1/2), and the sample variance only settles when the fourth moment is finite (alpha < 1/4), hence the
warning above 1/4.

The exact MLE ("there are no closed-form ML estimators", SIDCo B.3.2) is computed by Grimshaw's (1993)
reduction to one dimension: with theta = alpha / beta, the likelihood maximised over alpha for fixed theta is at
alpha(theta) = mean(log(1 + theta y)), which leaves the profile log-likelihood per observation
l(theta) = -log(alpha(theta) / theta) - alpha(theta) - 1 on theta > -1 / max(y). It is maximised by a vectorised
evaluation of l on a grid of theta over a strided subsample (the start), then by safeguarded Newton steps on a
larger strided subsample and finally on all the data (closed-form first and second derivatives, backtracking,
alpha > -1 kept, where the MLE exists), all in torch float64 on the data's device, in cache-sized chunks.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from gradstat.theory import scalars as S
from gradstat.theory.estimators.estimate import Estimate
from gradstat.theory.estimators.exceedances import FLOAT_DTYPES, Exceedances, noise_floor

MM_RELIABLE_SHAPE = 0.25
MM_WARNING = "moment matching is unreliable for shape >= 1/4 (infinite 4th moment)"
MLE_MAX_ITER = 60
MLE_TOLERANCE = 1e-3
"""Newton stops when its step is below MLE_TOLERANCE * (|theta| + 1e-3) (normalised data) and takes that last step:
quadratic convergence leaves an error of the order of the step squared: measured within 2e-5 (shape, absolute; scale,
relative) of a solve to 1e-13, as close as scipy.stats.genpareto.fit comes to it (tests/theory check both)."""
BOUNDARY_WARNING = (
    "no generalized Pareto MLE: the likelihood grows without bound as shape -> -1 (bounded or "
    "tied data); the returned shape is the boundary -1"
)
NEAR_CONSTANT_WARNING = (
    "the data are constant within the rounding of the reductions (variance at or below {floor:.2g} mean^2): the "
    "generalized Pareto shape is not identifiable; mean^2 / var clipped at {ratio:.3g}, not converged"
)
_BOUNDARY = 1e-6
_GRID_SAMPLE = 4096
_NEWTON_SAMPLE = 1 << 16
_SUBSAMPLE_TOLERANCE = 1e-3
_LOG1P_BELOW = 1e-3
_CHUNK = 1 << 16  # float64 elements per chunk of a likelihood pass (256 KiB per buffer: stays in cache)
_THETA_FLOOR = 1e-7  # |theta| (normalised) kept above this: the profile has a removable singularity at 0


_NEAR_CONSTANT_WARNINGS = {
    dtype: NEAR_CONSTANT_WARNING.format(floor=noise_floor(dtype), ratio=1.0 / noise_floor(dtype))
    for dtype in FLOAT_DTYPES
}
"""The warning of a degenerate moment-matching fit per dtype (at its noise floor), written at import: a fit
compiled by torch.compile looks it up instead of tracing a cached function (dynamo warns there)."""


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
    degenerate = S.logical_not(var > floor * mu * mu)  # also catches NaN
    ratio = S.where(degenerate, 1.0 / floor, mu * mu / S.where(degenerate, mu, var))
    shape = 0.5 * (1.0 - ratio)
    scale = 0.5 * mu * (ratio + 1.0) * data.unit
    return Estimate(
        params={"shape": shape, "scale": scale},
        converged=S.logical_not(degenerate),
        flags=[
            (shape >= MM_RELIABLE_SHAPE, MM_WARNING),
            (degenerate, _NEAR_CONSTANT_WARNINGS[data.x.dtype]),
        ],
        degenerate=degenerate,
    )


def _profile(y: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Profile log-likelihood per observation l(theta) for each theta (shape (K,)) over y (shape (n,))."""
    k = torch.log1p(theta[:, None] * y[None, :]).mean(dim=1)
    ell = -torch.log(k / theta) - k - 1.0
    return torch.where(k > -1.0, ell, torch.full_like(ell, -math.inf))


@dataclass
class _Values:
    """The used values as y = (raw - shift) / unit_of_theta in float64, converted chunk by chunk on the fly (no
    full-size float64 copy: a fresh large allocation costs more in page faults than a likelihood pass)."""

    raw: torch.Tensor
    shift: torch.Tensor | None
    denom: torch.Tensor | None  # 0-d float64: the mean of y in the raw units (mean of y about 1); None: y is raw

    def numel(self) -> int:
        return self.raw.numel()

    def convert(self, raw: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """(raw - shift) / denom as float64, clipped at 0 (raw <= shift only by rounding), into ``out``."""
        y = out.copy_(raw) if out is not None else raw.to(torch.float64, copy=True)
        if self.shift is not None:
            y.sub_(self.shift).clamp_min_(0)
        return y.div_(self.denom) if self.denom is not None else y

    def chunks(self, buffer: torch.Tensor) -> Iterator[torch.Tensor]:
        for start in range(0, self.raw.numel(), buffer.numel()):
            raw = self.raw[start : start + buffer.numel()]
            if raw.dtype == torch.float64 and self.shift is None and self.denom is None:
                yield raw
            else:
                yield self.convert(raw, buffer[: raw.numel()])


def _sums(y: _Values | torch.Tensor, theta: float, work: tuple[torch.Tensor, ...]) -> tuple[float, float, float]:
    """alpha(theta) = mean log(1 + theta y) and its derivatives' ingredients m1 = mean y/(1 + theta y),
    m2 = mean (y/(1 + theta y))^2, read back as floats (one synchronisation).

    One pass over y (a float64 tensor, or :class:`_Values` converted on the fly) in chunks the size of the three
    ``work`` buffers (no allocation per pass). log(1 + t) uses torch's log1p when |theta| is small (mean y is 1, so
    alpha(theta) ~ theta and its relative accuracy needs log1p's), else log of the rounded 1 + t, whose absolute
    error of about 1e-16 per element is relatively below 1e-12 of alpha there, and which runs several times faster
    on CPUs (vectorised)."""
    a_buf, b_buf, c_buf = work
    one = torch.ones((), dtype=torch.float64, device=a_buf.device)
    source = y if isinstance(y, _Values) else _Values(y, None, None)
    parts = []
    for chunk in source.chunks(c_buf):
        a, b = a_buf[: chunk.numel()], b_buf[: chunk.numel()]
        if abs(theta) < _LOG1P_BELOW:
            t = torch.mul(chunk, theta, out=a)
            logs = torch.log1p(t, out=b)
            u = t.add_(1.0)
        else:
            u = torch.add(one, chunk, alpha=theta, out=a)  # 1 + theta y
            logs = torch.log(u, out=b)
        w = torch.div(chunk, u, out=a)
        parts.append(torch.stack([logs.sum(), w.sum(), torch.dot(w, w)]))
    k, m1, m2 = (torch.stack(parts).sum(dim=0) / source.numel()).tolist()
    return k, m1, m2


def _ell(theta: float, k: float) -> float:
    return -math.log(k / theta) - k - 1.0 if k > -1.0 and k / theta > 0 else -math.inf


def _start(y: torch.Tensor, y_max: float) -> float:
    """Best theta of a grid, evaluated on a strided subsample in one vectorised pass."""
    stride = max(1, y.numel() // _GRID_SAMPLE)
    sub = y[::stride]
    pos = torch.logspace(-3, 3, 25, dtype=y.dtype, device=y.device)
    neg = -(1.0 - torch.pow(2.0, -torch.arange(1, 9, dtype=y.dtype, device=y.device))) / y_max
    grid = torch.cat([neg, pos])
    return float(grid[torch.argmax(_profile(sub, grid))])


def _away_from_zero(theta: float, direction: float) -> float:
    if abs(theta) >= _THETA_FLOOR:
        return theta
    return math.copysign(_THETA_FLOOR, direction if direction != 0 else 1.0)


@dataclass
class _Newton:
    """State of the safeguarded Newton iteration on the profile likelihood."""

    theta: float
    k: float
    converged: bool
    iterations: int


def _newton(
    y: _Values | torch.Tensor, theta: float, lower: float, tolerance: float, work: tuple[torch.Tensor, ...]
) -> _Newton:
    """Maximise l(theta) over y from ``theta`` by Newton steps with backtracking (never decreasing l, staying above
    ``lower`` = -1 / max y, away from the removable singularity at 0); ``work``: the chunk buffers of :func:`_sums`.

    Each iteration is one pass over y (the sums at the candidate). Once a full Newton step is below ``tolerance``
    (relative to |theta| + 1e-3) it is taken without another pass: Newton's convergence is quadratic, so the error
    left is of the order of the step squared; alpha follows to first order, k + m1 * step (d alpha / d theta = m1).
    """
    theta = _away_from_zero(theta, 1.0)
    k, m1, m2 = _sums(y, theta, work)
    ell = _ell(theta, k)
    for iterations in range(1, MLE_MAX_ITER + 1):
        grad = 1.0 / theta - m1 / k - m1
        hess = -1.0 / (theta * theta) + (m2 * k + m1 * m1) / (k * k) + m2
        newton = hess < 0
        step = -grad / hess if newton else math.copysign(0.1 * max(abs(theta), 1e-3), grad)
        if newton and abs(step) <= tolerance * (abs(theta) + 1e-3) and theta + step > lower:
            final = _away_from_zero(theta + step, step)
            return _Newton(final, k + m1 * (final - theta), True, iterations)
        accepted = False
        for _ in range(60):  # backtracking: stay in the domain and never decrease the likelihood
            cand = theta + step
            if cand <= lower:
                step = 0.5 * (lower - theta)
                continue
            cand = _away_from_zero(cand, step)
            kc, m1c, m2c = _sums(y, cand, work)
            ellc = _ell(cand, kc)
            if ellc >= ell - 1e-13 * abs(ell):
                accepted = True
                break
            step *= 0.5
        if not accepted:
            return _Newton(theta, k, abs(grad) * (abs(theta) + 1e-3) < 1e-8, iterations)
        theta, k, m1, m2, ell = cand, kc, m1c, m2c, ellc
    return _Newton(theta, k, False, MLE_MAX_ITER)


def mle(data: Exceedances) -> Estimate:
    """Exact GP maximum likelihood (location 0) by Grimshaw's profile likelihood in theta = shape / scale.

    Reads the used values (compaction, skipped when every element is used) and normalises them to mean 1. The
    start is the best point of a grid evaluated on a strided subsample of ``_GRID_SAMPLE`` values; Newton then
    converges on a strided subsample of ``_NEWTON_SAMPLE`` values (cheap passes, a start within the sampling error
    of the optimum), and finishes on all the data, where two passes typically suffice (a step of about 1e-3, then
    one below ``MLE_TOLERANCE``, taken without another pass). ``converged`` is false when the iteration limit is
    reached or the maximum sits on the boundary alpha -> -1 (no MLE there).
    """
    raw, shift = data.used()
    denom = data.mean() * data.unit  # the mean of y in raw units: theta dimensionless, y of mean about 1
    if not float(denom) > 0:  # every used value sits at the shift (ties at the smallest survivor): no spread at all
        nan = S.constant(math.nan, raw, data.host)
        message = "the used values are all equal to the shift (zero mean excess): no generalized Pareto MLE"
        return Estimate(
            params={"shape": nan, "scale": nan},
            converged=False,
            flags=[(S.flag(True, raw, data.host), message)],
            degenerate=S.flag(True, raw, data.host),
        )
    values = _Values(raw, shift, denom)
    top = raw.max().double()
    y_max = float(top if shift is None else (top - shift).clamp_min(0)) / float(denom)
    lower = -1.0 / y_max
    n = values.numel()
    sample = values.convert(raw[:: max(1, n // _NEWTON_SAMPLE)]) if n > 2 * _NEWTON_SAMPLE else None
    theta = _start(sample if sample is not None else values.convert(raw), y_max)
    iterations = 0
    size = min(n, _CHUNK)
    work = tuple(torch.empty(size, dtype=torch.float64, device=raw.device) for _ in range(3))
    if sample is not None:
        rough = _newton(sample, theta, lower, _SUBSAMPLE_TOLERANCE, work)
        theta, iterations = rough.theta, rough.iterations
    result = _newton(values, theta, lower, MLE_TOLERANCE, work)
    theta, k, converged = result.theta, result.k, result.converged
    iterations += result.iterations
    shape = S.constant(k, raw, data.host)
    scale = (k / theta) * denom
    at_boundary = k <= -1.0 + _BOUNDARY
    return Estimate(
        params={"shape": shape, "scale": scale},
        iterations=iterations,
        converged=converged and not at_boundary,
        flags=[
            (shape <= -0.5, "generalized Pareto MLE shape <= -1/2: the estimator is not regular there"),
            (S.flag(at_boundary, raw, data.host), BOUNDARY_WARNING),
        ],
    )

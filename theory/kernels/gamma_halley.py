"""The gamma quantile's Halley steps: the hot loop of :func:`gradstat.theory.distributions.incgamma.gammainccinv`.

Each value solves log P(a, x) = log p (where p < 1/2) or log Q(a, x) = log q (else) in t = log x, P and Q the
regularized incomplete gamma functions (SIDCo (Abdelmoniem et al.), Cor. 1.2 (14), App. B.3.1 (19)-(20)): from a
start ``t`` raised to the bound ``(log p + log Gamma(a + 1)) / a`` (P(a, x) <= x^a / Gamma(a + 1)), ``steps`` steps of
Halley's method, Newton's step divided by ``1 - h h'' / (2 h'^2)`` with ``h'' = h' (a - x - h')`` in closed form, the
correction clamped to [-1/2, 1/2] (a step far from the root is Newton's within a factor of two) and the step to
[-2, 2] (x moves by at most e^2), t kept above the bound.

Forms:

- :func:`reference`: torch operations on the values' tensors, P and Q by ``torch.special.gammainc`` /
  ``gammaincc``, each function at x on its branch only and at 0 on the other (where it returns at once: on a GPU
  one value's serial series or continued fraction is the cost), the tail's leading term standing in where it
  underflows: some 15 launches per step on a device;
- ``triton`` (:mod:`gradstat.theory.kernels.triton_gamma`): one launch for every step, P and Q by their series and
  continued fraction in logarithms; for float64 values on CUDA where Triton is installed and the policy is not
  ``never`` (inside a compiled function, as its operator), the reference elsewhere (float32 values among them) and
  after a failure (reported once). Shapes above about 9e8 (float64 magnitudes nearly constant) exceed its loops'
  bound: those values come out NaN, which a SIDCo stage reads as a failed fit.

Both agree with scipy's inverse to 1e-9 relative (tests), not bit for bit with each other.
"""

from __future__ import annotations

import torch

from gradstat.theory.kernels import triton_gamma
from gradstat.theory.kernels.fused import compiling

MAX_LOG_STEP = 2.0
"""Damping: one step moves x by at most a factor e^2."""
MAX_CORRECTION = 0.5
"""|h h'' / (2 h'^2)| at most this: Halley's step is Newton's times 2/3 to 2."""


def reference(
    a: torch.Tensor,
    logp: torch.Tensor,
    logq: torch.Tensor,
    lgam: torch.Tensor,
    lgam1: torch.Tensor,
    start: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    """x = e^t after ``steps`` Halley steps from ``t = start``, in torch (see the module docstring). ``lgam`` and
    ``lgam1``: log Gamma(a) and log Gamma(a + 1); all same-shaped floating tensors on one device."""
    tiny = torch.finfo(a.dtype).tiny
    lower = logp < logq  # solve log P = log p when p < 1/2, else log Q = log q
    target = torch.where(lower, logp, logq)
    floor = (logp + lgam1) / a
    t = start
    for _ in range(steps):
        x = torch.exp(t)
        # each function evaluated at x on its branch only, at 0 on the other (where it returns at once: on a GPU one
        # value's serial series or continued fraction is the cost; on a CPU 20-30x less work per element)
        zero = torch.zeros_like(x)
        tail = torch.where(
            lower,
            torch.special.gammainc(a, torch.where(lower, x, zero)),
            torch.special.gammaincc(a, torch.where(lower, zero, x)),
        )
        # where the tail underflows, its leading term: P ~ x^a e^-x / Gamma(a+1), Q ~ x^(a-1) e^-x / Gamma(a)
        asymptote = torch.where(lower, a * t - x - lgam1, (a - 1.0) * t - x - lgam)
        log_tail = torch.where(tail > tiny, torch.log(tail.clamp_min(tiny)), asymptote)
        # h = log_tail - target; h' = +-e^t f(e^t) / tail = +-exp(a t - x - lgamma(a) - log_tail) for P and Q;
        # d/dt log|h'| = a - x - h' for both, so h'' = h' (a - x - h')
        slope = torch.exp(a * t - x - lgam - log_tail)
        slope = torch.where(lower, slope, -slope)
        residual = log_tail - target
        correction = residual * (a - x - slope) / (2.0 * slope)  # h h'' / (2 h'^2)
        correction = torch.where(torch.isfinite(correction), correction, torch.zeros_like(correction))
        step = residual / slope / (1.0 - correction.clamp(-MAX_CORRECTION, MAX_CORRECTION))
        step = step.clamp(-MAX_LOG_STEP, MAX_LOG_STEP)
        t = torch.maximum(t - torch.where(torch.isfinite(step), step, torch.zeros_like(step)), floor)
    return torch.exp(t)


def halley(
    a: torch.Tensor,
    logp: torch.Tensor,
    logq: torch.Tensor,
    lgam: torch.Tensor,
    lgam1: torch.Tensor,
    start: torch.Tensor,
    steps: int,
) -> torch.Tensor:
    """:func:`reference`'s result by the form that runs on ``a`` (the module docstring)."""
    if compiling():  # (what torch.compile traces: plain attributes only, no policy or context variable read)
        if triton_gamma.in_graph(a):
            return triton_gamma.HALLEY_OP(a, logp, logq, lgam, lgam1, start, steps)
    elif triton_gamma.runs_on(a):
        try:
            return triton_gamma.halley(a, logp, logq, lgam, lgam1, start, steps)
        except Exception as exc:  # noqa: BLE001 - a failed build or launch: reported once, the reference runs
            triton_gamma.report(exc)
    return reference(a, logp, logq, lgam, lgam1, start, steps)

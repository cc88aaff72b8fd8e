"""Inverse of the regularized incomplete gamma functions in torch: the gamma quantile of SIDCo (14).

SIDCo (Abdelmoniem et al.), Cor. 1.2 (14), App. B.3.1 (19)-(20)) needs eta = beta P^{-1}(alpha, 1 - delta),
with P the regularized lower incomplete gamma function and Q = 1 - P. torch has P and Q
(``torch.special.gammainc`` / ``gammaincc``) but not their inverses, so they are solved here in log space, with
t = log x: t -> log P(a, e^t) is increasing and concave (the log-CDF of log X, X ~ gamma(a), whose density is
log-concave) and t -> log Q(a, e^t) decreasing and concave. The branch solved is the one of the smaller of p and q,
so tail probabilities down to the smallest normal float keep full relative precision.

A fixed number of steps (:data:`STEPS`) without any host synchronisation: Halley's method (Newton's step divided by
1 - h h'' / (2 h'^2), h'' in closed form from h', that correction clamped to [-1/2, 1/2] so that a step far from the
root is Newton's within a factor of two), started from a guess (Numerical Recipes' ``invgammp`` guess for a <= 1,
Wilson-Hilferty for a > 1) raised to a bound the root never lies below: P(a, x) <= x^a / Gamma(a + 1), so
x >= (p Gamma(a + 1))^(1/a); every iterate is kept above that bound too. Each step evaluates the branch's P or Q
(on a GPU a serial kernel of ~14 us for one value, the largest cost of SIDCo's gamma threshold), the other function
at 0, where it returns at once: four Halley steps replace the eight Newton steps, each of which evaluated both, that
this solver took before, and three do where the caller knows q >= 1e-6 (SIDCo's gamma first stage: q >= delta_1).
Where the tail underflows, its leading term stands in for it: P ~ x^a e^-x / Gamma(a + 1), Q ~ x^(a-1) e^-x /
Gamma(a).

That solver is the reference. For float64 values on CUDA the same steps run as one Triton kernel
(:mod:`gradstat.theory.kernels.triton_gamma`: P and Q by their series and continued fraction in logarithms, one
launch where the torch steps took some 15 each), within 1e-9 of scipy as the reference is. For one value on a CPU,
where its ~280 operations on 0-d tensors cost half a millisecond of dispatch, the same quantile comes from scipy's
``gammainccinv`` / ``gammaincinv`` on host floats (:func:`host_form`; the kernels' policy decides,
``GRADSTAT_COMPILE=never`` keeps the reference); the two agree to 1e-9 relative from p = 1e-300 to 1 (the tests
check both).
"""

from __future__ import annotations

import math

import torch

from gradstat.theory.kernels import gamma_halley
from gradstat.theory.kernels.fused import compiling
from gradstat.theory.kernels.policy import native_allowed

STEPS = 4
"""Fixed number of Halley steps: 4 reach scipy's values to 1e-9 relative on a grid a in [1e-3, 1e4], p and q in
[1e-300, 1 - 1e-12] (3 fall short at q = 1e-300; tests check both)."""
MODERATE = 1e-6
"""A smaller bound on q than this, known on the host, and :func:`gammainccinv` takes :data:`MODERATE_STEPS`."""
MODERATE_STEPS = 3
"""Halley steps where q >= :data:`MODERATE` is known: 3 reach scipy's values to 2.1e-10 relative on the grid a in
[1e-3, 1e4], q in [1e-6, 1 - 1e-16] (2: 4.7e-10, 1: 2.8e-3), one serial evaluation of Q fewer than :data:`STEPS`.
SIDCo's gamma first stage knows q >= delta_1 (its conditional ratio delta_1 d / n, n <= d)."""


def _initial_guess(a: torch.Tensor, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Starting point x0 > 0 for P(a, x) = p, given log p and log q = log(1 - p) (both accurate)."""
    p = torch.exp(logp)
    # a <= 1 (Numerical Recipes 3rd ed., Sec. 6.2.1): P ~ t (x)^a near 0, Q ~ (1 - t) e^{1-x} beyond.
    t = 1.0 - a * (0.253 + 0.12 * a)
    small_a = torch.where(p < t, torch.exp((logp - torch.log(t)) / a), 1.0 - (logq - torch.log1p(-t)))
    # a > 1: Wilson-Hilferty cube-root normal approximation, the normal quantile taken from the smaller tail.
    z = torch.where(logp < logq, torch.special.ndtri(p), -torch.special.ndtri(torch.exp(logq)))
    w = 1.0 - 1.0 / (9.0 * a) + z / (3.0 * torch.sqrt(a))
    lower_tail = torch.exp((logp + torch.lgamma(a + 1.0)) / a)  # P ~ x^a / Gamma(a + 1) for small x
    large_a = torch.where(w > 0, a * w.clamp_min(0) ** 3, lower_tail)
    x0 = torch.where(a <= 1, small_a, large_a)
    return x0.clamp_min(torch.finfo(a.dtype).tiny)


def _solve(a: torch.Tensor, logp: torch.Tensor, logq: torch.Tensor, steps: int | None = None) -> torch.Tensor:
    """x with log P(a, x) = logp (equivalently log Q(a, x) = logq), solved on the smaller tail's branch, in
    ``steps`` Halley steps (:data:`STEPS` by default; :func:`gradstat.theory.kernels.gamma_halley.halley`)."""
    lgam = torch.lgamma(a)
    lgam1 = torch.lgamma(a + 1.0)
    floor = (logp + lgam1) / a  # log of a bound below the root: P(a, x) <= x^a / Gamma(a + 1)
    start = torch.maximum(torch.log(_initial_guess(a, logp, logq)), floor)
    return gamma_halley.halley(a, logp, logq, lgam, lgam1, start, STEPS if steps is None else steps)


def host_form(a: torch.Tensor, prob: torch.Tensor) -> bool:
    """Whether the quantile of these (broadcast) arguments comes from scipy on host floats: one value on a CPU,
    and a policy other than ``never`` (:mod:`gradstat.theory.kernels.policy`), outside a function torch.compile is
    tracing (whose graph holds tensors only)."""
    if compiling():
        return False
    return prob.numel() == 1 and prob.device.type == "cpu" and a.device.type == "cpu" and native_allowed()


def host_inverse(fn_name: str, a: float, prob: float) -> float:
    """scipy's ``fn_name`` (``gammaincinv`` or ``gammainccinv``) of host numbers: the host form of the inverses
    below, and of the quantiles of a fit on host numbers (:mod:`gradstat.theory.scalars`)."""
    from scipy import special  # (imported on first use: the command line's help loads no scipy)

    return float(getattr(special, fn_name)(a, prob))


def _host(fn_name: str, a: torch.Tensor, prob: torch.Tensor) -> torch.Tensor:
    value = host_inverse(fn_name, float(a.reshape(())), float(prob.reshape(())))
    return torch.full(prob.shape, value, dtype=prob.dtype)


def _broadcast(a: torch.Tensor, prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.as_tensor(a, dtype=prob.dtype, device=prob.device)
    return torch.broadcast_tensors(a, prob)


def gammaincinv(a: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """x with P(a, x) = p, the inverse of the regularized lower incomplete gamma function.

    Parameters
    ----------
    a : Tensor or float, shape broadcastable with ``p``; > 0.
    p : Tensor in [0, 1] (any device, floating dtype).

    Returns
    -------
    Tensor of the broadcast shape: 0 at p = 0, inf at p = 1, NaN outside [0, 1].
    Agrees with ``scipy.special.gammaincinv``; source: SIDCo (Abdelmoniem et al.), (14) and (20).
    """
    a, p = _broadcast(a, p)
    if host_form(a, p):
        return _host("gammaincinv", a, p)
    inner = (p > 0) & (p < 1)
    ps = torch.where(inner, p, torch.full_like(p, 0.5))
    x = _solve(a, torch.log(ps), torch.log1p(-ps))
    x = torch.where(p == 0, torch.zeros_like(x), torch.where(p == 1, torch.full_like(x, math.inf), x))
    return torch.where(inner | (p == 0) | (p == 1), x, torch.full_like(x, math.nan))


def gammainccinv(a: torch.Tensor, q: torch.Tensor, q_at_least: float = 0.0) -> torch.Tensor:
    """x with Q(a, x) = q, the inverse of the regularized upper incomplete gamma function.

    Accurate for tiny q (the far tail that sparsification thresholds live in). 0 at q = 1, inf at q = 0, NaN outside
    [0, 1]. Agrees with ``scipy.special.gammainccinv``; source: SIDCo (Abdelmoniem et al.), (14) with q = delta.
    ``q_at_least``: a bound below every q in [0, 1) that the caller knows on the host; from :data:`MODERATE` up the
    solver takes :data:`MODERATE_STEPS` steps (a q below the bound is solved less accurately, never raised).
    """
    a, q = _broadcast(a, q)
    if host_form(a, q):
        return _host("gammainccinv", a, q)
    inner = (q > 0) & (q < 1)
    qs = torch.where(inner, q, torch.full_like(q, 0.5))
    x = _solve(a, torch.log1p(-qs), torch.log(qs), MODERATE_STEPS if q_at_least >= MODERATE else None)
    x = torch.where(q == 1, torch.zeros_like(x), torch.where(q == 0, torch.full_like(x, math.inf), x))
    return torch.where(inner | (q == 0) | (q == 1), x, torch.full_like(x, math.nan))

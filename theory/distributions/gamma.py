"""Gamma distribution of |g| (the magnitude of a double-gamma gradient).

SIDCo (Abdelmoniem et al.), App. B.3.1 (17)-(20): f(x) = x^(alpha-1) e^(-x/beta) / (beta^alpha Gamma(alpha)),
F(x) = P(alpha, x/beta). scipy.stats.gamma with a = shape = alpha, loc = 0, scale = beta. The quantile (SIDCo (14))
is solved in torch by :mod:`gradstat.theory.distributions.incgamma`.
"""

from __future__ import annotations

import math

import torch

from gradstat.theory.distributions.base import Param, SparsityInducingDistribution, check_param, uniform_open
from gradstat.theory.distributions.incgamma import gammainccinv, gammaincinv


class Gamma(SparsityInducingDistribution):
    """|G| ~ gamma(shape, scale) (SIDCo (18); scipy.stats.gamma(a=shape, scale=scale)). shape > 0, scale > 0."""

    name = "gamma"
    shape: Param  # always given (the base class allows None for one-parameter families)

    def __init__(self, shape: Param, scale: Param) -> None:
        super().__init__(scale, check_param(shape, "shape", positive=True))

    def _logpdf(self, z, a):
        return torch.special.xlogy(a - 1.0, z) - z - torch.lgamma(a)

    def _cdf(self, z, a):
        return torch.special.gammainc(a, z)

    def _sf(self, z, a):
        return torch.special.gammaincc(a, z)

    def _ppf(self, p, a):
        return gammaincinv(a, p)

    def _isf(self, q, a):
        return gammainccinv(a, q)

    def mean(self) -> Param:
        return self.shape * self.scale

    def var(self) -> Param:
        return self.shape * self.scale * self.scale

    def _standard_sample(self, n, generator, device, dtype):
        a = float(self.shape)
        return standard_gamma(a, n, generator, device, dtype)


def standard_gamma(
    a: float, n: int, generator: torch.Generator | None, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """n draws of gamma(a, 1) by Marsaglia & Tsang's squeeze-free rejection method (ACM TOMS 26(3), 2000).

    For a < 1 it samples gamma(a + 1) and multiplies by U^(1/a) (in log space, so tiny shapes do not underflow
    to 0 prematurely). Uses only ``generator`` (never the global RNG) and works on any device.
    """
    boost = a < 1.0
    d = (a + 1.0 if boost else a) - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    chunks: list[torch.Tensor] = []
    missing = n
    while missing > 0:
        m = int(missing * 1.1) + 64  # acceptance is >= 95 % for a >= 1
        z = torch.randn(m, generator=generator, device=device, dtype=dtype)
        u = uniform_open(m, generator, device, dtype)
        v = (1.0 + c * z) ** 3
        ok = (v > 0) & (torch.log(u) < 0.5 * z * z + d - d * v + d * torch.log(v.clamp_min(1e-300)))
        got = d * v[ok]
        chunks.append(got[:missing])
        missing -= chunks[-1].numel()
    x = torch.cat(chunks) if chunks else torch.empty(0, device=device, dtype=dtype)
    if boost:
        x = torch.exp(torch.log(x) + torch.log(uniform_open(n, generator, device, dtype)) / a)
    return x

"""Exponential distribution of |g| (the magnitude of a Laplace / double-exponential gradient).

SIDCo (Abdelmoniem et al.), Cor. 1.1 (6): |G| ~ Exp(beta), F(x) = 1 - exp(-x / beta); scipy.stats.expon with
loc = 0 and scale = beta.
"""

from __future__ import annotations

import torch

from gradstat.theory.distributions.base import Param, SparsityInducingDistribution, uniform_open


class Exponential(SparsityInducingDistribution):
    """|G| ~ Exp(scale): pdf exp(-x/scale)/scale on x >= 0 (SIDCo (6); scipy.stats.expon(scale=scale))."""

    name = "exponential"

    def __init__(self, scale: Param) -> None:
        super().__init__(scale)

    def _logpdf(self, z, c):
        return -z

    def _cdf(self, z, c):
        return -torch.expm1(-z)

    def _sf(self, z, c):
        return torch.exp(-z)

    def _ppf(self, p, c):
        return -torch.log1p(-p)

    def _isf(self, q, c):
        return -torch.log(q)

    def mean(self) -> Param:
        return self.scale

    def var(self) -> Param:
        return self.scale * self.scale

    def _standard_sample(self, n, generator, device, dtype):
        return -torch.log(uniform_open(n, generator, device, dtype))

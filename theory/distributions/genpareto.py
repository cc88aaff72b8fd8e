"""Generalized Pareto distribution of |g| (the magnitude of a double-GP gradient; the law of exceedances).

SIDCo (Abdelmoniem et al.), Cor. 1.3 (30)-(33) and Lemma 2 (36)-(37): F(x) = 1 - (1 + alpha x / beta)^(-1/alpha)
on x >= 0 (and x <= -beta/alpha when alpha < 0). This is scipy.stats.genpareto with c = shape = the paper's alpha,
loc = 0 and scale = beta; alpha = 0 is the exponential distribution. The paper restricts 0 < alpha < 1/2 for single
stage fits and -1/2 < alpha < 1/2 for peak-over-threshold stages; any real shape is accepted here.
"""

from __future__ import annotations

import math

import torch

from gradstat.theory import scalars as S
from gradstat.theory.distributions.base import Param, SparsityInducingDistribution, check_param, uniform_open

_SMALL_SHAPE = 1e-12  # |c| below this uses the exponential limit (c -> 0) of every formula


def log1p_over(c: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """log(1 + c y) / c, with its limit y at c = 0 (the GP 'cumulative hazard' in standardized units)."""
    small = c.abs() < _SMALL_SHAPE
    safe_c = torch.where(small, torch.ones_like(c), c)
    return torch.where(small, y, torch.log1p(c * y) / safe_c)


def expm1_over(c: S.Scalar, y: S.Scalar) -> S.Scalar:
    """(exp(c y) - 1) / c, with its limit y at c = 0 (SIDCo (33): the GP quantile with y = -log(1 - p)); tensors
    or host numbers (:mod:`gradstat.theory.scalars`)."""
    if not isinstance(c, torch.Tensor):
        return y if abs(c) < _SMALL_SHAPE else S.expm1(c * y) / c
    small = c.abs() < _SMALL_SHAPE
    safe_c = torch.where(small, torch.ones_like(c), c)
    return torch.where(small, y, torch.expm1(c * y) / safe_c)


class GenPareto(SparsityInducingDistribution):
    """|G| ~ GP(shape, scale) (SIDCo (31)-(32); scipy.stats.genpareto(c=shape, scale=scale)). scale > 0."""

    name = "genpareto"
    shape: Param  # always given (the base class allows None for one-parameter families)

    def __init__(self, shape: Param, scale: Param) -> None:
        super().__init__(scale, check_param(shape, "shape", positive=False))

    def _upper_end(self, c, like):
        safe = torch.where(c < 0, c, -torch.ones_like(c))
        return torch.where(c < 0, -1.0 / safe, torch.full_like(c, math.inf))

    def _logpdf(self, z, c):
        # (31): log f = -(1/c + 1) log(1 + c z) = -(1 + c) * log1p(c z)/c
        return -(1.0 + c) * log1p_over(c, z)

    def _cdf(self, z, c):
        return -torch.expm1(-log1p_over(c, z))

    def _sf(self, z, c):
        return torch.exp(-log1p_over(c, z))

    def _ppf(self, p, c):
        return expm1_over(c, -torch.log1p(-p))

    def _isf(self, q, c):
        return expm1_over(c, -torch.log(q))

    def mean(self) -> Param:
        """scale / (1 - shape) for shape < 1, else inf (the mean of (32); SIDCo's (34) prints 1 + alpha)."""
        if isinstance(self.shape, torch.Tensor) or isinstance(self.scale, torch.Tensor):
            c = torch.as_tensor(self.shape)
            s = torch.as_tensor(self.scale)
            return torch.where(c < 1, s / (1 - c), torch.full_like(s * c, math.inf))
        return self.scale / (1 - self.shape) if self.shape < 1 else math.inf

    def var(self) -> Param:
        """scale^2 / ((1 - shape)^2 (1 - 2 shape)) for shape < 1/2, else inf."""
        if isinstance(self.shape, torch.Tensor) or isinstance(self.scale, torch.Tensor):
            c = torch.as_tensor(self.shape)
            s = torch.as_tensor(self.scale)
            return torch.where(c < 0.5, s * s / ((1 - c) ** 2 * (1 - 2 * c)), torch.full_like(s * c, math.inf))
        shape, scale = self.shape, self.scale
        return scale * scale / ((1 - shape) ** 2 * (1 - 2 * shape)) if shape < 0.5 else math.inf

    def _standard_sample(self, n, generator, device, dtype):
        c = torch.as_tensor(self.shape, dtype=dtype, device=device).reshape(())
        return expm1_over(c, -torch.log(uniform_open(n, generator, device, dtype)))

"""The symmetric signed form of a distribution of |g|: G = S |G| with a random sign S = +-1.

SIDCo (Abdelmoniem et al.), Lemma 1 (4)-(5) and (17), (30): f_G(g) = f_|G|(|g|) / 2 and
F_G^{-1}(1 - delta/2) = F_|G|^{-1}(1 - delta). Double(Exponential(b)) is scipy.stats.laplace(scale=b),
Double(Gamma(a, b)) is scipy.stats.dgamma(a, scale=b); Double(GenPareto(c, b)) is the double GP of (30).
"""

from __future__ import annotations

import math

import torch

from gradstat.theory.distributions.base import (
    ArrayLike,
    Param,
    SparsityInducingDistribution,
    from_tensor,
    tensor_result,
    to_tensor,
)

_LOG2 = math.log(2.0)


class Double:
    """Symmetric signed distribution whose magnitude follows ``dist`` (any of Exponential, Gamma, GenPareto)."""

    def __init__(self, dist: SparsityInducingDistribution) -> None:
        if not isinstance(dist, SparsityInducingDistribution):
            raise TypeError(f"dist must be Exponential, Gamma or GenPareto, got {type(dist).__name__}")
        self.dist = dist

    @property
    def name(self) -> str:
        return f"double_{self.dist.name}"

    def logpdf(self, x: ArrayLike) -> ArrayLike:
        """log f_G(x) = log f_|G|(|x|) - log 2."""
        t, as_numpy = to_tensor(x)
        return from_tensor(tensor_result(self.dist.logpdf(t.abs())) - _LOG2, as_numpy)

    def pdf(self, x: ArrayLike) -> ArrayLike:
        """f_G(x) = f_|G|(|x|) / 2 (SIDCo (17), (30))."""
        t, as_numpy = to_tensor(x)
        return from_tensor(tensor_result(self.dist.pdf(t.abs())) / 2, as_numpy)

    def cdf(self, x: ArrayLike) -> ArrayLike:
        """P(G <= x): S(-x)/2 for x < 0, 1 - S(x)/2 for x >= 0, with S the survival function of |G|."""
        t, as_numpy = to_tensor(x)
        half_tail = tensor_result(self.dist.sf(t.abs())) / 2
        return from_tensor(torch.where(t < 0, half_tail, 1 - half_tail), as_numpy)

    def sf(self, x: ArrayLike) -> ArrayLike:
        """P(G > x) = cdf(-x) by symmetry (accurate in the right tail)."""
        t, as_numpy = to_tensor(x)
        return from_tensor(tensor_result(self.cdf(-t)), as_numpy)

    def ppf(self, p: ArrayLike) -> ArrayLike:
        """Quantile of G: -isf_|G|(2p) for p < 1/2, isf_|G|(2(1 - p)) otherwise (SIDCo (5))."""
        t, as_numpy = to_tensor(p, "probability")
        left = t < 0.5
        tail = torch.where(left, 2 * t, 2 * (1 - t))
        mag = tensor_result(self.dist.isf(tail))
        out = torch.where(left, -mag, mag)
        return from_tensor(torch.where((t >= 0) & (t <= 1), out, torch.full_like(out, math.nan)), as_numpy)

    def isf(self, q: ArrayLike) -> ArrayLike:
        """x with P(G > x) = q, i.e. -ppf(q)."""
        t, as_numpy = to_tensor(q, "probability")
        return from_tensor(-tensor_result(self.ppf(t)), as_numpy)

    def mean(self) -> Param:
        """0 by symmetry (where E|G| is finite)."""
        m = self.dist.mean()
        return m * 0 if isinstance(m, torch.Tensor) else (0.0 if math.isfinite(m) else math.nan)

    def var(self) -> Param:
        """E[G^2] = Var|G| + (E|G|)^2."""
        m = self.dist.mean()
        return self.dist.var() + m * m

    def sample(
        self,
        n: int,
        generator: torch.Generator | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> torch.Tensor:
        """n draws of G: magnitudes from ``dist`` times independent fair signs (same generator)."""
        mag = self.dist.sample(n, generator, device=device, dtype=dtype)
        sign = torch.randint(0, 2, (n,), generator=generator, device=mag.device).to(mag.dtype) * 2 - 1
        return mag * sign

    def __repr__(self) -> str:
        return f"Double({self.dist!r})"

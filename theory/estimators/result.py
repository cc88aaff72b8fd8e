"""The result of fitting a sparsity-inducing distribution to |g|: parameters plus diagnostics."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gradstat.theory.distributions import Exponential, Gamma, GenPareto, SparsityInducingDistribution

DISTRIBUTIONS: dict[str, type[SparsityInducingDistribution]] = {
    "exponential": Exponential,
    "gamma": Gamma,
    "genpareto": GenPareto,
}


@dataclass
class Fit:
    """A fitted distribution of |g| (location 0) with its diagnostics.

    Attributes
    ----------
    dist : str
        'exponential', 'gamma' or 'genpareto'.
    method : str
        'closed_form', 'mle' or 'minka_newton'.
    params : dict[str, Tensor]
        'scale' always, 'shape' for gamma and generalized Pareto (scipy conventions: gamma a, genpareto c);
        0-d float64 tensors on the data's device.
    n : int
        Number of values used (the non-zero elements, or a peak-over-threshold stage's exceedances).
    n_zeros : int
        Exact zeros left out of the fit (see :mod:`gradstat.theory.estimators.magnitudes` for the policy).
    converged : bool
        False when an iterative estimator stopped before its tolerance.
    iterations : int
        Iterations of the estimator (0 for closed forms).
    warnings : list[str]
        Reliability warnings (e.g. generalized Pareto moment matching with shape >= 1/4).
    """

    dist: str
    method: str
    params: dict[str, torch.Tensor]
    n: int
    n_zeros: int = 0
    converged: bool = True
    iterations: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def d(self) -> int:
        """Elements of the vector the fit describes, zeros included (n + n_zeros)."""
        return self.n + self.n_zeros

    @property
    def zero_fraction(self) -> float:
        """n_zeros / d."""
        return self.n_zeros / self.d if self.d else 0.0

    @property
    def distribution(self) -> SparsityInducingDistribution:
        """The fitted distribution object (Exponential, Gamma or GenPareto) built from ``params``."""
        return DISTRIBUTIONS[self.dist](**self.params)

"""Which estimator computes which (distribution, method) pair: one table, so one test battery covers all."""

from __future__ import annotations

from typing import Callable

from gradstat.theory.estimators import exponential, gamma, genpareto
from gradstat.theory.estimators.estimate import Estimate
from gradstat.theory.estimators.exceedances import Exceedances

Estimator = Callable[[Exceedances], Estimate]

ESTIMATORS: dict[tuple[str, str], Estimator] = {
    ("exponential", "closed_form"): exponential.mean_scale,  # SIDCo (6)
    ("exponential", "mle"): exponential.mean_scale,  # the mean is the exponential MLE
    ("gamma", "closed_form"): gamma.minka,  # SIDCo (16)
    ("gamma", "mle"): gamma.mle,  # SIDCo (26)
    ("gamma", "minka_newton"): gamma.minka_newton,  # (16) + one Newton step on (26)
    ("genpareto", "closed_form"): genpareto.moment_matching,  # SIDCo (35)
    ("genpareto", "mle"): genpareto.mle,  # Grimshaw profile likelihood
}
SHAPED = {"gamma", "genpareto"}
"""Distributions with a shape parameter (undefined on constant data)."""


def estimator(dist: str, method: str) -> Estimator:
    """The estimator for ``dist`` and ``method``; ValueError naming the accepted values otherwise."""
    dists = sorted({d for d, _ in ESTIMATORS})
    if dist not in dists:
        raise ValueError(f"dist must be one of {dists}, got {dist!r}")
    if (dist, method) not in ESTIMATORS:
        methods = sorted(m for d, m in ESTIMATORS if d == dist)
        raise ValueError(f"method for dist {dist!r} must be one of {methods}, got {method!r}")
    return ESTIMATORS[(dist, method)]

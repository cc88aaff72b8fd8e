"""Exponential fit of |g|: the scale is the sample mean (closed form and MLE coincide).

SIDCo (Abdelmoniem et al.), Cor. 1.1 (6): beta_hat = (1/d) sum |g_j|, the maximum likelihood estimate; for
peak-over-threshold stages Cor. 2.1 (11): beta_m = mean(|g_bar| - eta_{m-1}).
"""

from __future__ import annotations

from gradstat.theory.estimators.estimate import Estimate
from gradstat.theory.estimators.exceedances import Exceedances


def mean_scale(data: Exceedances) -> Estimate:
    """beta_hat = mean of the used values (SIDCo (6), (11)); exact MLE of the exponential scale."""
    return Estimate(params={"scale": data.mean() * data.unit})

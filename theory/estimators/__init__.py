"""Estimators of the sparsity-inducing distributions of |g|: closed forms of SIDCo, exact MLE, Newton-refined Minka.

SIDCo (Abdelmoniem et al.), Cor. 1.1-1.3 and App. B.3. ``fit(x, dist, method)`` returns a :class:`Fit`.
"""

from gradstat.theory.estimators.fit import fit
from gradstat.theory.estimators.result import DISTRIBUTIONS, Fit

__all__ = ["DISTRIBUTIONS", "Fit", "fit"]

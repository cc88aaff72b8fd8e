"""Sparsity-inducing distributions of gradient magnitudes |g| and their signed (double) forms.

SIDCo (Abdelmoniem et al.), Property 2, Lemma 1 and App. B.3. scipy.stats conventions: location 0, ``scale`` =
the paper's beta, gamma ``shape`` = scipy's ``a`` = the paper's alpha, generalized Pareto ``shape`` = scipy's ``c`` =
the paper's alpha. Methods take torch tensors (any device and floating dtype) or numpy arrays (returned as numpy).

The classes are imported on first use, so that :mod:`gradstat.theory.distributions.names` (the laws' spellings,
which the command line's help texts show) loads without torch or scipy.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gradstat.theory.distributions.base import SparsityInducingDistribution
    from gradstat.theory.distributions.double import Double
    from gradstat.theory.distributions.exponential import Exponential
    from gradstat.theory.distributions.gamma import Gamma
    from gradstat.theory.distributions.genpareto import GenPareto

__all__ = ["Double", "Exponential", "Gamma", "GenPareto", "SparsityInducingDistribution"]

_MODULES = {
    "Double": "double",
    "Exponential": "exponential",
    "Gamma": "gamma",
    "GenPareto": "genpareto",
    "SparsityInducingDistribution": "base",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

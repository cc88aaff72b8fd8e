"""Sparsity-inducing distributions of gradient magnitudes |g| and their signed (double) forms.

SIDCo (Abdelmoniem et al.), Property 2, Lemma 1 and App. B.3. scipy.stats conventions: location 0, ``scale`` =
the paper's beta, gamma ``shape`` = scipy's ``a`` = the paper's alpha, generalized Pareto ``shape`` = scipy's ``c`` =
the paper's alpha. Methods take torch tensors (any device and floating dtype) or numpy arrays (returned as numpy).
"""

from gradstat.theory.distributions.base import SparsityInducingDistribution
from gradstat.theory.distributions.double import Double
from gradstat.theory.distributions.exponential import Exponential
from gradstat.theory.distributions.gamma import Gamma
from gradstat.theory.distributions.genpareto import GenPareto

__all__ = ["Double", "Exponential", "Gamma", "GenPareto", "SparsityInducingDistribution"]

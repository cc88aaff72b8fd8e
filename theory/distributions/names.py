"""One spelling for each sparsity-inducing law of |g|, with the usual aliases.

SIDCo (Abdelmoniem et al., statistical threshold sparsification), Sec. 2.3 and Property 2: the magnitudes of a
gradient are modelled by the exponential law (|g| of a Laplace, i.e. double-exponential, gradient), the gamma law
or the generalized Pareto law. The canonical names are those of the estimators and of scipy.stats:
``exponential``, ``gamma`` and ``genpareto``. Every command option, compressor spec and table uses them; the aliases
below are accepted as input and never printed.
"""

from __future__ import annotations

DISTRIBUTIONS = ("exponential", "gamma", "genpareto")
"""The canonical names, in the order tables list them."""

ALIASES = {
    "exponential": "exponential",
    "exp": "exponential",
    "expon": "exponential",
    "laplace": "exponential",
    "double-exponential": "exponential",
    "gamma": "gamma",
    "genpareto": "genpareto",
    "gp": "genpareto",
    "gpd": "genpareto",
    "generalized-pareto": "genpareto",
    "generalised-pareto": "genpareto",
}
"""Every accepted spelling (lower case, ``_`` and spaces read as ``-``) and its canonical name."""


def distribution_name(name: str, what: str = "distribution") -> str:
    """The canonical name of ``name`` (any alias, any case); ValueError naming ``what`` and the accepted names."""
    key = "-".join(str(name).strip().lower().replace("_", " ").replace("-", " ").split())
    try:
        return ALIASES[key]
    except KeyError:
        raise ValueError(f"{what} {name!r} is not a known law of |g|; use {accepted()}") from None


def accepted() -> str:
    """The canonical names with their short aliases, for help texts and error messages."""
    return "exponential (exp, laplace), gamma, genpareto (gp)"

"""SIDCo's (Abdelmoniem et al.) estimation quality under the genie distribution: with |g| drawn from the fitted
family itself, the count k_hat of elements above the fitted threshold eta(delta) is Binomial(d, delta), so
E[k_hat/k] = 1.

Source: SIDCo (Abdelmoniem et al.), Lemma 1 (4)-(5) (threshold), Cor. 1.1-1.3 (closed-form fits), Sec. 2.2 / App. C
(k_hat ~ Binomial(d, delta)). The threshold comes from :func:`gradstat.theory.thresholds.threshold` with the quantile
the check names; with the gamma family and ``quantile="approx"`` (Cor. 1.2's approximation claimed as exact) the check
fails, which the regression tests use to show it can.

Tolerance: the parameters are estimated from the same d values, so E[k_hat/k] deviates from 1 by O(1/d) even for
an exact estimator; the equality is accepted within ``TOLERANCE`` (absolute, in k_hat/k).

The vectors are synthetic whatever the dump (the claim is about the genie law): every row says so. The verdict
is about the *mean* of k_hat/k over the trials; the note also gives the share of single trials inside the 99 %
binomial band of one draw, a band far wider than a 2 % bias, so a violated mean with every trial inside its band
is not a contradiction.
"""

from __future__ import annotations

import numpy as np
import torch

from gradstat.analysis.measure.intervals import mean_ci
from gradstat.analysis.validation.engine import Check, Measurement, Setting
from gradstat.theory.distributions.base import SparsityInducingDistribution
from gradstat.theory.estimators import fit
from gradstat.theory.sources import cite, file_of
from gradstat.theory.thresholds import threshold

SIDCO = "SIDCo"
D = 20_000
RATIO = 0.01
TOLERANCE = 0.01
LAWS = {
    "exponential": "Exponential(scale 1)",
    "gamma": "Gamma(shape 0.5, scale 1)",
    "genpareto": "GP(shape 0.25, scale 1)",
}
FAMILIES = {  # family -> genie distribution, with shapes typical of gradients (SIDCo Fig. 2)
    "exponential": lambda: _dist("Exponential", scale=1.0),
    "gamma": lambda: _dist("Gamma", shape=0.5, scale=1.0),
    "genpareto": lambda: _dist("GenPareto", shape=0.25, scale=1.0),
}


def _dist(name: str, **params: float) -> SparsityInducingDistribution:
    import gradstat.theory.distributions as td

    return getattr(td, name)(**params)


def k_ratio_samples(
    family: str,
    method: str,
    quantile: str,
    trials: int,
    seed: int,
    device: torch.device,
    d: int = D,
    ratio: float = RATIO,
) -> np.ndarray:
    """k_hat/(d delta) for ``trials`` vectors of d i.i.d. |g| from the family's genie distribution."""
    dist = FAMILIES[family]()
    k = d * ratio
    out = []
    for t in range(trials):
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + t)
        a = dist.sample(d, gen, device=device, dtype=torch.float64)
        eta = threshold(fit(a, family, method), ratio, quantile=quantile)
        out.append(float((a > eta).sum()) / k)
    return np.asarray(out)


def sidco_check(family: str, method: str = "closed_form", quantile: str = "exact", must_hold: bool = True) -> Check:
    """The binomial k_hat check for one family, estimator and quantile."""

    def measure(s: Setting) -> Measurement:
        from gradstat.theory.sidco import exceedance_count_interval

        x = k_ratio_samples(family, method, quantile, s.trials, s.seed, s.device)
        lo, hi = exceedance_count_interval(D, RATIO, 0.99)
        inside = float(np.mean((x * D * RATIO >= lo) & (x * D * RATIO <= hi)))
        return Measurement(
            1.0,
            mean_ci(x),
            f"d={D}, delta={RATIO}, {method} fit, {quantile} quantile; verdict on the mean over {s.trials} "
            f"trials (tolerance {TOLERANCE}); single trials: {inside:.0%} inside the 99% band [{lo}, {hi}] of "
            "one Binomial(d, delta) draw",
            f"synthetic: genie |g| ~ {LAWS[family]}, d = {D}, a fresh draw per trial (independent of any dump)",
            setup={"family": family, "fit": method, "quantile": quantile, "d": D, "delta": RATIO},
        )

    suffix = "" if method == "closed_form" else f"-{method}"
    return Check(
        f"sidco-binomial-{family}{suffix}",
        cite(SIDCO, f"Lemma 1, Cor. 1.{'123'[list(FAMILIES).index(family)]}, App. C"),
        "equal",
        "E[k_hat] / (d delta) under the genie distribution",
        measure,
        {"quick": 30, "full": 300},
        tolerance=TOLERANCE,
        must_hold=must_hold,
        paper=file_of(SIDCO),
    )


# The closed-form gamma fit (Cor. 1.2's shape approximation) is biased: about -2 % in k_hat/k at delta = 0.01,
# shape 0.5 (measured: 0.9785, 99 % CI [0.965, 0.992] over 100 trials). It is reported, not required; the exact
# MLE is held to the binomial law.
CHECKS = [
    sidco_check("exponential"),
    sidco_check("gamma", "mle"),
    sidco_check("gamma", must_hold=False),
    sidco_check("genpareto"),
]

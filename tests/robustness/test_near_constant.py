"""Near-constant and constant data: shaped fits of float32 values are computed in float64 where float32's
reductions cannot tell them from constant (they gave a shape clipped at float32's noise floor, 131072 for the
gamma, flagged as not identifiable), and a constant gradient given to a shaped SIDCo is reported with its own
magnitude (it said "constant (0.5 ...)" for 0.25: the value after SIDCo's power-of-two normalisation)."""

from __future__ import annotations

import pytest
import torch

from gradstat import compressors
from gradstat.compressors import Context
from gradstat.theory.estimators import fit

SHAPED_FITS = [("gamma", "closed_form"), ("gamma", "mle"), ("gamma", "minka_newton"), ("genpareto", "closed_form")]


def near_constant() -> torch.Tensor:
    """1 + 1e-6 N(0, 1) in float64: a spread of 1e-6, below float32's reduction noise (32 ulps ~ 4e-6)."""
    return 1.0 + 1e-6 * torch.randn(10_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("dist, method", SHAPED_FITS)
def test_a_float32_near_constant_fit_is_the_float64_fit_of_the_same_values(dist, method):
    x32 = near_constant().float()
    got, wide = fit(x32, dist, method), fit(x32.double(), dist, method)
    assert got.converged and got.warnings == []
    assert float(got.params["shape"]) == float(wide.params["shape"])
    assert float(got.params["scale"]) == float(wide.params["scale"])


@pytest.mark.parametrize("dist, method", SHAPED_FITS)
def test_a_float32_near_constant_fit_agrees_with_the_float64_data_it_rounds(dist, method):
    """float32 rounding moves each value by at most 6e-8 against a spread of 1e-6: the variance, and so the
    shape (gamma ~ mean^2 / var, generalized Pareto ~ -mean^2 / (2 var)), moves by well under 2 %."""
    x = near_constant()
    got, ref = float(fit(x.float(), dist, method).params["shape"]), float(fit(x, dist, method).params["shape"])
    assert abs(got) > 1e11 and got == pytest.approx(ref, rel=0.02)


@pytest.mark.parametrize("dist", ["gamma", "gp"])
@pytest.mark.parametrize("value, n", [(0.25, 1000), (-3.0, 1000), (0.25, 3_000_000)])
def test_a_constant_gradient_is_reported_with_its_own_magnitude(dist, value, n):
    g = torch.full((n,), value)
    with pytest.raises(ValueError, match=rf"every nonzero \|g\| is {abs(value)} \({n} elements\)"):
        compressors.create(f"sidco:dist={dist},exact_fallback=false").encode(g, Context(seed=1))


def test_a_constant_gradient_takes_the_exact_top_k_and_says_why():
    c = compressors.create("sidco:dist=gamma")
    p = c.encode(torch.full((1000,), 0.25), Context(seed=1))
    out = c.decode(p)
    assert p.info["k_hat"] == 10 and torch.equal(torch.nonzero(out).reshape(-1), torch.arange(10))
    assert p.info["fallback"] == "exact top-k: every nonzero |g| is 0.25 (1000 elements): a gamma fit has no shape"

"""SIDCo's gamma threshold in its three forms (App. A): the exact quantile (14), the fixed point of (22) and the
approximation (23) that gives (15), each held to the exceedance fraction it produces on the gamma law itself."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special, stats

from gradstat.theory.sidco import gamma_threshold


def test_the_three_forms_at_the_issue_point():
    # alpha = 0.3, delta = 0.01: (14) P^-1(0.3, 0.99), (22) the root of x = 3.509 - 0.7 log x, (23) 3.509
    exact, fixed, approx = (gamma_threshold(0.3, 1.0, 0.01, f) for f in ("exact", "fixed-point", "approx"))
    assert stats.gamma(0.3).sf(exact) == pytest.approx(0.01, rel=1e-10)
    c = -math.log(0.01 * special.gamma(0.3))
    assert approx == pytest.approx(c, rel=1e-12)
    assert fixed == pytest.approx(c - 0.7 * math.log(fixed), rel=1e-12)
    assert exact < fixed < approx  # (22) is the tighter of the paper's two forms, both above the quantile
    assert (round(exact, 2), round(fixed, 2), round(approx, 2)) == (2.64, 2.79, 3.51)


@pytest.mark.parametrize("shape", [0.1, 0.3, 0.6, 0.9])
@pytest.mark.parametrize("ratio", [1e-3, 1e-2, 1e-1])
def test_the_fixed_point_keeps_at_most_delta_and_the_approximation_less_where_it_holds(shape, ratio):
    law = stats.gamma(shape, scale=2.0)
    kept = {f: law.sf(gamma_threshold(shape, 2.0, ratio, f)) for f in ("exact", "fixed-point", "approx")}
    assert kept["exact"] == pytest.approx(ratio, rel=1e-8)
    assert kept["fixed-point"] <= ratio  # (21) bounds the tail for every x > 0: (22)'s threshold is too high
    if gamma_threshold(shape, 1.0, ratio, "approx") >= 1.0:  # (23) holds only where its x >= 1
        assert kept["approx"] <= kept["fixed-point"]


def test_the_forms_agree_on_the_exponential_law():
    values = [gamma_threshold(1.0, 3.0, 0.05, f) for f in ("exact", "fixed-point", "approx")]
    assert values == pytest.approx([3.0 * math.log(20.0)] * 3, rel=1e-12)


def test_the_fixed_point_is_measured_on_samples():
    gen = np.random.default_rng(7)
    x = gen.gamma(0.3, 1.0, size=2_000_000)
    share = float((x > gamma_threshold(0.3, 1.0, 0.01, "fixed-point")).mean())
    exact = float(stats.gamma(0.3).sf(gamma_threshold(0.3, 1.0, 0.01, "fixed-point")))
    half = 3.0 * math.sqrt(exact * (1 - exact) / x.size)  # binomial, ~99.7 %
    assert abs(share - exact) < half and share < 0.01 - 3 * half


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"shape": 0.0}, "shape"),
        ({"ratio": 1.0}, "ratio"),
        ({"scale": -1.0}, "scale"),
        ({"form": "newton"}, "form"),
        ({"shape": 1.5, "form": "fixed-point"}, "shape <= 1"),
    ],
)
def test_bad_inputs_get_clear_errors(kw, msg):
    args = {"shape": 0.5, "scale": 1.0, "ratio": 0.01, "form": "exact", **kw}
    with pytest.raises(ValueError, match=msg):
        gamma_threshold(**args)


@pytest.mark.parametrize("scale", [1e-30, 1e30])
def test_every_form_scales_with_beta(scale):
    for form in ("exact", "fixed-point", "approx"):
        assert gamma_threshold(0.4, scale, 0.01, form) == pytest.approx(scale * gamma_threshold(0.4, 1.0, 0.01, form))

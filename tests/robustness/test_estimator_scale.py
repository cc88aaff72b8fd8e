"""Every registered estimator, threshold and peak-over-threshold stage at every scale of value.

Property (the fit of c * x for a power of two c): shapes identical, scales exactly c times (the statistics are
taken on values normalised by a power of two, so scaling the input changes no rounding), over c = 2^-100 .. 2^100
for float32 and 2^-1000 .. 2^900 for float64; denormal, near-overflow and near-constant inputs give finite
parameters, with ``converged=False`` and a warning where the shape is not identifiable.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradstat.theory.estimators import fit
from gradstat.theory.estimators.registry import ESTIMATORS
from gradstat.theory.pot import multistage_threshold
from gradstat.theory.thresholds import tail_quantile, threshold

PAIRS = sorted(ESTIMATORS)
BOUNDED = settings(max_examples=12, deadline=None, derandomize=True)


def sample(seed: int, n: int, power: float, dtype: torch.dtype) -> torch.Tensor:
    """|g|-like magnitudes: exponential draws raised to ``power`` (heavier or lighter tails than exponential)."""
    g = torch.Generator().manual_seed(seed)
    return torch.empty(n, dtype=torch.float64).exponential_(generator=g).pow(power).to(dtype)


def assert_equivariant(base, scaled, factor: float) -> None:
    assert scaled.params.keys() == base.params.keys()
    if "shape" in base.params:
        assert float(scaled.params["shape"]) == float(base.params["shape"])
    assert float(scaled.params["scale"]) == float(base.params["scale"]) * factor
    assert scaled.converged == base.converged


@pytest.mark.parametrize("dist, method", PAIRS)
@BOUNDED
@given(
    seed=st.integers(0, 2**16),
    power=st.floats(0.5, 2.5),
    exponent=st.integers(-100, 100),
    n=st.integers(50, 600),
)
def test_float32_fit_is_scale_equivariant_over_2_pow_100(dist, method, seed, power, exponent, n):
    x = sample(seed, n, power, torch.float32)
    factor = 2.0**exponent
    assert_equivariant(fit(x, dist, method), fit(x * factor, dist, method), factor)


@pytest.mark.parametrize("dist, method", PAIRS)
@BOUNDED
@given(seed=st.integers(0, 2**16), exponent=st.integers(-1000, 900), n=st.integers(50, 600))
def test_float64_fit_is_scale_equivariant_over_the_float64_range(dist, method, seed, exponent, n):
    x = sample(seed, n, 1.3, torch.float64)
    factor = 2.0**exponent
    assert_equivariant(fit(x, dist, method), fit(x * factor, dist, method), factor)


@pytest.mark.parametrize("dist, method", PAIRS)
@pytest.mark.parametrize("top", [1e-40, 1e-30, 1e30, 3.0e38])
def test_float32_extremes_give_finite_fits_and_thresholds_close_to_the_unscaled(dist, method, top):
    """Denormal (1e-40: about 16 significant bits left) and near-overflow float32 data: the same fit as the data at
    scale 1, up to the rounding the scaling itself caused."""
    x = sample(3, 4000, 1.2, torch.float64)
    x = x / x.max()
    base = fit(x.float(), dist, method)
    scaled = fit((x * top).float(), dist, method)
    for key, value in scaled.params.items():
        assert math.isfinite(float(value))
        expected = float(base.params[key]) * (top if key == "scale" else 1.0)
        assert float(value) == pytest.approx(expected, rel=1e-3 if top < 1e-38 else 1e-5)
    eta = float(threshold(scaled, 0.01))
    assert 0 < eta < math.inf and eta / top == pytest.approx(float(threshold(base, 0.01)), rel=1e-3)


@pytest.mark.parametrize("dist, method", PAIRS)
def test_float64_beyond_float32_range_fits(dist, method):
    x = sample(4, 3000, 1.2, torch.float64)
    base, big = fit(x, dist, method), fit(x * 1e300, dist, method)
    assert float(big.params["scale"]) / 1e300 == pytest.approx(float(base.params["scale"]), rel=1e-12)
    assert math.isfinite(float(threshold(big, 0.001)))


NEAR_CONSTANT = torch.tensor([0.25, 0.25000003] * 500, dtype=torch.float32)


@pytest.mark.parametrize("dist, method", PAIRS)
@pytest.mark.parametrize("factor", [1.0, 2.0**-120, 2.0**120])
def test_near_constant_data_give_finite_positive_parameters_and_thresholds(dist, method, factor):
    got = fit(NEAR_CONSTANT * factor, dist, method)
    for value in got.params.values():
        assert math.isfinite(float(value))
    assert float(got.params["scale"]) > 0
    if dist != "exponential":  # the exponential scale is the mean: well defined on constant data
        assert not got.converged and got.warnings
    eta = float(threshold(got, 0.01))
    assert 0 <= eta < math.inf


@pytest.mark.parametrize("dist", ["gamma", "genpareto"])
def test_near_constant_shaped_closed_forms_say_so(dist):
    got = fit(NEAR_CONSTANT, dist, "closed_form")
    assert any("constant within the rounding" in w for w in got.warnings)


def test_genpareto_closed_form_never_reports_converged_with_infinite_parameters():
    tied = torch.tensor([1.0, 1.0 + 2**-52] * 50, dtype=torch.float64)
    got = fit(tied, "genpareto", "closed_form")
    assert not got.converged
    assert all(math.isfinite(float(v)) for v in got.params.values())


@pytest.mark.parametrize("first", ["gamma", "genpareto", "exponential"])
@pytest.mark.parametrize("anchor", ["threshold", "min_survivor"])
@pytest.mark.parametrize("factor", [1e-40, 1e30, 3e38 / 40])
def test_multistage_threshold_keeps_the_target_count_at_extreme_scales(first, anchor, factor):
    """3 stages, target 1.1 % of 10,000: the same count as at scale 1 (within the rounding of scaling)."""
    x = sample(0, 10000, 1.0, torch.float64)
    x = (x / x.max()).float()
    kept = {}
    for f in (1.0, factor):
        y = (x.double() * f).float()
        result = multistage_threshold(y, 0.011, 3, first=first, anchor=anchor)
        assert result.stopped_reason is None
        kept[f] = int(torch.count_nonzero(y > result.threshold.float()))
    assert 60 <= kept[1.0] <= 160
    assert abs(kept[factor] - kept[1.0]) <= 2


SCALE = {"scale": torch.tensor(1.0, dtype=torch.float64), "shape": torch.tensor(0.3, dtype=torch.float64)}


@pytest.mark.parametrize("tail", [0, 1, 0.0, 1.0, -0.1, 1.5, math.nan, math.inf, -math.inf])
def test_tail_quantile_rejects_tails_outside_the_open_unit_interval(tail):
    with pytest.raises(ValueError, match="tail must lie strictly between 0 and 1"):
        tail_quantile("genpareto", SCALE, tail)


@pytest.mark.parametrize("tail", [True, False, "0.1", None, [0.1]])
def test_tail_quantile_rejects_non_numbers(tail):
    with pytest.raises(TypeError, match="tail must be a number"):
        tail_quantile("genpareto", SCALE, tail)


def test_tail_quantile_rejects_unknown_dist():
    with pytest.raises(ValueError, match="dist must be one of"):
        tail_quantile("laplace", SCALE, 0.1)


def test_tail_quantile_is_finite_where_the_quantile_exceeds_float64():
    huge = {"scale": torch.tensor(1e307, dtype=torch.float64), "shape": torch.tensor(0.9, dtype=torch.float64)}
    assert math.isfinite(float(tail_quantile("genpareto", huge, 1e-12)))


@pytest.mark.parametrize("method", ["closed_form", "mle", "minka_newton"])
def test_gamma_on_values_spanning_the_whole_float32_range(method):
    """1e-38 and 1e38 side by side: normalised by the largest, the smallest underflows in float32; the logs are then
    taken in float64 and the fit matches the same values given as float64."""
    x = torch.tensor([1e-38, 3e-20, 1.0, 1e38] * 50, dtype=torch.float32)
    got, ref = fit(x, "gamma", method), fit(x.double(), "gamma", method)
    assert math.isfinite(float(got.params["shape"])) and float(got.params["scale"]) > 0
    assert float(got.params["shape"]) == pytest.approx(float(ref.params["shape"]), rel=1e-6)

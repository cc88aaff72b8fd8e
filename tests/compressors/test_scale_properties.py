"""Every registered compressor at every scale of value (property-based, hypothesis).

- Scaling the input by 2^e, e in [-100, 100], scales the reconstruction by exactly 2^e (same selection, same
  bits): binary floating point multiplies by a power of two exactly, so any difference is the compressor's.
- Denormal-scale and near-overflow inputs give a finite reconstruction whose relative error stays within twice the
  error of the same vector at unit scale (plus 1e-3), or a ValueError that names float32's range.
- Ties, a handful of distinct values and exact zeros give a finite reconstruction that does not increase the error
  beyond the input's energy (or a clear ValueError).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gradstat import compressors
from gradstat.compressors.context import Context

FMAX = torch.finfo(torch.float32).max
NAMES = compressors.names()
SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)


def _vector(seed: int, n: int) -> torch.Tensor:
    """Laplace(0, 1) float32 with every magnitude in [2^-20, 2^6] (so that 2^-100 keeps every element normal)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64) - 0.5
    g = -torch.sign(u) * torch.log1p(-2 * u.abs())
    g = torch.sign(g) * g.abs().clamp(2.0**-20, 2.0**6)
    g[g == 0] = 1.0
    return g.float()


def _build(name: str, x: torch.Tensor, unit: float = 1.0):
    """The registered compressor with its defaults; a fixed threshold gets its 99th percentile (times ``unit``)."""
    if name == "threshold":
        eta = float(torch.quantile(x.abs().double(), 0.99)) * unit
        return compressors.create(name, eta=eta)
    return compressors.create(name)


def _roundtrip(c, x: torch.Tensor, seed: int):
    needs_side = c.properties.needs_side
    ctx = Context(seed=seed, worker=1 if needs_side else 0).but(state=c.new_state(x))
    payload = c.encode(x, ctx)
    return payload, c.decode(payload, ctx, side=x if needs_side else None)


def _rel_error(y: torch.Tensor, x: torch.Tensor) -> float:
    s = x.double().abs().max()
    return float((((y.double() - x.double()) / s) ** 2).sum() / ((x.double() / s) ** 2).sum())


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(seed=st.integers(0, 2**16), n=st.integers(256, 2048), e=st.integers(-100, 100))
def test_power_of_two_scaling_is_exactly_equivariant(name, seed, n, e):
    g = _vector(seed, n)
    scale = 2.0**e
    p0, y0 = _roundtrip(_build(name, g), g, seed)
    p1, y1 = _roundtrip(_build(name, g, unit=scale), g * scale, seed)
    assert p1.bits == p0.bits
    assert torch.equal(y1, y0 * scale), f"{name}: decode(encode(2^{e} g)) != 2^{e} decode(encode(g))"


def _finite_within_bound_or_clear_error(name: str, x: torch.Tensor, reference: float) -> str:
    try:
        _, y = _roundtrip(_build(name, x), x, 7)
    except ValueError as exc:
        assert "float32" in str(exc), f"{name}: unclear error {exc}"
        return "error"
    assert bool(torch.isfinite(y).all()), f"{name}: non-finite reconstruction"
    err = _rel_error(y, x)
    assert err <= 2 * reference + 1e-3, f"{name}: relative error {err:.3g} against {reference:.3g} at unit scale"
    return "ok"


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(seed=st.integers(0, 2**16), e=st.integers(-149 + 7, -127))
def test_denormal_scale_inputs_keep_their_accuracy(name, seed, e):
    g = _vector(seed, 1024)
    x = (g.double() * 2.0**e).float()  # mostly subnormal float32 values
    x = x[x != 0]
    unit = (x.double() * 2.0 ** (-e)).float()  # the same (rounded) values at unit scale, exactly
    _, y0 = _roundtrip(_build(name, unit), unit, 7)
    assert _finite_within_bound_or_clear_error(name, x, _rel_error(y0, unit)) == "ok"


@pytest.mark.parametrize("name", NAMES)
@SETTINGS
@given(seed=st.integers(0, 2**16), top=st.floats(1e30, float(FMAX)))
def test_near_overflow_inputs_are_finite_or_refused_clearly(name, seed, top):
    g = _vector(seed, 1024)
    x = (g.double() / g.abs().max() * top).float()
    _, y0 = _roundtrip(_build(name, g), g, 7)
    _finite_within_bound_or_clear_error(name, x, _rel_error(y0, g))


def test_float64_beyond_float32_range_is_refused_clearly():
    g = _vector(3, 512).double() * 1e300
    outcomes = {}
    for name in NAMES:
        try:
            _, y = _roundtrip(_build(name, g), g, 1)
            outcomes[name] = "finite" if bool(torch.isfinite(y).all()) else "NONFINITE"
        except ValueError as exc:
            assert "float32" in str(exc), f"{name}: unclear error {exc}"
            outcomes[name] = "error"
    assert "NONFINITE" not in outcomes.values(), outcomes


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "values",
    [[0.25], [0.25, 0.25000003], [1.0, -1.0], [0.0, 0.0, 3.0], [2.0, -0.5, 0.125, 0.0, 1e-3]],
    ids=["constant", "near_constant", "two_signs", "mostly_zero", "few_distinct"],
)
def test_ties_and_few_distinct_values_give_finite_results(name, values):
    x = torch.tensor(values * math.ceil(1024 / len(values)))[:1024]
    try:
        _, y = _roundtrip(_build(name, x), x, 5)
    except ValueError as exc:
        assert "float32" in str(exc) or "degenerate" in str(exc) or "constant" in str(exc), str(exc)
        return
    assert bool(torch.isfinite(y).all())
    if not compressors.get(name).properties.unbiased:  # a contraction: never more error than the input's energy
        assert float(((y - x).double() ** 2).sum()) <= float((x.double() ** 2).sum()) * (1 + 1e-6)

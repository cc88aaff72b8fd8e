"""The two kinds of scalar arithmetic of the fits (gradstat.theory.scalars): host numbers on a CPU, 0-d tensors on a
device. Both run the same expressions on the same statistics, so the multi-stage thresholds, the stages' fits,
their survivor counts and the reasons to stop must agree: bit for bit where the arithmetic is +, -, *, /, sqrt and
comparisons, and within a few float64 ulps where a transcendental function (log, exp, digamma, the gamma quantile)
comes from libm or scipy on one side and torch on the other. The tensor form is forced on a CPU by turning
``on_host`` off; the statistics (the C loops' sums) are then the same numbers on both sides."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gradstat.theory import pot, scalars
from gradstat.theory.kernels.policy import forced
from gradstat.theory.kernels.primitives import gather_at_least
from gradstat.theory.pot import multistage_threshold

REL = {"closed_form": 1e-12, "mle": 1e-9}
"""Agreement asked of every threshold and parameter. Closed forms: a few float64 ulps amplified by at most a few
dozen scalar operations (the quantiles' logarithms). Maximum likelihood: the gamma MLE's Newton steps take digamma
and trigamma from scipy on one side and torch on the other (ulps apart), and the generalized Pareto MLE of the next
stage stops its Newton iteration at a step tolerance, which passes a last-bit difference of its input on
amplified by the conditioning of the likelihood equation: measured up to 1.2e-11 (a shape of -0.0053 from inputs
7 ulps apart). A wrong expression, a statistic rounded to float32 where the other form keeps float64, or a bound
not rounded to x's dtype differs by 1e-8 or more."""


def _vector(kind: str, scale: float, seed: int, d: int = 20_000) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "laplace":
        x = torch.empty(d).exponential_(generator=g) * (torch.rand(d, generator=g) - 0.5).sign()
    elif kind == "gamma_half":
        # Gamma(1/2, 1) as Z^2 / 2 (chi-square with one degree of freedom, halved), drawn from the seeded
        # generator: torch.distributions.Gamma draws from the global one, which made the vector depend on test order
        x = torch.randn(d, generator=g).square() / 2 * (torch.rand(d, generator=g) - 0.5).sign()
    elif kind == "zeros":  # 60 % exact zeros (ReLU-like)
        x = torch.empty(d).exponential_(generator=g)
        x[torch.rand(d, generator=g) < 0.6] = 0.0
    elif kind == "two_values":  # degenerate later stages: ties everywhere
        x = torch.where(torch.rand(d, generator=g) < 0.99, 1.0, 2.0)
    else:
        raise AssertionError(kind)
    return (x * scale).float()


def _run(x: torch.Tensor, host: bool, monkeypatch: pytest.MonkeyPatch, **kw: object) -> pot.PotResult | str:
    with monkeypatch.context() as m:
        m.setattr(scalars, "on_host", lambda _x: host)
        try:
            return multistage_threshold(x, **kw)  # type: ignore[arg-type]
        except ValueError as exc:
            return f"ValueError: {exc}"


def _close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    u, v = float(a), float(b)
    if math.isnan(u) or math.isnan(v):
        return math.isnan(u) and math.isnan(v)
    return u == v or abs(u - v) <= rel * max(abs(u), abs(v))


def _assert_same(
    host: pot.PotResult | str, device: pot.PotResult | str, what: str, method: str = "closed_form"
) -> None:
    rel = REL[method]
    if isinstance(host, str) or isinstance(device, str):
        assert host == device, what
        return
    assert _close(host.threshold, device.threshold, rel), (what, float(host.threshold), float(device.threshold))
    assert host.stopped_reason == device.stopped_reason, what
    assert len(host.stages) == len(device.stages), what
    for m, (h, d) in enumerate(zip(host.stages, device.stages, strict=True), start=1):
        assert isinstance(h.threshold, torch.Tensor) and h.threshold.dtype == torch.float64, (what, m)
        assert _close(h.threshold, d.threshold, rel), (what, m, float(h.threshold), float(d.threshold))
        assert (h.survivors is None) == (d.survivors is None), (what, m)
        if h.survivors is not None and d.survivors is not None:
            assert int(h.survivors) == int(d.survivors), (what, m)
        assert h.fit.params.keys() == d.fit.params.keys(), (what, m)
        for name in h.fit.params:
            assert isinstance(h.fit.params[name], torch.Tensor), (what, m, name)
            assert _close(h.fit.params[name], d.fit.params[name], rel), (what, m, name)
        assert h.fit.converged == d.fit.converged and h.fit.warnings == d.fit.warnings, (what, m)
        assert h.fit.n == d.fit.n, (what, m)


CASES = [
    (first, stages, anchor, method)
    for first in ("exponential", "gamma", "genpareto")
    for stages in (1, 3)
    for anchor in ("threshold", "min_survivor")
    for method in ("closed_form", "mle")
    if not (stages == 1 and anchor == "min_survivor")
]


@pytest.mark.parametrize("first, stages, anchor, method", CASES)
@pytest.mark.parametrize("kind, scale", [("laplace", 1.0), ("gamma_half", 1e-30), ("zeros", 1e30), ("two_values", 1.0)])
def test_host_numbers_and_tensors_give_the_same_thresholds_and_fits(
    first: str, stages: int, anchor: str, method: str, kind: str, scale: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _vector(kind, scale, seed=stages)
    for signed in (False, True):
        v = x if signed else x.abs()
        kw = dict(ratio=1e-3, stages=stages, first=first, anchor=anchor, method=method, signed=signed)
        what = f"{kind} x{scale} signed={signed}"
        _assert_same(_run(v, True, monkeypatch, **kw), _run(v, False, monkeypatch, **kw), what, method)
    if stages > 1:  # the narrowed last stage (SIDCo's encode), with the count left to the caller
        kw = dict(ratio=1e-3, stages=stages, first=first, anchor=anchor, method=method, signed=True)
        kw.update(final_count=False, narrow=lambda v, t: gather_at_least(v, t, signed=True))
        host, device = _run(x, True, monkeypatch, **kw), _run(x, False, monkeypatch, **kw)
        _assert_same(host, device, f"{kind} x{scale} narrowed", method)


@pytest.mark.parametrize("quantile", ["exact", "approx"])
def test_the_gamma_quantiles_agree(quantile: str, monkeypatch: pytest.MonkeyPatch) -> None:
    x = _vector("gamma_half", 1.0, seed=7).abs()
    for ratio in (0.3, 1e-2, 1e-4):
        kw = dict(ratio=ratio, stages=1, first="gamma", quantile=quantile)
        _assert_same(_run(x, True, monkeypatch, **kw), _run(x, False, monkeypatch, **kw), f"{quantile} {ratio}")


def test_the_host_form_runs_on_a_cpu_unless_the_policy_is_never() -> None:
    x = torch.ones(4)
    assert scalars.on_host(x)
    with forced("never"):
        assert not scalars.on_host(x)


@pytest.mark.parametrize(
    "fn, value",
    [
        (scalars.log, 0.0),
        (scalars.log, -1.0),
        (scalars.sqrt, -1.0),
        (scalars.expm1, 1000.0),
        (scalars.expm1, -1000.0),
        (scalars.lgamma, 0.0),
        (scalars.digamma, 0.0),
        (scalars.trigamma, 1e300),
    ],
)
def test_each_function_gives_what_torch_gives_at_the_edges(fn, value: float) -> None:
    with np.errstate(all="ignore"):
        host = float(fn(np.float64(value)))
    device = float(fn(torch.tensor(value, dtype=torch.float64)))
    assert (math.isnan(host) and math.isnan(device)) or host == pytest.approx(device, rel=1e-14), (host, device)


def test_the_host_trigamma_is_exact_where_torch_is_not() -> None:
    # psi'(1/2) = pi^2 / 2 and psi'(1) = pi^2 / 6; torch 2.13's polygamma(1, 0.5) is 3e-10 off (4.934802202073678),
    # which is why the gamma MLE's Newton steps differ in their last bits between the two forms (see REL)
    assert float(scalars.trigamma(np.float64(0.5))) == pytest.approx(math.pi**2 / 2, rel=1e-15)
    assert float(scalars.trigamma(np.float64(1.0))) == pytest.approx(math.pi**2 / 6, rel=1e-15)


def test_where_clamp_and_not_keep_their_kind_and_nan() -> None:
    nan = np.float64(math.nan)
    assert math.isnan(scalars.clamp_min(nan, 0.0)) and math.isnan(scalars.clamp_max(nan, 1.0))
    assert scalars.clamp_min(np.float64(-1.0), 0.0) == 0.0 and scalars.clamp_max(np.float64(3.0), 1.0) == 1.0
    assert scalars.where(np.bool_(True), np.float64(1.0), 2.0) == 1.0
    assert isinstance(scalars.where(np.bool_(False), np.float64(1.0), 2.0), np.float64)
    assert scalars.logical_not(False) is np.True_  # (~False is -1 in Python)
    t = scalars.where(torch.tensor(False), torch.tensor(1.0, dtype=torch.float64), 2.0)
    assert isinstance(t, torch.Tensor) and float(t) == 2.0


@pytest.mark.parametrize("first", ["exponential", "gamma", "genpareto"])
@pytest.mark.parametrize("kind", ["laplace", "two_values"])
def test_without_details_the_threshold_and_the_reason_are_the_same(first: str, kind: str) -> None:
    x = _vector(kind, 1.0, seed=5)
    for stages in (1, 3):
        full = multistage_threshold(x, 1e-3, stages, first=first, signed=True)
        lean = multistage_threshold(x, 1e-3, stages, first=first, signed=True, details=False)
        assert lean.stages == [] and len(full.stages) >= 1
        assert lean.threshold.dtype == torch.float64 and torch.equal(lean.threshold, full.threshold), stages
        assert lean.stopped_reason == full.stopped_reason

"""The device form of the multi-stage threshold (gradstat.theory.pot.deferred_threshold): it reads nothing back to
the host (proved on meta tensors, where every read raises), it flags exactly the inputs it does not represent, and
elsewhere its threshold and reason to stop are those of multistage_threshold with the closed forms.

Agreement asked: bit for bit with the synchronous form computing on 0-d tensors (the ``never`` kernel policy on a
CPU: the same float64 operations on the same statistics); 1e-12 relative with the synchronous form computing on
host numbers (the default policy on a CPU), whose logarithms, lgamma and gamma quantile come from libm and scipy
rather than torch: a few ulps, amplified by a few dozen scalar operations (tests/theory/test_scalars.py bounds the
same two forms the same way). A statistic rounded to float32, a unit off by a factor of two or a ratio off by one
element differs by 1e-8 or more."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from _no_host_reads import no_copy_to_device, on_meta

from gradstat.theory.estimators.exceedances import device_unit, unit_for
from gradstat.theory.kernels.policy import forced
from gradstat.theory.kernels.stage_stats import summary
from gradstat.theory.pot import FIRST, DeferredPot, deferred_threshold, multistage_threshold
from gradstat.theory.thresholds import tail_quantile

REL_HOST = 1e-12
"""Agreement with the synchronous form on host numbers (see the module docstring); with 0-d tensors it is exact."""


def _vector(kind: str, d: int, scale: float, seed: int, zeros: float = 0.2) -> torch.Tensor:
    """Signed float32 values of one law, a fraction ``zeros`` of them exact zeros, times ``scale``."""
    g = torch.Generator().manual_seed(seed)
    sign = (torch.rand(d, generator=g) - 0.5).sign()
    if kind == "laplace":  # (inverse transform of seeded uniforms: the same numbers under every torch version)
        x = -torch.log1p(-torch.rand(d, generator=g, dtype=torch.float64))
    elif kind == "gamma_like":  # gamma(0.5) magnitudes, Z^2 / 2: a sharper peak at 0 than the exponential
        x = torch.randn(d, generator=g, dtype=torch.float64).square() / 2
    elif kind == "heavy":  # Pareto magnitudes of tail index 2.5: a finite variance, an infinite fourth moment
        x = torch.rand(d, generator=g, dtype=torch.float64).pow(-1.0 / 2.5) - 1.0
    elif kind == "ties":  # two magnitudes: later stages see constant exceedances or none (they stop)
        x = torch.where(torch.rand(d, generator=g) < 0.99, 1.0, 2.0).double()
    else:
        raise AssertionError(kind)
    x = torch.where(torch.rand(d, generator=g) < zeros, 0.0, x * sign)
    return (x * scale).float()


def _caller_stats(x: torch.Tensor, first: str, signed: bool) -> torch.Tensor:
    """The summary a compressor reads before the fit (compressors/schemes/sparsifiers/sidco.py ``_summary``): the
    minima for a shaped law (and always for magnitudes, whose signs they check), the sum of squares for the
    generalized Pareto, the logarithms for the gamma (of signed values: the summary takes them of |x|)."""
    shaped = first != "exponential"
    return summary(x, signed, shaped or not signed, first == "genpareto", first == "gamma" and signed)


def _settled(pot: DeferredPot) -> tuple[bool, str | None]:
    return pot.settle(pot.reads.tolist())


def _cases() -> Iterator[tuple[float, int, str]]:
    """(ratio, stages, anchor): 1 to 4 stages for every ratio, both anchors beyond one stage; and 8 stages at the
    smallest ratio, whose last stages see a handful of survivors (on 1000 elements) and may stop."""
    for ratio, stages, anchor in itertools.product((1e-3, 1e-2, 0.1), (1, 2, 3, 4, 8), ("threshold", "min_survivor")):
        if not (stages == 1 and anchor == "min_survivor" or stages == 8 and ratio != 1e-3):
            yield ratio, stages, anchor


def _out_of_range(signed: bool, scale: float) -> bool:
    """Where the device form is expected to ask for the synchronous path on ordinary data: magnitudes read by the
    plain reductions (no C loop: the ``never`` policy) at a scale whose unit is outside 2^-32..2^32 (float32)."""
    return not signed and scale != 1.0


def _compare(policy: str, kind: str, d: int, scale: float, first: str, seed: int) -> list[str]:
    """Every case of :func:`_cases` on one vector, signed and magnitudes, every other one with the caller's summary
    (the rest read their own): the failures, described."""
    failures = []
    x = _vector(kind, d, scale, seed)
    quantiles = ("exact", "approx") if first == "gamma" else ("exact",)  # ('approx' changes the gamma only)
    with forced(policy):
        for case, (signed, (ratio, stages, anchor), quantile) in enumerate(
            itertools.product((False, True), _cases(), quantiles)
        ):
            given = (case + seed) % 2 == 1
            v = x if signed else x.abs()
            stats = _caller_stats(v, first, signed) if given else None
            kw = dict(first=first, anchor=anchor, quantile=quantile, signed=signed)
            what = f"{policy} {kind} d={d} x{scale} {first} signed={signed} stats={given} {ratio} {stages} {kw}"
            pot = deferred_threshold(v, ratio, stages, stats=stats, **kw)
            exact_path, reason = _settled(pot)
            if exact_path != (policy == "never" and _out_of_range(signed, scale)):
                failures.append(f"{what}: exact_path {exact_path}")
                continue
            if exact_path:
                continue
            want = multistage_threshold(
                v, ratio, stages, stats=stats, method="closed_form", final_count=False, details=False, **kw
            )
            got, expected = float(pot.threshold), float(want.threshold)
            same = got == expected if policy == "never" else abs(got - expected) <= REL_HOST * abs(expected)
            if not same or reason != want.stopped_reason:
                failures.append(f"{what}: {got!r} vs {expected!r}, {reason!r} vs {want.stopped_reason!r}")
    return failures


# ---- no host read -------------------------------------------------------------------------------------------------
@on_meta
@pytest.mark.parametrize(
    "first, signed, given",
    list(itertools.product(FIRST, (False, True), (False, True))),
)
def test_the_device_form_reads_nothing_back(first: str, signed: bool, given: bool) -> None:
    """On meta tensors every read raises (item, float, int, bool, an ``if`` on a tensor, tolist, cpu, numpy,
    nonzero, boolean masks): the whole call, for every stage count and anchor, runs without one, and copies
    nothing from the host to the device (the caller's summary, when given, is read before)."""
    x = torch.empty(260_000, device="meta")
    stats = _caller_stats(x, first, signed) if given else None
    for stages, anchor in itertools.product((1, 2, 3), ("threshold", "min_survivor")):
        with no_copy_to_device():
            pot = deferred_threshold(x, 1e-3, stages, first=first, anchor=anchor, signed=signed, stats=stats)
        assert (
            pot.threshold.device.type == "meta" and pot.threshold.shape == () and pot.threshold.dtype == torch.float64
        )
        assert pot.reads.device.type == "meta" and pot.reads.dtype == torch.float64
        assert pot.reads.shape == (1 + 2 * stages,)  # the flag, then each stage's count and validity


def test_the_meta_proof_catches_a_read() -> None:
    """The proof above would see a read: the synchronous form, which reads its facts back, fails on meta tensors."""
    with pytest.raises((RuntimeError, NotImplementedError)):
        multistage_threshold(torch.empty(1000, device="meta"), 1e-2, 2, final_count=False, details=False)


def test_the_meta_proof_catches_a_copy_to_the_device() -> None:
    for copy in (lambda: torch.tensor(1.0, device="meta"), lambda: torch.ones(1).to("meta")):
        with pytest.raises(AssertionError), no_copy_to_device():
            copy()


# ---- the same thresholds and reasons ------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["never", "auto"])
@pytest.mark.parametrize("first", FIRST)
@pytest.mark.parametrize("kind", ["laplace", "gamma_like", "heavy", "ties"])
def test_the_threshold_and_the_reason_to_stop_are_the_synchronous_forms(policy: str, first: str, kind: str) -> None:
    """d = 1000: ratios 1e-3 to 0.1, 1 to 4 stages and 8 at 1e-3 (whose last stages see few survivors, and stop
    on some vectors; ties stop at stage 2 or 3), both anchors, the gamma's two quantiles, signed values and
    magnitudes, with and without the caller's summary, at scales 1e-30, 1 and 1e30, a fifth of the elements zero.
    Under ``never`` bit for bit; under the default policy (host numbers) within :data:`REL_HOST`."""
    failures = []
    for seed, scale in enumerate((1e-30, 1.0, 1e30)):
        failures += _compare(policy, kind, 1000, scale, first, seed)
    assert not failures, "\n".join(failures[:10])


@pytest.mark.parametrize("policy", ["never", "auto"])
@pytest.mark.parametrize("first", FIRST)
def test_the_thresholds_agree_on_a_large_vector(policy: str, first: str) -> None:
    """d = 100,003 (not a multiple of any block size), heavy-tailed values at scale 1."""
    assert not (failures := _compare(policy, "heavy", 100_003, 1.0, first, seed=11)), "\n".join(failures[:10])


def test_stages_that_stop_early_give_the_same_reasons() -> None:
    """Every kind of stop, each with the synchronous form's reason and threshold: a last stage with one survivor
    (8 stages at ratio 1e-3 on 1000 elements), constant exceedances (a degenerate fit) and none at all (ties)."""
    seen = set()
    with forced("never"):
        for kind, seed, first in itertools.product(("laplace", "ties"), range(4), FIRST):
            x = _vector(kind, 1000, 1.0, seed)
            for stages, anchor in itertools.product((3, 8), ("threshold", "min_survivor")):
                pot = deferred_threshold(x, 1e-3, stages, first=first, anchor=anchor, signed=True)
                want = multistage_threshold(
                    x, 1e-3, stages, first=first, anchor=anchor, signed=True, final_count=False, details=False
                )
                assert _settled(pot) == (False, want.stopped_reason), (kind, seed, first, stages, anchor)
                assert float(pot.threshold) == float(want.threshold), (kind, seed, first, stages, anchor)
                if want.stopped_reason is not None:
                    seen.add(want.stopped_reason.split(": ")[1].split(" above")[0])
    assert seen == {"one survivor", "no survivor", "degenerate fit (zero variance or non-finite parameters)"}


# ---- the inputs it leaves to the synchronous form ------------------------------------------------------------------
def _flagged(x: torch.Tensor, first: str = "exponential", signed: bool = False, **kw: object) -> bool:
    return _settled(deferred_threshold(x, 1e-2, 3, first=first, signed=signed, **kw))[0]  # type: ignore[arg-type]


def _raises(x: torch.Tensor, first: str, signed: bool = False, **kw: object) -> bool:
    try:
        multistage_threshold(x, 1e-2, 3, first=first, signed=signed, final_count=False, details=False, **kw)  # type: ignore[arg-type]
    except ValueError:
        return True
    return False


def _ordinary(d: int = 1000) -> torch.Tensor:
    return _vector("laplace", d, 1.0, seed=3, zeros=0.0)


@pytest.mark.parametrize("first", FIRST)
@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_values_take_the_synchronous_path(first: str, signed: bool, bad: float) -> None:
    x = _ordinary()
    x[17] = bad
    v = x if signed else x.abs()
    assert _flagged(v, first, signed) and _raises(v, first, signed)
    assert not _flagged(_ordinary() if signed else _ordinary().abs(), first, signed)


@pytest.mark.parametrize("first", FIRST)
@pytest.mark.parametrize("signed", [False, True])
def test_an_all_zero_vector_takes_the_synchronous_path(first: str, signed: bool) -> None:
    x = torch.zeros(1000)
    assert _flagged(x, first, signed) and _raises(x, first, signed)


@pytest.mark.parametrize("first", FIRST)
def test_negative_magnitudes_take_the_synchronous_path(first: str) -> None:
    x = _ordinary().abs()
    x[3] = -1.0
    assert _flagged(x, first) and _raises(x, first)


@pytest.mark.parametrize("first", FIRST)
@pytest.mark.parametrize("signed", [False, True])
def test_a_single_non_zero_takes_the_synchronous_path(first: str, signed: bool) -> None:
    """A shaped law cannot fit it (the validation raises); the exponential's stage 1 would need 10 of 1 non-zero."""
    x = torch.zeros(1000)
    x[5] = -2.0 if signed else 2.0
    assert _flagged(x, first, signed)
    assert _raises(x, first, signed) == (first != "exponential")


@pytest.mark.parametrize("first", ["gamma", "genpareto"])
@pytest.mark.parametrize("signed", [False, True])
def test_constant_magnitudes_take_the_synchronous_path_with_a_shaped_law(first: str, signed: bool) -> None:
    x = torch.where(torch.arange(1000) % 3 == 0, 0.0, 0.5)
    if signed:
        x = torch.where(torch.arange(1000) % 2 == 0, x, -x)
    assert _flagged(x, first, signed) and _raises(x, first, signed)
    assert not _flagged(x, "exponential", signed)  # the exponential fits constant data (later stages stop)


@pytest.mark.parametrize("first", FIRST)
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_fewer_non_zeros_than_stage_1_needs_take_the_synchronous_path(first: str, stages: int) -> None:
    """delta_1 d / n >= 1: the synchronous form keeps every non-zero and re-splits the later ratios (its note)."""
    x = _ordinary()
    ratio = 0.1 if stages == 1 else 0.01
    sparse = torch.where(torch.arange(1000) % 5 == 0, x, 0.0)  # 200 non-zeros: delta_1 = 0.25 needs 250
    pot = deferred_threshold(sparse.abs(), ratio, stages, first=first)
    assert _settled(pot)[0] == (stages > 1)  # (one stage: 0.1 d = 100 of 200, conditional ratio 1/2)
    just_enough = torch.where(torch.arange(1000) % 4 == 0, x, 0.0)  # 250 non-zeros: exactly delta_1 d
    assert _settled(deferred_threshold(just_enough.abs(), 0.01, 2, first=first))[0]
    more = torch.where(torch.arange(1000) % 4 != 1, x, 0.0)  # 750 non-zeros
    assert not _settled(deferred_threshold(more.abs(), ratio, stages, first=first))[0]


@pytest.mark.parametrize("first", ["gamma", "genpareto"])
def test_a_summary_without_what_the_checks_read_takes_the_synchronous_path(first: str) -> None:
    x = _ordinary()
    without_minima = summary(x, True, False, True, False)
    assert _flagged(x, first, True, stats=without_minima) and _raises(x, first, True, stats=without_minima)
    if first == "genpareto":
        without_squares = summary(x, True, True, False, False)
        assert _flagged(x, first, True, stats=without_squares) and _raises(x, first, True, stats=without_squares)


@pytest.mark.parametrize("first", FIRST)
def test_magnitudes_beyond_the_plain_reductions_range_take_the_synchronous_path(first: str) -> None:
    """Magnitudes read by the plain reductions (``never``: no C loop) at a unit outside 2^-32..2^32 (float32),
    where the synchronous form normalises the values before it sums them; signed values go through the fused
    kernel and are represented at every scale."""
    with forced("never"):
        for scale in (1e-11, 2e10):
            x = _ordinary() * scale
            assert _flagged(x.abs(), first) and not _flagged(x, first, True)
        assert not _flagged(_ordinary().abs() * 1e-9, first) and not _flagged(_ordinary().abs() * 1e8, first)
        assert not _flagged(_ordinary().abs().double() * 1e30, first)  # (float64: 2^-256..2^256)


def test_a_gamma_fit_of_values_spanning_the_exponent_range_takes_the_synchronous_path() -> None:
    """Plain reductions: the smallest non-zero over the unit underflows float32, where the synchronous form takes
    its logarithms in float64."""
    with forced("never"):
        x = _ordinary().abs()
        x[9] = 1e-40  # a float32 denormal
        assert _flagged(x, "gamma") and not _flagged(x, "genpareto") and not _flagged(x, "gamma", signed=True)
        x[9] = 1e-37
        assert not _flagged(x, "gamma")


def test_the_arguments_are_checked_as_the_synchronous_form_checks_them() -> None:
    x = _ordinary()
    for args, kw, match in [
        ((x, 0.0, 2), {}, "ratio"),
        ((x, 0.3, 2), {}, "below first_ratio"),
        ((x, 0.01, 0), {}, "stages"),
        ((x, 0.01, 2), {"first": "pareto"}, "first"),
        ((x, 0.01, 2), {"anchor": "median"}, "anchor"),
        ((x, 0.01, 2), {"quantile": "close"}, "quantile"),
        ((torch.empty(0), 0.01, 2), {}, "empty"),
        ((torch.rand(99), 0.01, 2), {}, "at least"),
    ]:
        with pytest.raises(ValueError, match=match):
            deferred_threshold(*args, **kw)  # type: ignore[arg-type]


# ---- the pieces ---------------------------------------------------------------------------------------------------
def test_the_device_unit_is_the_host_unit() -> None:
    """The same power of two at every exponent of float64, at and just below powers of two, for denormals, the
    largest finite value, and the fallback 1 for 0, negative and non-finite maxima."""
    tops = [2.0**e * f for e in range(-1074, 1024, 7) for f in (1.0, 1.5, 1.999999)] + [2.0**-1074, 1e-310, 1.0]
    tops += [math.nextafter(2.0**e, 0.0) for e in (-1000, -1, 0, 1, 100, 1000)] + [torch.finfo(torch.float64).max]
    tops += [0.0, -3.0, math.inf, math.nan]
    device = device_unit(torch.tensor(tops, dtype=torch.float64))
    assert device.tolist() == [unit_for(t) for t in tops]


def test_a_validated_tail_is_a_0d_tensor_of_the_parameters_kind() -> None:
    params = {"scale": torch.tensor(2.0, dtype=torch.float64)}
    tail = torch.tensor(0.01, dtype=torch.float64)
    assert float(tail_quantile("exponential", params, tail, validated=True)) == float(
        tail_quantile("exponential", params, 0.01)
    )
    for bad in (0.01, tail.float(), tail.reshape(1)):
        with pytest.raises(TypeError, match="validated"):
            tail_quantile("exponential", params, bad, validated=True)
    with pytest.raises(TypeError, match="validated"):
        tail_quantile("exponential", {"scale": np.float64(2.0)}, tail, validated=True)

"""The deferred multi-stage threshold compiled as one function (theory/pot.py, DEFERRED_STAGES) against its eager
form, on every device present where torch.compile builds kernels (C++ on a CPU, Triton on CUDA).

Compiled, the stages' statistics and their hundreds of scalar operations become a few generated kernels; the
result must be the eager one's: the flags and every stage's count and validity exactly, the threshold to 1e-12
relative (the generated code may sum in another order and take its logarithms by its own routines; measured on
this CPU: exponential and generalized Pareto within 2e-16, gamma 6e-13, its Halley steps on the quantile)."""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch
from test_pot_deferred import _vector

from gradstat.theory.kernels import policy, triton_gamma
from gradstat.theory.kernels.policy import forced
from gradstat.theory.kernels.stage_stats import summary
from gradstat.theory.pot import DEFERRED_STAGES, deferred_threshold, multistage_threshold

RTOL = 1e-12

CASES = [
    ("exponential", 1, "threshold"),
    ("exponential", 3, "threshold"),
    ("gamma", 3, "threshold"),
    ("genpareto", 3, "min_survivor"),
]


def _laplace(n: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).float().to(device)


@pytest.mark.parametrize(("first", "stages", "anchor"), CASES)
def test_the_compiled_stages_equal_the_eager_ones(first, stages, anchor, device):
    if not policy.compiler_for(device.type):
        pytest.skip(f"torch.compile builds no kernel for {device.type} here")
    g = _laplace(300_000, 3, device)
    stats = summary(g, True, first != "exponential", first == "genpareto", first == "gamma")
    args = (g, stats, 1e-3, stages, first, 0.25, anchor, "exact", True)
    with forced("never"):
        eager = DEFERRED_STAGES(*args)
    with forced("always"), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a failed build warns and runs eagerly: fail instead
        # and no warning of the trace reaches a user (dynamo's at a functools.lru_cache call, once in the fits)
        warnings.filterwarnings("error", message=".*lru_cache", category=UserWarning)
        DEFERRED_STAGES._compiled = None  # (a fresh trace: the warnings come while tracing)
        torch._dynamo.reset()
        compiled = DEFERRED_STAGES(*args)
        assert DEFERRED_STAGES.compiled_for(g)
    torch.testing.assert_close(compiled[0], eager[0], rtol=RTOL, atol=0.0)
    assert torch.equal(compiled[1:], eager[1:])
    assert not bool(eager[1])  # ordinary data: the deferred form stands (else this test compares flags only)


def test_the_compiled_form_gives_the_synchronous_threshold_and_reason(device):
    """Through deferred_threshold as a compressor calls it, compiled: the threshold and the reason the stages stopped
    are the synchronous form's, on vectors where 8 stages at ratio 1e-3 on 1,000 elements stop early (the deferred
    threshold's own test's vectors: Laplace, and two magnitudes whose later stages see constant exceedances)."""
    if not policy.compiler_for(device.type):
        pytest.skip(f"torch.compile builds no kernel for {device.type} here")
    stops = 0
    for kind, seed in itertools.product(("laplace", "ties"), range(4)):
        g = _vector(kind, 1000, 1.0, seed).to(device)
        with forced("always"), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            pot = deferred_threshold(g, 1e-3, 8, signed=True)
            values = pot.reads.tolist()
        with forced("never"):
            want = multistage_threshold(g, 1e-3, 8, signed=True, final_count=False, details=False)
        assert pot.settle(values) == (False, want.stopped_reason), (kind, seed)
        torch.testing.assert_close(pot.threshold, want.threshold, rtol=RTOL, atol=0.0)
        stops += want.stopped_reason is not None
    assert stops >= 2  # the stops were compared, not only completed stages


def _compiled_stages(args: tuple) -> torch.Tensor:
    """DEFERRED_STAGES compiled afresh on ``args`` (no warning allowed: a failed build would run eagerly)."""
    with forced("always"), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        DEFERRED_STAGES._compiled = None
        torch._dynamo.reset()
        try:
            return DEFERRED_STAGES(*args)
        finally:
            DEFERRED_STAGES._compiled = None
            torch._dynamo.reset()


@pytest.mark.parametrize("signed", [True, False])
@pytest.mark.parametrize(("first", "stages", "anchor"), CASES)
def test_the_compiled_stages_calling_the_triton_statistics_equal_the_traced_ones(
    first, stages, anchor, signed, monkeypatch
):
    """On CUDA the compiled stages call the Triton statistics as opaque operators (theory/kernels/triton_stats.py,
    ``GRAPH_DEVICES``) instead of tracing the reference sums into kernels of their own. The same path here, the
    operators run through Triton's interpreter on the CPU, every call counted: on the signed vector with the caller's
    summary (as SIDCo calls it) and on magnitudes without one (the stages then take their own summary, in the graph);
    the result is the compiled stages' without the operators (whose own agreement with eager is the test above)."""
    from gradstat.theory.kernels import triton_stats

    if not policy.compiler_for("cpu") or triton_stats.TAIL_OP is None:
        pytest.skip("needs torch.compile for the CPU, Triton and torch.library.custom_op")
    g = _laplace(20_000, 4, torch.device("cpu"))
    x = g if signed else g.abs()
    stats = summary(g, True, first != "exponential", first == "genpareto", first == "gamma") if signed else None
    args = (x, stats, 1e-3, stages, first, 0.25, anchor, "exact", signed)
    traced = _compiled_stages(args)
    calls, summaries = [], []
    tail, whole = triton_stats.tail_moments, triton_stats.summary

    def counted(*a):
        calls.append(a[0].numel())
        return tail(*a)

    def counted_summary(*a):
        summaries.append(a[0].numel())
        return whole(*a)

    monkeypatch.setattr(triton_stats, "tail_moments", counted)
    monkeypatch.setattr(triton_stats, "summary", counted_summary)
    monkeypatch.setattr(triton_stats, "GRAPH_DEVICES", ("cuda", "cpu"))
    called = _compiled_stages(args)
    # one operator call per later stage, on the whole vector, and the gamma's first stage (its sum of logarithms)
    assert len(calls) == stages - 1 + (first == "gamma")
    assert all(n == g.numel() for n in calls)
    assert summaries == ([] if signed else [g.numel()])
    # the gamma's logarithms: each one of the kernel's within 2 float32 ulps of torch's (the catalog's bound), which
    # moves the mean log and so the Newton quantile; measured 2.0e-12 relative here (numpy's float32 log in the
    # interpreter against torch's), so 1e-9 leaves 500x; every other law sums float64 in another order only
    rtol = 1e-9 if first == "gamma" else RTOL
    torch.testing.assert_close(called[0], traced[0], rtol=rtol, atol=0.0)
    assert torch.equal(called[1:], traced[1:])


def test_the_compiled_gamma_stages_call_the_quantile_kernel_as_their_operator(monkeypatch):
    """On CUDA the gamma quantile's Halley steps are one Triton kernel, called by the compiled stages as the operator
    gradstat::gamma_halley (theory/kernels/triton_gamma.py); here on a CPU through Triton's interpreter, the operator
    path opened to CPU tensors. The trace reads no policy or context variable (it would fail, and the stages would
    turn eager with a warning), the operator runs once per call, and the threshold equals the eager one's (the torch
    steps) to the test's 1e-12: measured here 5e-13, the kernel and torch each evaluating P and Q their own way."""
    if not policy.compiler_for("cpu") or triton_gamma.HALLEY_OP is None:
        pytest.skip("torch.compile builds no CPU kernel here, or this torch has no custom operators")
    calls = []
    original = triton_gamma.halley

    def counted(*args):  # type: ignore[no-untyped-def]
        calls.append(args[-1])
        return original(*args)

    monkeypatch.setattr(triton_gamma, "GRAPH_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(triton_gamma, "halley", counted)
    g = _laplace(300_000, 3, torch.device("cpu"))
    stats = summary(g, True, True, False, True)
    args = (g, stats, 1e-3, 3, "gamma", 0.25, "threshold", "exact", True)
    with forced("never"):
        eager = DEFERRED_STAGES(*args)
    assert not calls  # (eager on a CPU: the torch steps)
    with forced("always"), warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        warnings.filterwarnings("error", message=".*lru_cache", category=UserWarning)
        DEFERRED_STAGES._compiled = None
        torch._dynamo.reset()
        try:
            compiled = DEFERRED_STAGES(*args)
            assert DEFERRED_STAGES.compiled_for(g)
        finally:
            DEFERRED_STAGES._compiled = None  # (the next test traces afresh, without the opened path)
            torch._dynamo.reset()
    assert calls == [3]  # (q >= delta_1 = 0.25: three steps)
    torch.testing.assert_close(compiled[0], eager[0], rtol=RTOL, atol=0.0)
    assert torch.equal(compiled[1:], eager[1:])

"""The fused kernels: compiled equals the eager reference, the policy is honoured, a failed build falls back, and
SIDCo's fused path (|g| read inside the kernels, never formed) selects what the eager path selects.

Compiled cases need torch.compile and a C++ compiler (skipped, saying so, where there is none); each asserts that
the kernel really ran compiled, so a silent fallback cannot pass for a compiled result.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gradstat import compressors
from gradstat.compressors.context import Context
from gradstat.compressors.schemes.sparsifiers.sidco import exceedances_above
from gradstat.theory.estimators import exceedances as exc_mod
from gradstat.theory.estimators.exceedances import Exceedances
from gradstat.theory.kernels import policy as policy_mod
from gradstat.theory.kernels import triton_runtime
from gradstat.theory.kernels.fused import Fused, TritonForm
from gradstat.theory.kernels.policy import forced, policy
from gradstat.theory.kernels.primitives import block_max
from gradstat.theory.kernels.stage_stats import summary, tail_moments
from gradstat.theory.pot import multistage_threshold

needs_compiler = pytest.mark.skipif(not policy_mod.can_compile(), reason="no C++ compiler for torch.compile here")


def _laplace(n: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).to(dtype)


def _compiled(kernel: Fused, *args):
    with forced("always"):
        out = kernel(*args)
    assert not kernel._broken, f"{kernel.name} did not compile"
    return out


# -- policy ---------------------------------------------------------------------------------------------------------
def test_policy_reads_the_environment_and_rejects_other_values(monkeypatch):
    monkeypatch.delenv(policy_mod.ENV, raising=False)
    assert policy() == "auto"
    monkeypatch.setenv(policy_mod.ENV, "Never")
    assert policy() == "never"
    assert not tail_moments.compiled_for(torch.zeros(policy_mod.MIN_ELEMENTS))
    monkeypatch.setenv(policy_mod.ENV, "0")
    assert policy() == "never"
    monkeypatch.setenv(policy_mod.ENV, "on")
    assert policy() == "always"
    monkeypatch.setenv(policy_mod.ENV, "sometimes")
    with pytest.raises(ValueError, match="GRADSTAT_COMPILE must be one of auto, always, never"):
        policy()
    with pytest.raises(ValueError, match="compile policy must be one of"):
        with forced("fast"):
            pass


def test_auto_compiles_only_large_cpu_vectors(monkeypatch):
    monkeypatch.setenv(policy_mod.ENV, "auto")
    assert not tail_moments.compiled_for(torch.zeros(policy_mod.MIN_ELEMENTS - 1))
    assert tail_moments.compiled_for(torch.zeros(policy_mod.MIN_ELEMENTS)) == policy_mod.can_compile()


def test_a_build_that_fails_warns_once_and_falls_back_to_the_reference(monkeypatch):
    def broken_compile(fn, **kwargs):
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(torch, "compile", broken_compile)
    kernel = Fused(lambda x: x.sum())
    x = torch.arange(10.0)
    with forced("always"):
        with pytest.warns(RuntimeWarning, match="the compiled fused kernel .* failed to build or run"):
            assert float(kernel(x)) == 45.0
        assert not kernel.compiled_for(x)  # stays eager for the rest of the run
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a second warning would fail here: the first one was the only one
            assert float(kernel(x)) == 45.0


def test_a_build_that_fails_during_a_graph_capture_fails_the_capture_and_keeps_the_kernel(monkeypatch):
    """Inside a CUDA graph's capture (some things CUDA refuses only then) the failure is raised, so the capture fails
    and its input launches directly; the compiled kernel is not turned off for the rest of the run."""

    def broken_compile(fn, **kwargs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch, "compile", broken_compile)
    monkeypatch.setattr(triton_runtime, "capturing", lambda: True)
    kernel = Fused(lambda x: x.sum())
    with forced("always"), pytest.raises(RuntimeError, match="stream is capturing"):
        kernel(torch.arange(10.0))
    assert not kernel._broken


def test_a_triton_form_runs_first_where_it_applies_and_a_failure_falls_back_once():
    """The Triton form of a kernel runs where it says it runs (a CUDA tensor in use; said of a CPU one here), before
    the C loop and the compiled form, not under ``never``; its first failure is reported once, and the other forms
    run from then on."""
    calls, failures = [], []

    def run(x):
        calls.append(x.numel())
        if len(calls) > 1:
            raise RuntimeError("no such kernel")
        return x.sum() + 100

    triton = TritonForm(run, lambda x: not failures, failures.append)
    kernel = Fused(lambda x: x.sum(), triton=triton)
    x = torch.arange(10.0)
    assert kernel.form_for(x) == "triton" and float(kernel(x)) == 145.0
    with forced("never"):
        assert kernel.form_for(x) == "eager" and float(kernel(x)) == 45.0
    assert float(kernel(x)) == 45.0  # failed: reported, and the reference answered
    assert len(failures) == 1 and str(failures[0]) == "no such kernel"
    assert kernel.form_for(x) != "triton" and float(kernel(x)) == 45.0 and len(calls) == 2


def test_the_triton_summary_checks_its_flags_as_the_other_forms():
    with pytest.raises(ValueError, match="summary without extremes needs magnitudes"):
        summary.triton.run(torch.ones(4), False, False)
    if summary.triton.op is not None:  # (torch 2.4 and newer: the operator compiled functions call)
        with pytest.raises(ValueError, match="summary with logarithms needs magnitudes"):
            summary.triton.op(torch.ones(4), False, True, True, True)


@pytest.mark.parametrize("name", ["summary", "tail_moments"])
def test_an_operator_whose_kernels_fail_reports_and_answers_with_the_reference(name, monkeypatch):
    """Inside a compiled function the Triton statistics are operators: a failed build or launch there is reported
    (once per process, which turns the form off) and the reference answers, instead of failing the whole function."""
    from gradstat.theory.kernels import triton_stats

    def broken(*args):
        raise RuntimeError("no kernel today")

    reported = []
    monkeypatch.setattr(triton_stats, name, broken)
    monkeypatch.setattr(triton_stats, "report", reported.append)
    x = _laplace(1000, 3)
    scalars = [torch.tensor(v, dtype=torch.float64) for v in (0.5, 0.5, 2.0)]
    args = (x, True, True, True, False) if name == "summary" else (x, *scalars, False, True)
    op = triton_stats._summary_op if name == "summary" else triton_stats._tail_op
    reference = summary.reference if name == "summary" else tail_moments.reference
    assert torch.equal(op(*args), reference(*args))
    assert [str(e) for e in reported] == ["no kernel today"]


def test_the_summary_has_a_triton_form_for_cuda_tensors_only():
    from gradstat.theory.kernels import triton_stats

    x = _laplace(1000, 5)
    assert summary.triton is not None and not triton_stats.runs_on(x)  # a CPU tensor: its C loop
    if triton_stats.exists(x):  # (Triton 3 or newer: its interpreter runs the kernels on the CPU)
        assert torch.equal(summary.triton.run(x, True), triton_stats.summary(x, True))


# -- compiled == eager reference ------------------------------------------------------------------------------------
@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30])
def test_compiled_kernels_equal_their_eager_reference(dtype, scale):
    x = _laplace(100_003, 1, dtype) * scale
    x[::7] = 0  # exact zeros are excluded from every used set
    x[5:9] = x[3]  # ties
    for absolute in (False, True):
        v = x if absolute else x.abs()
        got, want = _compiled(summary, v, absolute), summary.reference(v, absolute)
        assert torch.equal(got[:3], want[:3])  # min, max and count are exact
        # float64 sums of 1e5 terms in two orders: typical rounding ~sqrt(n) eps64 = 7e-14; 1e-12 is 15x that
        torch.testing.assert_close(got[3:], want[3:], rtol=1e-12, atol=0)
    # without the minima (magnitudes only): the same max, count and sums, the minima at their bounds 0 and +inf
    light, full = _compiled(summary, x, True, False), summary.reference(x, True)
    assert torch.equal(light[1:3], full[1:3]) and light[0] == 0 and light[5] == math.inf
    torch.testing.assert_close(light[3:5], full[3:5], rtol=1e-12, atol=0)
    assert torch.equal(summary.reference(x, True, False)[[0, 5]], light[[0, 5]])
    above = torch.tensor(float(x.abs().median()), dtype=torch.float64)
    shift = above * 1.01
    inv_unit = torch.tensor(2.0 ** -torch.frexp(x.abs().max()).exponent.item(), dtype=torch.float64)
    for logs in (False, True):
        got = _compiled(tail_moments, x, above, shift if not logs else above * 0, inv_unit, logs)
        want = tail_moments.reference(x, above, shift if not logs else above * 0, inv_unit, logs)
        assert got[0] == want[0]
        torch.testing.assert_close(got[:3], want[:3], rtol=1e-12, atol=0)
        if logs:  # logarithms in x's dtype: compiled and eager log kernels may differ by an ulp per element
            ulp = torch.finfo(dtype).eps
            bound = 2 * ulp * float(got[0]) * 120  # 2 ulps of |log z| per element; here z > 1e-45, so |log z| < 104
            assert abs(float(got[3] - want[3])) <= bound
    rows = x[: 64 * (x.numel() // 64)].view(-1, 64)
    assert torch.equal(_compiled(block_max, rows, True), block_max.reference(rows, True))


@needs_compiler
def test_fused_statistics_equal_the_eager_passes_within_float32_rounding(monkeypatch):
    """Exceedances' count, mean, variance and mean log from one fused pass against the eager masked reductions."""
    x = _laplace(200_000, 2).abs()
    x[::11] = 0
    above = torch.tensor(float(x.quantile(0.8)), dtype=torch.float64)
    cases = [dict(), dict(above=above), dict(above=above, shift=above * 1.0001)]
    for kw in cases:
        stats = {}
        for mode in ("never", "always"):
            with forced(mode):
                e = Exceedances(x, unit=0.5, **kw)
                stats[mode] = [e.count(), e.mean(), e.var()] + ([e.mean_log()] if not kw else [])
        assert stats["always"][0] == stats["never"][0]
        # the eager sums are float32 pairwise sums of 2e5 values (relative error up to ~log2(n) eps32 = 1e-6),
        # and the variance's sum z^2 - n mean^2 amplifies that by (var + mean^2) / var (~2 to 3 here): 1e-5
        # is ~2x that bound, and 100x below the differences a wrong statistic gives (the shift test below)
        for a, b in zip(stats["always"][1:], stats["never"][1:], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=0)


# -- SIDCo on the fused path ----------------------------------------------------------------------------------------
SIDCO = ["sidco:dist=exp,stages=3,ratio=0.001", "sidco:dist=gp,stages=2,ratio=0.01", "sidco:dist=gamma,ratio=0.01"]


EXACT = ["sidco:dist=exp,stages=3,ratio=0.001", "sidco:dist=gp,stages=2,ratio=0.01"]
EXACT += ["dgc:ratio=0.001", "gmc_topk:ratio=0.01", "threshold:eta=2.5", "tailcount:ratio=0.001"]


def _both_paths(comp, g, monkeypatch):
    with forced("always"):
        signed = comp.encode(g)
        with monkeypatch.context() as m:
            m.setattr(type(comp), "_signed_threshold", lambda self, *args: None)
            normalised = comp.encode(g)
    return signed, normalised


@needs_compiler
@pytest.mark.parametrize("spec", EXACT + ["sidco:dist=gamma,ratio=0.01"])
def test_signed_fused_path_is_exactly_the_normalised_path_at_every_scale(spec, monkeypatch):
    """The signed path's threshold is 2^e times the normalised one bit for bit (SIDCo's float64 sums, DGC's and
    GMC's sampled magnitudes, tailcount's float64 counts and excesses), or the given one (threshold), so both
    select the same coordinates; checked at power-of-two scales from 2^-120 to 2^120. The gamma first stage
    takes float32 logarithms of |g| on one path and of |g| 2^-e on the other: equal up to one rounding of each
    logarithm (relative 6e-8 per element), so its threshold agrees to 1e-6 (16x that) and its selection to
    within the few coordinates such a difference can move across the threshold."""
    comp = compressors.create(spec)
    g0 = _laplace(300_000, 3)
    for power in (-120, 0, 120):
        signed, normalised = _both_paths(comp, g0 * 2.0**power, monkeypatch)
        if spec in EXACT:
            assert float(signed.info["threshold"]) == float(normalised.info["threshold"])
            assert torch.equal(signed["indices"], normalised["indices"])
            assert torch.equal(signed["values"], normalised["values"])
        else:
            t_s, t_n = float(signed.info["threshold"]), float(normalised.info["threshold"])
            assert abs(t_s / t_n - 1) < 1e-6
            a, b = set(signed["indices"].tolist()), set(normalised["indices"].tolist())
            assert len(a ^ b) <= 2


@needs_compiler
def test_signed_path_keeps_magnitudes_the_normalisation_flushes_to_zero(monkeypatch):
    """A vector spanning more than float32's exponent range: normalising by the largest magnitude's power of two
    flushes |g| < 2^(e - 149) to zero, so that path leaves them out of the fit (as zeros); the signed path keeps
    them. The fits then differ, and the signed one is the fit of the vector as given."""
    g = _laplace(200_000, 7) * 1e29
    g[::10] = 1e-21  # 10 % of the entries 50 orders of magnitude below the rest
    comp = compressors.create("sidco:dist=exp,stages=1,ratio=0.01")
    signed, normalised = _both_paths(comp, g, monkeypatch)
    # the exponential fit of all nonzeros: threshold = mean |g| log(1 / delta') with delta' = delta d / n
    n = g.numel()
    want = float(g.abs().double().mean()) * math.log(n / (0.01 * n))
    assert abs(float(signed.info["threshold"]) / want - 1) < 1e-9
    n_kept = n - n // 10  # the normalised path sees only these as nonzero
    mean_kept = float(g.abs().double().sum()) / n_kept
    want_n = mean_kept * math.log(n_kept / (0.01 * n))
    assert abs(float(normalised.info["threshold"]) / want_n - 1) < 1e-6


@needs_compiler
@pytest.mark.parametrize("spec", SIDCO)
def test_fused_sidco_selects_what_the_eager_sidco_selects(spec):
    comp = compressors.create(spec)
    g = _laplace(400_000, 4)
    with forced("never"):
        eager = comp.encode(g)
    with forced("always"):
        fast = comp.encode(g)
    torch.testing.assert_close(
        torch.as_tensor(fast.info["threshold"], dtype=torch.float64),
        torch.as_tensor(eager.info["threshold"], dtype=torch.float64),
        rtol=1e-5,
        atol=0,
    )
    a, b = set(fast["indices"].tolist()), set(eager["indices"].tolist())
    # thresholds within 1e-5 relative: on a Laplace tail, count(|g| > t) = d exp(-t) moves by k t 1e-5 < 0.1
    # coordinates in expectation, so more than 2 differing coordinates means a different selection rule
    assert len(a ^ b) <= 2, f"{len(a ^ b)} coordinates differ"
    # and both select about k (SIDCo's own estimation error on Laplace data is well inside a factor 1.5)
    assert abs(len(a) / (0.001 if "0.001" in spec else 0.01) / g.numel() - 1) < 0.5


@needs_compiler
def test_adaptive_sidco_learns_the_same_stages_on_both_paths():
    grads = [_laplace(50_000, s) ** 3 for s in range(12)]  # heavier than exponential: M must move
    comp = compressors.create("sidco:ratio=0.001,period=2")
    seen = {}
    for mode in ("never", "always"):
        state = comp.new_state()
        with forced(mode):
            for g in grads:
                comp.encode(g, compressors.Context(state=state))
        seen[mode] = (state.stages, list(state.history))
    assert seen["always"] == seen["never"]
    assert len({m for m, _ in seen["always"][1]}) > 1  # M moved, so the comparison is of a learning state


@needs_compiler
def test_a_fused_kernel_that_forgets_the_shift_misses_the_target(monkeypatch):
    """Planted bug on the compiled path: statistics of |g| instead of |g| - eta_{m-1} at stages >= 2."""

    def forgetful(x, above, shift, inv_unit, logs, squares=True):
        return tail_moments.fn(x, above, shift * 0, inv_unit, logs, squares)

    g = _laplace(1_000_000, 5)
    with forced("always"):
        good = multistage_threshold(g, 1e-3, 3, signed=True)
        monkeypatch.setattr(exc_mod, "tail_moments", Fused(forgetful))
        bad = multistage_threshold(g, 1e-3, 3, signed=True)
    k = 1e-3 * g.numel()
    assert abs(int((g.abs() > good.threshold).sum()) / k - 1) < 0.2
    assert abs(int((g.abs() > bad.threshold).sum()) / k - 1) > 0.5


@needs_compiler
def test_fused_count_at_least_equals_the_eager_count():
    from gradstat.theory.kernels import primitives as P

    a = _laplace(100_000, 6).abs()
    a[::5] = 0
    for t in (0.0, 1e-45, float(a.median()), 3.0, 1e9):
        with forced("never"):
            want = P.count_at_least(a, t)
        with forced("always"):
            got = P.count_at_least(a, t)
        assert not P.count_excess._broken and got == want


@needs_compiler
def test_fused_gamma_fit_of_a_vector_wider_than_float32_s_exponent_range():
    """log z with z = |g| / unit underflows to log 0 for |g| far below the largest; the fused kernel takes the
    logarithm of |g| itself, so the gamma fit of the signed path stays finite and equals the eager float64 fit of
    the same magnitudes (to 1e-5: float32 against float64 logarithms and sums)."""
    g = _laplace(200_000, 8) * 1e29
    g[::1000] = 1e-21
    comp = compressors.create("sidco:dist=gamma,stages=1,ratio=0.01")
    with forced("always"):
        fast = comp.encode(g)
    with forced("never"):
        want = multistage_threshold(g.abs().double(), 0.01, 1, first="gamma").threshold
    assert fast.info["stopped_reason"] is None
    assert abs(float(fast.info["threshold"]) / float(want) - 1) < 1e-5


@pytest.mark.parametrize("spec", sorted(compressors.registry.names()))
def test_compressors_work_under_inference_mode(spec):
    """Every compressor encodes and decodes inference tensors, also right after a decode outside inference mode
    (whose checks may leave an ordinary tensor's extremes kept for the next encode's)."""
    g = _laplace(10_000, 9)
    comp = compressors.create(spec)
    with torch.inference_mode():
        inside = comp.decode(comp.encode(g, Context(seed=3)), Context(seed=3))
    outside = comp.decode(comp.encode(g, Context(seed=3)), Context(seed=3))
    with torch.inference_mode():
        again = comp.decode(comp.encode(g, Context(seed=3)), Context(seed=3))
    assert torch.equal(inside, outside) and torch.equal(again, outside)  # (the same numbers in either mode)


# -- one read fewer: the summary as the check, the last stage on the gathered exceedances ---------------------------
@needs_compiler
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_the_summary_read_is_the_finiteness_check_of_a_fused_sidco(bad, monkeypatch):
    """Where SIDCo reads the fused summary of |g| (compiled), that read replaces the encode's own check pass: the
    separate check is never called, and NaN or +-Inf still raise the check's own error (NaN and Inf reach the
    summary's maximum). A compressor without such a read still runs the separate check."""
    from gradstat.compressors import pending

    calls = []  # (the encode's own check: pending.finite, which reads all_finite where nothing is deferred)
    monkeypatch.setattr(pending, "all_finite", lambda x: calls.append(x) or bool(torch.isfinite(x).all()))
    g = _laplace(100_000, 5)
    comp = compressors.create("sidco:dist=exp,stages=3,ratio=0.001")
    with forced("always"):
        assert comp.encode(g)["indices"].numel() > 0
        assert calls == []
        g[77] = bad
        with pytest.raises(ValueError, match=r"sidco: the gradient holds 1 NaN/Inf value\(s\) out of 100000"):
            comp.encode(g)
        assert calls == []
        with pytest.raises(ValueError, match=r"topk: the gradient holds 1 NaN/Inf"):
            compressors.create("topk:ratio=0.01").encode(g)
        assert len(calls) == 1


def test_a_summary_without_minima_is_refused_where_they_are_needed():
    """Signed values need the minimum (the sign check), a spread check the smallest nonzero: a summary read
    without them is refused there rather than passing a constant vector or a negative one."""
    from gradstat.theory.estimators.magnitudes import check_magnitudes

    with pytest.raises(ValueError, match="needs magnitudes"):
        summary.reference(torch.ones(10), False, False)
    x = torch.full((1000,), 2.0)  # constant: the spread check must reject it
    with pytest.raises(ValueError, match="read without its minima"):
        check_magnitudes(x, spread=True, signed=True, stats=summary.reference(x, True, False))
    with pytest.raises(ValueError, match="constant"):
        check_magnitudes(x, spread=True, signed=True, stats=summary.reference(x, True))
    assert check_magnitudes(x, signed=True, stats=summary.reference(x, True, False)).n_nonzero == 1000


@pytest.mark.parametrize("mode", ["never", "always"])
@pytest.mark.parametrize("first", ["exponential", "genpareto"])
def test_the_last_stage_on_the_gathered_exceedances_equals_the_stage_over_the_whole_vector(mode, first):
    """``narrow``: the last stage runs on the elements above eta_{M-1}, gathered once. Its threshold equals the
    whole-vector stage's up to the order of the sums (float32 pairwise sums of ~5e3 values eagerly, ~1e-6
    relative at most; float64 sums compiled), and SIDCo's gather gives exactly the elements at or above eta_{M-1}. Where
    more than NARROW_FRACTION of the elements lie above eta_{M-1} (3 stages at delta = 0.01: 5 %), nothing is
    gathered."""
    if mode == "always" and not policy_mod.can_compile():
        pytest.skip("no C++ compiler for torch.compile here")
    g = _laplace(300_000, 6)
    with forced(mode):
        for signed, x in ((True, g), (False, g.abs())):
            whole = multistage_threshold(x, 0.001, 3, first=first, signed=signed)
            narrowed = multistage_threshold(x, 0.001, 3, first=first, signed=signed, narrow=exceedances_above)
            rtol = 0.0 if mode == "always" and signed else 1e-6
            torch.testing.assert_close(narrowed.threshold, whole.threshold, rtol=rtol, atol=0)
            above = torch.nonzero(g.abs() >= whole.stages[1].threshold.float()).squeeze(1)
            assert narrowed.candidates is not None and torch.equal(narrowed.candidates, above)
            assert narrowed.candidate_magnitudes is not None
            assert torch.equal(narrowed.candidate_magnitudes, g.abs()[above])
            assert [int(s.survivors) for s in narrowed.stages] == [int(s.survivors) for s in whole.stages]
            dense = multistage_threshold(x, 0.01, 3, first=first, signed=signed, narrow=exceedances_above)
            assert dense.candidates is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_fixed_threshold_selection_is_its_own_finiteness_check(bad, monkeypatch):
    """The fixed threshold's one read selects and proves g finite: the separate check is never called, the
    selection equals the plain mask, and NaN or +-Inf raise the check's own error; an all-zero gradient sends
    nothing with threshold +inf, as every threshold rule reports it."""
    from gradstat.compressors import pending

    calls = []  # (the encode's own check: pending.finite, which reads all_finite where nothing is deferred)
    monkeypatch.setattr(pending, "all_finite", lambda x: calls.append(x) or bool(torch.isfinite(x).all()))
    comp = compressors.create("threshold:eta=2.5")
    g = _laplace(100_000, 8)
    p = comp.encode(g)
    assert torch.equal(p["indices"].long(), torch.nonzero(g.abs() >= 2.5).squeeze(1)) and calls == []
    assert torch.equal(comp.decode(p), torch.where(g.abs() >= 2.5, g, 0.0))
    zero = comp.encode(torch.zeros(1000))
    assert zero.info["k_hat"] == 0 and math.isinf(float(zero.info["threshold"]))
    g[4321] = bad
    with pytest.raises(ValueError, match=r"threshold: the gradient holds 1 NaN/Inf value\(s\) out of 100000"):
        comp.encode(g)
    assert calls == []


@needs_compiler
@pytest.mark.parametrize("signed", [False, True])
def test_a_sparse_selection_through_compiled_block_maxima_equals_the_plain_mask(signed):
    """With an expected density at most SPARSE_DENSITY the CPU selection searches compiled block maxima first (a
    ragged tail, thresholds from sparse to dense and above the maximum): the same indices as the plain mask."""
    from gradstat.theory.kernels import primitives as P

    x = _laplace(64 * 5000 + 21, 9)
    a = x.abs()
    with forced("always"):
        for t in (0.5, 4.0, 7.0, float(a.max()), float(a.max()) * 2):
            want = torch.nonzero(a >= t).squeeze(1)
            assert torch.equal(P.select_at_least(x if signed else a, t, signed=signed, density=1e-3), want), t


@needs_compiler
@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30, 3e38])
def test_fused_mean_abs_is_the_float64_mean_rounded_once(scale):
    """Compiled, ``mean_abs`` of float32 values is the float64 sum of |x| over d rounded once to float32: within
    half an ulp of the exact mean (checked against a float64 mean, itself within ~1e-13 of it) at every scale, the
    near-overflow one included, and exactly equivariant to powers of two away from the denormal range."""
    from gradstat.theory.kernels import primitives as P

    x = (_laplace(100_003, 10) * scale).clamp(-torch.finfo(torch.float32).max, torch.finfo(torch.float32).max)
    with forced("always"):
        got = P.mean_abs(x)
        assert torch.equal(P.mean_abs_scratch(x), got)
        assert got.dtype == torch.float32 and bool(torch.isfinite(got))
        exact = x.double().abs().mean()
        assert abs(float(got.double() / exact) - 1) <= 2.0**-24 + 1e-12
        if scale == 1.0:
            for e in (-100, -30, 30, 100):
                assert torch.equal(P.mean_abs(x * 2.0**e), got * 2.0**e), e


@needs_compiler
@pytest.mark.parametrize("scale", [1e-30, 1.0, 1e30, 3e38])
def test_one_bit_class_means_of_one_group_from_one_fused_read(scale):
    """1-bit SGD on a flat float32 gradient (one group) takes its class counts and sums from one fused float64 read:
    each mean is the exact class mean rounded once to float32 (within half an ulp of a float64 reference, at
    every scale, the near-overflow one included), the bits are the plain ones, and the decode puts each class's
    mean back exactly. The plain path's means (float32 sums) agree within their own rounding."""
    from gradstat.theory.kernels import primitives as P

    g = (_laplace(200_003, 13) * scale).clamp(-torch.finfo(torch.float32).max, torch.finfo(torch.float32).max)
    comp = compressors.create("onebit")
    with forced("always"):
        p = comp.encode(g)
        assert bool(P.sign_split_sums.compiled_for(g)) and not P.sign_split_sums._broken
        decoded = comp.decode(p)
    mean_neg, mean_pos = p["values"][0].double()
    pos = g >= 0
    exact_pos, exact_neg = g.double()[pos].mean(), g.double()[~pos].mean()
    assert abs(float(mean_pos / exact_pos) - 1) <= 2.0**-24 + 1e-12
    assert abs(float(mean_neg / exact_neg) - 1) <= 2.0**-24 + 1e-12
    assert torch.equal(p["bits"], pos)
    assert torch.equal(decoded, torch.where(pos, p["values"][0, 1], p["values"][0, 0]))
    with forced("never"):
        plain = comp.encode(g)
    torch.testing.assert_close(plain["values"], p["values"], rtol=1e-5, atol=0)


@needs_compiler
@pytest.mark.parametrize("scale", [1e-40, 1e-30, 1.0, 1e30, 1e36])
def test_compiled_row_scales_equal_the_eager_ones_and_the_float64_norm(scale):
    """The quantizers' bucket scales from one fused read: the l2 norms are the float64 sums of squares rounded
    once, so compiled and eager agree with each other and with a float64 norm within half an ulp (1e-36 rows of
    512 reach ~2e37, near float32's top; 1e-40 is denormal), and the max-abs rows are exactly the eager ones."""
    from gradstat.theory.kernels import primitives as P

    rows = (_laplace(512 * 301, 11) * scale).view(301, 512)
    rows[7] = 0.0
    exact = torch.linalg.vector_norm(rows.double(), dim=1)
    with forced("always"):
        got, rows_max = P.l2_norm_rows(rows), P.max_abs_rows(rows)
    assert not P.sum_squares_rows._broken and not P.block_max._broken
    with forced("never"):
        want, want_max = P.l2_norm_rows(rows), P.max_abs_rows(rows)
    assert torch.equal(rows_max, want_max) and got[7] == 0
    assert bool(torch.isfinite(got).all())
    # both rounded once from float64 sums that differ by ~1e-16: equal unless a sum lies that close to a tie
    assert int((got != want).sum()) <= 1
    nonzero = exact > 0
    ulps = ((got.double() - exact).abs() / torch.finfo(torch.float32).eps / exact.clamp_min(1e-45))[nonzero]
    half_ulp = 0.5 if scale >= 1e-30 else 2.0**-150 / float(exact[nonzero].min()) / torch.finfo(torch.float32).eps
    assert float(ulps.max()) <= max(half_ulp, 0.5) + 1e-6


def _flagged(x: torch.Tensor, double: bool, negate: bool) -> torch.Tensor:
    y = x * 2 if double else x
    return -y if negate else y


@needs_compiler
def test_a_kernel_builds_more_variants_than_torch_s_default_limit_and_stays_compiled():
    """Each dtype and each Python flag builds a variant of its own; the quantizers' kernels serve more than
    torch's default of 8 in one process (code dtypes, input dtypes, one row or many, constants). Twelve variants:
    all compiled, none falls back (torch raises at its limit, which would turn the kernel eager for the rest of
    the run)."""
    kernel = Fused(_flagged)
    with forced("always"), warnings.catch_warnings():
        warnings.filterwarnings("error", message="gradstat")
        for dtype in (torch.float32, torch.float64, torch.float16):
            x = torch.arange(1000, dtype=dtype)
            for double in (False, True):
                for negate in (False, True):
                    assert torch.equal(kernel(x, double, negate), _flagged(x, double, negate))
    assert kernel._compiled is not None and not kernel._broken


@pytest.mark.parametrize("mode", ["never", pytest.param("always", marks=needs_compiler)])
def test_without_squares_the_other_statistics_are_the_same_and_the_variance_refuses(mode):
    """``squares=False`` (the exponential fit's summary and stages) leaves every other statistic as it was, bit for
    bit, puts NaN where the sum of squares stood, and an Exceedances built so refuses to give a variance."""
    from gradstat.theory.estimators.exceedances import Exceedances
    from gradstat.theory.kernels.stage_stats import summary

    g = _laplace(100_000, 8)
    above = torch.tensor(1.3, dtype=torch.float64)
    one = torch.ones((), dtype=torch.float64)
    with forced(mode):
        for full, lean in (
            (summary(g, True, False), summary(g, True, False, False)),
            (tail_moments(g, above, above, one, False), tail_moments(g, above, above, one, False, False)),
        ):
            assert torch.equal(lean[[0, 1]], full[[0, 1]]) and math.isnan(float(lean[2 if len(lean) < 6 else 4]))
            if len(lean) == 6:
                assert torch.equal(lean[[0, 1, 2, 3, 5]], full[[0, 1, 2, 3, 5]])
        data = Exceedances(g, above=above, signed=True, squares=False)
        assert float(data.mean()) == float(Exceedances(g, above=above, signed=True).mean())
        with pytest.raises(RuntimeError, match="squares=False"):
            data.var()


def test_a_summary_without_squares_is_refused_by_a_first_stage_that_reads_them():
    """A summary read with ``squares=False`` (the exponential's and the gamma's) handed to a generalized Pareto first
    stage, whose moment matching reads the variance: a clear error, not a NaN variance in the fit. The gamma first
    stage reads the mean and the mean logarithm only: the same threshold as from a full summary."""
    from gradstat.theory.kernels.stage_stats import summary
    from gradstat.theory.pot import multistage_threshold

    g = _laplace(10_000, 9)
    lean = summary(g, True, True, False)
    with pytest.raises(ValueError, match="sum of squares"):
        multistage_threshold(g, 1e-2, 2, first="genpareto", signed=True, stats=lean)
    full = summary(g, True, True, True)
    for first in ("gamma", "exponential"):
        threshold = multistage_threshold(g, 1e-2, 2, first=first, signed=True, stats=lean).threshold
        assert threshold > 0
        assert torch.equal(threshold, multistage_threshold(g, 1e-2, 2, first=first, signed=True, stats=full).threshold)

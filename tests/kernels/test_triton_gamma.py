"""The gamma quantile's Triton kernel (theory/kernels/triton_gamma.py), on CPU tensors through Triton's interpreter:
its quantiles agree with scipy's as the torch solver's do (1e-9 relative), on both branches and from q = 1e-300 to
1 - 1e-16; a truncated kernel fails the check; gammainccinv takes it where it runs; and it builds for sm_90."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import special

from gradstat.theory.distributions import incgamma
from gradstat.theory.kernels import gamma_halley, triton_gamma, triton_runtime

needs_triton = pytest.mark.skipif(not triton_runtime.available(), reason="no Triton 3.0 or newer here")

A = np.array([1e-3, 0.05, 0.7, 1.0, 3.0, 40.0, 1e4])
Q = np.concatenate(
    [10.0 ** -np.array([300.0, 100.0, 30.0, 8.0, 3.0]), [0.25, 0.5, 0.9], 1 - 10.0 ** -np.array([3.0, 16.0])]
)
"""Seven decades of shapes; upper-tail probabilities from 1e-300 (the Q branch) through 1/2 to 1 - 1e-16 (the P
branch, p = 1e-16)."""


def _kernel_quantiles(steps: int, device: torch.device | str = "cpu") -> tuple[np.ndarray, np.ndarray]:
    """The kernel's x with Q(a, x) = q over the grid on ``device``, from the torch solver's start; and scipy's."""
    a, q = (torch.tensor(v).reshape(-1) for v in np.meshgrid(A, Q))
    logp, logq = torch.log1p(-q), torch.log(q)
    lgam, lgam1 = torch.lgamma(a), torch.lgamma(a + 1.0)
    start = torch.maximum(torch.log(incgamma._initial_guess(a, logp, logq)), (logp + lgam1) / a)
    args = (v.to(device) for v in (a, logp, logq, lgam, lgam1, start))
    got = triton_gamma.halley(*args, steps).cpu().numpy()
    return got, special.gammainccinv(a.numpy(), q.numpy())


def _worst(steps: int, device: torch.device | str = "cpu") -> float:
    got, want = _kernel_quantiles(steps, device)
    keep = want > 1e-290  # (scipy's own underflow)
    return float(np.max(np.abs(got[keep] / want[keep] - 1)))


@needs_triton
@pytest.mark.parametrize("steps", [incgamma.MODERATE_STEPS, incgamma.STEPS])
def test_the_kernel_agrees_with_scipy_to_1e9_on_both_branches(steps, device):
    """On every device present: interpreted on a CPU, compiled on CUDA."""
    assert _worst(steps, device) < 1e-9


@needs_triton
def test_a_truncated_kernel_is_detected_and_a_loop_cut_short_gives_nan(monkeypatch):
    """The check above fails on one Halley step; series and continued fractions cut at two terms (as at shapes
    beyond MAX_TERMS' reach) give NaN, never a number cut short."""
    assert _worst(1) > 1e-6
    monkeypatch.setattr(triton_gamma, "MAX_TERMS", 2)
    got, want = _kernel_quantiles(incgamma.STEPS)
    cut = np.isnan(got)
    assert cut.mean() > 0.5, cut.mean()
    keep = ~cut & (want > 1e-290)
    assert np.all(np.abs(got[keep] / want[keep] - 1) < 1e-9)  # (the few whose loops end within two terms)


@needs_triton
def test_the_operator_answers_by_the_reference_where_the_kernel_fails(monkeypatch):
    """Inside a compiled function the kernel is an operator: a failure there is reported once and the torch steps
    answer (the compiled function keeps running, not turned eager)."""

    def broken(*args):  # type: ignore[no-untyped-def]
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(triton_gamma, "_BROKEN", triton_runtime.Fallback("the Triton gamma quantile", "X"))
    monkeypatch.setattr(triton_gamma, "halley", broken)
    a, q = torch.tensor([1.2, 30.0], dtype=torch.float64), torch.tensor([0.3, 0.9], dtype=torch.float64)
    logp, logq = torch.log1p(-q), torch.log(q)
    lgam, lgam1 = torch.lgamma(a), torch.lgamma(a + 1.0)
    start = torch.maximum(torch.log(incgamma._initial_guess(a, logp, logq)), (logp + lgam1) / a)
    with pytest.warns(RuntimeWarning, match="the Triton gamma quantile failed"):
        got = triton_gamma._halley_op(a, logp, logq, lgam, lgam1, start, 4)
    assert torch.equal(got, gamma_halley.reference(a, logp, logq, lgam, lgam1, start, 4))
    assert triton_gamma._BROKEN.failed and not triton_gamma.in_graph(a)  # (later traces leave the operator)


@needs_triton
def test_gammainccinv_takes_the_kernel_where_it_runs(monkeypatch):
    """Said to run on a CPU tensor (on CUDA it does), the public inverse goes through the kernel: one launch, the
    same quantiles within 1e-9 of scipy (SIDCo's points: a fitted shape, q = delta_1 d / n)."""
    launches = []
    original = triton_gamma.halley

    def counted(*args):  # type: ignore[no-untyped-def]
        launches.append(args[-1])
        return original(*args)

    monkeypatch.setattr(triton_gamma, "runs_on", lambda a: True)
    monkeypatch.setattr(triton_gamma, "halley", counted)
    monkeypatch.setattr(incgamma, "host_form", lambda a, prob: False)
    for a, q in ((0.3, 0.25), (1.2, 0.6), (40.0, 0.3), (0.05, 1e-7)):
        got = incgamma.gammainccinv(torch.tensor(a, dtype=torch.float64), torch.tensor(q, dtype=torch.float64), 0.25)
        assert float(got) == pytest.approx(special.gammainccinv(a, q), rel=1e-9)
    assert launches == [incgamma.MODERATE_STEPS] * 4


@needs_triton
def test_a_failed_kernel_warns_once_and_the_torch_steps_run(monkeypatch):
    def broken(*args):  # type: ignore[no-untyped-def]
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(triton_gamma, "_BROKEN", triton_runtime.Fallback("the Triton gamma quantile", "X"))
    monkeypatch.setattr(triton_gamma, "runs_on", lambda a: not triton_gamma._BROKEN.is_set())
    monkeypatch.setattr(triton_gamma, "halley", broken)
    monkeypatch.setattr(incgamma, "host_form", lambda a, prob: False)
    a, q = torch.tensor(1.2, dtype=torch.float64), torch.tensor(0.3, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match="the Triton gamma quantile failed"):
        got = incgamma.gammainccinv(a, q)
    assert float(got) == pytest.approx(special.gammainccinv(1.2, 0.3), rel=1e-9)
    assert float(incgamma.gammainccinv(a, q)) == float(got)  # (no second attempt, no second warning)


@needs_triton
def test_the_kernel_compiles_for_cuda_without_a_gpu(tmp_path, monkeypatch):
    """Triton's own compiler down to sm_90 machine code: its while loops over float64 lanes, as a GPU builds it."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = triton_runtime.build(triton_gamma._halley, interpret=False)
    signature = dict.fromkeys(("a_ptr", "logp_ptr", "logq_ptr", "lgam_ptr", "lgam1_ptr", "t_ptr", "out_ptr"), "*fp64")
    signature.update(n="i32", STEPS="constexpr", MAX_TERMS="constexpr", BLOCK="constexpr")
    constants = {"STEPS": incgamma.MODERATE_STEPS, "MAX_TERMS": triton_gamma.MAX_TERMS, "BLOCK": triton_gamma.BLOCK}
    ordered = {name: signature[name] for name in kernel.arg_names}
    target = GPUTarget("cuda", 90, 32)
    compiled = triton.compile(ASTSource(kernel, ordered, constants), target=target, options=_cuda_options())
    assert compiled.asm["cubin"]


def _cuda_options() -> dict[str, object]:
    """The options every CUDA launch builds with (triton_runtime.COMPILE_OPTIONS: no fused multiply-add)."""
    return dict(triton_runtime.COMPILE_OPTIONS)

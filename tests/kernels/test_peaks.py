"""Sub-block maxima (theory/kernels/peaks.py): the Triton summary stores them from its read of the vector, equal to
their definition; clear errors for peaks that do not describe the vector; and the CUDA build of the summary kernel
that stores them. The selection that skips by them equals the one that reads everything: the equivalence battery's
``-peaks`` cases (tests/kernels/test_equivalence.py)."""

from __future__ import annotations

import math

import pytest
import torch

from gradstat.theory.kernels import bounded, peaks, triton_runtime, triton_stats

needs_triton = pytest.mark.skipif(not triton_runtime.available(), reason="no Triton 3.0 or newer here")


def _vector(n: int, dtype: torch.dtype, scale: float, seed: int) -> torch.Tensor:
    """Uniform values in [-scale/2, scale/2) from a seeded generator, every seventh zero (from the first)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, generator=g, dtype=torch.float64) - 0.5).to(dtype) * scale
    x[::7] = 0.0
    return x


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [1, 5, 64, 4099])
@pytest.mark.parametrize("scale", [1.0, 1e-30, 1e30])
def test_the_summary_stores_the_peaks_of_its_definition_and_the_same_summary(dtype, n, scale, device):
    """On every device present: interpreted on a CPU (sub-blocks of 4), compiled on CUDA (of 32)."""
    clean = _vector(n, dtype, scale, seed=n).to(device)
    flags = (True, True, True, False)
    # the same summary, bit for bit, as without the peaks' stores (on finite values: NaN would hide the sums)
    stats, found = triton_stats.summary_and_peaks(clean, *flags)
    # (the smallest nonzero magnitude is +inf for the all-zero n = 1)
    assert bool(torch.isfinite(stats[:5]).all()) and (n == 1 or float(stats[3]) > 0)
    assert torch.equal(stats, triton_stats.summary(clean, *flags)), stats
    x = clean.clone()
    if n >= 64:  # a NaN, an infinity and a negative infinity, each in a sub-block of its own
        x[9], x[30], x[-1] = math.nan, math.inf, -math.inf
    _, found = triton_stats.summary_and_peaks(x, *flags)
    sub = peaks.sub_for(x)
    want = peaks.reference(x, sub)
    assert found.sub == want.sub == (peaks.INTERPRETED_SUB if device.type == "cpu" else peaks.SUB)
    assert found.values.dtype == dtype and torch.equal(found.values, want.values), (found.values, want.values)
    if n >= 64:
        assert found.values[9 // sub] == math.inf and found.values[30 // sub] == math.inf
        assert found.values[(n - 1) // sub] == math.inf


def test_the_definition_marks_every_sub_block_holding_a_nan_or_an_infinity():
    x = torch.tensor([1.0, -3.0, 2.0, 0.5, math.nan, 0.0, 1.0, 1.0, 0.25, -math.inf, 7.0])
    got = peaks.reference(x, 4)
    assert got.values.tolist() == [3.0, math.inf, math.inf]


@pytest.mark.parametrize(
    ("values", "sub", "extremes", "message"),
    [
        (torch.zeros(2), 4, False, "3 torch.float32 sub-block maxima on cpu describe x, got a 1-D torch.float32 "),
        (torch.zeros(3, dtype=torch.float64), 4, False, "got a 1-D torch.float64 tensor of 3"),
        (torch.zeros(1, 3), 4, False, "got a 2-D"),
        (torch.zeros(4), 3, False, "sub-blocks of 3 elements do not tile blocks"),
        (torch.zeros(3), 4, True, "the largest magnitude \\(extremes\\) needs them all"),
    ],
)
def test_peaks_that_do_not_describe_x_are_refused_by_every_form(values, sub, extremes, message):
    x = torch.ones(10)  # (in sub-blocks of 4: three of them)
    found = peaks.Peaks(values, sub)
    for select in (bounded.reference, bounded.eager, bounded.select_bounded, bounded.triton):
        with pytest.raises(ValueError, match=message):
            select(x, torch.tensor(0.5), True, 4, extremes, False, found)


@needs_triton
@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
def test_the_summary_kernel_with_peaks_compiles_for_cuda_without_a_gpu(dtype, tmp_path, monkeypatch):
    """Triton's own compiler down to sm_90 machine code for the summary kernel, with and without the peaks' stores
    (the sub-blocks' maxima through a reshape of the block), as a GPU builds it."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = triton_runtime.build(triton_stats._summary_blocks, interpret=False)
    signature = {"x_ptr": f"*{dtype}", "part_ptr": "*fp64", "peaks_ptr": f"*{dtype}", "n": "i32", "n_peaks": "i32"}
    signature.update(dict.fromkeys(("ABSOLUTE", "EXTREMES", "SQUARES", "LOGS", "PEAKS", "SUB", "BLOCK"), "constexpr"))
    for with_peaks in (False, True):
        constants = {"ABSOLUTE": True, "EXTREMES": False, "SQUARES": False, "LOGS": False, "PEAKS": with_peaks,
                     "SUB": peaks.SUB, "BLOCK": triton_stats.BLOCK}  # fmt: skip
        ordered = {name: signature[name] for name in kernel.arg_names}
        target = GPUTarget("cuda", 90, 32)  # (with the launches' own options: no fused multiply-add)
        compiled = triton.compile(
            ASTSource(kernel, ordered, constants), target=target, options=dict(triton_runtime.COMPILE_OPTIONS)
        )
        assert ".ftz" not in compiled.asm["ptx"] and compiled.asm["cubin"]

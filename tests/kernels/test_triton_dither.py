"""The counter-dither rows' Triton form (theory/kernels/triton_dither.py) beyond the battery of test_equivalence.py
(which holds quantize, reconstruct and signed rows to their references on every device present): the in-place
reconstruction, which run_rows takes on CUDA; which form run_rows picks, and its fallback; and the CUDA build's
machine code, read on a machine without a GPU for the two properties that make it equal to the reference bit for bit
(IEEE division and no fused multiply-add), and the absence of flushed subnormals."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from gradstat.theory.kernels import counter_dither, nested, policy, triton_dither, triton_runtime

needs_triton = pytest.mark.skipif(not triton_runtime.available(), reason="no Triton 3.0 or newer here")


def _rows(rows: int, size: int, device: torch.device, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(rows * 1000 + size)
    x = (torch.randn(rows * size, generator=gen) * scale).reshape(rows, size).to(device)
    return x, x.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


@needs_triton
@pytest.mark.parametrize("subtract", [True, False])
@pytest.mark.parametrize(("rows", "size"), [(1, 1), (3, 64), (1, 70_001)])
def test_the_in_place_reconstruction_equals_its_reference(rows, size, subtract, device):
    _, scale = _rows(rows, size, device)
    gen = torch.Generator().manual_seed(7)
    codes = torch.randint(-127, 128, (rows, size), generator=gen).to(torch.float32).to(device)
    key, base = counter_dither.keys(3, 1, device), torch.tensor(11, dtype=torch.int32, device=device)
    want = counter_dither.KERNELS["reconstruct_rows_in_place"].reference(
        codes.clone(), scale, base, key, 7.0, 0.5, subtract
    )
    form = counter_dither.triton_form("reconstruct_rows_in_place")
    assert counter_dither.triton_form_applies("reconstruct_rows_in_place")(codes, scale, base, key, 7.0, 0.5, subtract)
    got = form(codes.clone(), scale, base, key, 7.0, 0.5, subtract)
    assert torch.equal(got, want)


class _CudaDivision(TorchFunctionMode):
    """torch's CUDA division of a float32 tensor by a host number, on any device: the product by the number's
    float32 reciprocal (ATen's ``div_true_kernel_cuda`` with a CPU scalar), so that a reference run on a CPU takes the
    values it takes on a GPU."""

    DIVISIONS = {torch.Tensor.__truediv__, torch.Tensor.div, torch.div, torch.true_divide}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.DIVISIONS and len(args) == 2 and isinstance(args[1], (int, float)) and not kwargs:
            if args[0].dtype == torch.float32:
                return torch.mul(args[0], float(np.float32(1.0) / np.float32(args[1])))
        return func(*args, **kwargs)


@needs_triton
@pytest.mark.parametrize(
    ("alpha", "delta1", "k", "differs"),
    [(1.0, 1 / 3, 3, True), (0.7, 0.25, 5, False), (1.0, 0.2, 7, True), (0.9, 0.1, 11, True)],
)
def test_the_nested_modes_divide_as_their_reference_does_on_cuda(alpha, delta1, k, differs, monkeypatch):
    """The nested encode and estimate's CUDA branch (products by float32 reciprocals), interpreted on a CPU, against
    their references run with CUDA's division by a host number: equal bit for bit. The CPU branch is the battery's
    (test_equivalence.py). ``differs``: the two divisions give other results on this data (where delta1 is not a
    power of two): in the estimate's values; the encode's codes move only where t lies within a rounding of a tie,
    which these data do not reach (the test below builds data that do)."""
    n = 70_001
    g, kappa = _rows(1, n, torch.device("cpu"))
    side = g + 0.05 * _rows(1, n, torch.device("cpu"), 0.3)[0] * kappa
    key, base = counter_dither.keys(9, 1, "cpu"), torch.zeros((), dtype=torch.int32)
    encode, estimate = nested.NESTED_KERNELS
    args = (base, key, alpha, delta1, k)
    with _CudaDivision():
        codes = encode.reference(torch.empty(g.shape, dtype=torch.int8), g, kappa, *args)
        want = estimate.reference(codes.float(), side, kappa, *args)
    plain = encode.reference(torch.empty(g.shape, dtype=torch.int8), g, kappa, *args)
    cpu_estimate = estimate.reference(codes.float(), side, kappa, *args)
    assert (not torch.equal(plain, codes) or not torch.equal(cpu_estimate, want)) == differs
    monkeypatch.setattr(triton_dither, "host_division", lambda device: False)
    got_codes = counter_dither.triton_form("nested_rows_into")(torch.empty(g.shape, dtype=torch.int8), g, kappa, *args)
    got = counter_dither.triton_form("nested_reconstruct_rows_in_place")(codes.float(), side, kappa, *args)
    assert torch.equal(got_codes, codes)
    assert torch.equal(got, want)


def _near_ties(n: int, key: torch.Tensor, alpha: float, delta1: float) -> torch.Tensor:
    """Values in [-1, 1] whose t = (alpha x + u) / Delta1 (u the counter dither of ``key`` from index 0) lies within a
    few float32 roundings of a half-integer, each chosen among its 17 nearest floats so that, where one does, the
    IEEE quotient and the product by the reciprocal round t to other sides of it. (The codes are round(t) modulo k:
    the coarse rounding of t / k cancels in them, so its division needs no such data.)"""
    u = counter_dither.dither_rows(1, n, torch.zeros((), dtype=torch.int32), key, torch.device("cpu")) * delta1
    u = u.reshape(-1).numpy()
    m = np.random.default_rng(n).integers(-int(1 / delta1), int(1 / delta1), n)
    x0 = (((m + 0.5) * delta1 - u.astype(np.float64)) / alpha).astype(np.float32)
    candidates = (x0[:, None].view(np.int32) + np.arange(-8, 9, dtype=np.int32)).view(np.float32).clip(-1, 1)
    s = candidates * np.float32(alpha) + u[:, None]
    ieee, product = s / np.float32(delta1), s * (np.float32(1) / np.float32(delta1))
    apart = np.floor(ieee + np.float32(0.5)) != np.floor(product + np.float32(0.5))
    pick = np.where(apart.any(axis=1), apart.argmax(axis=1), 8)
    return torch.from_numpy(candidates[np.arange(n), pick].copy()).reshape(1, n)


@needs_triton
@pytest.mark.parametrize(("alpha", "delta1", "k"), [(1.0, 1 / 3, 3), (1.0, 0.3, 5), (0.9, 0.1, 11)])
def test_the_nested_encode_divides_as_its_reference_does_on_cuda_at_ties(alpha, delta1, k, monkeypatch):
    """The nested encode's CUDA branch at near-ties, where the two divisions give other codes (asserted: so a
    fault in that branch alone shows here), interpreted on a CPU: equal to the reference run with CUDA's division."""
    key = counter_dither.keys(9, 1, "cpu")
    g = _near_ties(8192, key, alpha, delta1)
    kappa, base = torch.ones((1, 1)), torch.zeros((), dtype=torch.int32)
    encode, _ = nested.NESTED_KERNELS
    args = (base, key, alpha, delta1, k)
    with _CudaDivision():
        want = encode.reference(torch.empty(g.shape, dtype=torch.int8), g, kappa, *args)
    plain = encode.reference(torch.empty(g.shape, dtype=torch.int8), g, kappa, *args)
    assert int((plain != want).sum()) >= 100
    monkeypatch.setattr(triton_dither, "host_division", lambda device: False)
    got = counter_dither.triton_form("nested_rows_into")(torch.empty(g.shape, dtype=torch.int8), g, kappa, *args)
    assert torch.equal(got, want)


@needs_triton
def test_run_rows_takes_the_triton_form_on_cuda_only_and_never_under_never(device):
    x, scale = _rows(5, 300, device)
    out = torch.empty(x.shape, dtype=torch.int8, device=device)
    expected = device.type == "cuda"
    assert counter_dither.triton_for("quantize_rows_into", out, (x,), scale) == expected
    with policy.forced("never"):
        assert not counter_dither.triton_for("quantize_rows_into", out, (x,), scale)
    # not a form it handles: a strided block, float64 values, a scale of the wrong shape
    assert not triton_dither.applies("quantize_rows_into", out, (x.t().contiguous().t(),), scale)
    assert not triton_dither.applies("quantize_rows_into", out, (x.double(),), scale)
    assert not triton_dither.applies("quantize_rows_into", out, (x,), scale.reshape(-1))
    key = counter_dither.keys(1, 1, device)
    args = (2.0, -2, 2, 0.0, torch.int8)
    got = counter_dither.run_rows(counter_dither.quantize_rows_into, out, x, scale, 4, key, *args)
    with policy.forced("never"):
        want = counter_dither.run_rows(
            counter_dither.quantize_rows_into, torch.empty_like(out), x, scale, 4, key, *args
        )
    assert torch.equal(got, want)


def test_a_failed_triton_form_warns_once_and_the_eager_tiles_run(monkeypatch):
    def broken(*args: object) -> torch.Tensor:
        raise RuntimeError("no GPU compiler here\nsecond line")

    monkeypatch.setattr(
        counter_dither, "TRITON_FALLBACK", triton_runtime.Fallback("the Triton counter-dither kernel", policy.ENV)
    )
    monkeypatch.setattr(triton_dither, "applies", lambda *args: True)
    monkeypatch.setattr(triton_dither, "run", broken)
    x, scale = _rows(2, 100, torch.device("cpu"))
    key = counter_dither.keys(1, 2, "cpu")
    with policy.forced("never"):
        want = counter_dither.run_rows(counter_dither.signed_rows_into, torch.empty_like(x), x, scale, 0, key, True)
    monkeypatch.setattr(counter_dither, "triton_for", lambda *args: not counter_dither.TRITON_FALLBACK.is_set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [
            counter_dither.run_rows(counter_dither.signed_rows_into, torch.empty_like(x), x, scale, 0, key, True)
            for _ in range(2)
        ]
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "(RuntimeError: no GPU compiler here)" in messages[0], messages
    assert all(torch.equal(g, want) for g in got)


SIGNATURE = {
    "f_ptr": "*fp32", "f_stride": "i32", "base_ptr": "*i32", "key_ptr": "*i32", "n": "i32", "size": "i32",
    "modulus": "i32",
    "gain": "fp32", "lo": "fp32", "hi": "fp32", "shift": "fp32", "offset": "fp32", "alpha": "fp32",
    "delta1": "fp32", "levels": "fp32", "half": "fp32", "step": "fp32", "inv_delta1": "fp32", "inv_levels": "fp32",
    "MODE": "constexpr", "FLAG": "constexpr", "HOST_DIVISION": "constexpr", "M0": "constexpr", "M1": "constexpr",
    "BLOCK": "constexpr",
}  # fmt: skip


@needs_triton
@pytest.mark.parametrize(
    ("mode", "out", "x"),
    [
        (triton_dither.QUANTIZE, "*i8", "*fp32"),
        (triton_dither.RECONSTRUCT, "*fp32", "*i8"),
        (triton_dither.SIGN, "*fp32", "*fp32"),
        (triton_dither.NESTED, "*i8", "*fp32"),
        (triton_dither.ESTIMATE, "*fp32", "*fp32"),
        (triton_dither.HASH_KEY, "*fp32", "*fp32"),
        (triton_dither.SAMPLE, "*i64", "*fp32"),
    ],
)
def test_the_cuda_build_divides_exactly_and_never_fuses_or_flushes(mode, out, x, tmp_path, monkeypatch):
    """Triton's compiler down to sm_90 machine code with the options the CUDA form launches with: IEEE division
    (``div.rn.f32``, never ``div.approx``/``div.full``), no fused multiply-add (``fma``: ``x / s gain + u`` rounded
    once), no ``.ftz`` (``floor`` by libdevice flushed subnormals: floor(-1e-40) = 0), the hash's wrapping 32-bit
    products. With Triton's default options the same source does fuse (checked, so the test can see one)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = triton_dither.kernel(interpret=False)
    signature = {**SIGNATURE, "out_ptr": out, "x_ptr": x}
    ordered = {name: signature[name] for name in kernel.arg_names}
    m0, m1 = counter_dither.MULTIPLIERS
    constants = {"MODE": mode, "FLAG": True, "HOST_DIVISION": False, "M0": m0, "M1": m1, "BLOCK": triton_dither.BLOCK}

    def ptx(options: dict) -> str:
        compiled = triton.compile(
            ASTSource(kernel, ordered, constants), target=GPUTarget("cuda", 90, 32), options=options
        )
        return compiled.asm["ptx"]

    code = ptx(triton_runtime.COMPILE_OPTIONS)
    assert not re.search(r"div\.(approx|full)", code)
    if mode not in (triton_dither.HASH_KEY, triton_dither.SAMPLE):  # (the hash keys and the sample divide nothing)
        assert "div.rn.f32" in code  # (FLAG: the signs divide too)
    assert not re.search(r"\bfma\.", code) and ".ftz" not in code
    if mode == 0:  # the clamp keeps a NaN, as the reference and the interpreter do (plain max.f32 drops it)
        assert re.search(r"max\.NaN\.f32", code) and re.search(r"min\.NaN\.f32", code)
    if mode == triton_dither.SAMPLE:  # (h + 2^31) d in 64 bits, shifted right by 32 as a 64-bit number
        assert re.search(r"mul\.lo\.s64", code) and re.search(r"shr\.s64", code)
    for multiplier in (m0, m1):  # the hash's wrapping 32-bit products, by the constants themselves
        assert re.search(rf"mul\.lo\.s32\s+%r\d+, %r\d+, {multiplier};", code), multiplier
    if mode not in (
        triton_dither.SIGN,
        triton_dither.HASH_KEY,
        triton_dither.SAMPLE,
    ):  # (nothing multiplied, then added)
        assert re.search(r"\bfma\.", ptx({"enable_fp_fusion": True})), "no fusion to switch off: proves nothing"


@needs_triton
def test_the_signs_flip_the_sign_bit_of_zeros_and_nans_as_the_reference_does(device):
    """``r x`` for r = -1 is the reference's negation: -0.0 from +0.0, a NaN with its sign flipped (compared bit for
    bit: torch.equal counts -0.0 equal to +0.0). On CUDA the reference's own negation (torch's ``-x``) turns a NaN
    into the canonical 0x7FFFFFFF (measured on an H100 with torch 2.11, where the kernel's flipped 0xFFC00000 was
    compared with it): against the reference on its own device a NaN is compared as a NaN and every other element bit
    for bit; against the CPU's reference, every element bit for bit."""
    x = torch.tensor([0.0, -0.0, math.nan, -math.nan, math.inf, 1e-45] * 50, device=device).reshape(2, -1)
    ones = torch.ones((), device=device).expand(2, 1)
    key, base = counter_dither.keys(9, 2, device), torch.tensor(0, dtype=torch.int32, device=device)
    want = counter_dither.KERNELS["signed_rows_into"].reference(torch.empty_like(x), x, ones, base, key, False)
    got = counter_dither.triton_form("signed_rows_into")(torch.empty_like(x), x, ones, base, key, False)
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got.view(torch.int32)[~nan], want.view(torch.int32)[~nan])
    # every element bit for bit against the CPU's reference (the same signs on every device), NaNs included
    cpu = torch.device("cpu")
    on_cpu = counter_dither.KERNELS["signed_rows_into"].reference(
        torch.empty_like(x, device=cpu), x.cpu(), ones.cpu(), base.cpu(), counter_dither.keys(9, 2, cpu), False
    )
    assert torch.equal(got.cpu().view(torch.int32), on_cpu.view(torch.int32))
    assert bool((want.view(torch.int32) != x.view(torch.int32))[~nan].any())  # some signs were flipped


def test_a_fallback_warns_once_per_process():
    fallback = triton_runtime.Fallback("the Triton thing", policy.ENV)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            fallback.report(RuntimeError("first\nsecond"))
    assert fallback.is_set()
    assert [str(w.message) for w in caught] == [
        f"gradstat: the Triton thing failed to build or run (RuntimeError: first); using the eager form for the rest "
        f"of this run (set {policy.ENV}=never to skip the attempt)"
    ]

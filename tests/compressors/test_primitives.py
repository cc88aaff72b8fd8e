"""Each fast primitive of theory/kernels/primitives.py equals a plain reference implementation (bit for bit, or
within float rounding where a reduction reorders), on ordinary, tied, zero, denormal and near-overflow inputs."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from gradstat.theory.kernels import compaction
from gradstat.theory.kernels import primitives as P

FMAX = torch.finfo(torch.float32).max
TINY = torch.finfo(torch.float32).smallest_normal


def _laplace(n: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).to(dtype)


def _cases() -> dict[str, torch.Tensor]:
    g = _laplace(10_007)
    sparse = g.clone()
    sparse[::3] = 0.0
    ties = torch.tensor([1.0, -1.0, 2.0, -2.0, 0.0] * 40)
    return {
        "laplace": g,
        "with_zeros": sparse,
        "ties": ties,
        "denormal": g * 1e-40,
        "near_overflow": g / g.abs().max() * (FMAX / 64),  # max 5e36, norm ~ 3e37: finite
        "float64": _laplace(5_003, 1, torch.float64) * 1e200,
        "short": torch.tensor([0.5, -3.0, 0.0]),
    }


CASES = _cases()


@pytest.fixture(params=["compaction", "numpy"])
def selection_path(request, monkeypatch):
    """Run a CPU selection test on the compaction kernel (skipped where the C extension is absent) and on the numpy
    chunks it falls back to."""
    if request.param == "numpy":
        monkeypatch.setattr(compaction, "available", lambda x: False)
    elif not compaction.available(torch.zeros(1)):
        pytest.skip("the C extension is absent (installed without a C compiler)")
    return request.param


@pytest.mark.parametrize("name", sorted(CASES))
def test_all_finite_matches_isfinite_all(name):
    x = CASES[name]
    assert P.all_finite(x) is True
    for bad in (math.nan, math.inf, -math.inf):
        y = x.clone()
        y[len(y) // 2] = bad
        assert P.all_finite(y) is bool(torch.isfinite(y).all()) is False


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("quantile", [0.0, 0.5, 0.9, 0.99, 0.999, 1.0])
def test_selection_and_count_match_the_plain_mask(name, quantile, selection_path):
    a = CASES[name].abs()
    t = torch.quantile(a.double(), quantile).to(a.dtype) if a.numel() < 16_000_000 else a.max()
    reference = torch.nonzero((a >= t) & (a > 0)).squeeze(1)
    assert torch.equal(P.select_at_least(a, t), reference)
    assert torch.equal(P.select_at_least_reference(a, t), reference)
    assert P.count_at_least(a, t) == int(((a >= t) & (a > 0)).sum())


def test_blocked_selection_handles_a_ragged_tail_and_a_dense_fallback():
    a = _laplace(64 * 1000 + 37).abs()
    for t in (0.0, 0.01, 3.0, 9.0, float(a[-1]), float(a.max()) * 2):
        assert torch.equal(P.select_at_least(a, t), torch.nonzero((a >= t) & (a > 0)).squeeze(1))


def test_zero_threshold_never_selects_zeros(selection_path):
    a = torch.tensor([0.0, 0.0, 1e-45, 2.0] * 100)
    assert P.count_at_least(a, 0.0) == 200
    assert P.select_at_least(a, -1.0).tolist() == [i for i in range(400) if i % 4 in (2, 3)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_max_abs_matches_abs_amax(name):
    x = CASES[name]
    assert torch.equal(P.max_abs(x), x.abs().amax())
    m = x[: (x.numel() // 7) * 7].reshape(-1, 7)
    assert torch.equal(P.max_abs(m, dim=1), m.abs().amax(dim=1))


@pytest.mark.parametrize("name", sorted(CASES))
def test_l2_norm_and_mean_abs_match_float64_references(name):
    x = CASES[name]
    ref_l2 = torch.linalg.vector_norm(x.double() if x.dtype == torch.float32 else x.to(torch.float64), 2)
    ref_l1 = x.double().abs().mean()
    if x.dtype == torch.float64:  # beyond float64 squares: compute the references in scaled form
        s = x.abs().max()
        ref_l2 = s * torch.linalg.vector_norm(x / s)
        ref_l1 = s * (x / s).abs().mean()
    rtol = 1e-5 if x.dtype == torch.float32 else 1e-12
    if name == "denormal":  # the inputs themselves carry fewer significant bits
        rtol = 1e-3
    torch.testing.assert_close(P.l2_norm(x).double(), ref_l2.double(), rtol=rtol, atol=0)
    torch.testing.assert_close(P.mean_abs(x).double(), ref_l1.double(), rtol=rtol, atol=0)
    assert bool(torch.isfinite(P.l2_norm(x))) and bool(torch.isfinite(P.mean_abs(x)))


def test_l2_norm_is_exactly_equivariant_to_powers_of_two():
    x = _laplace(4096)
    base = P.l2_norm(x)
    for e in (-100, -60, -1, 1, 60, 100):
        scaled = x * 2.0**e
        assert torch.equal(P.l2_norm(scaled), base * 2.0**e), e
        assert torch.equal(P.mean_abs(scaled), P.mean_abs(x) * 2.0**e), e
    rows = x.reshape(64, 64)
    assert torch.equal(P.l2_norm(rows * 2.0**90, dim=1), P.l2_norm(rows, dim=1) * 2.0**90)


def test_l2_norm_overflows_only_when_the_norm_itself_does():
    x = torch.full((4,), FMAX / 4)
    assert torch.equal(P.l2_norm(x), torch.tensor(FMAX / 2))  # the plain norm overflows its squares
    assert torch.isinf(torch.linalg.vector_norm(torch.full((16,), FMAX / 2)))
    assert torch.isinf(P.l2_norm(torch.full((16,), FMAX / 2)))


def test_scale_by_pow2_is_exact_across_the_whole_exponent_range():
    x = torch.tensor([1.5, -3.25, TINY, 1e-45])
    for e in (-149, -126, -60, 0, 60, 127):
        got = P.scale_by_pow2(x.double(), torch.tensor(e))
        assert torch.equal(got, x.double() * 2.0**e)
    assert torch.equal(P.scale_by_pow2(torch.tensor([1e-45]), torch.tensor(149)), torch.tensor([1.0]))
    assert torch.equal(P.scale_by_pow2(torch.tensor([FMAX]), torch.tensor(-127)), torch.tensor([FMAX * 2.0**-127]))


def test_abs_scratch_matches_abs_and_reuses_its_buffer():
    x = _laplace(1000)
    a = P.abs_scratch(x)
    assert torch.equal(a, x.abs())
    b = P.abs_scratch(x[:500])
    assert torch.equal(b, x[:500].abs()) and b.data_ptr() == a.data_ptr()
    P.release_scratch()
    assert torch.equal(P.abs_scratch(x), x.abs())


def test_float32_wire_refuses_what_float32_cannot_carry():
    from gradstat.compressors.wire.floats import to_wire

    f32 = torch.float32
    assert to_wire(torch.tensor([1.0, -2.0], dtype=torch.float64), f32, "c", "value").dtype == f32
    with pytest.raises(ValueError, match="exceeds float32's range"):
        to_wire(torch.tensor([1e300], dtype=torch.float64), f32, "c", "value")
    with pytest.raises(ValueError, match="would be sent as zero"):
        to_wire(torch.tensor([1e-300], dtype=torch.float64), f32, "c", "value")
    zero = to_wire(torch.tensor([0.0, 1.0], dtype=torch.float64), f32, "c", "value")
    assert zero.tolist() == [0.0, 1.0]


def test_max_abs_reuses_the_checked_extremes_only_for_the_same_unchanged_elements():
    """all_finite keeps the extremes it read for max_abs on the same elements (one pass for both): the same tensor or
    a contiguous view of the same memory (NDQSG's scale reads the (1, d) rows of the checked vector), in either
    order. An in-place change, other elements (a part, a strided view), a tensor that replaced a freed one or the end
    of an encode must all force a fresh reading."""
    from gradstat import compressors

    x = torch.tensor([1.0, -3.0, 2.0])
    assert P.all_finite(x) and float(P.max_abs(x)) == 3.0
    x.mul_(2)  # bumps the version counter
    assert float(P.max_abs(x)) == 6.0
    with _aminmax_calls() as calls:
        assert float(P.max_abs(x)) == 6.0 and P.all_finite(x)  # (the other order)
        assert P.all_finite(x) and float(P.max_abs(x.reshape(1, 3).reshape(-1))) == 6.0
    assert calls == [(3,), (3,)]
    y = torch.tensor([7.0, -9.0, 8.0, 10.0])
    for part, want in ((y[:3], 9.0), (y[::2], 8.0), (y[1:], 10.0)):
        P.all_finite(y)
        assert float(P.max_abs(part)) == want
    P.forget_extremes()
    x = torch.tensor([7.0, -9.0, 8.0])
    P.all_finite(x)
    del x  # a new tensor may take its memory: the weak reference to the checked one is dead
    assert float(P.max_abs(torch.tensor([1.0, -2.0, 1.5]))) == 2.0
    z = torch.tensor([1.0, -4.0])
    P.all_finite(z)
    z.data.mul_(10)  # .data bypasses the version counter: forgetting is what makes this safe
    P.forget_extremes()
    assert float(P.max_abs(z)) == 40.0
    P.all_finite(z)
    compressors.create("topk:ratio=0.5").encode(z)
    assert P._EXTREMES.last is None  # every encode forgets what its check read


@contextlib.contextmanager
def _aminmax_calls() -> Iterator[list[tuple[int, ...]]]:
    """The shapes of the tensors ``torch.aminmax`` reads in the enclosed code."""
    calls: list[tuple[int, ...]] = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func.overloadpacket is torch.ops.aten.aminmax:
                calls.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    with Seen():
        yield calls


def test_ndqsg_reads_its_input_s_extremes_once():
    """Its finiteness check and its whole-vector scale (the max |g| of its one row) share one aminmax pass."""
    from gradstat import compressors

    g = torch.randn(50_000, generator=torch.Generator().manual_seed(1))
    with _aminmax_calls() as calls:
        compressors.create("ndqsg").encode(g)
    assert calls.count((50_000,)) == 1, calls


@pytest.mark.parametrize("name", ["laplace", "with_zeros", "ties", "denormal", "near_overflow", "float64"])
@pytest.mark.parametrize("signed", [False, True])
def test_chunked_selection_across_many_chunks_equals_the_plain_mask(name, signed, monkeypatch, selection_path):
    """The CPU selection reads the vector a chunk at a time: with chunks of 61 elements (a ragged last chunk, most
    chunks holding no hit at the high quantiles) its indices, and the magnitudes ``gather_at_least`` takes from
    each chunk, equal the plain mask's over the whole vector."""
    monkeypatch.setattr(P, "SELECT_CHUNK", 61)
    x = CASES[name]
    a = x.abs()
    for quantile in (0.0, 0.5, 0.99, 0.9999, 1.0):
        t = torch.quantile(a.double(), quantile).to(a.dtype)
        reference = torch.nonzero((a >= t) & (a > 0)).squeeze(1)
        v = x if signed else a
        assert torch.equal(P.select_at_least(v, t, signed=signed), reference)
        indices, values = P.gather_at_least(v, t, signed=signed)
        assert torch.equal(indices, reference) and torch.equal(values, a[reference])
    assert P.select_at_least(x, a.max() * 2, signed=True).numel() == 0
    assert P.gather_at_least(x, a.max() * 2, signed=True)[1].numel() == 0


def test_blocked_selection_off_the_cpu_path_equals_the_plain_mask():
    """The block-maxima selection (the path of non-CPU devices), run here on CPU tensors: sparse (a few candidate
    blocks), dense (the whole-mask fallback), signed and with a ragged tail."""
    x = _laplace(64 * 1000 + 37)
    a = x.abs()
    for t in (0.01, 3.0, 9.0, float(a.max())):
        reference = torch.nonzero(a >= t).squeeze(1)
        bound = P.positive_threshold(t, a)
        assert torch.equal(P._select_blocked(a, bound, False), reference)
        assert torch.equal(P._select_blocked(x, bound, True), reference)


@pytest.mark.parametrize("name", ["laplace", "with_zeros", "denormal", "near_overflow", "float64", "short"])
def test_scan_selects_and_reads_the_largest_magnitude_with_nan_and_inf_reaching_it(name, monkeypatch, selection_path):
    """``scan_at_least``: the selection plus max |x| of the whole vector from the same read (chunks of 61 here),
    NaN when any element is NaN (wherever it lies, whatever the other chunks hold), +inf when any is infinite:
    what lets a fixed-threshold encode skip its separate check pass."""
    monkeypatch.setattr(P, "SELECT_CHUNK", 61)
    x = CASES[name]
    t = x.abs().max() / 3
    indices, top = P.scan_at_least(x, t, signed=True)
    assert torch.equal(indices, P.select_at_least_reference(x, t, signed=True))
    assert top == float(x.abs().max())
    for where in (0, x.numel() // 2, x.numel() - 1):
        for bad, want in ((math.nan, math.isnan), (math.inf, math.isinf), (-math.inf, math.isinf)):
            y = x.clone()
            y[where] = bad
            assert want(P.scan_at_least(y, t, signed=True)[1]), (where, bad)
            assert want(P.scan_at_least(y.abs(), t)[1]), (where, bad)


@pytest.mark.parametrize("name", sorted(CASES))
def test_at_least_zero_equals_the_plain_comparison(name):
    x = CASES[name].clone()
    x[:3] = torch.tensor([-0.0, 0.0, -TINY], dtype=x.dtype)[: min(3, x.numel())]
    assert torch.equal(P.at_least_zero(x), x >= 0)
    m = x[: (x.numel() // 3) * 3].reshape(-1, 3)
    assert torch.equal(P.at_least_zero(m), m >= 0)
    assert torch.equal(P.at_least_zero(m.t()), m.t() >= 0)  # not contiguous: torch's comparison


@pytest.mark.parametrize("scale", [None, 1.0, 0.7310586, 3e-39, 1e-45, 1e30, FMAX / 2, FMAX, 0.0, -0.0, -2.5])
def test_plus_minus_equals_the_plain_signed_scale_bit_for_bit(scale):
    """``b (2s) - s`` against ``s (2b - 1)``: the same float32 bit patterns at every scale, the denormal ones,
    those whose double overflows and the signed zeros (which take the plain form) included; 2-D and
    non-contiguous bits too."""
    bits = _laplace(10_007) >= 0
    s = None if scale is None else torch.tensor([scale], dtype=torch.float32)
    plain = bits.float() * 2 - 1
    want = plain if s is None else plain * s
    assert torch.equal(P.plus_minus(bits, s).view(torch.int32), want.view(torch.int32))
    rows = bits[:10_000].reshape(100, 100)
    got = P.plus_minus(rows.t(), s)
    assert torch.equal(
        got.contiguous().view(torch.int32), want[:10_000].reshape(100, 100).t().contiguous().view(torch.int32)
    )
    assert torch.isfinite(P.plus_minus(bits, s)).all()
    # the one-pass form other devices take, on CPU tensors here
    assert torch.equal(P.plus_minus_where(bits, s).view(torch.int32), want.view(torch.int32))
    assert torch.equal(P.plus_minus_where(rows.t(), s).view(torch.int32), got.view(torch.int32))


@pytest.mark.parametrize("scale", [None, 0.7310586, 3e-39, FMAX, 0.0, -0.0, -2.5])
def test_plus_minus_on_every_device_equals_the_plain_signed_scale_bit_for_bit(scale, device):
    """plus_minus where it runs (numpy loops on a CPU, one where() on a GPU): the CPU's plain ``s (2b - 1)``."""
    bits = _laplace(10_007) >= 0
    s = None if scale is None else torch.tensor([scale], dtype=torch.float32)
    want = bits.float() * 2 - 1 if s is None else (bits.float() * 2 - 1) * s
    got = P.plus_minus(bits.to(device), None if s is None else s.to(device))
    assert got.device.type == device.type
    assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32))


def test_choose_by_bits_equals_where_bit_for_bit():
    """The bit-pattern choice against ``torch.where``: per-row values of every kind a float32 holds (signed
    zeros, denormals, the largest finite, infinities), several rows, and non-contiguous bits (the plain path)."""
    special = torch.tensor([0.0, -0.0, 1e-45, -3e-39, FMAX, -FMAX, math.inf, -math.inf, 1.5, -2.25])
    gen = torch.Generator().manual_seed(11)
    f = special[torch.randint(0, 10, (10,), generator=gen)]
    t = special[torch.randint(0, 10, (10,), generator=gen)]
    bits = _laplace(10 * 997, 12).reshape(10, 997) >= 0
    want = torch.where(bits, t[:, None], f[:, None])
    got = P.choose_by_bits(bits, f, t)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # bit patterns: -0.0 kept apart from 0.0
    cols = bits.t().contiguous().t()  # the same values, column-major
    assert torch.equal(P.choose_by_bits(cols, f, t).view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_count_at_smallest_is_the_same_on_numpy_and_torch(dtype):
    # the CPU form (numpy on the tensor's memory) against the torch form (a non-contiguous view takes it), on
    # selections with and without ties at their smallest magnitude, signed values, and no selection at all
    from gradstat.theory.kernels.primitives import count_at_smallest

    g = torch.Generator().manual_seed(3)
    x = torch.randint(-5, 6, (4000,), generator=g).to(dtype) * 0.25
    strided = torch.stack([x, torch.zeros_like(x)], dim=1)[:, 0]  # same values, not contiguous
    assert not strided.is_contiguous()
    for size in (0, 1, 7, 300, 4000):
        indices = torch.randperm(4000, generator=g)[:size].sort().values
        want = 0 if size == 0 else int((x[indices].abs() == x[indices].abs().min()).sum())
        assert count_at_smallest(x, indices) == want == count_at_smallest(strided, indices), size


def test_the_norm_finiteness_flag_sees_every_nan_and_infinity():
    """The small tensors' check off the CPU (a quantizer's scales on a GPU): one norm reduction; here on CPU tensors,
    whose values it reads the same way."""
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.tensor([0.0, 2.5, -1e-30, 3.0e38 if dtype != torch.float64 else 1e300], dtype=dtype)
        assert bool(P.norm_finite_flag(x))
        for bad in (math.nan, math.inf, -math.inf):
            for at in (0, 3):
                y = x.clone()
                y[at] = bad
                assert not bool(P.norm_finite_flag(y)), (dtype, bad, at)
    assert bool(P.norm_finite_flag(torch.zeros(1)))

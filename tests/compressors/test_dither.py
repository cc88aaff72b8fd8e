"""The shared dithered quantization step (002_87c17e3716ede1d0.txt Sec. 2.1, Theorem 1, Lemma 2)."""

from __future__ import annotations

import pytest
import torch
from _quant_checks import check_mean_equals

from gradstat.compressors.schemes.quantizers.dither import (
    ScaledQuantizer,
    bucket_norm,
    draw_dither,
    quantize,
    reconstruct,
    to_buckets,
)
from gradstat.compressors.wire.payload import Payload

N = 200_000  # dither draws per check


def test_dithered_error_is_uniform_and_independent_of_the_input():
    """Theorem 1: for any y, the error c - u - y has mean 0 and variance 1/12 (99.9 % z-tests per y, Bonferroni
    not needed for the claim to fail on the half-dithered variant below)."""
    u = draw_dither(N, seed=1, device=torch.device("cpu")).double()
    for y0 in (0.0, 0.13, 0.5, -1.77, 2.9):
        y = torch.full((N,), y0, dtype=torch.float64)
        err = reconstruct(quantize(y, u, -3, 3), u) - y
        assert check_mean_equals(err, 0.0) == []
        assert check_mean_equals(err**2, 1 / 12) == []
        assert float(err.abs().max()) <= 0.5


def test_half_dithered_error_depends_on_the_input():
    """Lemma 2: the half-dithered error is unbiased with variance f(1 - f) (f = fractional part), not 1/12."""
    u = draw_dither(N, seed=2, device=torch.device("cpu")).double()
    for y0, var in ((0.0, 0.0), (0.25, 0.1875), (0.5, 0.25), (-1.3, 0.21)):
        y = torch.full((N,), y0, dtype=torch.float64)
        err = reconstruct(quantize(y, u, -3, 3), None) - y
        assert check_mean_equals(err, 0.0) == []
        assert check_mean_equals(err**2, var) == []
    y = torch.full((N,), 0.25, dtype=torch.float64)  # the dithered check rejects it
    assert check_mean_equals((reconstruct(quantize(y, u, -3, 3), None) - y) ** 2, 1 / 12) != []


def test_codes_never_leave_the_range_even_at_the_edges():
    u = torch.tensor([-0.5, 0.4999999, 0.0])
    assert quantize(torch.tensor([-3.0, 3.0, 3.0]), u, -3, 3).tolist() == [-3.0, 3.0, 3.0]


def test_literal_one_bit_reading_of_eq_5_6_is_biased_and_the_midrise_reading_is_not():
    """QCS (5)-(6): with s = 2||v||_inf, y = v/s in [-1/2, 1/2] and q = sign(y + u), taking s (q - u) literally
    has mean 2v; the midrise reading (points +-1/2, value q/2 - u) is unbiased with error variance 1/12."""
    u = draw_dither(N, seed=3, device=torch.device("cpu")).double()
    y = torch.full((N,), 0.3, dtype=torch.float64)
    q = torch.where(y + u > 0, 1.0, -1.0).double()
    assert check_mean_equals(q - u, 0.6) == []  # literal: 2y
    mid = reconstruct(quantize(y, u, -1, 0, offset=0.5), u, offset=0.5)
    assert torch.equal(mid, q / 2 - u)
    assert check_mean_equals(mid, 0.3) == [] and check_mean_equals((mid - y) ** 2, 1 / 12) == []


def test_dither_is_reproducible_from_the_seed_on_the_device(device):
    a = draw_dither(1000, 5, device)
    assert a.device.type == device.type and torch.equal(a, draw_dither(1000, 5, device))
    assert not torch.equal(a, draw_dither(1000, 6, device))
    assert float(a.min()) >= -0.5 and float(a.max()) < 0.5


def test_buckets_pad_only_the_last_row_and_norms_do_not_overflow():
    x = torch.arange(1.0, 8.0)
    b = to_buckets(x, 3)
    assert b.tolist() == [[1, 2, 3], [4, 5, 6], [7, 0, 0]]
    huge = torch.full((2, 4), 1e30)
    assert torch.allclose(bucket_norm(huge, "l2"), torch.full((2,), 2e30))
    assert bucket_norm(b, "linf").tolist() == [3, 6, 7]


@pytest.mark.parametrize("subtract", [True, False])
def test_zero_buckets_decode_to_zero(subtract):
    q = ScaledQuantizer(levels=2, bucket=4, subtract=subtract)
    x = torch.tensor([0.0, 0, 0, 0, 1, -2, 0.5, 0])
    p = Payload(shape=x.shape, dtype=x.dtype)
    q.encode(x, p, seed=1)
    out = q.decode(p, 8, seed=1)
    assert out[:4].tolist() == [0, 0, 0, 0] and p["scales"].tolist() == [0, 2]


def test_invalid_quantizer_settings_are_rejected():
    with pytest.raises(ValueError, match="levels"):
        ScaledQuantizer(levels=0)
    with pytest.raises(ValueError, match="norm"):
        ScaledQuantizer(levels=1, norm="l3")
    with pytest.raises(ValueError, match="1-bit"):
        ScaledQuantizer(levels=2, onebit=True)


@pytest.mark.parametrize("source", ["counter", "torch"])
def test_a_dithered_reconstruction_beyond_float32_is_refused_before_anything_is_sent(source):
    """Dithered values ``c - u`` reach half a step past the outermost code: (L + 1/2)/L times the scale (1.25 for
    L = 2), 2 for the 1-bit quantizer. A scale whose reach float32 cannot carry is refused at encode with a clear
    error; just inside the reach, every seed decodes finite; the half-dithered quantizer never passes its scale."""
    fmax = torch.finfo(torch.float32).max
    q = ScaledQuantizer(levels=2, bucket=0, norm="linf", subtract=True, dither=source)
    onebit = ScaledQuantizer(levels=1, bucket=0, norm="linf", subtract=True, onebit=True, dither=source)
    assert q.reach == 1.25 and onebit.reach == 2.0
    x = torch.tensor([3.0e38, -1.0e38, 2.0e37, 0.0])
    for quantizer in (q, onebit):
        with pytest.raises(ValueError, match=r"dithered reconstruction reaches .* beyond float32's range"):
            quantizer.encode(x, Payload(shape=x.shape, dtype=x.dtype), seed=0)
    half = ScaledQuantizer(levels=2, bucket=0, norm="linf", subtract=False, dither=source)
    p = Payload(shape=x.shape, dtype=x.dtype)
    half.encode(x, p, seed=0)
    assert bool(torch.isfinite(half.decode(p, 4, seed=0)).all())
    edge = torch.full((64,), fmax / 1.25 * (1 - 2**-20))
    edge[1::2] *= -1
    for seed in range(50):
        p = Payload(shape=edge.shape, dtype=edge.dtype)
        q.encode(edge, p, seed=seed)
        assert bool(torch.isfinite(q.decode(p, 64, seed=seed)).all()), seed

"""The wire dtype follows the gradient: a bf16 or fp16 gradient's values, scales and factors travel at 16 bits (the
part's dtype in the wire header), counted in the bits; where the math is exact (values and scales representable in
bf16) the 16-bit payload carries the same numbers as the float32 one and decodes to the same tensor."""

from __future__ import annotations

import math

import pytest
import torch

from gradstat import compressors
from gradstat.compressors.context import Context
from gradstat.compressors.wire.errors import PayloadError
from gradstat.compressors.wire.floats import to_wire, wire_float
from gradstat.compressors.wire.payload import Payload, header_bits

HALF = (torch.bfloat16, torch.float16)


def _laplace16(d: int, seed: int) -> torch.Tensor:
    """Laplace values rounded to bf16 and then to fp16's grid too (so the same numbers are exact in all three)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(d, generator=gen, dtype=torch.float64) - 0.5
    x = (-torch.sign(u) * torch.log1p(-2 * u.abs())).float()
    return x.to(torch.bfloat16).float().to(torch.float16).float()


def _powers_of_two(d: int = 2048, per_bucket: int = 4, bucket: int = 512, seed: int = 0) -> torch.Tensor:
    """Zeros except ``per_bucket`` entries of +-1 in each bucket of 512: every l_inf and l2 norm (of a bucket, 2, and
    of the whole vector, 4) is a power of two, exact in bf16 and fp16."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.zeros(d)
    for b in range(0, d, bucket):
        pos = b + torch.randperm(bucket, generator=gen)[:per_bucket]
        x[pos] = torch.where(torch.rand(per_bucket, generator=gen) < 0.5, -1.0, 1.0)
    return x


def _encode(name: str, g: torch.Tensor) -> tuple[Payload, torch.Tensor]:
    c = compressors.create(name)
    ctx = Context(seed=7, step=3, worker=1, state=c.new_state(g))
    p = c.encode(g, ctx)
    back = Payload.from_bytes(p.to_bytes(), p.shape, p.dtype)  # what a receiver reads
    return back, c.decode(back, ctx, side=g if c.properties.needs_side else None)


@pytest.mark.parametrize("name", compressors.names())
@pytest.mark.parametrize("dtype", HALF)
def test_a_16_bit_gradient_sends_every_floating_part_at_16_bits(name, dtype, device):
    g = _laplace16(3000, 1).reshape(60, 50).to(device)
    p32, _ = _encode(name, g)
    p16, out = _encode(name, g.to(dtype))
    assert out.dtype == dtype and out.shape == g.shape and out.device == g.device
    floats = 0
    assert list(p16.parts) == list(p32.parts)
    for key, part in p16.parts.items():
        wide = p32.parts[key]
        assert part.tensor.shape == wide.tensor.shape, key
        if wide.tensor.is_floating_point():
            assert wide.tensor.dtype == torch.float32 and wide.width == 32
            assert part.tensor.dtype == dtype and part.width == 16, key
            floats += part.tensor.numel()
        else:
            assert part.tensor.dtype == wide.tensor.dtype and part.width == wide.width, key
    assert floats > 0
    # the same selection: the float32 payload's bits less 16 per floating value, and the bytes say so
    assert p16.bits == p32.bits - 16 * floats
    assert 8 * p16.wire_bytes == header_bits(len(p16.parts)) + 8 * math.ceil(p16.bits / 8)


def _signs(d: int = 2048, seed: int = 0) -> torch.Tensor:
    """+-1/2 everywhere: every class mean and l1 mean is +-1/2."""
    gen = torch.Generator().manual_seed(seed)
    return torch.where(torch.rand(d, generator=gen) < 0.5, -0.5, 0.5)


VECTORS = {"laplace16": lambda: _laplace16(4096, 2), "powers": _powers_of_two, "signs": _signs}
EXACT: dict[str, tuple[str, ...]] = {
    **{
        name: ("laplace16", "powers")
        for name in ("topk", "dgc", "gmc_topk", "gaussianksgd", "redsync", "sidco", "tailcount", "threshold", "randk")
    },
    **{name: ("powers",) for name in ("qsgd", "ecq", "terngrad", "dqsg", "ndqsg")},
    **{name: ("signs",) for name in ("signsgd", "onebit")},
}
"""Compressors whose 16-bit payload carries exactly the float32 payload's numbers on vectors exact in 16 bits, and
those vectors: the sparsifiers send elements of the gradient; the quantizers' l_inf and l2 norms are powers of two
on ``powers``, signSGD's l1 mean and 1-bit SGD's class means on ``signs`` (on ``powers`` the zeros join the
positive class). Not here: ``qcs`` (its scales are norms of Hadamard-mixed vectors), ``powersgd`` (QR factors),
``wangni`` and ``randk_unbiased`` (values divided by probabilities): rounded to 16 bits."""


@pytest.mark.parametrize("name", sorted(EXACT))
@pytest.mark.parametrize("dtype", HALF)
def test_where_the_math_is_exact_16_bits_carry_the_float32_payload(name, dtype, device):
    for vector in EXACT[name]:
        g = VECTORS[vector]().to(device)
        p32, out32 = _encode(name, g)
        p16, out16 = _encode(name, g.to(dtype))
        for key, part in p16.parts.items():
            assert torch.equal(part.tensor.float(), p32.parts[key].tensor.float()), f"{name}, {vector}: {key} differs"
        assert torch.equal(out16, out32.to(dtype))


def test_scales_are_rounded_up_so_they_still_bound_their_bucket():
    x = torch.tensor([1.0 + 2**-10, 3.0, 1e-3, 0.0])  # 1 + 2^-10 lies between two bf16 values
    up = to_wire(x, torch.bfloat16, "c", "scale", up=True)
    assert up.dtype == torch.bfloat16 and bool((up.float() >= x).all())
    assert up[0].item() == 1.0 + 2**-7 and up[1].item() == 3.0 and up[3].item() == 0.0  # next bf16 above 1
    near = to_wire(x, torch.bfloat16, "c", "mean")
    assert near[0].item() == 1.0


def test_a_16_bit_scale_quantizer_stays_unbiased():
    # eight ones: the l2 scale sqrt(8) = 2.8284 is sent as bf16 2.84375 (rounded up, 0.54 % above). The encoder
    # quantizes with the scale it sends, so E[decode] = g; had it quantized with sqrt(8) and sent 2.84375, every
    # element would be 0.0054 too large. With s = 127 levels a reconstruction's error is uniform over one step
    # (2.84375 / 127), standard deviation 0.0065, so the mean of 4000 seeds has a standard error of 1.0e-4: a
    # bound of 6 standard errors (6.2e-4; confidence 1 - 2e-9 per element) is an order below that bias.
    g = torch.ones(8, dtype=torch.bfloat16)
    c = compressors.create("qsgd:s=127")
    assert c.encode(g)["scales"].item() == 2.84375
    trials = 4000
    acc = torch.zeros(8, dtype=torch.float64)
    for seed in range(trials):
        acc += c.decode(c.encode(g, Context(seed=seed))).double()
    step_sd = 2.84375 / 127 / math.sqrt(12)
    assert float((acc / trials - 1.0).abs().max()) < 6 * step_sd / math.sqrt(trials)


def test_wire_dtypes_are_the_gradients_for_16_bit_and_float32_otherwise():
    assert wire_float(torch.bfloat16) == torch.bfloat16 and wire_float(torch.float16) == torch.float16
    assert wire_float(torch.float32) == torch.float32 and wire_float(torch.float64) == torch.float32


def test_a_value_a_16_bit_dtype_cannot_carry_is_refused_clearly():
    with pytest.raises(ValueError, match="exceeds float16's range"):
        to_wire(torch.tensor([1e5]), torch.float16, "qsgd", "l2 bucket scale", up=True)
    with pytest.raises(ValueError, match="would be sent as zero"):
        to_wire(torch.tensor([1e-9]), torch.float16, "signsgd", "l1 scale")
    big = torch.full((4096,), 60000.0, dtype=torch.float16)  # each fits fp16, the bucket's l2 norm does not
    with pytest.raises(ValueError, match="float16's range"):
        compressors.create("qsgd").encode(big)


@pytest.mark.parametrize("name", ["dqsg", "ndqsg"])
def test_a_reconstruction_beyond_float16s_range_is_refused_not_sent_as_inf(name):
    # values up to 65000: dithered reconstructions reach half a step beyond the l_inf scale, past 65504
    g = (torch.rand(4096, generator=torch.Generator().manual_seed(0)) * 2 - 1).mul(65000).half()
    c = compressors.create(name)
    ctx = Context(seed=1)
    with pytest.raises(PayloadError, match="exceeds float16's range"):
        c.decode(c.encode(g, ctx), ctx, side=g if c.properties.needs_side else None)

"""signSGD, 1-bit SGD and NDQSG: the in-place encode/decode give the same payloads and reconstructions, bit for bit,
as plain reference forms written with fresh tensors (the same dithers: counter or torch's draws), for 1-D and 2-D
gradients (1-bit's column groups are a transposed view: the reductions must keep its layout), all-zero gradients
and extreme scales."""

from __future__ import annotations

import pytest
import torch

from gradstat import compressors
from gradstat.compressors.context import Context
from gradstat.compressors.schemes.quantizers.dither import DITHER_STREAM, draw_dither
from gradstat.compressors.wire.floats import to_wire
from gradstat.compressors.wire.payload import Payload
from gradstat.theory.kernels import counter_dither
from gradstat.theory.kernels.hadamard import first_rows, first_rows_transpose
from gradstat.theory.kernels.primitives import mean_abs

SHAPES = [(1,), (7,), (4099,), (64, 33), (33, 64), (300, 257)]
SCALES = [1.0, 1e-30, 1e30, 1e-40]


def _gradients():
    for i, shape in enumerate(SHAPES):
        for j, scale in enumerate(SCALES):
            gen = torch.Generator().manual_seed(100 * i + j)
            g = torch.randn(shape, generator=gen, dtype=torch.float64) * torch.rand(shape, generator=gen) ** 4
            yield f"{shape}-{scale:g}", (g * scale).float()
        yield f"{shape}-zeros", torch.zeros(shape)


def _equal_payloads(a: Payload, b: Payload) -> None:
    assert list(a.parts) == list(b.parts)
    for name in a.parts:
        x, y = a[name], b[name]
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), name
        # the sign of a zero scale is part of the payload
        if x.is_floating_point():
            assert torch.equal(torch.signbit(x), torch.signbit(y)), name


def _signsgd_reference(g: torch.Tensor, scale: str) -> tuple[Payload, torch.Tensor]:
    p = Payload(shape=g.shape, dtype=g.dtype)
    flat = g.reshape(-1)
    p.add("signs", flat >= 0, 1, "code")
    s = p["signs"].float() * 2.0 - 1.0
    if scale == "l1":
        p.add("scale", to_wire(mean_abs(flat).reshape(1), torch.float32, "signsgd", "l1 scale"), 32, "scale")
        s = p["scale"] * s
    return p, s.reshape(g.shape)


@pytest.mark.parametrize("scale", ["l1", "unit"])
def test_signsgd_equals_the_plain_reference(scale):
    c = compressors.create(f"signsgd:scale={scale}")
    for label, g in _gradients():
        payload = c.encode(g)
        ref_payload, ref_out = _signsgd_reference(g, scale)
        _equal_payloads(payload, ref_payload)
        out = c.decode(payload)
        assert torch.equal(out, ref_out) and torch.equal(torch.signbit(out), torch.signbit(ref_out)), label


@pytest.mark.parametrize("spec", ["onebit", "onebit:axis=row", "onebit:columns=1"])
def test_onebit_equals_the_plain_reference(spec):
    c = compressors.create(spec)
    for _label, g in _gradients():
        if spec.endswith("columns=1") and g.dim() > 1:
            continue
        fast = Payload(shape=g.shape, dtype=g.dtype)
        plain = Payload(shape=g.shape, dtype=g.dtype)
        c._encode(g.reshape(-1), fast, Context())
        c._encode_reference(g.reshape(-1), plain, Context())
        _equal_payloads(fast, plain)
        # the decode: each element gets its group's mean for its bit (the plain where over the matrix view)
        values = plain["values"]
        bits = plain["bits"].reshape(values.shape[0], -1)
        groups = torch.where(bits, values[:, 1:2], values[:, 0:1])
        want = (groups.T if c.axis == "column" else groups).reshape(-1)
        got = c._decode(fast, Context(), None)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), _label


def nested_encode_reference(x, u, delta1: float, k: int, alpha: float = 1.0) -> torch.Tensor:
    """Eq. (6) with fresh tensors (float codes)."""
    t = (alpha * x + u) / delta1
    s = torch.floor(t + 0.5) - k * torch.floor(t / k + 0.5)
    h = (k - 1) // 2
    return torch.remainder(s + h, k) - h


def nested_decode_reference(s, u, y, delta1: float, k: int, alpha: float = 1.0) -> torch.Tensor:
    """Eq. (7) with fresh tensors."""
    r = (s * delta1 - u - alpha * y) / delta1
    return y + alpha * delta1 * (r - k * torch.floor(r / k + 0.5))


def _ndqsg_reference(
    c, g: torch.Tensor, side: torch.Tensor, ctx: Context
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The plain P2 encode and decode: nested index codes, the scale kappa and the reconstruction."""
    flat = g.reshape(-1)
    kappa = flat.abs().amax()
    x = flat / torch.where(kappa > 0, kappa, torch.ones_like(kappa))
    if c.dither == "torch":
        u = draw_dither(flat.numel(), ctx.call_seed, flat.device) * c.fine_step
    else:  # element i's counter dither of (seed, i)
        key = counter_dither.keys(ctx.call_seed, DITHER_STREAM, flat.device)
        zero = torch.zeros((), dtype=torch.int32)
        u = counter_dither.dither_rows(1, flat.numel(), zero, key, flat.device)[0] * c.fine_step
    s = nested_encode_reference(x, u, c.fine_step, c.nesting, c.alpha)
    codes = s.to(torch.int8 if c.nesting <= 255 else torch.int32)
    safe = torch.where(kappa > 0, kappa, torch.ones_like(kappa))
    x_hat = nested_decode_reference(codes.float(), u, side.reshape(-1) / safe, c.fine_step, c.nesting, c.alpha)
    return codes, kappa, kappa * x_hat


@pytest.mark.parametrize(
    "spec",
    [
        "ndqsg",
        "ndqsg:alpha=0.7",
        "ndqsg:delta1=0.25,delta2=1.0,alpha=0.9",
        "ndqsg:dither=torch",
        "ndqsg:alpha=0.7,dither=torch",
    ],
)
def test_ndqsg_nested_worker_equals_the_plain_reference(spec):
    c = compressors.create(spec)
    ctx = Context(seed=4, worker=1)  # a P2 worker: nested indices
    for label, g in _gradients():
        side = g + 0.01 * g.abs().amax() * torch.randn(g.shape, generator=torch.Generator().manual_seed(7))
        payload = c.encode(g, ctx)
        codes, kappa, out = _ndqsg_reference(c, g, side, ctx)
        assert torch.equal(payload["nested"], codes), label
        sent = payload["scales"]
        assert torch.equal(sent, kappa.reshape(1)) and torch.equal(torch.signbit(sent), torch.signbit(kappa.reshape(1)))
        got = c.decode(payload, ctx, side=side).reshape(-1)
        assert torch.equal(got, out.float()), label


@pytest.mark.parametrize(
    "spec",
    [
        "qcs",
        "qcs:k=64,Q=4,block=256",
        "qcs:k=256,Q=1",
        "qcs:k=32,block=64,onebit=True",
        "qcs:k=16,Q=2,block=128,alpha=mmse",
        "qcs:k=24,Q=3,block=96",  # k does not fold: the full Paley x Sylvester transform
        "qcs:k=16,Q=4,block=192",  # folds over a Paley I base of order 12 (its first row is all ones)
        "qcs:k=2,Q=2,block=200",  # folds over a Paley II base of order 100 (its first row has minus signs)
    ],
)
def test_qcs_equals_the_plain_reference(spec):
    c = compressors.create(spec)
    for label, g in _gradients():
        ctx = Context(seed=9, step=len(label))
        flat = g.reshape(-1)
        fast, plain = Payload(shape=g.shape, dtype=g.dtype), Payload(shape=g.shape, dtype=g.dtype)
        try:
            c._encode_reference(flat, plain, ctx)
        except ValueError as exc:  # a scale float32 cannot carry: the fast path refuses it too
            with pytest.raises(ValueError, match=str(exc)[:40]):
                c._encode(flat, fast, ctx)
            continue
        c._encode(flat, fast, ctx)
        _equal_payloads(fast, plain)
        out, ref = c._decode(fast, ctx, None), c._decode_reference(plain, ctx, None)
        assert out.shape == ref.shape and torch.equal(out, ref), label


@pytest.mark.parametrize("n,k", [(256, 64), (256, 256), (64, 8), (192, 16), (200, 2), (96, 8)])
def test_first_rows_equal_the_plain_fold_bit_for_bit(n, k):
    """The fold skips the multiplication by an all-ones first row (Sylvester orders) and nothing else."""
    from gradstat.theory.kernels.hadamard import _first_row_on, factor, fwht

    x = torch.randn(37, n, generator=torch.Generator().manual_seed(n + k))
    m, p2 = factor(n)
    sign = _first_row_on(m, x.dtype, x.device)
    plain = fwht((x.reshape(37, m, p2 // k, k) * sign[:, None, None]).sum(dim=(-3, -2)))
    assert torch.equal(first_rows(x, k), plain)
    v = torch.randn(37, k, generator=torch.Generator().manual_seed(k))
    w = fwht(v)[..., None, None, :] * sign[:, None, None]
    assert torch.equal(first_rows_transpose(v, n), w.expand(37, m, p2 // k, k).reshape(37, n))

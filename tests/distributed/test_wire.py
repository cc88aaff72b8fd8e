"""The wire format: every registered compressor's payload serialises to one flat uint8 tensor and back exactly,
with ``8 * len(bytes) = header + 8 * ceil(bits / 8)``; bit-packing is exact at every width."""

from __future__ import annotations

import math

import pytest
import torch

from gradstat import compressors
from gradstat.compressors.context import Context
from gradstat.compressors.wire import bitpack
from gradstat.compressors.wire.payload import Payload, header_bits


def _laplace(d: int, seed: int, device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(d, generator=gen, dtype=torch.float64) - 0.5
    return (-torch.sign(u) * torch.log1p(-2 * u.abs())).float().to(device)


@pytest.mark.parametrize("name", compressors.names())
def test_every_compressor_round_trips_through_bytes_exactly(name, device):
    c = compressors.create(name)
    for d, shape, worker in ((1000, (1000,), 0), (4099, (4099,), 1), (2048, (32, 64), 1)):
        g = _laplace(d, d, device).reshape(shape)
        ctx = Context(seed=3, step=2, worker=worker, state=c.new_state(g))
        payload = c.encode(g, ctx)
        data = payload.to_bytes()
        assert data.dtype == torch.uint8 and data.dim() == 1 and data.device.type == device.type
        assert data.numel() * 8 == header_bits(len(payload.parts)) + 8 * math.ceil(payload.bits / 8)
        assert data.numel() == payload.wire_bytes
        back = Payload.from_bytes(data, payload.shape, payload.dtype)
        assert list(back.parts) == list(payload.parts) and back.bits == payload.bits
        for key, part in payload.parts.items():
            got = back.parts[key]
            assert got.kind == part.kind and got.width == part.width and got.tensor.dtype == part.tensor.dtype
            assert torch.equal(got.tensor.cpu(), part.tensor.cpu()), f"{name}: part {key!r} differs"
        side = g if c.properties.needs_side else None
        assert torch.equal(c.decode(back, ctx, side=side), c.decode(payload, ctx, side=side))


@pytest.mark.parametrize("width", [1, 2, 3, 5, 7, 8, 11, 16, 17, 24, 31, 32])
def test_bit_packing_is_exact_and_dense_at_every_width(width, device):
    gen = torch.Generator().manual_seed(width)
    n, base = 1001, 13  # an odd count and an odd starting bit
    values = torch.randint(0, 2**width, (n,), generator=gen, dtype=torch.int64).to(device)
    values[:2] = torch.tensor([0, 2**width - 1])
    total = base + n * width
    acc = torch.zeros(bitpack.packed_bytes(total) + 8, dtype=torch.int64, device=device)
    bitpack.pack_into(acc, values, width, base)
    stream = acc.to(torch.uint8)
    assert int(acc.max()) <= 255  # no two values wrote the same bit
    assert not bool(stream[bitpack.packed_bytes(total) :].any())  # nothing past the last byte
    assert torch.equal(bitpack.unpack(stream, n, width, base), values)


def test_the_header_is_documented_size_and_the_bias_packs_signed_codes():
    p = Payload(shape=torch.Size([6]), dtype=torch.float32)
    p.add("codes", torch.tensor([-4, 4, 0, -1, 3, 2], dtype=torch.int8), 4, "code")  # 9 levels in 4 bits
    p.add("nested", torch.tensor([0, 1, 1, 0], dtype=torch.int8), 1, "code")  # {0, 1} in 1 bit
    p.add("scales", torch.tensor([1e-30, 1e30]), 32, "scale")
    p.add_seed(2**63 - 5)
    data = p.to_bytes()
    assert data.numel() == 12 + 28 * 4 + math.ceil((24 + 4 + 64 + 64) / 8)
    back = Payload.from_bytes(data, p.shape, p.dtype)
    assert torch.equal(back["codes"], p["codes"]) and torch.equal(back["nested"], p["nested"])
    assert torch.equal(back["scales"], p["scales"]) and back.seed == 2**63 - 5
    assert back["seed"].device.type == "cpu"


def test_values_that_do_not_fit_their_width_are_refused():
    p = Payload(shape=torch.Size([3]), dtype=torch.float32)
    p.add("codes", torch.tensor([-2, 0, 2], dtype=torch.int8), 2, "code")  # 5 levels claimed in 2 bits
    with pytest.raises(ValueError, match="do not fit"):
        p.to_bytes()
    q = Payload(shape=torch.Size([3]), dtype=torch.float32)
    q.add("values", torch.ones(3), 16, "value")
    with pytest.raises(ValueError, match="own 32 bits"):
        q.to_bytes()


@pytest.mark.parametrize(
    "mangle,match",
    [
        (lambda b: b[:5], "shorter"),
        (lambda b: torch.cat([torch.tensor([0, 0], dtype=torch.uint8), b[2:]]), "magic"),
        (lambda b: b[:-1], "announces"),
    ],
)
def test_bytes_that_are_not_a_payload_give_a_clear_error(mangle, match):
    c = compressors.create("topk:ratio=0.1")
    data = c.encode(_laplace(100, 1, "cpu")).to_bytes()
    with pytest.raises(ValueError, match=match):
        Payload.from_bytes(mangle(data), torch.Size([100]), torch.float32)

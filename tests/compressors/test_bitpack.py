"""The fast bit-packing paths of compressors/wire/bitpack.py give the same bytes as the plain reference (``pack_into`` /
``unpack``), bit for bit, at every width, length, dtype and starting bit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gradstat.compressors.wire import bitpack

WIDTHS = list(range(1, bitpack.MAX_WIDTH + 1))
LENGTHS = [1, 2, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1001, 4099]


def _values(n: int, width: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    v = torch.randint(0, 2**width, (n,), generator=gen, dtype=torch.int64)
    v[: min(n, 2)] = torch.tensor([2**width - 1, 0])[: min(n, 2)]  # both extremes
    return v


def _reference_stream(runs: list[tuple[torch.Tensor, int, int]], total_bits: int) -> torch.Tensor:
    acc = torch.zeros(bitpack.packed_bytes(total_bits) + 8, dtype=torch.int64)
    for values, width, base in runs:
        bitpack.pack_into(acc, values, width, base)
    assert int(acc.max()) <= 255  # no two values wrote the same bit
    return acc[: bitpack.packed_bytes(total_bits)].to(torch.uint8)


def _narrowest(values: torch.Tensor, width: int) -> list[torch.Tensor]:
    """The values in every integer dtype that holds them (and bool for width 1)."""
    out = [values]
    for dtype, top in ((torch.int32, 31), (torch.int16, 15), (torch.uint8, 8), (torch.int8, 7)):
        if width <= top:
            out.append(values.to(dtype))
    if width == 1:
        out.append(values.bool())
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_pack_equals_the_reference_at_every_width_length_and_dtype(width):
    for n in LENGTHS:
        values = _values(n, width, 1000 * width + n)
        expected = _reference_stream([(values, width, 0)], n * width)
        for v in _narrowest(values, width):
            got = bitpack.pack(v, width)
            assert got.dtype == torch.uint8 and torch.equal(got, expected), (width, n, v.dtype)


@pytest.mark.parametrize("width", WIDTHS)
def test_unpack_bytes_equals_the_reference_and_inverts_pack(width):
    for n in LENGTHS:
        values = _values(n, width, 7 * width + n)
        data = bitpack.pack(values, width)
        got = bitpack.unpack_bytes(data, n, width)
        reference = bitpack.unpack(torch.cat((data, data.new_zeros(8))), n, width, 0)
        assert torch.equal(got.to(torch.int64), reference) and torch.equal(reference, values), (width, n)
        expected_dtype = torch.uint8 if width <= 8 else torch.int32 if width <= 16 else torch.int64
        assert got.dtype == expected_dtype


def test_bits_above_the_width_are_dropped_as_by_the_reference():
    gen = torch.Generator().manual_seed(3)
    raw = torch.randint(-(2**40), 2**40, (999,), generator=gen, dtype=torch.int64)
    for width in WIDTHS:
        for v in (raw, raw.to(torch.int32), raw.to(torch.int8)):
            assert torch.equal(bitpack.pack(v, width), _reference_stream([(v, width, 0)], 999 * width)), width


def test_pack_reads_views_and_unaligned_slices_without_changing_them():
    base = _values(4096 + 5, 3, 11).to(torch.uint8)
    for view in (base[5:], base[1::2], base[5:].view(64, -1)[:, :7]):
        before = view.clone()
        got = bitpack.pack(view, 3)
        assert torch.equal(got, _reference_stream([(view.reshape(-1), 3, 0)], view.numel() * 3))
        assert torch.equal(view, before)


def _runs(seed: int, count: int) -> tuple[list[tuple[torch.Tensor, int, int]], int]:
    gen = torch.Generator().manual_seed(seed)
    runs, base = [], int(torch.randint(0, 16, (), generator=gen))
    for i in range(count):
        width = int(torch.randint(1, bitpack.MAX_WIDTH + 1, (), generator=gen))
        n = int(torch.randint(0, 300, (), generator=gen))
        runs.append((_values(n, width, seed * 100 + i), width, base))
        base += n * width + int(torch.randint(0, 3, (), generator=gen))  # sometimes a gap of unused bits
    return runs, base


@pytest.mark.parametrize("seed", range(20))
def test_runs_written_at_any_bit_make_the_reference_stream_and_read_back(seed):
    runs, total = _runs(seed, 6)
    stream = torch.zeros(bitpack.packed_bytes(total), dtype=torch.uint8)
    for values, width, base in runs:
        bitpack.write_bits(stream, bitpack.pack(values, width), base)
    assert torch.equal(stream, _reference_stream(runs, total))
    for values, width, base in runs:
        n = values.numel()
        data = bitpack.read_bits(stream, base, bitpack.packed_bytes(n * width))
        assert torch.equal(bitpack.unpack_bytes(data, n, width).to(torch.int64), values)


@settings(max_examples=60, deadline=None)
@given(
    width=st.integers(1, bitpack.MAX_WIDTH),
    n=st.integers(0, 200),
    base=st.integers(0, 64),
    seed=st.integers(0, 2**31 - 1),
)
def test_property_one_run_at_any_offset_equals_the_reference(width, n, base, seed):
    values = _values(n, width, seed)
    total = base + n * width
    stream = torch.zeros(bitpack.packed_bytes(total), dtype=torch.uint8)
    bitpack.write_bits(stream, bitpack.pack(values, width), base)
    assert torch.equal(stream, _reference_stream([(values, width, base)], total))
    back = bitpack.unpack_bytes(bitpack.read_bits(stream, base, bitpack.packed_bytes(n * width)), n, width)
    assert torch.equal(back.to(torch.int64), values)


def test_bad_inputs_are_rejected_with_a_clear_error():
    with pytest.raises(ValueError, match="integer or bool"):
        bitpack.pack(torch.ones(3), 8)
    with pytest.raises(ValueError, match="bit width"):
        bitpack.pack(torch.ones(3, dtype=torch.int64), 0)
    with pytest.raises(ValueError, match="at least 2 bytes"):
        bitpack.unpack_bytes(torch.zeros(1, dtype=torch.uint8), 5, 3)
    with pytest.raises(ValueError, match="run past"):
        bitpack.read_bits(torch.zeros(4, dtype=torch.uint8), 9, 4)

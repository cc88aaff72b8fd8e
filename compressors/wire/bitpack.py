"""Bit-packing: unsigned integers of a declared width written back to back into a byte stream, and read back.

The one home of bit-packing (used by the wire format, :mod:`gradstat.compressors.wire.payload`). Everything is
vectorised with torch ops on the tensors' own device (no host round trip): value ``i`` of a run at width ``w``
occupies bits ``[base + i w, base + (i + 1) w)`` of the stream, least significant bit first within a byte and
within a value (little-endian bit order). Writing spreads each value, shifted to its bit offset, over the at most
``ceil((w + 7) / 8)`` bytes it touches and adds them in with ``index_add_``; the bits of different values never
overlap, so adding is OR-ing and the result does not depend on the order of the additions (also on CUDA).
That general form (:func:`pack_into`, :func:`unpack`) is the plain reference.

The fast form (:func:`pack`, :func:`unpack_bytes`) packs one run from bit 0 into its own bytes and a run is then
placed at any bit of a stream by a two-byte shift (:func:`write_bits`, :func:`read_bits`), so no value needs its own
byte offsets:
- widths that are multiples of 8 (8, 16, 24, 32): the low bytes of each value, a view (little-endian hosts);
- widths 1 to 7: the values as bytes, eight of them per 64-bit lane, compacted by halving steps: in step s the two
  ``w 2^(s-1)``-bit fields of each ``2^s``-byte lane are joined by one shift, two masks and an OR (bit-parallel
  over the whole tensor); after the step where a lane holds a whole number of bytes those bytes are the output;
- other widths (9 to 31 not a multiple of 8: bit-packed indices) use the reference form.
Every fast path gives the same bytes as the reference (``tests/compressors/test_bitpack.py``).
"""

from __future__ import annotations

import sys

import torch

MAX_WIDTH = 32
"""Widest run packed directly; wider integers (64-bit seeds, float64) are split into 32-bit words first."""


def _check_width(width: int) -> None:
    if isinstance(width, bool) or not isinstance(width, int) or not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"bit width must be an integer in [1, {MAX_WIDTH}], got {width!r}")


def _span(width: int) -> int:
    """Bytes one value of ``width`` bits can touch when it starts anywhere inside a byte."""
    return (width + 7 + 7) // 8


def packed_bytes(bits: int) -> int:
    """Bytes holding ``bits`` bits (the last one padded with zeros): ``ceil(bits / 8)``."""
    return -(-int(bits) // 8)


def pack_into(out: torch.Tensor, values: torch.Tensor, width: int, base_bit: int) -> None:
    """Add ``values`` (integers in ``[0, 2**width)``, any integer dtype) at ``width`` bits each, starting at bit
    ``base_bit``, into ``out``: an int64 accumulator of at least ``ceil((base_bit + n width) / 8) + 4`` zeroed
    bytes (the tail lets the last value's byte span run past the end; it stays zero)."""
    _check_width(width)
    n = values.numel()
    if n == 0:
        return
    v = values.reshape(-1).to(torch.int64) & ((1 << width) - 1)
    offset = base_bit + torch.arange(n, device=v.device, dtype=torch.int64) * width
    first = offset >> 3
    shifted = v << (offset & 7)  # at most width + 7 <= 39 bits: no overflow in int64
    for j in range(_span(width)):
        out.index_add_(0, first + j, (shifted >> (8 * j)) & 0xFF)


def unpack(stream: torch.Tensor, n: int, width: int, base_bit: int) -> torch.Tensor:
    """The ``n`` values of ``width`` bits starting at bit ``base_bit`` of ``stream`` (uint8, at least
    ``ceil((base_bit + n width) / 8) + 4`` bytes long); int64 in ``[0, 2**width)``."""
    _check_width(width)
    if n == 0:
        return torch.zeros(0, dtype=torch.int64, device=stream.device)
    offset = base_bit + torch.arange(n, device=stream.device, dtype=torch.int64) * width
    first = offset >> 3
    word = torch.zeros(n, dtype=torch.int64, device=stream.device)
    for j in range(_span(width)):
        word |= stream[first + j].to(torch.int64) << (8 * j)
    return (word >> (offset & 7)) & ((1 << width) - 1)


def split_words(values: torch.Tensor) -> torch.Tensor:
    """64-bit integers as pairs of unsigned 32-bit words ``(low, high)``, interleaved: shape ``(2 n,)`` int64."""
    v = values.reshape(-1).to(torch.int64)
    return torch.stack((v & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF), dim=1).reshape(-1)


def join_words(words: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_words`: int64 from interleaved unsigned 32-bit ``(low, high)`` words."""
    pairs = words.reshape(-1, 2)
    return pairs[:, 0] | (pairs[:, 1] << 32)


def sign_extend(values: torch.Tensor, width: int) -> torch.Tensor:
    """Unsigned ``width``-bit integers read as two's-complement signed ones (int64)."""
    top = 1 << (width - 1)
    return (values ^ top) - top


# -- fast form: one run from bit 0, placed at any bit of a stream ----------------------------------------------------
_LITTLE_ENDIAN = sys.byteorder == "little"


def _repeat(pattern: int, lane_bits: int) -> int:
    """``pattern`` repeated in every ``lane_bits``-bit lane of a 64-bit word, as a signed int64 constant."""
    word = 0
    for at in range(0, 64, lane_bits):
        word |= pattern << at
    return word - (1 << 64) if word >= 1 << 63 else word


def _lane_steps(width: int) -> list[tuple[int, int, int]]:
    """(shift, low-field mask, high-field mask) of each halving step for a width in [1, 7]: step s joins the two
    ``width 2^(s-1)``-bit fields of every ``8 2^s``-bit lane; it stops at the first s where a lane holds whole bytes."""
    last = next(s for s in (1, 2, 3) if (width << s) % 8 == 0)
    steps = []
    for s in range(1, last + 1):
        field, lane = width << (s - 1), 8 << s
        low = (1 << field) - 1
        steps.append((lane // 2 - field, _repeat(low, lane), _repeat(low << field, lane)))
    return steps


def _as_bytes(values: torch.Tensor) -> torch.Tensor:
    """Integer or bool values as uint8 (their low byte), a view where the dtype already is one byte."""
    if values.dtype in (torch.bool, torch.int8):
        return values.view(torch.uint8)
    if values.dtype == torch.uint8:
        return values
    return values.to(torch.uint8)  # modular: the low byte


def _check_integer(values: torch.Tensor) -> None:
    if values.dtype.is_floating_point or values.dtype.is_complex:
        raise ValueError(f"bit-packing takes integer or bool values, got {values.dtype} (view floats as integers)")


def pack(values: torch.Tensor, width: int) -> torch.Tensor:
    """``values`` (integers in ``[0, 2**width)``, any integer or bool dtype, any shape) at ``width`` bits each from
    bit 0: a uint8 tensor of :func:`packed_bytes` ``(n width)`` bytes, the last one zero-padded. The same bytes as
    :func:`pack_into` at ``base_bit = 0`` (bits above ``width`` are dropped as there). May share memory with
    ``values`` (a width equal to the dtype's size is a view)."""
    _check_width(width)
    _check_integer(values)
    v = values.reshape(-1)
    n = v.numel()
    if n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=v.device)
    if not _LITTLE_ENDIAN or (width % 8 and width > 8):
        acc = torch.zeros(packed_bytes(n * width) + 8, dtype=torch.int64, device=v.device)
        pack_into(acc, v, width, 0)
        return acc[: packed_bytes(n * width)].to(torch.uint8)
    if width % 8 == 0:
        return _low_bytes(v, width // 8)
    u = _as_bytes(v).contiguous()
    if n % 8 or u.storage_offset() % 8:
        u = torch.cat((u, u.new_zeros(-n % 8)))
    lanes = torch.bitwise_and(u.view(torch.int64), _repeat((1 << width) - 1, 8))
    steps = _lane_steps(width)
    for shift, low, high in steps:
        moved = lanes >> shift
        moved &= high
        lanes &= low
        lanes |= moved
    lane_bytes = 1 << len(steps)
    keep = (width << len(steps)) // 8
    return lanes.view(torch.uint8).view(-1, lane_bytes)[:, :keep].reshape(-1)[: packed_bytes(n * width)]


def _low_bytes(v: torch.Tensor, k: int) -> torch.Tensor:
    """The low ``k`` bytes of each value, little-endian, back to back (a view when ``k`` is the dtype's size)."""
    if v.dtype == torch.bool:
        v = v.view(torch.uint8)
    if v.element_size() < k:
        v = v.to(torch.int64)
    b = v.contiguous().view(torch.uint8)
    size = v.element_size()
    return b if size == k else b.view(-1, size)[:, :k].reshape(-1)


def unpack_bytes(data: torch.Tensor, n: int, width: int) -> torch.Tensor:
    """Inverse of :func:`pack`: the ``n`` values of ``width`` bits from bit 0 of ``data`` (uint8, at least
    ``packed_bytes(n width)`` bytes; bits after the run are ignored). Values as uint8 for widths up to 8, int32
    up to 16, int64 above (the same numbers as :func:`unpack`); may share memory with ``data`` at width 8."""
    _check_width(width)
    need = packed_bytes(n * width)
    if data.dtype != torch.uint8 or data.dim() != 1 or data.numel() < need:
        raise ValueError(
            f"unpack: need a 1-D uint8 tensor of at least {need} bytes, got {tuple(data.shape)} {data.dtype}"
        )
    narrow = torch.uint8 if width <= 8 else torch.int32 if width <= 16 else torch.int64
    if n == 0:
        return torch.zeros(0, dtype=narrow, device=data.device)
    if not _LITTLE_ENDIAN or (width % 8 and width > 8):
        stream = torch.cat((data[:need], data.new_zeros(8)))
        return unpack(stream, n, width, 0).to(narrow)
    if width == 8:
        return data[:n]
    if width % 8 == 0:
        k = width // 8
        words = data.new_zeros(n, 4 if k == 2 else 8)
        words[:, :k] = data[: n * k].view(n, k)
        return words.view(narrow).view(-1)
    steps = _lane_steps(width)
    lane_bytes, keep = 1 << len(steps), (width << len(steps)) // 8
    lanes_n = -(-n // lane_bytes)
    lanes_n += -lanes_n % (8 // lane_bytes)  # whole int64 words
    packed = data.new_zeros(lanes_n * keep)
    packed[:need] = data[:need]
    lanes8 = data.new_zeros(lanes_n, lane_bytes)
    lanes8[:, :keep] = packed.view(lanes_n, keep)
    lanes = lanes8.view(-1).view(torch.int64)
    for shift, low, high in reversed(steps):
        moved = lanes & high
        moved <<= shift
        lanes &= low
        lanes |= moved
    return lanes.view(torch.uint8)[:n]


def write_bits(stream: torch.Tensor, packed: torch.Tensor, base_bit: int) -> None:
    """OR a run packed from bit 0 (:func:`pack`) into the uint8 ``stream`` so that it starts at bit ``base_bit``.
    The stream's bits from ``base_bit`` on must be zero and it must hold the run's bits (the run's own zero
    padding may fall past its end)."""
    start, shift = base_bit >> 3, base_bit & 7
    size = packed.numel()
    if size == 0:
        return
    if shift == 0:
        stream[start : start + size] |= packed
        return
    stream[start : start + size] |= packed << shift
    end = min(start + 1 + size, stream.numel())
    stream[start + 1 : end] |= packed[: end - start - 1] >> (8 - shift)


def read_bits(stream: torch.Tensor, base_bit: int, nbytes: int) -> torch.Tensor:
    """``nbytes`` bytes of the uint8 ``stream`` starting at bit ``base_bit``, shifted to start at bit 0 (the input
    of :func:`unpack_bytes`); a view of the stream when ``base_bit`` is a whole byte."""
    start, shift = base_bit >> 3, base_bit & 7
    if stream.numel() < start + nbytes:
        raise ValueError(f"read_bits: {nbytes} bytes from bit {base_bit} run past the {stream.numel()}-byte stream")
    if shift == 0:
        return stream[start : start + nbytes]
    out = stream[start : start + nbytes] >> shift
    high = stream[start + 1 : start + 1 + nbytes]
    out[: high.numel()] |= high << (8 - shift)
    return out

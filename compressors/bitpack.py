"""Bit-packing: unsigned integers of a declared width written back to back into a byte stream, and read back.

The one home of bit-packing (used by the wire format, :mod:`gradstat.compressors.payload`). Everything is
vectorised with torch ops on the tensors' own device (no host round trip): value ``i`` of a run at width ``w``
occupies bits ``[base + i w, base + (i + 1) w)`` of the stream, least significant bit first within a byte and
within a value (little-endian bit order). Writing spreads each value, shifted to its bit offset, over the at most
``ceil((w + 7) / 8)`` bytes it touches and adds them in with ``index_add_``; the bits of different values never
overlap, so adding is OR-ing and the result does not depend on the order of the additions (also on CUDA).
"""

from __future__ import annotations

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

"""The counter-dither quantize and reconstruct loops in C, for float32 values and int8 codes on a CPU.

:mod:`gradstat.theory.kernels.counter_dither` defines the arithmetic (its eager torch functions are the reference)
and runs it as a ``torch.compile`` kernel. On a CPU that generated loop costs about twice what the arithmetic
needs: it converts and stores the int8 codes 8 at a time through torch's partial vector store, and it loads them
back the same way (measured at 26M, one thread: 36 ms for the quantize loop against 16 ms here). So for the common
case (float32 values, int8 codes: every quantizer with at most 127 levels) the same operations, in the same order
and in float32 without fused multiply-adds, run in a small C loop of gradstat's own (``_native.c``, built at install,
see :mod:`gradstat.theory.kernels.native`): 8 elements per AVX2 step (checked at run time), a scalar loop
otherwise and for each row's last elements. The hash is the one of :mod:`gradstat.theory.kernels.counter_dither`
(the C source repeats its multipliers; a test compares them), so the codes and reconstructions of finite values equal
the reference bit for bit (the quantizers refuse NaN and Inf before this loop; for NaN the C and torch codes differ);
the tests compare them on every quantizer setting. NDQSG's nested worker has its loops here too. Where the extension
is absent or turned off, the compiled kernel or the eager tiles run instead.
"""

from __future__ import annotations

import functools
import math
from types import ModuleType

import torch

from gradstat.theory.kernels import native
from gradstat.theory.kernels.native import cpu_contiguous


def _extension() -> ModuleType:
    ext = native.extension()
    assert ext is not None, "the C loops run only where quantizes, reconstructs or nests said so"
    return ext


def quantizes(x: torch.Tensor, scale: torch.Tensor, codes: torch.dtype) -> bool:
    """Whether :func:`quantize_rows_into` runs: ``codes`` int8, float32 values ``x`` and scales, contiguous on a
    CPU, and the C extension in use (see :mod:`gradstat.theory.kernels.native`)."""
    ok = codes == torch.int8 and cpu_contiguous(x, (torch.float32,)) and cpu_contiguous(scale, (torch.float32,))
    return ok and native.extension() is not None


def reconstructs(codes: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether :func:`reconstruct_rows_into` runs: int8 codes and float32 scales, contiguous on a CPU, and the
    C extension in use."""
    ok = cpu_contiguous(codes, (torch.int8,)) and cpu_contiguous(scale, (torch.float32,))
    return ok and native.extension() is not None


def _words(key: torch.Tensor) -> tuple[int, int]:
    k0, k1 = key.tolist()
    return k0 & 0xFFFFFFFF, k1 & 0xFFFFFFFF


def _rows_pieces(rows: int, size: int) -> list[tuple[int, int, int, int]]:
    """``(row_start, row_stop, col_start, col_stop)`` pieces of a ``(rows, size)`` block, about one per thread
    (:func:`gradstat.theory.kernels.native.pieces`): whole rows, or parts of the one row of a single-row block."""
    if rows == 1:
        return [(0, 1, a, b) for a, b in native.pieces(size)]
    cuts = sorted({0, rows, *(min(rows, round(a / size)) for a, _ in native.pieces(rows * size))})
    return [(r0, r1, 0, size) for r0, r1 in zip(cuts, cuts[1:], strict=False) if r1 > r0]


def _over_rows(name: str, out: torch.Tensor, src: torch.Tensor, scale: torch.Tensor, base: int, key: torch.Tensor,
               params: tuple[float, ...]) -> torch.Tensor:  # fmt: skip
    """The row loop ``name`` of the extension (arguments: source, rows, size, row scales, first index, key words,
    ``params``, destination) over the ``(rows, size)`` block ``src`` into ``out``, split across torch's threads."""
    fn = getattr(_extension(), name)
    rows, size = src.shape
    if out.shape != src.shape or not out.is_contiguous() or scale.numel() < rows:
        raise ValueError(f"{name}: out {tuple(out.shape)} and {scale.numel()} scales for a block of {tuple(src.shape)}")
    k0, k1 = _words(key)
    flat_scale = scale.reshape(-1)

    def piece(r0: int, r1: int, c0: int, c1: int) -> None:
        part, dest = src[r0:r1, c0:c1].detach().numpy(), out[r0:r1, c0:c1].numpy()
        fn(part, r1 - r0, c1 - c0, flat_scale[r0:r1].detach().numpy(), base + r0 * size + c0, k0, k1, *params, dest)

    native.run_all([functools.partial(piece, *p) for p in _rows_pieces(rows, size)])
    return out


def quantize_rows_into(
    out: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, base: int, key: torch.Tensor, gain: float, lo: int,
    hi: int, shift: float,
) -> torch.Tensor:  # fmt: skip
    """:func:`gradstat.theory.kernels.counter_dither.quantize_rows_into` (int8 codes) of the ``(rows, size)`` block
    ``x`` whose first element has index ``base``, ``scale`` of ``rows`` elements (see :func:`quantizes`); split
    across torch's threads on a long block."""
    return _over_rows("quantize_rows", out, x, scale, base, key, (gain, float(lo), float(hi), shift))


def reconstruct_rows_into(
    out: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, base: int, key: torch.Tensor, gain: float,
    offset: float, subtract: bool,
) -> torch.Tensor:  # fmt: skip
    """:func:`gradstat.theory.kernels.counter_dither.reconstruct_rows_into` (float32 values) of the ``(rows,
    size)`` int8 codes whose first element has index ``base`` (see :func:`reconstructs`); split across torch's threads
    on a long block."""
    return _over_rows("reconstruct_rows", out, codes, scale, base, key, (gain, offset, int(subtract)))


def samples(out: torch.Tensor) -> bool:
    """Whether :func:`sample_indices_into` runs: a contiguous int64 CPU output and the C extension in use."""
    return cpu_contiguous(out, (torch.int64,)) and native.extension() is not None


def sample_indices_into(out: torch.Tensor, base: int, key: torch.Tensor, d: int) -> torch.Tensor:
    """:func:`gradstat.theory.kernels.counter_dither.sample_indices_into` of the flat int64 ``out`` whose first
    element has index ``base`` (see :func:`samples`): ``floor((h + 2^31) d / 2^32)`` of each element's hash, in one
    loop (the reference takes some twenty tensor operations: measured on a 2-core CPU, one thread, 90 us for DGC's
    2,600 draws from 260k elements, of its 330 us encode)."""
    k0, k1 = _words(key)
    flat = out.reshape(-1)
    fn = _extension().sample_indices

    def piece(a: int, b: int) -> None:
        fn(flat[a:b].numpy(), base + a, k0, k1, d)

    native.run_all([functools.partial(piece, *p) for p in native.pieces(flat.numel())])
    return out


def hashes_below(d: int, cut: int, key: torch.Tensor, expected: int) -> torch.Tensor:
    """The sort keys ``((h + 2^31) << 31) + i`` (int64, as :func:`gradstat.theory.kernels.counter_dither.k_smallest`
    forms them) of the counters ``i < d`` whose signed hash ``h`` lies below ``cut``, in increasing ``i``: random-k's
    candidates (:func:`~gradstat.theory.kernels.counter_dither.subset` on a CPU) in one loop (8 hashes a step with
    AVX2) where the torch reference takes some twenty operations per element. ``expected``: about how many pass
    (sizes the buffers; a piece that finds more runs again with room for all). Split across torch's threads on a
    long vector. Needs the C extension in use (:func:`gradstat.theory.kernels.native.extension`)."""
    k0, k1 = _words(key)
    fn = _extension().hashes_below

    def piece(a: int, b: int) -> torch.Tensor:
        room = min(b - a, max(64, math.ceil(2 * expected * (b - a) / max(d, 1)) + 64))  # (a piece finds <= b - a)
        out = torch.empty(room, dtype=torch.int64)
        count = fn(out.numpy(), a, b - a, cut, k0, k1)
        if count > room:  # (more passed than room: again, with room for all)
            out = torch.empty(count, dtype=torch.int64)
            fn(out.numpy(), a, b - a, cut, k0, k1)
        return out[:count]

    found = native.run_all([functools.partial(piece, *p) for p in native.pieces(d)])
    return found[0] if len(found) == 1 else torch.cat(found)


def nests(g: torch.Tensor, k: int, delta1: float) -> bool:
    """Whether :func:`nested_rows_into` and :func:`nested_estimate_into` run: float32 values on a CPU, int8 codes
    (k <= 255), the small remainder's range (``1 / delta1 + 1 < 2^22``,
    :data:`gradstat.theory.kernels.nested.SMALL_T`) and the C extension in use."""
    ok = cpu_contiguous(g, (torch.float32,)) and k <= 255 and 1.0 / delta1 + 1.0 < 2.0**22
    return ok and native.extension() is not None


def nested_rows_into(
    out: torch.Tensor, g: torch.Tensor, kappa: float, key: torch.Tensor, alpha: float, delta1: float, k: int
) -> torch.Tensor:
    """:func:`gradstat.theory.kernels.nested.nested_rows_into` of the flat float32 ``g`` (first index 0)
    with the nonzero scale ``kappa``: the int8 nested codes into ``out`` (see :func:`nests`); split across torch's
    threads on a long vector."""
    ext = _extension()
    k0, k1 = _words(key)
    flat, dest = g.reshape(-1), out.reshape(-1)
    if flat.numel() != dest.numel() or not dest.is_contiguous() or dest.dtype != torch.int8:
        raise ValueError(f"nested encode: {flat.numel()} values into {dest.numel()} {dest.dtype} codes")
    h = float((k - 1) // 2)

    def piece(a: int, b: int) -> None:
        ext.nested_rows(flat[a:b].detach().numpy(), kappa, a, k0, k1, alpha, delta1, float(k), h, dest[a:b].numpy())

    native.run_all([functools.partial(piece, *p) for p in native.pieces(flat.numel())])
    return out


def nested_estimate_into(
    out: torch.Tensor, s: torch.Tensor, side: torch.Tensor, kappa: float, key: torch.Tensor, alpha: float,
    delta1: float, k: int,
) -> torch.Tensor:  # fmt: skip
    """:func:`gradstat.theory.kernels.nested.nested_reconstruct_rows_in_place` of the flat int8 codes
    ``s`` with the float32 side information (first index 0, scale ``kappa``, possibly 0), into the float32 ``out``;
    split across torch's threads on a long vector."""
    ext = _extension()
    k0, k1 = _words(key)
    step = alpha * delta1  # (a Python product, rounded to float32 once, as the torch form's scalar)
    codes, y, dest = s.reshape(-1), side.reshape(-1), out.reshape(-1)
    if not codes.numel() == y.numel() == dest.numel() or not dest.is_contiguous():
        raise ValueError(f"nested estimate: {codes.numel()} codes, {y.numel()} side values, {dest.numel()} outputs")

    def piece(a: int, b: int) -> None:
        ext.nested_estimate(codes[a:b].numpy(), y[a:b].detach().numpy(), kappa, a, k0, k1, alpha, alpha != 1.0, delta1,
                            float(k), step, dest[a:b].numpy())  # fmt: skip

    native.run_all([functools.partial(piece, *p) for p in native.pieces(codes.numel())])
    return out

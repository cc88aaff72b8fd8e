"""The counter-dither rows' Triton form: one kernel, compiled for CUDA tensors and interpreted for CPU ones.

The quantizers' hot loops (:mod:`gradstat.theory.kernels.counter_dither`: quantize, reconstruct, random signs) run
eagerly on CUDA: their ``torch.compile`` builds gave other codes than the eager reference there (codes saturated at
the levels; :data:`gradstat.theory.kernels.counter_dither.COMPILES_ON`), and eagerly each of the hash's twenty
integer operations is a kernel that reads and writes the whole vector. :func:`run` computes each of them in one
pass (read the block, write the result), written by hand so that every operation is the reference's:

- the hash on int32 words exactly as the reference writes it: wrapping products by the constant multipliers
  (the caller passes :data:`~gradstat.theory.kernels.counter_dither.MULTIPLIERS`), logical shifts as arithmetic shifts
  plus masks, the dither ``(h >> 8) 2^-24`` from an arithmetic shift;
- float32 arithmetic in the reference's order, with IEEE division (``tl.div_rn``: Triton's ``/`` may be an
  approximate division on a GPU) and the compiled build's contraction of products and sums into fused multiply-adds
  switched off (:data:`~gradstat.theory.kernels.triton_runtime.COMPILE_OPTIONS`: ``x / s * gain + u`` rounded once
  would move a code across a floor); the reference divides by a tensor (:func:`~gradstat.theory.kernels.
  counter_dither.divided`), which torch's CUDA kernels also divide exactly;

so that it equals the reference bit for bit (the battery in ``tests/kernels`` holds the interpreted form to it on a
CPU and the compiled one on a GPU; ``tests/kernels/test_triton_dither.py`` also builds the CUDA form on a machine
without a GPU and reads its machine code for those two properties).

One program handles :data:`BLOCK` consecutive elements of the flattened ``(rows, size)`` block; element ``i`` has
counter ``base + i`` and row ``i // size``, whose factor (a scale or divisor of shape ``(rows, 1)``, any row stride,
0 for a broadcast one) it reads.
"""

from __future__ import annotations

from typing import Any

import torch

from gradstat.theory.kernels import triton_runtime

tl: Any = None
"""``triton.language``, bound by :func:`gradstat.theory.kernels.triton_runtime.build`."""

BLOCK = 1024
"""Elements per program on CUDA."""

QUANTIZE, RECONSTRUCT, SIGN = 0, 1, 2
"""The kernel's modes (compile-time constants: each builds its own code)."""

MODES = {
    "quantize_rows_into": QUANTIZE,
    "reconstruct_rows_into": RECONSTRUCT,
    "reconstruct_rows_in_place": RECONSTRUCT,
    "signed_rows_into": SIGN,
}
"""The counter-dither kernels (by function name) this form computes, and their mode."""

CODE_DTYPES = (torch.int8, torch.int16, torch.int32, torch.float32)
"""The dtypes of codes this form reads and writes (quantize writes them, reconstruct reads them)."""


def _rows(  # type: ignore[no-untyped-def]
    out_ptr, x_ptr, f_ptr, f_stride, base_ptr, key_ptr, n, size, gain, lo, hi, shift, offset,
    MODE: tl.constexpr, FLAG: tl.constexpr, M0: tl.constexpr, M1: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One block of a counter-dither row kernel (finite inputs: where the reference's code would come from a NaN,
    this one is ``lo``; the quantizers refuse non-finite gradients and scales before they quantize).
    QUANTIZE: ``clamp(floor(x / f gain + u + shift), lo, hi)``;
    RECONSTRUCT: ``(x + offset - u) / gain f`` (``- u`` where FLAG); SIGN: ``r x`` (divided by f where FLAG)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # int32: a call indexes fewer than 2^31 elements
    inside = offsets < n
    f = tl.load(f_ptr + (offsets // size) * f_stride, mask=inside, other=1.0)
    x = tl.load(x_ptr + offsets, mask=inside, other=0).to(tl.float32)
    h = (tl.load(base_ptr) + offsets) ^ tl.load(key_ptr)  # counter_dither.counter_bits, on int32 words
    h = h * M0
    h = h ^ ((h >> 15) & 0x1FFFF)
    h = h * M1
    h = h ^ ((h >> 16) & 0xFFFF)
    h = h ^ tl.load(key_ptr + 1)
    h = h * M0
    h = h ^ ((h >> 15) & 0x1FFFF)
    h = h * M1
    u = (h >> 8).to(tl.float32) * 5.9604644775390625e-08  # 2^-24: the dither in [-1/2, 1/2)
    if MODE == 0:
        v = tl.minimum(tl.maximum(tl.div_rn(x, f) * gain + u + shift, lo), hi)  # clamp, then floor: the same
        t = v.to(tl.int32)  # (lo, hi integers); floor as truncation stepped down below a negative v, since tl.floor
        v = (t - (t.to(tl.float32) > v).to(tl.int32)).to(tl.float32)  # flushes subnormals (floor(-1e-40) = 0)
    elif MODE == 1:
        v = x + offset
        if FLAG:
            v = v - u
        v = tl.div_rn(v, gain) * f
    else:
        # r x with r = -1 where the hash is negative: its sign bit flipped (the reference's negation, -0.0 and NaN
        # included; Triton's own ``-x`` was ``0 - x``, which keeps +0.0, before version 3.9)
        v = (x.to(tl.int32, bitcast=True) ^ (h & -2147483648)).to(tl.float32, bitcast=True)
        if FLAG:
            v = tl.div_rn(v, f)
    tl.store(out_ptr + offsets, v.to(out_ptr.dtype.element_ty), mask=inside)


def kernel(interpret: bool) -> Any:
    """The kernel, interpreted (for CPU tensors) or for compilation on CUDA. Raises ImportError without Triton."""
    return triton_runtime.build(_rows, interpret)


def applies(name: str, out: torch.Tensor, blocks: tuple[torch.Tensor, ...], row_factor: torch.Tensor) -> bool:
    """Whether this form computes the counter-dither kernel ``name`` for these tensors: Triton installed, the
    tensors on one CUDA device (compiled) or the CPU (interpreted), ``out`` and the blocks contiguous, float32
    values and codes of :data:`CODE_DTYPES`, ``row_factor`` float32 of shape ``(rows, 1)``."""
    if name not in MODES or out.device.type not in ("cuda", "cpu") or not triton_runtime.available():
        return False
    tensors = (out, *blocks)
    if any(t.device != out.device or not t.is_contiguous() or t.dtype not in CODE_DTYPES for t in tensors):
        return False
    values = blocks[0] if MODES[name] != RECONSTRUCT else out
    return (
        values.dtype == torch.float32
        and row_factor.dtype == torch.float32
        and row_factor.device == out.device
        and row_factor.dim() == 2
        and row_factor.shape[1] == 1
        and out.dim() == 2
        and row_factor.shape[0] == out.shape[0]
    )


def run(name: str, multipliers: tuple[int, int], out: torch.Tensor, blocks: tuple[torch.Tensor, ...],
        row_factor: torch.Tensor, base: torch.Tensor, key: torch.Tensor, *rest: Any) -> torch.Tensor:  # fmt: skip
    """The counter-dither kernel ``name`` (:data:`MODES`) with the hash's ``multipliers`` and its reference's
    arguments (``blocks``: its input blocks, empty where it reads ``out``; ``rest``: its constants), in one pass;
    where :func:`applies`."""
    mode = MODES[name]
    n = out.numel()
    if n == 0:
        return out
    source = blocks[0] if blocks else out
    gain, lo, hi, shift, offset, flag = 1.0, 0.0, 0.0, 0.0, 0.0, False
    if mode == QUANTIZE:
        gain, lo, hi, shift = float(rest[0]), float(rest[1]), float(rest[2]), float(rest[3])
    elif mode == RECONSTRUCT:
        gain, offset, flag = float(rest[0]), float(rest[1]), bool(rest[2])
    else:
        flag = bool(rest[0])
    block = triton_runtime.block_for(out, BLOCK)
    grid = (-(-n // block),)
    context, options = triton_runtime.launch(out)
    with context:
        kernel(interpret=out.device.type == "cpu")[grid](
            out, source, row_factor, row_factor.stride(0), base, key, n, out.shape[1], gain, lo, hi, shift, offset,
            MODE=mode, FLAG=flag, M0=multipliers[0], M1=multipliers[1], BLOCK=block, **options,
        )  # fmt: skip
    return out

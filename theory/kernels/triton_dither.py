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

import math
from typing import Any

import numpy as np
import torch

from gradstat.theory.kernels import triton_runtime

tl: Any = None
"""``triton.language``, bound by :func:`gradstat.theory.kernels.triton_runtime.build`."""

BLOCK = 1024
"""Elements per program on CUDA."""

QUANTIZE, RECONSTRUCT, SIGN, NESTED, ESTIMATE, HASH_KEY, SAMPLE = 0, 1, 2, 3, 4, 5, 6
"""The kernel's modes (compile-time constants: each builds its own code)."""

MODES = {
    "quantize_rows_into": QUANTIZE,
    "reconstruct_rows_into": RECONSTRUCT,
    "reconstruct_rows_in_place": RECONSTRUCT,
    "signed_rows_into": SIGN,
    "nested_rows_into": NESTED,
    "nested_reconstruct_rows_in_place": ESTIMATE,
    "hash_keys_into": HASH_KEY,
    "sample_indices_into": SAMPLE,
}
"""The counter-dither kernels (by function name) this form computes, and their mode: those of
:mod:`gradstat.theory.kernels.counter_dither` and NDQSG's nested encode and estimate
(:mod:`gradstat.theory.kernels.nested`)."""

SMALL_T = 2.0**22
"""The nested encode runs here only where ``1 / delta1 + 1`` lies below this bound: the range where the reference
takes its remainder modulo k by conditional additions (:data:`gradstat.theory.kernels.nested.SMALL_T`)."""

CODE_DTYPES = (torch.int8, torch.int16, torch.int32, torch.float32)
"""The dtypes of codes this form reads and writes (quantize writes them, reconstruct reads them)."""


def _rows(  # type: ignore[no-untyped-def]
    out_ptr, x_ptr, f_ptr, f_stride, base_ptr, key_ptr, n, size, modulus, gain, lo, hi, shift, offset, alpha, delta1,
    levels, half, step, inv_delta1, inv_levels, MODE: tl.constexpr, FLAG: tl.constexpr, HOST_DIVISION: tl.constexpr,
    M0: tl.constexpr, M1: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """One block of a counter-dither row kernel (finite inputs: the quantizers refuse non-finite gradients and scales
    before they quantize; a NaN passes the clamp, as in the reference, and its code is what the conversion to an
    integer makes of it).
    QUANTIZE: ``clamp(floor(x / f gain + u + shift), lo, hi)``;
    RECONSTRUCT: ``(x + offset - u) / gain f`` (``- u`` where FLAG); SIGN: ``r x`` (divided by f where FLAG);
    HASH_KEY: ``2^31 - h`` of the hash h in float32 (x and f unread); SAMPLE: ``floor((h + 2^31) modulus / 2^32)``
    (int64; x and f unread);
    NESTED: NDQSG's nested index of ``x / f`` (eq. (6)); ESTIMATE: its decode of the codes held in ``out`` with the
    side information ``x`` and the scale ``f`` (eq. (7); ``y alpha`` where FLAG), both with the dither ``u delta1``
    and ``levels`` = k, ``half`` = (k - 1) // 2, ``step`` = alpha delta1. Their divisions by delta1 and k are what
    the reference's ``t / delta1`` is on the device it runs on (:func:`host_division`): IEEE divisions where
    HOST_DIVISION (a CPU), else products by ``inv_delta1`` and ``inv_levels``, their float32 reciprocals (CUDA)."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # int32: a call indexes fewer than 2^31 elements
    inside = offsets < n
    if MODE < 5:
        f = tl.load(f_ptr + (offsets // size) * f_stride, mask=inside, other=1.0)
        x = tl.load(x_ptr + offsets, mask=inside, other=0).to(tl.float32)
    else:  # (the hash keys and the sample read nothing but their counters)
        f, x = 1.0, 0.0
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
        # (a NaN kept, as by the reference and the interpreter: compiled, max.f32 and min.f32 would drop it)
        v = tl.maximum(tl.div_rn(x, f) * gain + u + shift, lo, propagate_nan=tl.PropagateNan.ALL)
        v = tl.minimum(v, hi, propagate_nan=tl.PropagateNan.ALL)  # clamp, then floor: the same
        t = v.to(tl.int32)  # (lo, hi integers); floor as truncation stepped down below a negative v, since tl.floor
        v = (t - (t.to(tl.float32) > v).to(tl.int32)).to(tl.float32)  # flushes subnormals (floor(-1e-40) = 0)
    elif MODE == 1:
        v = x + offset
        if FLAG:
            v = v - u
        v = tl.div_rn(v, gain) * f
    elif MODE == 3:  # nested.nested_rows_into: t = (x / f alpha + u delta1) / delta1, round(t) - k round(t / k)
        t = x
        if HOST_DIVISION:
            t = tl.div_rn(tl.div_rn(x, f) * alpha + u * delta1, delta1)
            q = tl.div_rn(t, levels)
        else:
            t = (tl.div_rn(x, f) * alpha + u * delta1) * inv_delta1
            q = t * inv_levels
        a, b = t + 0.5, q + 0.5  # floor(a), floor(b) as below (ESTIMATE)
        small_a, small_b = tl.abs(a) < 8388608.0, tl.abs(b) < 8388608.0
        ia, ib = tl.where(small_a, a, 0.0).to(tl.int32), tl.where(small_b, b, 0.0).to(tl.int32)
        fa = tl.where(small_a, (ia - (ia.to(tl.float32) > a).to(tl.int32)).to(tl.float32), a)
        fb = tl.where(small_b, (ib - (ib.to(tl.float32) > b).to(tl.int32)).to(tl.float32), b)
        v = fa - fb * levels + half
        v = tl.where(v < 0, v + levels, v)  # nested._small_remainder: two conditional additions, two subtractions
        v = tl.where(v < 0, v + levels, v)
        v = tl.where(v >= levels, v - levels, v)
        v = tl.where(v >= levels, v - levels, v)
        v = v - half
    elif MODE == 4:  # nested.nested_reconstruct_rows_in_place: r = (s delta1 - u delta1 - alpha y) / delta1
        s = tl.load(out_ptr + offsets, mask=inside, other=0.0)
        y = tl.div_rn(x, tl.where(f > 0, f, 1.0))
        side = y
        if FLAG:
            side = y * alpha
        r = s
        if HOST_DIVISION:
            r = tl.div_rn(s * delta1 - u * delta1 - side, delta1)
            q = tl.div_rn(r, levels)
        else:
            r = (s * delta1 - u * delta1 - side) * inv_delta1
            q = r * inv_levels
        # floor(b): a truncation stepped down below a negative b, for |b| < 2^23 (every float32 beyond is an integer;
        # NaN passes through); tl.floor compiles to cvt.rmi.ftz, which flushes subnormals (b is never -0.0: a sum)
        b = q + 0.5
        small = tl.abs(b) < 8388608.0
        ib = tl.where(small, b, 0.0).to(tl.int32)
        fb = tl.where(small, (ib - (ib.to(tl.float32) > b).to(tl.int32)).to(tl.float32), b)
        v = ((r - fb * levels) * step + y) * f
    elif MODE == 5:  # counter_dither.hash_keys_into: 2^31 - h in float32, falling as the hash rises
        v = 2147483648.0 - h.to(tl.float32)
    elif MODE == 6:  # counter_dither.sample_indices_into: (h + 2^31) in [0, 2^32) times modulus < 2^31, in int64
        v = ((h.to(tl.int64) + 2147483648) * modulus) >> 32
    else:
        # r x with r = -1 where the hash is negative: its sign bit flipped (the reference's negation, -0.0 and NaN
        # included; Triton's own ``-x`` was ``0 - x``, which keeps +0.0, before version 3.9)
        v = (x.to(tl.int32, bitcast=True) ^ (h & -2147483648)).to(tl.float32, bitcast=True)
        if FLAG:
            v = tl.div_rn(v, f)
    tl.store(out_ptr + offsets, v.to(out_ptr.dtype.element_ty), mask=inside)


def host_division(device: torch.device) -> bool:
    """Whether torch divides a float32 tensor by a host number (``t / 0.2``) as an IEEE division on ``device`` (a
    CPU), or multiplies it by the number's float32 reciprocal, itself rounded in float32 (CUDA: ATen's
    ``div_true_kernel_cuda`` with a CPU scalar). The nested modes follow their reference's device."""
    return device.type == "cpu"


def reciprocal32(value: float) -> float:
    """``1 / value`` as torch's CUDA division by a host number forms it: ``value`` rounded to float32, then one
    float32 division."""
    v = np.float32(value)
    return float(np.float32(1.0) / v) if v != 0 else math.inf


def kernel(interpret: bool) -> Any:
    """The kernel, interpreted (for CPU tensors) or for compilation on CUDA. Raises ImportError without Triton."""
    return triton_runtime.build(_rows, interpret)


def applies(
    name: str, out: torch.Tensor, blocks: tuple[torch.Tensor, ...], row_factor: torch.Tensor, rest: tuple[Any, ...] = ()
) -> bool:
    """Whether this form computes the counter-dither kernel ``name`` for these tensors and constants ``rest``:
    Triton installed, the tensors on one CUDA device (compiled) or the CPU (interpreted), ``out`` and the blocks
    contiguous, float32 values and codes of :data:`CODE_DTYPES`, ``row_factor`` float32 of shape ``(rows, 1)``; the
    nested encode within :data:`SMALL_T`."""
    if name not in MODES or out.device.type not in ("cuda", "cpu") or not triton_runtime.available():
        return False
    if MODES[name] == SAMPLE:
        return not blocks and out.dtype == torch.int64 and out.dim() == 2 and out.is_contiguous()
    tensors = (out, *blocks)
    if any(t.device != out.device or not t.is_contiguous() or t.dtype not in CODE_DTYPES for t in tensors):
        return False
    mode = MODES[name]
    if mode == HASH_KEY:
        return out.dtype == torch.float32 and out.dim() == 2 and out.is_contiguous()
    if mode == NESTED and not (len(rest) == 3 and 1.0 / float(rest[1]) + 1.0 < SMALL_T):
        return False
    if mode == ESTIMATE and (out.dtype != torch.float32 or not blocks or blocks[0].dtype != torch.float32):
        return False
    values = blocks[0] if mode not in (RECONSTRUCT, ESTIMATE) else out
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
    gain, lo, hi, shift, offset, flag, modulus = 1.0, 0.0, 0.0, 0.0, 0.0, False, 1
    alpha, delta1, levels, half = 1.0, 1.0, 1.0, 0.0
    if mode == QUANTIZE:
        gain, lo, hi, shift = float(rest[0]), float(rest[1]), float(rest[2]), float(rest[3])
    elif mode == RECONSTRUCT:
        gain, offset, flag = float(rest[0]), float(rest[1]), bool(rest[2])
    elif mode == HASH_KEY:
        pass
    elif mode == SAMPLE:
        modulus = int(rest[0])
    elif mode in (NESTED, ESTIMATE):  # (alpha, delta1, k): each a float32 operand, as the reference's host numbers
        alpha, delta1, k = float(rest[0]), float(rest[1]), int(rest[2])
        levels, half, flag = float(k), float((k - 1) // 2), mode == ESTIMATE and alpha != 1.0
    else:
        flag = bool(rest[0])
    inv_delta1, inv_levels = reciprocal32(delta1), reciprocal32(levels)
    block = triton_runtime.block_for(out, BLOCK)
    grid = (-(-n // block),)
    context, options = triton_runtime.launch(out)
    with context:
        kernel(interpret=out.device.type == "cpu")[grid](
            out, source, row_factor, row_factor.stride(0), base, key, n, out.shape[1], modulus, gain, lo, hi, shift,
            offset, alpha, delta1, levels, half, alpha * delta1, inv_delta1, inv_levels, MODE=mode, FLAG=flag,
            HOST_DIVISION=host_division(out.device), M0=multipliers[0], M1=multipliers[1], BLOCK=block, **options,
        )  # fmt: skip
    return out

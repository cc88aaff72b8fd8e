"""Threshold compaction on a CPU: the increasing indices of ``v_i >= t`` (``v = |x|`` or ``x``) in one read.

Every threshold sparsifier ends in this step, and no torch or numpy operation does it in one pass: a comparison
writes a full mask, and ``nonzero`` reads it again and counts before it writes (numpy's chunked form of
:func:`gradstat.compressors.kernels.primitives.select_at_least` costs ~4 read passes at 26M, of which the absolute
value, the comparison and the search each take about one). Compaction cannot be written as a ``torch.compile`` kernel
either (its output length depends on the data). So this module holds one small C loop of its own
(:mod:`gradstat.compressors.kernels.native` builds it with the machine's C compiler at first use and caches it):

- 16 elements per step: two AVX2 comparisons give a 16-bit mask, and only its set bits are visited (at the
  densities sparsifiers use, most steps find none), with the largest magnitude and a NaN flag kept on the way, so
  that the same read is also the vector's finiteness check;
- a portable scalar loop where AVX2 is missing (checked at run time) and for float64 vectors.

The output grows by doubling: a call stops before a step could overflow its buffers and is resumed with larger
ones. Where the library cannot be had (no compiler, a failed build, ``GRADSTAT_COMPILE=never``), :func:`available`
is false and callers keep their numpy path; the tests hold both to the same plain reference.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections.abc import Callable

import numpy as np
import torch

from gradstat.compressors.kernels import native
from gradstat.compressors.kernels.scratch import scratch

SOURCE = r"""
#include <math.h>
#include <stdint.h>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GS_AVX2 1
#endif

#define GS_SCALAR(T, ABS)                                                                       \
    for (; i < end && c < cap; i++) {                                                           \
        T v = absolute ? ABS(x[i]) : x[i];                                                      \
        if (v != v) {                                                                           \
            *nan = 1;                                                                           \
        } else if ((double)v > *top) {                                                          \
            *top = (double)v;                                                                   \
        }                                                                                       \
        if (v >= t) {                                                                           \
            idx[c] = i;                                                                         \
            if (vals) vals[c] = v;                                                              \
            c++;                                                                                \
        }                                                                                       \
    }

#ifdef GS_AVX2
__attribute__((target("avx2")))
static int64_t f32_avx2(const float* x, int64_t i, int64_t end, float t, int32_t absolute, int64_t* idx,
                        float* vals, int64_t cap, int64_t* count, double* top, int32_t* nan) {
    const __m256 vt = _mm256_set1_ps(t);
    const __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32(absolute ? 0x7fffffff : -1));
    __m256 hi = _mm256_set1_ps(-INFINITY);
    __m256 bad = _mm256_setzero_ps();
    int64_t c = *count;
    for (; i + 16 <= end && c + 16 <= cap; i += 16) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), keep);
        __m256 b = _mm256_and_ps(_mm256_loadu_ps(x + i + 8), keep);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
        hi = _mm256_max_ps(hi, _mm256_max_ps(a, b));
        unsigned m = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, vt, _CMP_GE_OQ)) |
                     ((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(b, vt, _CMP_GE_OQ)) << 8);
        while (m) {
            int j = __builtin_ctz(m);
            idx[c] = i + j;
            if (vals) vals[c] = absolute ? fabsf(x[i + j]) : x[i + j];
            c++;
            m &= m - 1;
        }
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, hi);
    for (int j = 0; j < 8; j++) {
        if ((double)lanes[j] > *top) *top = (double)lanes[j];
    }
    if (_mm256_movemask_ps(bad)) *nan = 1;
    *count = c;
    return i;
}
#endif

int64_t gs_select_f32(const float* x, int64_t i, int64_t end, float t, int32_t absolute, int64_t* idx,
                      float* vals, int64_t cap, int64_t* count, double* top, int32_t* nan) {
#ifdef GS_AVX2
    if (__builtin_cpu_supports("avx2")) {
        i = f32_avx2(x, i, end, t, absolute, idx, vals, cap, count, top, nan);
        if (i + 16 <= end) return i; /* stopped for room: the caller grows the buffers */
    }
#endif
    int64_t c = *count;
    GS_SCALAR(float, fabsf)
    *count = c;
    return i;
}

int64_t gs_select_f64(const double* x, int64_t i, int64_t end, double t, int32_t absolute, int64_t* idx,
                      double* vals, int64_t cap, int64_t* count, double* top, int32_t* nan) {
    int64_t c = *count;
    GS_SCALAR(double, fabs)
    *count = c;
    return i;
}
"""

_FUNCTIONS = {torch.float32: "gs_select_f32", torch.float64: "gs_select_f64"}
_P = ctypes.c_void_p
_SIGNATURES: dict[str, native.Signature] = {
    name: (
        ctypes.c_int64,
        [_P, ctypes.c_int64, ctypes.c_int64, scalar, ctypes.c_int32, _P, _P, ctypes.c_int64, _P, _P, _P],
    )
    for name, scalar in (("gs_select_f32", ctypes.c_float), ("gs_select_f64", ctypes.c_double))
}


def _library() -> ctypes.CDLL | None:
    return native.library("compaction", SOURCE, _SIGNATURES)


def available(x: torch.Tensor) -> bool:
    """Whether :func:`select` runs on ``x``: a contiguous float32 or float64 CPU tensor, a compile policy other
    than ``never``, and a library built here."""
    if x.device.type != "cpu" or x.dtype not in _FUNCTIONS or not x.is_contiguous():
        return False
    return _library() is not None


def _scan(
    fn: Callable[..., int],
    data: np.ndarray,
    piece: str,
    begin: int,
    end: int,
    bound: float,
    absolute: bool,
    gather: bool,
    want: int,
) -> tuple[np.ndarray, np.ndarray | None, float, bool]:
    """The piece ``[begin, end)`` of a selection, in this thread's buffers for the slot ``piece`` (the calling
    thread and the piece's number: a pool thread may run two pieces of one call, or pieces of two callers' calls
    before either has joined its results): the selected indices (absolute), their values with ``gather``, the
    piece's largest value and whether it holds a NaN."""

    cpu, values = torch.device("cpu"), torch.from_numpy(data[:0]).dtype
    count, top, nan = ctypes.c_int64(0), ctypes.c_double(-np.inf), ctypes.c_int32(0)
    at = begin
    while True:
        k = count.value
        # this thread's warm buffers (fresh ones of a few MB cost more in page faults than the whole selection)
        idx = scratch(want, torch.int64, cpu, f"compaction indices {piece}", keep=k).numpy()
        vals = scratch(want, values, cpu, f"compaction values {piece}", keep=k).numpy() if gather else None
        cap = want
        refs = (ctypes.byref(count), ctypes.byref(top), ctypes.byref(nan))
        vp = None if vals is None else vals.ctypes.data
        at = fn(data.ctypes.data, at, end, bound, int(absolute), idx.ctypes.data, vp, cap, *refs)
        if at >= end:
            break
        want = min(end - begin, 2 * cap)  # more selected than room: grow, keep what was found, resume
    k = count.value
    return idx[:k], None if vals is None else vals[:k], top.value, bool(nan.value)


def _output(found: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
    """The pieces' ``found`` arrays joined in a tensor of their own, from torch's allocator (which can back it with
    huge pages: with 4 KB pages the copy's page faults cost more than the selection's read at a density of 1 %)."""
    out = torch.empty(sum(f.size for f in found), dtype=dtype)
    np.concatenate(found, out=out.numpy())
    return out


def select(
    x: torch.Tensor, t: float, absolute: bool, gather: bool = False, expected: int | None = None
) -> tuple[torch.Tensor, torch.Tensor | None, float]:
    """``(indices, values, top)`` of the flat ``x`` (see :func:`available`): the increasing int64 indices of the
    elements with ``v >= t`` (``v = |x|`` when ``absolute``, else ``x``; NaN never selected), their ``v`` with
    ``gather`` (else None), and the largest ``v`` of the whole vector (NaN if any element is NaN; -inf if empty).
    ``t`` is compared in ``x``'s dtype. ``expected``: the count the caller expects (sizes the first buffers). A
    long vector is read in pieces on torch's threads (:func:`gradstat.compressors.kernels.native.pieces`), each into its
    thread's buffers, joined in order."""
    flat = x.reshape(-1)
    n = flat.numel()
    lib = _library()
    assert lib is not None, "select() needs available(x)"
    fn = getattr(lib, _FUNCTIONS[flat.dtype])
    data = flat.detach().numpy()
    with np.errstate(over="ignore"):  # (a threshold beyond the dtype's range compares as infinity, as in torch)
        bound = float(data.dtype.type(t))  # the threshold in x's dtype: the comparisons are exact
    parts = native.pieces(n)
    caller = threading.get_ident()
    want = max(4096, (2 * expected if expected is not None else n // 64) // len(parts))
    found = native.run_all(
        [
            functools.partial(_scan, fn, data, f"{caller} {i}", a, b, bound, absolute, gather, min(b - a, want))
            for i, (a, b) in enumerate(parts)
        ]
    )
    indices = _output([f[0] for f in found], torch.int64)
    values = _output([f[1] for f in found if f[1] is not None], flat.dtype) if gather else None
    top = max((f[2] for f in found), default=-math.inf)
    return indices, values, math.nan if any(f[3] for f in found) else top

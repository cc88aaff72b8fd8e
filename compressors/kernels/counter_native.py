"""The counter-dither quantize and reconstruct loops in C, for float32 values and int8 codes on a CPU.

:mod:`gradstat.compressors.kernels.counter_dither` defines the arithmetic (its eager torch functions are the reference)
and runs it as a ``torch.compile`` kernel. On a CPU that generated loop costs about twice what the arithmetic
needs: it converts and stores the int8 codes 8 at a time through torch's partial vector store, and it loads them
back the same way (measured at 26M, one thread: 36 ms for the quantize loop against 16 ms here). So for the common
case (float32 values, int8 codes: every quantizer with at most 127 levels) the same operations, in the same order
and in float32 without fused multiply-adds, run in a small C loop of gradstat's own, built by
:mod:`gradstat.compressors.kernels.native`: 8 elements per AVX2 step (checked at run time), a scalar loop otherwise and
for each row's last elements. The hash is the one of :mod:`gradstat.compressors.kernels.counter_dither` (its
multipliers are written into the source from there), so the codes and reconstructions of finite values equal the
reference bit for bit (the quantizers refuse NaN and Inf before this loop; for NaN the C and torch codes differ); the
tests compare them on every quantizer setting. NDQSG's nested worker has its loops here too. Where the library cannot be
built, the compiled kernel or the eager tiles run instead.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from gradstat.compressors.kernels import native
from gradstat.compressors.kernels.counter_dither import MULTIPLIERS
from gradstat.compressors.kernels.primitives import cpu_contiguous

SOURCE = r"""
#include <math.h>
#include <stdint.h>

#define M0 MULTIPLIER0
#define M1 MULTIPLIER1
#define ULP24 5.9604644775390625e-08f /* 2^-24 */

/* the hash of counter_dither.counter_bits: round(fold(round(i ^ k0)) ^ k1), read as a signed number */
static inline uint32_t gs_round(uint32_t x) {
    x *= M0;
    x ^= x >> 15;
    return x * M1;
}

static inline float gs_dither(uint32_t i, uint32_t k0, uint32_t k1) {
    uint32_t h = gs_round(i ^ k0);
    h = gs_round((h ^ (h >> 16)) ^ k1);
    return (float)(((int32_t)h) >> 8) * ULP24;
}

static void quantize_scalar(const float* x, int64_t n, float s, uint32_t first, uint32_t k0, uint32_t k1,
                            float gain, float lo, float hi, float shift, int8_t* out) {
    for (int64_t c = 0; c < n; c++) {
        float u = gs_dither(first + (uint32_t)c, k0, k1);
        float y = x[c] / s * gain;
        float q = floorf(y + u + shift);
        q = q < lo ? lo : q;
        q = q > hi ? hi : q;
        out[c] = (int8_t)q;
    }
}

static void reconstruct_scalar(const int8_t* codes, int64_t n, float s, uint32_t first, uint32_t k0, uint32_t k1,
                               float gain, float offset, int32_t subtract, float* out) {
    for (int64_t c = 0; c < n; c++) {
        float v = (float)codes[c] + offset;
        if (subtract) v = v - gs_dither(first + (uint32_t)c, k0, k1);
        out[c] = v / gain * s;
    }
}

/* NDQSG's nested worker (ndqsg.nested_index and nested_estimate; the small remainder: two conditional additions
   and two conditional subtractions of k) */
static void nested_scalar(const float* g, int64_t n, float kappa, uint32_t first, uint32_t k0, uint32_t k1,
                          float alpha, float delta1, float k, float h, int8_t* out) {
    for (int64_t c = 0; c < n; c++) {
        float u = gs_dither(first + (uint32_t)c, k0, k1) * delta1;
        float t = (g[c] / kappa * alpha + u) / delta1;
        float coarse = floorf(t / k + 0.5f) * k;
        float v = floorf(t + 0.5f) - coarse + h;
        v = v < 0 ? v + k : v;
        v = v < 0 ? v + k : v;
        v = v >= k ? v - k : v;
        v = v >= k ? v - k : v;
        out[c] = (int8_t)(v - h);
    }
}

static void nested_estimate_scalar(const int8_t* s, const float* side, int64_t n, float kappa, uint32_t first,
                                   uint32_t k0, uint32_t k1, float alpha, int32_t shrink, float delta1, float k,
                                   float step, float* out) {
    float safe = kappa > 0 ? kappa : 1.0f;
    for (int64_t c = 0; c < n; c++) {
        float u = gs_dither(first + (uint32_t)c, k0, k1) * delta1;
        float y = side[c] / safe;
        float r = ((float)s[c] * delta1 - u - (shrink ? y * alpha : y)) / delta1;
        float coarse = floorf(r / k + 0.5f) * k;
        out[c] = ((r - coarse) * step + y) * kappa;
    }
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GS_AVX2 1

__attribute__((target("avx2"))) static inline __m256 gs_dither8(__m256i i, __m256i k0, __m256i k1) {
    const __m256i m0 = _mm256_set1_epi32((int32_t)M0), m1 = _mm256_set1_epi32((int32_t)M1);
    __m256i h = _mm256_mullo_epi32(_mm256_xor_si256(i, k0), m0);
    h = _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 15)), m1);
    h = _mm256_xor_si256(_mm256_xor_si256(h, _mm256_srli_epi32(h, 16)), k1);
    h = _mm256_mullo_epi32(h, m0);
    h = _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 15)), m1);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(h, 8)), _mm256_set1_ps(ULP24));
}

__attribute__((target("avx2"))) static int64_t quantize_avx2(const float* x, int64_t n, float s, uint32_t first,
                                                            uint32_t k0, uint32_t k1, float gain, float lo,
                                                            float hi, float shift, int8_t* out) {
    const __m256i vk0 = _mm256_set1_epi32((int32_t)k0), vk1 = _mm256_set1_epi32((int32_t)k1);
    const __m256 vs = _mm256_set1_ps(s), vg = _mm256_set1_ps(gain), vlo = _mm256_set1_ps(lo);
    const __m256 vhi = _mm256_set1_ps(hi), vsh = _mm256_set1_ps(shift);
    __m256i i = _mm256_add_epi32(_mm256_set1_epi32((int32_t)first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i eight = _mm256_set1_epi32(8);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 u = gs_dither8(i, vk0, vk1);
        __m256 y = _mm256_mul_ps(_mm256_div_ps(_mm256_loadu_ps(x + c), vs), vg);
        __m256 q = _mm256_floor_ps(_mm256_add_ps(_mm256_add_ps(y, u), vsh));
        q = _mm256_min_ps(_mm256_max_ps(q, vlo), vhi);
        __m256i w = _mm256_cvttps_epi32(q);
        __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storel_epi64((__m128i*)(out + c), _mm_packs_epi16(p, p));
        i = _mm256_add_epi32(i, eight);
    }
    return c;
}

__attribute__((target("avx2"))) static int64_t reconstruct_avx2(const int8_t* codes, int64_t n, float s,
                                                               uint32_t first, uint32_t k0, uint32_t k1,
                                                               float gain, float offset, int32_t subtract,
                                                               float* out) {
    const __m256i vk0 = _mm256_set1_epi32((int32_t)k0), vk1 = _mm256_set1_epi32((int32_t)k1);
    const __m256 vs = _mm256_set1_ps(s), vg = _mm256_set1_ps(gain), voff = _mm256_set1_ps(offset);
    __m256i i = _mm256_add_epi32(_mm256_set1_epi32((int32_t)first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i eight = _mm256_set1_epi32(8);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(codes + c)));
        __m256 v = _mm256_add_ps(_mm256_cvtepi32_ps(w), voff);
        if (subtract) v = _mm256_sub_ps(v, gs_dither8(i, vk0, vk1));
        _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_div_ps(v, vg), vs));
        i = _mm256_add_epi32(i, eight);
    }
    return c;
}
__attribute__((target("avx2"))) static inline __m256 gs_wrap8(__m256 v, __m256 k) {
    const __m256 zero = _mm256_setzero_ps();
    v = _mm256_blendv_ps(v, _mm256_add_ps(v, k), _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
    v = _mm256_blendv_ps(v, _mm256_add_ps(v, k), _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
    v = _mm256_blendv_ps(v, _mm256_sub_ps(v, k), _mm256_cmp_ps(v, k, _CMP_GE_OQ));
    return _mm256_blendv_ps(v, _mm256_sub_ps(v, k), _mm256_cmp_ps(v, k, _CMP_GE_OQ));
}

__attribute__((target("avx2"))) static int64_t nested_avx2(const float* g, int64_t n, float kappa, uint32_t first,
                                                          uint32_t k0, uint32_t k1, float alpha, float delta1,
                                                          float k, float h, int8_t* out) {
    const __m256i vk0 = _mm256_set1_epi32((int32_t)k0), vk1 = _mm256_set1_epi32((int32_t)k1);
    const __m256 vkap = _mm256_set1_ps(kappa), va = _mm256_set1_ps(alpha), vd = _mm256_set1_ps(delta1);
    const __m256 vk = _mm256_set1_ps(k), vh = _mm256_set1_ps(h), half = _mm256_set1_ps(0.5f);
    __m256i i = _mm256_add_epi32(_mm256_set1_epi32((int32_t)first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i eight = _mm256_set1_epi32(8);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 u = _mm256_mul_ps(gs_dither8(i, vk0, vk1), vd);
        __m256 x = _mm256_mul_ps(_mm256_div_ps(_mm256_loadu_ps(g + c), vkap), va);
        __m256 t = _mm256_div_ps(_mm256_add_ps(x, u), vd);
        __m256 coarse = _mm256_mul_ps(_mm256_floor_ps(_mm256_add_ps(_mm256_div_ps(t, vk), half)), vk);
        __m256 v = _mm256_add_ps(_mm256_sub_ps(_mm256_floor_ps(_mm256_add_ps(t, half)), coarse), vh);
        __m256i w = _mm256_cvttps_epi32(_mm256_sub_ps(gs_wrap8(v, vk), vh));
        __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
        _mm_storel_epi64((__m128i*)(out + c), _mm_packs_epi16(p, p));
        i = _mm256_add_epi32(i, eight);
    }
    return c;
}

__attribute__((target("avx2"))) static int64_t nested_estimate_avx2(const int8_t* s, const float* side, int64_t n,
                                                                   float kappa, uint32_t first, uint32_t k0,
                                                                   uint32_t k1, float alpha, int32_t shrink,
                                                                   float delta1, float k, float step, float* out) {
    const __m256i vk0 = _mm256_set1_epi32((int32_t)k0), vk1 = _mm256_set1_epi32((int32_t)k1);
    const __m256 vkap = _mm256_set1_ps(kappa), vsafe = _mm256_set1_ps(kappa > 0 ? kappa : 1.0f);
    const __m256 va = _mm256_set1_ps(alpha), vd = _mm256_set1_ps(delta1), vk = _mm256_set1_ps(k);
    const __m256 vstep = _mm256_set1_ps(step), half = _mm256_set1_ps(0.5f);
    __m256i i = _mm256_add_epi32(_mm256_set1_epi32((int32_t)first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i eight = _mm256_set1_epi32(8);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 u = _mm256_mul_ps(gs_dither8(i, vk0, vk1), vd);
        __m256 y = _mm256_div_ps(_mm256_loadu_ps(side + c), vsafe);
        __m256 sv = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)(s + c))));
        __m256 r = _mm256_sub_ps(_mm256_sub_ps(_mm256_mul_ps(sv, vd), u), shrink ? _mm256_mul_ps(y, va) : y);
        r = _mm256_div_ps(r, vd);
        __m256 coarse = _mm256_mul_ps(_mm256_floor_ps(_mm256_add_ps(_mm256_div_ps(r, vk), half)), vk);
        __m256 e = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(r, coarse), vstep), y);
        _mm256_storeu_ps(out + c, _mm256_mul_ps(e, vkap));
        i = _mm256_add_epi32(i, eight);
    }
    return c;
}
#endif

void gs_nested_rows(const float* g, int64_t n, float kappa, int32_t base, uint32_t k0, uint32_t k1, float alpha,
                    float delta1, float k, float h, int8_t* out) {
    int64_t c = 0;
#ifdef GS_AVX2
    if (__builtin_cpu_supports("avx2")) c = nested_avx2(g, n, kappa, (uint32_t)base, k0, k1, alpha, delta1, k, h, out);
#endif
    nested_scalar(g + c, n - c, kappa, (uint32_t)base + (uint32_t)c, k0, k1, alpha, delta1, k, h, out + c);
}

void gs_nested_estimate(const int8_t* s, const float* side, int64_t n, float kappa, int32_t base, uint32_t k0,
                        uint32_t k1, float alpha, int32_t shrink, float delta1, float k, float step, float* out) {
    int64_t c = 0;
    uint32_t first = (uint32_t)base;
#ifdef GS_AVX2
    if (__builtin_cpu_supports("avx2"))
        c = nested_estimate_avx2(s, side, n, kappa, first, k0, k1, alpha, shrink, delta1, k, step, out);
#endif
    nested_estimate_scalar(s + c, side + c, n - c, kappa, first + (uint32_t)c, k0, k1, alpha, shrink, delta1, k,
                           step, out + c);
}

/* rows x size elements; element (r, c) has index base + r size + c; scale[r] is row r's divisor / factor */
void gs_quantize_rows(const float* x, int64_t rows, int64_t size, const float* scale, int32_t base, uint32_t k0,
                      uint32_t k1, float gain, float lo, float hi, float shift, int8_t* out) {
#ifdef GS_AVX2
    int wide = __builtin_cpu_supports("avx2");
#endif
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * size;
        int8_t* o = out + r * size;
        uint32_t first = (uint32_t)base + (uint32_t)(r * size);
        int64_t c = 0;
#ifdef GS_AVX2
        if (wide) c = quantize_avx2(xr, size, scale[r], first, k0, k1, gain, lo, hi, shift, o);
#endif
        quantize_scalar(xr + c, size - c, scale[r], first + (uint32_t)c, k0, k1, gain, lo, hi, shift, o + c);
    }
}

void gs_reconstruct_rows(const int8_t* codes, int64_t rows, int64_t size, const float* scale, int32_t base,
                         uint32_t k0, uint32_t k1, float gain, float offset, int32_t subtract, float* out) {
#ifdef GS_AVX2
    int wide = __builtin_cpu_supports("avx2");
#endif
    for (int64_t r = 0; r < rows; r++) {
        const int8_t* cr = codes + r * size;
        float* o = out + r * size;
        uint32_t first = (uint32_t)base + (uint32_t)(r * size);
        int64_t c = 0;
#ifdef GS_AVX2
        if (wide) c = reconstruct_avx2(cr, size, scale[r], first, k0, k1, gain, offset, subtract, o);
#endif
        reconstruct_scalar(cr + c, size - c, scale[r], first + (uint32_t)c, k0, k1, gain, offset, subtract, o + c);
    }
}
""".replace("MULTIPLIER0", f"0x{MULTIPLIERS[0]:08X}u").replace("MULTIPLIER1", f"0x{MULTIPLIERS[1]:08X}u")

_P, _I64, _I32, _U32, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_uint32, ctypes.c_float
_SIGNATURES: dict[str, native.Signature] = {
    "gs_quantize_rows": (None, [_P, _I64, _I64, _P, _I32, _U32, _U32, _F, _F, _F, _F, _P]),
    "gs_reconstruct_rows": (None, [_P, _I64, _I64, _P, _I32, _U32, _U32, _F, _F, _I32, _P]),
    "gs_nested_rows": (None, [_P, _I64, _F, _I32, _U32, _U32, _F, _F, _F, _F, _P]),
    "gs_nested_estimate": (None, [_P, _P, _I64, _F, _I32, _U32, _U32, _F, _I32, _F, _F, _F, _P]),
}


def _library() -> ctypes.CDLL | None:
    return native.library("counter_dither", SOURCE, _SIGNATURES)


def quantizes(x: torch.Tensor, scale: torch.Tensor, codes: torch.dtype) -> bool:
    """Whether :func:`quantize_rows_into` runs: ``codes`` int8, float32 values ``x`` and scales, contiguous on a
    CPU, and the library built (see :mod:`gradstat.compressors.kernels.native`)."""
    ok = codes == torch.int8 and cpu_contiguous(x, (torch.float32,)) and cpu_contiguous(scale, (torch.float32,))
    return ok and _library() is not None


def reconstructs(codes: torch.Tensor, scale: torch.Tensor) -> bool:
    """Whether :func:`reconstruct_rows_into` runs: int8 codes and float32 scales, contiguous on a CPU, and the
    library built."""
    return cpu_contiguous(codes, (torch.int8,)) and cpu_contiguous(scale, (torch.float32,)) and _library() is not None


def _words(key: torch.Tensor) -> tuple[int, int]:
    k0, k1 = key.tolist()
    return k0 & 0xFFFFFFFF, k1 & 0xFFFFFFFF


def _rows_pieces(rows: int, size: int) -> list[tuple[int, int, int, int]]:
    """``(row_start, row_stop, col_start, col_stop)`` pieces of a ``(rows, size)`` block, about one per thread
    (:func:`gradstat.compressors.kernels.native.pieces`): whole rows, or parts of the one row of a single-row block."""
    if rows == 1:
        return [(0, 1, a, b) for a, b in native.pieces(size)]
    cuts = sorted({0, rows, *(min(rows, round(a / size)) for a, _ in native.pieces(rows * size))})
    return [(r0, r1, 0, size) for r0, r1 in zip(cuts, cuts[1:], strict=False) if r1 > r0]


def _over_rows(name: str, out: torch.Tensor, src: torch.Tensor, scale: torch.Tensor, base: int, key: torch.Tensor,
               params: tuple[float, ...]) -> torch.Tensor:  # fmt: skip
    """The row loop ``name`` of the library (arguments: source, rows, size, row scales, first index, key words,
    ``params``, destination) over the ``(rows, size)`` block ``src`` into ``out``, split across torch's threads."""
    lib = _library()
    assert lib is not None
    fn = getattr(lib, name)
    rows, size = src.shape
    # the C loop trusts these: a mismatch would read or write past a buffer
    if out.shape != src.shape or not out.is_contiguous() or scale.numel() < rows:
        raise ValueError(f"{name}: out {tuple(out.shape)} and {scale.numel()} scales for a block of {tuple(src.shape)}")
    k0, k1 = _words(key)
    flat_scale = scale.reshape(-1)

    def piece(r0: int, r1: int, c0: int, c1: int) -> None:
        part, dest = src[r0:r1, c0:c1], out[r0:r1, c0:c1]
        fn(part.data_ptr(), r1 - r0, c1 - c0, flat_scale[r0:].data_ptr(), base + r0 * size + c0, k0, k1, *params,
           dest.data_ptr())  # fmt: skip

    native.run_all([functools.partial(piece, *p) for p in _rows_pieces(rows, size)])
    return out


def quantize_rows_into(
    out: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, base: int, key: torch.Tensor, gain: float, lo: int,
    hi: int, shift: float,
) -> torch.Tensor:  # fmt: skip
    """:func:`gradstat.compressors.kernels.counter_dither.quantize_rows_into` (int8 codes) of the ``(rows, size)`` block
    ``x`` whose first element has index ``base``, ``scale`` of ``rows`` elements (see :func:`quantizes`); split
    across torch's threads on a long block."""
    return _over_rows("gs_quantize_rows", out, x, scale, base, key, (gain, float(lo), float(hi), shift))


def reconstruct_rows_into(
    out: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, base: int, key: torch.Tensor, gain: float,
    offset: float, subtract: bool,
) -> torch.Tensor:  # fmt: skip
    """:func:`gradstat.compressors.kernels.counter_dither.reconstruct_rows_into` (float32 values) of the ``(rows,
    size)`` int8 codes whose first element has index ``base`` (see :func:`reconstructs`); split across torch's threads
    on a long block."""
    return _over_rows("gs_reconstruct_rows", out, codes, scale, base, key, (gain, offset, int(subtract)))


def nests(g: torch.Tensor, k: int, delta1: float) -> bool:
    """Whether :func:`nested_rows_into` and :func:`nested_estimate_into` run: float32 values on a CPU, int8 codes
    (k <= 255), the small remainder's range (``1 / delta1 + 1 < 2^22``,
    :data:`gradstat.compressors.schemes.quantizers.ndqsg.SMALL_T`) and the library built."""
    return cpu_contiguous(g, (torch.float32,)) and k <= 255 and 1.0 / delta1 + 1.0 < 2.0**22 and _library() is not None


def nested_rows_into(
    out: torch.Tensor, g: torch.Tensor, kappa: float, key: torch.Tensor, alpha: float, delta1: float, k: int
) -> torch.Tensor:
    """:func:`gradstat.compressors.schemes.quantizers.ndqsg.nested_rows_into` of the flat float32 ``g`` (first index 0)
    with the nonzero scale ``kappa``: the int8 nested codes into ``out`` (see :func:`nests`); split across torch's
    threads on a long vector."""
    lib = _library()
    assert lib is not None
    k0, k1 = _words(key)
    flat, dest = g.reshape(-1), out.reshape(-1)
    if flat.numel() != dest.numel() or not dest.is_contiguous() or dest.dtype != torch.int8:  # (trusted by the C)
        raise ValueError(f"nested encode: {flat.numel()} values into {dest.numel()} {dest.dtype} codes")

    def piece(a: int, b: int) -> None:
        lib.gs_nested_rows(flat[a:].data_ptr(), b - a, kappa, a, k0, k1, alpha, delta1, float(k),
                           float((k - 1) // 2), dest[a:].data_ptr())  # fmt: skip

    native.run_all([functools.partial(piece, *p) for p in native.pieces(flat.numel())])
    return out


def nested_estimate_into(
    out: torch.Tensor, s: torch.Tensor, side: torch.Tensor, kappa: float, key: torch.Tensor, alpha: float,
    delta1: float, k: int,
) -> torch.Tensor:  # fmt: skip
    """:func:`gradstat.compressors.schemes.quantizers.ndqsg.nested_reconstruct_rows_in_place` of the flat int8 codes
    ``s`` with the float32 side information (first index 0, scale ``kappa``, possibly 0), into the float32 ``out``;
    split across torch's threads on a long vector."""
    lib = _library()
    assert lib is not None
    k0, k1 = _words(key)
    step = alpha * delta1  # (a Python product, rounded to float32 once, as the torch form's scalar)
    codes, y, dest = s.reshape(-1), side.reshape(-1), out.reshape(-1)
    if not codes.numel() == y.numel() == dest.numel() or not dest.is_contiguous():  # (the C loop trusts these)
        raise ValueError(f"nested estimate: {codes.numel()} codes, {y.numel()} side values, {dest.numel()} outputs")

    def piece(a: int, b: int) -> None:
        lib.gs_nested_estimate(codes[a:].data_ptr(), y[a:].data_ptr(), b - a, kappa, a, k0, k1, alpha,
                               int(alpha != 1.0), delta1, float(k), step, dest[a:].data_ptr())  # fmt: skip

    native.run_all([functools.partial(piece, *p) for p in native.pieces(codes.numel())])
    return out

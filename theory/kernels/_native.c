/* gradstat's C loops, built by the package build as the extension module gradstat.theory.kernels._native.

Plain C on raw buffers (Python's buffer protocol: numpy arrays viewing torch's CPU tensors), so the module does not
depend on the torch version it runs beside. Every function checks its buffers' element type, contiguity and length
before it reads or writes, then releases the GIL for its loop: the callers split a long loop across torch's threads
(native.run_all) and the pieces run at once.

- select_f32 / select_f64: threshold compaction (compaction.py): the increasing indices of v >= t (v = |x| or x),
  with the largest v and a NaN flag kept in the same read; 16 float32 elements per AVX2 step.
- summary_f32 / tail_f32: the stage statistics of stage_stats.py (extremes, nonzero count and float64 sums of |x|,
  and count and sums over |x| > t, with the sum of logarithms a gamma fit reads), one read of a float32 piece.
- quantize_rows, reconstruct_rows, nested_rows, nested_estimate: the counter-dither loops of counter_dither.py and
  NDQSG's nested worker (counter_native.py), float32 values and int8 codes, 8 elements per AVX2 step.

AVX2 is chosen at run time (__builtin_cpu_supports, with function-level target attributes), so a module built on one
x86-64 CPU runs on another; elsewhere (another architecture, another compiler) the scalar loops run. Build flags keep
a multiply and an add from being contracted into one FMA, so float arithmetic rounds as torch's eager operations. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifndef GS_SOURCE_DIGEST
#define GS_SOURCE_DIGEST ""
#endif

/* the multipliers of counter_dither.MULTIPLIERS (a test compares them) */
#define M0 0x7FEB352Du
#define M1 0x5BD1E995u
#define ULP24 5.9604644775390625e-08f /* 2^-24 */

static int gs_allow_wide = 1; /* set_avx2(False): the scalar loops only (the tests compare both on one machine) */

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define GS_AVX2 1
static int gs_wide(void) { return gs_allow_wide && __builtin_cpu_supports("avx2"); }
#else
static int gs_wide(void) { return 0; }
#endif

/* ---------------------------------------------------------------------------------------------------------------
   Buffers: element type, C-contiguity, writability and length checked before any loop runs. */

typedef enum { GS_F32, GS_F64, GS_I8, GS_I64 } gs_kind;

static const char* gs_kind_name(gs_kind kind) {
    switch (kind) {
        case GS_F32: return "float32";
        case GS_F64: return "float64";
        case GS_I8: return "int8";
        default: return "int64";
    }
}

static int gs_matches(const Py_buffer* view, gs_kind kind) {
    const char* f = view->format ? view->format : "B";
    if (*f == '@' || *f == '=') f++;
    if (f[0] == '\0' || f[1] != '\0') return 0;
    switch (kind) {
        case GS_F32: return f[0] == 'f' && view->itemsize == 4;
        case GS_F64: return f[0] == 'd' && view->itemsize == 8;
        case GS_I8: return f[0] == 'b' && view->itemsize == 1;
        default: return (f[0] == 'q' || f[0] == 'l') && view->itemsize == 8;
    }
}

/* The buffer of obj as a contiguous array of kind (writable when asked); its element count in *count. On failure
   an exception is set, nothing is held, and -1 is returned. */
static int gs_get(PyObject* obj, Py_buffer* view, gs_kind kind, int writable, const char* what, Py_ssize_t* count) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: needs a contiguous%s %s buffer, got %.80s", what,
                     writable ? " writable" : "", gs_kind_name(kind), Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (!gs_matches(view, kind)) {
        PyErr_Format(PyExc_TypeError, "%s: needs %s elements, got buffer format '%s' of %zd bytes", what,
                     gs_kind_name(kind), view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    *count = view->len / view->itemsize;
    return 0;
}

/* The buffers taken by one call, released together. */
typedef struct {
    Py_buffer views[4];
    int held;
} gs_views;

static void gs_release(gs_views* v) {
    for (int j = 0; j < v->held; j++) PyBuffer_Release(&v->views[j]);
    v->held = 0;
}

static int gs_take(gs_views* v, PyObject* obj, gs_kind kind, int writable, const char* what, Py_ssize_t* count,
                   void** data) {
    if (gs_get(obj, &v->views[v->held], kind, writable, what, count) != 0) return -1;
    *data = v->views[v->held].buf;
    v->held++;
    return 0;
}

static int gs_length(const char* fn, const char* what, Py_ssize_t have, long long want) {
    if ((long long)have != want) {
        PyErr_Format(PyExc_ValueError, "%s: %s holds %zd elements, expected %lld", fn, what, have, want);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------------------------
   Threshold compaction. */

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
__attribute__((target("avx2"))) static int64_t select_f32_avx2(const float* x, int64_t i, int64_t end, float t,
                                                              int absolute, int64_t* idx, float* vals, int64_t cap,
                                                              int64_t* count, double* top, int* nan) {
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

static int64_t select_f32_loop(const float* x, int64_t i, int64_t end, float t, int absolute, int64_t* idx,
                               float* vals, int64_t cap, int64_t* count, double* top, int* nan) {
#ifdef GS_AVX2
    if (gs_wide()) {
        i = select_f32_avx2(x, i, end, t, absolute, idx, vals, cap, count, top, nan);
        if (i + 16 <= end) return i; /* stopped for room: the caller grows the buffers */
    }
#endif
    int64_t c = *count;
    GS_SCALAR(float, fabsf)
    *count = c;
    return i;
}

static int64_t select_f64_loop(const double* x, int64_t i, int64_t end, double t, int absolute, int64_t* idx,
                               double* vals, int64_t cap, int64_t* count, double* top, int* nan) {
    int64_t c = *count;
    GS_SCALAR(double, fabs)
    *count = c;
    return i;
}

/* select_f32 / select_f64(x, start, end, t, absolute, idx, vals or None, count, top, nan)
   -> (stop, count, top, nan): scans x[start:end) from where the last call stopped, appending to idx (and vals)
   after their first count entries; stops early (stop < end) when the next step could overflow them. */
static PyObject* gs_select(PyObject* args, gs_kind kind, const char* fn) {
    PyObject *xo, *idxo, *valso;
    long long start, end, count;
    double t, top;
    int absolute, nan;
    if (!PyArg_ParseTuple(args, "OLLdpOOLdp", &xo, &start, &end, &t, &absolute, &idxo, &valso, &count, &top, &nan))
        return NULL;
    gs_views v = {.held = 0};
    Py_ssize_t n, cap, nvals;
    void *x, *idx, *vals = NULL;
    if (gs_take(&v, xo, kind, 0, fn, &n, &x) || gs_take(&v, idxo, GS_I64, 1, fn, &cap, &idx)) goto fail;
    if (valso != Py_None) {
        if (gs_take(&v, valso, kind, 1, fn, &nvals, &vals)) goto fail;
        if (nvals < cap) cap = nvals;
    }
    if (start < 0 || start > end || end > (long long)n || count < 0 || count > (long long)cap) {
        PyErr_Format(PyExc_ValueError, "%s: range [%lld, %lld) of %zd elements with %lld of %zd entries filled", fn,
                     start, end, n, count, cap);
        goto fail;
    }
    int64_t at, c = (int64_t)count;
    Py_BEGIN_ALLOW_THREADS;
    if (kind == GS_F32)
        at = select_f32_loop((const float*)x, start, end, (float)t, absolute, (int64_t*)idx, (float*)vals, cap, &c,
                             &top, &nan);
    else
        at = select_f64_loop((const double*)x, start, end, t, absolute, (int64_t*)idx, (double*)vals, cap, &c, &top,
                             &nan);
    Py_END_ALLOW_THREADS;
    gs_release(&v);
    return Py_BuildValue("LLdO", (long long)at, (long long)c, top, nan ? Py_True : Py_False);
fail:
    gs_release(&v);
    return NULL;
}

static PyObject* gs_select_f32(PyObject* self, PyObject* args) {
    (void)self;
    return gs_select(args, GS_F32, "select_f32");
}

static PyObject* gs_select_f64(PyObject* self, PyObject* args) {
    (void)self;
    return gs_select(args, GS_F64, "select_f64");
}

/* ---------------------------------------------------------------------------------------------------------------
   Counter-hash dither: the hash of counter_dither.counter_bits, round(fold(round(i ^ k0)) ^ k1), read as a signed
   number; the same operations in the same order as the eager torch functions, in float32. */

static inline uint32_t gs_round(uint32_t x) {
    x *= M0;
    x ^= x >> 15;
    return x * M1;
}

/* the hash of the counter i (counter_dither.hash_at) */
static inline uint32_t gs_hash(uint32_t i, uint32_t k0, uint32_t k1) {
    uint32_t h = gs_round(i ^ k0);
    return gs_round((h ^ (h >> 16)) ^ k1);
}

static inline float gs_dither(uint32_t i, uint32_t k0, uint32_t k1) {
    return (float)(((int32_t)gs_hash(i, k0, k1)) >> 8) * ULP24;
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
                               float gain, float offset, int subtract, float* out) {
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
                                   uint32_t k0, uint32_t k1, float alpha, int shrink, float delta1, float k,
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

#ifdef GS_AVX2
/* the hash of 8 counters (gs_round(fold(gs_round(i ^ k0)) ^ k1), lane by lane) */
__attribute__((target("avx2"))) static inline __m256i gs_hash8(__m256i i, __m256i k0, __m256i k1) {
    const __m256i m0 = _mm256_set1_epi32((int32_t)M0), m1 = _mm256_set1_epi32((int32_t)M1);
    __m256i h = _mm256_mullo_epi32(_mm256_xor_si256(i, k0), m0);
    h = _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 15)), m1);
    h = _mm256_xor_si256(_mm256_xor_si256(h, _mm256_srli_epi32(h, 16)), k1);
    h = _mm256_mullo_epi32(h, m0);
    return _mm256_mullo_epi32(_mm256_xor_si256(h, _mm256_srli_epi32(h, 15)), m1);
}

__attribute__((target("avx2"))) static inline __m256 gs_dither8(__m256i i, __m256i k0, __m256i k1) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srai_epi32(gs_hash8(i, k0, k1), 8)), _mm256_set1_ps(ULP24));
}

__attribute__((target("avx2"))) static inline __m256i gs_index8(uint32_t first) {
    return _mm256_add_epi32(_mm256_set1_epi32((int32_t)first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

__attribute__((target("avx2"))) static inline void gs_store_codes8(int8_t* out, __m256 q) {
    __m256i w = _mm256_cvttps_epi32(q);
    __m128i p = _mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
    _mm_storel_epi64((__m128i*)out, _mm_packs_epi16(p, p));
}

__attribute__((target("avx2"))) static inline __m256 gs_load_codes8(const int8_t* codes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)codes)));
}

__attribute__((target("avx2"))) static int64_t quantize_avx2(const float* x, int64_t n, float s, uint32_t first,
                                                            uint32_t k0, uint32_t k1, float gain, float lo,
                                                            float hi, float shift, int8_t* out) {
    const __m256i vk0 = _mm256_set1_epi32((int32_t)k0), vk1 = _mm256_set1_epi32((int32_t)k1);
    const __m256 vs = _mm256_set1_ps(s), vg = _mm256_set1_ps(gain), vlo = _mm256_set1_ps(lo);
    const __m256 vhi = _mm256_set1_ps(hi), vsh = _mm256_set1_ps(shift);
    const __m256i eight = _mm256_set1_epi32(8);
    __m256i i = gs_index8(first);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 u = gs_dither8(i, vk0, vk1);
        __m256 y = _mm256_mul_ps(_mm256_div_ps(_mm256_loadu_ps(x + c), vs), vg);
        __m256 q = _mm256_floor_ps(_mm256_add_ps(_mm256_add_ps(y, u), vsh));
        gs_store_codes8(out + c, _mm256_min_ps(_mm256_max_ps(q, vlo), vhi));
        i = _mm256_add_epi32(i, eight);
    }
    return c;
}

__attribute__((target("avx2"))) static int64_t reconstruct_avx2(const int8_t* codes, int64_t n, float s,
                                                               uint32_t first, uint32_t k0, uint32_t k1,
                                                               float gain, float offset, int subtract, float* out) {
    const __m256i vk0 = _mm256_set1_epi32((int32_t)k0), vk1 = _mm256_set1_epi32((int32_t)k1);
    const __m256 vs = _mm256_set1_ps(s), vg = _mm256_set1_ps(gain), voff = _mm256_set1_ps(offset);
    const __m256i eight = _mm256_set1_epi32(8);
    __m256i i = gs_index8(first);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 v = _mm256_add_ps(gs_load_codes8(codes + c), voff);
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
    const __m256i eight = _mm256_set1_epi32(8);
    __m256i i = gs_index8(first);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 u = _mm256_mul_ps(gs_dither8(i, vk0, vk1), vd);
        __m256 x = _mm256_mul_ps(_mm256_div_ps(_mm256_loadu_ps(g + c), vkap), va);
        __m256 t = _mm256_div_ps(_mm256_add_ps(x, u), vd);
        __m256 coarse = _mm256_mul_ps(_mm256_floor_ps(_mm256_add_ps(_mm256_div_ps(t, vk), half)), vk);
        __m256 v = _mm256_add_ps(_mm256_sub_ps(_mm256_floor_ps(_mm256_add_ps(t, half)), coarse), vh);
        gs_store_codes8(out + c, _mm256_sub_ps(gs_wrap8(v, vk), vh));
        i = _mm256_add_epi32(i, eight);
    }
    return c;
}

__attribute__((target("avx2"))) static int64_t nested_estimate_avx2(const int8_t* s, const float* side, int64_t n,
                                                                   float kappa, uint32_t first, uint32_t k0,
                                                                   uint32_t k1, float alpha, int shrink,
                                                                   float delta1, float k, float step, float* out) {
    const __m256i vk0 = _mm256_set1_epi32((int32_t)k0), vk1 = _mm256_set1_epi32((int32_t)k1);
    const __m256 vkap = _mm256_set1_ps(kappa), vsafe = _mm256_set1_ps(kappa > 0 ? kappa : 1.0f);
    const __m256 va = _mm256_set1_ps(alpha), vd = _mm256_set1_ps(delta1), vk = _mm256_set1_ps(k);
    const __m256 vstep = _mm256_set1_ps(step), half = _mm256_set1_ps(0.5f);
    const __m256i eight = _mm256_set1_epi32(8);
    __m256i i = gs_index8(first);
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 u = _mm256_mul_ps(gs_dither8(i, vk0, vk1), vd);
        __m256 y = _mm256_div_ps(_mm256_loadu_ps(side + c), vsafe);
        __m256 r = _mm256_sub_ps(_mm256_sub_ps(_mm256_mul_ps(gs_load_codes8(s + c), vd), u),
                                 shrink ? _mm256_mul_ps(y, va) : y);
        r = _mm256_div_ps(r, vd);
        __m256 coarse = _mm256_mul_ps(_mm256_floor_ps(_mm256_add_ps(_mm256_div_ps(r, vk), half)), vk);
        __m256 e = _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(r, coarse), vstep), y);
        _mm256_storeu_ps(out + c, _mm256_mul_ps(e, vkap));
        i = _mm256_add_epi32(i, eight);
    }
    return c;
}
#endif

/* rows x size elements; element (r, c) has index base + r size + c; scale[r] is row r's divisor / factor */
static void quantize_rows_loop(const float* x, int64_t rows, int64_t size, const float* scale, uint32_t base,
                               uint32_t k0, uint32_t k1, float gain, float lo, float hi, float shift, int8_t* out) {
    int wide = gs_wide();
    for (int64_t r = 0; r < rows; r++) {
        const float* xr = x + r * size;
        int8_t* o = out + r * size;
        uint32_t first = base + (uint32_t)(r * size);
        int64_t c = 0;
#ifdef GS_AVX2
        if (wide) c = quantize_avx2(xr, size, scale[r], first, k0, k1, gain, lo, hi, shift, o);
#endif
        quantize_scalar(xr + c, size - c, scale[r], first + (uint32_t)c, k0, k1, gain, lo, hi, shift, o + c);
    }
    (void)wide;
}

static void reconstruct_rows_loop(const int8_t* codes, int64_t rows, int64_t size, const float* scale,
                                  uint32_t base, uint32_t k0, uint32_t k1, float gain, float offset, int subtract,
                                  float* out) {
    int wide = gs_wide();
    for (int64_t r = 0; r < rows; r++) {
        const int8_t* cr = codes + r * size;
        float* o = out + r * size;
        uint32_t first = base + (uint32_t)(r * size);
        int64_t c = 0;
#ifdef GS_AVX2
        if (wide) c = reconstruct_avx2(cr, size, scale[r], first, k0, k1, gain, offset, subtract, o);
#endif
        reconstruct_scalar(cr + c, size - c, scale[r], first + (uint32_t)c, k0, k1, gain, offset, subtract, o + c);
    }
    (void)wide;
}

/* The shape arguments of a row loop: rows, size >= 0 and rows * size representable. */
static int gs_block(const char* fn, long long rows, long long size) {
    if (rows < 0 || size < 0 || (size > 0 && rows > (long long)PY_SSIZE_T_MAX / size)) {
        PyErr_Format(PyExc_ValueError, "%s: a block of %lld x %lld elements", fn, rows, size);
        return -1;
    }
    return 0;
}

/* quantize_rows(x, rows, size, scale, base, k0, k1, gain, lo, hi, shift, out): the int8 codes of the float32
   (rows, size) block x into out */
static PyObject* gs_quantize_rows(PyObject* self, PyObject* args) {
    (void)self;
    const char* fn = "quantize_rows";
    PyObject *xo, *so, *oo;
    long long rows, size, base;
    unsigned long long k0, k1;
    float gain, lo, hi, shift;
    if (!PyArg_ParseTuple(args, "OLLOLKKffffO", &xo, &rows, &size, &so, &base, &k0, &k1, &gain, &lo, &hi, &shift,
                          &oo))
        return NULL;
    gs_views v = {.held = 0};
    Py_ssize_t nx, ns, no;
    void *x, *s, *o;
    if (gs_block(fn, rows, size) || gs_take(&v, xo, GS_F32, 0, fn, &nx, &x) ||
        gs_take(&v, so, GS_F32, 0, fn, &ns, &s) || gs_take(&v, oo, GS_I8, 1, fn, &no, &o) ||
        gs_length(fn, "the values", nx, rows * size) || gs_length(fn, "the scales", ns, rows) ||
        gs_length(fn, "the codes", no, rows * size))
        goto fail;
    Py_BEGIN_ALLOW_THREADS;
    quantize_rows_loop((const float*)x, rows, size, (const float*)s, (uint32_t)base, (uint32_t)k0, (uint32_t)k1, gain,
                       lo, hi, shift, (int8_t*)o);
    Py_END_ALLOW_THREADS;
    gs_release(&v);
    Py_RETURN_NONE;
fail:
    gs_release(&v);
    return NULL;
}

/* reconstruct_rows(codes, rows, size, scale, base, k0, k1, gain, offset, subtract, out): the float32
   reconstruction of the int8 (rows, size) codes into out */
static PyObject* gs_reconstruct_rows(PyObject* self, PyObject* args) {
    (void)self;
    const char* fn = "reconstruct_rows";
    PyObject *co, *so, *oo;
    long long rows, size, base;
    unsigned long long k0, k1;
    float gain, offset;
    int subtract;
    if (!PyArg_ParseTuple(args, "OLLOLKKffpO", &co, &rows, &size, &so, &base, &k0, &k1, &gain, &offset, &subtract,
                          &oo))
        return NULL;
    gs_views v = {.held = 0};
    Py_ssize_t nc, ns, no;
    void *c, *s, *o;
    if (gs_block(fn, rows, size) || gs_take(&v, co, GS_I8, 0, fn, &nc, &c) ||
        gs_take(&v, so, GS_F32, 0, fn, &ns, &s) || gs_take(&v, oo, GS_F32, 1, fn, &no, &o) ||
        gs_length(fn, "the codes", nc, rows * size) || gs_length(fn, "the scales", ns, rows) ||
        gs_length(fn, "the output", no, rows * size))
        goto fail;
    Py_BEGIN_ALLOW_THREADS;
    reconstruct_rows_loop((const int8_t*)c, rows, size, (const float*)s, (uint32_t)base, (uint32_t)k0, (uint32_t)k1,
                          gain, offset, subtract, (float*)o);
    Py_END_ALLOW_THREADS;
    gs_release(&v);
    Py_RETURN_NONE;
fail:
    gs_release(&v);
    return NULL;
}

/* nested_rows(g, kappa, base, k0, k1, alpha, delta1, k, h, out): NDQSG's int8 nested codes of the float32 g */
static PyObject* gs_nested_rows(PyObject* self, PyObject* args) {
    (void)self;
    const char* fn = "nested_rows";
    PyObject *go, *oo;
    long long base;
    unsigned long long k0, k1;
    float kappa, alpha, delta1, k, h;
    if (!PyArg_ParseTuple(args, "OfLKKffffO", &go, &kappa, &base, &k0, &k1, &alpha, &delta1, &k, &h, &oo))
        return NULL;
    gs_views v = {.held = 0};
    Py_ssize_t n, no;
    void *g, *o;
    if (gs_take(&v, go, GS_F32, 0, fn, &n, &g) || gs_take(&v, oo, GS_I8, 1, fn, &no, &o) ||
        gs_length(fn, "the codes", no, n))
        goto fail;
    int64_t c = 0;
    Py_BEGIN_ALLOW_THREADS;
#ifdef GS_AVX2
    if (gs_wide())
        c = nested_avx2((const float*)g, n, kappa, (uint32_t)base, (uint32_t)k0, (uint32_t)k1, alpha, delta1, k, h,
                        (int8_t*)o);
#endif
    nested_scalar((const float*)g + c, n - c, kappa, (uint32_t)base + (uint32_t)c, (uint32_t)k0, (uint32_t)k1, alpha,
                  delta1, k, h, (int8_t*)o + c);
    Py_END_ALLOW_THREADS;
    gs_release(&v);
    Py_RETURN_NONE;
fail:
    gs_release(&v);
    return NULL;
}

/* nested_estimate(s, side, kappa, base, k0, k1, alpha, shrink, delta1, k, step, out): NDQSG's float32 estimate
   from the int8 codes s and the float32 side information */
static PyObject* gs_nested_estimate(PyObject* self, PyObject* args) {
    (void)self;
    const char* fn = "nested_estimate";
    PyObject *so, *yo, *oo;
    long long base;
    unsigned long long k0, k1;
    float kappa, alpha, delta1, k, step;
    int shrink;
    if (!PyArg_ParseTuple(args, "OOfLKKfpfffO", &so, &yo, &kappa, &base, &k0, &k1, &alpha, &shrink, &delta1, &k,
                          &step, &oo))
        return NULL;
    gs_views v = {.held = 0};
    Py_ssize_t n, ny, no;
    void *s, *y, *o;
    if (gs_take(&v, so, GS_I8, 0, fn, &n, &s) || gs_take(&v, yo, GS_F32, 0, fn, &ny, &y) ||
        gs_take(&v, oo, GS_F32, 1, fn, &no, &o) || gs_length(fn, "the side information", ny, n) ||
        gs_length(fn, "the output", no, n))
        goto fail;
    int64_t c = 0;
    Py_BEGIN_ALLOW_THREADS;
#ifdef GS_AVX2
    if (gs_wide())
        c = nested_estimate_avx2((const int8_t*)s, (const float*)y, n, kappa, (uint32_t)base, (uint32_t)k0,
                                 (uint32_t)k1, alpha, shrink, delta1, k, step, (float*)o);
#endif
    nested_estimate_scalar((const int8_t*)s + c, (const float*)y + c, n - c, kappa, (uint32_t)base + (uint32_t)c,
                           (uint32_t)k0, (uint32_t)k1, alpha, shrink, delta1, k, step, (float*)o + c);
    Py_END_ALLOW_THREADS;
    gs_release(&v);
    Py_RETURN_NONE;
fail:
    gs_release(&v);
    return NULL;
}

/* Indices drawn with replacement (counter_dither.sample_indices_into): floor((h + 2^31) d / 2^32) of the hash h of
   the counters base, base + 1, ...; h + 2^31 of the signed hash is its bits with the top one flipped, below 2^32,
   and d <= 2^31, so the product stays below 2^63. */
static PyObject* gs_sample_indices(PyObject* self, PyObject* args) {
    (void)self;
    const char* fn = "sample_indices";
    PyObject* oo;
    long long base, d;
    unsigned long long k0, k1;
    if (!PyArg_ParseTuple(args, "OLKKL", &oo, &base, &k0, &k1, &d)) return NULL;
    if (d < 1 || d > (1LL << 31)) {
        PyErr_Format(PyExc_ValueError, "%s: indices into %lld elements (1 to 2^31)", fn, d);
        return NULL;
    }
    gs_views v = {.held = 0};
    Py_ssize_t n;
    void* o;
    if (gs_take(&v, oo, GS_I64, 1, fn, &n, &o)) {
        gs_release(&v);
        return NULL;
    }
    int64_t* out = (int64_t*)o;
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t c = 0; c < n; c++) {
        uint32_t h = gs_hash((uint32_t)base + (uint32_t)c, (uint32_t)k0, (uint32_t)k1);
        out[c] = (int64_t)(((uint64_t)(h ^ 0x80000000u) * (uint64_t)d) >> 32);
    }
    Py_END_ALLOW_THREADS;
    gs_release(&v);
    Py_RETURN_NONE;
}

#ifdef GS_AVX2
/* hashes_below's loop 8 counters a step (a comparison and a mask; most steps find none below the cut), up to the
   last full step: its count, and in *done where it stopped */
__attribute__((target("avx2"))) static long long hashes_below_avx2(long long start, long long n, int32_t cut,
                                                                   uint32_t k0, uint32_t k1, int64_t* out,
                                                                   long long capacity, long long* done) {
    const __m256i vk0 = _mm256_set1_epi32((int32_t)k0), vk1 = _mm256_set1_epi32((int32_t)k1);
    const __m256i vcut = _mm256_set1_epi32(cut), eight = _mm256_set1_epi32(8);
    __m256i i = gs_index8((uint32_t)start);
    long long count = 0, c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256i h = gs_hash8(i, vk0, vk1);
        unsigned mask = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(vcut, h)));
        while (mask) {
            int lane = __builtin_ctz(mask);
            mask &= mask - 1;
            uint32_t at = (uint32_t)(start + c + lane);
            uint32_t hl = (uint32_t)_mm256_extract_epi32(h, 0);
            switch (lane) { /* (extract takes a constant lane) */
                case 1: hl = (uint32_t)_mm256_extract_epi32(h, 1); break;
                case 2: hl = (uint32_t)_mm256_extract_epi32(h, 2); break;
                case 3: hl = (uint32_t)_mm256_extract_epi32(h, 3); break;
                case 4: hl = (uint32_t)_mm256_extract_epi32(h, 4); break;
                case 5: hl = (uint32_t)_mm256_extract_epi32(h, 5); break;
                case 6: hl = (uint32_t)_mm256_extract_epi32(h, 6); break;
                case 7: hl = (uint32_t)_mm256_extract_epi32(h, 7); break;
                default: break;
            }
            if (count < capacity) out[count] = (int64_t)((((uint64_t)(hl ^ 0x80000000u)) << 31) + (uint64_t)at);
            count++;
        }
        i = _mm256_add_epi32(i, eight);
    }
    *done = c;
    return count;
}
#endif

/* Random-k's candidates (counter_dither.subset on a CPU): the counters start, start + 1, ... whose signed hash lies
   below cut, each as its sort key ((h + 2^31) << 31) + index (counter_dither.k_smallest's); the first `capacity`
   written, the count of all of them returned (the caller runs again with room for more where it exceeds it). */
static PyObject* gs_hashes_below(PyObject* self, PyObject* args) {
    (void)self;
    const char* fn = "hashes_below";
    PyObject* oo;
    long long start, n, cut;
    unsigned long long k0, k1;
    if (!PyArg_ParseTuple(args, "OLLLKK", &oo, &start, &n, &cut, &k0, &k1)) return NULL;
    if (start < 0 || n < 0 || start + n > (1LL << 31)) {
        PyErr_Format(PyExc_ValueError, "%s: counters %lld to %lld run past 2^31", fn, start, start + n);
        return NULL;
    }
    gs_views v = {.held = 0};
    Py_ssize_t capacity;
    void* o;
    if (gs_take(&v, oo, GS_I64, 1, fn, &capacity, &o)) {
        gs_release(&v);
        return NULL;
    }
    int64_t* out = (int64_t*)o;
    long long count = 0, c = 0;
    Py_BEGIN_ALLOW_THREADS;
#ifdef GS_AVX2
    if (gs_wide() && cut <= INT32_MAX) count = hashes_below_avx2(start, n, (int32_t)(cut < INT32_MIN ? INT32_MIN : cut),
                                                                 (uint32_t)k0, (uint32_t)k1, out, capacity, &c);
#endif
    for (; c < n; c++) {
        uint32_t i = (uint32_t)(start + c);
        uint32_t h = gs_hash(i, (uint32_t)k0, (uint32_t)k1);
        if ((long long)(int32_t)h < cut) {
            if (count < capacity) out[count] = (int64_t)((((uint64_t)(h ^ 0x80000000u)) << 31) + (uint64_t)i);
            count++;
        }
    }
    Py_END_ALLOW_THREADS;
    gs_release(&v);
    return PyLong_FromLongLong(count);
}

/* ---------------------------------------------------------------------------------------------------------------
   Stage statistics (stage_stats.py): one read of a float32 piece, every sum accumulated in float64 (four partial
   sums per quantity, so the additions overlap; the order differs from torch's, within the rounding the catalog
   declares). NaN propagates as in torch's reductions: the caller is told and sets the affected results. */

/* The sum of logarithms without a logarithm per element: for a = m 2^k (m in [1, 2)), sum log a = (sum k) ln 2 +
   log(prod m). The mantissas' product is kept per lane in float64 (each multiplication rounds by at most 2^-53,
   so after N of them log(prod m) is off by at most N 2^-53: about 2e-12 for a block of 65,536 elements, far below
   a float32 logarithm's own rounding, which the reference sums), renormalised into the exponent sum every
   GS_LOG_RENORM steps (prod m < 2^GS_LOG_RENORM stays finite); one libm log per lane at the end. A zero used
   element makes the sum -inf and an infinite one +inf (both: NaN), as the reference's logarithms do. */
#define GS_LOG_RENORM 512

typedef struct {
    double product[4], exponents;
    int zero, inf;
} gs_logsum;

static void gs_logsum_init(gs_logsum* l) {
    for (int j = 0; j < 4; j++) l->product[j] = 1.0;
    l->exponents = 0.0;
    l->zero = l->inf = 0;
}

/* the scalar step: one used magnitude a >= 0 into lane j */
static inline void gs_logsum_add(gs_logsum* l, int j, double a) {
    if (a == 0.0) {
        l->zero = 1;
        return;
    }
    if (isinf(a)) {
        l->inf = 1;
        return;
    }
    int k;
    double m = frexp(a, &k); /* a = m 2^k, m in [1/2, 1) */
    l->product[j] *= m;
    l->exponents += k;
    if (l->product[j] < 1e-150) { /* (far from float64's range: renormalise) */
        l->product[j] = frexp(l->product[j], &k);
        l->exponents += k;
    }
}

/* sum log(a inv_unit) over the used elements: a power-of-two inv_unit joins the exponent sum exactly (an integer),
   so that scaling every a by a power of two and inv_unit by its inverse gives the same sum bit for bit (the fits'
   scale equivariance); another inv_unit adds used * log(inv_unit) */
static double gs_logsum_value(const gs_logsum* l, int64_t used, double inv_unit) {
    if (l->zero || l->inf) return l->zero && l->inf ? NAN : (l->zero ? -INFINITY : INFINITY);
    int e;
    double exponents = l->exponents, rest = 0.0;
    if (frexp(inv_unit, &e) == 0.5)
        exponents += (double)used * (double)(e - 1);
    else
        rest = (double)used * log(inv_unit);
    double logs = exponents * 0.69314718055994530942;
    for (int j = 0; j < 4; j++) logs += log(l->product[j]);
    return logs + rest;
}

#ifdef GS_AVX2
/* the AVX2 step: 4 float64 magnitudes a (finite, nonzero where used), of which the lanes of the mask used count,
   into the product p and the exponent sum k (both per lane); zero and infinity are the callers' to handle */
__attribute__((target("avx2"))) static inline void gs_logsum_step(__m256d a, __m256d used, __m256d* p,
                                                                  __m256d* k) {
    const __m256i mant = _mm256_set1_epi64x(0x000FFFFFFFFFFFFFLL);
    const __m256i one_bits = _mm256_set1_epi64x(0x3FF0000000000000LL);
    const __m256i two52 = _mm256_set1_epi64x(0x4330000000000000LL);
    const __m256d bias = _mm256_set1_pd(4503599627370496.0 + 1023.0), one = _mm256_set1_pd(1.0);
    __m256i bits = _mm256_castpd_si256(a);
    __m256d m = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, mant), one_bits));
    __m256d e = _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(bits, 52), two52)), bias);
    *p = _mm256_mul_pd(*p, _mm256_blendv_pd(one, m, used));
    *k = _mm256_add_pd(*k, _mm256_and_pd(e, used));
}

/* the lanes' products back into [1, 2), their exponents added to k */
__attribute__((target("avx2"))) static inline void gs_logsum_renorm(__m256d* p, __m256d* k) {
    const __m256i mant = _mm256_set1_epi64x(0x000FFFFFFFFFFFFFLL);
    const __m256i one_bits = _mm256_set1_epi64x(0x3FF0000000000000LL);
    const __m256i two52 = _mm256_set1_epi64x(0x4330000000000000LL);
    const __m256d bias = _mm256_set1_pd(4503599627370496.0 + 1023.0);
    __m256i bits = _mm256_castpd_si256(*p);
    *k = _mm256_add_pd(*k, _mm256_sub_pd(_mm256_castsi256_pd(_mm256_or_si256(_mm256_srli_epi64(bits, 52), two52)),
                                         bias));
    *p = _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(bits, mant), one_bits));
}

/* one step of 8 magnitudes (two groups of 4 lanes, each with its mask of used lanes), the products renormalised
   every GS_LOG_RENORM steps (counted in *steps) */
__attribute__((target("avx2"))) static inline void gs_logsum_step8(__m256d a0, __m256d a1, __m256d u0, __m256d u1,
                                                                   __m256d* p0, __m256d* p1, __m256d* k0,
                                                                   __m256d* k1, int64_t* steps) {
    gs_logsum_step(a0, u0, p0, k0);
    gs_logsum_step(a1, u1, p1, k1);
    if (++*steps % GS_LOG_RENORM == 0) {
        gs_logsum_renorm(p0, k0);
        gs_logsum_renorm(p1, k1);
    }
}

/* the AVX2 lanes' state into the scalar one (products multiplied per lane, exponents and flags joined) */
__attribute__((target("avx2"))) static void gs_logsum_join(gs_logsum* l, __m256d p0, __m256d p1, __m256d k0,
                                                           __m256d k1) {
    gs_logsum_renorm(&p0, &k0);
    gs_logsum_renorm(&p1, &k1);
    double a[4], b[4], c[4], d[4];
    _mm256_storeu_pd(a, p0);
    _mm256_storeu_pd(b, p1);
    _mm256_storeu_pd(c, k0);
    _mm256_storeu_pd(d, k1);
    for (int j = 0; j < 4; j++) {
        l->product[j] = a[j] * b[j]; /* each in [1, 2): the product stays in [1, 4) */
        l->exponents += c[j] + d[j];
    }
}
#endif

typedef struct {
    double sum, sumsq;
    int64_t count;
    float lo, hi, lonz;
    int nan;
} gs_summary;

/* the scalar loop, from i to end; NaN elements count as nonzero and are left out of every other result (the AVX2
   loop lets them reach the sums and the logarithms' state instead: the caller replaces those results where the NaN
   flag is set) */
static void summary_scalar(const float* x, int64_t i, int64_t end, int absolute, int extremes, int squares,
                           gs_logsum* logs, gs_summary* r) {
    double s[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};
    for (; i < end; i++) {
        float e = absolute ? fabsf(x[i]) : x[i];
        if (e != e) {
            r->nan = 1;
            r->count++;
            continue;
        }
        double w = (double)e;
        s[i & 3] += w;
        if (squares) q[i & 3] += w * w;
        if (logs && e != 0.0f) gs_logsum_add(logs, (int)(i & 3), w);
        r->count += e != 0.0f;
        if (e > r->hi) r->hi = e;
        if (extremes) {
            if (e < r->lo) r->lo = e;
            if (e != 0.0f && e < r->lonz) r->lonz = e;
        }
    }
    r->sum += (s[0] + s[1]) + (s[2] + s[3]);
    r->sumsq += (q[0] + q[1]) + (q[2] + q[3]);
}

#ifdef GS_AVX2
__attribute__((target("avx2"))) static inline double gs_hsum(__m256d v) {
    double l[4];
    _mm256_storeu_pd(l, v);
    return (l[0] + l[1]) + (l[2] + l[3]);
}

/* 8 float32 per step: |x| by a mask, NaN lanes flagged and counted as nonzero; the sums in two float64
   accumulators of 4 lanes each. NaN lanes are not blended out: they make the sums (and the logarithms' state) NaN
   where the caller sets those results to NaN anyway, and the extremes skip them by operand order (max and min
   return their second operand where the first is NaN). The logarithms (magnitudes only) multiply every lane's
   mantissa into the product -- a zero lane's is exactly 1 -- and add the raw exponent fields as integers, a zero
   lane's being 0, so that the exponent sum is their sum less 1023 per nonzero lane: no mask per lane. The smallest
   nonzero magnitude is the unsigned minimum of the bits less one (non-negative floats order as their bits; zero
   wraps to the largest). Each result is the one the masked forms give, bit for bit. */
__attribute__((target("avx2"), always_inline)) static inline int64_t summary_avx2_body(
    const float* x, int64_t i, int64_t end, const int absolute, const int extremes, const int squares,
    gs_logsum* logs, gs_summary* r) {
    const __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32(absolute ? 0x7fffffff : -1));
    const __m256 zero = _mm256_setzero_ps(), inf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    const __m256i mant = _mm256_set1_epi64x(0x000FFFFFFFFFFFFFLL), one_bits = _mm256_set1_epi64x(0x3FF0000000000000LL);
    const __m256i one32 = _mm256_set1_epi32(1);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), q0 = _mm256_setzero_pd(), q1 = _mm256_setzero_pd();
    const __m256d one = _mm256_set1_pd(1.0);
    __m256d p0 = one, p1 = one, k0 = _mm256_setzero_pd(), k1 = k0;
    __m256i f0 = _mm256_setzero_si256(), f1 = f0; /* the exponent fields of the logarithms' lanes, summed */
    __m256i below = _mm256_set1_epi32(-1);        /* magnitudes: the unsigned minimum of (bits - 1) */
    __m256 lo = inf, hi = ninf, lonz = inf, bad = zero;
    int64_t count = 0, steps = 0;
    for (; i + 8 <= end; i += 8) {
        __m256 e = _mm256_and_ps(_mm256_loadu_ps(x + i), keep);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(e, e, _CMP_UNORD_Q));
        count += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_cmp_ps(e, zero, _CMP_NEQ_UQ)));
        __m256d w0 = _mm256_cvtps_pd(_mm256_castps256_ps128(e)), w1 = _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1));
        s0 = _mm256_add_pd(s0, w0);
        s1 = _mm256_add_pd(s1, w1);
        if (squares) {
            q0 = _mm256_add_pd(q0, _mm256_mul_pd(w0, w0));
            q1 = _mm256_add_pd(q1, _mm256_mul_pd(w1, w1));
        }
        if (logs) {
            __m256i b0 = _mm256_castpd_si256(w0), b1 = _mm256_castpd_si256(w1);
            p0 = _mm256_mul_pd(p0, _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(b0, mant), one_bits)));
            p1 = _mm256_mul_pd(p1, _mm256_castsi256_pd(_mm256_or_si256(_mm256_and_si256(b1, mant), one_bits)));
            f0 = _mm256_add_epi64(f0, _mm256_srli_epi64(b0, 52));
            f1 = _mm256_add_epi64(f1, _mm256_srli_epi64(b1, 52));
            if (++steps % GS_LOG_RENORM == 0) {
                gs_logsum_renorm(&p0, &k0);
                gs_logsum_renorm(&p1, &k1);
            }
        }
        hi = _mm256_max_ps(e, hi);
        if (extremes) {
            if (absolute) {
                below = _mm256_min_epu32(below, _mm256_sub_epi32(_mm256_castps_si256(e), one32));
            } else {
                __m256 isnan = _mm256_cmp_ps(e, e, _CMP_UNORD_Q);
                lo = _mm256_min_ps(e, lo);
                __m256 ok = _mm256_blendv_ps(e, zero, isnan);
                lonz = _mm256_min_ps(lonz, _mm256_blendv_ps(ok, inf, _mm256_cmp_ps(ok, zero, _CMP_EQ_OQ)));
            }
        }
    }
    float l[8], h[8], z[8];
    uint32_t m[8];
    _mm256_storeu_ps(l, lo);
    _mm256_storeu_ps(h, hi);
    _mm256_storeu_ps(z, lonz);
    _mm256_storeu_si256((__m256i*)m, below);
    for (int j = 0; j < 8; j++) {
        if (h[j] > r->hi) r->hi = h[j];
        if (l[j] < r->lo) r->lo = l[j];
        if (z[j] < r->lonz) r->lonz = z[j];
        if (absolute && m[j] != UINT32_MAX) { /* a nonzero magnitude (or NaN, whose result the caller replaces) */
            uint32_t bits = m[j] + 1u;
            float v;
            memcpy(&v, &bits, sizeof v);
            if (v < r->lonz) r->lonz = v;
        }
    }
    if (_mm256_movemask_ps(bad)) r->nan = 1;
    r->count += count;
    r->sum += gs_hsum(_mm256_add_pd(s0, s1));
    r->sumsq += gs_hsum(_mm256_add_pd(q0, q1));
    if (logs) {
        gs_logsum_join(logs, p0, p1, k0, k1);
        int64_t f[8];
        _mm256_storeu_si256((__m256i*)f, f0);
        _mm256_storeu_si256((__m256i*)(f + 4), f1);
        int64_t fields = 0;
        for (int j = 0; j < 8; j++) fields += f[j];
        logs->exponents += (double)(fields - 1023 * count); /* (exact: integers far below 2^53) */
    }
    return i;
}

/* summary_avx2_body with each combination of flags a constant: one loop per combination, holding in registers only
   what that combination reads (a single loop carrying every flag's accumulators spills them to memory) */
__attribute__((target("avx2"))) static int64_t summary_avx2(const float* x, int64_t i, int64_t end, int absolute,
                                                           int extremes, int squares, gs_logsum* logs,
                                                           gs_summary* r) {
#define GS_SUMMARY(a, e, q) \
    return logs ? summary_avx2_body(x, i, end, a, e, q, logs, r) : summary_avx2_body(x, i, end, a, e, q, NULL, r)
    switch ((absolute ? 4 : 0) | (extremes ? 2 : 0) | (squares ? 1 : 0)) {
    case 0: GS_SUMMARY(0, 0, 0);
    case 1: GS_SUMMARY(0, 0, 1);
    case 2: GS_SUMMARY(0, 1, 0);
    case 3: GS_SUMMARY(0, 1, 1);
    case 4: GS_SUMMARY(1, 0, 0);
    case 5: GS_SUMMARY(1, 0, 1);
    case 6: GS_SUMMARY(1, 1, 0);
    default: GS_SUMMARY(1, 1, 1);
    }
#undef GS_SUMMARY
}
#endif

/* The float32 piece x[start:end) of a stage-statistics call: the buffer taken into v and checked, its data in
   *x; on failure an exception is set, nothing is held, and -1 is returned. */
static int gs_float_piece(PyObject* xo, long long start, long long end, const char* fn, gs_views* v,
                          const float** x) {
    Py_ssize_t n;
    void* data;
    if (gs_take(v, xo, GS_F32, 0, fn, &n, &data)) return -1;
    if (start < 0 || start > end || end > (long long)n) {
        PyErr_Format(PyExc_ValueError, "%s: range [%lld, %lld) of %zd elements", fn, start, end, n);
        gs_release(v);
        return -1;
    }
    *x = (const float*)data;
    return 0;
}

/* summary_f32(x, start, end, absolute, extremes, squares, logs=False)
   -> (min v, max v, #(v != 0), sum v, sum v^2, min of the nonzero v, any NaN, sum of log v over the nonzero v) of
   v = |x| (absolute) or x over x[start:end); without extremes the minima are not read (returned as 0 and +inf);
   without squares the sum of squares is not formed (returned as 0); without logs the sum of logarithms is 0 (with
   logs, v are magnitudes: the caller asks for absolute). NaN elements count as nonzero and set the NaN flag; the
   sums, the sum of logarithms and (with extremes) the minima are then meaningless, and the caller replaces them with
   NaN (stage_stats._native_summary); the maximum skips them. A zero extreme's sign is not kept (-0 and +0 compare
   equal and either may come back); no caller tells them apart. */
static PyObject* gs_summary_f32(PyObject* self, PyObject* args) {
    (void)self;
    PyObject* xo;
    long long start, end;
    int absolute, extremes, squares, logs = 0;
    if (!PyArg_ParseTuple(args, "OLLppp|p", &xo, &start, &end, &absolute, &extremes, &squares, &logs)) return NULL;
    gs_views v = {.held = 0};
    const float* data;
    if (gs_float_piece(xo, start, end, "summary_f32", &v, &data)) return NULL;
    gs_summary r = {0.0, 0.0, 0, INFINITY, -INFINITY, INFINITY, 0};
    gs_logsum l;
    gs_logsum_init(&l);
    double sumlog = 0.0;
    Py_BEGIN_ALLOW_THREADS;
    int64_t i = start;
#ifdef GS_AVX2
    if (gs_wide()) i = summary_avx2(data, i, end, absolute, extremes, squares, logs ? &l : NULL, &r);
#endif
    summary_scalar(data, i, end, absolute, extremes, squares, logs ? &l : NULL, &r);
    /* the smallest magnitude is 0 where a zero was read, else the smallest nonzero one (the AVX2 loop reads only
       the latter for magnitudes; NaN elements count as nonzero) */
    if (absolute && extremes) r.lo = end - start > r.count ? 0.0f : r.lonz;
    if (logs) sumlog = r.hi == INFINITY ? INFINITY : gs_logsum_value(&l, 0, 1.0); /* (AVX2 lanes skip the flags) */
    Py_END_ALLOW_THREADS;
    gs_release(&v);
    return Py_BuildValue("ddLdddOd", extremes ? (double)r.lo : 0.0, (double)r.hi, (long long)r.count, r.sum,
                         r.sumsq, extremes ? (double)r.lonz : INFINITY, r.nan ? Py_True : Py_False, sumlog);
}


typedef struct {
    double sum, sumsq, sumlog;
    int64_t count;
} gs_tail;

static void tail_scalar(const float* x, int64_t i, int64_t end, double above, double shift, double inv_unit,
                        int squares, int logs, gs_logsum* l, gs_tail* r) {
    double s[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};
    for (; i < end; i++) {
        double a = (double)fabsf(x[i]);
        int used = a > above;
        double z = used ? (a - shift) * inv_unit : 0.0;
        r->count += used;
        s[i & 3] += z;
        if (squares) q[i & 3] += z * z;
        if (logs && used) gs_logsum_add(l, (int)(i & 3), a);
    }
    r->sum += (s[0] + s[1]) + (s[2] + s[3]);
    r->sumsq += (q[0] + q[1]) + (q[2] + q[3]);
}

#ifdef GS_AVX2

/* 8 float32 per step, compared and shifted in float64 (two groups of 4 lanes); unused lanes (NaN among them)
   blended to 0 before they reach the sums */
__attribute__((target("avx2"), always_inline)) static inline int64_t tail_avx2_body(
    const float* x, int64_t i, int64_t end, double above, double shift, double inv_unit, const int squares,
    const int logs, gs_logsum* l, gs_tail* r) {
    const __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256d va = _mm256_set1_pd(above), vs = _mm256_set1_pd(shift), vu = _mm256_set1_pd(inv_unit);
    const __m256d zero = _mm256_setzero_pd(), one = _mm256_set1_pd(1.0);
    __m256d s0 = zero, s1 = zero, q0 = zero, q1 = zero;
    __m256d p0 = one, p1 = one, k0 = zero, k1 = zero;
    int64_t count = 0, steps = 0;
    for (; i + 8 <= end; i += 8) {
        __m256 e = _mm256_and_ps(_mm256_loadu_ps(x + i), keep);
        __m256d a0 = _mm256_cvtps_pd(_mm256_castps256_ps128(e)), a1 = _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1));
        __m256d u0 = _mm256_cmp_pd(a0, va, _CMP_GT_OQ), u1 = _mm256_cmp_pd(a1, va, _CMP_GT_OQ);
        int m0 = _mm256_movemask_pd(u0), m1 = _mm256_movemask_pd(u1);
        count += __builtin_popcount((unsigned)m0) + __builtin_popcount((unsigned)m1);
        __m256d z0 = _mm256_and_pd(_mm256_mul_pd(_mm256_sub_pd(a0, vs), vu), u0);
        __m256d z1 = _mm256_and_pd(_mm256_mul_pd(_mm256_sub_pd(a1, vs), vu), u1);
        s0 = _mm256_add_pd(s0, z0);
        s1 = _mm256_add_pd(s1, z1);
        if (squares) {
            q0 = _mm256_add_pd(q0, _mm256_mul_pd(z0, z0));
            q1 = _mm256_add_pd(q1, _mm256_mul_pd(z1, z1));
        }
        if (logs && (m0 | m1)) { /* (a step with no used lane adds nothing: skipped) */
            gs_logsum_step8(a0, a1, u0, u1, &p0, &p1, &k0, &k1, &steps);
        }
    }
    r->count += count;
    r->sum += gs_hsum(_mm256_add_pd(s0, s1));
    r->sumsq += gs_hsum(_mm256_add_pd(q0, q1));
    if (logs) gs_logsum_join(l, p0, p1, k0, k1);
    return i;
}

/* tail_avx2_body with its flags constants (see summary_avx2) */
__attribute__((target("avx2"))) static int64_t tail_avx2(const float* x, int64_t i, int64_t end, double above,
                                                        double shift, double inv_unit, int squares, int logs,
                                                        gs_logsum* l, gs_tail* r) {
    if (squares)
        return logs ? tail_avx2_body(x, i, end, above, shift, inv_unit, 1, 1, l, r)
                    : tail_avx2_body(x, i, end, above, shift, inv_unit, 1, 0, l, r);
    return logs ? tail_avx2_body(x, i, end, above, shift, inv_unit, 0, 1, l, r)
                : tail_avx2_body(x, i, end, above, shift, inv_unit, 0, 0, l, r);
}
#endif

/* tail_f32(x, start, end, above, shift, inv_unit, squares, logs=False) -> (n, sum z, sum z^2, sum log z) over the
   elements of x[start:end) with a = |x| > above (float64 comparisons; NaN never used), z = (a - shift) * inv_unit
   in float64, and, with logs (for shift 0), log z = log a + log inv_unit summed through the mantissas' product
   (gs_logsum: within 2e-12 of the float64 sum of exact logarithms per block); without squares the sum of squares
   is not formed (returned as 0), without logs the sum of
   logarithms is 0. */
static PyObject* gs_tail_f32(PyObject* self, PyObject* args) {
    (void)self;
    PyObject* xo;
    long long start, end;
    double above, shift, inv_unit;
    int squares, logs = 0;
    if (!PyArg_ParseTuple(args, "OLLdddp|p", &xo, &start, &end, &above, &shift, &inv_unit, &squares, &logs))
        return NULL;
    gs_views v = {.held = 0};
    const float* data;
    if (gs_float_piece(xo, start, end, "tail_f32", &v, &data)) return NULL;
    gs_tail r = {0.0, 0.0, 0.0, 0};
    gs_logsum l;
    gs_logsum_init(&l);
    Py_BEGIN_ALLOW_THREADS;
    int64_t i = start;
#ifdef GS_AVX2
    /* (the AVX2 logarithms leave zero and infinity to the caller: zeros are used only below a negative bound, and
       an infinite used element makes the sum of z infinite) */
    if (gs_wide() && !(logs && above < 0.0)) i = tail_avx2(data, i, end, above, shift, inv_unit, squares, logs, &l, &r);
#endif
    tail_scalar(data, i, end, above, shift, inv_unit, squares, logs, &l, &r);
    if (logs) r.sumlog = isinf(r.sum) ? (l.zero ? NAN : INFINITY) : gs_logsum_value(&l, r.count, inv_unit);
    Py_END_ALLOW_THREADS;
    gs_release(&v);
    return Py_BuildValue("Lddd", (long long)r.count, r.sum, r.sumsq, r.sumlog);
}

static PyObject* gs_avx2(PyObject* self, PyObject* unused) {
    (void)self;
    (void)unused;
    return PyBool_FromLong(gs_wide());
}

/* set_avx2(allow) -> the previous setting: whether the AVX2 loops may run where the CPU has them */
static PyObject* gs_set_avx2(PyObject* self, PyObject* args) {
    (void)self;
    int allow, before = gs_allow_wide;
    if (!PyArg_ParseTuple(args, "p", &allow)) return NULL;
    gs_allow_wide = allow;
    return PyBool_FromLong(before);
}

static PyMethodDef gs_methods[] = {
    {"select_f32", gs_select_f32, METH_VARARGS, "Threshold compaction of a float32 buffer (see _native.c)."},
    {"select_f64", gs_select_f64, METH_VARARGS, "Threshold compaction of a float64 buffer (see _native.c)."},
    {"quantize_rows", gs_quantize_rows, METH_VARARGS, "Counter-dither int8 codes of float32 rows."},
    {"reconstruct_rows", gs_reconstruct_rows, METH_VARARGS, "Counter-dither float32 reconstruction of int8 rows."},
    {"nested_rows", gs_nested_rows, METH_VARARGS, "NDQSG's nested int8 codes of float32 values."},
    {"nested_estimate", gs_nested_estimate, METH_VARARGS, "NDQSG's float32 estimate from nested codes."},
    {"sample_indices", gs_sample_indices, METH_VARARGS, "Indices drawn with replacement from the counter hash."},
    {"hashes_below", gs_hashes_below, METH_VARARGS, "Random-k's candidates: counters whose hash lies below a cut."},
    {"summary_f32", gs_summary_f32, METH_VARARGS, "Stage statistics: extremes, nonzeros and sums of a float32 piece."},
    {"tail_f32", gs_tail_f32, METH_VARARGS, "Stage statistics: count and sums over |x| > above of a float32 piece."},
    {"avx2", gs_avx2, METH_NOARGS, "Whether the AVX2 loops run (the CPU has AVX2, and set_avx2 allows them)."},
    {"set_avx2", gs_set_avx2, METH_VARARGS, "Allow or forbid the AVX2 loops; returns the previous setting."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef gs_module = {
    PyModuleDef_HEAD_INIT, "_native", "gradstat's C loops on raw buffers (see theory/kernels/native.py).", -1,
    gs_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject* m = PyModule_Create(&gs_module);
    if (m == NULL) return NULL;
    if (PyModule_AddStringConstant(m, "SOURCE_DIGEST", GS_SOURCE_DIGEST) != 0 ||
        PyModule_AddObject(m, "MULTIPLIERS", Py_BuildValue("(kk)", (unsigned long)M0, (unsigned long)M1)) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

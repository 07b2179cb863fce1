/* AVX2 + FMA + F16C CPU kernels. Each lane reproduces the shared numerics header bit for bit:
 * the fp8 / bf16 / fp16 conversions are the same integer sequences, tails use the header. */
#include <immintrin.h>
#include <string.h>

#include "cpu/p2w.h"
#include "cpu/transpose_u8_net.h"
#include "cpu/xte_cpu.h"
#include "numerics/xte_numerics.h"

#define V8 __m256i

static inline __m256 abs8(__m256 x) {
  return _mm256_castsi256_ps(
      _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7FFFFFFF)));
}

/* 8 x fp32 -> 8 fp8 codes in the low byte of each int32 lane (same rule as xte_f32_to_e4m3). */
#define XTE_AI static inline __attribute__((always_inline))

/* fp32 -> fp8 codes (the same values as xte_f32_to_e4m3 / xte_f32_to_e5m2; the exhaustive
 * conversion test proves it), one sequence for normal and subnormal results:
 *   ac = min(|x|, 2^(emax+1))   inf and NaN become 2^(emax+1), which encodes past the max
 *   e  = max(exponent field of ac, emin), M = e + (23 - mbits) << 23 (the fp32 2^(E + 23 - mbits))
 *   y  = ac + M in fp32 (RNE): the ulp of y is the format's quantum at ac (at emin also below
 *        it: the header's subnormal rule), so bits(y) - bits(M) = k = RNE(ac / quantum)
 *   code = k + (E - emin) << mbits, then overflow (min with the largest code the rule allows),
 *   NaN and the sign. */
typedef struct fp8k {
  V8 clamp, emin, madd, dsub, cmax, nanc;
  __m128i dsh;
  int fixnan;
} fp8k;

static inline fp8k fp8k_make(int fmt, int sat) {
  fp8k k;
  int e4 = fmt == XTE_FP8_E4M3;
  int base = e4 ? 121 : 113, mb = e4 ? 3 : 2;
  k.clamp = _mm256_set1_epi32(e4 ? 0x44000000 : 0x47800000); /* 512, 65536 */
  k.emin = _mm256_set1_epi32(base << 23);
  k.madd = _mm256_set1_epi32((23 - mb) << 23);
  k.dsub = _mm256_set1_epi32(base << mb);
  k.dsh = _mm_cvtsi32_si128(23 - mb);
  k.cmax = _mm256_set1_epi32(e4 ? (sat ? 0x7E : 0x7F) : (sat ? 0x7B : 0x7C));
  k.nanc = _mm256_set1_epi32(e4 ? 0x7F : 0x7E);
  k.fixnan = !e4 || sat; /* e4m3 without saturation: NaN already lands on 0x7F */
  return k;
}

/* magnitude code of a = |x| (bits), NaN not handled */
XTE_AI V8 cvt_mag(const fp8k *k, V8 a) {
  V8 ac = _mm256_min_epu32(a, k->clamp);
  V8 e = _mm256_max_epu32(_mm256_and_si256(ac, _mm256_set1_epi32(0x7F800000)), k->emin);
  V8 m = _mm256_add_epi32(e, k->madd);
  V8 d = _mm256_sub_epi32(_mm256_srl_epi32(e, k->dsh), k->dsub);
  V8 y = _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(ac), _mm256_castsi256_ps(m)));
  return _mm256_min_epu32(_mm256_add_epi32(_mm256_sub_epi32(y, m), d), k->cmax);
}

XTE_AI V8 with_sign(V8 r, V8 u) {
  return _mm256_or_si256(r, _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80)));
}

XTE_AI V8 cvt(const fp8k *k, __m256 x) {
  V8 u = _mm256_castps_si256(x);
  V8 a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  V8 r = cvt_mag(k, a);
  if (k->fixnan)
    r = _mm256_blendv_epi8(r, k->nanc, _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000)));
  return with_sign(r, u);
}

/* fp8(x * s) for a NaN-free x and a finite s > 0, from ax = |x|: x * s = sign(x) (ax * s) */
XTE_AI V8 cvt_scaled(const fp8k *k, __m256 x, __m256 ax, __m256 s) {
  return with_sign(cvt_mag(k, _mm256_castps_si256(_mm256_mul_ps(ax, s))), _mm256_castps_si256(x));
}

static inline int pos_finite(float s) {
  return s > 0.0f && s <= 3.40282346638528859812e+38f;
}

/* max of 8 uint32 (for |x| bits: the float max when no NaN; above 0x7F800000 when one is NaN) */
XTE_AI uint32_t hmax_u32(V8 v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4E));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xB1));
  return (uint32_t)_mm_cvtsi128_si32(m);
}

/* four vectors of int32 codes (0..255) -> 32 bytes in order */
static inline void store32(uint8_t *q, V8 r0, V8 r1, V8 r2, V8 r3) {
  V8 p01 = _mm256_packus_epi32(r0, r1);
  V8 p23 = _mm256_packus_epi32(r2, r3);
  V8 b = _mm256_packus_epi16(p01, p23);
  b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256((__m256i *)q, b);
}

static inline void store32nt(uint8_t *q, V8 r0, V8 r1, V8 r2, V8 r3) {
  V8 p01 = _mm256_packus_epi32(r0, r1);
  V8 p23 = _mm256_packus_epi32(r2, r3);
  V8 b = _mm256_packus_epi16(p01, p23);
  b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_stream_si256((__m256i *)q, b);
}

static void load_f32(const void *src, int in_kind, int64_t n, float *dst) {
  int64_t i = 0;
  if (in_kind == XTE_NUM_IN_F32) {
    const float *s = (const float *)src;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(s + i));
    for (; i < n; i++) dst[i] = s[i];
  } else if (in_kind == XTE_NUM_IN_BF16) {
    const uint16_t *s = (const uint16_t *)src;
    for (; i + 8 <= n; i += 8) {
      V8 v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + i)));
      _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) dst[i] = xte_bf16_to_f32(s[i]);
  } else {
    const uint16_t *s = (const uint16_t *)src;
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++) dst[i] = xte_fp16_to_f32(s[i]);
  }
}

static inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}

static float amax(const float *x, int64_t n) {
  /* max_ps(a, acc) returns acc when a is NaN: NaN never wins, as fmaxf */
  __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
  int64_t i = 0;
  float m;
  for (; i + 16 <= n; i += 16) {
    m0 = _mm256_max_ps(abs8(_mm256_loadu_ps(x + i)), m0);
    m1 = _mm256_max_ps(abs8(_mm256_loadu_ps(x + i + 8)), m1);
  }
  for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(abs8(_mm256_loadu_ps(x + i)), m0);
  m = hmax8(_mm256_max_ps(m0, m1));
  for (; i < n; i++) m = xte_amax_update(m, x[i]);
  return m;
}

static void quant(const float *x, int64_t n, float scale, int fmt, int sat, uint8_t *q) {
  fp8k k = fp8k_make(fmt, sat);
  __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    store32(q + i, cvt(&k, _mm256_mul_ps(_mm256_loadu_ps(x + i), s)),
            cvt(&k, _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), s)),
            cvt(&k, _mm256_mul_ps(_mm256_loadu_ps(x + i + 16), s)),
            cvt(&k, _mm256_mul_ps(_mm256_loadu_ps(x + i + 24), s)));
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i] * scale, fmt, sat);
}

static void quant_vs(const float *x, int64_t n, const float *sc, int fmt, int sat, uint8_t *q) {
  fp8k k = fp8k_make(fmt, sat);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    store32(q + i, cvt(&k, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(sc + i))),
            cvt(&k, _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(sc + i + 8))),
            cvt(&k, _mm256_mul_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(sc + i + 16))),
            cvt(&k, _mm256_mul_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(sc + i + 24))));
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i] * sc[i], fmt, sat);
}

static void cast_fp8(const float *x, int64_t n, int fmt, int sat, uint8_t *q) {
  fp8k k = fp8k_make(fmt, sat);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    store32(q + i, cvt(&k, _mm256_loadu_ps(x + i)), cvt(&k, _mm256_loadu_ps(x + i + 8)),
            cvt(&k, _mm256_loadu_ps(x + i + 16)), cvt(&k, _mm256_loadu_ps(x + i + 24)));
  for (; i < n; i++) q[i] = xte_f32_to_fp8(x[i], fmt, sat);
}

/* 8 x fp32 -> bf16 in the low half of each lane (xte_f32_to_bf16) */
static inline V8 cvt_bf16(__m256 x) {
  V8 u = _mm256_castps_si256(x);
  V8 a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  V8 isnan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
  V8 odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  V8 r =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd), 16);
  V8 nanv = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(r, nanv, isnan);
}

static inline V8 cvt_fp16(__m256 x) {
  V8 u = _mm256_castps_si256(x);
  V8 sign = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000));
  V8 a = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  V8 isnan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
  V8 ovf = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x477FEFFF));
  V8 normal = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x387FFFFF));
  V8 odd = _mm256_and_si256(_mm256_srli_epi32(a, 13), _mm256_set1_epi32(1));
  V8 rn =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(0xFFF)), odd), 13);
  V8 nv = _mm256_sub_epi32(rn, _mm256_set1_epi32(112 << 10));
  __m256 y = _mm256_add_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(0.5f));
  V8 sv = _mm256_sub_epi32(_mm256_castps_si256(y), _mm256_set1_epi32(0x3F000000));
  V8 nanv = _mm256_or_si256(_mm256_set1_epi32(0x7E00),
                            _mm256_and_si256(_mm256_srli_epi32(a, 13), _mm256_set1_epi32(0x3FF)));
  V8 r = _mm256_blendv_epi8(sv, nv, normal);
  r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7C00), ovf);
  r = _mm256_blendv_epi8(r, nanv, isnan);
  return _mm256_or_si256(r, sign);
}

static inline void store16x16(uint16_t *y, V8 lo, V8 hi) {
  V8 p = _mm256_packus_epi32(lo, hi);
  p = _mm256_permute4x64_epi64(p, 0xD8);
  _mm256_storeu_si256((__m256i *)y, p);
}

static void cast_bf16(const float *x, int64_t n, uint16_t *y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store16x16(y + i, cvt_bf16(_mm256_loadu_ps(x + i)), cvt_bf16(_mm256_loadu_ps(x + i + 8)));
  for (; i < n; i++) y[i] = xte_f32_to_bf16(x[i]);
}

static void cast_fp16(const float *x, int64_t n, uint16_t *y) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store16x16(y + i, cvt_fp16(_mm256_loadu_ps(x + i)), cvt_fp16(_mm256_loadu_ps(x + i + 8)));
  for (; i < n; i++) y[i] = xte_f32_to_fp16(x[i]);
}

/* 16x16 byte transpose blocks with SSE unpacks; edges scalar. */
static inline void tr16(const uint8_t *s, int64_t lds, uint8_t *d, int64_t ldd) {
  __m128i r[16], t[16];
  int i;
  for (i = 0; i < 16; i++) r[i] = _mm_loadu_si128((const __m128i *)(s + i * lds));
  XTE_TR16_NETWORK(_mm, r, t);
  for (i = 0; i < 16; i++) _mm_storeu_si128((__m128i *)(d + i * ldd), r[i]);
}

static void transpose_u8(const uint8_t *src, int64_t rows, int64_t cols, int64_t lds, uint8_t *dst,
                         int64_t ldd) {
  int64_t r, c, r16 = rows & ~(int64_t)15, c16 = cols & ~(int64_t)15;
  for (r = 0; r < r16; r += 16)
    for (c = 0; c < c16; c += 16) tr16(src + r * lds + c, lds, dst + c * ldd + r, ldd);
  for (r = 0; r < rows; r++)
    for (c = (r < r16 ? c16 : 0); c < cols; c++) dst[c * ldd + r] = src[r * lds + c];
}

/* 64 rows x 16 bytes -> 16 rows of 64 bytes. Two halves of 32 rows: lane q of r[i] is source row
 * 16 q + i, so after the network r[c] is 32 bytes of destination row c; the first half's rows wait
 * in h while the second is transposed, then each destination row is stored whole (both 32-byte
 * halves back to back: a streaming store fills its line before the next line starts). */
static inline void tr64x16(const uint8_t *s, int64_t lds, uint8_t *d, int64_t ldd, int nt) {
  V8 r[16], t[16], h[16];
  int i, k;
  for (k = 0; k < 2; k++) {
    for (i = 0; i < 16; i++)
      r[i] = _mm256_loadu2_m128i((const __m128i *)(s + (32 * k + 16 + i) * lds),
                                 (const __m128i *)(s + (32 * k + i) * lds));
    XTE_TR16_NETWORK(_mm256, r, t);
    if (k == 0)
      for (i = 0; i < 16; i++) h[i] = r[i];
  }
  for (i = 0; i < 16; i++) {
    __m256i *q = (__m256i *)(d + i * ldd);
    if (nt) {
      _mm256_stream_si256(q, h[i]);
      _mm256_stream_si256(q + 1, r[i]);
    } else {
      _mm256_storeu_si256(q, h[i]);
      _mm256_storeu_si256(q + 1, r[i]);
    }
  }
}

/* The transposed copy straight into its destination (no buffer and copy pass): 64-byte rows,
 * streaming stores when nt and the destination rows are 64-byte aligned. Column groups outer: the
 * lines of a destination row leave one right after the other (the memory takes them faster than
 * all first lines, then all second ones) */
static void transpose_nt(const uint8_t *src, int64_t rows, int64_t cols, int64_t lds, uint8_t *dst,
                         int64_t ldd, int nt) {
  const int64_t r64 = rows & ~(int64_t)63, c16 = cols & ~(int64_t)15;
  int64_t r, c;
  nt = nt && !((uintptr_t)dst & 63) && !(ldd & 63);
  for (c = 0; c < c16; c += 16)
    for (r = 0; r < r64; r += 64) tr64x16(src + r * lds + c, lds, dst + c * ldd + r, ldd, nt);
  if (c16 < cols) transpose_u8(src + c16, r64, cols - c16, lds, dst + c16 * ldd, ldd);
  if (r64 < rows) transpose_u8(src + r64 * lds, rows - r64, cols, lds, dst + r64, ldd);
}

/* ---------------------------------------------------------------- fused kernels
 * The bodies take the input kind as a constant (always inlined into one copy per kind). */

XTE_AI __m256 ld8(const void *src, int kind, int64_t i) {
  if (kind == XTE_NUM_IN_F32) return _mm256_loadu_ps((const float *)src + i);
  if (kind == XTE_NUM_IN_BF16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + i))), 16));
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)src + i)));
}

/* the vector layer of cpu/quantize_template.h: 8 fp32 lanes */
#define XQ_W 8
#define xq_f __m256
#define xq_zero() _mm256_setzero_ps()
#define xq_max(a, b) _mm256_max_ps((a), (b))
#define xq_abs(x) abs8(x)
#define xq_ld(p) _mm256_loadu_ps(p)
#define xq_st(p, v) _mm256_storeu_ps((p), (v))
#define xq_ldk(src, kind, i) ld8((src), (kind), (i))
#define xq_hmax(v) hmax8(v)
#define xq_stream_u8(d, s) \
  _mm256_stream_si256((__m256i *)(d), _mm256_loadu_si256((const __m256i *)(s)))
#define xq_w V8
#define xq_wlo(v) \
  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)), 16))
#define xq_whi(v)      \
  _mm256_castsi256_ps( \
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256((v), 1)), 16))

#include "cpu/quantize_template.h"

static float load_amax_r1(const void *src, int in_kind, int64_t n, float *acc) {
  switch (in_kind) {
    case XTE_NUM_IN_F32:
      return load_amax_row(src, XTE_NUM_IN_F32, n, acc);
    case XTE_NUM_IN_BF16:
      return load_amax_row(src, XTE_NUM_IN_BF16, n, acc);
    default:
      return load_amax_row(src, XTE_NUM_IN_F16, n, acc);
  }
}

XTE_AI float load_quant_slow(const void *src, int kind, int64_t n, float scale, int fmt, int sat,
                             uint8_t *q, int nt) {
  fp8k k = fp8k_make(fmt, sat);
  __m256 s = _mm256_set1_ps(scale), m = _mm256_setzero_ps();
  int64_t i = 0;
  float r;
  nt = nt && !((uintptr_t)q & 31);
  for (; i + 32 <= n; i += 32) {
    __m256 x0 = ld8(src, kind, i), x1 = ld8(src, kind, i + 8);
    __m256 x2 = ld8(src, kind, i + 16), x3 = ld8(src, kind, i + 24);
    V8 r0, r1, r2, r3;
    m = _mm256_max_ps(abs8(x0), m);
    m = _mm256_max_ps(abs8(x1), m);
    m = _mm256_max_ps(abs8(x2), m);
    m = _mm256_max_ps(abs8(x3), m);
    r0 = cvt(&k, _mm256_mul_ps(x0, s));
    r1 = cvt(&k, _mm256_mul_ps(x1, s));
    r2 = cvt(&k, _mm256_mul_ps(x2, s));
    r3 = cvt(&k, _mm256_mul_ps(x3, s));
    if (nt)
      store32nt(q + i, r0, r1, r2, r3);
    else
      store32(q + i, r0, r1, r2, r3);
  }
  r = hmax8(m);
  for (; i < n; i++) {
    float x = ld1(src, kind, i);
    r = xte_amax_update(r, x);
    q[i] = xte_f32_to_fp8(x * scale, fmt, sat);
  }
  return r;
}

/* a finite scale > 0: the fast sequence, watching for NaN (then redone the general way) */
XTE_AI float load_quant_body(const void *src, int kind, int64_t n, float scale, int fmt, int sat,
                             uint8_t *q, int nt) {
  fp8k k;
  __m256 s = _mm256_set1_ps(scale);
  V8 mi = _mm256_setzero_si256();
  int64_t i = 0;
  uint32_t mb;
  float r;
  int ntq = nt && !((uintptr_t)q & 31);
  if (!pos_finite(scale)) return load_quant_slow(src, kind, n, scale, fmt, sat, q, nt);
  k = fp8k_make(fmt, sat);
  for (; i + 32 <= n; i += 32) {
    __m256 x0 = ld8(src, kind, i), x1 = ld8(src, kind, i + 8);
    __m256 x2 = ld8(src, kind, i + 16), x3 = ld8(src, kind, i + 24);
    __m256 a0 = abs8(x0), a1 = abs8(x1), a2 = abs8(x2), a3 = abs8(x3);
    V8 r0, r1, r2, r3;
    mi = _mm256_max_epu32(
        mi, _mm256_max_epu32(_mm256_max_epu32(_mm256_castps_si256(a0), _mm256_castps_si256(a1)),
                             _mm256_max_epu32(_mm256_castps_si256(a2), _mm256_castps_si256(a3))));
    r0 = cvt_scaled(&k, x0, a0, s);
    r1 = cvt_scaled(&k, x1, a1, s);
    r2 = cvt_scaled(&k, x2, a2, s);
    r3 = cvt_scaled(&k, x3, a3, s);
    if (ntq)
      store32nt(q + i, r0, r1, r2, r3);
    else
      store32(q + i, r0, r1, r2, r3);
  }
  mb = hmax_u32(mi);
  if (mb > 0x7F800000u) {
    if (ntq) _mm_sfence();
    return load_quant_slow(src, kind, n, scale, fmt, sat, q, nt);
  }
  r = xte_bits_f32(mb);
  for (; i < n; i++) {
    float x = ld1(src, kind, i);
    r = xte_amax_update(r, x);
    q[i] = xte_f32_to_fp8(x * scale, fmt, sat);
  }
  return r;
}

static float load_quant_r1(const void *src, int in_kind, int64_t n, float scale, int fmt, int sat,
                           uint8_t *q, int nt) {
  switch (in_kind) {
    case XTE_NUM_IN_F32:
      return load_quant_body(src, XTE_NUM_IN_F32, n, scale, fmt, sat, q, nt);
    case XTE_NUM_IN_BF16:
      return load_quant_body(src, XTE_NUM_IN_BF16, n, scale, fmt, sat, q, nt);
    default:
      return load_quant_body(src, XTE_NUM_IN_F16, n, scale, fmt, sat, q, nt);
  }
}

XTE_AI void load_quant_vs_slow(const void *src, int kind, int64_t n, const float *sc, int fmt,
                               int sat, uint8_t *q, int nt) {
  fp8k k = fp8k_make(fmt, sat);
  int64_t i = 0;
  nt = nt && !((uintptr_t)q & 31);
  for (; i + 32 <= n; i += 32) {
    V8 r0 = cvt(&k, _mm256_mul_ps(ld8(src, kind, i), _mm256_loadu_ps(sc + i)));
    V8 r1 = cvt(&k, _mm256_mul_ps(ld8(src, kind, i + 8), _mm256_loadu_ps(sc + i + 8)));
    V8 r2 = cvt(&k, _mm256_mul_ps(ld8(src, kind, i + 16), _mm256_loadu_ps(sc + i + 16)));
    V8 r3 = cvt(&k, _mm256_mul_ps(ld8(src, kind, i + 24), _mm256_loadu_ps(sc + i + 24)));
    if (nt)
      store32nt(q + i, r0, r1, r2, r3);
    else
      store32(q + i, r0, r1, r2, r3);
  }
  for (; i < n; i++) q[i] = xte_f32_to_fp8(ld1(src, kind, i) * sc[i], fmt, sat);
}

/* finite scales > 0 (the caller checks): the fast sequence, watching for NaN (then redone the
 * general way) */
XTE_AI void load_quant_vs_body(const void *src, int kind, int64_t n, const float *sc, int fmt,
                               int sat, uint8_t *q, int nt) {
  fp8k k;
  V8 mi = _mm256_setzero_si256();
  int64_t i;
  int ntq = nt && !((uintptr_t)q & 31);
  k = fp8k_make(fmt, sat);
  for (i = 0; i + 32 <= n; i += 32) {
    __m256 x0 = ld8(src, kind, i), x1 = ld8(src, kind, i + 8);
    __m256 x2 = ld8(src, kind, i + 16), x3 = ld8(src, kind, i + 24);
    __m256 a0 = abs8(x0), a1 = abs8(x1), a2 = abs8(x2), a3 = abs8(x3);
    V8 r0, r1, r2, r3;
    mi = _mm256_max_epu32(
        mi, _mm256_max_epu32(_mm256_max_epu32(_mm256_castps_si256(a0), _mm256_castps_si256(a1)),
                             _mm256_max_epu32(_mm256_castps_si256(a2), _mm256_castps_si256(a3))));
    r0 = cvt_scaled(&k, x0, a0, _mm256_loadu_ps(sc + i));
    r1 = cvt_scaled(&k, x1, a1, _mm256_loadu_ps(sc + i + 8));
    r2 = cvt_scaled(&k, x2, a2, _mm256_loadu_ps(sc + i + 16));
    r3 = cvt_scaled(&k, x3, a3, _mm256_loadu_ps(sc + i + 24));
    if (ntq)
      store32nt(q + i, r0, r1, r2, r3);
    else
      store32(q + i, r0, r1, r2, r3);
  }
  if (hmax_u32(mi) > 0x7F800000u) {
    if (ntq) _mm_sfence();
    load_quant_vs_slow(src, kind, n, sc, fmt, sat, q, nt);
    return;
  }
  for (; i < n; i++) q[i] = xte_f32_to_fp8(ld1(src, kind, i) * sc[i], fmt, sat);
}

static void load_quant_vs_r1(const void *src, int in_kind, int64_t n, const float *scale, int fmt,
                             int sat, uint8_t *q, int nt, int fast) {
  switch (in_kind) {
    case XTE_NUM_IN_F32:
      if (fast)
        load_quant_vs_body(src, XTE_NUM_IN_F32, n, scale, fmt, sat, q, nt);
      else
        load_quant_vs_slow(src, XTE_NUM_IN_F32, n, scale, fmt, sat, q, nt);
      break;
    case XTE_NUM_IN_BF16:
      if (fast)
        load_quant_vs_body(src, XTE_NUM_IN_BF16, n, scale, fmt, sat, q, nt);
      else
        load_quant_vs_slow(src, XTE_NUM_IN_BF16, n, scale, fmt, sat, q, nt);
      break;
    default:
      if (fast)
        load_quant_vs_body(src, XTE_NUM_IN_F16, n, scale, fmt, sat, q, nt);
      else
        load_quant_vs_slow(src, XTE_NUM_IN_F16, n, scale, fmt, sat, q, nt);
      break;
  }
}

/* ---------------------------------------------------------------- bf16 words
 * bf16 input in 16-bit lanes with a power-of-two scale (cpu/p2w.h): |x| is the word without its
 * sign bit, and for these the uint16 order is the float order (NaN above 0x7F80), so amaxes are
 * word maxima. */

XTE_AI V8 ldw(const uint16_t *p) {
  return _mm256_loadu_si256((const __m256i *)p);
}

XTE_AI V8 absw(V8 z) {
  return _mm256_and_si256(z, _mm256_set1_epi16(0x7FFF));
}

/* max of 16 uint16 (phminposuw on the complement) */
XTE_AI uint32_t hmax_u16(V8 v) {
  __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_minpos_epu16(_mm_xor_si128(m, _mm_set1_epi32(-1)));
  return ~(uint32_t)_mm_cvtsi128_si32(m) & 0xFFFFu;
}

typedef struct p2wk {
  __m128i sh;
  V8 one, cmax, sgn, mbits;
  __m256 magic;
} p2wk;

static inline p2wk p2wk_make(int fmt, int sat) {
  p2wk w;
  w.sh = _mm_cvtsi32_si128(fmt == XTE_FP8_E4M3 ? 4 : 5);
  w.one = _mm256_set1_epi16(1);
  w.cmax = _mm256_set1_epi16((short)p2w_cmax(fmt, sat));
  w.sgn = _mm256_set1_epi16(0x80);
  w.mbits = _mm256_set1_epi32((int)p2w_magic(fmt));
  w.magic = _mm256_castsi256_ps(w.mbits);
  return w;
}

/* The sign bytes of the words z0, z1 in packus_epi16 order: a word with its sign bit set packs
 * (signed saturation) to 0x80; any other to a byte below 0x80 */
XTE_AI V8 sign_bytes(V8 z0, V8 z1) {
  return _mm256_and_si256(_mm256_packs_epi16(z0, z1), _mm256_set1_epi8((char)0x80));
}

/* The normal-result magnitude codes of the 16 words a = |z| (in the low byte of each word) */
XTE_AI V8 p2w_norm(const p2wk *w, V8 a, V8 d) {
  V8 odd = _mm256_and_si256(_mm256_srl_epi16(a, w->sh), w->one);
  return _mm256_srl_epi16(_mm256_subs_epu16(_mm256_add_epi16(a, odd), d), w->sh);
}

/* r with its lanes lo replaced by the subnormal codes of a (the fma of cpu/p2w.h) */
XTE_AI V8 p2w_sub(const p2wk *w, V8 a, __m256 s_lo, __m256 s_hi, V8 r, V8 lo) {
  V8 ylo = _mm256_castps_si256(_mm256_fmadd_ps(
      _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), a)), s_lo, w->magic));
  V8 yhi = _mm256_castps_si256(_mm256_fmadd_ps(
      _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), a)), s_hi, w->magic));
  return _mm256_blendv_epi8(
      r, _mm256_packus_epi32(_mm256_sub_epi32(ylo, w->mbits), _mm256_sub_epi32(yhi, w->mbits)), lo);
}

/* The codes (sign included) of the 32 words z0, z1 as bytes in packus_epi16 order. Per half:
 * d, t p2w_d and p2w_t per lane (t < 0x8000, so a signed compare is the unsigned one); s_lo /
 * s_hi the lanes' scales as fp32 in unpack order (words 0-3, 8-11 and 4-7, 12-15). Lanes |w| < t
 * by the fma, for P2W_SUB_RARE only when one of the 32 has it (one test). clamp 0: the caller
 * knows that no |x| s exceeds the format's largest finite value (then no code passes cmax). */
XTE_AI V8 p2w_codes(const p2wk *w, V8 z0, V8 d0, V8 t0, __m256 sl0, __m256 sh0, V8 z1, V8 d1, V8 t1,
                    __m256 sl1, __m256 sh1, int clamp, int sub) {
  const V8 a0 = absw(z0), a1 = absw(z1);
  const V8 lo0 = _mm256_cmpgt_epi16(t0, a0), lo1 = _mm256_cmpgt_epi16(t1, a1);
  V8 r0 = p2w_norm(w, a0, d0), r1 = p2w_norm(w, a1, d1), lo;
  if (clamp) {
    r0 = _mm256_min_epu16(r0, w->cmax);
    r1 = _mm256_min_epu16(r1, w->cmax);
  }
  lo = _mm256_or_si256(lo0, lo1);
  if (sub == P2W_SUB_ALWAYS || !_mm256_testz_si256(lo, lo)) {
    r0 = p2w_sub(w, a0, sl0, sh0, r0, lo0);
    r1 = p2w_sub(w, a1, sl1, sh1, r1, lo1);
  }
  return _mm256_or_si256(sign_bytes(z0, z1), _mm256_packus_epi16(r0, r1));
}

/* p2w_codes under one scale (d, t, s broadcast) */
XTE_AI V8 p2w_codes1(const p2wk *w, V8 z0, V8 z1, V8 d, V8 t, __m256 s, int clamp, int sub) {
  return p2w_codes(w, z0, d, t, s, s, z1, d, t, s, s, clamp, sub);
}

/* fp32 on bf16 words rounded to odd (the high half, the low bit set when the low half is not
 * zero: cpu/p2w.h): they round at the fp8 precision or the subnormal quantum as x itself does.
 * 2 x 8 fp32 -> 16 words rounded to odd, in each 128-bit lane L elements 4L..4L+3 of x0 then of
 * x1 (the packus order; store32's permutation puts the codes back in order) */
XTE_AI V8 rto_words(V8 x0, V8 x1) {
  /* min_epu16 with 1 per 32-bit lane: the high word 0, the low word 1 when it is not zero */
  const V8 one = _mm256_set1_epi32(1);
  return _mm256_packus_epi32(_mm256_or_si256(_mm256_srli_epi32(x0, 16), _mm256_min_epu16(x0, one)),
                             _mm256_or_si256(_mm256_srli_epi32(x1, 16), _mm256_min_epu16(x1, one)));
}

/* The 32 words of elements 16 i .. 16 i + 31 of the row p: bf16 words, or (f32) the words rounded
 * to odd of the fp32 values, in packus order */
XTE_AI void ldw32(const char *p, int i, int f32, V8 *z0, V8 *z1) {
  if (f32) {
    const __m256i *x = (const __m256i *)(p + 64 * i);
    *z0 = rto_words(_mm256_loadu_si256(x), _mm256_loadu_si256(x + 1));
    *z1 = rto_words(_mm256_loadu_si256(x + 2), _mm256_loadu_si256(x + 3));
  } else {
    *z0 = ldw((const uint16_t *)p + 16 * i);
    *z1 = ldw((const uint16_t *)p + 16 * i + 16);
  }
}

XTE_AI void p2w_st(uint8_t *q, V8 b, int nt) {
  if (nt)
    _mm256_stream_si256((__m256i *)q, b);
  else
    _mm256_storeu_si256((__m256i *)q, b);
}

/* p2w_codes' bytes of bf16 words in order (the 64-bit quarters) */
XTE_AI V8 p2w_order(V8 b) {
  return _mm256_permute4x64_epi64(b, 0xD8);
}

/* bf16 rows (f32 0) or fp32 rows (f32 1: on words rounded to odd, the amax from the fp32 values),
 * n % 32 == 0, one power-of-two scale (p2w_ok), the codes to q and, when q2 is not NULL, also to
 * q2 (row stride ldq2, cached stores); returns 0 when a NaN was seen (the caller redoes the rows
 * the general way), else 1 with *amax set */
XTE_AI int load_quant_p2w(const void *src, int64_t lds, int64_t rows, int64_t n, float scale,
                          int fmt, int sat, uint8_t *q, int64_t ldq, int nt, uint8_t *q2,
                          int64_t ldq2, float *amax, int f32) {
  const p2wk w = p2wk_make(fmt, sat);
  const V8 d = _mm256_set1_epi16((short)p2w_d(scale, fmt));
  const V8 t = _mm256_set1_epi16((short)p2w_t(scale, fmt));
  const V8 am = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256 s = _mm256_set1_ps(scale);
  V8 mi = _mm256_setzero_si256();
  uint32_t mb;
  int64_t r, i;
  for (r = 0; r < rows; r++)
    for (i = 0; i + 32 <= n; i += 32) {
      V8 z0, z1, b;
      if (f32) {
        const __m256i *x = (const __m256i *)((const float *)src + r * lds + i);
        const V8 x0 = _mm256_loadu_si256(x), x1 = _mm256_loadu_si256(x + 1);
        const V8 x2 = _mm256_loadu_si256(x + 2), x3 = _mm256_loadu_si256(x + 3);
        z0 = rto_words(x0, x1);
        z1 = rto_words(x2, x3);
        mi = _mm256_max_epu32(
            mi,
            _mm256_max_epu32(_mm256_max_epu32(_mm256_and_si256(x0, am), _mm256_and_si256(x1, am)),
                             _mm256_max_epu32(_mm256_and_si256(x2, am), _mm256_and_si256(x3, am))));
      } else {
        z0 = ldw((const uint16_t *)src + r * lds + i);
        z1 = ldw((const uint16_t *)src + r * lds + i + 16);
        mi = _mm256_max_epu16(mi, _mm256_max_epu16(absw(z0), absw(z1)));
      }
      b = p2w_codes1(&w, z0, z1, d, t, s, 1, P2W_SUB_ALWAYS);
      /* in order: the 64-bit quarters (bf16 words), the 32-bit groups of rto_words (fp32) */
      b = f32 ? _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
              : _mm256_permute4x64_epi64(b, 0xD8);
      p2w_st(q + r * ldq + i, b, nt);
      if (q2) _mm256_storeu_si256((__m256i *)(q2 + r * ldq2 + i), b);
    }
  mb = f32 ? hmax_u32(mi) : hmax_u16(mi) << 16;
  if (mb > 0x7F800000u) {
    if (nt) _mm_sfence();
    return 0;
  }
  *amax = xte_bits_f32(mb);
  return 1;
}

/* bf16 rows, n % 32 == 0, n <= 256, per-column power-of-two scales (all p2w_ok); 0 when a NaN was
 * seen (the caller redoes the rows) */
static int load_quant_vs_p2w(const uint16_t *p, int64_t lds, int64_t rows, int64_t n,
                             const float *sc, int fmt, int sat, uint8_t *q, int64_t ldq, int nt) {
  const p2wk w = p2wk_make(fmt, sat);
  _Alignas(32) uint16_t pd[256], pt[256];
  _Alignas(32) float sl[256], sh[256];
  V8 mi = _mm256_setzero_si256();
  int64_t r, i, j;
  for (i = 0; i < n; i++) {
    pd[i] = p2w_d(sc[i], fmt);
    pt[i] = p2w_t(sc[i], fmt);
  }
  for (i = 0; i < n; i += 16)
    for (j = 0; j < 4; j++) {
      sl[i / 2 + j] = sc[i + j];
      sl[i / 2 + 4 + j] = sc[i + 8 + j];
      sh[i / 2 + j] = sc[i + 4 + j];
      sh[i / 2 + 4 + j] = sc[i + 12 + j];
    }
  for (r = 0; r < rows; r++)
    for (i = 0; i + 32 <= n; i += 32) {
      V8 z0 = ldw(p + r * lds + i), z1 = ldw(p + r * lds + i + 16);
      mi = _mm256_max_epu16(mi, _mm256_max_epu16(absw(z0), absw(z1)));
      p2w_st(q + r * ldq + i,
             p2w_order(p2w_codes(
                 &w, z0, _mm256_load_si256((const __m256i *)(pd + i)),
                 _mm256_load_si256((const __m256i *)(pt + i)), _mm256_load_ps(sl + i / 2),
                 _mm256_load_ps(sh + i / 2), z1, _mm256_load_si256((const __m256i *)(pd + i + 16)),
                 _mm256_load_si256((const __m256i *)(pt + i + 16)), _mm256_load_ps(sl + i / 2 + 8),
                 _mm256_load_ps(sh + i / 2 + 8), 1, P2W_SUB_ALWAYS)),
             nt);
    }
  if (hmax_u16(mi) > 0x7F80u) {
    if (nt) _mm_sfence();
    return 0;
  }
  return 1;
}

#define ROW(p, r, ld, es) ((const char *)(p) + (size_t)(r) * (size_t)(ld) * (es))

static float load_amax(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                       float *acc) {
  const size_t es = in_kind == XTE_NUM_IN_F32 ? 4 : 2;
  float m = 0.0f;
  int64_t r, i;
  if (in_kind == XTE_NUM_IN_BF16 && !acc && n % 32 == 0) { /* word maxima (a NaN: the float way) */
    V8 m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
    uint32_t mb;
    for (r = 0; r < rows; r++) {
      const uint16_t *p = (const uint16_t *)src + r * lds;
      for (i = 0; i < n; i += 32) {
        m0 = _mm256_max_epu16(m0, absw(ldw(p + i)));
        m1 = _mm256_max_epu16(m1, absw(ldw(p + i + 16)));
      }
    }
    mb = hmax_u16(_mm256_max_epu16(m0, m1));
    if (mb <= 0x7F80u) return xte_bits_f32(mb << 16);
  }
  if (in_kind == XTE_NUM_IN_F32 && !acc && n % 16 == 0) { /* the same on fp32 bits */
    const V8 am = _mm256_set1_epi32(0x7FFFFFFF);
    V8 m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
    uint32_t mb;
    for (r = 0; r < rows; r++) {
      const __m256i *p = (const __m256i *)((const float *)src + r * lds);
      for (i = 0; i < n / 8; i += 2) {
        m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256(p + i), am));
        m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256(p + i + 1), am));
      }
    }
    mb = hmax_u32(_mm256_max_epu32(m0, m1));
    if (mb <= 0x7F800000u) return xte_bits_f32(mb);
  }
  for (r = 0; r < rows; r++) m = xte_fmaxf(m, load_amax_r1(ROW(src, r, lds, es), in_kind, n, acc));
  return m;
}

static float load_quant(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                        float scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt) {
  const size_t es = in_kind == XTE_NUM_IN_F32 ? 4 : 2;
  float m = 0.0f;
  int64_t r;
  nt = nt && !(ldq & 31) && !((uintptr_t)q & 31);
  if (in_kind == XTE_NUM_IN_BF16 && n % 32 == 0 && p2w_ok(scale) &&
      load_quant_p2w(src, lds, rows, n, scale, fmt, sat, q, ldq, nt, NULL, 0, &m, 0))
    return m;
  if (in_kind == XTE_NUM_IN_F32 && n % 32 == 0 && p2w_ok(scale) &&
      load_quant_p2w(src, lds, rows, n, scale, fmt, sat, q, ldq, nt, NULL, 0, &m, 1))
    return m;
  for (r = 0; r < rows; r++)
    m = xte_fmaxf(
        m, load_quant_r1(ROW(src, r, lds, es), in_kind, n, scale, fmt, sat, q + r * ldq, nt));
  return m;
}

static int load_quant_dup(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                          float scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt,
                          uint8_t *q2, int64_t ldq2, float *amax) {
  nt = nt && !(ldq & 31) && !((uintptr_t)q & 31);
  if (in_kind == XTE_NUM_IN_F16 || n % 32 != 0 || !p2w_ok(scale)) return 0;
  return in_kind == XTE_NUM_IN_F32
             ? load_quant_p2w(src, lds, rows, n, scale, fmt, sat, q, ldq, nt, q2, ldq2, amax, 1)
             : load_quant_p2w(src, lds, rows, n, scale, fmt, sat, q, ldq, nt, q2, ldq2, amax, 0);
}

static void load_quant_vs(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                          const float *scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt) {
  const size_t es = in_kind == XTE_NUM_IN_F32 ? 4 : 2;
  int64_t r, i;
  int fast = 1, p2 = in_kind == XTE_NUM_IN_BF16 && n % 32 == 0 && n <= 256;
  for (i = 0; i < n; i++) {
    fast &= pos_finite(scale[i]);
    p2 &= p2w_ok(scale[i]);
  }
  nt = nt && !(ldq & 31);
  if (p2 && load_quant_vs_p2w((const uint16_t *)src, lds, rows, n, scale, fmt, sat, q, ldq,
                              nt && !((uintptr_t)q & 31)))
    return;
  for (r = 0; r < rows; r++)
    load_quant_vs_r1(ROW(src, r, lds, es), in_kind, n, scale, fmt, sat, q + r * ldq, nt, fast);
}

/* The TE recipes (xte_scale_te: TE_CURRENT, TE_BLOCK) 8 blocks at a time, lane by lane the
 * header's steps */
typedef struct tesk {
  __m256 eps, fmax, dmax, one, inf;
  int pow2;
} tesk;

static inline tesk tesk_make(const xte_quant_args *a) {
  tesk c;
  c.eps = _mm256_set1_ps(a->eps);
  c.fmax = _mm256_set1_ps(xte_fp8_max(a->fmt));
  c.dmax = _mm256_set1_ps(xte_quant_te_inf_scale(a));
  c.one = _mm256_set1_ps(1.0f);
  c.inf = _mm256_castsi256_ps(_mm256_set1_epi32(0x7F800000));
  c.pow2 = xte_quant_te_pow2(a);
  return c;
}

/* the scales of the 8 amaxes v */
XTE_AI __m256 te_scale8(const tesk *c, __m256 v) {
  __m256 q, deg;
  v = _mm256_blendv_ps(v, c->eps, _mm256_cmp_ps(v, c->eps, _CMP_LT_OQ));
  deg = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(abs8(v), c->inf, _CMP_EQ_OQ),
                                  _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ)),
                     _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  q = _mm256_div_ps(c->fmax, v);
  q = _mm256_blendv_ps(q, c->dmax, _mm256_cmp_ps(abs8(q), c->inf, _CMP_EQ_OQ));
  if (c->pow2)
    q = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_castps_si256(q), _mm256_set1_epi32((int)0xFF800000)));
  return _mm256_blendv_ps(q, c->one, deg);
}

/* s[0..n) from the scale vector q */
XTE_AI void store_scales8(xte_block_scale *s, __m256 q, __m256 one, int n) {
  _Alignas(32) float sc[8], si[8];
  int j;
  _mm256_store_ps(sc, q);
  _mm256_store_ps(si, _mm256_div_ps(one, q));
  for (j = 0; j < n; j++) {
    s[j].scale = sc[j];
    s[j].scale_inv = si[j];
    s[j].e8m0 = 0;
  }
}

/* The TE scales of the n <= 8 amaxes am (8 initialized floats readable) into s (their values into
 * f, their word-path parameters p2w_d / p2w_t into d / t: 8 entries of f, d, t written whatever n);
 * their p2w_ok lanes and whether some amax times its scale passes fmax (exact for 2^k scales)
 * folded into *ok / *over; returns the amaxes (0 in lanes past n) */
XTE_AI __m256 te_params8(const tesk *c, const float *am, int n, int fmt, xte_block_scale *s,
                         float *f, uint16_t *d, uint16_t *t, int *ok, int *over) {
  const int lanes = (1 << n) - 1;
  const V8 m = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const V8 lo16 = _mm256_set1_epi32(0xFFFF);
  const __m256 v = _mm256_and_ps(_mm256_loadu_ps(am), _mm256_castsi256_ps(m)), q = te_scale8(c, v);
  const V8 u = _mm256_castps_si256(q), e = _mm256_srli_epi32(u, 23);
  const V8 kk = _mm256_sub_epi32(e, _mm256_set1_epi32(127));
  const V8 bad = _mm256_or_si256(
      _mm256_xor_si256(_mm256_cmpeq_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFF)),
                                          _mm256_setzero_si256()),
                       _mm256_set1_epi32(-1)),
      _mm256_or_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32((int)P2W_EXP_MIN), e),
                      _mm256_cmpgt_epi32(e, _mm256_set1_epi32((int)P2W_EXP_MAX))));
  const V8 dd = _mm256_sub_epi32(_mm256_set1_epi32(p2w_d0(fmt)), _mm256_slli_epi32(kk, 7));
  const V8 tt = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(p2w_t0(fmt)), kk), 7);
  *ok &= (_mm256_movemask_ps(_mm256_castsi256_ps(bad)) & lanes) == 0;
  *over |=
      (_mm256_movemask_ps(_mm256_cmp_ps(_mm256_mul_ps(v, q), c->fmax, _CMP_NLE_UQ)) & lanes) != 0;
  _mm256_storeu_ps(f, q);
  /* the low 16 bits of each lane (the casts of p2w_d / p2w_t) */
  _mm_storeu_si128((__m128i *)d, _mm256_castsi256_si128(_mm256_permute4x64_epi64(
                                     _mm256_packus_epi32(_mm256_and_si256(dd, lo16), lo16), 0xD8)));
  _mm_storeu_si128((__m128i *)t, _mm256_castsi256_si128(_mm256_permute4x64_epi64(
                                     _mm256_packus_epi32(_mm256_and_si256(tt, lo16), lo16), 0xD8)));
  store_scales8(s, q, c->one, n);
  return v;
}

/* The TE recipes through te_scale8; the others through the header. */
static void block_scales(const xte_quant_args *a, const float *amax, int64_t n,
                         xte_block_scale *s) {
  int64_t i = 0;
  if (xte_quant_is_te(a)) {
    const tesk c = tesk_make(a);
    for (; i + 8 <= n; i += 8)
      store_scales8(s + i, te_scale8(&c, _mm256_loadu_ps(amax + i)), c.one, 8);
  }
  for (; i < n; i++) s[i] = xte_quant_block_scale(a, amax[i]);
}

/* the block-group quantizers, both copies in one read and the 128x128 runs:
 * cpu/avx2/quantize_avx2_blocks.h */
#include "cpu/avx2/quantize_avx2_blocks.h"

static void store_fence(void) {
  _mm_sfence();
}

const xte_quant_kernels xte_quant_kernels_avx2 = {
    XTE_CPU_ISA_AVX2, load_f32,       amax,         amax_cols,    quant,       quant_vs,
    cast_fp8,         cast_bf16,      cast_fp16,    transpose_u8, load_amax,   load_quant,
    load_quant_vs,    quant_blocks,   block_scales, copy_u8,      store_fence, quant_rc,
    transpose_nt,     load_quant_dup, quant_sq_run};

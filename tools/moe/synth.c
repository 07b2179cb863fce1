/* The synthetic data of `xte moe` (see synth.h): vectorized, threaded fills of the
 * counter-based streams and the strip-wise generation + quantization of the expert weights. */
#include "synth.h"

#include <math.h>
#include <string.h>

#include "bench_common.h"

float moe_w_scale(int64_t fan_in) {
  return (float)sqrt(3.0 / (double)fan_in);
}

/* ---------------------------------------------------------------- fill kernels
 * One loop body, compiled for AVX-512 (64-bit multiplies in vector registers: vpmullq), AVX2
 * and plain x86-64 / other CPUs; the compiler vectorizes it. All integer arithmetic plus an exact
 * conversion and one fp32 multiply: the same bits from every version. */

enum { D_F32, D_F64, D_BF16 };

static inline __attribute__((always_inline)) void fill_body(void *out, int kind, size_t n,
                                                            uint64_t key, uint64_t i0, float a) {
  size_t i;
  if (kind == D_F32) {
    float *p = (float *)out;
    for (i = 0; i < n; i++) p[i] = moe_synth(key, i0 + i, a);
  } else if (kind == D_F64) {
    double *p = (double *)out;
    for (i = 0; i < n; i++) p[i] = (double)moe_synth(key, i0 + i, a);
  } else {
    uint16_t *p = (uint16_t *)out;
    for (i = 0; i < n; i++) p[i] = xte_f32_to_bf16(moe_synth(key, i0 + i, a));
  }
}

static void fill_generic(void *out, int kind, size_t n, uint64_t key, uint64_t i0, float a) {
  fill_body(out, kind, n, key, i0, a);
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define MOE_FILL_X86 1
__attribute__((target("avx2"))) static void fill_avx2(void *out, int kind, size_t n, uint64_t key,
                                                      uint64_t i0, float a) {
  fill_body(out, kind, n, key, i0, a);
}

__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))) static void fill_avx512(
    void *out, int kind, size_t n, uint64_t key, uint64_t i0, float a) {
  fill_body(out, kind, n, key, i0, a);
}
#endif

typedef void (*fill_fn)(void *, int, size_t, uint64_t, uint64_t, float);

/* The widest kernel the CPU runs, capped by the library's ISA (xte_cpu_get_isa(): --isa scalar
 * runs the plain C here too). 0 plain C, 1 AVX2, 2 AVX-512 (F/DQ/VL/BW), 3 AVX-512 + VBMI. */
static int fill_level(void) {
#ifdef MOE_FILL_X86
  xte_cpu_isa isa = xte_cpu_get_isa();
  __builtin_cpu_init();
  if (isa == XTE_CPU_ISA_SCALAR || !__builtin_cpu_supports("avx2")) return 0;
  if (isa == XTE_CPU_ISA_AVX2 || !__builtin_cpu_supports("avx512f") ||
      !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("avx512vl") ||
      !__builtin_cpu_supports("avx512bw"))
    return 1;
  return __builtin_cpu_supports("avx512vbmi") ? 3 : 2;
#else
  return 0;
#endif
}

static fill_fn pick_fill(void) {
#ifdef MOE_FILL_X86
  int lv = fill_level();
  if (lv >= 2) return fill_avx512;
  if (lv == 1) return fill_avx2;
#endif
  return fill_generic;
}

/* ---------------------------------------------------------------- threaded fills */

typedef struct fill_job {
  fill_fn fn;
  char *out;
  size_t esize, n;
  int kind;
  uint64_t key, i0; /* elements i0 .. i0 + n of the stream */
  float a;
} fill_job;

static void fill_part(void *ctx, int t, int nt) {
  const fill_job *j = (const fill_job *)ctx;
  /* parts of whole 64-byte lines, so that no two threads write one line */
  size_t per_line = 64 / j->esize, lines = (j->n + per_line - 1) / per_line;
  size_t lo = lines * (size_t)t / (size_t)nt * per_line;
  size_t hi = lines * (size_t)(t + 1) / (size_t)nt * per_line;
  if (hi > j->n) hi = j->n;
  if (lo < hi) j->fn(j->out + lo * j->esize, j->kind, hi - lo, j->key, j->i0 + lo, j->a);
}

static void fill_any(void *p, int kind, size_t esize, size_t n, uint64_t seed, uint64_t stream,
                     float a) {
  fill_job j;
  j.fn = pick_fill();
  j.out = (char *)p;
  j.esize = esize;
  j.n = n;
  j.kind = kind;
  j.key = moe_stream_key(seed, stream);
  j.i0 = 0;
  j.a = a;
  if (n < ((size_t)1 << 16))
    fill_part(&j, 0, 1);
  else
    xte_bench_team_run(fill_part, &j);
}

void moe_fill_f32(float *p, size_t n, uint64_t seed, uint64_t stream, float a) {
  fill_any(p, D_F32, 4, n, seed, stream, a);
}
void moe_fill_f64(double *p, size_t n, uint64_t seed, uint64_t stream, float a) {
  fill_any(p, D_F64, 8, n, seed, stream, a);
}
void moe_fill_bf16(uint16_t *p, size_t n, uint64_t seed, uint64_t stream, float a) {
  fill_any(p, D_BF16, 2, n, seed, stream, a);
}

/* ---------------------------------------------------------------- expert weights
 * FP8 codes straight from the hash (synth.h): one 64-bit hash per 8 codes, each byte mapped
 * through the 128-level table with its top bit as the sign. */

#define GOLDEN 0x9E3779B97F4A7C15ull

uint8_t moe_e4m3_level(unsigned j) {
  return xte_f32_to_e4m3(((float)(j & 127u) + 0.5f) * 3.5f, 1);
}

typedef struct code_lut {
  uint8_t b[128];
} code_lut;

static void lut_init(code_lut *t) {
  unsigned j;
  for (j = 0; j < 128; j++) t->b[j] = moe_e4m3_level(j);
}

/* Words [w0, w0 + nw) of the stream with this key into out (8 codes each). */
static inline __attribute__((always_inline)) void codes_body(uint8_t *out, size_t nw, uint64_t key,
                                                             uint64_t w0, const code_lut *t) {
  size_t w;
  int b;
  for (w = 0; w < nw; w++) {
    uint64_t z = moe_mix64(key + (w0 + w) * GOLDEN);
    for (b = 0; b < 8; b++) {
      unsigned u = (unsigned)(z >> (8 * b)) & 255u;
      out[8 * w + (size_t)b] = (uint8_t)(t->b[u & 127u] | (u & 128u));
    }
  }
}

static void codes_generic(uint8_t *out, size_t nw, uint64_t key, uint64_t w0, const code_lut *t) {
  codes_body(out, nw, key, w0, t);
}

#ifdef MOE_FILL_X86
#include <immintrin.h>
/* a * c mod 2^64 in 64-bit lanes from 32 x 32 -> 64 products (AVX2 has no vpmullq). */
__attribute__((target("avx2"))) static inline __m256i mul64_avx2(__m256i a, __m256i clo,
                                                                 __m256i chi) {
  __m256i lo = _mm256_mul_epu32(a, clo);
  __m256i cross =
      _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), clo), _mm256_mul_epu32(a, chi));
  return _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32));
}

/* 4 words (32 codes) per step: the hash in 64-bit lanes, the 128-entry table as 8 vpshufb of
 * 16 entries each, picked by bits 4..6 of the byte (bit 7 is the sign, or-ed in after). */
__attribute__((target("avx2"))) static void codes_avx2(uint8_t *out, size_t nw, uint64_t key,
                                                       uint64_t w0, const code_lut *t) {
  const __m256i c1lo = _mm256_set1_epi64x((long long)(0xBF58476D1CE4E5B9ull & 0xFFFFFFFFu));
  const __m256i c1hi = _mm256_set1_epi64x((long long)(0xBF58476D1CE4E5B9ull >> 32));
  const __m256i c2lo = _mm256_set1_epi64x((long long)(0x94D049BB133111EBull & 0xFFFFFFFFu));
  const __m256i c2hi = _mm256_set1_epi64x((long long)(0x94D049BB133111EBull >> 32));
  const __m256i step = _mm256_set1_epi64x((long long)(4 * GOLDEN));
  const __m256i sign = _mm256_set1_epi8((char)0x80), low4 = _mm256_set1_epi8(0x0F);
  __m256i tb[8], z0;
  size_t w = 0;
  int i;
  for (i = 0; i < 8; i++)
    tb[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(t->b + 16 * i)));
  z0 = _mm256_set_epi64x((long long)(key + (w0 + 3) * GOLDEN), (long long)(key + (w0 + 2) * GOLDEN),
                         (long long)(key + (w0 + 1) * GOLDEN), (long long)(key + w0 * GOLDEN));
  for (; w + 4 <= nw; w += 4) {
    __m256i z = z0, lo, hi, c = _mm256_setzero_si256();
    z = mul64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), c1lo, c1hi);
    z = mul64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), c2lo, c2hi);
    z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
    lo = _mm256_and_si256(z, low4);
    hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), _mm256_set1_epi8(0x07));
    for (i = 0; i < 8; i++)
      c = _mm256_or_si256(c, _mm256_and_si256(_mm256_cmpeq_epi8(hi, _mm256_set1_epi8((char)i)),
                                              _mm256_shuffle_epi8(tb[i], lo)));
    c = _mm256_or_si256(c, _mm256_and_si256(z, sign));
    _mm256_storeu_si256((__m256i *)(void *)(out + 8 * w), c);
    z0 = _mm256_add_epi64(z0, step);
  }
  if (w < nw) codes_body(out + 8 * w, nw - w, key, w0 + w, t);
}

/* 8 words (64 codes) per step: the hash in 64-bit lanes (vpmullq), the table by vpermi2b (its
 * index uses the low 7 bits of each byte: bit 7 is the sign, or-ed in after). */
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx512vbmi"))) static void codes_vbmi(
    uint8_t *out, size_t nw, uint64_t key, uint64_t w0, const code_lut *t) {
  const __m512i lo = _mm512_loadu_si512((const void *)t->b);
  const __m512i hi = _mm512_loadu_si512((const void *)(t->b + 64));
  const __m512i c1 = _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ull);
  const __m512i c2 = _mm512_set1_epi64((long long)0x94D049BB133111EBull);
  const __m512i step = _mm512_set1_epi64((long long)(8 * GOLDEN));
  const __m512i sign = _mm512_set1_epi8((char)0x80);
  __m512i z0 = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  size_t w = 0;
  z0 = _mm512_add_epi64(_mm512_set1_epi64((long long)w0), z0);
  z0 = _mm512_add_epi64(_mm512_set1_epi64((long long)key),
                        _mm512_mullo_epi64(z0, _mm512_set1_epi64((long long)GOLDEN)));
  for (; w + 8 <= nw; w += 8) {
    __m512i z = z0, c;
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), c1);
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), c2);
    z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
    c = _mm512_permutex2var_epi8(lo, z, hi);
    c = _mm512_ternarylogic_epi32(c, z, sign, 0xF8); /* c | (z & sign) */
    _mm512_storeu_si512((void *)(out + 8 * w), c);
    z0 = _mm512_add_epi64(z0, step);
  }
  if (w < nw) codes_body(out + 8 * w, nw - w, key, w0 + w, t);
}
#endif

typedef void (*codes_fn)(uint8_t *, size_t, uint64_t, uint64_t, const code_lut *);

static codes_fn pick_codes(void) {
#ifdef MOE_FILL_X86
  int lv = fill_level();
  if (lv == 3) return codes_vbmi;
  if (lv >= 1) return codes_avx2;
#endif
  return codes_generic;
}

size_t moe_weight_stage_floats(int64_t N, int64_t K) {
  (void)N;
  (void)K;
  return 16;
}

typedef struct weight_job {
  codes_fn fn;
  const code_lut *lut;
  uint8_t *q;   /* the expert's [N, K] codes */
  float *s;     /* its [N / 128, K / 128] scales */
  int64_t N, K; /* N, K: multiples of 128 */
  uint64_t key, skey;
  float level[8]; /* scale_inv of the 8 block levels */
} weight_job;

static void weight_part(void *ctx, int t, int nt) {
  const weight_job *j = (const weight_job *)ctx;
  int64_t nb = j->N / 128, sc = j->K / 128, lo = nb * t / nt, hi = nb * (t + 1) / nt, b;
  size_t wpr = (size_t)j->K / 8; /* words per row */
  if (lo >= hi) return;
  for (b = lo * sc; b < hi * sc; b++)
    j->s[b] = j->level[moe_mix64(j->skey + (uint64_t)b * GOLDEN) >> 61];
  j->fn(j->q + (size_t)(lo * 128) * (size_t)j->K, (size_t)((hi - lo) * 128) * wpr, j->key,
        (uint64_t)(lo * 128) * wpr, j->lut);
}

/* scale_inv that xte_quantize stores for a 128x128 block of amax a under W's recipe: the
 * library's answer for a [1, 1] block holding a. */
static xte_status block_scale(const xte_qtensor *W, float a, float *scale_inv, xte_stream st) {
  xte_qtensor q;
  uint8_t code;
  xte_tensor in = xte_tensor_2d(&a, XTE_DTYPE_FP32, 1, 1);
  memset(&q, 0, sizeof q);
  q.scaling_mode = W->scaling_mode;
  q.recipe = W->recipe;
  q.rowwise = xte_tensor_2d(&code, XTE_DTYPE_E4M3, 1, 1);
  q.rowwise_scale_inv.data = scale_inv;
  q.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  q.rowwise_scale_inv.rows = 1;
  q.rowwise_scale_inv.cols = 1;
  q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  return xte_quantize(&in, &q, NULL, st);
}

xte_status moe_weight_expert(const xte_qtensor *W, int64_t g, int64_t N, int64_t K, float *stage,
                             uint64_t seed, uint64_t stream, xte_stream st) {
  static code_lut lut;
  static int lut_ready;
  weight_job j;
  int L;
  (void)stage;
  if (!lut_ready) {
    lut_init(&lut);
    lut_ready = 1;
  }
  j.fn = pick_codes();
  j.lut = &lut;
  j.N = N;
  j.K = K;
  j.q = (uint8_t *)W->rowwise.data + (size_t)(g * N) * (size_t)K;
  j.s = (float *)W->rowwise_scale_inv.data + (size_t)(g * N / 128) * (size_t)(K / 128);
  j.key = moe_stream_key(seed, stream);
  j.skey = moe_mix64(~j.key);
  for (L = 0; L < 8; L++) {
    float a = moe_w_scale(K) * (float)(16 - L) / 16.0f;
    xte_status rc = block_scale(W, a, &j.level[L], st);
    if (rc == XTE_SUCCESS && st) rc = xte_stream_synchronize(st);
    if (rc != XTE_SUCCESS) return rc;
  }
  if ((size_t)(N * K) < ((size_t)1 << 18))
    weight_part(&j, 0, 1);
  else
    xte_bench_team_run(weight_part, &j);
  return XTE_SUCCESS;
}

typedef struct dequant_job {
  double *out;
  const uint8_t *q;
  const float *s;
  int64_t N, K;
  double v[256]; /* the value of every e4m3 code (the library's decode, exact) */
} dequant_job;

static void dequant_part(void *ctx, int t, int nt) {
  const dequant_job *j = (const dequant_job *)ctx;
  int64_t K = j->K, sc = K / 128, lo = j->N * t / nt, hi = j->N * (t + 1) / nt, r, c, b;
  for (r = lo; r < hi; r++)
    for (b = 0; b < sc; b++) {
      double s = (double)j->s[r / 128 * sc + b]; /* v * s: exact in fp64 (4 x 24 bits) */
      for (c = b * 128; c < b * 128 + 128; c++) j->out[r * K + c] = j->v[j->q[r * K + c]] * s;
    }
}

void moe_dequant_128(double *out, const uint8_t *q, const float *s, int64_t N, int64_t K) {
  dequant_job j;
  int i;
  j.out = out;
  j.q = q;
  j.s = s;
  j.N = N;
  j.K = K;
  for (i = 0; i < 256; i++) j.v[i] = (double)xte_e4m3_to_f32((uint8_t)i);
  if ((size_t)(N * K) < ((size_t)1 << 18))
    dequant_part(&j, 0, 1);
  else
    xte_bench_team_run(dequant_part, &j);
}

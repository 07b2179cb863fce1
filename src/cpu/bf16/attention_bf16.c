/* XTE_ATTENTION_FAST's bf16 dot products on AVX512-BF16 (VDPBF16PS), an extension of the avx512
 * ISA (built with -mavx512bf16, cmake/XteCpuIsa.cmake; attached by src/cpu/isa.c as
 * xte_attn_bf16_table where the CPU has AVX512-BF16 and XTE_CPU_AVX512_BF16 is not "0").
 *
 * The attention driver (src/cpu/attention_driver.c) calls these two kernels in place of the FAST
 * table's gemm and gemm_fold for bf16 inputs: the same arguments and results, except that both
 * operands are rounded to bf16 (round to nearest even; exact for Q, K, V, dO, which are bf16
 * already, one rounding of P and dS, as FlashAttention does) and each output is a sum of exact
 * products in fp32 in the instruction's order: per pair of K steps (2k, 2k + 1) one VDPBF16PS,
 * the pairs in k order (K chunks of KC = 128, the chunk's partial sums going through C in fp32).
 * The instruction reads its bf16 inputs' subnormals as zero and flushes subnormal results (below
 * 2^-126, far under the FAST bound's absolute term); NaN and inf propagate. The order depends on
 * nothing but the shapes, so the results are deterministic (docs/numerics.md section 7, "FAST").
 *
 * Packing (per call, in thread-local buffers): B's rows in pairs, each 32-bit word one column's
 * (B[2k][c], B[2k + 1][c]) in bf16 (low, high), a row of pairs NC words; A's pairs as 32-bit
 * words (A[r][2k], A[r][2k + 1]), broadcast. An odd K's last pair takes zeros in both operands. */
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention_kernels.h"
#include "numerics/xte_attention_numerics.h"

#define AI static inline __attribute__((always_inline))

enum { MC = 64, KC = 128, NC = 64, MR = 6 };

/* packed A (pairs [MC][KC / 2] or [KC / 2][MC]), packed B [KC / 2][NC], fold sums [MC][NC] */
static _Thread_local uint32_t tA[MC * KC / 2] __attribute__((aligned(64)));
static _Thread_local uint32_t tB[KC / 2 * NC] __attribute__((aligned(64)));
static _Thread_local float tC[MC * NC] __attribute__((aligned(64)));

static pthread_once_t bf16_once = PTHREAD_ONCE_INIT;
static int bf16_ok;

/* CPUID.(EAX=7, ECX=1):EAX bit 5 is AVX512-BF16 (the caller runs the avx512 ISA: F, BW, VL and
 * the OS's zmm state are known to be there) */
static void bf16_init(void) {
  unsigned a, b, c, d;
  const char *env = getenv("XTE_CPU_AVX512_BF16");
  if (env && strcmp(env, "0") == 0) return;
  if (__get_cpuid_max(0, NULL) < 7) return;
  __cpuid_count(7, 1, a, b, c, d);
  (void)b;
  (void)c;
  (void)d;
  bf16_ok = (a >> 5) & 1;
}

int xte_attn_bf16_usable(void) {
  pthread_once(&bf16_once, bf16_init);
  return bf16_ok;
}

/* 16 words (x[c], y[c]) in bf16, x low, y high (round to nearest even) */
AI __m512i pair16(__m512 x, __m512 y) {
  static const uint16_t order[32]
      __attribute__((aligned(64))) = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512((const void *)order),
                                  (__m512i)_mm512_cvtne2ps_pbh(y, x));
}

/* one fp32 to bf16 (round to nearest even, a NaN kept quiet): the generic packing's */
static uint32_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

/* B rows [0, kc), columns [0, nc) (nc a multiple of 16) to dst[k2 * NC + c] */
static void pack_b(const float *B, int64_t ldb, int64_t kc, int64_t nc, uint32_t *dst) {
  int64_t k2, c;
  for (k2 = 0; 2 * k2 < kc; k2++) {
    const float *x = B + 2 * k2 * ldb, *y = 2 * k2 + 1 < kc ? x + ldb : NULL;
    for (c = 0; c < nc; c += 16)
      _mm512_store_si512(
          (void *)(dst + k2 * NC + c),
          pair16(_mm512_loadu_ps(x + c), y ? _mm512_loadu_ps(y + c) : _mm512_setzero_ps()));
  }
}

/* A rows [0, m), K steps [0, kc) (A[r * a_rs + k * a_ks]) to pairs: rows along k (a_ks = 1)
 * dst[r * KC / 2 + k2] (*rs = KC / 2, *ks = 1), columns (a_rs = 1) dst[k2 * MC + r] (*rs = 1,
 * *ks = MC), else element by element like the first. */
static void pack_a(const float *A, int64_t a_rs, int64_t a_ks, int64_t m, int64_t kc, uint32_t *dst,
                   int64_t *rs, int64_t *ks) {
  int64_t r, k;
  if (a_rs == 1 && a_ks != 1) {
    *rs = 1;
    *ks = MC;
    for (k = 0; k < kc; k += 2)
      for (r = 0; r < m; r += 16) {
        const __mmask16 mk = m - r >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (m - r)) - 1u);
        const float *x = A + k * a_ks + r;
        const __m512 y = k + 1 < kc ? _mm512_maskz_loadu_ps(mk, x + a_ks) : _mm512_setzero_ps();
        _mm512_store_si512((void *)(dst + k / 2 * MC + r), pair16(_mm512_maskz_loadu_ps(mk, x), y));
      }
    return;
  }
  *rs = KC / 2;
  *ks = 1;
  if (a_ks == 1) {
    for (r = 0; r < m; r++) {
      const float *x = A + r * a_rs;
      uint32_t *d = dst + r * (KC / 2);
      for (k = 0; k < kc; k += 32) {
        const int64_t n = kc - k;
        const __mmask16 m0 = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u);
        const __mmask16 m1 = n >= 32  ? (__mmask16)0xFFFF
                             : n > 16 ? (__mmask16)((1u << (n - 16)) - 1u)
                                      : 0;
        const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(m1, x + k + 16),
                                                       _mm512_maskz_loadu_ps(m0, x + k));
        const int64_t np = (n >= 32 ? 32 : n + 1) / 2; /* pairs of this step */
        _mm512_mask_storeu_epi32(d + k / 2,
                                 np >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << np) - 1u), w);
      }
    }
    return;
  }
  for (r = 0; r < m; r++)
    for (k = 0; k < kc; k += 2) {
      const uint32_t lo = bf16_of(A[r * a_rs + k * a_ks]);
      const uint32_t hi = k + 1 < kc ? bf16_of(A[r * a_rs + (k + 1) * a_ks]) : 0u;
      dst[r * (KC / 2) + k / 2] = lo | hi << 16;
    }
}

/* C[i][16 v ..] (i < mr, v < nv) = (ld ? C : 0) + the pairs k2 < kp of rows i of A (word
 * a[i * ars + k2 * aks]) against b[k2 * NC + 16 v ..] */
AI void mk(const int mr, const int nv, int64_t kp, const uint32_t *a, int64_t ars, int64_t aks,
           const uint32_t *b, float *C, int64_t ldc, int ld) {
  __m512 acc[MR][4];
  int64_t k2;
  int i, v;
  for (i = 0; i < mr; i++)
    for (v = 0; v < nv; v++)
      acc[i][v] = ld ? _mm512_loadu_ps(C + i * ldc + 16 * v) : _mm512_setzero_ps();
  for (k2 = 0; k2 < kp; k2++) {
    __m512i bv[4];
    for (v = 0; v < nv; v++) bv[v] = _mm512_load_si512((const void *)(b + k2 * NC + 16 * v));
    for (i = 0; i < mr; i++) {
      const __m512i av = _mm512_set1_epi32((int)a[i * ars + k2 * aks]);
      for (v = 0; v < nv; v++)
        acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)av, (__m512bh)bv[v]);
    }
  }
  for (i = 0; i < mr; i++)
    for (v = 0; v < nv; v++) _mm512_storeu_ps(C + i * ldc + 16 * v, acc[i][v]);
}

#define MK_NV(mr)                                \
  switch (nv) {                                  \
    case 1:                                      \
      mk(mr, 1, kp, a, ars, aks, b, C, ldc, ld); \
      break;                                     \
    case 2:                                      \
      mk(mr, 2, kp, a, ars, aks, b, C, ldc, ld); \
      break;                                     \
    case 3:                                      \
      mk(mr, 3, kp, a, ars, aks, b, C, ldc, ld); \
      break;                                     \
    default:                                     \
      mk(mr, 4, kp, a, ars, aks, b, C, ldc, ld); \
      break;                                     \
  }

static void mk_any(int mr, int nv, int64_t kp, const uint32_t *a, int64_t ars, int64_t aks,
                   const uint32_t *b, float *C, int64_t ldc, int ld) {
  switch (mr) {
    case 1:
      MK_NV(1);
      break;
    case 2:
      MK_NV(2);
      break;
    case 3:
      MK_NV(3);
      break;
    case 4:
      MK_NV(4);
      break;
    case 5:
      MK_NV(5);
      break;
    default:
      MK_NV(6);
      break;
  }
}

/* C[r * ldc + c] (r < m <= MC, c < N) = (ld ? C : 0) + A B over K: K chunks of KC in order, A
 * packed once per chunk, B per chunk and NC columns */
static void block(int64_t m, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                  const float *B, int64_t ldb, float *C, int64_t ldc, int ld) {
  int64_t k0, n0, r, ars, aks;
  if (K <= 0) { /* no products: C or +0 */
    if (!ld)
      for (r = 0; r < m; r++) memset(C + r * ldc, 0, sizeof(float) * (size_t)N);
    return;
  }
  for (k0 = 0; k0 < K; k0 += KC) {
    const int64_t kc = K - k0 < KC ? K - k0 : KC, kp = (kc + 1) / 2;
    pack_a(A + k0 * a_ks, a_rs, a_ks, m, kc, tA, &ars, &aks);
    for (n0 = 0; n0 < N; n0 += NC) {
      const int64_t nc = N - n0 < NC ? N - n0 : NC;
      pack_b(B + k0 * ldb + n0, ldb, kc, nc, tB);
      for (r = 0; r < m; r += MR)
        mk_any((int)(m - r < MR ? m - r : MR), (int)(nc / 16), kp, tA + r * ars, ars, aks, tB,
               C + r * ldc + n0, ldc, ld || k0 > 0);
    }
  }
}

/* xte_attn_kernels.gemm's arguments, bf16 products (see the top) */
static void gemm_bf16(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                      const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
  int64_t r0;
  for (r0 = 0; r0 < M; r0 += MC)
    block(M - r0 < MC ? M - r0 : MC, N, K, A + r0 * a_rs, a_rs, a_ks, B, ldb, C + r0 * ldc, ldc,
          acc);
}

/* xte_attn_kernels.gemm_fold's: the sums in tC (NC columns at a time), then folded into D as
 * xte_attn_add / xte_attn_rescale */
static void gemm_fold_bf16(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs,
                           int64_t a_ks, const float *B, int64_t ldb, const float *C0, int64_t ldc0,
                           float *D, int64_t ldd, const float *alpha) {
  int64_t r0, n0, r, c;
  for (r0 = 0; r0 < M; r0 += MC) {
    const int64_t m = M - r0 < MC ? M - r0 : MC;
    for (n0 = 0; n0 < N; n0 += NC) {
      const int64_t nc = N - n0 < NC ? N - n0 : NC;
      if (C0)
        for (r = 0; r < m; r++)
          memcpy(tC + r * NC, C0 + (r0 + r) * ldc0 + n0, sizeof(float) * (size_t)nc);
      block(m, nc, K, A + r0 * a_rs, a_rs, a_ks, B + n0, ldb, tC, NC, C0 != NULL);
      for (r = 0; r < m; r++) {
        float *d = D + (r0 + r) * ldd + n0;
        const float *t = tC + r * NC;
        if (alpha) {
          const __m512 al = _mm512_set1_ps(alpha[r0 + r]);
          for (c = 0; c < nc; c += 16) /* xte_attn_rescale: fmaf(d, alpha, t) */
            _mm512_storeu_ps(d + c,
                             _mm512_fmadd_ps(_mm512_loadu_ps(d + c), al, _mm512_loadu_ps(t + c)));
        } else {
          for (c = 0; c < nc; c += 16) /* xte_attn_add: d + t */
            _mm512_storeu_ps(d + c, _mm512_add_ps(_mm512_loadu_ps(d + c), _mm512_loadu_ps(t + c)));
        }
      }
    }
  }
}

const xte_attn_bf16_kernels xte_attn_bf16_table = {gemm_bf16, gemm_fold_bf16, NULL, NULL,
                                                   NULL,      NULL,           NULL, NULL};

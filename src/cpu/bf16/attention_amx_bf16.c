/* XTE_ATTENTION_FAST's bf16 dot products on AMX-BF16 tiles (TDPBF16PS), the same two kernels as
 * attention_bf16.c (xte_attn_bf16_kernels: gemm and gemm_fold with xte_attn_kernels' arguments)
 * and the same roundings: each operand rounded to bf16 (round to nearest even, VCVTNE2PS2BF16),
 * the products exact in fp32 and summed in fp32 by the tile unit, which reads bf16 subnormals as
 * zero and flushes subnormal results (far under the FAST bound's absolute term); NaN and inf
 * propagate. Per 16 x 16 tile of the output, K chunks of KA in order, each as 32-step tile
 * products in k order starting from the chunk before's fp32 sums; the order depends on nothing
 * but the shapes, so the results are deterministic (docs/numerics.md section 7, "FAST").
 * Built with the bf16/ folder's flags where the compiler has AMX-BF16 (XTE_ATTN_AMX); attached by
 * src/cpu/isa.c as xte_attn_amx_bf16_table where the CPU has AMX-BF16, the OS grants the tiles
 * and neither XTE_CPU_AMX nor XTE_CPU_AMX_BF16 is "0".
 *
 * Packing per call, in thread-local buffers: A's rows as pairs of K steps (the A tile's rows:
 * 16 words, 32 K steps, a row), B's rows in pairs (the B tile's rows: word c = (B[2k][c],
 * B[2k + 1][c])), both zero-padded to whole tiles along K; the sums of a block in an fp32 buffer
 * (tile rows past M are computed and never read). */
#ifdef XTE_ATTN_AMX
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/amx/amx_tiles.h"
#include "cpu/attention_kernels.h"
#include "cpu/avx512/avx512_transpose.h"

#define AI static inline __attribute__((always_inline))

enum { MA = 64, KA = 256, NA = 256 }; /* NA: the longest head dim, A packed once per call */

/* packed A [MA][KA / 2] words, packed B [KA / 2][NA] words, sums [MA][NA] */
static _Thread_local uint32_t aA[MA * KA / 2] __attribute__((aligned(64)));
static _Thread_local uint32_t aB[KA / 2 * NA] __attribute__((aligned(64)));
static _Thread_local float aC[MA * NA] __attribute__((aligned(64)));

static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static int amx_ok;

static void amx_init(void) {
  const char *env = getenv("XTE_CPU_AMX"), *env2 = getenv("XTE_CPU_AMX_BF16");
  if ((env && strcmp(env, "0") == 0) || (env2 && strcmp(env2, "0") == 0)) return;
  amx_ok = xte_amx_tiles_usable((1u << 22) | (1u << 24)); /* AMX-BF16 and AMX-TILE */
}

int xte_attn_amx_bf16_usable(void) {
  pthread_once(&amx_once, amx_init);
  return amx_ok;
}

/* 16 words (x[c], y[c]) in bf16, x low, y high (round to nearest even) */
AI __m512i pair16(__m512 x, __m512 y) {
  static const uint16_t order[32]
      __attribute__((aligned(64))) = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512((const void *)order),
                                  (__m512i)_mm512_cvtne2ps_pbh(y, x));
}

AI __mmask16 first(int64_t n) {
  return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* one fp32 to bf16 (round to nearest even, a NaN kept quiet): the generic packing's */
static uint32_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (u >> 16) | 0x40u;
  return (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
}

/* B rows [0, kc), columns [0, nc) to dst[k2 * ld + c], pairs k2 < kp16 (kc's pairs rounded up
 * to 16; the rows past kc zero) */
static void pack_b(const float *B, int64_t ldb, int64_t kc, int64_t nc, int64_t kp16, uint32_t *dst,
                   int64_t ld) {
  int64_t k2, c;
  for (k2 = 0; k2 < kp16; k2++) {
    const float *x = 2 * k2 < kc ? B + 2 * k2 * ldb : NULL;
    const float *y = 2 * k2 + 1 < kc ? B + (2 * k2 + 1) * ldb : NULL;
    for (c = 0; c < nc; c += 16)
      _mm512_store_si512((void *)(dst + k2 * ld + c),
                         pair16(x ? _mm512_loadu_ps(x + c) : _mm512_setzero_ps(),
                                y ? _mm512_loadu_ps(y + c) : _mm512_setzero_ps()));
  }
}

/* A's rows [0, m) (A[r * lda + k], K steps [0, kc)) as A tile rows: row r's pairs k2 < kp16 at
 * dst[r * ld + k2] (zero past kc), rows [m, mpad) zero */
static void pack_rows(const float *A, int64_t lda, int64_t m, int64_t mpad, int64_t kc,
                      int64_t kp16, uint32_t *dst, int64_t ld) {
  int64_t r, k;
  for (r = 0; r < mpad; r++) {
    uint32_t *d = dst + r * ld;
    const float *x = A + r * lda;
    if (r >= m) {
      memset(d, 0, sizeof(uint32_t) * (size_t)kp16);
      continue;
    }
    for (k = 0; k < 2 * kp16; k += 32)
      _mm512_store_si512(
          (void *)(d + k / 2),
          (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(first(kc - k - 16), x + k + 16),
                                       _mm512_maskz_loadu_ps(first(kc - k), x + k)));
  }
}

/* A rows [0, m), K steps [0, kc) (A[r * a_rs + k * a_ks]) to aA[r * KA / 2 + k2], pairs k2 <
 * kp16 (zero past kc), rows up to m rounded up to 16 (zero past m) */
static void pack_a(const float *A, int64_t a_rs, int64_t a_ks, int64_t m, int64_t kc,
                   int64_t kp16) {
  const int64_t m16 = (m + 15) / 16 * 16;
  int64_t r, k, i;
  if (a_rs == 1 && a_ks != 1) { /* columns: 16 x 16 blocks of pairs, transposed */
    for (r = 0; r < m16; r += 16)
      for (k = 0; k < 2 * kp16; k += 32) {
        __m512i x[16];
        for (i = 0; i < 16; i++) {
          const int64_t k0 = k + 2 * i;
          const __mmask16 mk = first(m - r);
          x[i] =
              pair16(k0 < kc ? _mm512_maskz_loadu_ps(mk, A + k0 * a_ks + r) : _mm512_setzero_ps(),
                     k0 + 1 < kc ? _mm512_maskz_loadu_ps(mk, A + (k0 + 1) * a_ks + r)
                                 : _mm512_setzero_ps());
        }
        xte_transpose16x16_epi32(x);
        for (i = 0; i < 16; i++)
          _mm512_store_si512((void *)(aA + (r + i) * (KA / 2) + k / 2), x[i]);
      }
    return;
  }
  if (a_ks == 1) {
    pack_rows(A, a_rs, m, m16, kc, kp16, aA, KA / 2);
    return;
  }
  for (r = 0; r < m16; r++) {
    uint32_t *d = aA + r * (KA / 2);
    if (r >= m) {
      memset(d, 0, sizeof(uint32_t) * (size_t)kp16);
      continue;
    }
    {
      for (k = 0; k < 2 * kp16; k += 2) {
        const uint32_t lo = k < kc ? bf16_of(A[r * a_rs + k * a_ks]) : 0u;
        const uint32_t hi = k + 1 < kc ? bf16_of(A[r * a_rs + (k + 1) * a_ks]) : 0u;
        d[k / 2] = lo | hi << 16;
      }
    }
  }
}

/* aC[r * NA + c] (r < m <= MA, c < nc <= NA) = (from ? aC : +0) + the products of the packed A's
 * pairs [0, kp16) (row r at a + r * lda words, rows up to m rounded up to 16 read) and the packed
 * B's (row k2 at b + k2 * ldb words); the tiles start from zero, not from a load of aC, when from
 * is 0 (no wait on aC's stores) */
static void tiles_packed_a(int64_t m, int64_t nc, int64_t kp16, const uint32_t *a, int64_t lda,
                           const uint32_t *b, int64_t ldb, int from) {
  const int64_t m16 = (m + 15) / 16 * 16;
  int64_t r, c, k2;
  for (r = 0; r < m16; r += 32) {
    const int two_r = r + 16 < m16;
    for (c = 0; c < nc; c += 32) {
      const int two_c = c + 16 < nc;
      float *t = aC + r * NA + c;
      if (from) {
        _tile_loadd(0, t, NA * 4);
        if (two_c) _tile_loadd(1, t + 16, NA * 4);
        if (two_r) _tile_loadd(2, t + 16 * NA, NA * 4);
        if (two_r && two_c) _tile_loadd(3, t + 16 * NA + 16, NA * 4);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (k2 = 0; k2 < kp16; k2 += 16) {
        _tile_loadd(4, a + r * lda + k2, lda * 4);
        _tile_loadd(6, b + k2 * ldb + c, ldb * 4);
        _tile_dpbf16ps(0, 4, 6);
        if (two_c) {
          _tile_loadd(7, b + k2 * ldb + c + 16, ldb * 4);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_r) {
          _tile_loadd(5, a + (r + 16) * lda + k2, lda * 4);
          _tile_dpbf16ps(2, 5, 6);
          if (two_c) _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, t, NA * 4);
      if (two_c) _tile_stored(1, t + 16, NA * 4);
      if (two_r) _tile_stored(2, t + 16 * NA, NA * 4);
      if (two_r && two_c) _tile_stored(3, t + 16 * NA + 16, NA * 4);
    }
  }
}

/* tiles_packed_a with A packed in aA */
static void tiles_packed(int64_t m, int64_t nc, int64_t kp16, const uint32_t *b, int64_t ldb,
                         int from) {
  tiles_packed_a(m, nc, kp16, aA, KA / 2, b, ldb, from);
}

/* aC[r * NA + c] (r < m <= MA, c < nc <= NA) = (from ? aC : +0) + A B over K, K in chunks of KA */
static void tiles(int64_t m, int64_t nc, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                  const float *B, int64_t ldb, int from) {
  int64_t k0, r;
  if (K <= 0 && !from) /* no products: +0 */
    for (r = 0; r < m; r++) memset(aC + r * NA, 0, sizeof(float) * (size_t)nc);
  for (k0 = 0; k0 < K; k0 += KA) {
    const int64_t kc = K - k0 < KA ? K - k0 : KA, kp16 = (kc + 31) / 32 * 16;
    pack_a(A + k0 * a_ks, a_rs, a_ks, m, kc, kp16);
    pack_b(B + k0 * ldb, ldb, kc, nc, kp16, aB, NA);
    tiles_packed(m, nc, kp16, aB, NA, from || k0 > 0);
  }
}

/* aC's rows [0, m16) from C's rows (past m: +0), nc columns */
static void start(int64_t m, int64_t nc, const float *C, int64_t ldc) {
  const int64_t m16 = (m + 15) / 16 * 16;
  int64_t r;
  for (r = 0; r < m16; r++) {
    if (r < m)
      memcpy(aC + r * NA, C + r * ldc, sizeof(float) * (size_t)nc);
    else
      memset(aC + r * NA, 0, sizeof(float) * (size_t)nc);
  }
}

/* xte_attn_kernels.gemm's arguments, bf16 products on the tiles (see the top) */
static void gemm_amx(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                     const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
  int64_t r0, n0, r;
  _tile_loadconfig(&xte_amx_cfg);
  for (r0 = 0; r0 < M; r0 += MA) {
    const int64_t m = M - r0 < MA ? M - r0 : MA;
    for (n0 = 0; n0 < N; n0 += NA) {
      const int64_t nc = N - n0 < NA ? N - n0 : NA;
      if (acc) start(m, nc, C + r0 * ldc + n0, ldc);
      tiles(m, nc, K, A + r0 * a_rs, a_rs, a_ks, B + n0, ldb, acc);
      for (r = 0; r < m; r++)
        memcpy(C + (r0 + r) * ldc + n0, aC + r * NA, sizeof(float) * (size_t)nc);
    }
  }
  _tile_release();
}

/* xte_attn_kernels.gemm_fold's: the sums in aC, folded into D as xte_attn_add /
 * xte_attn_rescale */
static void gemm_fold_amx(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs,
                          int64_t a_ks, const float *B, int64_t ldb, const float *C0, int64_t ldc0,
                          float *D, int64_t ldd, const float *alpha) {
  int64_t r0, n0, r, c;
  _tile_loadconfig(&xte_amx_cfg);
  for (r0 = 0; r0 < M; r0 += MA) {
    const int64_t m = M - r0 < MA ? M - r0 : MA;
    for (n0 = 0; n0 < N; n0 += NA) {
      const int64_t nc = N - n0 < NA ? N - n0 : NA;
      if (C0) start(m, nc, C0 + r0 * ldc0 + n0, ldc0);
      tiles(m, nc, K, A + r0 * a_rs, a_rs, a_ks, B + n0, ldb, C0 != NULL);
      for (r = 0; r < m; r++) {
        float *d = D + (r0 + r) * ldd + n0;
        const float *t = aC + r * NA;
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
  _tile_release();
}

/* xte_attn_bf16_kernels.pack_b: B (K <= 256 rows, N <= 64 columns) as the B tiles read it, row
 * k2 of pairs at pb + k2 * 64 words, ceil(K / 32) * 16 rows (zero past K) */
static void pack_b_amx(int64_t K, int64_t N, const float *B, int64_t ldb, uint32_t *pb) {
  pack_b(B, ldb, K, N, (K + 31) / 32 * 16, pb, XTE_ATTN_PB_LD);
}

/* xte_attn_bf16_kernels.gemm_pb: gemm from +0 with B packed by pack_b (pb at B's first column) */
static void gemm_pb_amx(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                        const uint32_t *pb, float *C, int64_t ldc) {
  const int64_t kp16 = (K + 31) / 32 * 16;
  int64_t r0, r;
  _tile_loadconfig(&xte_amx_cfg);
  for (r0 = 0; r0 < M; r0 += MA) {
    const int64_t m = M - r0 < MA ? M - r0 : MA;
    pack_a(A + r0 * a_rs, a_rs, a_ks, m, K, kp16);
    tiles_packed(m, N, kp16, pb, XTE_ATTN_PB_LD, 0);
    for (r = 0; r < m; r++) memcpy(C + (r0 + r) * ldc, aC + r * NA, sizeof(float) * (size_t)N);
  }
  _tile_release();
}

/* xte_attn_bf16_kernels.pack_a: A's rows as the A tiles read them (pack_a's for a_ks = 1) */
static void pack_a_amx(int64_t M, int64_t Mpad, int64_t K, const float *A, int64_t lda,
                       uint32_t *pa) {
  const int64_t kp16 = (K + 31) / 32 * 16;
  pack_rows(A, lda, M, Mpad, K, kp16, pa, kp16);
}

/* xte_attn_bf16_kernels.gemm_pa: gemm_pb with A's rows packed by pack_a */
static void gemm_pa_amx(int64_t M, int64_t N, int64_t K, const uint32_t *pa, const uint32_t *pb,
                        float *C, int64_t ldc) {
  const int64_t kp16 = (K + 31) / 32 * 16;
  int64_t r0, r;
  _tile_loadconfig(&xte_amx_cfg);
  for (r0 = 0; r0 < M; r0 += MA) {
    const int64_t m = M - r0 < MA ? M - r0 : MA;
    tiles_packed_a(m, N, kp16, pa + r0 * kp16, kp16, pb, XTE_ATTN_PB_LD, 0);
    for (r = 0; r < m; r++) memcpy(C + (r0 + r) * ldc, aC + r * NA, sizeof(float) * (size_t)N);
  }
  _tile_release();
}

/* xte_attn_bf16_kernels.pack_bn: B's rows in pairs as the B tiles read them (pack_b's), pair row
 * k2 < Kpad / 2 at p + k2 * ld words, rows [K, Kpad) zero */
static void pack_bn_amx(int64_t K, int64_t Kpad, int64_t N, const float *B, int64_t ldb,
                        uint32_t *p, int64_t ld) {
  pack_b(B, ldb, K, N, Kpad / 2, p, ld);
}

/* xte_attn_bf16_kernels.gemm_fold_pb: gemm_fold_amx without C0, B packed by pack_bn */
static void gemm_fold_pb_amx(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs,
                             int64_t a_ks, const uint32_t *pb, int64_t ldpb, float *D, int64_t ldd,
                             const float *alpha) {
  const int64_t kp16 = (K + 31) / 32 * 16;
  int64_t r0, r, c;
  _tile_loadconfig(&xte_amx_cfg);
  for (r0 = 0; r0 < M; r0 += MA) {
    const int64_t m = M - r0 < MA ? M - r0 : MA;
    if (K > 0) {
      pack_a(A + r0 * a_rs, a_rs, a_ks, m, K, kp16);
      tiles_packed(m, N, kp16, pb, ldpb, 0);
    } else {
      for (r = 0; r < m; r++) memset(aC + r * NA, 0, sizeof(float) * (size_t)N);
    }
    for (r = 0; r < m; r++) {
      float *d = D + (r0 + r) * ldd;
      const float *t = aC + r * NA;
      if (alpha) {
        const __m512 al = _mm512_set1_ps(alpha[r0 + r]);
        for (c = 0; c < N; c += 16) /* xte_attn_rescale: fmaf(d, alpha, t) */
          _mm512_storeu_ps(d + c,
                           _mm512_fmadd_ps(_mm512_loadu_ps(d + c), al, _mm512_loadu_ps(t + c)));
      } else {
        for (c = 0; c < N; c += 16) /* xte_attn_add: d + t */
          _mm512_storeu_ps(d + c, _mm512_add_ps(_mm512_loadu_ps(d + c), _mm512_loadu_ps(t + c)));
      }
    }
  }
  _tile_release();
}

const xte_attn_bf16_kernels xte_attn_amx_bf16_table = {gemm_amx,    gemm_fold_amx,   pack_b_amx,
                                                       gemm_pb_amx, pack_a_amx,      gemm_pa_amx,
                                                       pack_bn_amx, gemm_fold_pb_amx};
#endif /* XTE_ATTN_AMX */

/* XTE_GEMM_FAST for a few rows of A on AVX-512 (src/cpu/gemm_kernels.h, xte_gemm_fs_fn; both
 * builds of this folder). B's codes go straight into fp32 FMAs: 16 codes to their fp16 images
 * (e4m3: sign and the 7 low bits moved into place, value * 2^-8, NaN codes made fp16 NaN; e5m2:
 * the code is the fp16's top byte), vcvtph2ps, one FMA per row of A (A's rows broadcast from L1:
 * a block of them is at most 32 x 128 fp32). Register tiles of R rows x C columns, R * C = 16
 * accumulators of 16 lanes; per block the 16 accumulators reduce to one vector (lane i: tile
 * element i) and the contract's update runs on that vector: acc = fma(p, sa * sb, acc). A block's
 * last codes (past a multiple of 16) are copied into a zeroed buffer first: nothing past K is read.
 */
#include <string.h>

#include "cpu/avx512/isa_avx512.h"
#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"

#define NC XTE_GEMM_FS_NC
#define AI inline __attribute__((always_inline))
#define FS_PF 1024 /* software prefetch distance along each column (bytes) */

/* 16 codes to fp32: their values (times 2^-8 for e4m3) */
static AI __m512 dec16(const uint8_t *p, int e4) {
  const __m128i x = _mm_loadu_si128((const __m128i *)p);
  __m256i h;
  if (e4) {
    h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(x), 7),
                         _mm256_set1_epi16((short)0xBF80));
    h = _mm256_blendv_epi8(h, _mm256_set1_epi16(0x7E00),
                           _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)),
                                              _mm256_set1_epi16(0x3F80)));
  } else {
    h = _mm256_slli_epi16(_mm256_cvtepu8_epi16(x), 8);
  }
  return _mm512_cvtph_ps(h);
}

/* 32 codes to fp32 (as dec16 on p and p + 16): the integer steps on 32 words at once */
static AI void dec32(const uint8_t *p, int e4, __m512 *lo, __m512 *hi) {
  const __m256i x = _mm256_loadu_si256((const __m256i *)p);
  __m512i h;
  if (e4) {
    h = _mm512_and_si512(_mm512_slli_epi16(_mm512_cvtepi8_epi16(x), 7),
                         _mm512_set1_epi16((short)0xBF80));
    h = _mm512_mask_mov_epi16(
        h,
        _mm512_cmpeq_epi16_mask(_mm512_and_si512(h, _mm512_set1_epi16(0x7FFF)),
                                _mm512_set1_epi16(0x3F80)),
        _mm512_set1_epi16(0x7E00));
  } else {
    h = _mm512_slli_epi16(_mm512_cvtepi8_epi16(x), 8); /* the sign extension shifts out */
  }
  *lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  *hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

/* vshuff32x4 as vshuff64x2 (the same 128-bit lanes; SIMDe 0.7.4 has the latter's alias) */
#define lanes4(a, b, imm) \
  _mm512_castpd_ps(_mm512_shuffle_f64x2(_mm512_castps_pd(a), _mm512_castps_pd(b), (imm)))

/* lane i = the sum of v[i]'s 16 lanes */
static AI __m512 reduce16(const __m512 *v) {
  __m512 t[8], u[4], y0, y1;
  int i;
#pragma GCC unroll 8
  for (i = 0; i < 8; i++)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 4
  for (i = 0; i < 4; i++) {
    __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  y0 = _mm512_add_ps(lanes4(u[0], u[1], 0x44), lanes4(u[0], u[1], 0xEE));
  y1 = _mm512_add_ps(lanes4(u[2], u[3], 0x44), lanes4(u[2], u[3], 0xEE));
  return _mm512_add_ps(lanes4(y0, y1, 0x88), lanes4(y0, y1, 0xDD));
}

/* Tiles of R rows x C = 16 / R columns; every row tile and column group of the 16 columns */
static AI void fs_run(const int R, int m, int mp, int64_t nblk, int kb, int kl, const float *a,
                      int64_t lda, const float *sa, const uint8_t *const *cols, int e4,
                      const float *sb, float *w) {
  const int C = NC / R, ntile = (m + R - 1) / R;
  __m512 wv[XTE_GEMM_SK_MAXM][1]; /* [row tile * R + column group]: ntile * R <= mp <= 32 */
  __m512i ir, ic;
  float bdec[NC * 8 * 16] __attribute__((aligned(64))); /* [column][16-code step][16] */
  const int64_t kend = (nblk - 1) * kb + kl;
  int rt, cg, i, pf;
  int64_t bl;
  {
    int idx_r[16], idx_c[16];
    for (i = 0; i < 16; i++) {
      idx_r[i] = i / C;
      idx_c[i] = i % C;
    }
    ir = _mm512_loadu_si512(idx_r);
    ic = _mm512_loadu_si512(idx_c);
  }
  for (i = 0; i < ntile * R; i++) wv[i][0] = _mm512_setzero_ps();
  for (bl = 0; bl < nblk; bl++) {
    const int len = bl == nblk - 1 ? kl : kb, nfull = len / 16, nst = (len + 15) / 16;
    const int64_t k0 = bl * kb;
    uint8_t tails[NC][16];
    if (nst > nfull)
      for (i = 0; i < NC; i++) {
        memset(tails[i], 0, 16);
        memcpy(tails[i], cols[i] + k0 + nfull * 16, (size_t)(len - nfull * 16));
      }
    /* the columns' codes FS_PF bytes ahead (the hardware prefetchers alone leave the 16 streams
     * waiting on memory), up to the end of K */
    if (k0 + FS_PF + kb <= kend)
      for (i = 0; i < NC; i++)
        for (pf = 0; pf < kb; pf += 64)
          _mm_prefetch((const char *)cols[i] + k0 + FS_PF + pf, _MM_HINT_T0);
    for (cg = 0; cg < R; cg++) {
      const __m512 sbv = _mm512_permutexvar_ps(ic, _mm512_loadu_ps(sb + bl * NC + cg * C));
      if (ntile > 1) /* several row tiles: the group's codes decoded once, into L1 */
        for (i = 0; i < C; i++) {
          int st;
          for (st = 0; st + 1 < nfull; st += 2) {
            __m512 b0, b1;
            dec32(cols[cg * C + i] + k0 + st * 16, e4, &b0, &b1);
            _mm512_store_ps(bdec + (i * 8 + st) * 16, b0);
            _mm512_store_ps(bdec + (i * 8 + st + 1) * 16, b1);
          }
          for (; st < nst; st++)
            _mm512_store_ps(
                bdec + (i * 8 + st) * 16,
                dec16(st < nfull ? cols[cg * C + i] + k0 + st * 16 : tails[cg * C + i], e4));
        }
      for (rt = 0; rt < ntile; rt++) {
        const float *ar = a + (int64_t)rt * R * lda + k0;
        __m512 acc[16], s;
        int st, r, c;
#pragma GCC unroll 16
        for (i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        st = 0;
        if (ntile == 1) /* pairs of steps: 32 codes decoded at once */
          for (; st + 1 < nfull; st += 2) {
            __m512 av[8], aw[8];
#pragma GCC unroll 8
            for (r = 0; r < R; r++) {
              av[r] = _mm512_loadu_ps(ar + r * lda + st * 16);
              aw[r] = _mm512_loadu_ps(ar + r * lda + st * 16 + 16);
            }
#pragma GCC unroll 16
            for (c = 0; c < C; c++) {
              __m512 b0, b1;
              dec32(cols[cg * C + c] + k0 + st * 16, e4, &b0, &b1);
#pragma GCC unroll 8
              for (r = 0; r < R; r++) {
                acc[r * C + c] = _mm512_fmadd_ps(av[r], b0, acc[r * C + c]);
                acc[r * C + c] = _mm512_fmadd_ps(aw[r], b1, acc[r * C + c]);
              }
            }
          }
        for (; st < nst; st++) {
          __m512 av[8];
#pragma GCC unroll 8
          for (r = 0; r < R; r++) av[r] = _mm512_loadu_ps(ar + r * lda + st * 16);
#pragma GCC unroll 16
          for (c = 0; c < C; c++) {
            const __m512 bv =
                ntile > 1
                    ? _mm512_load_ps(bdec + (c * 8 + st) * 16)
                    : dec16(st < nfull ? cols[cg * C + c] + k0 + st * 16 : tails[cg * C + c], e4);
#pragma GCC unroll 8
            for (r = 0; r < R; r++) acc[r * C + c] = _mm512_fmadd_ps(av[r], bv, acc[r * C + c]);
          }
        }
        s = _mm512_mul_ps(_mm512_permutexvar_ps(ir, _mm512_loadu_ps(sa + bl * mp + rt * R)), sbv);
        wv[rt * R + cg][0] = _mm512_fmadd_ps(reduce16(acc), s, wv[rt * R + cg][0]);
      }
    }
  }
  for (rt = 0; rt < ntile; rt++)
    for (cg = 0; cg < R; cg++) {
      float o[16];
      int r, c;
      _mm512_storeu_ps(o, wv[rt * R + cg][0]);
      for (r = 0; r < R; r++)
        for (c = 0; c < C; c++) w[(rt * R + r) * NC + cg * C + c] = o[r * C + c];
    }
}

void XTE_AVX512_NAME(xte_gemm_fast_small)(int m, int mp, int64_t nblk, int kb, int kl,
                                          const float *a, int64_t lda, const float *sa,
                                          const uint8_t *const *cols, int fmt, const float *sb,
                                          float *w) {
  const int e4 = fmt == XTE_FP8_E4M3;
  if (m == 1)
    fs_run(1, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
  else if (m == 2)
    fs_run(2, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
  else
    fs_run(4, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
}

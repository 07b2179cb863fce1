/* XTE_GEMM_FAST for a few rows of A on AVX2 + FMA + F16C (src/cpu/gemm_kernels.h,
 * xte_gemm_fs_fn). As the AVX-512 kernel with 8 lanes: 8 codes to their fp16 images (e4m3: sign
 * and the 7 low bits moved into place, value * 2^-8, NaN codes made fp16 NaN; e5m2: the code is
 * the fp16's top byte), vcvtph2ps, one FMA per row of A. Register tiles of R rows x C columns,
 * R * C = 8 accumulators; per block they reduce to one vector (lane i: tile element i) and the
 * contract's update runs on it: acc = fma(p, sa * sb, acc). A block's last codes (past a multiple
 * of 8) are copied into a zeroed buffer first, so nothing past K is read. */
#include <immintrin.h>
#include <string.h>

#include "cpu/gemm_kernels.h"
#include "cpu/xte_cpu.h"

#define NC XTE_GEMM_FS_NC
#define AI inline __attribute__((always_inline))

/* 8 codes to fp32: their values (times 2^-8 for e4m3) */
static AI __m256 dec8(const uint8_t *p, int e4) {
  __m128i x = _mm_loadl_epi64((const __m128i *)p), h;
  if (e4) {
    const __m128i s = _mm_cvtepi8_epi16(x);
    h = _mm_and_si128(_mm_slli_epi16(s, 7), _mm_set1_epi16((short)0xBF80));
    h = _mm_blendv_epi8(
        h, _mm_set1_epi16(0x7E00),
        _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7FFF)), _mm_set1_epi16(0x3F80)));
  } else {
    h = _mm_slli_epi16(_mm_cvtepu8_epi16(x), 8);
  }
  return _mm256_cvtph_ps(h);
}

/* 16 codes to fp32 (as dec8 on p and p + 8): the integer steps on 16 words at once */
static AI void dec16(const uint8_t *p, int e4, __m256 *lo, __m256 *hi) {
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
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

/* lane i = the sum of v[i]'s 8 lanes */
static AI __m256 reduce8(const __m256 *v) {
  __m256 t[4], u[2];
  int i;
#pragma GCC unroll 4
  for (i = 0; i < 4; i++)
    t[i] = _mm256_add_ps(_mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]));
#pragma GCC unroll 2
  for (i = 0; i < 2; i++) {
    __m256d a = _mm256_castps_pd(t[2 * i]), b = _mm256_castps_pd(t[2 * i + 1]);
    u[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(a, b)),
                         _mm256_castpd_ps(_mm256_unpackhi_pd(a, b)));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(u[0], u[1], 0x20),
                       _mm256_permute2f128_ps(u[0], u[1], 0x31));
}

static AI void fs_run(const int R, int m, int mp, int64_t nblk, int kb, int kl, const float *a,
                      int64_t lda, const float *sa, const uint8_t *const *cols, int e4,
                      const float *sb, float *w) {
  const int C = 8 / R, ngrp = NC / C, ntile = (m + R - 1) / R;
  __m256 wv[XTE_GEMM_SK_MAXM * 2]; /* [row tile * ngrp + column group]: <= (mp / R) * (16 / C) */
  __m256i ir, ic;
  float bdec[8 * 16 * 8] __attribute__((aligned(32))); /* [column][8-code step][8] */
  int rt, cg, i;
  int64_t bl;
  {
    int idx_r[8], idx_c[8];
    for (i = 0; i < 8; i++) {
      idx_r[i] = i / C;
      idx_c[i] = i % C;
    }
    ir = _mm256_loadu_si256((const __m256i *)idx_r);
    ic = _mm256_loadu_si256((const __m256i *)idx_c);
  }
  for (i = 0; i < ntile * ngrp; i++) wv[i] = _mm256_setzero_ps();
  for (bl = 0; bl < nblk; bl++) {
    const int len = bl == nblk - 1 ? kl : kb, nfull = len / 8, nst = (len + 7) / 8;
    const int64_t k0 = bl * kb;
    uint8_t tails[NC][8];
    if (nst > nfull)
      for (i = 0; i < NC; i++) {
        memset(tails[i], 0, 8);
        memcpy(tails[i], cols[i] + k0 + nfull * 8, (size_t)(len - nfull * 8));
      }
    for (cg = 0; cg < ngrp; cg++) {
      const __m256 sbv = _mm256_permutevar8x32_ps(_mm256_loadu_ps(sb + bl * NC + cg * C), ic);
      if (ntile > 1) /* several row tiles: the group's codes decoded once, into L1 */
        for (i = 0; i < C * nst; i++) {
          const int c = i / nst, st = i % nst;
          _mm256_store_ps(
              bdec + (c * 16 + st) * 8,
              dec8(st < nfull ? cols[cg * C + c] + k0 + st * 8 : tails[cg * C + c], e4));
        }
      for (rt = 0; rt < ntile; rt++) {
        const float *ar = a + (int64_t)rt * R * lda + k0;
        __m256 acc[8], s;
        int st, r, c;
#pragma GCC unroll 8
        for (i = 0; i < 8; i++) acc[i] = _mm256_setzero_ps();
        st = 0;
        if (ntile == 1) /* pairs of steps: 16 codes decoded at once */
          for (; st + 1 < nfull; st += 2) {
            __m256 av[4], aw[4];
#pragma GCC unroll 4
            for (r = 0; r < R; r++) {
              av[r] = _mm256_loadu_ps(ar + r * lda + st * 8);
              aw[r] = _mm256_loadu_ps(ar + r * lda + st * 8 + 8);
            }
#pragma GCC unroll 8
            for (c = 0; c < C; c++) {
              __m256 b0, b1;
              dec16(cols[cg * C + c] + k0 + st * 8, e4, &b0, &b1);
#pragma GCC unroll 4
              for (r = 0; r < R; r++) {
                acc[r * C + c] = _mm256_fmadd_ps(av[r], b0, acc[r * C + c]);
                acc[r * C + c] = _mm256_fmadd_ps(aw[r], b1, acc[r * C + c]);
              }
            }
          }
        for (; st < nst; st++) {
          __m256 av[4];
#pragma GCC unroll 8
          for (r = 0; r < R; r++) av[r] = _mm256_loadu_ps(ar + r * lda + st * 8);
#pragma GCC unroll 16
          for (c = 0; c < C; c++) {
            const uint8_t *bp = st < nfull ? cols[cg * C + c] + k0 + st * 8 : tails[cg * C + c];
            const __m256 bv = ntile > 1 ? _mm256_load_ps(bdec + (c * 16 + st) * 8) : dec8(bp, e4);
#pragma GCC unroll 8
            for (r = 0; r < R; r++) acc[r * C + c] = _mm256_fmadd_ps(av[r], bv, acc[r * C + c]);
          }
        }
        s = _mm256_mul_ps(_mm256_permutevar8x32_ps(_mm256_loadu_ps(sa + bl * mp + rt * R), ir),
                          sbv);
        wv[rt * ngrp + cg] = _mm256_fmadd_ps(reduce8(acc), s, wv[rt * ngrp + cg]);
      }
    }
  }
  for (rt = 0; rt < ntile; rt++)
    for (cg = 0; cg < ngrp; cg++) {
      float o[8];
      int r, c;
      _mm256_storeu_ps(o, wv[rt * ngrp + cg]);
      for (r = 0; r < R; r++)
        for (c = 0; c < C; c++) w[(rt * R + r) * NC + cg * C + c] = o[r * C + c];
    }
}

void xte_gemm_fast_small_avx2(int m, int mp, int64_t nblk, int kb, int kl, const float *a,
                              int64_t lda, const float *sa, const uint8_t *const *cols, int fmt,
                              const float *sb, float *w) {
  const int e4 = fmt == XTE_FP8_E4M3;
  if (m == 1)
    fs_run(1, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
  else if (m == 2)
    fs_run(2, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
  else
    fs_run(4, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
}

/* The FAST small-M kernel (xte_gemm_fs_fn, src/cpu/gemm_kernels.h; the driver is
 * src/cpu/gemm_fast_small.c) written once over a small vector layer, compiled per ISA:
 * src/cpu/avx2/gemm_fast_small_avx2.c (8 fp32 lanes) and src/cpu/avx512/gemm_fast_small_avx512.c
 * (16 lanes, natively and against SIMDe) define the layer below and include this file.
 *
 * B's codes go straight into fp32 FMAs: FS_W codes at a time to their fp16 images (e4m3: sign and
 * the 7 low bits moved into place, value * 2^-8, NaN codes made fp16 NaN; e5m2: the code is the
 * fp16's top byte), vcvtph2ps, one FMA per row of A (A's rows, decoded by the driver, come from
 * L1: a block of them is at most 32 x 128 fp32). Register tiles of R rows x C columns,
 * R * C = FS_W accumulators of FS_W lanes; lane l of an accumulator sums the products of the K
 * steps l, l + FS_W, ... of the block in K order. Per block the FS_W accumulators reduce to one
 * vector (lane i: tile element i = r * C + c) and the contract's update runs on that vector:
 * acc = fma(p, sa * sb, acc). With several row tiles the column group's codes are decoded once
 * per block into an L1 buffer that every row tile reads. A block's last codes (past a multiple of
 * FS_W) are copied into a zeroed buffer first: nothing past K is read.
 *
 * The including file defines, before including this file:
 *   FS_W                 the fp32 lanes of fsv (8 or 16)
 *   fsv, fsi             the fp32 vector type and an int32 vector of FS_W lanes
 *   fs_zero() fs_ld(p) fs_lda(p) fs_sta(p, v) fs_stu(p, v) fs_fma(a, b, c) fs_mul(a, b)
 *                        +0; load; aligned load; aligned store; store; a b + c; a b
 *   fs_ildu(p)           fsi from FS_W ints
 *   fs_perm(v, i)        lane j = v[i[j]]
 *   fs_dec1(p, e4)       FS_W codes at p to fp32 (the fp16 images' values)
 *   fs_dec2(p, e4, lo, hi)  2 FS_W codes: fs_dec1 of p and p + FS_W
 *   fs_reduce(v)         lane i = the sum of the FS_W lanes of v[i], for FS_W vectors v
 *   fs_prefetch(p)       (optional) a prefetch of the cache line of p
 *   FS_FN                the kernel's name
 * (src/cpu/fp8_f16_image.h has the integer steps of the decoders.) It defines the kernel FS_FN. */
#ifndef XTE_CPU_GEMM_FAST_SMALL_TEMPLATE_H
#define XTE_CPU_GEMM_FAST_SMALL_TEMPLATE_H

#include <string.h>

#include "cpu/gemm_kernels.h"

#define FS_STR_(x) #x
#define FS_STR(x) FS_STR_(x)
/* Unrolling hints for the optimizing builds only: at -O0 (the check_kernels_O0 build) GCC warns
 * that it ignores the annotation of a loop whose bound makes it vanish (r < R && R < 8 with R >=
 * 8), and warnings are errors. The optimized code is the same either way. */
#ifdef __OPTIMIZE__
#define FS_UNROLL(n) _Pragma(FS_STR(GCC unroll n))
#else
#define FS_UNROLL(n)
#endif
#define FS_AI inline __attribute__((always_inline))
#define FS_NC XTE_GEMM_FS_NC
#define FS_SPB (128 / FS_W)                      /* FS_W-code steps in a block of at most 128 */
#define FS_PF 1024                               /* software prefetch distance along a column */
#define FS_NWV (XTE_GEMM_SK_MAXM * FS_NC / FS_W) /* tile vectors of the fp32 accumulators */
#ifndef fs_prefetch
#define fs_prefetch(p) ((void)(p))
#endif

/* Tiles of R rows x C = FS_W / R columns; every row tile and column group of the FS_NC columns */
static FS_AI void fs_run(const int R, int m, int mp, int64_t nblk, int kb, int kl, const float *a,
                         int64_t lda, const float *sa, const uint8_t *const *cols, int e4,
                         const float *sb, float *w) {
  const int C = FS_W / R, ngrp = FS_NC / C, ntile = (m + R - 1) / R;
  fsv wv[FS_NWV]; /* [row tile * ngrp + column group] */
  fsi ir, ic;
  float bdec[FS_W * 128] __attribute__((aligned(64))); /* [column][step][FS_W] */
  const int64_t kend = (nblk - 1) * kb + kl;
  int rt, cg, i, pf;
  int64_t bl;
  {
    int idx_r[FS_W], idx_c[FS_W];
    for (i = 0; i < FS_W; i++) {
      idx_r[i] = i / C;
      idx_c[i] = i % C;
    }
    ir = fs_ildu(idx_r);
    ic = fs_ildu(idx_c);
  }
  for (i = 0; i < ntile * ngrp; i++) wv[i] = fs_zero();
  for (bl = 0; bl < nblk; bl++) {
    const int len = bl == nblk - 1 ? kl : kb, nfull = len / FS_W, nst = (len + FS_W - 1) / FS_W;
    const int64_t k0 = bl * kb;
    uint8_t tails[FS_NC][FS_W];
    if (nst > nfull)
      for (i = 0; i < FS_NC; i++) {
        memset(tails[i], 0, FS_W);
        memcpy(tails[i], cols[i] + k0 + nfull * FS_W, (size_t)(len - nfull * FS_W));
      }
    /* the columns' codes FS_PF bytes ahead (the hardware prefetchers alone leave the 16 streams
     * waiting on memory), up to the end of K */
    if (k0 + FS_PF + kb <= kend)
      for (i = 0; i < FS_NC; i++)
        for (pf = 0; pf < kb; pf += 64) fs_prefetch(cols[i] + k0 + FS_PF + pf);
    for (cg = 0; cg < ngrp; cg++) {
      const fsv sbv = fs_perm(fs_ld(sb + bl * FS_NC + cg * C), ic);
      if (ntile > 1) /* several row tiles: the group's codes decoded once, into L1 */
        for (i = 0; i < C; i++) {
          const uint8_t *col = cols[cg * C + i] + k0;
          float *bd = bdec + i * FS_SPB * FS_W;
          int st;
          for (st = 0; st + 1 < nfull; st += 2) {
            fsv b0, b1;
            fs_dec2(col + st * FS_W, e4, &b0, &b1);
            fs_sta(bd + st * FS_W, b0);
            fs_sta(bd + (st + 1) * FS_W, b1);
          }
          for (; st < nst; st++)
            fs_sta(bd + st * FS_W, fs_dec1(st < nfull ? col + st * FS_W : tails[cg * C + i], e4));
        }
      for (rt = 0; rt < ntile; rt++) {
        const float *ar = a + (int64_t)rt * R * lda + k0;
        fsv acc[FS_W], s;
        int st, r, c;
        FS_UNROLL(16)
        for (i = 0; i < FS_W; i++) acc[i] = fs_zero();
        st = 0;
        if (ntile == 1) /* pairs of steps: 2 FS_W codes decoded at once; A's vectors held in
                           registers up to 4 rows, past that read by the FMAs themselves */
          for (; st + 1 < nfull; st += 2) {
            fsv av[4], aw[4];
            FS_UNROLL(4)
            for (r = 0; r < R && R < 8; r++) {
              av[r] = fs_ld(ar + r * lda + st * FS_W);
              aw[r] = fs_ld(ar + r * lda + st * FS_W + FS_W);
            }
            FS_UNROLL(16)
            for (c = 0; c < C; c++) {
              fsv b0, b1;
              fs_dec2(cols[cg * C + c] + k0 + st * FS_W, e4, &b0, &b1);
              FS_UNROLL(8)
              for (r = 0; r < R; r++) {
                const float *ap = ar + r * lda + st * FS_W;
                acc[r * C + c] = fs_fma(R < 8 ? av[r] : fs_ld(ap), b0, acc[r * C + c]);
                acc[r * C + c] = fs_fma(R < 8 ? aw[r] : fs_ld(ap + FS_W), b1, acc[r * C + c]);
              }
            }
          }
        for (; st < nst; st++) {
          fsv av[4];
          FS_UNROLL(4)
          for (r = 0; r < R && R < 8; r++) av[r] = fs_ld(ar + r * lda + st * FS_W);
          FS_UNROLL(16)
          for (c = 0; c < C; c++) {
            const fsv bv = ntile > 1 ? fs_lda(bdec + (c * FS_SPB + st) * FS_W)
                                     : fs_dec1(st < nfull ? cols[cg * C + c] + k0 + st * FS_W
                                                          : tails[cg * C + c],
                                               e4);
            FS_UNROLL(16)
            for (r = 0; r < R; r++)
              acc[r * C + c] =
                  fs_fma(R < 8 ? av[r] : fs_ld(ar + r * lda + st * FS_W), bv, acc[r * C + c]);
          }
        }
        s = fs_mul(fs_perm(fs_ld(sa + bl * mp + rt * R), ir), sbv);
        wv[rt * ngrp + cg] = fs_fma(fs_reduce(acc), s, wv[rt * ngrp + cg]);
      }
    }
  }
  for (rt = 0; rt < ntile; rt++)
    for (cg = 0; cg < ngrp; cg++) {
      float o[FS_W];
      int r, c;
      fs_stu(o, wv[rt * ngrp + cg]);
      for (r = 0; r < R; r++)
        for (c = 0; c < C; c++) w[(rt * R + r) * FS_NC + cg * C + c] = o[r * C + c];
    }
}

void FS_FN(int m, int mp, int64_t nblk, int kb, int kl, const float *a, int64_t lda,
           const float *sa, const uint8_t *const *cols, int fmt, const float *sb, float *w) {
  const int e4 = fmt == XTE_FP8_E4M3;
  /* Up to 8 rows: one row tile, the smallest that holds them (each code decoded once per block,
   * in registers). More rows: tiles of 4 rows x FS_W / 4 columns over the codes decoded into L1
   * (R + C loads per R C FMAs: taller tiles of fewer columns wait on the loads). The tile shape
   * changes no byte: each output's lanes and their reduction are the same. */
  if (m == 1)
    fs_run(1, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
  else if (m == 2)
    fs_run(2, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
  else if (m <= 4)
    fs_run(4, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
  else if (m <= 8)
    fs_run(8, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
  else
    fs_run(4, m, mp, nblk, kb, kl, a, lda, sa, cols, e4, sb, w);
}

#endif /* XTE_CPU_GEMM_FAST_SMALL_TEMPLATE_H */

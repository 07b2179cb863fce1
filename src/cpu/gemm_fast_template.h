/* The FAST GEMM micro-kernel (xte_gemm_fast_tile_fn, src/cpu/gemm_kernels.h) written once over a
 * small fp32 vector layer, compiled per ISA: src/cpu/scalar/gemm_fast_scalar.c (1 lane),
 * src/cpu/avx2/gemm_fast_avx2.c (8 lanes) and src/cpu/avx512/gemm_fast_avx512.c (16 lanes,
 * natively and against SIMDe) define the layer below and include this file.
 *
 * A tile is MR rows of A (broadcast) x NR columns of B (NR / XS_W vectors), so that the
 * accumulators of a row of the tile are contiguous in the row-major fp32 accumulator array. Per K
 * block the partials start at +0 and take one multiply-add per k, in k order (xs_fma: fused on the
 * SIMD ISAs, a rounded product and a rounded sum on the scalar one): the FAST partial. Then the
 * contract's step: s = RNE_fp32(sa sb), acc = fmaf(p, s, acc) (xs_fold).
 *
 * The including file defines, before including this file:
 *   MR, NR        the tile (NR a multiple of XS_W)
 *   XS_W          the fp32 lanes of xs
 *   xs            the fp32 vector type
 *   xs_zero() xs_ld(p) xs_st(p, v) xs_1(x) xs_fma(a, b, c)   +0; load; store; broadcast; a b + c
 *   xs_fold(p, sa, sb, acc)   fmaf(p, RNE_fp32(sa sb), acc), lane by lane
 *   xs_prefetch(p)            (optional) a prefetch of the cache line of p
 * It defines the static function fast_tile. */
#ifndef XTE_CPU_GEMM_FAST_TEMPLATE_H
#define XTE_CPU_GEMM_FAST_TEMPLATE_H

#define XF_STR_(x) #x
#define XF_STR(x) XF_STR_(x)
#define XF_UNROLL(n) _Pragma(XF_STR(GCC unroll n))

#define XF_NV (NR / XS_W) /* vectors per tile row */
#ifndef xs_prefetch
#define xs_prefetch(p) ((void)(p))
#endif

static void fast_tile(int nblk, const int *kl, const float *a, const float *b, const float *sa,
                      const float *sb, float *acc, int64_t ldc) {
  int bl;
  for (bl = 0; bl < nblk; bl++) {
    const int n = kl[bl];
    xs c[MR][XF_NV];
    xs sbv[XF_NV];
    int i, v, k;
    XF_UNROLL(MR)
    for (i = 0; i < MR; i++) {
      /* the accumulators' lines, read after this block's partials */
      xs_prefetch(acc + i * ldc);
      xs_prefetch(acc + i * ldc + NR - 1);
      XF_UNROLL(XF_NV)
      for (v = 0; v < XF_NV; v++) c[i][v] = xs_zero();
    }
    for (k = 0; k < n; k++) {
      xs bv[XF_NV];
      XF_UNROLL(XF_NV)
      for (v = 0; v < XF_NV; v++) bv[v] = xs_ld(b + k * NR + v * XS_W);
      XF_UNROLL(MR)
      for (i = 0; i < MR; i++) {
        const xs av = xs_1(a[k * MR + i]);
        XF_UNROLL(XF_NV)
        for (v = 0; v < XF_NV; v++) c[i][v] = xs_fma(av, bv[v], c[i][v]);
      }
    }
    XF_UNROLL(XF_NV)
    for (v = 0; v < XF_NV; v++) sbv[v] = xs_ld(sb + bl * NR + v * XS_W);
    XF_UNROLL(MR)
    for (i = 0; i < MR; i++) {
      const xs sai = xs_1(sa[bl * MR + i]);
      XF_UNROLL(XF_NV)
      for (v = 0; v < XF_NV; v++) {
        float *o = acc + i * ldc + v * XS_W;
        xs_st(o, xs_fold(c[i][v], sai, sbv[v], xs_ld(o)));
      }
    }
    a += n * MR;
    b += n * NR;
  }
}

#endif /* XTE_CPU_GEMM_FAST_TEMPLATE_H */

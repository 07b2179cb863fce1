/* The attention micro-kernels that are one algorithm at every vector width, written once over a
 * small fp32 vector layer and compiled per ISA: src/cpu/avx2/attention_avx2.c (8 lanes) and
 * src/cpu/avx512/attention_avx512.c (16 lanes, natively and against SIMDe) define the layer below
 * and include this file, as the MoE router is shared (src/cpu/moe_router.c). Each output element
 * is the scalar kernel's sequence of IEEE operations on every ISA, so the bytes are the scalar
 * kernels'. What differs between the ISAs in more than width stays in their files: the exp, fmax,
 * visibility and logit primitives below, the GEMM's column blocking (gemm_x), the softmax
 * summation (fwd_softmax_t, bwd_p_t) and the transposed load (load_t).
 *
 * The including file defines, before including this file:
 *   XA_W            the fp32 lanes of xv
 *   XA_NAME(x)      the name of this ISA's kernel x (x##_avx2)
 *   AI              static inline __attribute__((always_inline))
 *   xv, xi          the fp32 and the int32 vector of XA_W lanes
 *   xv_ld(p) xv_st(p, v) xv_zero() xv_1(x) xv_ninf() xv_add(a, b) xv_sub(a, b) xv_mul(a, b)
 *   xv_fma(a, b, c) xv_fnma(a, b, c) xv_bcast(p)
 *                                     loads, stores, +0, broadcasts, -inf, arithmetic, +-a b + c
 *   xi_ld(p) xi_1(x) xi_mullo(a, b) xi_iota()   int32 load, broadcast, product, lanes 0..XA_W-1
 *   xv_gather(base, idx)              lane i: base[idx lane i] (scale 4)
 *   XA_PREFETCH_B(p, nv)              prefetches of the nv vectors of columns at p
 *   xv fmax_mb_v(xv mb, xv b)         xte_fmaxf(mb, b) for an mb that is no NaN
 *   int scaled_v(int scaled, const int32_t *a, const int32_t *e)
 *                                     scaled, or 2 when every slot of the XA_W columns is visible
 *   xv logit_v(const float *S, int64_t j, int scaled, xv sc, xi av, xi ev)
 *                                     the logits of slot j of XA_W columns
 * and, after including it (both declared below):
 *   gemm_x                            the GEMM's column blocking over XA_TILE and XA_ROWS
 *   xv exp_v(xv x)                    xte_expf lane by lane, from exp_poly_v This file defines
 * tile, block_max and the kernels gemm, gemm_fold, exp_sub, rescale, dot_rows and exp_n of
 * xte_attn_kernels (src/cpu/attention_kernels.h), named by XA_NAME. */
#ifndef XTE_CPU_ATTENTION_TEMPLATE_H
#define XTE_CPU_ATTENTION_TEMPLATE_H

/* xte_expf's range reduction and polynomial, lane by lane (the same steps with the same
 * constants, xte_math.h): *kp = k = rint(x log2(e)) and the result p, xte_expf(x) being
 * (1 + p) 2^k where no special case is taken */
AI xv exp_poly_v(xv x, xv *kp) {
  const xv magic = xv_1(XTE_RINT_MAGIC);
  const xv k = xv_sub(xv_add(xv_mul(x, xv_1(1.44269502162933349609375f)), magic), magic);
  xv r = xv_fnma(k, xv_1(0.693147182464599609375f), x);
  xv p;
  r = xv_fnma(k, xv_1(-1.904654323148236e-09f), r);
  p = xv_1(2.48015873015873e-05f);
  p = xv_fma(p, r, xv_1(1.98412698412698e-04f));
  p = xv_fma(p, r, xv_1(1.38888888888889e-03f));
  p = xv_fma(p, r, xv_1(8.33333333333333e-03f));
  p = xv_fma(p, r, xv_1(4.16666666666667e-02f));
  p = xv_fma(p, r, xv_1(1.66666666666667e-01f));
  p = xv_fma(p, r, xv_1(0.5f));
  *kp = k;
  return xv_fma(p, xv_mul(r, r), r);
}

/* xte_expf lane by lane, defined by the including file */
AI xv exp_v(xv x);

/* XTE_ATTENTION_FAST's exp lane by lane (docs/numerics.md section 7, "FAST"), defined by the
 * including file */
AI xv exp_fast_v(xv x);

/* The FAST exp's constants: exp(x) = 2^k exp(r), k = rint(x log2(e)), r = x - k ln2 in two
 * steps (ln2 = XF_LN2_HI + XF_LN2_LO), exp(r) = 1 + r (1 + r (c0 + r (c1 + r (c2 + r c3)))), a
 * degree-5 polynomial fitted for the least maximum relative error on |r| <= ln2 / 2 (1.05e-7 in
 * exact arithmetic). x < XF_EXP_LO (and -inf) gives +0: |exp(x)| < 2.7e-38 there; x > 88.7228
 * gives +inf; NaN gives NaN. */
#define XF_EXP_LO (-86.5f)
#define XF_LN2_HI 0.693145751953125f
#define XF_LN2_LO 1.428606765330187e-06f
#define XF_C0 0.499992311000824f
#define XF_C1 0.16667114198207855f
#define XF_C2 0.04189009591937065f
#define XF_C3 0.008312494494020939f

/* The FAST exp's reduction and polynomial, lane by lane: exp(r) ~ 1 + r q for k = rint(x
 * log2(e)) given, x <= 89 (the caller clamps) */
AI xv exp_fast_poly_v(xv x, xv k) {
  xv r = xv_fnma(k, xv_1(XF_LN2_HI), x), q;
  r = xv_fnma(k, xv_1(XF_LN2_LO), r);
  q = xv_fma(xv_1(XF_C3), r, xv_1(XF_C2));
  q = xv_fma(q, r, xv_1(XF_C1));
  q = xv_fma(q, r, xv_1(XF_C0));
  q = xv_fma(q, r, xv_1(1.0f));
  return xv_fma(q, r, xv_1(1.0f));
}

/* mr rows x nv vectors of XA_W columns: the chains start from C0 (NULL: +0); mode 0 stores them
 * to D, mode 1 stores D + chain (xte_attn_add), mode 2 fmaf(D, alpha[row], chain)
 * (xte_attn_rescale) */
AI void tile(const int mr, const int nv, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
             const float *B, int64_t ldb, const float *C0, int64_t ldc0, float *D, int64_t ldd,
             const int mode, const float *alpha) {
  xv c[6][4];
  int i, v;
  int64_t k;
  for (i = 0; i < mr; i++)
    for (v = 0; v < nv; v++) c[i][v] = C0 ? xv_ld(C0 + i * ldc0 + XA_W * v) : xv_zero();
  /* prefetches (no effect on any value): the next tile's rows of A when they are rows read in
   * place from a tensor (4 KiB apart, where the hardware prefetchers do not follow; rows of a
   * packed copy or workspace need none) */
  if (a_ks == 1 && a_rs > 256)
    for (i = 0; i < mr; i++)
      for (k = 0; k < K; k += 16) __builtin_prefetch(A + (mr + i) * a_rs + k, 0, 3);
  for (k = 0; k < K; k++) {
    const float *b = B + k * ldb, *a = A + k * a_ks;
    xv bv[4];
    /* B's rows 4 ahead when they are rows of a tensor read in place */
    if (ldb > 256 && k + 4 < K) XA_PREFETCH_B(b + 4 * ldb, nv);
    for (v = 0; v < nv; v++) bv[v] = xv_ld(b + XA_W * v);
    for (i = 0; i < mr; i++) {
      xv av = xv_bcast(a + i * a_rs);
      for (v = 0; v < nv; v++) c[i][v] = xv_fma(av, bv[v], c[i][v]);
    }
  }
  for (i = 0; i < mr; i++) {
    const xv al = mode == 2 ? xv_1(alpha[i]) : xv_zero();
    for (v = 0; v < nv; v++) {
      float *d = D + i * ldd + XA_W * v;
      if (mode == 1)
        c[i][v] = xv_add(xv_ld(d), c[i][v]);
      else if (mode == 2)
        c[i][v] = xv_fma(xv_ld(d), al, c[i][v]);
      xv_st(d, c[i][v]);
    }
  }
}

/* the tiles of MR rows x NV vectors at row r, column c0 (gemm_x's variables) */
#define XA_TILE(MR, NV)                                                                   \
  tile(MR, NV, K, A + r * a_rs, a_rs, a_ks, b, ldb, C0 ? C0 + c0 + r * ldc0 : NULL, ldc0, \
       D + c0 + r * ldd, ldd, mode, alpha ? alpha + r : NULL)

/* every row, 6 at a time, then the rest: NV vectors of columns from c0 */
#define XA_ROWS(NV)                                 \
  do {                                              \
    for (r = 0; r + 6 <= M; r += 6) XA_TILE(6, NV); \
    switch (M - r) {                                \
      case 5:                                       \
        XA_TILE(5, NV);                             \
        break;                                      \
      case 4:                                       \
        XA_TILE(4, NV);                             \
        break;                                      \
      case 3:                                       \
        XA_TILE(3, NV);                             \
        break;                                      \
      case 2:                                       \
        XA_TILE(2, NV);                             \
        break;                                      \
      case 1:                                       \
        XA_TILE(1, NV);                             \
        break;                                      \
      default:                                      \
        break;                                      \
    }                                               \
  } while (0)

/* the chains of every row and column (mode and alpha as in tile), defined by the including file */
AI void gemm_x(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
               const float *B, int64_t ldb, const float *C0, int64_t ldc0, float *D, int64_t ldd,
               const int mode, const float *alpha);

static void XA_NAME(gemm)(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs,
                          int64_t a_ks, const float *B, int64_t ldb, float *C, int64_t ldc,
                          int acc) {
  gemm_x(M, N, K, A, a_rs, a_ks, B, ldb, acc ? C : NULL, ldc, C, ldc, 0, NULL);
}

/* the chains (from C0, NULL: +0) folded into D: D + chain (alpha NULL) or fmaf(D, alpha[r], chain)
 */
static void XA_NAME(gemm_fold)(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs,
                               int64_t a_ks, const float *B, int64_t ldb, const float *C0,
                               int64_t ldc0, float *D, int64_t ldd, const float *alpha) {
  if (alpha)
    gemm_x(M, N, K, A, a_rs, a_ks, B, ldb, C0, ldc0, D, ldd, 2, alpha);
  else
    gemm_x(M, N, K, A, a_rs, a_ks, B, ldb, C0, ldc0, D, ldd, 1, NULL);
}

/* xte_attn_exp lane by lane: xte_expf(x - m) */
static void XA_NAME(exp_sub)(const float *x, float m, int64_t n, float *p) {
  int64_t j;
  const xv mv = xv_1(m);
  for (j = 0; j + XA_W <= n; j += XA_W) xv_st(p + j, exp_v(xv_sub(xv_ld(x + j), mv)));
  for (; j < n; j++) p[j] = xte_attn_exp(x[j], m);
}

/* xte_attn_rescale lane by lane: fmaf(o, alpha, pv) */
static void XA_NAME(rescale)(float *o, float alpha, const float *pv, int64_t n) {
  int64_t c;
  const xv av = xv_1(alpha);
  for (c = 0; c + XA_W <= n; c += XA_W) xv_st(o + c, xv_fma(xv_ld(o + c), av, xv_ld(pv + c)));
  for (; c < n; c++) o[c] = xte_attn_rescale(o[c], alpha, pv[c]);
}

/* The block maxima of ng groups of XA_W columns at once (independent fmax chains side by side;
 * each lane's chain in slot order, as the scalar kernel's) */
AI void block_max(const int ng, const float *S, int64_t ld, int scaled, xv sc, const int32_t *a,
                  const int32_t *e, xv *mb) {
  xi av[4], ev[4];
  int64_t j;
  int q, all = scaled != 0;
  for (q = 0; q < ng; q++) {
    av[q] = xi_ld(a + XA_W * q);
    ev[q] = xi_ld(e + XA_W * q);
    mb[q] = xv_ninf();
    if (scaled_v(scaled, a + XA_W * q, e + XA_W * q) != 2) all = 0;
  }
  if (all) {
    for (j = 0; j < 64; j++)
      for (q = 0; q < ng; q++) mb[q] = fmax_mb_v(mb[q], xv_mul(xv_ld(S + j * ld + XA_W * q), sc));
    return;
  }
  for (j = 0; j < 64; j++)
    for (q = 0; q < ng; q++)
      mb[q] = fmax_mb_v(mb[q], logit_v(S + j * ld + XA_W * q, j, scaled, sc, av[q], ev[q]));
}

/* XA_W rows per vector (gathers), each lane the scalar chain; the rows past a multiple of XA_W
 * one by one */
static void XA_NAME(dot_rows)(int64_t n, int64_t d, const float *X, const float *Y, int64_t ld,
                              float *out) {
  int64_t r = 0, c;
  const xi idx = xi_mullo(xi_iota(), xi_1((int)ld));
  if (ld <= INT32_MAX / XA_W)
    for (; r + XA_W <= n; r += XA_W) {
      xv acc = xv_zero();
      for (c = 0; c < d; c++)
        acc = xv_fma(xv_gather(X + r * ld + c, idx), xv_gather(Y + r * ld + c, idx), acc);
      xv_st(out + r, acc);
    }
  for (; r < n; r++) {
    float acc = 0.0f;
    for (c = 0; c < d; c++) acc = xte_fmaf(X[r * ld + c], Y[r * ld + c], acc);
    out[r] = acc;
  }
}

/* every element through the lanes, the tail too (tests) */
static void XA_NAME(exp_n)(const float *x, float *y, int64_t n) {
  int64_t j;
  float t[XA_W] = {0};
  for (j = 0; j + XA_W <= n; j += XA_W) xv_st(y + j, exp_v(xv_ld(x + j)));
  if (j < n) {
    memcpy(t, x + j, (size_t)(n - j) * sizeof(float));
    xv_st(t, exp_v(xv_ld(t)));
    memcpy(y + j, t, (size_t)(n - j) * sizeof(float));
  }
}

/* exp_sub through the FAST exp (n a multiple of XA_W) */
static void XA_NAME(exp_sub_fast)(const float *x, float m, int64_t n, float *p) {
  int64_t j;
  const xv mv = xv_1(m);
  for (j = 0; j < n; j += XA_W) xv_st(p + j, exp_fast_v(xv_sub(xv_ld(x + j), mv)));
}

/* exp_n through the FAST exp */
static void XA_NAME(exp_n_fast)(const float *x, float *y, int64_t n) {
  int64_t j;
  float t[XA_W] = {0};
  for (j = 0; j + XA_W <= n; j += XA_W) xv_st(y + j, exp_fast_v(xv_ld(x + j)));
  if (j < n) {
    memcpy(t, x + j, (size_t)(n - j) * sizeof(float));
    xv_st(t, exp_fast_v(xv_ld(t)));
    memcpy(y + j, t, (size_t)(n - j) * sizeof(float));
  }
}

#endif /* XTE_CPU_ATTENTION_TEMPLATE_H */

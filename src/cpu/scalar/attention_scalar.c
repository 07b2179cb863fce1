/* Scalar attention micro-kernels: the reference the SIMD kernels reproduce bit for bit. */
#include "cpu/xte_cpu.h"
#include "numerics/xte_attention_numerics.h"
#include "cpu/attention_kernels.h"

static void gemm_scalar(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                        const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
  int64_t r, c, k;
  float t[16];
  for (r = 0; r < M; r++) {
    const float *a = A + r * a_rs;
    float *cr = C + r * ldc;
    for (c = 0; c < N; c += 16) {
      int64_t u;
      for (u = 0; u < 16; u++) t[u] = acc ? cr[c + u] : 0.0f;
      for (k = 0; k < K; k++) {
        const float av = a[k * a_ks];
        const float *b = B + k * ldb + c;
        for (u = 0; u < 16; u++) t[u] = xte_fmaf(av, b[u], t[u]);
      }
      for (u = 0; u < 16; u++) cr[c + u] = t[u];
    }
  }
}

static void gemm_fold_scalar(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs,
                             int64_t a_ks, const float *B, int64_t ldb, const float *C0,
                             int64_t ldc0, float *D, int64_t ldd, const float *alpha) {
  int64_t r, c, k;
  float t[16];
  for (r = 0; r < M; r++) {
    const float *a = A + r * a_rs;
    float *dr = D + r * ldd;
    for (c = 0; c < N; c += 16) {
      int64_t u;
      for (u = 0; u < 16; u++) t[u] = C0 ? C0[r * ldc0 + c + u] : 0.0f;
      for (k = 0; k < K; k++) {
        const float av = a[k * a_ks];
        const float *b = B + k * ldb + c;
        for (u = 0; u < 16; u++) t[u] = xte_fmaf(av, b[u], t[u]);
      }
      for (u = 0; u < 16; u++)
        dr[c + u] =
            alpha ? xte_attn_rescale(dr[c + u], alpha[r], t[u]) : xte_attn_add(dr[c + u], t[u]);
    }
  }
}

static void dot_rows_scalar(int64_t n, int64_t d, const float *X, const float *Y, int64_t ld,
                            float *out) {
  int64_t r, c;
  for (r = 0; r < n; r++) {
    float acc = 0.0f;
    for (c = 0; c < d; c++) acc = xte_fmaf(X[r * ld + c], Y[r * ld + c], acc);
    out[r] = acc;
  }
}

static void exp_sub_scalar(const float *x, float m, int64_t n, float *p) {
  int64_t j;
  for (j = 0; j < n; j++) p[j] = xte_attn_exp(x[j], m);
}

static void rescale_scalar(float *o, float alpha, const float *pv, int64_t n) {
  int64_t c;
  for (c = 0; c < n; c++) o[c] = xte_attn_rescale(o[c], alpha, pv[c]);
}

static void exp_n_scalar(const float *x, float *y, int64_t n) {
  int64_t j;
  for (j = 0; j < n; j++) y[j] = xte_expf(x[j]);
}

static void fwd_softmax_t_scalar(const float *S, int64_t ld, int64_t n, int scaled, float scale,
                                 const int32_t *a, const int32_t *e, float *m, float *l,
                                 float *alpha, float *P) {
  int64_t r, j;
  float x[64], p[64];
  for (r = 0; r < n; r++) {
    float mb = xte_attn_neg_inf();
    for (j = 0; j < 64; j++) {
      const float s = S[j * ld + r];
      x[j] = !scaled ? s : (j >= a[r] && j < e[r]) ? s * scale : xte_attn_neg_inf();
      mb = xte_fmaxf(mb, x[j]);
    }
    alpha[r] = xte_attn_new_max(&m[r], mb);
    for (j = 0; j < 64; j++) p[j] = xte_attn_exp(x[j], m[r]);
    l[r] = xte_fmaf(l[r], alpha[r], xte_attn_sum64(p));
    for (j = 0; j < 64; j++) P[j * ld + r] = p[j];
  }
}

static void bwd_p_t_scalar(const float *S, const float *dP, const float *G, int64_t ld, int64_t n,
                           int scaled, float scale, const int32_t *a, const int32_t *e,
                           const float *L, const float *C, const float *D, float *P, float *dS,
                           float *sum) {
  int64_t r, j;
  float p[64];
  for (r = 0; r < n; r++) {
    for (j = 0; j < 64; j++) {
      const float s = S[j * ld + r];
      const float x = !scaled ? s : (j >= a[r] && j < e[r]) ? s * scale : xte_attn_neg_inf();
      p[j] = xte_attn_exp(x - L[r], C ? C[r] : 0.0f);
      P[j * ld + r] = p[j];
      dS[j * ld + r] = xte_attn_ds(p[j], dP[j * ld + r], D[r], G ? G[j * ld + r] : scale);
    }
    if (sum) sum[r] = xte_attn_sum64(p);
  }
}

static void load_t_scalar(const float *X, int64_t ldx, int64_t n, int64_t d, float *dst) {
  int64_t r, k;
  for (k = 0; k < d; k++)
    for (r = 0; r < XTE_ATTN_BM; r++) dst[k * XTE_ATTN_BM + r] = r < n ? X[r * ldx + k] : 0.0f;
}

const xte_attn_kernels xte_attn_kernels_scalar = {
    XTE_CPU_ISA_SCALAR,
    gemm_scalar,
    exp_sub_scalar,
    rescale_scalar,
    fwd_softmax_t_scalar,
    bwd_p_t_scalar,
    exp_n_scalar,
    gemm_fold_scalar,
    dot_rows_scalar,
    load_t_scalar,
    NULL /* XTE_ATTENTION_FAST runs these kernels (without the backward's renormalisation) */};

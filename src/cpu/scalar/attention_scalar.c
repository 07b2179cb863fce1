/* Scalar attention micro-kernels: the reference the SIMD kernels reproduce bit for bit. */
#include "cpu/xte_cpu.h"
#include "numerics/xte_attention_numerics.h"
#include "xte_attention_ops.h"

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

const xte_attn_kernels xte_attn_kernels_scalar = {XTE_CPU_ISA_SCALAR, gemm_scalar, exp_sub_scalar,
                                                  rescale_scalar, exp_n_scalar};

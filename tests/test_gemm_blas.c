/* xte_gemm against OpenBLAS cblas_dgemm on the dequantized operands (a * scale_inv, exact in
 * fp64). The contract gives the bound (docs/numerics.md section 6):
 *   |D - V| <= (nb + 2) * 2^-24 * S + u_out * |V| (+ the dgemm's own K * 2^-53 * S)
 * with V the exact product of the dequantized operands, S = sum_k |a_k * sa * b_k * sb|, nb the
 * number of K blocks, u_out = 0 (fp32 out) or 2^-8 (bf16 out). It runs on the ISA in use: ctest
 * runs it once per ISA with XTE_CPU_ISA (test_gemm_blas@<isa>), which must then be the one in use.
 * The bound assumes normal fp32 scale products (docs/numerics.md); these inputs keep to them. */
#include <cblas.h>
#include <criterion/criterion.h>
#include <stdio.h>

#include "test_gemm_oracle.h"

static double *dequant(const lop *l, int kblock) {
  double *x = malloc(sizeof(double) * (size_t)(l->rows * l->K + 1));
  int64_t i, k;
  for (i = 0; i < l->rows; i++)
    for (k = 0; k < l->K; k++) {
      int kind;
      int64_t v = o_decode(l->codes[i * l->K + k], l->dt, &kind);
      x[i * l->K + k] = ldexp((double)v, -16) * (double)l->scales[i * l->nkb + k / kblock];
    }
  return x;
}

static double *absd(const double *x, int64_t n) {
  double *y = malloc(sizeof(double) * (size_t)(n + 1));
  int64_t i;
  for (i = 0; i < n; i++) y[i] = fabs(x[i]);
  return y;
}

static void check(xte_scaling_mode ma, xte_recipe ra, xte_scaling_mode mb, xte_recipe rb,
                  xte_dtype da, xte_dtype db, int64_t M, int64_t N, int64_t K, xte_dtype d_dt,
                  uint64_t seed) {
  float *xa = o_random(M, K, seed), *xb = o_random(N, K, seed + 1);
  int kblock = ma == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  int64_t nb = o_cdiv(K, kblock), i;
  double u_out = d_dt == XTE_DTYPE_BF16 ? ldexp(1.0, -8) : 0.0;
  tq qa, qb;
  lop la, lb;
  double *A, *B, *V, *Aa, *Ba, *S, worst = 0.0;
  void *d = malloc(4 * (size_t)(M * N));
  xte_tensor D = xte_tensor_2d(d, d_dt, M, N);
  const char *env = getenv("XTE_CPU_ISA");
  if (env && *env)
    cr_assert_str_eq(xte_cpu_isa_name(xte_cpu_get_isa()), env,
                     "XTE_CPU_ISA=%s but the library runs %s", env,
                     xte_cpu_isa_name(xte_cpu_get_isa()));
  cr_assert_eq(tq_make(&qa, xa, M, K, ma, ra, XTE_SCALE_LAYOUT_COMPACT, da), XTE_SUCCESS);
  cr_assert_eq(tq_make(&qb, xb, N, K, mb, rb, XTE_SCALE_LAYOUT_COMPACT, db), XTE_SUCCESS);
  tq_logical(&qa, 0, &la);
  tq_logical(&qb, 0, &lb);
  A = dequant(&la, kblock);
  B = dequant(&lb, kblock);
  Aa = absd(A, M * K);
  Ba = absd(B, N * K);
  V = malloc(sizeof(double) * (size_t)(M * N));
  S = malloc(sizeof(double) * (size_t)(M * N));
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0, A, (int)K, B,
              (int)K, 0.0, V, (int)N);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)N, (int)K, 1.0, Aa, (int)K, Ba,
              (int)K, 0.0, S, (int)N);
  cr_assert_eq(xte_gemm(&qa.q, &qb.q, NULL, &D, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
  for (i = 0; i < M * N; i++) {
    double got = d_dt == XTE_DTYPE_BF16 ? (double)o_float((uint32_t)((uint16_t *)d)[i] << 16)
                                        : (double)((float *)d)[i];
    double bound = (double)(nb + 2) * ldexp(1.0, -24) * S[i] * 1.01 +
                   (double)K * ldexp(1.0, -52) * S[i] +
                   u_out * (fabs(V[i]) + (double)(nb + 2) * ldexp(1.0, -24) * S[i]);
    double err = fabs(got - V[i]);
    cr_assert(err <= bound,
              "M %lld N %lld K %lld element %lld: xte %.17g dgemm %.17g err %g > bound %g",
              (long long)M, (long long)N, (long long)K, (long long)i, got, V[i], err, bound);
    if (S[i] > 0 && err / S[i] > worst) worst = err / S[i];
  }
  cr_log_info("%s: M %lld N %lld K %lld out %s: worst |err| / S = %.3g (bound %.3g + u_out)",
              xte_cpu_isa_name(xte_cpu_get_isa()), (long long)M, (long long)N, (long long)K,
              d_dt == XTE_DTYPE_BF16 ? "bf16" : "fp32", worst, (double)(nb + 2) * ldexp(1.0, -24));
  tq_free(&qa);
  tq_free(&qb);
  lop_free(&la);
  lop_free(&lb);
  free(xa);
  free(xb);
  free(A);
  free(B);
  free(Aa);
  free(Ba);
  free(V);
  free(S);
  free(d);
}

Test(gemm_blas, block_scaled_fprop) {
  check(XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_128x128,
        XTE_RECIPE_TE_BLOCK, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 129, 300, 1000, XTE_DTYPE_FP32, 1);
  check(XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_128x128,
        XTE_RECIPE_DEEPGEMM, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 64, 512, 7168, XTE_DTYPE_BF16, 2);
}

Test(gemm_blas, hybrid_and_mx_and_per_tensor) {
  check(XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
        XTE_DTYPE_E5M2, XTE_DTYPE_E4M3, 100, 200, 2048, XTE_DTYPE_FP32, 3);
  check(XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE,
        XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, 100, 200, 1000, XTE_DTYPE_FP32, 4);
  check(XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT, XTE_SCALING_PER_TENSOR,
        XTE_RECIPE_TE_CURRENT, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 100, 200, 3000, XTE_DTYPE_BF16, 5);
}

Test(gemm_blas, model_shapes_small_m) {
  const int64_t NK[][2] = {{4096, 7168}, {7168, 2048}, {2112, 7168}};
  int i;
  for (i = 0; i < 3; i++)
    check(XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_128x128,
          XTE_RECIPE_TE_BLOCK, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 16, NK[i][0], NK[i][1],
          XTE_DTYPE_BF16, 10 + (uint64_t)i);
}

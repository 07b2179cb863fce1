/* AVX2 + FMA attention micro-kernels. Each output element is the scalar kernel's sequence of
 * IEEE operations (the fmaf chain of the GEMM runs in k order within one lane; exp is
 * xte_expf lane by lane), so the bytes are the scalar kernels'. */
#include <immintrin.h>
#include <string.h>

#include "cpu/xte_cpu.h"
#include "numerics/xte_attention_numerics.h"
#include "xte_attention_ops.h"

#define AI static inline __attribute__((always_inline))

/* mr rows x nv vectors of 8 columns */
AI void tile(const int mr, const int nv, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
             const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
  __m256 c[6][4];
  int i, v;
  int64_t k;
  for (i = 0; i < mr; i++)
    for (v = 0; v < nv; v++)
      c[i][v] = acc ? _mm256_loadu_ps(C + i * ldc + 8 * v) : _mm256_setzero_ps();
  for (k = 0; k < K; k++) {
    const float *b = B + k * ldb, *a = A + k * a_ks;
    __m256 bv[4];
    for (v = 0; v < nv; v++) bv[v] = _mm256_loadu_ps(b + 8 * v);
    for (i = 0; i < mr; i++) {
      __m256 av = _mm256_broadcast_ss(a + i * a_rs);
      for (v = 0; v < nv; v++) c[i][v] = _mm256_fmadd_ps(av, bv[v], c[i][v]);
    }
  }
  for (i = 0; i < mr; i++)
    for (v = 0; v < nv; v++) _mm256_storeu_ps(C + i * ldc + 8 * v, c[i][v]);
}

static void gemm_avx2(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                      const float *B, int64_t ldb, float *C, int64_t ldc, int acc) {
  int64_t c0, r;
  for (c0 = 0; c0 < N; c0 += 16) {
    const float *b = B + c0;
    float *cc = C + c0;
    for (r = 0; r + 6 <= M; r += 6)
      tile(6, 2, K, A + r * a_rs, a_rs, a_ks, b, ldb, cc + r * ldc, ldc, acc);
    switch (M - r) {
      case 5:
        tile(5, 2, K, A + r * a_rs, a_rs, a_ks, b, ldb, cc + r * ldc, ldc, acc);
        break;
      case 4:
        tile(4, 2, K, A + r * a_rs, a_rs, a_ks, b, ldb, cc + r * ldc, ldc, acc);
        break;
      case 3:
        tile(3, 2, K, A + r * a_rs, a_rs, a_ks, b, ldb, cc + r * ldc, ldc, acc);
        break;
      case 2:
        tile(2, 2, K, A + r * a_rs, a_rs, a_ks, b, ldb, cc + r * ldc, ldc, acc);
        break;
      case 1:
        tile(1, 2, K, A + r * a_rs, a_rs, a_ks, b, ldb, cc + r * ldc, ldc, acc);
        break;
      default:
        break;
    }
  }
}

/* xte_exp2i for k in the normal range, 8 lanes */
AI __m256 exp2i_8(__m256i k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

/* xte_ldexp_small(p, k), 8 lanes: its branches are blends */
AI __m256 ldexp_8(__m256 p, __m256i ki) {
  const __m256 lo = _mm256_mul_ps(
      _mm256_mul_ps(p, exp2i_8(_mm256_add_epi32(ki, _mm256_set1_epi32(XTE_LDEXP_SPLIT)))),
      exp2i_8(_mm256_set1_epi32(-XTE_LDEXP_SPLIT)));
  const __m256 hi = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_set1_ps(2.0f)),
                                  exp2i_8(_mm256_sub_epi32(ki, _mm256_set1_epi32(1))));
  __m256 res = _mm256_mul_ps(p, exp2i_8(ki));
  res = _mm256_blendv_ps(
      res, lo, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(XTE_LDEXP_KMIN), ki)));
  return _mm256_blendv_ps(
      res, hi, _mm256_castsi256_ps(_mm256_cmpgt_epi32(ki, _mm256_set1_epi32(XTE_LDEXP_KMAX))));
}

/* xte_expf, 8 lanes: the same steps with the same constants (xte_math.h); the special cases are
 * blends */
AI __m256 exp_8(__m256 x) {
  const __m256 magic = _mm256_set1_ps(XTE_RINT_MAGIC);
  const __m256 k = _mm256_sub_ps(
      _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269502162933349609375f)), magic), magic);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693147182464599609375f), x);
  __m256 p, res;
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-1.904654323148236e-09f), r);
  p = _mm256_set1_ps(2.48015873015873e-05f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.98412698412698e-04f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.38888888888889e-03f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.33333333333333e-03f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.16666666666667e-02f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.66666666666667e-01f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  res = ldexp_8(_mm256_add_ps(_mm256_set1_ps(1.0f), p), _mm256_cvttps_epi32(k));
  res = _mm256_blendv_ps(res, _mm256_setzero_ps(),
                         _mm256_cmp_ps(x, _mm256_set1_ps(-103.97909545898438f), _CMP_LT_OQ));
  res = _mm256_blendv_ps(res, _mm256_castsi256_ps(_mm256_set1_epi32(0x7F800000)),
                         _mm256_cmp_ps(x, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ));
  return _mm256_blendv_ps(res, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* xte_attn_exp lane by lane: xte_expf(x - m) */
static void exp_sub_avx2(const float *x, float m, int64_t n, float *p) {
  int64_t j;
  const __m256 mv = _mm256_set1_ps(m);
  for (j = 0; j + 8 <= n; j += 8)
    _mm256_storeu_ps(p + j, exp_8(_mm256_sub_ps(_mm256_loadu_ps(x + j), mv)));
  for (; j < n; j++) p[j] = xte_attn_exp(x[j], m);
}

/* xte_attn_rescale lane by lane: fmaf(o, alpha, pv) */
static void rescale_avx2(float *o, float alpha, const float *pv, int64_t n) {
  int64_t c;
  const __m256 av = _mm256_set1_ps(alpha);
  for (c = 0; c + 8 <= n; c += 8)
    _mm256_storeu_ps(o + c, _mm256_fmadd_ps(_mm256_loadu_ps(o + c), av, _mm256_loadu_ps(pv + c)));
  for (; c < n; c++) o[c] = xte_attn_rescale(o[c], alpha, pv[c]);
}

/* every element through the lanes, the tail too (tests) */
static void exp_n_avx2(const float *x, float *y, int64_t n) {
  int64_t j;
  float t[8] = {0};
  for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(y + j, exp_8(_mm256_loadu_ps(x + j)));
  if (j < n) {
    memcpy(t, x + j, (size_t)(n - j) * sizeof(float));
    _mm256_storeu_ps(t, exp_8(_mm256_loadu_ps(t)));
    memcpy(y + j, t, (size_t)(n - j) * sizeof(float));
  }
}

const xte_attn_kernels xte_attn_kernels_avx2 = {XTE_CPU_ISA_AVX2, gemm_avx2, exp_sub_avx2,
                                                rescale_avx2, exp_n_avx2};

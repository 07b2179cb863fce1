/* AVX2 + FMA attention micro-kernels. Each output element is the scalar kernel's sequence of
 * IEEE operations (the fmaf chain of the GEMM runs in k order within one lane; exp2 is
 * xte_exp2f lane by lane), so the bytes are the scalar kernels'. */
#include <immintrin.h>

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

/* xte_exp2f, 8 lanes */
AI __m256 exp2_8(__m256 x) {
  const __m256 magic = _mm256_set1_ps(12582912.0f);
  __m256 k = _mm256_sub_ps(_mm256_add_ps(x, magic), magic);
  __m256 r = _mm256_sub_ps(x, k);
  __m256 p = _mm256_set1_ps(1.3215486790144307e-06f), res;
  __m256i ki, e1, e2, e3;
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.5252733804059840e-05f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.5403530393381608e-04f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3333558146428443e-03f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(9.6181291076284772e-03f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.5504108664821580e-02f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(2.4022650695910071e-01f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(6.9314718055994531e-01f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  ki = _mm256_cvttps_epi32(k);
  e1 = _mm256_slli_epi32(_mm256_add_epi32(ki, _mm256_set1_epi32(127)), 23);
  e2 = _mm256_slli_epi32(_mm256_add_epi32(ki, _mm256_set1_epi32(127 + 64)), 23);
  e3 = _mm256_slli_epi32(_mm256_add_epi32(ki, _mm256_set1_epi32(127 - 1)), 23);
  res = _mm256_mul_ps(p, _mm256_castsi256_ps(e1));
  res = _mm256_blendv_ps(res,
                         _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e2)),
                                       _mm256_castsi256_ps(_mm256_set1_epi32(0x1F800000))),
                         _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(-125), ki)));
  res = _mm256_blendv_ps(
      res, _mm256_mul_ps(_mm256_mul_ps(p, _mm256_set1_ps(2.0f)), _mm256_castsi256_ps(e3)),
      _mm256_castsi256_ps(_mm256_cmpgt_epi32(ki, _mm256_set1_epi32(127))));
  res = _mm256_blendv_ps(res, _mm256_setzero_ps(),
                         _mm256_cmp_ps(x, _mm256_set1_ps(-150.0f), _CMP_LT_OQ));
  res = _mm256_blendv_ps(res, _mm256_castsi256_ps(_mm256_set1_epi32(0x7F800000)),
                         _mm256_cmp_ps(x, _mm256_set1_ps(128.0f), _CMP_GE_OQ));
  res = _mm256_blendv_ps(res, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return res;
}

static void exp2_sub_avx2(const float *t, float m, int64_t n, float *p) {
  int64_t j;
  const __m256 mv = _mm256_set1_ps(m);
  for (j = 0; j + 8 <= n; j += 8)
    _mm256_storeu_ps(p + j, exp2_8(_mm256_sub_ps(_mm256_loadu_ps(t + j), mv)));
  for (; j < n; j++) p[j] = xte_exp2f(t[j] - m);
}

const xte_attn_kernels xte_attn_kernels_avx2 = {XTE_CPU_ISA_AVX2, gemm_avx2, exp2_sub_avx2};

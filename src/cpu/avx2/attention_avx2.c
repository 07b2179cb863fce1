/* AVX2 + FMA attention micro-kernels. Each output element is the scalar kernel's sequence of
 * IEEE operations (the fmaf chain of the GEMM runs in k order within one lane; exp is
 * xte_expf lane by lane), so the bytes are the scalar kernels'. */
#include <immintrin.h>
#include <string.h>

#include "cpu/xte_cpu.h"
#include "numerics/xte_attention_numerics.h"
#include "cpu/attention_kernels.h"

#define AI static inline __attribute__((always_inline))

/* the vector layer of src/cpu/attention_template.h: 8 fp32 lanes */
#define XA_W 8
#define XA_NAME(x) x##_avx2
typedef __m256 xv;
typedef __m256i xi;
#define xv_ld(p) _mm256_loadu_ps(p)
#define xv_st(p, v) _mm256_storeu_ps((p), (v))
#define xv_zero() _mm256_setzero_ps()
#define xv_1(x) _mm256_set1_ps(x)
#define xv_bcast(p) _mm256_broadcast_ss(p)
#define xv_ninf() _mm256_castsi256_ps(_mm256_set1_epi32((int)0xFF800000u))
#define xv_add(a, b) _mm256_add_ps((a), (b))
#define xv_sub(a, b) _mm256_sub_ps((a), (b))
#define xv_mul(a, b) _mm256_mul_ps((a), (b))
#define xv_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define xv_fnma(a, b, c) _mm256_fnmadd_ps((a), (b), (c))
#define xi_ld(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define xi_1(x) _mm256_set1_epi32(x)
#define xi_mullo(a, b) _mm256_mullo_epi32((a), (b))
#define xi_iota() _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)
#define xv_gather(base, idx) _mm256_i32gather_ps((base), (idx), 4)
/* one 64-byte line: the 2 vectors of a row of gemm_x's B tile */
#define XA_PREFETCH_B(p, nv) __builtin_prefetch((p), 0, 3)

/* xte_fmaxf lane by lane: a NaN in a gives b, a NaN in b gives a, else a > b ? a : b */
AI __m256 fmax_v(__m256 a, __m256 b) {
  __m256 r = _mm256_blendv_ps(b, a, _mm256_cmp_ps(a, b, _CMP_GT_OQ));
  r = _mm256_blendv_ps(r, a, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
  return _mm256_blendv_ps(r, b, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

/* fmax_v(mb, b) for an mb that is no NaN (a block max chain from -inf): b where b is NaN is
 * the only case to take back */
AI __m256 fmax_mb_v(__m256 mb, __m256 b) {
  return _mm256_blendv_ps(_mm256_max_ps(mb, b), mb, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
}

/* scaled (see fwd_softmax_t) as 2 when every slot of the 8 columns a[], e[] is visible
 * (a = 0, e = 64): the logit is S * scale with no mask (the same value) */
AI int scaled_v(int scaled, const int32_t *a, const int32_t *e) {
  const __m256i av = _mm256_loadu_si256((const __m256i *)a),
                ev = _mm256_loadu_si256((const __m256i *)e);
  if (!scaled) return 0;
  return _mm256_movemask_ps(_mm256_castsi256_ps(
             _mm256_and_si256(_mm256_cmpeq_epi32(av, _mm256_setzero_si256()),
                              _mm256_cmpeq_epi32(ev, _mm256_set1_epi32(64))))) == 0xFF
             ? 2
             : 1;
}

/* the logits of slot j of 8 columns (scaled 2: all visible) */
AI __m256 logit_v(const float *S, int64_t j, int scaled, __m256 sc, __m256i av, __m256i ev) {
  const __m256 s = _mm256_loadu_ps(S);
  __m256i jv, vis;
  if (!scaled) return s;
  if (scaled == 2) return _mm256_mul_ps(s, sc);
  jv = _mm256_set1_epi32((int)j);
  /* a <= j && j < e */
  vis = _mm256_andnot_si256(_mm256_cmpgt_epi32(av, jv), _mm256_cmpgt_epi32(ev, jv));
  return _mm256_blendv_ps(_mm256_castsi256_ps(_mm256_set1_epi32((int)0xFF800000u)),
                          _mm256_mul_ps(s, sc), _mm256_castsi256_ps(vis));
}

#include "cpu/attention_template.h"

/* xte_exp2i for k in the normal range, 8 lanes */
AI __m256 exp2i_v(__m256i k) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

/* xte_ldexp_small(p, k), 8 lanes: its branches are blends, skipped when no lane takes them (the
 * usual case: the same bits) */
AI __m256 ldexp_v(__m256 p, __m256i ki) {
  const __m256i mlo = _mm256_cmpgt_epi32(_mm256_set1_epi32(XTE_LDEXP_KMIN), ki);
  const __m256i mhi = _mm256_cmpgt_epi32(ki, _mm256_set1_epi32(XTE_LDEXP_KMAX));
  __m256 res = _mm256_mul_ps(p, exp2i_v(ki));
  if (!_mm256_testz_si256(_mm256_or_si256(mlo, mhi), _mm256_or_si256(mlo, mhi))) {
    const __m256 lo = _mm256_mul_ps(
        _mm256_mul_ps(p, exp2i_v(_mm256_add_epi32(ki, _mm256_set1_epi32(XTE_LDEXP_SPLIT)))),
        exp2i_v(_mm256_set1_epi32(-XTE_LDEXP_SPLIT)));
    const __m256 hi = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_set1_ps(2.0f)),
                                    exp2i_v(_mm256_sub_epi32(ki, _mm256_set1_epi32(1))));
    res = _mm256_blendv_ps(res, lo, _mm256_castsi256_ps(mlo));
    res = _mm256_blendv_ps(res, hi, _mm256_castsi256_ps(mhi));
  }
  return res;
}

/* xte_expf, 8 lanes: exp_poly_v's reduction and polynomial, then 2^k; the special cases are
 * blends */
AI __m256 exp_v(__m256 x) {
  __m256 k, res;
  const __m256 p = exp_poly_v(x, &k);
  /* every lane in [-86, 88] (no NaN): k in [-124, 127], no branch of xte_ldexp_small and no
   * special case is taken, the result is (1 + p) 2^k (the same bits as the path below) */
  if (_mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-86.0f), _CMP_GE_OQ),
                                       _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_LE_OQ))) ==
      0xFF)
    return _mm256_mul_ps(_mm256_add_ps(_mm256_set1_ps(1.0f), p), exp2i_v(_mm256_cvttps_epi32(k)));
  res = ldexp_v(_mm256_add_ps(_mm256_set1_ps(1.0f), p), _mm256_cvttps_epi32(k));
  res = _mm256_blendv_ps(res, _mm256_setzero_ps(),
                         _mm256_cmp_ps(x, _mm256_set1_ps(-103.97909545898438f), _CMP_LT_OQ));
  res = _mm256_blendv_ps(res, _mm256_castsi256_ps(_mm256_set1_epi32(0x7F800000)),
                         _mm256_cmp_ps(x, _mm256_set1_ps(88.72283935546875f), _CMP_GT_OQ));
  return _mm256_blendv_ps(res, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* XTE_ATTENTION_FAST's exp, 8 lanes (attention_template.h's constants): x clamped to 88.75 (a
 * NaN kept: k <= 128), k = rint(x log2(e)), the polynomial times 2^(k - 1) (a normal power for
 * k in [-125, 128]) times 2 (exact, +inf past the range); lanes with x < XF_EXP_LO (-inf
 * included: k >= -125 elsewhere) give +0 */
AI __m256 exp_fast_v(__m256 x) {
  const __m256 xc = _mm256_min_ps(_mm256_set1_ps(88.75f), x);
  const __m256 k = _mm256_round_ps(_mm256_mul_ps(xc, _mm256_set1_ps(1.44269502162933349609375f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 p2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(126)), 23));
  const __m256 res = _mm256_mul_ps(_mm256_mul_ps(exp_fast_poly_v(xc, k), p2), _mm256_set1_ps(2.0f));
  return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(XF_EXP_LO), _CMP_LT_OQ), res);
}

/* the exp of the mode: fast (a constant) selects exp_fast_v */
#define XEXP(fast, y) ((fast) ? exp_fast_v(y) : exp_v(y))

/* 16 columns (2 vectors) at a time */
AI void gemm_x(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
               const float *B, int64_t ldb, const float *C0, int64_t ldc0, float *D, int64_t ldd,
               const int mode, const float *alpha) {
  int64_t c0, r;
  for (c0 = 0; c0 < N; c0 += 16) {
    const float *b = B + c0;
    XA_ROWS(2);
  }
}

/* xte_attn_sum64's slots t (chains t, t + 16, t + 32, t + 48) in the order that lets its tree
 * add each pair as soon as both halves exist: v[t] + v[t + 8], then + 4, + 2, + 1 (a binary
 * counter over q; at most four partial sums live instead of sixteen chains) */
static const int8_t sum64_order[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

/* one step of that counter: x is the chain of slot sum64_order[q]; h[] the pending halves */
AI __m256 sum64_push(int q, __m256 x, __m256 *h) {
  int lev;
  for (lev = 0; (q >> lev) & 1; lev++) x = _mm256_add_ps(h[lev], x);
  if (lev < 4) h[lev] = x;
  return x;
}

/* the scalar kernel's order, 8 columns (query rows) per vector; fast: exp_fast_v */
AI void fwd_softmax_t_x(const float *S, int64_t ld, int64_t n, int scaled, float scale,
                        const int32_t *a, const int32_t *e, float *m, float *l, float *alpha,
                        float *P, const int fast) {
  const __m256 sc = _mm256_set1_ps(scale);
  int64_t r0, r;
  int q, g;
  for (r0 = 0; r0 < n; r0 += 32) {
    __m256 mbs[4];
    /* n is a multiple of 16: four groups of 8 columns, or the last two */
    const int ng = n - r0 >= 32 ? 4 : 2;
    if (ng == 4)
      block_max(4, S + r0, ld, scaled, sc, a + r0, e + r0, mbs);
    else
      block_max(2, S + r0, ld, scaled, sc, a + r0, e + r0, mbs);
    for (g = 0; g < ng; g++) {
      __m256i av, ev;
      __m256 mo, mn, al, h[4], x = _mm256_setzero_ps();
      int sq;
      r = r0 + 8 * g;
      av = _mm256_loadu_si256((const __m256i *)(a + r));
      ev = _mm256_loadu_si256((const __m256i *)(e + r));
      mo = _mm256_loadu_ps(m + r);
      mn = fmax_v(mo, mbs[g]);
      al = XEXP(fast, _mm256_sub_ps(mo, mn));
      sq = scaled_v(scaled, a + r, e + r);
      _mm256_storeu_ps(m + r, mn);
      _mm256_storeu_ps(alpha + r, al);
      for (q = 0; q < 16; q++) {
        const int t = sum64_order[q];
        int u;
        for (u = 0; u < 4; u++) {
          const int64_t j = t + 16 * u;
          const __m256 p =
              XEXP(fast, _mm256_sub_ps(logit_v(S + j * ld + r, j, sq, sc, av, ev), mn));
          _mm256_storeu_ps(P + j * ld + r, p);
          x = u ? _mm256_add_ps(x, p) : p;
        }
        x = sum64_push(q, x, h);
      }
      _mm256_storeu_ps(l + r, _mm256_fmadd_ps(_mm256_loadu_ps(l + r), al, x));
    }
  }
}

static void fwd_softmax_t_avx2(const float *S, int64_t ld, int64_t n, int scaled, float scale,
                               const int32_t *a, const int32_t *e, float *m, float *l, float *alpha,
                               float *P) {
  fwd_softmax_t_x(S, ld, n, scaled, scale, a, e, m, l, alpha, P, 0);
}
static void fwd_softmax_t_fast_avx2(const float *S, int64_t ld, int64_t n, int scaled, float scale,
                                    const int32_t *a, const int32_t *e, float *m, float *l,
                                    float *alpha, float *P) {
  fwd_softmax_t_x(S, ld, n, scaled, scale, a, e, m, l, alpha, P, 1);
}

/* the scalar kernel's order, 8 columns (query rows) per vector; fast: exp_fast_v */
AI void bwd_p_t_x(const float *S, const float *dP, const float *G, int64_t ld, int64_t n,
                  int scaled, float scale, const int32_t *a, const int32_t *e, const float *L,
                  const float *C, const float *D, float *P, float *dS, float *sum, const int fast) {
  const __m256 sc = _mm256_set1_ps(scale);
  int64_t r;
  int q;
  for (r = 0; r < n; r += 8) {
    const __m256i av = _mm256_loadu_si256((const __m256i *)(a + r)),
                  ev = _mm256_loadu_si256((const __m256i *)(e + r));
    const __m256 Lv = _mm256_loadu_ps(L + r), Dv = _mm256_loadu_ps(D + r);
    const __m256 Cv = C ? _mm256_loadu_ps(C + r) : _mm256_setzero_ps();
    const int sq = scaled_v(scaled, a + r, e + r);
    __m256 h[4], x = _mm256_setzero_ps();
    for (q = 0; q < 16; q++) {
      const int t = sum64_order[q];
      int u;
      for (u = 0; u < 4; u++) {
        const int64_t j = t + 16 * u;
        const __m256 y = logit_v(S + j * ld + r, j, sq, sc, av, ev);
        const __m256 p = XEXP(fast, _mm256_sub_ps(_mm256_sub_ps(y, Lv), Cv));
        const __m256 g = G ? _mm256_loadu_ps(G + j * ld + r) : sc;
        _mm256_storeu_ps(P + j * ld + r, p);
        _mm256_storeu_ps(
            dS + j * ld + r,
            _mm256_mul_ps(_mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dP + j * ld + r), Dv)),
                          g));
        x = u ? _mm256_add_ps(x, p) : p;
      }
      if (sum) x = sum64_push(q, x, h);
    }
    if (sum) _mm256_storeu_ps(sum + r, x);
  }
}

static void bwd_p_t_avx2(const float *S, const float *dP, const float *G, int64_t ld, int64_t n,
                         int scaled, float scale, const int32_t *a, const int32_t *e,
                         const float *L, const float *C, const float *D, float *P, float *dS,
                         float *sum) {
  bwd_p_t_x(S, dP, G, ld, n, scaled, scale, a, e, L, C, D, P, dS, sum, 0);
}
static void bwd_p_t_fast_avx2(const float *S, const float *dP, const float *G, int64_t ld,
                              int64_t n, int scaled, float scale, const int32_t *a,
                              const int32_t *e, const float *L, const float *C, const float *D,
                              float *P, float *dS, float *sum) {
  bwd_p_t_x(S, dP, G, ld, n, scaled, scale, a, e, L, C, D, P, dS, sum, 1);
}

/* x[c] = column c of the 8 x 8 matrix whose row r is x[r] */
AI void transpose_8(__m256 x[8]) {
  __m256 t[8], u[8];
  int i;
  for (i = 0; i < 4; i++) {
    t[2 * i] = _mm256_unpacklo_ps(x[2 * i], x[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(x[2 * i], x[2 * i + 1]);
  }
  for (i = 0; i < 2; i++) { /* u[4 i + j], 128-bit half h: rows 4 i .. 4 i + 3 of column 4 h + j */
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
  for (i = 0; i < 4; i++) {
    x[i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x20);
    x[4 + i] = _mm256_permute2f128_ps(u[i], u[4 + i], 0x31);
  }
}

/* 8 x 8 blocks through the registers (see load_t_avx512) */
static void load_t_avx2(const float *X, int64_t ldx, int64_t n, int64_t d, float *dst) {
  static const int32_t ones[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  int64_t r0, k0;
  int i;
  for (r0 = 0; r0 < XTE_ATTN_BM; r0 += 8)
    for (k0 = 0; k0 < d; k0 += 8) {
      const int kn = d - k0 >= 8 ? 8 : (int)(d - k0);
      const __m256i km = _mm256_loadu_si256((const __m256i *)(ones + 8 - kn));
      __m256 x[8];
      for (i = 0; i < 8; i++) {
        const int64_t r = r0 + i;
        x[i] = r < n ? _mm256_maskload_ps(X + r * ldx + k0, km) : _mm256_setzero_ps();
        if (r + 8 < n) __builtin_prefetch(X + (r + 8) * ldx + k0, 0, 3);
      }
      transpose_8(x);
      for (i = 0; i < kn; i++) _mm256_storeu_ps(dst + (k0 + i) * XTE_ATTN_BM + r0, x[i]);
    }
}

/* XTE_ATTENTION_FAST: the exact table with the exps through exp_fast_v */
static const xte_attn_kernels attn_fast_avx2 = {XTE_CPU_ISA_AVX2,
                                                gemm_avx2,
                                                exp_sub_fast_avx2,
                                                rescale_avx2,
                                                fwd_softmax_t_fast_avx2,
                                                bwd_p_t_fast_avx2,
                                                exp_n_fast_avx2,
                                                gemm_fold_avx2,
                                                dot_rows_avx2,
                                                load_t_avx2,
                                                NULL};

const xte_attn_kernels xte_attn_kernels_avx2 = {
    XTE_CPU_ISA_AVX2, gemm_avx2,      exp_sub_avx2,  rescale_avx2, fwd_softmax_t_avx2, bwd_p_t_avx2,
    exp_n_avx2,       gemm_fold_avx2, dot_rows_avx2, load_t_avx2,  &attn_fast_avx2};

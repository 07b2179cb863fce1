/* AVX-512 attention micro-kernels, built natively and a second time against SIMDe
 * (XTE_AVX512_SIMDE), like quantize_avx512.c. Each output element is the scalar kernel's
 * sequence of IEEE operations (the GEMM's fmaf chain runs in k order within one lane; exp is
 * xte_expf lane by lane), so the bytes are the scalar kernels'. */
#include "cpu/avx512/isa_avx512.h"

#include <string.h>

#include "cpu/avx512/avx512_transpose.h"
#include "cpu/xte_cpu.h"
#include "numerics/xte_attention_numerics.h"
#include "cpu/attention_kernels.h"

#define AI static inline __attribute__((always_inline))

/* the vector layer of src/cpu/attention_template.h: 16 fp32 lanes */
#define XA_W 16
#define XA_NAME(x) x##_avx512
typedef __m512 xv;
typedef __m512i xi;
#define xv_ld(p) _mm512_loadu_ps(p)
#define xv_st(p, v) _mm512_storeu_ps((p), (v))
#define xv_zero() _mm512_setzero_ps()
#define xv_1(x) _mm512_set1_ps(x)
#define xv_bcast(p) _mm512_set1_ps(*(p))
#define xv_ninf() _mm512_castsi512_ps(_mm512_set1_epi32((int)0xFF800000u))
#define xv_add(a, b) _mm512_add_ps((a), (b))
#define xv_sub(a, b) _mm512_sub_ps((a), (b))
#define xv_mul(a, b) _mm512_mul_ps((a), (b))
#define xv_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define xv_fnma(a, b, c) _mm512_fnmadd_ps((a), (b), (c))
#define xi_ld(p) _mm512_loadu_si512(p)
#define xi_1(x) _mm512_set1_epi32(x)
#define xi_mullo(a, b) _mm512_mullo_epi32((a), (b))
#define xi_iota() _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
#define xv_gather(base, idx) _mm512_i32gather_ps((idx), (base), 4)
#define XA_PREFETCH_B(p, nv)                                                   \
  do {                                                                         \
    int pv_;                                                                   \
    for (pv_ = 0; pv_ < (nv); pv_++) __builtin_prefetch((p) + 16 * pv_, 0, 3); \
  } while (0)

/* xte_fmaxf lane by lane: a NaN in a gives b, a NaN in b gives a, else a > b ? a : b
 * (_mm512_max_ps(a, b) is a > b ? a : b, b when either is NaN: a is taken back where only b is
 * NaN) */
AI __m512 fmax_v(__m512 a, __m512 b) {
  const __mmask16 k =
      _mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(a, a, _CMP_ORD_Q), b, b, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(_mm512_max_ps(a, b), k, a);
}

/* fmax_v(mb, b) for an mb that is no NaN (a block max chain from -inf): b where b is NaN is
 * the only case to take back */
AI __m512 fmax_mb_v(__m512 mb, __m512 b) {
  return _mm512_mask_mov_ps(_mm512_max_ps(mb, b), _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q), mb);
}

/* scaled (see fwd_softmax_t) as 2 when every slot of the 16 columns a[], e[] is visible
 * (a = 0, e = 64): the logit is S * scale with no mask (the same value) */
AI int scaled_v(int scaled, const int32_t *a, const int32_t *e) {
  if (!scaled) return 0;
  return (_mm512_mask_cmpge_epi32_mask(
              _mm512_cmpeq_epi32_mask(_mm512_loadu_si512(a), _mm512_setzero_si512()),
              _mm512_loadu_si512(e), _mm512_set1_epi32(64)) == 0xFFFF)
             ? 2
             : 1;
}

/* the logits of slot j of 16 columns (scaled 2: all visible) */
AI __m512 logit_v(const float *S, int64_t j, int scaled, __m512 sc, __m512i av, __m512i ev) {
  const __m512 s = _mm512_loadu_ps(S);
  __m512i jv;
  __mmask16 vis;
  if (!scaled) return s;
  if (scaled == 2) return _mm512_mul_ps(s, sc);
  jv = _mm512_set1_epi32((int)j);
  vis = _mm512_cmpge_epi32_mask(jv, av) & _mm512_cmplt_epi32_mask(jv, ev);
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(_mm512_set1_epi32((int)0xFF800000u)), vis,
                            _mm512_mul_ps(s, sc));
}

#include "cpu/attention_template.h"

/* xte_exp2i for k in the normal range, 16 lanes */
AI __m512 exp2i_v(__m512i k) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(k, _mm512_set1_epi32(127)), 23));
}

/* xte_ldexp_small(p, k), 16 lanes: its branches are masked moves, skipped when no lane takes
 * them (the usual case: the same bits) */
AI __m512 ldexp_v(__m512 p, __m512i ki) {
  const __mmask16 mlo = _mm512_cmpgt_epi32_mask(_mm512_set1_epi32(XTE_LDEXP_KMIN), ki);
  const __mmask16 mhi = _mm512_cmpgt_epi32_mask(ki, _mm512_set1_epi32(XTE_LDEXP_KMAX));
  __m512 res = _mm512_mul_ps(p, exp2i_v(ki));
  if (mlo | mhi) {
    const __m512 lo = _mm512_mul_ps(
        _mm512_mul_ps(p, exp2i_v(_mm512_add_epi32(ki, _mm512_set1_epi32(XTE_LDEXP_SPLIT)))),
        exp2i_v(_mm512_set1_epi32(-XTE_LDEXP_SPLIT)));
    const __m512 hi = _mm512_mul_ps(_mm512_mul_ps(p, _mm512_set1_ps(2.0f)),
                                    exp2i_v(_mm512_sub_epi32(ki, _mm512_set1_epi32(1))));
    res = _mm512_mask_mov_ps(res, mlo, lo);
    res = _mm512_mask_mov_ps(res, mhi, hi);
  }
  return res;
}

/* xte_expf, 16 lanes: exp_poly_v's reduction and polynomial, then 2^k; the special cases are
 * masked moves */
AI __m512 exp_v(__m512 x) {
  __m512 k, res;
  const __m512 p = exp_poly_v(x, &k);
  /* every lane in [-86, 88] (no NaN): k in [-124, 127], no branch of xte_ldexp_small and no
   * special case is taken, the result is (1 + p) 2^k (the same bits as the path below): a
   * scalef, exact here (1 + p in [0.7, 1.5), so the product is a normal float) */
  if (_mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-86.0f), _CMP_GE_OQ), x,
                              _mm512_set1_ps(88.0f), _CMP_LE_OQ) == 0xFFFF)
    return _mm512_scalef_ps(_mm512_add_ps(_mm512_set1_ps(1.0f), p), k);
  res = ldexp_v(_mm512_add_ps(_mm512_set1_ps(1.0f), p), _mm512_cvttps_epi32(k));
  res = _mm512_mask_mov_ps(res,
                           _mm512_cmp_ps_mask(x, _mm512_set1_ps(-103.97909545898438f), _CMP_LT_OQ),
                           _mm512_setzero_ps());
  res =
      _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.72283935546875f), _CMP_GT_OQ),
                         _mm512_castsi512_ps(_mm512_set1_epi32(0x7F800000)));
  return _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), _mm512_add_ps(x, x));
}

/* XTE_ATTENTION_FAST's exp, 16 lanes (attention_template.h's constants): x clamped to 89 (a NaN
 * kept), k = rint(x log2(e)), the polynomial scaled by 2^(k - 1) (a scalef: exact, k - 1 in
 * [-126, 127]), then by 2 (exact, +inf past the range; SIMDe's scalef forms 2^128 as +inf);
 * lanes with x < XF_EXP_LO (-inf included) give +0 */
AI __m512 exp_fast_v(__m512 x) {
  const __m512 xc = _mm512_min_ps(_mm512_set1_ps(89.0f), x);
  const __m512 k =
      _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269502162933349609375f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return _mm512_mul_ps(
      _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(XF_EXP_LO), _CMP_NLT_UQ),
                             exp_fast_poly_v(xc, k), _mm512_sub_ps(k, _mm512_set1_ps(1.0f))),
      _mm512_set1_ps(2.0f));
}

/* the exp of the mode: fast (a constant) selects exp_fast_v */
#define XEXP(fast, y) ((fast) ? exp_fast_v(y) : exp_v(y))

/* 64 columns (4 vectors) at a time, then 16 */
AI void gemm_x(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
               const float *B, int64_t ldb, const float *C0, int64_t ldc0, float *D, int64_t ldd,
               const int mode, const float *alpha) {
  int64_t c0 = 0, r;
  for (; c0 + 64 <= N; c0 += 64) {
    const float *b = B + c0;
    XA_ROWS(4);
  }
  for (; c0 < N; c0 += 16) {
    const float *b = B + c0;
    XA_ROWS(1);
  }
}

/* the scalar kernel's order, 16 columns (query rows) per vector; fast: exp_fast_v */
AI void fwd_softmax_t_x(const float *S, int64_t ld, int64_t n, int scaled, float scale,
                        const int32_t *a, const int32_t *e, float *m, float *l, float *alpha,
                        float *P, const int fast) {
  const __m512 sc = _mm512_set1_ps(scale);
  int64_t r0, r, j;
  int L, q;
  for (r0 = 0; r0 < n; r0 += 64) {
    __m512 mbs[4];
    const int ng = n - r0 >= 64 ? 4 : (int)((n - r0) / 16);
    switch (ng) {
      case 4:
        block_max(4, S + r0, ld, scaled, sc, a + r0, e + r0, mbs);
        break;
      case 3:
        block_max(3, S + r0, ld, scaled, sc, a + r0, e + r0, mbs);
        break;
      case 2:
        block_max(2, S + r0, ld, scaled, sc, a + r0, e + r0, mbs);
        break;
      default:
        block_max(1, S + r0, ld, scaled, sc, a + r0, e + r0, mbs);
        break;
    }
    for (q = 0; q < ng; q++) {
      const __m512i av = _mm512_loadu_si512(a + r0 + 16 * q),
                    ev = _mm512_loadu_si512(e + r0 + 16 * q);
      const __m512 mo = _mm512_loadu_ps(m + r0 + 16 * q), mn = fmax_v(mo, mbs[q]),
                   al = XEXP(fast, _mm512_sub_ps(mo, mn));
      __m512 v[16];
      int sq;
      r = r0 + 16 * q;
      sq = scaled_v(scaled, a + r, e + r);
      _mm512_storeu_ps(m + r, mn);
      _mm512_storeu_ps(alpha + r, al);
      for (j = 0; j < 64; j++) {
        const __m512 p = XEXP(fast, _mm512_sub_ps(logit_v(S + j * ld + r, j, sq, sc, av, ev), mn));
        _mm512_storeu_ps(P + j * ld + r, p);
        v[j & 15] = j < 16 ? p : _mm512_add_ps(v[j & 15], p);
      }
      for (L = 0; L < 8; L++) v[L] = _mm512_add_ps(v[L], v[L + 8]);
      for (L = 0; L < 4; L++) v[L] = _mm512_add_ps(v[L], v[L + 4]);
      for (L = 0; L < 2; L++) v[L] = _mm512_add_ps(v[L], v[L + 2]);
      _mm512_storeu_ps(l + r,
                       _mm512_fmadd_ps(_mm512_loadu_ps(l + r), al, _mm512_add_ps(v[0], v[1])));
    }
  }
}

static void fwd_softmax_t_avx512(const float *S, int64_t ld, int64_t n, int scaled, float scale,
                                 const int32_t *a, const int32_t *e, float *m, float *l,
                                 float *alpha, float *P) {
  fwd_softmax_t_x(S, ld, n, scaled, scale, a, e, m, l, alpha, P, 0);
}
static void fwd_softmax_t_fast_avx512(const float *S, int64_t ld, int64_t n, int scaled,
                                      float scale, const int32_t *a, const int32_t *e, float *m,
                                      float *l, float *alpha, float *P) {
  fwd_softmax_t_x(S, ld, n, scaled, scale, a, e, m, l, alpha, P, 1);
}

/* the scalar kernel's order, 16 columns (query rows) per vector; fast: exp_fast_v */
AI void bwd_p_t_x(const float *S, const float *dP, const float *G, int64_t ld, int64_t n,
                  int scaled, float scale, const int32_t *a, const int32_t *e, const float *L,
                  const float *C, const float *D, float *P, float *dS, float *sum, const int fast) {
  const __m512 sc = _mm512_set1_ps(scale);
  int64_t r, j;
  int q;
  for (r = 0; r < n; r += 16) {
    const __m512i av = _mm512_loadu_si512(a + r), ev = _mm512_loadu_si512(e + r);
    const __m512 Lv = _mm512_loadu_ps(L + r), Dv = _mm512_loadu_ps(D + r);
    const __m512 Cv = C ? _mm512_loadu_ps(C + r) : _mm512_setzero_ps();
    const int sq = scaled_v(scaled, a + r, e + r);
    __m512 v[16];
    for (j = 0; j < 64; j++) {
      const __m512 x = logit_v(S + j * ld + r, j, sq, sc, av, ev);
      const __m512 u = XEXP(fast, _mm512_sub_ps(_mm512_sub_ps(x, Lv), Cv));
      const __m512 g = G ? _mm512_loadu_ps(G + j * ld + r) : sc;
      _mm512_storeu_ps(P + j * ld + r, u);
      _mm512_storeu_ps(
          dS + j * ld + r,
          _mm512_mul_ps(_mm512_mul_ps(u, _mm512_sub_ps(_mm512_loadu_ps(dP + j * ld + r), Dv)), g));
      v[j & 15] = j < 16 ? u : _mm512_add_ps(v[j & 15], u);
    }
    if (sum) {
      for (q = 0; q < 8; q++) v[q] = _mm512_add_ps(v[q], v[q + 8]);
      for (q = 0; q < 4; q++) v[q] = _mm512_add_ps(v[q], v[q + 4]);
      for (q = 0; q < 2; q++) v[q] = _mm512_add_ps(v[q], v[q + 2]);
      _mm512_storeu_ps(sum + r, _mm512_add_ps(v[0], v[1]));
    }
  }
}

static void bwd_p_t_avx512(const float *S, const float *dP, const float *G, int64_t ld, int64_t n,
                           int scaled, float scale, const int32_t *a, const int32_t *e,
                           const float *L, const float *C, const float *D, float *P, float *dS,
                           float *sum) {
  bwd_p_t_x(S, dP, G, ld, n, scaled, scale, a, e, L, C, D, P, dS, sum, 0);
}
static void bwd_p_t_fast_avx512(const float *S, const float *dP, const float *G, int64_t ld,
                                int64_t n, int scaled, float scale, const int32_t *a,
                                const int32_t *e, const float *L, const float *C, const float *D,
                                float *P, float *dS, float *sum) {
  bwd_p_t_x(S, dP, G, ld, n, scaled, scale, a, e, L, C, D, P, dS, sum, 1);
}

/* 16 x 16 blocks through the registers; rows past n are zero vectors, columns past d masked. The
 * rows lie ldx apart (4 KiB in a [s, h, d] tensor, where the hardware prefetchers do not follow):
 * the next 16 rows are prefetched while these are moved. */
static void load_t_avx512(const float *X, int64_t ldx, int64_t n, int64_t d, float *dst) {
  int64_t r0, k0;
  int i;
  for (r0 = 0; r0 < XTE_ATTN_BM; r0 += 16)
    for (k0 = 0; k0 < d; k0 += 16) {
      const __mmask16 km = d - k0 >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (d - k0)) - 1u);
      const int kn = d - k0 >= 16 ? 16 : (int)(d - k0);
      __m512i x[16];
      for (i = 0; i < 16; i++) {
        const int64_t r = r0 + i;
        x[i] = r < n ? _mm512_maskz_loadu_epi32(km, X + r * ldx + k0) : _mm512_setzero_si512();
        if (r + 16 < n) __builtin_prefetch(X + (r + 16) * ldx + k0, 0, 3);
      }
      xte_transpose16x16_epi32(x);
      for (i = 0; i < kn; i++) _mm512_storeu_si512(dst + (k0 + i) * XTE_ATTN_BM + r0, x[i]);
    }
}

/* XTE_ATTENTION_FAST: the exact table with the exps through exp_fast_v */
static const xte_attn_kernels attn_fast_avx512 = {XTE_AVX512_ISA,
                                                  gemm_avx512,
                                                  exp_sub_fast_avx512,
                                                  rescale_avx512,
                                                  fwd_softmax_t_fast_avx512,
                                                  bwd_p_t_fast_avx512,
                                                  exp_n_fast_avx512,
                                                  gemm_fold_avx512,
                                                  dot_rows_avx512,
                                                  load_t_avx512,
                                                  NULL};

const xte_attn_kernels XTE_AVX512_NAME(xte_attn_kernels) = {
    XTE_AVX512_ISA,       gemm_avx512,    exp_sub_avx512,   rescale_avx512,
    fwd_softmax_t_avx512, bwd_p_t_avx512, exp_n_avx512,     gemm_fold_avx512,
    dot_rows_avx512,      load_t_avx512,  &attn_fast_avx512};

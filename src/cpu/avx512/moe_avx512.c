/* The MoE router driver (src/cpu/moe_router.c) on 16 AVX-512 lanes: the score functions and the
 * top-k filter. Built natively, and a second time against SIMDe (XTE_AVX512_SIMDE, the emulated
 * ISA the tests run everywhere), as src/cpu/avx512/quantize_avx512.c is. The lanes reproduce the
 * scalar functions bit for bit (tests/test_moe_router.c compares every ISA). SwiGLU
 * (src/cpu/moe_swiglu.c) runs on the same 16 lanes (tests/test_moe_swiglu.c); the unpermute is
 * the AVX2 build's for this ISA too. */
#include "cpu/avx512/isa_avx512.h"

#include <stdint.h>

#define XTE_MOE_NAME(x) XTE_AVX512_NAME(x)

#define XTE_MOE_VW 16
typedef __m512 xv;
typedef __mmask16 xm;
#define xv_ld(p) _mm512_loadu_ps(p)
#define xv_st(p, v) _mm512_storeu_ps((p), (v))
#define xv_1(f) _mm512_set1_ps(f)
#define xv_add(a, b) _mm512_add_ps((a), (b))
#define xv_sub(a, b) _mm512_sub_ps((a), (b))
#define xv_mul(a, b) _mm512_mul_ps((a), (b))
#define xv_div(a, b) _mm512_div_ps((a), (b))
#define xv_fma(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define xv_fnma(a, b, c) _mm512_fnmadd_ps((a), (b), (c))
#define xv_round(a) _mm512_roundscale_ps((a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define xv_negif(m, a)                                                                           \
  _mm512_castsi512_ps(_mm512_mask_xor_epi32(_mm512_castps_si512(a), (m), _mm512_castps_si512(a), \
                                            _mm512_set1_epi32(INT32_MIN)))
#define xv_neg(a) \
  _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)))
#define xv_gt(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_GT_OQ)
#define xv_ge(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_GE_OQ)
#define xv_lt(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_LT_OQ)
#define xv_nan(a) _mm512_cmp_ps_mask((a), (a), _CMP_UNORD_Q)
#define xv_sel(m, a, b) _mm512_mask_blend_ps((m), (b), (a))
#define xv_le(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_LE_OQ)
#define xv_max(a, b) _mm512_max_ps((a), (b))
#define xm_and(a, b) ((xm)((a) & (b)))
#define XTE_MOE_VMASK 0xFFFFu
#define xv_eq(a, b) _mm512_cmp_ps_mask((a), (b), _CMP_EQ_OQ)
#define xv_stream(p, v) _mm512_stream_ps((p), (v))
#define xv_sfence() _mm_sfence()
#define xm_bits(m) ((unsigned)(m))
#ifdef XTE_AVX512_SIMDE
static inline __m512 xv_pow2(__m512 k) {
  __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127));
  return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}
/* SIMDe's scalef multiplies by exp2(floor(k)), exact only where 2^k is normal */
#define xv_ldexp(y, k) xv_mul((y), xv_pow2(k))
#else
/* vscalefps: y 2^k with one rounding for any integral k (subnormal results included) */
#define XTE_MOE_SCALEF 1
#define xv_ldexp(y, k) _mm512_scalef_ps((y), (k))
/* y 2^k where a >= lim or a is NaN, else +0 */
#define xv_ldexp_nlt(y, k, a, lim) \
  _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask((a), _mm512_set1_ps(lim), _CMP_NLT_UQ), (y), (k))
#endif

/* bf16 (src/cpu/moe_swiglu.c): widening is a shift; xte_f32_to_bf16 rounds u to nearest even
 * (u + 0x7FFF + bit 16) >> 16, a NaN keeps its top bits, quieted (bit 22 set): the high halves
 * (odd words) of the 16 lanes gathered into 256 bits by one word permutation */
static inline __m512 xv_ld_bf16(const uint16_t *p) {
  const __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline void xv_st_bf16(uint16_t *p, __m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rnd = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), odd);
  const __m512i h = _mm512_mask_or_epi32(rnd, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), u,
                                         _mm512_set1_epi32(0x00400000));
  /* word 2 i + 1 to word i (i < 16): 32-bit lane j of the index holds 4 j + 1 and 4 j + 3 */
  const __m512i idx = _mm512_setr_epi32(0x00030001, 0x00070005, 0x000B0009, 0x000F000D, 0x00130011,
                                        0x00170015, 0x001B0019, 0x001F001D, 0, 0, 0, 0, 0, 0, 0, 0);
  _mm256_storeu_si256((__m256i *)(void *)p,
                      _mm512_castsi512_si256(_mm512_permutexvar_epi16(idx, h)));
}

/* Writes base + the lanes set in m (ascending) to dst (16 ints written), returns their count. */
static inline int xv_cand(int *dst, unsigned m, int base) {
  __m512i i =
      _mm512_add_epi32(_mm512_set1_epi32(base),
                       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  _mm512_storeu_si512(dst, _mm512_maskz_compress_epi32((__mmask16)m, i));
  return __builtin_popcount(m);
}

#include "cpu/moe_router.c"
#include "cpu/moe_swiglu.c"

/* the router and SwiGLU on 16 lanes; unpermute is the avx2 build's (src/cpu/moe_cpu.h) */
const xte_moe_kernels XTE_AVX512_NAME(xte_moe_kernels) = {
    .isa = XTE_AVX512_ISA,
    .router_forward = XTE_AVX512_NAME(xte_cpu_moe_router_forward),
    .router_backward = XTE_AVX512_NAME(xte_cpu_moe_router_backward),
    .unpermute = xte_cpu_moe_unpermute_avx2,
    .swiglu = XTE_AVX512_NAME(xte_cpu_moe_swiglu),
};

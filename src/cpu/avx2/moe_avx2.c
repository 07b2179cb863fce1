/* The portable MoE drivers compiled a second time with AVX2 + FMA code generation (this folder's
 * flags), so that the explicit fmaf of the shared numerics is one instruction and the loops
 * vectorise. Same source, same operations, exactly rounded fmaf: the same bits as the generic
 * build, which the scalar ISA keeps using (tests compare every ISA). The router's score
 * functions and top-k filter run on the 8-lane operations below (src/cpu/moe_router.c), the
 * unpermute on explicit AVX2 (src/cpu/moe_permute.c, XTE_MOE_UNPERMUTE_AVX2). */
#include <immintrin.h>
#include <stdint.h>

#define XTE_MOE_NAME(x) x##_avx2

#define XTE_MOE_VW 8
typedef __m256 xv;
typedef __m256 xm;
#define xv_ld(p) _mm256_loadu_ps(p)
#define xv_st(p, v) _mm256_storeu_ps((p), (v))
#define xv_1(f) _mm256_set1_ps(f)
#define xv_add(a, b) _mm256_add_ps((a), (b))
#define xv_sub(a, b) _mm256_sub_ps((a), (b))
#define xv_mul(a, b) _mm256_mul_ps((a), (b))
#define xv_div(a, b) _mm256_div_ps((a), (b))
#define xv_fma(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define xv_fnma(a, b, c) _mm256_fnmadd_ps((a), (b), (c))
#define xv_round(a) _mm256_round_ps((a), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define xv_negif(m, a) _mm256_xor_ps((a), _mm256_and_ps((m), _mm256_set1_ps(-0.0f)))
#define xv_neg(a) _mm256_xor_ps((a), _mm256_set1_ps(-0.0f))
#define xv_gt(a, b) _mm256_cmp_ps((a), (b), _CMP_GT_OQ)
#define xv_ge(a, b) _mm256_cmp_ps((a), (b), _CMP_GE_OQ)
#define xv_lt(a, b) _mm256_cmp_ps((a), (b), _CMP_LT_OQ)
#define xv_nan(a) _mm256_cmp_ps((a), (a), _CMP_UNORD_Q)
#define xv_sel(m, a, b) _mm256_blendv_ps((b), (a), (m))
#define xv_le(a, b) _mm256_cmp_ps((a), (b), _CMP_LE_OQ)
#define xv_max(a, b) _mm256_max_ps((a), (b))
#define xm_and(a, b) _mm256_and_ps((a), (b))
#define XTE_MOE_VMASK 0xFFu
#define xv_eq(a, b) _mm256_cmp_ps((a), (b), _CMP_EQ_OQ)
#define xv_stream(p, v) _mm256_stream_ps((p), (v))
#define xv_sfence() _mm_sfence()
#define xm_bits(m) ((unsigned)_mm256_movemask_ps(m))
static inline __m256 xv_pow2(__m256 k) {
  __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
#define xv_ldexp(y, k) xv_mul((y), xv_pow2(k))
/* bf16 (src/cpu/moe_swiglu.c): widening is a shift; xte_f32_to_bf16 rounds u to nearest even
 * (u + 0x7FFF + bit 16) >> 16, a NaN keeps its top bits, quieted (bit 22 set) */
static inline __m256 xv_ld_bf16(const uint16_t *p) {
  const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline void xv_st_bf16(uint16_t *p, __m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i rnd = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i h = _mm256_blendv_epi8(rnd, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
  /* the high halves (bytes 2, 3 of each lane) to the low 8 bytes of each 128-bit half, then the
   * two halves' 64-bit elements 0 and 2 together */
  const __m256i sh = _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2,
                                      3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i pk = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(h, sh), 0xD8);
  _mm_storeu_si128((__m128i *)(void *)p, _mm256_castsi256_si128(pk));
}

/* Writes base + the lanes set in m (ascending) to dst (8 ints written), returns their count. */
static const uint32_t xte_moe_lanes_lut[256] = {
    0x00000000u, 0x00000000u, 0x00000001u, 0x00000010u, 0x00000002u, 0x00000020u, 0x00000021u,
    0x00000210u, 0x00000003u, 0x00000030u, 0x00000031u, 0x00000310u, 0x00000032u, 0x00000320u,
    0x00000321u, 0x00003210u, 0x00000004u, 0x00000040u, 0x00000041u, 0x00000410u, 0x00000042u,
    0x00000420u, 0x00000421u, 0x00004210u, 0x00000043u, 0x00000430u, 0x00000431u, 0x00004310u,
    0x00000432u, 0x00004320u, 0x00004321u, 0x00043210u, 0x00000005u, 0x00000050u, 0x00000051u,
    0x00000510u, 0x00000052u, 0x00000520u, 0x00000521u, 0x00005210u, 0x00000053u, 0x00000530u,
    0x00000531u, 0x00005310u, 0x00000532u, 0x00005320u, 0x00005321u, 0x00053210u, 0x00000054u,
    0x00000540u, 0x00000541u, 0x00005410u, 0x00000542u, 0x00005420u, 0x00005421u, 0x00054210u,
    0x00000543u, 0x00005430u, 0x00005431u, 0x00054310u, 0x00005432u, 0x00054320u, 0x00054321u,
    0x00543210u, 0x00000006u, 0x00000060u, 0x00000061u, 0x00000610u, 0x00000062u, 0x00000620u,
    0x00000621u, 0x00006210u, 0x00000063u, 0x00000630u, 0x00000631u, 0x00006310u, 0x00000632u,
    0x00006320u, 0x00006321u, 0x00063210u, 0x00000064u, 0x00000640u, 0x00000641u, 0x00006410u,
    0x00000642u, 0x00006420u, 0x00006421u, 0x00064210u, 0x00000643u, 0x00006430u, 0x00006431u,
    0x00064310u, 0x00006432u, 0x00064320u, 0x00064321u, 0x00643210u, 0x00000065u, 0x00000650u,
    0x00000651u, 0x00006510u, 0x00000652u, 0x00006520u, 0x00006521u, 0x00065210u, 0x00000653u,
    0x00006530u, 0x00006531u, 0x00065310u, 0x00006532u, 0x00065320u, 0x00065321u, 0x00653210u,
    0x00000654u, 0x00006540u, 0x00006541u, 0x00065410u, 0x00006542u, 0x00065420u, 0x00065421u,
    0x00654210u, 0x00006543u, 0x00065430u, 0x00065431u, 0x00654310u, 0x00065432u, 0x00654320u,
    0x00654321u, 0x06543210u, 0x00000007u, 0x00000070u, 0x00000071u, 0x00000710u, 0x00000072u,
    0x00000720u, 0x00000721u, 0x00007210u, 0x00000073u, 0x00000730u, 0x00000731u, 0x00007310u,
    0x00000732u, 0x00007320u, 0x00007321u, 0x00073210u, 0x00000074u, 0x00000740u, 0x00000741u,
    0x00007410u, 0x00000742u, 0x00007420u, 0x00007421u, 0x00074210u, 0x00000743u, 0x00007430u,
    0x00007431u, 0x00074310u, 0x00007432u, 0x00074320u, 0x00074321u, 0x00743210u, 0x00000075u,
    0x00000750u, 0x00000751u, 0x00007510u, 0x00000752u, 0x00007520u, 0x00007521u, 0x00075210u,
    0x00000753u, 0x00007530u, 0x00007531u, 0x00075310u, 0x00007532u, 0x00075320u, 0x00075321u,
    0x00753210u, 0x00000754u, 0x00007540u, 0x00007541u, 0x00075410u, 0x00007542u, 0x00075420u,
    0x00075421u, 0x00754210u, 0x00007543u, 0x00075430u, 0x00075431u, 0x00754310u, 0x00075432u,
    0x00754320u, 0x00754321u, 0x07543210u, 0x00000076u, 0x00000760u, 0x00000761u, 0x00007610u,
    0x00000762u, 0x00007620u, 0x00007621u, 0x00076210u, 0x00000763u, 0x00007630u, 0x00007631u,
    0x00076310u, 0x00007632u, 0x00076320u, 0x00076321u, 0x00763210u, 0x00000764u, 0x00007640u,
    0x00007641u, 0x00076410u, 0x00007642u, 0x00076420u, 0x00076421u, 0x00764210u, 0x00007643u,
    0x00076430u, 0x00076431u, 0x00764310u, 0x00076432u, 0x00764320u, 0x00764321u, 0x07643210u,
    0x00000765u, 0x00007650u, 0x00007651u, 0x00076510u, 0x00007652u, 0x00076520u, 0x00076521u,
    0x00765210u, 0x00007653u, 0x00076530u, 0x00076531u, 0x00765310u, 0x00076532u, 0x00765320u,
    0x00765321u, 0x07653210u, 0x00007654u, 0x00076540u, 0x00076541u, 0x00765410u, 0x00076542u,
    0x00765420u, 0x00765421u, 0x07654210u, 0x00076543u, 0x00765430u, 0x00765431u, 0x07654310u,
    0x00765432u, 0x07654320u, 0x07654321u, 0x76543210u,
};
static inline int xv_cand(int *dst, unsigned m, int base) {
  __m256i n = _mm256_srlv_epi32(_mm256_set1_epi32((int)xte_moe_lanes_lut[m]),
                                _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
  n = _mm256_and_si256(n, _mm256_set1_epi32(7));
  _mm256_storeu_si256((__m256i *)dst, _mm256_add_epi32(n, _mm256_set1_epi32(base)));
  return __builtin_popcount(m);
}

#define XTE_MOE_UNPERMUTE_AVX2 1

#include "cpu/moe_permute.c"
#include "cpu/moe_router.c"
#include "cpu/moe_swiglu.c"

const xte_moe_kernels xte_moe_kernels_avx2 = {
    .isa = XTE_CPU_ISA_AVX2,
    .router_forward = xte_cpu_moe_router_forward_avx2,
    .router_backward = xte_cpu_moe_router_backward_avx2,
    .unpermute = xte_cpu_moe_unpermute_avx2,
    .swiglu = xte_cpu_moe_swiglu_avx2,
};

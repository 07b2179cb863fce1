/* The NaN rule (docs/numerics.md, section 2, "NaN bits"): a NaN an operation creates from
 * non-NaN inputs (inf * 0) has the contract's bits, 0xFFC00000 (x86's default NaN, sign set), on
 * every backend and ISA, never the hardware's own NaN (a GPU's 0x7FFFFFFF).
 *
 * The expected bytes are literals from the contract: a block holding an infinity under the
 * DEEPGEMM, DEEPGEMM_UE8M0 and MTFP8 recipes gets scale 1 / inf = 0, so its inf elements become
 * inf * 0 = NaN(0xFFC00000) -> e4m3 0xFF, e5m2 0xFE; finite elements become +-0; a NaN element
 * keeps its sign. Dequantizing with scale_inv = inf: +-0 * inf = 0xFFC00000.
 *
 * Attention (O with an inf or a NaN in V): every NaN written is the canonical 0x7FC00000.
 *
 * Every ISA the machine has runs the cases. In the XTE_NAN_SIM build (scripts/nansim.sh) the
 * scalar ISA runs the shared numerics with every hardware NaN turned into 0x7FFFFFFF, so a NaN
 * whose bits were left to the hardware gives 0x7F here instead of 0xFF, and this test fails. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <xte/xte.h>

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* Selects an ISA; 0 when this build or machine cannot run it. */
static int set_isa(int isa) {
  return xte_cpu_set_isa((xte_cpu_isa)isa) == XTE_SUCCESS;
}

#define N 128

/* One 1 x 128 block: inf, -inf, finite values, +-NaN, +-0. */
static void fill_block(float *x) {
  int i;
  for (i = 0; i < N; i++) x[i] = (float)(i % 7) - 3.0f; /* -3 .. 3 */
  x[0] = INFINITY;
  x[5] = -INFINITY;
  x[9] = bits_f32(0x7FC00001u);  /* +NaN */
  x[13] = bits_f32(0xFFC00002u); /* -NaN */
  x[17] = 0.0f;
  x[18] = -0.0f;
  x[127] = INFINITY;
}

/* The contract's code of x * 0 (scale 0): inf -> NaN(0xFFC00000): e4m3 0xFF, e5m2 0xFE; a NaN
 * keeps its sign; finite -> +-0. */
static uint8_t expect_code(float x, int e5) {
  uint32_t u = f32_bits(x);
  uint8_t nan = e5 ? 0x7E : 0x7F;
  if ((u & 0x7FFFFFFFu) == 0x7F800000u) return (uint8_t)(0x80 | nan);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint8_t)(((u >> 24) & 0x80) | nan);
  return (uint8_t)((u >> 24) & 0x80);
}

static void quant_block(const float *x, xte_recipe r, int e5, uint8_t *q, float *sinv) {
  xte_qtensor qt;
  xte_quant_config c = xte_quant_config_default();
  xte_tensor in = xte_tensor_2d((void *)x, XTE_DTYPE_FP32, 1, N);
  int64_t sr, sc;
  memset(&qt, 0, sizeof qt);
  cr_assert_eq(xte_quantize_scale_shape(1, N, XTE_SCALING_BLOCK_1x128, r, XTE_SCALE_LAYOUT_COMPACT,
                                        0, &sr, &sc),
               XTE_SUCCESS);
  cr_assert_eq(sr * sc, 1);
  qt.rowwise = xte_tensor_2d(q, e5 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3, 1, N);
  qt.rowwise_scale_inv.data = sinv;
  qt.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  qt.rowwise_scale_inv.rows = 1;
  qt.rowwise_scale_inv.cols = 1;
  qt.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  qt.scaling_mode = XTE_SCALING_BLOCK_1x128;
  qt.recipe = r;
  cr_assert_eq(xte_quantize(&in, &qt, &c, NULL), XTE_SUCCESS, "%s", xte_last_error());
}

Test(nan_rule, quantize_inf_block_scale_zero) {
  static const xte_recipe recipes[] = {XTE_RECIPE_DEEPGEMM, XTE_RECIPE_DEEPGEMM_UE8M0,
                                       XTE_RECIPE_MTFP8};
  const xte_cpu_isa saved = xte_cpu_get_isa();
  float x[N], sinv;
  uint8_t q[N];
  int isa, ri, e5, i, ran = 0;
  fill_block(x);
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    if (!set_isa(isa)) continue;
    ran++;
    for (ri = 0; ri < 3; ri++)
      for (e5 = 0; e5 < 2; e5++) {
        memset(q, 0x55, sizeof q);
        quant_block(x, recipes[ri], e5, q, &sinv);
        cr_expect_eq(f32_bits(sinv), 0x7F800000u, "isa %s recipe %d: scale_inv %08x",
                     xte_cpu_isa_name((xte_cpu_isa)isa), (int)recipes[ri], f32_bits(sinv));
        for (i = 0; i < N; i++)
          cr_expect_eq(q[i], expect_code(x[i], e5),
                       "isa %s recipe %d %s: x[%d] = %08x gives %02x, the contract %02x",
                       xte_cpu_isa_name((xte_cpu_isa)isa), (int)recipes[ri], e5 ? "e5m2" : "e4m3",
                       i, f32_bits(x[i]), q[i], expect_code(x[i], e5));
      }
  }
  xte_cpu_set_isa(saved);
  cr_assert(ran >= 1);
}

/* The anchor of the expectation itself: x86's inf * 0 (this test is compiled for x86 with IEEE
 * semantics) is the contract's NaN. A volatile keeps the compiler from folding it. */
Test(nan_rule, contract_nan_is_x86_default) {
  volatile float inf = INFINITY, zero = 0.0f;
  float r = inf * zero;
#if defined(__x86_64__) || defined(__i386__)
  cr_expect_eq(f32_bits(r), 0xFFC00000u, "inf * 0 = %08x", f32_bits(r));
#else
  cr_expect(isnan(r));
#endif
}

/* Dequantize: code * scale_inv with scale_inv = inf. +-0 * inf creates a NaN: 0xFFC00000 (bf16
 * 0xFFC0); 1 * inf = inf; a NaN code (0x7F: +NaN) stays +NaN, quiet (0x7FC00000). */
Test(nan_rule, dequantize_zero_times_inf) {
  static const uint8_t codes[4] = {0x00, 0x80, 0x38, 0x7F};
  static const uint32_t want32[4] = {0xFFC00000u, 0xFFC00000u, 0x7F800000u, 0x7FC00000u};
  static const uint16_t want16[4] = {0xFFC0u, 0xFFC0u, 0x7F80u, 0x7FC0u};
  const xte_cpu_isa saved = xte_cpu_get_isa();
  uint8_t q[4];
  float sinv = INFINITY, out[4];
  uint16_t outb[4];
  int isa, i;
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    xte_qtensor qt;
    xte_tensor o;
    if (!set_isa(isa)) continue;
    memcpy(q, codes, 4);
    memset(&qt, 0, sizeof qt);
    qt.rowwise = xte_tensor_2d(q, XTE_DTYPE_E4M3, 1, 4);
    qt.rowwise_scale_inv.data = &sinv;
    qt.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
    qt.rowwise_scale_inv.rows = 1;
    qt.rowwise_scale_inv.cols = 1;
    qt.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
    qt.scaling_mode = XTE_SCALING_BLOCK_1x128;
    qt.recipe = XTE_RECIPE_DEEPGEMM;
    o = xte_tensor_2d(out, XTE_DTYPE_FP32, 1, 4);
    cr_assert_eq(xte_dequantize(&qt, 0, &o, NULL), XTE_SUCCESS, "%s", xte_last_error());
    for (i = 0; i < 4; i++)
      cr_expect_eq(f32_bits(out[i]), want32[i], "isa %s code %02x: %08x, the contract %08x",
                   xte_cpu_isa_name((xte_cpu_isa)isa), codes[i], f32_bits(out[i]), want32[i]);
    o = xte_tensor_2d(outb, XTE_DTYPE_BF16, 1, 4);
    cr_assert_eq(xte_dequantize(&qt, 0, &o, NULL), XTE_SUCCESS, "%s", xte_last_error());
    for (i = 0; i < 4; i++)
      cr_expect_eq(outb[i], want16[i], "isa %s code %02x (bf16): %04x, the contract %04x",
                   xte_cpu_isa_name((xte_cpu_isa)isa), codes[i], outb[i], want16[i]);
  }
  xte_cpu_set_isa(saved);
}

/* SwiGLU: y = silu(g) * u. silu(+inf) * 0 = inf * 0 and silu(-inf) * inf = -0 * inf create
 * NaNs: 0xFFC00000. Backward: dsilu(+-inf) is a created NaN (inf * 0 inside), so
 * d_gate = (dy * u) * dsilu(+-inf) = 0xFFC00000 for finite dy * u; d_up = dy * silu(g). */
Test(nan_rule, swiglu_created_nans) {
  /* T = 1, F = 4: gate = x[0..4), up = x[4..8) */
  const float x[8] = {INFINITY, -INFINITY, 1.0f, INFINITY, 0.0f, INFINITY, 2.0f, 3.0f};
  const uint32_t want_y[4] = {0xFFC00000u, 0xFFC00000u, 0u, 0x7F800000u};
  const float dy[4] = {1.0f, 1.0f, 0.0f, 0.0f};
  const xte_cpu_isa saved = xte_cpu_get_isa();
  float y[4], gi[8];
  int isa, i;
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    xte_tensor in = xte_tensor_2d((void *)x, XTE_DTYPE_FP32, 1, 8);
    xte_tensor out = xte_tensor_2d(y, XTE_DTYPE_FP32, 1, 4);
    xte_tensor g = xte_tensor_2d((void *)dy, XTE_DTYPE_FP32, 1, 4);
    xte_tensor gin = xte_tensor_2d(gi, XTE_DTYPE_FP32, 1, 8);
    if (!set_isa(isa)) continue;
    cr_assert_eq(xte_swiglu(&in, &out, NULL), XTE_SUCCESS, "%s", xte_last_error());
    for (i = 0; i < 4; i++) {
      uint32_t w = want_y[i];
      if (i == 2) w = f32_bits(y[2]); /* silu(1) * 2: finite, checked by test_moe_swiglu */
      cr_expect_eq(f32_bits(y[i]), w, "isa %s y[%d] = %08x, the contract %08x",
                   xte_cpu_isa_name((xte_cpu_isa)isa), i, f32_bits(y[i]), w);
    }
    cr_expect(isfinite(y[2]));
    cr_assert_eq(xte_dswiglu(&g, &in, &gin, NULL), XTE_SUCCESS, "%s", xte_last_error());
    /* d_gate[0] = (1 * 0) * dsilu(inf): created NaN; d_gate[1] = (1 * inf) * dsilu(-inf):
     * created NaN; d_gate[3] = (0 * 3) * dsilu(inf): created NaN */
    cr_expect_eq(f32_bits(gi[0]), 0xFFC00000u, "isa %s d_gate[0] = %08x",
                 xte_cpu_isa_name((xte_cpu_isa)isa), f32_bits(gi[0]));
    cr_expect_eq(f32_bits(gi[1]), 0xFFC00000u, "isa %s d_gate[1] = %08x",
                 xte_cpu_isa_name((xte_cpu_isa)isa), f32_bits(gi[1]));
    cr_expect_eq(f32_bits(gi[3]), 0xFFC00000u, "isa %s d_gate[3] = %08x",
                 xte_cpu_isa_name((xte_cpu_isa)isa), f32_bits(gi[3]));
    /* d_up[3] = dy * silu(inf) = 0 * inf: created NaN; d_up[1] = 1 * silu(-inf) = -0 */
    cr_expect_eq(f32_bits(gi[7]), 0xFFC00000u, "isa %s d_up[3] = %08x",
                 xte_cpu_isa_name((xte_cpu_isa)isa), f32_bits(gi[7]));
    cr_expect_eq(f32_bits(gi[5]), 0x80000000u, "isa %s d_up[1] = %08x",
                 xte_cpu_isa_name((xte_cpu_isa)isa), f32_bits(gi[5]));
  }
  xte_cpu_set_isa(saved);
}

/* Attention forward with an infinity and a NaN in V and finite Q, K: the probability of a far
 * key underflows to 0, so its inf value gives p * v = 0 * inf, a NaN the pv chain creates while
 * the row's sum l stays finite. Every ISA must write the scalar ISA's bytes (in the XTE_NAN_SIM
 * build the scalar ISA gives the GPU's NaN there unless the driver sets the bits). */
static xte_tensor t4(void *p, int64_t a, int64_t b, int64_t c, int64_t d) {
  xte_tensor t = xte_tensor_2d(p, XTE_DTYPE_FP32, a, b);
  t.rank = 4;
  t.shape[2] = c;
  t.shape[3] = d;
  return t;
}

Test(nan_rule, attention_inf_nan_in_v_isas_agree) {
  enum { S = 8, D = 16 };
  float q[S * D], k[S * D], v[S * D], o[S * D], ref[S * D], lse[S], lref[S];
  const xte_cpu_isa saved = xte_cpu_get_isa();
  xte_attention_config cfg = xte_attention_config_default();
  int i, isa, ran = 0;
  for (i = 0; i < S * D; i++) {
    q[i] = (i % D == 0) ? 30.0f : 0.0f;                  /* q . k_j = 30 k_j[0] */
    k[i] = (i % D == 0) ? (float)(i / D) * 4.0f : 0.25f; /* logits 0, 120 / 4, ... apart */
    v[i] = (float)(i % 5) - 2.0f;
  }
  v[0 * D + 3] = INFINITY;              /* key 0: p = 0 for every row (its logit is the lowest) */
  v[1 * D + 4] = -INFINITY;             /* key 1 too */
  v[7 * D + 5] = bits_f32(0xFFC12345u); /* key 7: the largest p, a NaN with a payload */
  cfg.mask = XTE_ATTN_MASK_NONE;
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    xte_tensor Q = t4(q, 1, S, 1, D), K = t4(k, 1, S, 1, D), V = t4(v, 1, S, 1, D),
               O = t4(isa == 0 ? ref : o, 1, S, 1, D);
    xte_tensor L = xte_tensor_2d(isa == 0 ? lref : lse, XTE_DTYPE_FP32, 1, S);
    L.rank = 3;
    L.shape[0] = 1;
    L.shape[1] = 1;
    L.shape[2] = S;
    if (!set_isa(isa)) {
      cr_assert_neq(isa, 0);
      continue;
    }
    ran++;
    cr_assert_eq(xte_attention_fwd(&Q, &K, &V, &O, &L, &cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    if (isa == 0) continue;
    for (i = 0; i < S * D; i++)
      cr_expect_eq(f32_bits(o[i]), f32_bits(ref[i]), "isa %s O[%d][%d] = %08x, scalar %08x",
                   xte_cpu_isa_name((xte_cpu_isa)isa), i / D, i % D, f32_bits(o[i]),
                   f32_bits(ref[i]));
    cr_expect(memcmp(lse, lref, sizeof lse) == 0, "isa %s: LSE differs",
              xte_cpu_isa_name((xte_cpu_isa)isa));
  }
  xte_cpu_set_isa(saved);
  /* the case does what it says: key 0's inf meets p = 0 (a NaN), key 7's NaN reaches O; every
   * NaN written is the canonical 0x7FC00000 (docs/numerics.md, NaN bits), on every ISA */
  cr_expect(isnan(ref[0 * D + 3]) && isnan(ref[0 * D + 4]) && isnan(ref[0 * D + 5]));
  for (i = 0; i < S * D; i++)
    if (isnan(ref[i]))
      cr_expect_eq(f32_bits(ref[i]), 0x7FC00000u, "O[%d][%d] = %08x, the contract 7fc00000", i / D,
                   i % D, f32_bits(ref[i]));
  cr_assert(ran >= 1);
}

/* A [1x128 block] qtensor of raw codes [R, 128] with every scale_inv 1 (rowwise copy only). */
static void codes_qtensor(xte_qtensor *q, uint8_t *codes, float *scales, int R, xte_dtype dt) {
  int i;
  memset(q, 0, sizeof *q);
  q->scaling_mode = XTE_SCALING_BLOCK_1x128;
  q->recipe = XTE_RECIPE_TE_BLOCK;
  q->rowwise = xte_tensor_2d(codes, dt, R, N);
  q->columnwise = xte_tensor_2d(NULL, dt, N, R);
  for (i = 0; i < R; i++) scales[i] = 1.0f;
  q->rowwise_scale_inv.data = scales;
  q->rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  q->rowwise_scale_inv.rows = R;
  q->rowwise_scale_inv.cols = 1;
  q->rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
}

/* GEMM, both modes: e5m2 infinities times 0 and +inf + -inf in a block make NaN partials (the
 * FAST kernels' fp32 multiply-adds create them in hardware); D holds exactly the canonical NaN
 * (fp32 0x7FC00000, bf16 0x7FC0) and the infinity, on every ISA. In the XTE_NAN_SIM build the
 * scalar kernels' block step gives 0x7FFFFFFF, which must not reach D either. */
Test(nan_rule, gemm_created_nans_both_modes) {
  uint8_t a[2 * N], b[2 * N];
  float sa[2], sb[2], d[4];
  uint16_t d16[4];
  const uint32_t want[4] = {0x7FC00000u, 0x7F800000u, 0x7FC00000u, 0x7FC00000u};
  const uint16_t want16[4] = {0x7FC0, 0x7F80, 0x7FC0, 0x7FC0};
  const xte_cpu_isa saved = xte_cpu_get_isa();
  xte_qtensor qa, qb;
  int isa, mode, i, ran = 0;
  memset(a, 0, sizeof a);
  memset(b, 0, sizeof b);
  a[0] = 0x7C; /* A row 0: +inf at k 0 */
  a[N] = 0x7C; /* A row 1: +inf at k 0, -inf at k 1 */
  a[N + 1] = 0xFC;
  b[1] = 0x38; /* B row 0: 0 at k 0 (inf x 0), 1 at k 1 */
  b[N] = 0x38; /* B row 1: 1 at k 0 and k 1 */
  b[N + 1] = 0x38;
  codes_qtensor(&qa, a, sa, 2, XTE_DTYPE_E5M2);
  codes_qtensor(&qb, b, sb, 2, XTE_DTYPE_E4M3);
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    if (!set_isa(isa)) continue;
    ran++;
    for (mode = 0; mode < 2; mode++) {
      xte_gemm_config g = xte_gemm_config_default();
      xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, 2, 2),
                 D16 = xte_tensor_2d(d16, XTE_DTYPE_BF16, 2, 2);
      g.mode = mode ? XTE_GEMM_FAST : XTE_GEMM_EXACT;
      cr_assert_eq(xte_gemm(&qa, &qb, NULL, &D, &g, NULL), XTE_SUCCESS, "%s", xte_last_error());
      cr_assert_eq(xte_gemm(&qa, &qb, NULL, &D16, &g, NULL), XTE_SUCCESS, "%s", xte_last_error());
      for (i = 0; i < 4; i++) {
        cr_expect_eq(f32_bits(d[i]), want[i], "isa %s mode %d D[%d] = %08x, the contract %08x",
                     xte_cpu_isa_name((xte_cpu_isa)isa), mode, i, f32_bits(d[i]), want[i]);
        cr_expect_eq(d16[i], want16[i], "isa %s mode %d bf16 D[%d] = %04x, the contract %04x",
                     xte_cpu_isa_name((xte_cpu_isa)isa), mode, i, d16[i], want16[i]);
      }
    }
  }
  xte_cpu_set_isa(saved);
  cr_assert(ran >= 1);
}

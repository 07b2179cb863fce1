/* XTE_GEMM_FAST on the CPU, on every ISA the machine runs:
 * - against an fp64 oracle written here (its own FP8 decoding, block sums and scale products),
 *   checking the FAST bound of docs/numerics.md (section 6, "XTE_GEMM_FAST") element by element:
 *     |D_fast - T| <= (KB 2^-13 + (nb + 2) 2^-23) S + nb 2^-149 + 2^-23 (|V| + |C| + |bias|)
 *                     + u_out |T| (+ 2^-133 for bf16)
 *   with V = sum_b P_b s_b (P_b the block's exact sum in fp64, s_b = sa sb), S = sum_b T_b |s_b|,
 *   T = V + C + bias (the last term: the epilogue's two fp32 roundings, which both modes take);
 *   every scaling pair, scale layout, dtype pair, transpose, odd shapes, K tails, MXFP8, C and
 *   bias, bf16 output, grouped (contiguous, masked) calls; NaN outputs are the canonical NaN and
 *   infinite ones the oracle's infinity;
 * - where every block sum is exact in fp32 whatever the order (e4m3 codes below 0.5: products are
 *   multiples of 2^-18 below 2^-2, 128 of them below 2^23 units), FAST gives EXACT's bytes: the
 *   scale step, block order, tails and epilogue are the contract's (this catches what the bound
 *   is too wide to see);
 * - NaN / inf / e5m2 inf x 0 / +inf + -inf / subnormal codes; empty shapes; run to run and thread
 *   count determinism; EXACT untouched by the mode's existence (its own tests).
 * On avx512 with AMX-BF16 (the plain run; amx_bf16_in_use_where_the_cpu_has_it checks it) all of
 * this runs FAST's panel path on the AMX-BF16 tiles; the @nobf16 and @noamx runs on the fp32
 * kernels. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "test_gemm_oracle.h"

static const xte_cpu_isa ISAS[] = {XTE_CPU_ISA_SCALAR, XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                   XTE_CPU_ISA_AVX512_SIMDE};
#define NISA 4

/* ---------------------------------------------------------------- the fp64 oracle */
/* The value of an FP8 code (OCP e4m3: bias 7, no inf, S.1111.111 NaN; e5m2: bias 15, IEEE). */
static double f_decode(uint8_t c, xte_dtype dt) {
  const int s = c >> 7;
  double v;
  if (dt == XTE_DTYPE_E4M3) {
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
  } else {
    const int e = (c >> 2) & 31, m = c & 3;
    if (e == 31) return m ? NAN : (s ? -INFINITY : INFINITY);
    v = e == 0 ? ldexp(m, -16) : ldexp(4 + m, e - 17);
  }
  return s ? -v : v;
}

typedef struct fref {
  double v, s; /* V and S above */
  int nan;     /* some block partial (or its scaled term) is NaN */
  int nb;
} fref;

static fref f_ref(const lop *A, int64_t ia, const lop *B, int64_t jb, int kb) {
  fref r;
  int64_t k0;
  memset(&r, 0, sizeof r);
  for (k0 = 0; k0 < A->K; k0 += kb) {
    const int64_t len = A->K - k0 < kb ? A->K - k0 : kb;
    const double sc =
        (double)A->scales[ia * A->nkb + k0 / kb] * (double)B->scales[jb * B->nkb + k0 / kb];
    double p = 0.0, t = 0.0;
    int64_t k;
    for (k = 0; k < len; k++) {
      const double x = f_decode(A->codes[ia * A->K + k0 + k], A->dt),
                   y = f_decode(B->codes[jb * B->K + k0 + k], B->dt);
      p += x * y;
      if (x == x && y == y) t += fabs(x * y);
    }
    r.nb++;
    if (p != p || p * sc != p * sc) {
      r.nan = 1;
      continue;
    }
    r.v += p * sc;
    if (t == t) r.s += t * fabs(sc);
  }
  if (r.v != r.v) r.nan = 1; /* +inf and -inf terms */
  return r;
}

/* One output element against the bound; returns 0 and fills why when it fails. */
static int f_check(uint32_t bits, xte_dtype d_dt, fref r, int kb, double c, double bias, char *why,
                   size_t nwhy) {
  const int bf = d_dt == XTE_DTYPE_BF16;
  const double got = bf ? (double)o_float(bits << 16) : (double)o_float(bits);
  const double t = r.v + c + bias;
  double tol;
  if (r.nan || t != t) {
    if (bits != (bf ? 0x7FC0u : 0x7FC00000u)) {
      snprintf(why, nwhy, "want the canonical NaN, got %08x", bits);
      return 0;
    }
    return 1;
  }
  if (isinf(t)) {
    if (got != t) {
      snprintf(why, nwhy, "want %g, got %08x", t, bits);
      return 0;
    }
    return 1;
  }
  tol = (kb * 0x1p-13 + (r.nb + 2) * 0x1p-23) * r.s + r.nb * 0x1p-149 +
        0x1p-23 * (fabs(r.v) + fabs(c) + fabs(bias)) + (bf ? 0x1p-8 * fabs(t) + 0x1p-133 : 0.0);
  if (!(fabs(got - t) <= tol)) {
    snprintf(why, nwhy, "got %.9g want %.9g (|err| %.3g > bound %.3g, S %.3g)", got, t,
             fabs(got - t), tol, r.s);
    return 0;
  }
  return 1;
}

static size_t dsize(xte_dtype d) {
  return d == XTE_DTYPE_BF16 ? 2 : 4;
}

static uint32_t elem(const void *p, int64_t i, xte_dtype dt) {
  return dt == XTE_DTYPE_BF16 ? ((const uint16_t *)p)[i] : ((const uint32_t *)p)[i];
}

static xte_gemm_config fast_config(void) {
  xte_gemm_config g = xte_gemm_config_default();
  g.mode = XTE_GEMM_FAST;
  return g;
}

/* ---------------------------------------------------------------- quantized random operands */
typedef struct side {
  xte_scaling_mode mode;
  xte_recipe recipe;
} side;

static int layouts_for(xte_recipe r, xte_scale_layout *out) {
  if (o_is_mx(r)) {
    out[0] = XTE_SCALE_LAYOUT_COMPACT;
    out[1] = XTE_SCALE_LAYOUT_MX_SWIZZLED;
    return 2;
  }
  out[0] = XTE_SCALE_LAYOUT_COMPACT;
  out[1] = XTE_SCALE_LAYOUT_TE_GEMM;
  out[2] = XTE_SCALE_LAYOUT_DEEPGEMM;
  return 3;
}

/* FAST on quantized random X_A, X_B with every scale layout on every ISA against the bound;
 * flags bit 0: accumulate into an fp32 C, bit 1: a bias, bit 2: a bf16 C (with bit 0). */
static void run_bound(side sa, side sb, xte_dtype da, xte_dtype db, int ta, int tb, int64_t M,
                      int64_t N, int64_t K, xte_dtype d_dt, int flags, uint64_t seed) {
  const int64_t RA = ta ? K : M, CA = ta ? M : K, RB = tb ? K : N, CB = tb ? N : K;
  const int kb = sa.mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  float *xa = o_random(RA, CA, seed), *xb = o_random(RB, CB, seed + 1);
  const xte_dtype c_dt = (flags & 4) ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
  void *out = malloc(dsize(d_dt) * (size_t)(M * N + 1));
  void *cbuf = malloc(4 * (size_t)(M * N + 1));
  float *bias = malloc(sizeof(float) * (size_t)(N + 1));
  fref *ref = malloc(sizeof(fref) * (size_t)(M * N + 1));
  xte_scale_layout lya[3], lyb[3];
  int nla = layouts_for(sa.recipe, lya), nlb = layouts_for(sb.recipe, lyb), li, ii;
  xte_gemm_config g = fast_config();
  xte_tensor bt = xte_tensor_1d(bias, XTE_DTYPE_FP32, N);
  tq qa, qb;
  lop la, lb;
  int64_t i;
  uint64_t s = seed;
  for (i = 0; i < M * N; i++) {
    const float v = (float)ldexp(o_unif(&s) - 0.5, (int)(o_rng(&s) % 7) - 3);
    if (c_dt == XTE_DTYPE_BF16)
      ((uint16_t *)cbuf)[i] = o_bf16(v);
    else
      ((float *)cbuf)[i] = v;
  }
  for (i = 0; i < N; i++) bias[i] = (float)(o_unif(&s) - 0.5);
  cr_assert_eq(tq_make(&qa, xa, RA, CA, sa.mode, sa.recipe, XTE_SCALE_LAYOUT_COMPACT, da),
               XTE_SUCCESS, "quantize A: %s", xte_last_error());
  cr_assert_eq(tq_make(&qb, xb, RB, CB, sb.mode, sb.recipe, XTE_SCALE_LAYOUT_COMPACT, db),
               XTE_SUCCESS, "quantize B: %s", xte_last_error());
  tq_logical(&qa, ta, &la);
  tq_logical(&qb, tb, &lb);
  for (i = 0; i < M * N; i++) ref[i] = f_ref(&la, i / N, &lb, i % N, kb);
  g.trans_a = ta;
  g.trans_b = tb;
  g.accumulate = flags & 1;
  g.bias = (flags & 2) ? &bt : NULL;
  for (li = 0; li < (nla > nlb ? nla : nlb); li++) {
    tq pa, pb;
    xte_tensor D = xte_tensor_2d(out, d_dt, M, N), C = xte_tensor_2d(cbuf, c_dt, M, N);
    cr_assert_eq(tq_make(&pa, xa, RA, CA, sa.mode, sa.recipe, lya[li % nla], da), XTE_SUCCESS);
    cr_assert_eq(tq_make(&pb, xb, RB, CB, sb.mode, sb.recipe, lyb[li % nlb], db), XTE_SUCCESS);
    for (ii = 0; ii < NISA; ii++) {
      char why[200];
      if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
      memset(out, 0xA5, dsize(d_dt) * (size_t)(M * N));
      cr_assert_eq(xte_gemm(&pa.q, &pb.q, (flags & 1) ? &C : NULL, &D, &g, NULL), XTE_SUCCESS,
                   "gemm %s: %s", xte_cpu_isa_name(ISAS[ii]), xte_last_error());
      for (i = 0; i < M * N; i++) {
        const double cv = !(flags & 1)             ? 0.0
                          : c_dt == XTE_DTYPE_BF16 ? o_float((uint32_t)((uint16_t *)cbuf)[i] << 16)
                                                   : ((float *)cbuf)[i];
        const double bv = (flags & 2) ? bias[i % N] : 0.0;
        if (!f_check(elem(out, i, d_dt), d_dt, ref[i], kb, cv, bv, why, sizeof why))
          cr_assert_fail(
              "isa %s modes %d/%d dtypes %d/%d trans %d/%d layouts %d/%d M %lld N %lld "
              "K %lld out %d flags %d: (%lld, %lld): %s",
              xte_cpu_isa_name(ISAS[ii]), sa.mode, sb.mode, da, db, ta, tb, lya[li % nla],
              lyb[li % nlb], (long long)M, (long long)N, (long long)K, d_dt, flags,
              (long long)(i / N), (long long)(i % N), why);
      }
    }
    tq_free(&pa);
    tq_free(&pb);
  }
  o_reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  lop_free(&la);
  lop_free(&lb);
  free(xa);
  free(xb);
  free(out);
  free(cbuf);
  free(bias);
  free(ref);
}

static const side S1x128 = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK};
static const side S128 = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK};
static const side SDG = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM};
static const side SDG128 = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_DEEPGEMM};
static const side SPT = {XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT};
static const side SMX = {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE};
static const side SMXO = {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_OCP};

Test(gemm_fast, bound_pairs_and_layouts) {
  const side pairs[][2] = {{S1x128, S128}, {S128, S1x128}, {S1x128, S1x128},
                           {SPT, SPT},     {SMX, SMXO},    {SDG, SDG128}};
  const xte_dtype dts[][2] = {{XTE_DTYPE_E4M3, XTE_DTYPE_E4M3},
                              {XTE_DTYPE_E5M2, XTE_DTYPE_E4M3},
                              {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2}};
  int p, d, n = 0;
  for (p = 0; p < 6; p++)
    for (d = 0; d < 3; d++, n++) {
      /* 128x128 x 1x128 is fprop with the operands swapped: op(A) is the 128x128 one; the
       * transposed pairs need a columnwise copy along K (1x128 with trans: TE's copy) */
      const int ta = pairs[p][0].mode == XTE_SCALING_BLOCK_128x128 ? n & 1 : 0;
      const int tb = (n >> 1) & 1;
      run_bound(pairs[p][0], pairs[p][1], dts[d][0], dts[d][1], ta, tb, 37 + n, 45 + 3 * n,
                257 + 17 * n, (n & 1) ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, n % 4, 100 + (uint64_t)n);
    }
}

/* Tails and blocking edges: M, N, K odd, K below one block, past the K panel (128), past MC,
 * the M chunk (1024 rows), NC (2048 columns), MXFP8 tails, C bf16 with bias. */
Test(gemm_fast, bound_shapes) {
  run_bound(S1x128, S128, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 0, 1, 1, 1, XTE_DTYPE_FP32, 3, 1);
  run_bound(S1x128, S128, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 0, 3, 5, 7, XTE_DTYPE_BF16, 7, 2);
  run_bound(S1x128, S128, XTE_DTYPE_E5M2, XTE_DTYPE_E4M3, 0, 1, 1100, 33, 300, XTE_DTYPE_FP32, 3,
            3);
  run_bound(S1x128, S128, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 0, 29, 2100, 129, XTE_DTYPE_BF16, 0,
            4);
  run_bound(SMX, SMX, XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, 0, 0, 77, 41, 1000, XTE_DTYPE_FP32, 7, 5);
  run_bound(SMX, SMX, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 1, 1, 50, 31, 95, XTE_DTYPE_BF16, 2, 6);
}

/* ---------------------------------------------------------------- hand-made codes
 * A rowwise-only qtensor [R, C] (1x128 TE_BLOCK with fp32 scales, or MXFP8 MX_OCP with E8M0) of
 * the given codes, COMPACT scales chosen at random (fp32: 1 + j / 8 times 2^-4 .. 2^4; E8M0:
 * 2^-4 .. 2^4). */
static void make_codes_tq(tq *t, const uint8_t *codes, int64_t R, int64_t C, int mx, xte_dtype dt,
                          uint64_t seed) {
  const xte_scaling_mode mode = mx ? XTE_SCALING_MXFP8_1x32 : XTE_SCALING_BLOCK_1x128;
  const xte_recipe rc = mx ? XTE_RECIPE_MX_OCP : XTE_RECIPE_TE_BLOCK;
  int64_t sr, sc, i;
  uint64_t s = seed * 7919 + 1;
  memset(t, 0, sizeof *t);
  t->R = R;
  t->C = C;
  t->q.scaling_mode = mode;
  t->q.recipe = rc;
  t->q.rowwise = xte_tensor_2d(malloc((size_t)(R * C + 1)), dt, R, C);
  memcpy(t->q.rowwise.data, codes, (size_t)(R * C));
  t->q.columnwise = xte_tensor_2d(NULL, dt, mx ? R : C, mx ? C : R);
  cr_assert_eq(xte_quantize_scale_shape(R, C, mode, rc, XTE_SCALE_LAYOUT_COMPACT, 0, &sr, &sc),
               XTE_SUCCESS);
  t->q.rowwise_scale_inv.data = calloc((size_t)(sr * sc + 1), mx ? 1 : 4);
  t->q.rowwise_scale_inv.dtype = mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
  t->q.rowwise_scale_inv.rows = sr;
  t->q.rowwise_scale_inv.cols = sc;
  t->q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  for (i = 0; i < sr * sc; i++) {
    if (mx)
      ((uint8_t *)t->q.rowwise_scale_inv.data)[i] = (uint8_t)(127 - 4 + (int)(o_rng(&s) % 9));
    else
      ((float *)t->q.rowwise_scale_inv.data)[i] =
          (float)ldexp(1.0 + (double)(o_rng(&s) % 8) / 8.0, (int)(o_rng(&s) % 9) - 4);
  }
}

/* e4m3 codes below 0.5 in magnitude (exponent field <= 5), either sign */
static void small_codes(uint8_t *c, int64_t n, uint64_t seed) {
  uint64_t s = seed * 31 + 7;
  int64_t i;
  for (i = 0; i < n; i++) c[i] = (uint8_t)((o_rng(&s) % 0x30) | ((o_rng(&s) & 1) << 7));
}

/* FAST against EXACT, bytes, where every partial is exact in fp32 (dense and both groupings) */
static void run_same_bytes(int64_t M, int64_t N, int64_t K, int mx, xte_dtype d_dt, int flags,
                           uint64_t seed) {
  uint8_t *ca = malloc((size_t)(M * K + 1)), *cb = malloc((size_t)(N * K + 1));
  void *fast = malloc(dsize(d_dt) * (size_t)(M * N + 1)),
       *exact = malloc(dsize(d_dt) * (size_t)(M * N + 1));
  float *cbuf = malloc(sizeof(float) * (size_t)(M * N + 1)),
        *bias = malloc(sizeof(float) * (size_t)(N + 1));
  xte_tensor bt = xte_tensor_1d(bias, XTE_DTYPE_FP32, N);
  xte_tensor D = xte_tensor_2d(fast, d_dt, M, N), DE = xte_tensor_2d(exact, d_dt, M, N),
             C = xte_tensor_2d(cbuf, XTE_DTYPE_FP32, M, N);
  xte_gemm_config ge = xte_gemm_config_default(), gf;
  tq qa, qb;
  int64_t i;
  int ii;
  uint64_t s = seed;
  small_codes(ca, M * K, seed);
  small_codes(cb, N * K, seed + 1);
  for (i = 0; i < M * N; i++) cbuf[i] = (float)(o_unif(&s) - 0.5);
  for (i = 0; i < N; i++) bias[i] = (float)ldexp(o_unif(&s) - 0.5, -3);
  make_codes_tq(&qa, ca, M, K, mx, XTE_DTYPE_E4M3, seed);
  make_codes_tq(&qb, cb, N, K, mx, XTE_DTYPE_E4M3, seed + 1);
  ge.accumulate = flags & 1;
  ge.bias = (flags & 2) ? &bt : NULL;
  gf = ge;
  gf.mode = XTE_GEMM_FAST;
  for (ii = 0; ii < NISA; ii++) {
    if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
    cr_assert_eq(xte_gemm(&qa.q, &qb.q, (flags & 1) ? &C : NULL, &DE, &ge, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    memset(fast, 0x5A, dsize(d_dt) * (size_t)(M * N));
    cr_assert_eq(xte_gemm(&qa.q, &qb.q, (flags & 1) ? &C : NULL, &D, &gf, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (i = 0; i < M * N; i++)
      if (elem(fast, i, d_dt) != elem(exact, i, d_dt))
        cr_assert_fail(
            "isa %s M %lld N %lld K %lld mx %d out %d flags %d: (%lld, %lld) FAST %08x "
            "EXACT %08x",
            xte_cpu_isa_name(ISAS[ii]), (long long)M, (long long)N, (long long)K, mx, d_dt, flags,
            (long long)(i / N), (long long)(i % N), elem(fast, i, d_dt), elem(exact, i, d_dt));
  }
  o_reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  free(ca);
  free(cb);
  free(fast);
  free(exact);
  free(cbuf);
  free(bias);
}

Test(gemm_fast, exact_partials_give_exact_bytes) {
  run_same_bytes(1, 1, 1, 0, XTE_DTYPE_FP32, 0, 1);
  run_same_bytes(13, 37, 129, 0, XTE_DTYPE_FP32, 3, 2);
  run_same_bytes(45, 70, 300, 1, XTE_DTYPE_BF16, 1, 3);
  run_same_bytes(530, 50, 513, 0, XTE_DTYPE_FP32, 2, 4);
  run_same_bytes(31, 2061, 257, 1, XTE_DTYPE_FP32, 3, 5);
  run_same_bytes(100, 64, 1024, 0, XTE_DTYPE_BF16, 3, 6);
  /* no C, no bias: the output conversion alone (the AMX-BF16 path's vectorised one), row tails */
  run_same_bytes(70, 2085, 300, 0, XTE_DTYPE_BF16, 0, 7);
  run_same_bytes(33, 45, 129, 1, XTE_DTYPE_FP32, 0, 8);
}

/* Grouped (contiguous and masked, padding rows poisoned with NaN codes), FAST against EXACT on
 * exact-partial codes: the problems' offsets, masked rows and B slices are the exact path's. */
static void run_grouped_same(int masked) {
  enum { G = 4, N = 70, K = 300, ALIGN = 64 };
  const int64_t sizes[G] = {0, 1, 130, 37};
  int64_t offs[G], rows = 0, g, m_max = 130, i;
  int32_t mm[G];
  uint8_t *ca, *cb;
  float *fast, *exact;
  tq qa, qb;
  int ii;
  for (g = 0; g < G; g++) {
    offs[g] = masked ? g * m_max : rows;
    rows += masked ? m_max : o_cdiv(sizes[g], ALIGN) * ALIGN;
    mm[g] = (int32_t)sizes[g];
  }
  ca = malloc((size_t)(rows * K));
  cb = malloc((size_t)(G * N * K));
  small_codes(ca, rows * K, 11);
  small_codes(cb, G * N * K, 12);
  for (g = 0; g < G; g++) /* padding rows: NaN codes, never read */
    for (i = (offs[g] + sizes[g]) * K; i < (g + 1 < G ? offs[g + 1] : rows) * K; i++) ca[i] = 0x7F;
  make_codes_tq(&qa, ca, rows, K, 0, XTE_DTYPE_E4M3, 11);
  make_codes_tq(&qb, cb, G * N, K, 0, XTE_DTYPE_E4M3, 12);
  fast = malloc(sizeof(float) * (size_t)(rows * N));
  exact = malloc(sizeof(float) * (size_t)(rows * N));
  for (ii = 0; ii < NISA; ii++) {
    xte_gemm_groups gr;
    xte_gemm_config cfg = xte_gemm_config_default();
    xte_tensor DF = xte_tensor_2d(fast, XTE_DTYPE_FP32, rows, N),
               DE = xte_tensor_2d(exact, XTE_DTYPE_FP32, rows, N);
    xte_tensor mt = xte_tensor_1d(mm, XTE_DTYPE_INT32, G);
    if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
    memset(&gr, 0, sizeof gr);
    gr.kind = masked ? XTE_GEMM_GROUPED_MASKED : XTE_GEMM_GROUPED_CONTIGUOUS;
    gr.num_groups = G;
    gr.group_sizes = sizes;
    gr.alignment = ALIGN;
    gr.masked_m = &mt;
    memset(fast, 0x11, sizeof(float) * (size_t)(rows * N));
    memset(exact, 0x11, sizeof(float) * (size_t)(rows * N));
    cr_assert_eq(xte_gemm_grouped(&qa.q, &qb.q, NULL, &DE, &gr, &cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    cfg.mode = XTE_GEMM_FAST;
    cr_assert_eq(xte_gemm_grouped(&qa.q, &qb.q, NULL, &DF, &gr, &cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (i = 0; i < rows * N; i++)
      cr_assert_eq(o_bits(fast[i]), o_bits(exact[i]),
                   "masked %d isa %s: row %lld col %lld: FAST %08x EXACT %08x", masked,
                   xte_cpu_isa_name(ISAS[ii]), (long long)(i / N), (long long)(i % N),
                   o_bits(fast[i]), o_bits(exact[i]));
  }
  o_reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  free(ca);
  free(cb);
  free(fast);
  free(exact);
}

Test(gemm_fast, grouped_contiguous_same_bytes) {
  run_grouped_same(0);
}
Test(gemm_fast, grouped_masked_same_bytes) {
  run_grouped_same(1);
}

/* Grouped contiguous on quantized random data (e5m2 B) against the fp64 bound, group by group. */
Test(gemm_fast, grouped_bound) {
  enum { G = 3, N = 96, K = 260 };
  const int64_t sizes[G] = {70, 0, 45};
  const int64_t rows = 115;
  float *xa = o_random(rows, K, 41), *xb = o_random(G * N, K, 42);
  float *d = malloc(sizeof(float) * rows * N);
  tq qa, qb;
  lop la, lb;
  int ii;
  cr_assert_eq(tq_make(&qa, xa, rows, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                       XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
               XTE_SUCCESS);
  cr_assert_eq(tq_make(&qb, xb, G * N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                       XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E5M2),
               XTE_SUCCESS);
  tq_logical(&qa, 0, &la);
  tq_logical(&qb, 0, &lb);
  for (ii = 0; ii < NISA; ii++) {
    xte_gemm_groups gr;
    xte_gemm_config cfg = fast_config();
    xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, rows, N);
    int64_t g, r0 = 0, r, n;
    if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
    memset(&gr, 0, sizeof gr);
    gr.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
    gr.num_groups = G;
    gr.group_sizes = sizes;
    cr_assert_eq(xte_gemm_grouped(&qa.q, &qb.q, NULL, &D, &gr, &cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (g = 0; g < G; r0 += sizes[g], g++)
      for (r = r0; r < r0 + sizes[g]; r++)
        for (n = 0; n < N; n++) {
          char why[200];
          if (!f_check(o_bits(d[r * N + n]), XTE_DTYPE_FP32, f_ref(&la, r, &lb, g * N + n, 128),
                       128, 0.0, 0.0, why, sizeof why))
            cr_assert_fail("isa %s group %lld row %lld col %lld: %s", xte_cpu_isa_name(ISAS[ii]),
                           (long long)g, (long long)r, (long long)n, why);
        }
  }
  o_reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  lop_free(&la);
  lop_free(&lb);
  free(xa);
  free(xb);
  free(d);
}

/* ---------------------------------------------------------------- specials */
/* e5m2 A x e4m3 B codes with NaN codes, e5m2 infinities, inf x 0 and +inf + -inf in one block,
 * subnormal codes: every element against the oracle (NaN canonical, infinities exact), and the
 * special elements' bytes equal to EXACT's. */
Test(gemm_fast, nan_inf_subnormal) {
  enum { M = 40, N = 35, K = 200 };
  uint8_t ca[M * K], cb[N * K];
  float fast[M * N], exact[M * N];
  uint16_t fast16[M * N];
  tq qa, qb;
  lop la, lb;
  uint64_t s = 99;
  int64_t i;
  int ii;
  for (i = 0; i < M * K; i++) {
    /* e5m2 subnormals (exponent 0) and normals up to 2^3 */
    uint8_t c = (uint8_t)(o_rng(&s) % 0x48);
    ca[i] = (uint8_t)(c | ((o_rng(&s) & 1) << 7));
  }
  for (i = 0; i < N * K; i++) {
    uint8_t c = (uint8_t)(o_rng(&s) % 0x60); /* e4m3 subnormals .. 2^4 */
    cb[i] = (uint8_t)(c | ((o_rng(&s) & 1) << 7));
  }
  ca[3 * K + 5] = 0x7C;    /* +inf in row 3 (first block): inf products in its row */
  ca[7 * K + 10] = 0x7C;   /* row 7: +inf at k 10, */
  ca[7 * K + 20] = 0xFC;   /* -inf at k 20: +inf + -inf where both B values are nonzero */
  ca[11 * K + 150] = 0x7D; /* a NaN code (second block) */
  cb[0 * K + 10] = 0x38;   /* column 0: 1.0 at k 10 and 20, so (7, 0) is +inf + -inf */
  cb[0 * K + 20] = 0x38;
  cb[4 * K + 5] = 0x00;                                      /* column 4: (3, 4) is inf x 0 */
  cb[9 * K + 30] = 0x7F;                                     /* e4m3 NaN code in column 9 */
  for (i = 0; i < K; i++) ca[20 * K + i] = (uint8_t)(i & 1); /* a row of the smallest subnormals */
  make_codes_tq(&qa, ca, M, K, 0, XTE_DTYPE_E5M2, 5);
  make_codes_tq(&qb, cb, N, K, 0, XTE_DTYPE_E4M3, 6);
  tq_logical(&qa, 0, &la);
  tq_logical(&qb, 0, &lb);
  for (ii = 0; ii < NISA; ii++) {
    xte_gemm_config ge = xte_gemm_config_default(), gf = fast_config();
    xte_tensor DF = xte_tensor_2d(fast, XTE_DTYPE_FP32, M, N),
               DE = xte_tensor_2d(exact, XTE_DTYPE_FP32, M, N);
    int nspecial = 0;
    if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
    cr_assert_eq(xte_gemm(&qa.q, &qb.q, NULL, &DE, &ge, NULL), XTE_SUCCESS, "%s", xte_last_error());
    cr_assert_eq(xte_gemm(&qa.q, &qb.q, NULL, &DF, &gf, NULL), XTE_SUCCESS, "%s", xte_last_error());
    for (i = 0; i < M * N; i++) {
      char why[200];
      const fref r = f_ref(&la, i / N, &lb, i % N, 128);
      if (!f_check(o_bits(fast[i]), XTE_DTYPE_FP32, r, 128, 0.0, 0.0, why, sizeof why))
        cr_assert_fail("isa %s (%lld, %lld): %s", xte_cpu_isa_name(ISAS[ii]), (long long)(i / N),
                       (long long)(i % N), why);
      if (r.nan || isinf(r.v)) {
        nspecial++;
        cr_assert_eq(o_bits(fast[i]), o_bits(exact[i]), "isa %s (%lld, %lld): %08x vs %08x",
                     xte_cpu_isa_name(ISAS[ii]), (long long)(i / N), (long long)(i % N),
                     o_bits(fast[i]), o_bits(exact[i]));
      }
    }
    /* rows 3, 7, 11 and column 9 hold specials; (3, 4) is NaN (inf x 0), row 7 NaN */
    cr_assert(nspecial >= 3 * N + M - 3, "isa %s: %d special outputs", xte_cpu_isa_name(ISAS[ii]),
              nspecial);
    cr_assert_eq(o_bits(fast[3 * N + 4]), 0x7FC00000u);
    cr_assert_eq(o_bits(fast[7 * N + 0]), 0x7FC00000u);
    cr_assert(isinf(fast[3 * N + 0]) || o_bits(fast[3 * N + 0]) == 0x7FC00000u);
    /* bf16 out, no C or bias: NaN the canonical 0x7FC0, infinities kept */
    DF = xte_tensor_2d(fast16, XTE_DTYPE_BF16, M, N);
    cr_assert_eq(xte_gemm(&qa.q, &qb.q, NULL, &DF, &gf, NULL), XTE_SUCCESS, "%s", xte_last_error());
    for (i = 0; i < M * N; i++) {
      char why[200];
      const fref r = f_ref(&la, i / N, &lb, i % N, 128);
      if (!f_check(fast16[i], XTE_DTYPE_BF16, r, 128, 0.0, 0.0, why, sizeof why))
        cr_assert_fail("isa %s bf16 (%lld, %lld): %s", xte_cpu_isa_name(ISAS[ii]),
                       (long long)(i / N), (long long)(i % N), why);
    }
    cr_assert_eq(fast16[3 * N + 4], 0x7FC0u);
    cr_assert_eq(fast16[7 * N + 0], 0x7FC0u);
  }
  o_reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  lop_free(&la);
  lop_free(&lb);
}

/* ---------------------------------------------------------------- shapes, determinism */
/* M, N or K = 0: nothing written for M or N = 0; K = 0 gives D = C + bias. */
Test(gemm_fast, empty_shapes) {
  float xa[8 * 4], xb[8 * 4], c[8 * 8], bias[8], d[8 * 8];
  tq qa, qb;
  int64_t i;
  int ii;
  for (i = 0; i < 32; i++) xa[i] = xb[i] = (float)i / 7.0f;
  for (i = 0; i < 64; i++) c[i] = (float)i * 0.25f;
  for (i = 0; i < 8; i++) bias[i] = (float)i - 3.5f;
  for (ii = 0; ii < NISA; ii++) {
    xte_gemm_config g = fast_config();
    xte_tensor bt = xte_tensor_1d(bias, XTE_DTYPE_FP32, 8);
    if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
    /* K = 0 */
    cr_assert_eq(tq_make(&qa, xa, 8, 0, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                         XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
                 XTE_SUCCESS);
    cr_assert_eq(tq_make(&qb, xb, 8, 0, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                         XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
                 XTE_SUCCESS);
    {
      xte_tensor C = xte_tensor_2d(c, XTE_DTYPE_FP32, 8, 8),
                 D = xte_tensor_2d(d, XTE_DTYPE_FP32, 8, 8);
      g.accumulate = 1;
      g.bias = &bt;
      memset(d, 0x77, sizeof d);
      cr_assert_eq(xte_gemm(&qa.q, &qb.q, &C, &D, &g, NULL), XTE_SUCCESS, "%s", xte_last_error());
      for (i = 0; i < 64; i++) {
        volatile float want = c[i] + bias[i % 8];
        cr_assert_eq(o_bits(d[i]), o_bits(want), "K = 0 isa %s: element %lld",
                     xte_cpu_isa_name(ISAS[ii]), (long long)i);
      }
    }
    tq_free(&qa);
    tq_free(&qb);
    /* M = 0 and N = 0: D untouched */
    cr_assert_eq(tq_make(&qa, xa, 0, 4, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                         XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
                 XTE_SUCCESS);
    cr_assert_eq(tq_make(&qb, xb, 8, 4, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                         XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
                 XTE_SUCCESS);
    {
      xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, 0, 8);
      xte_gemm_config g0 = fast_config();
      memset(d, 0x77, sizeof d);
      cr_assert_eq(xte_gemm(&qa.q, &qb.q, NULL, &D, &g0, NULL), XTE_SUCCESS, "%s",
                   xte_last_error());
      for (i = 0; i < 64; i++) cr_assert_eq(o_bits(d[i]), 0x77777777u);
    }
    tq_free(&qa);
    tq_free(&qb);
  }
  o_reset_isa();
}

/* Same bytes run to run, and for 1 and 2 threads (the partition decides no arithmetic). */
Test(gemm_fast, deterministic) {
  enum { M = 300, N = 150, K = 700 };
  float *xa = o_random(M, K, 71), *xb = o_random(N, K, 72);
  float *d0 = malloc(sizeof(float) * M * N), *d1 = malloc(sizeof(float) * M * N);
  tq qa, qb;
  int ii, rep;
  const int nt0 = xte_cpu_get_num_threads();
  cr_assert_eq(tq_make(&qa, xa, M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                       XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
               XTE_SUCCESS);
  cr_assert_eq(tq_make(&qb, xb, N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                       XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E5M2),
               XTE_SUCCESS);
  for (ii = 0; ii < NISA; ii++) {
    xte_gemm_config g = fast_config();
    xte_tensor D0 = xte_tensor_2d(d0, XTE_DTYPE_FP32, M, N),
               D1 = xte_tensor_2d(d1, XTE_DTYPE_FP32, M, N);
    if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
    cr_assert_eq(xte_gemm(&qa.q, &qb.q, NULL, &D0, &g, NULL), XTE_SUCCESS);
    for (rep = 0; rep < 3; rep++) {
      cr_assert_eq(xte_cpu_set_num_threads(rep == 1 ? 1 : nt0), XTE_SUCCESS);
      memset(d1, 0, sizeof(float) * M * N);
      cr_assert_eq(xte_gemm(&qa.q, &qb.q, NULL, &D1, &g, NULL), XTE_SUCCESS);
      cr_assert_eq(memcmp(d0, d1, sizeof(float) * M * N), 0, "isa %s rep %d",
                   xte_cpu_isa_name(ISAS[ii]), rep);
    }
  }
  cr_assert_eq(xte_cpu_set_num_threads(nt0), XTE_SUCCESS);
  o_reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  free(xa);
  free(xb);
  free(d0);
  free(d1);
}

/* Every product of two FP8 values is exact in fp32, so the k-order sums of the scalar (product,
 * then sum), AVX2 and AVX-512 (fused) kernels are the same values: the same bytes on every ISA
 * (docs/numerics.md states it; e4m3 x e5m2, which no ISA runs on the exact AMX path). */
Test(gemm_fast, isas_agree) {
  enum { M = 61, N = 83, K = 390 };
  float *xa = o_random(M, K, 81), *xb = o_random(N, K, 82);
  uint16_t d[M * N], ref[M * N];
  tq qa, qb;
  int ii, ran = 0;
  cr_assert_eq(tq_make(&qa, xa, M, K, XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE,
                       XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
               XTE_SUCCESS);
  cr_assert_eq(tq_make(&qb, xb, N, K, XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE,
                       XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E5M2),
               XTE_SUCCESS);
  for (ii = 0; ii < NISA; ii++) {
    xte_gemm_config g = fast_config();
    xte_tensor D = xte_tensor_2d(ran ? d : ref, XTE_DTYPE_BF16, M, N);
    int i;
    if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
    cr_assert_eq(xte_gemm(&qa.q, &qb.q, NULL, &D, &g, NULL), XTE_SUCCESS, "%s", xte_last_error());
    if (ran++ == 0) continue;
    for (i = 0; i < M * N; i++)
      cr_assert_eq(d[i], ref[i], "isa %s element %d: %04x vs %04x", xte_cpu_isa_name(ISAS[ii]), i,
                   d[i], ref[i]);
  }
  o_reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  free(xa);
  free(xb);
}

/* The AMX-BF16 tiles run FAST's panel path where they can: /proc/cpuinfo (read here, apart from
 * the library's CPUID check) lists amx_tile and amx_bf16, the build has them (XTE_TEST_AMX_BF16),
 * avx512 is the ISA and neither XTE_CPU_AMX nor XTE_CPU_AMX_BF16 is "0"; `xte info` then names
 * them, else the fp32 kernels. So the plain run of this test checks the bound and bytes of the
 * AMX-BF16 path (every case but e4m3 x e4m3 K block 128, which runs the exact AMX-INT8 path),
 * test_gemm_fast@noamx and @nobf16 the fp32 kernels. */
Test(gemm_fast, amx_bf16_in_use_where_the_cpu_has_it) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[8192], info[4096];
  int amx = 0, built = 0;
  const char *e1 = getenv("XTE_CPU_AMX"), *e2 = getenv("XTE_CPU_AMX_BF16");
#ifdef XTE_TEST_AMX_BF16
  built = 1;
#endif
  if (f) {
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "flags", 5)) {
        amx =
            strstr(line, " amx_tile") && strstr(line, " amx_bf16") && strstr(line, " avx512_vbmi");
        break;
      }
    fclose(f);
  }
  if (getenv("XTE_CPU_ISA") && strcmp(getenv("XTE_CPU_ISA"), "avx512")) return;
  cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_AVX512) == XTE_SUCCESS || !amx, 1);
  cr_assert_eq(xte_backend_info_string(info, sizeof info), XTE_SUCCESS);
  if (amx && built && !(e1 && !strcmp(e1, "0")) && !(e2 && !strcmp(e2, "0")))
    cr_expect(strstr(info, "FAST GEMM, panels: amx-bf16 tiles") != NULL, "%s", info);
  else
    cr_expect(strstr(info, "FAST GEMM, panels: fp32 fma") != NULL, "%s", info);
  o_reset_isa();
}

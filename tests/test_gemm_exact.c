/* xte_gemm against the independent int128 oracle (tests/test_gemm_oracle.h), bit for bit: every
 * scaling pair, transpose combination, scale layout, dtype pair and CPU ISA; shapes with tails;
 * model shapes at small M; accumulate and bias; NaN / inf codes; thread-count invariance; bad
 * input leaves the output untouched. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "test_gemm_oracle.h"

static const xte_cpu_isa ISAS[] = {XTE_CPU_ISA_SCALAR, XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                   XTE_CPU_ISA_AVX512_SIMDE};
#define NISA 4

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

static size_t dsize(xte_dtype d) {
  return d == XTE_DTYPE_BF16 ? 2 : 4;
}

static int first_diff(const void *x, const void *y, int64_t n, xte_dtype dt) {
  int64_t i;
  for (i = 0; i < n; i++) {
    if (dt == XTE_DTYPE_BF16) {
      if (((const uint16_t *)x)[i] != ((const uint16_t *)y)[i]) return (int)i;
    } else if (((const uint32_t *)x)[i] != ((const uint32_t *)y)[i]) {
      return (int)i;
    }
  }
  return -1;
}

/* One case: quantize X_A, X_B (shapes from M, N, K and the transposes), oracle from the COMPACT
 * copies, then xte_gemm with every layout pair (same layout index on both sides) and every ISA.
 * drop_col bit 0 / 1: A's / B's columnwise copy is removed before the GEMM (the library must then
 * read the rowwise copy, transposed when trans is set); bit 2: every 128x128 tile of X_A and X_B
 * is scaled by its own power of two, 2^(3 (r / 128) + (c / 128) - 4), so that no two blocks
 * share a scale. */
static void ramp_tiles(float *x, int64_t R, int64_t C) {
  int64_t r, c;
  for (r = 0; r < R; r++)
    for (c = 0; c < C; c++) x[r * C + c] = ldexpf(x[r * C + c], (int)(3 * (r / 128) + c / 128) - 4);
}

static void run_case_x(side sa, side sb, xte_dtype da, xte_dtype db, int ta, int tb, int64_t M,
                       int64_t N, int64_t K, xte_dtype d_dt, int isa_mask, uint64_t seed,
                       int drop_col) {
  int64_t RA = ta ? K : M, CA = ta ? M : K, RB = tb ? K : N, CB = tb ? N : K;
  float *xa = o_random(RA, CA, seed), *xb = o_random(RB, CB, seed + 1);
  tq qa, qb;
  lop la, lb;
  ocfg cf;
  void *ref = malloc(dsize(d_dt) * (size_t)(M * N + 1));
  void *out = malloc(dsize(d_dt) * (size_t)(M * N + 1));
  xte_scale_layout lya[3], lyb[3];
  int nla = layouts_for(sa.recipe, lya), nlb = layouts_for(sb.recipe, lyb), li, ii;
  xte_gemm_config g = xte_gemm_config_default();
  if (drop_col & 4) {
    ramp_tiles(xa, RA, CA);
    ramp_tiles(xb, RB, CB);
  }
  cr_assert_eq(tq_make(&qa, xa, RA, CA, sa.mode, sa.recipe, XTE_SCALE_LAYOUT_COMPACT, da),
               XTE_SUCCESS, "quantize A: %s", xte_last_error());
  cr_assert_eq(tq_make(&qb, xb, RB, CB, sb.mode, sb.recipe, XTE_SCALE_LAYOUT_COMPACT, db),
               XTE_SUCCESS, "quantize B: %s", xte_last_error());
  tq_logical(&qa, ta, &la);
  tq_logical(&qb, tb, &lb);
  memset(&cf, 0, sizeof cf);
  cf.kblock = sa.mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  cf.d_dt = d_dt;
  o_gemm(&la, &lb, &cf, ref);
  g.trans_a = ta;
  g.trans_b = tb;
  for (li = 0; li < (nla > nlb ? nla : nlb); li++) {
    tq pa, pb;
    xte_tensor D = xte_tensor_2d(out, d_dt, M, N);
    cr_assert_eq(tq_make(&pa, xa, RA, CA, sa.mode, sa.recipe, lya[li % nla], da), XTE_SUCCESS);
    cr_assert_eq(tq_make(&pb, xb, RB, CB, sb.mode, sb.recipe, lyb[li % nlb], db), XTE_SUCCESS);
    if (drop_col & 1) {
      free(pa.q.columnwise.data);
      pa.q.columnwise.data = NULL;
    }
    if (drop_col & 2) {
      free(pb.q.columnwise.data);
      pb.q.columnwise.data = NULL;
    }
    for (ii = 0; ii < NISA; ii++) {
      int d;
      if (!(isa_mask & (1 << ii))) continue;
      if (o_set_isa(ISAS[ii]) == XTE_ERROR_UNSUPPORTED) continue;
      cr_assert_eq(xte_cpu_get_isa(), ISAS[ii]);
      memset(out, 0xA5, dsize(d_dt) * (size_t)(M * N));
      cr_assert_eq(xte_gemm(&pa.q, &pb.q, NULL, &D, &g, NULL), XTE_SUCCESS, "gemm %s: %s",
                   xte_cpu_isa_name(ISAS[ii]), xte_last_error());
      d = first_diff(out, ref, M * N, d_dt);
      cr_assert_eq(d, -1,
                   "isa %s modes %d/%d recipes %d/%d dtypes %d/%d trans %d/%d layouts %d/%d "
                   "drop_col %d M %lld N %lld K %lld out %d: element %d (row %lld col %lld) "
                   "differs: got %08x want %08x",
                   xte_cpu_isa_name(ISAS[ii]), sa.mode, sb.mode, sa.recipe, sb.recipe, da, db, ta,
                   tb, lya[li % nla], lyb[li % nlb], drop_col, (long long)M, (long long)N,
                   (long long)K, d_dt, d, (long long)(d / N), (long long)(d % N),
                   d_dt == XTE_DTYPE_BF16 ? ((uint16_t *)out)[d] : ((uint32_t *)out)[d],
                   d_dt == XTE_DTYPE_BF16 ? ((uint16_t *)ref)[d] : ((uint32_t *)ref)[d]);
    }
    tq_free(&pa);
    tq_free(&pb);
  }
  tq_free(&qa);
  tq_free(&qb);
  lop_free(&la);
  lop_free(&lb);
  free(xa);
  free(xb);
  free(ref);
  free(out);
}

static void run_case(side sa, side sb, xte_dtype da, xte_dtype db, int ta, int tb, int64_t M,
                     int64_t N, int64_t K, xte_dtype d_dt, int isa_mask, uint64_t seed) {
  run_case_x(sa, sb, da, db, ta, tb, M, N, K, d_dt, isa_mask, seed, 0);
}

static void reset_isa(void) {
  o_reset_isa();
}

#define ALL_ISA 15

Test(gemm_exact, every_pair_layout_dtype_trans_isa) {
  const side pairs[][2] = {
      {{XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK},
       {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK}},
      {{XTE_SCALING_BLOCK_128x128, XTE_RECIPE_DEEPGEMM},
       {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM}},
      {{XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK}, {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_MTFP8}},
      {{XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT},
       {XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT}},
      {{XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE}, {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_OCP}},
  };
  const xte_dtype dts[][2] = {{XTE_DTYPE_E4M3, XTE_DTYPE_E4M3},
                              {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2},
                              {XTE_DTYPE_E5M2, XTE_DTYPE_E4M3}};
  int p, d, t, n = 0;
  for (p = 0; p < 5; p++)
    for (d = 0; d < 3; d++)
      for (t = 0; t < 4; t++, n++)
        run_case(pairs[p][0], pairs[p][1], dts[d][0], dts[d][1], t & 1, t >> 1, 37, 45, 300,
                 (n & 1) ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, ALL_ISA, 100 + (uint64_t)n);
  reset_isa();
}

/* 128x128 operands read through the other coordinate order: MTFP8 128x128 (its columnwise copy
 * keeps [M, K], so op(X) = X^T reads either copy transposed), and TE / DeepGEMM 128x128 given only
 * by the rowwise copy with trans = 1. Block grids are not square (K = 300: 3 blocks; M, N of 1 or 2
 * blocks), so a block scale read as (k, i) instead of (i, k) changes the result. */
Test(gemm_exact, square_blocks_transposed) {
  const side a1 = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_MTFP8};
  const side sq = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_MTFP8};
  const side te1 = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK};
  const side tesq = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK};
  const side dg1 = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM};
  const side dgsq = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_DEEPGEMM};
  int t, n = 0;
  for (t = 0; t < 4; t++, n++) {
    /* MTFP8: 1x128 x 128x128 and 128x128 x 1x128, every transpose pair */
    run_case_x(a1, sq, XTE_DTYPE_E4M3, n & 1 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3, t & 1, t >> 1, 37,
               200, 300, (n & 1) ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, ALL_ISA, 1300 + (uint64_t)n, 4);
    run_case_x(sq, a1, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, t & 1, t >> 1, 200, 45, 300, XTE_DTYPE_FP32,
               ALL_ISA, 1400 + (uint64_t)n, 4);
  }
  /* the rowwise copy only, trans = 1: B [K, N] (fprop / dgrad weight), A [K, M] */
  run_case_x(te1, tesq, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 1, 37, 200, 300, XTE_DTYPE_FP32, ALL_ISA,
             1500, 2 | 4);
  run_case_x(dg1, dgsq, XTE_DTYPE_E5M2, XTE_DTYPE_E4M3, 1, 1, 45, 129, 300, XTE_DTYPE_BF16, ALL_ISA,
             1501, 2 | 4);
  run_case_x(tesq, te1, XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, 1, 0, 200, 37, 300, XTE_DTYPE_FP32, ALL_ISA,
             1502, 1 | 4);
  run_case_x(dgsq, dg1, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 1, 1, 129, 45, 300, XTE_DTYPE_FP32, ALL_ISA,
             1503, 1 | 4);
  reset_isa();
}

Test(gemm_exact, tails) {
  const int64_t S[] = {1, 15, 127, 129, 1000};
  const side a = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK};
  const side b = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK};
  int i, j, k, n = 0;
  for (i = 0; i < 5; i++)
    for (j = 0; j < 5; j++)
      for (k = 0; k < 5; k++, n++) {
        int64_t M = S[i], N = S[j], K = S[k];
        if (M * N * K > 20000000) continue; /* the oracle's time */
        run_case(a, b, XTE_DTYPE_E4M3, (n % 3 == 0) ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3, 0, 0, M, N,
                 K, (n & 1) ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, ALL_ISA, 500 + (uint64_t)n);
      }
  reset_isa();
}

Test(gemm_exact, blocking_edges) {
  /* past MC (240 / 128 rows), past the M chunk (1024 rows), past NC (1536 columns), several K
   * panels (256) with an MXFP8 tail */
  const side a = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM};
  const side b = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_DEEPGEMM};
  const side mx = {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE};
  run_case(a, b, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 0, 1100, 9, 300, XTE_DTYPE_FP32, ALL_ISA, 7);
  run_case(a, b, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 0, 5, 1700, 600, XTE_DTYPE_BF16, ALL_ISA, 8);
  run_case(mx, mx, XTE_DTYPE_E5M2, XTE_DTYPE_E4M3, 0, 0, 250, 30, 1000, XTE_DTYPE_FP32, ALL_ISA, 9);
  reset_isa();
}

Test(gemm_exact, model_shapes_small_m) {
  const int64_t NK[][2] = {{4096, 7168}, {7168, 2048}, {2112, 7168}};
  const side a = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK};
  const side b = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK};
  int i;
  for (i = 0; i < 3; i++)
    run_case(a, b, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 0, 3, NK[i][0], NK[i][1], XTE_DTYPE_BF16,
             1 << 2 | 1 << 1, 900 + (uint64_t)i);
  reset_isa();
}

/* The small-M path (m <= 32 rows: B decoded per K block into a buffer, never packed): every M it
 * covers and one past it, every scaling pair and scale layout, each dtype pair (e5m2 split on
 * either side), B read along K or transposed (trans_b), N with a strip tail, K with a 16-multiple
 * block tail (272: the SIMD decode only), an odd tail (300: the table decode for the last codes)
 * and K < 16. */
Test(gemm_exact, small_m_every_path) {
  const int64_t Ms[] = {1, 2, 3, 4, 5, 6, 7, 12, 13, 31, 32, 33};
  const int64_t Ks[] = {272, 300, 7};
  const side pairs[][2] = {
      {{XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK},
       {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK}},
      {{XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM},
       {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_DEEPGEMM}},
      {{XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK}, {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_MTFP8}},
      {{XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT},
       {XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT}},
      {{XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE}, {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_OCP}},
  };
  const xte_dtype dts[][2] = {{XTE_DTYPE_E4M3, XTE_DTYPE_E4M3},
                              {XTE_DTYPE_E5M2, XTE_DTYPE_E4M3},
                              {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2}};
  int mi, n = 0;
  for (mi = 0; mi < 12; mi++) {
    /* each M meets every dtype pair, both trans_b and every K; the pairs rotate */
    int d, t;
    for (d = 0; d < 3; d++)
      for (t = 0; t < 2; t++, n++)
        run_case(pairs[n % 5][0], pairs[n % 5][1], dts[d][0], dts[d][1], 0, t, Ms[mi], 45,
                 Ks[(mi + d + t) % 3], (n & 1) ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, ALL_ISA,
                 3000 + (uint64_t)n);
  }
  /* several K panels of the packed A (32 rows: 2048 columns a panel; 31 split rows: 1920), and
   * several 256-column chunks per thread over one packed A */
  {
    const side a1 = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK};
    const side b2 = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK};
    run_case(a1, b2, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 0, 32, 19, 2200, XTE_DTYPE_FP32, ALL_ISA,
             3200);
    run_case(a1, b2, XTE_DTYPE_E5M2, XTE_DTYPE_E4M3, 0, 0, 31, 11, 4000, XTE_DTYPE_BF16, ALL_ISA,
             3201);
    run_case(a1, b2, XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, 0, 0, 5, 1100, 300, XTE_DTYPE_FP32, ALL_ISA,
             3202);
    /* e4m3 x e4m3 on AMX (5..32 rows): K past one super-panel of packed A digits (two row tiles:
     * 4608 codes; one: 9216), the last one ragged */
    run_case(a1, b2, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 0, 20, 23, 5000, XTE_DTYPE_FP32, ALL_ISA,
             3203);
    run_case(a1, b2, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 0, 9, 17, 9500, XTE_DTYPE_BF16, ALL_ISA,
             3204);
  }
  /* A used transposed (X [K, M]): the columnwise copy, or the rowwise copy read strided along K
   * (per-tensor and 128x128 A given only by it), with B either way */
  for (mi = 0; mi < 4; mi++)
    run_case_x(pairs[mi][0], pairs[mi][1], mi == 2 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3,
               mi == 3 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3, 1, mi & 1, Ms[mi * 3 + 1], 45, 300,
               XTE_DTYPE_FP32, ALL_ISA, 3300 + (uint64_t)mi, mi == 3 ? 1 : 0);
  {
    const side tesq = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK};
    const side te1 = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK};
    run_case_x(tesq, te1, XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, 1, 0, 7, 37, 300, XTE_DTYPE_BF16, ALL_ISA,
               3310, 1 | 4);
  }
  /* B given only by its rowwise copy [K, N] and used transposed: codes strided along K (the last
   * e4m3 x e4m3 with 13 rows: AMX's transposed B packing) */
  for (mi = 0; mi < 4; mi++) {
    const side te1 = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK};
    const side tesq = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK};
    run_case_x(te1, tesq, mi == 1 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3,
               mi == 2 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3, 0, 1, mi == 3 ? 13 : Ms[mi * 4 + 1], 45,
               300, XTE_DTYPE_FP32, ALL_ISA, 3100 + (uint64_t)mi, 2);
  }
  reset_isa();
}

/* ---------------------------------------------------------------- accumulate, bias */
Test(gemm_exact, accumulate_and_bias) {
  const int64_t M = 33, N = 50, K = 260;
  float *xa = o_random(M, K, 1), *xb = o_random(N, K, 2);
  tq qa, qb;
  lop la, lb;
  ocfg cf;
  int cdt, ddt, inplace, ii;
  float bias[50];
  uint64_t s = 99;
  int n;
  cr_assert_eq(tq_make(&qa, xa, M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                       XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E4M3),
               XTE_SUCCESS);
  cr_assert_eq(tq_make(&qb, xb, N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                       XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E5M2),
               XTE_SUCCESS);
  {
    tq ca, cb;
    tq_make(&ca, xa, M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
            XTE_DTYPE_E4M3);
    tq_make(&cb, xb, N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
            XTE_DTYPE_E5M2);
    tq_logical(&ca, 0, &la);
    tq_logical(&cb, 0, &lb);
    tq_free(&ca);
    tq_free(&cb);
  }
  for (n = 0; n < N; n++) bias[n] = (float)(o_unif(&s) * 8.0 - 4.0);
  for (cdt = 0; cdt < 2; cdt++)
    for (ddt = 0; ddt < 2; ddt++)
      for (inplace = 0; inplace < 2; inplace++) {
        xte_dtype c_dt = cdt ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
        xte_dtype d_dt = ddt ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
        void *cbuf, *ref, *out;
        int64_t i;
        if (inplace && c_dt != d_dt) continue;
        cbuf = malloc(dsize(c_dt) * (size_t)(M * N));
        ref = malloc(dsize(d_dt) * (size_t)(M * N));
        out = malloc(dsize(d_dt) * (size_t)(M * N));
        for (i = 0; i < M * N; i++) {
          float v = (float)(o_unif(&s) * 2e4 - 1e4);
          if (c_dt == XTE_DTYPE_BF16)
            ((uint16_t *)cbuf)[i] = o_bf16(v);
          else
            ((float *)cbuf)[i] = v;
        }
        /* NaNs in C with the sign bit, a payload or signalling: D gets the canonical NaN */
        for (i = 5; i < M * N; i += 97) {
          static const uint32_t nan32[3] = {0xFFC00000u, 0x7F800001u, 0xFFFFFFFFu};
          static const uint16_t nan16[3] = {0xFFC0u, 0x7F81u, 0xFFFFu};
          if (c_dt == XTE_DTYPE_BF16)
            ((uint16_t *)cbuf)[i] = nan16[i % 3];
          else
            memcpy((float *)cbuf + i, &nan32[i % 3], 4);
        }
        memset(&cf, 0, sizeof cf);
        cf.kblock = 128;
        cf.c = cbuf;
        cf.c_dt = c_dt;
        cf.bias = (cdt ^ ddt) ? NULL : bias;
        cf.d_dt = d_dt;
        o_gemm(&la, &lb, &cf, ref);
        for (ii = 0; ii < NISA; ii++) {
          xte_gemm_config g = xte_gemm_config_default();
          xte_tensor bt = xte_tensor_1d(bias, XTE_DTYPE_FP32, N);
          xte_tensor C, D;
          if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
          g.accumulate = 1;
          g.bias = cf.bias ? &bt : NULL;
          if (inplace) {
            memcpy(out, cbuf, dsize(c_dt) * (size_t)(M * N));
            C = xte_tensor_2d(out, c_dt, M, N);
          } else {
            memset(out, 0x5A, dsize(d_dt) * (size_t)(M * N));
            C = xte_tensor_2d(cbuf, c_dt, M, N);
          }
          D = xte_tensor_2d(out, d_dt, M, N);
          cr_assert_eq(xte_gemm(&qa.q, &qb.q, &C, &D, &g, NULL), XTE_SUCCESS, "%s",
                       xte_last_error());
          cr_assert_eq(first_diff(out, ref, M * N, d_dt), -1, "c %d d %d inplace %d isa %s", cdt,
                       ddt, inplace, xte_cpu_isa_name(ISAS[ii]));
        }
        free(cbuf);
        free(ref);
        free(out);
      }
  reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  lop_free(&la);
  lop_free(&lb);
  free(xa);
  free(xb);
}

/* ---------------------------------------------------------------- NaN / inf codes */
/* Hand-made per-tensor and 1x128 qtensors with raw codes (compact scales). */
static void raw_q(xte_qtensor *q, uint8_t *codes, float *scales, int64_t R, int64_t C, xte_dtype dt,
                  xte_scaling_mode mode) {
  memset(q, 0, sizeof *q);
  q->scaling_mode = mode;
  q->recipe = mode == XTE_SCALING_PER_TENSOR ? XTE_RECIPE_TE_DELAYED : XTE_RECIPE_TE_BLOCK;
  q->rowwise = xte_tensor_2d(codes, dt, R, C);
  q->rowwise_scale_inv.data = scales;
  q->rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  q->rowwise_scale_inv.rows = mode == XTE_SCALING_PER_TENSOR ? 1 : R;
  q->rowwise_scale_inv.cols = mode == XTE_SCALING_PER_TENSOR ? 1 : o_cdiv(C, 128);
  q->rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
}

Test(gemm_exact, nan_inf_and_extreme_codes) {
  enum { M = 9, N = 11, K = 200 };
  uint8_t a[M * K], b[N * K];
  float sa[M * 2], sb[N * 2];
  uint32_t ref[M * N], out[M * N];
  uint64_t s = 5;
  int i, ii, dp;
  for (dp = 0; dp < 2; dp++) {
    xte_dtype db = dp ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
    xte_qtensor qa, qb;
    lop la = {M, K, 2, a, sa, XTE_DTYPE_E4M3}, lb = {N, K, 2, b, sb, db};
    ocfg cf = {128, NULL, XTE_DTYPE_FP32, NULL, XTE_DTYPE_FP32};
    xte_tensor D = xte_tensor_2d(out, XTE_DTYPE_FP32, M, N);
    /* mostly extreme codes: +-max, tiny subnormals, zeros */
    for (i = 0; i < M * K; i++) {
      static const uint8_t pick[] = {0x7E, 0xFE, 0x01, 0x81, 0x00, 0x80, 0x3C, 0x44};
      a[i] = pick[o_rng(&s) % 8];
    }
    for (i = 0; i < N * K; i++) {
      static const uint8_t p4[] = {0x7E, 0xFE, 0x01, 0x81, 0x00, 0x80, 0x39};
      static const uint8_t p5[] = {0x7B, 0xFB, 0x01, 0x81, 0x00, 0x80, 0x3C};
      b[i] = dp ? p5[o_rng(&s) % 7] : p4[o_rng(&s) % 7];
    }
    /* specials in chosen rows */
    a[0 * K + 3] = 0x7F; /* NaN in row 0, block 0 */
    a[1 * K + 150] = 0xFF;
    if (dp) {
      b[2 * K + 10] = 0x7C;  /* +inf */
      b[3 * K + 140] = 0xFC; /* -inf */
      b[4 * K + 5] = 0x7C;
      b[4 * K + 6] = 0xFC; /* +inf + -inf -> NaN */
      b[5 * K + 7] = 0x7D; /* NaN */
    }
    for (i = 0; i < M * 2; i++) sa[i] = ldexpf(1.0f + (float)(i % 7) / 8.0f, (i % 9) - 4);
    for (i = 0; i < N * 2; i++) sb[i] = ldexpf(1.0f + (float)(i % 5) / 8.0f, (i % 11) - 5);
    sa[12] = 1e-40f; /* subnormal scale */
    sb[3] = 3e38f;   /* scale product overflow possible */
    raw_q(&qa, a, sa, M, K, XTE_DTYPE_E4M3, XTE_SCALING_BLOCK_1x128);
    raw_q(&qb, b, sb, N, K, db, XTE_SCALING_BLOCK_1x128);
    o_gemm(&la, &lb, &cf, ref);
    for (ii = 0; ii < NISA; ii++) {
      int d;
      if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
      memset(out, 0, sizeof out);
      cr_assert_eq(xte_gemm(&qa, &qb, NULL, &D, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
      d = first_diff(out, ref, M * N, XTE_DTYPE_FP32);
      cr_assert_eq(d, -1, "dtype %d isa %s element %d: got %08x want %08x", dp,
                   xte_cpu_isa_name(ISAS[ii]), d, d >= 0 ? out[d] : 0, d >= 0 ? ref[d] : 0);
    }
  }
  reset_isa();
}

/* The rounding of the e5m2 class sums: products that cancel to a value needing more than 53
 * bits, where a plain fp64 sum would round twice. */
Test(gemm_exact, hybrid_double_rounding_cases) {
  enum { M = 1, N = 64, K = 128 };
  uint8_t a[M * K], b[N * K];
  float sa[N] = {1.0f}, sb[N]; /* per-tensor: one scale (the oracle takes one per row) */
  uint32_t ref[M * N], out[M * N];
  lop la = {M, K, 1, a, sa, XTE_DTYPE_E4M3}, lb = {N, K, 1, b, sb, XTE_DTYPE_E5M2};
  ocfg cf = {128, NULL, XTE_DTYPE_FP32, NULL, XTE_DTYPE_FP32};
  xte_qtensor qa, qb;
  xte_tensor D = xte_tensor_2d(out, XTE_DTYPE_FP32, M, N);
  int64_t i, n;
  uint64_t s = 77;
  memset(a, 0, sizeof a);
  memset(b, 0, sizeof b);
  for (i = 0; i < N; i++) sb[i] = 1.0f;
  /* sum = 2^29 (+ 2^6) + 2^5 +- 2^-25 (+ noise): an fp32 midpoint plus a term 54 bits below;
   * an fp64 sum would lose the 2^-25 and round the tie to even. a[k] * b[n, k]: */
  for (i = 0; i < 64; i++) a[i] = 0x78; /* 256 */
  a[64] = 0x68;                         /* 64 */
  a[65] = 0x60;                         /* 32 */
  a[66] = 0x01;                         /* 2^-9 */
  for (i = 67; i < K; i++) a[i] = (uint8_t)(o_rng(&s) % 0x7E);
  for (n = 0; n < N; n++) {
    for (i = 0; i < 64; i++) b[n * K + i] = 0x78;                        /* 32768 */
    b[n * K + 64] = (n & 2) ? 0x3C : 0x00;                               /* 1 or 0 */
    b[n * K + 65] = 0x3C;                                                /* 1 */
    b[n * K + 66] = (n & 1) ? 0x81 : 0x01;                               /* -+2^-16 */
    if (n >= 8) b[n * K + 67 + n % 60] = (uint8_t)(n % 2 ? 0x81 : 0x02); /* more tiny terms */
  }
  raw_q(&qa, a, sa, M, K, XTE_DTYPE_E4M3, XTE_SCALING_PER_TENSOR);
  raw_q(&qb, b, sb, N, K, XTE_DTYPE_E5M2, XTE_SCALING_PER_TENSOR);
  o_gemm(&la, &lb, &cf, ref);
  for (i = 0; i < NISA; i++) {
    if (o_set_isa(ISAS[i]) != XTE_SUCCESS) continue;
    cr_assert_eq(xte_gemm(&qa, &qb, NULL, &D, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
    cr_assert_eq(first_diff(out, ref, M * N, XTE_DTYPE_FP32), -1, "isa %s",
                 xte_cpu_isa_name(ISAS[i]));
  }
  reset_isa();
}

/* ---------------------------------------------------------------- invariance */
Test(gemm_exact, thread_count_invariance) {
  const int64_t M = 300, N = 700, K = 600;
  float *xa = o_random(M, K, 11), *xb = o_random(N, K, 12);
  tq qa, qb;
  float *d1 = malloc(sizeof(float) * M * N), *d2 = malloc(sizeof(float) * M * N);
  int nt[] = {1, 2, 3, 5}, i, ii;
  xte_tensor D1 = xte_tensor_2d(d1, XTE_DTYPE_FP32, M, N),
             D2 = xte_tensor_2d(d2, XTE_DTYPE_FP32, M, N);
  tq_make(&qa, xa, M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
          XTE_DTYPE_E4M3);
  tq_make(&qb, xb, N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
          XTE_DTYPE_E5M2);
  o_isa_start();
  cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_SCALAR), XTE_SUCCESS); /* the reference */
  xte_cpu_set_num_threads(1);
  cr_assert_eq(xte_gemm(&qa.q, &qb.q, NULL, &D1, NULL, NULL), XTE_SUCCESS);
  for (ii = 0; ii < NISA; ii++) {
    if (o_set_isa(ISAS[ii]) == XTE_ERROR_UNSUPPORTED) continue;
    cr_assert_eq(xte_cpu_get_isa(), ISAS[ii]);
    for (i = 0; i < 4; i++) {
      cr_assert_eq(xte_cpu_set_num_threads(nt[i]), XTE_SUCCESS);
      memset(d2, 0, sizeof(float) * M * N);
      cr_assert_eq(xte_gemm(&qa.q, &qb.q, NULL, &D2, NULL, NULL), XTE_SUCCESS);
      cr_assert_eq(memcmp(d1, d2, sizeof(float) * M * N), 0, "isa %s threads %d",
                   xte_cpu_isa_name(ISAS[ii]), nt[i]);
    }
  }
  xte_cpu_set_num_threads(0);
  reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  free(xa);
  free(xb);
  free(d1);
  free(d2);
}

/* ---------------------------------------------------------------- bad input */
Test(gemm_exact, bad_input_writes_nothing) {
  const int64_t M = 20, N = 30, K = 256;
  float *xa = o_random(M, K, 1), *xb = o_random(N, K, 2), *xk = o_random(N, K + 128, 3);
  tq qa, qb, qsq, qk, q55a, q55b, qpt;
  float out[20 * 30];
  xte_tensor D = xte_tensor_2d(out, XTE_DTYPE_FP32, M, N);
  xte_tensor Dbad = xte_tensor_2d(out, XTE_DTYPE_FP32, M, N - 1);
  xte_tensor Dfp16 = xte_tensor_2d(out, XTE_DTYPE_FP16, M, N);
  xte_gemm_config g = xte_gemm_config_default();
  uint8_t canary[sizeof out];
  int i;
  tq_make(&qa, xa, M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
          XTE_DTYPE_E4M3);
  tq_make(&qb, xb, N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
          XTE_DTYPE_E4M3);
  tq_make(&qsq, xa, M, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
          XTE_DTYPE_E4M3);
  tq_make(&qk, xk, N, K + 128, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
          XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3);
  tq_make(&q55a, xa, M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
          XTE_DTYPE_E5M2);
  tq_make(&q55b, xb, N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
          XTE_DTYPE_E5M2);
  tq_make(&qpt, xb, N, K, XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT, XTE_SCALE_LAYOUT_COMPACT,
          XTE_DTYPE_E4M3);
  for (i = 0; i < (int)sizeof canary; i++) canary[i] = (uint8_t)(i * 7 + 3);
#define EXPECT_FAIL(call, want)                                                                  \
  do {                                                                                           \
    xte_status st_;                                                                              \
    memcpy(out, canary, sizeof out);                                                             \
    st_ = (call);                                                                                \
    cr_expect_eq(st_, want, "%s: got %s (%s)", #call, xte_status_string(st_), xte_last_error()); \
    cr_expect_neq(xte_last_error()[0], '\0');                                                    \
    cr_expect_eq(memcmp(out, canary, sizeof out), 0, "%s wrote the output", #call);              \
  } while (0)
  EXPECT_FAIL(xte_gemm(&qa.q, &qk.q, NULL, &D, NULL, NULL), XTE_ERROR_SHAPE); /* K mismatch */
  EXPECT_FAIL(xte_gemm(&qa.q, &qb.q, NULL, &Dbad, NULL, NULL), XTE_ERROR_SHAPE);
  EXPECT_FAIL(xte_gemm(&qa.q, &qb.q, NULL, &Dfp16, NULL, NULL), XTE_ERROR_DTYPE);
  EXPECT_FAIL(xte_gemm(&qsq.q, &qb.q, NULL, &D, NULL, NULL), XTE_ERROR_UNSUPPORTED);
  EXPECT_FAIL(xte_gemm(&q55a.q, &q55b.q, NULL, &D, NULL, NULL), XTE_ERROR_UNSUPPORTED);
  EXPECT_FAIL(xte_gemm(&qa.q, &qpt.q, NULL, &D, NULL, NULL), XTE_ERROR_UNSUPPORTED);
  EXPECT_FAIL(xte_gemm(NULL, &qb.q, NULL, &D, NULL, NULL), XTE_ERROR_NULL_POINTER);
  g.accumulate = 1;
  EXPECT_FAIL(xte_gemm(&qa.q, &qb.q, NULL, &D, &g, NULL), XTE_ERROR_NULL_POINTER);
  g.accumulate = 2;
  EXPECT_FAIL(xte_gemm(&qa.q, &qb.q, NULL, &D, &g, NULL), XTE_ERROR_INVALID_ARGUMENT);
  g.accumulate = 0;
  {
    float bias[5];
    xte_tensor bt = xte_tensor_1d(bias, XTE_DTYPE_FP32, 5);
    g.bias = &bt;
    EXPECT_FAIL(xte_gemm(&qa.q, &qb.q, NULL, &D, &g, NULL), XTE_ERROR_SHAPE);
    g.bias = NULL;
  }
  /* wrong scale shape */
  qb.q.rowwise_scale_inv.cols += 1;
  EXPECT_FAIL(xte_gemm(&qa.q, &qb.q, NULL, &D, NULL, NULL), XTE_ERROR_SHAPE);
  qb.q.rowwise_scale_inv.cols -= 1;
  qb.q.rowwise_scale_inv.dtype = XTE_DTYPE_E8M0;
  EXPECT_FAIL(xte_gemm(&qa.q, &qb.q, NULL, &D, NULL, NULL), XTE_ERROR_DTYPE);
  qb.q.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  /* trans_a = 1 with a 1x128 A whose columnwise copy is missing */
  {
    void *col = qa.q.columnwise.data;
    xte_tensor Dt = xte_tensor_2d(out, XTE_DTYPE_FP32, K, N);
    qa.q.columnwise.data = NULL;
    g.trans_a = 1;
    EXPECT_FAIL(xte_gemm(&qa.q, &qb.q, NULL, &Dt, &g, NULL), XTE_ERROR_UNSUPPORTED);
    g.trans_a = 0;
    qa.q.columnwise.data = col;
  }
  cr_expect_eq(xte_gemm(&qa.q, &qb.q, NULL, &D, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
  tq_free(&qa);
  tq_free(&qb);
  tq_free(&qsq);
  tq_free(&qk);
  tq_free(&q55a);
  tq_free(&q55b);
  tq_free(&qpt);
  free(xa);
  free(xb);
  free(xk);
}

/* The dense (packed) path with NaN and extreme e4m3 codes in B: M > 32 so B is packed (the AVX-512
 * SIMD decode of 8 B rows through their fp16 images, a NaN code becoming an fp16 NaN), with row
 * tiles of 24 + 16 and 24 + 24 + 8 rows (the 16- and 8-row tile kernels), and K = 200 (16-code
 * SIMD runs plus a table tail of 8). nan_inf_and_extreme_codes runs M = 9 (the small-M path). */
Test(gemm_exact, dense_path_nan_and_extreme_e4m3_codes) {
  enum { MMAX = 56, N = 20, K = 200 };
  static const int Ms[2] = {40, 56};
  static uint8_t a[MMAX * K], b[N * K];
  static float sa[MMAX * 2], sb[N * 2];
  static uint32_t ref[MMAX * N], out[MMAX * N];
  uint64_t s = 7;
  int i, ii, mi;
  for (mi = 0; mi < 2; mi++) {
    const int M = Ms[mi];
    xte_qtensor qa, qb;
    lop la = {M, K, 2, a, sa, XTE_DTYPE_E4M3}, lb = {N, K, 2, b, sb, XTE_DTYPE_E4M3};
    ocfg cf = {128, NULL, XTE_DTYPE_FP32, NULL, XTE_DTYPE_FP32};
    xte_tensor D = xte_tensor_2d(out, XTE_DTYPE_FP32, M, N);
    for (i = 0; i < M * K; i++) {
      static const uint8_t pick[] = {0x7E, 0xFE, 0x01, 0x81, 0x00, 0x80, 0x3C, 0x44, 0x07, 0x8F};
      a[i] = pick[o_rng(&s) % 10];
    }
    for (i = 0; i < N * K; i++) b[i] = (uint8_t)(o_rng(&s) & 0xFF); /* every code, NaN included */
    /* keep most columns finite: NaN codes only in chosen rows of B, inside the 16-code runs and
     * in the tail */
    for (i = 0; i < N * K; i++)
      if ((b[i] & 0x7F) == 0x7F) b[i] ^= 0x01;
    b[1 * K + 5] = 0x7F;    /* strip 0, SIMD run */
    b[6 * K + 131] = 0xFF;  /* strip 0, second block */
    b[9 * K + 196] = 0x7F;  /* strip 1, table tail */
    b[15 * K + 64] = 0xFF;  /* strip 1 */
    b[17 * K + 199] = 0x7F; /* partial strip (table path) */
    for (i = 0; i < M * 2; i++) sa[i] = ldexpf(1.0f + (float)(i % 7) / 8.0f, (i % 9) - 4);
    for (i = 0; i < N * 2; i++) sb[i] = ldexpf(1.0f + (float)(i % 5) / 8.0f, (i % 11) - 5);
    raw_q(&qa, a, sa, M, K, XTE_DTYPE_E4M3, XTE_SCALING_BLOCK_1x128);
    raw_q(&qb, b, sb, N, K, XTE_DTYPE_E4M3, XTE_SCALING_BLOCK_1x128);
    o_gemm(&la, &lb, &cf, ref);
    for (ii = 0; ii < NISA; ii++) {
      int d = -1;
      if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
      memset(out, 0, sizeof out);
      cr_assert_eq(xte_gemm(&qa, &qb, NULL, &D, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
      for (i = 0; i < M * N && d < 0; i++)
        if (out[i] != ref[i]) d = i;
      cr_assert_eq(d, -1, "M %d isa %s element %d: got %08x want %08x", M,
                   xte_cpu_isa_name(ISAS[ii]), d, d >= 0 ? out[d] : 0, d >= 0 ? ref[d] : 0);
    }
  }
  o_reset_isa();
}

/* The small-M paths on raw e4m3 codes (on avx512 with AVX512-VNNI: the digit dot products, whose
 * B digits carry offsets that each A row's block corrections take back out, and whose NaN marks
 * come from the table's marker): every code in B (NaN only in chosen rows and blocks, one in a
 * ragged tail), A rows of chosen extremes, blocks of all +-448 in both (the largest folded sums
 * of either sign), one A row with a NaN code; M from 1 to 32 (the last small-M count: rows in
 * groups of 4, 2 and 1; VNNI up to 8 rows where AMX is in use, else up to 32), N with a 5-column
 * strip tail, K with a ragged last block (74, not a multiple of 4) and K < 64. The plain run uses
 * the machine's kernels, @noamx VNNI up to 32 rows, @novnni the fp64 ones. */
Test(gemm_exact, small_m_e4m3_codes) {
  enum { MMAX = 32, N = 21 };
  static const int Ms[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 32};
  static const int Ks[] = {330, 37, 256};
  static float sa[MMAX * 3], sb[N * 3];
  static uint32_t ref[MMAX * N], out[MMAX * N];
  uint64_t s = 13;
  int i, ii, mi, ki;
  for (ki = 0; ki < 3; ki++)
    for (mi = 0; mi < 10; mi++) {
      const int M = Ms[mi], K = Ks[ki], nb = (K + 127) / 128;
      /* exactly sized (ASan: no read past the last row of B) */
      uint8_t *a = malloc((size_t)(M * K)), *b = malloc((size_t)(N * K));
      xte_qtensor qa, qb;
      lop la = {M, K, nb, a, sa, XTE_DTYPE_E4M3}, lb = {N, K, nb, b, sb, XTE_DTYPE_E4M3};
      ocfg cf = {128, NULL, XTE_DTYPE_FP32, NULL, XTE_DTYPE_FP32};
      xte_tensor D = xte_tensor_2d(out, XTE_DTYPE_FP32, M, N);
      for (i = 0; i < M * K; i++) {
        static const uint8_t pick[] = {0x7E, 0xFE, 0x01, 0x81, 0x00, 0x80,
                                       0x3C, 0x44, 0x07, 0x8F, 0x5D, 0xC9};
        a[i] = (o_rng(&s) & 3) ? pick[o_rng(&s) % 12] : (uint8_t)(o_rng(&s) & 0xFF);
        if ((a[i] & 0x7F) == 0x7F) a[i] ^= 0x01;
      }
      for (i = 0; i < N * K; i++) {
        b[i] = (uint8_t)(o_rng(&s) & 0xFF); /* every code */
        if ((b[i] & 0x7F) == 0x7F) b[i] ^= 0x01;
      }
      /* block 0: A row 0 all +448; B row 2 all +448, row 3 all -448 (largest sums, both signs) */
      for (i = 0; i < (K < 128 ? K : 128); i++) {
        a[i] = 0x7E;
        b[2 * K + i] = 0x7E;
        b[3 * K + i] = 0xFE;
      }
      if (M > 1)
        for (i = 0; i < (K < 128 ? K : 128); i++) a[K + i] = 0xFE; /* A row 1: all -448 */
      b[1 * K + 5] = 0x7F;                                         /* column 1, block 0 */
      b[9 * K + K - 1] = 0xFF;  /* column 9, the last code (ragged tail) */
      b[20 * K + K / 2] = 0x7F; /* the strip tail */
      b[15 * K + K / 3] = 0xFF; /* the last column of a 16-column strip */
      if (M > 2) a[2 * K + K - 3] = 0xFF;
      if (M == 1 && K > 128) a[K - 3] = 0xFF; /* the one-row kernel's NaN row */
      for (i = 0; i < M * nb; i++) sa[i] = ldexpf(1.0f + (float)(i % 7) / 8.0f, (i % 9) - 4);
      for (i = 0; i < N * nb; i++) sb[i] = ldexpf(1.0f + (float)(i % 5) / 8.0f, (i % 11) - 5);
      raw_q(&qa, a, sa, M, K, XTE_DTYPE_E4M3, XTE_SCALING_BLOCK_1x128);
      raw_q(&qb, b, sb, N, K, XTE_DTYPE_E4M3, XTE_SCALING_BLOCK_1x128);
      o_gemm(&la, &lb, &cf, ref);
      for (ii = 0; ii < NISA; ii++) {
        int d;
        if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
        memset(out, 0xA5, sizeof out);
        cr_assert_eq(xte_gemm(&qa, &qb, NULL, &D, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
        d = first_diff(out, ref, M * N, XTE_DTYPE_FP32);
        cr_assert_eq(d, -1, "M %d K %d isa %s element %d (row %d col %d): got %08x want %08x", M, K,
                     xte_cpu_isa_name(ISAS[ii]), d, d / N, d % N, d >= 0 ? out[d] : 0,
                     d >= 0 ? ref[d] : 0);
      }
      free(a);
      free(b);
    }
  o_reset_isa();
}

/* NaN codes in an operand read transposed (given as X [K, rows] with 128x128 blocks): op(A)'s
 * rows or op(B)'s columns are then contiguous and its K steps a row of X apart (the wgrad
 * gradient, the dgrad weight), which the AMX path packs by transposing / interleaving K steps and
 * marks NaN rows / columns from there. The other operand is 1x128, read along K. */
static void transposed_nan_case(int ta) {
  enum { M = 40, N = 20, K = 200 };
  static uint8_t a[M * K], b[N * K], xt[K * M];
  static float sa[M * 2], sb[N * 2], st[2];
  static uint32_t ref[M * N], out[M * N];
  static const int nanpos[][2] = {{1, 5}, {6, 131}, {9, 196}, {15, 64}, {17, 199}, {19, 0}};
  uint64_t s = 11 + (uint64_t)ta;
  int i, k, ii;
  xte_qtensor qa, qb;
  lop la = {M, K, 2, a, sa, XTE_DTYPE_E4M3}, lb = {N, K, 2, b, sb, XTE_DTYPE_E4M3};
  ocfg cf = {128, NULL, XTE_DTYPE_FP32, NULL, XTE_DTYPE_FP32};
  xte_tensor D = xte_tensor_2d(out, XTE_DTYPE_FP32, M, N);
  xte_gemm_config g = xte_gemm_config_default();
  uint8_t *x = ta ? a : b;
  const int R = ta ? M : N;
  float *sx = ta ? sa : sb, *so = ta ? sb : sa;
  g.trans_a = ta;
  g.trans_b = !ta;
  for (i = 0; i < M * K; i++) a[i] = (uint8_t)(o_rng(&s) & 0xFF);
  for (i = 0; i < N * K; i++) b[i] = (uint8_t)(o_rng(&s) & 0xFF);
  for (i = 0; i < M * K; i++)
    if ((a[i] & 0x7F) == 0x7F) a[i] ^= 0x01;
  for (i = 0; i < N * K; i++)
    if ((b[i] & 0x7F) == 0x7F) b[i] ^= 0x01;
  for (i = 0; i < 6; i++) x[nanpos[i][0] * K + nanpos[i][1]] = (i & 1) ? 0xFF : 0x7F;
  a[3 * K + 77] = 0x7F; /* one NaN in the other operand too */
  b[2 * K + 140] = 0xFF;
  for (i = 0; i < R; i++)
    for (k = 0; k < K; k++) xt[k * R + i] = x[i * K + k];
  st[0] = 0.375f; /* the 128x128 blocks of X [K, R]: K rows 0-127 and 128-199 */
  st[1] = 1.75f;
  for (i = 0; i < R * 2; i++) sx[i] = st[i % 2];
  for (i = 0; i < (ta ? N : M) * 2; i++) so[i] = ldexpf(1.0f + (float)(i % 7) / 8.0f, (i % 9) - 4);
  if (ta) {
    raw_q(&qa, xt, st, K, M, XTE_DTYPE_E4M3, XTE_SCALING_BLOCK_1x128);
    raw_q(&qb, b, sb, N, K, XTE_DTYPE_E4M3, XTE_SCALING_BLOCK_1x128);
  } else {
    raw_q(&qa, a, sa, M, K, XTE_DTYPE_E4M3, XTE_SCALING_BLOCK_1x128);
    raw_q(&qb, xt, st, K, N, XTE_DTYPE_E4M3, XTE_SCALING_BLOCK_1x128);
  }
  {
    xte_qtensor *q = ta ? &qa : &qb;
    q->scaling_mode = XTE_SCALING_BLOCK_128x128;
    q->rowwise_scale_inv.rows = 2;
    q->rowwise_scale_inv.cols = 1;
  }
  o_gemm(&la, &lb, &cf, ref);
  for (ii = 0; ii < NISA; ii++) {
    int d = -1;
    if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
    memset(out, 0, sizeof out);
    cr_assert_eq(xte_gemm(&qa, &qb, NULL, &D, &g, NULL), XTE_SUCCESS, "%s", xte_last_error());
    for (i = 0; i < M * N && d < 0; i++)
      if (out[i] != ref[i]) d = i;
    cr_assert_eq(d, -1, "trans_a %d isa %s element %d: got %08x want %08x", ta,
                 xte_cpu_isa_name(ISAS[ii]), d, d >= 0 ? out[d] : 0, d >= 0 ? ref[d] : 0);
  }
  o_reset_isa();
}

Test(gemm_exact, nan_codes_in_a_transposed_operand) {
  transposed_nan_case(0);
  transposed_nan_case(1);
}

/* The AMX-INT8 path is taken where it can be: /proc/cpuinfo (read here, apart from the library's
 * CPUID check) lists amx_tile, amx_int8 and avx512_vbmi, avx512 is the ISA and XTE_CPU_AMX is not
 * "0"; `xte info` then names it. Otherwise the fp64 kernels are named. (The bytes of both paths
 * are checked by every test above, in the plain run and in the @noamx run.) */
Test(gemm_exact, amx_in_use_where_the_cpu_has_it) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[8192], info[4096];
  int amx = 0;
  const char *env = getenv("XTE_CPU_AMX");
  if (f) {
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "flags", 5)) {
        amx =
            strstr(line, " amx_tile") && strstr(line, " amx_int8") && strstr(line, " avx512_vbmi");
        break;
      }
    fclose(f);
  }
  cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_AVX512) == XTE_SUCCESS || !amx, 1);
  cr_assert_eq(xte_backend_info_string(info, sizeof info), XTE_SUCCESS);
  if (amx && !(env && !strcmp(env, "0")))
    cr_expect(strstr(info, "exact e4m3 GEMM: amx-int8") != NULL, "%s", info);
  else
    cr_expect(strstr(info, "exact e4m3 GEMM: fp64 fma") != NULL, "%s", info);
  reset_isa();
}

/* The VNNI small-M kernels are in use where /proc/cpuinfo lists avx512_vnni and avx512_vbmi, the
 * build has them (the @novnni test exists then), avx512 is the ISA and XTE_CPU_VNNI is not "0":
 * up to 8 rows where AMX is in use too, else up to 32; `xte info` names them. */
Test(gemm_exact, vnni_in_use_where_the_cpu_has_it) {
  FILE *f = fopen("/proc/cpuinfo", "r");
  char line[8192], info[4096];
  int vnni = 0, amx = 0;
  const char *env = getenv("XTE_CPU_VNNI"), *env_amx = getenv("XTE_CPU_AMX");
  if (f) {
    while (fgets(line, sizeof line, f))
      if (!strncmp(line, "flags", 5)) {
        vnni = strstr(line, " avx512_vnni") && strstr(line, " avx512_vbmi");
        amx = vnni && strstr(line, " amx_tile") && strstr(line, " amx_int8");
        break;
      }
    fclose(f);
  }
  if (amx && env_amx && !strcmp(env_amx, "0")) amx = 0;
  cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_AVX512) == XTE_SUCCESS || !vnni, 1);
  cr_assert_eq(xte_backend_info_string(info, sizeof info), XTE_SUCCESS);
  if (vnni && !(env && !strcmp(env, "0")))
    cr_expect(strstr(info, amx ? "exact e4m3 GEMM, 1-8 rows: avx512-vnni"
                               : "exact e4m3 GEMM, 1-32 rows: avx512-vnni") != NULL,
              "%s", info);
  else
    cr_expect(strstr(info, "exact e4m3 GEMM, few rows: no avx512-vnni") != NULL, "%s", info);
  reset_isa();
}

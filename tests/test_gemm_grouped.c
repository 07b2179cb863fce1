/* Grouped GEMMs (contiguous, masked, k-grouped) against a loop of single xte_gemm calls on each
 * group's own quantized slices, bit for bit, on every ISA; padding / masked rows never read
 * (NaN codes and scales there) and never written (canary); empty groups and one-row groups. */
#include <criterion/criterion.h>
#include <stdio.h>

#include "test_gemm_oracle.h"

static const xte_cpu_isa ISAS[] = {XTE_CPU_ISA_SCALAR, XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                   XTE_CPU_ISA_AVX512_SIMDE};

static void reset_isa(void) {
  o_reset_isa();
}

#define CANARY 0x7F7F7F01u

/* Poisons rows [r0, r1) of a 1x128 COMPACT rowwise qtensor [R, C]: NaN codes, NaN scales. */
static void poison_rows(tq *t, int64_t r0, int64_t r1) {
  int64_t r, c, gc = o_cdiv(t->C, 128);
  for (r = r0; r < r1; r++) {
    for (c = 0; c < t->C; c++) ((uint8_t *)t->q.rowwise.data)[r * t->C + c] = 0x7F;
    for (c = 0; c < gc; c++) ((float *)t->q.rowwise_scale_inv.data)[r * gc + c] = NAN;
  }
}

/* contiguous (trans_b 0 and 1) and masked */
static void run_m_grouped(int masked, int trans_b, xte_dtype db) {
  enum { G = 5, N = 256, K = 384, ALIGN = 128 };
  const int64_t sizes[G] = {0, 1, 130, 37, 128};
  int64_t offs[G], rows = 0, g, m_max = 130;
  int32_t mm[G];
  float *xa, *xb;
  tq qa, qb;
  uint32_t *d, *ref;
  int ii;
  for (g = 0; g < G; g++) {
    offs[g] = masked ? g * m_max : rows;
    rows += masked ? m_max : o_cdiv(sizes[g], ALIGN) * ALIGN;
    mm[g] = (int32_t)sizes[g];
  }
  xa = o_random(rows, K, 31);
  xb = trans_b ? o_random(G * K, N, 32) : o_random(G * N, K, 32);
  cr_assert_eq(tq_make(&qa, xa, rows, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                       XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
               XTE_SUCCESS);
  cr_assert_eq(tq_make(&qb, xb, trans_b ? G * K : G * N, trans_b ? N : K, XTE_SCALING_BLOCK_128x128,
                       XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT, db),
               XTE_SUCCESS);
  for (g = 0; g < G; g++) poison_rows(&qa, offs[g] + sizes[g], g + 1 < G ? offs[g + 1] : rows);
  d = malloc(sizeof(uint32_t) * (size_t)(rows * N));
  ref = malloc(sizeof(uint32_t) * (size_t)(rows * N));
  /* reference: one xte_gemm per group on its own quantized slices */
  for (ii = 0; ii < (int)(rows * N); ii++) ref[ii] = CANARY;
  for (g = 0; g < G; g++) {
    tq ag, bg;
    xte_tensor D;
    xte_gemm_config cfg = xte_gemm_config_default();
    if (sizes[g] == 0) continue;
    cr_assert_eq(tq_make(&ag, xa + offs[g] * K, sizes[g], K, XTE_SCALING_BLOCK_1x128,
                         XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
                 XTE_SUCCESS);
    cr_assert_eq(
        tq_make(&bg, xb + g * N * K, trans_b ? K : N, trans_b ? N : K, XTE_SCALING_BLOCK_128x128,
                XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT, db),
        XTE_SUCCESS);
    cfg.trans_b = trans_b;
    D = xte_tensor_2d(ref + offs[g] * N, XTE_DTYPE_FP32, sizes[g], N);
    cr_assert_eq(xte_gemm(&ag.q, &bg.q, NULL, &D, &cfg, NULL), XTE_SUCCESS, "%s", xte_last_error());
    tq_free(&ag);
    tq_free(&bg);
  }
  for (ii = 0; ii < 4; ii++) {
    xte_gemm_groups gr;
    xte_gemm_config cfg = xte_gemm_config_default();
    xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, rows, N);
    xte_tensor mt = xte_tensor_1d(mm, XTE_DTYPE_INT32, G);
    int64_t i;
    if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
    memset(&gr, 0, sizeof gr);
    gr.kind = masked ? XTE_GEMM_GROUPED_MASKED : XTE_GEMM_GROUPED_CONTIGUOUS;
    gr.num_groups = G;
    gr.group_sizes = sizes;
    gr.alignment = ALIGN;
    gr.masked_m = &mt;
    cfg.trans_b = trans_b;
    for (i = 0; i < rows * N; i++) d[i] = CANARY;
    cr_assert_eq(xte_gemm_grouped(&qa.q, &qb.q, NULL, &D, &gr, &cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (i = 0; i < rows * N; i++)
      cr_assert_eq(d[i], ref[i], "masked %d trans_b %d isa %s: row %lld col %lld: %08x vs %08x",
                   masked, trans_b, xte_cpu_isa_name(ISAS[ii]), (long long)(i / N),
                   (long long)(i % N), d[i], ref[i]);
  }
  reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  free(xa);
  free(xb);
  free(d);
  free(ref);
}

Test(gemm_grouped, contiguous) {
  run_m_grouped(0, 0, XTE_DTYPE_E4M3);
}
Test(gemm_grouped, contiguous_trans_b_hybrid) {
  run_m_grouped(0, 1, XTE_DTYPE_E5M2);
}
Test(gemm_grouped, masked) {
  run_m_grouped(1, 0, XTE_DTYPE_E4M3);
}

/* k-grouped weight gradient: dY [T, M], X [T, N] (both quantized 1x128 along T: the columnwise
 * copies), D[g] = C[g] + dY_g^T X_g in fp32. */
Test(gemm_grouped, k_grouped_wgrad) {
  enum { G = 4, M = 70, N = 90 };
  const int64_t ks[G] = {128, 0, 256, 100};
  int64_t T = 484, offs[G], g, i;
  float *xa = o_random(T, M, 41), *xb = o_random(T, N, 42);
  float *c = malloc(sizeof(float) * G * M * N);
  uint32_t *d = malloc(sizeof(uint32_t) * G * M * N), *ref = malloc(sizeof(uint32_t) * G * M * N);
  tq qa, qb;
  uint64_t s = 3;
  int ii;
  for (g = 0, i = 0; g < G; g++) {
    offs[g] = i;
    i += ks[g];
  }
  for (i = 0; i < G * M * N; i++) c[i] = (float)(o_unif(&s) * 100.0 - 50.0);
  cr_assert_eq(tq_make(&qa, xa, T, M, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                       XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E5M2),
               XTE_SUCCESS);
  cr_assert_eq(tq_make(&qb, xb, T, N, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                       XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E4M3),
               XTE_SUCCESS);
  for (g = 0; g < G; g++) {
    xte_gemm_config cfg = xte_gemm_config_default();
    xte_tensor C = xte_tensor_2d(c + g * M * N, XTE_DTYPE_FP32, M, N);
    xte_tensor D = xte_tensor_2d(ref + g * M * N, XTE_DTYPE_FP32, M, N);
    cfg.trans_a = cfg.trans_b = 1;
    cfg.accumulate = 1;
    if (ks[g] == 0) {
      memcpy(ref + g * M * N, c + g * M * N, sizeof(float) * M * N); /* C + 0 */
      continue;
    }
    {
      tq ag, bg;
      cr_assert_eq(tq_make(&ag, xa + offs[g] * M, ks[g], M, XTE_SCALING_BLOCK_1x128,
                           XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E5M2),
                   XTE_SUCCESS);
      cr_assert_eq(tq_make(&bg, xb + offs[g] * N, ks[g], N, XTE_SCALING_BLOCK_1x128,
                           XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
                   XTE_SUCCESS);
      cr_assert_eq(xte_gemm(&ag.q, &bg.q, &C, &D, &cfg, NULL), XTE_SUCCESS, "%s", xte_last_error());
      tq_free(&ag);
      tq_free(&bg);
    }
  }
  for (ii = 0; ii < 4; ii++) {
    xte_gemm_groups gr;
    xte_gemm_config cfg = xte_gemm_config_default();
    xte_tensor C = xte_tensor_2d(c, XTE_DTYPE_FP32, G * M, N);
    xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, G * M, N);
    if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
    memset(&gr, 0, sizeof gr);
    gr.kind = XTE_GEMM_GROUPED_K;
    gr.num_groups = G;
    gr.group_sizes = ks;
    cfg.trans_a = cfg.trans_b = 1;
    cfg.accumulate = 1;
    memset(d, 0, sizeof(uint32_t) * G * M * N);
    cr_assert_eq(xte_gemm_grouped(&qa.q, &qb.q, &C, &D, &gr, &cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (i = 0; i < G * M * N; i++)
      cr_assert_eq(d[i], ref[i], "isa %s: group %lld element %lld: %08x vs %08x",
                   xte_cpu_isa_name(ISAS[ii]), (long long)(i / (M * N)), (long long)(i % (M * N)),
                   d[i], ref[i]);
  }
  reset_isa();
  tq_free(&qa);
  tq_free(&qb);
  free(xa);
  free(xb);
  free(c);
  free(d);
  free(ref);
}

/* Small groups (1..32 rows: the small-M path, its SIMD and table decodes, 1..3 row tiles) over raw
 * codes drawn from every code with subnormals and zeros frequent, NaN and inf codes planted in
 * chosen rows of A and B, per-row 1x128 scales; each dtype pair (e5m2 split on either side), K
 * with a 16-multiple tail, an odd tail and below 16, N with a strip tail; against the int128
 * oracle group by group, on every ISA. */
static uint8_t special_code(uint64_t *s, xte_dtype dt) {
  static const uint8_t sub4[] = {0x00, 0x80, 0x01, 0x81, 0x07, 0x87, 0x08, 0x88, 0x7E, 0xFE};
  static const uint8_t sub5[] = {0x00, 0x80, 0x01, 0x81, 0x03, 0x83, 0x04, 0x84, 0x7B, 0xFB};
  uint8_t c = (uint8_t)(o_rng(s) & 0xFF);
  if (o_rng(s) % 4 == 0) return dt == XTE_DTYPE_E4M3 ? sub4[o_rng(s) % 10] : sub5[o_rng(s) % 10];
  if (dt == XTE_DTYPE_E4M3 && (c & 0x7F) == 0x7F) c ^= 1;    /* NaN only where planted */
  if (dt == XTE_DTYPE_E5M2 && (c & 0x7F) >= 0x7C) c &= 0xF3; /* no NaN / inf by chance */
  return c;
}

Test(gemm_grouped, small_groups_special_codes) {
  enum { G = 11, N = 45 };
  const int64_t sizes[G] = {1, 2, 3, 5, 6, 7, 0, 12, 17, 32, 4};
  const int64_t Ks[] = {272, 300, 13};
  const xte_dtype dts[][2] = {{XTE_DTYPE_E4M3, XTE_DTYPE_E4M3},
                              {XTE_DTYPE_E5M2, XTE_DTYPE_E4M3},
                              {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2}};
  int64_t rows = 0, g, i, offs[G];
  int di, ki, ii;
  uint64_t s = 1234;
  for (g = 0; g < G; g++) {
    offs[g] = rows;
    rows += sizes[g];
  }
  for (di = 0; di < 3; di++)
    for (ki = 0; ki < 3; ki++) {
      const xte_dtype da = dts[di][0], db = dts[di][1];
      const int64_t K = Ks[ki], nkb = o_cdiv(K, 128);
      uint8_t *a = malloc((size_t)(rows * K)), *b = malloc((size_t)(G * N * K));
      float *sa = malloc(sizeof(float) * (size_t)(rows * nkb));
      float *sb = malloc(sizeof(float) * (size_t)(G * N * nkb));
      uint32_t *d = malloc(sizeof(uint32_t) * (size_t)(rows * N));
      uint32_t *ref = malloc(sizeof(uint32_t) * (size_t)(rows * N));
      xte_qtensor qa, qb;
      xte_gemm_groups gr;
      xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, rows, N);
      for (i = 0; i < rows * K; i++) a[i] = special_code(&s, da);
      for (i = 0; i < G * N * K; i++) b[i] = special_code(&s, db);
      for (i = 0; i < rows * nkb; i++)
        sa[i] = ldexpf(1.0f + (float)(i % 7) / 8.0f, (int)(i % 9) - 4);
      for (i = 0; i < G * N * nkb; i++)
        sb[i] = ldexpf(1.0f + (float)(i % 5) / 8.0f, (int)(i % 11) - 5);
      /* NaN in A row 0 (group 0) and in a row of group 3; in e5m2 B: +inf, -inf, both (NaN) */
      a[0 * K + K / 2] = da == XTE_DTYPE_E4M3 ? 0x7F : 0x7E;
      a[(offs[3] + 2) * K + K - 1] = 0xFF;
      b[(3 * N + 4) * K + 1] = da == XTE_DTYPE_E4M3 && db == XTE_DTYPE_E4M3 ? 0xFF : 0x7F;
      b[(7 * N + 20) * K + K - 3] = 0x7F; /* a 12-row group, the last block */
      if (db == XTE_DTYPE_E5M2) {
        b[(4 * N + 9) * K + K - 2] = 0x7C;
        b[(5 * N + 44) * K + 3] = 0xFC;
        b[(9 * N + 8) * K + 5] = 0x7C;
        b[(9 * N + 8) * K + K - 1] = 0xFC;
      }
      if (da == XTE_DTYPE_E5M2) {
        a[offs[8] * K + 2] = 0xFC; /* -inf */
        a[(offs[9] + 31) * K + K - 1] = 0x7C;
      }
      for (g = 0; g < G; g++) {
        lop la = {sizes[g], K, nkb, a + offs[g] * K, sa + offs[g] * nkb, da};
        lop lb = {N, K, nkb, b + g * N * K, sb + g * N * nkb, db};
        ocfg cf = {128, NULL, XTE_DTYPE_FP32, NULL, XTE_DTYPE_FP32};
        if (sizes[g]) o_gemm(&la, &lb, &cf, ref + offs[g] * N);
      }
      memset(&qa, 0, sizeof qa);
      qa.scaling_mode = qb.scaling_mode = XTE_SCALING_BLOCK_1x128;
      qa.recipe = XTE_RECIPE_TE_BLOCK;
      qa.rowwise = xte_tensor_2d(a, da, rows, K);
      qa.rowwise_scale_inv.data = sa;
      qa.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
      qa.rowwise_scale_inv.rows = rows;
      qa.rowwise_scale_inv.cols = nkb;
      qa.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
      qb = qa;
      qb.rowwise = xte_tensor_2d(b, db, G * N, K);
      qb.rowwise_scale_inv.data = sb;
      qb.rowwise_scale_inv.rows = G * N;
      memset(&gr, 0, sizeof gr);
      gr.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
      gr.num_groups = G;
      gr.group_sizes = sizes;
      for (ii = 0; ii < 4; ii++) {
        if (o_set_isa(ISAS[ii]) != XTE_SUCCESS) continue;
        memset(d, 0xA5, sizeof(uint32_t) * (size_t)(rows * N));
        cr_assert_eq(xte_gemm_grouped(&qa, &qb, NULL, &D, &gr, NULL, NULL), XTE_SUCCESS, "%s",
                     xte_last_error());
        for (i = 0; i < rows * N; i++)
          cr_assert_eq(d[i], ref[i], "isa %s dtypes %d/%d K %lld: row %lld col %lld: %08x vs %08x",
                       xte_cpu_isa_name(ISAS[ii]), da, db, (long long)K, (long long)(i / N),
                       (long long)(i % N), d[i], ref[i]);
      }
      free(a);
      free(b);
      free(sa);
      free(sb);
      free(d);
      free(ref);
    }
  reset_isa();
}

Test(gemm_grouped, bad_input_writes_nothing) {
  enum { G = 2, N = 128, K = 256 };
  const int64_t sizes[G] = {3, 4};
  int64_t rows = 7;
  float *xa = o_random(rows, K, 1), *xb = o_random(G * N, K, 2);
  tq qa, qb;
  uint32_t d[7 * 128];
  int32_t mm[G] = {3, 9};
  xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, rows, N);
  xte_tensor mt = xte_tensor_1d(mm, XTE_DTYPE_INT32, G);
  xte_gemm_groups gr;
  int64_t bad_sizes[G] = {3, 5}, ksz[G] = {100, 156};
  int i;
  tq_make(&qa, xa, rows, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
          XTE_DTYPE_E4M3);
  tq_make(&qb, xb, G * N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
          XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3);
  memset(&gr, 0, sizeof gr);
  gr.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
  gr.num_groups = G;
  gr.group_sizes = bad_sizes; /* 8 rows: A has 7 */
#define EXPECT_FAIL(want)                                                                \
  do {                                                                                   \
    xte_status st_;                                                                      \
    for (i = 0; i < 7 * 128; i++) d[i] = CANARY;                                         \
    st_ = xte_gemm_grouped(&qa.q, &qb.q, NULL, &D, &gr, NULL, NULL);                     \
    cr_expect_eq(st_, want, "got %s (%s)", xte_status_string(st_), xte_last_error());    \
    for (i = 0; i < 7 * 128; i++) cr_assert_eq(d[i], CANARY, "output written at %d", i); \
  } while (0)
  EXPECT_FAIL(XTE_ERROR_SHAPE);
  gr.num_groups = 0;
  EXPECT_FAIL(XTE_ERROR_INVALID_ARGUMENT);
  gr.num_groups = 3; /* 256 rows of B are not 3 groups */
  EXPECT_FAIL(XTE_ERROR_SHAPE);
  gr.num_groups = G;
  gr.kind = XTE_GEMM_GROUPED_MASKED; /* 7 rows are not 2 groups of m_max */
  gr.masked_m = &mt;
  EXPECT_FAIL(XTE_ERROR_SHAPE);
  gr.kind = XTE_GEMM_GROUPED_K; /* K segments not aligned to 128 */
  gr.group_sizes = ksz;
  EXPECT_FAIL(XTE_ERROR_SHAPE);
  {
    /* group_sizes (int64, host) 4 bytes off: rejected before it is read */
    static int64_t spare[G + 1];
    gr.group_sizes = (const int64_t *)((const char *)spare + 4);
    EXPECT_FAIL(XTE_ERROR_ALIGNMENT);
    gr.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
    EXPECT_FAIL(XTE_ERROR_ALIGNMENT);
  }
  gr.group_sizes = sizes;
  gr.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
  {
    uint32_t ok[7 * 128];
    xte_tensor Dok = xte_tensor_2d(ok, XTE_DTYPE_FP32, rows, N);
    cr_expect_eq(xte_gemm_grouped(&qa.q, &qb.q, NULL, &Dok, &gr, NULL, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
  }
  tq_free(&qa);
  tq_free(&qb);
  free(xa);
  free(xb);
}

/* masked_m beyond m_max is caught by the backend before anything is written */
Test(gemm_grouped, masked_m_out_of_range) {
  enum { G = 2, N = 128, K = 128, MM = 4 };
  float *xa = o_random(G * MM, K, 1), *xb = o_random(G * N, K, 2);
  tq qa, qb;
  uint32_t d[G * MM * N];
  int32_t mm[G] = {2, MM + 1};
  xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, G * MM, N);
  xte_tensor mt = xte_tensor_1d(mm, XTE_DTYPE_INT32, G);
  xte_gemm_groups gr;
  int i;
  tq_make(&qa, xa, G * MM, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
          XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3);
  tq_make(&qb, xb, G * N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
          XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3);
  memset(&gr, 0, sizeof gr);
  gr.kind = XTE_GEMM_GROUPED_MASKED;
  gr.num_groups = G;
  gr.masked_m = &mt;
  for (i = 0; i < G * MM * N; i++) d[i] = CANARY;
  cr_expect_eq(xte_gemm_grouped(&qa.q, &qb.q, NULL, &D, &gr, NULL, NULL),
               XTE_ERROR_INVALID_ARGUMENT);
  for (i = 0; i < G * MM * N; i++) cr_assert_eq(d[i], CANARY);
  tq_free(&qa);
  tq_free(&qb);
  free(xa);
  free(xb);
}

/* K-grouped D is [G * M, N]: G * M past int64 wrapped (2^24 groups of 2^40 rows: 2^64 = 0), so a
 * D with no rows passed the shape check and the backend ran groups of 2^40 rows. Now SHAPE,
 * naming num_groups, before anything is read or written. A's data is never dereferenced by the
 * checks: a small buffer stands for it. */
Test(gemm_grouped, k_grouped_row_count_overflow) {
  enum { N = 4, K = 128 };
  const int64_t G = (int64_t)1 << 24, M = (int64_t)1 << 40;
  static uint8_t fake_a[256];
  static float fake_as[64];
  float *xb = o_random(N, K, 5);
  int64_t *sizes = calloc((size_t)G, sizeof(int64_t));
  uint32_t d[64];
  xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, 0, N);
  xte_qtensor A;
  tq qb;
  xte_gemm_groups gr;
  xte_status st;
  int i;
  cr_assert(sizes);
  sizes[0] = K;
  memset(&A, 0, sizeof A);
  A.rowwise = xte_tensor_2d(fake_a, XTE_DTYPE_E4M3, M, K);
  A.rowwise_scale_inv.data = fake_as;
  A.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  A.rowwise_scale_inv.rows = M;
  A.rowwise_scale_inv.cols = 1;
  A.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  A.scaling_mode = XTE_SCALING_BLOCK_1x128;
  A.recipe = XTE_RECIPE_TE_BLOCK;
  cr_assert_eq(tq_make(&qb, xb, N, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                       XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3),
               XTE_SUCCESS);
  memset(&gr, 0, sizeof gr);
  gr.kind = XTE_GEMM_GROUPED_K;
  gr.num_groups = (int)G;
  gr.group_sizes = sizes;
  for (i = 0; i < 64; i++) d[i] = CANARY;
  st = xte_gemm_grouped(&A, &qb.q, NULL, &D, &gr, NULL, NULL);
  cr_expect_eq(st, XTE_ERROR_SHAPE, "got %s (%s)", xte_status_string(st), xte_last_error());
  cr_expect(strstr(xte_last_error(), "num_groups") != NULL, "message: %s", xte_last_error());
  for (i = 0; i < 64; i++) cr_assert_eq(d[i], CANARY, "output written at %d", i);
  tq_free(&qb);
  free(xb);
  free(sizes);
}

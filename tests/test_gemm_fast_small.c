/* XTE_GEMM_FAST on the CPU for a few rows of A (src/cpu/gemm_fast_small.c), on every ISA the
 * machine and build have (xte_cpu_set_isa), against an fp64 oracle written here:
 * - the FAST bound (include/xte/gemm.h, docs/numerics.md section 6): per block
 *   |p_fast - p| <= KB 2^-13 sum |a b|, then the contract's fp32 steps; the test bounds
 *   |D - V| <= sum_b |s_b| KB 2^-13 S_b + (nb + 2) 2^-24 T (+ 2^-8 |V| + ... for bf16 out), V the
 *   fp64 value of the contract with exact partials, S_b = sum |a b| over block b, T the magnitudes
 *   every fp32 rounding sees; and the CPU path's own tighter bound, the fp32 sum of at most KB
 *   exact products: (KB - 1) 2^-24 S_b in place of KB 2^-13 S_b;
 * - exact bytes where every fp32 partial sum is exact (small integer and subnormal values): the
 *   contract's steps emulated here in fp32 (fmaf, RNE, canonical NaN), which also fixes the NaN /
 *   inf rule (a NaN code, inf * 0, +inf + -inf in a block give NaN; e5m2 inf an inf partial);
 * - grouped (contiguous, masked) calls, C (fp32, bf16) and bias, bf16 out, MXFP8, e5m2 on either
 *   side, N off the vector width, K off the block, K = 0, groups of 0 rows; the same bytes run to
 *   run and for 1 and 2 threads; B read transposed (not this path) gives the EXACT bytes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

/* ---------------------------------------------------------------- the oracle's decoding */
static double fp8_value(uint8_t b, int e5) {
  const double sg = (b & 0x80) ? -1.0 : 1.0;
  if (!e5) {
    int e = (b >> 3) & 15, m = b & 7;
    if (e == 15 && m == 7) return NAN;
    return sg * (e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10));
  } else {
    int e = (b >> 2) & 31, m = b & 3;
    if (e == 31) return m == 0 ? sg * INFINITY : NAN;
    return sg * (e == 0 ? ldexp(m, -16) : ldexp(4 + m, e - 17));
  }
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static float bf16_f32(uint16_t h) {
  return from_bits((uint32_t)h << 16);
}
static uint16_t f32_bf16(float f) { /* RNE, canonical NaN */
  uint32_t u = bits(f);
  if (isnan(f)) return 0x7FC0;
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static uint64_t rng_state = 1;
static uint32_t rnd(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (uint32_t)(rng_state >> 33);
}

/* ---------------------------------------------------------------- an operand [R, K] */
enum { SC_1x128, SC_128x128, SC_MX };
typedef struct op {
  int64_t R, K;
  int sc, e5;
  uint8_t *codes;
  void *scales; /* COMPACT: fp32 [R or R/128][nkb], MX: e8m0 [R][nkb] */
  int64_t srows, scols;
  xte_qtensor q;
} op;

static int kblock_of(int sc) {
  return sc == SC_MX ? 32 : 128;
}

static float op_scale(const op *o, int64_t r, int64_t k) {
  const int64_t kb = k / kblock_of(o->sc);
  if (o->sc == SC_MX)
    return (float)ldexp(1.0, ((const uint8_t *)o->scales)[r * o->scols + kb] - 127);
  if (o->sc == SC_128x128) return ((const float *)o->scales)[(r / 128) * o->scols + kb];
  return ((const float *)o->scales)[r * o->scols + kb];
}

/* kind 0: random codes (finite, every magnitude); 1: small integers |v| <= 8 (fp32 sums exact);
 * 2: |v| < 1/4, subnormals included (fp32 sums exact) */
static uint8_t pick_code(int e5, int kind) {
  for (;;) {
    uint8_t c = (uint8_t)rnd();
    double v = fp8_value(c, e5);
    if (!isfinite(v)) continue;
    if (kind == 1 && (fabs(v) > 8.0 || fabs(v) != floor(fabs(v)))) continue;
    if (kind == 2 && fabs(v) >= 0.25) continue;
    return c;
  }
}

static void op_make(op *o, int64_t R, int64_t K, int sc, int e5, int kind) {
  xte_scaling_mode mode = sc == SC_MX        ? XTE_SCALING_MXFP8_1x32
                          : sc == SC_128x128 ? XTE_SCALING_BLOCK_128x128
                                             : XTE_SCALING_BLOCK_1x128;
  xte_recipe rc = sc == SC_MX ? XTE_RECIPE_MX_OCP : XTE_RECIPE_TE_BLOCK;
  int64_t i;
  memset(o, 0, sizeof *o);
  o->R = R;
  o->K = K;
  o->sc = sc;
  o->e5 = e5;
  cr_assert_eq(
      xte_quantize_scale_shape(R, K, mode, rc, XTE_SCALE_LAYOUT_COMPACT, 0, &o->srows, &o->scols),
      XTE_SUCCESS);
  o->codes = malloc((size_t)(R * K + 1));
  for (i = 0; i < R * K; i++) o->codes[i] = pick_code(e5, kind);
  if (sc == SC_MX) {
    uint8_t *s = malloc((size_t)(o->srows * o->scols + 1));
    for (i = 0; i < o->srows * o->scols; i++) s[i] = (uint8_t)(120 + rnd() % 14);
    o->scales = s;
  } else {
    float *s = malloc(sizeof(float) * (size_t)(o->srows * o->scols + 1));
    for (i = 0; i < o->srows * o->scols; i++)
      s[i] = (float)ldexp(1.0 + (rnd() % 1024) / 1024.0, (int)(rnd() % 9) - 4);
    o->scales = s;
  }
  o->q.scaling_mode = mode;
  o->q.recipe = rc;
  o->q.rowwise = xte_tensor_2d(o->codes, e5 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3, R, K);
  o->q.rowwise_scale_inv.data = o->scales;
  o->q.rowwise_scale_inv.dtype = sc == SC_MX ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
  o->q.rowwise_scale_inv.rows = o->srows;
  o->q.rowwise_scale_inv.cols = o->scols;
  o->q.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
}

static void op_free(op *o) {
  free(o->codes);
  free(o->scales);
}

/* ---------------------------------------------------------------- one call and its checks */
typedef struct call {
  int64_t M, N, K, G;   /* A rows (all groups), N, K, groups (0: a plain xte_gemm) */
  int masked;           /* G > 0: masked (A [G, mmax, K]) else contiguous */
  const int64_t *sizes; /* G > 0: rows per group */
  int sca, scb;         /* SC_* */
  int e5a, e5b, kind;
  int c_dt; /* 0: no C, else XTE_DTYPE_FP32 / BF16 */
  int bias, d_bf16;
  int specials; /* plant NaN / inf codes */
} call;

typedef struct run {
  op a, b;
  void *c, *d;
  float *bias;
  int64_t rows_d;                  /* rows of D */
  int64_t *g_row0, *g_rows, *g_b0; /* per problem: first A / D row, valid rows, first B row */
  int64_t np;
  int32_t *mm;
} run;

static void plant_specials(run *r, const call *c) {
  /* B: a NaN code in column 3's first block; e5m2 B: +inf in column 5 (block 0) and -inf in
   * column 6 together with +inf (block 1, when there); A (e5m2): +inf in row 0 block 0 */
  const int64_t K = c->K;
  int64_t g;
  if (K == 0) return;
  for (g = 0; g < (c->G ? c->G : 1); g++) {
    uint8_t *b = r->b.codes + r->g_b0[g] * K;
    if (c->N > 3) b[3 * K + K / 2] = c->e5b ? 0x7E : 0x7F;
    if (c->e5b && c->N > 6) {
      b[5 * K + 1] = 0x7C;
      b[6 * K + 0] = 0x7C;
      b[6 * K + (K > 2 ? 2 : 0)] = 0xFC;
    }
    if (!c->e5b && c->N > 8) b[8 * K + K - 1] = 0xFF; /* -NaN in the last (ragged) block */
  }
  if (c->e5a)
    for (g = 0; g < r->np; g++)
      if (r->g_rows[g] > 0) {
        r->a.codes[r->g_row0[g] * K + 0] = 0x7C; /* +inf: inf * 0 where B's code is 0 */
        if (r->g_rows[g] > 1) r->a.codes[(r->g_row0[g] + 1) * K + K - 1] = 0xFC;
      }
}

static void setup(run *r, const call *c) {
  int64_t g, rows = 0, mmax = 0;
  memset(r, 0, sizeof *r);
  r->np = c->G ? c->G : 1;
  r->g_row0 = calloc((size_t)r->np, sizeof(int64_t));
  r->g_rows = calloc((size_t)r->np, sizeof(int64_t));
  r->g_b0 = calloc((size_t)r->np, sizeof(int64_t));
  r->mm = calloc((size_t)r->np, sizeof(int32_t));
  for (g = 0; g < r->np; g++)
    if (c->G && c->sizes[g] > mmax) mmax = c->sizes[g];
  for (g = 0; g < r->np; g++) {
    const int64_t m = c->G ? c->sizes[g] : c->M;
    r->g_row0[g] = c->masked ? g * mmax : rows;
    r->g_rows[g] = m;
    r->g_b0[g] = g * c->N;
    r->mm[g] = (int32_t)m;
    rows += c->masked ? mmax : m;
  }
  r->rows_d = rows;
  op_make(&r->a, rows, c->K, c->sca, c->e5a, c->kind);
  op_make(&r->b, r->np * c->N, c->K, c->scb, c->e5b, c->kind);
  if (c->specials) plant_specials(r, c);
  r->d = malloc(4 * (size_t)(rows * c->N + 1));
  if (c->c_dt) {
    int64_t i;
    r->c = malloc(4 * (size_t)(rows * c->N + 1));
    for (i = 0; i < rows * c->N; i++) {
      float v = (float)((int)(rnd() % 64) - 32) * 0.25f;
      if (c->c_dt == XTE_DTYPE_BF16)
        ((uint16_t *)r->c)[i] = f32_bf16(v);
      else
        ((float *)r->c)[i] = v;
    }
  }
  if (c->bias) {
    int64_t n;
    r->bias = malloc(sizeof(float) * (size_t)(c->N + 1));
    for (n = 0; n < c->N; n++) r->bias[n] = (float)((int)(rnd() % 32) - 16) * 0.125f;
  }
}

static void teardown(run *r) {
  op_free(&r->a);
  op_free(&r->b);
  free(r->c);
  free(r->d);
  free(r->bias);
  free(r->g_row0);
  free(r->g_rows);
  free(r->g_b0);
  free(r->mm);
}

#define CANARY 0x5A5A5A5Au

static xte_status do_call(run *r, const call *c, int mode) {
  xte_gemm_config cfg = xte_gemm_config_default();
  xte_tensor D = xte_tensor_2d(r->d, c->d_bf16 ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, r->rows_d, c->N);
  xte_tensor C, Bi;
  int64_t i;
  cfg.mode = (xte_gemm_mode)mode;
  if (c->c_dt) {
    C = xte_tensor_2d(r->c, (xte_dtype)c->c_dt, r->rows_d, c->N);
    cfg.accumulate = 1;
  }
  if (r->bias) {
    Bi = xte_tensor_1d(r->bias, XTE_DTYPE_FP32, c->N);
    cfg.bias = &Bi;
  }
  for (i = 0; i < r->rows_d * c->N * (c->d_bf16 ? 2 : 4) / 4; i++) ((uint32_t *)r->d)[i] = CANARY;
  if (c->G) {
    xte_gemm_groups gr;
    xte_tensor mt = xte_tensor_1d(r->mm, XTE_DTYPE_INT32, c->G);
    memset(&gr, 0, sizeof gr);
    gr.kind = c->masked ? XTE_GEMM_GROUPED_MASKED : XTE_GEMM_GROUPED_CONTIGUOUS;
    gr.num_groups = (int)c->G;
    gr.group_sizes = c->sizes;
    gr.alignment = 1;
    gr.masked_m = &mt;
    return xte_gemm_grouped(&r->a.q, &r->b.q, c->c_dt ? &C : NULL, &D, &gr, &cfg, NULL);
  }
  return xte_gemm(&r->a.q, &r->b.q, c->c_dt ? &C : NULL, &D, &cfg, NULL);
}

static float load_c(const run *r, const call *c, int64_t i) {
  if (c->c_dt == XTE_DTYPE_BF16) return bf16_f32(((const uint16_t *)r->c)[i]);
  return ((const float *)r->c)[i];
}

/* Checks D of every valid row against the oracle; returns the worst error / bound ratio. */
static double check(const run *r, const call *c, const char *isa, int exact_bytes) {
  const int kb = kblock_of(c->sca);
  const int64_t K = c->K, N = c->N, nb = (K + kb - 1) / kb;
  const double u = ldexp(1.0, -24), fast_rel = kb * ldexp(1.0, -13),
               tight_rel = (kb - 1) * u * 1.001;
  double worst = 0.0;
  int64_t g, i, n;
  for (g = 0; g < r->np; g++)
    for (i = 0; i < r->g_rows[g]; i++) {
      const int64_t ra = r->g_row0[g] + i;
      for (n = 0; n < N; n++) {
        const int64_t rb = r->g_b0[g] + n, di = ra * N + n;
        double V = 0.0, Ef = 0.0, Et = 0.0, T = 0.0;
        float acc = 0.0f, t;
        int64_t b, k;
        uint32_t got, want;
        for (b = 0; b < nb; b++) {
          double p = 0.0, S = 0.0;
          float s;
          for (k = b * kb; k < K && k < (b + 1) * kb; k++) {
            double x = fp8_value(r->a.codes[ra * K + k], c->e5a) *
                       fp8_value(r->b.codes[rb * K + k], c->e5b);
            p += x;
            S += fabs(x);
          }
          s = (float)((double)op_scale(&r->a, ra, b * kb) * (double)op_scale(&r->b, rb, b * kb));
          V += p * (double)s;
          Ef += fabs((double)s) * fast_rel * S;
          Et += fabs((double)s) * tight_rel * S;
          T += fabs((double)s) * S * (1.0 + fast_rel);
          acc = fmaf((float)p, s, acc);
        }
        t = acc;
        if (c->c_dt) {
          t = t + load_c(r, c, di);
          V += load_c(r, c, di);
          T += fabs(load_c(r, c, di));
        }
        if (r->bias) {
          t = t + r->bias[n];
          V += r->bias[n];
          T += fabs(r->bias[n]);
        }
        if (c->d_bf16) {
          want = f32_bf16(t);
          got = ((const uint16_t *)r->d)[di];
        } else {
          want = isnan(t) ? 0x7FC00000u : bits(t);
          got = ((const uint32_t *)r->d)[di];
        }
        if (exact_bytes || isnan(V) || isinf(V)) {
          cr_assert_eq(got, want, "%s row %lld col %lld: %08x, the contract %08x", isa,
                       (long long)ra, (long long)n, got, want);
          continue;
        }
        {
          const double D = c->d_bf16 ? (double)bf16_f32((uint16_t)got) : (double)from_bits(got);
          const double slack = (double)(nb + 2) * u * T + (nb + 2) * ldexp(1.0, -149);
          double bf = Ef + slack, bt = Et + slack, err = fabs(D - V);
          if (c->d_bf16) {
            bf += ldexp(1.0, -8) * (fabs(V) + bf);
            bt += ldexp(1.0, -8) * (fabs(V) + bt);
          }
          cr_assert(err <= bf, "%s row %lld col %lld: |D - V| = %g above the FAST bound %g", isa,
                    (long long)ra, (long long)n, err, bf);
          cr_assert(err <= bt, "%s row %lld col %lld: |D - V| = %g above the fp32-sum bound %g",
                    isa, (long long)ra, (long long)n, err, bt);
          if (bt > 0 && err / bt > worst) worst = err / bt;
        }
      }
    }
  /* rows no problem owns (masked padding) keep the canary */
  if (c->G && c->masked)
    for (g = 0; g < r->np; g++)
      for (i = r->g_rows[g]; i < (g + 1 < r->np ? r->g_row0[g + 1] : r->rows_d) - r->g_row0[g]; i++)
        for (n = 0; n < N; n++) {
          const int64_t di = (r->g_row0[g] + i) * N + n;
          const uint32_t got =
              c->d_bf16 ? ((const uint16_t *)r->d)[di] : ((const uint32_t *)r->d)[di];
          cr_assert_eq(got, c->d_bf16 ? (CANARY & 0xFFFF) : CANARY, "%s: masked row written", isa);
        }
  return worst;
}

/* Every ISA: the checks, the same bytes twice and for 1 and 2 threads. */
static int each_isa(const call *c, int exact_bytes) {
  const xte_cpu_isa saved = xte_cpu_get_isa();
  const int threads = xte_cpu_get_num_threads();
  size_t bytes = 0;
  int isa, ran = 0;
  run r;
  void *first;
  setup(&r, c);
  bytes = (size_t)(r.rows_d * c->N) * (c->d_bf16 ? 2 : 4);
  first = malloc(bytes + 1);
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    const char *name = xte_cpu_isa_name((xte_cpu_isa)isa);
    if (xte_cpu_set_isa((xte_cpu_isa)isa) != XTE_SUCCESS) continue;
    ran++;
    xte_cpu_set_num_threads(2);
    cr_assert_eq(do_call(&r, c, XTE_GEMM_FAST), XTE_SUCCESS, "%s: %s", name, xte_last_error());
    check(&r, c, name, exact_bytes);
    memcpy(first, r.d, bytes);
    xte_cpu_set_num_threads(1);
    cr_assert_eq(do_call(&r, c, XTE_GEMM_FAST), XTE_SUCCESS, "%s", xte_last_error());
    cr_assert(memcmp(first, r.d, bytes) == 0, "%s: 1 thread gives other bytes than 2", name);
    xte_cpu_set_num_threads(2);
    cr_assert_eq(do_call(&r, c, XTE_GEMM_FAST), XTE_SUCCESS, "%s", xte_last_error());
    cr_assert(memcmp(first, r.d, bytes) == 0, "%s: not the same bytes run to run", name);
  }
  xte_cpu_set_num_threads(threads);
  xte_cpu_set_isa(saved);
  free(first);
  teardown(&r);
  cr_assert(ran >= 1);
  return ran;
}

/* ---------------------------------------------------------------- the cases */
Test(gemm_fast_small, rows_1_to_32_random) {
  int64_t m;
  for (m = 1; m <= 32; m++) {
    call c = {0};
    c.M = m;
    c.N = 37;
    c.K = 300;
    c.sca = SC_1x128;
    c.scb = SC_128x128;
    each_isa(&c, 0);
  }
}

Test(gemm_fast_small, exact_where_fp32_sums_are_exact) {
  static const int64_t ms[] = {1, 2, 3, 4, 5, 8, 13, 32};
  int i, e;
  for (i = 0; i < 8; i++)
    for (e = 0; e < 3; e++) {
      call c = {0};
      c.M = ms[i];
      c.N = 45;
      c.K = 1000;
      c.sca = SC_1x128;
      c.scb = e == 2 ? SC_1x128 : SC_128x128;
      c.e5a = e == 1;
      c.e5b = e == 2;
      c.kind = 1;
      each_isa(&c, 1);
    }
}

Test(gemm_fast_small, subnormals_exact) {
  int e;
  for (e = 0; e < 3; e++) {
    call c = {0};
    c.M = 5;
    c.N = 21;
    c.K = 259;
    c.sca = SC_1x128;
    c.scb = SC_128x128;
    c.e5a = e == 1;
    c.e5b = e == 2;
    c.kind = 2;
    each_isa(&c, 1);
  }
}

Test(gemm_fast_small, mxfp8) {
  static const int64_t ms[] = {1, 2, 4, 7, 32};
  int i, e;
  for (i = 0; i < 5; i++)
    for (e = 0; e < 3; e++) {
      call c = {0};
      c.M = ms[i];
      c.N = 50;
      c.K = 100;
      c.sca = c.scb = SC_MX;
      c.e5a = e == 1;
      c.e5b = e == 2;
      each_isa(&c, 0);
      c.kind = 1;
      each_isa(&c, 1);
    }
}

Test(gemm_fast_small, e5m2_either_side) {
  int e;
  for (e = 1; e <= 2; e++) {
    call c = {0};
    c.M = 6;
    c.N = 33;
    c.K = 700;
    c.sca = SC_1x128;
    c.scb = SC_128x128;
    c.e5a = e == 1;
    c.e5b = e == 2;
    each_isa(&c, 0);
  }
}

Test(gemm_fast_small, nan_inf_rule) {
  int e, i;
  static const int64_t ms[] = {1, 2, 3, 9};
  for (i = 0; i < 4; i++)
    for (e = 0; e < 3; e++) {
      call c = {0};
      c.M = ms[i];
      c.N = 20;
      c.K = 200;
      c.sca = SC_1x128;
      c.scb = SC_1x128;
      c.e5a = e == 1;
      c.e5b = e == 2;
      c.kind = 1;
      c.specials = 1;
      each_isa(&c, 1);
      c.sca = c.scb = SC_MX;
      each_isa(&c, 1);
    }
}

Test(gemm_fast_small, epilogue_c_bias_bf16) {
  int v;
  for (v = 0; v < 6; v++) {
    call c = {0};
    c.M = 3 + v;
    c.N = 29;
    c.K = 400;
    c.sca = SC_1x128;
    c.scb = SC_128x128;
    c.c_dt = v % 3 == 0 ? 0 : v % 3 == 1 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
    c.bias = v >= 2;
    c.d_bf16 = v % 2;
    each_isa(&c, 0);
    c.kind = 1;
    each_isa(&c, 1);
  }
}

Test(gemm_fast_small, grouped_contiguous_and_masked) {
  static const int64_t sizes[4] = {3, 0, 1, 32};
  int masked, e;
  for (masked = 0; masked < 2; masked++)
    for (e = 0; e < 2; e++) {
      call c = {0};
      c.G = 4;
      c.sizes = sizes;
      c.masked = masked;
      c.N = 40;
      c.K = 260;
      c.sca = SC_1x128;
      c.scb = SC_128x128;
      c.e5b = e;
      c.bias = 1;
      each_isa(&c, 0);
      c.kind = 1;
      c.specials = 1;
      each_isa(&c, 1);
    }
}

Test(gemm_fast_small, empty) {
  static const int64_t sizes[3] = {0, 2, 0};
  call c = {0};
  c.M = 4;
  c.N = 17;
  c.K = 0;
  c.sca = SC_1x128;
  c.scb = SC_128x128;
  c.c_dt = XTE_DTYPE_FP32;
  c.bias = 1;
  c.kind = 1;
  each_isa(&c, 1); /* K = 0: D = C + bias */
  c.G = 3;
  c.sizes = sizes;
  c.K = 128;
  c.masked = 1;
  each_isa(&c, 1);
}

/* The routing (src/cpu/gemm_fast.c, small_exact): where FAST hands a problem of few rows to the
 * exact driver's VNNI / AMX-INT8 path (xte_internal_gemm_fast_small_exact says so for the ISA in
 * use) its rows hold EXACT's bytes, also in a grouped call mixing routed and unrouted groups; the
 * other rows are FAST's own (on random data some differ from EXACT's) and within the bounds. */
XTE_API int xte_internal_gemm_fast_small_exact(int64_t m);

Test(gemm_fast_small, routed_to_exact_gives_exact_bytes) {
  static const int64_t sizes[6] = {1, 16, 2, 32, 0, 8};
  const xte_cpu_isa saved = xte_cpu_get_isa();
  int isa, masked;
  for (masked = 0; masked < 2; masked++) {
    /* 6 groups of 1, 16, 2, 32, 0 and 8 rows, N 72, K 1536, e4m3 x e4m3 1x128 x 128x128, bias */
    call c = {.G = 6, .sizes = sizes, .masked = masked, .N = 72, .K = 1536, .bias = 1};
    run r;
    size_t bytes;
    void *ex;
    int64_t g;
    c.scb = SC_128x128;
    setup(&r, &c);
    bytes = (size_t)(r.rows_d * c.N) * 4;
    ex = malloc(bytes);
    for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
      const char *name = xte_cpu_isa_name((xte_cpu_isa)isa);
      if (xte_cpu_set_isa((xte_cpu_isa)isa) != XTE_SUCCESS) continue;
      cr_assert_eq(do_call(&r, &c, XTE_GEMM_EXACT), XTE_SUCCESS, "%s", xte_last_error());
      memcpy(ex, r.d, bytes);
      cr_assert_eq(do_call(&r, &c, XTE_GEMM_FAST), XTE_SUCCESS, "%s", xte_last_error());
      check(&r, &c, name, 0);
      for (g = 0; g < r.np; g++) {
        const size_t off = (size_t)(r.g_row0[g] * c.N) * 4, len = (size_t)(r.g_rows[g] * c.N) * 4;
        const int same = memcmp((char *)ex + off, (char *)r.d + off, len) == 0;
        if (r.g_rows[g] == 0) continue;
        if (xte_internal_gemm_fast_small_exact(r.g_rows[g]))
          cr_assert(same, "%s: group of %lld rows routed to the exact path: not EXACT's bytes",
                    name, (long long)r.g_rows[g]);
        else
          cr_assert(!same, "%s: group of %lld rows on FAST's kernel gives EXACT's bytes", name,
                    (long long)r.g_rows[g]);
      }
    }
    xte_cpu_set_isa(saved);
    free(ex);
    teardown(&r);
  }
  /* the rule: rows the exact driver runs fast on VNNI (1) and AMX-INT8 (9 and more) on avx512
   * where the CPU has them, never on avx2 or scalar */
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    if (xte_cpu_set_isa((xte_cpu_isa)isa) != XTE_SUCCESS) continue;
    if (isa != XTE_CPU_ISA_AVX512) {
      int64_t m;
      for (m = 0; m <= 33; m++)
        cr_assert(!xte_internal_gemm_fast_small_exact(m), "%s: %lld rows routed to exact",
                  xte_cpu_isa_name((xte_cpu_isa)isa), (long long)m);
    }
    cr_assert(!xte_internal_gemm_fast_small_exact(0) && !xte_internal_gemm_fast_small_exact(33));
    {
      /* xte info names the routed rows */
      char info[8192];
      const int any =
          xte_internal_gemm_fast_small_exact(1) || xte_internal_gemm_fast_small_exact(9);
      cr_assert_eq(xte_backend_info_string(info, sizeof info), XTE_SUCCESS);
      cr_assert_eq(
          strstr(info, "FAST e4m3 GEMM, few rows: fp32 fma; the exact path at rows") != NULL, any,
          "%s", info);
    }
  }
  xte_cpu_set_isa(saved);
}

/* FAST is this path (not the exact kernel under another name): on random data some partial's
 * fp32 sum differs from the exact one; and B read transposed (not this path) gives EXACT bytes. */
Test(gemm_fast_small, fast_differs_from_exact_and_fallback) {
  const xte_cpu_isa saved = xte_cpu_get_isa();
  int isa, differ;
  call c = {0};
  run r;
  size_t bytes;
  void *ex;
  c.M = 8;
  c.N = 64;
  c.K = 2048;
  c.sca = SC_1x128;
  c.scb = SC_128x128;
  setup(&r, &c);
  bytes = (size_t)(r.rows_d * c.N) * 4;
  ex = malloc(bytes);
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    if (xte_cpu_set_isa((xte_cpu_isa)isa) != XTE_SUCCESS) continue;
    cr_assert_eq(do_call(&r, &c, XTE_GEMM_EXACT), XTE_SUCCESS);
    memcpy(ex, r.d, bytes);
    cr_assert_eq(do_call(&r, &c, XTE_GEMM_FAST), XTE_SUCCESS);
    differ = memcmp(ex, r.d, bytes) != 0;
    cr_expect(differ, "%s: FAST gives the EXACT bytes on random data: not the FAST path",
              xte_cpu_isa_name((xte_cpu_isa)isa));
  }
  xte_cpu_set_isa(saved);
  {
    /* B as X^T [K, N] (trans_b = 1): not this path's (B is not read along K); the general FAST
     * driver takes it (its bound, every transpose: tests/test_gemm_fast.c). Here: it runs, and
     * gives the same bytes run to run. */
    op b2;
    xte_gemm_config cfg = xte_gemm_config_default();
    xte_tensor D = xte_tensor_2d(r.d, XTE_DTYPE_FP32, c.M, c.N);
    op_make(&b2, c.K, c.N, SC_128x128, 0, 0);
    cfg.trans_b = 1;
    cfg.mode = XTE_GEMM_FAST;
    cr_assert_eq(xte_gemm(&r.a.q, &b2.q, NULL, &D, &cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    memcpy(ex, r.d, bytes);
    cr_assert_eq(xte_gemm(&r.a.q, &b2.q, NULL, &D, &cfg, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    cr_assert(memcmp(ex, r.d, bytes) == 0, "trans_b = 1 in FAST: not the same bytes run to run");
    op_free(&b2);
  }
  free(ex);
  teardown(&r);
}

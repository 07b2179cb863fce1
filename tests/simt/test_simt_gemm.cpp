/* The CUDA exact GEMM kernels (src/cuda/gemm_kernels.cuh, stage 1: SIMT fp64; stage 2: the fp64
 * tensor-core kernel of src/cuda/gemm_mma_kernels.cuh, once with mma.sync m8n8k4 and once with
 * m16n8k16, both emulated by src/cuda/xte_dmma.cuh; every case runs through all three; stage 3:
 * the int8 digit kernel of src/cuda/gemm_imma_kernels.cuh, mma m16n8k32 .s8 emulated by
 * src/cuda/xte_imma.cuh, every e4m3 x e4m3 case), run on the host by the SIMT runner (simt.h,
 * through the stand-in plugin simt_plugin.cpp that libxte loads as its CUDA backend), against the
 * CPU backend, byte for byte: every byte of D (D starts as 0xCD on
 * both sides, so rows the call must not write, padding rows of a contiguous grouping and rows past
 * masked_m, are compared too).
 *
 * Dense: every scaling pair (1x128 x 128x128, 128x128 x 1x128, 1x128 x 1x128, per-tensor,
 * MXFP8 1x32 with E8M0 scales), every transpose, every scale layout, the dtype pairs e4m3 x e4m3,
 * e4m3 x e5m2, e5m2 x e4m3 (and e5m2 x e5m2, refused alike), odd M / N / K, K not a multiple of
 * the block and K = 0, padded ld of C and D, accumulate (C fp32 / bf16, in place too), bias, D
 * fp32 / bf16, EXACT and FAST; codes with NaN / inf / subnormal / max codes planted into the
 * quantized copies, codes that are mostly extreme (+-max next to subnormals), subnormal / huge
 * scales; sums that an fp64 addition of the two e5m2 classes would round twice (the split's single
 * rounding, both operand orders). Grouped: contiguous (empty groups, alignment
 * 0 / 1 / 8 / 32, B as [G N, K] or [G K, N]), masked (masked_m 0, m_max and between; a masked_m
 * out of range is refused with the CPU's status and message and D is left as it was), K-grouped
 * (empty groups, a ragged last group, both transposes).
 *
 * Also: xte_dmma_m8n8k4, xte_dmma_m16n8k16 and xte_imma_m16n8k32 alone (one warp, D = C + A B
 * against a plain triple loop, fragments placed by the PTX ISA's documented layouts written out as
 * tables), the e4m3 digit split over all 256 codes and the digit partial against __int128
 * arithmetic (src/numerics/xte_gemm_digits.h), and a few cases on 128-lane warps (MUSA's), where
 * an MMA request must run the SIMT kernel. The plugin's launch counters (simt_gemm_launches) say
 * which kernel ran in every call.
 *
 *   test_simt_gemm [--full] [--verbose]
 * default: a thinned case list (well under 40 s on 2 idle cores); --full: every case.
 * Exit status 1 on any mismatch, with one line per failing case. */
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <dlfcn.h>

#include "../test_gemm_oracle.h"
#include "xte/xte.h"
/* the DMMA wrapper's host emulation, unit-tested here on the runner (xte_dmma_unit) */
#include "simt.h"
#include "../../src/cuda/xte_dmma.cuh"
#include "../../src/cuda/xte_imma.cuh"
#include "../../src/numerics/xte_gemm_digits.h"

#include "simt_test_common.h"

/* 1: the thinned default list (--reduced too); 0: every case (--full) */
static int reduced = 1;

/* n elements of dtype dt (fp32 / bf16): normal values of moderate range, now and then a special */
static buf random_vals(size_t n, int dt) {
  buf b(n * esz(dt) + 1);
  static const uint32_t specials[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFA12345u,
                                      0x00000001u, 0x80000000u, 0x00000000u, 0x7F7FFFFFu};
  for (size_t i = 0; i < n; i++) {
    uint32_t v;
    if (rnd() % 29 == 0)
      v = specials[rnd() % 8];
    else
      v = (uint32_t)(rnd() & 0x807FFFFFu) | ((118u + (uint32_t)(rnd() % 16)) << 23);
    if (dt == XTE_DTYPE_FP32) {
      std::memcpy(&b[i * 4], &v, 4);
    } else {
      const uint16_t h = (uint16_t)(v >> 16);
      std::memcpy(&b[i * 2], &h, 2);
    }
  }
  return b;
}

/* ---------------------------------------------------------------- operands */

struct side {
  xte_scaling_mode mode;
  xte_recipe recipe;
};

static const side S1_TE = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK};
static const side SQ_TE = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK};
static const side S1_DG = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM};
static const side SQ_DG = {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_DEEPGEMM};
static const side S1_MT = {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_MTFP8};
static const side PT = {XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT};
static const side MX_TE = {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE};
static const side MX_OCP = {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_OCP};

static const side PAIRS[][2] = {{S1_TE, SQ_TE}, {SQ_DG, S1_DG}, {S1_TE, S1_MT},
                                {S1_DG, SQ_DG}, {PT, PT},       {MX_TE, MX_OCP}};
static const int NPAIRS = 6;

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

/* codes planted into the quantized copies: 0 none, 1 a few specials (NaN, inf, subnormal, max),
 * 2 mostly extreme finite codes (+-max and subnormals: large cancellations), 3 both */
static void plant(xte_tensor *t, int how) {
  if (!t->data || how == 0) return;
  const int64_t n = t->shape[0] * t->shape[1];
  uint8_t *c = (uint8_t *)t->data;
  const int e5 = t->dtype == XTE_DTYPE_E5M2;
  static const uint8_t sp4[] = {0x7F, 0xFF, 0x01, 0x81, 0x07, 0x7E, 0xFE, 0x00, 0x80};
  static const uint8_t sp5[] = {0x7C, 0xFC, 0x7D, 0xFF, 0x01, 0x83, 0x7B, 0xFB, 0x00};
  static const uint8_t ex4[] = {0x7E, 0xFE, 0x01, 0x81, 0x00, 0x80, 0x3C, 0x44, 0x39};
  static const uint8_t ex5[] = {0x7B, 0xFB, 0x01, 0x81, 0x00, 0x80, 0x3C, 0x02, 0x82};
  for (int64_t i = 0; i < n; i++) {
    if ((how & 2) && rnd() % 2) c[i] = (e5 ? ex5 : ex4)[rnd() % 9];
    if ((how & 1) && rnd() % 97 == 0) c[i] = (e5 ? sp5 : sp4)[rnd() % 9];
  }
}

/* a few fp32 scales made subnormal or huge */
static void plant_scales(xte_qtensor *q) {
  xte_scale_tensor *s[2] = {&q->rowwise_scale_inv, &q->columnwise_scale_inv};
  for (int c = 0; c < 2; c++) {
    if (!s[c]->data || s[c]->dtype != XTE_DTYPE_FP32) continue;
    const int64_t n = s[c]->rows * s[c]->cols;
    float *f = (float *)s[c]->data;
    for (int k = 0; k < 2 && n > 0; k++) f[rnd() % (uint64_t)n] = k ? 3e38f : 1e-40f;
  }
}

struct qop {
  tq t;
  bool ok = false;
  qop() { std::memset(&t, 0, sizeof t); }
  ~qop() { tq_free(&t); }
  qop(const qop &) = delete;
  qop &operator=(const qop &) = delete;
};

/* X [R, C] quantized (both copies) with side s, layout and dtype; codes planted */
static bool make_q(qop &q, int64_t R, int64_t C, side s, xte_scale_layout ly, xte_dtype dt, int how,
                   int scales) {
  float *x = o_random(R, C, rnd());
  const xte_status st = tq_make(&q.t, x, R, C, s.mode, s.recipe, ly, dt);
  free(x);
  if (st != XTE_SUCCESS) return false;
  plant(&q.t.q.rowwise, how);
  plant(&q.t.q.columnwise, how);
  if (scales) plant_scales(&q.t.q);
  q.ok = true;
  return true;
}

/* ---------------------------------------------------------------- one call, both backends */

struct outs {
  int d_dt, c_dt; /* c_dt < 0: no C; in place: C is D */
  int in_place, with_bias;
  int64_t rows, N, ld_d, ld_c;
  buf c, bias;
};

static void setup_outs(outs &o, int64_t rows, int64_t N, int d_dt, int c_dt, int in_place,
                       int with_bias, int pad) {
  o.rows = rows;
  o.N = N;
  o.d_dt = d_dt;
  o.c_dt = c_dt;
  o.in_place = in_place && c_dt >= 0;
  if (o.in_place) o.c_dt = d_dt;
  o.with_bias = with_bias;
  o.ld_d = N + pad;
  o.ld_c = o.in_place ? o.ld_d : N + (pad ? 3 : 0);
  if (o.c_dt >= 0) o.c = random_vals((size_t)(rows * o.ld_c), o.c_dt);
  if (with_bias) o.bias = random_vals((size_t)N, XTE_DTYPE_FP32);
}

typedef xte_status (*call_fn)(void *ctx, const xte_tensor *C, xte_tensor *D, const xte_tensor *bias,
                              xte_stream s);

/* The GPU kernels a case runs through (SIMT_GEMM_KERNEL of the runner's plugin): bit 0 the SIMT
 * kernel (stage 1), bit 1 the DMMA kernel (stage 2) with mma m8n8k4, bit 2 with mma m16n8k16,
 * bit 3 the int8 digit kernel (stage 3: e4m3 x e4m3 cases; a request for it with an e5m2 operand,
 * tried on every 8th such case, must run the SIMT kernel). With want_simt_for_dmma (the 128-lane
 * pass) an MMA request must run the SIMT kernel. */
static int kernel_mask = 15, want_simt_for_dmma;
/* --reduced (the sanitized builds: the OS-thread engine, where every emulated MMA waits at a warp
 * barrier): the MMA passes on every 4th case only */
static int thin_dmma;
static long (*plugin_launches)(int dmma); /* the plugin's simt_gemm_launches (0 .. 3) */
static const char *const KERNEL_ENV[4] = {"simt", "dmma", "dmma16", "imma"}; /* SIMT_GEMM_KERNEL */
static const char *const KERNEL_NAME[4] = {"SIMT", "DMMA m8n8k4", "DMMA m16n8k16",
                                           "IMMA m16n8k32 (int8 digits)"};

static int imma_cases; /* cases the int8 digit kernel ran */

/* e4m3: both operands are e4m3 (the int8 digit kernel applies) */
static void run_both(const std::string &desc, outs &o, call_fn fn, void *ctx, int e4m3) {
  buf d[2];
  xte_status st[2];
  std::string msg[2];
  const size_t nd = (size_t)(o.rows * o.ld_d) * esz(o.d_dt);
  long simt_launches = -1; /* the SIMT kernel's launches in this case (its pass runs first) */
  cases_run++;
  for (int pass = 0; pass < 5; pass++) {
    /* pass 0: the CPU (side 1); pass 1: the SIMT kernel, pass 2: the DMMA kernel with m8n8k4,
     * pass 3: with m16n8k16, pass 4: the int8 digit kernel (side 0) */
    const int side_ = pass == 0 ? 1 : 0, kern = pass - 1;
    if (pass > 0 && !(kernel_mask & (1 << kern))) continue;
    if (kern >= 1 && thin_dmma && !want_simt_for_dmma && cases_run % 4 != 0) continue;
    if (kern == 3 && !e4m3 && cases_run % 8 != 0) continue;
    if (pass > 0) setenv("SIMT_GEMM_KERNEL", KERNEL_ENV[kern], 1);
    long l[4];
    for (int q = 0; q < 4; q++) l[q] = plugin_launches(q);
    buf c = o.c;
    d[side_].assign(nd + 1, 0xCD);
    if (o.in_place) std::memcpy(d[side_].data(), c.data(), nd);
    xte_tensor D = xte_tensor_2d(d[side_].data(), (xte_dtype)o.d_dt, o.rows, o.N);
    D.ld = o.ld_d;
    xte_tensor C = D;
    if (o.c_dt >= 0 && !o.in_place) {
      C = xte_tensor_2d(c.data(), (xte_dtype)o.c_dt, o.rows, o.N);
      C.ld = o.ld_c;
    }
    xte_tensor B = xte_tensor_1d(o.bias.data(), XTE_DTYPE_FP32, o.N);
    st[side_] =
        fn(ctx, o.c_dt >= 0 ? &C : nullptr, &D, o.with_bias ? &B : nullptr, side_ ? cpu : gpu);
    msg[side_] = st[side_] == XTE_SUCCESS ? "" : xte_last_error();
    if (pass == 0) continue;
    const std::string kdesc = desc + " [" + KERNEL_NAME[kern] + " kernel]";
    /* which kernel ran: the requested one (the SIMT one for an MMA request on 128-lane warps
     * and for an int8 digit request with an e5m2 operand), as often as the SIMT pass launched
     * its kernel, and no other */
    long n[4];
    for (int q = 0; q < 4; q++) n[q] = plugin_launches(q) - l[q];
    const int ran = want_simt_for_dmma || (kern == 3 && !e4m3) ? 0 : kern;
    if (n[(ran + 1) % 4] != 0 || n[(ran + 2) % 4] != 0 || n[(ran + 3) % 4] != 0 ||
        (simt_launches >= 0 && n[ran] != simt_launches)) {
      char m[300];
      std::snprintf(m, sizeof m,
                    "launches: %ld SIMT, %ld DMMA m8n8k4, %ld DMMA m16n8k16, %ld IMMA (expected "
                    "%ld of the %s kernel)",
                    n[0], n[1], n[2], n[3], simt_launches, KERNEL_NAME[ran]);
      report(kdesc, m);
    }
    if (ran == 3) imma_cases++;
    if (kern == 0) simt_launches = n[0];
    if (st[0] != st[1] || msg[0] != msg[1]) {
      char m[600];
      std::snprintf(m, sizeof m, "status simt %d (%s), cpu %d (%s)", (int)st[0], msg[0].c_str(),
                    (int)st[1], msg[1].c_str());
      report(kdesc, m);
      continue;
    }
    if (st[0] != XTE_SUCCESS && kern == 0) {
      refused++;
      if (verbose) std::printf("refused alike: %s: %s\n", desc.c_str(), msg[0].c_str());
    }
    if (std::memcmp(d[0].data(), d[1].data(), nd + 1) != 0) {
      size_t i = 0, diff = 0;
      while (d[0][i] == d[1][i]) i++;
      for (size_t j = 0; j <= nd; j++) diff += d[0][j] != d[1][j];
      const size_t e = esz(o.d_dt), el = i / e;
      char m[300];
      std::snprintf(m, sizeof m,
                    "D: %zu of %zu bytes differ, first in element (%lld, %lld) byte %zu: simt "
                    "0x%02x, cpu 0x%02x%s",
                    diff, nd, (long long)(el / (size_t)o.ld_d), (long long)(el % (size_t)o.ld_d),
                    i % e, d[0][i], d[1][i], st[0] != XTE_SUCCESS ? " (refused call wrote)" : "");
      report(kdesc, m);
    }
  }
}

/* ---------------------------------------------------------------- dense */

struct dense_ctx {
  xte_qtensor *a, *b;
  xte_gemm_config cfg;
};

/* The config a side runs: the SIMT plugin's FAST runs its exact kernels (or, for cuBLASLt's path,
 * the exact partials into fp32 then xte's bias epilogue), so its reference is the CPU's EXACT; the
 * CPU's own FAST (fp32 partials, src/cpu/gemm_fast.c) is bounded, not these bytes, and is tested
 * against fp64 by tests/test_gemm_fast*.c. */
static xte_gemm_config side_cfg(xte_gemm_config cfg, const xte_tensor *bias, xte_stream s) {
  cfg.bias = bias;
  if (s == cpu) cfg.mode = XTE_GEMM_EXACT;
  return cfg;
}

static xte_status dense_call(void *v, const xte_tensor *C, xte_tensor *D, const xte_tensor *bias,
                             xte_stream s) {
  dense_ctx *c = (dense_ctx *)v;
  const xte_gemm_config cfg = side_cfg(c->cfg, bias, s);
  return xte_gemm(c->a, c->b, C, D, &cfg, s);
}

static void dense_case(int pi, xte_dtype da, xte_dtype db, int ta, int tb, int64_t M, int64_t N,
                       int64_t K, int li, int how, int n) {
  const side sa = PAIRS[pi][0], sb = PAIRS[pi][1];
  xte_scale_layout lya[3], lyb[3];
  const int nla = layouts_for(sa.recipe, lya), nlb = layouts_for(sb.recipe, lyb);
  qop qa, qb;
  if (!make_q(qa, ta ? K : M, ta ? M : K, sa, lya[li % nla], da, how, n % 5 == 0) ||
      !make_q(qb, tb ? K : N, tb ? N : K, sb, lyb[li % nlb], db, how, n % 7 == 0))
    return;
  dense_ctx c;
  c.a = &qa.t.q;
  c.b = &qb.t.q;
  c.cfg = xte_gemm_config_default();
  c.cfg.trans_a = ta;
  c.cfg.trans_b = tb;
  c.cfg.mode = n % 4 == 3 ? XTE_GEMM_FAST : XTE_GEMM_EXACT;
  const int c_dt = n % 3 == 0 ? -1 : (n % 3 == 1 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16);
  c.cfg.accumulate = c_dt >= 0;
  outs o;
  setup_outs(o, M, N, n % 2 ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, c_dt, n % 5 == 1, n % 3 != 1,
             n % 4 == 1 ? 5 : 0);
  char d[300];
  std::snprintf(d, sizeof d,
                "dense pair %d dt %d/%d trans %d/%d M %lld N %lld K %lld layout %d codes %d C %d%s "
                "bias %d D %d %s",
                pi, (int)da, (int)db, ta, tb, (long long)M, (long long)N, (long long)K, li, how,
                c_dt, o.in_place ? " in place" : "", o.with_bias, o.d_dt,
                c.cfg.mode == XTE_GEMM_FAST ? "FAST" : "EXACT");
  run_both(d, o, dense_call, &c, da == XTE_DTYPE_E4M3 && db == XTE_DTYPE_E4M3);
}

/* FAST with a bias on cuBLASLt's path (the stand-in: shapes, layouts and alignment xte_lt_plan
 * takes): cuBLASLt's fp32 result, then the bias added by xte_gemm_bias_epilogue, into D itself
 * (fp32 D) or from the fp32 workspace slice (bf16 D). The bias (NaN, inf, subnormals among its
 * values) is the contract's fp32 bias: the bytes must be the CPU's. */
static void fast_bias_cases() {
  static const int64_t shapes[][3] = {{16, 64, 256}, {8, 136, 128}, {72, 8, 400}};
  int n = 0;
  for (int pi = 0; pi < 3; pi += 2) /* 1x128 x 128x128, 1x128 x 1x128 */
    for (int si = 0; si < 3; si++)
      for (int dd = 0; dd < 2; dd++) {
        const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        qop qa, qb;
        xte_scale_layout lya[3], lyb[3];
        layouts_for(PAIRS[pi][0].recipe, lya);
        layouts_for(PAIRS[pi][1].recipe, lyb);
        n++;
        if (!make_q(qa, M, K, PAIRS[pi][0], lya[0], XTE_DTYPE_E4M3, n % 4, 0) ||
            !make_q(qb, N, K, PAIRS[pi][1], lyb[0], XTE_DTYPE_E4M3, (n + 1) % 4, 0))
          continue;
        dense_ctx c;
        c.a = &qa.t.q;
        c.b = &qb.t.q;
        c.cfg = xte_gemm_config_default();
        c.cfg.mode = XTE_GEMM_FAST;
        outs o;
        setup_outs(o, M, N, dd ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, -1, 0, 1, 0);
        char d[200];
        std::snprintf(d, sizeof d, "FAST bias (cuBLASLt path) pair %d M %lld N %lld K %lld D %d",
                      pi, (long long)M, (long long)N, (long long)K, o.d_dt);
        run_both(d, o, dense_call, &c, true);
      }
}

static void dense_cases() {
  static const int64_t shapes[][3] = {{1, 1, 1},     {7, 9, 130},    {65, 67, 300},
                                      {64, 64, 128}, {130, 70, 257}, {3, 100, 33},
                                      {33, 5, 0},    {1, 130, 512},  {80, 1, 200}};
  static const xte_dtype dts[][2] = {{XTE_DTYPE_E4M3, XTE_DTYPE_E4M3},
                                     {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2},
                                     {XTE_DTYPE_E5M2, XTE_DTYPE_E4M3},
                                     {XTE_DTYPE_E5M2, XTE_DTYPE_E5M2}};
  int n = 0;
  for (int pi = 0; pi < NPAIRS; pi++)
    for (int di = 0; di < 4; di++)
      for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
          for (int si = 0; si < 9; si++) {
            n++;
            if (di == 3 && si > 1) continue; /* refused: two shapes are enough */
            if (reduced && n % 5 != 0 && si != 1) continue;
            dense_case(pi, dts[di][0], dts[di][1], ta, tb, shapes[si][0], shapes[si][1],
                       shapes[si][2], n, n % 4, n);
          }
}

/* The single rounding of the e5m2 class sums (the split): per block, sum = 2^29 (+ 2^6) + 2^5
 * +- 2^-25 (+ tiny terms), an fp32 midpoint plus a term 54 bits below it, which a plain fp64 sum
 * of the two classes would lose (and then round the tie to even). Raw per-tensor operands, scale
 * 1; swap: the e5m2 operand is A. Two K blocks, the second a ragged one of random codes. */
static void tie_case(int swap, int64_t M, int64_t N, int n) {
  const int64_t K = 128 + 40;
  buf e4((size_t)(M * K)), e5((size_t)(N * K));
  float one[1] = {1.0f}, one2[1] = {1.0f};
  for (int64_t m = 0; m < M; m++) {
    uint8_t *a = &e4[(size_t)(m * K)];
    for (int i = 0; i < 64; i++) a[i] = 0x78; /* 256 */
    a[64] = 0x68;                             /* 64 */
    a[65] = 0x60;                             /* 32 */
    a[66] = (m & 1) ? 0x81 : 0x01;            /* +-2^-9 */
    for (int64_t i = 67; i < K; i++) a[i] = (uint8_t)(rnd() % 4 ? 0 : rnd() % 0x7E);
  }
  for (int64_t c = 0; c < N; c++) {
    uint8_t *b = &e5[(size_t)(c * K)];
    for (int i = 0; i < 64; i++) b[i] = 0x78; /* 32768 */
    b[64] = (c & 2) ? 0x3C : 0x00;            /* 1 or 0 */
    b[65] = 0x3C;                             /* 1 */
    b[66] = (c & 1) ? 0x81 : 0x01;            /* -+2^-16 */
    for (int64_t i = 67; i < 128; i++) b[i] = 0;
    if (c >= 4) b[67 + c % 60] = (uint8_t)(c % 2 ? 0x81 : 0x02); /* more tiny terms */
    for (int64_t i = 128; i < K; i++) b[i] = (uint8_t)(rnd() % 0x7B);
  }
  xte_qtensor q4, q5;
  std::memset(&q4, 0, sizeof q4);
  q4.scaling_mode = XTE_SCALING_PER_TENSOR;
  q4.recipe = XTE_RECIPE_TE_DELAYED;
  q4.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  q4.rowwise_scale_inv.rows = q4.rowwise_scale_inv.cols = 1;
  q4.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  q5 = q4;
  q4.rowwise = xte_tensor_2d(e4.data(), XTE_DTYPE_E4M3, M, K);
  q4.rowwise_scale_inv.data = one;
  q5.rowwise = xte_tensor_2d(e5.data(), XTE_DTYPE_E5M2, N, K);
  q5.rowwise_scale_inv.data = one2;
  dense_ctx c;
  c.a = swap ? &q5 : &q4;
  c.b = swap ? &q4 : &q5;
  c.cfg = xte_gemm_config_default();
  outs o;
  setup_outs(o, swap ? N : M, swap ? M : N, XTE_DTYPE_FP32, -1, 0, 0, 0);
  char d[120];
  std::snprintf(d, sizeof d, "split ties %s M %lld N %lld #%d",
                swap ? "e5m2 x e4m3" : "e4m3 x e5m2", (long long)o.rows, (long long)o.N, n);
  run_both(d, o, dense_call, &c, 0);
}

static void tie_cases() {
  int n = 0;
  for (int swap = 0; swap < 2; swap++)
    for (int64_t mn : {1, 9, 70}) tie_case(swap, mn, 64 + mn, n++);
}

/* ---------------------------------------------------------------- grouped */

struct grouped_ctx {
  xte_qtensor *a, *b;
  xte_gemm_config cfg;
  xte_gemm_groups gr;
};

static xte_status grouped_call(void *v, const xte_tensor *C, xte_tensor *D, const xte_tensor *bias,
                               xte_stream s) {
  grouped_ctx *c = (grouped_ctx *)v;
  const xte_gemm_config cfg = side_cfg(c->cfg, bias, s);
  return xte_gemm_grouped(c->a, c->b, C, D, &c->gr, &cfg, s);
}

static void fill_cfg(grouped_ctx &c, outs &o, int n, int64_t rows, int64_t N) {
  c.cfg.mode = n % 4 == 3 ? XTE_GEMM_FAST : XTE_GEMM_EXACT;
  const int c_dt = n % 3 == 0 ? -1 : (n % 3 == 1 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16);
  c.cfg.accumulate = c_dt >= 0;
  setup_outs(o, rows, N, n % 2 ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, c_dt, n % 5 == 1, n % 3 != 2,
             n % 4 == 2 ? 3 : 0);
}

static const side GPAIRS[][2] = {{S1_TE, SQ_TE}, {S1_DG, SQ_DG},  {S1_TE, S1_MT},
                                 {SQ_DG, S1_DG}, {MX_TE, MX_OCP}, {PT, PT}};

static void contiguous_case(int pi, int G, int64_t N, int64_t K, int64_t align, int tb, int e5,
                            int n) {
  const side sa = GPAIRS[pi][0], sb = GPAIRS[pi][1];
  const int kb = sa.mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  if (tb && G > 1 && K % kb) K = (K + kb - 1) / kb * kb;
  std::vector<int64_t> sizes((size_t)G);
  int64_t rows = 0;
  const int64_t al = align > 1 ? align : 1;
  for (int g = 0; g < G; g++) {
    const uint64_t r = rnd() % 6;
    sizes[(size_t)g] = r == 0 ? 0 : (r == 1 ? 1 : (int64_t)(rnd() % 90));
    rows += (sizes[(size_t)g] + al - 1) / al * al;
  }
  xte_scale_layout lya[3], lyb[3];
  layouts_for(sa.recipe, lya);
  layouts_for(sb.recipe, lyb);
  qop qa, qb;
  const xte_dtype da = e5 == 1 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
  const xte_dtype db = e5 == 2 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
  if (!make_q(qa, rows, K, sa, lya[0], da, n % 4, 0) ||
      !make_q(qb, tb ? (int64_t)G * K : (int64_t)G * N, tb ? N : K, sb, lyb[n % 2], db, n % 4, 0))
    return;
  grouped_ctx c;
  c.a = &qa.t.q;
  c.b = &qb.t.q;
  c.cfg = xte_gemm_config_default();
  c.cfg.trans_b = tb;
  std::memset(&c.gr, 0, sizeof c.gr);
  c.gr.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
  c.gr.num_groups = G;
  c.gr.group_sizes = sizes.data();
  c.gr.alignment = align;
  outs o;
  fill_cfg(c, o, n, rows, N);
  char d[200];
  std::snprintf(d, sizeof d,
                "contiguous pair %d G %d N %lld K %lld align %lld trans_b %d e5 %d #%d", pi, G,
                (long long)N, (long long)K, (long long)align, tb, e5, n);
  run_both(d, o, grouped_call, &c, da == XTE_DTYPE_E4M3 && db == XTE_DTYPE_E4M3);
}

static void masked_case(int pi, int G, int64_t m_max, int64_t N, int64_t K, int tb, int bad,
                        int n) {
  const side sa = GPAIRS[pi][0], sb = GPAIRS[pi][1];
  const int kb = sa.mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  if (tb && G > 1 && K % kb) K = (K + kb - 1) / kb * kb;
  std::vector<int32_t> mm((size_t)G);
  for (int g = 0; g < G; g++) {
    const uint64_t r = rnd() % 4;
    mm[(size_t)g] = r == 0 ? 0 : (r == 1 ? (int32_t)m_max : (int32_t)(rnd() % (m_max + 1)));
  }
  if (bad) mm[(size_t)(rnd() % (uint64_t)G)] = bad > 0 ? (int32_t)m_max + 1 : -1;
  xte_scale_layout lya[3], lyb[3];
  layouts_for(sa.recipe, lya);
  layouts_for(sb.recipe, lyb);
  qop qa, qb;
  if (!make_q(qa, G * m_max, K, sa, lya[n % 2], XTE_DTYPE_E4M3, n % 4, 0) ||
      !make_q(qb, tb ? (int64_t)G * K : (int64_t)G * N, tb ? N : K, sb, lyb[0],
              n % 3 == 0 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3, n % 4, 0))
    return;
  xte_tensor mt = xte_tensor_1d(mm.data(), XTE_DTYPE_INT32, G);
  grouped_ctx c;
  c.a = &qa.t.q;
  c.b = &qb.t.q;
  c.cfg = xte_gemm_config_default();
  c.cfg.trans_b = tb;
  std::memset(&c.gr, 0, sizeof c.gr);
  c.gr.kind = XTE_GEMM_GROUPED_MASKED;
  c.gr.num_groups = G;
  c.gr.masked_m = &mt;
  outs o;
  fill_cfg(c, o, n, G * m_max, N);
  char d[200];
  std::snprintf(d, sizeof d, "masked pair %d G %d m_max %lld N %lld K %lld trans_b %d bad %d #%d",
                pi, G, (long long)m_max, (long long)N, (long long)K, tb, bad, n);
  run_both(d, o, grouped_call, &c, n % 3 != 0);
}

static void kgrouped_case(int pi, int G, int64_t M, int64_t N, int ta, int tb, int n) {
  const side sa = GPAIRS[pi][0], sb = GPAIRS[pi][1];
  const int kb = sa.mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  std::vector<int64_t> sizes((size_t)G);
  int64_t K = 0;
  for (int g = 0; g < G; g++) {
    const uint64_t r = rnd() % 5;
    sizes[(size_t)g] = r == 0 ? 0 : (int64_t)(1 + rnd() % 3) * kb;
    if (g == G - 1 && r == 4) sizes[(size_t)g] = 1 + (int64_t)(rnd() % (uint64_t)(2 * kb));
    K += sizes[(size_t)g];
  }
  xte_scale_layout lya[3], lyb[3];
  layouts_for(sa.recipe, lya);
  layouts_for(sb.recipe, lyb);
  qop qa, qb;
  if (!make_q(qa, ta ? K : M, ta ? M : K, sa, lya[0], n % 3 == 1 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3,
              n % 4, 0) ||
      !make_q(qb, tb ? K : N, tb ? N : K, sb, lyb[n % 2], XTE_DTYPE_E4M3, n % 4, 0))
    return;
  grouped_ctx c;
  c.a = &qa.t.q;
  c.b = &qb.t.q;
  c.cfg = xte_gemm_config_default();
  c.cfg.trans_a = ta;
  c.cfg.trans_b = tb;
  std::memset(&c.gr, 0, sizeof c.gr);
  c.gr.kind = XTE_GEMM_GROUPED_K;
  c.gr.num_groups = G;
  c.gr.group_sizes = sizes.data();
  outs o;
  fill_cfg(c, o, n, (int64_t)G * M, N);
  char d[200];
  std::snprintf(d, sizeof d, "k-grouped pair %d G %d M %lld N %lld K %lld trans %d/%d #%d", pi, G,
                (long long)M, (long long)N, (long long)K, ta, tb, n);
  run_both(d, o, grouped_call, &c, n % 3 != 1);
}

static void grouped_cases() {
  int n = 0;
  for (int pi = 0; pi < 6; pi++)
    for (int G : {1, 3, 5})
      for (int tb = 0; tb < 2; tb++) {
        n++;
        if (reduced && n % 2) continue;
        static const int64_t aligns[4] = {0, 1, 8, 32};
        contiguous_case(pi, G, 1 + (int64_t)(rnd() % 80), 1 + (int64_t)(rnd() % 300), aligns[n % 4],
                        tb, n % 3, n);
        masked_case(pi, G, 1 + (int64_t)(rnd() % 70), 1 + (int64_t)(rnd() % 70),
                    1 + (int64_t)(rnd() % 260), tb, n % 5 == 0 ? (n % 2 ? 1 : -1) : 0, n);
        for (int ta = 0; ta < 2; ta++)
          if (!reduced || (n + ta) % 2)
            kgrouped_case(pi, G, 1 + (int64_t)(rnd() % 70), 1 + (int64_t)(rnd() % 70), ta, tb, n);
      }
}

/* ---------------------------------------------------------------- the DMMA wrapper itself */

/* The fragment layout of mma.m8n8k4 .f64 (PTX ISA 9.x, section 9.7.14.5.2 "Matrix Fragments for
 * mma.m8n8k4 with .f64 floating point type"), written out per lane from its formulas:
 * A: row = %laneid >> 2, col = %laneid % 4; B: row = %laneid % 4, col = %laneid >> 2;
 * C / D: row = groupID, col = threadID_in_group * 2 + i for ci (i = 0, 1). */
static const int DMMA_A_POS[32][2] = {
    {0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}, {1, 2}, {1, 3}, {2, 0}, {2, 1}, {2, 2},
    {2, 3}, {3, 0}, {3, 1}, {3, 2}, {3, 3}, {4, 0}, {4, 1}, {4, 2}, {4, 3}, {5, 0}, {5, 1},
    {5, 2}, {5, 3}, {6, 0}, {6, 1}, {6, 2}, {6, 3}, {7, 0}, {7, 1}, {7, 2}, {7, 3}};
static const int DMMA_B_POS[32][2] = {
    {0, 0}, {1, 0}, {2, 0}, {3, 0}, {0, 1}, {1, 1}, {2, 1}, {3, 1}, {0, 2}, {1, 2}, {2, 2},
    {3, 2}, {0, 3}, {1, 3}, {2, 3}, {3, 3}, {0, 4}, {1, 4}, {2, 4}, {3, 4}, {0, 5}, {1, 5},
    {2, 5}, {3, 5}, {0, 6}, {1, 6}, {2, 6}, {3, 6}, {0, 7}, {1, 7}, {2, 7}, {3, 7}};
/* c0; c1 is the next column */
static const int DMMA_C_POS[32][2] = {
    {0, 0}, {0, 2}, {0, 4}, {0, 6}, {1, 0}, {1, 2}, {1, 4}, {1, 6}, {2, 0}, {2, 2}, {2, 4},
    {2, 6}, {3, 0}, {3, 2}, {3, 4}, {3, 6}, {4, 0}, {4, 2}, {4, 4}, {4, 6}, {5, 0}, {5, 2},
    {5, 4}, {5, 6}, {6, 0}, {6, 2}, {6, 4}, {6, 6}, {7, 0}, {7, 2}, {7, 4}, {7, 6}};

static double uA[8][4], uB[4][8], uC[8][8], uD[8][8];

/* one warp: each lane loads its fragments by the table, one MMA (in place: d is c), stores D */
static void dmma_unit_kernel(int in_place) {
  const int l = (int)threadIdx.x;
  const double a = uA[DMMA_A_POS[l][0]][DMMA_A_POS[l][1]];
  const double b = uB[DMMA_B_POS[l][0]][DMMA_B_POS[l][1]];
  double c[2] = {uC[DMMA_C_POS[l][0]][DMMA_C_POS[l][1]],
                 uC[DMMA_C_POS[l][0]][DMMA_C_POS[l][1] + 1]};
  double d[2] = {-1.0, -1.0};
  xte_dmma_m8n8k4(in_place ? c : d, a, b, c);
  const double *r = in_place ? c : d;
  uD[DMMA_C_POS[l][0]][DMMA_C_POS[l][1]] = r[0];
  uD[DMMA_C_POS[l][0]][DMMA_C_POS[l][1] + 1] = r[1];
}

/* D = C + A B of random small integers (every product and sum exact, so the order of the
 * instruction's sum does not matter), against a plain triple loop; twice in a row (the
 * emulation's double buffer) and in place. */
static void dmma_unit() {
  int bad = 0;
  for (int rep = 0; rep < 6; rep++) {
    for (int i = 0; i < 8; i++)
      for (int k = 0; k < 4; k++) uA[i][k] = (double)((int)(rnd() % 61) - 30);
    for (int k = 0; k < 4; k++)
      for (int j = 0; j < 8; j++) uB[k][j] = (double)((int)(rnd() % 61) - 30) * 64.0;
    for (int i = 0; i < 8; i++)
      for (int j = 0; j < 8; j++) {
        uC[i][j] = (double)((int)(rnd() % 1001) - 500) / 8.0;
        uD[i][j] = -12345.0;
      }
    if (simt::launch(dim3(1), dim3(32), 0, dmma_unit_kernel, rep % 2) != simt::ok) {
      report("dmma unit", "launch refused");
      return;
    }
    for (int i = 0; i < 8; i++)
      for (int j = 0; j < 8; j++) {
        double e = uC[i][j];
        for (int k = 0; k < 4; k++) e += uA[i][k] * uB[k][j];
        if (uD[i][j] != e && bad++ < 4) {
          char m[200];
          std::snprintf(m, sizeof m, "rep %d: D[%d][%d] = %g, expected %g", rep, i, j, uD[i][j], e);
          report("dmma unit (xte_dmma_m8n8k4 against the documented layout)", m);
        }
      }
  }
  cases_run++;
}

/* The fragment layouts of mma.m16n8k16 .f64 (PTX ISA 9.x, section 9.7.14.5.8 "Matrix Fragments for
 * mma.m16n8k16 with floating point type", Figures 80, 82, 83), written out per lane {row, col}
 * from its formulas (g = %laneid >> 2, t = %laneid % 4):
 * A, ai: row = g for i even, g + 8 for i odd; col = i * 2 + t for i even, i * 2 - 2 + t for i odd;
 * B, bi: row = t + 4 i, col = g;
 * C / D, ci: row = g for i < 2, g + 8 for i >= 2; col = t * 2 + (i & 1). */
static const int DMMA16_A_POS[32][8][2] = {
    {{0, 0}, {8, 0}, {0, 4}, {8, 4}, {0, 8}, {8, 8}, {0, 12}, {8, 12}},       /* lane 0 */
    {{0, 1}, {8, 1}, {0, 5}, {8, 5}, {0, 9}, {8, 9}, {0, 13}, {8, 13}},       /* lane 1 */
    {{0, 2}, {8, 2}, {0, 6}, {8, 6}, {0, 10}, {8, 10}, {0, 14}, {8, 14}},     /* lane 2 */
    {{0, 3}, {8, 3}, {0, 7}, {8, 7}, {0, 11}, {8, 11}, {0, 15}, {8, 15}},     /* lane 3 */
    {{1, 0}, {9, 0}, {1, 4}, {9, 4}, {1, 8}, {9, 8}, {1, 12}, {9, 12}},       /* lane 4 */
    {{1, 1}, {9, 1}, {1, 5}, {9, 5}, {1, 9}, {9, 9}, {1, 13}, {9, 13}},       /* lane 5 */
    {{1, 2}, {9, 2}, {1, 6}, {9, 6}, {1, 10}, {9, 10}, {1, 14}, {9, 14}},     /* lane 6 */
    {{1, 3}, {9, 3}, {1, 7}, {9, 7}, {1, 11}, {9, 11}, {1, 15}, {9, 15}},     /* lane 7 */
    {{2, 0}, {10, 0}, {2, 4}, {10, 4}, {2, 8}, {10, 8}, {2, 12}, {10, 12}},   /* lane 8 */
    {{2, 1}, {10, 1}, {2, 5}, {10, 5}, {2, 9}, {10, 9}, {2, 13}, {10, 13}},   /* lane 9 */
    {{2, 2}, {10, 2}, {2, 6}, {10, 6}, {2, 10}, {10, 10}, {2, 14}, {10, 14}}, /* lane 10 */
    {{2, 3}, {10, 3}, {2, 7}, {10, 7}, {2, 11}, {10, 11}, {2, 15}, {10, 15}}, /* lane 11 */
    {{3, 0}, {11, 0}, {3, 4}, {11, 4}, {3, 8}, {11, 8}, {3, 12}, {11, 12}},   /* lane 12 */
    {{3, 1}, {11, 1}, {3, 5}, {11, 5}, {3, 9}, {11, 9}, {3, 13}, {11, 13}},   /* lane 13 */
    {{3, 2}, {11, 2}, {3, 6}, {11, 6}, {3, 10}, {11, 10}, {3, 14}, {11, 14}}, /* lane 14 */
    {{3, 3}, {11, 3}, {3, 7}, {11, 7}, {3, 11}, {11, 11}, {3, 15}, {11, 15}}, /* lane 15 */
    {{4, 0}, {12, 0}, {4, 4}, {12, 4}, {4, 8}, {12, 8}, {4, 12}, {12, 12}},   /* lane 16 */
    {{4, 1}, {12, 1}, {4, 5}, {12, 5}, {4, 9}, {12, 9}, {4, 13}, {12, 13}},   /* lane 17 */
    {{4, 2}, {12, 2}, {4, 6}, {12, 6}, {4, 10}, {12, 10}, {4, 14}, {12, 14}}, /* lane 18 */
    {{4, 3}, {12, 3}, {4, 7}, {12, 7}, {4, 11}, {12, 11}, {4, 15}, {12, 15}}, /* lane 19 */
    {{5, 0}, {13, 0}, {5, 4}, {13, 4}, {5, 8}, {13, 8}, {5, 12}, {13, 12}},   /* lane 20 */
    {{5, 1}, {13, 1}, {5, 5}, {13, 5}, {5, 9}, {13, 9}, {5, 13}, {13, 13}},   /* lane 21 */
    {{5, 2}, {13, 2}, {5, 6}, {13, 6}, {5, 10}, {13, 10}, {5, 14}, {13, 14}}, /* lane 22 */
    {{5, 3}, {13, 3}, {5, 7}, {13, 7}, {5, 11}, {13, 11}, {5, 15}, {13, 15}}, /* lane 23 */
    {{6, 0}, {14, 0}, {6, 4}, {14, 4}, {6, 8}, {14, 8}, {6, 12}, {14, 12}},   /* lane 24 */
    {{6, 1}, {14, 1}, {6, 5}, {14, 5}, {6, 9}, {14, 9}, {6, 13}, {14, 13}},   /* lane 25 */
    {{6, 2}, {14, 2}, {6, 6}, {14, 6}, {6, 10}, {14, 10}, {6, 14}, {14, 14}}, /* lane 26 */
    {{6, 3}, {14, 3}, {6, 7}, {14, 7}, {6, 11}, {14, 11}, {6, 15}, {14, 15}}, /* lane 27 */
    {{7, 0}, {15, 0}, {7, 4}, {15, 4}, {7, 8}, {15, 8}, {7, 12}, {15, 12}},   /* lane 28 */
    {{7, 1}, {15, 1}, {7, 5}, {15, 5}, {7, 9}, {15, 9}, {7, 13}, {15, 13}},   /* lane 29 */
    {{7, 2}, {15, 2}, {7, 6}, {15, 6}, {7, 10}, {15, 10}, {7, 14}, {15, 14}}, /* lane 30 */
    {{7, 3}, {15, 3}, {7, 7}, {15, 7}, {7, 11}, {15, 11}, {7, 15}, {15, 15}}, /* lane 31 */
};
static const int DMMA16_B_POS[32][4][2] = {
    {{0, 0}, {4, 0}, {8, 0}, {12, 0}},  /* lane 0 */
    {{1, 0}, {5, 0}, {9, 0}, {13, 0}},  /* lane 1 */
    {{2, 0}, {6, 0}, {10, 0}, {14, 0}}, /* lane 2 */
    {{3, 0}, {7, 0}, {11, 0}, {15, 0}}, /* lane 3 */
    {{0, 1}, {4, 1}, {8, 1}, {12, 1}},  /* lane 4 */
    {{1, 1}, {5, 1}, {9, 1}, {13, 1}},  /* lane 5 */
    {{2, 1}, {6, 1}, {10, 1}, {14, 1}}, /* lane 6 */
    {{3, 1}, {7, 1}, {11, 1}, {15, 1}}, /* lane 7 */
    {{0, 2}, {4, 2}, {8, 2}, {12, 2}},  /* lane 8 */
    {{1, 2}, {5, 2}, {9, 2}, {13, 2}},  /* lane 9 */
    {{2, 2}, {6, 2}, {10, 2}, {14, 2}}, /* lane 10 */
    {{3, 2}, {7, 2}, {11, 2}, {15, 2}}, /* lane 11 */
    {{0, 3}, {4, 3}, {8, 3}, {12, 3}},  /* lane 12 */
    {{1, 3}, {5, 3}, {9, 3}, {13, 3}},  /* lane 13 */
    {{2, 3}, {6, 3}, {10, 3}, {14, 3}}, /* lane 14 */
    {{3, 3}, {7, 3}, {11, 3}, {15, 3}}, /* lane 15 */
    {{0, 4}, {4, 4}, {8, 4}, {12, 4}},  /* lane 16 */
    {{1, 4}, {5, 4}, {9, 4}, {13, 4}},  /* lane 17 */
    {{2, 4}, {6, 4}, {10, 4}, {14, 4}}, /* lane 18 */
    {{3, 4}, {7, 4}, {11, 4}, {15, 4}}, /* lane 19 */
    {{0, 5}, {4, 5}, {8, 5}, {12, 5}},  /* lane 20 */
    {{1, 5}, {5, 5}, {9, 5}, {13, 5}},  /* lane 21 */
    {{2, 5}, {6, 5}, {10, 5}, {14, 5}}, /* lane 22 */
    {{3, 5}, {7, 5}, {11, 5}, {15, 5}}, /* lane 23 */
    {{0, 6}, {4, 6}, {8, 6}, {12, 6}},  /* lane 24 */
    {{1, 6}, {5, 6}, {9, 6}, {13, 6}},  /* lane 25 */
    {{2, 6}, {6, 6}, {10, 6}, {14, 6}}, /* lane 26 */
    {{3, 6}, {7, 6}, {11, 6}, {15, 6}}, /* lane 27 */
    {{0, 7}, {4, 7}, {8, 7}, {12, 7}},  /* lane 28 */
    {{1, 7}, {5, 7}, {9, 7}, {13, 7}},  /* lane 29 */
    {{2, 7}, {6, 7}, {10, 7}, {14, 7}}, /* lane 30 */
    {{3, 7}, {7, 7}, {11, 7}, {15, 7}}, /* lane 31 */
};
static const int DMMA16_C_POS[32][4][2] = {
    {{0, 0}, {0, 1}, {8, 0}, {8, 1}},   /* lane 0 */
    {{0, 2}, {0, 3}, {8, 2}, {8, 3}},   /* lane 1 */
    {{0, 4}, {0, 5}, {8, 4}, {8, 5}},   /* lane 2 */
    {{0, 6}, {0, 7}, {8, 6}, {8, 7}},   /* lane 3 */
    {{1, 0}, {1, 1}, {9, 0}, {9, 1}},   /* lane 4 */
    {{1, 2}, {1, 3}, {9, 2}, {9, 3}},   /* lane 5 */
    {{1, 4}, {1, 5}, {9, 4}, {9, 5}},   /* lane 6 */
    {{1, 6}, {1, 7}, {9, 6}, {9, 7}},   /* lane 7 */
    {{2, 0}, {2, 1}, {10, 0}, {10, 1}}, /* lane 8 */
    {{2, 2}, {2, 3}, {10, 2}, {10, 3}}, /* lane 9 */
    {{2, 4}, {2, 5}, {10, 4}, {10, 5}}, /* lane 10 */
    {{2, 6}, {2, 7}, {10, 6}, {10, 7}}, /* lane 11 */
    {{3, 0}, {3, 1}, {11, 0}, {11, 1}}, /* lane 12 */
    {{3, 2}, {3, 3}, {11, 2}, {11, 3}}, /* lane 13 */
    {{3, 4}, {3, 5}, {11, 4}, {11, 5}}, /* lane 14 */
    {{3, 6}, {3, 7}, {11, 6}, {11, 7}}, /* lane 15 */
    {{4, 0}, {4, 1}, {12, 0}, {12, 1}}, /* lane 16 */
    {{4, 2}, {4, 3}, {12, 2}, {12, 3}}, /* lane 17 */
    {{4, 4}, {4, 5}, {12, 4}, {12, 5}}, /* lane 18 */
    {{4, 6}, {4, 7}, {12, 6}, {12, 7}}, /* lane 19 */
    {{5, 0}, {5, 1}, {13, 0}, {13, 1}}, /* lane 20 */
    {{5, 2}, {5, 3}, {13, 2}, {13, 3}}, /* lane 21 */
    {{5, 4}, {5, 5}, {13, 4}, {13, 5}}, /* lane 22 */
    {{5, 6}, {5, 7}, {13, 6}, {13, 7}}, /* lane 23 */
    {{6, 0}, {6, 1}, {14, 0}, {14, 1}}, /* lane 24 */
    {{6, 2}, {6, 3}, {14, 2}, {14, 3}}, /* lane 25 */
    {{6, 4}, {6, 5}, {14, 4}, {14, 5}}, /* lane 26 */
    {{6, 6}, {6, 7}, {14, 6}, {14, 7}}, /* lane 27 */
    {{7, 0}, {7, 1}, {15, 0}, {15, 1}}, /* lane 28 */
    {{7, 2}, {7, 3}, {15, 2}, {15, 3}}, /* lane 29 */
    {{7, 4}, {7, 5}, {15, 4}, {15, 5}}, /* lane 30 */
    {{7, 6}, {7, 7}, {15, 6}, {15, 7}}, /* lane 31 */
};

static double vA[16][16], vB[16][8], vC[16][8], vD[16][8];

/* one warp: each lane loads its fragments by the tables, one MMA (in place: d is c), stores D */
static void dmma16_unit_kernel(int in_place) {
  const int l = (int)threadIdx.x;
  double a[8], b[4], c[4], d[4] = {-1.0, -1.0, -1.0, -1.0};
  for (int i = 0; i < 8; i++) a[i] = vA[DMMA16_A_POS[l][i][0]][DMMA16_A_POS[l][i][1]];
  for (int i = 0; i < 4; i++) b[i] = vB[DMMA16_B_POS[l][i][0]][DMMA16_B_POS[l][i][1]];
  for (int i = 0; i < 4; i++) c[i] = vC[DMMA16_C_POS[l][i][0]][DMMA16_C_POS[l][i][1]];
  xte_dmma_m16n8k16(in_place ? c : d, a, b, c);
  const double *r = in_place ? c : d;
  for (int i = 0; i < 4; i++) vD[DMMA16_C_POS[l][i][0]][DMMA16_C_POS[l][i][1]] = r[i];
}

/* xte_dmma_m16n8k16 as dmma_unit: D = C + A B of random small integers (every product and sum
 * exact) against a plain triple loop, six times (the double buffer; in place every other time);
 * first the tables themselves: each covers its matrix exactly once. */
static void dmma16_unit() {
  int bad = 0;
  {
    int seen_a[16][16] = {}, seen_b[16][8] = {}, seen_c[16][8] = {};
    for (int l = 0; l < 32; l++) {
      for (int i = 0; i < 8; i++) seen_a[DMMA16_A_POS[l][i][0]][DMMA16_A_POS[l][i][1]]++;
      for (int i = 0; i < 4; i++) seen_b[DMMA16_B_POS[l][i][0]][DMMA16_B_POS[l][i][1]]++;
      for (int i = 0; i < 4; i++) seen_c[DMMA16_C_POS[l][i][0]][DMMA16_C_POS[l][i][1]]++;
    }
    for (int r = 0; r < 16; r++)
      for (int c = 0; c < 16; c++)
        if (seen_a[r][c] != 1 || (c < 8 && (seen_b[r][c] != 1 || seen_c[r][c] != 1))) bad++;
    if (bad) report("dmma16 unit", "a lane table does not cover its matrix exactly once");
  }
  for (int rep = 0; rep < 6 && !bad; rep++) {
    for (int i = 0; i < 16; i++)
      for (int k = 0; k < 16; k++) vA[i][k] = (double)((int)(rnd() % 61) - 30);
    for (int k = 0; k < 16; k++)
      for (int j = 0; j < 8; j++) vB[k][j] = (double)((int)(rnd() % 61) - 30) * 64.0;
    for (int i = 0; i < 16; i++)
      for (int j = 0; j < 8; j++) {
        vC[i][j] = (double)((int)(rnd() % 1001) - 500) / 8.0;
        vD[i][j] = -12345.0;
      }
    if (simt::launch(dim3(1), dim3(32), 0, dmma16_unit_kernel, rep % 2) != simt::ok) {
      report("dmma16 unit", "launch refused");
      return;
    }
    for (int i = 0; i < 16; i++)
      for (int j = 0; j < 8; j++) {
        double e = vC[i][j];
        for (int k = 0; k < 16; k++) e += vA[i][k] * vB[k][j];
        if (vD[i][j] != e && bad++ < 4) {
          char m[200];
          std::snprintf(m, sizeof m, "rep %d: D[%d][%d] = %g, expected %g", rep, i, j, vD[i][j], e);
          report("dmma16 unit (xte_dmma_m16n8k16 against the documented layout)", m);
        }
      }
  }
  cases_run++;
}

/* ---------------------------------------------------------------- the int8 digit kernel's parts */

/* xte_gemm_e4m3_digits (src/numerics/xte_gemm_digits.h) over all 256 codes: the digits' value
 * d0 + 2^7 d1 + 2^14 d2 against the fp32 decode times 2^9 (xte_e4m3_to_f32, exact), the digit
 * ranges (d0, d1 in [-64, 63], |d2| <= 14), NaN exactly for 0x7F and 0xFF; then
 * xte_gemm_digits_fold and xte_gemm_digits_partial on random weight sums (up to their proven
 * bounds) against __int128 arithmetic and an int -> fp32 conversion (the one rounding) scaled by
 * 2^-18, and on the extreme sums of 128 products (+-448 x +-448). */
static void digits_unit() {
  int bad = 0;
  for (int c = 0; c < 256; c++) {
    int8_t d[3] = {99, 99, 99};
    const int nan = xte_gemm_e4m3_digits((uint8_t)c, d);
    const float v = xte_e4m3_to_f32((uint8_t)c);
    const int want_nan = (c & 0x7F) == 0x7F;
    const long long n = (long long)d[0] + 128LL * d[1] + 16384LL * d[2];
    if (nan != want_nan || (nan && (d[0] | d[1] | d[2])) ||
        (!nan && ((double)n != (double)v * 512.0 || d[0] < -64 || d[0] > 63 || d[1] < -64 ||
                  d[1] > 63 || d[2] < -14 || d[2] > 14))) {
      char m[200];
      std::snprintf(m, sizeof m, "code 0x%02X: digits %d %d %d (nan %d), value %g", c, d[0], d[1],
                    d[2], nan, (double)v);
      if (bad++ < 4) report("digit split (xte_gemm_e4m3_digits)", m);
    }
  }
  for (int rep = 0; rep < 20000 && bad < 4; rep++) {
    int32_t acc[5];
    /* random sums within the proven bounds (|acc_w| <= 128 x 4096, 8192, 5888, 1792, 196), now
     * and then up to the bounds */
    static const int bound[5] = {128 * 4096, 128 * 8192, 128 * 5888, 128 * 1792, 128 * 196};
    for (int w = 0; w < 5; w++) {
      const int lim = rep % 7 == 0 ? bound[w] : (1 << (rnd() % 21)) % (bound[w] + 1);
      acc[w] = (int32_t)((int64_t)(rnd() % (2 * (uint64_t)lim + 1)) - lim);
    }
    if (rep == 0) /* 128 products 448 x 448: n = 14 2^14 each side, d2 d2 = 196 */
      acc[0] = acc[1] = acc[2] = acc[3] = 0, acc[4] = 128 * 196;
    if (rep == 1) acc[0] = acc[1] = acc[2] = acc[3] = 0, acc[4] = -128 * 196;
    __int128 s = 0;
    for (int w = 4; w >= 0; w--) s = s * 128 + acc[w];
    const float want = std::ldexp((float)(long long)s, -18); /* (float) of an integer: RNE */
    int32_t lo = 0, hi = 0;
    lo = xte_gemm_digits_fold(lo, acc[0], 0);
    lo = xte_gemm_digits_fold(lo, acc[1], 1);
    for (int w = 2; w < 5; w++) hi = xte_gemm_digits_fold(hi, acc[w], w);
    const float got = xte_gemm_digits_partial(lo, hi, 0);
    uint32_t gb, wb;
    std::memcpy(&gb, &got, 4);
    std::memcpy(&wb, &want, 4);
    if (gb != wb) {
      char m[200];
      std::snprintf(m, sizeof m, "sums %d %d %d %d %d: 0x%08X, expected 0x%08X", acc[0], acc[1],
                    acc[2], acc[3], acc[4], gb, wb);
      if (bad++ < 4) report("digit partial (xte_gemm_digits_partial)", m);
    }
    const float nanp = xte_gemm_digits_partial(lo, hi, 1);
    std::memcpy(&gb, &nanp, 4);
    if (gb != 0x7FC00000u && bad++ < 4) report("digit partial", "NaN flag: not the quiet NaN");
  }
  cases_run++;
}

/* The fragment layout of mma.m16n8k32 .s8 (PTX ISA 9.x, section 9.7.14.5.10 "Matrix Fragments for
 * mma.m16n8k32", Figures 88, 90, 91), written out per lane from its formulas (g = %laneid >> 2,
 * t = %laneid % 4): A, ai (element i = byte i % 4 of register i / 4): row = g for 0 <= i < 4 or
 * 8 <= i < 12, g + 8 otherwise; col = 4 t + (i & 3), + 16 for i >= 8. B, bi: row = 4 t + (i & 3),
 * + 16 for i >= 4; col = g. C / D: as m16n8k16's (Figure 92): DMMA16_C_POS. */
/* clang-format off */
static const int IMMA_A_POS[32][16][2] = {
    {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {8, 0}, {8, 1}, {8, 2}, {8, 3},  /* lane 0 */
     {0, 16}, {0, 17}, {0, 18}, {0, 19}, {8, 16}, {8, 17}, {8, 18}, {8, 19}},
    {{0, 4}, {0, 5}, {0, 6}, {0, 7}, {8, 4}, {8, 5}, {8, 6}, {8, 7},  /* lane 1 */
     {0, 20}, {0, 21}, {0, 22}, {0, 23}, {8, 20}, {8, 21}, {8, 22}, {8, 23}},
    {{0, 8}, {0, 9}, {0, 10}, {0, 11}, {8, 8}, {8, 9}, {8, 10}, {8, 11},  /* lane 2 */
     {0, 24}, {0, 25}, {0, 26}, {0, 27}, {8, 24}, {8, 25}, {8, 26}, {8, 27}},
    {{0, 12}, {0, 13}, {0, 14}, {0, 15}, {8, 12}, {8, 13}, {8, 14}, {8, 15},  /* lane 3 */
     {0, 28}, {0, 29}, {0, 30}, {0, 31}, {8, 28}, {8, 29}, {8, 30}, {8, 31}},
    {{1, 0}, {1, 1}, {1, 2}, {1, 3}, {9, 0}, {9, 1}, {9, 2}, {9, 3},  /* lane 4 */
     {1, 16}, {1, 17}, {1, 18}, {1, 19}, {9, 16}, {9, 17}, {9, 18}, {9, 19}},
    {{1, 4}, {1, 5}, {1, 6}, {1, 7}, {9, 4}, {9, 5}, {9, 6}, {9, 7},  /* lane 5 */
     {1, 20}, {1, 21}, {1, 22}, {1, 23}, {9, 20}, {9, 21}, {9, 22}, {9, 23}},
    {{1, 8}, {1, 9}, {1, 10}, {1, 11}, {9, 8}, {9, 9}, {9, 10}, {9, 11},  /* lane 6 */
     {1, 24}, {1, 25}, {1, 26}, {1, 27}, {9, 24}, {9, 25}, {9, 26}, {9, 27}},
    {{1, 12}, {1, 13}, {1, 14}, {1, 15}, {9, 12}, {9, 13}, {9, 14}, {9, 15},  /* lane 7 */
     {1, 28}, {1, 29}, {1, 30}, {1, 31}, {9, 28}, {9, 29}, {9, 30}, {9, 31}},
    {{2, 0}, {2, 1}, {2, 2}, {2, 3}, {10, 0}, {10, 1}, {10, 2}, {10, 3},  /* lane 8 */
     {2, 16}, {2, 17}, {2, 18}, {2, 19}, {10, 16}, {10, 17}, {10, 18}, {10, 19}},
    {{2, 4}, {2, 5}, {2, 6}, {2, 7}, {10, 4}, {10, 5}, {10, 6}, {10, 7},  /* lane 9 */
     {2, 20}, {2, 21}, {2, 22}, {2, 23}, {10, 20}, {10, 21}, {10, 22}, {10, 23}},
    {{2, 8}, {2, 9}, {2, 10}, {2, 11}, {10, 8}, {10, 9}, {10, 10}, {10, 11},  /* lane 10 */
     {2, 24}, {2, 25}, {2, 26}, {2, 27}, {10, 24}, {10, 25}, {10, 26}, {10, 27}},
    {{2, 12}, {2, 13}, {2, 14}, {2, 15}, {10, 12}, {10, 13}, {10, 14}, {10, 15},  /* lane 11 */
     {2, 28}, {2, 29}, {2, 30}, {2, 31}, {10, 28}, {10, 29}, {10, 30}, {10, 31}},
    {{3, 0}, {3, 1}, {3, 2}, {3, 3}, {11, 0}, {11, 1}, {11, 2}, {11, 3},  /* lane 12 */
     {3, 16}, {3, 17}, {3, 18}, {3, 19}, {11, 16}, {11, 17}, {11, 18}, {11, 19}},
    {{3, 4}, {3, 5}, {3, 6}, {3, 7}, {11, 4}, {11, 5}, {11, 6}, {11, 7},  /* lane 13 */
     {3, 20}, {3, 21}, {3, 22}, {3, 23}, {11, 20}, {11, 21}, {11, 22}, {11, 23}},
    {{3, 8}, {3, 9}, {3, 10}, {3, 11}, {11, 8}, {11, 9}, {11, 10}, {11, 11},  /* lane 14 */
     {3, 24}, {3, 25}, {3, 26}, {3, 27}, {11, 24}, {11, 25}, {11, 26}, {11, 27}},
    {{3, 12}, {3, 13}, {3, 14}, {3, 15}, {11, 12}, {11, 13}, {11, 14}, {11, 15},  /* lane 15 */
     {3, 28}, {3, 29}, {3, 30}, {3, 31}, {11, 28}, {11, 29}, {11, 30}, {11, 31}},
    {{4, 0}, {4, 1}, {4, 2}, {4, 3}, {12, 0}, {12, 1}, {12, 2}, {12, 3},  /* lane 16 */
     {4, 16}, {4, 17}, {4, 18}, {4, 19}, {12, 16}, {12, 17}, {12, 18}, {12, 19}},
    {{4, 4}, {4, 5}, {4, 6}, {4, 7}, {12, 4}, {12, 5}, {12, 6}, {12, 7},  /* lane 17 */
     {4, 20}, {4, 21}, {4, 22}, {4, 23}, {12, 20}, {12, 21}, {12, 22}, {12, 23}},
    {{4, 8}, {4, 9}, {4, 10}, {4, 11}, {12, 8}, {12, 9}, {12, 10}, {12, 11},  /* lane 18 */
     {4, 24}, {4, 25}, {4, 26}, {4, 27}, {12, 24}, {12, 25}, {12, 26}, {12, 27}},
    {{4, 12}, {4, 13}, {4, 14}, {4, 15}, {12, 12}, {12, 13}, {12, 14}, {12, 15},  /* lane 19 */
     {4, 28}, {4, 29}, {4, 30}, {4, 31}, {12, 28}, {12, 29}, {12, 30}, {12, 31}},
    {{5, 0}, {5, 1}, {5, 2}, {5, 3}, {13, 0}, {13, 1}, {13, 2}, {13, 3},  /* lane 20 */
     {5, 16}, {5, 17}, {5, 18}, {5, 19}, {13, 16}, {13, 17}, {13, 18}, {13, 19}},
    {{5, 4}, {5, 5}, {5, 6}, {5, 7}, {13, 4}, {13, 5}, {13, 6}, {13, 7},  /* lane 21 */
     {5, 20}, {5, 21}, {5, 22}, {5, 23}, {13, 20}, {13, 21}, {13, 22}, {13, 23}},
    {{5, 8}, {5, 9}, {5, 10}, {5, 11}, {13, 8}, {13, 9}, {13, 10}, {13, 11},  /* lane 22 */
     {5, 24}, {5, 25}, {5, 26}, {5, 27}, {13, 24}, {13, 25}, {13, 26}, {13, 27}},
    {{5, 12}, {5, 13}, {5, 14}, {5, 15}, {13, 12}, {13, 13}, {13, 14}, {13, 15},  /* lane 23 */
     {5, 28}, {5, 29}, {5, 30}, {5, 31}, {13, 28}, {13, 29}, {13, 30}, {13, 31}},
    {{6, 0}, {6, 1}, {6, 2}, {6, 3}, {14, 0}, {14, 1}, {14, 2}, {14, 3},  /* lane 24 */
     {6, 16}, {6, 17}, {6, 18}, {6, 19}, {14, 16}, {14, 17}, {14, 18}, {14, 19}},
    {{6, 4}, {6, 5}, {6, 6}, {6, 7}, {14, 4}, {14, 5}, {14, 6}, {14, 7},  /* lane 25 */
     {6, 20}, {6, 21}, {6, 22}, {6, 23}, {14, 20}, {14, 21}, {14, 22}, {14, 23}},
    {{6, 8}, {6, 9}, {6, 10}, {6, 11}, {14, 8}, {14, 9}, {14, 10}, {14, 11},  /* lane 26 */
     {6, 24}, {6, 25}, {6, 26}, {6, 27}, {14, 24}, {14, 25}, {14, 26}, {14, 27}},
    {{6, 12}, {6, 13}, {6, 14}, {6, 15}, {14, 12}, {14, 13}, {14, 14}, {14, 15},  /* lane 27 */
     {6, 28}, {6, 29}, {6, 30}, {6, 31}, {14, 28}, {14, 29}, {14, 30}, {14, 31}},
    {{7, 0}, {7, 1}, {7, 2}, {7, 3}, {15, 0}, {15, 1}, {15, 2}, {15, 3},  /* lane 28 */
     {7, 16}, {7, 17}, {7, 18}, {7, 19}, {15, 16}, {15, 17}, {15, 18}, {15, 19}},
    {{7, 4}, {7, 5}, {7, 6}, {7, 7}, {15, 4}, {15, 5}, {15, 6}, {15, 7},  /* lane 29 */
     {7, 20}, {7, 21}, {7, 22}, {7, 23}, {15, 20}, {15, 21}, {15, 22}, {15, 23}},
    {{7, 8}, {7, 9}, {7, 10}, {7, 11}, {15, 8}, {15, 9}, {15, 10}, {15, 11},  /* lane 30 */
     {7, 24}, {7, 25}, {7, 26}, {7, 27}, {15, 24}, {15, 25}, {15, 26}, {15, 27}},
    {{7, 12}, {7, 13}, {7, 14}, {7, 15}, {15, 12}, {15, 13}, {15, 14}, {15, 15},  /* lane 31 */
     {7, 28}, {7, 29}, {7, 30}, {7, 31}, {15, 28}, {15, 29}, {15, 30}, {15, 31}},
};
static const int IMMA_B_POS[32][8][2] = {
    {{0, 0}, {1, 0}, {2, 0}, {3, 0}, {16, 0}, {17, 0}, {18, 0}, {19, 0}}, /* lane 0 */
    {{4, 0}, {5, 0}, {6, 0}, {7, 0}, {20, 0}, {21, 0}, {22, 0}, {23, 0}}, /* lane 1 */
    {{8, 0}, {9, 0}, {10, 0}, {11, 0}, {24, 0}, {25, 0}, {26, 0}, {27, 0}}, /* lane 2 */
    {{12, 0}, {13, 0}, {14, 0}, {15, 0}, {28, 0}, {29, 0}, {30, 0}, {31, 0}}, /* lane 3 */
    {{0, 1}, {1, 1}, {2, 1}, {3, 1}, {16, 1}, {17, 1}, {18, 1}, {19, 1}}, /* lane 4 */
    {{4, 1}, {5, 1}, {6, 1}, {7, 1}, {20, 1}, {21, 1}, {22, 1}, {23, 1}}, /* lane 5 */
    {{8, 1}, {9, 1}, {10, 1}, {11, 1}, {24, 1}, {25, 1}, {26, 1}, {27, 1}}, /* lane 6 */
    {{12, 1}, {13, 1}, {14, 1}, {15, 1}, {28, 1}, {29, 1}, {30, 1}, {31, 1}}, /* lane 7 */
    {{0, 2}, {1, 2}, {2, 2}, {3, 2}, {16, 2}, {17, 2}, {18, 2}, {19, 2}}, /* lane 8 */
    {{4, 2}, {5, 2}, {6, 2}, {7, 2}, {20, 2}, {21, 2}, {22, 2}, {23, 2}}, /* lane 9 */
    {{8, 2}, {9, 2}, {10, 2}, {11, 2}, {24, 2}, {25, 2}, {26, 2}, {27, 2}}, /* lane 10 */
    {{12, 2}, {13, 2}, {14, 2}, {15, 2}, {28, 2}, {29, 2}, {30, 2}, {31, 2}}, /* lane 11 */
    {{0, 3}, {1, 3}, {2, 3}, {3, 3}, {16, 3}, {17, 3}, {18, 3}, {19, 3}}, /* lane 12 */
    {{4, 3}, {5, 3}, {6, 3}, {7, 3}, {20, 3}, {21, 3}, {22, 3}, {23, 3}}, /* lane 13 */
    {{8, 3}, {9, 3}, {10, 3}, {11, 3}, {24, 3}, {25, 3}, {26, 3}, {27, 3}}, /* lane 14 */
    {{12, 3}, {13, 3}, {14, 3}, {15, 3}, {28, 3}, {29, 3}, {30, 3}, {31, 3}}, /* lane 15 */
    {{0, 4}, {1, 4}, {2, 4}, {3, 4}, {16, 4}, {17, 4}, {18, 4}, {19, 4}}, /* lane 16 */
    {{4, 4}, {5, 4}, {6, 4}, {7, 4}, {20, 4}, {21, 4}, {22, 4}, {23, 4}}, /* lane 17 */
    {{8, 4}, {9, 4}, {10, 4}, {11, 4}, {24, 4}, {25, 4}, {26, 4}, {27, 4}}, /* lane 18 */
    {{12, 4}, {13, 4}, {14, 4}, {15, 4}, {28, 4}, {29, 4}, {30, 4}, {31, 4}}, /* lane 19 */
    {{0, 5}, {1, 5}, {2, 5}, {3, 5}, {16, 5}, {17, 5}, {18, 5}, {19, 5}}, /* lane 20 */
    {{4, 5}, {5, 5}, {6, 5}, {7, 5}, {20, 5}, {21, 5}, {22, 5}, {23, 5}}, /* lane 21 */
    {{8, 5}, {9, 5}, {10, 5}, {11, 5}, {24, 5}, {25, 5}, {26, 5}, {27, 5}}, /* lane 22 */
    {{12, 5}, {13, 5}, {14, 5}, {15, 5}, {28, 5}, {29, 5}, {30, 5}, {31, 5}}, /* lane 23 */
    {{0, 6}, {1, 6}, {2, 6}, {3, 6}, {16, 6}, {17, 6}, {18, 6}, {19, 6}}, /* lane 24 */
    {{4, 6}, {5, 6}, {6, 6}, {7, 6}, {20, 6}, {21, 6}, {22, 6}, {23, 6}}, /* lane 25 */
    {{8, 6}, {9, 6}, {10, 6}, {11, 6}, {24, 6}, {25, 6}, {26, 6}, {27, 6}}, /* lane 26 */
    {{12, 6}, {13, 6}, {14, 6}, {15, 6}, {28, 6}, {29, 6}, {30, 6}, {31, 6}}, /* lane 27 */
    {{0, 7}, {1, 7}, {2, 7}, {3, 7}, {16, 7}, {17, 7}, {18, 7}, {19, 7}}, /* lane 28 */
    {{4, 7}, {5, 7}, {6, 7}, {7, 7}, {20, 7}, {21, 7}, {22, 7}, {23, 7}}, /* lane 29 */
    {{8, 7}, {9, 7}, {10, 7}, {11, 7}, {24, 7}, {25, 7}, {26, 7}, {27, 7}}, /* lane 30 */
    {{12, 7}, {13, 7}, {14, 7}, {15, 7}, {28, 7}, {29, 7}, {30, 7}, {31, 7}}, /* lane 31 */
};
/* clang-format on */
static int8_t iA[16][32], iB[32][8];
static int32_t iC[16][8], iD[16][8];

/* one warp: each lane packs its fragments by the tables, one MMA (in place: d is c), stores D */
static void imma_unit_kernel(int in_place) {
  const int l = (int)threadIdx.x;
  uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  int32_t c[4], d[4] = {-1, -1, -1, -1};
  for (int i = 0; i < 16; i++)
    a[i / 4] |= (uint32_t)(uint8_t)iA[IMMA_A_POS[l][i][0]][IMMA_A_POS[l][i][1]] << (8 * (i % 4));
  for (int i = 0; i < 8; i++)
    b[i / 4] |= (uint32_t)(uint8_t)iB[IMMA_B_POS[l][i][0]][IMMA_B_POS[l][i][1]] << (8 * (i % 4));
  for (int i = 0; i < 4; i++) c[i] = iC[DMMA16_C_POS[l][i][0]][DMMA16_C_POS[l][i][1]];
  xte_imma_m16n8k32(in_place ? c : d, a, b, c);
  const int32_t *r = in_place ? c : d;
  for (int i = 0; i < 4; i++) iD[DMMA16_C_POS[l][i][0]][DMMA16_C_POS[l][i][1]] = r[i];
}

/* xte_imma_m16n8k32 as dmma16_unit: D = C + A B of random int8 (the full range) against a plain
 * triple loop, six times (the double buffer; in place every other time); first the tables: each
 * covers its matrix exactly once. */
static void imma_unit() {
  int bad = 0;
  {
    int seen_a[16][32] = {}, seen_b[32][8] = {};
    for (int l = 0; l < 32; l++) {
      for (int i = 0; i < 16; i++) seen_a[IMMA_A_POS[l][i][0]][IMMA_A_POS[l][i][1]]++;
      for (int i = 0; i < 8; i++) seen_b[IMMA_B_POS[l][i][0]][IMMA_B_POS[l][i][1]]++;
    }
    for (int r = 0; r < 16; r++)
      for (int k = 0; k < 32; k++)
        if (seen_a[r][k] != 1) bad++;
    for (int k = 0; k < 32; k++)
      for (int n = 0; n < 8; n++)
        if (seen_b[k][n] != 1) bad++;
    if (bad) report("imma unit", "a lane table does not cover its matrix exactly once");
  }
  for (int rep = 0; rep < 6 && !bad; rep++) {
    for (int i = 0; i < 16; i++)
      for (int k = 0; k < 32; k++) iA[i][k] = (int8_t)(rep == 0 ? -128 : (int)(rnd() % 256) - 128);
    for (int k = 0; k < 32; k++)
      for (int j = 0; j < 8; j++) iB[k][j] = (int8_t)(rep == 0 ? -128 : (int)(rnd() % 256) - 128);
    for (int i = 0; i < 16; i++)
      for (int j = 0; j < 8; j++) {
        iC[i][j] = (int32_t)(rnd() % 2000001) - 1000000;
        iD[i][j] = -12345;
      }
    if (simt::launch(dim3(1), dim3(32), 0, imma_unit_kernel, rep % 2) != simt::ok) {
      report("imma unit", "launch refused");
      return;
    }
    for (int i = 0; i < 16; i++)
      for (int j = 0; j < 8; j++) {
        long long e = iC[i][j];
        for (int k = 0; k < 32; k++) e += (long long)iA[i][k] * iB[k][j];
        if (iD[i][j] != e && bad++ < 4) {
          char m[200];
          std::snprintf(m, sizeof m, "rep %d: D[%d][%d] = %d, expected %lld", rep, i, j, iD[i][j],
                        e);
          report("imma unit (xte_imma_m16n8k32 against the documented layout)", m);
        }
      }
  }
  cases_run++;
}

/* With 128-lane warps (MUSA's) an MMA request runs the SIMT kernel: a few cases. */
static void warp128_cases() {
  setenv("SIMT_WARP_SIZE", "128", 1);
  kernel_mask = 14;
  want_simt_for_dmma = 1;
  tie_case(0, 9, 73, 100);
  dense_case(0, XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, 0, 1, 65, 67, 300, 1, 3, 101);
  dense_case(3, XTE_DTYPE_E5M2, XTE_DTYPE_E4M3, 1, 0, 7, 9, 130, 2, 1, 102);
  dense_case(1, XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, 0, 0, 65, 67, 300, 1, 3, 103);
  setenv("SIMT_WARP_SIZE", "32", 1);
  kernel_mask = 15;
  want_simt_for_dmma = 0;
}

int main(int argc, char **argv) {
  const simt_args args = simt_parse_args(argc, argv);
  if (args.full) reduced = 0;
  thin_dmma = args.reduced && !args.full;
  if (!simt_open("simt gemm", 0)) return 2;
  {
    /* the plugin libxte loaded: its kernel launch counters */
    const std::string so = std::string(SIMT_PLUGIN_DIR) + "/libxte_cuda.so";
    void *h = dlopen(so.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (h) plugin_launches = (long (*)(int))dlsym(h, "simt_gemm_launches");
    if (!plugin_launches) {
      std::fprintf(stderr, "FATAL simt gemm: simt_gemm_launches not found in %s\n", so.c_str());
      return 2;
    }
  }
  std::printf(
      "simt gemm: CPU ISA %s, %s list, every case through the SIMT and both DMMA kernels, the "
      "e4m3 x e4m3 ones through the int8 digit kernel too\n",
      simt_isa(), reduced ? "default" : "full");
  dmma_unit();
  dmma16_unit();
  digits_unit();
  imma_unit();
  dense_cases();
  fast_bias_cases();
  tie_cases();
  grouped_cases();
  warp128_cases();
  std::printf("simt gemm: %d cases through the int8 digit kernel\n", imma_cases);
  if (imma_cases == 0) report("int8 digit kernel", "no case ran through it");
  return simt_close("simt gemm");
}

/* Quantization layouts x ISAs: every recipe x mode x scale layout (COMPACT, TE_GEMM, DEEPGEMM,
 * MX_SWIZZLED where the recipe takes it) x rowwise / columnwise / both, on shapes 1x16, 65x96,
 * 993x512, 1024x1 and a few odd ones:
 *  - every ISA gives the scalar path's bytes (data, whole scale buffers, amax);
 *  - each layout holds the COMPACT grid at the positions the layout definitions give (index
 *    formulas written here from numerics-facts.md / quantize.h), its padding is zero, and
 *    xte_quantize_scale_shape reports the defined shape;
 *  - producing one copy alone gives the same bytes as producing both;
 *  - the columnwise copy equals the rowwise quantization of the transposed input (transposed
 *    back where the recipe keeps [M, K]);
 *  - dequantize gives fp8 value * scale_inv (fp32 product), rounded to nearest even into fp32 /
 *    bf16 / fp16, computed here. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

typedef struct combo {
  xte_recipe recipe;
  xte_scaling_mode mode;
} combo;

static int is_mx(xte_recipe r) {
  return r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP;
}
static int transposes(xte_recipe r) {
  return !(r == XTE_RECIPE_MTFP8 || is_mx(r));
}
static int64_t cdiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
static int64_t rup(int64_t a, int64_t b) {
  return cdiv(a, b) * b;
}

/* ------------------------------------------------------------------ layout definitions */

/* Block grid [GR, GC] of a copy of an [M, K] input (quantize.h). */
static void grid_of(const combo *cb, int64_t M, int64_t K, int col, int64_t *GR, int64_t *GC) {
  int64_t B = cb->mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  int64_t R = col && transposes(cb->recipe) ? K : M, C = col && transposes(cb->recipe) ? M : K;
  if (cb->mode == XTE_SCALING_PER_TENSOR) {
    *GR = *GC = 1;
  } else if (cb->mode == XTE_SCALING_BLOCK_128x128) {
    *GR = cdiv(R, 128);
    *GC = cdiv(C, 128);
  } else if (col && !transposes(cb->recipe)) { /* Bx1 blocks over [M, K] */
    *GR = cdiv(M, B);
    *GC = K;
  } else {
    *GR = R;
    *GC = cdiv(C, B);
  }
}

/* Where layout L puts grid entry (gi, gj); the buffer shape in *rows, *cols. */
typedef struct lmap {
  int64_t rows, cols;
  int kind; /* 0: gi * a + gj * b; 1: swizzle over (r, c) = (gi, gj) or (gj, gi) */
  int64_t a, b;
  int swap;
} lmap;

static lmap layout_of(const combo *cb, xte_scale_layout L, int64_t GR, int64_t GC, int col) {
  lmap m;
  int colblock = col && !transposes(cb->recipe) && cb->mode != XTE_SCALING_BLOCK_128x128;
  memset(&m, 0, sizeof m);
  if (cb->mode == XTE_SCALING_PER_TENSOR || L == XTE_SCALE_LAYOUT_COMPACT) {
    m.rows = GR, m.cols = GC, m.a = GC, m.b = 1;
  } else if (L == XTE_SCALE_LAYOUT_MX_SWIZZLED) {
    /* cuBLAS 128x4 tiles over the rowwise grid, or over the transposed grid [K, ceil(M/32)] */
    int64_t r = colblock ? GC : GR, c = colblock ? GR : GC;
    m.kind = 1;
    m.swap = colblock;
    m.rows = rup(r, 128);
    m.cols = rup(c, 4);
  } else if (L == XTE_SCALE_LAYOUT_TE_GEMM) {
    if (cb->mode == XTE_SCALING_BLOCK_128x128 || colblock) { /* [GR, roundup(GC, 4)] */
      m.rows = GR, m.cols = rup(GC, 4), m.a = m.cols, m.b = 1;
    } else { /* 1xB: transposed [GC, roundup(GR, 4)] */
      m.rows = GC, m.cols = rup(GR, 4), m.a = 1, m.b = m.cols;
    }
  } else {                                                   /* DEEPGEMM */
    if (cb->mode == XTE_SCALING_BLOCK_128x128 || colblock) { /* RHS [GR, GC] row-major */
      m.rows = GR, m.cols = GC, m.a = GC, m.b = 1;
    } else { /* LHS: MN-major [GC, roundup(GR, 4)] */
      m.rows = GC, m.cols = rup(GR, 4), m.a = 1, m.b = m.cols;
    }
  }
  return m;
}

static int64_t lmap_index(const lmap *m, int64_t gi, int64_t gj) {
  int64_t r, c;
  if (m->kind == 0) return gi * m->a + gj * m->b;
  r = m->swap ? gj : gi;
  c = m->swap ? gi : gj;
  return ((r / 128) * (m->cols / 4) + c / 4) * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4;
}

/* ------------------------------------------------------------------ independent arithmetic */

static double fp8_value(uint8_t b, int fmt) { /* NaN codes give NaN */
  int m = fmt == 0 ? 3 : 2, bias = fmt == 0 ? 7 : 15, eb = fmt == 0 ? 4 : 5;
  int e = (b >> m) & ((1 << eb) - 1), f = b & ((1 << m) - 1);
  double v;
  if (fmt == 0 && (b & 0x7F) == 0x7F) return NAN;
  if (fmt == 1 && e == 31) return f ? NAN : ((b & 0x80) ? -INFINITY : INFINITY);
  v = e == 0 ? ldexp(f, 1 - bias - m) : ldexp((1 << m) + f, e - bias - m);
  return (b & 0x80) ? -v : v;
}

/* RNE of a finite fp32 magnitude (bits a) into m mantissa bits, minimum normal exponent emin,
 * bias: the magnitude code, possibly past the largest finite one. */
static uint32_t round_code(uint32_t a, int m, int emin, int bias) {
  uint64_t sig = a >> 23 ? (a & 0x7FFFFFu) | 0x800000u : a & 0x7FFFFFu, n;
  int exp = a >> 23 ? (int)(a >> 23) - 150 : -149, fl, q;
  if (!sig) return 0;
  fl = exp + 63 - __builtin_clzll(sig);
  q = (fl > emin ? fl : emin) - m;
  if (q <= exp) {
    n = sig << (exp - q);
  } else if (q - exp > 40) {
    n = 0;
  } else {
    uint64_t rem = sig & ((1ull << (q - exp)) - 1), half = 1ull << (q - exp - 1);
    n = sig >> (q - exp);
    if (rem > half || (rem == half && (n & 1))) n++;
  }
  if (!n) return 0;
  if (n == (1ull << (m + 1))) n >>= 1, q++;
  if (n < (1ull << m)) return (uint32_t)n;
  return ((uint32_t)(q + m + bias) << m) | (uint32_t)(n - (1ull << m));
}

static uint32_t f32_to_out(float v, xte_dtype d) { /* non-NaN */
  uint32_t u, a, s, c;
  memcpy(&u, &v, 4);
  if (d == XTE_DTYPE_FP32) return u;
  a = u & 0x7FFFFFFFu;
  s = (u >> 16) & 0x8000u;
  if (d == XTE_DTYPE_BF16) {
    c = a == 0x7F800000u ? 0x7F80u : round_code(a, 7, -126, 127);
    return s | (c > 0x7F7Fu ? 0x7F80u : c);
  }
  c = a == 0x7F800000u ? 0x7C00u : round_code(a, 10, -14, 15);
  return s | (c > 0x7BFFu ? 0x7C00u : c);
}

static int out_isnan(uint32_t v, xte_dtype d) {
  if (d == XTE_DTYPE_FP32) return (v & 0x7FFFFFFFu) > 0x7F800000u;
  if (d == XTE_DTYPE_BF16) return (v & 0x7FFFu) > 0x7F80u;
  return (v & 0x7FFFu) > 0x7C00u;
}

/* ------------------------------------------------------------------ inputs */

static uint64_t rs_state;
static uint32_t rnd(void) {
  rs_state ^= rs_state << 13;
  rs_state ^= rs_state >> 7;
  rs_state ^= rs_state << 17;
  return (uint32_t)(rs_state >> 16);
}

/* Random values of dtype d: exponents spread over +-20 binades, some blocks scaled far down or
 * up, with zeros, infs and NaNs here and there. */
static void gen_input(void *buf, xte_dtype d, int64_t M, int64_t K, unsigned seed) {
  int eb = d == XTE_DTYPE_FP16 ? 5 : 8,
      mb = d == XTE_DTYPE_FP32 ? 23 : (d == XTE_DTYPE_BF16 ? 7 : 10);
  int bias = (1 << (eb - 1)) - 1, emax = (1 << eb) - 2;
  int64_t i;
  rs_state = 0x9E3779B97F4A7C15ull ^ ((uint64_t)seed << 20) ^ (uint64_t)seed;
  for (i = 0; i < M * K; i++) {
    uint32_t r = rnd(), s = rnd() & 1u, f = rnd() & ((1u << mb) - 1u), b;
    int64_t row = i / K, c = i % K;
    int shift = (int)(((row / 7) * 13 + (c / 32) * 5) % 9) - 4; /* block-level magnitude */
    int e = bias + (int)(rnd() % 41) - 20 + shift * (eb == 5 ? 1 : 6);
    if (e < 0) e = 0;
    if (e > emax) e = emax;
    b = (s << (eb + mb)) | ((uint32_t)e << mb) | f;
    if (r % 97 == 0) b = s << (eb + mb);                                        /* +-0 */
    if (r % 389 == 1) b = (s << (eb + mb)) | ((uint32_t)(emax + 1) << mb);      /* inf */
    if (r % 401 == 2) b = (s << (eb + mb)) | ((uint32_t)(emax + 1) << mb) | 1u; /* NaN */
    if (d == XTE_DTYPE_FP32)
      ((uint32_t *)buf)[i] = b;
    else
      ((uint16_t *)buf)[i] = (uint16_t)b;
  }
}

/* ------------------------------------------------------------------ runs */

typedef struct qrun {
  uint8_t *q[2];
  uint8_t *s[2]; /* raw scale buffers */
  int64_t sn[2]; /* elements */
  int64_t sr[2], sc[2];
  float amax;
} qrun;

static void qrun_free(qrun *r) {
  int i;
  for (i = 0; i < 2; i++) {
    free(r->q[i]);
    free(r->s[i]);
  }
  memset(r, 0, sizeof *r);
}

/* copies: bit 0 rowwise, bit 1 columnwise. Buffers are pre-filled with a canary. */
static void quant(const combo *cb, xte_scale_layout L, int copies, const void *in, xte_dtype dt,
                  int64_t M, int64_t K, int fmt, qrun *out) {
  const xte_dtype qdt = fmt ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
  const int mx = is_mx(cb->recipe);
  const size_t es = mx ? 1 : 4;
  float scale = 2.0f;
  xte_qtensor q;
  xte_tensor x = xte_tensor_2d((void *)in, dt, M, K);
  xte_status st;
  int c;
  memset(out, 0, sizeof *out);
  memset(&q, 0, sizeof q);
  for (c = 0; c < 2; c++) {
    xte_tensor *t = c ? &q.columnwise : &q.rowwise;
    xte_scale_tensor *s = c ? &q.columnwise_scale_inv : &q.rowwise_scale_inv;
    int tr = c && transposes(cb->recipe);
    if (!(copies & (1 << c))) continue;
    cr_assert_eq(
        xte_quantize_scale_shape(M, K, cb->mode, cb->recipe, L, c, &out->sr[c], &out->sc[c]),
        XTE_SUCCESS, "%s", xte_last_error());
    out->sn[c] = out->sr[c] * out->sc[c];
    out->q[c] = malloc((size_t)(M * K) + 1);
    out->s[c] = malloc((size_t)out->sn[c] * es + 1);
    cr_assert(out->q[c] && out->s[c]);
    memset(out->q[c], 0xA5, (size_t)(M * K));
    memset(out->s[c], 0xA5, (size_t)out->sn[c] * es);
    *t = xte_tensor_2d(out->q[c], qdt, tr ? K : M, tr ? M : K);
    s->data = out->s[c];
    s->dtype = mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
    s->rows = out->sr[c];
    s->cols = out->sc[c];
    s->layout = L;
  }
  q.scaling_mode = cb->mode;
  q.recipe = cb->recipe;
  q.amax = &out->amax;
  q.scale = &scale;
  st = xte_quantize(&x, &q, NULL, NULL);
  cr_assert_eq(st, XTE_SUCCESS, "xte_quantize: %s", xte_last_error());
}

static long n_bad;

static void same_bytes(const char *tag, const char *what, const void *a, const void *b, size_t n) {
  size_t i;
  if (memcmp(a, b, n) == 0) return;
  for (i = 0; i < n; i++)
    if (((const uint8_t *)a)[i] != ((const uint8_t *)b)[i]) break;
  cr_log_error("%s: %s differ at byte %zu (0x%02X vs 0x%02X)", tag, what, i,
               ((const uint8_t *)a)[i], ((const uint8_t *)b)[i]);
  n_bad++;
}

/* Reads grid entry (gi, gj) from a scale buffer under map m: the fp32 bits or the E8M0 byte. */
static uint32_t scale_at(const uint8_t *buf, int mx, int64_t idx) {
  uint32_t u;
  if (mx) return buf[idx];
  memcpy(&u, buf + idx * 4, 4);
  return u;
}

/* Layout check: buffer holds compact entries at the mapped positions, zero elsewhere. */
static void check_layout(const char *tag, const combo *cb, xte_scale_layout L, int col, int64_t M,
                         int64_t K, const qrun *lay, const qrun *compact) {
  int64_t GR, GC, gi, gj, i, n;
  const int mx = is_mx(cb->recipe);
  lmap m;
  char *hit;
  grid_of(cb, M, K, col, &GR, &GC);
  m = layout_of(cb, L, GR, GC, col);
  if (lay->sr[col] != m.rows || lay->sc[col] != m.cols) {
    cr_log_error("%s: %s scale shape [%lld, %lld], want [%lld, %lld]", tag,
                 col ? "columnwise" : "rowwise", (long long)lay->sr[col], (long long)lay->sc[col],
                 (long long)m.rows, (long long)m.cols);
    n_bad++;
    return;
  }
  n = m.rows * m.cols;
  hit = calloc((size_t)n, 1);
  cr_assert(hit);
  for (gi = 0; gi < GR; gi++)
    for (gj = 0; gj < GC; gj++) {
      int64_t idx = lmap_index(&m, gi, gj);
      cr_assert(idx >= 0 && idx < n);
      if (hit[idx]) {
        cr_log_error("%s: two blocks map to %lld", tag, (long long)idx);
        n_bad++;
      }
      hit[idx] = 1;
      if (scale_at(lay->s[col], mx, idx) != scale_at(compact->s[col], mx, gi * GC + gj)) {
        if (n_bad < 20)
          cr_log_error("%s: %s block (%lld, %lld) at %lld holds 0x%X, compact 0x%X", tag,
                       col ? "columnwise" : "rowwise", (long long)gi, (long long)gj, (long long)idx,
                       scale_at(lay->s[col], mx, idx), scale_at(compact->s[col], mx, gi * GC + gj));
        n_bad++;
      }
    }
  for (i = 0; i < n; i++)
    if (!hit[i] && scale_at(lay->s[col], mx, i) != 0) {
      if (n_bad < 20) cr_log_error("%s: padding entry %lld is not zero", tag, (long long)i);
      n_bad++;
      break;
    }
  free(hit);
}

/* Dequantize check of one copy under a layout: out == RNE(fp8 * scale_inv) per element. */
static void check_dequant(const char *tag, const combo *cb, xte_scale_layout L, int col, int64_t M,
                          int64_t K, int fmt, const qrun *run, const qrun *compact) {
  static const xte_dtype outs[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  const int mx = is_mx(cb->recipe), tr = col && transposes(cb->recipe);
  const int64_t R = tr ? K : M, C = tr ? M : K;
  const int64_t B = cb->mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  int64_t GR, GC, r, c, bh, bw;
  size_t o;
  void *buf = malloc((size_t)(R * C) * 4 + 4);
  xte_qtensor q;
  cr_assert(buf);
  grid_of(cb, M, K, col, &GR, &GC);
  if (cb->mode == XTE_SCALING_PER_TENSOR)
    bh = R, bw = C;
  else if (cb->mode == XTE_SCALING_BLOCK_128x128)
    bh = bw = 128;
  else if (col && !tr)
    bh = B, bw = 1;
  else
    bh = 1, bw = B;
  memset(&q, 0, sizeof q);
  q.scaling_mode = cb->mode;
  q.recipe = cb->recipe;
  {
    xte_tensor *t = col ? &q.columnwise : &q.rowwise;
    xte_scale_tensor *s = col ? &q.columnwise_scale_inv : &q.rowwise_scale_inv;
    *t = xte_tensor_2d(run->q[col], fmt ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3, R, C);
    s->data = run->s[col];
    s->dtype = mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
    s->rows = run->sr[col];
    s->cols = run->sc[col];
    s->layout = L;
  }
  for (o = 0; o < 3; o++) {
    xte_tensor y = xte_tensor_2d(buf, outs[o], R, C);
    size_t es = xte_dtype_size(outs[o]);
    long bad = 0;
    cr_assert_eq(xte_dequantize(&q, col, &y, NULL), XTE_SUCCESS, "%s", xte_last_error());
    for (r = 0; r < R; r++)
      for (c = 0; c < C; c++) {
        uint32_t sbits = scale_at(compact->s[col], mx, (r / bh) * GC + c / bw), g, w;
        float sinv, v;
        double fv = fp8_value(run->q[col][r * C + c], fmt);
        if (mx)
          sinv = sbits == 0xFF ? NAN : ldexpf(1.0f, (int)sbits - 127);
        else
          memcpy(&sinv, &sbits, 4);
        v = (float)fv * sinv; /* the fp32 product */
        g = es == 4 ? ((uint32_t *)buf)[r * C + c] : ((uint16_t *)buf)[r * C + c];
        if (isnan(v)) {
          if (out_isnan(g, outs[o])) continue;
          w = 0x7FFFFFFF;
        } else {
          w = f32_to_out(v, outs[o]);
          if (g == w) continue;
        }
        if (bad++ < 3)
          cr_log_error("%s: dequantize %s to %s [%lld, %lld]: 0x%X, want 0x%X", tag,
                       col ? "columnwise" : "rowwise", xte_dtype_name(outs[o]), (long long)r,
                       (long long)c, g, w);
      }
    if (bad) n_bad++;
  }
  free(buf);
}

/* The columnwise copy is the quantization along the other axis: the rowwise copy of the
 * transposed input (transposed back for MTFP8 / MX Bx1 blocks; the rowwise copy itself for
 * MTFP8 128x128). */
static void check_other_axis(const char *tag, const combo *cb, const void *in, xte_dtype dt,
                             int64_t M, int64_t K, int fmt, const qrun *both) {
  const size_t es = xte_dtype_size(dt);
  const int mx = is_mx(cb->recipe);
  int64_t i, j, GR, GC, tGR, tGC;
  uint8_t *xt = malloc((size_t)(M * K) * es + 1);
  qrun t;
  cr_assert(xt);
  grid_of(cb, M, K, 1, &GR, &GC);
  if (cb->recipe == XTE_RECIPE_MTFP8 && cb->mode == XTE_SCALING_BLOCK_128x128) {
    same_bytes(tag, "MTFP8 128x128 columnwise vs rowwise data", both->q[1], both->q[0],
               (size_t)(M * K));
    same_bytes(tag, "MTFP8 128x128 columnwise vs rowwise scales", both->s[1], both->s[0],
               (size_t)(GR * GC) * 4);
    free(xt);
    return;
  }
  for (i = 0; i < M; i++)
    for (j = 0; j < K; j++)
      memcpy(xt + (j * M + i) * es, (const uint8_t *)in + (i * K + j) * es, es);
  quant(cb, XTE_SCALE_LAYOUT_COMPACT, 1, xt, dt, K, M, fmt, &t);
  grid_of(cb, K, M, 0, &tGR, &tGC);
  if (transposes(cb->recipe)) {
    same_bytes(tag, "columnwise vs rowwise(x^T) data", both->q[1], t.q[0], (size_t)(M * K));
    same_bytes(tag, "columnwise vs rowwise(x^T) scales", both->s[1], t.s[0],
               (size_t)(GR * GC) * (mx ? 1 : 4));
  } else {
    long bad = 0;
    for (i = 0; i < M; i++)
      for (j = 0; j < K; j++)
        if (both->q[1][i * K + j] != t.q[0][j * M + i]) bad++;
    for (i = 0; i < GR; i++)
      for (j = 0; j < GC; j++) /* col grid [ceil(M/B), K] vs x^T rowwise grid [K, ceil(M/B)] */
        if (scale_at(both->s[1], mx, i * GC + j) != scale_at(t.s[0], mx, j * tGC + i)) bad++;
    if (bad) {
      cr_log_error("%s: columnwise Bx1 copy differs from rowwise(x^T)^T in %ld places", tag, bad);
      n_bad++;
    }
  }
  qrun_free(&t);
  free(xt);
}

static const int64_t SHAPES[][2] = {{1, 16},   {65, 96},   {993, 512}, {1024, 1},
                                    {37, 259}, {200, 129}, {3, 1000}};
#define NSHAPES (sizeof SHAPES / sizeof SHAPES[0])

static void run_combo(xte_recipe recipe, xte_scaling_mode mode) {
  static const xte_dtype dts[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  const combo cbv = {recipe, mode}, *cb = &cbv;
  const int mx = is_mx(recipe);
  xte_cpu_isa saved = xte_cpu_get_isa();
  size_t si;
  int fmt, li, copies, isa;
  n_bad = 0;
  for (si = 0; si < NSHAPES; si++)
    for (fmt = 0; fmt < 2; fmt++) {
      const int64_t M = SHAPES[si][0], K = SHAPES[si][1];
      const xte_dtype dt = dts[(si + (size_t)fmt) % 3];
      const size_t es = xte_dtype_size(dt);
      void *in = malloc((size_t)(M * K) * es);
      qrun compact;
      cr_assert(in);
      gen_input(in, dt, M, K, (unsigned)(si * 31 + (size_t)fmt * 7 + (size_t)recipe * 101 + mode));
      cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_SCALAR), XTE_SUCCESS);
      quant(cb, XTE_SCALE_LAYOUT_COMPACT, 3, in, dt, M, K, fmt, &compact);
      {
        char tag[160];
        snprintf(tag, sizeof tag, "[recipe %d mode %d %lldx%lld %s fmt %d]", (int)recipe, (int)mode,
                 (long long)M, (long long)K, xte_dtype_name(dt), fmt);
        check_other_axis(tag, cb, in, dt, M, K, fmt, &compact);
      }
      for (li = 0; li < XTE_SCALE_LAYOUT_COUNT; li++) {
        const xte_scale_layout L = (xte_scale_layout)li;
        int64_t r, c;
        xte_status st;
        if (mx ? (L == XTE_SCALE_LAYOUT_TE_GEMM || L == XTE_SCALE_LAYOUT_DEEPGEMM)
               : L == XTE_SCALE_LAYOUT_MX_SWIZZLED) {
          st = xte_quantize_scale_shape(M, K, mode, recipe, L, 0, &r, &c);
          cr_expect_eq(st, XTE_ERROR_UNSUPPORTED, "layout %d for recipe %d", li, (int)recipe);
          continue;
        }
        for (copies = 1; copies <= 3; copies++) {
          qrun ref;
          char tag[200];
          snprintf(tag, sizeof tag, "[recipe %d mode %d layout %d copies %d %lldx%lld %s fmt %d]",
                   (int)recipe, (int)mode, li, copies, (long long)M, (long long)K,
                   xte_dtype_name(dt), fmt);
          cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_SCALAR), XTE_SUCCESS);
          quant(cb, L, copies, in, dt, M, K, fmt, &ref);
          for (r = 0; r < 2; r++) {
            if (!(copies & (1 << r))) continue;
            /* the same bytes as when both copies are produced */
            same_bytes(tag, "data vs both-copies run", ref.q[r], compact.q[r], (size_t)(M * K));
            check_layout(tag, cb, L, (int)r, M, K, &ref, &compact);
            if (copies == 3 && (si % 2 == 0 || L == XTE_SCALE_LAYOUT_COMPACT))
              check_dequant(tag, cb, L, (int)r, M, K, fmt, &ref, &compact);
          }
          if (memcmp(&ref.amax, &compact.amax, 4) != 0) { /* amax: of the input, not a copy */
            cr_log_error("%s: amax %a, with both copies %a", tag, (double)ref.amax,
                         (double)compact.amax);
            n_bad++;
          }
          for (isa = XTE_CPU_ISA_SCALAR + 1; isa < XTE_CPU_ISA_COUNT; isa++) {
            qrun got;
            if (xte_cpu_set_isa((xte_cpu_isa)isa) != XTE_SUCCESS) {
              if (si == 0 && fmt == 0 && li == 0 && copies == 1)
                printf("isa %s not available: skipped\n", xte_cpu_isa_name((xte_cpu_isa)isa));
              continue;
            }
            quant(cb, L, copies, in, dt, M, K, fmt, &got);
            for (r = 0; r < 2; r++) {
              char what[80];
              if (!(copies & (1 << r))) continue;
              snprintf(what, sizeof what, "%s %s data vs scalar",
                       xte_cpu_isa_name((xte_cpu_isa)isa), r ? "columnwise" : "rowwise");
              same_bytes(tag, what, got.q[r], ref.q[r], (size_t)(M * K));
              snprintf(what, sizeof what, "%s %s scales vs scalar",
                       xte_cpu_isa_name((xte_cpu_isa)isa), r ? "columnwise" : "rowwise");
              same_bytes(tag, what, got.s[r], ref.s[r], (size_t)ref.sn[r] * (mx ? 1 : 4));
            }
            if (memcmp(&got.amax, &ref.amax, 4) != 0) {
              cr_log_error("%s: %s amax %a vs scalar %a", tag, xte_cpu_isa_name((xte_cpu_isa)isa),
                           (double)got.amax, (double)ref.amax);
              n_bad++;
            }
            qrun_free(&got);
          }
          qrun_free(&ref);
        }
      }
      qrun_free(&compact);
      free(in);
    }
  xte_cpu_set_isa(saved);
  cr_expect_eq(n_bad, 0, "%ld failed checks", n_bad);
}

Test(layouts, te_block_1x128) {
  run_combo(XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128);
}
Test(layouts, te_block_128x128) {
  run_combo(XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_128x128);
}
Test(layouts, deepgemm_1x128) {
  run_combo(XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_1x128);
}
Test(layouts, deepgemm_128x128) {
  run_combo(XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_128x128);
}
Test(layouts, deepgemm_ue8m0_1x128) {
  run_combo(XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALING_BLOCK_1x128);
}
Test(layouts, deepgemm_ue8m0_128x128) {
  run_combo(XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALING_BLOCK_128x128);
}
Test(layouts, mtfp8_1x128) {
  run_combo(XTE_RECIPE_MTFP8, XTE_SCALING_BLOCK_1x128);
}
Test(layouts, mtfp8_128x128) {
  run_combo(XTE_RECIPE_MTFP8, XTE_SCALING_BLOCK_128x128);
}
Test(layouts, mx_te) {
  run_combo(XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32);
}
Test(layouts, mx_ocp) {
  run_combo(XTE_RECIPE_MX_OCP, XTE_SCALING_MXFP8_1x32);
}
Test(layouts, te_current) {
  run_combo(XTE_RECIPE_TE_CURRENT, XTE_SCALING_PER_TENSOR);
}
Test(layouts, te_delayed) {
  run_combo(XTE_RECIPE_TE_DELAYED, XTE_SCALING_PER_TENSOR);
}

/* The swizzle formula itself on the facts' anchor: in-tile offset (r%32)*16 + (r/32)*4 + c. */
Test(layouts, swizzle_formula_anchor) {
  const combo cb = {XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32};
  lmap m = layout_of(&cb, XTE_SCALE_LAYOUT_MX_SWIZZLED, 300, 9, 0);
  cr_expect_eq(m.rows, 384);
  cr_expect_eq(m.cols, 12);
  cr_expect_eq(lmap_index(&m, 0, 0), 0);
  cr_expect_eq(lmap_index(&m, 1, 0), 16);
  cr_expect_eq(lmap_index(&m, 32, 0), 4);
  cr_expect_eq(lmap_index(&m, 33, 3), 16 + 4 + 3);
  cr_expect_eq(lmap_index(&m, 0, 4), 512);       /* next tile along the row of tiles */
  cr_expect_eq(lmap_index(&m, 128, 0), 3 * 512); /* next tile row: 3 tiles per row */
  cr_expect_eq(lmap_index(&m, 127, 11), 2 * 512 + 31 * 16 + 3 * 4 + 3);
}

/* Strided views: an input with ld > K, rowwise / columnwise outputs with ld > their columns and a
 * rank-3 input give the dense results, and the gaps between rows are never written. Empty inputs
 * (M = 0 or K = 0) succeed. */
static void strided_case(const combo *cb, int64_t M, int64_t K) {
  const int mx = is_mx(cb->recipe), tr = transposes(cb->recipe);
  const int64_t ldi = K + 13, ldr = K + 5, cR = tr ? K : M, cC = tr ? M : K, ldc = cC + 7;
  float *dense = malloc((size_t)(M * K) * 4), *wide = malloc((size_t)(M * ldi) * 4);
  uint8_t *rq = malloc((size_t)(M * ldr)), *cq = malloc((size_t)(cR * ldc));
  uint8_t *rs = malloc(1 << 16), *cs = malloc(1 << 16);
  qrun ref;
  xte_qtensor q;
  xte_tensor x;
  int64_t i, j, r, c;
  float amax, s = 2.0f; /* q.scale: the per-tensor scale out (used by both calls below) */
  cr_assert(dense && wide && rq && cq && rs && cs);
  gen_input(dense, XTE_DTYPE_FP32, M, K, (unsigned)(M * 3 + K));
  for (i = 0; i < M; i++)
    for (j = 0; j < ldi; j++) wide[i * ldi + j] = j < K ? dense[i * K + j] : NAN;
  quant(cb, XTE_SCALE_LAYOUT_COMPACT, 3, dense, XTE_DTYPE_FP32, M, K, 0, &ref);
  memset(rq, 0xA5, (size_t)(M * ldr));
  memset(cq, 0xA5, (size_t)(cR * ldc));
  memset(&q, 0, sizeof q);
  x = xte_tensor_2d(wide, XTE_DTYPE_FP32, M, K);
  x.ld = ldi;
  q.rowwise = xte_tensor_2d(rq, XTE_DTYPE_E4M3, M, K);
  q.rowwise.ld = ldr;
  q.columnwise = xte_tensor_2d(cq, XTE_DTYPE_E4M3, cR, cC);
  q.columnwise.ld = ldc;
  q.rowwise_scale_inv.data = rs;
  q.rowwise_scale_inv.dtype = mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
  q.rowwise_scale_inv.rows = ref.sr[0];
  q.rowwise_scale_inv.cols = ref.sc[0];
  q.columnwise_scale_inv = q.rowwise_scale_inv;
  q.columnwise_scale_inv.data = cs;
  q.columnwise_scale_inv.rows = ref.sr[1];
  q.columnwise_scale_inv.cols = ref.sc[1];
  q.scaling_mode = cb->mode;
  q.recipe = cb->recipe;
  q.amax = &amax;
  q.scale = &s;
  cr_assert_eq(xte_quantize(&x, &q, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
  for (r = 0; r < M; r++)
    for (c = 0; c < ldr; c++)
      if (rq[r * ldr + c] != (c < K ? ref.q[0][r * K + c] : 0xA5)) {
        cr_log_error("recipe %d mode %d strided rowwise [%lld, %lld] wrong", (int)cb->recipe,
                     (int)cb->mode, (long long)r, (long long)c);
        n_bad++;
        r = M;
        break;
      }
  for (r = 0; r < cR; r++)
    for (c = 0; c < ldc; c++)
      if (cq[r * ldc + c] != (c < cC ? ref.q[1][r * cC + c] : 0xA5)) {
        cr_log_error("recipe %d mode %d strided columnwise [%lld, %lld] wrong", (int)cb->recipe,
                     (int)cb->mode, (long long)r, (long long)c);
        n_bad++;
        r = cR;
        break;
      }
  same_bytes("strided", "rowwise scales", rs, ref.s[0], (size_t)ref.sn[0] * (mx ? 1 : 4));
  same_bytes("strided", "columnwise scales", cs, ref.s[1], (size_t)ref.sn[1] * (mx ? 1 : 4));
  cr_expect_eq(memcmp(&amax, &ref.amax, 4), 0);
  /* dequantize into a strided output */
  {
    float *o = malloc((size_t)(M * (K + 3)) * 4), *od = malloc((size_t)(M * K) * 4);
    xte_tensor y = xte_tensor_2d(o, XTE_DTYPE_FP32, M, K),
               yd = xte_tensor_2d(od, XTE_DTYPE_FP32, M, K);
    cr_assert(o && od);
    y.ld = K + 3;
    memset(o, 0xA5, (size_t)(M * (K + 3)) * 4);
    cr_assert_eq(xte_dequantize(&q, 0, &y, NULL), XTE_SUCCESS, "%s", xte_last_error());
    q.rowwise.ld = 0;
    q.rowwise.data = ref.q[0];
    cr_assert_eq(xte_dequantize(&q, 0, &yd, NULL), XTE_SUCCESS, "%s", xte_last_error());
    for (r = 0; r < M; r++) {
      cr_expect_eq(memcmp(o + r * (K + 3), od + r * K, (size_t)K * 4), 0, "strided dequantize");
      cr_expect_eq(((uint32_t *)o)[r * (K + 3) + K], 0xA5A5A5A5u, "gap written");
    }
    free(o);
    free(od);
  }
  /* rank 3: [2, M/2, K] is the same 2-D view when M is even */
  if (M % 2 == 0) {
    xte_tensor x3 = xte_tensor_2d(dense, XTE_DTYPE_FP32, 2, M / 2);
    x3.rank = 3;
    x3.shape[2] = K;
    q.rowwise = xte_tensor_2d(rq, XTE_DTYPE_E4M3, M, K);
    q.columnwise = xte_tensor_2d(cq, XTE_DTYPE_E4M3, cR, cC);
    cr_assert_eq(xte_quantize(&x3, &q, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
    same_bytes("rank 3", "rowwise data", rq, ref.q[0], (size_t)(M * K));
    same_bytes("rank 3", "columnwise data", cq, ref.q[1], (size_t)(M * K));
  }
  qrun_free(&ref);
  free(dense);
  free(wide);
  free(rq);
  free(cq);
  free(rs);
  free(cs);
}

Test(layouts, strided_views_and_empty) {
  static const combo all[] = {
      {XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128},
      {XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_128x128},
      {XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_1x128},
      {XTE_RECIPE_MTFP8, XTE_SCALING_BLOCK_1x128},
      {XTE_RECIPE_MTFP8, XTE_SCALING_BLOCK_128x128},
      {XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32},
      {XTE_RECIPE_MX_OCP, XTE_SCALING_MXFP8_1x32},
      {XTE_RECIPE_TE_CURRENT, XTE_SCALING_PER_TENSOR},
      {XTE_RECIPE_TE_DELAYED, XTE_SCALING_PER_TENSOR},
  };
  size_t i;
  int isa;
  xte_cpu_isa saved = xte_cpu_get_isa();
  n_bad = 0;
  for (isa = 0; isa < XTE_CPU_ISA_COUNT; isa++) {
    if (xte_cpu_set_isa((xte_cpu_isa)isa) != XTE_SUCCESS) continue;
    for (i = 0; i < sizeof all / sizeof all[0]; i++) {
      strided_case(&all[i], 150, 300);
      strided_case(&all[i], 33, 17);
    }
  }
  xte_cpu_set_isa(saved);
  for (i = 0; i < sizeof all / sizeof all[0]; i++) {
    static const int64_t empty[][2] = {{0, 256}, {5, 0}, {0, 0}};
    size_t e;
    for (e = 0; e < 3; e++) {
      qrun r;
      float none[1] = {0.0f};
      quant(&all[i], XTE_SCALE_LAYOUT_COMPACT, 3, none, XTE_DTYPE_FP32, empty[e][0], empty[e][1], 0,
            &r);
      cr_expect_eq(r.amax, 0.0f);
      qrun_free(&r);
    }
  }
  cr_expect_eq(n_bad, 0, "%ld failed checks", n_bad);
}

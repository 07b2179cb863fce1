/* The table of valid calls (tests/calls/calls.h): one case per entry point and variant, shapes
 * small but with a few hundred rows, so that the CPU pool splits every call over its threads. */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include "calls.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ context */

void *calls_alloc(calls_ctx *c, size_t bytes) {
  void *p = NULL;
  size_t n = (bytes + 64 + 63) / 64 * 64; /* slack past the end, a whole number of lines */
  if (c->nbufs >= CALLS_MAX_BUFS) return NULL;
  if (posix_memalign(&p, 64, n) != 0) return NULL;
  memset(p, 0, n);
  c->bufs[c->nbufs++] = p;
  return p;
}

void calls_output(calls_ctx *c, void *p, size_t bytes, const char *name) {
  if (c->nout >= CALLS_MAX_OUT) {
    fprintf(stderr, "calls: too many outputs (%s)\n", name);
    abort();
  }
  c->out[c->nout].p = p;
  c->out[c->nout].bytes = bytes;
  c->out[c->nout].name = name;
  c->nout++;
}

void calls_free(calls_ctx *c) {
  int i;
  if (c->cleanup) c->cleanup(c);
  for (i = 0; i < c->nbufs; i++) free(c->bufs[i]);
  memset(c, 0, sizeof *c);
}

static int fail(calls_ctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return 1;
}

/* the state struct of a case */
#define STATE(T)                                 \
  T *s = (T *)calls_alloc(c, sizeof(T));         \
  if (!s) return fail(c, "out of buffer slots"); \
  c->state = s
#define ALLOC(p, T, n)                                        \
  do {                                                        \
    (p) = (T *)calls_alloc(c, sizeof(T) * (size_t)(n));       \
    if (!(p)) return fail(c, "out of buffer slots (%s)", #p); \
  } while (0)
#define TRY_X(call)                                                                   \
  do {                                                                                \
    xte_status st_ = (call);                                                          \
    if (st_ != XTE_SUCCESS)                                                           \
      return fail(c, "%s: %s (%s)", #call, xte_status_string(st_), xte_last_error()); \
  } while (0)

void calls_fill_sentinel(calls_ctx *c) {
  int o;
  size_t i;
  for (o = 0; o < c->nout; o++)
    for (i = 0; i < c->out[o].bytes; i++) ((uint8_t *)c->out[o].p)[i] = calls_sentinel(o, i);
}

size_t calls_out_bytes(const calls_ctx *c) {
  size_t n = 0;
  int o;
  for (o = 0; o < c->nout; o++) n += c->out[o].bytes;
  return n;
}

void calls_snapshot(const calls_ctx *c, uint8_t *dst) {
  int o;
  for (o = 0; o < c->nout; o++) {
    memcpy(dst, c->out[o].p, c->out[o].bytes);
    dst += c->out[o].bytes;
  }
}

int64_t calls_compare(const calls_ctx *c, const uint8_t *snap, int *oo, size_t *off) {
  int64_t base = 0;
  int o;
  for (o = 0; o < c->nout; o++) {
    const uint8_t *p = (const uint8_t *)c->out[o].p;
    if (memcmp(p, snap, c->out[o].bytes) != 0) {
      size_t i = 0;
      while (p[i] == snap[i]) i++;
      *oo = o;
      *off = i;
      return base + (int64_t)i;
    }
    snap += c->out[o].bytes;
    base += (int64_t)c->out[o].bytes;
  }
  return -1;
}

int64_t calls_check_sentinel(const calls_ctx *c, int *oo, size_t *off) {
  int64_t base = 0;
  int o;
  size_t i;
  for (o = 0; o < c->nout; o++) {
    const uint8_t *p = (const uint8_t *)c->out[o].p;
    for (i = 0; i < c->out[o].bytes; i++)
      if (p[i] != calls_sentinel(o, i)) {
        *oo = o;
        *off = i;
        return base + (int64_t)i;
      }
    base += (int64_t)c->out[o].bytes;
  }
  return -1;
}

int calls_match(const char *name, const char *filter) {
  return !filter || !*filter || strstr(name, filter) != NULL;
}

const char *calls_filter(int argc, char **argv) {
  int i;
  for (i = 1; i < argc; i++) {
    if (argv[i][0] == '-') {
      if (argv[i][1] == '-' && !strchr(argv[i], '=') && i + 1 < argc && argv[i + 1][0] != '-')
        i++; /* "--jobs 1": skip the value */
      continue;
    }
    return argv[i];
  }
  return NULL;
}

/* ------------------------------------------------------------------ data */

static uint32_t rnd(calls_ctx *c) {
  c->rng ^= c->rng << 13;
  c->rng ^= c->rng >> 7;
  c->rng ^= c->rng << 17;
  return (uint32_t)(c->rng >> 11);
}

static float rnd_f(calls_ctx *c) { /* uniform in [-1, 1) */
  return (float)((double)(rnd(c) & 0xFFFFFF) / 8388608.0 - 1.0);
}

static float special(calls_ctx *c) {
  static const uint32_t bits[] = {0x7FC00000u, 0xFFC00001u, 0x7F800000u, 0xFF800000u,
                                  0x00000001u, 0x80012345u, 0x007FFFFFu, 0x80000000u};
  float f;
  uint32_t u = bits[rnd(c) % 8];
  memcpy(&f, &u, 4);
  return f;
}

/* n fp32 values: scale * [-1, 1); with specials, about one in 61 is NaN / inf / subnormal /
 * -0 (no inf when specials == 2). */
static void fill_f32(calls_ctx *c, float *p, int64_t n, float scale, int specials) {
  int64_t i;
  for (i = 0; i < n; i++) {
    p[i] = rnd_f(c) * scale;
    if (specials && rnd(c) % 61 == 0) {
      float f = special(c);
      if (specials == 2 && isinf(f)) f = 1e-41f;
      p[i] = f;
    }
  }
}

static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static void fill_bf16(calls_ctx *c, uint16_t *p, int64_t n, float scale, int specials) {
  int64_t i;
  for (i = 0; i < n; i++) {
    float f = rnd_f(c) * scale;
    if (specials && rnd(c) % 61 == 0) {
      f = special(c);
      if (specials == 2 && isinf(f)) f = 1e-39f;
    }
    p[i] = to_bf16(f);
  }
}

/* a float / bf16 buffer of n elements, filled */
static void *data(calls_ctx *c, xte_dtype dt, int64_t n, float scale, int specials) {
  void *p = calls_alloc(c, xte_dtype_size(dt) * (size_t)n);
  if (!p) return NULL;
  if (dt == XTE_DTYPE_FP32)
    fill_f32(c, (float *)p, n, scale, specials);
  else if (dt == XTE_DTYPE_BF16)
    fill_bf16(c, (uint16_t *)p, n, scale, specials);
  else {
    int64_t i;
    for (i = 0; i < n * (int64_t)xte_dtype_size(dt); i++) ((uint8_t *)p)[i] = (uint8_t)rnd(c);
  }
  return p;
}

/* an output tensor [r, cols], listed */
static int out2d(calls_ctx *c, xte_tensor *t, xte_dtype dt, int64_t r, int64_t cols,
                 const char *name) {
  size_t bytes = xte_dtype_size(dt) * (size_t)(r * (cols ? cols : 1));
  void *p = calls_alloc(c, bytes);
  if (!p) return fail(c, "out of buffer slots (%s)", name);
  *t = xte_tensor_2d(p, dt, r, cols);
  if (cols == 0) *t = xte_tensor_1d(p, dt, r);
  calls_output(c, p, bytes, name);
  return 0;
}

/* ------------------------------------------------------------------ quantized tensors */

static int is_mx(xte_recipe r) {
  return r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP;
}

/* Buffers of a qtensor for an [M, K] input (rowwise, and columnwise when col), listed as outputs
 * when as_out. */
static int make_q(calls_ctx *c, xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode,
                  xte_recipe rec, xte_scale_layout lay, xte_dtype dt, int col, int as_out) {
  int mx = is_mx(rec), tr = !(mx || rec == XTE_RECIPE_MTFP8), k;
  size_t es = mx ? 1 : 4;
  memset(q, 0, sizeof *q);
  q->scaling_mode = mode;
  q->recipe = rec;
  for (k = 0; k < 1 + (col != 0); k++) {
    int64_t sr, sc;
    xte_scale_tensor *s = k ? &q->columnwise_scale_inv : &q->rowwise_scale_inv;
    void *d = calls_alloc(c, (size_t)(M * K)), *sd;
    TRY_X(xte_quantize_scale_shape(M, K, mode, rec, lay, k, &sr, &sc));
    sd = calls_alloc(c, (size_t)(sr * sc) * es);
    if (!d || !sd) return fail(c, "out of buffer slots (qtensor)");
    if (k)
      q->columnwise = tr ? xte_tensor_2d(d, dt, K, M) : xte_tensor_2d(d, dt, M, K);
    else
      q->rowwise = xte_tensor_2d(d, dt, M, K);
    s->data = sd;
    s->dtype = mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
    s->rows = sr;
    s->cols = sc;
    s->layout = lay;
    if (as_out) {
      calls_output(c, d, (size_t)(M * K), k ? "columnwise" : "rowwise");
      calls_output(c, sd, (size_t)(sr * sc) * es, k ? "columnwise_scale_inv" : "rowwise_scale_inv");
    }
  }
  return 0;
}

/* A quantized operand from fp32 data x [M, K] (an input of a later call). */
static int quantized(calls_ctx *c, xte_qtensor *q, const float *x, int64_t M, int64_t K,
                     xte_scaling_mode mode, xte_recipe rec, xte_scale_layout lay, xte_dtype dt,
                     int col) {
  xte_tensor in = xte_tensor_2d((void *)x, XTE_DTYPE_FP32, M, K);
  if (make_q(c, q, M, K, mode, rec, lay, dt, col, 0)) return 1;
  TRY_X(xte_quantize(&in, q, NULL, NULL));
  return 0;
}

/* ------------------------------------------------------------------ quantize, dequantize, cast */

typedef struct q_state {
  xte_tensor in, out;
  xte_qtensor q;
  xte_quant_config cfg;
  int columnwise, saturate;
} q_state;

static int quant_setup(calls_ctx *c, int64_t M, int64_t K, xte_dtype in_dt, int specials,
                       xte_scaling_mode mode, xte_recipe rec, xte_scale_layout lay, xte_dtype dt,
                       int amax, int scale) {
  STATE(q_state);
  void *x = data(c, in_dt, M * K, 3.0f, specials);
  if (!x) return fail(c, "out of buffer slots");
  s->in = xte_tensor_2d(x, in_dt, M, K);
  s->cfg = xte_quant_config_default();
  if (make_q(c, &s->q, M, K, mode, rec, lay, dt, 1, 1)) return 1;
  if (amax) {
    ALLOC(s->q.amax, float, 1);
    calls_output(c, s->q.amax, 4, "amax");
  }
  if (scale) {
    ALLOC(s->q.scale, float, 1);
    calls_output(c, s->q.scale, 4, "scale");
  }
  return 0;
}

static xte_status quant_run(calls_ctx *c) {
  q_state *s = (q_state *)c->state;
  return xte_quantize(&s->in, &s->q, &s->cfg, NULL);
}

static int setup_quantize_1x128(calls_ctx *c) {
  return quant_setup(c, 300, 400, XTE_DTYPE_FP32, 1, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                     XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3, 1, 0);
}
static int setup_quantize_128x128(calls_ctx *c) {
  return quant_setup(c, 300, 384, XTE_DTYPE_BF16, 1, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                     XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E4M3, 1, 0);
}
static int setup_quantize_mxfp8(calls_ctx *c) {
  return quant_setup(c, 256, 320, XTE_DTYPE_BF16, 1, XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE,
                     XTE_SCALE_LAYOUT_MX_SWIZZLED, XTE_DTYPE_E4M3, 1, 0);
}
static int setup_quantize_current(calls_ctx *c) {
  return quant_setup(c, 300, 256, XTE_DTYPE_FP32, 2, XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT,
                     XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E5M2, 1, 1);
}

static int dequant_setup(calls_ctx *c, xte_scaling_mode mode, int col, xte_dtype out_dt) {
  const int64_t M = 300, K = 384;
  STATE(q_state);
  float *x = (float *)data(c, XTE_DTYPE_FP32, M * K, 5.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  if (quantized(c, &s->q, x, M, K, mode, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT,
                XTE_DTYPE_E4M3, 1))
    return 1;
  s->columnwise = col;
  return out2d(c, &s->out, out_dt, col ? K : M, col ? M : K, "out");
}

static xte_status dequant_run(calls_ctx *c) {
  q_state *s = (q_state *)c->state;
  return xte_dequantize(&s->q, s->columnwise, &s->out, NULL);
}

static int setup_dequantize_1x128_col(calls_ctx *c) {
  return dequant_setup(c, XTE_SCALING_BLOCK_1x128, 1, XTE_DTYPE_FP32);
}
static int setup_dequantize_128x128(calls_ctx *c) {
  return dequant_setup(c, XTE_SCALING_BLOCK_128x128, 0, XTE_DTYPE_BF16);
}

static int cast_setup(calls_ctx *c, xte_dtype in_dt, xte_dtype out_dt, int saturate) {
  const int64_t M = 300, K = 256;
  STATE(q_state);
  void *x = data(c, in_dt, M * K, 1000.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  s->in = xte_tensor_2d(x, in_dt, M, K);
  s->saturate = saturate;
  return out2d(c, &s->out, out_dt, M, K, "out");
}

static xte_status cast_run(calls_ctx *c) {
  q_state *s = (q_state *)c->state;
  return xte_cast(&s->in, &s->out, s->saturate, NULL);
}

static int setup_cast_fp32_e5m2(calls_ctx *c) {
  return cast_setup(c, XTE_DTYPE_FP32, XTE_DTYPE_E5M2, 0);
}
static int setup_cast_e4m3_bf16(calls_ctx *c) {
  return cast_setup(c, XTE_DTYPE_E4M3, XTE_DTYPE_BF16, 1);
}

/* ------------------------------------------------------------------ GEMM */

typedef struct g_state {
  xte_qtensor A, B;
  xte_tensor C, D, bias, masked_m;
  xte_gemm_config cfg;
  xte_gemm_groups groups;
  int64_t sizes[8];
  int grouped;
} g_state;

static xte_status gemm_run(calls_ctx *c) {
  g_state *s = (g_state *)c->state;
  if (s->grouped)
    return xte_gemm_grouped(&s->A, &s->B, s->cfg.accumulate ? &s->C : NULL, &s->D, &s->groups,
                            &s->cfg, NULL);
  return xte_gemm(&s->A, &s->B, s->cfg.accumulate ? &s->C : NULL, &s->D, &s->cfg, NULL);
}

/* A 1x128 [M, K] x B 128x128 (X [N, K], or X [K, N] with trans_b) */
static int gemm_setup(calls_ctx *c, int trans_b, int acc_bias, xte_dtype d_dt) {
  const int64_t M = 200, N = 256, K = 384;
  STATE(g_state);
  float *xa = (float *)data(c, XTE_DTYPE_FP32, M * K, 2.0f, 2);
  float *xb = (float *)data(c, XTE_DTYPE_FP32, N * K, 2.0f, 2);
  if (!xa || !xb) return fail(c, "out of buffer slots");
  s->cfg = xte_gemm_config_default();
  s->cfg.trans_b = trans_b;
  if (quantized(c, &s->A, xa, M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E4M3, 0) ||
      quantized(c, &s->B, xb, trans_b ? K : N, trans_b ? N : K, XTE_SCALING_BLOCK_128x128,
                XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3, 0))
    return 1;
  if (acc_bias) {
    void *cd = data(c, XTE_DTYPE_FP32, M * N, 100.0f, 0),
         *bd = data(c, XTE_DTYPE_FP32, N, 10.0f, 0);
    if (!cd || !bd) return fail(c, "out of buffer slots");
    s->C = xte_tensor_2d(cd, XTE_DTYPE_FP32, M, N);
    s->bias = xte_tensor_1d(bd, XTE_DTYPE_FP32, N);
    s->cfg.accumulate = 1;
    s->cfg.bias = &s->bias;
  }
  return out2d(c, &s->D, d_dt, M, N, "D");
}

static int setup_gemm_1x128_128x128(calls_ctx *c) {
  return gemm_setup(c, 0, 0, XTE_DTYPE_BF16);
}
static int setup_gemm_trans_b_acc_bias(calls_ctx *c) {
  return gemm_setup(c, 1, 1, XTE_DTYPE_FP32);
}

/* contiguous (masked = 0) or masked M-grouped */
static int grouped_m_setup(calls_ctx *c, int masked) {
  enum { G = 4, N = 128, K = 256, ALIGN = 128, MMAX = 130 };
  const int64_t sizes[G] = {70, 0, 130, 37};
  int64_t rows = 0, g;
  int32_t *mm;
  float *xa, *xb;
  STATE(g_state);
  for (g = 0; g < G; g++) {
    s->sizes[g] = sizes[g];
    rows += masked ? MMAX : (sizes[g] + ALIGN - 1) / ALIGN * ALIGN;
  }
  xa = (float *)data(c, XTE_DTYPE_FP32, rows * K, 2.0f, 2);
  xb = (float *)data(c, XTE_DTYPE_FP32, G * N * K, 2.0f, 2);
  ALLOC(mm, int32_t, G);
  if (!xa || !xb) return fail(c, "out of buffer slots");
  for (g = 0; g < G; g++) mm[g] = (int32_t)sizes[g];
  s->masked_m = xte_tensor_1d(mm, XTE_DTYPE_INT32, G);
  s->cfg = xte_gemm_config_default();
  s->grouped = 1;
  s->groups.kind = masked ? XTE_GEMM_GROUPED_MASKED : XTE_GEMM_GROUPED_CONTIGUOUS;
  s->groups.num_groups = G;
  s->groups.group_sizes = s->sizes;
  s->groups.alignment = ALIGN;
  s->groups.masked_m = &s->masked_m;
  if (quantized(c, &s->A, xa, rows, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3, 0) ||
      quantized(c, &s->B, xb, G * N, K, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3, 0))
    return 1;
  return out2d(c, &s->D, XTE_DTYPE_FP32, rows, N, "D");
}

static int setup_gemm_grouped_contiguous(calls_ctx *c) {
  return grouped_m_setup(c, 0);
}
static int setup_gemm_grouped_masked(calls_ctx *c) {
  return grouped_m_setup(c, 1);
}

/* K-grouped weight gradient: dY [T, M] and X [T, N] quantized 1x128 with columnwise copies;
 * D[g] = C[g] + dY_g^T X_g. */
static int setup_gemm_grouped_k(calls_ctx *c) {
  enum { G = 3, M = 96, N = 80 };
  const int64_t ks[G] = {128, 0, 200};
  const int64_t T = 328;
  float *xa, *xb;
  void *cd;
  int g;
  STATE(g_state);
  xa = (float *)data(c, XTE_DTYPE_FP32, T * M, 2.0f, 2);
  xb = (float *)data(c, XTE_DTYPE_FP32, T * N, 2.0f, 2);
  cd = data(c, XTE_DTYPE_FP32, G * M * N, 50.0f, 0);
  if (!xa || !xb || !cd) return fail(c, "out of buffer slots");
  for (g = 0; g < G; g++) s->sizes[g] = ks[g];
  s->cfg = xte_gemm_config_default();
  s->cfg.trans_a = s->cfg.trans_b = 1;
  s->cfg.accumulate = 1;
  s->grouped = 1;
  s->groups.kind = XTE_GEMM_GROUPED_K;
  s->groups.num_groups = G;
  s->groups.group_sizes = s->sizes;
  s->C = xte_tensor_2d(cd, XTE_DTYPE_FP32, G * M, N);
  if (quantized(c, &s->A, xa, T, M, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E5M2, 1) ||
      quantized(c, &s->B, xb, T, N, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                XTE_SCALE_LAYOUT_TE_GEMM, XTE_DTYPE_E4M3, 1))
    return 1;
  return out2d(c, &s->D, XTE_DTYPE_FP32, G * M, N, "D");
}

/* ------------------------------------------------------------------ router and aux loss */

typedef struct r_state {
  xte_tensor logits, bias, grad, map, saved, grad_logits, scores, tpe;
  xte_router_config cfg;
  xte_router_outputs out;
  int topk, backward, aux;
  xte_router_score score;
  int64_t total;
  float coeff, grad_aux, *aux_loss;
} r_state;

static xte_status router_run(calls_ctx *c) {
  r_state *s = (r_state *)c->state;
  if (s->aux)
    return s->backward ? xte_router_aux_scores_backward(&s->grad, &s->saved, &s->logits, s->topk,
                                                        s->score, &s->grad_logits, NULL)
                       : xte_router_aux_scores(&s->logits, s->topk, s->score, &s->scores, &s->map,
                                               &s->saved, NULL);
  if (s->backward)
    return xte_router_backward(&s->grad, &s->map, &s->saved, &s->logits, &s->cfg, &s->grad_logits,
                               NULL);
  return xte_router_forward(&s->logits, s->bias.data ? &s->bias : NULL, &s->cfg, &s->out, NULL);
}

/* Router forward (backward = 0) or backward; grouped: sigmoid with 8 groups, bias, bf16. */
static int router_setup(calls_ctx *c, int grouped, int backward) {
  const int64_t T = 300, E = 64;
  STATE(r_state);
  xte_dtype ldt = grouped && !backward ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
  void *x = data(c, ldt, T * E, 4.0f, 1);
  int k = grouped ? 8 : 4;
  if (!x) return fail(c, "out of buffer slots");
  s->logits = xte_tensor_2d(x, ldt, T, E);
  s->cfg = xte_router_config_default();
  s->cfg.topk = k;
  s->backward = backward;
  if (grouped) {
    void *b = calls_alloc(c, 4 * (size_t)E);
    int e;
    if (!b) return fail(c, "out of buffer slots");
    for (e = 0; e < E; e++) ((float *)b)[e] = (float)(rnd(c) % 8) * 0.0625f;
    s->bias = xte_tensor_1d(b, XTE_DTYPE_FP32, E);
    s->cfg.score_function = XTE_ROUTER_SIGMOID;
    s->cfg.num_groups = 8;
    s->cfg.group_topk = 4;
    s->cfg.scaling_factor = 2.5f;
  } else {
    s->cfg.use_pre_softmax = backward;
  }
  if (!backward) {
    memset(&s->out, 0, sizeof s->out);
    if (out2d(c, &s->out.probs, XTE_DTYPE_FP32, T, E, "probs") ||
        out2d(c, &s->out.routing_map, XTE_DTYPE_UINT8, T, E, "routing_map") ||
        out2d(c, &s->out.routing_bits, XTE_DTYPE_UINT8, T, (E + 7) / 8, "routing_bits") ||
        out2d(c, &s->out.topk_idx, grouped ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64, T, k, "topk_idx") ||
        out2d(c, &s->out.topk_weights, XTE_DTYPE_FP32, T, k, "topk_weights") ||
        out2d(c, &s->out.saved, XTE_DTYPE_FP32, T, E, "saved"))
      return 1;
    return 0;
  }
  {
    xte_router_outputs o;
    void *m = calls_alloc(c, (size_t)(T * E)), *sv = calls_alloc(c, 4 * (size_t)(T * E));
    void *g = data(c, XTE_DTYPE_FP32, T * E, 1.0f, 0);
    if (!m || !sv || !g) return fail(c, "out of buffer slots");
    memset(&o, 0, sizeof o);
    o.routing_map = s->map = xte_tensor_2d(m, XTE_DTYPE_UINT8, T, E);
    o.saved = s->saved = xte_tensor_2d(sv, XTE_DTYPE_FP32, T, E);
    s->grad = xte_tensor_2d(g, XTE_DTYPE_FP32, T, E);
    TRY_X(xte_router_forward(&s->logits, s->bias.data ? &s->bias : NULL, &s->cfg, &o, NULL));
    return out2d(c, &s->grad_logits, grouped ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, T, E,
                 "grad_logits");
  }
}

static int setup_router_fwd_softmax(calls_ctx *c) {
  return router_setup(c, 0, 0);
}
static int setup_router_fwd_sigmoid_grouped(calls_ctx *c) {
  return router_setup(c, 1, 0);
}
static int setup_router_bwd_softmax(calls_ctx *c) {
  return router_setup(c, 0, 1);
}
static int setup_router_bwd_sigmoid_grouped(calls_ctx *c) {
  return router_setup(c, 1, 1);
}

static int aux_scores_setup(calls_ctx *c, xte_router_score score, int backward) {
  const int64_t T = 300, E = 40;
  STATE(r_state);
  void *x = data(c, XTE_DTYPE_FP32, T * E, 3.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  s->aux = 1;
  s->backward = backward;
  s->topk = 4;
  s->score = score;
  s->logits = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
  if (!backward)
    return out2d(c, &s->scores, XTE_DTYPE_FP32, T, E, "scores") ||
           out2d(c, &s->map, XTE_DTYPE_UINT8, T, E, "routing_map") ||
           out2d(c, &s->saved, XTE_DTYPE_FP32, T, E, "saved");
  {
    void *sc = calls_alloc(c, 4 * (size_t)(T * E)), *sv = calls_alloc(c, 4 * (size_t)(T * E));
    void *g = data(c, XTE_DTYPE_FP32, T * E, 1.0f, 0);
    xte_tensor st;
    if (!sc || !sv || !g) return fail(c, "out of buffer slots");
    st = xte_tensor_2d(sc, XTE_DTYPE_FP32, T, E);
    s->saved = xte_tensor_2d(sv, XTE_DTYPE_FP32, T, E);
    s->grad = xte_tensor_2d(g, XTE_DTYPE_FP32, T, E);
    TRY_X(xte_router_aux_scores(&s->logits, s->topk, score, &st, NULL, &s->saved, NULL));
    return out2d(c, &s->grad_logits, XTE_DTYPE_FP32, T, E, "grad_logits");
  }
}

static int setup_aux_scores_softmax(calls_ctx *c) {
  return aux_scores_setup(c, XTE_ROUTER_SOFTMAX, 0);
}
static int setup_aux_scores_sigmoid(calls_ctx *c) {
  return aux_scores_setup(c, XTE_ROUTER_SIGMOID, 0);
}
static int setup_aux_scores_bwd_softmax(calls_ctx *c) {
  return aux_scores_setup(c, XTE_ROUTER_SOFTMAX, 1);
}
static int setup_aux_scores_bwd_sigmoid(calls_ctx *c) {
  return aux_scores_setup(c, XTE_ROUTER_SIGMOID, 1);
}

static xte_status aux_loss_run(calls_ctx *c) {
  r_state *s = (r_state *)c->state;
  if (s->backward)
    return xte_moe_aux_loss_backward(&s->tpe, s->total, s->topk, s->coeff, s->grad_aux,
                                     &s->grad_logits, NULL);
  return xte_moe_aux_loss_forward(&s->scores, &s->tpe, s->total, s->topk, s->coeff, s->aux_loss,
                                  NULL);
}

static int aux_loss_setup(calls_ctx *c, int backward) {
  const int64_t T = 2100, E = 32; /* more than two 1024-token blocks */
  int64_t *tpe, e;
  STATE(r_state);
  void *p = data(c, XTE_DTYPE_FP32, T * E, 1.0f, 0);
  ALLOC(tpe, int64_t, E);
  if (!p) return fail(c, "out of buffer slots");
  for (e = 0; e < E; e++) tpe[e] = rnd(c) % 1000;
  s->scores = xte_tensor_2d(p, XTE_DTYPE_FP32, T, E);
  s->tpe = xte_tensor_1d(tpe, XTE_DTYPE_INT64, E);
  s->total = T;
  s->topk = 4;
  s->coeff = 1e-2f;
  s->grad_aux = 0.75f;
  s->backward = backward;
  if (backward) return out2d(c, &s->grad_logits, XTE_DTYPE_FP32, T, E, "grad_probs");
  ALLOC(s->aux_loss, float, 1);
  calls_output(c, s->aux_loss, 4, "aux_loss");
  return 0;
}

static int setup_aux_loss_fwd(calls_ctx *c) {
  return aux_loss_setup(c, 0);
}
static int setup_aux_loss_bwd(calls_ctx *c) {
  return aux_loss_setup(c, 1);
}

/* Quantile Balancing (xte_router_qb_forward), the aux scores with a bit map and the
 * sequence-level aux loss (the _ex entry points). */
typedef struct qb_state {
  xte_tensor logits, bias, cutoff, hist, scores, bits, saved, tpe, grad;
  xte_router_outputs out;
  float *aux_loss;
  int which; /* 0 QB, 1 aux scores bits, 2 aux loss forward, 3 aux loss backward */
} qb_state;

static xte_status qb_run(calls_ctx *c) {
  qb_state *s = (qb_state *)c->state;
  switch (s->which) {
    case 0:
      return xte_router_qb_forward(&s->logits, &s->bias, 8, 1.5f, -1.2f, 1.2f, &s->out, &s->cutoff,
                                   &s->hist, NULL);
    case 1:
      return xte_router_aux_scores_ex(&s->logits, 4, XTE_ROUTER_SQRTSOFTPLUS, &s->scores, NULL,
                                      &s->bits, &s->saved, NULL);
    case 2:
      return xte_moe_aux_loss_forward_ex(&s->scores, &s->tpe, 1500, 32, 4, 1e-2f, s->aux_loss,
                                         NULL);
    default:
      return xte_moe_aux_loss_backward_ex(&s->tpe, 1500, 32, 4, 1e-2f, 0.75f, &s->grad, NULL);
  }
}

static int qb_setup(calls_ctx *c, int which) {
  const int64_t T = 300, E = 96, bins = 50;
  STATE(qb_state);
  void *x = data(c, XTE_DTYPE_FP32, T * E, 3.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  s->which = which;
  s->logits = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
  if (which == 0) {
    void *b = data(c, XTE_DTYPE_FP32, E, 0.2f, 0), *h = calls_alloc(c, 4 * (size_t)(E * bins));
    if (!b || !h) return fail(c, "out of buffer slots");
    memset(h, 0, 4 * (size_t)(E * bins));
    s->bias = xte_tensor_1d(b, XTE_DTYPE_FP32, E);
    s->hist = xte_tensor_2d(h, XTE_DTYPE_INT32, E, bins);
    calls_output(c, h, 4 * (size_t)(E * bins), "histogram");
    memset(&s->out, 0, sizeof s->out);
    return out2d(c, &s->out.probs, XTE_DTYPE_FP32, T, E, "probs") ||
           out2d(c, &s->out.routing_bits, XTE_DTYPE_UINT8, T, (E + 7) / 8, "routing_bits") ||
           out2d(c, &s->out.topk_idx, XTE_DTYPE_INT32, T, 8, "topk_idx") ||
           out2d(c, &s->out.saved, XTE_DTYPE_FP32, T, E, "saved") ||
           out2d(c, &s->cutoff, XTE_DTYPE_FP32, T, 1, "cutoff");
  }
  if (which == 1)
    return out2d(c, &s->scores, XTE_DTYPE_FP32, T, E, "scores") ||
           out2d(c, &s->bits, XTE_DTYPE_UINT8, T, (E + 7) / 8, "routing_bits") ||
           out2d(c, &s->saved, XTE_DTYPE_FP32, T, E, "saved");
  {
    /* 3 sequences of 32 experts: tokens_per_expert fp32 [96] */
    float *tpe;
    int64_t e;
    ALLOC(tpe, float, E);
    for (e = 0; e < E; e++) tpe[e] = (float)(rnd(c) % 1000);
    s->tpe = xte_tensor_1d(tpe, XTE_DTYPE_FP32, E);
    s->scores = xte_tensor_2d(x, XTE_DTYPE_FP32, T, E);
    if (which == 3) return out2d(c, &s->grad, XTE_DTYPE_FP32, T, E, "grad_probs");
    ALLOC(s->aux_loss, float, 1);
    calls_output(c, s->aux_loss, 4, "aux_loss");
    return 0;
  }
}

static int setup_router_qb(calls_ctx *c) {
  return qb_setup(c, 0);
}
static int setup_aux_scores_bits(calls_ctx *c) {
  return qb_setup(c, 1);
}
static int setup_aux_loss_seq_fwd(calls_ctx *c) {
  return qb_setup(c, 2);
}
static int setup_aux_loss_seq_bwd(calls_ctx *c) {
  return qb_setup(c, 3);
}

/* ------------------------------------------------------------------ token movement */

enum {
  P_ROWS,
  P_PERMUTE,
  P_UNPERMUTE,
  P_PERMUTE_BWD,
  P_UNPERMUTE_BWD,
  P_SORT,
  P_SORT_BWD,
  P_LAYOUT
};

typedef struct p_state {
  int op;
  xte_tensor map, idx, input, input_scales, output, output_scales, row_map, probs, grad_in,
      grad_probs, split, sorted;
  xte_moe_routing routing;
  xte_permute_config cfg;
  xte_permute_outputs extra;
  int64_t *rows, E;
  int ranks, fp8;
} p_state;

static xte_status perm_run(calls_ctx *c) {
  p_state *s = (p_state *)c->state;
  switch (s->op) {
    case P_ROWS:
      return xte_moe_permute_rows(&s->routing, &s->cfg, s->rows, NULL);
    case P_PERMUTE:
      return xte_moe_permute(&s->input, s->fp8 ? &s->input_scales : NULL, &s->routing, &s->cfg,
                             &s->output, s->fp8 ? &s->output_scales : NULL, &s->row_map, &s->extra,
                             NULL);
    case P_UNPERMUTE:
      return xte_moe_unpermute(&s->input, &s->routing, &s->row_map, &s->probs, &s->output, NULL);
    case P_PERMUTE_BWD:
      return xte_moe_permute_backward(&s->input, &s->routing, &s->row_map, &s->output, NULL);
    case P_UNPERMUTE_BWD:
      return xte_moe_unpermute_backward(&s->grad_in, &s->input, &s->routing, &s->row_map, &s->probs,
                                        &s->output, &s->grad_probs, NULL);
    case P_SORT:
      return xte_moe_sort_chunks_by_index(&s->input, &s->split, &s->sorted, &s->output, &s->row_map,
                                          NULL);
    case P_SORT_BWD:
      return xte_moe_sort_chunks_backward(&s->input, &s->row_map, &s->output, NULL);
    default:
      return xte_moe_dispatch_layout(&s->idx, s->E, s->ranks, &s->extra.tokens_per_expert,
                                     &s->extra.expert_offsets, &s->output, NULL);
  }
}

/* A routing of T tokens over E experts, k distinct experts each; with topk_idx (use_map = 0)
 * about one slot in 7 is -1. */
static int gen_routing(calls_ctx *c, p_state *s, int64_t T, int64_t E, int k, int use_map,
                       xte_dtype idx_dt) {
  uint8_t *map;
  void *idx;
  int64_t t;
  int j, i;
  map = (uint8_t *)calls_alloc(c, (size_t)(T * E));
  idx = calls_alloc(c, 8 * (size_t)(T * k));
  if (!map || !idx) return fail(c, "out of buffer slots");
  for (t = 0; t < T; t++) {
    int64_t sel[16];
    for (j = 0; j < k; j++) {
      int64_t e;
      int dup;
      do {
        e = (int64_t)(rnd(c) % (uint32_t)E);
        dup = 0;
        for (i = 0; i < j; i++) dup |= sel[i] == e;
      } while (dup);
      sel[j] = e;
      map[t * E + e] = 1;
      if (!use_map && rnd(c) % 7 == 0) e = -1;
      if (idx_dt == XTE_DTYPE_INT32)
        ((int32_t *)idx)[t * k + j] = (int32_t)e;
      else
        ((int64_t *)idx)[t * k + j] = e;
    }
  }
  s->map = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
  s->idx = xte_tensor_2d(idx, idx_dt, T, k);
  s->routing.routing_map = use_map ? &s->map : NULL;
  s->routing.topk_idx = use_map ? NULL : &s->idx;
  s->routing.num_experts = E;
  s->E = E;
  s->cfg = xte_permute_config_default();
  s->cfg.num_out_tokens = -1;
  s->cfg.align = 1;
  return 0;
}

#define PT 300
#define PE 16
#define PK 4
#define PH 256

static int setup_permute_rows_map(calls_ctx *c) {
  STATE(p_state);
  s->op = P_ROWS;
  if (gen_routing(c, s, PT, PE, PK, 1, XTE_DTYPE_INT64)) return 1;
  ALLOC(s->rows, int64_t, 1);
  calls_output(c, s->rows, 8, "rows");
  return 0;
}

static int setup_permute_rows_topk_align(calls_ctx *c) {
  STATE(p_state);
  s->op = P_ROWS;
  if (gen_routing(c, s, PT, PE, PK, 0, XTE_DTYPE_INT64)) return 1;
  s->cfg.num_out_tokens = 900;
  s->cfg.align = 16;
  ALLOC(s->rows, int64_t, 1);
  calls_output(c, s->rows, 8, "rows");
  return 0;
}

/* permute: map + bf16 (no cap) or topk_idx int32 + e4m3 with scales, cap and align 16 */
static int permute_setup(calls_ctx *c, int use_map) {
  int64_t R, OR;
  xte_dtype dt = use_map ? XTE_DTYPE_BF16 : XTE_DTYPE_E4M3;
  void *x;
  STATE(p_state);
  s->op = P_PERMUTE;
  if (gen_routing(c, s, PT, PE, PK, use_map, use_map ? XTE_DTYPE_INT64 : XTE_DTYPE_INT32)) return 1;
  if (!use_map) {
    s->cfg.num_out_tokens = 900;
    s->cfg.align = 16;
  }
  TRY_X(xte_moe_permute_rows(&s->routing, &s->cfg, &R, NULL));
  OR = R + 5;
  x = data(c, dt, PT * PH, 2.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  s->input = xte_tensor_2d(x, dt, PT, PH);
  if (!use_map) {
    void *xs = data(c, XTE_DTYPE_FP32, PT * 2, 1.0f, 0);
    if (!xs) return fail(c, "out of buffer slots");
    s->fp8 = 1;
    s->input_scales = xte_tensor_2d(xs, XTE_DTYPE_FP32, PT, 2);
    if (out2d(c, &s->output_scales, XTE_DTYPE_FP32, OR, 2, "output_scales")) return 1;
  }
  memset(&s->extra, 0, sizeof s->extra);
  return out2d(c, &s->output, dt, OR, PH, "output") ||
         out2d(c, &s->row_map, XTE_DTYPE_INT32, PT, PK, "row_map") ||
         out2d(c, &s->extra.expert_offsets, XTE_DTYPE_INT64, PE + 1, 0, "expert_offsets") ||
         out2d(c, &s->extra.tokens_per_expert, use_map ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64, PE, 0,
               "tokens_per_expert") ||
         out2d(c, &s->extra.row_to_expert, XTE_DTYPE_INT32, OR, 0, "row_to_expert");
}

static int setup_permute_map_bf16(calls_ctx *c) {
  return permute_setup(c, 1);
}
static int setup_permute_topk_e4m3_align(calls_ctx *c) {
  return permute_setup(c, 0);
}

/* The inputs of the unpermute family: a routing, a permuted tensor [R, H] of dtype dt (by a
 * permute of random tokens: its row_map), probs ([T, E] with a map, [T, k] with topk_idx). */
static int unpermute_inputs(calls_ctx *c, p_state *s, int use_map, xte_dtype dt, int64_t *R) {
  void *x, *px, *rm;
  if (gen_routing(c, s, PT, PE, PK, use_map, XTE_DTYPE_INT64)) return 1;
  TRY_X(xte_moe_permute_rows(&s->routing, &s->cfg, R, NULL));
  x = data(c, dt, PT * PH, 2.0f, 1);
  px = calls_alloc(c, xte_dtype_size(dt) * (size_t)(*R * PH));
  rm = calls_alloc(c, 4 * (size_t)(PT * PK));
  if (!x || !px || !rm) return fail(c, "out of buffer slots");
  {
    xte_tensor in = xte_tensor_2d(x, dt, PT, PH);
    s->input = xte_tensor_2d(px, dt, *R, PH);
    s->row_map = xte_tensor_2d(rm, XTE_DTYPE_INT32, PT, PK);
    TRY_X(
        xte_moe_permute(&in, NULL, &s->routing, &s->cfg, &s->input, NULL, &s->row_map, NULL, NULL));
  }
  {
    int64_t pc = use_map ? PE : PK;
    void *p = data(c, XTE_DTYPE_FP32, PT * pc, 1.0f, 0);
    if (!p) return fail(c, "out of buffer slots");
    s->probs = xte_tensor_2d(p, XTE_DTYPE_FP32, PT, pc);
  }
  return 0;
}

static int unpermute_setup(calls_ctx *c, int use_map, xte_dtype dt) {
  int64_t R;
  STATE(p_state);
  s->op = P_UNPERMUTE;
  if (unpermute_inputs(c, s, use_map, dt, &R)) return 1;
  return out2d(c, &s->output, dt, PT, PH, "out");
}

static int setup_unpermute_map_fp32(calls_ctx *c) {
  return unpermute_setup(c, 1, XTE_DTYPE_FP32);
}
static int setup_unpermute_topk_bf16(calls_ctx *c) {
  return unpermute_setup(c, 0, XTE_DTYPE_BF16);
}

static int setup_permute_bwd_map(calls_ctx *c) {
  int64_t R;
  STATE(p_state);
  s->op = P_PERMUTE_BWD;
  if (unpermute_inputs(c, s, 1, XTE_DTYPE_FP32, &R)) return 1;
  return out2d(c, &s->output, XTE_DTYPE_FP32, PT, PH, "grad_input");
}

static int setup_permute_bwd_topk_bf16(calls_ctx *c) {
  int64_t R;
  STATE(p_state);
  s->op = P_PERMUTE_BWD;
  if (unpermute_inputs(c, s, 0, XTE_DTYPE_BF16, &R)) return 1;
  return out2d(c, &s->output, XTE_DTYPE_BF16, PT, PH, "grad_input");
}

static int unpermute_bwd_setup(calls_ctx *c, int use_map, xte_dtype dt) {
  int64_t R;
  void *g;
  STATE(p_state);
  s->op = P_UNPERMUTE_BWD;
  if (unpermute_inputs(c, s, use_map, dt, &R)) return 1;
  g = data(c, dt, PT * PH, 1.0f, 0);
  if (!g) return fail(c, "out of buffer slots");
  s->grad_in = xte_tensor_2d(g, dt, PT, PH);
  return out2d(c, &s->output, dt, R, PH, "grad_input") ||
         out2d(c, &s->grad_probs, XTE_DTYPE_FP32, PT, s->probs.shape[1], "grad_probs");
}

static int setup_unpermute_bwd_topk_fp32(calls_ctx *c) {
  return unpermute_bwd_setup(c, 0, XTE_DTYPE_FP32);
}
static int setup_unpermute_bwd_map_bf16(calls_ctx *c) {
  return unpermute_bwd_setup(c, 1, XTE_DTYPE_BF16);
}

/* sort chunks: R = 600 rows in 12 chunks (one empty), a fixed permutation */
static int sort_inputs(calls_ctx *c, p_state *s, int64_t *R) {
  enum { NCH = 12 };
  static const int64_t sizes[NCH] = {50, 7, 0, 100, 63, 41, 90, 1, 88, 60, 30, 70};
  static const int32_t order[NCH] = {3, 11, 0, 7, 2, 9, 5, 1, 10, 4, 8, 6};
  int64_t *sp;
  int32_t *ix;
  int i;
  ALLOC(sp, int64_t, NCH);
  ALLOC(ix, int32_t, NCH);
  *R = 0;
  for (i = 0; i < NCH; i++) {
    sp[i] = sizes[i];
    ix[i] = order[i];
    *R += sizes[i];
  }
  s->split = xte_tensor_1d(sp, XTE_DTYPE_INT64, NCH);
  s->sorted = xte_tensor_1d(ix, XTE_DTYPE_INT32, NCH);
  return 0;
}

static int setup_sort_chunks(calls_ctx *c) {
  int64_t R;
  void *x;
  STATE(p_state);
  s->op = P_SORT;
  if (sort_inputs(c, s, &R)) return 1;
  x = data(c, XTE_DTYPE_BF16, R * 96, 1.0f, 1);
  if (!x) return fail(c, "out of buffer slots");
  s->input = xte_tensor_2d(x, XTE_DTYPE_BF16, R, 96);
  return out2d(c, &s->output, XTE_DTYPE_BF16, R, 96, "output") ||
         out2d(c, &s->row_map, XTE_DTYPE_INT32, R, 0, "row_map");
}

static int setup_sort_chunks_bwd(calls_ctx *c) {
  int64_t R;
  void *x, *y, *rm;
  STATE(p_state);
  s->op = P_SORT_BWD;
  if (sort_inputs(c, s, &R)) return 1;
  x = data(c, XTE_DTYPE_FP32, R * 96, 1.0f, 1);
  y = calls_alloc(c, 4 * (size_t)(R * 96));
  rm = calls_alloc(c, 4 * (size_t)R);
  if (!x || !y || !rm) return fail(c, "out of buffer slots");
  {
    xte_tensor in = xte_tensor_2d(x, XTE_DTYPE_FP32, R, 96), out;
    out = xte_tensor_2d(y, XTE_DTYPE_FP32, R, 96);
    s->row_map = xte_tensor_1d(rm, XTE_DTYPE_INT32, R);
    TRY_X(xte_moe_sort_chunks_by_index(&in, &s->split, &s->sorted, &out, &s->row_map, NULL));
    s->input = out; /* grad_output: the forward's output, as good as any */
  }
  return out2d(c, &s->output, XTE_DTYPE_FP32, R, 96, "grad_input");
}

static int setup_dispatch_layout(calls_ctx *c) {
  const int64_t E = 64;
  STATE(p_state);
  s->op = P_LAYOUT;
  if (gen_routing(c, s, PT, E, 8, 0, XTE_DTYPE_INT64)) return 1;
  s->ranks = 8;
  return out2d(c, &s->extra.tokens_per_expert, XTE_DTYPE_INT32, s->ranks, 0, "tokens_per_rank") ||
         out2d(c, &s->extra.expert_offsets, XTE_DTYPE_INT32, E, 0, "tokens_per_expert") ||
         out2d(c, &s->output, XTE_DTYPE_UINT8, PT, s->ranks, "is_token_in_rank");
}

/* ------------------------------------------------------------------ SwiGLU */

typedef struct s_state {
  int op; /* 0 swiglu, 1 dswiglu, 2 swiglu_quantize, 3 dswiglu_quantize */
  xte_tensor in, gout, out;
  xte_qtensor q;
  xte_quant_config cfg;
  xte_dtype act;
} s_state;

static xte_status swiglu_run(calls_ctx *c) {
  s_state *s = (s_state *)c->state;
  switch (s->op) {
    case 0:
      return xte_swiglu(&s->in, &s->out, NULL);
    case 1:
      return xte_dswiglu(&s->gout, &s->in, &s->out, NULL);
    case 2:
      return xte_swiglu_quantize(&s->in, s->act, &s->q, &s->cfg, NULL);
    default:
      return xte_dswiglu_quantize(&s->gout, &s->in, s->act, &s->q, &s->cfg, NULL);
  }
}

static int swiglu_setup(calls_ctx *c, int op, xte_dtype dt, xte_dtype out_dt, xte_recipe rec,
                        xte_scale_layout lay) {
  const int64_t T = 300, F = 256;
  void *x, *g;
  STATE(s_state);
  s->op = op;
  x = data(c, dt, T * 2 * F, 4.0f, 1);
  g = data(c, dt, T * F, 1.0f, 1);
  if (!x || !g) return fail(c, "out of buffer slots");
  s->in = xte_tensor_2d(x, dt, T, 2 * F);
  s->gout = xte_tensor_2d(g, dt, T, F);
  s->act = out_dt;
  s->cfg = xte_quant_config_default();
  switch (op) {
    case 0:
      return out2d(c, &s->out, out_dt, T, F, "out");
    case 1:
      return out2d(c, &s->out, out_dt, T, 2 * F, "grad_input");
    default: {
      int64_t K = op == 2 ? F : 2 * F;
      if (make_q(c, &s->q, T, K, XTE_SCALING_BLOCK_1x128, rec, lay, XTE_DTYPE_E4M3, 1, 1)) return 1;
      ALLOC(s->q.amax, float, 1);
      calls_output(c, s->q.amax, 4, "amax");
      return 0;
    }
  }
}

static int setup_swiglu_fp32(calls_ctx *c) {
  return swiglu_setup(c, 0, XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_RECIPE_TE_BLOCK,
                      XTE_SCALE_LAYOUT_COMPACT);
}
static int setup_dswiglu_bf16(calls_ctx *c) {
  return swiglu_setup(c, 1, XTE_DTYPE_BF16, XTE_DTYPE_BF16, XTE_RECIPE_TE_BLOCK,
                      XTE_SCALE_LAYOUT_COMPACT);
}
static int setup_swiglu_quantize(calls_ctx *c) {
  return swiglu_setup(c, 2, XTE_DTYPE_BF16, XTE_DTYPE_BF16, XTE_RECIPE_TE_BLOCK,
                      XTE_SCALE_LAYOUT_TE_GEMM);
}
static int setup_dswiglu_quantize(calls_ctx *c) {
  return swiglu_setup(c, 3, XTE_DTYPE_FP32, XTE_DTYPE_FP32, XTE_RECIPE_MTFP8,
                      XTE_SCALE_LAYOUT_COMPACT);
}

/* ------------------------------------------------------------------ attention */

typedef struct a_state {
  int bwd;
  xte_tensor Q, K, V, O, L, dO, dQ, dK, dV;
  xte_attention_config cfg;
} a_state;

static xte_status attn_run(calls_ctx *c) {
  a_state *s = (a_state *)c->state;
  if (s->bwd)
    return xte_attention_bwd(&s->Q, &s->K, &s->V, &s->O, &s->dO, &s->L, &s->dQ, &s->dK, &s->dV,
                             &s->cfg, NULL);
  return xte_attention_fwd(&s->Q, &s->K, &s->V, &s->O, &s->L, &s->cfg, NULL);
}

static xte_tensor attn_tensor(void *p, xte_dtype dt, int thd, int64_t b, int64_t s, int64_t h,
                              int64_t d) {
  xte_tensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.dtype = dt;
  if (thd) {
    t.rank = 3;
    t.shape[0] = s;
    t.shape[1] = h;
    t.shape[2] = d;
  } else {
    t.rank = 4;
    t.shape[0] = b;
    t.shape[1] = s;
    t.shape[2] = h;
    t.shape[3] = d;
  }
  return t;
}

/* BSHD causal GQA (b 2, s 96, h 4 / 2, d 64) or THD varlen (5 sequences, bottom-right causal, one
 * token outside every sequence); fp32 or bf16. */
static int attn_setup(calls_ctx *c, int thd, xte_dtype dt, int bwd) {
  static const int32_t lq[5] = {5, 0, 70, 130, 33}, lk[5] = {5, 3, 70, 140, 64};
  const int64_t hq = 4, hkv = 2, D = 64;
  int64_t b = thd ? 1 : 2, sq = 96, skv = 96, nl;
  size_t es = xte_dtype_size(dt);
  void *q, *k, *v, *o, *l, *dout = NULL;
  STATE(a_state);
  s->bwd = bwd;
  s->cfg = xte_attention_config_default();
  if (thd) {
    int32_t *cq, *ck;
    int i;
    ALLOC(cq, int32_t, 6);
    ALLOC(ck, int32_t, 6);
    for (i = 0; i < 5; i++) {
      cq[i + 1] = cq[i] + lq[i];
      ck[i + 1] = ck[i] + lk[i];
    }
    sq = cq[5] + 1;
    skv = ck[5] + 1;
    s->cfg.layout = XTE_ATTN_LAYOUT_THD;
    s->cfg.mask = XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT;
    s->cfg.cu_seqlens_q = cq;
    s->cfg.cu_seqlens_kv = ck;
    s->cfg.batch = 5;
    s->cfg.max_seqlen_q = 130;
    s->cfg.max_seqlen_kv = 140;
  } else {
    s->cfg.mask = XTE_ATTN_MASK_CAUSAL;
  }
  q = data(c, dt, b * sq * hq * D, 1.0f, 0);
  k = data(c, dt, b * skv * hkv * D, 1.0f, 0);
  v = data(c, dt, b * skv * hkv * D, 1.0f, 0);
  nl = b * sq * hq;
  if (!q || !k || !v) return fail(c, "out of buffer slots");
  s->Q = attn_tensor(q, dt, thd, b, sq, hq, D);
  s->K = attn_tensor(k, dt, thd, b, skv, hkv, D);
  s->V = attn_tensor(v, dt, thd, b, skv, hkv, D);
  if (!bwd) {
    o = calls_alloc(c, es * (size_t)(b * sq * hq * D));
    l = calls_alloc(c, 4 * (size_t)nl);
    if (!o || !l) return fail(c, "out of buffer slots");
    calls_output(c, o, es * (size_t)(b * sq * hq * D), "O");
    calls_output(c, l, 4 * (size_t)nl, "lse");
  } else {
    o = calls_alloc(c, es * (size_t)(b * sq * hq * D));
    l = calls_alloc(c, 4 * (size_t)nl);
    dout = data(c, dt, b * sq * hq * D, 1.0f, 0);
    if (!o || !l || !dout) return fail(c, "out of buffer slots");
  }
  s->O = attn_tensor(o, dt, thd, b, sq, hq, D);
  if (thd)
    s->L = xte_tensor_2d(l, XTE_DTYPE_FP32, sq, hq);
  else {
    memset(&s->L, 0, sizeof s->L);
    s->L.data = l;
    s->L.dtype = XTE_DTYPE_FP32;
    s->L.rank = 3;
    s->L.shape[0] = b;
    s->L.shape[1] = hq;
    s->L.shape[2] = sq;
  }
  if (bwd) {
    void *dq = calls_alloc(c, es * (size_t)(b * sq * hq * D));
    void *dk = calls_alloc(c, es * (size_t)(b * skv * hkv * D));
    void *dv = calls_alloc(c, es * (size_t)(b * skv * hkv * D));
    if (!dq || !dk || !dv) return fail(c, "out of buffer slots");
    TRY_X(xte_attention_fwd(&s->Q, &s->K, &s->V, &s->O, &s->L, &s->cfg, NULL));
    s->dO = attn_tensor(dout, dt, thd, b, sq, hq, D);
    s->dQ = attn_tensor(dq, dt, thd, b, sq, hq, D);
    s->dK = attn_tensor(dk, dt, thd, b, skv, hkv, D);
    s->dV = attn_tensor(dv, dt, thd, b, skv, hkv, D);
    calls_output(c, dq, es * (size_t)(b * sq * hq * D), "dQ");
    calls_output(c, dk, es * (size_t)(b * skv * hkv * D), "dK");
    calls_output(c, dv, es * (size_t)(b * skv * hkv * D), "dV");
  }
  return 0;
}

static int setup_attn_fwd_bshd_fp32(calls_ctx *c) {
  return attn_setup(c, 0, XTE_DTYPE_FP32, 0);
}
static int setup_attn_fwd_bshd_bf16(calls_ctx *c) {
  return attn_setup(c, 0, XTE_DTYPE_BF16, 0);
}
static int setup_attn_fwd_thd_fp32(calls_ctx *c) {
  return attn_setup(c, 1, XTE_DTYPE_FP32, 0);
}
static int setup_attn_fwd_thd_bf16(calls_ctx *c) {
  return attn_setup(c, 1, XTE_DTYPE_BF16, 0);
}
static int setup_attn_bwd_bshd_fp32(calls_ctx *c) {
  return attn_setup(c, 0, XTE_DTYPE_FP32, 1);
}
static int setup_attn_bwd_bshd_bf16(calls_ctx *c) {
  return attn_setup(c, 0, XTE_DTYPE_BF16, 1);
}
static int setup_attn_bwd_thd_fp32(calls_ctx *c) {
  return attn_setup(c, 1, XTE_DTYPE_FP32, 1);
}
static int setup_attn_bwd_thd_bf16(calls_ctx *c) {
  return attn_setup(c, 1, XTE_DTYPE_BF16, 1);
}

/* ------------------------------------------------------------------ streams and memory */

#define MEM_BYTES 4096
#define HANDLE_SENTINEL ((uintptr_t)0x5E5E5E5E5E5E5E40ull)

typedef struct m_state {
  uint8_t *flag; /* 1 after a success; on an error written only when the handle was clobbered */
  uint8_t *mem;  /* what the memory held */
} m_state;

static int mem_setup(calls_ctx *c) {
  STATE(m_state);
  ALLOC(s->flag, uint8_t, 1);
  ALLOC(s->mem, uint8_t, MEM_BYTES);
  calls_output(c, s->flag, 1, "handle_untouched");
  calls_output(c, s->mem, MEM_BYTES, "memory");
  return 0;
}

static void clobbered(calls_ctx *c) {
  m_state *s = (m_state *)c->state;
  s->flag[0] = (uint8_t)~calls_sentinel(0, 0);
}

/* create a CPU stream, a memset through it, synchronize, destroy */
static xte_status stream_run(calls_ctx *c) {
  m_state *s = (m_state *)c->state;
  xte_stream h = (xte_stream)HANDLE_SENTINEL;
  xte_status st = xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &h), st2;
  if (st != XTE_SUCCESS) {
    if (h != (xte_stream)HANDLE_SENTINEL) clobbered(c);
    return st;
  }
  s->flag[0] = 1;
  st = xte_memset(h, s->mem, 0x3C, MEM_BYTES);
  if (st == XTE_SUCCESS) st = xte_stream_synchronize(h);
  st2 = xte_stream_destroy(h);
  return st != XTE_SUCCESS ? st : st2;
}

/* xte_malloc, memset, copy out, xte_free */
static xte_status malloc_run(calls_ctx *c) {
  m_state *s = (m_state *)c->state;
  void *p = (void *)HANDLE_SENTINEL;
  xte_status st = xte_malloc(NULL, MEM_BYTES, &p), st2;
  if (st != XTE_SUCCESS) {
    if (p != (void *)HANDLE_SENTINEL) clobbered(c);
    return st;
  }
  s->flag[0] = 1;
  st = xte_memset(NULL, p, 0x6B, MEM_BYTES);
  if (st == XTE_SUCCESS) st = xte_memcpy(NULL, s->mem, p, MEM_BYTES, XTE_MEMCPY_DEVICE_TO_HOST);
  st2 = xte_free(NULL, p);
  return st != XTE_SUCCESS ? st : st2;
}

/* ------------------------------------------------------------------ the table */

/* ------------------------------------------------------------------ expert parallelism */

/* One rank (a threads world of one): its step moves every row to itself through the transport
 * and the same packing as any rank count. op: 0 prepare, 1 dispatch, 2 combine, 3 combine
 * backward, 4 dispatch backward; the steps before op run in the setup. */
typedef struct ep_state {
  int op;
  xte_ep_threads_world world;
  xte_ep_group g;
  void *handle;
  size_t hb;
  xte_ep_counts counts, *pcounts;
  xte_tensor idx, x, xs, w, rx, rs, rw, tpe, y, out, slots, gout, gy, gw, gr, gx;
} ep_state;

static void ep_cleanup(calls_ctx *c) {
  ep_state *s = (ep_state *)c->state;
  if (!s) return;
  xte_ep_group_destroy(s->g);
  xte_ep_threads_world_destroy(s->world);
  s->g = NULL;
  s->world = NULL;
}

static xte_status ep_run(calls_ctx *c) {
  ep_state *s = (ep_state *)c->state;
  switch (s->op) {
    case 0:
      return xte_ep_prepare(s->g, &s->idx, s->handle, s->hb, s->pcounts, &s->tpe, NULL);
    case 1:
      return xte_ep_dispatch(s->g, s->handle, &s->x, &s->xs, &s->w, &s->rx, &s->rs, &s->rw, NULL);
    case 2:
      return xte_ep_combine(s->g, s->handle, &s->y, &s->w, &s->out, &s->slots, NULL);
    case 3:
      return xte_ep_combine_backward(s->g, s->handle, &s->gout, &s->w, &s->slots, &s->gy, &s->gw,
                                     NULL);
    default:
      return xte_ep_dispatch_backward(s->g, s->handle, &s->gr, &s->gx, NULL);
  }
}

static int ep_setup(calls_ctx *c, int op) {
  const int64_t T = 100, H = 256, El = 8, K = 4, S = 2;
  xte_ep_config cfg = xte_ep_config_default();
  int32_t *idx;
  float *w;
  int64_t t, j, rows;
  STATE(ep_state);
  s->op = op;
  c->cleanup = ep_cleanup;
  ALLOC(idx, int32_t, T * K);
  ALLOC(w, float, T *K);
  for (t = 0; t < T; t++)
    for (j = 0; j < K; j++) {
      idx[t * K + j] = (int32_t)((t * 3 + j * 5) % El); /* distinct within a token (5 k < 8) */
      if ((t + j) % 11 == 0) idx[t * K + j] = -1;
      w[t * K + j] = (float)(t % 7 + j) / 8.0f;
    }
  s->idx = xte_tensor_2d(idx, XTE_DTYPE_INT32, T, K);
  s->w = xte_tensor_2d(w, XTE_DTYPE_FP32, T, K);
  s->x = xte_tensor_2d(data(c, XTE_DTYPE_E4M3, T * H, 1.0f, 0), XTE_DTYPE_E4M3, T, H);
  s->xs = xte_tensor_2d(data(c, XTE_DTYPE_FP32, T * S, 1.0f, 0), XTE_DTYPE_FP32, T, S);
  if (!s->x.data || !s->xs.data) return fail(c, "out of buffer slots");
  cfg.experts_per_rank = El;
  cfg.hidden = H;
  cfg.topk = (int32_t)K;
  cfg.align = 16;
  cfg.max_tokens_per_rank = T;
  TRY_X(xte_ep_threads_world_create(1, &s->world));
  TRY_X(xte_ep_group_create_threads(s->world, 0, &cfg, &s->g));
  TRY_X(xte_ep_handle_size(s->g, &s->hb));
  s->handle = calls_alloc(c, s->hb);
  if (!s->handle) return fail(c, "out of buffer slots (handle)");
  if (op == 0) {
    /* the handle is opaque (it holds the group's address, which differs between contexts): the
     * counts and tokens_per_expert are the outputs compared */
    s->pcounts = (xte_ep_counts *)calls_alloc(c, sizeof(xte_ep_counts));
    if (!s->pcounts) return fail(c, "out of buffer slots (counts)");
    calls_output(c, s->pcounts, sizeof(xte_ep_counts), "counts");
    return out2d(c, &s->tpe, XTE_DTYPE_INT64, 1, El, "tokens_per_expert");
  }
  TRY_X(xte_ep_prepare(s->g, &s->idx, s->handle, s->hb, &s->counts, NULL, NULL));
  rows = s->counts.recv_rows;
  if (op == 1)
    return out2d(c, &s->rx, XTE_DTYPE_E4M3, rows, H, "recv_x") ||
           out2d(c, &s->rs, XTE_DTYPE_FP32, rows, S, "recv_scales") ||
           out2d(c, &s->rw, XTE_DTYPE_FP32, 1, rows, "recv_weights");
  ALLOC(s->rx.data, uint8_t, rows * H);
  ALLOC(s->rs.data, float, rows *S);
  s->rx = xte_tensor_2d(s->rx.data, XTE_DTYPE_E4M3, rows, H);
  s->rs = xte_tensor_2d(s->rs.data, XTE_DTYPE_FP32, rows, S);
  TRY_X(xte_ep_dispatch(s->g, s->handle, &s->x, &s->xs, NULL, &s->rx, &s->rs, NULL, NULL));
  s->y = xte_tensor_2d(data(c, XTE_DTYPE_BF16, rows * H, 2.0f, 1), XTE_DTYPE_BF16, rows, H);
  s->gr = xte_tensor_2d(data(c, XTE_DTYPE_FP32, rows * H, 2.0f, 1), XTE_DTYPE_FP32, rows, H);
  s->gout = xte_tensor_2d(data(c, XTE_DTYPE_BF16, T * H, 2.0f, 1), XTE_DTYPE_BF16, T, H);
  if (!s->y.data || !s->gr.data || !s->gout.data) return fail(c, "out of buffer slots");
  if (op == 2)
    return out2d(c, &s->out, XTE_DTYPE_BF16, T, H, "out") ||
           out2d(c, &s->slots, XTE_DTYPE_BF16, s->counts.slot_rows, H, "slot_rows");
  if (op == 3) {
    ALLOC(s->out.data, uint16_t, T * H);
    ALLOC(s->slots.data, uint16_t, s->counts.slot_rows * H);
    s->out = xte_tensor_2d(s->out.data, XTE_DTYPE_BF16, T, H);
    s->slots = xte_tensor_2d(s->slots.data, XTE_DTYPE_BF16, s->counts.slot_rows, H);
    TRY_X(xte_ep_combine(s->g, s->handle, &s->y, &s->w, &s->out, &s->slots, NULL));
    return out2d(c, &s->gy, XTE_DTYPE_BF16, rows + 3, H, "grad_expert_out") ||
           out2d(c, &s->gw, XTE_DTYPE_FP32, T, K, "grad_weights");
  }
  return out2d(c, &s->gx, XTE_DTYPE_FP32, T, H, "grad_x");
}

static int setup_ep_prepare(calls_ctx *c) {
  return ep_setup(c, 0);
}
static int setup_ep_dispatch_e4m3(calls_ctx *c) {
  return ep_setup(c, 1);
}
static int setup_ep_combine_bf16(calls_ctx *c) {
  return ep_setup(c, 2);
}
static int setup_ep_combine_bwd(calls_ctx *c) {
  return ep_setup(c, 3);
}
static int setup_ep_dispatch_bwd(calls_ctx *c) {
  return ep_setup(c, 4);
}

#define CASE(name, run) \
  { #name, setup_##name, run }

const calls_case calls_table[] = {
    CASE(quantize_1x128, quant_run),
    CASE(quantize_128x128, quant_run),
    CASE(quantize_mxfp8, quant_run),
    CASE(quantize_current, quant_run),
    CASE(dequantize_1x128_col, dequant_run),
    CASE(dequantize_128x128, dequant_run),
    CASE(cast_fp32_e5m2, cast_run),
    CASE(cast_e4m3_bf16, cast_run),
    CASE(gemm_1x128_128x128, gemm_run),
    CASE(gemm_trans_b_acc_bias, gemm_run),
    CASE(gemm_grouped_contiguous, gemm_run),
    CASE(gemm_grouped_masked, gemm_run),
    CASE(gemm_grouped_k, gemm_run),
    CASE(router_fwd_softmax, router_run),
    CASE(router_fwd_sigmoid_grouped, router_run),
    CASE(router_bwd_softmax, router_run),
    CASE(router_bwd_sigmoid_grouped, router_run),
    CASE(aux_scores_softmax, router_run),
    CASE(aux_scores_sigmoid, router_run),
    CASE(aux_scores_bwd_softmax, router_run),
    CASE(aux_scores_bwd_sigmoid, router_run),
    CASE(aux_loss_fwd, aux_loss_run),
    CASE(aux_loss_bwd, aux_loss_run),
    CASE(router_qb, qb_run),
    CASE(aux_scores_bits, qb_run),
    CASE(aux_loss_seq_fwd, qb_run),
    CASE(aux_loss_seq_bwd, qb_run),
    CASE(permute_rows_map, perm_run),
    CASE(permute_rows_topk_align, perm_run),
    CASE(permute_map_bf16, perm_run),
    CASE(permute_topk_e4m3_align, perm_run),
    CASE(unpermute_map_fp32, perm_run),
    CASE(unpermute_topk_bf16, perm_run),
    CASE(permute_bwd_map, perm_run),
    CASE(permute_bwd_topk_bf16, perm_run),
    CASE(unpermute_bwd_topk_fp32, perm_run),
    CASE(unpermute_bwd_map_bf16, perm_run),
    CASE(sort_chunks, perm_run),
    CASE(sort_chunks_bwd, perm_run),
    CASE(dispatch_layout, perm_run),
    CASE(swiglu_fp32, swiglu_run),
    CASE(dswiglu_bf16, swiglu_run),
    CASE(swiglu_quantize, swiglu_run),
    CASE(dswiglu_quantize, swiglu_run),
    CASE(attn_fwd_bshd_fp32, attn_run),
    CASE(attn_fwd_bshd_bf16, attn_run),
    CASE(attn_fwd_thd_fp32, attn_run),
    CASE(attn_fwd_thd_bf16, attn_run),
    CASE(attn_bwd_bshd_fp32, attn_run),
    CASE(attn_bwd_bshd_bf16, attn_run),
    CASE(attn_bwd_thd_fp32, attn_run),
    CASE(attn_bwd_thd_bf16, attn_run),
    CASE(ep_prepare, ep_run),
    CASE(ep_dispatch_e4m3, ep_run),
    CASE(ep_combine_bf16, ep_run),
    CASE(ep_combine_bwd, ep_run),
    CASE(ep_dispatch_bwd, ep_run),
    {"stream_create_destroy", mem_setup, stream_run},
    {"malloc_free", mem_setup, malloc_run},
};
const int calls_count = (int)(sizeof calls_table / sizeof calls_table[0]);

int calls_setup(int i, calls_ctx *c) {
  memset(c, 0, sizeof *c);
  c->rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1) + 12345;
  if (calls_table[i].setup(c)) {
    fprintf(stderr, "%s: setup failed: %s\n", calls_table[i].name, c->err);
    calls_free(c);
    return 1;
  }
  return 0;
}

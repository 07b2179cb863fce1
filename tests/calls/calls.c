/* The table of valid calls (tests/calls/calls.h): one case per entry point and variant, shapes
 * small but with a few hundred rows, so that the CPU pool splits every call over its threads. */
#define _POSIX_C_SOURCE 200809L /* posix_memalign */
#include "calls_cases.h"
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

int fail(calls_ctx *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  return 1;
}

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

uint32_t rnd(calls_ctx *c) {
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
void *data(calls_ctx *c, xte_dtype dt, int64_t n, float scale, int specials) {
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
int out2d(calls_ctx *c, xte_tensor *t, xte_dtype dt, int64_t r, int64_t cols, const char *name) {
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
int make_q(calls_ctx *c, xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode,
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
int quantized(calls_ctx *c, xte_qtensor *q, const float *x, int64_t M, int64_t K,
              xte_scaling_mode mode, xte_recipe rec, xte_scale_layout lay, xte_dtype dt, int col) {
  xte_tensor in = xte_tensor_2d((void *)x, XTE_DTYPE_FP32, M, K);
  if (make_q(c, q, M, K, mode, rec, lay, dt, col, 0)) return 1;
  TRY_X(xte_quantize(&in, q, NULL, NULL));
  return 0;
}

/* ------------------------------------------------------------------ the table */

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
    CASE(gemm_fast_e5m2_acc_bias, gemm_run),
    CASE(gemm_grouped_masked_fast, gemm_run),
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
    CASE(attn_fast_fwd_thd_bf16, attn_run),
    CASE(attn_fast_bwd_bshd_fp32, attn_run),
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

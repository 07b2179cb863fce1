/* CPU quantize / dequantize / cast driver. Work is cut into 128 x 128 tiles of the input, each
 * owned by one thread, so every output byte is computed by the same arithmetic whatever the
 * thread count. Per tile: load to fp32, block amax, scale (shared numerics), convert, and for the
 * transposed columnwise copy a byte transpose. */
#include <string.h>

#include "cpu/xte_cpu.h"
#include "numerics/xte_numerics.h"

#define TILE 128

typedef struct qctx {
  const xte_quant_args *a;
  const xte_cpu_kernels *k;
  int64_t ntr, ntc;
  int per_tensor;
  xte_block_scale ts; /* per-tensor scale */
  float partial[256]; /* per-thread amax */
} qctx;

static size_t in_size(int in_kind) {
  return in_kind == XTE_NUM_IN_F32 ? 4 : 2;
}

static void quant_tile(qctx *c, int64_t tr, int64_t tc, float *T, uint8_t *Qt, float *acc,
                       float *sv, float *tamax) {
  const xte_quant_args *a = c->a;
  const xte_cpu_kernels *k = c->k;
  const int64_t r0 = tr * TILE, c0 = tc * TILE;
  const int64_t nr = a->M - r0 < TILE ? a->M - r0 : TILE;
  const int64_t nc = a->K - c0 < TILE ? a->K - c0 : TILE;
  const size_t es = in_size(a->in_kind);
  const char *in = (const char *)a->in;
  int64_t r, j, g;
  float tile_amax = 0.0f;
  xte_block_scale sq = c->ts; /* the tile's scale for square / per-tensor modes */
  int one_scale = c->per_tensor || a->square;

  for (r = 0; r < nr; r++)
    k->load_f32(in + ((size_t)(r0 + r) * (size_t)a->ld_in + (size_t)c0) * es, a->in_kind, nc,
                T + r * TILE);

  if (one_scale) {
    for (r = 0; r < nr; r++) tile_amax = xte_fmaxf(tile_amax, k->amax(T + r * TILE, nc));
    if (a->square) sq = xte_quant_block_scale(a, tile_amax);
  }

  /* rowwise */
  if (a->row_q) {
    uint8_t *dst = a->row_q + (size_t)r0 * (size_t)a->ld_row_q + (size_t)c0;
    if (one_scale) {
      for (r = 0; r < nr; r++)
        k->quant(T + r * TILE, nc, sq.scale, a->fmt, a->saturate, dst + r * a->ld_row_q);
      if (a->square) xte_store_scale(&a->row_s, tr, tc, sq);
    } else {
      const int64_t bw = a->row_bw;
      for (r = 0; r < nr; r++) {
        for (j = 0; j < nc; j += bw) {
          int64_t n = nc - j < bw ? nc - j : bw;
          float am = k->amax(T + r * TILE + j, n);
          xte_block_scale s = xte_quant_block_scale(a, am);
          tile_amax = xte_fmaxf(tile_amax, am);
          xte_store_scale(&a->row_s, r0 + r, (c0 + j) / bw, s);
          k->quant(T + r * TILE + j, n, s.scale, a->fmt, a->saturate, dst + r * a->ld_row_q + j);
        }
      }
    }
  }

  /* columnwise */
  if (a->col_q) {
    if (one_scale) {
      const uint8_t *src;
      int64_t lds;
      if (a->row_q) {
        src = a->row_q + (size_t)r0 * (size_t)a->ld_row_q + (size_t)c0;
        lds = a->ld_row_q;
      } else {
        for (r = 0; r < nr; r++)
          k->quant(T + r * TILE, nc, sq.scale, a->fmt, a->saturate, Qt + r * TILE);
        src = Qt;
        lds = TILE;
      }
      if (a->col_transposed) {
        k->transpose_u8(src, nr, nc, lds, a->col_q + (size_t)c0 * (size_t)a->ld_col_q + (size_t)r0,
                        a->ld_col_q);
        if (a->square) xte_store_scale(&a->col_s, tc, tr, sq);
      } else {
        for (r = 0; r < nr; r++)
          memcpy(a->col_q + (size_t)(r0 + r) * (size_t)a->ld_col_q + (size_t)c0, src + r * lds,
                 (size_t)nc);
        if (a->square) xte_store_scale(&a->col_s, tr, tc, sq);
      }
    } else {
      const int64_t bh = a->col_bh;
      for (g = 0; g < nr; g += bh) {
        int64_t gr = nr - g < bh ? nr - g : bh;
        int64_t gblk = (r0 + g) / bh;
        for (j = 0; j < nc; j++) acc[j] = 0.0f;
        k->amax_cols(T + g * TILE, gr, nc, TILE, acc);
        for (j = 0; j < nc; j++) {
          xte_block_scale s = xte_quant_block_scale(a, acc[j]);
          tile_amax = xte_fmaxf(tile_amax, acc[j]);
          sv[j] = s.scale;
          if (a->col_transposed)
            xte_store_scale(&a->col_s, c0 + j, gblk, s);
          else
            xte_store_scale(&a->col_s, gblk, c0 + j, s);
        }
        for (r = g; r < g + gr; r++) {
          uint8_t *dst = a->col_transposed
                             ? Qt + r * TILE
                             : a->col_q + (size_t)(r0 + r) * (size_t)a->ld_col_q + (size_t)c0;
          k->quant_vs(T + r * TILE, nc, sv, a->fmt, a->saturate, dst);
        }
      }
      if (a->col_transposed)
        k->transpose_u8(Qt, nr, nc, TILE, a->col_q + (size_t)c0 * (size_t)a->ld_col_q + (size_t)r0,
                        a->ld_col_q);
    }
  }
  *tamax = xte_fmaxf(*tamax, tile_amax);
}

static void quant_range(void *vctx, int64_t b, int64_t e, int tid) {
  qctx *c = (qctx *)vctx;
  _Alignas(64) float T[TILE * TILE];
  _Alignas(64) uint8_t Qt[TILE * TILE];
  _Alignas(64) float acc[TILE], sv[TILE];
  float am = 0.0f;
  int64_t t;
  for (t = b; t < e; t++) quant_tile(c, t / c->ntc, t % c->ntc, T, Qt, acc, sv, &am);
  c->partial[tid] = xte_fmaxf(c->partial[tid], am);
}

/* Whole-tensor amax for per-tensor current scaling. */
static void amax_range(void *vctx, int64_t b, int64_t e, int tid) {
  qctx *c = (qctx *)vctx;
  const xte_quant_args *a = c->a;
  _Alignas(64) float buf[1024];
  const size_t es = in_size(a->in_kind);
  float m = 0.0f;
  int64_t r, j;
  for (r = b; r < e; r++) {
    const char *row = (const char *)a->in + (size_t)r * (size_t)a->ld_in * es;
    for (j = 0; j < a->K; j += 1024) {
      int64_t n = a->K - j < 1024 ? a->K - j : 1024;
      c->k->load_f32(row + (size_t)j * es, a->in_kind, n, buf);
      m = xte_fmaxf(m, c->k->amax(buf, n));
    }
  }
  c->partial[tid] = xte_fmaxf(c->partial[tid], m);
}

static void zero_scales(const xte_scale_map *m) {
  if (m->data) memset(m->data, 0, (size_t)m->total * (m->e8m0 ? 1u : 4u));
}

xte_status xte_cpu_quantize(const xte_quant_args *a, void *handle) {
  qctx c;
  int i;
  float am = 0.0f;
  (void)handle;
  memset(&c, 0, sizeof c);
  c.a = a;
  c.k = xte_cpu_kernels_get();
  c.ntr = (a->M + TILE - 1) / TILE;
  c.ntc = (a->K + TILE - 1) / TILE;
  c.per_tensor = a->mode == XTE_SCALING_PER_TENSOR;
  zero_scales(&a->row_s);
  zero_scales(&a->col_s);
  if (c.per_tensor) {
    if (a->recipe == XTE_RECIPE_TE_CURRENT) {
      xte_parallel_for(a->M, amax_range, &c);
      for (i = 0; i < 256; i++) am = xte_fmaxf(am, c.partial[i]);
      memset(c.partial, 0, sizeof c.partial);
    }
    c.ts = xte_quant_block_scale(a, am);
    if (a->row_s.data) xte_store_scale(&a->row_s, 0, 0, c.ts);
    if (a->col_s.data) xte_store_scale(&a->col_s, 0, 0, c.ts);
    if (a->scale_out) *a->scale_out = c.ts.scale;
  }
  if (a->M > 0 && a->K > 0) xte_parallel_for(c.ntr * c.ntc, quant_range, &c);
  if (a->amax_out) {
    am = 0.0f;
    for (i = 0; i < 256; i++) am = xte_fmaxf(am, c.partial[i]);
    *a->amax_out = am;
  }
  return XTE_SUCCESS;
}

/* ---------------------------------------------------------------- dequantize */

static void dequant_rows(void *vctx, int64_t b, int64_t e, int tid) {
  const xte_dequant_args *a = (const xte_dequant_args *)vctx;
  int64_t r, c;
  (void)tid;
  for (r = b; r < e; r++) {
    const uint8_t *q = a->q + (size_t)r * (size_t)a->ld_q;
    for (c = 0; c < a->C; c++) {
      float s = xte_load_scale_inv(&a->s, r / a->bh, c / a->bw);
      float v = xte_fp8_to_f32(q[c], a->fmt) * s;
      size_t o = (size_t)r * (size_t)a->ld_out + (size_t)c;
      if (a->out_dtype == XTE_DTYPE_FP32)
        ((float *)a->out)[o] = v;
      else if (a->out_dtype == XTE_DTYPE_BF16)
        ((uint16_t *)a->out)[o] = xte_f32_to_bf16(v);
      else
        ((uint16_t *)a->out)[o] = xte_f32_to_fp16(v);
    }
  }
}

xte_status xte_cpu_dequantize(const xte_dequant_args *a, void *handle) {
  (void)handle;
  xte_parallel_for(a->R, dequant_rows, (void *)a);
  return XTE_SUCCESS;
}

/* ---------------------------------------------------------------- cast */

static int in_kind_of(int dtype) {
  return dtype == XTE_DTYPE_BF16 ? XTE_NUM_IN_BF16
                                 : (dtype == XTE_DTYPE_FP16 ? XTE_NUM_IN_F16 : XTE_NUM_IN_F32);
}

static void cast_range(void *vctx, int64_t b, int64_t e, int tid) {
  const xte_cast_args *a = (const xte_cast_args *)vctx;
  const xte_cpu_kernels *k = xte_cpu_kernels_get();
  _Alignas(64) float buf[2048];
  int64_t i, j;
  (void)tid;
  for (i = b * 2048; i < e * 2048 && i < a->n; i += 2048) {
    int64_t n = a->n - i < 2048 ? a->n - i : 2048;
    if (a->in_dtype == XTE_DTYPE_E4M3 || a->in_dtype == XTE_DTYPE_E5M2) {
      const uint8_t *q = (const uint8_t *)a->in + i;
      int fmt = a->in_dtype == XTE_DTYPE_E4M3 ? XTE_FP8_E4M3 : XTE_FP8_E5M2;
      for (j = 0; j < n; j++) buf[j] = xte_fp8_to_f32(q[j], fmt);
    } else {
      size_t es = a->in_dtype == XTE_DTYPE_FP32 ? 4 : 2;
      k->load_f32((const char *)a->in + (size_t)i * es, in_kind_of(a->in_dtype), n, buf);
    }
    switch (a->out_dtype) {
      case XTE_DTYPE_FP32:
        memcpy((float *)a->out + i, buf, (size_t)n * 4);
        break;
      case XTE_DTYPE_BF16:
        k->cast_bf16(buf, n, (uint16_t *)a->out + i);
        break;
      case XTE_DTYPE_FP16:
        k->cast_fp16(buf, n, (uint16_t *)a->out + i);
        break;
      case XTE_DTYPE_E4M3:
        k->cast_fp8(buf, n, XTE_FP8_E4M3, a->saturate, (uint8_t *)a->out + i);
        break;
      default:
        k->cast_fp8(buf, n, XTE_FP8_E5M2, a->saturate, (uint8_t *)a->out + i);
        break;
    }
  }
}

xte_status xte_cpu_cast(const xte_cast_args *a, void *handle) {
  (void)handle;
  xte_parallel_for((a->n + 2047) / 2048, cast_range, (void *)a);
  return XTE_SUCCESS;
}

/* Entry points of the GEMM: argument checks, choice of the quantized copy of each operand, scale
 * layout resolution, the list of problems of a grouped call, dispatch. Nothing is written to any
 * output before every check has passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"
#include "core/scale.h"
#include "core/tensor.h"
#include "xte_gemm_ops.h"
#include "xte_internal.h"

#define BIG_BLOCK ((int64_t)1 << 50)

/* a (>= 0) rounded up to a multiple of b (> 0) into *r; 1 when that overflows int64 */
static int rup_overflows(int64_t a, int64_t b, int64_t *r) {
  return __builtin_mul_overflow(a / b + (a % b != 0), b, r);
}

xte_gemm_config xte_gemm_config_default(void) {
  xte_gemm_config c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.mode = XTE_GEMM_EXACT;
  return c;
}

/* A resolved operand: the logical [rows, K] view and its scaling. */
typedef struct opnd {
  xte_gemm_operand op;
  int64_t rows, K;
  xte_scaling_mode mode;
  xte_dtype dtype;
} opnd;

static xte_status resolve_operand(const xte_qtensor *q, int trans, const char *name, opnd *o) {
  const xte_tensor *copies[2];
  const xte_scale_tensor *scales[2];
  int64_t R[2], Cc[2], ld[2], Mq = -1, Kq = -1;
  int have[2], c, pick = -1, pick_swapped = 0, pass;
  int kb;
  memset(o, 0, sizeof *o);
  XTE_CHECK_PTR(q, name);
  if ((unsigned)q->scaling_mode >= XTE_SCALING_COUNT)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "%s->scaling_mode %d is not an xte_scaling_mode", name,
                         (int)q->scaling_mode);
  if ((unsigned)q->recipe >= XTE_RECIPE_COUNT)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "%s->recipe %d is not an xte_recipe", name,
                         (int)q->recipe);
  kb = q->scaling_mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  copies[0] = &q->rowwise;
  copies[1] = &q->columnwise;
  scales[0] = &q->rowwise_scale_inv;
  scales[1] = &q->columnwise_scale_inv;
  for (c = 0; c < 2; c++) {
    char nm[96];
    int64_t m, k;
    have[c] = copies[c]->data != NULL;
    if (!have[c]) continue;
    snprintf(nm, sizeof nm, "%s->%s", name, c ? "columnwise" : "rowwise");
    XTE_TRY(xte_tensor_view2d(copies[c], nm, &R[c], &Cc[c], &ld[c]));
    if (copies[c]->dtype != XTE_DTYPE_E4M3 && copies[c]->dtype != XTE_DTYPE_E5M2)
      return xte_set_error(XTE_ERROR_DTYPE, "%s->dtype is %s: want e4m3 or e5m2", nm,
                           xte_dtype_name(copies[c]->dtype));
    if (c == 1 && xte_recipe_col_transposed(q->recipe)) {
      m = Cc[c];
      k = R[c];
    } else {
      m = R[c];
      k = Cc[c];
    }
    if (Mq >= 0 && (m != Mq || k != Kq))
      return xte_set_error(
          XTE_ERROR_SHAPE,
          "%s->columnwise is [%lld, %lld]: does not match the rowwise [%lld, %lld]", name,
          (long long)R[c], (long long)Cc[c], (long long)Mq, (long long)Kq);
    Mq = m;
    Kq = k;
  }
  if (!have[0] && !have[1])
    return xte_set_error(XTE_ERROR_NULL_POINTER, "%s: rowwise.data and columnwise.data are NULL",
                         name);
  /* Choose a copy whose blocks run along K: first one read K-contiguously, then any. */
  for (pass = 0; pass < 2 && pick < 0; pass++) {
    for (c = 0; c < 2 && pick < 0; c++) {
      int copy_is_x = !(c == 1 && xte_recipe_col_transposed(q->recipe));
      int swapped = copy_is_x == (trans != 0); /* logical = copy^T */
      int64_t bh, bw, kblk;
      if (!have[c] || swapped != pass) continue;
      if (q->scaling_mode == XTE_SCALING_PER_TENSOR) {
        bh = bw = BIG_BLOCK;
      } else if (q->scaling_mode == XTE_SCALING_BLOCK_128x128) {
        bh = bw = 128;
      } else if (c == 1 && !xte_recipe_col_transposed(q->recipe)) {
        bh = kb;
        bw = 1;
      } else {
        bh = 1;
        bw = kb;
      }
      kblk = swapped ? bh : bw;
      if (kblk < kb) continue;
      pick = c;
      pick_swapped = swapped;
      o->op.bi = swapped ? bw : bh;
      o->op.bk = kblk;
    }
  }
  if (pick < 0)
    return xte_set_error(
        XTE_ERROR_UNSUPPORTED,
        "%s: no copy is quantized along K for trans = %d (%s blocks; %s needs the %s "
        "copy)",
        name, trans, xte_scaling_mode_name(q->scaling_mode), name,
        have[0] ? "columnwise" : "rowwise");
  {
    const xte_scale_tensor *s = scales[pick];
    char sn[96];
    int64_t need_r, need_c;
    xte_dtype want_s = xte_recipe_is_mx(q->recipe) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
    snprintf(sn, sizeof sn, "%s->%s_scale_inv", name, pick ? "columnwise" : "rowwise");
    if ((unsigned)s->layout >= XTE_SCALE_LAYOUT_COUNT)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "%s.layout %d is not an xte_scale_layout",
                           sn, (int)s->layout);
    XTE_TRY(xte_scale_geom(Mq, Kq, q->scaling_mode, q->recipe, s->layout, pick, &o->op.s, &need_r,
                           &need_c));
    if (s->data == NULL) return xte_set_error(XTE_ERROR_NULL_POINTER, "%s.data is NULL", sn);
    if (s->dtype != want_s)
      return xte_set_error(XTE_ERROR_DTYPE, "%s.dtype is %s: recipe %d stores %s", sn,
                           xte_dtype_name(s->dtype), (int)q->recipe, xte_dtype_name(want_s));
    if (want_s == XTE_DTYPE_FP32 && ((uintptr_t)s->data % 4) != 0)
      return xte_set_error(XTE_ERROR_ALIGNMENT, "%s.data is not 4-byte aligned", sn);
    if (s->rows != need_r || s->cols != need_c)
      return xte_set_error(XTE_ERROR_SHAPE, "%s is [%lld, %lld]: want [%lld, %lld]", sn,
                           (long long)s->rows, (long long)s->cols, (long long)need_r,
                           (long long)need_c);
    o->op.s.data = s->data;
  }
  o->op.data = (const uint8_t *)copies[pick]->data;
  o->op.fmt = copies[pick]->dtype == XTE_DTYPE_E4M3 ? XTE_FP8_E4M3 : XTE_FP8_E5M2;
  o->op.sswap = pick_swapped;
  if (pick_swapped) {
    o->op.rs = 1;
    o->op.ks = ld[pick];
    o->rows = Cc[pick];
    o->K = R[pick];
  } else {
    o->op.rs = ld[pick];
    o->op.ks = 1;
    o->rows = R[pick];
    o->K = Cc[pick];
  }
  o->mode = q->scaling_mode;
  o->dtype = copies[pick]->dtype;
  return XTE_SUCCESS;
}

static xte_status check_pair(const opnd *a, const opnd *b) {
  xte_scaling_mode ma = a->mode, mb = b->mode;
  int ok = (ma == XTE_SCALING_PER_TENSOR && mb == XTE_SCALING_PER_TENSOR) ||
           (ma == XTE_SCALING_MXFP8_1x32 && mb == XTE_SCALING_MXFP8_1x32) ||
           (ma == XTE_SCALING_BLOCK_1x128 &&
            (mb == XTE_SCALING_BLOCK_1x128 || mb == XTE_SCALING_BLOCK_128x128)) ||
           (ma == XTE_SCALING_BLOCK_128x128 && mb == XTE_SCALING_BLOCK_1x128);
  if (!ok)
    return xte_set_error(XTE_ERROR_UNSUPPORTED,
                         "scaling pair A %s x B %s is not supported (1x128 x 128x128, 128x128 x "
                         "1x128, 1x128 x 1x128, per-tensor x per-tensor, mxfp8 x mxfp8)",
                         xte_scaling_mode_name(ma), xte_scaling_mode_name(mb));
  if (a->dtype == XTE_DTYPE_E5M2 && b->dtype == XTE_DTYPE_E5M2)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "A and B are both e5m2: not supported (as cuBLAS)");
  return XTE_SUCCESS;
}

/* Checks D, C and bias for an output of rows x N; fills the args' output fields. */
static xte_status check_outputs(const xte_tensor *C, xte_tensor *D, const xte_gemm_config *cfg,
                                int64_t rows, int64_t N, xte_gemm_args *g) {
  int64_t r, c, ld;
  XTE_CHECK_PTR(D, "D");
  XTE_TRY(xte_tensor_view2d(D, "D", &r, &c, &ld));
  if (D->dtype != XTE_DTYPE_FP32 && D->dtype != XTE_DTYPE_BF16)
    return xte_set_error(XTE_ERROR_DTYPE, "D->dtype is %s: want fp32 or bf16",
                         xte_dtype_name(D->dtype));
  if (r != rows || c != N)
    return xte_set_error(XTE_ERROR_SHAPE, "D is [%lld, %lld]: want [%lld, %lld]", (long long)r,
                         (long long)c, (long long)rows, (long long)N);
  if ((uintptr_t)D->data % xte_dtype_size(D->dtype))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "D->data is not aligned to its element size");
  g->d = D->data;
  g->d_dtype = (int)D->dtype;
  g->ld_d = ld;
  if (cfg->accumulate) {
    int64_t cr, cc, cld;
    XTE_CHECK_PTR(C, "C (config->accumulate = 1)");
    XTE_TRY(xte_tensor_view2d(C, "C", &cr, &cc, &cld));
    if (C->dtype != XTE_DTYPE_FP32 && C->dtype != XTE_DTYPE_BF16)
      return xte_set_error(XTE_ERROR_DTYPE, "C->dtype is %s: want fp32 or bf16",
                           xte_dtype_name(C->dtype));
    if (cr != rows || cc != N)
      return xte_set_error(XTE_ERROR_SHAPE, "C is [%lld, %lld]: want [%lld, %lld]", (long long)cr,
                           (long long)cc, (long long)rows, (long long)N);
    if ((uintptr_t)C->data % xte_dtype_size(C->dtype))
      return xte_set_error(XTE_ERROR_ALIGNMENT, "C->data is not aligned to its element size");
    if (C->data == D->data && (C->dtype != D->dtype || cld != ld))
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "C aliases D with a different dtype or ld (in place needs the same)");
    if (C->data != D->data && rows > 0 && N > 0) {
      /* any other overlap would make the result depend on the tile order */
      const char *c0 = (const char *)C->data, *d0 = (const char *)D->data;
      const char *c1 =
          c0 + ((size_t)(rows - 1) * (size_t)cld + (size_t)N) * xte_dtype_size(C->dtype);
      const char *d1 =
          d0 + ((size_t)(rows - 1) * (size_t)ld + (size_t)N) * xte_dtype_size(D->dtype);
      if (c0 < d1 && d0 < c1)
        return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                             "C overlaps D without being the same tensor (in place: C == D)");
    }
    g->c = C->data;
    g->c_dtype = (int)C->dtype;
    g->ld_c = cld;
  }
  if (cfg->bias) {
    int64_t br, bc, bld, bn;
    XTE_TRY(xte_tensor_view2d(cfg->bias, "config->bias", &br, &bc, &bld));
    if (cfg->bias->dtype != XTE_DTYPE_FP32)
      return xte_set_error(XTE_ERROR_DTYPE, "config->bias->dtype is %s: want fp32",
                           xte_dtype_name(cfg->bias->dtype));
    if (__builtin_mul_overflow(br, bc, &bn) || bn != N || (br > 1 && bld != bc))
      return xte_set_error(XTE_ERROR_SHAPE, "config->bias is [%lld, %lld]: want N = %lld elements",
                           (long long)br, (long long)bc, (long long)N);
    if ((uintptr_t)cfg->bias->data % 4)
      return xte_set_error(XTE_ERROR_ALIGNMENT, "config->bias->data is not 4-byte aligned");
    g->bias = (const float *)cfg->bias->data;
  }
  return XTE_SUCCESS;
}

static xte_status check_config(const xte_gemm_config *cfg) {
  if (cfg->trans_a != 0 && cfg->trans_a != 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->trans_a must be 0 or 1");
  if (cfg->trans_b != 0 && cfg->trans_b != 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->trans_b must be 0 or 1");
  if (cfg->accumulate != 0 && cfg->accumulate != 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->accumulate must be 0 or 1");
  if (cfg->mode != XTE_GEMM_EXACT && cfg->mode != XTE_GEMM_FAST)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->mode %d is not an xte_gemm_mode",
                         (int)cfg->mode);
  return XTE_SUCCESS;
}

/* The caller's config (NULL: the default) under the config ABI rule (src/core/config.h), checked.
 */
static xte_status read_config(const xte_gemm_config *config, xte_gemm_config *cfg) {
  const xte_gemm_config def = xte_gemm_config_default();
  XTE_TRY(xte_config_read(config, "config", XTE_CONFIG_END(xte_gemm_config, mode), sizeof *cfg,
                          &def, cfg));
  return check_config(cfg);
}

static xte_status dispatch(xte_gemm_args *g, xte_stream stream) {
  xte_exec ex;
  XTE_TRY(xte_resolve_stream(stream, &ex));
  if (!ex.ops->gemm || !ex.ops->gemm->gemm)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "backend %s has no gemm",
                         xte_backend_name(ex.backend));
  xte_clear_error();
  return ex.ops->gemm->gemm(g, ex.handle);
}

static void fill_operands(xte_gemm_args *g, const opnd *a, const opnd *b,
                          const xte_gemm_config *cfg) {
  g->a = a->op;
  g->b = b->op;
  g->kblock = a->mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  g->mode = (int)cfg->mode;
}

xte_status xte_gemm(const xte_qtensor *A, const xte_qtensor *B, const xte_tensor *C, xte_tensor *D,
                    const xte_gemm_config *config, xte_stream stream) {
  xte_gemm_config cfg;
  xte_gemm_args g;
  xte_gemm_problem p;
  opnd a, b;
  memset(&g, 0, sizeof g);
  memset(&p, 0, sizeof p);
  XTE_CHECK_PTR(A, "A");
  XTE_CHECK_PTR(B, "B");
  XTE_TRY(read_config(config, &cfg));
  XTE_TRY(resolve_operand(A, cfg.trans_a, "A", &a));
  XTE_TRY(resolve_operand(B, cfg.trans_b, "B", &b));
  XTE_TRY(check_pair(&a, &b));
  if (a.K != b.K)
    return xte_set_error(XTE_ERROR_SHAPE,
                         "K mismatch: op(A) is [%lld, %lld], op(B) is [%lld, %lld]",
                         (long long)a.rows, (long long)a.K, (long long)b.rows, (long long)b.K);
  XTE_TRY(check_outputs(C, D, &cfg, a.rows, b.rows, &g));
  fill_operands(&g, &a, &b, &cfg);
  p.m = a.rows;
  p.n = b.rows;
  p.k = a.K;
  g.num_problems = 1;
  g.problems = &p;
  return dispatch(&g, stream);
}

xte_status xte_gemm_grouped(const xte_qtensor *A, const xte_qtensor *B, const xte_tensor *C,
                            xte_tensor *D, const xte_gemm_groups *groups,
                            const xte_gemm_config *config, xte_stream stream) {
  xte_gemm_config cfg;
  xte_gemm_args g;
  xte_gemm_problem *P;
  opnd a, b;
  int64_t G, i, N, K, rows_out = 0, kb;
  xte_status st;
  memset(&g, 0, sizeof g);
  XTE_CHECK_PTR(A, "A");
  XTE_CHECK_PTR(B, "B");
  XTE_CHECK_PTR(groups, "groups");
  XTE_TRY(read_config(config, &cfg));
  if ((unsigned)groups->kind > XTE_GEMM_GROUPED_K)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "groups->kind %d is not an xte_gemm_grouping",
                         (int)groups->kind);
  if (groups->num_groups < 1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "groups->num_groups = %d: want >= 1",
                         groups->num_groups);
  G = groups->num_groups;
  if (groups->kind != XTE_GEMM_GROUPED_K && cfg.trans_a != 0)
    return xte_set_error(
        XTE_ERROR_UNSUPPORTED,
        "config->trans_a = 1: contiguous and masked groupings take A as [rows, K]");
  XTE_TRY(resolve_operand(A, cfg.trans_a, "A", &a));
  XTE_TRY(resolve_operand(B, cfg.trans_b, "B", &b));
  XTE_TRY(check_pair(&a, &b));
  kb = a.mode == XTE_SCALING_MXFP8_1x32 ? 32 : 128;
  if (groups->kind == XTE_GEMM_GROUPED_K) {
    int64_t off = 0;
    XTE_CHECK_PTR(groups->group_sizes, "groups->group_sizes");
    if ((uintptr_t)groups->group_sizes % 8)
      return xte_set_error(XTE_ERROR_ALIGNMENT, "groups->group_sizes is not 8-byte aligned");
    if (a.K != b.K)
      return xte_set_error(XTE_ERROR_SHAPE,
                           "K mismatch: op(A) is [%lld, %lld], op(B) is [%lld, %lld]",
                           (long long)a.rows, (long long)a.K, (long long)b.rows, (long long)b.K);
    for (i = 0; i < G; i++) {
      int64_t k = groups->group_sizes[i];
      if (k < 0)
        return xte_set_error(XTE_ERROR_SHAPE, "groups->group_sizes[%lld] = %lld is negative",
                             (long long)i, (long long)k);
      if (k > a.K - off)
        return xte_set_error(XTE_ERROR_SHAPE,
                             "groups->group_sizes[%lld] = %lld runs past op(A)'s K = %lld",
                             (long long)i, (long long)k, (long long)a.K);
      if (k > 0 && off % kb)
        return xte_set_error(
            XTE_ERROR_SHAPE,
            "groups->group_sizes: group %lld starts at K = %lld, not a multiple of "
            "the K block %lld",
            (long long)i, (long long)off, (long long)kb);
      off += k;
    }
    if (off != a.K)
      return xte_set_error(XTE_ERROR_SHAPE, "groups->group_sizes sum to %lld: op(A) has K = %lld",
                           (long long)off, (long long)a.K);
    N = b.rows;
    if (__builtin_mul_overflow(G, a.rows, &rows_out))
      return xte_set_error(XTE_ERROR_SHAPE,
                           "groups->num_groups = %lld times op(A)'s %lld rows overflows (D is "
                           "[G * M, N])",
                           (long long)G, (long long)a.rows);
  } else {
    int64_t align = groups->alignment > 1 ? groups->alignment : 1;
    if (cfg.trans_b == 0) {
      if (b.rows % G)
        return xte_set_error(XTE_ERROR_SHAPE, "B has %lld rows: not %lld groups of N rows",
                             (long long)b.rows, (long long)G);
      N = b.rows / G;
      K = b.K;
    } else {
      if (b.K % G)
        return xte_set_error(XTE_ERROR_SHAPE, "B has %lld rows: not %lld groups of K rows",
                             (long long)b.K, (long long)G);
      N = b.rows;
      K = b.K / G;
      if (G > 1 && K % kb)
        return xte_set_error(XTE_ERROR_SHAPE,
                             "B [G, K, N] with K = %lld: K must be a multiple of the K block %lld",
                             (long long)K, (long long)kb);
    }
    if (a.K != K)
      return xte_set_error(XTE_ERROR_SHAPE, "K mismatch: A has K = %lld, each group of B %lld",
                           (long long)a.K, (long long)K);
    if (groups->kind == XTE_GEMM_GROUPED_CONTIGUOUS) {
      XTE_CHECK_PTR(groups->group_sizes, "groups->group_sizes");
      if ((uintptr_t)groups->group_sizes % 8)
        return xte_set_error(XTE_ERROR_ALIGNMENT, "groups->group_sizes is not 8-byte aligned");
      if (groups->alignment < 0 || groups->alignment > ((int64_t)1 << 30))
        return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                             "groups->alignment = %lld is outside [0, 2^30]",
                             (long long)groups->alignment);
      for (i = 0; i < G; i++) {
        int64_t sz = groups->group_sizes[i], padded;
        if (sz < 0)
          return xte_set_error(XTE_ERROR_SHAPE, "groups->group_sizes[%lld] = %lld is negative",
                               (long long)i, (long long)sz);
        if (sz > a.rows - rows_out || rup_overflows(sz, align, &padded) ||
            padded > a.rows - rows_out)
          return xte_set_error(XTE_ERROR_SHAPE,
                               "groups->group_sizes[%lld] = %lld (padded to %lld) runs past A's "
                               "%lld rows",
                               (long long)i, (long long)sz, (long long)align, (long long)a.rows);
        rows_out += padded;
      }
      if (rows_out != a.rows)
        return xte_set_error(XTE_ERROR_SHAPE,
                             "A has %lld rows: the groups (padded to %lld) need %lld",
                             (long long)a.rows, (long long)align, (long long)rows_out);
    } else {
      int64_t mr, mc, mld, mn;
      XTE_CHECK_PTR(groups->masked_m, "groups->masked_m");
      XTE_TRY(xte_tensor_view2d(groups->masked_m, "groups->masked_m", &mr, &mc, &mld));
      if (groups->masked_m->dtype != XTE_DTYPE_INT32)
        return xte_set_error(XTE_ERROR_DTYPE, "groups->masked_m->dtype is %s: want int32",
                             xte_dtype_name(groups->masked_m->dtype));
      if (__builtin_mul_overflow(mr, mc, &mn) || mn != G || (mr > 1 && mld != mc))
        return xte_set_error(XTE_ERROR_SHAPE, "groups->masked_m is [%lld, %lld]: want %lld values",
                             (long long)mr, (long long)mc, (long long)G);
      if ((uintptr_t)groups->masked_m->data % 4)
        return xte_set_error(XTE_ERROR_ALIGNMENT, "groups->masked_m->data is not 4-byte aligned");
      if (a.rows % G)
        return xte_set_error(XTE_ERROR_SHAPE, "A has %lld rows: not %lld groups of m_max rows",
                             (long long)a.rows, (long long)G);
      rows_out = a.rows;
    }
  }
  XTE_TRY(check_outputs(C, D, &cfg, rows_out, N, &g));
  fill_operands(&g, &a, &b, &cfg);
  P = (xte_gemm_problem *)xte_aligned_calloc((size_t)G, sizeof *P);
  if (!P) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "no memory for %lld groups", (long long)G);
  {
    int64_t off = 0, align = groups->alignment > 1 ? groups->alignment : 1;
    for (i = 0; i < G; i++) {
      xte_gemm_problem *p = &P[i];
      p->n = N;
      if (groups->kind == XTE_GEMM_GROUPED_K) {
        p->m = a.rows;
        p->k = groups->group_sizes[i];
        p->a_k0 = p->b_k0 = off;
        p->d_r0 = i * a.rows;
        off += p->k;
      } else {
        p->k = a.K;
        if (cfg.trans_b == 0)
          p->b_i0 = i * N;
        else
          p->b_k0 = i * a.K;
        if (groups->kind == XTE_GEMM_GROUPED_CONTIGUOUS) {
          int64_t padded = 0;
          p->m = groups->group_sizes[i];
          p->a_i0 = p->d_r0 = off;
          (void)rup_overflows(p->m, align, &padded); /* checked above: at most A's rows */
          off += padded;
        } else {
          p->m = a.rows / G;
          p->a_i0 = p->d_r0 = i * p->m;
        }
      }
    }
  }
  g.num_problems = G;
  g.problems = P;
  if (groups->kind == XTE_GEMM_GROUPED_MASKED) g.masked_m = (const int32_t *)groups->masked_m->data;
  st = dispatch(&g, stream);
  xte_aligned_free(P);
  return st;
}

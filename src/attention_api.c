/* Entry points of attention: argument checks, layout resolution, dispatch. Nothing is written
 * to any output before every check the core can make has passed (cu_seqlens, in backend memory,
 * are checked by the backend, also before it writes). */
#include <stdint.h>
#include <string.h>

#include "core/config.h"
#include "core/tensor.h"
#include "numerics/xte_attention_numerics.h"
#include "xte_attention_ops.h"
#include "xte_internal.h"

xte_attention_config xte_attention_config_default(void) {
  xte_attention_config c;
  memset(&c, 0, sizeof c);
  c.struct_size = sizeof c;
  c.layout = XTE_ATTN_LAYOUT_BSHD;
  c.mask = XTE_ATTN_MASK_NONE;
  c.window_left = -1;
  c.window_right = -1;
  c.mode = XTE_ATTENTION_EXACT;
  return c;
}

/* The caller's config under the config ABI rule (src/core/config.h) into *cfg, and config pointed
 * at it; a NULL config stays NULL (check_common refuses it). */
static xte_status read_config(const xte_attention_config **config, xte_attention_config *cfg) {
  const xte_attention_config def = xte_attention_config_default();
  if (*config == NULL) return XTE_SUCCESS;
  XTE_TRY(xte_config_read(*config, "config", XTE_CONFIG_END(xte_attention_config, descale_v),
                          sizeof *cfg, &def, cfg));
  *config = cfg;
  return XTE_SUCCESS;
}

static int finitef_(float x) {
  return x == x && x - x == 0.0f;
}

/* Shape of one operand: [b, s, h, d] (BSHD, SBHD as [s, b, h, d]) or [t, h, d]. */
typedef struct shp {
  int64_t b, s, h, d;
} shp;

static xte_status get_shape(const xte_tensor *t, const char *name, int layout, shp *o) {
  int i;
  int want = layout == XTE_ATTN_LAYOUT_THD ? 3 : 4;
  if (t->rank != want)
    return xte_set_error(XTE_ERROR_SHAPE, "%s has rank %d: the %s layout wants rank %d", name,
                         (int)t->rank, layout == XTE_ATTN_LAYOUT_THD ? "THD" : "BSHD/SBHD", want);
  {
    /* The product of the dims, zeros counted as 1, is bounded: every product of some of them
     * (strides, element counts, the kernels' offsets) then fits int64 even when one is 0. */
    int64_t total = 1;
    for (i = 0; i < want; i++) {
      if (t->shape[i] < 0 || t->shape[i] > INT32_MAX)
        return xte_set_error(XTE_ERROR_SHAPE, "%s->shape[%d] = %lld is outside [0, 2^31)", name, i,
                             (long long)t->shape[i]);
      if (__builtin_mul_overflow(total, t->shape[i] > 0 ? t->shape[i] : 1, &total) ||
          total > ((int64_t)1 << 48))
        return xte_set_error(XTE_ERROR_SHAPE, "%s has more than 2^48 elements (zero dims as 1)",
                             name);
    }
  }
  if (layout == XTE_ATTN_LAYOUT_THD) {
    o->b = 1;
    o->s = t->shape[0];
    o->h = t->shape[1];
    o->d = t->shape[2];
  } else if (layout == XTE_ATTN_LAYOUT_BSHD) {
    o->b = t->shape[0];
    o->s = t->shape[1];
    o->h = t->shape[2];
    o->d = t->shape[3];
  } else {
    o->s = t->shape[0];
    o->b = t->shape[1];
    o->h = t->shape[2];
    o->d = t->shape[3];
  }
  if (t->ld != 0 && t->ld != o->d)
    return xte_set_error(XTE_ERROR_SHAPE,
                         "%s->ld = %lld: attention tensors are dense (ld = 0 or %lld)", name,
                         (long long)t->ld, (long long)o->d);
  return XTE_SUCCESS;
}

static xte_attn_tensor resolve(const xte_tensor *t, int layout, const shp *s) {
  xte_attn_tensor r;
  r.data = t->data;
  r.hs = s->d;
  if (layout == XTE_ATTN_LAYOUT_SBHD) {
    r.ts = s->b * s->h * s->d;
    r.bs = s->h * s->d;
  } else {
    r.ts = s->h * s->d;
    r.bs = s->s * s->h * s->d;
  }
  return r;
}

/* A pointer aligned to n bytes (NULL passes: the NULL checks are separate). */
static int aligned_to(const void *p, size_t n) {
  return n <= 1 || (uintptr_t)p % n == 0;
}

static xte_status check_data(const xte_tensor *t, const char *name, const shp *s) {
  if (t->data == NULL && s->b * s->s * s->h * s->d > 0)
    return xte_set_error(XTE_ERROR_NULL_POINTER, "%s->data is NULL", name);
  if (!aligned_to(t->data, xte_dtype_size(t->dtype)))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "%s->data is not aligned to its element size (%zu)",
                         name, xte_dtype_size(t->dtype));
  return XTE_SUCCESS;
}

/* An optional fp32 / int32 array of the config (NULL: absent) must be 4-byte aligned. */
static xte_status check_cfg_array(const void *p, const char *name) {
  if (!aligned_to(p, 4))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "config->%s is not 4-byte aligned", name);
  return XTE_SUCCESS;
}

static xte_status same_shape(const shp *a, const shp *b, const char *an, const char *bn) {
  if (a->b != b->b || a->s != b->s || a->h != b->h || a->d != b->d)
    return xte_set_error(XTE_ERROR_SHAPE, "%s and %s differ in shape", an, bn);
  return XTE_SUCCESS;
}

static int in_dtype_ok(xte_dtype d) {
  return d == XTE_DTYPE_FP32 || d == XTE_DTYPE_BF16 || d == XTE_DTYPE_FP16;
}

/* Checks everything common to fwd and bwd and fills args (except the backward tensors). */
static xte_status check_common(const xte_tensor *Q, const xte_tensor *K, const xte_tensor *V,
                               const xte_tensor *O, const char *oname, const xte_tensor *lse,
                               const xte_attention_config *cfg, int bwd, xte_attn_args *a, shp *sq_,
                               shp *skv_, shp *sv_, shp *so_) {
  shp q, k, v, o;
  int layout;
  XTE_CHECK_PTR(Q, "Q");
  XTE_CHECK_PTR(K, "K");
  XTE_CHECK_PTR(V, "V");
  XTE_CHECK_PTR(O, oname);
  XTE_CHECK_PTR(lse, "lse");
  XTE_CHECK_PTR(cfg, "config");
  if ((unsigned)cfg->layout >= XTE_ATTN_LAYOUT_COUNT)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->layout %d is not an xte_attn_layout",
                         (int)cfg->layout);
  if ((unsigned)cfg->mask >= XTE_ATTN_MASK_COUNT)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->mask %d is not an xte_attn_mask",
                         (int)cfg->mask);
  if (cfg->window_left < -1 || cfg->window_right < -1)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "config->window_left = %lld, window_right = %lld: each must be >= -1",
                         (long long)cfg->window_left, (long long)cfg->window_right);
  if (!finitef_(cfg->softmax_scale))
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->softmax_scale is not finite");
  if (!finitef_(cfg->softcap) || cfg->softcap < 0.0f)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "config->softcap = %g: must be finite and >= 0 (0 = off)",
                         (double)cfg->softcap);
  if ((unsigned)cfg->mode > (unsigned)XTE_ATTENTION_FAST)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "config->mode %d is not an xte_attention_mode (0 EXACT, 1 FAST)",
                         (int)cfg->mode);
  layout = (int)cfg->layout;

  /* dtypes */
  if (Q->dtype != K->dtype || Q->dtype != V->dtype)
    return xte_set_error(XTE_ERROR_DTYPE, "Q, K, V dtypes differ (%s, %s, %s)",
                         xte_dtype_name(Q->dtype), xte_dtype_name(K->dtype),
                         xte_dtype_name(V->dtype));
  if (Q->dtype == XTE_DTYPE_E4M3) {
    if (bwd)
      return xte_set_error(XTE_ERROR_UNSUPPORTED,
                           "Q is e4m3: the FP8 attention is forward only (Q, K, V fp32 / bf16 / "
                           "fp16 for the backward)");
    if (!in_dtype_ok(O->dtype))
      return xte_set_error(XTE_ERROR_DTYPE, "%s is %s: with e4m3 inputs O is bf16, fp16 or fp32",
                           oname, xte_dtype_name(O->dtype));
  } else {
    if (!in_dtype_ok(Q->dtype))
      return xte_set_error(XTE_ERROR_DTYPE,
                           "Q is %s: attention takes fp32, bf16, fp16 (e4m3 "
                           "forward)",
                           xte_dtype_name(Q->dtype));
    if (O->dtype != Q->dtype)
      return xte_set_error(XTE_ERROR_DTYPE, "%s is %s: it must have Q's dtype %s", oname,
                           xte_dtype_name(O->dtype), xte_dtype_name(Q->dtype));
    if (cfg->descale_q || cfg->descale_k || cfg->descale_v)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "config->descale_* are for e4m3 inputs only (Q is %s)",
                           xte_dtype_name(Q->dtype));
  }
  if (lse->dtype != XTE_DTYPE_FP32)
    return xte_set_error(XTE_ERROR_DTYPE, "lse is %s: it must be fp32", xte_dtype_name(lse->dtype));

  /* shapes */
  XTE_TRY(get_shape(Q, "Q", layout, &q));
  XTE_TRY(get_shape(K, "K", layout, &k));
  XTE_TRY(get_shape(V, "V", layout, &v));
  XTE_TRY(get_shape(O, oname, layout, &o));
  if (k.b != q.b || v.b != q.b || o.b != q.b)
    return xte_set_error(XTE_ERROR_SHAPE, "Q, K, V, %s differ in batch size", oname);
  if (k.s != v.s || k.h != v.h)
    return xte_set_error(XTE_ERROR_SHAPE,
                         "K [.., %lld, %lld, ..] and V [.., %lld, %lld, ..] differ in sequence "
                         "length or heads",
                         (long long)k.s, (long long)k.h, (long long)v.s, (long long)v.h);
  if (o.s != q.s || o.h != q.h || o.d != v.d)
    return xte_set_error(XTE_ERROR_SHAPE, "%s must be [.., s_q = %lld, h_q = %lld, d_v = %lld]",
                         oname, (long long)q.s, (long long)q.h, (long long)v.d);
  if (q.d != k.d)
    return xte_set_error(XTE_ERROR_SHAPE, "Q head dim %lld differs from K head dim %lld",
                         (long long)q.d, (long long)k.d);
  if (q.d < 1 || q.d > XTE_ATTN_MAX_HEAD_DIM)
    return xte_set_error(XTE_ERROR_SHAPE, "Q head dim d_qk = %lld is outside [1, %d]",
                         (long long)q.d, XTE_ATTN_MAX_HEAD_DIM);
  if (v.d < 1 || v.d > XTE_ATTN_MAX_HEAD_DIM)
    return xte_set_error(XTE_ERROR_SHAPE, "V head dim d_v = %lld is outside [1, %d]",
                         (long long)v.d, XTE_ATTN_MAX_HEAD_DIM);
  if (k.h < 1 || q.h < 1)
    return xte_set_error(XTE_ERROR_SHAPE, "h_q = %lld, h_kv = %lld: heads must be >= 1",
                         (long long)q.h, (long long)k.h);
  if (q.h % k.h != 0)
    return xte_set_error(XTE_ERROR_SHAPE,
                         "h_q = %lld is not a multiple of h_kv = %lld (GQA groups)", (long long)q.h,
                         (long long)k.h);
  XTE_TRY(check_data(Q, "Q", &q));
  XTE_TRY(check_data(K, "K", &k));
  XTE_TRY(check_data(V, "V", &v));
  XTE_TRY(check_data(O, oname, &o));

  memset(a, 0, sizeof *a);
  a->dtype = (int)Q->dtype;
  a->out_dtype = (int)O->dtype;
  a->hq = q.h;
  a->hkv = k.h;
  a->dqk = q.d;
  a->dv = v.d;
  a->q = resolve(Q, layout, &q);
  a->k = resolve(K, layout, &k);
  a->v = resolve(V, layout, &v);
  a->o = resolve(O, layout, &o);

  if (layout == XTE_ATTN_LAYOUT_THD) {
    XTE_CHECK_PTR(cfg->cu_seqlens_q, "config->cu_seqlens_q");
    XTE_CHECK_PTR(cfg->cu_seqlens_kv, "config->cu_seqlens_kv");
    if (cfg->batch < 0 || cfg->batch >= INT32_MAX)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "config->batch = %lld is outside [0, 2^31 - 1) (cu_seqlens are int32 "
                           "[batch + 1])",
                           (long long)cfg->batch);
    if (cfg->max_seqlen_q < 0 || cfg->max_seqlen_kv < 0)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "config->max_seqlen_q = %lld, max_seqlen_kv = %lld: negative",
                           (long long)cfg->max_seqlen_q, (long long)cfg->max_seqlen_kv);
    a->packed = 1;
    a->batch = cfg->batch;
    a->sq = cfg->max_seqlen_q;
    a->skv = cfg->max_seqlen_kv;
    a->total_q = q.s;
    a->total_kv = k.s;
    if (lse->rank != 2 || lse->shape[0] != q.s || lse->shape[1] != q.h)
      return xte_set_error(XTE_ERROR_SHAPE, "lse must be [total_q = %lld, h_q = %lld] fp32 (THD)",
                           (long long)q.s, (long long)q.h);
    a->lse_ts = q.h;
    a->lse_hs = 1;
    a->lse_bs = 0;
    a->q.bs = a->k.bs = a->v.bs = a->o.bs = 0;
  } else {
    a->batch = q.b;
    a->sq = q.s;
    a->skv = k.s;
    a->total_q = q.s;
    a->total_kv = k.s;
    if (lse->rank != 3 || lse->shape[0] != q.b || lse->shape[1] != q.h || lse->shape[2] != q.s)
      return xte_set_error(XTE_ERROR_SHAPE, "lse must be [b = %lld, h_q = %lld, s_q = %lld] fp32",
                           (long long)q.b, (long long)q.h, (long long)q.s);
    if ((cfg->cu_seqlens_q == NULL) != (cfg->cu_seqlens_kv == NULL))
      return xte_set_error(XTE_ERROR_NULL_POINTER,
                           "config->cu_seqlens_%s is NULL while cu_seqlens_%s is given (padding "
                           "takes both)",
                           cfg->cu_seqlens_q ? "kv" : "q", cfg->cu_seqlens_q ? "q" : "kv");
    a->lse_bs = q.h * q.s;
    a->lse_hs = q.s;
    a->lse_ts = 1;
  }
  if (lse->ld != 0 && lse->ld != lse->shape[lse->rank - 1])
    return xte_set_error(XTE_ERROR_SHAPE, "lse->ld = %lld: lse is dense", (long long)lse->ld);
  if (lse->data == NULL && q.b * q.s * q.h > 0)
    return xte_set_error(XTE_ERROR_NULL_POINTER, "lse->data is NULL");
  if (!aligned_to(lse->data, 4))
    return xte_set_error(XTE_ERROR_ALIGNMENT, "lse->data is not 4-byte aligned");
  XTE_TRY(check_cfg_array(cfg->cu_seqlens_q, "cu_seqlens_q"));
  XTE_TRY(check_cfg_array(cfg->cu_seqlens_kv, "cu_seqlens_kv"));
  XTE_TRY(check_cfg_array(cfg->alibi_slopes, "alibi_slopes"));
  XTE_TRY(check_cfg_array(cfg->descale_q, "descale_q"));
  XTE_TRY(check_cfg_array(cfg->descale_k, "descale_k"));
  XTE_TRY(check_cfg_array(cfg->descale_v, "descale_v"));
  a->cu_q = cfg->cu_seqlens_q;
  a->cu_kv = cfg->cu_seqlens_kv;
  a->lse = (float *)lse->data;
  a->mask = (int)cfg->mask;
  /* Positions are below 2^31: a wider window is the same as an unbounded side, and clamping
   * keeps every position +- window sum of the kernels inside int64. */
  a->window_left = cfg->window_left > INT32_MAX ? INT32_MAX : cfg->window_left;
  a->window_right = cfg->window_right > INT32_MAX ? INT32_MAX : cfg->window_right;
  a->scale = cfg->softmax_scale != 0.0f ? cfg->softmax_scale : xte_attn_default_scale(q.d);
  a->softcap = cfg->softcap;
  a->fast = cfg->mode == XTE_ATTENTION_FAST;
  a->alibi = cfg->alibi_slopes;
  a->descale_q = cfg->descale_q;
  a->descale_k = cfg->descale_k;
  a->descale_v = cfg->descale_v;
  *sq_ = q;
  *skv_ = k;
  *sv_ = v;
  *so_ = o;
  return XTE_SUCCESS;
}

/* Elements of a checked operand (get_shape bounds the product, zeros counted as 1). */
static int64_t numel(const xte_tensor *t) {
  int64_t n = 1;
  int i;
  for (i = 0; i < t->rank; i++) n *= t->shape[i];
  return n;
}

xte_status xte_attention_fwd(const xte_tensor *Q, const xte_tensor *K, const xte_tensor *V,
                             xte_tensor *O, xte_tensor *lse, const xte_attention_config *config,
                             xte_stream stream) {
  xte_attn_args a;
  shp q, k, v, o;
  xte_exec ex;
  xte_attention_config cfg;
  XTE_TRY(read_config(&config, &cfg));
  XTE_TRY(check_common(Q, K, V, O, "O", lse, config, 0, &a, &q, &k, &v, &o));
  XTE_TRY(xte_resolve_stream(stream, &ex));
  if (!ex.ops->attention || !ex.ops->attention->fwd)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "backend %s has no attention",
                         xte_backend_name(ex.backend));
  xte_clear_error();
  a.no_output = numel(O) == 0 && numel(lse) == 0;
  return ex.ops->attention->fwd(&a, ex.handle);
}

xte_status xte_attention_bwd(const xte_tensor *Q, const xte_tensor *K, const xte_tensor *V,
                             const xte_tensor *O, const xte_tensor *dO, const xte_tensor *lse,
                             xte_tensor *dQ, xte_tensor *dK, xte_tensor *dV,
                             const xte_attention_config *config, xte_stream stream) {
  xte_attn_args a;
  shp q, k, v, o, t;
  xte_exec ex;
  xte_attention_config cfg;
  XTE_TRY(read_config(&config, &cfg));
  XTE_TRY(check_common(Q, K, V, O, "O", lse, config, 1, &a, &q, &k, &v, &o));
  XTE_CHECK_PTR(dO, "dO");
  XTE_CHECK_PTR(dQ, "dQ");
  XTE_CHECK_PTR(dK, "dK");
  XTE_CHECK_PTR(dV, "dV");
  if (dO->dtype != Q->dtype || dQ->dtype != Q->dtype || dK->dtype != Q->dtype ||
      dV->dtype != Q->dtype)
    return xte_set_error(XTE_ERROR_DTYPE, "dO, dQ, dK, dV must all have Q's dtype %s",
                         xte_dtype_name(Q->dtype));
  XTE_TRY(get_shape(dO, "dO", (int)config->layout, &t));
  XTE_TRY(same_shape(&t, &o, "dO", "O"));
  XTE_TRY(check_data(dO, "dO", &t));
  XTE_TRY(get_shape(dQ, "dQ", (int)config->layout, &t));
  XTE_TRY(same_shape(&t, &q, "dQ", "Q"));
  XTE_TRY(check_data(dQ, "dQ", &t));
  XTE_TRY(get_shape(dK, "dK", (int)config->layout, &t));
  XTE_TRY(same_shape(&t, &k, "dK", "K"));
  XTE_TRY(check_data(dK, "dK", &t));
  XTE_TRY(get_shape(dV, "dV", (int)config->layout, &t));
  XTE_TRY(same_shape(&t, &v, "dV", "V"));
  XTE_TRY(check_data(dV, "dV", &t));
  a.dout = resolve(dO, (int)config->layout, &o);
  a.dq = resolve(dQ, (int)config->layout, &q);
  a.dk = resolve(dK, (int)config->layout, &k);
  a.dv_ = resolve(dV, (int)config->layout, &v);
  if (a.packed) a.dout.bs = a.dq.bs = a.dk.bs = a.dv_.bs = 0;
  XTE_TRY(xte_resolve_stream(stream, &ex));
  if (!ex.ops->attention || !ex.ops->attention->bwd)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "backend %s has no attention backward",
                         xte_backend_name(ex.backend));
  xte_clear_error();
  a.no_output = numel(dQ) == 0 && numel(dK) == 0 && numel(dV) == 0;
  return ex.ops->attention->bwd(&a, ex.handle);
}

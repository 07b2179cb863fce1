/* The config ABI rule (docs/api.md, src/core/config.h): every xte_*_config starts with
 * struct_size; the library reads the fields inside the caller's struct_size and takes the default
 * for those past it; a struct_size of 0, below the first version's fields or above the library's
 * sizeof is refused with XTE_ERROR_INVALID_ARGUMENT naming config->struct_size, and nothing is
 * written; a NULL config means the default where the header says so.
 *
 * Part 1 runs the rule's reader (src/core/config.c, compiled into this test) on a config with two
 * versions, as the library will see one when a field is appended: the older caller's struct, the
 * newer one cut before its last field, and the bytes past struct_size poisoned. Part 2 checks
 * every public entry point that takes a config. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <xte/xte.h>

/* the reader, with this file's xte_set_error (the library's is hidden) */
#include "../src/core/config.c"

static char g_msg[512];

xte_status xte_set_error(xte_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_msg, sizeof g_msg, fmt, ap);
  va_end(ap);
  return status;
}

/* ------------------------------------------------------------------ part 1: two versions */

/* version 1 of a config, and version 2 (the library's) with a field appended past sizeof(v1) */
typedef struct cfg_v1 {
  size_t struct_size;
  int32_t a, b;
} cfg_v1;
typedef struct cfg_v2 {
  size_t struct_size;
  int32_t a, b;
  int64_t c;
} cfg_v2;

static const cfg_v2 DEF = {sizeof(cfg_v2), 1, 2, 77};
#define V1_END XTE_CONFIG_END(cfg_v1, b)

/* a caller's struct of struct_size bytes at the start of a buffer whose other bytes are 0xEE,
 * so that a byte read past struct_size shows in the result */
typedef union poisoned {
  unsigned char bytes[64];
  cfg_v2 v2;
  cfg_v1 v1;
} poisoned;

static xte_status read_v2(const void *caller, cfg_v2 *out) {
  g_msg[0] = '\0';
  return xte_config_read(caller, "config", V1_END, sizeof(cfg_v2), &DEF, out);
}

Test(config_rule, older_struct_gets_the_default_for_later_fields) {
  poisoned p;
  cfg_v2 out;
  memset(&p, 0xEE, sizeof p);
  p.v1.struct_size = sizeof(cfg_v1);
  p.v1.a = 5;
  p.v1.b = 6;
  cr_assert_eq(read_v2(&p, &out), XTE_SUCCESS, "%s", g_msg);
  cr_expect_eq(out.a, 5);
  cr_expect_eq(out.b, 6);
  cr_expect_eq(out.c, 77, "c = %lld: read past struct_size instead of the default",
               (long long)out.c);
  cr_expect_eq(out.struct_size, sizeof(cfg_v2));
}

Test(config_rule, newer_struct_cut_before_its_last_field) {
  poisoned p;
  cfg_v2 out;
  memset(&p, 0xEE, sizeof p);
  p.v2.a = -3;
  p.v2.b = 4;
  p.v2.c = 999;                           /* present in memory, outside struct_size */
  p.v2.struct_size = offsetof(cfg_v2, c); /* cut before c */
  cr_assert_eq(read_v2(&p, &out), XTE_SUCCESS, "%s", g_msg);
  cr_expect_eq(out.a, -3);
  cr_expect_eq(out.b, 4);
  cr_expect_eq(out.c, 77, "c = %lld: want the default 77", (long long)out.c);
  p.v2.struct_size = V1_END; /* the smallest accepted: the first version's fields, no padding */
  cr_assert_eq(read_v2(&p, &out), XTE_SUCCESS, "%s", g_msg);
  cr_expect_eq(out.c, 77);
  p.v2.struct_size = sizeof(cfg_v2); /* the full struct: every field the caller's */
  cr_assert_eq(read_v2(&p, &out), XTE_SUCCESS, "%s", g_msg);
  cr_expect_eq(out.a, -3);
  cr_expect_eq(out.c, 999);
}

Test(config_rule, null_is_the_default) {
  cfg_v2 out;
  memset(&out, 0xCD, sizeof out);
  cr_assert_eq(read_v2(NULL, &out), XTE_SUCCESS);
  cr_expect(memcmp(&out, &DEF, sizeof out) == 0);
}

Test(config_rule, bad_sizes_refused_and_nothing_written) {
  static const size_t bad[] = {
      0, 1, sizeof(size_t), V1_END - 1, sizeof(cfg_v2) + 1, sizeof(cfg_v2) + 8, 4096, SIZE_MAX};
  size_t i;
  for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    poisoned p;
    cfg_v2 out, before;
    memset(&p, 0, sizeof p);
    p.v2.struct_size = bad[i];
    memset(&out, 0xCD, sizeof out);
    before = out;
    cr_expect_eq(read_v2(&p, &out), XTE_ERROR_INVALID_ARGUMENT, "struct_size %zu accepted", bad[i]);
    cr_expect(strstr(g_msg, "config->struct_size") != NULL, "message \"%s\"", g_msg);
    cr_expect(memcmp(&out, &before, sizeof out) == 0, "struct_size %zu: *out written", bad[i]);
  }
}

/* ------------------------------------------------------------------ part 2: the entry points */

#define CANARY 0xA5

static int all_canary(const void *p, size_t n) {
  size_t i;
  for (i = 0; i < n; i++)
    if (((const uint8_t *)p)[i] != CANARY) return 0;
  return 1;
}

/* The sizes every entry point must refuse for a config of library size lib, first-version
 * end first. */
static size_t bad_size(int i, size_t first, size_t lib) {
  switch (i) {
    case 0:
      return 0;
    case 1:
      return first - 1;
    case 2:
      return lib + 1;
    default:
      return lib + 64;
  }
}
#define NBAD 4

static void expect_refused(xte_status st, size_t size, const char *what) {
  const char *msg = xte_last_error();
  cr_expect_eq(st, XTE_ERROR_INVALID_ARGUMENT, "%s: struct_size %zu gave %s", what, size,
               xte_status_string(st));
  cr_expect(strstr(msg, "config->struct_size") != NULL, "%s: message \"%s\"", what, msg);
}

/* quantize fp32 [4, 256] -> e4m3, TE_BLOCK 1x128, rowwise, COMPACT scales */
typedef struct qfix {
  float in[4 * 256];
  uint8_t q[4 * 256];
  float s[8];
  xte_tensor x;
  xte_qtensor out;
} qfix;

static void qfix_init(qfix *f) {
  int i;
  for (i = 0; i < 4 * 256; i++) f->in[i] = (float)(i % 29) * 37.5f - 500.0f;
  memset(f->q, CANARY, sizeof f->q);
  memset(f->s, CANARY, sizeof f->s);
  f->x = xte_tensor_2d(f->in, XTE_DTYPE_FP32, 4, 256);
  memset(&f->out, 0, sizeof f->out);
  f->out.rowwise = xte_tensor_2d(f->q, XTE_DTYPE_E4M3, 4, 256);
  f->out.rowwise_scale_inv.data = f->s;
  f->out.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  f->out.rowwise_scale_inv.rows = 4;
  f->out.rowwise_scale_inv.cols = 2;
  f->out.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  f->out.scaling_mode = XTE_SCALING_BLOCK_1x128;
  f->out.recipe = XTE_RECIPE_TE_BLOCK;
}

Test(config_api, quantize) {
  static qfix f, g;
  const size_t first = XTE_CONFIG_END(xte_quant_config, saturate), lib = sizeof(xte_quant_config);
  xte_quant_config c = xte_quant_config_default();
  int i;
  cr_expect_eq(c.struct_size, lib);
  /* NULL, the default and the first version's size give the same bytes */
  qfix_init(&f);
  cr_assert_eq(xte_quantize(&f.x, &f.out, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
  qfix_init(&g);
  c.struct_size = first;
  cr_assert_eq(xte_quantize(&g.x, &g.out, &c, NULL), XTE_SUCCESS, "%s", xte_last_error());
  cr_expect(memcmp(f.q, g.q, sizeof f.q) == 0 && memcmp(f.s, g.s, sizeof f.s) == 0);
  for (i = 0; i < NBAD; i++) {
    qfix_init(&f);
    c.struct_size = bad_size(i, first, lib);
    expect_refused(xte_quantize(&f.x, &f.out, &c, NULL), c.struct_size, "xte_quantize");
    cr_expect(all_canary(f.q, sizeof f.q) && all_canary(f.s, sizeof f.s),
              "xte_quantize wrote on error");
  }
}

Test(config_api, swiglu_quantize) {
  static float in[4 * 512];
  static qfix f;
  const size_t lib = sizeof(xte_quant_config);
  xte_quant_config c = xte_quant_config_default();
  xte_tensor x = xte_tensor_2d(in, XTE_DTYPE_FP32, 4, 512);
  int i;
  for (i = 0; i < 4 * 512; i++) in[i] = (float)(i % 13) - 6.0f;
  for (i = 0; i < NBAD; i++) {
    qfix_init(&f);
    c.struct_size = bad_size(i, XTE_CONFIG_END(xte_quant_config, saturate), lib);
    expect_refused(xte_swiglu_quantize(&x, XTE_DTYPE_FP32, &f.out, &c, NULL), c.struct_size,
                   "xte_swiglu_quantize");
    cr_expect(all_canary(f.q, sizeof f.q) && all_canary(f.s, sizeof f.s));
  }
  qfix_init(&f);
  c.struct_size = lib;
  cr_expect_eq(xte_swiglu_quantize(&x, XTE_DTYPE_FP32, &f.out, &c, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
}

Test(config_api, gemm) {
  static qfix a, b;
  static float d[4 * 4];
  const size_t first = XTE_CONFIG_END(xte_gemm_config, mode), lib = sizeof(xte_gemm_config);
  xte_gemm_config c = xte_gemm_config_default();
  xte_tensor D = xte_tensor_2d(d, XTE_DTYPE_FP32, 4, 4);
  float ref[16];
  int i;
  cr_expect_eq(c.struct_size, lib);
  qfix_init(&a);
  qfix_init(&b);
  cr_assert_eq(xte_quantize(&a.x, &a.out, NULL, NULL), XTE_SUCCESS);
  cr_assert_eq(xte_quantize(&b.x, &b.out, NULL, NULL), XTE_SUCCESS);
  cr_assert_eq(xte_gemm(&a.out, &b.out, NULL, &D, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
  memcpy(ref, d, sizeof ref);
  memset(d, CANARY, sizeof d);
  c.struct_size = first;
  cr_assert_eq(xte_gemm(&a.out, &b.out, NULL, &D, &c, NULL), XTE_SUCCESS, "%s", xte_last_error());
  cr_expect(memcmp(ref, d, sizeof ref) == 0);
  for (i = 0; i < NBAD; i++) {
    memset(d, CANARY, sizeof d);
    c.struct_size = bad_size(i, first, lib);
    expect_refused(xte_gemm(&a.out, &b.out, NULL, &D, &c, NULL), c.struct_size, "xte_gemm");
    cr_expect(all_canary(d, sizeof d), "xte_gemm wrote on error");
  }
}

Test(config_api, router) {
  static float logits[8 * 16], probs[8 * 16];
  const size_t first = XTE_CONFIG_END(xte_router_config, scaling_factor),
               lib = sizeof(xte_router_config);
  xte_router_config c = xte_router_config_default();
  xte_tensor L = xte_tensor_2d(logits, XTE_DTYPE_FP32, 8, 16);
  xte_router_outputs o;
  int i;
  cr_expect_eq(c.struct_size, lib);
  for (i = 0; i < 8 * 16; i++) logits[i] = (float)((i * 7) % 16) * 0.25f;
  memset(&o, 0, sizeof o);
  o.probs = xte_tensor_2d(probs, XTE_DTYPE_FP32, 8, 16);
  c.topk = 2;
  c.struct_size = first;
  cr_expect_eq(xte_router_forward(&L, NULL, &c, &o, NULL), XTE_SUCCESS, "%s", xte_last_error());
  for (i = 0; i < NBAD; i++) {
    memset(probs, CANARY, sizeof probs);
    c.struct_size = bad_size(i, first, lib);
    expect_refused(xte_router_forward(&L, NULL, &c, &o, NULL), c.struct_size, "xte_router_forward");
    cr_expect(all_canary(probs, sizeof probs), "xte_router_forward wrote on error");
  }
}

Test(config_api, permute) {
  static int64_t idx[8 * 2];
  const size_t first = XTE_CONFIG_END(xte_permute_config, align), lib = sizeof(xte_permute_config);
  xte_permute_config c = xte_permute_config_default();
  xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, 8, 2);
  xte_moe_routing r;
  int64_t rows, rows_null;
  int i;
  cr_expect_eq(c.struct_size, lib);
  cr_expect(c.num_out_tokens == -1 && c.align == 1);
  for (i = 0; i < 16; i++) idx[i] = (i * 3 + i / 2) % 4;
  memset(&r, 0, sizeof r);
  r.topk_idx = &it;
  r.num_experts = 4;
  cr_assert_eq(xte_moe_permute_rows(&r, NULL, &rows_null, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  c.struct_size = first;
  cr_assert_eq(xte_moe_permute_rows(&r, &c, &rows, NULL), XTE_SUCCESS, "%s", xte_last_error());
  cr_expect_eq(rows, rows_null);
  for (i = 0; i < NBAD; i++) {
    memset(&rows, CANARY, sizeof rows);
    c.struct_size = bad_size(i, first, lib);
    expect_refused(xte_moe_permute_rows(&r, &c, &rows, NULL), c.struct_size,
                   "xte_moe_permute_rows");
    cr_expect(all_canary(&rows, sizeof rows), "xte_moe_permute_rows wrote on error");
  }
}

Test(config_api, attention) {
  /* BSHD [1, 4, 1, 8] */
  static float q[32], k[32], v[32], o[32], lse[4];
  const size_t first = XTE_CONFIG_END(xte_attention_config, descale_v),
               lib = sizeof(xte_attention_config);
  xte_attention_config c = xte_attention_config_default();
  int64_t sh[4] = {1, 4, 1, 8}, sl[3] = {1, 1, 4};
  xte_tensor Q, K, V, O, LSE;
  int i;
  cr_expect_eq(c.struct_size, lib);
  for (i = 0; i < 32; i++) q[i] = k[i] = v[i] = (float)(i % 5) * 0.5f;
  memset(&Q, 0, sizeof Q);
  Q.dtype = XTE_DTYPE_FP32;
  Q.rank = 4;
  memcpy(Q.shape, sh, sizeof sh);
  K = V = O = Q;
  Q.data = q;
  K.data = k;
  V.data = v;
  O.data = o;
  memset(&LSE, 0, sizeof LSE);
  LSE.data = lse;
  LSE.dtype = XTE_DTYPE_FP32;
  LSE.rank = 3;
  memcpy(LSE.shape, sl, sizeof sl);
  c.struct_size = first;
  cr_expect_eq(xte_attention_fwd(&Q, &K, &V, &O, &LSE, &c, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  for (i = 0; i < NBAD; i++) {
    memset(o, CANARY, sizeof o);
    memset(lse, CANARY, sizeof lse);
    c.struct_size = bad_size(i, first, lib);
    expect_refused(xte_attention_fwd(&Q, &K, &V, &O, &LSE, &c, NULL), c.struct_size,
                   "xte_attention_fwd");
    cr_expect(all_canary(o, sizeof o) && all_canary(lse, sizeof lse),
              "xte_attention_fwd wrote on error");
  }
}

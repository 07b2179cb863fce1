/* xte_isa_digest (digest.h): quantize, dequantize, cast; the dense and grouped exact GEMM. */
#define _POSIX_C_SOURCE 200809L
#include "digest.h"

/* ================================================================== quantize, dequantize, cast */

const char *mode_name(xte_scaling_mode m) {
  static const char *n[] = {"pt", "1x128", "128x128", "mx32"};
  return (unsigned)m < 4 ? n[m] : "?";
}
const char *recipe_name(xte_recipe r) {
  static const char *n[] = {"te_cur",   "te_del", "te_blk", "dg",
                            "dg_ue8m0", "mtfp8",  "mx_te",  "mx_ocp"};
  return (unsigned)r < 8 ? n[r] : "?";
}
const char *layout_name(xte_scale_layout l) {
  static const char *n[] = {"compact", "te_gemm", "deepgemm", "mx_swz"};
  return (unsigned)l < 4 ? n[l] : "?";
}
static int is_mx(xte_recipe r) {
  return r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP;
}
static int col_transposed(xte_recipe r) {
  return !(is_mx(r) || r == XTE_RECIPE_MTFP8);
}

const char *copies_name(int c) {
  return c == C_ROW ? "row" : c == C_COL ? "col" : "both";
}

/* Buffers of a qtensor for an [M, K] input with the given copies (scale dtype sdt: XTE_DTYPE_COUNT
 * for the recipe's own). as_out: registered as the case's outputs. Returns the status of
 * xte_quantize_scale_shape. */
xte_status make_q(xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode, xte_recipe rec,
                  xte_scale_layout lay, xte_dtype qdt, int copies, xte_dtype sdt, int as_out) {
  int k;
  int tr = col_transposed(rec);
  if (sdt == XTE_DTYPE_COUNT) sdt = is_mx(rec) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
  memset(q, 0, sizeof *q);
  q->scaling_mode = mode;
  q->recipe = rec;
  for (k = 0; k < 2; k++) {
    int64_t sr = 0, sc = 0;
    size_t es = xte_dtype_size(sdt), db = (size_t)(M * K), sb;
    xte_scale_tensor *s = k ? &q->columnwise_scale_inv : &q->rowwise_scale_inv;
    void *d, *sd;
    xte_status st;
    if (!(copies & (k ? C_COL : C_ROW))) continue;
    st = xte_quantize_scale_shape(M, K, mode, rec, lay, k, &sr, &sc);
    if (st != XTE_SUCCESS) return st;
    sb = (size_t)(sr * sc) * es;
    d = xalloc(db);
    sd = xalloc(sb);
    if (k)
      q->columnwise = tr ? t2(d, qdt, K, M) : t2(d, qdt, M, K);
    else
      q->rowwise = t2(d, qdt, M, K);
    s->data = sd;
    s->dtype = sdt;
    s->rows = sr;
    s->cols = sc;
    s->layout = lay;
    if (as_out) {
      out_buf(k ? "col" : "row", d, db, qdt, 1);
      out_buf(k ? "col_scale_inv" : "row_scale_inv", sd, sb, sdt, 1);
    }
  }
  return XTE_SUCCESS;
}

typedef struct qopts {
  int force_pow_2; /* -1 default */
  int saturate;
  float eps;
  int amax;     /* amax output */
  int ld_pad;   /* input rows ld = K + ld_pad */
  float dscale; /* TE_DELAYED scale */
  const char *tag;
} qopts;

static qopts qopts_default(void) {
  qopts o;
  o.force_pow_2 = -1;
  o.saturate = 1;
  o.eps = 0.0f;
  o.amax = 1;
  o.ld_pad = 0;
  o.dscale = 0.375f;
  o.tag = "";
  return o;
}

/* One quantize case; with dq, the dequantize cases of each copy into fp32 / bf16 / fp16 follow. */
static void quant_case(int64_t M, int64_t K, xte_dtype in_dt, xte_scaling_mode mode, xte_recipe rec,
                       xte_scale_layout lay, xte_dtype qdt, int copies, const qopts *o, int prof,
                       int dq) {
  int mark = mem_mark();
  xte_qtensor q;
  xte_tensor in;
  xte_quant_config cfg = xte_quant_config_default();
  xte_status st;
  int64_t ld = K + o->ld_pad;
  void *x;
  char base[160];
  snprintf(base, sizeof base, "%s.%s.%s.%s.%s.%s.%lldx%lld%s", mode_name(mode), recipe_name(rec),
           layout_name(lay), dtn(in_dt), dtn(qdt), copies_name(copies), (long long)M, (long long)K,
           o->tag);
  case_begin("quantize.%s", base);
  x = (void *)shared_input(in_dt, M > 0 ? (M - 1) * ld + K : 0, prof, 3.0f);
  in = t2(x, in_dt, M, K);
  if (o->ld_pad) in.ld = ld;
  st = make_q(&q, M, K, mode, rec, lay, qdt, copies, XTE_DTYPE_COUNT, 1);
  if (st != XTE_SUCCESS) {
    case_end(st, 1);
    mem_release(mark);
    return;
  }
  cfg.force_pow_2 = o->force_pow_2;
  cfg.saturate = o->saturate;
  cfg.amax_epsilon = o->eps;
  if (o->amax) {
    q.amax = (float *)xalloc(4);
    out_buf("amax", q.amax, 4, XTE_DTYPE_FP32, 1);
  }
  if (rec == XTE_RECIPE_TE_DELAYED) {
    q.scale = (float *)xalloc(4);
    *q.scale = o->dscale;
  } else if (rec == XTE_RECIPE_TE_CURRENT) {
    q.scale = (float *)xalloc(4);
    out_buf("scale", q.scale, 4, XTE_DTYPE_FP32, 1);
  }
  st = xte_quantize(&in, &q, &cfg, NULL);
  case_end(st, 1);
  if (st == XTE_SUCCESS && dq) {
    static const xte_dtype odt[3] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
    int k, j;
    for (k = 0; k < 2; k++) {
      int tr = k && col_transposed(rec);
      if (!(copies & (k ? C_COL : C_ROW))) continue;
      for (j = 0; j < 3; j++) {
        xte_tensor out;
        int m2 = mem_mark();
        case_begin("dequantize.%s.%s.%s", base, k ? "col" : "row", dtn(odt[j]));
        out = out2("out", odt[j], tr ? K : M, tr ? M : K);
        case_end(xte_dequantize(&q, k, &out, NULL), 0);
        mem_release(m2);
      }
    }
  }
  mem_release(mark);
}

void quantize_cases(void) {
  static const xte_dtype in_dts[3] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  static const xte_dtype q_dts[2] = {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2};
  const int64_t M = g_small ? 130 : 260, K = g_small ? 160 : 300;
  int mode, rec, lay, i, j, c;
  qopts o = qopts_default();
  for (mode = 0; mode < XTE_SCALING_COUNT; mode++)
    for (rec = 0; rec < XTE_RECIPE_COUNT; rec++)
      for (lay = 0; lay < XTE_SCALE_LAYOUT_COUNT; lay++) {
        int64_t r, cc;
        xte_scaling_mode m = (xte_scaling_mode)mode;
        xte_recipe re = (xte_recipe)rec;
        xte_scale_layout l = (xte_scale_layout)lay;
        xte_status st = xte_quantize_scale_shape(M, K, m, re, l, 0, &r, &cc);
        if (st != XTE_SUCCESS) { /* a combination the API does not define: listed once */
          case_begin("quantize.%s.%s.%s", mode_name(m), recipe_name(re), layout_name(l));
          case_end(st, 1);
          continue;
        }
        /* the other scale dtype: refused */
        {
          int mark = mem_mark();
          xte_qtensor q;
          xte_tensor in;
          xte_dtype other = is_mx(re) ? XTE_DTYPE_FP32 : XTE_DTYPE_E8M0;
          case_begin("quantize.%s.%s.%s.scale_%s", mode_name(m), recipe_name(re), layout_name(l),
                     dtn(other));
          in = t2(gen_new(XTE_DTYPE_FP32, 64 * 64, P_UNIT, 1.0f), XTE_DTYPE_FP32, 64, 64);
          st = make_q(&q, 64, 64, m, re, l, XTE_DTYPE_E4M3, C_BOTH, other, 1);
          if (st == XTE_SUCCESS) {
            if (re == XTE_RECIPE_TE_DELAYED) {
              q.scale = (float *)xalloc(4);
              *q.scale = 1.0f;
            }
            st = xte_quantize(&in, &q, NULL, NULL);
          }
          case_end(st, 1);
          mem_release(mark);
        }
        /* the main shape: every input dtype, fp8 dtype and set of copies */
        for (i = 0; i < 3; i++)
          for (j = 0; j < 2; j++)
            for (c = C_ROW; c <= C_BOTH; c++) {
              if (g_small && c != C_BOTH && !(i == 1 && j == 0)) continue;
              /* NaN / inf in a group of blocks send the SIMD kernels down their general path:
               * bf16 and one-copy fp16 inputs have none */
              quant_case(M, K, in_dts[i], m, re, l, q_dts[j], c, &o,
                         i == 1 || (i == 2 && c != C_BOTH) ? P_CLEAN : P_WILD,
                         c == C_BOTH && i == 0 && (j == 0 || !g_small));
            }
        /* odd small shapes, one row, empty; whole 128-blocks (the SIMD kernels' fast paths);
         * rows longer than one pass of the row kernel (256 blocks) */
        quant_case(1, 33, XTE_DTYPE_BF16, m, re, l, XTE_DTYPE_E4M3, C_BOTH, &o, P_WILD, 0);
        quant_case(0, 64, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E4M3, C_BOTH, &o, P_WILD, 0);
        quant_case(64, 0, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E4M3, C_BOTH, &o, P_WILD, 0);
        quant_case(40, 256, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E4M3, C_ROW, &o, P_CLEAN, 0);
        quant_case(41, 256, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E4M3, C_ROW, &o, P_WILD, 0);
        if (m == XTE_SCALING_BLOCK_1x128 || m == XTE_SCALING_MXFP8_1x32)
          quant_case(g_small ? 1 : 3, m == XTE_SCALING_MXFP8_1x32 ? 8300 : 33000, XTE_DTYPE_BF16, m,
                     re, l, XTE_DTYPE_E5M2, C_ROW, &o, P_WILD, 0);
        if (!g_small) {
          quant_case(7, 161, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E5M2, C_BOTH, &o, P_WILD, 1);
          quant_case(129, 1, XTE_DTYPE_FP16, m, re, l, XTE_DTYPE_E4M3, C_BOTH, &o, P_WILD, 0);
          quant_case(256, 384, XTE_DTYPE_BF16, m, re, l, XTE_DTYPE_E4M3, C_BOTH, &o, P_CLEAN, 0);
          quant_case(256, 384, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E5M2, C_BOTH, &o, P_CLEAN, 0);
          quant_case(130, 512, XTE_DTYPE_FP16, m, re, l, XTE_DTYPE_E4M3, C_ROW, &o, P_CLEAN, 0);
        }
      }
  /* configuration variants on a few recipes */
  {
    static const struct {
      xte_scaling_mode m;
      xte_recipe r;
      xte_scale_layout l;
    } v[] = {
        {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT},
        {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_TE_GEMM},
        {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_MTFP8, XTE_SCALE_LAYOUT_COMPACT},
        {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALE_LAYOUT_DEEPGEMM},
        {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_OCP, XTE_SCALE_LAYOUT_COMPACT},
        {XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT, XTE_SCALE_LAYOUT_COMPACT},
        {XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_DELAYED, XTE_SCALE_LAYOUT_COMPACT},
    };
    int n = (int)(sizeof v / sizeof v[0]), k;
    for (k = 0; k < n; k++)
      for (j = 0; j < 2; j++) {
        qopts a = qopts_default();
        a.force_pow_2 = 0;
        a.tag = ".pow2_0";
        quant_case(M, K, XTE_DTYPE_FP32, v[k].m, v[k].r, v[k].l, q_dts[j], C_BOTH, &a, P_WILD, 0);
        a.force_pow_2 = 1;
        a.tag = ".pow2_1";
        quant_case(M, K, XTE_DTYPE_BF16, v[k].m, v[k].r, v[k].l, q_dts[j], C_BOTH, &a, P_WILD, 0);
        a = qopts_default();
        a.saturate = 0;
        a.dscale = 3000.0f; /* delayed: values overflow */
        a.tag = ".nosat";
        quant_case(M, K, XTE_DTYPE_FP32, v[k].m, v[k].r, v[k].l, q_dts[j], C_BOTH, &a, P_WILD, 0);
        a.saturate = 1;
        a.tag = ".sat_big";
        quant_case(M, K, XTE_DTYPE_FP16, v[k].m, v[k].r, v[k].l, q_dts[j], C_BOTH, &a, P_WILD, 0);
        a = qopts_default();
        a.eps = 1e-3f;
        a.tag = ".eps";
        quant_case(M, K, XTE_DTYPE_FP32, v[k].m, v[k].r, v[k].l, q_dts[j], C_ROW, &a, P_WILD, 0);
        a = qopts_default();
        a.ld_pad = 40;
        a.amax = 0;
        a.tag = ".ld";
        quant_case(M, K, XTE_DTYPE_BF16, v[k].m, v[k].r, v[k].l, q_dts[j], C_BOTH, &a, P_WILD,
                   !g_small);
      }
  }
}

void cast_cases(void) {
  static const xte_dtype dts[6] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16,
                                   XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, XTE_DTYPE_E8M0};
  int i, j, sat;
  for (i = 0; i < 6; i++)
    for (j = 0; j < 6; j++)
      for (sat = 0; sat < 2; sat++) {
        int mark = mem_mark();
        xte_dtype a = dts[i], b = dts[j];
        size_t es = xte_dtype_size(a);
        /* 16-bit and 8-bit inputs: every code, then random ones; fp32: the wild profile */
        int64_t n = es == 4 ? (g_small ? 3001 : 20011) : es == 2 ? 65536 + 77 : 256 + 1013, k;
        void *x = xalloc(es * (size_t)n);
        xte_tensor in, out;
        case_begin("cast.%s.%s.sat%d", dtn(a), dtn(b), sat);
        if (es == 4) {
          gen(x, a, n, P_WILD, 1.0f);
        } else {
          for (k = 0; k < n; k++) {
            uint32_t code = k < (es == 2 ? 65536 : 256) ? (uint32_t)k : rnd();
            if (es == 2)
              ((uint16_t *)x)[k] = (uint16_t)code;
            else
              ((uint8_t *)x)[k] = (uint8_t)code;
          }
        }
        in = t2(x, a, 1, n);
        out = out2("out", b, 1, n);
        case_end(xte_cast(&in, &out, sat, NULL), 1);
        mem_release(mark);
      }
  /* a 2-D cast with odd rows */
  {
    int mark = mem_mark();
    xte_tensor in, out;
    case_begin("cast.fp32.e4m3.sat1.37x113");
    in = t2(gen_new(XTE_DTYPE_FP32, 37 * 113, P_WILD, 300.0f), XTE_DTYPE_FP32, 37, 113);
    out = out2("out", XTE_DTYPE_E4M3, 37, 113);
    case_end(xte_cast(&in, &out, 1, NULL), 0);
    mem_release(mark);
  }
}

/* ================================================================== GEMM */

typedef struct opspec {
  xte_scaling_mode mode;
  xte_recipe rec;
  xte_scale_layout lay;
  xte_dtype dt;
  int copies;
} opspec;

/* A quantized operand from an fp32 [R, C] tensor (profile P_GEMM), with a few special codes
 * poked into each copy: NaN, zero, subnormals, e5m2 infinities. */
static int make_operand(xte_qtensor *q, int64_t R, int64_t C, const opspec *s, float scale,
                        int specials) {
  xte_tensor in = t2(gen_new(XTE_DTYPE_FP32, R * C, P_GEMM, scale), XTE_DTYPE_FP32, R, C);
  int k, n;
  if (!setup_ok(make_q(q, R, C, s->mode, s->rec, s->lay, s->dt, s->copies, XTE_DTYPE_COUNT, 0),
                "scale shape"))
    return 0;
  if (s->rec == XTE_RECIPE_TE_DELAYED) {
    q->scale = (float *)xalloc(4);
    *q->scale = 4.0f;
  }
  if (!setup_ok(xte_quantize(&in, q, NULL, NULL), "quantize")) return 0;
  q->scale = NULL;
  if (!specials || R * C == 0) return 1;
  for (k = 0; k < 2; k++) {
    uint8_t *d = (uint8_t *)(k ? q->columnwise.data : q->rowwise.data);
    static const uint8_t e4[] = {0x7F, 0xFF, 0x00, 0x80, 0x01, 0x86};
    static const uint8_t e5[] = {0x7C, 0xFC, 0x7E, 0x00, 0x01, 0x83};
    if (!d) continue;
    for (n = 0; n < specials; n++) {
      int64_t pos = (int64_t)(((uint64_t)rnd() << 16 ^ rnd()) % (uint64_t)(R * C));
      d[pos] = s->dt == XTE_DTYPE_E4M3 ? e4[rndn(6)] : e5[rndn(6)];
    }
  }
  return 1;
}

typedef struct gspec {
  opspec a, b;
  int64_t M, N, K;
  int ta, tb;
  xte_dtype d_dt;
  int acc; /* 0 none, 1 C fp32, 2 C bf16, 3 C = D (in place, D's dtype) */
  int bias;
  int specials; /* special codes per operand copy */
  int ld_d;     /* extra columns of D's rows (ld) */
} gspec;

static const char *pair_name(const gspec *g, char *buf, size_t n) {
  snprintf(buf, n, "%s_%s", mode_name(g->a.mode), mode_name(g->b.mode));
  return buf;
}

static gspec gspec_make(xte_scaling_mode ma, xte_scaling_mode mb, xte_dtype da, xte_dtype db,
                        int64_t M, int64_t N, int64_t K) {
  gspec g;
  memset(&g, 0, sizeof g);
  g.a.mode = ma;
  g.b.mode = mb;
  g.a.rec = g.b.rec = ma == XTE_SCALING_MXFP8_1x32   ? XTE_RECIPE_MX_TE
                      : ma == XTE_SCALING_PER_TENSOR ? XTE_RECIPE_TE_CURRENT
                                                     : XTE_RECIPE_TE_BLOCK;
  if (mb == XTE_SCALING_MXFP8_1x32) g.b.rec = XTE_RECIPE_MX_TE;
  if (mb == XTE_SCALING_PER_TENSOR) g.b.rec = XTE_RECIPE_TE_CURRENT;
  if (mb == XTE_SCALING_BLOCK_1x128 || mb == XTE_SCALING_BLOCK_128x128) {
    if (ma == XTE_SCALING_MXFP8_1x32 || ma == XTE_SCALING_PER_TENSOR) g.b.rec = XTE_RECIPE_TE_BLOCK;
  }
  g.a.lay = g.b.lay = XTE_SCALE_LAYOUT_COMPACT;
  g.a.dt = da;
  g.b.dt = db;
  g.a.copies = g.b.copies = C_BOTH;
  g.M = M;
  g.N = N;
  g.K = K;
  g.d_dt = XTE_DTYPE_BF16;
  g.specials = 3;
  return g;
}

static void gemm_case(const gspec *g, const char *tag) {
  int mark = mem_mark();
  xte_qtensor A, B;
  xte_tensor C, D, bias;
  xte_gemm_config cfg = xte_gemm_config_default();
  char pn[40];
  static const char *acc_n[] = {"", ".acc_fp32", ".acc_bf16", ".inplace"};
  int64_t ldd = g->N + g->ld_d;
  size_t ds = xte_dtype_size(g->d_dt);
  void *dp;
  case_begin("gemm.%s.%s%s.ta%dtb%d.%lldx%lldx%lld.%s%s%s%s%s", pair_name(g, pn, sizeof pn),
             g->a.dt == XTE_DTYPE_E4M3 ? "e4" : "e5", g->b.dt == XTE_DTYPE_E4M3 ? "e4" : "e5",
             g->ta, g->tb, (long long)g->M, (long long)g->N, (long long)g->K, dtn(g->d_dt),
             acc_n[g->acc], g->bias ? ".bias" : "", g->ld_d ? ".ld" : "", tag);
  if (!make_operand(&A, g->ta ? g->K : g->M, g->ta ? g->M : g->K, &g->a, 1.0f, g->specials) ||
      !make_operand(&B, g->tb ? g->K : g->N, g->tb ? g->N : g->K, &g->b, 1.0f, g->specials)) {
    mem_release(mark);
    return;
  }
  cfg.trans_a = g->ta;
  cfg.trans_b = g->tb;
  dp = xalloc(ds * (size_t)(g->M > 0 ? (g->M - 1) * ldd + g->N : 1));
  D = t2(dp, g->d_dt, g->M, g->N);
  if (g->ld_d) D.ld = ldd;
  memset(&C, 0, sizeof C);
  if (g->acc == 3) {
    gen(dp, g->d_dt, g->M > 0 ? (g->M - 1) * ldd + g->N : 0, P_UNIT, 50.0f);
    C = D;
    cfg.accumulate = 1;
  } else if (g->acc) {
    xte_dtype cdt = g->acc == 1 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
    C = t2(gen_new(cdt, g->M * g->N, P_UNIT, 50.0f), cdt, g->M, g->N);
    cfg.accumulate = 1;
  }
  out_buf("D", dp, ds * (size_t)(g->M > 0 ? (g->M - 1) * ldd + g->N : 0), g->d_dt, g->acc != 3);
  if (g->bias) {
    bias = t1(gen_new(XTE_DTYPE_FP32, g->N, P_UNIT, 10.0f), XTE_DTYPE_FP32, g->N);
    cfg.bias = &bias;
  }
  case_end(xte_gemm(&A, &B, cfg.accumulate ? &C : NULL, &D, &cfg, NULL), 1);
  mem_release(mark);
}

void gemm_cases(void) {
  static const xte_scaling_mode pairs[][2] = {
      {XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_128x128},
      {XTE_SCALING_BLOCK_128x128, XTE_SCALING_BLOCK_1x128},
      {XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_1x128},
      {XTE_SCALING_PER_TENSOR, XTE_SCALING_PER_TENSOR},
      {XTE_SCALING_MXFP8_1x32, XTE_SCALING_MXFP8_1x32},
      {XTE_SCALING_BLOCK_128x128, XTE_SCALING_BLOCK_128x128}, /* refused */
      {XTE_SCALING_PER_TENSOR, XTE_SCALING_BLOCK_1x128},      /* refused */
  };
  static const xte_dtype dpairs[4][2] = {{XTE_DTYPE_E4M3, XTE_DTYPE_E4M3},
                                         {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2},
                                         {XTE_DTYPE_E5M2, XTE_DTYPE_E4M3},
                                         {XTE_DTYPE_E5M2, XTE_DTYPE_E5M2}};
  static const int64_t ms_full[] = {1, 2, 4, 5, 8, 9, 16, 32, 33, 130, 257};
  static const int64_t ms_small[] = {1, 5, 8, 33, 70};
  const int64_t *ms = g_small ? ms_small : ms_full;
  int nm = g_small ? 5 : 11;
  const int64_t n1 = g_small ? 40 : 72, k1 = g_small ? 260 : 300;
  int p, d, i, t, k;
  gspec g;
  /* 1. every pair x dtype pair x rows, TN, bf16 out */
  for (p = 0; p < 7; p++)
    for (d = 0; d < 4; d++)
      for (i = 0; i < nm; i++) {
        if ((p >= 5 || d == 3) && i > 0) continue; /* refused: listed once */
        g = gspec_make(pairs[p][0], pairs[p][1], dpairs[d][0], dpairs[d][1], ms[i], n1, k1);
        gemm_case(&g, "");
      }
  /* 2. transposes (each pair, e4 x e4 and e5 x e4) */
  for (p = 0; p < 5; p++)
    for (t = 1; t < 4; t++)
      for (i = 0; i < 2; i++) {
        g = gspec_make(pairs[p][0], pairs[p][1], i ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3,
                       XTE_DTYPE_E4M3, i ? 130 : 6, 40, 260);
        g.ta = t & 1;
        g.tb = t >> 1;
        if (g_small && i) g.M = 40;
        gemm_case(&g, "");
      }
  /* 3. epilogues: C fp32 / bf16 / in place, bias, D fp32 / bf16, ld */
  for (p = 0; p < 5; p += g_small ? 4 : 1)
    for (k = 0; k < 2; k++)
      for (i = 0; i < 7; i++) {
        g = gspec_make(pairs[p][0], pairs[p][1], XTE_DTYPE_E4M3, XTE_DTYPE_E4M3,
                       k ? (g_small ? 40 : 140) : 3, g_small ? 40 : 56, 200);
        g.d_dt = (i & 1) ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
        g.acc = i < 2 ? 1 + i : i < 4 ? 3 : i == 4 ? 0 : i == 5 ? 2 : 1;
        g.bias = i >= 4;
        g.ld_d = i == 6 ? 9 : 0;
        if (g.ld_d) g.acc = 0;
        gemm_case(&g, "");
      }
  /* 4. scale layouts of both operands */
  {
    static const xte_scale_layout lays[3] = {XTE_SCALE_LAYOUT_COMPACT, XTE_SCALE_LAYOUT_TE_GEMM,
                                             XTE_SCALE_LAYOUT_DEEPGEMM};
    int la, lb;
    for (p = 0; p < 3; p++)
      for (la = 0; la < 3; la++)
        for (lb = 0; lb < 3; lb++)
          for (i = 0; i < 2; i++) {
            char tag[64];
            if (g_small && i) continue;
            g = gspec_make(pairs[p][0], pairs[p][1], XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, i ? 130 : 20,
                           48, g_small ? 260 : 300);
            g.a.lay = lays[la];
            g.b.lay = lays[lb];
            g.tb = i; /* a transposed B reads the other copy's layout */
            snprintf(tag, sizeof tag, ".%s_%s", layout_name(lays[la]), layout_name(lays[lb]));
            gemm_case(&g, tag);
          }
    for (la = 0; la < 2; la++)
      for (lb = 0; lb < 2; lb++)
        for (t = 0; t < 2; t++) {
          char tag[64];
          g = gspec_make(XTE_SCALING_MXFP8_1x32, XTE_SCALING_MXFP8_1x32, XTE_DTYPE_E4M3,
                         XTE_DTYPE_E5M2, t ? 131 : 7, 40, 200);
          g.a.lay = la ? XTE_SCALE_LAYOUT_MX_SWIZZLED : XTE_SCALE_LAYOUT_COMPACT;
          g.b.lay = lb ? XTE_SCALE_LAYOUT_MX_SWIZZLED : XTE_SCALE_LAYOUT_COMPACT;
          g.ta = t;
          snprintf(tag, sizeof tag, ".%s_%s", layout_name(g.a.lay), layout_name(g.b.lay));
          gemm_case(&g, tag);
        }
  }
  /* 5. other recipes of the operands */
  {
    static const xte_recipe recs[4] = {XTE_RECIPE_DEEPGEMM, XTE_RECIPE_DEEPGEMM_UE8M0,
                                       XTE_RECIPE_MTFP8, XTE_RECIPE_MX_OCP};
    for (k = 0; k < 4; k++)
      for (p = 0; p < 3; p++)
        for (t = 0; t < 4; t++) {
          char tag[64];
          if (k == 3 && p > 0) continue;
          if (g_small && ((t != 0 && t != 3) || p == 1)) continue;
          g = k == 3 ? gspec_make(XTE_SCALING_MXFP8_1x32, XTE_SCALING_MXFP8_1x32, XTE_DTYPE_E4M3,
                                  XTE_DTYPE_E4M3, g_small ? 9 : 24, 40, 300)
                     : gspec_make(pairs[p][0], pairs[p][1], XTE_DTYPE_E4M3, XTE_DTYPE_E4M3,
                                  g_small ? 9 : 24, 40, 300);
          g.a.rec = g.b.rec = recs[k];
          g.ta = t & 1;
          g.tb = t >> 1;
          if (t == 3) g.M = g_small ? 40 : 140;
          snprintf(tag, sizeof tag, ".%s", recipe_name(recs[k]));
          gemm_case(&g, tag);
        }
    /* per-tensor delayed */
    g = gspec_make(XTE_SCALING_PER_TENSOR, XTE_SCALING_PER_TENSOR, XTE_DTYPE_E5M2, XTE_DTYPE_E4M3,
                   50, 40, 300);
    g.a.rec = g.b.rec = XTE_RECIPE_TE_DELAYED;
    gemm_case(&g, ".te_del");
  }
  /* 6. one copy only (the other absent): the operand read across its rows (strided) where the
   * blocks allow it (128x128, per-tensor), else refused */
  for (p = 0; p < 5; p++)
    for (k = 0; k < 4; k++)
      for (i = 0; i < 2; i++) {
        static const char *vn[4] = {".a_col_only", ".a_row_only", ".b_col_only", ".b_row_only"};
        if (g_small && i) continue;
        g = gspec_make(pairs[p][0], pairs[p][1], XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, i ? 70 : 6, 40,
                       260);
        if (k < 2) {
          g.a.copies = k ? C_ROW : C_COL;
          g.ta = k;
        } else {
          g.b.copies = k == 3 ? C_ROW : C_COL;
          g.tb = k == 3;
        }
        gemm_case(&g, vn[k]);
      }
  /* 7. shapes: empty, K = 1, one K block, 3 K panels, N past one N panel, M past one M chunk */
  {
    static const int64_t shp[][3] = {{0, 40, 128},    {16, 0, 128},   {16, 40, 0},  {5, 40, 0},
                                     {9, 17, 1},      {37, 33, 32},   {3, 24, 129}, {40, 24, 129},
                                     {20, 40, 600},   {200, 40, 600}, {1, 1, 1000}, {40, 1600, 128},
                                     {1100, 24, 130}, {6, 1600, 256}};
    int ns = g_small ? 9 : (int)(sizeof shp / sizeof shp[0]);
    for (k = 0; k < ns; k++)
      for (p = 0; p < 5; p++)
        for (d = 0; d < 2; d++) {
          if (k >= 11 && !(p == 0 || p == 4)) continue;
          if (k >= 11 && d) continue;
          g = gspec_make(pairs[p][0], pairs[p][1], d ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3,
                         XTE_DTYPE_E4M3, shp[k][0], shp[k][1], shp[k][2]);
          g.d_dt = d ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
          gemm_case(&g, "");
        }
  }
  /* 8. special values everywhere: many NaN / inf / zero codes */
  for (p = 0; p < 5; p++)
    for (d = 0; d < 3; d++) {
      g = gspec_make(pairs[p][0], pairs[p][1], dpairs[d][0], dpairs[d][1],
                     d == 2 ? (g_small ? 33 : 70) : 7, 40, 300);
      g.specials = 40;
      gemm_case(&g, ".specials");
    }
}

/* ------------------------------------------------------------------ grouped GEMMs */

typedef struct ggspec {
  xte_gemm_grouping kind;
  xte_scaling_mode ma, mb;
  xte_dtype da, db;
  int G;
  int64_t sizes[8]; /* rows (contiguous, masked valid rows) or K per group */
  int64_t align;    /* contiguous */
  int64_t mmax;     /* masked */
  int64_t M, N, K;  /* K-grouped: M, N; others: N, K */
  int tb, acc, bias;
  xte_dtype d_dt;
} ggspec;

static void grouped_case(const ggspec *s) {
  int mark = mem_mark();
  xte_qtensor A, B;
  xte_tensor C, D, bias, mm;
  xte_gemm_config cfg = xte_gemm_config_default();
  xte_gemm_groups gr;
  int64_t rows = 0, g, Ksum = 0, drows;
  int32_t *mmv;
  char sz[80] = "";
  opspec oa, ob;
  static const char *kinds[] = {"contig", "masked", "kgroup"};
  for (g = 0; g < s->G; g++) {
    size_t l = strlen(sz);
    snprintf(sz + l, sizeof sz - l, "%s%lld", g ? "_" : "", (long long)s->sizes[g]);
  }
  case_begin("gemm_grouped.%s.%s_%s.%s%s.g%s.a%lld.m%lld.%lldx%lldx%lld.%s%s%s%s", kinds[s->kind],
             mode_name(s->ma), mode_name(s->mb), s->da == XTE_DTYPE_E4M3 ? "e4" : "e5",
             s->db == XTE_DTYPE_E4M3 ? "e4" : "e5", sz, (long long)s->align, (long long)s->mmax,
             (long long)s->M, (long long)s->N, (long long)s->K, dtn(s->d_dt), s->tb ? ".tb" : "",
             s->acc ? ".acc" : "", s->bias ? ".bias" : "");
  memset(&oa, 0, sizeof oa);
  oa.mode = s->ma;
  oa.rec = s->ma == XTE_SCALING_MXFP8_1x32   ? XTE_RECIPE_MX_TE
           : s->ma == XTE_SCALING_PER_TENSOR ? XTE_RECIPE_TE_CURRENT
                                             : XTE_RECIPE_TE_BLOCK;
  oa.lay = XTE_SCALE_LAYOUT_COMPACT;
  oa.dt = s->da;
  oa.copies = C_BOTH;
  ob = oa;
  ob.mode = s->mb;
  ob.rec = s->mb == XTE_SCALING_MXFP8_1x32   ? XTE_RECIPE_MX_TE
           : s->mb == XTE_SCALING_PER_TENSOR ? XTE_RECIPE_TE_CURRENT
                                             : XTE_RECIPE_TE_BLOCK;
  ob.dt = s->db;
  memset(&gr, 0, sizeof gr);
  gr.kind = s->kind;
  gr.num_groups = s->G;
  gr.group_sizes = s->sizes;
  gr.alignment = s->align;
  mmv = (int32_t *)xalloc(4 * (size_t)s->G);
  for (g = 0; g < s->G; g++) mmv[g] = (int32_t)s->sizes[g];
  mm = t1(mmv, XTE_DTYPE_INT32, s->G);
  gr.masked_m = &mm;
  if (s->kind == XTE_GEMM_GROUPED_K) {
    for (g = 0; g < s->G; g++) Ksum += s->sizes[g];
    /* dY [Ksum, M], X [Ksum, N]: D[g] = dY_g^T X_g (trans_a = trans_b = 1) */
    if (!make_operand(&A, Ksum, s->M, &oa, 1.0f, 3) ||
        !make_operand(&B, Ksum, s->N, &ob, 1.0f, 3)) {
      mem_release(mark);
      return;
    }
    cfg.trans_a = cfg.trans_b = 1;
    drows = s->G * s->M;
  } else {
    for (g = 0; g < s->G; g++) {
      int64_t al = s->align > 1 ? s->align : 1;
      rows += s->kind == XTE_GEMM_GROUPED_MASKED ? s->mmax : (s->sizes[g] + al - 1) / al * al;
    }
    /* B [G, N, K] (trans_b = 0) or [G, K, N]: the quantized X is [G * N, K] or [G * K, N] */
    if (!make_operand(&A, rows, s->K, &oa, 1.0f, 3) ||
        !make_operand(&B, s->G * (s->tb ? s->K : s->N), s->tb ? s->N : s->K, &ob, 1.0f, 3)) {
      mem_release(mark);
      return;
    }
    cfg.trans_b = s->tb;
    drows = rows;
  }
  D = out2("D", s->d_dt, drows, s->N);
  memset(&C, 0, sizeof C);
  if (s->acc) {
    C = t2(gen_new(XTE_DTYPE_FP32, drows * s->N, P_UNIT, 20.0f), XTE_DTYPE_FP32, drows, s->N);
    cfg.accumulate = 1;
  }
  if (s->bias) {
    bias = t1(gen_new(XTE_DTYPE_FP32, s->N, P_UNIT, 5.0f), XTE_DTYPE_FP32, s->N);
    cfg.bias = &bias;
  }
  case_end(xte_gemm_grouped(&A, &B, s->acc ? &C : NULL, &D, &gr, &cfg, NULL), 1);
  mem_release(mark);
}

void grouped_cases(void) {
  static const xte_scaling_mode pairs[4][2] = {{XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_128x128},
                                               {XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_1x128},
                                               {XTE_SCALING_MXFP8_1x32, XTE_SCALING_MXFP8_1x32},
                                               {XTE_SCALING_PER_TENSOR, XTE_SCALING_PER_TENSOR}};
  ggspec s;
  int p, v;
  /* contiguous */
  for (p = 0; p < 4; p++)
    for (v = 0; v < 6; v++) {
      static const int64_t al[6] = {128, 0, 16, 1, 128, 32};
      if (g_small && v > 2) continue;
      memset(&s, 0, sizeof s);
      s.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
      s.ma = pairs[p][0];
      s.mb = pairs[p][1];
      s.da = v == 5 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
      s.db = XTE_DTYPE_E4M3;
      s.G = 5;
      s.sizes[0] = 0;
      s.sizes[1] = 1;
      s.sizes[2] = g_small ? 40 : 137;
      s.sizes[3] = 8;
      s.sizes[4] = 33;
      s.align = al[v];
      s.N = g_small ? 40 : 72;
      s.tb = v == 2 || v == 4;
      s.K = s.tb ? 256 : g_small ? 260 : 300; /* B [G, K, N]: K a multiple of the K block */
      s.acc = v == 3 || v == 4;
      s.bias = v >= 3;
      s.d_dt = (v & 1) ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
      grouped_case(&s);
    }
  /* masked */
  for (p = 0; p < 4; p++)
    for (v = 0; v < 3; v++) {
      if (g_small && v == 2) continue;
      memset(&s, 0, sizeof s);
      s.kind = XTE_GEMM_GROUPED_MASKED;
      s.ma = pairs[p][0];
      s.mb = pairs[p][1];
      s.da = XTE_DTYPE_E4M3;
      s.db = v == 1 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
      s.G = 4;
      s.mmax = v == 2 ? 130 : 40;
      s.sizes[0] = v == 2 ? 130 : 0;
      s.sizes[1] = v == 2 ? 1 : 40;
      s.sizes[2] = v == 2 ? 64 : 3;
      s.sizes[3] = v == 2 ? 0 : 17;
      s.N = 48;
      s.tb = v == 1;
      s.K = s.tb ? 384 : 260;
      s.acc = v == 1;
      s.bias = v == 2;
      s.d_dt = v == 1 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
      grouped_case(&s);
    }
  /* K-grouped */
  for (p = 0; p < 4; p++)
    for (v = 0; v < 3; v++) {
      static const int64_t ks[3][4] = {{128, 0, 200, 0}, {256, 44, 0, 0}, {128, 128, 128, 5}};
      static const int gs[3] = {3, 2, 4};
      int g;
      if (p == 0) continue; /* 128x128 A: not a weight gradient */
      if (g_small && v == 2) continue;
      memset(&s, 0, sizeof s);
      s.kind = XTE_GEMM_GROUPED_K;
      s.ma = pairs[p][0];
      s.mb = pairs[p][1];
      s.da = v == 1 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
      s.db = XTE_DTYPE_E4M3;
      s.G = gs[v];
      for (g = 0; g < s.G; g++) s.sizes[g] = p == 2 && ks[v][g] == 200 ? 192 : ks[v][g];
      s.M = v == 2 ? 9 : 40;
      s.N = 24 + 8 * v;
      s.acc = v != 1;
      s.bias = v == 2;
      s.d_dt = v == 1 ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
      grouped_case(&s);
    }
}

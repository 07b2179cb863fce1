/* xte_isa_digest (digest.h): the MoE router, aux loss, token movement, SwiGLU, one-rank EP; the
 * test hooks. */
#define _POSIX_C_SOURCE 200809L
#include "digest.h"

/* ================================================================== MoE */

static const char *score_name(xte_router_score s) {
  static const char *n[] = {"softmax", "sigmoid", "sqrtsoftplus"};
  return (unsigned)s < 3 ? n[s] : "?";
}

typedef struct rspec {
  int64_t T, E;
  int topk, pre, groups, gtopk, bias;
  xte_router_score score;
  float sf;
  xte_dtype ldt, idt, gdt;
  int prof;
} rspec;

static void router_fill_bias(float *b, int64_t E) {
  int64_t e;
  for (e = 0; e < E; e++) b[e] = (float)((int)rndn(16) - 4) * 0.0625f;
}

static void router_case(const rspec *r, int bwd) {
  int mark = mem_mark();
  xte_router_config cfg = xte_router_config_default();
  xte_tensor logits, bias;
  xte_router_outputs o;
  void *x;
  case_begin("router_%s.%s%s.T%lld.E%lld.k%d.g%d_%d%s.sf%g.%s.%s%s%s", bwd ? "bwd" : "fwd",
             score_name(r->score), r->pre ? "_pre" : "", (long long)r->T, (long long)r->E, r->topk,
             r->groups, r->gtopk, r->bias ? ".bias" : "", (double)r->sf, dtn(r->ldt),
             bwd ? dtn(r->gdt) : dtn(r->idt), r->prof == P_TIES ? ".ties" : "",
             r->prof == P_WILD ? ".specials" : "");
  x = gen_new(r->ldt, r->T * r->E, r->prof, 4.0f);
  logits = t2(x, r->ldt, r->T, r->E);
  cfg.topk = r->topk;
  cfg.score_function = r->score;
  cfg.use_pre_softmax = r->pre;
  cfg.num_groups = r->groups;
  cfg.group_topk = r->gtopk;
  cfg.scaling_factor = r->sf;
  if (r->bias) {
    float *b = (float *)xalloc(4 * (size_t)r->E);
    router_fill_bias(b, r->E);
    bias = t1(b, XTE_DTYPE_FP32, r->E);
  }
  memset(&o, 0, sizeof o);
  if (!bwd) {
    o.probs = out2("probs", XTE_DTYPE_FP32, r->T, r->E);
    o.routing_map = out2("routing_map", XTE_DTYPE_UINT8, r->T, r->E);
    o.routing_bits = out2("routing_bits", XTE_DTYPE_UINT8, r->T, (r->E + 7) / 8);
    o.topk_idx = out2("topk_idx", r->idt, r->T, r->topk);
    o.topk_weights = out2("topk_weights", XTE_DTYPE_FP32, r->T, r->topk);
    o.saved = out2("saved", XTE_DTYPE_FP32, r->T, r->E);
    case_end(xte_router_forward(&logits, r->bias ? &bias : NULL, &cfg, &o, NULL), 1);
  } else {
    xte_tensor gp, gl;
    o.routing_map = t2(xalloc((size_t)(r->T * r->E)), XTE_DTYPE_UINT8, r->T, r->E);
    o.saved = t2(xalloc(4 * (size_t)(r->T * r->E)), XTE_DTYPE_FP32, r->T, r->E);
    if (!setup_ok(xte_router_forward(&logits, r->bias ? &bias : NULL, &cfg, &o, NULL),
                  "router_forward")) {
      mem_release(mark);
      return;
    }
    gp = t2(gen_new(XTE_DTYPE_FP32, r->T * r->E, P_UNIT, 1.0f), XTE_DTYPE_FP32, r->T, r->E);
    gl = out2("grad_logits", r->gdt, r->T, r->E);
    case_end(xte_router_backward(&gp, &o.routing_map, &o.saved, &logits, &cfg, &gl, NULL), 1);
  }
  mem_release(mark);
}

static void aux_scores_case(int64_t T, int64_t E, int topk, xte_router_score sc, int bwd) {
  int mark = mem_mark();
  xte_tensor logits = t2(gen_new(XTE_DTYPE_FP32, T * E, P_UNIT, 6.0f), XTE_DTYPE_FP32, T, E);
  case_begin("aux_scores_%s.%s.T%lld.E%lld.k%d", bwd ? "bwd" : "fwd", score_name(sc), (long long)T,
             (long long)E, topk);
  if (!bwd) {
    xte_tensor s = out2("scores", XTE_DTYPE_FP32, T, E),
               m = out2("routing_map", XTE_DTYPE_UINT8, T, E),
               sv = out2("saved", XTE_DTYPE_FP32, T, E);
    case_end(xte_router_aux_scores(&logits, topk, sc, &s, &m, &sv, NULL), 1);
  } else {
    xte_tensor s = t2(xalloc(4 * (size_t)(T * E)), XTE_DTYPE_FP32, T, E);
    xte_tensor sv = t2(xalloc(4 * (size_t)(T * E)), XTE_DTYPE_FP32, T, E), g, gl;
    if (!setup_ok(xte_router_aux_scores(&logits, topk, sc, &s, NULL, &sv, NULL), "aux_scores")) {
      mem_release(mark);
      return;
    }
    g = t2(gen_new(XTE_DTYPE_FP32, T * E, P_UNIT, 1.0f), XTE_DTYPE_FP32, T, E);
    gl = out2("grad_logits", XTE_DTYPE_FP32, T, E);
    case_end(xte_router_aux_scores_backward(&g, &sv, &logits, topk, sc, &gl, NULL), 1);
  }
  mem_release(mark);
}

static void aux_loss_cases(void) {
  int i, bwd;
  for (i = 0; i < 2; i++)
    for (bwd = 0; bwd < 2; bwd++) {
      int mark = mem_mark();
      const int64_t T = g_small ? 1100 : 2100, E = i ? 7 : 32;
      xte_dtype tdt = i ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
      void *tpe = xalloc(8 * (size_t)E);
      xte_tensor probs, tp;
      int64_t e;
      case_begin("aux_loss_%s.T%lld.E%lld.%s%s", bwd ? "bwd" : "fwd", (long long)T, (long long)E,
                 dtn(tdt), i ? ".nan" : "");
      probs = t2(gen_new(XTE_DTYPE_FP32, T * E, P_UNIT, 1.0f), XTE_DTYPE_FP32, T, E);
      if (i) { /* a NaN and an inf: the fixed-order NaN rule */
        ((float *)probs.data)[rndn((uint32_t)(T * E))] = NAN;
        ((float *)probs.data)[rndn((uint32_t)(T * E))] = INFINITY;
      }
      for (e = 0; e < E; e++) {
        if (i)
          ((int32_t *)tpe)[e] = (int32_t)rndn(1000);
        else
          ((int64_t *)tpe)[e] = (int64_t)rndn(1000);
      }
      tp = t1(tpe, tdt, E);
      if (bwd) {
        xte_tensor gp = out2("grad_probs", XTE_DTYPE_FP32, T, E);
        case_end(xte_moe_aux_loss_backward(&tp, T * 2, 4, 1e-2f, 0.75f, &gp, NULL), 1);
      } else {
        float *loss = (float *)xalloc(4);
        out_buf("aux_loss", loss, 4, XTE_DTYPE_FP32, 1);
        case_end(xte_moe_aux_loss_forward(&probs, &tp, T, 4, 1e-2f, loss, NULL), 1);
      }
      mem_release(mark);
    }
}

void router_cases(void) {
  static const xte_router_score scs[3] = {XTE_ROUTER_SOFTMAX, XTE_ROUTER_SIGMOID,
                                          XTE_ROUTER_SQRTSOFTPLUS};
  int s, v, pre;
  for (s = 0; s < 3; s++)
    for (pre = 0; pre < (s == 0 ? 2 : 1); pre++)
      for (v = 0; v < 7; v++) {
        rspec r;
        if (g_small && v >= 4) continue;
        memset(&r, 0, sizeof r);
        r.score = scs[s];
        r.pre = pre;
        r.sf = 1.0f;
        r.ldt = XTE_DTYPE_FP32;
        r.idt = XTE_DTYPE_INT64;
        r.gdt = XTE_DTYPE_FP32;
        r.prof = P_UNIT;
        switch (v) {
          case 0:
            r.T = 53, r.E = 64, r.topk = 4;
            break;
          case 1:
            r.T = 53, r.E = 64, r.topk = 8, r.groups = 8, r.gtopk = 4, r.bias = 1, r.sf = 2.5f;
            r.ldt = XTE_DTYPE_BF16, r.idt = XTE_DTYPE_INT32, r.gdt = XTE_DTYPE_BF16;
            break;
          case 2:
            r.T = 19, r.E = 7, r.topk = 1;
            break;
          case 3:
            r.T = 31, r.E = 160, r.topk = 6, r.groups = 4, r.gtopk = 2, r.bias = 1;
            r.prof = P_TIES;
            break;
          case 4:
            r.T = 9, r.E = 512, r.topk = 16, r.ldt = XTE_DTYPE_BF16;
            break;
          case 5:
            r.T = 40, r.E = 24, r.topk = 3, r.prof = P_WILD, r.idt = XTE_DTYPE_INT32;
            break;
          default:
            r.T = 300, r.E = 48, r.topk = 2, r.bias = 1, r.sf = 0.75f, r.prof = P_TIES;
            break;
        }
        router_case(&r, 0);
        router_case(&r, 1);
      }
  if (!g_small) { /* outputs past 8 MiB: the SIMD router writes them with streaming stores */
    rspec r;
    memset(&r, 0, sizeof r);
    r.T = 8200, r.E = 256, r.topk = 8, r.groups = 8, r.gtopk = 4, r.bias = 1;
    r.score = XTE_ROUTER_SIGMOID, r.sf = 1.0f, r.ldt = XTE_DTYPE_BF16, r.idt = XTE_DTYPE_INT32;
    r.gdt = XTE_DTYPE_FP32, r.prof = P_UNIT;
    router_case(&r, 0);
    r.score = XTE_ROUTER_SOFTMAX, r.groups = 0, r.gtopk = 0, r.bias = 0, r.ldt = XTE_DTYPE_FP32;
    router_case(&r, 0);
    aux_scores_case(8200, 256, 4, XTE_ROUTER_SQRTSOFTPLUS, 0);
  }
  for (s = 0; s < 3; s++)
    for (v = 0; v < 2; v++) {
      aux_scores_case(v ? 19 : 120, v ? 7 : 64, v ? 1 : 4, scs[s], 0);
      aux_scores_case(v ? 19 : 120, v ? 7 : 64, v ? 1 : 4, scs[s], 1);
    }
  aux_loss_cases();
}

/* ------------------------------------------------------------------ token movement */

typedef struct routing {
  xte_tensor map, idx;
  xte_moe_routing r;
  int64_t T, E;
  int k;
} routing;

/* T tokens over E experts, k distinct each; topk_idx (use_map = 0) has about one slot in 7 at -1 */
static void gen_routing(routing *g, int64_t T, int64_t E, int k, int use_map, xte_dtype idt) {
  uint8_t *map = (uint8_t *)xalloc((size_t)(T * E));
  void *idx = xalloc(8 * (size_t)(T * k));
  int64_t t;
  int j, i;
  for (t = 0; t < T; t++) {
    int64_t sel[16];
    for (j = 0; j < k; j++) {
      int64_t e;
      int dup;
      do {
        e = (int64_t)rndn((uint32_t)E);
        dup = 0;
        for (i = 0; i < j; i++) dup |= sel[i] == e;
      } while (dup);
      sel[j] = e;
      if (!use_map && rndn(7) == 0) e = -1;
      if (e >= 0) map[t * E + e] = 1;
      if (idt == XTE_DTYPE_INT32)
        ((int32_t *)idx)[t * k + j] = (int32_t)e;
      else
        ((int64_t *)idx)[t * k + j] = e;
    }
  }
  g->map = t2(map, XTE_DTYPE_UINT8, T, E);
  g->idx = t2(idx, idt, T, k);
  g->r.routing_map = use_map ? &g->map : NULL;
  g->r.topk_idx = use_map ? NULL : &g->idx;
  g->r.num_experts = E;
  g->T = T;
  g->E = E;
  g->k = k;
}

static const char *rname(int use_map, xte_dtype idt) {
  return use_map ? "map" : idt == XTE_DTYPE_INT32 ? "idx32" : "idx64";
}

void permute_cases(void) {
  static const xte_dtype dts[4] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_E4M3, XTE_DTYPE_E5M2};
  const int64_t T = g_small ? 97 : 300, E = 16, H = 200;
  const int k = 4;
  int d, rv, cv;
  /* permute_rows and permute: each dtype x routing kind x cap / align */
  for (d = 0; d < 4; d++)
    for (rv = 0; rv < 3; rv++)
      for (cv = 0; cv < 4; cv++) {
        static const int64_t caps[4] = {-1, -1, 250, 250}, als[4] = {1, 16, 1, 128};
        int mark = mem_mark();
        int use_map = rv == 0;
        xte_dtype idt = rv == 2 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
        routing g;
        xte_permute_config pc;
        xte_permute_outputs ex;
        xte_tensor in, ins, out, outs, rm;
        int64_t R = 0, OR, *rows;
        int fp8 = dts[d] == XTE_DTYPE_E4M3 || dts[d] == XTE_DTYPE_E5M2;
        xte_dtype sdt = dts[d] == XTE_DTYPE_E5M2 ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
        if (g_small && cv != 0 && cv != 3 && d != 1) {
          mem_release(mark);
          continue;
        }
        pc = xte_permute_config_default();
        pc.num_out_tokens = caps[cv];
        pc.align = als[cv];
        if (d == 0) { /* permute_rows (independent of the dtype) */
          case_begin("permute_rows.%s.T%lld.E%lld.k%d.cap%lld.al%lld", rname(use_map, idt),
                     (long long)T, (long long)E, k, (long long)pc.num_out_tokens,
                     (long long)pc.align);
          gen_routing(&g, T, E, k, use_map, idt);
          rows = (int64_t *)xalloc(8);
          out_buf("rows", rows, 8, XTE_DTYPE_INT64, 1);
          case_end(xte_moe_permute_rows(&g.r, &pc, rows, NULL), 0);
        }
        case_begin("permute.%s.%s.T%lld.E%lld.H%lld.k%d.cap%lld.al%lld", dtn(dts[d]),
                   rname(use_map, idt), (long long)T, (long long)E, (long long)H, k,
                   (long long)pc.num_out_tokens, (long long)pc.align);
        gen_routing(&g, T, E, k, use_map, idt);
        if (!setup_ok(xte_moe_permute_rows(&g.r, &pc, &R, NULL), "permute_rows")) {
          mem_release(mark);
          continue;
        }
        OR = R + 5;
        in = t2(gen_new(dts[d], T * H, P_WILD, 2.0f), dts[d], T, H);
        ins = t2(gen_new(sdt, T * 2, P_UNIT, 1.0f), sdt, T, 2);
        out = out2("output", dts[d], OR, H);
        outs = fp8 ? out2("output_scales", sdt, OR, 2) : t2(NULL, sdt, OR, 2);
        rm = out2("row_map", XTE_DTYPE_INT32, T, k);
        memset(&ex, 0, sizeof ex);
        ex.expert_offsets = out2("expert_offsets", XTE_DTYPE_INT64, E + 1, 0);
        ex.tokens_per_expert =
            out2("tokens_per_expert", rv == 2 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64, E, 0);
        ex.row_to_expert = out2("row_to_expert", XTE_DTYPE_INT32, OR, 0);
        case_end(xte_moe_permute(&in, fp8 ? &ins : NULL, &g.r, &pc, &out, fp8 ? &outs : NULL, &rm,
                                 &ex, NULL),
                 0);
        mem_release(mark);
      }
  /* unpermute and the backwards: fp32 / bf16, map / topk_idx, probs or none, cap + align */
  for (d = 0; d < 2; d++)
    for (rv = 0; rv < 3; rv++)
      for (cv = 0; cv < 2; cv++) {
        int op;
        for (op = 0; op < 3; op++) {
          int mark = mem_mark();
          int use_map = rv == 0, pr;
          xte_dtype idt = rv == 2 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64, dt = dts[d];
          routing g;
          xte_permute_config pc;
          xte_tensor x, px, rm, probs, out;
          int64_t R;
          static const char *ops[3] = {"unpermute", "permute_bwd", "unpermute_bwd"};
          pc = xte_permute_config_default();
          pc.num_out_tokens = cv ? 250 : -1;
          pc.align = cv ? 16 : 1;
          pr = (rv + cv + op) % 2 == 0 || op == 2;
          case_begin("%s.%s.%s.T%lld.E%lld.H%lld.k%d.cap%lld.al%lld%s", ops[op], dtn(dt),
                     rname(use_map, idt), (long long)T, (long long)E, (long long)H, k,
                     (long long)pc.num_out_tokens, (long long)pc.align,
                     op != 1 ? (pr ? ".probs" : ".noprobs") : "");
          gen_routing(&g, T, E, k, use_map, idt);
          if (!setup_ok(xte_moe_permute_rows(&g.r, &pc, &R, NULL), "permute_rows")) {
            mem_release(mark);
            continue;
          }
          x = t2(gen_new(dt, T * H, P_FINITE, 2.0f), dt, T, H);
          px = t2(xalloc(xte_dtype_size(dt) * (size_t)(R * H)), dt, R, H);
          rm = t2(xalloc(4 * (size_t)(T * k)), XTE_DTYPE_INT32, T, k);
          if (!setup_ok(xte_moe_permute(&x, NULL, &g.r, &pc, &px, NULL, &rm, NULL, NULL),
                        "permute")) {
            mem_release(mark);
            continue;
          }
          gen(px.data, dt, R * H, P_FINITE, 1.0f); /* the experts' outputs */
          probs = t2(gen_new(XTE_DTYPE_FP32, T * (use_map ? E : k), P_UNIT, 1.0f), XTE_DTYPE_FP32,
                     T, use_map ? E : k);
          if (op == 0) {
            out = out2("out", dt, T, H);
            case_end(xte_moe_unpermute(&px, &g.r, &rm, pr ? &probs : NULL, &out, NULL), 0);
          } else if (op == 1) {
            out = out2("grad_input", dt, T, H);
            case_end(xte_moe_permute_backward(&px, &g.r, &rm, &out, NULL), 0);
          } else {
            xte_tensor go = t2(gen_new(dt, T * H, P_UNIT, 1.0f), dt, T, H), gp;
            out = out2("grad_input", dt, R, H);
            gp = out2("grad_probs", XTE_DTYPE_FP32, T, use_map ? E : k);
            case_end(xte_moe_unpermute_backward(&go, &px, &g.r, &rm, &probs, &out,
                                                (rv + cv) % 2 ? NULL : &gp, NULL),
                     0);
          }
          mem_release(mark);
        }
      }
  /* mixed dtypes: fp32 input, bf16 out (and back) */
  for (d = 0; d < 2; d++) {
    int mark = mem_mark();
    routing g;
    xte_permute_config pc;
    xte_tensor x, px, rm, out;
    int64_t R;
    xte_dtype a = d ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, b = d ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
    pc = xte_permute_config_default();
    pc.num_out_tokens = -1;
    pc.align = 1;
    case_begin("unpermute.%s_%s.idx64.T%lld", dtn(a), dtn(b), (long long)T);
    gen_routing(&g, T, E, k, 0, XTE_DTYPE_INT64);
    if (setup_ok(xte_moe_permute_rows(&g.r, &pc, &R, NULL), "permute_rows")) {
      x = t2(gen_new(a, T * H, P_FINITE, 2.0f), a, T, H);
      px = t2(xalloc(xte_dtype_size(a) * (size_t)(R * H)), a, R, H);
      rm = t2(xalloc(4 * (size_t)(T * k)), XTE_DTYPE_INT32, T, k);
      if (setup_ok(xte_moe_permute(&x, NULL, &g.r, &pc, &px, NULL, &rm, NULL, NULL), "permute")) {
        out = out2("out", b, T, H);
        case_end(xte_moe_unpermute(&px, &g.r, &rm, NULL, &out, NULL), 1);
      }
    }
    mem_release(mark);
  }
  /* sort chunks and its backward */
  {
    static const int64_t sizes[12] = {50, 7, 0, 100, 63, 41, 90, 1, 88, 60, 30, 70};
    static const int32_t order[12] = {3, 11, 0, 7, 2, 9, 5, 1, 10, 4, 8, 6};
    static const xte_dtype sdts[3] = {XTE_DTYPE_BF16, XTE_DTYPE_FP32, XTE_DTYPE_UINT8};
    int v;
    for (v = 0; v < 3; v++) {
      int mark = mem_mark(), i;
      int64_t R = 0, Hs = v == 2 ? 33 : 96;
      void *sp = xalloc(8 * 12);
      int32_t *ix = (int32_t *)xalloc(4 * 12);
      xte_dtype spdt = v == 1 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
      xte_tensor split, sorted, in, out, rm, gi;
      for (i = 0; i < 12; i++) {
        if (spdt == XTE_DTYPE_INT32)
          ((int32_t *)sp)[i] = (int32_t)sizes[i];
        else
          ((int64_t *)sp)[i] = sizes[i];
        ix[i] = order[i];
        R += sizes[i];
      }
      split = t1(sp, spdt, 12);
      sorted = t1(ix, XTE_DTYPE_INT32, 12);
      case_begin("sort_chunks.%s.R%lld.H%lld.split_%s", dtn(sdts[v]), (long long)R, (long long)Hs,
                 dtn(spdt));
      in = t2(gen_new(sdts[v], R * Hs, P_WILD, 1.0f), sdts[v], R, Hs);
      out = out2("output", sdts[v], R, Hs);
      rm = out2("row_map", XTE_DTYPE_INT32, R, 0);
      case_end(xte_moe_sort_chunks_by_index(&in, &split, &sorted, &out, &rm, NULL), 0);
      case_begin("sort_chunks_bwd.%s.R%lld.H%lld", dtn(sdts[v]), (long long)R, (long long)Hs);
      gi = out2("grad_input", sdts[v], R, Hs);
      case_end(xte_moe_sort_chunks_backward(&out, &rm, &gi, NULL), 0);
      mem_release(mark);
    }
  }
  /* dispatch layout */
  {
    int v;
    for (v = 0; v < 3; v++) {
      int mark = mem_mark();
      static const int ranks[3] = {8, 1, 3};
      static const int64_t es[3] = {64, 16, 9};
      routing g;
      xte_tensor tpr, tpe, inr;
      xte_dtype idt = v == 1 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
      case_begin("dispatch_layout.%s.T%lld.E%lld.r%d", dtn(idt), (long long)T, (long long)es[v],
                 ranks[v]);
      gen_routing(&g, T, es[v], v == 0 ? 8 : 3, 0, idt);
      tpr = out2("tokens_per_rank", XTE_DTYPE_INT32, ranks[v], 0);
      tpe = out2("tokens_per_expert", XTE_DTYPE_INT32, es[v], 0);
      inr = out2("is_token_in_rank", XTE_DTYPE_UINT8, T, ranks[v]);
      case_end(xte_moe_dispatch_layout(&g.idx, es[v], ranks[v], &tpr, &tpe, &inr, NULL), 0);
      mem_release(mark);
    }
  }
}

/* ------------------------------------------------------------------ SwiGLU */

void swiglu_cases(void) {
  static const xte_dtype dts[2] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16};
  const int64_t T = g_small ? 37 : 67;
  int i, j, f;
  for (f = 0; f < 2; f++)
    for (i = 0; i < 2; i++)
      for (j = 0; j < 2; j++) {
        int mark = mem_mark();
        int64_t F = f ? 256 : 200;
        int prof = f ? P_CLEAN : P_WILD;
        xte_tensor in = t2(gen_new(dts[i], T * 2 * F, prof, 4.0f), dts[i], T, 2 * F), out, go;
        case_begin("swiglu.%s_%s.T%lld.F%lld", dtn(dts[i]), dtn(dts[j]), (long long)T,
                   (long long)F);
        out = out2("out", dts[j], T, F);
        case_end(xte_swiglu(&in, &out, NULL), 1);
        case_begin("dswiglu.%s_%s.T%lld.F%lld", dtn(dts[i]), dtn(dts[j]), (long long)T,
                   (long long)F);
        go = t2(gen_new(dts[i], T * F, prof, 1.0f), dts[i], T, F);
        out = out2("grad_input", dts[j], T, 2 * F);
        case_end(xte_dswiglu(&go, &in, &out, NULL), 1);
        mem_release(mark);
      }
  /* fused with quantization: every recipe x layout (1x128; 128x128 and MX refused), act dtype,
   * fp8 dtype, copies */
  {
    static const xte_recipe recs[6] = {XTE_RECIPE_TE_BLOCK,       XTE_RECIPE_DEEPGEMM,
                                       XTE_RECIPE_DEEPGEMM_UE8M0, XTE_RECIPE_MTFP8,
                                       XTE_RECIPE_MX_TE,          XTE_RECIPE_TE_CURRENT};
    int r, l, bwd, v;
    for (bwd = 0; bwd < 2; bwd++)
      for (r = 0; r < 6; r++)
        for (l = 0; l < 4; l++)
          for (v = 0; v < 6; v++) {
            int mark = mem_mark();
            xte_scaling_mode mode = r == 4   ? XTE_SCALING_MXFP8_1x32
                                    : r == 5 ? XTE_SCALING_PER_TENSOR
                                             : XTE_SCALING_BLOCK_1x128;
            xte_dtype idt = v == 1 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
            xte_dtype act = v == 2 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
            xte_dtype qdt = v == 3 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
            int copies = v == 4 ? C_ROW : v == 5 ? C_COL : C_BOTH;
            int64_t F = v == 1 ? 256 : 200, K = bwd ? 2 * F : F;
            xte_qtensor q;
            xte_tensor in, go;
            xte_quant_config cfg = xte_quant_config_default();
            xte_status st;
            int prof;
            if (v > 0 && (r >= 4 || l == 3)) {
              mem_release(mark);
              continue;
            }
            if (v > 0 && g_small && l != 0) {
              mem_release(mark);
              continue;
            }
            case_begin("%s.%s.%s.%s.%s.%s.%s.%s.T%lld.F%lld%s",
                       bwd ? "dswiglu_quantize" : "swiglu_quantize", mode_name(mode),
                       recipe_name(recs[r]), layout_name((xte_scale_layout)l), dtn(idt), dtn(act),
                       dtn(qdt), copies_name(copies), (long long)T, (long long)F,
                       v == 0 && (r + l) % 2 ? ".clean" : "");
            /* half the recipe x layout cases without NaN / inf (the kernels' fast paths) */
            prof = v == 0 && (r + l) % 2 ? P_CLEAN : P_WILD;
            in = t2(gen_new(idt, T * 2 * F, prof, 4.0f), idt, T, 2 * F);
            go = t2(gen_new(idt, T * F, prof, 1.0f), idt, T, F);
            st = make_q(&q, T, K, mode, recs[r], (xte_scale_layout)l, qdt, copies, XTE_DTYPE_COUNT,
                        1);
            if (st == XTE_SUCCESS) {
              q.amax = (float *)xalloc(4);
              out_buf("amax", q.amax, 4, XTE_DTYPE_FP32, 1);
              st = bwd ? xte_dswiglu_quantize(&go, &in, act, &q, &cfg, NULL)
                       : xte_swiglu_quantize(&in, act, &q, &cfg, NULL);
            }
            case_end(st, 1);
            mem_release(mark);
          }
    /* 128x128 blocks: refused */
    for (bwd = 0; bwd < 2; bwd++) {
      int mark = mem_mark();
      xte_qtensor q;
      xte_tensor in =
          t2(gen_new(XTE_DTYPE_BF16, 128 * 512, P_UNIT, 1.0f), XTE_DTYPE_BF16, 128, 512);
      xte_tensor go =
          t2(gen_new(XTE_DTYPE_BF16, 128 * 256, P_UNIT, 1.0f), XTE_DTYPE_BF16, 128, 256);
      xte_status st;
      case_begin("%s.128x128.te_blk.compact", bwd ? "dswiglu_quantize" : "swiglu_quantize");
      st = make_q(&q, 128, bwd ? 512 : 256, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                  XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3, C_BOTH, XTE_DTYPE_COUNT, 1);
      if (st == XTE_SUCCESS)
        st = bwd ? xte_dswiglu_quantize(&go, &in, XTE_DTYPE_BF16, &q, NULL, NULL)
                 : xte_swiglu_quantize(&in, XTE_DTYPE_BF16, &q, NULL, NULL);
      case_end(st, 1);
      mem_release(mark);
    }
  }
}

/* ------------------------------------------------------------------ expert parallelism (one rank)
 */

void ep_cases(void) {
  const int64_t T = g_small ? 40 : 100, H = 256, El = 8, K = 4, S = 2;
  int v;
  for (v = 0; v < 2; v++) {
    int mark = mem_mark();
    xte_ep_config cfg = xte_ep_config_default();
    xte_ep_threads_world world = NULL;
    xte_ep_group grp = NULL;
    size_t hb = 0;
    void *handle;
    xte_ep_counts counts, *pc;
    int32_t *idx = (int32_t *)xalloc(4 * (size_t)(T * K));
    float *w = (float *)xalloc(4 * (size_t)(T * K));
    xte_tensor ti, tw, x, xs, rx, rs, rw, tpe, y, out, slots, go, gy, gw, gr, gx, rti, rtw;
    int64_t t, j, rows;
    xte_dtype xdt = v ? XTE_DTYPE_BF16 : XTE_DTYPE_E4M3;
    const char *vn = v ? "bf16" : "e4m3";
    int ok = 1;
    for (t = 0; t < T; t++)
      for (j = 0; j < K; j++) {
        idx[t * K + j] = (int32_t)((t * 3 + j * 5) % El); /* distinct within a token */
        if ((t + j) % 11 == 0) idx[t * K + j] = -1;
        w[t * K + j] = (float)(t % 7 + j) / 8.0f;
      }
    ti = t2(idx, XTE_DTYPE_INT32, T, K);
    tw = t2(w, XTE_DTYPE_FP32, T, K);
    cfg.experts_per_rank = El;
    cfg.hidden = H;
    cfg.topk = (int32_t)K;
    cfg.align = v ? 1 : 16;
    cfg.max_tokens_per_rank = T;
    case_begin("ep1.prepare.%s", vn);
    if (!setup_ok(xte_ep_threads_world_create(1, &world), "world") ||
        !setup_ok(xte_ep_group_create_threads(world, 0, &cfg, &grp), "group") ||
        !setup_ok(xte_ep_handle_size(grp, &hb), "handle_size")) {
      ok = 0;
    }
    if (ok) {
      handle = xalloc(hb);
      pc = (xte_ep_counts *)xalloc(sizeof *pc);
      out_buf("counts", pc, sizeof *pc, XTE_DTYPE_INT64, 1);
      tpe = out2("tokens_per_expert", XTE_DTYPE_INT64, El, 0);
      case_end(xte_ep_prepare(grp, &ti, handle, hb, pc, &tpe, NULL), 0);
      counts = *pc;
      rows = counts.recv_rows;
      x = t2(gen_new(xdt, T * H, P_FINITE, 1.0f), xdt, T, H);
      xs = t2(gen_new(XTE_DTYPE_FP32, T * S, P_UNIT, 1.0f), XTE_DTYPE_FP32, T, S);
      case_begin("ep1.dispatch.%s", vn);
      rx = out2("recv_x", xdt, rows, H);
      rs = v ? t2(NULL, XTE_DTYPE_FP32, rows, S) : out2("recv_scales", XTE_DTYPE_FP32, rows, S);
      rw = out2("recv_weights", XTE_DTYPE_FP32, rows, 0);
      case_end(
          xte_ep_dispatch(grp, handle, &x, v ? NULL : &xs, &tw, &rx, v ? NULL : &rs, &rw, NULL), 0);
      case_begin("ep1.dispatch_tokens.%s", vn);
      {
        int64_t rt = counts.recv_tokens + 2;
        xte_tensor rx2 = out2("recv_x", xdt, rt, H);
        xte_tensor rs2 =
            v ? t2(NULL, XTE_DTYPE_FP32, rt, S) : out2("recv_scales", XTE_DTYPE_FP32, rt, S);
        rti = out2("recv_topk_idx", XTE_DTYPE_INT32, rt, K);
        rtw = out2("recv_topk_weights", XTE_DTYPE_FP32, rt, K);
        case_end(xte_ep_dispatch_tokens(grp, handle, &x, v ? NULL : &xs, &tw, &rx2, v ? NULL : &rs2,
                                        &rti, &rtw, NULL),
                 0);
      }
      /* the dispatch above counts as the step's: dispatch again so that combine follows it */
      if (setup_ok(
              xte_ep_dispatch(grp, handle, &x, v ? NULL : &xs, &tw, &rx, v ? NULL : &rs, &rw, NULL),
              "dispatch")) {
        y = t2(gen_new(XTE_DTYPE_BF16, rows * H, P_FINITE, 2.0f), XTE_DTYPE_BF16, rows, H);
        case_begin("ep1.combine.%s", vn);
        out = out2("out", XTE_DTYPE_BF16, T, H);
        slots = out2("slot_rows", XTE_DTYPE_BF16, counts.slot_rows, H);
        case_end(xte_ep_combine(grp, handle, &y, &tw, &out, &slots, NULL), 0);
        go = t2(gen_new(XTE_DTYPE_BF16, T * H, P_FINITE, 2.0f), XTE_DTYPE_BF16, T, H);
        case_begin("ep1.combine_bwd.%s", vn);
        gy = out2("grad_expert_out", XTE_DTYPE_BF16, rows + 3, H);
        gw = out2("grad_weights", XTE_DTYPE_FP32, T, K);
        case_end(xte_ep_combine_backward(grp, handle, &go, &tw, &slots, &gy, &gw, NULL), 0);
        gr = t2(gen_new(XTE_DTYPE_FP32, rows * H, P_FINITE, 2.0f), XTE_DTYPE_FP32, rows, H);
        case_begin("ep1.dispatch_bwd.%s", vn);
        gx = out2("grad_x", XTE_DTYPE_FP32, T, H);
        case_end(xte_ep_dispatch_backward(grp, handle, &gr, &gx, NULL), 0);
      }
    }
    if (grp) xte_ep_group_destroy(grp);
    if (world) xte_ep_threads_world_destroy(world);
    mem_release(mark);
  }
}

/* ================================================================== test hooks
 * Two test hooks of the CPU attention driver (declared under src/, exported for tests, not public
 * API; declared weak here so that a build without them lists these cases as UNSUPPORTED): the
 * attention with its per-thread head caches off and a small S store (the backward's paths past
 * the caches' size limit: operands read in place or converted block by block, S and dP
 * recomputed, the store in rounds), and the ISA's vector exp. */
XTE_API size_t xte_internal_attention_cache_limit(size_t bytes) __attribute__((weak));
XTE_API xte_status xte_internal_attention_exp(xte_cpu_isa isa, const float *x, float *y, int64_t n)
    __attribute__((weak));

void internal_cases(void) {
  static const xte_dtype dts[3] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  int i;
  if (!xte_internal_attention_cache_limit) {
    case_begin("internal.attention_cache_limit");
    case_end(XTE_ERROR_UNSUPPORTED, 1);
  } else {
    size_t lim = xte_internal_attention_cache_limit(0); /* no caches, no store */
    aspec a;
    for (i = 0; i < 3; i++) {
      a = g_small ? aspec_make(dts[i], 1, 37, 2, 1, i == 2 ? 40 : 64, XTE_ATTN_MASK_CAUSAL)
                  : aspec_make(dts[i], 2, 37, 4, 2, i == 2 ? 40 : 64, XTE_ATTN_MASK_CAUSAL);
      a.tag = ".nocache";
      attn_both(&a);
    }
    if (!g_small) {
      a = aspec_make(XTE_DTYPE_BF16, 1, 150, 4, 2, 64, XTE_ATTN_MASK_NONE);
      a.tag = ".nocache";
      attn_both(&a);
      a = aspec_make(XTE_DTYPE_FP32, 1, 130, 2, 1, 64, XTE_ATTN_MASK_CAUSAL);
      a.tag = ".nocache";
      attn_both(&a);
    }
    a = aspec_make(XTE_DTYPE_FP32, 1, g_small ? 40 : 70, 2, 1, 48, XTE_ATTN_MASK_NONE);
    a.dv = 24;
    a.softcap = 20.0f;
    a.tag = ".nocache";
    attn_both(&a);
    a = aspec_make(XTE_DTYPE_BF16, 1, 1, 2, 1, 32, XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
    a.layout = XTE_ATTN_LAYOUT_THD;
    a.nlen = 3;
    a.lq[0] = 30, a.lq[1] = 0, a.lq[2] = 65;
    a.lk[0] = 31, a.lk[1] = 4, a.lk[2] = 70;
    a.tag = ".nocache";
    attn_both(&a);
    a = aspec_make(XTE_DTYPE_E4M3, 2, 37, g_small ? 2 : 4, g_small ? 1 : 2, 64,
                   XTE_ATTN_MASK_CAUSAL);
    a.out_dt = XTE_DTYPE_BF16;
    a.descale = 1;
    a.tag = ".nocache";
    attn_both(&a);
    /* a store of a few 64 x 64 tiles: a (sequence, KV head) pair in several rounds */
    xte_internal_attention_cache_limit((size_t)400 << 10);
    for (i = 0; i < (g_small ? 1 : 2); i++) { /* 300 keys: 5 blocks of 64, 160 KiB per tile row */
      a = aspec_make(dts[i], 1, g_small ? 140 : 300, 2, 1, i ? 64 : 32,
                     i ? XTE_ATTN_MASK_NONE : XTE_ATTN_MASK_CAUSAL);
      a.tag = ".store400k";
      attn_case(&a, 1);
    }
    xte_internal_attention_cache_limit(lim);
  }
  if (!xte_internal_attention_exp) {
    case_begin("internal.attention_exp");
    case_end(XTE_ERROR_UNSUPPORTED, 1);
  } else {
    int mark = mem_mark();
    const int64_t n = 4099;
    float *x = (float *)xalloc(4 * (size_t)n);
    xte_tensor y;
    int64_t k;
    case_begin("internal.attention_exp.n%lld", (long long)n);
    for (k = 0; k < n; k++) /* a sweep over [-110, 95], then the wild profile */
      x[k] = k < 2048 ? -110.0f + 205.0f * (float)k / 2047.0f : 0.0f;
    gen_f32(x + 2048, n - 2048, P_WILD, 30.0f);
    y = out2("y", XTE_DTYPE_FP32, n, 0);
    case_end(xte_internal_attention_exp(xte_cpu_get_isa(), x, (float *)y.data, n), 0);
    mem_release(mark);
  }
}

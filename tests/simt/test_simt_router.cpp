/* The CUDA router and SwiGLU kernels (src/cuda/moe_router_kernels.cuh, moe_swiglu_kernels.cuh),
 * run on the host by the SIMT runner (simt.h, through the stand-in plugin simt_plugin.cpp that
 * libxte loads as its CUDA backend), against the CPU backend, byte for byte (every output starts
 * as 0xCD on both sides, so an untouched or extra byte shows too):
 *  - router forward: softmax (pre / post top-k), sigmoid, sqrtsoftplus; topk 1..16; groups with
 *    group_topk; expert bias; scaling factor; fp32 / bf16 logits with padded rows; int32 / int64
 *    topk_idx; every output, and subsets; logits with ties (few distinct values), +-0, NaN, +-inf,
 *    all -inf rows, huge values; T = 0, 1, odd; E from 1 to 512, odd ones; past the old limits
 *    (E 1024 / 2051 with topk 32 / 100 / E: the row slots in global memory, the CPU's
 *    insertion and merge-sort top-k paths, groups);
 *  - router backward on the forward's own map and saved, and on arbitrary ones, fp32 / bf16
 *    grad_logits, with NaN / inf gradients;
 *  - aux scores (byte and bit maps) and their backward (every score function and topk);
 *  - Quantile Balancing (xte_router_qb_forward): every output, cutoff, histogram; refusals;
 *  - aux loss forward (T across the 1024-token blocks; NaN / inf probs; int32 / int64 / fp32
 *    tokens_per_expert; num_experts dividing the columns) and backward;
 *  - SwiGLU forward / backward (fp32 / bf16 in and out, odd F, F = 0, T = 0, specials) and the
 *    fused SwiGLU + quantize forms (every 1x128 recipe, act fp32 / bf16, rowwise + columnwise,
 *    every scale layout), with the amax output;
 *  - refusals: the same status and message as the CPU.
 *
 *   test_simt_router [--reduced | --full] [--warp 32|64|128] [--verbose]
 * default: the case list thinned (well under 40 s on 2 cores); --full: every case; --reduced: a
 * shorter list (sanitized builds); --warp: the runner's warp size (the kernels must not depend
 * on it). Exit status 1 on any mismatch, with one line per failing case. */
#include "simt.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "simt_test_common.h"

/* keep one case in `stride`: 3 by default, 6 with --reduced, 1 (every case) with --full */
static int stride = 3, counter;

/* thin the default list: keep one case in `stride` (every case with --full) */
static bool keep() {
  return (counter++ % stride) == 0;
}

/* Value kinds of a logits row. */
enum { V_NORMAL, V_TIES, V_SPECIAL, V_NEGINF, V_HUGE, V_KINDS };

static float value(int kind) {
  static const uint32_t sp[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFA12345u, 0x7F812345u,
                                0x00000001u, 0x80000000u, 0x00000000u, 0x7F7FFFFFu, 0xFF7FFFFFu};
  switch (kind) {
    case V_TIES: {
      static const float t[] = {1.0f, 0.5f, -2.0f, 0.0f, -0.0f, 3.0f};
      return t[rnd() % 6];
    }
    case V_SPECIAL:
      if (rnd() % 4 == 0) return bitsf(sp[rnd() % 10]);
      break;
    case V_NEGINF:
      if (rnd() % 8) return -INFINITY;
      break;
    case V_HUGE:
      return (float)((double)(int64_t)(rnd() % 2000001 - 1000000) * 1e3);
  }
  return (float)((double)(int64_t)(rnd() % 2000001 - 1000000) * 4e-6);
}

static buf fill_f32(int64_t n, int kind) {
  buf b((size_t)n * 4);
  for (int64_t i = 0; i < n; i++) {
    const uint32_t u = fbits(value(kind));
    std::memcpy(&b[(size_t)i * 4], &u, 4);
  }
  return b;
}

/* rows x cols of dt (fp32 / bf16) with leading dimension ld (the gaps filled too) */
static buf fill_mat(int64_t rows, int64_t ld, int dt, int kind) {
  const int64_t n = rows * ld;
  buf b((size_t)n * (dt == XTE_DTYPE_FP32 ? 4 : 2) + 1);
  for (int64_t i = 0; i < n; i++) {
    const uint32_t u = fbits(value(kind));
    if (dt == XTE_DTYPE_FP32) {
      std::memcpy(&b[(size_t)i * 4], &u, 4);
    } else {
      const uint16_t h = (uint16_t)(u >> 16);
      std::memcpy(&b[(size_t)i * 2], &h, 2);
    }
  }
  return b;
}

static const char *sname(int s) {
  return s == 0 ? "softmax" : (s == 1 ? "sigmoid" : "sqrtsoftplus");
}

/* ---------------------------------------------------------------- router */

struct rcase {
  int64_t T, E, ldx;
  int k, score, pre, groups, gtopk, bias, dt, idx_dt, outs, kind;
  float scale;
};

struct rout {
  buf probs, map, bits, idx, w, saved;
};

static rout fresh(const rcase &c) {
  rout o;
  const size_t TE = (size_t)(c.T * c.E);
  o.probs.assign(TE * 4 + 1, 0xCD);
  o.map.assign(TE + 1, 0xCD);
  o.bits.assign((size_t)(c.T * ((c.E + 7) / 8)) + 1, 0xCD);
  o.idx.assign((size_t)(c.T * c.k) * (c.idx_dt == XTE_DTYPE_INT32 ? 4 : 8) + 1, 0xCD);
  o.w.assign((size_t)(c.T * c.k) * 4 + 1, 0xCD);
  o.saved.assign(TE * 4 + 1, 0xCD);
  return o;
}

static xte_status router_fwd(const rcase &c, buf &x, buf &bias, rout &o, xte_stream s) {
  xte_tensor tx = t2(x, c.dt, c.T, c.E, c.ldx);
  xte_tensor tb = xte_tensor_1d(bias.data(), XTE_DTYPE_FP32, c.E);
  xte_router_config cfg = xte_router_config_default();
  cfg.topk = c.k;
  cfg.score_function = (xte_router_score)c.score;
  cfg.use_pre_softmax = c.pre;
  cfg.num_groups = c.groups;
  cfg.group_topk = c.gtopk;
  cfg.scaling_factor = c.scale;
  xte_router_outputs out;
  std::memset(&out, 0, sizeof out);
  if (c.outs & 1) out.probs = t2(o.probs, XTE_DTYPE_FP32, c.T, c.E);
  if (c.outs & 2) out.routing_map = t2(o.map, XTE_DTYPE_UINT8, c.T, c.E);
  if (c.outs & 4) out.routing_bits = t2(o.bits, XTE_DTYPE_UINT8, c.T, (c.E + 7) / 8);
  if (c.outs & 8) out.topk_idx = t2(o.idx, c.idx_dt, c.T, c.k);
  if (c.outs & 16) out.topk_weights = t2(o.w, XTE_DTYPE_FP32, c.T, c.k);
  if (c.outs & 32) out.saved = t2(o.saved, XTE_DTYPE_FP32, c.T, c.E);
  return xte_router_forward(&tx, c.bias ? &tb : nullptr, &cfg, &out, s);
}

static std::string rdesc(const rcase &c, const char *what) {
  char d[300];
  std::snprintf(d, sizeof d,
                "%s T=%lld E=%lld ld=%lld k=%d %s pre=%d groups=%d/%d bias=%d %s idx%s outs=%d "
                "kind=%d scale=%g",
                what, (long long)c.T, (long long)c.E, (long long)c.ldx, c.k, sname(c.score), c.pre,
                c.groups, c.gtopk, c.bias, c.dt == XTE_DTYPE_FP32 ? "fp32" : "bf16",
                c.idx_dt == XTE_DTYPE_INT32 ? "32" : "64", c.outs, c.kind, (double)c.scale);
  return d;
}

/* The forward, then the backward from the CPU forward's map and saved (and from arbitrary ones). */
static void router_case(const rcase &c) {
  buf x = fill_mat(c.T, c.ldx, c.dt, c.kind);
  buf bias = fill_f32(c.E, rnd() % 3 ? V_NORMAL : V_TIES);
  rout og = fresh(c), oc = fresh(c);
  const std::string d = rdesc(c, "router_forward");
  if (!run_both(d, [&](xte_stream s) { return router_fwd(c, x, bias, s == cpu ? oc : og, s); }))
    return;
  same("probs", d, og.probs, oc.probs);
  same("routing_map", d, og.map, oc.map);
  same("routing_bits", d, og.bits, oc.bits);
  same("topk_idx", d, og.idx, oc.idx);
  same("topk_weights", d, og.w, oc.w);
  same("saved", d, og.saved, oc.saved);
  if ((c.outs & 34) != 34) return; /* the backward needs the map and saved */
  for (int arbitrary = 0; arbitrary < 2; arbitrary++) {
    const int gdt = (counter & 1) ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
    buf map = oc.map, saved = oc.saved;
    if (arbitrary) {
      if (rnd() % 2) continue;
      for (auto &b : map) b = (uint8_t)(rnd() % 3 == 0);
      saved = fill_mat(c.T, c.E, XTE_DTYPE_FP32, rnd() % 2 ? V_SPECIAL : V_NORMAL);
      saved.resize((size_t)(c.T * c.E) * 4 + 1);
    }
    buf g = fill_mat(c.T, c.E, XTE_DTYPE_FP32, rnd() % 4 ? V_NORMAL : V_SPECIAL);
    const size_t gsz = (size_t)(c.T * c.E) * (gdt == XTE_DTYPE_FP32 ? 4 : 2) + 1;
    buf gxg(gsz, 0xCD), gxc(gsz, 0xCD);
    const std::string db =
        rdesc(c, arbitrary ? "router_backward(arbitrary map)" : "router_backward") +
        (gdt == XTE_DTYPE_FP32 ? " grad fp32" : " grad bf16");
    if (!run_both(db, [&](xte_stream s) {
          xte_tensor tg = t2(g, XTE_DTYPE_FP32, c.T, c.E), tm = t2(map, XTE_DTYPE_UINT8, c.T, c.E),
                     ts = t2(saved, XTE_DTYPE_FP32, c.T, c.E), tx = t2(x, c.dt, c.T, c.E, c.ldx),
                     tgx = t2(s == cpu ? gxc : gxg, gdt, c.T, c.E);
          xte_router_config cfg = xte_router_config_default();
          cfg.topk = c.k;
          cfg.score_function = (xte_router_score)c.score;
          cfg.use_pre_softmax = c.pre;
          cfg.num_groups = c.groups;
          cfg.group_topk = c.gtopk;
          cfg.scaling_factor = c.scale;
          return xte_router_backward(&tg, &tm, &ts, &tx, &cfg, &tgx, s);
        }))
      continue;
    same("grad_logits", db, gxg, gxc);
  }
}

static void router_cases() {
  const int64_t Es[] = {1, 2, 7, 16, 33, 64, 130, 384, 512};
  for (int64_t E : Es)
    for (int64_t T : {0, 1, 5, 37})
      for (int score = 0; score < 3; score++)
        for (int k : {1, 2, 3, 8, 16}) {
          if (k > E) continue;
          for (int variant = 0; variant < 4; variant++) {
            if (!keep()) continue;
            if (E >= 384 && T == 37 && stride > 1 && variant) continue;
            rcase c;
            c.T = T;
            c.E = E;
            c.k = k;
            c.score = score;
            c.pre = score == 0 ? (int)(rnd() % 2) : 0;
            c.groups = 0;
            c.gtopk = 0;
            if (variant >= 2) { /* group-limited: a divisor of E that can supply k */
              for (int tries = 0; tries < 8 && !c.groups; tries++) {
                const int G = 1 + (int)(rnd() % (uint64_t)(E < 16 ? E : 16));
                if (G < 2 || E % G) continue;
                const int gt = 1 + (int)(rnd() % (uint64_t)(G < k ? G : k));
                if (k / gt > E / G || (int64_t)gt * (E / G) < k) continue;
                c.groups = G;
                c.gtopk = gt;
              }
            }
            c.bias = (int)(rnd() % 2);
            c.dt = rnd() % 3 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
            c.ldx = E + (rnd() % 3 == 0 ? 3 : 0);
            c.idx_dt = rnd() % 2 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
            c.outs = rnd() % 4 ? 63 : 1 + (int)(rnd() % 63);
            c.kind = (int)(rnd() % V_KINDS);
            if (variant == 1) c.kind = V_SPECIAL;
            c.scale = rnd() % 2 ? 1.0f : 2.5f;
            router_case(c);
          }
        }
  /* past the old limits (E 512, topk 16): every one of these runs, whatever the stride */
  struct big {
    int64_t E;
    int k, groups, gtopk;
  };
  const big bigs[] = {{1024, 32, 0, 0}, {2051, 100, 0, 0}, {1024, 32, 8, 4},
                      {96, 96, 0, 0},   {1024, 65, 0, 0},  {130, 17, 0, 0}};
  for (const big &b : bigs)
    for (int score = 0; score < 3; score++) {
      rcase c;
      c.T = 3;
      c.E = b.E;
      c.k = b.k;
      c.score = score;
      c.pre = score == 0 ? (int)(rnd() % 2) : 0;
      c.groups = b.groups;
      c.gtopk = b.gtopk;
      c.bias = (int)(rnd() % 2);
      c.dt = rnd() % 3 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
      c.ldx = c.E;
      c.idx_dt = rnd() % 2 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
      c.outs = 63;
      c.kind = score == 1 ? V_TIES : (int)(rnd() % V_KINDS);
      c.scale = 1.0f;
      router_case(c);
    }
}

/* ---------------------------------------------------------------- aux scores, aux loss */

static void aux_scores_case(int64_t T, int64_t E, int k, int score, int kind, int gdt) {
  buf x = fill_mat(T, E, XTE_DTYPE_FP32, kind);
  const size_t TE = (size_t)(T * E);
  const int64_t nbits = (E + 7) / 8;
  buf sg(TE * 4 + 1, 0xCD), sc(sg), mg(TE + 1, 0xCD), mc(mg), vg(sg), vc(sg),
      bg((size_t)(T * nbits) + 1, 0xCD), bc(bg);
  char d0[160];
  std::snprintf(d0, sizeof d0, "aux_scores T=%lld E=%lld k=%d %s kind=%d", (long long)T,
                (long long)E, k, sname(score), kind);
  const std::string d = d0;
  if (!run_both(d, [&](xte_stream s) {
        const bool c = s == cpu;
        xte_tensor tx = t2(x, XTE_DTYPE_FP32, T, E), ts = t2(c ? sc : sg, XTE_DTYPE_FP32, T, E),
                   tm = t2(c ? mc : mg, XTE_DTYPE_UINT8, T, E),
                   tv = t2(c ? vc : vg, XTE_DTYPE_FP32, T, E);
        xte_tensor tb = t2(c ? bc : bg, XTE_DTYPE_UINT8, T, nbits);
        return xte_router_aux_scores_ex(&tx, k, (xte_router_score)score, &ts, &tm, &tb, &tv, s);
      }))
    return;
  same("scores", d, sg, sc);
  same("routing_map", d, mg, mc);
  same("routing_bits", d, bg, bc);
  same("saved", d, vg, vc);
  buf g = fill_mat(T, E, XTE_DTYPE_FP32, rnd() % 4 ? V_NORMAL : V_SPECIAL);
  const size_t gsz = TE * (gdt == XTE_DTYPE_FP32 ? 4 : 2) + 1;
  buf gg(gsz, 0xCD), gc(gsz, 0xCD);
  const std::string db = "aux_scores_backward " + d.substr(11);
  if (!run_both(db, [&](xte_stream s) {
        xte_tensor tg = t2(g, XTE_DTYPE_FP32, T, E), tv = t2(vc, XTE_DTYPE_FP32, T, E),
                   tx = t2(x, XTE_DTYPE_FP32, T, E), tgx = t2(s == cpu ? gc : gg, gdt, T, E);
        return xte_router_aux_scores_backward(&tg, &tv, &tx, k, (xte_router_score)score, &tgx, s);
      }))
    return;
  same("grad_logits", db, gg, gc);
}

/* The aux loss from the contract (docs/numerics.md section 8 and the NaN rule of section 2):
 * fp64 column sums over blocks of 1024 tokens (tokens ascending), blocks in order, experts in
 * order; every NaN operand propagates quieted with its sign and payload, the first one as written
 * (acc + x: acc's), a NaN the operation creates is 0xFFF8000000000000; fp32 <-> fp64 keep the sign
 * and the top of the payload. */
static uint64_t dbits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}
static double bitsd(uint64_t u) {
  double d;
  std::memcpy(&d, &u, 8);
  return d;
}
static double o_nan(double a, double b, double r) {
  if (!std::isnan(r)) return r;
  if (std::isnan(a)) return bitsd(dbits(a) | (1ull << 51));
  if (std::isnan(b)) return bitsd(dbits(b) | (1ull << 51));
  return bitsd(0xFFF8000000000000ull);
}
static float aux_oracle(const buf &p, int64_t T, int64_t E, const buf &tpe, int tdt, int64_t N,
                        int k, float coeff, int64_t ne) {
  const double C = (double)ne * (double)coeff / ((double)k * (double)N * (double)N);
  double total = 0.0;
  for (int64_t e = 0; e < E; e++) {
    double cs = 0.0;
    for (int64_t b0 = 0; b0 < T; b0 += 1024) {
      double ps = 0.0;
      for (int64_t t = b0; t < T && t < b0 + 1024; t++) {
        uint32_t u;
        std::memcpy(&u, &p[(size_t)(t * E + e) * 4], 4);
        double x;
        if ((u & 0x7FFFFFFFu) > 0x7F800000u)
          x = bitsd((uint64_t)(u >> 31) << 63 | 0x7FF8000000000000ull |
                    (uint64_t)(u & 0x003FFFFFu) << 29);
        else
          x = (double)bitsf(u);
        ps = o_nan(ps, x, ps + x);
      }
      cs = o_nan(cs, ps, cs + ps);
    }
    double v;
    if (tdt == XTE_DTYPE_INT32) {
      int32_t w;
      std::memcpy(&w, &tpe[(size_t)e * 4], 4);
      v = (double)w;
    } else if (tdt == XTE_DTYPE_FP32) {
      float w;
      std::memcpy(&w, &tpe[(size_t)e * 4], 4);
      v = (double)w;
    } else {
      int64_t w;
      std::memcpy(&w, &tpe[(size_t)e * 8], 8);
      v = (double)w;
    }
    const double pr = o_nan(cs, v, cs * v);
    total = o_nan(total, pr, total + pr);
  }
  const double r = o_nan(C, total, C * total);
  if (!std::isnan(r)) return (float)r;
  const uint64_t u = dbits(r);
  return bitsf((uint32_t)(u >> 63) << 31 | 0x7FC00000u | (uint32_t)((u >> 29) & 0x3FFFFFu));
}

static void aux_loss_case(int64_t T, int64_t E, int k, int tdt, int kind, float coeff,
                          int64_t ne = -1) {
  buf p = fill_mat(T, E, XTE_DTYPE_FP32, kind);
  if (kind == V_HUGE) { /* cancellation: small values, and +-2^40 700 tokens apart in every
                         * column, so that the fp64 sums round and the blocking shows */
    p = fill_mat(T, E, XTE_DTYPE_FP32, V_NORMAL);
    for (int64_t e = 0; e < E && T > 700; e++) {
      const int64_t t0 = (e * 37) % (T - 700);
      const float big = 1099511627776.0f, nbig = -big;
      std::memcpy(&p[(size_t)(t0 * E + e) * 4], &big, 4);
      std::memcpy(&p[(size_t)((t0 + 700) * E + e) * 4], &nbig, 4);
    }
  }
  for (size_t i = 0; i + 4 <= p.size() && kind == V_NORMAL; i += 4) { /* probs-like, >= 0 */
    p[i + 3] &= 0x7F;
  }
  buf tpe((size_t)E * (tdt == XTE_DTYPE_INT64 ? 8 : 4));
  for (int64_t e = 0; e < E; e++) {
    const int64_t v = (int64_t)(rnd() % 5000) - (rnd() % 9 == 0 ? 100 : 0);
    if (tdt == XTE_DTYPE_FP32) {
      const float w = (float)v * 0.375f;
      std::memcpy(&tpe[(size_t)e * 4], &w, 4);
    } else if (tdt == XTE_DTYPE_INT32) {
      const int32_t w = (int32_t)v;
      std::memcpy(&tpe[(size_t)e * 4], &w, 4);
    } else {
      std::memcpy(&tpe[(size_t)e * 8], &v, 8);
    }
  }
  const int64_t N = T + 1 + (int64_t)(rnd() % 100);
  char d0[160];
  std::snprintf(d0, sizeof d0, "aux_loss T=%lld E=%lld/%lld k=%d tpe%s kind=%d coeff=%g",
                (long long)T, (long long)E, (long long)ne, k,
                tdt == XTE_DTYPE_INT32 ? "i32" : (tdt == XTE_DTYPE_FP32 ? "f32" : "i64"), kind,
                (double)coeff);
  const std::string d = d0;
  buf ag(4, 0xCD), ac(4, 0xCD);
  if (run_both(d, [&](xte_stream s) {
        xte_tensor tp = t2(p, XTE_DTYPE_FP32, T, E),
                   tt = xte_tensor_1d(tpe.data(), (xte_dtype)tdt, E);
        return xte_moe_aux_loss_forward_ex(&tp, &tt, N, ne, k, coeff,
                                           (float *)(s == cpu ? ac : ag).data(), s);
      })) {
    /* the contract's value (an oracle written here) and the CPU's bytes, NaN results included
     * (the NaN rule: the first NaN operand as written, acc + x gives acc's) */
    buf ao(4);
    const float o = aux_oracle(p, T, E, tpe, tdt, N, k, coeff, ne < 0 ? E : ne);
    std::memcpy(ao.data(), &o, 4);
    same("aux_loss (contract oracle)", d, ag, ao);
    same("aux_loss", d, ag, ac);
  }
  buf gg((size_t)(T * E) * 4 + 1, 0xCD), gc(gg);
  const float grad = rnd() % 5 ? 0.75f : 0.0f;
  const std::string db = "aux_loss_backward " + d.substr(9);
  if (run_both(db, [&](xte_stream s) {
        xte_tensor tt = xte_tensor_1d(tpe.data(), (xte_dtype)tdt, E),
                   tg = t2(s == cpu ? gc : gg, XTE_DTYPE_FP32, T, E);
        return xte_moe_aux_loss_backward_ex(&tt, N, ne, k, coeff, grad, &tg, s);
      }))
    same("grad_probs", db, gg, gc);
}

static void aux_cases() {
  for (int64_t E : {1, 7, 64, 257})
    for (int64_t T : {0, 1, 9})
      for (int score = 0; score < 3; score++)
        for (int k : {1, 2, 5}) {
          if (k > E || !keep()) continue;
          aux_scores_case(T, E, k, score, (int)(rnd() % V_KINDS),
                          rnd() % 2 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16);
        }
  for (int64_t T : {0, 1, 1023, 1024, 1025, 2500})
    for (int64_t E : {1, 3, 64, 300})
      for (int kind : {V_NORMAL, V_SPECIAL, V_HUGE}) {
        if (!keep() && T < 1024) continue;
        if (T * E > 200000 && stride > 1 && kind) continue;
        aux_loss_case(T, E, E > 2 ? 2 : 1, rnd() % 2 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64, kind,
                      rnd() % 4 ? 0.01f : 3e38f);
      }
  /* the sequence-level loss (num_experts dividing the columns), fp32 counts */
  aux_loss_case(1100, 64, 4, XTE_DTYPE_FP32, V_NORMAL, 0.01f, 32);
  aux_loss_case(9, 300, 2, XTE_DTYPE_INT32, V_NORMAL, 0.01f, 3);
  for (int64_t E : {1024, 2051})
    aux_scores_case(3, E, 32, (int)(rnd() % 3), V_NORMAL, XTE_DTYPE_FP32);
}

/* ---------------------------------------------------------------- SwiGLU */

static void swiglu_case(int64_t T, int64_t F, int dt, int odt, int backward, int kind) {
  const int64_t ldx = 2 * F + (rnd() % 3 == 0 ? 5 : 0);
  buf x = fill_mat(T, ldx, dt, kind), dy = fill_mat(T, F, dt, rnd() % 3 ? V_NORMAL : V_SPECIAL);
  const int64_t oc = backward ? 2 * F : F;
  const size_t osz = (size_t)(T * oc) * (odt == XTE_DTYPE_FP32 ? 4 : 2) + 1;
  buf og(osz, 0xCD), ocp(osz, 0xCD);
  char d0[160];
  std::snprintf(d0, sizeof d0, "%s T=%lld F=%lld in %s out %s ld=%lld kind=%d",
                backward ? "dswiglu" : "swiglu", (long long)T, (long long)F,
                dt == XTE_DTYPE_FP32 ? "fp32" : "bf16", odt == XTE_DTYPE_FP32 ? "fp32" : "bf16",
                (long long)ldx, kind);
  const std::string d = d0;
  if (run_both(d, [&](xte_stream s) {
        xte_tensor tx = t2(x, dt, T, 2 * F, ldx), tdy = t2(dy, dt, T, F),
                   to = t2(s == cpu ? ocp : og, odt, T, oc);
        return backward ? xte_dswiglu(&tdy, &tx, &to, s) : xte_swiglu(&tx, &to, s);
      }))
    same("output", d, og, ocp);
}

struct qbuf {
  buf rq, cq, rs, cs, amax;
};

/* ldx: x's row stride (>= 2F; 0: 2F) */
static void fused_case(int64_t T, int64_t F, int dt, int act, int rec, int lay, int col,
                       int backward, int kind, int64_t ldx = 0) {
  if (ldx < 2 * F) ldx = 2 * F;
  buf x = fill_mat(T, ldx, dt, kind), dy = fill_mat(T, F, dt, rnd() % 3 ? V_NORMAL : V_SPECIAL);
  const int64_t M = T, K = backward ? 2 * F : F;
  int64_t rr = 0, rc = 0, cr = 0, cc = 0;
  xte_quantize_scale_shape(M, K, XTE_SCALING_BLOCK_1x128, (xte_recipe)rec, (xte_scale_layout)lay, 0,
                           &rr, &rc);
  xte_quantize_scale_shape(M, K, XTE_SCALING_BLOCK_1x128, (xte_recipe)rec, (xte_scale_layout)lay, 1,
                           &cr, &cc);
  auto make = [&](qbuf &b, xte_qtensor &q) {
    b.rq.assign((size_t)(M * K) + 1, 0xCD);
    b.cq.assign((size_t)(M * K) + 1, 0xCD);
    b.rs.assign((size_t)(rr * rc) * 4 + 1, 0xCD);
    b.cs.assign((size_t)(cr * cc) * 4 + 1, 0xCD);
    b.amax.assign(4, 0xCD);
    std::memset(&q, 0, sizeof q);
    q.scaling_mode = XTE_SCALING_BLOCK_1x128;
    q.recipe = (xte_recipe)rec;
    q.rowwise = xte_tensor_2d(b.rq.data(), XTE_DTYPE_E4M3, M, K);
    q.rowwise_scale_inv.data = b.rs.data();
    q.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
    q.rowwise_scale_inv.rows = rr;
    q.rowwise_scale_inv.cols = rc;
    q.rowwise_scale_inv.layout = (xte_scale_layout)lay;
    if (col) {
      q.columnwise = rec != XTE_RECIPE_MTFP8 ? xte_tensor_2d(b.cq.data(), XTE_DTYPE_E4M3, K, M)
                                             : xte_tensor_2d(b.cq.data(), XTE_DTYPE_E4M3, M, K);
      q.columnwise_scale_inv.data = b.cs.data();
      q.columnwise_scale_inv.dtype = XTE_DTYPE_FP32;
      q.columnwise_scale_inv.rows = cr;
      q.columnwise_scale_inv.cols = cc;
      q.columnwise_scale_inv.layout = (xte_scale_layout)lay;
    }
    q.amax = (float *)b.amax.data();
  };
  qbuf bg, bc;
  xte_qtensor qg, qc;
  make(bg, qg);
  make(bc, qc);
  char d0[200];
  std::snprintf(d0, sizeof d0,
                "%s T=%lld F=%lld ld=%lld in %s act %s recipe %d layout %d col %d kind=%d",
                backward ? "dswiglu_quantize" : "swiglu_quantize", (long long)T, (long long)F,
                (long long)ldx, dt == XTE_DTYPE_FP32 ? "fp32" : "bf16",
                act == XTE_DTYPE_FP32 ? "fp32" : "bf16", rec, lay, col, kind);
  const std::string d = d0;
  if (!run_both(d, [&](xte_stream s) {
        xte_tensor tx = t2(x, dt, T, 2 * F, ldx), tdy = t2(dy, dt, T, F);
        xte_quant_config cfg = xte_quant_config_default();
        xte_qtensor *q = s == cpu ? &qc : &qg;
        return backward ? xte_dswiglu_quantize(&tdy, &tx, (xte_dtype)act, q, &cfg, s)
                        : xte_swiglu_quantize(&tx, (xte_dtype)act, q, &cfg, s);
      }))
    return;
  same("rowwise", d, bg.rq, bc.rq);
  same("columnwise", d, bg.cq, bc.cq);
  same("rowwise_scale_inv", d, bg.rs, bc.rs);
  same("columnwise_scale_inv", d, bg.cs, bc.cs);
  same("amax", d, bg.amax, bc.amax);
}

static void swiglu_cases() {
  for (int64_t T : {0, 1, 3, 130})
    for (int64_t F : {0, 1, 7, 64, 129})
      for (int backward = 0; backward < 2; backward++)
        for (int dt : {XTE_DTYPE_FP32, XTE_DTYPE_BF16})
          for (int odt : {XTE_DTYPE_FP32, XTE_DTYPE_BF16}) {
            if (!keep()) continue;
            swiglu_case(T, F, dt, odt, backward, (int)(rnd() % V_KINDS));
          }
  const int recs[] = {XTE_RECIPE_TE_BLOCK, XTE_RECIPE_DEEPGEMM, XTE_RECIPE_DEEPGEMM_UE8M0,
                      XTE_RECIPE_MTFP8};
  /* F: odd, 16-byte multiples (bf16 and fp32 halves aligned: the 16-byte loads) and not (the
   * up half misaligned), one and two 64-column slabs, a half boundary inside a chunk (backward,
   * K = 2F); x's stride 2F, 2F + 8 (aligned) or 2F + 5 (every row misaligned). One keep() per
   * case: the default list thins the whole product evenly. */
  for (int64_t T : {0, 1, 130, 257})
    for (int64_t F : {1, 7, 100, 130, 192})
      for (int backward = 0; backward < 2; backward++)
        for (int ri = 0; ri < 4; ri++)
          for (int lay = 0; lay < 3; lay++) {
            if (!keep()) continue;
            const int64_t pad[3] = {0, 8, 5};
            fused_case(T, F, rnd() % 2 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16,
                       rnd() % 2 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16, recs[ri], lay, (int)(rnd() % 2),
                       backward, rnd() % 3 ? V_NORMAL : V_SPECIAL, 2 * F + pad[rnd() % 3]);
          }
}

/* ---------------------------------------------------------------- refusals */

/* Quantile Balancing: every output, the cutoff and the histogram (accumulated onto the same
 * starting counts on both sides), byte for byte. */
static void qb_case(int64_t T, int64_t E, int k, int64_t bins, int kind, float lower, float upper) {
  buf x = fill_mat(T, E, XTE_DTYPE_FP32, kind);
  buf bias = fill_f32(E, rnd() % 3 ? V_NORMAL : V_TIES);
  const size_t TE = (size_t)(T * E), nb8 = (size_t)((E + 7) / 8);
  buf pg(TE * 4 + 1, 0xCD), pc(pg), mg(TE + 1, 0xCD), mc(mg), bg((size_t)T * nb8 + 1, 0xCD), bc(bg),
      ig((size_t)(T * k) * 4 + 1, 0xCD), ic(ig), wg(ig), wc(ig), vg(pg), vc(pg),
      cg((size_t)T * 4 + 1, 0xCD), cc(cg), hg((size_t)(E * bins) * 4, 0), hc(hg);
  for (size_t i = 0; i < hg.size(); i += 4) hg[i] = hc[i] = (uint8_t)(i % 7);
  char d0[160];
  std::snprintf(d0, sizeof d0, "router_qb T=%lld E=%lld k=%d bins=%lld kind=%d [%g, %g]",
                (long long)T, (long long)E, k, (long long)bins, kind, (double)lower, (double)upper);
  const std::string d = d0;
  if (!run_both(d, [&](xte_stream s) {
        const bool c = s == cpu;
        xte_router_outputs out;
        std::memset(&out, 0, sizeof out);
        out.probs = t2(c ? pc : pg, XTE_DTYPE_FP32, T, E);
        out.routing_map = t2(c ? mc : mg, XTE_DTYPE_UINT8, T, E);
        out.routing_bits = t2(c ? bc : bg, XTE_DTYPE_UINT8, T, (int64_t)nb8);
        out.topk_idx = t2(c ? ic : ig, XTE_DTYPE_INT32, T, k);
        out.topk_weights = t2(c ? wc : wg, XTE_DTYPE_FP32, T, k);
        out.saved = t2(c ? vc : vg, XTE_DTYPE_FP32, T, E);
        xte_tensor tx = t2(x, XTE_DTYPE_FP32, T, E),
                   tb = xte_tensor_1d(bias.data(), XTE_DTYPE_FP32, E),
                   tc = xte_tensor_1d((c ? cc : cg).data(), XTE_DTYPE_FP32, T),
                   th = t2(c ? hc : hg, XTE_DTYPE_INT32, E, bins);
        return xte_router_qb_forward(&tx, &tb, k, 1.5f, lower, upper, &out, &tc, &th, s);
      }))
    return;
  same("probs", d, pg, pc);
  same("routing_map", d, mg, mc);
  same("routing_bits", d, bg, bc);
  same("topk_idx", d, ig, ic);
  same("topk_weights", d, wg, wc);
  same("saved", d, vg, vc);
  same("cutoff", d, cg, cc);
  same("histogram", d, hg, hc);
}

static void qb_cases() {
  qb_case(37, 64, 8, 100, V_NORMAL, -1.2f, 1.2f);
  qb_case(5, 896, 16, 1000, V_NORMAL, -1.2f, 1.2f);
  qb_case(9, 16, 2, 8, V_TIES, -0.05f, 0.05f);
  qb_case(7, 40, 1, 5, V_SPECIAL, -1.0f, 1.0f);
  qb_case(0, 8, 3, 4, V_NORMAL, -1.0f, 1.0f);
  qb_case(3, 1030, 100, 50, V_NORMAL, -0.5f, 0.7f);
  /* refusals: topk = E, bounds reversed or not finite */
  qb_case(2, 8, 8, 4, V_NORMAL, -1.0f, 1.0f);
  qb_case(2, 8, 2, 4, V_NORMAL, 1.0f, 1.0f);
  qb_case(2, 8, 2, 4, V_NORMAL, -1.0f, INFINITY);
}

static void refusal_cases() {
  /* an unsupported fused recipe and scaling mode: the same refusal from both */
  fused_case(3, 5, XTE_DTYPE_FP32, XTE_DTYPE_FP32, XTE_RECIPE_MX_TE, 0, 0, 0, V_NORMAL);
  fused_case(3, 5, XTE_DTYPE_FP32, XTE_DTYPE_FP32, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COUNT, 1,
             1, V_NORMAL);
}

int main(int argc, char **argv) {
  const simt_args args = simt_parse_args(argc, argv);
  if (args.bad) return 2;
  /* --full wins over --reduced */
  if (args.reduced) stride = 6;
  if (args.full) stride = 1;
  report_by_op = true;
  if (!simt_open("simt router", args.warp)) return 2;
  std::printf("simt router: CPU ISA %s, warp %d, %s list\n", simt_isa(), args.warp,
              stride == 1 ? "full" : (stride == 3 ? "default" : "reduced"));
  router_cases();
  aux_cases();
  qb_cases();
  swiglu_cases();
  refusal_cases();
  return simt_close("simt router");
}

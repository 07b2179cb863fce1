/* The CUDA MoE token-movement kernels (src/cuda/moe_kernels.cuh: permute, unpermute, permute
 * backward, unpermute backward, sort chunks and its backward, the dispatch layout), run on the host
 * by the SIMT runner (simt.h, through the stand-in plugin simt_plugin.cpp that libxte loads as its
 * CUDA backend), against the CPU backend, byte for byte: every output byte (outputs start as 0xCD
 * on both sides: padding rows, rows past R, every extra output), on empty, one-token, odd and
 * multi-block shapes; topk_idx (int32 / int64, with -1 slots) and routing-map routing (row_map
 * wider than needed); fp32 / bf16 / fp16 / e4m3 / e5m2 rows (fp8 with fp32 or e8m0 scale rows);
 * padded leading dimensions (aligned and unaligned rows: the 16-, 4- and 1-byte copy paths); caps
 * (none, 0, partial, past the total) and align padding; more output rows than R. Unpermute and both
 * backwards: fp32 / bf16 / fp16 in and out, probs dense / per slot / none, NaN / inf / subnormal
 * values, grad_probs. Bad inputs: an expert out of range, an expert twice, a map row with more
 * experts than row_map columns, a row_map entry out of range / on an empty slot / repeated, an
 * output with too few rows: the same status and message as the CPU, and every output byte
 * unchanged. Sort chunks: 1..64 chunks (empty ones too), any dtype, H = 0, int32 / int64 sizes,
 * padded input rows, with and without row_map; a negative size, sizes past the rows or short of
 * them, an index repeated or out of range; its backward with a good and a bad map. Dispatch layout:
 * every output subset, int32 / int64 indices with -1, 1..4 ranks, bad indices.
 *
 *   test_simt_moe [--reduced | --full] [--verbose]
 * default: the case list thinned (about a minute on 2 cores); --full: every case (~8 min);
 * --reduced: the ThreadSanitizer variant's shorter list; --verbose: every refusal, its message.
 * Exit status 1 on any mismatch, with one line per failing case. */
#include "simt.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define SIMT_TEST_SEED 0x2545F4914F6CDD1Dull
#include "simt_test_common.h"

/* reduced: the default list (about a minute on 2 cores); --full clears it (every case, ~8 min);
 * tiny: --reduced, the ThreadSanitizer variant's list (no 300-token routings) */
static int reduced = 1, tiny;

/* n elements of dtype dt with leading-dimension gaps filled too: values of every kind. */
static buf random_bytes(size_t n, int dt) {
  buf b(n + 1);
  const uint32_t specials[] = {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFA12345u,
                               0x00000001u, 0x80000000u, 0x00000000u, 0x7F7FFFFFu};
  if (dt == XTE_DTYPE_FP32) {
    for (size_t i = 0; i + 4 <= n; i += 4) {
      uint32_t v;
      if (rnd() % 13 == 0)
        v = specials[rnd() % 8];
      else {
        const uint32_t e = 110 + (uint32_t)(rnd() % 30);
        v = (uint32_t)(rnd() & 0x807FFFFFu) | (e << 23);
      }
      std::memcpy(&b[i], &v, 4);
    }
  } else if (dt == XTE_DTYPE_BF16) {
    for (size_t i = 0; i + 2 <= n; i += 2) {
      uint16_t v;
      if (rnd() % 13 == 0)
        v = (uint16_t)(specials[rnd() % 8] >> 16);
      else
        v = (uint16_t)(((rnd() & 0x807F)) | ((110 + rnd() % 30) << 7));
      std::memcpy(&b[i], &v, 2);
    }
  } else if (dt == XTE_DTYPE_FP16) {
    const uint16_t sp16[] = {0x7C00u, 0xFC00u, 0x7E00u, 0xFD23u,
                             0x0001u, 0x8000u, 0x0000u, 0x7BFFu};
    for (size_t i = 0; i + 2 <= n; i += 2) {
      uint16_t v;
      if (rnd() % 13 == 0)
        v = sp16[rnd() % 8];
      else
        v = (uint16_t)((rnd() & 0x83FF) | ((4 + rnd() % 24) << 10));
      std::memcpy(&b[i], &v, 2);
    }
  } else {
    for (size_t i = 0; i < n; i++) b[i] = (uint8_t)rnd();
  }
  return b;
}

/* ---------------------------------------------------------------- routings */

struct routing {
  int64_t T, E, K; /* K: row_map columns */
  int by_map, idx_dt;
  buf map, idx;
  xte_tensor tmap, tidx;
  xte_moe_routing r;
  void finish() {
    tmap = xte_tensor_2d(map.data(), XTE_DTYPE_UINT8, T, E);
    tidx = xte_tensor_2d(idx.data(), (xte_dtype)idx_dt, T, K);
    r.routing_map = by_map ? &tmap : nullptr;
    r.topk_idx = by_map ? nullptr : &tidx;
    r.num_experts = E;
  }
};

/* topk experts per token at most (some slots -1 with topk_idx; map rows with fewer), K row_map
 * columns (>= topk for a map). Skewed toward low experts so that caps bite unevenly. */
static routing make_routing(int64_t T, int64_t E, int64_t topk, int by_map, int idx_dt, int64_t K) {
  routing g;
  g.T = T;
  g.E = E;
  g.K = by_map ? K : topk;
  g.by_map = by_map;
  g.idx_dt = idx_dt;
  g.map.assign((size_t)(T * E) + 1, 0);
  g.idx.assign((size_t)(T * g.K) * esz(idx_dt) + 1, 0);
  for (int64_t t = 0; t < T; t++) {
    std::vector<int64_t> chosen;
    for (int64_t j = 0; j < topk; j++) {
      int64_t e = (int64_t)(rnd() % (uint64_t)E);
      if (rnd() % 3 == 0) e = e % ((E + 2) / 3);
      bool dup = false;
      for (int64_t c : chosen) dup |= c == e;
      if (dup || rnd() % 7 == 0) e = -1;
      chosen.push_back(e);
    }
    for (int64_t j = 0; j < topk; j++) {
      const int64_t e = chosen[(size_t)j];
      if (e >= 0) g.map[(size_t)(t * E + e)] = 1;
      if (!by_map) {
        if (idx_dt == XTE_DTYPE_INT32) {
          const int32_t v = (int32_t)e;
          std::memcpy(&g.idx[(size_t)(t * g.K + j) * 4], &v, 4);
        } else {
          std::memcpy(&g.idx[(size_t)(t * g.K + j) * 8], &e, 8);
        }
      }
    }
  }
  g.finish();
  return g;
}

/* ---------------------------------------------------------------- permute */

struct perm_out {
  buf out, out_s, row_map, offsets, tpe, r2e;
};

struct perm_case {
  int64_t H, ld_in, S, cap, align, extra_rows;
  int dt, sdt, tpe_dt, with_extra;
};

static xte_status run_permute(routing &g, const perm_case &pc, buf &in, buf &in_s, int64_t rows,
                              perm_out &o, xte_stream s) {
  const int fp8 = pc.dt == XTE_DTYPE_E4M3 || pc.dt == XTE_DTYPE_E5M2;
  xte_tensor ti = t2(in, pc.dt, g.T, pc.H, pc.ld_in);
  xte_tensor tis = t2(in_s, pc.sdt, g.T, pc.S, 0);
  xte_tensor to = t2(o.out, pc.dt, rows, pc.H, 0);
  xte_tensor tos = t2(o.out_s, pc.sdt, rows, pc.S, 0);
  xte_tensor trm = t2(o.row_map, XTE_DTYPE_INT32, g.T, g.K, 0);
  xte_permute_config cfg = xte_permute_config_default();
  cfg.num_out_tokens = pc.cap;
  cfg.align = pc.align;
  xte_permute_outputs ex;
  ex.expert_offsets = xte_tensor_1d(o.offsets.data(), XTE_DTYPE_INT64, g.E + 1);
  ex.tokens_per_expert = xte_tensor_1d(o.tpe.data(), (xte_dtype)pc.tpe_dt, g.E);
  ex.row_to_expert = xte_tensor_1d(o.r2e.data(), XTE_DTYPE_INT32, rows);
  return xte_moe_permute(&ti, fp8 ? &tis : nullptr, &g.r, &cfg, &to, fp8 ? &tos : nullptr, &trm,
                         pc.with_extra ? &ex : nullptr, s);
}

static perm_out fresh_perm(const routing &g, const perm_case &pc, int64_t rows) {
  perm_out o;
  o.out.assign((size_t)(rows * pc.H) * esz(pc.dt) + 1, 0xCD);
  o.out_s.assign((size_t)(rows * pc.S) * esz(pc.sdt) + 1, 0xCD);
  o.row_map.assign((size_t)(g.T * g.K) * 4 + 1, 0xCD);
  o.offsets.assign((size_t)(g.E + 1) * 8 + 1, 0xCD);
  o.tpe.assign((size_t)g.E * esz(pc.tpe_dt) + 1, 0xCD);
  o.r2e.assign((size_t)rows * 4 + 1, 0xCD);
  return o;
}

static void compare_perm(const std::string &d, const perm_out &og, const perm_out &oc) {
  same("output", d, og.out, oc.out);
  same("output_scales", d, og.out_s, oc.out_s);
  same("row_map", d, og.row_map, oc.row_map);
  same("expert_offsets", d, og.offsets, oc.offsets);
  same("tokens_per_expert", d, og.tpe, oc.tpe);
  same("row_to_expert", d, og.r2e, oc.r2e);
}

/* the unpermute family on the permute's result */
static void unpermute_cases(routing &g, const std::string &d0, const buf &row_map, int64_t rows);

static void permute_case(routing &g, const perm_case &pc, const std::string &d0) {
  const size_t es = esz(pc.dt);
  buf in = random_bytes((size_t)(g.T > 0 ? (g.T - 1) * pc.ld_in + pc.H : 0) * es, pc.dt);
  buf in_s = random_bytes((size_t)(g.T * pc.S) * esz(pc.sdt), pc.sdt);
  char dd[300];
  std::snprintf(dd, sizeof dd,
                "%s permute %s H=%lld ld=%lld S=%lld sdt=%s cap=%lld align=%lld +%lld", d0.c_str(),
                xte_dtype_name((xte_dtype)pc.dt), (long long)pc.H, (long long)pc.ld_in,
                (long long)pc.S, xte_dtype_name((xte_dtype)pc.sdt), (long long)pc.cap,
                (long long)pc.align, (long long)pc.extra_rows);
  const std::string d = dd;
  /* the rows: both backends' xte_moe_permute_rows */
  int64_t Rc = -1, Rg = -2;
  xte_permute_config cfg = xte_permute_config_default();
  cfg.num_out_tokens = pc.cap;
  cfg.align = pc.align;
  const xte_status rc = xte_moe_permute_rows(&g.r, &cfg, &Rc, cpu);
  const std::string mrc = rc ? xte_last_error() : "";
  const xte_status rg = xte_moe_permute_rows(&g.r, &cfg, &Rg, gpu);
  const std::string mrg = rg ? xte_last_error() : "";
  if (!both_status(d + " (rows)", rc, mrc, rg, mrg) || rc != XTE_SUCCESS) return;
  if (Rc != Rg) {
    report(d, "permute_rows differ");
    return;
  }
  const int64_t rows = Rc + pc.extra_rows;
  perm_out oc = fresh_perm(g, pc, rows), og = fresh_perm(g, pc, rows);
  const xte_status sc = run_permute(g, pc, in, in_s, rows, oc, cpu);
  const std::string mc = sc ? xte_last_error() : "";
  const xte_status sg = run_permute(g, pc, in, in_s, rows, og, gpu);
  const std::string mg = sg ? xte_last_error() : "";
  if (!both_status(d, sc, mc, sg, mg)) return;
  compare_perm(d, og, oc);
  /* too few output rows: refused alike, nothing written */
  if (Rc > 0 && pc.extra_rows == 0 && pc.dt == XTE_DTYPE_BF16) {
    perm_out oc2 = fresh_perm(g, pc, Rc - 1), og2 = fresh_perm(g, pc, Rc - 1);
    const perm_out blank = fresh_perm(g, pc, Rc - 1);
    const xte_status sc2 = run_permute(g, pc, in, in_s, Rc - 1, oc2, cpu);
    const std::string mc2 = sc2 ? xte_last_error() : "";
    const xte_status sg2 = run_permute(g, pc, in, in_s, Rc - 1, og2, gpu);
    const std::string mg2 = sg2 ? xte_last_error() : "";
    both_status(d + " (rows - 1)", sc2, mc2, sg2, mg2);
    compare_perm(d + " (rows - 1, untouched)", og2, blank);
  }
  if (sc == XTE_SUCCESS && (pc.dt == XTE_DTYPE_FP32) && pc.extra_rows == 0)
    unpermute_cases(g, d0, oc.row_map, rows);
}

/* ---------------------------------------------------------------- unpermute family */

static void unpermute_one(routing &g, const std::string &d, const buf &row_map, int64_t rows,
                          int64_t H, int in_dt, int out_dt, int probs_kind, int ld_pad,
                          bool expect_ok_untouched_check) {
  const int64_t ldi = H + ld_pad;
  const int64_t pc = probs_kind == 2 ? g.E : g.K;
  buf rm = row_map;
  xte_tensor trm = t2(rm, XTE_DTYPE_INT32, g.T, g.K, 0);
  buf in = random_bytes((size_t)(rows > 0 ? (rows - 1) * ldi + H : 0) * esz(in_dt), in_dt);
  buf probs = random_bytes((size_t)(g.T * pc) * 4, XTE_DTYPE_FP32);
  xte_tensor tin = t2(in, in_dt, rows, H, ldi);
  xte_tensor tp = t2(probs, XTE_DTYPE_FP32, g.T, pc, 0);
  const xte_tensor *pp = probs_kind ? &tp : nullptr;
  char dd[400];
  std::snprintf(dd, sizeof dd, "%s in=%s out=%s H=%lld pad=%d probs=%d", d.c_str(),
                xte_dtype_name((xte_dtype)in_dt), xte_dtype_name((xte_dtype)out_dt), (long long)H,
                ld_pad, probs_kind);
  const std::string ds = dd;
  /* forward and permute backward */
  for (int bw = 0; bw < 2; bw++) {
    if (bw && probs_kind) continue;
    buf oc((size_t)(g.T * H) * esz(out_dt) + 1, 0xCD), og = oc;
    const buf blank = oc;
    xte_tensor toc = t2(oc, out_dt, g.T, H, 0), tog = t2(og, out_dt, g.T, H, 0);
    const xte_status sc = bw ? xte_moe_permute_backward(&tin, &g.r, &trm, &toc, cpu)
                             : xte_moe_unpermute(&tin, &g.r, &trm, pp, &toc, cpu);
    const std::string mc = sc ? xte_last_error() : "";
    const xte_status sg = bw ? xte_moe_permute_backward(&tin, &g.r, &trm, &tog, gpu)
                             : xte_moe_unpermute(&tin, &g.r, &trm, pp, &tog, gpu);
    const std::string mg = sg ? xte_last_error() : "";
    const std::string dw = ds + (bw ? " permute_backward" : " unpermute");
    if (!both_status(dw, sc, mc, sg, mg)) continue;
    same("out", dw, og, oc);
    if (sg != XTE_SUCCESS || expect_ok_untouched_check) same("out untouched", dw, og, blank);
  }
  /* unpermute backward (grad_probs with probs) */
  {
    buf go = random_bytes((size_t)(g.T * H) * esz(out_dt), out_dt);
    xte_tensor tgo = t2(go, out_dt, g.T, H, 0);
    buf gic((size_t)(rows * H) * esz(in_dt) + 1, 0xCD), gig = gic;
    buf gpc((size_t)(g.T * pc) * 4 + 1, 0xCD), gpg = gpc;
    const buf blank_i = gic, blank_p = gpc;
    buf fin = random_bytes((size_t)(rows * H) * esz(in_dt), in_dt);
    xte_tensor tfin = t2(fin, in_dt, rows, H, 0);
    xte_tensor tgic = t2(gic, in_dt, rows, H, 0), tgig = t2(gig, in_dt, rows, H, 0);
    xte_tensor tgpc = t2(gpc, XTE_DTYPE_FP32, g.T, pc, 0),
               tgpg = t2(gpg, XTE_DTYPE_FP32, g.T, pc, 0);
    const xte_status sc = xte_moe_unpermute_backward(&tgo, &tfin, &g.r, &trm, pp, &tgic,
                                                     probs_kind ? &tgpc : nullptr, cpu);
    const std::string mc = sc ? xte_last_error() : "";
    const xte_status sg = xte_moe_unpermute_backward(&tgo, &tfin, &g.r, &trm, pp, &tgig,
                                                     probs_kind ? &tgpg : nullptr, gpu);
    const std::string mg = sg ? xte_last_error() : "";
    const std::string dw = ds + " unpermute_backward";
    if (both_status(dw, sc, mc, sg, mg)) {
      same("grad_input", dw, gig, gic);
      same("grad_probs", dw, gpg, gpc);
      if (sg != XTE_SUCCESS || expect_ok_untouched_check) {
        same("grad_input untouched", dw, gig, blank_i);
        same("grad_probs untouched", dw, gpg, blank_p);
      }
    }
  }
}

static void unpermute_cases(routing &g, const std::string &d0, const buf &row_map, int64_t rows) {
  const int64_t Hs[] = {1, 5, 64, 131};
  int n = 0;
  for (int64_t H : Hs)
    for (int in_dt : {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16})
      for (int out_dt : {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16})
        for (int probs_kind = 0; probs_kind < 3; probs_kind++) {
          if (probs_kind == 2 && !g.by_map) continue;
          if (probs_kind == 1 && g.by_map) continue;
          if ((n++ + (int)H) % (reduced ? 7 : 2)) continue;
          unpermute_one(g, d0, row_map, rows, H, in_dt, out_dt, probs_kind, (int)(H % 3), false);
        }
  /* bad row maps (routing valid): each refused alike, nothing written */
  if (g.T > 0 && g.K > 0) {
    const int32_t *rm = (const int32_t *)row_map.data();
    int64_t p_used = -1, p_empty = -1;
    for (int64_t p = 0; p < g.T * g.K; p++) {
      if (rm[p] >= 0 && p_used < 0) p_used = p;
      if (rm[p] < 0 && p_empty < 0) p_empty = p;
    }
    for (int kind = 0; kind < 4; kind++) {
      buf bad = row_map;
      int32_t *b = (int32_t *)bad.data();
      const int64_t last = g.T * g.K - 1;
      if (kind == 0) b[last] = (int32_t)rows; /* out of range */
      if (kind == 1) b[last] = -2;
      if (kind == 2) { /* a repeated row, later than its first use */
        if (p_used < 0 || p_used == last) continue;
        b[last] = rm[p_used];
      }
      if (kind == 3) { /* a row on a slot without an expert (or an out-of-range one) */
        if (p_empty < 0) continue;
        b[p_empty] = rows > 0 ? 0 : 5;
      }
      char dd[200];
      std::snprintf(dd, sizeof dd, "%s bad row_map kind %d", d0.c_str(), kind);
      unpermute_one(g, dd, bad, rows, 3, XTE_DTYPE_BF16, XTE_DTYPE_FP32, g.by_map ? 2 : 1, 0,
                    false);
    }
  }
}

/* ---------------------------------------------------------------- bad routings */

static void bad_routing_cases() {
  for (int by_map = 0; by_map < 2; by_map++)
    for (int kind = 0; kind < 3; kind++) {
      if (by_map && kind) continue;
      const int idx_dt = kind == 2 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
      routing g = make_routing(9, 6, 3, by_map, idx_dt, 3);
      if (by_map) { /* token 4 gets 4 experts with 3 row_map columns; token 7 too */
        for (int e = 0; e < 4; e++) g.map[(size_t)(4 * 6 + e)] = 1;
        for (int e = 0; e < 5; e++) g.map[(size_t)(7 * 6 + e)] = 1;
      } else {
        auto put = [&](int64_t t, int64_t j, int64_t v) {
          if (idx_dt == XTE_DTYPE_INT32) {
            const int32_t v32 = (int32_t)v;
            std::memcpy(&g.idx[(size_t)(t * 3 + j) * 4], &v32, 4);
          } else {
            std::memcpy(&g.idx[(size_t)(t * 3 + j) * 8], &v, 8);
          }
        };
        if (kind == 0) {
          put(5, 2, 6);  /* out of range */
          put(8, 0, -2); /* later: not the one reported */
        } else if (kind == 1) {
          put(3, 0, 2); /* expert 2 twice in token 3 */
          put(3, 1, -1);
          put(3, 2, 2);
          put(6, 0, 9);
        } else {
          put(2, 1, -5);
          put(2, 2, 1);
          put(2, 0, 1);
        }
      }
      g.finish();
      char d[80];
      std::snprintf(d, sizeof d, "bad routing map=%d kind=%d", by_map, kind);
      perm_case pc{8, 8, 0, -1, 1, 0, XTE_DTYPE_BF16, XTE_DTYPE_FP32, XTE_DTYPE_INT32, 1};
      const int64_t rows = 40;
      buf in = random_bytes((size_t)(g.T * pc.H) * 2, XTE_DTYPE_BF16), in_s;
      perm_out oc = fresh_perm(g, pc, rows), og = fresh_perm(g, pc, rows);
      const perm_out blank = fresh_perm(g, pc, rows);
      const xte_status sc = run_permute(g, pc, in, in_s, rows, oc, cpu);
      const std::string mc = sc ? xte_last_error() : "";
      const xte_status sg = run_permute(g, pc, in, in_s, rows, og, gpu);
      const std::string mg = sg ? xte_last_error() : "";
      both_status(std::string(d) + " permute", sc, mc, sg, mg);
      if (sc == XTE_SUCCESS) report(d, "the CPU accepted a bad routing (test bug)");
      compare_perm(std::string(d) + " permute (untouched)", og, blank);
      /* the unpermute family: the routing is checked before the row map */
      buf rm((size_t)(g.T * g.K) * 4 + 1, 0xFF);
      unpermute_one(g, std::string(d), rm, rows, 4, XTE_DTYPE_FP32, XTE_DTYPE_BF16, 0, 0, false);
    }
}

/* ---------------------------------------------------------------- sort chunks, dispatch layout */

static void put_vec(buf &b, int dt, int64_t i, int64_t v) {
  if (dt == XTE_DTYPE_INT32) {
    const int32_t v32 = (int32_t)v;
    std::memcpy(&b[(size_t)i * 4], &v32, 4);
  } else {
    std::memcpy(&b[(size_t)i * 8], &v, 8);
  }
}

/* kind: 0 valid, 1 a negative size, 2 sizes past R, 3 an index repeated, 4 an index out of
 * range, 5 a sum short of R */
static void sort_chunks_case(int64_t n, int64_t H, int dt, int vdt, int kind, int with_map,
                             int64_t ld_pad) {
  std::vector<int64_t> split((size_t)n), perm((size_t)n);
  int64_t R = 0;
  for (int64_t i = 0; i < n; i++) {
    split[(size_t)i] = (int64_t)(rnd() % 5);
    if (rnd() % 4 == 0) split[(size_t)i] = 0;
    R += split[(size_t)i];
    perm[(size_t)i] = i;
  }
  for (int64_t i = n - 1; i > 0; i--)
    std::swap(perm[(size_t)i], perm[(size_t)(rnd() % (uint64_t)(i + 1))]);
  if (kind == 1 && n > 1) {
    split[(size_t)(n / 2)] = -1;
    split[(size_t)(n - 1)] += 1;
  }
  if (kind == 2) split[(size_t)(n - 1)] += 7;
  if (kind == 3 && n > 1) perm[(size_t)(n - 1)] = perm[0];
  if (kind == 4) perm[(size_t)(n / 2)] = n;
  if (kind == 5 && n > 0)
    split[(size_t)(n - 1)] = split[(size_t)(n - 1)] > 0 ? split[(size_t)(n - 1)] - 1 : 0;
  if (kind == 5 && R == 0) return;
  buf sb((size_t)n * 8 + 1), ib((size_t)n * 8 + 1);
  for (int64_t i = 0; i < n; i++) {
    put_vec(sb, vdt, i, split[(size_t)i]);
    put_vec(ib, vdt, i, perm[(size_t)i]);
  }
  const int64_t ld = H + ld_pad;
  const size_t es = esz(dt);
  buf in = random_bytes((size_t)(R > 0 ? (R - 1) * ld + H : 0) * es, dt);
  xte_tensor ti = t2(in, dt, R, H, ld);
  xte_tensor ts = xte_tensor_1d(sb.data(), (xte_dtype)vdt, n);
  xte_tensor tx = xte_tensor_1d(ib.data(), (xte_dtype)vdt, n);
  buf oc((size_t)(R * H) * es + 1, 0xCD), og = oc, mc_((size_t)R * 4 + 1, 0xCD), mg_ = mc_;
  const buf blank_o = oc, blank_m = mc_;
  xte_tensor toc = t2(oc, dt, R, H, 0), tog = t2(og, dt, R, H, 0);
  xte_tensor tmc = xte_tensor_1d(mc_.data(), XTE_DTYPE_INT32, R);
  xte_tensor tmg = xte_tensor_1d(mg_.data(), XTE_DTYPE_INT32, R);
  char d[200];
  std::snprintf(d, sizeof d, "sort_chunks n=%lld R=%lld H=%lld %s %s kind=%d map=%d pad=%lld",
                (long long)n, (long long)R, (long long)H, xte_dtype_name((xte_dtype)dt),
                xte_dtype_name((xte_dtype)vdt), kind, with_map, (long long)ld_pad);
  const xte_status sc =
      xte_moe_sort_chunks_by_index(&ti, &ts, &tx, &toc, with_map ? &tmc : nullptr, cpu);
  const std::string m1 = sc ? xte_last_error() : "";
  const xte_status sg =
      xte_moe_sort_chunks_by_index(&ti, &ts, &tx, &tog, with_map ? &tmg : nullptr, gpu);
  const std::string m2 = sg ? xte_last_error() : "";
  if (!both_status(d, sc, m1, sg, m2)) return;
  same("output", d, og, oc);
  same("row_map", d, mg_, mc_);
  if (sg != XTE_SUCCESS) {
    same("output untouched", d, og, blank_o);
    same("row_map untouched", d, mg_, blank_m);
    return;
  }
  if (!with_map) return;
  /* the backward with that map, and with a bad map */
  for (int bad = 0; bad < 3; bad++) {
    if (bad && R == 0) continue;
    buf m = mc_;
    if (bad) {
      const int32_t v = bad == 1 ? (int32_t)R : -1;
      std::memcpy(&m[(size_t)((R - 1) / 2) * 4], &v, 4);
      std::memcpy(&m[(size_t)(R - 1) * 4], &v, 4);
    }
    xte_tensor tm = xte_tensor_1d(m.data(), XTE_DTYPE_INT32, R);
    buf bc((size_t)(R * H) * es + 1, 0xCD), bg = bc;
    const buf blank = bc;
    xte_tensor tbc = t2(bc, dt, R, H, 0), tbg = t2(bg, dt, R, H, 0);
    xte_tensor tgo = t2(oc, dt, R, H, 0);
    const xte_status c2 = xte_moe_sort_chunks_backward(&tgo, &tm, &tbc, cpu);
    const std::string n1 = c2 ? xte_last_error() : "";
    const xte_status g2 = xte_moe_sort_chunks_backward(&tgo, &tm, &tbg, gpu);
    const std::string n2 = g2 ? xte_last_error() : "";
    const std::string db = std::string(d) + (bad ? " backward (bad map)" : " backward");
    if (!both_status(db, c2, n1, g2, n2)) continue;
    same("grad_input", db, bg, bc);
    if (g2 != XTE_SUCCESS) same("grad_input untouched", db, bg, blank);
  }
}

static void dispatch_case(int64_t T, int64_t E, int64_t K, int ranks, int vdt, int bad, int outs) {
  buf idx((size_t)(T * K) * 8 + 1);
  for (int64_t t = 0; t < T; t++)
    for (int64_t j = 0; j < K; j++) {
      int64_t v = (int64_t)(rnd() % (uint64_t)(E + 1)) - 1;
      put_vec(idx, vdt, t * K + j, v);
    }
  if (bad && T * K > 0) {
    put_vec(idx, vdt, (T * K) / 2, bad == 1 ? E : -2);
    put_vec(idx, vdt, T * K - 1, E + 3);
  }
  xte_tensor ti = xte_tensor_2d(idx.data(), (xte_dtype)vdt, T, K);
  buf pc((size_t)ranks * 4 + 1, 0xCD), pg = pc, ec((size_t)E * 4 + 1, 0xCD), eg = ec;
  buf rc_((size_t)(T * ranks) + 1, 0xCD), rg_ = rc_;
  const buf bp = pc, be = ec, br = rc_;
  xte_tensor tpc = xte_tensor_1d(pc.data(), XTE_DTYPE_INT32, ranks);
  xte_tensor tpg = xte_tensor_1d(pg.data(), XTE_DTYPE_INT32, ranks);
  xte_tensor tec = xte_tensor_1d(ec.data(), XTE_DTYPE_INT32, E);
  xte_tensor teg = xte_tensor_1d(eg.data(), XTE_DTYPE_INT32, E);
  xte_tensor trc = xte_tensor_2d(rc_.data(), XTE_DTYPE_UINT8, T, ranks);
  xte_tensor trg = xte_tensor_2d(rg_.data(), XTE_DTYPE_UINT8, T, ranks);
  char d[160];
  std::snprintf(d, sizeof d, "dispatch_layout T=%lld E=%lld K=%lld ranks=%d %s bad=%d outs=%d",
                (long long)T, (long long)E, (long long)K, ranks, xte_dtype_name((xte_dtype)vdt),
                bad, outs);
  const xte_status sc =
      xte_moe_dispatch_layout(&ti, E, ranks, (outs & 1) ? &tpc : nullptr,
                              (outs & 2) ? &tec : nullptr, (outs & 4) ? &trc : nullptr, cpu);
  const std::string m1 = sc ? xte_last_error() : "";
  const xte_status sg =
      xte_moe_dispatch_layout(&ti, E, ranks, (outs & 1) ? &tpg : nullptr,
                              (outs & 2) ? &teg : nullptr, (outs & 4) ? &trg : nullptr, gpu);
  const std::string m2 = sg ? xte_last_error() : "";
  if (!both_status(d, sc, m1, sg, m2)) return;
  same("tokens_per_rank", d, pg, pc);
  same("tokens_per_expert", d, eg, ec);
  same("is_token_in_rank", d, rg_, rc_);
  if (sg != XTE_SUCCESS) {
    same("tokens_per_rank untouched", d, pg, bp);
    same("tokens_per_expert untouched", d, eg, be);
    same("is_token_in_rank untouched", d, rg_, br);
  }
}

static void chunk_and_dispatch_cases() {
  int n = 0;
  for (int64_t nc : {1, 2, 7, 64})
    for (int64_t H : {0, 1, 3, 8, 33})
      for (int dt : {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_E4M3, XTE_DTYPE_INT64})
        for (int kind = 0; kind < 6; kind++) {
          n++;
          if (kind && (n % (reduced ? 5 : 2))) continue;
          if (!kind && reduced && (n / 6) % 2) continue; /* n = 6 i + 1 at kind 0 */
          sort_chunks_case(nc, H, dt, n % 2 ? XTE_DTYPE_INT64 : XTE_DTYPE_INT32, kind,
                           kind == 0 ? (n % 3 != 0) : (n % 2), (n % 3 == 1) ? 5 : 0);
        }
  for (int64_t T : {0, 1, 9, 300})
    for (int64_t E : {1, 8, 36})
      for (int ranks : {1, 2, 4})
        for (int64_t K : {1, 3, 8}) {
          if (E % ranks) continue;
          n++;
          if (reduced && n % 3) continue;
          dispatch_case(T, E, K, ranks, n % 2 ? XTE_DTYPE_INT64 : XTE_DTYPE_INT32, 0,
                        n % 7 == 0 ? 5 : 7);
          if (n % 4 == 0) dispatch_case(T, E, K, ranks, XTE_DTYPE_INT32, 1 + (n % 8 == 0), 7);
        }
}

/* ---------------------------------------------------------------- the case list */

static void permute_cases() {
  const int64_t Ts[] = {0, 1, 7, 33, 300};
  const int64_t Es[] = {1, 5, 16, 37};
  int n = 0;
  for (int64_t T : Ts)
    for (int64_t E : Es)
      for (int by_map = 0; by_map < 2; by_map++)
        for (int64_t topk : {1, 2, 4}) {
          if (topk > E) continue;
          if (T == 300 && (E == 1 || topk == 2 || tiny)) continue;
          const int idx_dt = (n & 1) ? XTE_DTYPE_INT64 : XTE_DTYPE_INT32;
          const int64_t K = by_map ? topk + (n % 3) : topk;
          routing g = make_routing(T, E, topk, by_map, idx_dt, K);
          char d0[120];
          std::snprintf(d0, sizeof d0, "T=%lld E=%lld topk=%lld %s K=%lld", (long long)T,
                        (long long)E, (long long)topk,
                        by_map ? "map" : (idx_dt == XTE_DTYPE_INT32 ? "idx32" : "idx64"),
                        (long long)K);
          const int64_t total = T * topk;
          const int64_t caps[] = {-1, 0, total / 3, total + 5};
          const int dts[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_E4M3, XTE_DTYPE_E5M2,
                             XTE_DTYPE_FP16};
          for (int di = 0; di < 5; di++)
            for (int ci = 0; ci < 4; ci++)
              for (int64_t align : {1, 4, 16}) {
                n++;
                if (di != 0 && (n % (reduced ? 9 : 3))) continue;
                if (di == 0 && ci != 0 && (n % (reduced ? 4 : 1))) continue;
                const int dt = dts[di];
                const int fp8 = dt == XTE_DTYPE_E4M3 || dt == XTE_DTYPE_E5M2;
                static const int64_t Hs[4] = {16, 3, 130, 64}, pads[4] = {0, 16, 1, 0};
                const int64_t H = Hs[(n + di) % 4];
                const int64_t ld = H + pads[n % 4];
                perm_case pc;
                pc.H = H;
                pc.ld_in = ld;
                pc.S = fp8 ? (H + 127) / 128 + (n % 2) : 0;
                pc.cap = caps[ci];
                pc.align = align;
                pc.extra_rows = (n % 5 == 0) ? 3 : 0;
                pc.dt = dt;
                pc.sdt = fp8 && (n % 2) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
                pc.tpe_dt = n % 2 ? XTE_DTYPE_INT64 : XTE_DTYPE_INT32;
                pc.with_extra = n % 7 != 3;
                permute_case(g, pc, d0);
              }
        }
}

/* An input of 2^31 empty rows ([2^31, 0]) under a row map spread over all of them: the row map
 * checks' table grows with the T K slots, not with the rows (the CUDA unpermute once asked for
 * rows x 8 bytes, 16 GiB, here and failed where the CPU succeeds). A valid map, then a repeated
 * row and a row past the input: the CPU's status, message and bytes. */
static void huge_rows_cases() {
  const int64_t rows = (int64_t)1 << 31;
  routing g = make_routing(9, 6, 3, 0, XTE_DTYPE_INT32, 3);
  buf rm((size_t)(g.T * g.K) * 4 + 1, 0);
  int32_t *r = (int32_t *)rm.data();
  const int32_t *idx = (const int32_t *)g.idx.data();
  int64_t p0 = -1, p1 = -1;
  for (int64_t p = 0; p < g.T * g.K; p++) {
    r[p] = idx[p] >= 0 ? (int32_t)(rows - 1 - p * 104729) : -1;
    if (idx[p] >= 0) {
      if (p0 < 0) p0 = p;
      p1 = p;
    }
  }
  unpermute_one(g, "rows 2^31 x 0, valid map", rm, rows, 0, XTE_DTYPE_FP32, XTE_DTYPE_FP32, 1, 0,
                false);
  if (p0 >= 0 && p1 > p0) {
    buf bad = rm;
    ((int32_t *)bad.data())[p1] = r[p0];
    unpermute_one(g, "rows 2^31 x 0, repeated row", bad, rows, 0, XTE_DTYPE_BF16, XTE_DTYPE_FP32, 1,
                  0, false);
    ((int32_t *)bad.data())[p1] = 0; /* row 0, used by no other slot: valid again */
    unpermute_one(g, "rows 2^31 x 0, row 0", bad, rows, 0, XTE_DTYPE_FP32, XTE_DTYPE_BF16, 0, 0,
                  false);
  }
}

int main(int argc, char **argv) {
  const simt_args args = simt_parse_args(argc, argv);
  tiny = args.reduced;
  if (args.full) reduced = 0;
  if (!simt_open("simt moe", 0)) return 2;
  std::printf("simt moe: CPU ISA %s, %s list\n", simt_isa(),
              tiny ? "reduced" : (reduced ? "default" : "full"));
  bad_routing_cases();
  chunk_and_dispatch_cases();
  permute_cases();
  huge_rows_cases();
  return simt_close("simt moe");
}

/* The CUDA exact-attention kernels (src/cuda/attention_kernels.cuh: the forward, the two-pass
 * backward, the cu_seqlens check and the padding), run on the host by the SIMT runner (simt.h,
 * through the stand-in plugin simt_plugin.cpp that libxte loads as its CUDA backend), against the
 * CPU backend, byte for byte: O and LSE of the forward, dQ, dK, dV of the backward (every output
 * starts as 0xCD on both sides, so a byte one side leaves unwritten shows). The backward takes the
 * CPU forward's O and LSE on both sides.
 *
 * Cases: fp32 / bf16 / fp16 (forward and backward) and e4m3 (forward; O fp32 / bf16 / fp16,
 * with and without descale factors); BSHD, SBHD (with and without cu_seqlens padding) and THD
 * varlen (empty sequences, tokens before the first and past the last sequence); no mask, causal
 * top-left and bottom-right, sliding windows (rows that see no key), softcap, ALiBi, GQA / MQA,
 * MLA head dims (d_qk != d_v), odd lengths (1, 63, 65, 130: partial 64-key blocks and 64-row
 * query tiles), q longer and shorter than kv; values with NaN / inf / subnormals and huge logits.
 * Bad cu_seqlens (negative start, decreasing, a length past the max, past the tensor): the same
 * status and message as the CPU, and no output byte written. Every case runs with the runner's
 * warp size 32 and 128 (SIMT_WARP_SIZE, read by the plugin): the kernels must not depend on it.
 *
 *   test_simt_attention [--reduced | --full] [--verbose]
 * default: about 30 s on 2 cores; --full: more random cases and larger shapes; --reduced: the
 * sanitized builds' shorter list. Exit status 1 on any mismatch, one line per failing case. */
#include "simt.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "simt_test_common.h"

/* full: --full (more random cases, larger shapes); tiny: --reduced (no random cases) */
static int full, tiny;

static float unif() { /* [-1, 1) */
  return (float)((double)(rnd() >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* specials: 0 none, 1 a few NaN / inf / subnormal / huge values */
static buf random_values(size_t n, int dt, float amp, int specials) {
  buf b(n * esz(dt) + 1);
  for (size_t i = 0; i < n; i++) {
    float f = unif() * amp;
    uint32_t u;
    if (specials && rnd() % 97 == 0) {
      const uint32_t sp[] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x00000003u,
                             0x80000000u, 0x7F7FFFFFu, 0xFFA12345u, 0x42F00000u};
      u = sp[rnd() % 8];
      std::memcpy(&f, &u, 4);
    }
    std::memcpy(&u, &f, 4);
    if (dt == XTE_DTYPE_FP32) {
      std::memcpy(&b[i * 4], &u, 4);
    } else if (dt == XTE_DTYPE_BF16) {
      const uint16_t h = (uint16_t)(u >> 16);
      std::memcpy(&b[i * 2], &h, 2);
    } else if (dt == XTE_DTYPE_FP16) {
      /* fp16 bits: sign, exponent 10..17 (values ~2^-5..2^2), specials sometimes */
      uint16_t h = (uint16_t)(((rnd() & 1) << 15) | ((10 + rnd() % 8) << 10) | (rnd() & 0x3FF));
      if (amp > 4.0f) h = (uint16_t)(h + (6u << 10)); /* larger */
      if (specials && rnd() % 97 == 0) {
        const uint16_t sp[] = {0x7E00, 0x7C00, 0xFC00, 0x0001, 0x8000, 0x7BFF};
        h = sp[rnd() % 6];
      }
      std::memcpy(&b[i * 2], &h, 2);
    } else { /* e4m3: any code but NaN unless specials */
      uint8_t c = (uint8_t)rnd();
      if (!specials && (c & 0x7F) == 0x7F) c = (uint8_t)(c - 1);
      b[i] = c;
    }
  }
  return b;
}

struct acase {
  int layout = XTE_ATTN_LAYOUT_BSHD, mask = 0, dt = XTE_DTYPE_FP32, odt = XTE_DTYPE_FP32;
  int64_t wl = -1, wr = -1;
  float softcap = 0, scale = 0;
  int alibi = 0, descale = 0, specials = 0, bwd = 1;
  int64_t batch = 1, sq = 1, skv = 1, hq = 1, hkv = 1, dqk = 16, dv = 16;
  int pad = 0;                       /* BSHD / SBHD: cu_seqlens padding */
  std::vector<int32_t> cuq, cukv;    /* THD (or padding) */
  int64_t total_q = 0, total_kv = 0; /* THD */
  float amp = 2.0f;
  int bad = 0; /* 1..4: bad cu_seqlens kinds */
  std::string desc() const {
    char s[300];
    std::snprintf(s, sizeof s,
                  "layout %d mask %d dt %s->%s w[%lld,%lld] cap %g alibi %d desc %d sp %d b %lld "
                  "sq %lld skv %lld h %lld/%lld d %lld/%lld pad %d amp %g bad %d",
                  layout, mask, xte_dtype_name((xte_dtype)dt), xte_dtype_name((xte_dtype)odt),
                  (long long)wl, (long long)wr, (double)softcap, alibi, descale, specials,
                  (long long)batch, (long long)sq, (long long)skv, (long long)hq, (long long)hkv,
                  (long long)dqk, (long long)dv, pad, (double)amp, bad);
    return s;
  }
};

static xte_tensor tens(void *p, int dt, int layout, int64_t b, int64_t s, int64_t h, int64_t d) {
  xte_tensor t = xte_tensor_2d(p, (xte_dtype)dt, 1, 1);
  if (layout == XTE_ATTN_LAYOUT_THD) {
    t.rank = 3;
    t.shape[0] = s;
    t.shape[1] = h;
    t.shape[2] = d;
  } else {
    t.rank = 4;
    t.shape[0] = layout == XTE_ATTN_LAYOUT_BSHD ? b : s;
    t.shape[1] = layout == XTE_ATTN_LAYOUT_BSHD ? s : b;
    t.shape[2] = h;
    t.shape[3] = d;
  }
  return t;
}

static std::vector<int32_t> make_cu(int64_t batch, int64_t maxlen, int64_t start) {
  std::vector<int32_t> cu((size_t)batch + 1);
  cu[0] = (int32_t)start;
  for (int64_t i = 0; i < batch; i++) {
    int64_t len = (int64_t)(rnd() % (uint64_t)(maxlen + 1));
    if (rnd() % 4 == 0) len = maxlen;
    cu[(size_t)i + 1] = (int32_t)(cu[(size_t)i] + len);
  }
  return cu;
}

static void set_ws(int ws) {
  char s[8];
  std::snprintf(s, sizeof s, "%d", ws);
  setenv("SIMT_WARP_SIZE", s, 1);
}

static void run_case(acase c) {
  const int thd = c.layout == XTE_ATTN_LAYOUT_THD;
  if (thd && c.cuq.empty()) {
    c.cuq = make_cu(c.batch, c.sq, rnd() % 3);
    c.cukv = make_cu(c.batch, c.skv, rnd() % 3);
    c.total_q = c.cuq.back() + (int64_t)(rnd() % 3);
    c.total_kv = c.cukv.back() + (int64_t)(rnd() % 3);
  } else if (!thd && c.pad && c.cuq.empty()) {
    c.cuq = make_cu(c.batch, c.sq, 0);
    c.cukv = make_cu(c.batch, c.skv, 0);
  }
  if (c.bad) {
    std::vector<int32_t> &cu = (c.bad & 1) ? c.cuq : c.cukv;
    if (c.bad <= 2 && c.batch >= 2)
      cu[1] = cu[2] + 1; /* decreasing */
    else if (c.bad <= 2)
      cu[0] = -1;
    else
      cu[cu.size() - 1] += 1000; /* past the max / the tensor */
  }
  const int64_t B = thd ? 1 : c.batch;
  const int64_t Sq = thd ? c.total_q : c.sq, Skv = thd ? c.total_kv : c.skv;
  const int64_t nq = B * Sq * c.hq, nkv = B * Skv * c.hkv;
  buf q = random_values((size_t)(nq * c.dqk), c.dt, c.amp, c.specials);
  buf k = random_values((size_t)(nkv * c.dqk), c.dt, c.amp, c.specials);
  buf v = random_values((size_t)(nkv * c.dv), c.dt, 2.0f, c.specials);
  std::vector<float> alibi((size_t)c.hq), dsq((size_t)(c.batch * c.hkv)), dsk(dsq.size()),
      dsv(dsq.size());
  for (auto &x : alibi) x = 0.03f + 0.5f * (float)(rnd() % 64) / 64.0f;
  for (size_t i = 0; i < dsq.size(); i++) {
    dsq[i] = 0.02f + 0.1f * (float)(rnd() % 32) / 32.0f;
    dsk[i] = 0.03f + 0.1f * (float)(rnd() % 32) / 32.0f;
    dsv[i] = 0.5f + (float)(rnd() % 32) / 16.0f;
  }
  xte_attention_config cfg = xte_attention_config_default();
  cfg.layout = (xte_attn_layout)c.layout;
  cfg.mask = (xte_attn_mask)c.mask;
  cfg.window_left = c.wl;
  cfg.window_right = c.wr;
  cfg.softmax_scale = c.scale;
  cfg.softcap = c.softcap;
  cfg.alibi_slopes = c.alibi ? alibi.data() : nullptr;
  if (!c.cuq.empty()) {
    cfg.cu_seqlens_q = c.cuq.data();
    cfg.cu_seqlens_kv = c.cukv.data();
  }
  cfg.batch = c.batch;
  cfg.max_seqlen_q = c.sq;
  cfg.max_seqlen_kv = c.skv;
  if (c.descale) {
    cfg.descale_q = dsq.data();
    cfg.descale_k = dsk.data();
    cfg.descale_v = dsv.data();
  }
  xte_tensor tq = tens(q.data(), c.dt, c.layout, B, Sq, c.hq, c.dqk);
  xte_tensor tk = tens(k.data(), c.dt, c.layout, B, Skv, c.hkv, c.dqk);
  xte_tensor tv = tens(v.data(), c.dt, c.layout, B, Skv, c.hkv, c.dv);
  const size_t obytes = (size_t)(nq * c.dv) * esz(c.odt), lbytes = (size_t)(B * Sq * c.hq) * 4;
  buf oc(obytes + 1, 0xCD), lc(lbytes + 1, 0xCD);
  xte_tensor to = tens(oc.data(), c.odt, c.layout, B, Sq, c.hq, c.dv);
  xte_tensor tl = thd ? xte_tensor_2d(lc.data(), XTE_DTYPE_FP32, Sq, c.hq)
                      : tens(lc.data(), XTE_DTYPE_FP32, XTE_ATTN_LAYOUT_THD, 0, B, c.hq, Sq);
  const std::string d = c.desc();
  const xte_status sc = xte_attention_fwd(&tq, &tk, &tv, &to, &tl, &cfg, cpu);
  const std::string mc = sc ? xte_last_error() : "";
  cases_run++;
  for (int ws : {32, 128}) {
    set_ws(ws);
    buf og(obytes + 1, 0xCD), lg(lbytes + 1, 0xCD);
    xte_tensor tog = to, tlg = tl;
    tog.data = og.data();
    tlg.data = lg.data();
    const xte_status sg = xte_attention_fwd(&tq, &tk, &tv, &tog, &tlg, &cfg, gpu);
    const std::string mg = sg ? xte_last_error() : "";
    const std::string dd = "fwd w" + std::to_string(ws) + " " + d;
    if (sg != sc || mg != mc) {
      report(dd, ("status " + std::to_string(sg) + " '" + mg + "' vs cpu " + std::to_string(sc) +
                  " '" + mc + "'")
                     .c_str());
      return;
    }
    if (sc) {
      if (verbose && ws == 32) std::printf("refused alike: %s\n", mc.c_str());
      refused += ws == 32;
    }
    same("O", dd, og, oc);
    same("LSE", dd, lg, lc);
  }
  if (!c.bwd || c.dt == XTE_DTYPE_E4M3 || sc) return;
  /* backward from the CPU's O and LSE */
  buf dout = random_values((size_t)(nq * c.dv), c.dt, 2.0f, c.specials);
  xte_tensor tdo = tens(dout.data(), c.dt, c.layout, B, Sq, c.hq, c.dv);
  const size_t qb = (size_t)(nq * c.dqk) * esz(c.dt), kb = (size_t)(nkv * c.dqk) * esz(c.dt),
               vb = (size_t)(nkv * c.dv) * esz(c.dt);
  buf dqc(qb + 1, 0xCD), dkc(kb + 1, 0xCD), dvc(vb + 1, 0xCD);
  xte_tensor tdq = tens(dqc.data(), c.dt, c.layout, B, Sq, c.hq, c.dqk);
  xte_tensor tdk = tens(dkc.data(), c.dt, c.layout, B, Skv, c.hkv, c.dqk);
  xte_tensor tdv = tens(dvc.data(), c.dt, c.layout, B, Skv, c.hkv, c.dv);
  const xte_status bc =
      xte_attention_bwd(&tq, &tk, &tv, &to, &tdo, &tl, &tdq, &tdk, &tdv, &cfg, cpu);
  const std::string bmc = bc ? xte_last_error() : "";
  for (int ws : {32, 128}) {
    set_ws(ws);
    buf dqg(qb + 1, 0xCD), dkg(kb + 1, 0xCD), dvg(vb + 1, 0xCD);
    xte_tensor gq = tdq, gk = tdk, gv = tdv;
    gq.data = dqg.data();
    gk.data = dkg.data();
    gv.data = dvg.data();
    const xte_status bg =
        xte_attention_bwd(&tq, &tk, &tv, &to, &tdo, &tl, &gq, &gk, &gv, &cfg, gpu);
    const std::string bmg = bg ? xte_last_error() : "";
    const std::string dd = "bwd w" + std::to_string(ws) + " " + d;
    if (bg != bc || bmg != bmc) {
      report(dd, ("status " + std::to_string(bg) + " '" + bmg + "' vs cpu " + std::to_string(bc) +
                  " '" + bmc + "'")
                     .c_str());
      return;
    }
    same("dQ", dd, dqg, dqc);
    same("dK", dd, dkg, dkc);
    same("dV", dd, dvg, dvc);
  }
}

/* ---------------------------------------------------------------- case lists */

static void fixed_cases() {
  const int dts[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  /* (1) forward + backward, BSHD, causal and not, GQA, odd lengths */
  for (int dt : dts)
    for (int mask = 0; mask < 3; mask++) {
      acase c;
      c.dt = c.odt = dt;
      c.mask = mask;
      c.batch = 2;
      c.sq = mask == 2 ? 37 : 70;
      c.skv = 65;
      c.hq = 4;
      c.hkv = 2;
      c.dqk = c.dv = 16;
      run_case(c);
    }
  /* empty: no query rows (no output), no keys (O = 0, LSE = -inf), a THD batch of empty
   * sequences with padding tokens only */
  {
    acase c;
    c.batch = 2;
    c.sq = 0;
    c.skv = 5;
    run_case(c);
    c.sq = 3;
    c.skv = 0;
    run_case(c);
    c.layout = XTE_ATTN_LAYOUT_THD;
    c.sq = 4;
    c.skv = 4;
    c.cuq = {1, 1, 1};
    c.cukv = {0, 0, 0};
    c.total_q = 3;
    c.total_kv = 2;
    run_case(c);
  }
  /* one row, one key; q longer than kv (bottom-right: rows that see nothing) */
  {
    acase c;
    run_case(c);
    c.mask = 2;
    c.sq = 20;
    c.skv = 5;
    c.dqk = 7;
    c.dv = 9;
    run_case(c);
    c.mask = 1;
    run_case(c);
  }
  /* windows: empty rows, partial blocks */
  {
    acase c;
    c.sq = 80;
    c.skv = 130;
    c.wl = 3;
    c.wr = 0;
    c.mask = 0;
    c.dqk = c.dv = 8;
    c.dt = c.odt = XTE_DTYPE_BF16;
    run_case(c);
    c.wl = 70;
    c.wr = -1;
    c.mask = 1;
    run_case(c);
    c.wl = -1;
    c.wr = -60; /* not allowed: < -1 -> refused alike */
    run_case(c);
    c.wr = 2;
    c.wl = 0;
    c.mask = 0;
    c.sq = 130;
    c.skv = 40;
    run_case(c);
  }
  /* softcap, ALiBi, explicit scale, MLA head dims, MQA */
  for (int dt : dts) {
    acase c;
    c.dt = c.odt = dt;
    c.softcap = 5.0f;
    c.alibi = 1;
    c.scale = 0.3f;
    c.sq = 33;
    c.skv = 67;
    c.hq = 3;
    c.hkv = 1;
    c.dqk = 24;
    c.dv = 12;
    c.mask = 2;
    c.amp = 6.0f;
    run_case(c);
  }
  {
    acase c; /* MLA 192 / 128, short sequences */
    c.dt = c.odt = XTE_DTYPE_BF16;
    c.sq = 5;
    c.skv = 9;
    c.dqk = 192;
    c.dv = 128;
    c.hq = 2;
    c.hkv = 1;
    c.mask = 1;
    run_case(c);
  }
  /* SBHD with and without padding; BSHD padding */
  for (int pad = 0; pad < 2; pad++)
    for (int layout : {XTE_ATTN_LAYOUT_SBHD, XTE_ATTN_LAYOUT_BSHD}) {
      acase c;
      c.layout = layout;
      c.pad = pad;
      c.batch = 3;
      c.sq = 21;
      c.skv = 66;
      c.hq = 2;
      c.hkv = 2;
      c.dqk = 12;
      c.dv = 20;
      c.mask = pad ? 2 : 1;
      c.dt = c.odt = pad ? XTE_DTYPE_FP16 : XTE_DTYPE_FP32;
      if (layout == XTE_ATTN_LAYOUT_BSHD && !pad) continue;
      run_case(c);
    }
  /* THD varlen */
  for (int mask = 0; mask < 3; mask++) {
    acase c;
    c.layout = XTE_ATTN_LAYOUT_THD;
    c.batch = 4;
    c.sq = 30;
    c.skv = 70;
    c.hq = 4;
    c.hkv = 1;
    c.dqk = 16;
    c.dv = 8;
    c.mask = mask;
    c.dt = c.odt = mask == 1 ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
    c.alibi = mask == 2;
    run_case(c);
  }
  /* THD with many empty sequences (the grids go by a work list of real tiles, found by binary
   * search past runs of empty sequences): 300 sequences, 5 of them not empty, q and kv apart */
  for (int mask = 0; mask < 2; mask++) {
    acase c;
    c.layout = XTE_ATTN_LAYOUT_THD;
    c.batch = 300;
    c.sq = 37;
    c.skv = 45;
    c.hq = 2;
    c.hkv = 1;
    c.dqk = c.dv = 16;
    c.mask = mask;
    c.dt = c.odt = XTE_DTYPE_BF16;
    c.cuq.assign(301, 0);
    c.cukv.assign(301, 0);
    for (int b = 0; b < 300; b++) {
      const int lq = b == 0 || b == 151 || b == 152 || b == 299 ? 17 + b % 20 : 0;
      const int lk = b == 1 || b == 151 || b == 200 || b == 299 || b == 152 ? 9 + b % 36 : 0;
      c.cuq[b + 1] = c.cuq[b] + lq;
      c.cukv[b + 1] = c.cukv[b] + lk;
    }
    c.total_q = c.cuq.back() + 2;
    c.total_kv = c.cukv.back();
    run_case(c);
  }
  /* NaN / inf / subnormal inputs; huge logits */
  for (int dt : dts) {
    acase c;
    c.dt = c.odt = dt;
    c.specials = 1;
    c.sq = 40;
    c.skv = 70;
    c.hq = 2;
    c.hkv = 1;
    c.dqk = c.dv = 16;
    c.mask = dt == XTE_DTYPE_FP16 ? 1 : 0;
    run_case(c);
    c.specials = 0;
    c.amp = 30.0f;
    run_case(c);
  }
  /* FP8 forward: O fp32 / bf16 / fp16, descales or not */
  for (int odt : dts)
    for (int ds = 0; ds < 2; ds++) {
      acase c;
      c.dt = XTE_DTYPE_E4M3;
      c.odt = odt;
      c.descale = ds;
      c.batch = 2;
      c.sq = 19;
      c.skv = 70;
      c.hq = 2;
      c.hkv = 1;
      c.dqk = c.dv = 16;
      c.mask = ds ? 2 : 0;
      c.specials = odt == XTE_DTYPE_FP16;
      c.softcap = ds ? 0.0f : 20.0f;
      run_case(c);
    }
  /* bad cu_seqlens: the CPU's status and message, nothing written */
  for (int bad = 1; bad <= 4; bad++)
    for (int layout : {XTE_ATTN_LAYOUT_THD, XTE_ATTN_LAYOUT_BSHD}) {
      acase c;
      c.layout = layout;
      c.pad = 1;
      c.batch = 3;
      c.sq = 9;
      c.skv = 12;
      c.bad = bad;
      c.dqk = c.dv = 4;
      run_case(c);
    }
}

static void random_cases(int n, int64_t maxs) {
  const int dts[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16, XTE_DTYPE_E4M3};
  const int64_t dims[] = {1, 3, 8, 16, 31, 32, 64};
  for (int i = 0; i < n; i++) {
    acase c;
    c.layout = (int)(rnd() % 3);
    c.mask = (int)(rnd() % 3);
    c.dt = dts[rnd() % 4];
    c.odt = c.dt == XTE_DTYPE_E4M3 ? dts[rnd() % 3] : c.dt;
    c.descale = c.dt == XTE_DTYPE_E4M3 && rnd() % 2;
    if (rnd() % 3 == 0) c.wl = (int64_t)(rnd() % 40);
    if (rnd() % 3 == 0) c.wr = (int64_t)(rnd() % 40);
    if (rnd() % 4 == 0) c.softcap = 1.0f + (float)(rnd() % 30);
    c.alibi = rnd() % 4 == 0;
    c.specials = rnd() % 5 == 0;
    c.batch = 1 + (int64_t)(rnd() % 3);
    c.sq = 1 + (int64_t)(rnd() % (uint64_t)maxs);
    c.skv = 1 + (int64_t)(rnd() % (uint64_t)maxs);
    c.hkv = 1 + (int64_t)(rnd() % 2);
    c.hq = c.hkv * (1 + (int64_t)(rnd() % 2));
    c.dqk = dims[rnd() % 7];
    c.dv = rnd() % 2 ? c.dqk : dims[rnd() % 7];
    c.pad = rnd() % 2;
    c.amp = rnd() % 3 == 0 ? 8.0f : 2.0f;
    run_case(c);
  }
}

int main(int argc, char **argv) {
  const simt_args args = simt_parse_args(argc, argv);
  tiny = args.reduced;
  full = args.full;
  if (!simt_open("simt attention", 0)) return 2;
  std::printf("simt attention: CPU ISA %s, %s list\n", simt_isa(),
              tiny ? "reduced" : (full ? "full" : "default"));
  fixed_cases();
  if (!tiny) random_cases(full ? 400 : 80, full ? 260 : 140);
  return simt_close("simt attention");
}

/* The CUDA quantize / dequantize / cast kernels (src/cuda/quantize_kernels.cuh), run on the host by
 * the SIMT runner (simt.h, through the stand-in plugin simt_plugin.cpp that libxte loads as its
 * CUDA backend), against the CPU backend, byte for byte: every output byte (padding included:
 * outputs start as 0xCD on both sides), every scale, amax and scale output. Quantize: every valid
 * recipe x scaling mode x scale layout, rowwise / columnwise / both, fp32 / bf16 / fp16 inputs,
 * e4m3 / e5m2, saturating or not, pow2 and epsilon variants, empty, one-element, odd and
 * multi-tile shapes, padded input and output leading dimensions, NaN / inf / subnormal inputs,
 * blocks holding an infinity and all-zero / all-NaN tiles. Dequantize: every copy produced (and
 * every fp8 byte pattern) to fp32 / bf16 / fp16. Cast: every dtype pair, every 16-bit pattern.
 * Also a self-test of the runner's warp intrinsics at 32 and 128 lanes.
 *
 *   test_simt_quantize [--reduced] [--quiet]
 * --reduced: the short case list (the ThreadSanitizer variant runs it). Exit status 1 on any
 * mismatch, with one line per failing case (the first differing byte of each output). */
#include "simt.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "simt_test_common.h"

static int reduced;

static void must(xte_status st, const char *what) {
  if (st != XTE_SUCCESS) {
    std::fprintf(stderr, "FATAL %s: %s\n", what, xte_last_error());
    std::exit(2);
  }
}

/* ---------------------------------------------------------------- inputs */

static const uint32_t special_bits[] = {
    0x00000000u, 0x80000000u,                           /* +-0 */
    0x00000001u, 0x807FFFFFu, 0x00400000u,              /* fp32 subnormals */
    0x7F800000u, 0xFF800000u,                           /* +-inf */
    0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFFA12345u, /* NaNs, signalling ones too */
    0x43E00000u, 0x43E80000u, 0x43E80001u, 0x43E88000u, /* 448, 464, 464+ulp, 465 */
    0xC3E00000u, 0x47600000u, 0x47700000u, 0x476FFFFFu, /* -448, 57344, 61440, 61440-ulp */
    0x477FE000u, 0x477FF000u, 0x33800000u, 0x387FC000u, /* 65504, 65520, 2^-24, fp16 subn */
    0x3B000000u, 0x3A800000u, 0x7F7FFFFFu, 0x00800000u, /* 2^-9, 2^-10, FLT_MAX, min normal */
};
static const int nspecial = sizeof special_bits / sizeof special_bits[0];

static float normal_value(int lo, int span) {
  float m = 1.0f + (float)(rnd() >> 41) * (1.0f / 8388608.0f);
  float v = std::ldexp(m, lo + (int)(rnd() % (uint64_t)span));
  return (rnd() & 1) ? -v : v;
}

/* Rows of different kinds: normal ranges, anything finite (subnormals too), zero rows, specials,
 * tiny values (bf16 normals, fp16 subnormals), NaN rows, huge values, an infinity on the diagonal
 * (a block holding inf: scale 0 under DEEPGEMM / MTFP8), narrow ranges; a zero tile and a NaN
 * tile when the shape has room. */
static float gen_value(int64_t M, int64_t K, int64_t r, int64_t c) {
  int style = (int)((r * 5 + 3) % 9);
  if (M >= 256 && K >= 128 && r >= 128 && r < 256 && c < 128) style = 2;
  if (M >= 128 && K >= 256 && r < 128 && c >= 128 && c < 256) style = 5;
  if (c % 37 == 5 || (r * 131 + c * 7) % 101 == 0) style = 3;
  switch (style) {
    case 0:
      return normal_value(-10, 21);
    case 1: {
      uint32_t e = (uint32_t)(rnd() % 255);
      return bitsf((uint32_t)(rnd() & 0x807FFFFFu) | (e << 23));
    }
    case 2:
      return (rnd() & 1) ? 0.0f : -0.0f;
    case 3:
      return (rnd() & 1) ? bitsf(special_bits[rnd() % nspecial]) : normal_value(-3, 12);
    case 4:
      return normal_value(-40, 28);
    case 5:
      return bitsf((rnd() & 1 ? 0xFFC00000u : 0x7FC00000u) | (uint32_t)(rnd() & 0x3FFFFFu));
    case 6:
      return normal_value(100, 27);
    case 7:
      return c == r % K ? bitsf(rnd() & 1 ? 0x7F800000u : 0xFF800000u) : normal_value(-6, 10);
    default:
      return normal_value(-2, 6);
  }
}

/* Input [M, K] with leading dimension ld in dtype dt; the gap past K is NaN (never read). */
static std::vector<uint8_t> make_input(int64_t M, int64_t K, int64_t ld, xte_dtype dt) {
  const size_t n = (size_t)(M * ld);
  std::vector<float> f(n ? n : 1);
  for (int64_t r = 0; r < M; r++)
    for (int64_t c = 0; c < ld; c++)
      f[r * ld + c] = c < K ? gen_value(M, K, r, c) : bitsf(0x7FC0DEADu);
  std::vector<uint8_t> out(n * xte_dtype_size(dt) + 1);
  if (dt == XTE_DTYPE_FP32) {
    std::memcpy(out.data(), f.data(), n * 4);
  } else if (n) {
    xte_tensor a = xte_tensor_1d(f.data(), XTE_DTYPE_FP32, (int64_t)n);
    xte_tensor b = xte_tensor_1d(out.data(), dt, (int64_t)n);
    must(xte_cast(&a, &b, 1, cpu), "xte_cast (input)");
  }
  return out;
}

/* ---------------------------------------------------------------- quantize + dequantize */

static bool is_mx(int r) {
  return r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP;
}
static bool col_transposed(int r) {
  return !(r == XTE_RECIPE_MTFP8 || is_mx(r));
}

struct qcase {
  int64_t M, K, ld_in;
  int pad_out;
  xte_dtype in_dt, q_dt;
  int mode, recipe, layout, row, col;
  xte_quant_config cfg;
  xte_dtype deq_dt;
  int deq_all_bytes; /* dequantize every fp8 byte pattern instead of the quantized copy */
};

static std::string describe(const qcase &q) {
  char s[320];
  std::snprintf(s, sizeof s,
                "M=%lld K=%lld ld=%lld pad=%d in=%s q=%s mode=%d recipe=%d layout=%d row=%d col=%d "
                "sat=%d pow2=%d eps=%g",
                (long long)q.M, (long long)q.K, (long long)q.ld_in, q.pad_out,
                xte_dtype_name(q.in_dt), xte_dtype_name(q.q_dt), q.mode, q.recipe, q.layout, q.row,
                q.col, q.cfg.saturate, q.cfg.force_pow_2, (double)q.cfg.amax_epsilon);
  return s;
}

struct copy_buf {
  int64_t rows = 0, cols = 0, ld = 0, sr = 0, sc = 0;
  size_t qbytes = 0, sbytes = 0;
};

static bool geometry(const qcase &q, int columnwise, copy_buf *b) {
  const bool tr = columnwise && col_transposed(q.recipe);
  b->rows = tr ? q.K : q.M;
  b->cols = tr ? q.M : q.K;
  b->ld = b->cols + (q.pad_out ? (columnwise ? 5 : 3) : 0);
  if (b->ld < 1) b->ld = 1;
  if (xte_quantize_scale_shape(q.M, q.K, (xte_scaling_mode)q.mode, (xte_recipe)q.recipe,
                               (xte_scale_layout)q.layout, columnwise, &b->sr,
                               &b->sc) != XTE_SUCCESS)
    return false;
  b->qbytes = (size_t)(b->rows * b->ld);
  b->sbytes = (size_t)(b->sr * b->sc) * (is_mx(q.recipe) ? 1u : 4u);
  return true;
}

static void fill_qtensor(xte_qtensor *t, const qcase &q, const copy_buf &rb, const copy_buf &cb,
                         void *rq, void *rs, void *cq, void *cs) {
  std::memset(t, 0, sizeof *t);
  t->scaling_mode = (xte_scaling_mode)q.mode;
  t->recipe = (xte_recipe)q.recipe;
  const xte_dtype sdt = is_mx(q.recipe) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
  if (rq) {
    t->rowwise = xte_tensor_2d(rq, q.q_dt, rb.rows, rb.cols);
    t->rowwise.ld = rb.ld;
    t->rowwise_scale_inv = {rs, sdt, rb.sr, rb.sc, (xte_scale_layout)q.layout};
  }
  if (cq) {
    t->columnwise = xte_tensor_2d(cq, q.q_dt, cb.rows, cb.cols);
    t->columnwise.ld = cb.ld;
    t->columnwise_scale_inv = {cs, sdt, cb.sr, cb.sc, (xte_scale_layout)q.layout};
  }
}

/* One side's buffers (0xCD-filled, with one spare byte so that empty copies have an address). */
struct side {
  std::vector<uint8_t> rq, rs, cq, cs;
  float amax = -1.0f, scale = -1.0f;
  void init(const qcase &q, const copy_buf &rb, const copy_buf &cb) {
    if (q.row) rq.assign(rb.qbytes + 1, 0xCD), rs.assign(rb.sbytes + 1, 0xCD);
    if (q.col) cq.assign(cb.qbytes + 1, 0xCD), cs.assign(cb.sbytes + 1, 0xCD);
  }
};

static void run_dequant(const qcase &q, const std::string &desc, const copy_buf &b, int columnwise,
                        const xte_qtensor &src_cpu) {
  /* both backends dequantize the CPU's copy (the quantize bytes were compared already) */
  xte_qtensor t = src_cpu;
  std::vector<uint8_t> qbuf;
  if (q.deq_all_bytes) {
    xte_tensor &d = columnwise ? t.columnwise : t.rowwise;
    qbuf.assign(b.qbytes + 1, 0);
    for (size_t i = 0; i < b.qbytes; i++) qbuf[i] = (uint8_t)(i * 7 + i / 256);
    d.data = qbuf.data();
  }
  const size_t es = xte_dtype_size(q.deq_dt);
  const int64_t ld_out = b.cols + (q.pad_out ? 2 : 0);
  const size_t n = (size_t)(b.rows * ld_out) * es;
  std::vector<uint8_t> oc(n + 1, 0xCD), og(n + 1, 0xCD);
  xte_tensor out_c = xte_tensor_2d(oc.data(), q.deq_dt, b.rows, b.cols);
  out_c.ld = ld_out;
  xte_tensor out_g = out_c;
  out_g.data = og.data();
  const xte_status sc = xte_dequantize(&t, columnwise, &out_c, cpu);
  const xte_status sg = xte_dequantize(&t, columnwise, &out_g, gpu);
  const std::string d = desc + (columnwise ? " dequant col" : " dequant row") +
                        " out=" + xte_dtype_name(q.deq_dt) + (q.deq_all_bytes ? " all-bytes" : "");
  cases_run++;
  if (sc != sg) {
    report(d, "dequantize status differs");
    return;
  }
  if (sc == XTE_SUCCESS)
    same("dequantized", d, og.data(), oc.data(), n);
  else
    refused++;
}

static void run_quant(const qcase &q, const uint8_t *in) {
  const std::string desc = describe(q);
  copy_buf rb, cb;
  if (!geometry(q, 0, &rb) || !geometry(q, 1, &cb)) {
    /* shapes the core refuses: both backends must refuse them alike (checked below) */
  }
  side c, g;
  c.init(q, rb, cb);
  g.init(q, rb, cb);
  xte_tensor x = xte_tensor_2d((void *)in, q.in_dt, q.M, q.K);
  x.ld = q.ld_in;
  const bool current = q.recipe == XTE_RECIPE_TE_CURRENT,
             delayed = q.recipe == XTE_RECIPE_TE_DELAYED;
  float given = 0.37f;
  xte_qtensor tc, tg;
  fill_qtensor(&tc, q, rb, cb, q.row ? c.rq.data() : nullptr, c.rs.data(),
               q.col ? c.cq.data() : nullptr, c.cs.data());
  fill_qtensor(&tg, q, rb, cb, q.row ? g.rq.data() : nullptr, g.rs.data(),
               q.col ? g.cq.data() : nullptr, g.cs.data());
  tc.amax = &c.amax;
  tg.amax = &g.amax;
  tc.scale = delayed ? &given : current ? &c.scale : nullptr;
  tg.scale = delayed ? &given : current ? &g.scale : nullptr;
  const xte_status sc = xte_quantize(&x, &tc, &q.cfg, cpu);
  const xte_status sg = xte_quantize(&x, &tg, &q.cfg, gpu);
  cases_run++;
  if (sc != sg) {
    char m[160];
    std::snprintf(m, sizeof m, "status: simt %s, cpu %s", xte_status_string(sg),
                  xte_status_string(sc));
    report(desc, m);
    return;
  }
  if (sc != XTE_SUCCESS) {
    refused++;
    return;
  }
  if (q.row) {
    same("rowwise data", desc, g.rq.data(), c.rq.data(), g.rq.size());
    same("rowwise scale_inv", desc, g.rs.data(), c.rs.data(), g.rs.size());
  }
  if (q.col) {
    same("columnwise data", desc, g.cq.data(), c.cq.data(), g.cq.size());
    same("columnwise scale_inv", desc, g.cs.data(), c.cs.data(), g.cs.size());
  }
  same("amax", desc, &g.amax, &c.amax, 4);
  if (current) same("scale", desc, &g.scale, &c.scale, 4);
  if (q.deq_dt != XTE_DTYPE_COUNT) {
    if (q.row) run_dequant(q, desc, rb, 0, tc);
    if (q.col) run_dequant(q, desc, cb, 1, tc);
  }
}

static bool valid_combo(int mode, int recipe, int layout) {
  int64_t r, c;
  return xte_quantize_scale_shape(4, 4, (xte_scaling_mode)mode, (xte_recipe)recipe,
                                  (xte_scale_layout)layout, 0, &r, &c) == XTE_SUCCESS;
}

struct shape {
  int64_t M, K, ld_in;
  int pad_out;
  int full;    /* every dtype x fp8 format x copies combination; else one rotated combination */
  int off = 0; /* the input starts this many elements past a 16-byte boundary (unaligned loads) */
};

static void quantize_cases() {
  static const xte_dtype in_dts[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  static const xte_dtype q_dts[] = {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2};
  static const xte_dtype deq_dts[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  std::vector<shape> shapes;
  if (reduced) {
    shapes = {{0, 16, 16, 0, 0}, {1, 1, 1, 0, 0}, {33, 140, 143, 1, 0}, {9, 70, 72, 0, 0, 1}};
  } else {
    shapes = {{0, 16, 16, 0, 0},
              {16, 0, 1, 0, 0},
              {1, 1, 1, 0, 0},
              {1, 16, 16, 0, 1},
              {65, 96, 96, 0, 1},
              {65, 96, 101, 1, 1},
              {3, 300, 300, 0, 0},
              {129, 1, 1, 0, 0},
              {130, 257, 261, 1, 1},
              {256, 384, 384, 0, 0},
              {200, 33, 40, 1, 1},
              /* the GPU kernels' 16-byte paths and their fallbacks: a base 1 element past a
               * 16-byte boundary; rows whose alignment alternates (bf16 ld 140: 280 bytes);
               * the fp32 tile in two 64-column slabs with a partial second one (K 100) */
              {65, 200, 200, 0, 0, 1},
              {70, 136, 140, 1, 1},
              {70, 136, 140, 0, 0, 3},
              {129, 100, 100, 0, 0},
              /* tall-skinny and short-wide: the whole-tensor amax spread over the grid */
              {3000, 3, 3, 0, 0},
              {2100, 1, 2, 1, 0},
              {1, 5000, 5000, 0, 0},
              {2, 4099, 4101, 1, 0, 2}};
  }
  int variant = 0;
  for (const shape &s : shapes) {
    std::vector<uint8_t> inputs[3];
    size_t skip[3] = {0, 0, 0}; /* where the input starts in inputs[di] */
    for (int di = 0; di < 3; di++) {
      inputs[di] = make_input(s.M, s.K, s.ld_in, in_dts[di]);
      if (s.off) { /* the same bytes, moved to 16 * k + off elements in a fresh buffer */
        std::vector<uint8_t> moved(inputs[di].size() + 32, 0xEE);
        uint8_t *base = moved.data();
        size_t pad = (16 - ((uintptr_t)base & 15)) & 15;
        skip[di] = pad + (size_t)s.off * xte_dtype_size(in_dts[di]);
        std::memcpy(base + skip[di], inputs[di].data(), inputs[di].size());
        inputs[di].swap(moved);
      }
    }
    for (int mode = 0; mode < XTE_SCALING_COUNT; mode++)
      for (int recipe = 0; recipe < XTE_RECIPE_COUNT; recipe++)
        for (int layout = 0; layout < XTE_SCALE_LAYOUT_COUNT; layout++) {
          if (!valid_combo(mode, recipe, layout)) continue;
          const int combos = s.full ? 3 * 2 * 3 : 1;
          for (int k = 0; k < combos; k++) {
            const int sel = s.full ? k : variant;
            qcase q;
            q.M = s.M;
            q.K = s.K;
            q.ld_in = s.ld_in;
            q.pad_out = s.pad_out;
            q.in_dt = in_dts[sel % 3];
            q.q_dt = q_dts[(sel / 3) % 2];
            const int which = 1 + (sel / 6) % 3;
            q.row = which & 1;
            q.col = (which >> 1) & 1;
            q.mode = mode;
            q.recipe = recipe;
            q.layout = layout;
            q.cfg = xte_quant_config_default();
            q.cfg.saturate = (variant & 1) ? 0 : 1;
            q.cfg.force_pow_2 = (variant & 2) ? 0 : 1;
            q.cfg.amax_epsilon = variant % 5 == 4 ? 1e-3f : 0.0f;
            /* dequantize after every third case, the all-bytes pattern every sixth */
            q.deq_dt = variant % 3 == 0 ? deq_dts[(variant / 3) % 3] : XTE_DTYPE_COUNT;
            q.deq_all_bytes = variant % 6 == 0;
            variant++;
            run_quant(q, inputs[sel % 3].data() + skip[sel % 3]);
          }
        }
  }
}

/* Per-tensor current scaling with one largest |x| (3.0, all others <= 0.5) placed in turn at each
 * position class of the GPU's whole-tensor amax walk (16-byte chunks along each row): first and
 * last element of a chunk, of a row, of the tensor, a chunk cut by the row end, rows whose
 * alignment differs, an unaligned start. The scale, the amax and every byte depend on that one
 * element. */
static void amax_position_cases() {
  struct pshape {
    int64_t M, K, ld;
    int off;
  };
  static const xte_dtype in_dts[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  /* not in the reduced list (the ThreadSanitizer variant's). The amax grid is sized from the
   * shape (xte_q_amax_grid): these shapes get 1 or 2 blocks, so each thread walks several chunks
   * and the walk's (row, chunk) carry is exercised. */
  static const pshape ps[] = {{1, 4099, 4099, 0}, {300, 24, 24, 0}, {5, 1000, 1003, 1}};
  const int nps = reduced ? 0 : (int)(sizeof ps / sizeof ps[0]);
  for (int di = 0; di < 3; di++)
    for (int si = 0; si < nps; si++) {
      const pshape &sh = ps[si];
      const int64_t epc = 16 / (int64_t)xte_dtype_size(in_dts[di]);
      const int64_t pos[][2] = {{0, 0},
                                {0, 1},
                                {0, epc - 1},
                                {0, epc},
                                {sh.M / 2, (sh.K / 2 / epc) * epc + epc - 1},
                                {sh.M / 2, sh.K - 1},
                                {sh.M - 1, 0},
                                {sh.M - 1, sh.K - 1}};
      for (const auto &p : pos) {
        const int64_t pr = p[0], pc = p[1] < sh.K ? p[1] : sh.K - 1;
        const size_t n = (size_t)(sh.M * sh.ld);
        std::vector<float> f(n);
        for (int64_t r = 0; r < sh.M; r++)
          for (int64_t c = 0; c < sh.ld; c++)
            f[r * sh.ld + c] =
                c < sh.K ? (float)((r * 7 + c * 13) % 17 - 8) * 0.0625f : bitsf(0x7FC0DEADu);
        f[pr * sh.ld + pc] = (pr + pc) & 1 ? -3.0f : 3.0f;
        const size_t es = xte_dtype_size(in_dts[di]);
        std::vector<uint8_t> buf(n * es + 64, 0xEE);
        const size_t skip = ((16 - ((uintptr_t)buf.data() & 15)) & 15) + (size_t)sh.off * es;
        xte_tensor a = xte_tensor_1d(f.data(), XTE_DTYPE_FP32, (int64_t)n);
        xte_tensor b = xte_tensor_1d(buf.data() + skip, in_dts[di], (int64_t)n);
        must(xte_cast(&a, &b, 1, cpu), "xte_cast (amax position input)");
        qcase q;
        q.M = sh.M;
        q.K = sh.K;
        q.ld_in = sh.ld;
        q.pad_out = 0;
        q.in_dt = in_dts[di];
        q.q_dt = XTE_DTYPE_E4M3;
        q.mode = XTE_SCALING_PER_TENSOR;
        q.recipe = XTE_RECIPE_TE_CURRENT;
        q.layout = XTE_SCALE_LAYOUT_COMPACT;
        q.row = 1;
        q.col = 0;
        q.cfg = xte_quant_config_default();
        q.deq_dt = XTE_DTYPE_COUNT;
        q.deq_all_bytes = 0;
        run_quant(q, buf.data() + skip);
      }
    }
}

/* ---------------------------------------------------------------- two host threads, one stream
 * Two host threads quantize at once on the one SIMT stream, with per-tensor current scaling: each
 * call runs four steps through the handle's scratch (amax reset, amax kernel, scale kernel, tiles)
 * and the runner takes its launches one at a time, so without the handle's lock one thread's
 * scale lands in the other's tiles. Each thread's bytes must be the CPU's, every time. */
static void two_thread_cases() {
  struct job {
    int64_t M, K;
    xte_dtype dt;
    std::vector<uint8_t> in, want, got;
    float amax_want = 0, scale_want = 0;
    int bad = 0;
  };
  job jobs[2] = {{8, 40, XTE_DTYPE_BF16, {}, {}, {}}, {5, 36, XTE_DTYPE_FP32, {}, {}, {}}};
  const int iters = reduced ? 12 : 40;
  xte_quant_config cfg = xte_quant_config_default();
  auto quantize = [&](job &j, xte_stream s, std::vector<uint8_t> &out, float *amax, float *scale) {
    out.assign((size_t)(j.M * j.K) + 4, 0xCD);
    xte_tensor x = xte_tensor_2d(j.in.data(), j.dt, j.M, j.K);
    xte_qtensor q;
    std::memset(&q, 0, sizeof q);
    q.scaling_mode = XTE_SCALING_PER_TENSOR;
    q.recipe = XTE_RECIPE_TE_CURRENT;
    q.rowwise = xte_tensor_2d(out.data(), XTE_DTYPE_E4M3, j.M, j.K);
    q.rowwise_scale_inv = {out.data() + j.M * j.K, XTE_DTYPE_FP32, 1, 1, XTE_SCALE_LAYOUT_COMPACT};
    q.amax = amax;
    q.scale = scale;
    return xte_quantize(&x, &q, &cfg, s);
  };
  for (int k = 0; k < 2; k++) {
    job &j = jobs[k];
    std::vector<float> f((size_t)(j.M * j.K));
    for (size_t i = 0; i < f.size(); i++) f[i] = normal_value(k ? 4 : -6, 3);
    j.in.assign(f.size() * xte_dtype_size(j.dt) + 1, 0);
    xte_tensor a = xte_tensor_1d(f.data(), XTE_DTYPE_FP32, (int64_t)f.size());
    xte_tensor b = xte_tensor_1d(j.in.data(), j.dt, (int64_t)f.size());
    must(xte_cast(&a, &b, 1, cpu), "xte_cast (two-thread input)");
    must(quantize(j, cpu, j.want, &j.amax_want, &j.scale_want), "xte_quantize (two-thread, cpu)");
  }
  std::vector<std::thread> th;
  for (int k = 0; k < 2; k++)
    th.emplace_back([&, k] {
      job &j = jobs[k];
      for (int it = 0; it < iters; it++) {
        float am = -1, sc = -1;
        std::vector<uint8_t> out;
        if (quantize(j, gpu, out, &am, &sc) != XTE_SUCCESS || out != j.want ||
            std::memcmp(&am, &j.amax_want, 4) || std::memcmp(&sc, &j.scale_want, 4))
          j.bad++;
      }
    });
  for (auto &t : th) t.join();
  for (int k = 0; k < 2; k++) {
    cases_run++;
    if (jobs[k].bad) {
      char m[96];
      std::snprintf(m, sizeof m, "%d of %d calls differ from the CPU", jobs[k].bad, iters);
      report(k ? "two threads, one stream: fp32 job" : "two threads, one stream: bf16 job", m);
    }
  }
}

/* ---------------------------------------------------------------- cast */

static void cast_cases() {
  static const xte_dtype dts[] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16,
                                  XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, XTE_DTYPE_E8M0};
  const int64_t ns[] = {0, 1, 257, 65536 + 3};
  for (int ii = 0; ii < 6; ii++)
    for (int oi = 0; oi < 6; oi++)
      for (int sat = 0; sat < 2; sat++)
        for (int64_t n : ns) {
          const xte_dtype idt = dts[ii], odt = dts[oi];
          const size_t is = xte_dtype_size(idt), os = xte_dtype_size(odt);
          if (reduced && (n > 257 || (n == 257 && (ii + oi + sat) % 4 != 0))) continue;
          /* every 16-bit pattern once per dtype pair: the long case only with saturate = 1
           * for 16-bit inputs, and for fp32 / fp8 inputs not at all (257 covers the 256 fp8
           * bytes; fp32 gets random bits and specials) */
          if (n > 257 && (is != 2 || sat == 0)) continue;
          std::vector<uint8_t> in(n * is + 1), oc(n * os + 1, 0xCD), og(n * os + 1, 0xCD);
          for (int64_t i = 0; i < n; i++) {
            if (is == 1) {
              in[i] = (uint8_t)i;
            } else if (is == 2) {
              const uint16_t v = (uint16_t)(i * 40503u);
              std::memcpy(&in[i * 2], &v, 2);
            } else {
              const uint32_t v = i < nspecial ? special_bits[i] : (uint32_t)rnd();
              std::memcpy(&in[i * 4], &v, 4);
            }
          }
          xte_tensor a = xte_tensor_1d(in.data(), idt, n);
          xte_tensor bc = xte_tensor_1d(oc.data(), odt, n), bg = xte_tensor_1d(og.data(), odt, n);
          const xte_status sc = xte_cast(&a, &bc, sat, cpu), sg = xte_cast(&a, &bg, sat, gpu);
          char d[128];
          std::snprintf(d, sizeof d, "cast %s -> %s sat=%d n=%lld", xte_dtype_name(idt),
                        xte_dtype_name(odt), sat, (long long)n);
          cases_run++;
          if (sc != sg)
            report(d, "status differs");
          else if (sc == XTE_SUCCESS)
            same("cast output", d, og.data(), oc.data(), oc.size());
          else
            refused++;
        }
}

/* ---------------------------------------------------------------- the runner's warp intrinsics */

__global__ void warp_kernel(int *out, int n) {
  const int t = (int)threadIdx.x, lane = t % warpSize;
  int v = t * 3 + 1, s = v;
  for (int o = warpSize / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
  const int from0 = __shfl_sync(0xFFFFFFFFu, v, 0);
  const int down = __shfl_down_sync(0xFFFFFFFFu, v, 1);
  const int up = __shfl_up_sync(0xFFFFFFFFu, v, 2, 16);
  const int any = __any_sync(0xFFFFFFFFu, lane == 5);
  const int all = __all_sync(0xFFFFFFFFu, v > 0);
  if (t < n) {
    out[t * 6 + 0] = s;
    out[t * 6 + 1] = from0;
    out[t * 6 + 2] = down;
    out[t * 6 + 3] = up;
    out[t * 6 + 4] = any + 2 * all;
    out[t * 6 + 5] = 0;
  }
  if (warpSize <= 32) {
    const unsigned long long b = __ballot_sync(0xFFFFFFFFu, lane & 1);
    if (t < n) out[t * 6 + 5] = (int)(b & 0x7FFFFFFFull);
  }
  __shared__ int cnt;
  if (t == 0) cnt = 0;
  __syncthreads();
  atomicAdd(&cnt, 1);
  __syncthreads();
  if (t == 0) atomicMax(&out[n * 6], cnt);
}

static void warp_selftest() {
  const simt::engine engine0 = simt::get_engine();
  for (int e = 0; e < 2; e++)
    for (int ws : {32, 128}) {
      const int n = 256;
      simt::set_engine(e ? simt::threads : simt::fibers);
      simt::set_warp_size(ws);
      std::vector<int> out(n * 6 + 1, 0);
      if (simt::launch(dim3(2), dim3(n), 0, warp_kernel, out.data(), n) != simt::ok) {
        report("warp self-test", "launch refused");
        continue;
      }
      int bad = 0;
      for (int t = 0; t < n; t++) {
        const int lane = t % ws, base = t - lane, seg = t - t % 16;
        long sum = 0;
        for (int l = 0; l < ws; l++) sum += (base + l) * 3 + 1;
        const int down = lane + 1 < ws ? t + 1 : t, up = t - 2 >= seg ? t - 2 : t;
        const int ballot = ws == 32 ? (int)(0xAAAAAAAAu & 0x7FFFFFFFu) : 0;
        const int want[6] = {(int)sum, base * 3 + 1, down * 3 + 1, up * 3 + 1, 1 + 2, ballot};
        for (int k = 0; k < 6; k++) bad += out[t * 6 + k] != want[k];
      }
      bad += out[n * 6] != n;
      cases_run++;
      if (bad) {
        char m[96];
        std::snprintf(m, sizeof m, "%d wrong values with %d-lane warps (%s)", bad, ws,
                      simt::get_engine() == simt::threads ? "threads" : "fibers");
        report("warp self-test", m);
      }
    }
  simt::set_warp_size(32);
  simt::set_engine(engine0);
}

int main(int argc, char **argv) {
  const simt_args args = simt_parse_args(argc, argv);
  reduced = args.reduced;
  if (!simt_open("simt", 0)) return 2;
  std::printf("simt: CPU ISA %s, %s list\n", simt_isa(), reduced ? "reduced" : "full");
  warp_selftest();
  quantize_cases();
  amax_position_cases();
  cast_cases();
  two_thread_cases();
  return simt_close("simt");
}

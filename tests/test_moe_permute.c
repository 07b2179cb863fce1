/* Token movement tests: permute from a routing map and from topk_idx (int32 / int64) in bf16,
 * fp32 and fp8 with scales, with capacity drops and alignment padding, against an oracle that
 * walks experts then tokens; unpermute (one-hot probs give x exactly; general probs bit-exact
 * against an fmaf loop in slot order), both backward passes, sort chunks, the DeepEP dispatch
 * layout. Every CPU ISA gives the same bytes. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>

#include "numerics/xte_numerics.h"
#include "test_moe_util.h"

/* A routing: T tokens, k distinct experts each (some slots -1 when holes). */
static void gen_route(int T, int E, int k, int holes, int64_t *idx, uint8_t *map) {
  int t, j, i;
  memset(map, 0, (size_t)(T * E));
  for (t = 0; t < T; t++)
    for (j = 0; j < k; j++) {
      int e, dup;
      do {
        e = (int)(rng_u32() % (uint32_t)E);
        dup = 0;
        for (i = 0; i < j; i++) dup |= idx[t * k + i] == e;
      } while (dup);
      idx[t * k + j] = e;
      if (holes && rng_u32() % 7 == 0) idx[t * k + j] = -1;
      if (idx[t * k + j] >= 0) map[t * E + e] = 1;
    }
}

/* Oracle row map: experts ascending, tokens ascending; cap on the unpadded position; padding. */
static int64_t oracle_rows(int T, int E, int k, const int64_t *idx, const uint8_t *map, int use_map,
                           int64_t cap, int64_t align, int32_t *rm, int64_t *off, int64_t *kept) {
  int64_t pos = 0, row = 0;
  int e, t, j;
  for (t = 0; t < T * k; t++) rm[t] = -1;
  for (e = 0; e < E; e++) {
    int64_t n = 0;
    off[e] = row;
    for (t = 0; t < T; t++) {
      int slot = -1;
      if (use_map) {
        int s = 0, x;
        if (!map[t * E + e]) continue;
        for (x = 0; x < e; x++) s += map[t * E + x];
        slot = s;
      } else {
        for (j = 0; j < k; j++)
          if (idx[t * k + j] == e) slot = j;
        if (slot < 0) continue;
      }
      if (cap < 0 || pos < cap) {
        rm[t * k + slot] = (int32_t)(row + n);
        n++;
      }
      pos++;
    }
    kept[e] = n;
    row += align > 1 ? (n + align - 1) / align * align : n;
  }
  off[E] = row;
  return row;
}

static void permute_case(int T, int E, int k, int H, xte_dtype dt, int use_map, int64_t cap,
                         int64_t align) {
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, t, j;
  size_t es = xte_dtype_size(dt);
  int fp8 = dt == XTE_DTYPE_E4M3;
  int64_t *idx = (int64_t *)zalloc(8 * (size_t)(T * k)), off[600], kept[600], R, rows;
  uint8_t *map = (uint8_t *)zalloc((size_t)(T * E));
  int32_t *orm = (int32_t *)zalloc(4 * (size_t)(T * k)),
          *rm = (int32_t *)zalloc(4 * (size_t)(T * k));
  int64_t SC = (H + 127) / 128;
  uint8_t *x = (uint8_t *)zalloc(es * (size_t)(T * H));
  float *xs = (float *)zalloc(4 * (size_t)(T * SC));
  xte_moe_routing routing;
  xte_permute_config cfg = xte_permute_config_default();
  xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, T, k),
             mt = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
  size_t i;
  gen_route(T, E, k, !use_map, idx, map);
  for (i = 0; i < es * (size_t)(T * H); i++) x[i] = (uint8_t)rng_u32();
  if (dt == XTE_DTYPE_FP32)
    for (i = 0; i < (size_t)(T * H); i++) ((float *)x)[i] = rng_f();
  for (i = 0; i < (size_t)(T * SC); i++) xs[i] = rng_f();
  routing.routing_map = use_map ? &mt : NULL;
  routing.topk_idx = use_map ? NULL : &it;
  routing.num_experts = E;
  cfg.num_out_tokens = cap;
  cfg.align = align;
  R = oracle_rows(T, E, k, idx, map, use_map, cap, align, orm, off, kept);
  cr_assert_eq(xte_moe_permute_rows(&routing, &cfg, &rows, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  cr_assert_eq(rows, R);
  for (ii = 0; ii < nisa; ii++) {
    int64_t OR = R + 3, e;
    uint8_t *out = (uint8_t *)malloc(es * (size_t)(OR * H));
    float *os = (float *)malloc(4 * (size_t)(OR * SC));
    int64_t *goff = (int64_t *)malloc(8 * (size_t)(E + 1));
    int32_t *tpe = (int32_t *)malloc(4 * (size_t)E), *r2e = (int32_t *)malloc(4 * (size_t)OR);
    xte_tensor in = xte_tensor_2d(x, dt, T, H), ins = xte_tensor_2d(xs, XTE_DTYPE_FP32, T, SC);
    xte_tensor ot = xte_tensor_2d(out, dt, OR, H), ost = xte_tensor_2d(os, XTE_DTYPE_FP32, OR, SC);
    xte_tensor rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, T, k);
    xte_permute_outputs ex;
    memset(out, 0xAB, es * (size_t)(OR * H));
    memset(os, 0xAB, 4 * (size_t)(OR * SC));
    ex.expert_offsets = xte_tensor_1d(goff, XTE_DTYPE_INT64, E + 1);
    ex.tokens_per_expert = xte_tensor_1d(tpe, XTE_DTYPE_INT32, E);
    ex.row_to_expert = xte_tensor_1d(r2e, XTE_DTYPE_INT32, OR);
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    cr_assert_eq(xte_moe_permute(&in, fp8 ? &ins : NULL, &routing, &cfg, &ot, fp8 ? &ost : NULL,
                                 &rmt, &ex, NULL),
                 XTE_SUCCESS, "%s", xte_last_error());
    cr_assert(memcmp(rm, orm, 4 * (size_t)(T * k)) == 0, "row map");
    for (e = 0; e <= E; e++) cr_assert_eq(goff[e], off[e]);
    for (e = 0; e < E; e++) cr_assert_eq(tpe[e], kept[e]);
    for (e = 0; e < OR; e++) {
      int64_t ex_e = -1, q;
      for (q = 0; q < E; q++)
        if (e >= off[q] && e < off[q] + kept[q]) ex_e = q;
      cr_assert_eq(r2e[e], ex_e, "row_to_expert[%lld]", (long long)e);
    }
    /* data: each mapped row equals its token's; every other row zero */
    {
      uint8_t *want = (uint8_t *)zalloc(es * (size_t)(OR * H));
      float *wants = (float *)zalloc(4 * (size_t)(OR * SC));
      for (t = 0; t < T; t++)
        for (j = 0; j < k; j++)
          if (orm[t * k + j] >= 0) {
            memcpy(want + (size_t)orm[t * k + j] * es * (size_t)H, x + (size_t)t * es * (size_t)H,
                   es * (size_t)H);
            memcpy(wants + (size_t)orm[t * k + j] * (size_t)SC, xs + (size_t)t * (size_t)SC,
                   4 * (size_t)SC);
          }
      cr_assert(memcmp(want, out, es * (size_t)(OR * H)) == 0, "permuted data (isa %d)",
                (int)isas[ii]);
      if (fp8) cr_assert(memcmp(wants, os, 4 * (size_t)(OR * SC)) == 0, "permuted scales");
      free(want), free(wants);
    }
    free(out), free(os), free(goff), free(tpe), free(r2e);
  }
  free(idx), free(map), free(orm), free(rm), free(x), free(xs);
}

Test(moe_permute, map_and_index_all_dtypes) {
  rng_seed(11);
  permute_case(300, 16, 4, 300, XTE_DTYPE_BF16, 1, -1, 1);
  permute_case(300, 16, 4, 300, XTE_DTYPE_BF16, 0, -1, 1);
  permute_case(200, 33, 8, 130, XTE_DTYPE_FP32, 0, -1, 1);
  permute_case(200, 33, 8, 256, XTE_DTYPE_E4M3, 1, -1, 1);
}

Test(moe_permute, capacity_and_alignment) {
  rng_seed(12);
  permute_case(300, 16, 4, 64, XTE_DTYPE_BF16, 1, 500, 1);
  permute_case(300, 16, 4, 64, XTE_DTYPE_BF16, 0, 700, 128);
  permute_case(300, 12, 2, 200, XTE_DTYPE_E4M3, 0, -1, 128);
  permute_case(100, 8, 8, 32, XTE_DTYPE_FP32, 1, 0, 16);
}

/* unpermute and the backward passes */
static void unpermute_case(int T, int E, int k, int H, int use_map, xte_dtype odt) {
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, t, j, h;
  int64_t *idx = (int64_t *)zalloc(8 * (size_t)(T * k)), off[600], kept[600], R;
  uint8_t *map = (uint8_t *)zalloc((size_t)(T * E));
  int32_t *rm = (int32_t *)zalloc(4 * (size_t)(T * k));
  float *x = (float *)zalloc(4 * (size_t)(T * H)), *px, *y = (float *)zalloc(4 * (size_t)(T * H));
  uint16_t *yb = (uint16_t *)zalloc(2 * (size_t)(T * H));
  float *probs = (float *)zalloc(4 * (size_t)(T * (use_map ? E : k)));
  int pc = use_map ? E : k;
  xte_moe_routing routing;
  xte_permute_config cfg = xte_permute_config_default();
  xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, T, k),
             mt = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
  gen_route(T, E, k, 0, idx, map);
  for (t = 0; t < T * H; t++) x[t] = rng_f() * 3.0f;
  routing.routing_map = use_map ? &mt : NULL;
  routing.topk_idx = use_map ? NULL : &it;
  routing.num_experts = E;
  R = oracle_rows(T, E, k, idx, map, use_map, -1, 1, rm, off, kept);
  px = (float *)zalloc(4 * (size_t)(R * H));
  {
    xte_tensor in = xte_tensor_2d(x, XTE_DTYPE_FP32, T, H),
               ot = xte_tensor_2d(px, XTE_DTYPE_FP32, R, H);
    xte_tensor rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, T, k);
    cr_assert_eq(xte_moe_permute(&in, NULL, &routing, &cfg, &ot, NULL, &rmt, NULL, NULL),
                 XTE_SUCCESS);
  }
  for (ii = 0; ii < nisa; ii++) {
    xte_tensor pt = xte_tensor_2d(px, XTE_DTYPE_FP32, R, H),
               rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, T, k);
    xte_tensor prt = xte_tensor_2d(probs, XTE_DTYPE_FP32, T, pc);
    xte_tensor yt =
        odt == XTE_DTYPE_FP32 ? xte_tensor_2d(y, odt, T, H) : xte_tensor_2d(yb, odt, T, H);
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    /* one-hot probs: x exactly */
    memset(probs, 0, 4 * (size_t)(T * pc));
    for (t = 0; t < T; t++) {
      int s = (int)(rng_u32() % (uint32_t)k);
      probs[t * pc + (use_map ? (int)idx[t * k + s] : s)] = 1.0f;
    }
    cr_assert_eq(xte_moe_unpermute(&pt, &routing, &rmt, &prt, &yt, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (t = 0; t < T * H; t++) {
      float v = odt == XTE_DTYPE_FP32 ? y[t] : xte_bf16_to_f32(yb[t]);
      float w = odt == XTE_DTYPE_FP32 ? x[t] : xte_bf16_to_f32(xte_f32_to_bf16(x[t]));
      cr_assert_eq(v, w, "unpermute round trip at %d", t);
    }
    /* general probs: fmaf in slot order */
    for (t = 0; t < T * pc; t++) probs[t] = rng_f();
    cr_assert_eq(xte_moe_unpermute(&pt, &routing, &rmt, &prt, &yt, NULL), XTE_SUCCESS);
    for (t = 0; t < T; t++)
      for (h = 0; h < H; h++) {
        float acc = 0.0f, v;
        int slot = 0;
        for (j = 0; j < (use_map ? E : k); j++) {
          int e = use_map ? j : (int)idx[t * k + j];
          float w;
          if (use_map && !map[t * E + j]) continue;
          w = use_map ? probs[t * pc + e] : probs[t * pc + j];
          acc = fmaf(w, px[(size_t)rm[t * k + (use_map ? slot : j)] * (size_t)H + (size_t)h], acc);
          slot++;
        }
        v = odt == XTE_DTYPE_FP32 ? y[t * H + h] : xte_bf16_to_f32(yb[t * H + h]);
        if (odt == XTE_DTYPE_BF16) acc = xte_bf16_to_f32(xte_f32_to_bf16(acc));
        cr_assert_eq(xte_f32_bits(v), xte_f32_bits(acc), "unpermute [%d, %d]", t, h);
      }
    /* unpermute backward: grad_in rows = w * g; grad_probs = dot */
    {
      float *g = (float *)zalloc(4 * (size_t)(T * H)), *gi = (float *)zalloc(4 * (size_t)(R * H));
      float *gp = (float *)zalloc(4 * (size_t)(T * pc)), *gb = (float *)zalloc(4 * (size_t)(T * H));
      xte_tensor gt = xte_tensor_2d(g, XTE_DTYPE_FP32, T, H),
                 git = xte_tensor_2d(gi, XTE_DTYPE_FP32, R, H);
      xte_tensor gpt = xte_tensor_2d(gp, XTE_DTYPE_FP32, T, pc),
                 gbt = xte_tensor_2d(gb, XTE_DTYPE_FP32, T, H);
      for (t = 0; t < T * H; t++) g[t] = rng_f();
      cr_assert_eq(xte_moe_unpermute_backward(&gt, &pt, &routing, &rmt, &prt, &git, &gpt, NULL),
                   XTE_SUCCESS, "%s", xte_last_error());
      for (t = 0; t < T; t++) {
        int slot = 0;
        for (j = 0; j < (use_map ? E : k); j++) {
          int64_t row;
          float w;
          double dot = 0.0; /* the products are exact in fp64; the sum rounds in fp64 */
          int e = use_map ? j : (int)idx[t * k + j];
          if (use_map && !map[t * E + j]) {
            cr_assert_eq(gp[t * pc + j], 0.0f);
            continue;
          }
          row = rm[t * k + (use_map ? slot : j)];
          w = use_map ? probs[t * pc + e] : probs[t * pc + j];
          for (h = 0; h < H; h++) {
            cr_assert_eq(gi[row * H + h], w * g[t * H + h]);
            dot = dot + (double)g[t * H + h] * (double)px[row * H + h];
          }
          cr_assert_eq(xte_f32_bits(gp[t * pc + (use_map ? e : j)]), xte_f32_bits((float)dot));
          slot++;
        }
      }
      /* permute backward = unpermute with unit weights */
      cr_assert_eq(xte_moe_permute_backward(&git, &routing, &rmt, &gbt, NULL), XTE_SUCCESS);
      for (t = 0; t < T; t++)
        for (h = 0; h < H; h++) {
          float acc = 0.0f;
          for (j = 0; j < k; j++)
            if (rm[t * k + j] >= 0) acc = acc + gi[(size_t)rm[t * k + j] * (size_t)H + (size_t)h];
          cr_assert_eq(xte_f32_bits(gb[t * H + h]), xte_f32_bits(acc));
        }
      free(g), free(gi), free(gp), free(gb);
    }
  }
  free(idx), free(map), free(rm), free(x), free(px), free(y), free(yb), free(probs);
}

Test(moe_permute, unpermute_round_trip_and_backward) {
  rng_seed(13);
  unpermute_case(150, 16, 4, 200, 1, XTE_DTYPE_FP32);
  unpermute_case(150, 16, 4, 200, 0, XTE_DTYPE_FP32);
  unpermute_case(90, 10, 3, 2100, 0, XTE_DTYPE_BF16);
}

Test(moe_permute, sort_chunks) {
  const int R = 100, H = 7, n = 6;
  int64_t split[6] = {10, 0, 35, 20, 5, 30}, order[6] = {3, 0, 5, 1, 4, 2};
  float *x = (float *)zalloc(4 * R * H), *y = (float *)zalloc(4 * R * H),
        *z = (float *)zalloc(4 * R * H);
  int32_t rm[100];
  int i, r, row = 0;
  xte_tensor xt = xte_tensor_2d(x, XTE_DTYPE_FP32, R, H),
             yt = xte_tensor_2d(y, XTE_DTYPE_FP32, R, H);
  xte_tensor zt = xte_tensor_2d(z, XTE_DTYPE_FP32, R, H),
             st = xte_tensor_1d(split, XTE_DTYPE_INT64, n);
  xte_tensor ot = xte_tensor_1d(order, XTE_DTYPE_INT64, n),
             rt = xte_tensor_1d(rm, XTE_DTYPE_INT32, R);
  for (i = 0; i < R * H; i++) x[i] = (float)i;
  cr_assert_eq(xte_moe_sort_chunks_by_index(&xt, &st, &ot, &yt, &rt, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  for (i = 0; i < n; i++) {
    int64_t c = order[i], s0 = 0;
    for (r = 0; r < c; r++) s0 += split[r];
    for (r = 0; r < split[c]; r++, row++) {
      cr_assert_eq(y[row * H], x[(s0 + r) * H]);
      cr_assert_eq(rm[s0 + r], row);
    }
  }
  cr_assert_eq(xte_moe_sort_chunks_backward(&yt, &rt, &zt, NULL), XTE_SUCCESS);
  cr_assert(memcmp(x, z, 4 * R * H) == 0);
  free(x), free(y), free(z);
}

Test(moe_permute, dispatch_layout) {
  const int T = 500, E = 64, k = 6, ranks = 8;
  int64_t *idx = (int64_t *)zalloc(8 * T * k);
  uint8_t *map = (uint8_t *)zalloc(T * E), *in = (uint8_t *)zalloc(T * ranks);
  int32_t tpr[8], tpe[64], wr[8] = {0}, we[64] = {0};
  int t, j, r;
  xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, T, k),
             a = xte_tensor_1d(tpr, XTE_DTYPE_INT32, ranks);
  xte_tensor b = xte_tensor_1d(tpe, XTE_DTYPE_INT32, E),
             c = xte_tensor_2d(in, XTE_DTYPE_UINT8, T, ranks);
  rng_seed(14);
  gen_route(T, E, k, 1, idx, map);
  cr_assert_eq(xte_moe_dispatch_layout(&it, E, ranks, &a, &b, &c, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  for (t = 0; t < T; t++) {
    int seen[8] = {0};
    for (j = 0; j < k; j++)
      if (idx[t * k + j] >= 0) {
        we[idx[t * k + j]]++;
        seen[idx[t * k + j] / (E / ranks)] = 1;
      }
    for (r = 0; r < ranks; r++) {
      wr[r] += seen[r];
      cr_assert_eq(in[t * ranks + r], seen[r]);
    }
  }
  cr_assert(memcmp(wr, tpr, sizeof wr) == 0);
  cr_assert(memcmp(we, tpe, sizeof we) == 0);
  free(idx), free(map), free(in);
}

/* The unpermute forward of every ISA equals the scalar ISA's bytes: bf16 and fp32 inputs and
 * outputs, NaN / inf / huge values (the bf16 rounding), -1 slots, hidden sizes with a tail, more
 * slots than the SIMD kernel's lists (64), and an output large enough for non-temporal stores. */
static void unpermute_isas_case(int T, int E, int k, int H, xte_dtype idt, xte_dtype odt) {
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, t, j;
  const int rows = T * k;
  const size_t ies = xte_dtype_size(idt), oes = xte_dtype_size(odt);
  int64_t *idx = (int64_t *)zalloc(8 * (size_t)T * (size_t)k);
  int32_t *rm = (int32_t *)zalloc(4 * (size_t)T * (size_t)k);
  float *w = (float *)zalloc(4 * (size_t)T * (size_t)k);
  char *in = (char *)zalloc(ies * (size_t)rows * (size_t)H);
  char *ref = (char *)zalloc(oes * (size_t)T * (size_t)H),
       *out = (char *)zalloc(oes * (size_t)T * (size_t)H);
  int32_t *perm = (int32_t *)zalloc(4 * (size_t)rows);
  size_t i;
  /* rows in a random order: each row at most once (the unpermute rejects a row mapped twice) */
  for (i = 0; i < (size_t)rows; i++) perm[i] = (int32_t)i;
  for (i = (size_t)rows; i > 1; i--) {
    size_t r = rng_u32() % i;
    int32_t tmp = perm[i - 1];
    perm[i - 1] = perm[r];
    perm[r] = tmp;
  }
  for (t = 0; t < T; t++)
    for (j = 0; j < k; j++) {
      int drop = rng_u32() % 8 == 0;
      idx[t * k + j] = drop ? -1 : (t + j) % E;
      rm[t * k + j] = drop ? -1 : perm[t * k + j];
      w[t * k + j] = rng_f() * 2.0f;
    }
  free(perm);
  for (i = 0; i < (size_t)rows * (size_t)H; i++) {
    uint32_t r = rng_u32() % 1000;
    float v = r == 0 ? NAN : r == 1 ? INFINITY : r == 2 ? 3e38f : rng_f() * 8.0f;
    if (idt == XTE_DTYPE_FP32)
      memcpy(in + 4 * i, &v, 4);
    else
      ((uint16_t *)in)[i] = xte_f32_to_bf16(v);
  }
  for (ii = 0; ii < nisa; ii++) {
    xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, T, k),
               rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, T, k);
    xte_tensor xt = xte_tensor_2d(in, idt, rows, H), wt = xte_tensor_2d(w, XTE_DTYPE_FP32, T, k);
    xte_tensor yt = xte_tensor_2d(ii == 0 ? ref : out, odt, T, H);
    xte_moe_routing routing;
    routing.routing_map = NULL;
    routing.topk_idx = &it;
    routing.num_experts = E;
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    cr_assert_eq(xte_moe_unpermute(&xt, &routing, &rmt, &wt, &yt, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    if (ii > 0)
      cr_assert(memcmp(ref, out, oes * (size_t)T * (size_t)H) == 0,
                "unpermute (isa %d, T %d k %d H %d) differs from scalar", (int)isas[ii], T, k, H);
  }
  xte_cpu_set_isa(isas[nisa - 1]);
  free(idx), free(rm), free(w), free(in), free(ref), free(out);
}

Test(moe_permute, unpermute_isas_agree) {
  rng_seed(17);
  unpermute_isas_case(600, 64, 2, 7168, XTE_DTYPE_BF16, XTE_DTYPE_BF16); /* 8.6 MB: streamed */
  unpermute_isas_case(600, 64, 4, 4096, XTE_DTYPE_FP32, XTE_DTYPE_FP32); /* 9.8 MB: streamed */
  unpermute_isas_case(77, 16, 5, 130, XTE_DTYPE_FP32, XTE_DTYPE_BF16);
  unpermute_isas_case(50, 16, 3, 200, XTE_DTYPE_BF16, XTE_DTYPE_FP32);
  unpermute_isas_case(20, 80, 70, 100, XTE_DTYPE_BF16, XTE_DTYPE_BF16); /* 70 slots */
}

/* fp16 rows through the permute, the unpermute and both backwards, with the sizes of
 * TransformerEngine's tests and past them: 1100 experts, 36 experts per token (topk_idx int64 and
 * a routing map), a hidden size with a tail. Against oracles: rows moved byte for byte; the
 * unpermute an fmaf chain over the slots from +0 rounded once to fp16 (specials included); the
 * unpermute backward fp16(w g) per slot and the dots (fp64 sums of the exact products, rounded
 * once); the permute backward the sum of the slots' rows. Every ISA. */
static uint16_t rnd_fp16(void) {
  static const uint16_t sp[] = {0x7C00u, 0xFC00u, 0x7E00u, 0x0001u, 0x8000u, 0x03FFu, 0x7BFFu};
  uint32_t r = rng_u32();
  if (r % 61 == 0) return sp[(r >> 8) % 7];
  return (uint16_t)((rng_u32() & 0x83FFu) | ((8u + rng_u32() % 16u) << 10));
}

static void fp16_big_case(int T, int E, int k, int H, int use_map) {
  xte_cpu_isa isas[XTE_CPU_ISA_COUNT];
  int nisa = moe_isas(isas), ii, t, j, h;
  int64_t *idx = (int64_t *)zalloc(8 * (size_t)(T * k)), R;
  int64_t *off = (int64_t *)zalloc(8 * (size_t)(E + 1)), *kept = (int64_t *)zalloc(8 * (size_t)E);
  uint8_t *map = (uint8_t *)zalloc((size_t)(T * E));
  int32_t *orm = (int32_t *)zalloc(4 * (size_t)(T * k)),
          *rm = (int32_t *)zalloc(4 * (size_t)(T * k));
  uint16_t *x = (uint16_t *)zalloc(2 * (size_t)(T * H));
  float *w = (float *)zalloc(4 * (size_t)(T * (use_map ? E : k)));
  const int pc = use_map ? E : k;
  xte_moe_routing routing;
  xte_permute_config cfg = xte_permute_config_default();
  xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, T, k),
             mt = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
  gen_route(T, E, k, !use_map, idx, map);
  for (t = 0; t < T * H; t++) x[t] = rnd_fp16();
  for (t = 0; t < T * pc; t++) w[t] = rng_f() * 2.0f;
  routing.routing_map = use_map ? &mt : NULL;
  routing.topk_idx = use_map ? NULL : &it;
  routing.num_experts = E;
  R = oracle_rows(T, E, k, idx, map, use_map, -1, 1, orm, off, kept);
  for (ii = 0; ii < nisa; ii++) {
    uint16_t *px = (uint16_t *)malloc(2 * (size_t)(R * H)),
             *y = (uint16_t *)malloc(2 * (size_t)(T * H));
    uint16_t *g = (uint16_t *)malloc(2 * (size_t)(T * H)),
             *gi = (uint16_t *)malloc(2 * (size_t)(R * H));
    uint16_t *gb = (uint16_t *)malloc(2 * (size_t)(T * H));
    float *gp = (float *)malloc(4 * (size_t)(T * pc));
    xte_tensor in = xte_tensor_2d(x, XTE_DTYPE_FP16, T, H),
               pt = xte_tensor_2d(px, XTE_DTYPE_FP16, R, H);
    xte_tensor rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, T, k),
               wt = xte_tensor_2d(w, XTE_DTYPE_FP32, T, pc);
    xte_tensor yt = xte_tensor_2d(y, XTE_DTYPE_FP16, T, H),
               gt = xte_tensor_2d(g, XTE_DTYPE_FP16, T, H);
    xte_tensor git = xte_tensor_2d(gi, XTE_DTYPE_FP16, R, H),
               gbt = xte_tensor_2d(gb, XTE_DTYPE_FP16, T, H);
    xte_tensor gpt = xte_tensor_2d(gp, XTE_DTYPE_FP32, T, pc);
    cr_assert_eq(xte_cpu_set_isa(isas[ii]), XTE_SUCCESS);
    cr_assert_eq(xte_moe_permute(&in, NULL, &routing, &cfg, &pt, NULL, &rmt, NULL, NULL),
                 XTE_SUCCESS, "%s", xte_last_error());
    cr_assert(memcmp(rm, orm, 4 * (size_t)(T * k)) == 0, "row map (isa %d)", (int)isas[ii]);
    for (t = 0; t < T; t++)
      for (j = 0; j < k; j++)
        if (orm[t * k + j] >= 0)
          cr_assert(memcmp(px + (size_t)orm[t * k + j] * (size_t)H, x + (size_t)t * (size_t)H,
                           2 * (size_t)H) == 0,
                    "permuted row of token %d slot %d", t, j);
    /* unpermute: the fmaf chain in slot order, one rounding to fp16 */
    cr_assert_eq(xte_moe_unpermute(&pt, &routing, &rmt, &wt, &yt, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (t = 0; t < T * H; t++) g[t] = rnd_fp16();
    cr_assert_eq(xte_moe_unpermute_backward(&gt, &pt, &routing, &rmt, &wt, &git, &gpt, NULL),
                 XTE_SUCCESS, "%s", xte_last_error());
    cr_assert_eq(xte_moe_permute_backward(&git, &routing, &rmt, &gbt, NULL), XTE_SUCCESS, "%s",
                 xte_last_error());
    for (t = 0; t < T; t++) {
      int slot = 0;
      for (h = 0; h < H; h++) {
        float acc = 0.0f, sum = 0.0f;
        for (j = 0; j < k; j++) {
          int64_t row = orm[t * k + j];
          int e;
          if (row < 0) continue;
          e = use_map ? -1 : (int)idx[t * k + j];
          if (use_map) { /* slot j: the j-th routed expert */
            int s = -1;
            for (e = 0; e < E && s < j; e++) s += map[t * E + e];
            e--;
          }
          acc = fmaf(w[t * pc + (use_map ? e : j)], xte_fp16_to_f32(px[row * H + h]), acc);
          sum = sum + xte_fp16_to_f32(gi[row * H + h]);
          cr_assert_eq(
              gi[row * H + h],
              xte_f32_to_fp16(w[t * pc + (use_map ? e : j)] * xte_fp16_to_f32(g[t * H + h])),
              "grad_input [%lld, %d]", (long long)row, h);
        }
        cr_assert_eq(y[t * H + h], xte_f32_to_fp16(acc), "unpermute [%d, %d] isa %d", t, h,
                     (int)isas[ii]);
        cr_assert_eq(gb[t * H + h], xte_f32_to_fp16(sum), "permute backward [%d, %d]", t, h);
      }
      for (j = 0; j < k; j++) {
        int64_t row = orm[t * k + j];
        double dot = 0.0;
        float got;
        int e = use_map ? -1 : (int)idx[t * k + j];
        if (row < 0) continue;
        if (use_map) {
          int s = -1;
          for (e = 0; e < E && s < j; e++) s += map[t * E + e];
          e--;
        }
        for (h = 0; h < H; h++) /* fp64: exact products, one fp64 rounding per sum */
          dot = dot +
                (double)xte_fp16_to_f32(g[t * H + h]) * (double)xte_fp16_to_f32(px[row * H + h]);
        got = gp[t * pc + (use_map ? e : j)];
        if (isnan(dot)) /* NaN / inf data: a NaN (its bits are the NaN rule's: test_nan_rule) */
          cr_assert(isnan(got), "grad_probs [%d, %d] not NaN", t, j);
        else
          cr_assert_eq(xte_f32_bits(got), xte_f32_bits((float)dot), "grad_probs [%d, %d]", t, j);
        slot++;
      }
      (void)slot;
    }
    free(px), free(y), free(g), free(gi), free(gb), free(gp);
  }
  free(idx), free(off), free(kept), free(map), free(orm), free(rm), free(x), free(w);
}

Test(moe_permute, fp16_big_topk_and_experts) {
  rng_seed(19);
  fp16_big_case(40, 1100, 36, 70, 0);
  fp16_big_case(30, 1100, 36, 33, 1);
  fp16_big_case(25, 2048, 40, 64, 0); /* 64-wide blocks (the AVX2 lists) with fp16 */
}

/* Hostile input to the MoE token movement and aux loss (issue 15): every call gets outputs filled
 * with a sentinel inside larger guard buffers, then bad input; it must return the stated status,
 * a message naming the argument, and leave every byte of the guard buffers as it was (so a write
 * out of the claimed bounds is seen too, without corrupting the heap). Covered: row_map entries
 * out of range, on an empty routing slot, or twice (unpermute, permute backward, unpermute
 * backward); num_experts past XTE_MOE_MAX_EXPERTS; split_sizes whose int64 sum wraps to the row
 * count; misaligned aux-loss / permute-rows output pointers; allocation failures (every n-th
 * allocation) in the token movement: XTE_ERROR_OUT_OF_MEMORY and nothing written, or success
 * with the right bytes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <time.h>

#include "test_moe_util.h"

/* src/alloc.c: makes the n-th allocation from now fail (-1: none), and counts them. */
XTE_API void xte_internal_fail_alloc(int64_t nth);
XTE_API int64_t xte_internal_alloc_count(void);

#define SENT 0x77
#define GUARD_ROWS 1100 /* rows of slack after a [rows, H] output: row_map entries up to 1000 */
#define H 8

/* A guarded fp32 output: base holds 1 row before and GUARD_ROWS after the claimed rows. */
typedef struct gbuf {
  float *base;
  size_t bytes;
  int64_t rows, cols;
} gbuf;

static void g_make(gbuf *g, int64_t rows, int64_t cols) {
  g->rows = rows;
  g->cols = cols;
  g->bytes = 4 * (size_t)cols * (size_t)(rows + 1 + GUARD_ROWS);
  g->base = (float *)malloc(g->bytes);
  memset(g->base, SENT, g->bytes);
}
static float *g_data(const gbuf *g) {
  return g->base + g->cols; /* one row in: a write to row -1 or element -1 lands in the guard */
}
static xte_tensor g_tensor(const gbuf *g) {
  return xte_tensor_2d(g_data(g), XTE_DTYPE_FP32, g->rows, g->cols);
}
static void g_reset(gbuf *g) {
  memset(g->base, SENT, g->bytes);
}
static int g_untouched(const gbuf *g) {
  size_t i;
  for (i = 0; i < g->bytes; i++)
    if (((const uint8_t *)g->base)[i] != SENT) return 0;
  return 1;
}
static void g_free(gbuf *g) {
  free(g->base);
}

static void expect_err(xte_status s, xte_status want, const char *needle, const char *what) {
  cr_expect_eq(s, want, "%s: status %s, want %s (%s)", what, xte_status_string(s),
               xte_status_string(want), xte_last_error());
  cr_expect(xte_last_error()[0] != '\0', "%s: empty message", what);
  cr_expect(strstr(xte_last_error(), needle) != NULL, "%s: message '%s' does not name '%s'", what,
            xte_last_error(), needle);
}

/* ---------------------------------------------------------------- row_map checks */

/* One case: routing (2 tokens, 4 experts, 2 slots) and a row_map; the three gathers / scatters
 * that read row_map must all refuse it before writing. probs: dense [T, E] with a map, else
 * [T, k]. */
static void row_map_case(int use_map, const int32_t rm_in[4], const char *needle,
                         const char *what) {
  enum { T = 2, E = 4, K = 2, ROWS = 4 };
  int64_t idx[T * K] = {0, 1, 2, -1};
  uint8_t map[T * E] = {1, 1, 0, 0, 0, 0, 1, 0}; /* token 0: experts 0, 1; token 1: expert 2 */
  int32_t rm[T * K];
  float in[ROWS * H], probs[T * E], fwd_in[ROWS * H];
  gbuf out, gin, gprobs;
  xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, T, K),
             mt = xte_tensor_2d(map, XTE_DTYPE_UINT8, T, E);
  xte_tensor rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, T, K);
  xte_tensor xt = xte_tensor_2d(in, XTE_DTYPE_FP32, ROWS, H);
  xte_tensor pt = xte_tensor_2d(probs, XTE_DTYPE_FP32, T, use_map ? E : K);
  xte_tensor ft = xte_tensor_2d(fwd_in, XTE_DTYPE_FP32, ROWS, H);
  xte_tensor ot, gt, gpt, got;
  xte_moe_routing r;
  float gout[T * H];
  int i;
  char w[160];
  memcpy(rm, rm_in, sizeof rm);
  r.routing_map = use_map ? &mt : NULL;
  r.topk_idx = use_map ? NULL : &it;
  r.num_experts = E;
  for (i = 0; i < ROWS * H; i++) in[i] = fwd_in[i] = (float)i * 0.25f;
  for (i = 0; i < T * E; i++) probs[i] = 0.5f;
  for (i = 0; i < T * H; i++) gout[i] = 1.0f + (float)i;
  g_make(&out, T, H);
  g_make(&gin, ROWS, H);
  g_make(&gprobs, T, use_map ? E : K);
  ot = g_tensor(&out);
  gt = g_tensor(&gin);
  gpt = g_tensor(&gprobs);
  got = xte_tensor_2d(gout, XTE_DTYPE_FP32, T, H);

  snprintf(w, sizeof w, "%s: unpermute (map %d)", what, use_map);
  expect_err(xte_moe_unpermute(&xt, &r, &rmt, &pt, &ot, NULL), XTE_ERROR_INVALID_ARGUMENT, needle,
             w);
  cr_expect(g_untouched(&out), "%s: out written", w);
  g_reset(&out);
  snprintf(w, sizeof w, "%s: permute backward (map %d)", what, use_map);
  expect_err(xte_moe_permute_backward(&xt, &r, &rmt, &ot, NULL), XTE_ERROR_INVALID_ARGUMENT, needle,
             w);
  cr_expect(g_untouched(&out), "%s: grad_input written", w);
  snprintf(w, sizeof w, "%s: unpermute backward (map %d)", what, use_map);
  expect_err(xte_moe_unpermute_backward(&got, &ft, &r, &rmt, &pt, &gt, &gpt, NULL),
             XTE_ERROR_INVALID_ARGUMENT, needle, w);
  cr_expect(g_untouched(&gin), "%s: grad_input written", w);
  cr_expect(g_untouched(&gprobs), "%s: grad_probs written", w);
  /* the same without grad_probs */
  expect_err(xte_moe_unpermute_backward(&got, NULL, &r, &rmt, NULL, &gt, NULL, NULL),
             XTE_ERROR_INVALID_ARGUMENT, needle, w);
  cr_expect(g_untouched(&gin), "%s: grad_input written (no probs)", w);
  cr_expect(memcmp(rm, rm_in, sizeof rm) == 0);
  g_free(&out);
  g_free(&gin);
  g_free(&gprobs);
}

Test(moe_hostile, row_map_out_of_range) {
  const int32_t far[4] = {0, 1000, 2, -1}, neg[4] = {0, -2, 2, -1}, edge[4] = {0, 4, 2, -1};
  row_map_case(0, far, "row_map[0, 1] = 1000", "row 1000");
  row_map_case(1, far, "row_map[0, 1] = 1000", "row 1000");
  row_map_case(0, neg, "row_map[0, 1] = -2", "row -2");
  row_map_case(1, edge, "row_map[0, 1] = 4", "row 4 of 4");
}

Test(moe_hostile, row_map_on_empty_slot) {
  /* token 1 has one expert: its slot 1 has none (topk_idx -1, or the map's second expert
   * missing), so a row there would read probs[-1] / write grad_probs[-1] */
  const int32_t rm[4] = {0, 1, 2, 3};
  row_map_case(1, rm, "row_map[1, 1] = 3", "row on an empty map slot");
  row_map_case(0, rm, "row_map[1, 1] = 3", "row on a -1 topk slot");
}

Test(moe_hostile, row_map_duplicate_rows) {
  const int32_t dup[4] = {1, 0, 1, -1};
  row_map_case(0, dup, "row_map[1, 0] = 1", "duplicate row");
  row_map_case(1, dup, "row_map[1, 0] = 1", "duplicate row");
}

Test(moe_hostile, row_map_valid_still_accepted) {
  /* the checks refuse nothing a permute produces: -1 on dropped slots with an expert is fine */
  enum { T = 2, E = 4, K = 2, ROWS = 4 };
  int64_t idx[T * K] = {0, 1, 2, -1};
  int32_t rm[T * K] = {3, -1, 0, -1};
  float in[ROWS * H], out[T * H];
  xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, T, K),
             rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, T, K);
  xte_tensor xt = xte_tensor_2d(in, XTE_DTYPE_FP32, ROWS, H),
             ot = xte_tensor_2d(out, XTE_DTYPE_FP32, T, H);
  xte_moe_routing r = {NULL, &it, E};
  int i;
  for (i = 0; i < ROWS * H; i++) in[i] = (float)i;
  cr_assert_eq(xte_moe_unpermute(&xt, &r, &rmt, NULL, &ot, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  for (i = 0; i < H; i++) {
    cr_assert_eq(out[i], in[3 * H + i]);
    cr_assert_eq(out[H + i], in[i]);
  }
}

/* ---------------------------------------------------------------- num_experts bound */

Test(moe_hostile, num_experts_upper_bound) {
  enum { T = 4, K = 2 };
  const int64_t huge[3] = {(int64_t)1 << 60, XTE_MOE_MAX_EXPERTS + 1, INT64_MAX};
  int64_t idx[T * K] = {0, 1, 1, 2, 2, 3, 3, 0}, rows = -7;
  int32_t rm[T * K];
  float in[T * H];
  gbuf out, tpr;
  uint8_t inrank[T * 4];
  xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, T, K),
             rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, T, K);
  xte_tensor xt = xte_tensor_2d(in, XTE_DTYPE_FP32, T, H), ot, tt, irt;
  xte_moe_routing r = {NULL, &it, 0};
  int c;
  memset(in, 0, sizeof in);
  g_make(&out, T * K, H);
  g_make(&tpr, 1, 1);
  ot = g_tensor(&out);
  tt = xte_tensor_1d(g_data(&tpr), XTE_DTYPE_INT32, 1);
  irt = xte_tensor_2d(inrank, XTE_DTYPE_UINT8, T, 1);
  for (c = 0; c < 3; c++) {
    r.num_experts = huge[c];
    memset(rm, SENT, sizeof rm);
    memset(inrank, SENT, sizeof inrank);
    g_reset(&out);
    g_reset(&tpr);
    expect_err(xte_moe_permute(&xt, NULL, &r, NULL, &ot, NULL, &rmt, NULL, NULL),
               XTE_ERROR_INVALID_ARGUMENT, "num_experts", "permute");
    cr_expect(g_untouched(&out), "permute output written");
    for (int i = 0; i < (int)sizeof rm; i++) cr_expect_eq(((uint8_t *)rm)[i], SENT);
    expect_err(xte_moe_permute_rows(&r, NULL, &rows, NULL), XTE_ERROR_INVALID_ARGUMENT,
               "num_experts", "permute_rows");
    cr_expect_eq(rows, -7);
    rm[0] = 0, rm[1] = 1, rm[2] = 2, rm[3] = 3, rm[4] = 4, rm[5] = 5, rm[6] = 6, rm[7] = 7;
    expect_err(xte_moe_unpermute(&ot, &r, &rmt, NULL, &xt, NULL), XTE_ERROR_INVALID_ARGUMENT,
               "num_experts", "unpermute");
    expect_err(xte_moe_dispatch_layout(&it, huge[c], 1, &tt, NULL, &irt, NULL),
               XTE_ERROR_INVALID_ARGUMENT, "num_experts", "dispatch_layout");
    cr_expect(g_untouched(&tpr), "tokens_per_rank written");
    for (int i = 0; i < (int)sizeof inrank; i++) cr_expect_eq(inrank[i], SENT);
  }
  /* the bound itself is accepted */
  r.num_experts = XTE_MOE_MAX_EXPERTS;
  cr_expect_eq(xte_moe_permute_rows(&r, NULL, &rows, NULL), XTE_SUCCESS, "%s", xte_last_error());
  cr_expect_eq(rows, T * K);
  g_free(&out);
  g_free(&tpr);
}

/* ---------------------------------------------------------------- sort chunks */

static void sort_wrap_case(const int64_t *split, int n, const char *what) {
  enum { R = 4 };
  int64_t index[8];
  float in[R * H];
  gbuf out, rmap;
  xte_tensor xt = xte_tensor_2d(in, XTE_DTYPE_FP32, R, H),
             st = xte_tensor_1d((void *)split, XTE_DTYPE_INT64, n),
             it = xte_tensor_1d(index, XTE_DTYPE_INT64, n), ot, rmt;
  int i;
  for (i = 0; i < n; i++) index[i] = n - 1 - i;
  for (i = 0; i < R * H; i++) in[i] = (float)i;
  g_make(&out, R, H);
  g_make(&rmap, 1, R);
  ot = g_tensor(&out);
  rmt = xte_tensor_1d(g_data(&rmap), XTE_DTYPE_INT32, R);
  expect_err(xte_moe_sort_chunks_by_index(&xt, &st, &it, &ot, &rmt, NULL), XTE_ERROR_SHAPE,
             "split_sizes", what);
  cr_expect(g_untouched(&out), "%s: output written", what);
  cr_expect(g_untouched(&rmap), "%s: row_map written", what);
  g_free(&out);
  g_free(&rmap);
}

Test(moe_hostile, sort_chunks_split_sum_wraps) {
  /* int64 sums that wrap modulo 2^64 to the 4 rows */
  const int64_t a[5] = {4, (int64_t)1 << 62, (int64_t)1 << 62, (int64_t)1 << 62, (int64_t)1 << 62};
  const int64_t b[3] = {INT64_MAX, INT64_MAX, 6};
  const int64_t c[2] = {5, 0}; /* plainly too many */
  sort_wrap_case(a, 5, "2^62 x 4 + 4");
  sort_wrap_case(b, 3, "INT64_MAX x 2 + 6");
  sort_wrap_case(c, 2, "5 of 4 rows");
}

/* ---------------------------------------------------------------- alignment */

Test(moe_hostile, misaligned_scalar_outputs) {
  enum { T = 4, E = 4 };
  float probs[T * E];
  int32_t tpe[E] = {1, 2, 3, 4};
  int64_t idx[T] = {0, 1, 2, 3};
  _Alignas(16) uint8_t buf[32];
  xte_tensor pt = xte_tensor_2d(probs, XTE_DTYPE_FP32, T, E),
             tt = xte_tensor_1d(tpe, XTE_DTYPE_INT32, E),
             it = xte_tensor_2d(idx, XTE_DTYPE_INT64, T, 1);
  xte_moe_routing r = {NULL, &it, E};
  int i, off;
  for (i = 0; i < T * E; i++) probs[i] = 0.25f;
  for (off = 1; off < 4; off++) {
    memset(buf, SENT, sizeof buf);
    expect_err(xte_moe_aux_loss_forward(&pt, &tt, T, 1, 1e-2f, (float *)(void *)(buf + off), NULL),
               XTE_ERROR_ALIGNMENT, "aux_loss", "aux loss");
    for (i = 0; i < (int)sizeof buf; i++) cr_expect_eq(buf[i], SENT, "aux_loss byte %d written", i);
  }
  for (off = 1; off < 8; off++) {
    memset(buf, SENT, sizeof buf);
    expect_err(xte_moe_permute_rows(&r, NULL, (int64_t *)(void *)(buf + off), NULL),
               XTE_ERROR_ALIGNMENT, "rows", "permute rows");
    for (i = 0; i < (int)sizeof buf; i++) cr_expect_eq(buf[i], SENT, "rows byte %d written", i);
  }
  /* aligned: accepted */
  cr_expect_eq(xte_moe_aux_loss_forward(&pt, &tt, T, 1, 1e-2f, (float *)(void *)buf, NULL),
               XTE_SUCCESS, "%s", xte_last_error());
}

/* ---------------------------------------------------------------- allocation failures
 * For n = 0, 1, ...: the n-th allocation of the call fails. The call either returns
 * XTE_ERROR_OUT_OF_MEMORY with a message and every output byte as it was, or (n past the call's
 * allocations) succeeds with the bytes of an unfailing call. */

typedef struct alloc_case {
  int which; /* 0 unpermute, 1 permute backward, 2 unpermute backward, 3 permute, 4 sort chunks */
} alloc_case;

enum { AT = 64, AE = 8, AK = 2, AH = 3000 }; /* H > the 2048 chunk of the scratch-free loops */

typedef struct alloc_io {
  int64_t idx[AT * AK];
  int32_t rm[AT * AK];
  float *in, *probs, *fwd_in, *gout;
  int64_t split[4], sidx[4];
} alloc_io;

static void alloc_io_make(alloc_io *io) {
  int t, j, i;
  io->in = (float *)zalloc(4 * (size_t)AT * AK * AH);
  io->fwd_in = (float *)zalloc(4 * (size_t)AT * AK * AH);
  io->gout = (float *)zalloc(4 * (size_t)AT * AK * AH);
  io->probs = (float *)zalloc(4 * (size_t)AT * AK);
  rng_seed(99);
  for (t = 0; t < AT; t++)
    for (j = 0; j < AK; j++) {
      io->idx[t * AK + j] = (t + 3 * j) % AE;
      io->probs[t * AK + j] = rng_f();
    }
  for (i = 0; i < AT * AK * AH; i++) {
    io->in[i] = rng_f();
    io->fwd_in[i] = rng_f();
    io->gout[i] = rng_f();
  }
  io->split[0] = 10, io->split[1] = 0, io->split[2] = 50, io->split[3] = AT - 60;
  io->sidx[0] = 2, io->sidx[1] = 0, io->sidx[2] = 3, io->sidx[3] = 1;
}

/* Runs call `which`; outputs in o1 (and o2). */
static xte_status alloc_call(alloc_io *io, int which, float *o1, float *o2) {
  xte_tensor it = xte_tensor_2d(io->idx, XTE_DTYPE_INT64, AT, AK),
             rmt = xte_tensor_2d(io->rm, XTE_DTYPE_INT32, AT, AK);
  xte_tensor pt = xte_tensor_2d(io->probs, XTE_DTYPE_FP32, AT, AK);
  xte_moe_routing r = {NULL, &it, AE};
  xte_tensor perm = xte_tensor_2d(io->in, XTE_DTYPE_FP32, AT * AK, AH),
             tok = xte_tensor_2d(io->gout, XTE_DTYPE_FP32, AT, AH);
  switch (which) {
    case 0: {
      xte_tensor ot = xte_tensor_2d(o1, XTE_DTYPE_FP32, AT, AH);
      return xte_moe_unpermute(&perm, &r, &rmt, &pt, &ot, NULL);
    }
    case 1: {
      xte_tensor ot = xte_tensor_2d(o1, XTE_DTYPE_FP32, AT, AH);
      return xte_moe_permute_backward(&perm, &r, &rmt, &ot, NULL);
    }
    case 2: {
      xte_tensor ft = xte_tensor_2d(io->fwd_in, XTE_DTYPE_FP32, AT * AK, AH);
      xte_tensor gi = xte_tensor_2d(o1, XTE_DTYPE_FP32, AT * AK, AH),
                 gp = xte_tensor_2d(o2, XTE_DTYPE_FP32, AT, AK);
      return xte_moe_unpermute_backward(&tok, &ft, &r, &rmt, &pt, &gi, &gp, NULL);
    }
    case 3: {
      xte_tensor ot = xte_tensor_2d(o1, XTE_DTYPE_FP32, AT * AK, AH);
      xte_tensor rmo = xte_tensor_2d(o2, XTE_DTYPE_INT32, AT, AK);
      return xte_moe_permute(&tok, NULL, &r, NULL, &ot, NULL, &rmo, NULL, NULL);
    }
    default: {
      xte_tensor st = xte_tensor_1d(io->split, XTE_DTYPE_INT64, 4),
                 si = xte_tensor_1d(io->sidx, XTE_DTYPE_INT64, 4);
      xte_tensor ot = xte_tensor_2d(o1, XTE_DTYPE_FP32, AT, AH),
                 rmo = xte_tensor_1d(o2, XTE_DTYPE_INT32, AT);
      return xte_moe_sort_chunks_by_index(&tok, &st, &si, &ot, &rmo, NULL);
    }
  }
}

Test(moe_hostile, allocation_failures_write_nothing) {
  const size_t n1 = 4 * (size_t)AT * AK * AH, n2 = 4 * (size_t)AT * AK;
  alloc_io io;
  float *ref1 = (float *)zalloc(n1), *ref2 = (float *)zalloc(n2);
  float *o1 = (float *)zalloc(n1), *o2 = (float *)zalloc(n2);
  int which, n, t, j;
  alloc_io_make(&io);
  for (which = 0; which < 5; which++) {
    int finished = 0;
    /* a valid row map (a permute's, from a first unfailing permute) */
    {
      xte_tensor it = xte_tensor_2d(io.idx, XTE_DTYPE_INT64, AT, AK),
                 rmt = xte_tensor_2d(io.rm, XTE_DTYPE_INT32, AT, AK);
      xte_tensor tok = xte_tensor_2d(io.gout, XTE_DTYPE_FP32, AT, AH),
                 ot = xte_tensor_2d(o1, XTE_DTYPE_FP32, AT * AK, AH);
      xte_moe_routing r = {NULL, &it, AE};
      cr_assert_eq(xte_moe_permute(&tok, NULL, &r, NULL, &ot, NULL, &rmt, NULL, NULL), XTE_SUCCESS,
                   "%s", xte_last_error());
      for (t = 0; t < AT; t++)
        for (j = 0; j < AK; j++) cr_assert(io.rm[t * AK + j] >= 0);
    }
    memset(ref1, SENT, n1);
    memset(ref2, SENT, n2);
    cr_assert_eq(alloc_call(&io, which, ref1, ref2), XTE_SUCCESS, "call %d: %s", which,
                 xte_last_error());
    for (n = 0; n < 64 && !finished; n++) {
      xte_status s;
      int64_t used;
      memset(o1, SENT, n1);
      memset(o2, SENT, n2);
      xte_internal_fail_alloc(n);
      s = alloc_call(&io, which, o1, o2);
      used = xte_internal_alloc_count();
      xte_internal_fail_alloc(-1);
      if (s == XTE_SUCCESS) {
        cr_expect(memcmp(o1, ref1, n1) == 0 && memcmp(o2, ref2, n2) == 0,
                  "call %d, allocation %d failed: success with other bytes", which, n);
        finished = used <= n; /* the failure was never reached */
        cr_expect(finished, "call %d: allocation %d failed, yet success", which, n);
        finished = 1;
      } else {
        size_t i;
        int same = 1;
        cr_expect_eq(s, XTE_ERROR_OUT_OF_MEMORY, "call %d, allocation %d: %s (%s)", which, n,
                     xte_status_string(s), xte_last_error());
        cr_expect(xte_last_error()[0] != '\0', "call %d: empty message", which);
        for (i = 0; i < n1 && same; i++) same = ((uint8_t *)o1)[i] == SENT;
        for (i = 0; i < n2 && same; i++) same = ((uint8_t *)o2)[i] == SENT;
        cr_expect(same, "call %d, allocation %d failed: an output byte was written", which, n);
      }
    }
    cr_expect(finished, "call %d never succeeded", which);
  }
  free(ref1), free(ref2), free(o1), free(o2);
  free(io.in), free(io.fwd_in), free(io.gout), free(io.probs);
}

/* fuzz_swiglu found it: an empty [2^40, 0] input walked its 2^40 rows (minutes) before this
 * returned; nothing is to be computed, so the call must return at once. */
Test(moe_hostile, empty_tensor_with_huge_row_count, .timeout = 20) {
  static float in[16], out[16], dy[16];
  int64_t T = (int64_t)1 << 40;
  xte_tensor x = xte_tensor_2d(in, XTE_DTYPE_FP32, T, 0),
             y = xte_tensor_2d(out, XTE_DTYPE_FP32, T, 0);
  xte_tensor g = xte_tensor_2d(dy, XTE_DTYPE_FP32, T, 0);
  cr_assert_eq(xte_swiglu(&x, &y, NULL), XTE_SUCCESS, "%s", xte_last_error());
  cr_assert_eq(xte_dswiglu(&g, &x, &y, NULL), XTE_SUCCESS, "%s", xte_last_error());
}

/* fuzz_permute found it (UBSan, scripts/sanitize.sh): with 0 input rows the sort-chunks
 * workspace put its int64 array one byte into the buffer (a misaligned store). */
Test(moe_hostile, sort_chunks_of_zero_rows) {
  static float in[4], out[4];
  static int64_t split[2] = {0, 0}, idx[2] = {1, 0};
  static int32_t rm[1] = {-7};
  xte_tensor i = xte_tensor_2d(in, XTE_DTYPE_FP32, 0, 4),
             o = xte_tensor_2d(out, XTE_DTYPE_FP32, 0, 4);
  xte_tensor s = xte_tensor_1d(split, XTE_DTYPE_INT64, 2),
             x = xte_tensor_1d(idx, XTE_DTYPE_INT64, 2);
  xte_tensor m = xte_tensor_1d(rm, XTE_DTYPE_INT32, 0);
  cr_assert_eq(xte_moe_sort_chunks_by_index(&i, &s, &x, &o, &m, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  cr_assert_eq(rm[0], -7);
}

/* fuzz_router found it (UBSan): the aux-score backward has no routing map, and its rows were
 * addressed from the NULL map pointer. */
Test(moe_hostile, aux_scores_backward_without_map) {
  static float gs[2 * 4] = {1, 2, 3, 4, 5, 6, 7, 8},
                      saved[2 * 4] = {.1f, .2f, .3f, .4f, .25f, .25f, .25f, .25f}, gl[2 * 4];
  xte_tensor g = xte_tensor_2d(gs, XTE_DTYPE_FP32, 2, 4),
             s = xte_tensor_2d(saved, XTE_DTYPE_FP32, 2, 4);
  xte_tensor o = xte_tensor_2d(gl, XTE_DTYPE_FP32, 2, 4);
  cr_assert_eq(xte_router_aux_scores_backward(&g, &s, NULL, 2, XTE_ROUTER_SOFTMAX, &o, NULL),
               XTE_SUCCESS, "%s", xte_last_error());
}

/* fuzz_permute found it (a long run, out of memory): an empty [2^31 - 1, 0] input with no
 * row_map made and filled an 8 GiB row map; with nothing to move or write only the checks run. */
Test(moe_hostile, sort_chunks_empty_rows_no_map, .timeout = 10) {
  static float in[4], out[4];
  static int64_t split[2] = {INT32_MAX - 5, 5}, idx[2] = {1, 0};
  const int64_t R = INT32_MAX;
  xte_tensor i = xte_tensor_2d(in, XTE_DTYPE_FP32, R, 0),
             o = xte_tensor_2d(out, XTE_DTYPE_FP32, R, 0);
  xte_tensor s = xte_tensor_1d(split, XTE_DTYPE_INT64, 2),
             x = xte_tensor_1d(idx, XTE_DTYPE_INT64, 2);
  cr_assert_eq(xte_moe_sort_chunks_by_index(&i, &s, &x, &o, NULL, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  split[0] = INT32_MAX - 4; /* the checks still run: the sizes sum past the rows */
  cr_assert_eq(xte_moe_sort_chunks_by_index(&i, &s, &x, &o, NULL, NULL), XTE_ERROR_SHAPE);
  split[0] = INT32_MAX - 5;
}

/* fuzz_permute found it (a long run, a 129 s timeout): the dispatch layout of a [2^32 - 1, 0]
 * topk_idx (no bytes) walked every token twice; with no slots only the zeroing is left, and the
 * per-token work no longer scales with num_ranks. */
Test(moe_hostile, dispatch_layout_empty_rows, .timeout = 10) {
  static int64_t idx[2];
  static int32_t tpr[2] = {7, 7}, tpe[6] = {7, 7, 7, 7, 7, 7};
  xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, (int64_t)1 << 40, 0);
  xte_tensor a = xte_tensor_1d(tpr, XTE_DTYPE_INT32, 2), b = xte_tensor_1d(tpe, XTE_DTYPE_INT32, 6);
  int i;
  cr_assert_eq(xte_moe_dispatch_layout(&it, 6, 2, &a, &b, NULL, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  for (i = 0; i < 2; i++) cr_assert_eq(tpr[i], 0);
  for (i = 0; i < 6; i++) cr_assert_eq(tpe[i], 0);
}

/* Empty outputs with a huge row count (h4's sweep, the same pattern as the two above): a permute
 * into an empty [2^40, 0] output (rows past R are valid and zeroed) walked its 2^40 rows of no
 * bytes, as did the unpermute backward's zeroing of an empty [2^40, 0] grad_input; the unpermute
 * and permute backward from an empty [2^40, 0] input zeroed a 256 MiB row bitmap for a two-entry
 * row_map. Each returns at once with the row_map / offsets it must write. */
Test(moe_hostile, empty_outputs_with_huge_row_count, .timeout = 30) {
  static float buf[4], small_out[4];
  static int64_t idx[2] = {0, 1}, offs[3] = {9, 9, 9};
  static int32_t rm[2] = {-7, -7};
  const int64_t big = (int64_t)1 << 40;
  xte_tensor x = xte_tensor_2d(buf, XTE_DTYPE_FP32, 2, 0),
             huge = xte_tensor_2d(buf, XTE_DTYPE_FP32, big, 0);
  xte_tensor y = xte_tensor_2d(small_out, XTE_DTYPE_FP32, 2, 0);
  xte_tensor it = xte_tensor_2d(idx, XTE_DTYPE_INT64, 2, 1),
             rmt = xte_tensor_2d(rm, XTE_DTYPE_INT32, 2, 1);
  xte_moe_routing r;
  xte_permute_outputs ex;
  clock_t t0;
  double secs;
  memset(&r, 0, sizeof r);
  memset(&ex, 0, sizeof ex);
  r.topk_idx = &it;
  r.num_experts = 2;
  ex.expert_offsets = xte_tensor_1d(offs, XTE_DTYPE_INT64, 3);
  t0 = clock();
  cr_assert_eq(xte_moe_permute(&x, NULL, &r, NULL, &huge, NULL, &rmt, &ex, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  cr_expect(rm[0] == 0 && rm[1] == 1, "row_map %d %d, want 0 1", rm[0], rm[1]);
  cr_expect(offs[0] == 0 && offs[1] == 1 && offs[2] == 2, "expert_offsets %lld %lld %lld",
            (long long)offs[0], (long long)offs[1], (long long)offs[2]);
  cr_assert_eq(xte_moe_unpermute_backward(&x, NULL, &r, &rmt, NULL, &huge, NULL, NULL), XTE_SUCCESS,
               "%s", xte_last_error());
  cr_assert_eq(xte_moe_unpermute(&huge, &r, &rmt, NULL, &y, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  cr_assert_eq(xte_moe_permute_backward(&huge, &r, &rmt, &y, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  rm[1] = 5; /* the checks still run: a duplicate, then a row past the empty input's two */
  rm[0] = 5;
  cr_expect_eq(xte_moe_unpermute(&x, &r, &rmt, NULL, &y, NULL), XTE_ERROR_INVALID_ARGUMENT);
  cr_expect_eq(xte_moe_unpermute(&huge, &r, &rmt, NULL, &y, NULL), XTE_ERROR_INVALID_ARGUMENT);
  cr_expect(
      strstr(xte_last_error(), "twice") != NULL || strstr(xte_last_error(), "earlier") != NULL,
      "%s", xte_last_error());
  secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  cr_log_info("empty_outputs_with_huge_row_count: %.3f s of CPU time", secs);
  cr_expect(secs < 1.0, "%.2f s of CPU time for outputs of no bytes", secs);
}

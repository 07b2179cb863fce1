/* Attention bad input: each invalid call returns a clear status with a message naming the
 * argument, and writes nothing (outputs keep a sentinel). */
#include <criterion/criterion.h>
#include <time.h>

#include "test_attention_oracle.h"

static acase small(xte_attn_layout L) {
  static const int32_t lq[2] = {3, 5};
  static const int32_t lk[2] = {4, 2};
  acase c = ta_case(L, F32, 2, 6, 7, 4, 2, 16, 16, NOMASK);
  c.lens_q = lq;
  c.lens_kv = lk;
  return c;
}

static void sentinel(adata *d) {
  memset(d->Or, 0xA5, (size_t)d->no * 4);
  memset(d->lse, 0xA5, (size_t)d->nl * 4);
  memset(d->dQr, 0xA5, (size_t)d->nq * 4);
  memset(d->dKr, 0xA5, (size_t)d->nk * 4);
  memset(d->dVr, 0xA5, (size_t)d->nv * 4);
}

static int untouched(const void *p, int64_t bytes) {
  const unsigned char *b = (const unsigned char *)p;
  int64_t i;
  for (i = 0; i < bytes; i++)
    if (b[i] != 0xA5) return 0;
  return 1;
}

static void expect_fail(adata *d, int bwd, xte_status want, const char *needle) {
  xte_status st;
  if (!bwd) {
    memset(d->Or, 0xA5, (size_t)d->no * 4);
    memset(d->lse, 0xA5, (size_t)d->nl * 4);
    st = xte_attention_fwd(&d->Q, &d->K, &d->V, &d->O, &d->L, &d->cfg, NULL);
  } else {
    memset(d->dQr, 0xA5, (size_t)d->nq * 4);
    memset(d->dKr, 0xA5, (size_t)d->nk * 4);
    memset(d->dVr, 0xA5, (size_t)d->nv * 4);
    st = xte_attention_bwd(&d->Q, &d->K, &d->V, &d->O, &d->dO, &d->L, &d->dQ, &d->dK, &d->dV,
                           &d->cfg, NULL);
  }
  cr_expect_eq(st, want, "want %s, got %s (%s)", xte_status_string(want), xte_status_string(st),
               xte_last_error());
  cr_expect(strstr(xte_last_error(), needle) != NULL, "message '%s' does not name '%s'",
            xte_last_error(), needle);
  if (!bwd) {
    cr_expect(untouched(d->Or, d->no * 4), "O written on a failed call (%s)", needle);
    cr_expect(untouched(d->lse, d->nl * 4), "lse written on a failed call (%s)", needle);
  } else {
    cr_expect(untouched(d->dQr, d->nq * 4), "dQ written on a failed call (%s)", needle);
    cr_expect(untouched(d->dKr, d->nk * 4), "dK written on a failed call (%s)", needle);
    cr_expect(untouched(d->dVr, d->nv * 4), "dV written on a failed call (%s)", needle);
  }
}

/* A fresh setup of case c into d, then the statements after needle (which break it), then
 * expect_fail(&d, bwd, want, needle). */
#define BAD(bwd, want, needle, ...)     \
  do {                                  \
    ta_setup(&d, &c);                   \
    __VA_ARGS__                         \
    expect_fail(&d, bwd, want, needle); \
    ta_free(&d);                        \
  } while (0)

Test(attention_bad_input, valid_baseline) {
  adata d;
  acase c = small(XTE_ATTN_LAYOUT_BSHD);
  ta_setup(&d, &c);
  sentinel(&d);
  cr_expect_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL), XTE_SUCCESS, "%s",
               xte_last_error());
  cr_expect_eq(
      xte_attention_bwd(&d.Q, &d.K, &d.V, &d.O, &d.dO, &d.L, &d.dQ, &d.dK, &d.dV, &d.cfg, NULL),
      XTE_SUCCESS, "%s", xte_last_error());
  ta_free(&d);
}

Test(attention_bad_input, shapes_and_heads) {
  adata d;
  acase c = small(XTE_ATTN_LAYOUT_BSHD);
  int bwd;
  for (bwd = 0; bwd < 2; bwd++) {
    /* h_q = 4 not a multiple of 3 */
    BAD(bwd, XTE_ERROR_SHAPE, "h_kv", d.K.shape[2] = 3; d.V.shape[2] = 3;);
    BAD(bwd, XTE_ERROR_SHAPE, "d_qk", d.Q.shape[3] = 300; d.K.shape[3] = 300;);
    BAD(bwd, XTE_ERROR_SHAPE, "head dim", d.K.shape[3] = 8;);
    BAD(bwd, XTE_ERROR_SHAPE, "O", d.O.shape[1] = 5;);
    BAD(bwd, XTE_ERROR_SHAPE, "lse", d.L.shape[2] = 5;);
    BAD(bwd, XTE_ERROR_SHAPE, "Q", d.Q.rank = 3;);
  }
  BAD(1, XTE_ERROR_SHAPE, "dK", d.dK.shape[2] = 1;);
}

Test(attention_bad_input, dtypes_and_config) {
  adata d;
  acase c = small(XTE_ATTN_LAYOUT_BSHD);
  int bwd;
  for (bwd = 0; bwd < 2; bwd++) {
    BAD(bwd, XTE_ERROR_DTYPE, "dtypes differ", d.K.dtype = XTE_DTYPE_BF16;);
    BAD(bwd, XTE_ERROR_DTYPE, "O", d.O.dtype = XTE_DTYPE_BF16;);
    BAD(bwd, XTE_ERROR_DTYPE, "lse", d.L.dtype = XTE_DTYPE_BF16;);
    BAD(bwd, XTE_ERROR_INVALID_ARGUMENT, "config->mask", d.cfg.mask = (xte_attn_mask)9;);
    BAD(bwd, XTE_ERROR_INVALID_ARGUMENT, "window_left", d.cfg.window_left = -2;);
    BAD(bwd, XTE_ERROR_INVALID_ARGUMENT, "softcap", d.cfg.softcap = -1.0f;);
    BAD(bwd, XTE_ERROR_NULL_POINTER, "Q->data", d.Q.data = NULL;);
  }
  BAD(1, XTE_ERROR_DTYPE, "dV", d.dV.dtype = XTE_DTYPE_FP16;);
  ta_setup(&d, &c);
  cr_expect_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, NULL, NULL), XTE_ERROR_NULL_POINTER);
  cr_expect(strstr(xte_last_error(), "config") != NULL);
  ta_free(&d);
}

Test(attention_bad_input, cu_seqlens) {
  adata d;
  acase c = small(XTE_ATTN_LAYOUT_THD);
  int bwd;
  for (bwd = 0; bwd < 2; bwd++) {
    /* cu_q = {0, 9, 8}: decreasing */
    BAD(bwd, XTE_ERROR_INVALID_ARGUMENT, "cu_seqlens_q", d.cu_q[1] = 9; d.cfg.max_seqlen_q = 1000;);
    /* beyond the tensor */
    BAD(bwd, XTE_ERROR_SHAPE, "cu_seqlens_kv", d.cu_kv[2] = 100; d.cfg.max_seqlen_kv = 1000;);
    /* a sequence of 5 */
    BAD(bwd, XTE_ERROR_SHAPE, "cu_seqlens_q", d.cfg.max_seqlen_q = 4;);
    BAD(bwd, XTE_ERROR_NULL_POINTER, "cu_seqlens_kv", d.cfg.cu_seqlens_kv = NULL;);
  }
  /* padding lengths past s */
  c = small(XTE_ATTN_LAYOUT_BSHD);
  c.padded = 1;
  /* s_kv = 7 */
  BAD(0, XTE_ERROR_SHAPE, "cu_seqlens_kv", d.cu_kv[2] = d.cu_kv[1] + 8;);
}

Test(attention_bad_input, fp8_backward_unsupported) {
  adata d;
  acase c = small(XTE_ATTN_LAYOUT_BSHD);
  BAD(1, XTE_ERROR_UNSUPPORTED, "e4m3", d.Q.dtype = d.K.dtype = d.V.dtype = XTE_DTYPE_E4M3;
      d.O.dtype = d.dO.dtype = d.dQ.dtype = d.dK.dtype = d.dV.dtype = XTE_DTYPE_E4M3;);
}

/* A copy of n 4-byte values at 1 byte past a 4-byte boundary (buf: 4 n + 8 bytes). */
static void *misaligned_copy(char *buf, const void *src, size_t n) {
  memcpy(buf + 1, src, 4 * n);
  return buf + 1;
}

Test(attention_bad_input, alignment) {
  adata d;
  acase c = small(XTE_ATTN_LAYOUT_BSHD);
  static char buf[64];
  int bwd;
  for (bwd = 0; bwd < 2; bwd++) {
    /* the buffers hold one spare byte: a tensor 1 byte in stays inside them */
    BAD(bwd, XTE_ERROR_ALIGNMENT, "Q->data", d.Q.data = (char *)d.Qr + 1;);
    BAD(bwd, XTE_ERROR_ALIGNMENT, "K->data", d.K.data = (char *)d.Kr + 1;);
    BAD(bwd, XTE_ERROR_ALIGNMENT, "O->data", d.O.data = (char *)d.Or + 1;);
    BAD(bwd, XTE_ERROR_ALIGNMENT, "lse->data", d.L.data = (char *)d.lse + 1;);
    BAD(bwd, XTE_ERROR_ALIGNMENT, "alibi_slopes",
        d.cfg.alibi_slopes = (const float *)misaligned_copy(buf, d.Qr, (size_t)c.hq););
  }
  BAD(1, XTE_ERROR_ALIGNMENT, "dQ->data", d.dQ.data = (char *)d.dQr + 1;);
  BAD(1, XTE_ERROR_ALIGNMENT, "dO->data", d.dO.data = (char *)d.dOr + 1;);
  BAD(1, XTE_ERROR_ALIGNMENT, "dV->data", d.dV.data = (char *)d.dVr + 1;);
  /* bf16: 2-byte elements */
  c.dt = BF16;
  BAD(0, XTE_ERROR_ALIGNMENT, "Q->data", d.Q.data = (char *)d.Qr + 1;);
  c = small(XTE_ATTN_LAYOUT_THD);
  for (bwd = 0; bwd < 2; bwd++) {
    BAD(bwd, XTE_ERROR_ALIGNMENT, "cu_seqlens_q",
        d.cfg.cu_seqlens_q = (const int32_t *)misaligned_copy(buf, d.cu_q, (size_t)c.b + 1););
    BAD(bwd, XTE_ERROR_ALIGNMENT, "cu_seqlens_kv",
        d.cfg.cu_seqlens_kv = (const int32_t *)misaligned_copy(buf, d.cu_kv, (size_t)c.b + 1););
  }
}

/* Batch 0 with s_q = h_q = 2^31 - 1: no element, but the strides s h d = (2^31 - 1)^2 x 16 do
 * not fit int64 (before the fix: accepted, the strides computed by signed overflow). */
static void zero_batch_huge(adata *d) {
  const int64_t big = INT32_MAX;
  xte_tensor *qs[4] = {&d->Q, &d->O, &d->dO, &d->dQ}, *ks[4] = {&d->K, &d->V, &d->dK, &d->dV};
  int i;
  for (i = 0; i < 4; i++) {
    qs[i]->shape[0] = 0;
    qs[i]->shape[1] = big;
    qs[i]->shape[2] = big;
    ks[i]->shape[0] = 0;
    ks[i]->shape[2] = 1;
  }
  d->L.shape[0] = 0;
  d->L.shape[1] = big;
  d->L.shape[2] = big;
}

Test(attention_bad_input, sizes_with_a_zero_dim) {
  adata d;
  acase c = small(XTE_ATTN_LAYOUT_BSHD);
  int bwd;
  for (bwd = 0; bwd < 2; bwd++) BAD(bwd, XTE_ERROR_SHAPE, "2^48", zero_batch_huge(&d););
  c = small(XTE_ATTN_LAYOUT_THD);
  BAD(0, XTE_ERROR_INVALID_ARGUMENT, "config->batch", d.cfg.batch = (int64_t)1 << 40;);
}

/* 2^31 - 1 sequences of no token: nothing to write and nothing to do (before the fix the
 * drivers walked the whole batch several times: minutes per call, found by a long fuzz run). */
Test(attention_bad_input, empty_sequences_huge_batch, .timeout = 20) {
  adata d;
  acase c = small(XTE_ATTN_LAYOUT_BSHD);
  xte_tensor *all[10];
  int i, bwd;
  for (bwd = 0; bwd < 2; bwd++) {
    ta_setup(&d, &c);
    all[0] = &d.Q, all[1] = &d.K, all[2] = &d.V, all[3] = &d.O, all[4] = &d.dO;
    all[5] = &d.dQ, all[6] = &d.dK, all[7] = &d.dV;
    for (i = 0; i < 8; i++) {
      all[i]->shape[0] = INT32_MAX;
      all[i]->shape[1] = 0;
    }
    d.L.shape[0] = INT32_MAX;
    d.L.shape[2] = 0;
    d.cfg.cu_seqlens_q = d.cfg.cu_seqlens_kv = NULL;
    if (!bwd)
      cr_expect_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL), XTE_SUCCESS, "%s",
                   xte_last_error());
    else
      cr_expect_eq(
          xte_attention_bwd(&d.Q, &d.K, &d.V, &d.O, &d.dO, &d.L, &d.dQ, &d.dK, &d.dV, &d.cfg, NULL),
          XTE_SUCCESS, "%s", xte_last_error());
    ta_free(&d);
  }
}

/* Empty outputs skip the work, not the checks: THD with no query token and cu_seqlens_q
 * {0, 1, 0} (decreasing, past the tokens) is still an error (found by fuzz_attention when the
 * empty-output shortcut first returned before the backend's cu_seqlens checks). */
Test(attention_bad_input, empty_outputs_still_check_cu_seqlens) {
  adata d;
  acase c = small(XTE_ATTN_LAYOUT_THD);
  int bwd;
  for (bwd = 0; bwd < 2; bwd++) {
    xte_status st;
    ta_setup(&d, &c);
    d.Q.shape[0] = d.O.shape[0] = d.dO.shape[0] = d.dQ.shape[0] = d.L.shape[0] = 0;
    d.K.shape[0] = d.V.shape[0] = d.dK.shape[0] = d.dV.shape[0] = 0;
    d.cu_q[0] = 0, d.cu_q[1] = 1, d.cu_q[2] = 0;
    d.cu_kv[0] = 0, d.cu_kv[1] = 0, d.cu_kv[2] = 0;
    st = bwd ? xte_attention_bwd(&d.Q, &d.K, &d.V, &d.O, &d.dO, &d.L, &d.dQ, &d.dK, &d.dV, &d.cfg,
                                 NULL)
             : xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL);
    cr_expect_eq(st, XTE_ERROR_INVALID_ARGUMENT, "%s: got %s", bwd ? "bwd" : "fwd",
                 xte_status_string(st));
    cr_expect(strstr(xte_last_error(), "cu_seqlens_q") != NULL, "%s", xte_last_error());
    ta_free(&d);
  }
}

/* Test hooks of src/alloc.c (exported, declared in src/xte_internal.h). */
void xte_internal_fail_alloc(int64_t nth);
int64_t xte_internal_alloc_count(void);

/* Allocation n fails, for n = 0, 1, ... until the call succeeds: every failure is
 * XTE_ERROR_OUT_OF_MEMORY with a message and no output byte changed, on 1 and 3 threads. */
static void oom_sweep(acase c, int bwd) {
  adata d;
  int64_t n;
  int t;
  static const int threads[2] = {1, 3};
  for (t = 0; t < 2; t++) {
    cr_assert_eq(xte_cpu_set_num_threads(threads[t]), XTE_SUCCESS);
    ta_setup(&d, &c);
    if (bwd)
      cr_assert_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL), XTE_SUCCESS);
    for (n = 0; n < 64; n++) {
      xte_status st;
      sentinel(&d);
      if (bwd) { /* O and lse are inputs here */
        ta_free(&d);
        ta_setup(&d, &c);
        cr_assert_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL), XTE_SUCCESS);
        memset(d.dQr, 0xA5, (size_t)d.nq * 4);
        memset(d.dKr, 0xA5, (size_t)d.nk * 4);
        memset(d.dVr, 0xA5, (size_t)d.nv * 4);
      }
      xte_internal_fail_alloc(n);
      if (!bwd)
        st = xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL);
      else
        st = xte_attention_bwd(&d.Q, &d.K, &d.V, &d.O, &d.dO, &d.L, &d.dQ, &d.dK, &d.dV, &d.cfg,
                               NULL);
      xte_internal_fail_alloc(-1);
      if (st == XTE_SUCCESS) break;
      cr_expect_eq(st, XTE_ERROR_OUT_OF_MEMORY, "%s, allocation %lld fails: got %s (%s)",
                   bwd ? "bwd" : "fwd", (long long)n, xte_status_string(st), xte_last_error());
      cr_expect(xte_last_error()[0] != '\0', "empty message");
      if (!bwd) {
        cr_expect(untouched(d.Or, d.no * 4), "fwd: O written when allocation %lld failed",
                  (long long)n);
        cr_expect(untouched(d.lse, d.nl * 4), "fwd: lse written when allocation %lld failed",
                  (long long)n);
      } else {
        cr_expect(untouched(d.dQr, d.nq * 4), "bwd: dQ written when allocation %lld failed",
                  (long long)n);
        cr_expect(untouched(d.dKr, d.nk * 4), "bwd: dK written when allocation %lld failed",
                  (long long)n);
        cr_expect(untouched(d.dVr, d.nv * 4), "bwd: dV written when allocation %lld failed",
                  (long long)n);
      }
    }
    cr_expect(n > 0 && n < 64, "%s: %lld allocations", bwd ? "bwd" : "fwd", (long long)n);
    ta_free(&d);
  }
  xte_cpu_set_num_threads(0);
}

Test(attention_bad_input, allocation_failures) {
  acase c = small(XTE_ATTN_LAYOUT_BSHD);
  c.padded = 1; /* padding rows are written first */
  oom_sweep(c, 0);
  oom_sweep(c, 1);
  c = small(XTE_ATTN_LAYOUT_THD);
  oom_sweep(c, 0);
  oom_sweep(c, 1);
}

/* the test hook of src/xte_attention_ops.h: the head caches' and S store's byte limit */
XTE_API size_t xte_internal_attention_cache_limit(size_t bytes);

/* One THD backward into dq, dk, dv: batch sequences of cu_q / cu_kv over TQ / TK tokens. */
static xte_status thd_bwd(const float *q, const float *k, const float *v, const float *o,
                          const float *g, const float *l, float *dq, float *dk, float *dv,
                          int64_t tq, int64_t tk, int64_t hq, int64_t hkv, int64_t dim,
                          const int32_t *cuq, const int32_t *cuk, int64_t batch, int64_t mq,
                          int64_t mk) {
  xte_attention_config cfg = xte_attention_config_default();
  xte_tensor Q = ta_thd_f32((void *)q, tq, hq, dim), K = ta_thd_f32((void *)k, tk, hkv, dim),
             V = ta_thd_f32((void *)v, tk, hkv, dim);
  xte_tensor O = ta_thd_f32((void *)o, tq, hq, dim), dO = ta_thd_f32((void *)g, tq, hq, dim),
             L = ta_thd_f32((void *)l, tq, hq, 1);
  xte_tensor dQ = ta_thd_f32(dq, tq, hq, dim), dK = ta_thd_f32(dk, tk, hkv, dim),
             dV = ta_thd_f32(dv, tk, hkv, dim);
  L.rank = 2;
  cfg.layout = XTE_ATTN_LAYOUT_THD;
  cfg.batch = batch;
  cfg.cu_seqlens_q = cuq;
  cfg.cu_seqlens_kv = cuk;
  cfg.max_seqlen_q = mq;
  cfg.max_seqlen_kv = mk;
  return xte_attention_bwd(&Q, &K, &V, &O, &dO, &L, &dQ, &dK, &dV, &cfg, NULL);
}

/* THD backward, one sequence of 65536 query tokens (1024 tiles, more than one S store round per
 * (sequence, KV head) pair on 2 threads) and 2^21 - 1 empty sequences after it: the rounds
 * walked every pair, empty or not, and each round scanned the whole query task list (2^32 steps,
 * tens of seconds); now they follow the tasks. The bytes are those of the same call with the
 * one sequence alone. */
Test(attention_bad_input, bwd_rounds_many_empty_sequences, .timeout = 60) {
  enum { TQ = 65536, TK = 40 };
  const int64_t nb = (int64_t)1 << 21;
  float *q = malloc(TQ * 4), *o = malloc(TQ * 4), *g = malloc(TQ * 4), *l = malloc(TQ * 4);
  float *dq[2] = {malloc(TQ * 4), malloc(TQ * 4)};
  static float k[TK], v[TK], dk[2][TK], dv[2][TK];
  int32_t *cuq = malloc((size_t)(nb + 1) * 4), *cuk = malloc((size_t)(nb + 1) * 4);
  const int32_t one_q[2] = {0, TQ}, one_k[2] = {0, TK};
  int64_t i;
  clock_t t0;
  double secs;
  cr_assert(q && o && g && l && dq[0] && dq[1] && cuq && cuk);
  for (i = 0; i < TQ; i++) {
    q[i] = (float)((i * 7) % 13) * 0.25f - 1.5f;
    o[i] = (float)(i % 5) * 0.5f - 1.0f;
    g[i] = (float)((i * 3) % 7) - 3.0f;
    l[i] = 2.0f + (float)(i % 3);
  }
  for (i = 0; i < TK; i++) k[i] = (float)(i % 9) * 0.125f - 0.5f, v[i] = (float)(i % 4) - 1.5f;
  cuq[0] = cuk[0] = 0;
  for (i = 1; i <= nb; i++) cuq[i] = TQ, cuk[i] = TK;
  cr_assert_eq(xte_cpu_set_num_threads(2), XTE_SUCCESS); /* the S store's budget: 16 MiB */
  memset(dq[0], 0xA5, TQ * 4);
  cr_assert_eq(
      thd_bwd(q, k, v, o, g, l, dq[0], dk[0], dv[0], TQ, TK, 1, 1, 1, one_q, one_k, 1, TQ, TK),
      XTE_SUCCESS, "%s", xte_last_error());
  memset(dq[1], 0xA5, TQ * 4);
  t0 = clock();
  cr_assert_eq(
      thd_bwd(q, k, v, o, g, l, dq[1], dk[1], dv[1], TQ, TK, 1, 1, 1, cuq, cuk, nb, TQ, TK),
      XTE_SUCCESS, "%s", xte_last_error());
  secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  xte_cpu_set_num_threads(0);
  cr_expect(memcmp(dq[0], dq[1], TQ * 4) == 0, "dQ differs with the empty sequences");
  cr_expect(memcmp(dk[0], dk[1], sizeof dk[0]) == 0, "dK differs with the empty sequences");
  cr_expect(memcmp(dv[0], dv[1], sizeof dv[0]) == 0, "dV differs with the empty sequences");
  cr_log_info("bwd_rounds_many_empty_sequences: %.3f s of CPU time", secs);
  cr_expect(secs < 3.0, "%.2f s of CPU time for one sequence and 2^21 - 1 empty ones", secs);
  free(q), free(o), free(g), free(l), free(dq[0]), free(dq[1]), free(cuq), free(cuk);
}

/* The S store in rounds of (query head, tile) units (a small byte limit) over sequences shorter
 * than the longest (rounds whose units are all past a sequence's tiles are skipped), empty ones
 * (query or key side) and GQA 4:2: the same bytes as without the store (limit 0: pass A
 * computes S and dP again), on 1, 2 and 3 threads. */
Test(attention_bad_input, bwd_rounds_skip_empty_units) {
  enum { TQ = 331, TK = 234, HQ = 4, HKV = 2, D = 16 };
  static const int32_t cuq[7] = {0, 200, 200, 270, 271, 271, 331};
  static const int32_t cuk[7] = {0, 100, 105, 105, 169, 169, 234};
  static float q[TQ * HQ * D], o[TQ * HQ * D], g[TQ * HQ * D], l[TQ * HQ];
  static float k[TK * HKV * D], v[TK * HKV * D];
  static float dq[2][TQ * HQ * D], dk[2][TK * HKV * D], dv[2][TK * HKV * D];
  const size_t lim = xte_internal_attention_cache_limit(0);
  const size_t limits[3] = {200000, 100000, 400000};
  int i, t, m;
  uint64_t s = 99;
  for (i = 0; i < TQ * HQ * D; i++) {
    q[i] = (float)(ta_rng(&s) % 17) * 0.125f - 1.0f;
    o[i] = (float)(ta_rng(&s) % 9) * 0.25f - 1.0f;
    g[i] = (float)(ta_rng(&s) % 11) * 0.5f - 2.5f;
  }
  for (i = 0; i < TQ * HQ; i++) l[i] = 1.0f + (float)(ta_rng(&s) % 5);
  for (i = 0; i < TK * HKV * D; i++) {
    k[i] = (float)(ta_rng(&s) % 13) * 0.125f - 0.75f;
    v[i] = (float)(ta_rng(&s) % 7) - 3.0f;
  }
  cr_assert_eq(xte_cpu_set_num_threads(1), XTE_SUCCESS);
  xte_internal_attention_cache_limit(0); /* no store, no caches: the reference */
  cr_assert_eq(
      thd_bwd(q, k, v, o, g, l, dq[0], dk[0], dv[0], TQ, TK, HQ, HKV, D, cuq, cuk, 6, 200, 100),
      XTE_SUCCESS, "%s", xte_last_error());
  for (m = 0; m < 3; m++) {
    xte_internal_attention_cache_limit(limits[m]);
    for (t = 1; t <= 3; t++) {
      cr_assert_eq(xte_cpu_set_num_threads(t), XTE_SUCCESS);
      memset(dq[1], 0xA5, sizeof dq[1]);
      memset(dk[1], 0xA5, sizeof dk[1]);
      memset(dv[1], 0xA5, sizeof dv[1]);
      cr_assert_eq(
          thd_bwd(q, k, v, o, g, l, dq[1], dk[1], dv[1], TQ, TK, HQ, HKV, D, cuq, cuk, 6, 200, 100),
          XTE_SUCCESS, "%s", xte_last_error());
      cr_expect(memcmp(dq[0], dq[1], sizeof dq[0]) == 0, "limit %zu, %d threads: dQ differs",
                limits[m], t);
      cr_expect(memcmp(dk[0], dk[1], sizeof dk[0]) == 0, "limit %zu, %d threads: dK differs",
                limits[m], t);
      cr_expect(memcmp(dv[0], dv[1], sizeof dv[0]) == 0, "limit %zu, %d threads: dV differs",
                limits[m], t);
    }
  }
  xte_internal_attention_cache_limit(lim);
  xte_cpu_set_num_threads(0);
}

/* The CPU attention driver's task lists, scheduler and cu_seqlens checks (moved out of
 * src/cpu/attention_driver.c as they were: which thread runs a task, and how the lists are cut,
 * never changes a byte). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attention_driver.h"

/* ---------------------------------------------------------------- scheduler
 * Each thread that takes tasks owns a contiguous range of the pass's list (the lists go head by
 * head, so a thread stays on its own heads and fills its head cache once per head instead of
 * every thread filling every head, as one shared counter would make the threads alternate over a
 * head's tasks); a thread whose range is done takes the next tasks of the others' ranges (an atomic
 * counter per range). Which thread runs a task never changes a byte. */
void xa_sched_thread(void *p, int64_t begin, int64_t end, int tid) {
  actx *c = (actx *)p;
  float *ws;
  int64_t t;
  int v;
  (void)begin;
  (void)end;
  /* a pool grown since the workspaces were sized: the extra threads take no task */
  if (tid >= c->nws || c->ntasks <= 0) return;
  ws = c->wsbuf + (size_t)tid * c->ws_stride;
  /* the workspace zero and the head cache empty (its tag zero); the whole cache zero where its
   * rows have padding columns (they are read, and each pass lays the cache out its own way) */
  if (c->cache && c->dqp == c->a->dqk && c->dvp == c->a->dv)
    memset(ws, 0, (c->cache_off + 16) * sizeof(float));
  else
    memset(ws, 0, c->ws_stride * sizeof(float));
  for (v = 0; v < c->nws; v++) {
    const int r = (tid + v) % c->nws;
    while ((t = atomic_fetch_add(&c->rnext[r], 1)) < c->rend[r]) c->run(c, ws, t);
  }
}

/* The first task of range r of n tasks in k ranges (sizes differ by at most one). */
static int64_t range_start(int64_t n, int64_t k, int64_t r) {
  return n / k * r + (r < n % k ? r : n % k);
}

/* Splits the pass's ntasks into the threads' ranges. */
void xa_split_tasks(actx *c) {
  int r;
  for (r = 0; r < c->nws; r++) {
    atomic_store(&c->rnext[r], range_start(c->ntasks, c->nws, r));
    c->rend[r] = range_start(c->ntasks, c->nws, r + 1);
  }
}

/* Runs tasks [k0, k1) of list (tasks [3][n]) with the workspaces allocated by xa_alloc_ws. */
void xa_run_range(actx *c, int64_t *list, int64_t n, int64_t k0, int64_t k1,
                  void (*run)(actx *, float *, int64_t)) {
  c->tb = list + k0;
  c->th = list + n + k0;
  c->ti = list + 2 * n + k0;
  c->ntasks = k1 - k0;
  c->run = run;
  xa_split_tasks(c);
  if (k1 > k0) xte_parallel_threads(xa_sched_thread, c);
}

/* Runs the tasks of list (tasks [3][n]). */
void xa_run_tasks(actx *c, int64_t *list, int64_t n, void (*run)(actx *, float *, int64_t)) {
  xa_run_range(c, list, n, 0, n, run);
}

/* One workspace of ws_floats floats per thread that can take a task (at most ntasks). */
xte_status xa_alloc_ws(actx *c, size_t ws_floats, int64_t ntasks) {
  int64_t nt = xte_cpu_threads();
  size_t bytes;
  if (nt > ntasks) nt = ntasks;
  if (nt > XTE_ATTN_MAX_RANGES) nt = XTE_ATTN_MAX_RANGES;
  if (nt < 1) nt = 1;
  c->nws = (int)nt;
  c->ws_stride = (ws_floats + 15) / 16 * 16; /* 64-byte aligned rows */
  if (__builtin_mul_overflow(c->ws_stride * sizeof(float), (size_t)nt, &bytes))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "attention: workspace size overflows");
  c->wsbuf = (float *)xte_aligned_alloc(bytes);
  if (!c->wsbuf)
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "attention: out of host memory (workspace)");
  return XTE_SUCCESS;
}

/* A task list [3][n]: sequence, head, first row / KV block. */
xte_status xa_alloc_list(int64_t n, int64_t **list) {
  size_t bytes;
  if (__builtin_mul_overflow(sizeof(int64_t) * 3, (size_t)(n > 0 ? n : 1), &bytes))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "attention: task list size overflows");
  *list = (int64_t *)xte_aligned_alloc(bytes);
  if (!*list) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "attention: out of host memory");
  return XTE_SUCCESS;
}

static void set_task(int64_t *list, int64_t n, int64_t k, int64_t b, int64_t h, int64_t i) {
  list[k] = b;
  list[n + k] = h;
  list[2 * n + k] = i;
}

/* Query tiles of every (sequence, head), the longest-running (last) tiles first. */
xte_status xa_make_q_tasks(actx *c) {
  const xte_attn_args *a = c->a;
  int64_t b, h, n = 0, t0, len, maxt = 0, ti, k = 0;
  for (b = 0; b < a->batch; b++) {
    seq(a, 0, b, &t0, &len);
    n += (len + BM - 1) / BM * a->hq;
    if ((len + BM - 1) / BM > maxt) maxt = (len + BM - 1) / BM;
  }
  XTE_TRY(xa_alloc_list(n, &c->qlist));
  c->nq = n;
  if (c->cache || c->bygroup) { /* a head's tiles one after the other (its longest first) */
    for (b = 0; b < a->batch; b++) {
      seq(a, 0, b, &t0, &len);
      for (h = 0; h < (len > 0 ? a->hq : 0); h++) /* no query rows: no heads to visit */
        for (ti = (len + BM - 1) / BM - 1; ti >= 0; ti--) set_task(c->qlist, n, k++, b, h, ti * BM);
    }
    return XTE_SUCCESS;
  }
  for (ti = maxt - 1; ti >= 0; ti--)
    for (b = 0; b < a->batch; b++) {
      seq(a, 0, b, &t0, &len);
      if (ti * BM >= len) continue;
      for (h = 0; h < a->hq; h++) set_task(c->qlist, n, k++, b, h, ti * BM);
    }
  return XTE_SUCCESS;
}

/* KV blocks of every (sequence, KV head). */
xte_status xa_make_kv_tasks(actx *c) {
  const xte_attn_args *a = c->a;
  int64_t b, hk, j0, n = 0, t0, len, k = 0;
  for (b = 0; b < a->batch; b++) {
    seq(a, 1, b, &t0, &len);
    n += (len + BN - 1) / BN * a->hkv;
  }
  XTE_TRY(xa_alloc_list(n, &c->kvlist));
  c->nkv = n;
  if (c->cache || c->bygroup) { /* a KV head's blocks one after the other: see the head caches */
    for (b = 0; b < a->batch; b++) {
      seq(a, 1, b, &t0, &len);
      for (hk = 0; hk < a->hkv; hk++)
        for (j0 = 0; j0 < len; j0 += BN) set_task(c->kvlist, n, k++, b, hk, j0);
    }
    return XTE_SUCCESS;
  }
  for (b = 0; b < a->batch; b++) {
    seq(a, 1, b, &t0, &len);
    for (j0 = 0; j0 < len; j0 += BN)
      for (hk = 0; hk < a->hkv; hk++) set_task(c->kvlist, n, k++, b, hk, j0);
  }
  return XTE_SUCCESS;
}

/* ---------------------------------------------------------------- cu_seqlens checks */
static xte_status check_cu(const int32_t *cu, int64_t batch, int64_t total, int64_t maxlen,
                           int packed, const char *name) {
  int64_t b;
  if (packed && cu[0] < 0)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "config->%s[0] = %d is negative", name,
                         (int)cu[0]);
  for (b = 0; b < batch; b++) {
    int64_t len = (int64_t)cu[b + 1] - cu[b];
    if (len < 0)
      return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "config->%s is not non-decreasing: [%lld] = %d > [%lld] = %d", name,
                           (long long)b, (int)cu[b], (long long)(b + 1), (int)cu[b + 1]);
    if (len > maxlen)
      return xte_set_error(XTE_ERROR_SHAPE, "config->%s: sequence %lld has length %lld > %s %lld",
                           name, (long long)b, (long long)len,
                           packed ? "the max_seqlen" : "the padded length s", (long long)maxlen);
  }
  if (packed && (int64_t)cu[batch] > total)
    return xte_set_error(XTE_ERROR_SHAPE,
                         "config->%s[%lld] = %d is beyond the tensor's %lld tokens", name,
                         (long long)batch, (int)cu[batch], (long long)total);
  return XTE_SUCCESS;
}

xte_status xa_check_args(const xte_attn_args *a) {
  if (a->packed || a->cu_q) {
    XTE_TRY(check_cu(a->cu_q, a->batch, a->total_q, a->sq, a->packed, "cu_seqlens_q"));
    XTE_TRY(check_cu(a->cu_kv, a->batch, a->total_kv, a->skv, a->packed, "cu_seqlens_kv"));
  }
  return XTE_SUCCESS;
}

/* The CPU attention driver's shared context and helpers (src/cpu/attention_driver.c: the
 * forward and backward passes; src/cpu/attention_tasks.c: the task lists, the scheduler and the
 * cu_seqlens checks). Private to src/cpu. */
#ifndef XTE_CPU_ATTENTION_DRIVER_H
#define XTE_CPU_ATTENTION_DRIVER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu/attention_kernels.h"
#include "cpu/xte_cpu.h"
#include "numerics/xte_attention_numerics.h"
#include "xte_attention_ops.h"
#include "xte_internal.h"

#define BN XTE_ATTN_BN
#define BM XTE_ATTN_BM

/* task ranges of the scheduler: one per thread that takes tasks (at most the pool's threads) */
#define XTE_ATTN_MAX_RANGES 256

static inline int64_t rup16(int64_t x) {
  return (x + 15) / 16 * 16;
}
static inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
static inline int64_t max64(int64_t a, int64_t b) {
  return a > b ? a : b;
}

/* ---------------------------------------------------------------- common context */
typedef struct actx {
  const xte_attn_args *a;
  const xte_attn_kernels *K;
  const xte_quant_kernels *ck;
  int64_t G;          /* query heads per KV head */
  int64_t lq_max;     /* the longest query sequence (THD: from cu_seqlens, not max_seqlen) */
  int64_t lkv_max;    /* the longest key sequence */
  int64_t dqp, dvp;   /* head dims rounded up to 16 */
  size_t esz;         /* input element size */
  float *Dbuf, *Cbuf; /* backward: D and the LSE correction log(l), indexed like lse */
  /* tasks of the pass being run (pointers into one of the task lists below) */
  int64_t *tb, *th, *ti; /* sequence, head, first row / KV block */
  int64_t ntasks;
  int64_t *qlist, nq;   /* query tiles: [3][nq] */
  int64_t *kvlist, nkv; /* backward: KV blocks: [3][nkv] */
  /* the pass's tasks in nws contiguous ranges, [*, rend[t]) from rnext[t] (see sched_thread) */
  _Atomic int64_t rnext[XTE_ATTN_MAX_RANGES];
  int64_t rend[XTE_ATTN_MAX_RANGES];
  /* per-thread workspaces, nws of ws_stride floats, allocated before any output is written */
  float *wsbuf;
  size_t ws_stride;
  int nws;
  /* bf16 / fp16 / e4m3: each thread's fp32 copy of one head's operands (see the head caches) at ws
   * + cache_off, cache_floats floats; 0: converted block by block */
  int cache;
  size_t cache_off, cache_floats;
  /* backward without softcap: pass B's St and dPt tiles kept for pass A (the S store below).
   * A pair's query tiles are its units u = g * sT + t (query head g of the group, tile t), in
   * the order of pass A's sums. A round is spairs pairs from spair0 and their units [su0, su1);
   * sbuf holds, per pair of the round, su units x sNB blocks x 2 [BN][BM] tiles. sacc: pass A's
   * running dK, dV sums [sNB][BN][dqp + dvp] when a pair takes several rounds (spairs = 1,
   * su < G sT). sbuf NULL: pass A recomputes S and dP. */
  float *sbuf, *sacc;
  int64_t spairs, spair0, sT, sNB, su, su0, su1;
  int64_t *qsub;     /* the round's pass B tasks [3][nq] */
  int sfirst, slast; /* the round is its pair's first / last (sacc: zero / store the sums) */
  int bygroup;       /* tasks listed pair by pair (the head caches, the S store) */
  int fast;          /* XTE_ATTENTION_FAST: K is the ISA's FAST table, no renormalisation */
  /* FAST with bf16 inputs where the ISA has xte_attn_bf16_kernels: K is kb, the FAST table with
   * their gemm and gemm_fold (bf16 dot products; they pack their operands per call, so pass A
   * runs its GEMMs whole instead of in row chunks) */
  int bf16;
  xte_attn_kernels kb;
  /* those bf16 kernels' B packed once per task (NULL: none): the forward's Q^T, pass B's Q^T and
   * dO^T (XTE_ATTN_PB_WORDS words each at the start of the workspace) */
  const xte_attn_bf16_kernels *pb;
  /* forward: the head caches also hold K and V packed for pb's gemm_pa and gemm_fold_pb, once
   * per head instead of once per KV block and query tile (0: not) */
  int pkv;
  void (*run)(struct actx *c, float *ws, int64_t t);
} actx;

static inline size_t dt_size(int dtype) {
  return dtype == XTE_DTYPE_FP32 ? 4 : dtype == XTE_DTYPE_E4M3 ? 1 : 2;
}

/* Sequence b of the queries (kv = 0) or the keys (kv = 1): its first token (packed; else 0)
 * and its length (cu_seqlens are always given when packed). */
static inline void seq(const xte_attn_args *a, int kv, int64_t b, int64_t *t0, int64_t *len) {
  const int32_t *cu = kv ? a->cu_kv : a->cu_q;
  *t0 = a->packed ? cu[b] : 0;
  *len = cu ? (int64_t)cu[b + 1] - cu[b] : kv ? a->skv : a->sq;
}

static inline int64_t eoff(const xte_attn_tensor *t, int64_t b, int64_t tok, int64_t h) {
  return b * t->bs + tok * t->ts + h * t->hs;
}
static inline int64_t loff(const xte_attn_args *a, int64_t b, int64_t tok, int64_t h) {
  return b * a->lse_bs + tok * a->lse_ts + h * a->lse_hs;
}

/* src/cpu/attention_tasks.c: the scheduler (see there) and the task lists */
/* runs tasks [k0, k1) of list (tasks [3][n]) / all n of them on the workspaces of xa_alloc_ws */
void xa_run_range(actx *c, int64_t *list, int64_t n, int64_t k0, int64_t k1,
                  void (*run)(actx *, float *, int64_t));
void xa_run_tasks(actx *c, int64_t *list, int64_t n, void (*run)(actx *, float *, int64_t));
/* splits the pass's c->ntasks into the threads' ranges; a thread's body for xte_parallel_threads */
void xa_split_tasks(actx *c);
void xa_sched_thread(void *p, int64_t begin, int64_t end, int tid);
/* one workspace of ws_floats floats per thread that can take a task (at most ntasks) */
xte_status xa_alloc_ws(actx *c, size_t ws_floats, int64_t ntasks);
/* a task list [3][n]: sequence, head, first row / KV block */
xte_status xa_alloc_list(int64_t n, int64_t **list);
/* the query tiles / KV blocks of every (sequence, head) (c->qlist, c->kvlist) */
xte_status xa_make_q_tasks(actx *c);
xte_status xa_make_kv_tasks(actx *c);
/* the cu_seqlens checks (backend memory) before anything is written */
xte_status xa_check_args(const xte_attn_args *a);

#endif /* XTE_CPU_ATTENTION_DRIVER_H */

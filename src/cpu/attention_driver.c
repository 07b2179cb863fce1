/* CPU attention driver: flash-style forward and deterministic backward.
 *
 * Forward: one task per (sequence, query head, tile of BM query rows); the task walks the KV
 * blocks of 64 keys its rows see, in order, with the online softmax of
 * src/numerics/xte_attention_numerics.h. Backward, two passes with no atomics:
 *   A. one task per (sequence, KV head, KV block): dK and dV of the block's 64 keys, summing
 *      over the group's query heads in order and their query rows in order;
 *   B. one task per (sequence, query head, query tile): dQ, summing over the KV blocks in order.
 * Both recompute P = expf(x - LSE) from Q, K and the LSE. Tasks are handed out
 * dynamically (each thread a contiguous range of them, then the others' rest: see the scheduler),
 * which never changes a byte: each task's result depends on nothing but its inputs. The inner
 * products are the ISA's fmaf-chain GEMM kernel
 * (xte_attn_kernels.gemm); the forward and dQ pass hold their tiles transposed (keys x query
 * rows) so that the softmax steps (fwd_softmax_t, bwd_p_t) run 16 query rows per vector, each
 * lane the scalar order of the shared numerics header; the operands are copied (converted for
 * bf16 / fp16 / e4m3) to fp32 rows once per head and thread (the head caches below; fp32 rows
 * 4 KiB apart in a tensor alias in the L1 cache) and read there, or read in place (fp32) /
 * converted block by block past the caches' size limit. Without softcap the backward's pass A
 * reads pass B's S and dP tiles from the S store instead of computing them again. The layout never
 * changes a byte: each output is the same sequence of operations. Everything else per element is
 * the shared numerics header. Every buffer (task lists, D, each thread's workspace) is allocated
 * before the first output byte is written, so an allocation failure leaves the outputs untouched.
 * XTE_ATTENTION_FAST with bf16 inputs takes the ISA's bf16 dot products where attached (the table
 * kb: their gemm and gemm_fold in place of the fp32 ones, src/cpu/bf16/), with the query tile's
 * Q^T (and dO^T) packed for them once per task where they can (c->pb).
 */
#define _DEFAULT_SOURCE /* madvise */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cpu/attention_driver.h"

static void load_row(const actx *c, const xte_attn_tensor *t, int dtype, int64_t off, int64_t n,
                     float *dst) {
  const char *p = (const char *)t->data + (size_t)off * dt_size(dtype);
  int64_t i;
  switch (dtype) {
    case XTE_DTYPE_FP32:
      memcpy(dst, p, (size_t)n * 4);
      break;
    case XTE_DTYPE_BF16:
      c->ck->load_f32(p, XTE_NUM_IN_BF16, n, dst);
      break;
    case XTE_DTYPE_FP16:
      c->ck->load_f32(p, XTE_NUM_IN_F16, n, dst);
      break;
    default:
      for (i = 0; i < n; i++) dst[i] = xte_e4m3_to_f32(((const uint8_t *)p)[i]);
      break;
  }
}

/* The NaN rule (docs/numerics.md, "NaN bits"): every NaN written to O, dQ, dK, dV is the
 * canonical xte_attn_nan() (bf16 0x7FC0, fp16 0x7E00), never the hardware's (a NaN in V, or
 * p * v = 0 * inf in the P V chain, carries x86's or the GPU's bits until here). */
static float canon_nan(float x) {
  return xte_f32_isnan(x) ? xte_attn_nan() : x;
}

static void store_row(const xte_attn_tensor *t, int dtype, int64_t off, int64_t n,
                      const float *src) {
  char *p = (char *)t->data + (size_t)off * dt_size(dtype);
  int64_t i;
  switch (dtype) {
    case XTE_DTYPE_FP32:
      for (i = 0; i < n; i++) ((float *)p)[i] = canon_nan(src[i]);
      break;
    case XTE_DTYPE_BF16:
      for (i = 0; i < n; i++) ((uint16_t *)p)[i] = xte_f32_to_bf16(canon_nan(src[i]));
      break;
    default:
      for (i = 0; i < n; i++) ((uint16_t *)p)[i] = xte_f32_to_fp16(canon_nan(src[i]));
      break;
  }
}

/* Prefetches (no effect on any value) the row at element off of t, n elements: rows of a [s, h, d]
 * tensor lie h d elements apart (4 KiB for fp32 h d = 1024), where the hardware prefetchers do not
 * follow, so the row copies and stores ask for the row PF_ROWS ahead. */
#define PF_ROWS 8
static void prefetch_row(const xte_attn_tensor *t, int dtype, int64_t off, int64_t n, int write) {
  const char *p = (const char *)t->data + (size_t)off * dt_size(dtype);
  const size_t bytes = (size_t)n * dt_size(dtype);
  size_t k;
  for (k = 0; k < bytes; k += 64) {
    if (write)
      __builtin_prefetch(p + k, 1, 3);
    else
      __builtin_prefetch(p + k, 0, 3);
  }
}

static void zero_row(const xte_attn_tensor *t, int dtype, int64_t off, int64_t n) {
  memset((char *)t->data + (size_t)off * dt_size(dtype), 0, (size_t)n * dt_size(dtype));
}

/* Score parameters of (sequence b, query head h). */
static xte_attn_score score_for(const xte_attn_args *a, int64_t b, int64_t h, float *vdesc) {
  float scale = a->scale;
  int64_t hk = h / (a->hq / a->hkv);
  if (a->descale_q) scale = scale * a->descale_q[b * a->hkv + hk];
  if (a->descale_k) scale = scale * a->descale_k[b * a->hkv + hk];
  if (vdesc) *vdesc = a->descale_v ? a->descale_v[b * a->hkv + hk] : 1.0f;
  return xte_attn_score_make(scale, a->softcap, a->alibi != NULL, a->alibi ? a->alibi[h] : 0.0f);
}

/* Logits of one row for the block [j0, j0 + nb): t[j] (j < BN), -inf where hidden. */
static void row_logits(const xte_attn_score *sp, const float *S, int64_t i, int64_t off, int64_t j0,
                       int64_t nb, int64_t lo, int64_t hi, float *t) {
  int64_t j, a = max64(lo - j0, 0), e = min64(hi - j0, nb);
  const float ninf = xte_attn_neg_inf();
  for (j = 0; j < a; j++) t[j] = ninf;
  if (!sp->softcap && !sp->alibi) {
    const float scale = sp->scale;
    for (j = a; j < e; j++) t[j] = S[j] * scale;
  } else {
    for (j = a; j < e; j++) t[j] = xte_attn_logit(S[j], sp, i + off - (j0 + j));
  }
  for (j = e; j < BN; j++) t[j] = ninf;
}

/* Packs keys [j0, j0 + nb) of (b, KV head hk) of tensor X: transposed XT[c * BN + j] (columns
 * past nb zero) and / or natural Xn[j * ldn + c]. */
static void pack_kv(const actx *c, const xte_attn_tensor *X, int64_t b, int64_t tok0, int64_t hk,
                    int64_t j0, int64_t nb, int64_t d, float *XT, float *Xn, int64_t ldn,
                    float *tmp) {
  int64_t j, k;
  for (j = 0; j < nb; j++) {
    float *row = Xn ? Xn + j * ldn : tmp;
    load_row(c, X, c->a->dtype, eoff(X, b, tok0 + j0 + j, hk), d, row);
    if (XT)
      for (k = 0; k < d; k++) XT[k * BN + j] = row[k];
  }
  if (XT && nb < BN)
    for (k = 0; k < d; k++) memset(XT + k * BN + nb, 0, (size_t)(BN - nb) * sizeof(float));
}

/* Loads n rows of tensor X, tokens [tok0, tok0 + n) of (b, head h), d columns each, into
 * dst[r * ld]. */
static void load_rows(const actx *c, const xte_attn_tensor *X, int64_t b, int64_t tok0, int64_t h,
                      int64_t n, int64_t d, float *dst, int64_t ld) {
  int64_t r;
  for (r = 0; r < n; r++) {
    if (r + PF_ROWS < n) prefetch_row(X, c->a->dtype, eoff(X, b, tok0 + r + PF_ROWS, h), d, 0);
    load_row(c, X, c->a->dtype, eoff(X, b, tok0 + r, h), d, dst + r * ld);
  }
}

/* ---------------------------------------------------------------- per-thread head caches
 * bf16 / fp16 / e4m3 operands are converted to fp32 once per head and thread, not once per
 * block and tile, and fp32 ones copied (rows of a [s, h, d] tensor lie h d floats apart, 4 KiB
 * for h d = 1024, so the rows a GEMM tile reads map to the same few L1 sets and miss, and the
 * GEMMs run slower than on a contiguous copy): each thread keeps, after its workspace, the fp32
 * rows of the (sequence, KV head) it last worked on (forward and pass B: K [skv][dqp], V
 * [skv][dvp]; pass A: Q [G][sq][dqp] and dO [G][sq][dvp] of the KV head's query heads), padding
 * columns zero, tagged with b * hkv + hk + 1 (0: empty) in its first 16 floats. The tasks of a head
 * are listed one after the other (xa_make_q_tasks, xa_make_kv_tasks), so a thread converts a head
 * about once per head it visits instead of once per query tile (forward, pass B) or KV block (pass
 * A). The conversion is exact and the kernels read the same numbers, so no byte changes. The caches
 * are sized with the workspaces (allocated before any output byte); past cache_limit bytes in all,
 * fp32 is read in place and the other dtypes converted block by block. cache_limit also caps the
 * backward's S store (plan_store; 0: none). */
static size_t cache_limit = (size_t)256 << 20;

size_t xte_internal_attention_cache_limit(size_t bytes) {
  const size_t old = cache_limit;
  cache_limit = bytes;
  return old;
}

/* Decides c->cache for per-thread caches of rows x (d1 + d2) floats (rows of up to n of each),
 * at most one per thread. */
static void plan_cache(actx *c, int64_t n, int64_t d1, int64_t d2) {
  size_t f, bytes;
  const int64_t nt = xte_cpu_threads() > 0 ? xte_cpu_threads() : 1;
  c->cache = 0;
  c->cache_floats = 0;
  if (n <= 0) return;
  if (__builtin_mul_overflow((size_t)n, (size_t)(d1 + d2), &f) ||
      __builtin_add_overflow(f, (size_t)16, &f) ||
      __builtin_mul_overflow(f * sizeof(float), (size_t)nt, &bytes) || bytes > cache_limit)
    return;
  c->cache = 1;
  c->cache_floats = f;
}

/* The thread's cache in ws, and whether it must be (re)filled for key (b, hk); tags it. */
static float *cache_take(const actx *c, float *ws, int64_t b, int64_t hk, int *fill) {
  float *cache = ws + c->cache_off;
  const int64_t key = b * c->a->hkv + hk + 1;
  int64_t have;
  memcpy(&have, cache, sizeof have);
  *fill = have != key;
  if (*fill) memcpy(cache, &key, sizeof key);
  return cache + 16;
}

/* The fp32 K [lkv][dqp] and V [lkv][dvp] of (b, KV head hk), keys from token kt0. With c->pkv,
 * past lkv_max (dqp + dvp) floats, K packed by pb->pack_a (rows to lkv rounded up to BN, at
 * *pk) and V by pb->pack_bn (pairs of rows, dvp words a pair row, at *pv). */
static float *cache_kv(const actx *c, float *ws, int64_t b, int64_t hk, int64_t kt0, int64_t lkv,
                       const uint32_t **pk, const uint32_t **pv) {
  int fill;
  float *Kc = cache_take(c, ws, b, hk, &fill);
  const int64_t n64 = (lkv + BN - 1) / BN * BN, lkv64 = (c->lkv_max + BN - 1) / BN * BN;
  const int64_t kp = (c->a->dqk + 31) / 32 * 16;
  uint32_t *qk = (uint32_t *)(Kc + c->lkv_max * (c->dqp + c->dvp)), *qv = qk + lkv64 * kp;
  if (fill) {
    load_rows(c, &c->a->k, b, kt0, hk, lkv, c->a->dqk, Kc, c->dqp);
    load_rows(c, &c->a->v, b, kt0, hk, lkv, c->a->dv, Kc + lkv * c->dqp, c->dvp);
    if (c->pkv) {
      c->pb->pack_a(lkv, n64, c->a->dqk, Kc, c->dqp, qk);
      c->pb->pack_bn(lkv, n64, c->dvp, Kc + lkv * c->dqp, c->dvp, qv, c->dvp);
    }
  }
  if (pk) *pk = c->pkv ? qk : NULL;
  if (pv) *pv = c->pkv ? qv : NULL;
  return Kc;
}

/* The visible keys [lo[r], hi[r]) of query rows i0 + r, r < nr, and (jlo, jhi non-NULL) the hull
 * [*jlo, *jhi) of the non-empty ones (empty: *jlo >= *jhi). */
static void row_ranges(const xte_attn_args *a, int64_t i0, int64_t nr, int64_t lq, int64_t lkv,
                       int64_t *lo, int64_t *hi, int64_t *jlo, int64_t *jhi) {
  int64_t r;
  if (jlo) {
    *jlo = INT64_MAX;
    *jhi = 0;
  }
  for (r = 0; r < nr; r++) {
    xte_attn_row_range(i0 + r, lq, lkv, a->mask, a->window_left, a->window_right, &lo[r], &hi[r]);
    if (jlo && lo[r] < hi[r]) {
      *jlo = min64(*jlo, lo[r]);
      *jhi = max64(*jhi, hi[r]);
    }
  }
}

/* act[r]: row r < nr sees a key of the block [j0, j0 + nb); [*ra, *rb): from the first such row
 * to past the last. Returns 0 when no row does. */
static int active_rows(const int64_t *lo, const int64_t *hi, int64_t nr, int64_t j0, int64_t nb,
                       char *act, int64_t *ra, int64_t *rb) {
  int64_t r;
  *ra = *rb = -1;
  for (r = 0; r < nr; r++) {
    act[r] = max64(lo[r], j0) < min64(hi[r], j0 + nb);
    if (act[r]) {
      if (*ra < 0) *ra = r;
      *rb = r + 1;
    }
  }
  return *ra >= 0;
}

/* The next run [*r, *e) of consecutive active rows at or after *r, below rb; 0 when none is left.
 * Use: for (r = ra; next_run(act, rb, &r, &e); r = e) ... */
static int next_run(const char *act, int64_t rb, int64_t *r, int64_t *e) {
  while (*r < rb && !act[*r]) (*r)++;
  if (*r >= rb) return 0;
  for (*e = *r; *e < rb && act[*e]; (*e)++) {
  }
  return 1;
}

/* Calls fn(b, tok) for every query (kv = 0) or key (kv = 1) position outside the sequences. */
typedef void (*pad_fn)(const actx *c, int64_t b, int64_t tok);
static void for_padding(const actx *c, int kv, pad_fn fn) {
  const xte_attn_args *a = c->a;
  int64_t b, t;
  const int32_t *cu = kv ? a->cu_kv : a->cu_q;
  int64_t total = kv ? a->total_kv : a->total_q, s = kv ? a->skv : a->sq;
  if (a->packed) {
    for (t = 0; t < cu[0]; t++) fn(c, 0, t);
    for (t = cu[a->batch]; t < total; t++) fn(c, 0, t);
  } else if (cu) {
    for (b = 0; b < a->batch; b++)
      for (t = (int64_t)cu[b + 1] - cu[b]; t < s; t++) fn(c, b, t);
  }
}

/* Transposes n rows of tensor X (tokens [tok0, tok0 + n) of (b, head h), d columns) into
 * dst[k * BM + r]; columns n..BM-1 zero. fp32 rows through the ISA's load_t, in place; other
 * dtypes converted row by row through tmp (d floats). */
static void load_rows_t(const actx *c, const xte_attn_tensor *X, int64_t b, int64_t tok0, int64_t h,
                        int64_t n, int64_t d, float *dst, float *tmp) {
  int64_t r, k;
  if (c->a->dtype == XTE_DTYPE_FP32 && n > 0) {
    c->K->load_t((const float *)X->data + eoff(X, b, tok0, h), X->ts, n, d, dst);
    return;
  }
  for (r = 0; r < BM; r++) {
    if (r < n) {
      if (r + PF_ROWS < n) prefetch_row(X, c->a->dtype, eoff(X, b, tok0 + r + PF_ROWS, h), d, 0);
      load_row(c, X, c->a->dtype, eoff(X, b, tok0 + r, h), d, tmp);
      for (k = 0; k < d; k++) dst[k * BM + r] = tmp[k];
    } else {
      for (k = 0; k < d; k++) dst[k * BM + r] = 0.0f;
    }
  }
}

/* ---------------------------------------------------------------- forward */
static void fwd_pad(const actx *c, int64_t b, int64_t tok) {
  const xte_attn_args *a = c->a;
  int64_t h;
  for (h = 0; h < a->hq; h++) {
    zero_row(&a->o, a->out_dtype, eoff(&a->o, b, tok, h), a->dv);
    a->lse[loff(a, b, tok, h)] = xte_attn_neg_inf();
  }
}

/* The forward task's workspace: Qt [dq][BM], Kn [BN][dq], Vf [BN][dvp], St, Pt [BN][BM], Oa
 * [BM][dvp], T [dqp], m, l, alpha, saved m, l [BM]. */
static size_t fwd_ws_floats(const actx *c) {
  const xte_attn_args *a = c->a;
  return (size_t)(a->dqk * BM + BN * a->dqk + BN * c->dvp + 2 * BN * BM + BM * c->dvp + c->dqp +
                  5 * BM + 64) +
         (c->pb ? (size_t)XTE_ATTN_PB_WORDS : 0);
}

/* The forward of one query tile. Its layout is transposed (the order is not): St[j][r] =
 * dot(k_j, q_r) (one fmaf chain over the head dim from +0: the GEMM kernel with the key rows as
 * the broadcast operand and Qt = Q^T as the vector operand), so that the online softmax runs
 * down the columns, 16 query rows per vector (fwd_softmax_t), and P V takes Pt as its
 * broadcast operand and V's rows as they are. fp32 K and V are read in place (V when its rows
 * are whole vectors); other dtypes from the thread's head cache (or, past its size limit,
 * converted block by block). */
static void fwd_task(actx *c, float *ws, int64_t task) {
  const xte_attn_args *a = c->a;
  const xte_attn_kernels *K = c->K;
  const int64_t b = c->tb[task], h = c->th[task], i0 = c->ti[task];
  const int64_t dq = a->dqk, dv = a->dv, dqp = c->dqp, dvp = c->dvp, hk = h / c->G;
  const int kdirect = a->dtype == XTE_DTYPE_FP32 && !c->cache;
  const int vdirect = a->dtype == XTE_DTYPE_FP32 && dv % 16 == 0 && !c->cache;
  int64_t qt0, lq, kt0, lkv, nr, r, jlo, jhi, j0, off;
  const float *Kc = NULL, *Vc = NULL;               /* the head cache */
  const uint32_t *Kq = NULL, *Vq = NULL;            /* its packed K, V (c->pkv) */
  const int64_t kp = (dq + 31) / 32 * 16;           /* Kq's words a row */
  uint32_t *pbq = c->pb ? (uint32_t *)ws : NULL;    /* Q^T packed for the bf16 kernels */
  float *Qt = ws + (c->pb ? XTE_ATTN_PB_WORDS : 0); /* [dq][BM] */
  float *Kn = Qt + dq * BM;                         /* [BN][dq] */
  float *Vf = Kn + BN * dq;                         /* [BN][dvp] */
  float *St = Vf + BN * dvp;                        /* [BN][BM] */
  float *Pt = St + BN * BM;                         /* [BN][BM] */
  float *Oa = Pt + BN * BM;                         /* [BM][dvp] */
  float *T = Oa + BM * dvp;                         /* [dqp]: a Q row */
  float *m = T + dqp, *l = m + BM;                  /* [BM] */
  float *al = l + BM;                               /* [BM]: alpha of the block */
  float *ms = al + BM, *ls = ms + BM;
  int64_t lo[BM], hi[BM];
  int32_t ja[BM], je[BM];
  char act[BM];
  float vdesc;
  xte_attn_score sp = score_for(a, b, h, &vdesc);
  const int plain = !sp.softcap && !sp.alibi;

  seq(a, 0, b, &qt0, &lq);
  seq(a, 1, b, &kt0, &lkv);
  off = lkv - lq;
  nr = min64(BM, lq - i0);
  load_rows_t(c, &a->q, b, qt0 + i0, h, nr, dq, Qt, T);
  if (pbq) c->pb->pack_b(dq, BM, Qt, BM, pbq);
  for (r = 0; r < BM; r++) {
    m[r] = xte_attn_neg_inf();
    l[r] = 0.0f;
  }
  row_ranges(a, i0, nr, lq, lkv, lo, hi, &jlo, &jhi);
  memset(Oa, 0, sizeof(float) * (size_t)(BM * dvp));
  if (c->cache && jlo < jhi) {
    Kc = cache_kv(c, ws, b, hk, kt0, lkv, &Kq, &Vq);
    Vc = Kc + lkv * dqp;
  }
  for (j0 = jlo < jhi ? jlo / BN * BN : 0; j0 < jhi; j0 += BN) {
    const int64_t nb = min64(BN, lkv - j0);
    int64_t ra, rb, c0, c1, j, e;
    const float *Kp, *Vp;
    int64_t krs, vld;
    if (!active_rows(lo, hi, nr, j0, nb, act, &ra, &rb)) continue;
    c0 = ra / 16 * 16;
    c1 = min64(BM, (rb + 15) / 16 * 16);
    if (kdirect) {
      Kp = (const float *)a->k.data + eoff(&a->k, b, kt0 + j0, hk);
      krs = a->k.ts;
    } else if (Kc) {
      Kp = Kc + j0 * dqp;
      krs = dqp;
    } else {
      load_rows(c, &a->k, b, kt0 + j0, hk, nb, dq, Kn, dq);
      Kp = Kn;
      krs = dq;
    }
    if (vdirect) {
      Vp = (const float *)a->v.data + eoff(&a->v, b, kt0 + j0, hk);
      vld = a->v.ts;
    } else if (Vc) {
      Vp = Vc + j0 * dvp;
      vld = dvp;
    } else {
      load_rows(c, &a->v, b, kt0 + j0, hk, nb, dv, Vf, dvp);
      Vp = Vf;
      vld = dvp;
    }
    if (Kq)
      c->pb->gemm_pa(nb, c1 - c0, dq, Kq + j0 * kp, pbq + c0, St + c0, BM);
    else if (pbq)
      c->pb->gemm_pb(nb, c1 - c0, dq, Kp, krs, 1, pbq + c0, St + c0, BM);
    else
      K->gemm(nb, c1 - c0, dq, Kp, krs, 1, Qt + c0, BM, St + c0, BM, 0);
    for (r = c0; r < c1; r++) {
      ms[r] = m[r];
      ls[r] = l[r];
      ja[r] = r < rb && act[r] ? (int32_t)(max64(lo[r], j0) - j0) : 0;
      je[r] = r < rb && act[r] ? (int32_t)(min64(hi[r], j0 + nb) - j0) : 0;
    }
    if (!plain) /* the logits in place (slots past nb too) */
      for (j = 0; j < BN; j++)
        for (r = c0; r < c1; r++) {
          float *x = St + j * BM + r;
          *x = j >= ja[r] && j < je[r] ? xte_attn_logit(*x, &sp, i0 + r + off - (j0 + j))
                                       : xte_attn_neg_inf();
        }
    K->fwd_softmax_t(St + c0, BM, c1 - c0, plain, sp.scale, ja + c0, je + c0, m + c0, l + c0,
                     al + c0, Pt + c0);
    for (r = c0; r < c1; r++)
      if (r < ra || r >= rb || !act[r]) {
        m[r] = ms[r];
        l[r] = ls[r];
      }
    /* the block's P V from +0 of the rows that see the block, folded into the accumulator as
     * its store: o = xte_attn_rescale(o, alpha, pv) */
    for (r = ra; next_run(act, rb, &r, &e); r = e)
      if (Vq)
        c->pb->gemm_fold_pb(e - r, dvp, nb, Pt + r, 1, BM, Vq + j0 / 2 * dvp, dvp, Oa + r * dvp,
                            dvp, al + r);
      else
        K->gemm_fold(e - r, dvp, nb, Pt + r, 1, BM, Vp, vld, NULL, 0, Oa + r * dvp, dvp, al + r);
  }
  for (r = 0; r < nr; r++) {
    float *o = Oa + r * dvp;
    int64_t cc;
    if (l[r] > 0.0f) {
      const float lr = l[r];
      for (cc = 0; cc < dv; cc++) o[cc] = xte_attn_finish(o[cc], lr);
      if (a->dtype == XTE_DTYPE_E4M3)
        for (cc = 0; cc < dv; cc++) o[cc] = o[cc] * vdesc;
    } else {
      /* no visible key: 0; a NaN sum (a NaN in q or in a visible key): NaN, never a silent 0 */
      const float z = xte_f32_isnan(l[r]) ? xte_attn_nan() : 0.0f;
      for (cc = 0; cc < dv; cc++) o[cc] = z;
    }
    if (r + PF_ROWS < nr)
      prefetch_row(&a->o, a->out_dtype, eoff(&a->o, b, qt0 + i0 + r + PF_ROWS, h), dv, 1);
    store_row(&a->o, a->out_dtype, eoff(&a->o, b, qt0 + i0 + r, h), dv, o);
    a->lse[loff(a, b, qt0 + i0 + r, h)] = xte_attn_lse(m[r], l[r]);
  }
}

/* FAST's bf16 dot products (xte_internal_attention_fast_bf16): 0 off, 1 the attached ones
 * (AMX-BF16 where attached, else AVX512-BF16), 2 AVX512-BF16 */
static int fast_bf16_on = 1;

/* which bf16 dot products FAST takes with table T: 0 none, 1 AMX-BF16, 2 AVX512-BF16 */
static int fast_bf16_kind(const xte_cpu_isa_table *T) {
  if (fast_bf16_on == 1 && T->attn_amx) return 1;
  return fast_bf16_on && T->attn_bf16 ? 2 : 0;
}

int xte_internal_attention_fast_bf16(int on) {
  if (on >= 0 && on <= 2) fast_bf16_on = on;
  return fast_bf16_kind(xte_cpu_isa_table_get());
}

static void init_ctx(actx *c, const xte_attn_args *a) {
  int64_t b, t0, len;
  const xte_cpu_isa_table *T = xte_cpu_isa_table_get(); /* one ISA for the whole call */
  memset(c, 0, sizeof *c);
  c->a = a;
  c->fast = a->fast;
  c->K = a->fast && T->attn->fast ? T->attn->fast : T->attn;
  if (a->fast && a->dtype == XTE_DTYPE_BF16 && fast_bf16_kind(T)) {
    const xte_attn_bf16_kernels *B = fast_bf16_kind(T) == 1 ? T->attn_amx : T->attn_bf16;
    c->kb = *c->K;
    c->kb.gemm = B->gemm;
    c->kb.gemm_fold = B->gemm_fold;
    c->K = &c->kb;
    c->bf16 = 1;
    c->pb = B->pack_b && B->gemm_pb && a->dqk <= 256 && a->dv <= 256 ? B : NULL;
  }
  c->ck = T->quant;
  c->G = a->hq / a->hkv;
  c->dqp = rup16(a->dqk);
  c->dvp = rup16(a->dv);
  c->esz = dt_size(a->dtype);
  /* the sizes below follow the sequences' lengths, not the max_seqlen bounds (THD's may be far
   * larger than any sequence: 2^40 once made 2^25 rounds of the S store) */
  for (b = 0; b < a->batch; b++) {
    seq(a, 0, b, &t0, &len);
    c->lq_max = max64(c->lq_max, len);
    seq(a, 1, b, &t0, &len);
    c->lkv_max = max64(c->lkv_max, len);
  }
}

static void free_ctx(actx *c) {
  xte_aligned_free(c->sbuf);
  xte_aligned_free(c->qsub);
  xte_aligned_free(c->qlist);
  xte_aligned_free(c->kvlist);
  xte_aligned_free(c->wsbuf);
  xte_aligned_free(c->Dbuf);
}

static xte_status cpu_attn_fwd(const xte_attn_args *a, void *handle) {
  actx c;
  xte_status st;
  (void)handle;
  XTE_TRY(xa_check_args(a));
  if (a->no_output) return XTE_SUCCESS;
  init_ctx(&c, a);
  plan_cache(&c, c.lkv_max, c.dqp, c.dvp);
  if (c.cache && c.pb && c.pb->pack_a && c.pb->gemm_pa && c.pb->pack_bn && c.pb->gemm_fold_pb) {
    /* the packed K, V after the fp32 rows (cache_kv), within cache_limit in all */
    const int64_t n64 = (c.lkv_max + BN - 1) / BN * BN;
    const size_t w = (size_t)(n64 * ((a->dqk + 31) / 32 * 16) + n64 / 2 * c.dvp);
    const size_t nt = (size_t)(xte_cpu_threads() > 0 ? xte_cpu_threads() : 1);
    size_t f, bytes;
    if (!__builtin_add_overflow(c.cache_floats, w, &f) &&
        !__builtin_mul_overflow(f * sizeof(float), nt, &bytes) && bytes <= cache_limit) {
      c.pkv = 1;
      c.cache_floats = f;
    }
  }
  c.cache_off = (fwd_ws_floats(&c) + 15) / 16 * 16;
  /* every allocation before the first output byte */
  st = xa_make_q_tasks(&c);
  if (st == XTE_SUCCESS) st = xa_alloc_ws(&c, c.cache_off + c.cache_floats, c.nq);
  if (st == XTE_SUCCESS) {
    for_padding(&c, 0, fwd_pad);
    xa_run_tasks(&c, c.qlist, c.nq, fwd_task);
  }
  free_ctx(&c);
  return st;
}

/* ---------------------------------------------------------------- backward */
static void bwd_pad_q(const actx *c, int64_t b, int64_t tok) {
  const xte_attn_args *a = c->a;
  int64_t h;
  for (h = 0; h < a->hq; h++) zero_row(&a->dq, a->dtype, eoff(&a->dq, b, tok, h), a->dqk);
}
static void bwd_pad_kv(const actx *c, int64_t b, int64_t tok) {
  const xte_attn_args *a = c->a;
  int64_t h;
  for (h = 0; h < a->hkv; h++) {
    zero_row(&a->dk, a->dtype, eoff(&a->dk, b, tok, h), a->dqk);
    zero_row(&a->dv_, a->dtype, eoff(&a->dv_, b, tok, h), a->dv);
  }
}

/* ---------------------------------------------------------------- the S store
 * Without softcap, pass B keeps its St = K Q^T (the logits when ALiBi) and dPt = V dO^T tiles of
 * every (query tile, KV block) in the S store, and pass A reads them instead of computing
 * S = Q K^T and dP = dO V^T again: each element is the same fmaf chain over the head dim from +0
 * (fmaf(a, b, c) = fmaf(b, a, c)), so no byte changes. The store holds the tiles of one round:
 * c->spairs (sequence, KV head) pairs, or the units [su0, su1) of one pair when a pair does not
 * fit (pass A's running sums then wait in sacc from round to round, added in the same order);
 * each round runs pass B, then pass A, over its tiles (plan_store, bwd_rounds). */
static float *s_slot(const actx *c, int64_t b, int64_t h, int64_t i0, int64_t j0) {
  const int64_t u = (h % c->G) * c->sT + i0 / BM, pair = b * c->a->hkv + h / c->G - c->spair0;
  return c->sbuf +
         (size_t)(((pair * c->su + (u - c->su0)) * c->sNB + j0 / BN) * 2) * (size_t)(BN * BM);
}

/* D = sum_c dO * O (one fmaf chain in c from +0), per (b, h, row). */
static void prep_task(actx *c, float *ws, int64_t task) {
  const xte_attn_args *a = c->a;
  const int64_t b = c->tb[task], h = c->th[task], i0 = c->ti[task];
  const int64_t dv = a->dv;
  int64_t t0, lq, r, n;
  float *o = ws, *g = ws + BM * dv, *Dr = g + BM * dv; /* [BM][dv], [BM][dv], [BM] */
  seq(a, 0, b, &t0, &lq);
  n = min64(lq, i0 + BM) - i0;
  for (r = 0; r < n; r++) {
    if (r + PF_ROWS < n) {
      prefetch_row(&a->o, a->dtype, eoff(&a->o, b, t0 + i0 + r + PF_ROWS, h), dv, 0);
      prefetch_row(&a->dout, a->dtype, eoff(&a->dout, b, t0 + i0 + r + PF_ROWS, h), dv, 0);
    }
    load_row(c, &a->o, a->dtype, eoff(&a->o, b, t0 + i0 + r, h), dv, o + r * dv);
    load_row(c, &a->dout, a->dtype, eoff(&a->dout, b, t0 + i0 + r, h), dv, g + r * dv);
  }
  if (n > 0) c->K->dot_rows(n, dv, g, o, dv, Dr);
  for (r = 0; r < n; r++) c->Dbuf[loff(a, b, t0 + i0 + r, h)] = Dr[r];
}

/* P and dS of the active rows [ra, rb) of a tile for the block [j0, j0 + nb). */
static void bwd_rows(const actx *c, const xte_attn_score *sp, int64_t b, int64_t h, int64_t qt0,
                     int64_t i0, int64_t ra, int64_t rb, const char *act, const int64_t *lo,
                     const int64_t *hi, int64_t off, int64_t j0, int64_t nb, const float *S,
                     const float *dP, float *P, float *dS, float *T, int corr) {
  const xte_attn_args *a = c->a;
  int64_t r, j;
  for (r = ra; r < rb; r++) {
    int64_t li;
    float Dv, *p = P + r * BN, *ds = dS + r * BN;
    const float *s = S + r * BN, *dp = dP + r * BN;
    if (!act[r]) continue;
    li = loff(a, b, qt0 + i0 + r, h);
    Dv = c->Dbuf[li];
    row_logits(sp, s, i0 + r, off, j0, nb, lo[r], hi[r], T);
    {
      const float L = a->lse[li];
      for (j = 0; j < BN; j++) T[j] = T[j] - L;
    }
    c->K->exp_sub(T, corr ? c->Cbuf[li] : 0.0f, BN, p);
    if (!sp->softcap) {
      const float g = sp->scale;
      for (j = 0; j < BN; j++) ds[j] = xte_attn_ds(p[j], dp[j], Dv, g);
    } else {
      for (j = 0; j < BN; j++) ds[j] = xte_attn_ds(p[j], dp[j], Dv, xte_attn_dlogit(s[j], sp));
    }
  }
}

/* Whether no active row is left at or after e, below rb (the run ending at e is the last). */
static int last_run(const char *act, int64_t rb, int64_t e) {
  int64_t r = e, e2;
  return !next_run(act, rb, &r, &e2);
}

/* Pass A: a run of n active rows of a query tile, its part of dV (P^T dO) and dK (dS^T Q): one
 * chain from +0 (acc = 0) or from the tile's earlier runs in dVt, dKt (acc = 1); the tile's last
 * run adds the tile's part to the running sums dVa, dKa as its store (xte_attn_add), the others
 * keep it in dVt, dKt. P, dS: column r of A (a key's row) at [r * a_rs + k * a_ks]. */
static void tile_part(const xte_attn_kernels *K, int64_t nb, int64_t dvp, int64_t dqp, int64_t n,
                      const float *P, const float *dS, int64_t a_rs, int64_t a_ks, const float *Gp,
                      int64_t gld, const float *Qp, int64_t qld, float *dVt, float *dKt, float *dVa,
                      float *dKa, int acc, int last, const float *pf, int whole) {
  /* pf (non-NULL): the next tile's St / dPt slot in the S store (2 BN BM floats, out of the
   * caches by then), prefetched a share at a time between row chunks of the two GEMMs so that
   * it arrives while they run. Chunks of 6 rows keep the register tiles; each element is its own
   * chain, so the split changes no byte. whole: no chunks (the bf16 kernels pack B per call). */
  const int64_t step = pf && !whole ? 6 : nb, nch = (nb + step - 1) / step,
                lines = 2 * BN * BM / 16;
  int64_t ch, q = 0, m0;
  for (ch = 0; ch < 2 * nch; ch++) {
    const int dk = ch >= nch; /* the dV chunks, then the dK chunks */
    const int64_t r0 = (dk ? ch - nch : ch) * step, m = min64(step, nb - r0);
    const float *A = (dk ? dS : P) + r0 * a_rs;
    if (pf)
      for (m0 = lines * (ch + 1) / (2 * nch); q < m0; q++) __builtin_prefetch(pf + 16 * q, 0, 2);
    if (!dk && last)
      K->gemm_fold(m, dvp, n, A, a_rs, a_ks, Gp, gld, acc ? dVt + r0 * dvp : NULL, dvp,
                   dVa + r0 * dvp, dvp, NULL);
    else if (!dk)
      K->gemm(m, dvp, n, A, a_rs, a_ks, Gp, gld, dVt + r0 * dvp, dvp, acc);
    else if (last)
      K->gemm_fold(m, dqp, n, A, a_rs, a_ks, Qp, qld, acc ? dKt + r0 * dqp : NULL, dqp,
                   dKa + r0 * dqp, dqp, NULL);
    else
      K->gemm(m, dqp, n, A, a_rs, a_ks, Qp, qld, dKt + r0 * dqp, dqp, acc);
  }
}

/* Pass A's workspace: Qf [BM][dqp], Gf [BM][dvp], Kt [dq][BN], Vt [dv][BN], S, dP, P, dS
 * [BM][BN], dKa, dKt [BN][dqp], dVa, dVt [BN][dvp], T [256]. */
static size_t bwd_kv_ws_floats(const actx *c) {
  const xte_attn_args *a = c->a;
  return (size_t)(BM * c->dqp + BM * c->dvp + a->dqk * BN + a->dv * BN + 4 * BM * BN +
                  2 * BN * c->dqp + 2 * BN * c->dvp + 256 + 64);
}

/* Pass A: dK, dV of keys [j0, j0 + 64) of (b, KV head hk): per (query head, query tile) a sum
 * from +0 over the tile's active rows, added to the running sums in order. */
static void bwd_kv_task(actx *c, float *ws, int64_t task) {
  const xte_attn_args *a = c->a;
  const xte_attn_kernels *K = c->K;
  const int64_t b = c->tb[task], hk = c->th[task], j0 = c->ti[task];
  const int64_t dq = a->dqk, dv = a->dv, dqp = c->dqp, dvp = c->dvp;
  int64_t qt0, lq, kt0, lkv, nb, off, g, i0, r, e, j;
  float *Qf = ws;              /* [BM][dqp] */
  float *Gf = Qf + BM * dqp;   /* dO [BM][dvp] */
  float *Kt = Gf + BM * dvp;   /* [dq][BN] */
  float *Vt = Kt + dq * BN;    /* [dv][BN] */
  float *S = Vt + dv * BN;     /* [BM][BN] */
  float *dP = S + BM * BN;     /* [BM][BN] */
  float *P = dP + BM * BN;     /* [BM][BN] */
  float *dS = P + BM * BN;     /* [BM][BN] */
  float *dKa = dS + BM * BN;   /* [BN][dqp] */
  float *dKt = dKa + BN * dqp; /* [BN][dqp]: the tile's part */
  float *dVa = dKt + BN * dqp; /* [BN][dvp] */
  float *dVt = dVa + BN * dvp; /* [BN][dvp]: the tile's part */
  float *T = dVt + BN * dvp;   /* [max(BN, 256)] */
  int64_t lo[BM], hi[BM];
  int32_t ja[BM], je[BM];
  float Lr[BM], Cr[BM], Dr[BM];
  char act[BM];
  /* fp32 Q and dO are read in place when their rows are whole vectors (the dK / dV GEMMs read
   * dqp / dvp columns) */
  const int qdirect = a->dtype == XTE_DTYPE_FP32 && dq % 16 == 0 && dv % 16 == 0 && !c->cache;
  const float *Qp = Qf, *Gp = Gf, *Qc = NULL, *Gc = NULL; /* Qc, Gc: the head cache */
  const int64_t qld = qdirect ? a->q.ts : dqp, gld = qdirect ? a->dout.ts : dvp;

  seq(a, 0, b, &qt0, &lq);
  seq(a, 1, b, &kt0, &lkv);
  off = lkv - lq;
  nb = min64(BN, lkv - j0);
  if (!c->sbuf) { /* K^T, V^T for S and dP (else in the S store) */
    pack_kv(c, &a->k, b, kt0, hk, j0, nb, dq, Kt, NULL, 0, T);
    pack_kv(c, &a->v, b, kt0, hk, j0, nb, dv, Vt, NULL, 0, T);
  }
  /* the round's units (all when there is no store): query heads [g0, g1), tiles from unit su0 to
   * before su1 */
  const int64_t g0 = c->sbuf ? c->su0 / c->sT : 0, g1 = c->sbuf ? (c->su1 - 1) / c->sT + 1 : c->G;
  if (c->sacc) { /* the running sums outlive the round */
    dKa = c->sacc + (j0 / BN) * BN * (dqp + dvp);
    dVa = dKa + BN * dqp;
  }
  if (!c->sacc || c->sfirst) {
    memset(dKa, 0, sizeof(float) * (size_t)(BN * dqp));
    memset(dVa, 0, sizeof(float) * (size_t)(BN * dvp));
  }
  if (c->cache && lq > 0) {
    int fill;
    float *Qw = cache_take(c, ws, b, hk, &fill), *Gw = Qw + c->G * lq * dqp;
    if (fill)
      for (g = 0; g < c->G; g++) {
        load_rows(c, &a->q, b, qt0, hk * c->G + g, lq, dq, Qw + g * lq * dqp, dqp);
        load_rows(c, &a->dout, b, qt0, hk * c->G + g, lq, dv, Gw + g * lq * dvp, dvp);
      }
    Qc = Qw;
    Gc = Gw;
  }
  /* no query rows: no query heads to visit (G may be 2^31 when dQ is empty) */
  for (g = g0; g < (lq > 0 ? g1 : g0); g++) {
    const int64_t h = hk * c->G + g;
    xte_attn_score sp = score_for(a, b, h, NULL);
    const int plain = !sp.softcap && !sp.alibi;
    const int64_t ib = c->sbuf ? min64(lq, (c->su1 - g * c->sT) * BM) : lq;
    for (i0 = c->sbuf ? max64(0, (c->su0 - g * c->sT) * BM) : 0; i0 < ib; i0 += BM) {
      const int64_t nr = min64(BM, lq - i0);
      int64_t ra, rb, acc = 0;
      row_ranges(a, i0, nr, lq, lkv, lo, hi, NULL, NULL);
      if (!active_rows(lo, hi, nr, j0, nb, act, &ra, &rb)) continue;
      /* Q and dO rows of the tile (row r at Qp + r * qld): fp32 in place, else converted */
      if (qdirect) {
        Qp = (const float *)a->q.data + eoff(&a->q, b, qt0 + i0, h);
        Gp = (const float *)a->dout.data + eoff(&a->dout, b, qt0 + i0, h);
      } else if (Qc) {
        Qp = Qc + (g * lq + i0) * dqp;
        Gp = Gc + (g * lq + i0) * dvp;
      } else {
        load_rows(c, &a->q, b, qt0 + i0 + ra, h, rb - ra, dq, Qf + ra * dqp, dqp);
        load_rows(c, &a->dout, b, qt0 + i0 + ra, h, rb - ra, dv, Gf + ra * dvp, dvp);
      }
      if (c->sbuf) {
        /* pass B's St and dPt (keys x rows; the logits when ALiBi), P and dS down the columns
         * as pass B does, with the correction C; then the parts with P^T, dS^T as the broadcast
         * operands */
        const float *Sb = s_slot(c, b, h, i0, j0), *dPb = Sb + BN * BM;
        const int64_t c0 = ra / 16 * 16, c1 = min64(BM, (rb + 15) / 16 * 16);
        for (r = c0; r < c1; r++) {
          const int on = r >= ra && r < rb && act[r];
          const int64_t li = on ? loff(a, b, qt0 + i0 + r, h) : 0;
          ja[r] = on ? (int32_t)(max64(lo[r], j0) - j0) : 0;
          je[r] = on ? (int32_t)(min64(hi[r], j0 + nb) - j0) : 0;
          Lr[r] = on ? a->lse[li] : 0.0f;
          Cr[r] = on ? c->Cbuf[li] : 0.0f;
          Dr[r] = on ? c->Dbuf[li] : 0.0f;
        }
        K->bwd_p_t(Sb + c0, dPb + c0, NULL, BM, c1 - c0, plain, sp.scale, ja + c0, je + c0, Lr + c0,
                   Cr + c0, Dr + c0, P + c0, dS + c0, NULL);
        const float *pf = i0 + BM < ib ? s_slot(c, b, h, i0 + BM, j0) : NULL;
        for (r = ra; next_run(act, rb, &r, &e); r = e, acc = 1, pf = NULL)
          tile_part(K, nb, dvp, dqp, e - r, P + r, dS + r, BM, 1, Gp + r * gld, gld, Qp + r * qld,
                    qld, dVt, dKt, dVa, dKa, (int)acc, last_run(act, rb, e), pf, c->bf16);
      } else {
        K->gemm(rb - ra, BN, dq, Qp + ra * qld, qld, 1, Kt, BN, S + ra * BN, BN, 0);
        K->gemm(rb - ra, BN, dv, Gp + ra * gld, gld, 1, Vt, BN, dP + ra * BN, BN, 0);
        bwd_rows(c, &sp, b, h, qt0, i0, ra, rb, act, lo, hi, off, j0, nb, S, dP, P, dS, T, 1);
        /* the tile's part: one chain from +0 over its active rows in order */
        for (r = ra; next_run(act, rb, &r, &e); r = e, acc = 1)
          tile_part(K, nb, dvp, dqp, e - r, P + r * BN, dS + r * BN, 1, BN, Gp + r * gld, gld,
                    Qp + r * qld, qld, dVt, dKt, dVa, dKa, (int)acc, last_run(act, rb, e), NULL,
                    c->bf16);
      }
    }
  }
  if (c->sacc && !c->slast) return; /* more rounds to come */
  for (j = 0; j < nb; j++) {
    if (j + PF_ROWS < nb) {
      prefetch_row(&a->dk, a->dtype, eoff(&a->dk, b, kt0 + j0 + j + PF_ROWS, hk), dq, 1);
      prefetch_row(&a->dv_, a->dtype, eoff(&a->dv_, b, kt0 + j0 + j + PF_ROWS, hk), dv, 1);
    }
    store_row(&a->dk, a->dtype, eoff(&a->dk, b, kt0 + j0 + j, hk), dq, dKa + j * dqp);
    store_row(&a->dv_, a->dtype, eoff(&a->dv_, b, kt0 + j0 + j, hk), dv, dVa + j * dvp);
  }
}

/* Pass B's workspace: Qt [dq][BM], Gt [dv][BM], Kn [BN][dqp], Vn [BN][dv], St, dPt, Pt, dSt,
 * Gg [BN][BM], dQa [BM][dqp], T [max(dqp, dvp)], ls, sums, Lr, Dr [BM]. */
static size_t bwd_q_ws_floats(const actx *c) {
  const xte_attn_args *a = c->a;
  return (size_t)(a->dqk * BM + a->dv * BM + BN * c->dqp + BN * a->dv + 5 * BN * BM + BM * c->dqp +
                  max64(c->dqp, c->dvp) + 4 * BM + 64) +
         (c->pb ? (size_t)(2 * XTE_ATTN_PB_WORDS) : 0);
}

/* Pass B: dQ of a query tile: per active KV block a sum from +0 over its keys, added in order.
 * Transposed like the forward: St = K Q^T, dPt = V dO^T (the key rows broadcast, read in place
 * for fp32), P and dS down the columns (bwd_p_t), then dQ's part = dS K with dSt as the
 * broadcast operand and K's rows as they are. */
static void bwd_q_task(actx *c, float *ws, int64_t task) {
  const xte_attn_args *a = c->a;
  const xte_attn_kernels *K = c->K;
  const int64_t b = c->tb[task], h = c->th[task], i0 = c->ti[task];
  const int64_t dq = a->dqk, dv = a->dv, dqp = c->dqp, hk = h / c->G;
  const int fp32 = a->dtype == XTE_DTYPE_FP32;
  const int kbdirect = fp32 && dq % 16 == 0;
  int64_t qt0, lq, kt0, lkv, nr, off, r, j0, jlo, jhi;
  const float *Kc = NULL, *Vc = NULL;            /* the head cache */
  uint32_t *pbq = c->pb ? (uint32_t *)ws : NULL; /* Q^T, dO^T packed for the bf16 kernels */
  uint32_t *pbg = pbq ? pbq + XTE_ATTN_PB_WORDS : NULL;
  float *Qt = ws + (c->pb ? 2 * XTE_ATTN_PB_WORDS : 0); /* [dq][BM] */
  float *Gt = Qt + dq * BM;                             /* dO^T [dv][BM] */
  float *Kn = Gt + dv * BM;                             /* [BN][dqp] */
  float *Vn = Kn + BN * dqp;                            /* [BN][dv] */
  float *St = Vn + BN * dv;                             /* [BN][BM] */
  float *dPt = St + BN * BM;                            /* [BN][BM] */
  float *Pt = dPt + BN * BM;                            /* [BN][BM] */
  float *dSt = Pt + BN * BM;                            /* [BN][BM] */
  float *Gg = dSt + BN * BM;                            /* [BN][BM]: dx/ds (softcap) */
  float *dQa = Gg + BN * BM;                            /* [BM][dqp] */
  float *T = dQa + BM * dqp;                            /* [max(dqp, dvp)] */
  float *ls = T + max64(dqp, c->dvp);                   /* [BM]: the row sums of P */
  float *sums = ls + BM, *Lr = sums + BM, *Dr = Lr + BM;
  int64_t lo[BM], hi[BM];
  int32_t ja[BM], je[BM];
  char act[BM];
  xte_attn_score sp = score_for(a, b, h, NULL);
  const int plain = !sp.softcap && !sp.alibi;

  seq(a, 0, b, &qt0, &lq);
  seq(a, 1, b, &kt0, &lkv);
  off = lkv - lq;
  nr = min64(BM, lq - i0);
  load_rows_t(c, &a->q, b, qt0 + i0, h, nr, dq, Qt, T);
  load_rows_t(c, &a->dout, b, qt0 + i0, h, nr, dv, Gt, T);
  if (pbq) {
    c->pb->pack_b(dq, BM, Qt, BM, pbq);
    c->pb->pack_b(dv, BM, Gt, BM, pbg);
  }
  for (r = 0; r < BM; r++) {
    const int64_t li = r < nr ? loff(a, b, qt0 + i0 + r, h) : 0;
    Lr[r] = r < nr ? a->lse[li] : 0.0f;
    Dr[r] = r < nr ? c->Dbuf[li] : 0.0f;
  }
  row_ranges(a, i0, nr, lq, lkv, lo, hi, &jlo, &jhi);
  memset(dQa, 0, sizeof(float) * (size_t)(BM * dqp));
  memset(ls, 0, sizeof(float) * BM);
  if (c->cache && jlo < jhi) {
    Kc = cache_kv(c, ws, b, hk, kt0, lkv, NULL, NULL);
    Vc = Kc + lkv * dqp;
  }
  for (j0 = jlo < jhi ? jlo / BN * BN : 0; j0 < jhi; j0 += BN) {
    const int64_t nb = min64(BN, lkv - j0);
    int64_t ra, rb, c0, c1, j, e, krs, vrs, kld;
    const float *Ka, *Va, *Kb;
    float *Sb = St, *dPb = dPt; /* in the S store when pass A reads them */
    if (!active_rows(lo, hi, nr, j0, nb, act, &ra, &rb)) continue;
    if (c->sbuf) {
      Sb = s_slot(c, b, h, i0, j0);
      dPb = Sb + BN * BM;
    }
    c0 = ra / 16 * 16;
    c1 = min64(BM, (rb + 15) / 16 * 16);
    if (fp32 && !Kc) {
      Ka = (const float *)a->k.data + eoff(&a->k, b, kt0 + j0, hk);
      krs = a->k.ts;
      Va = (const float *)a->v.data + eoff(&a->v, b, kt0 + j0, hk);
      vrs = a->v.ts;
    } else if (Kc) {
      Ka = Kc + j0 * dqp;
      krs = dqp;
      Va = Vc + j0 * c->dvp;
      vrs = c->dvp;
    } else {
      load_rows(c, &a->k, b, kt0 + j0, hk, nb, dq, Kn, dqp);
      load_rows(c, &a->v, b, kt0 + j0, hk, nb, dv, Vn, dv);
      Ka = Kn;
      krs = dqp;
      Va = Vn;
      vrs = dv;
    }
    if (kbdirect || Kc) {
      Kb = Ka;
      kld = krs;
    } else {
      if (fp32) load_rows(c, &a->k, b, kt0 + j0, hk, nb, dq, Kn, dqp);
      Kb = Kn;
      kld = dqp;
    }
    if (pbq) {
      c->pb->gemm_pb(nb, c1 - c0, dq, Ka, krs, 1, pbq + c0, Sb + c0, BM);
      c->pb->gemm_pb(nb, c1 - c0, dv, Va, vrs, 1, pbg + c0, dPb + c0, BM);
    } else {
      K->gemm(nb, c1 - c0, dq, Ka, krs, 1, Qt + c0, BM, Sb + c0, BM, 0);
      K->gemm(nb, c1 - c0, dv, Va, vrs, 1, Gt + c0, BM, dPb + c0, BM, 0);
    }
    for (r = c0; r < c1; r++) {
      ja[r] = r < rb && act[r] ? (int32_t)(max64(lo[r], j0) - j0) : 0;
      je[r] = r < rb && act[r] ? (int32_t)(min64(hi[r], j0 + nb) - j0) : 0;
    }
    if (!plain) /* dx/ds and the logits in place */
      for (j = 0; j < BN; j++)
        for (r = c0; r < c1; r++) {
          float *x = Sb + j * BM + r;
          const float s = j < nb ? *x : 0.0f;
          Gg[j * BM + r] = xte_attn_dlogit(s, &sp);
          *x = j >= ja[r] && j < je[r] ? xte_attn_logit(s, &sp, i0 + r + off - (j0 + j))
                                       : xte_attn_neg_inf();
        }
    K->bwd_p_t(Sb + c0, dPb + c0, sp.softcap ? Gg + c0 : NULL, BM, c1 - c0, plain, sp.scale,
               ja + c0, je + c0, Lr + c0, NULL, Dr + c0, Pt + c0, dSt + c0,
               c->fast ? NULL : sums + c0);
    if (!c->fast) /* FAST: no renormalisation, no row sums */
      for (r = ra; r < rb; r++)
        if (act[r]) ls[r] = xte_attn_add(ls[r], sums[r]);
    /* the block's part of the rows that see it, added to dQa as its store (xte_attn_add) */
    for (r = ra; next_run(act, rb, &r, &e); r = e)
      K->gemm_fold(e - r, dqp, nb, dSt + r, 1, BM, Kb, kld, NULL, 0, dQa + r * dqp, dqp, NULL);
  }
  for (r = 0; r < nr; r++) {
    float *g = dQa + r * dqp;
    int64_t cc;
    if (ls[r] > 0.0f) { /* never in FAST (ls stays 0): dQ as summed, corr 0 */
      for (cc = 0; cc < dq; cc++) g[cc] = xte_attn_finish(g[cc], ls[r]);
      c->Cbuf[loff(a, b, qt0 + i0 + r, h)] = xte_logf(ls[r]);
    } else {
      c->Cbuf[loff(a, b, qt0 + i0 + r, h)] = 0.0f;
    }
    if (r + PF_ROWS < nr)
      prefetch_row(&a->dq, a->dtype, eoff(&a->dq, b, qt0 + i0 + r + PF_ROWS, h), dq, 1);
    store_row(&a->dq, a->dtype, eoff(&a->dq, b, qt0 + i0 + r, h), dq, g);
  }
}

static size_t max_size(size_t x, size_t y) {
  return x > y ? x : y;
}

/* The S store (see s_slot): a budget of 8 MiB per thread (at least 16 MiB, at most the head
 * caches' limit), reused round after round; a bigger store spends more on the page faults of its
 * first touch than recomputing S and dP costs (docs/performance.md, attention). As many
 * whole pairs per round as fit, else one pair and as many units as fit (then with the running
 * sums sacc), else no store. A pair that does not fit gets four times the budget: each of its
 * rounds moves pass A's running sums through memory and waits for both passes, and its work
 * (quadratic in the sequence, like the store) dwarfs the faults. Allocated here, before any output
 * byte. */
static xte_status plan_store(actx *c) {
  const xte_attn_args *a = c->a;
  const int64_t npairs = a->batch * a->hkv;
  const int64_t nt = xte_cpu_threads() > 0 ? xte_cpu_threads() : 1;
  size_t unit, maxu, budget = (size_t)(nt < 2 ? 2 : nt) << 23, bytes, accb = 0;
  if (budget > cache_limit) budget = cache_limit;
  c->sT = (c->lq_max + BM - 1) / BM;
  c->sNB = (c->lkv_max + BN - 1) / BN;
  if (npairs <= 0 || c->sT <= 0 || c->sNB <= 0 || c->nq <= 0 ||
      __builtin_mul_overflow((size_t)c->sNB, (size_t)(2 * BN * BM) * sizeof(float), &unit) ||
      unit > budget)
    return XTE_SUCCESS;
  if ((size_t)c->G * (size_t)c->sT > budget / unit) /* a pair takes rounds: a bigger store */
    budget = budget <= cache_limit / 4 ? 4 * budget : cache_limit;
  maxu = budget / unit;
  if ((size_t)c->G * (size_t)c->sT <= maxu) { /* whole pairs */
    c->su = c->G * c->sT;
    c->spairs = (int64_t)(maxu / (size_t)c->su) < npairs ? (int64_t)(maxu / (size_t)c->su) : npairs;
  } else { /* one pair in several rounds */
    c->su = (int64_t)maxu;
    c->spairs = 1;
    accb = (size_t)c->sNB * (size_t)(BN * (c->dqp + c->dvp)) * sizeof(float);
  }
  bytes = unit * (size_t)c->su * (size_t)c->spairs;
  c->sbuf = (float *)xte_aligned_alloc(bytes + accb);
  if (!c->sbuf) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "attention: out of host memory");
  c->sacc = accb ? c->sbuf + bytes / sizeof(float) : NULL;
  XTE_TRY(xa_alloc_list(c->nq, &c->qsub));
#ifdef MADV_HUGEPAGE
  { /* 2 MiB pages where the system offers them: a fraction of the page faults */
    const uintptr_t h = (uintptr_t)2 << 20, p0 = ((uintptr_t)c->sbuf + h - 1) & ~(h - 1),
                    p1 = ((uintptr_t)c->sbuf + bytes + accb) & ~(h - 1);
    if (p1 > p0) (void)madvise((void *)p0, p1 - p0, MADV_HUGEPAGE);
  }
#endif
  return XTE_SUCCESS;
}

/* The (sequence, KV head) pair of query task k / KV task k (the lists go pair by pair). */
static int64_t q_pair(const actx *c, int64_t k) {
  return c->qlist[k] * c->a->hkv + c->qlist[c->nq + k] / c->G;
}
static int64_t kv_pair(const actx *c, int64_t k) {
  return c->kvlist[k] * c->a->hkv + c->kvlist[c->nkv + k];
}

static void q_sub(actx *c, int64_t n, int64_t b, int64_t h, int64_t i0) {
  c->qsub[n] = b;
  c->qsub[c->nq + n] = h;
  c->qsub[2 * c->nq + n] = i0;
}

/* One round: pass B over qsub's n tasks (a list of stride nq), then pass A over KV tasks
 * [k0, k1). */
static void run_round(actx *c, int64_t n, int64_t k0, int64_t k1) {
  c->tb = c->qsub;
  c->th = c->qsub + c->nq;
  c->ti = c->qsub + 2 * c->nq;
  c->ntasks = n;
  c->run = bwd_q_task;
  xa_split_tasks(c);
  if (n > 0) xte_parallel_threads(xa_sched_thread, c);
  xa_run_range(c, c->kvlist, c->nkv, k0, k1, bwd_kv_task);
}

/* The backward's passes B and A in rounds over the S store (see s_slot, plan_store). The rounds
 * follow the task lists, not the bounds: a round starts at the next pair that has a task (pairs
 * of empty sequences cost nothing; THD may have 2^31 of them), a round's query tasks are
 * gathered from its own pairs' part of the list, and a pair run in rounds of su units (spairs = 1)
 * builds each round's tasks from its units and skips the rounds whose units are all past the
 * sequence's tiles (sT is the longest sequence's). A round's work is the same as before: which
 * rounds run and how its tasks are listed changes no byte (tasks are independent, pass A adds
 * the units in the same order). */
static void bwd_rounds(actx *c) {
  const xte_attn_args *a = c->a;
  const int64_t nu = c->G * c->sT;
  int64_t qk = 0, kk = 0, qe, ke, k, n;
  while (qk < c->nq || kk < c->nkv) {
    const int64_t pq = qk < c->nq ? q_pair(c, qk) : INT64_MAX;
    const int64_t pk = kk < c->nkv ? kv_pair(c, kk) : INT64_MAX;
    int64_t p1;
    c->spair0 = pq < pk ? pq : pk;
    p1 = c->spair0 + c->spairs;
    for (qe = qk; qe < c->nq && q_pair(c, qe) < p1; qe++) {
    }
    for (ke = kk; ke < c->nkv && kv_pair(c, ke) < p1; ke++) {
    }
    if (c->su >= nu || qe == qk) {
      /* whole pairs in one round (or a pair with no query tile: pass A alone, zeros) */
      c->su0 = 0;
      c->su1 = nu;
      c->sfirst = c->slast = 1;
      for (k = qk, n = 0; k < qe; k++, n++)
        q_sub(c, n, c->qlist[k], c->qlist[c->nq + k], c->qlist[2 * c->nq + k]);
      run_round(c, n, kk, ke);
    } else {
      /* one pair in rounds of su units u = g sT + t (query head g of the group, tile t < nt) */
      const int64_t b = c->qlist[qk], hk = c->qlist[c->nq + qk] / c->G;
      int64_t t0, lq, nt, u = 0, g, t, tlo, thi;
      seq(a, 0, b, &t0, &lq);
      nt = (lq + BM - 1) / BM;
      while (u < nu) {
        c->su0 = u / c->su * c->su;
        c->su1 = c->su0 + c->su < nu ? c->su0 + c->su : nu;
        for (g = c->su0 / c->sT, n = 0; g <= (c->su1 - 1) / c->sT; g++) {
          tlo = max64(0, c->su0 - g * c->sT);
          thi = min64(nt, c->su1 - g * c->sT);
          for (t = thi - 1; t >= tlo; t--) q_sub(c, n++, b, hk * c->G + g, t * BM); /* last first */
        }
        u = c->su1; /* the next unit of a tile */
        if (u % c->sT >= nt) u = (u / c->sT + 1) * c->sT;
        c->sfirst = c->su0 == 0;
        c->slast = u >= nu;
        run_round(c, n, kk, ke);
      }
    }
    qk = qe;
    kk = ke;
  }
}

static xte_status cpu_attn_bwd(const xte_attn_args *a, void *handle) {
  actx c;
  xte_status st;
  int64_t nl;
  size_t bytes, wsf;
  (void)handle;
  XTE_TRY(xa_check_args(a));
  if (a->no_output) return XTE_SUCCESS;
  init_ctx(&c, a);
  /* every allocation before the first output byte: D, both task lists, the workspaces */
  if (__builtin_mul_overflow(a->packed ? a->total_q : a->batch * a->sq, a->hq, &nl) ||
      __builtin_mul_overflow((size_t)nl * 2 + 16, sizeof(float), &bytes))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "attention: D buffer size overflows");
  c.Dbuf = (float *)xte_aligned_alloc(bytes);
  c.Cbuf = c.Dbuf ? c.Dbuf + nl : NULL; /* no offset from a NULL pointer */
  st = c.Dbuf ? XTE_SUCCESS
              : xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "attention: out of host memory");
  plan_cache(&c, max64(c.lkv_max, c.G * c.lq_max), c.dqp, c.dvp);
  c.bygroup = c.cache || !(a->softcap > 0.0f);
  if (st == XTE_SUCCESS) st = xa_make_q_tasks(&c);
  if (st == XTE_SUCCESS) st = xa_make_kv_tasks(&c);
  if (st == XTE_SUCCESS && !(a->softcap > 0.0f)) st = plan_store(&c);
  wsf = max_size(max_size((size_t)(2 * BM * a->dv + BM + 64), bwd_q_ws_floats(&c)),
                 bwd_kv_ws_floats(&c));
  c.cache_off = (wsf + 15) / 16 * 16;
  wsf = c.cache_off + c.cache_floats;
  if (st == XTE_SUCCESS) st = xa_alloc_ws(&c, wsf, c.nq > c.nkv ? c.nq : c.nkv);
  if (st == XTE_SUCCESS) {
    for_padding(&c, 0, bwd_pad_q);
    for_padding(&c, 1, bwd_pad_kv);
    xa_run_tasks(&c, c.qlist, c.nq, prep_task); /* D */
    if (c.sbuf) {
      bwd_rounds(&c);
    } else {
      xa_run_tasks(&c, c.qlist, c.nq, bwd_q_task);    /* pass B: dQ */
      xa_run_tasks(&c, c.kvlist, c.nkv, bwd_kv_task); /* pass A: dK, dV */
    }
  }
  free_ctx(&c);
  return st;
}

static const struct xte_attention_ops cpu_attention_ops = {cpu_attn_fwd, cpu_attn_bwd};

const struct xte_attention_ops *xte_cpu_attention_ops(void) {
  return &cpu_attention_ops;
}

xte_status xte_internal_attention_exp(xte_cpu_isa isa, const float *x, float *y, int64_t n) {
  const xte_cpu_isa_table *T = xte_cpu_isa_table_for(isa);
  if (!T)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "isa %d cannot run on this machine or build",
                         (int)isa);
  if (n > 0) T->attn->exp_n(x, y, n);
  return XTE_SUCCESS;
}

xte_status xte_internal_attention_exp_fast(xte_cpu_isa isa, const float *x, float *y, int64_t n) {
  const xte_cpu_isa_table *T = xte_cpu_isa_table_for(isa);
  if (!T)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "isa %d cannot run on this machine or build",
                         (int)isa);
  if (n > 0) (T->attn->fast ? T->attn->fast : T->attn)->exp_n(x, y, n);
  return XTE_SUCCESS;
}

xte_status xte_internal_attention_bf16_gemm(int kind, int fold, int64_t M, int64_t N, int64_t K,
                                            const float *A, int64_t a_rs, int64_t a_ks,
                                            const float *B, int64_t ldb, const float *C0,
                                            int64_t ldc0, float *D, int64_t ldd, const float *alpha,
                                            int acc) {
  const xte_cpu_isa_table *T = xte_cpu_isa_table_get();
  const xte_attn_bf16_kernels *k = kind == 1 ? T->attn_amx : kind == 2 ? T->attn_bf16 : NULL;
  if (!k) return xte_set_error(XTE_ERROR_UNSUPPORTED, "bf16 dot products %d not attached", kind);
  if (fold == 2) {
    uint32_t *pb;
    if (!k->gemm_pb || K > 256 || N > XTE_ATTN_PB_LD)
      return xte_set_error(XTE_ERROR_UNSUPPORTED, "no packed-B gemm for kind %d, K %lld, N %lld",
                           kind, (long long)K, (long long)N);
    pb = (uint32_t *)xte_aligned_alloc(XTE_ATTN_PB_WORDS * sizeof(uint32_t));
    if (!pb) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "out of host memory");
    k->pack_b(K, N, B, ldb, pb);
    k->gemm_pb(M, N, K, A, a_rs, a_ks, pb, D, ldd);
    xte_aligned_free(pb);
  } else if (fold)
    k->gemm_fold(M, N, K, A, a_rs, a_ks, B, ldb, C0, ldc0, D, ldd, alpha);
  else
    k->gemm(M, N, K, A, a_rs, a_ks, B, ldb, D, ldd, acc);
  return XTE_SUCCESS;
}

/* The threads-in-one-process EP transport: the ranks are threads of one process sharing a world;
 * a collective posts each rank's buffers in the world, waits at a barrier, copies what it
 * receives straight from the senders' buffers, and waits again before anyone may reuse them. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ep/ep_transport.h"
#include "xte/ep.h"
#include "xte_internal.h"

typedef struct post {
  const void *send;
  const int64_t *scount, *sdispl;
  size_t unit;
  const intptr_t *saddr; /* alltoallw's blocks */
  const int64_t *slen, *soff;
  const int64_t *rlen, *roff; /* alltoallw's receive blocks (their lengths) */
} post;

struct xte_ep_threads_world_s {
  int n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  uint64_t generation;
  post *posts;
};

typedef struct rank_ctx {
  struct xte_ep_threads_world_s *w;
  int rank;
} rank_ctx;

xte_status xte_ep_threads_world_create(int num_ranks, xte_ep_threads_world *world) {
  struct xte_ep_threads_world_s *w;
  XTE_CHECK_PTR(world, "world");
  if (num_ranks < 1 || num_ranks > 4096)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "num_ranks = %d: want 1..4096", num_ranks);
  w = (struct xte_ep_threads_world_s *)xte_aligned_calloc(1, sizeof *w);
  if (!w) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "threads world: out of memory");
  w->posts = (post *)xte_aligned_calloc((size_t)num_ranks, sizeof(post));
  if (!w->posts) {
    xte_aligned_free(w);
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "threads world: out of memory");
  }
  w->n = num_ranks;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  *world = w;
  xte_clear_error();
  return XTE_SUCCESS;
}

xte_status xte_ep_threads_world_destroy(xte_ep_threads_world world) {
  if (!world) return XTE_SUCCESS;
  pthread_mutex_destroy(&world->mu);
  pthread_cond_destroy(&world->cv);
  xte_aligned_free(world->posts);
  xte_aligned_free(world);
  xte_clear_error();
  return XTE_SUCCESS;
}

static void barrier(struct xte_ep_threads_world_s *w) {
  pthread_mutex_lock(&w->mu);
  uint64_t g = w->generation;
  if (++w->arrived == w->n) {
    w->arrived = 0;
    w->generation++;
    pthread_cond_broadcast(&w->cv);
  } else {
    while (w->generation == g) pthread_cond_wait(&w->cv, &w->mu);
  }
  pthread_mutex_unlock(&w->mu);
}

static xte_status th_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  rank_ctx *c = (rank_ctx *)ctx;
  struct xte_ep_threads_world_s *w = c->w;
  int r;
  w->posts[c->rank].send = send;
  barrier(w);
  for (r = 0; r < w->n; r++)
    if (bytes) memcpy((char *)recv + (size_t)r * bytes, w->posts[r].send, bytes);
  barrier(w);
  return XTE_SUCCESS;
}

static xte_status th_alltoallv(void *ctx, const void *send, const int64_t *scount,
                               const int64_t *sdispl, void *recv, const int64_t *rcount,
                               const int64_t *rdispl, size_t unit) {
  rank_ctx *c = (rank_ctx *)ctx;
  struct xte_ep_threads_world_s *w = c->w;
  xte_status st = XTE_SUCCESS;
  int s;
  post *me = &w->posts[c->rank];
  me->send = send;
  me->scount = scount;
  me->sdispl = sdispl;
  me->unit = unit;
  barrier(w);
  for (s = 0; s < w->n; s++) {
    const post *p = &w->posts[s];
    int64_t n = p->scount[c->rank];
    if (n != rcount[s] || p->unit != unit) {
      st = xte_set_error(XTE_ERROR_INTERNAL,
                         "threads transport: rank %d sends %lld units to rank "
                         "%d, which expects %lld",
                         s, (long long)n, c->rank, (long long)rcount[s]);
      continue;
    }
    if (n)
      memcpy((char *)recv + (size_t)rdispl[s] * unit,
             (const char *)p->send + (size_t)p->sdispl[c->rank] * unit, (size_t)n * unit);
  }
  barrier(w);
  return st;
}

/* alltoallw (matched 0) or alltoallw_matched (1: the blocks of both sides of each pair must
 * have the same lengths, which is checked, so that the threads tests catch a list cut
 * differently on the two sides, which a transport moving blocks as they are relies on) */
static xte_status th_exchange(void *ctx, const intptr_t *saddr, const int64_t *slen,
                              const int64_t *soff, const intptr_t *raddr, const int64_t *rlen,
                              const int64_t *roff, int matched) {
  rank_ctx *c = (rank_ctx *)ctx;
  struct xte_ep_threads_world_s *w = c->w;
  xte_status st = XTE_SUCCESS;
  int s;
  post *me = &w->posts[c->rank];
  me->saddr = saddr;
  me->slen = slen;
  me->soff = soff;
  me->rlen = rlen;
  me->roff = roff;
  barrier(w);
  if (matched) {
    /* every rank checks every pair, so that all fail alike */
    int d;
    for (s = 0; s < w->n && st == XTE_SUCCESS; s++)
      for (d = 0; d < w->n && st == XTE_SUCCESS; d++) {
        const post *ps = &w->posts[s], *pd = &w->posts[d];
        int64_t sb = ps->soff[d], rb = pd->roff[s], k, ok;
        ok = ps->soff[d + 1] - sb == pd->roff[s + 1] - rb;
        for (k = 0; ok && k < ps->soff[d + 1] - sb; k++)
          ok = ps->slen[sb + k] == pd->rlen[rb + k] && ps->slen[sb + k] > 0;
        if (!ok)
          st = xte_set_error(XTE_ERROR_INTERNAL,
                             "threads transport: rank %d's blocks for rank %d are cut unlike the "
                             "receiver's (matched exchange)",
                             s, d);
      }
    if (st != XTE_SUCCESS) {
      barrier(w);
      return st;
    }
  }
  for (s = 0; s < w->n; s++) {
    const post *p = &w->posts[s];
    int64_t sb = p->soff[c->rank], se = p->soff[c->rank + 1], rb = roff[s], re = roff[s + 1];
    int64_t so = 0, ro = 0; /* bytes done within the current send / receive block */
    while (sb < se && rb < re) {
      int64_t n = p->slen[sb] - so < rlen[rb] - ro ? p->slen[sb] - so : rlen[rb] - ro;
      memcpy((char *)raddr[rb] + ro, (const char *)p->saddr[sb] + so, (size_t)n);
      so += n;
      ro += n;
      if (so == p->slen[sb]) sb++, so = 0;
      if (ro == rlen[rb]) rb++, ro = 0;
    }
    while (sb < se && p->slen[sb] == 0) sb++;
    while (rb < re && rlen[rb] == 0) rb++;
    if (sb != se || rb != re)
      st = xte_set_error(XTE_ERROR_INTERNAL,
                         "threads transport: rank %d's blocks for rank %d do not match the "
                         "receiver's",
                         s, c->rank);
  }
  barrier(w);
  return st;
}

static xte_status th_alltoallw(void *ctx, const intptr_t *saddr, const int64_t *slen,
                               const int64_t *soff, const intptr_t *raddr, const int64_t *rlen,
                               const int64_t *roff) {
  return th_exchange(ctx, saddr, slen, soff, raddr, rlen, roff, 0);
}

static xte_status th_alltoallw_matched(void *ctx, const intptr_t *saddr, const int64_t *slen,
                                       const int64_t *soff, const intptr_t *raddr,
                                       const int64_t *rlen, const int64_t *roff) {
  return th_exchange(ctx, saddr, slen, soff, raddr, rlen, roff, 1);
}

static void th_destroy(void *ctx) {
  xte_aligned_free(ctx);
}

xte_status xte_ep_threads_transport(struct xte_ep_threads_world_s *world, int rank,
                                    xte_ep_transport *t) {
  rank_ctx *c;
  XTE_CHECK_PTR(world, "world");
  if (rank < 0 || rank >= world->n)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "rank = %d: want 0..%d", rank, world->n - 1);
  c = (rank_ctx *)xte_aligned_alloc(sizeof *c);
  if (!c) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "threads transport: out of memory");
  c->w = world;
  c->rank = rank;
  memset(t, 0, sizeof *t);
  t->name = "threads";
  t->rank = rank;
  t->size = world->n;
  t->ctx = c;
  t->allgather = th_allgather;
  t->alltoallv = th_alltoallv;
  t->alltoallw = th_alltoallw;
  t->alltoallw_matched = th_alltoallw_matched;
  t->destroy = th_destroy;
  return XTE_SUCCESS;
}

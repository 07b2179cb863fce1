/* A stand-in for libnccl.so.2 over threads of one process (host memory; streams ignored: every
 * operation is done when the call returns), for test_simt_ep: the NCCL transport of
 * src/ep/transport/ccl.h loads it through XTE_NCCL_LIBRARY and runs on the SIMT runner's plugin.
 *
 *  - fake_ncclGetUniqueId makes a world (its address in the id); each rank's thread calls
 *    ncclCommInitRank(&comm, nranks, id, rank) with it.
 *  - ncclSend / ncclRecv inside ncclGroupStart / ncclGroupEnd are queued per thread and run at
 *    the outermost ncclGroupEnd: every send first (copied into the world's mailbox of the pair),
 *    then every receive, in call order, waiting for the peer's message of the same order
 *    (NCCL's matching: per (peer, direction), in order). A size mismatch fails the receive
 *    (ncclInvalidUsage) and is printed. Outside a group an operation runs on its own.
 *  - ncclAllGather is a group of a send to every rank and a receive from every rank.
 *  - ncclGetVersion says 2.21.5; ncclCommCuDevice device 0; no asynchronous errors.
 * Only the datatypes' sizes matter (bytes are copied). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_API __attribute__((visibility("default")))
#define FAKE_MAX_RANKS 64
#define FAKE_MAX_OPS 4096

typedef struct fake_msg {
  struct fake_msg *next;
  size_t bytes;
  unsigned char data[];
} fake_msg;

typedef struct fake_world {
  int n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  fake_msg *head[FAKE_MAX_RANKS][FAKE_MAX_RANKS], *tail[FAKE_MAX_RANKS][FAKE_MAX_RANKS];
} fake_world;

typedef struct fake_comm {
  fake_world *w;
  int rank;
} fake_comm;

typedef struct {
  char internal[128];
} fake_unique_id;

typedef struct fake_op {
  int send;
  void *buf;
  size_t bytes;
  int peer;
  fake_comm *comm;
} fake_op;

static __thread int g_depth;
static __thread int g_nops;
static __thread fake_op g_ops[FAKE_MAX_OPS];
static __thread int g_overflow;

static size_t dt_size(int dt) {
  static const size_t sz[10] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return dt >= 0 && dt < 10 ? sz[dt] : 1;
}

FAKE_API int ncclGetVersion(int *v) {
  *v = 22105;
  return 0;
}

FAKE_API const char *ncclGetErrorString(int r) {
  return r == 0 ? "no error (fake)" : r == 5 ? "invalid usage (fake)" : "error (fake)";
}

FAKE_API int ncclGetUniqueId(fake_unique_id *id) {
  fake_world *w = (fake_world *)calloc(1, sizeof *w);
  if (!w) return 2;
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  memset(id, 0, sizeof *id);
  memcpy(id->internal, &w, sizeof w);
  return 0;
}

FAKE_API int ncclCommInitRank(fake_comm **comm, int nranks, fake_unique_id id, int rank) {
  fake_world *w;
  fake_comm *c;
  memcpy(&w, id.internal, sizeof w);
  if (!w || nranks < 1 || nranks > FAKE_MAX_RANKS || rank < 0 || rank >= nranks) return 4;
  pthread_mutex_lock(&w->mu);
  if (!w->n) w->n = nranks;
  pthread_mutex_unlock(&w->mu);
  if (w->n != nranks) return 4;
  c = (fake_comm *)calloc(1, sizeof *c);
  if (!c) return 2;
  c->w = w;
  c->rank = rank;
  *comm = c;
  return 0;
}

FAKE_API int ncclCommDestroy(fake_comm *c) {
  free(c);
  return 0;
}

/* the world of an id, freed once every comm of it is destroyed (the test's last call) */
FAKE_API void fake_ncclWorldDestroy(fake_unique_id id) {
  fake_world *w;
  int a, b;
  memcpy(&w, id.internal, sizeof w);
  if (!w) return;
  for (a = 0; a < FAKE_MAX_RANKS; a++)
    for (b = 0; b < FAKE_MAX_RANKS; b++)
      while (w->head[a][b]) {
        fake_msg *m = w->head[a][b];
        w->head[a][b] = m->next;
        free(m);
      }
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}

FAKE_API int ncclCommCount(const fake_comm *c, int *n) {
  *n = c->w->n;
  return 0;
}
FAKE_API int ncclCommUserRank(const fake_comm *c, int *r) {
  *r = c->rank;
  return 0;
}
FAKE_API int ncclCommCuDevice(const fake_comm *c, int *d) {
  (void)c;
  *d = 0;
  return 0;
}
FAKE_API int ncclCommGetAsyncError(fake_comm *c, int *e) {
  (void)c;
  *e = 0;
  return 0;
}

static int run_ops(void) {
  int i, rc = 0;
  /* sends: copied into the pair's mailbox */
  for (i = 0; i < g_nops; i++) {
    fake_op *o = &g_ops[i];
    fake_world *w = o->comm->w;
    fake_msg *m;
    if (!o->send) continue;
    m = (fake_msg *)malloc(sizeof *m + (o->bytes ? o->bytes : 1));
    if (!m) return 2;
    m->next = NULL;
    m->bytes = o->bytes;
    if (o->bytes) memcpy(m->data, o->buf, o->bytes);
    pthread_mutex_lock(&w->mu);
    if (w->tail[o->comm->rank][o->peer])
      w->tail[o->comm->rank][o->peer]->next = m;
    else
      w->head[o->comm->rank][o->peer] = m;
    w->tail[o->comm->rank][o->peer] = m;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
  }
  /* receives, in order */
  for (i = 0; i < g_nops; i++) {
    fake_op *o = &g_ops[i];
    fake_world *w = o->comm->w;
    fake_msg *m;
    if (o->send) continue;
    pthread_mutex_lock(&w->mu);
    while (!w->head[o->peer][o->comm->rank]) pthread_cond_wait(&w->cv, &w->mu);
    m = w->head[o->peer][o->comm->rank];
    w->head[o->peer][o->comm->rank] = m->next;
    if (!m->next) w->tail[o->peer][o->comm->rank] = NULL;
    pthread_mutex_unlock(&w->mu);
    if (m->bytes != o->bytes) {
      fprintf(stderr, "fake nccl: rank %d receives %zu bytes from rank %d, which sent %zu\n",
              o->comm->rank, o->bytes, o->peer, m->bytes);
      rc = 5;
    } else if (o->bytes) {
      memcpy(o->buf, m->data, o->bytes);
    }
    free(m);
  }
  g_nops = 0;
  return rc;
}

static int queue(int send, const void *buf, size_t count, int dt, int peer, fake_comm *c) {
  if (peer < 0 || peer >= c->w->n) return 4;
  if (g_nops == FAKE_MAX_OPS) {
    g_overflow = 1;
    return 5;
  }
  g_ops[g_nops].send = send;
  g_ops[g_nops].buf = (void *)buf;
  g_ops[g_nops].bytes = count * dt_size(dt);
  g_ops[g_nops].peer = peer;
  g_ops[g_nops].comm = c;
  g_nops++;
  return g_depth ? 0 : run_ops();
}

FAKE_API int ncclGroupStart(void) {
  g_depth++;
  return 0;
}

FAKE_API int ncclGroupEnd(void) {
  if (g_depth <= 0) return 5;
  if (--g_depth) return 0;
  if (g_overflow) {
    g_overflow = 0;
    g_nops = 0;
    return 5;
  }
  return run_ops();
}

FAKE_API int ncclSend(const void *buf, size_t count, int dt, int peer, fake_comm *c, void *stream) {
  (void)stream;
  return queue(1, buf, count, dt, peer, c);
}

FAKE_API int ncclRecv(void *buf, size_t count, int dt, int peer, fake_comm *c, void *stream) {
  (void)stream;
  return queue(0, buf, count, dt, peer, c);
}

FAKE_API int ncclAllGather(const void *send, void *recv, size_t count, int dt, fake_comm *c,
                           void *stream) {
  size_t b = count * dt_size(dt);
  int p, rc;
  (void)stream;
  ncclGroupStart();
  for (p = 0; p < c->w->n; p++) queue(1, send, count, dt, p, c);
  for (p = 0; p < c->w->n; p++) queue(0, (char *)recv + (size_t)p * b, count, dt, p, c);
  rc = ncclGroupEnd();
  return rc;
}

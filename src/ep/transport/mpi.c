/* The MPI EP transport (built when CMake finds MPI): MPI_Allgather and MPI_Alltoallv on a
 * duplicate of the caller's communicator, counts in units of a contiguous datatype (a row), so
 * a block of more than 2^31 bytes still moves while its row count fits an int. The token rows
 * of dispatch and combine go by alltoallw_matched: MPI_Isend / MPI_Irecv of each block in place
 * (one copy in Open MPI's shared memory transport, as MPI_Alltoallv's), small blocks staged; its
 * two halves (alltoallw_matched_start, alltoallw_wait) let the caller work while it is in
 * flight. */
#include <limits.h>
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "ep/ep_transport.h"
#include "xte_internal.h"

typedef struct mpi_ctx {
  MPI_Comm comm;
  int size, rank;
  int datatypes;  /* XTE_EP_MPI_DATATYPES=1: hindexed types instead of staging */
  void *stage[2]; /* send / receive staging, kept and grown across calls */
  size_t stage_bytes[2];
  int *sc, *sd, *rc, *rd; /* int count / displacement scratch, [size] each */
  int64_t *sd64, *rd64;   /* staging offsets of alltoallw_matched, [size] each */
  MPI_Request *req;       /* alltoallw_matched's requests, kept and grown by reserve */
  int64_t req_cap;
  int64_t seg_min; /* alltoallw_matched moves a pair's blocks as they are when they average
                    * at least this many bytes (XTE_EP_MPI_SEGMENT_MIN), else stages them */
  /* the exchange that alltoallw_matched_start posted and alltoallw_wait completes */
  int64_t pend_nreq;
  int pend_rc, pending;
  const intptr_t *pend_raddr;
  const int64_t *pend_rlen, *pend_roff;
} mpi_ctx;

#define XTE_EP_MPI_TAG 0x7865
#define XTE_EP_MPI_SEGMENT_MIN_DEFAULT 16384
#define XTE_EP_MPI_CHUNK ((int64_t)1 << 30) /* bytes per message at most */

int xte_ep_have_mpi(void) {
  return 1;
}

static xte_status mpi_fail(int rc, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  msg[0] = '\0';
  MPI_Error_string(rc, msg, &len);
  return xte_set_error(XTE_ERROR_DEVICE, "%s failed: %s", what, msg);
}

static xte_status mpi_allgather(void *ctx, const void *send, void *recv, size_t bytes) {
  mpi_ctx *c = (mpi_ctx *)ctx;
  int rc;
  if (bytes > INT_MAX) return xte_set_error(XTE_ERROR_INTERNAL, "allgather of %zu bytes", bytes);
  rc = MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, c->comm);
  return rc == MPI_SUCCESS ? XTE_SUCCESS : mpi_fail(rc, "MPI_Allgather");
}

static xte_status mpi_alltoallv(void *ctx, const void *send, const int64_t *scount,
                                const int64_t *sdispl, void *recv, const int64_t *rcount,
                                const int64_t *rdispl, size_t unit) {
  mpi_ctx *c = (mpi_ctx *)ctx;
  MPI_Datatype row = MPI_BYTE;
  int r, rc, bytes = 1;
  int64_t u = (int64_t)unit;
  if (unit == 0 || unit > INT_MAX)
    return xte_set_error(XTE_ERROR_INTERNAL, "alltoallv unit of %zu bytes", unit);
  /* byte counts when every count and displacement fits an int (MPI_BYTE is the fastest path),
   * else counts of a contiguous row type */
  for (r = 0; r < c->size && bytes; r++)
    bytes = scount[r] <= INT_MAX / u && sdispl[r] <= INT_MAX / u && rcount[r] <= INT_MAX / u &&
            rdispl[r] <= INT_MAX / u;
  for (r = 0; r < c->size; r++) {
    int64_t m = bytes ? u : 1;
    if (scount[r] > INT_MAX || sdispl[r] > INT_MAX || rcount[r] > INT_MAX || rdispl[r] > INT_MAX)
      return xte_set_error(XTE_ERROR_UNSUPPORTED,
                           "the MPI transport moves at most 2^31 - 1 rows "
                           "per rank pair and buffer");
    c->sc[r] = (int)(scount[r] * m);
    c->sd[r] = (int)(sdispl[r] * m);
    c->rc[r] = (int)(rcount[r] * m);
    c->rd[r] = (int)(rdispl[r] * m);
  }
  if (!bytes) {
    rc = MPI_Type_contiguous((int)unit, MPI_BYTE, &row);
    if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&row);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Type_contiguous");
  }
  rc = MPI_Alltoallv(send, c->sc, c->sd, row, recv, c->rc, c->rd, row, c->comm);
  if (!bytes) MPI_Type_free(&row);
  return rc == MPI_SUCCESS ? XTE_SUCCESS : mpi_fail(rc, "MPI_Alltoallv");
}

/* A rank's blocks to itself: copied here, block by block (MPI would pack and unpack them). */
static int self_copy(const intptr_t *saddr, const int64_t *slen, int64_t sb, int64_t se,
                     const intptr_t *raddr, const int64_t *rlen, int64_t rb, int64_t re) {
  int64_t so = 0, ro = 0;
  while (sb < se && rb < re) {
    int64_t n = slen[sb] - so < rlen[rb] - ro ? slen[sb] - so : rlen[rb] - ro;
    memcpy((char *)raddr[rb] + ro, (const char *)saddr[sb] + so, (size_t)n);
    so += n;
    ro += n;
    if (so == slen[sb]) sb++, so = 0;
    if (ro == rlen[rb]) rb++, ro = 0;
  }
  while (sb < se && slen[sb] == 0) sb++;
  while (rb < re && rlen[rb] == 0) rb++;
  return sb == se && rb == re;
}

/* One hindexed byte type per peer over absolute addresses (MPI_BOTTOM), so MPI reads the rows in
 * place and writes them straight where they belong; MPI_Alltoallw moves them. */
static xte_status mpi_alltoallw_types(void *ctx, const intptr_t *saddr, const int64_t *slen,
                                      const int64_t *soff, const intptr_t *raddr,
                                      const int64_t *rlen, const int64_t *roff) {
  mpi_ctx *c = (mpi_ctx *)ctx;
  int n = c->size, r, rc = MPI_SUCCESS, made = 0;
  int64_t nb = soff[n] > roff[n] ? soff[n] : roff[n], b;
  MPI_Datatype *ty;
  MPI_Aint *disp;
  int *len, *zero;
  if (nb > INT_MAX)
    return xte_set_error(XTE_ERROR_UNSUPPORTED, "the MPI transport takes at most 2^31 - 1 blocks");
  ty = (MPI_Datatype *)xte_aligned_alloc((size_t)n * 2 * sizeof(MPI_Datatype));
  disp = (MPI_Aint *)xte_aligned_alloc((size_t)(nb ? nb : 1) * sizeof(MPI_Aint));
  len = (int *)xte_aligned_alloc(((size_t)(nb ? nb : 1) + (size_t)n * 3) * sizeof(int));
  if (!ty || !disp || !len) {
    xte_aligned_free(ty);
    xte_aligned_free(disp);
    xte_aligned_free(len);
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "MPI transport: out of memory");
  }
  zero = len + (nb ? nb : 1);
  for (r = 0; r < 2 * n; r++) ty[r] = MPI_BYTE;
  for (r = 0; r < n; r++) {
    zero[r] = 0;
    c->sc[r] = r != c->rank && soff[r + 1] > soff[r];
    c->rc[r] = r != c->rank && roff[r + 1] > roff[r];
  }
  if (!self_copy(saddr, slen, soff[c->rank], soff[c->rank + 1], raddr, rlen, roff[c->rank],
                 roff[c->rank + 1])) {
    xte_aligned_free(ty);
    xte_aligned_free(disp);
    xte_aligned_free(len);
    return xte_set_error(XTE_ERROR_INTERNAL, "MPI transport: a rank's blocks to itself differ");
  }
  for (r = 0; r < 2 * n && rc == MPI_SUCCESS; r++) {
    const int side = r >= n, p = side ? r - n : r;
    if (p == c->rank) continue;
    const intptr_t *a = side ? raddr : saddr;
    const int64_t *l = side ? rlen : slen, *o = side ? roff : soff;
    int64_t k = o[p + 1] - o[p];
    if (!k) continue;
    for (b = 0; b < k; b++) {
      if (l[o[p] + b] > INT_MAX) {
        rc = MPI_ERR_COUNT;
        break;
      }
      disp[b] = (MPI_Aint)a[o[p] + b];
      len[b] = (int)l[o[p] + b];
    }
    if (rc != MPI_SUCCESS) break;
    {
      MPI_Datatype t;
      rc = MPI_Type_create_hindexed((int)k, len, disp, MPI_BYTE, &t);
      if (rc != MPI_SUCCESS) break;
      ty[r] = t;
      made = r + 1;
      rc = MPI_Type_commit(&ty[r]);
    }
  }
  if (rc == MPI_SUCCESS)
    rc = MPI_Alltoallw(MPI_BOTTOM, c->sc, zero, ty, MPI_BOTTOM, c->rc, zero, ty + n, c->comm);
  for (r = 0; r < made; r++)
    if (ty[r] != MPI_BYTE) MPI_Type_free(&ty[r]);
  xte_aligned_free(ty);
  xte_aligned_free(disp);
  xte_aligned_free(len);
  return rc == MPI_SUCCESS ? XTE_SUCCESS : mpi_fail(rc, "MPI_Alltoallw");
}

/* Whether one side can go to MPI as it is: at most one block per peer (self aside), all within
 * 2^31 - 1 bytes of the lowest, whose address goes to *base. */
static int one_block_each(const mpi_ctx *c, const intptr_t *addr, const int64_t *len,
                          const int64_t *off, intptr_t *base) {
  int p;
  intptr_t lo = 0;
  int any = 0;
  for (p = 0; p < c->size; p++) {
    int64_t k = off[p + 1] - off[p];
    if (p == c->rank || k == 0) continue;
    if (k > 1) return 0;
    if (!any || addr[off[p]] < lo) lo = addr[off[p]];
    any = 1;
  }
  for (p = 0; p < c->size; p++) {
    if (p == c->rank || off[p + 1] == off[p]) continue;
    if (addr[off[p]] - lo + len[off[p]] > INT_MAX) return 0;
  }
  *base = lo;
  return 1;
}

static void *stage_get(mpi_ctx *c, int side, size_t bytes) {
  if (bytes == 0) bytes = 64;
  if (c->stage_bytes[side] >= bytes) return c->stage[side];
  xte_aligned_free(c->stage[side]);
  c->stage[side] = xte_aligned_alloc(bytes);
  c->stage_bytes[side] = c->stage[side] ? bytes : 0;
  return c->stage[side];
}

/* The block exchange as contiguous bytes (MPI_Alltoallv of MPI_BYTE, which Open MPI's shared
 * memory transport moves with one copy): a side with one block per peer goes in place, any
 * other side through a staging buffer (packed before, unpacked after). The rank's blocks to
 * itself are copied here. Derived datatypes (XTE_EP_MPI_DATATYPES=1) avoid the staging copy, but
 * an MPI that packs them itself (Open MPI over shared memory) moves rows of a few KB slower that
 * way than staging plus contiguous bytes (docs/performance.md, expert parallelism). */
static xte_status mpi_alltoallw(void *ctx, const intptr_t *saddr, const int64_t *slen,
                                const int64_t *soff, const intptr_t *raddr, const int64_t *rlen,
                                const int64_t *roff) {
  mpi_ctx *c = (mpi_ctx *)ctx;
  int n = c->size, p, rc, in_s, in_r;
  intptr_t sbase = 0, rbase = 0;
  int64_t b, st = 0, rt = 0;
  char *sbuf = NULL, *rbuf = NULL;
  if (c->datatypes) return mpi_alltoallw_types(ctx, saddr, slen, soff, raddr, rlen, roff);
  in_s = one_block_each(c, saddr, slen, soff, &sbase);
  in_r = one_block_each(c, raddr, rlen, roff, &rbase);
  for (p = 0; p < n; p++) {
    int64_t sp = 0, rp = 0;
    if (p != c->rank) {
      for (b = soff[p]; b < soff[p + 1]; b++) sp += slen[b];
      for (b = roff[p]; b < roff[p + 1]; b++) rp += rlen[b];
    }
    if (sp > INT_MAX || rp > INT_MAX || st > INT_MAX - sp || rt > INT_MAX - rp)
      return mpi_alltoallw_types(ctx, saddr, slen, soff, raddr, rlen, roff);
    c->sc[p] = (int)sp;
    c->rc[p] = (int)rp;
    c->sd[p] = in_s ? (sp ? (int)(saddr[soff[p]] - sbase) : 0) : (int)st;
    c->rd[p] = in_r ? (rp ? (int)(raddr[roff[p]] - rbase) : 0) : (int)rt;
    st += sp;
    rt += rp;
  }
  if (!in_s && !(sbuf = (char *)stage_get(c, 0, (size_t)st)))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "MPI transport: out of memory for staging");
  if (!in_r && !(rbuf = (char *)stage_get(c, 1, (size_t)rt)))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "MPI transport: out of memory for staging");
  if (!self_copy(saddr, slen, soff[c->rank], soff[c->rank + 1], raddr, rlen, roff[c->rank],
                 roff[c->rank + 1]))
    return xte_set_error(XTE_ERROR_INTERNAL, "MPI transport: a rank's blocks to itself differ");
  if (!in_s)
    for (p = 0; p < n; p++) {
      char *q = sbuf + c->sd[p];
      if (p == c->rank) continue;
      for (b = soff[p]; b < soff[p + 1]; b++) {
        memcpy(q, (const void *)saddr[b], (size_t)slen[b]);
        q += slen[b];
      }
    }
  rc = MPI_Alltoallv(in_s ? (void *)sbase : sbuf, c->sc, c->sd, MPI_BYTE,
                     in_r ? (void *)rbase : rbuf, c->rc, c->rd, MPI_BYTE, c->comm);
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Alltoallv");
  if (!in_r)
    for (p = 0; p < n; p++) {
      const char *q = rbuf + c->rd[p];
      if (p == c->rank) continue;
      for (b = roff[p]; b < roff[p + 1]; b++) {
        memcpy((void *)raddr[b], q, (size_t)rlen[b]);
        q += rlen[b];
      }
    }
  return XTE_SUCCESS;
}

/* Requests for a block of len bytes (messages of at most XTE_EP_MPI_CHUNK bytes). */
static int64_t chunks(int64_t len) {
  return (len + XTE_EP_MPI_CHUNK - 1) / XTE_EP_MPI_CHUNK;
}

static xte_status mpi_reserve(void *ctx, int64_t nblocks, int64_t sbytes, int64_t rbytes) {
  mpi_ctx *c = (mpi_ctx *)ctx;
  int64_t need;
  if (nblocks < 0 || sbytes < 0 || rbytes < 0)
    return xte_set_error(XTE_ERROR_INTERNAL, "MPI transport: negative reservation");
  /* each side: every block (chunked), or one staged message (chunked) per peer */
  need = 2 * (nblocks + chunks(sbytes) + chunks(rbytes) + 2 * (int64_t)c->size);
  if (need > c->req_cap) {
    MPI_Request *q = (MPI_Request *)xte_aligned_alloc((size_t)need * sizeof(MPI_Request));
    if (!q) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "MPI transport: out of memory");
    xte_aligned_free(c->req);
    c->req = q;
    c->req_cap = need;
  }
  if (!stage_get(c, 0, (size_t)sbytes) || !stage_get(c, 1, (size_t)rbytes))
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "MPI transport: out of memory for staging");
  return XTE_SUCCESS;
}

/* Posts the messages of one block of len bytes at p (chunked). */
static int post_block(mpi_ctx *c, int send, char *p, int64_t len, int peer, int64_t *nreq) {
  int rc = MPI_SUCCESS;
  while (len > 0 && rc == MPI_SUCCESS) {
    int n = (int)(len < XTE_EP_MPI_CHUNK ? len : XTE_EP_MPI_CHUNK);
    if (send)
      rc = MPI_Isend(p, n, MPI_BYTE, peer, XTE_EP_MPI_TAG, c->comm, &c->req[*nreq]);
    else
      rc = MPI_Irecv(p, n, MPI_BYTE, peer, XTE_EP_MPI_TAG, c->comm, &c->req[*nreq]);
    if (rc == MPI_SUCCESS) ++*nreq;
    p += n;
    len -= n;
  }
  return rc;
}

/* Whether the blocks [b0, b1) of a pair go as they are: they average seg_min bytes or more. Both
 * sides of a pair see the same lengths (matched), so they decide alike. */
static int direct_pair(const mpi_ctx *c, const int64_t *len, int64_t b0, int64_t b1,
                       int64_t *total) {
  int64_t b, t = 0;
  for (b = b0; b < b1; b++) t += len[b];
  *total = t;
  return b1 > b0 && t / (b1 - b0) >= c->seg_min;
}

/* alltoallw_matched_start: per peer, its blocks as messages of their own straight between the
 * caller's buffers (Open MPI's shared memory transport moves each large one with a single
 * copy), or, where the blocks are small, packed into one staged message; all posted at once
 * (receives first), the rank's blocks to itself copied; mpi_wait completes them. */
static xte_status mpi_matched_start(void *ctx, const intptr_t *saddr, const int64_t *slen,
                                    const int64_t *soff, const intptr_t *raddr, const int64_t *rlen,
                                    const int64_t *roff) {
  mpi_ctx *c = (mpi_ctx *)ctx;
  int n = c->size, p, rc = MPI_SUCCESS;
  int64_t b, nreq = 0, st = 0, rt = 0, need = 0, tot;
  char *sbuf, *rbuf;
  if (c->datatypes) return mpi_alltoallw_types(ctx, saddr, slen, soff, raddr, rlen, roff);
  c->pending = 0;
  for (p = 0; p < n; p++) {
    c->sc[p] = c->rc[p] = 0;
    c->sd64[p] = c->rd64[p] = -1; /* -1: direct */
    if (p == c->rank) continue;
    if (direct_pair(c, slen, soff[p], soff[p + 1], &tot)) {
      for (b = soff[p]; b < soff[p + 1]; b++) need += chunks(slen[b]);
    } else {
      c->sd64[p] = st;
      st += tot;
      need += chunks(tot);
    }
    if (direct_pair(c, rlen, roff[p], roff[p + 1], &tot)) {
      for (b = roff[p]; b < roff[p + 1]; b++) need += chunks(rlen[b]);
    } else {
      c->rd64[p] = rt;
      rt += tot;
      need += chunks(tot);
    }
  }
  /* reserve ran before the agreement: nothing is allocated here when it did */
  sbuf = (char *)stage_get(c, 0, (size_t)st);
  rbuf = (char *)stage_get(c, 1, (size_t)rt);
  if (need > c->req_cap || !sbuf || !rbuf)
    return xte_set_error(XTE_ERROR_INTERNAL, "MPI transport: exchange larger than reserved");
  for (p = 0; p < n && rc == MPI_SUCCESS; p++) {
    if (p == c->rank) continue;
    if (c->rd64[p] < 0) {
      for (b = roff[p]; b < roff[p + 1] && rc == MPI_SUCCESS; b++)
        rc = post_block(c, 0, (char *)raddr[b], rlen[b], p, &nreq);
    } else {
      int64_t t = 0;
      for (b = roff[p]; b < roff[p + 1]; b++) t += rlen[b];
      rc = post_block(c, 0, rbuf + c->rd64[p], t, p, &nreq);
    }
  }
  for (p = 0; p < n && rc == MPI_SUCCESS; p++) {
    if (p == c->rank || c->sd64[p] >= 0) continue;
    for (b = soff[p]; b < soff[p + 1] && rc == MPI_SUCCESS; b++)
      rc = post_block(c, 1, (char *)saddr[b], slen[b], p, &nreq);
  }
  for (p = 0; p < n && rc == MPI_SUCCESS; p++) {
    char *q;
    if (p == c->rank || c->sd64[p] < 0) continue;
    q = sbuf + c->sd64[p];
    for (b = soff[p]; b < soff[p + 1]; b++) {
      memcpy(q, (const void *)saddr[b], (size_t)slen[b]);
      q += slen[b];
    }
    rc = post_block(c, 1, sbuf + c->sd64[p], q - (sbuf + c->sd64[p]), p, &nreq);
  }
  if (!self_copy(saddr, slen, soff[c->rank], soff[c->rank + 1], raddr, rlen, roff[c->rank],
                 roff[c->rank + 1]) &&
      rc == MPI_SUCCESS)
    rc = MPI_ERR_INTERN;
  c->pending = 1;
  c->pend_nreq = nreq;
  c->pend_rc = rc;
  c->pend_raddr = raddr;
  c->pend_rlen = rlen;
  c->pend_roff = roff;
  return XTE_SUCCESS;
}

/* Completes the exchange of mpi_matched_start: every posted request (even after a failure to
 * post), then the staged receives unpacked. */
static xte_status mpi_wait(void *ctx) {
  mpi_ctx *c = (mpi_ctx *)ctx;
  int n = c->size, p, rc = c->pend_rc;
  int64_t b;
  const char *rbuf = (const char *)c->stage[1];
  if (!c->pending) return XTE_SUCCESS;
  c->pending = 0;
  if (c->pend_nreq) {
    int rw = MPI_Waitall((int)c->pend_nreq, c->req, MPI_STATUSES_IGNORE);
    if (rc == MPI_SUCCESS) rc = rw;
  }
  if (rc != MPI_SUCCESS) return mpi_fail(rc, "alltoallw_matched (MPI_Isend / MPI_Irecv)");
  for (p = 0; p < n; p++) {
    const char *q;
    if (p == c->rank || c->rd64[p] < 0) continue;
    q = rbuf + c->rd64[p];
    for (b = c->pend_roff[p]; b < c->pend_roff[p + 1]; b++) {
      memcpy((void *)c->pend_raddr[b], q, (size_t)c->pend_rlen[b]);
      q += c->pend_rlen[b];
    }
  }
  return XTE_SUCCESS;
}

static xte_status mpi_alltoallw_matched(void *ctx, const intptr_t *saddr, const int64_t *slen,
                                        const int64_t *soff, const intptr_t *raddr,
                                        const int64_t *rlen, const int64_t *roff) {
  XTE_TRY(mpi_matched_start(ctx, saddr, slen, soff, raddr, rlen, roff));
  return mpi_wait(ctx);
}

static void mpi_destroy(void *ctx) {
  mpi_ctx *c = (mpi_ctx *)ctx;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Comm_free(&c->comm);
  xte_aligned_free(c->sc);
  xte_aligned_free(c->stage[0]);
  xte_aligned_free(c->stage[1]);
  xte_aligned_free(c->sd64);
  xte_aligned_free(c->req);
  xte_aligned_free(c);
}

xte_status xte_ep_mpi_transport(const void *comm, xte_ep_transport *t) {
  int init = 0, fin = 0, rank = 0, size = 0, rc;
  mpi_ctx *c;
  XTE_CHECK_PTR(comm, "mpi_comm");
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                         "mpi_comm: MPI is not initialised (or is "
                         "finalised): call MPI_Init first");
  c = (mpi_ctx *)xte_aligned_calloc(1, sizeof *c);
  if (!c) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "MPI transport: out of memory");
  rc = MPI_Comm_dup(*(const MPI_Comm *)comm, &c->comm);
  if (rc != MPI_SUCCESS) {
    xte_aligned_free(c);
    return mpi_fail(rc, "MPI_Comm_dup");
  }
  MPI_Comm_rank(c->comm, &rank);
  MPI_Comm_size(c->comm, &size);
  c->size = size;
  c->rank = rank;
  {
    const char *e = getenv("XTE_EP_MPI_DATATYPES");
    c->datatypes = e && e[0] == '1';
    e = getenv("XTE_EP_MPI_SEGMENT_MIN");
    c->seg_min = e && e[0] ? strtoll(e, NULL, 10) : XTE_EP_MPI_SEGMENT_MIN_DEFAULT;
  }
  c->sc = (int *)xte_aligned_calloc((size_t)size * 4, sizeof(int));
  c->sd64 = (int64_t *)xte_aligned_calloc((size_t)size * 2, sizeof(int64_t));
  if (!c->sc || !c->sd64) {
    MPI_Comm_free(&c->comm);
    xte_aligned_free(c->sc);
    xte_aligned_free(c->sd64);
    xte_aligned_free(c);
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "MPI transport: out of memory");
  }
  c->sd = c->sc + size;
  c->rc = c->sd + size;
  c->rd = c->rc + size;
  c->rd64 = c->sd64 + size;
  memset(t, 0, sizeof *t);
  t->name = "mpi";
  t->rank = rank;
  t->size = size;
  t->ctx = c;
  t->allgather = mpi_allgather;
  t->alltoallv = mpi_alltoallv;
  t->alltoallw = mpi_alltoallw;
  t->alltoallw_matched = mpi_alltoallw_matched;
  t->alltoallw_matched_start = mpi_matched_start;
  t->alltoallw_wait = mpi_wait;
  t->reserve = mpi_reserve;
  t->destroy = mpi_destroy;
  return XTE_SUCCESS;
}

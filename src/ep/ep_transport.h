/* EP transports as tables (src/ep_api.c drives them; each file of src/ep/ fills one). A
 * transport moves bytes between the ranks of a group; it does no arithmetic and knows nothing of
 * tokens. Every function is collective over the group. */
#ifndef XTE_EP_TRANSPORT_H
#define XTE_EP_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "xte/core.h"

typedef struct xte_ep_transport {
  const char *name;
  int rank, size;
  void *ctx;
  /* recv[r * bytes .. ] = rank r's send (bytes each) */
  xte_status (*allgather)(void *ctx, const void *send, void *recv, size_t bytes);
  /* Rank r's block for rank s: scount[s] units of `unit` bytes at send + sdispl[s] * unit; it
   * lands at recv + rdispl[r] * unit on rank s, whose rcount[r] equals it. */
  xte_status (*alltoallv)(void *ctx, const void *send, const int64_t *scount, const int64_t *sdispl,
                          void *recv, const int64_t *rcount, const int64_t *rdispl, size_t unit);
  /* Scatter-gather exchange, no staging copy of xte's own: rank r sends rank s its blocks
   * [soff[s], soff[s + 1]) (slen[b] bytes at address saddr[b]) back to back; rank s stores that
   * stream into its blocks [roff[r], roff[r + 1]) (raddr, rlen) in order. The two sides of a pair
   * hold the same total. Blocks of one side never overlap. */
  xte_status (*alltoallw)(void *ctx, const intptr_t *saddr, const int64_t *slen,
                          const int64_t *soff, const intptr_t *raddr, const int64_t *rlen,
                          const int64_t *roff);
  /* Optional (NULL: alltoallw). alltoallw's exchange when the two sides of every pair cut the
   * stream into the same blocks (the k-th block rank r sends rank s has the length of the k-th
   * block rank s receives from r; no block of length 0): the transport may move each block as
   * it is, in place, with no staging copy. */
  xte_status (*alltoallw_matched)(void *ctx, const intptr_t *saddr, const int64_t *slen,
                                  const int64_t *soff, const intptr_t *raddr, const int64_t *rlen,
                                  const int64_t *roff);
  /* Optional, local (not collective): room for an alltoallw / alltoallw_matched of at most
   * nblocks blocks per side and sbytes / rbytes bytes sent / received, so that the exchange
   * itself allocates nothing (called before the ranks agree: a failure here is the rank's
   * local error). */
  xte_status (*reserve)(void *ctx, int64_t nblocks, int64_t sbytes, int64_t rbytes);
  void (*destroy)(void *ctx);
} xte_ep_transport;

/* src/ep/threads.c */
struct xte_ep_threads_world_s;
xte_status xte_ep_threads_transport(struct xte_ep_threads_world_s *world, int rank,
                                    xte_ep_transport *t);
/* src/ep/mpi.c (XTE_HAVE_MPI); comm points to an MPI_Comm */
xte_status xte_ep_mpi_transport(const void *comm, xte_ep_transport *t);
/* 1 when this build has the MPI transport */
int xte_ep_have_mpi(void);

#endif /* XTE_EP_TRANSPORT_H */

/* The one transport table of expert parallelism: every transport fills an xte_ep_transport
 * (src/ep/transport/: threads.c and mpi.c for the CPU, ccl.h the NCCL / MCCL template the GPU
 * plugins instantiate) and the EP core (src/ep/) drives it. A transport moves bytes between the
 * ranks of a group, does no arithmetic and knows nothing of tokens. Plain C (the plugins include
 * it from C++). */
#ifndef XTE_EP_TRANSPORT_H
#define XTE_EP_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "xte/core.h"

/* Memory: allgather and alltoallv move host memory (the agreement record, prepare's counts and
 * routing; a GPU transport stages them through device memory and returns when they have
 * arrived); alltoallw / alltoallw_matched move the group's tensor memory (device memory of the
 * group's device for a GPU transport, enqueued on the bound stream). Every function is collective
 * over the group. */
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
  /* Optional, both or neither (NULL: alltoallw_matched, then nothing to wait for):
   * alltoallw_matched in two halves. start posts the exchange, copies the rank's blocks to
   * itself and returns; the caller may then work on memory the exchange does not touch (no
   * block of either list); wait completes it (called once after every start, whatever start
   * returned; the lists and blocks stay valid until it returns). */
  xte_status (*alltoallw_matched_start)(void *ctx, const intptr_t *saddr, const int64_t *slen,
                                        const int64_t *soff, const intptr_t *raddr,
                                        const int64_t *rlen, const int64_t *roff);
  xte_status (*alltoallw_wait)(void *ctx);
  /* Optional, local (not collective): room for an alltoallw / alltoallw_matched of at most
   * nblocks blocks per side and sbytes / rbytes bytes sent / received (a GPU transport: also for
   * an alltoallv of that many bytes), so that the exchange itself allocates nothing (called
   * before the ranks agree: a failure here is the rank's local error). */
  xte_status (*reserve)(void *ctx, int64_t nblocks, int64_t sbytes, int64_t rbytes);
  /* Optional (GPU transports), local: the backend stream handle the following calls run on (a
   * stream of the group's device). */
  void (*bind)(void *ctx, void *stream);
  void (*destroy)(void *ctx);
} xte_ep_transport;

/* The CPU transports. src/ep/transport/threads.c: */
struct xte_ep_threads_world_s;
xte_status xte_ep_threads_transport(struct xte_ep_threads_world_s *world, int rank,
                                    xte_ep_transport *t);
/* src/ep/transport/mpi.c (XTE_HAVE_MPI; else no_mpi.c refuses); comm points to an MPI_Comm */
xte_status xte_ep_mpi_transport(const void *comm, xte_ep_transport *t);
/* 1 when this build has the MPI transport */
int xte_ep_have_mpi(void);

#endif /* XTE_EP_TRANSPORT_H */

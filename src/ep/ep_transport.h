/* The CPU EP transports (src/ep_api.c drives them; each file of src/ep/ fills one). The table,
 * xte_ep_transport, is in src/xte_ep_ops.h (the GPU plugins fill it too). */
#ifndef XTE_EP_TRANSPORT_H
#define XTE_EP_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "xte/core.h"
#include "xte_ep_ops.h" /* xte_ep_transport */

/* src/ep/threads.c */
struct xte_ep_threads_world_s;
xte_status xte_ep_threads_transport(struct xte_ep_threads_world_s *world, int rank,
                                    xte_ep_transport *t);
/* src/ep/mpi.c (XTE_HAVE_MPI); comm points to an MPI_Comm */
xte_status xte_ep_mpi_transport(const void *comm, xte_ep_transport *t);
/* 1 when this build has the MPI transport */
int xte_ep_have_mpi(void);

#endif /* XTE_EP_TRANSPORT_H */

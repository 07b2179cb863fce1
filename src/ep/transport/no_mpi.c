/* Stands in for src/ep/mpi.c in a build without MPI. */
#include "ep/ep_transport.h"
#include "xte_internal.h"

int xte_ep_have_mpi(void) {
  return 0;
}

xte_status xte_ep_mpi_transport(const void *comm, xte_ep_transport *t) {
  (void)comm;
  (void)t;
  return xte_set_error(XTE_ERROR_UNSUPPORTED,
                       "mpi_comm: this xte was built without MPI "
                       "(configure with MPI installed: Debian's libopenmpi-dev)");
}

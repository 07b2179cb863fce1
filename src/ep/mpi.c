/* The MPI EP transport (built when CMake finds MPI): MPI_Allgather and MPI_Alltoallv on a
 * duplicate of the caller's communicator, counts in units of a contiguous datatype (a row), so
 * a block of more than 2^31 bytes still moves while its row count fits an int. */
#include <limits.h>
#include <mpi.h>
#include <string.h>

#include "ep/ep_transport.h"
#include "xte_internal.h"

typedef struct mpi_ctx {
  MPI_Comm comm;
  int size;
  int *sc, *sd, *rc, *rd; /* int count / displacement scratch, [size] each */
} mpi_ctx;

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

static void mpi_destroy(void *ctx) {
  mpi_ctx *c = (mpi_ctx *)ctx;
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin) MPI_Comm_free(&c->comm);
  xte_aligned_free(c->sc);
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
  c->sc = (int *)xte_aligned_calloc((size_t)size * 4, sizeof(int));
  if (!c->sc) {
    MPI_Comm_free(&c->comm);
    xte_aligned_free(c);
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "MPI transport: out of memory");
  }
  c->sd = c->sc + size;
  c->rc = c->sd + size;
  c->rd = c->rc + size;
  memset(t, 0, sizeof *t);
  t->name = "mpi";
  t->rank = rank;
  t->size = size;
  t->ctx = c;
  t->allgather = mpi_allgather;
  t->alltoallv = mpi_alltoallv;
  t->destroy = mpi_destroy;
  return XTE_SUCCESS;
}

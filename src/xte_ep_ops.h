/* The expert-parallelism table of a backend (src/xte_backend.h: xte_backend_ops.ep): a GPU
 * backend's collective library transport (the table of src/ep/ep_transport.h, filled by the
 * template of src/ep/transport/ccl.h) and its device block move; the CPU backend's has only the
 * block move, on the host (ccl_name and transport_create NULL). Plain C: the EP core (src/ep/)
 * drives it. */
#ifndef XTE_EP_OPS_H
#define XTE_EP_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "ep/ep_transport.h" /* xte_ep_transport */
#include "xte/core.h"

/* One move of the device block operation: len bytes from src to dst, or len zero bytes at dst
 * when src is NULL. */
typedef struct xte_ep_block {
  const void *src;
  void *dst;
  int64_t len;
} xte_ep_block;

typedef struct xte_ep_ops {
  /* The backend's collective library (NCCL for CUDA, MCCL for MUSA): its name ("nccl"). */
  const char *ccl_name;
  /* A transport over *comm (the library's communicator, borrowed: never destroyed here) whose
   * collectives run on stream (a stream handle of this backend, of the communicator's device)
   * until bind() says otherwise. XTE_ERROR_UNSUPPORTED with the reason recorded when the library
   * cannot be loaded. */
  xte_status (*transport_create)(const void *comm, void *stream, xte_ep_transport *t);
  /* Enqueues the n moves of b (a host array, staged by the call: reusable when it returns) on
   * stream, in one launch (the CPU backend: done before it returns, stream ignored). Destinations
   * of one call never overlap one another, nor a source. */
  xte_status (*blocks)(void *stream, const xte_ep_block *b, int64_t n);
} xte_ep_ops;

#endif /* XTE_EP_OPS_H */

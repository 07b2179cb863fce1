/* Core internals: error recording, backend resolution. Not installed. */
#ifndef XTE_INTERNAL_H
#define XTE_INTERNAL_H

#include "xte/xte.h"
#include "xte_backend.h"

#if defined(__GNUC__)
#define XTE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define XTE_PRINTF(a, b)
#endif

/* Records the message for xte_last_error() and returns status. */
xte_status xte_set_error(xte_status status, const char *fmt, ...) XTE_PRINTF(2, 3);
void xte_clear_error(void);

/* Host memory, 64-byte aligned (src/alloc.c): every allocation the library makes goes through
 * these, so the allocation-failure test can fail each one in turn. */
void *xte_aligned_alloc(size_t bytes);
void *xte_aligned_calloc(size_t count, size_t size); /* zeroed; NULL when count * size wraps */
void xte_aligned_free(void *p);
/* Test hooks (exported, not in the public headers): from this call on, allocation number nth
 * (0-based; -1: none) fails; xte_internal_alloc_count() is the number attempted since. */
XTE_API void xte_internal_fail_alloc(int64_t nth);
XTE_API int64_t xte_internal_alloc_count(void);

/* Fails with XTE_ERROR_NULL_POINTER naming the argument when p is NULL. */
#define XTE_CHECK_PTR(p, name)                                                         \
  do {                                                                                 \
    if ((p) == NULL) return xte_set_error(XTE_ERROR_NULL_POINTER, "%s is NULL", name); \
  } while (0)

#define XTE_TRY(expr)                                 \
  do {                                                \
    xte_status xte_try_s_ = (expr);                   \
    if (xte_try_s_ != XTE_SUCCESS) return xte_try_s_; \
  } while (0)

/* A resolved stream: the backend table and the backend's own handle. */
typedef struct xte_exec {
  const xte_backend_ops *ops;
  xte_backend backend;
  int device;
  void *handle;
} xte_exec;

/* Resolves stream (NULL = default backend) into an exec context; loads plugins on first use. */
xte_status xte_resolve_stream(xte_stream stream, xte_exec *exec);

/* The built-in CPU backend table. */
const xte_backend_ops *xte_cpu_backend_ops(void);

#endif /* XTE_INTERNAL_H */

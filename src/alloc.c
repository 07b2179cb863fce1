/* Host allocations of the library, all through one place: 64-byte aligned, and with a test hook
 * that makes the n-th allocation fail (xte_internal_fail_alloc), so every entry point can be
 * checked to report XTE_ERROR_OUT_OF_MEMORY without touching an output byte. */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "xte_internal.h"

static atomic_llong alloc_count; /* allocations attempted since the last xte_internal_fail_alloc */
static atomic_llong alloc_fail_at = -1; /* the index that fails; -1: none */

void *xte_aligned_alloc(size_t bytes) {
  void *p = NULL;
  long long n = atomic_fetch_add(&alloc_count, 1);
  long long f = atomic_load(&alloc_fail_at);
  if (f >= 0 && n == f) return NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
  return p;
}

void *xte_aligned_calloc(size_t count, size_t size) {
  size_t bytes;
  void *p;
  if (__builtin_mul_overflow(count, size, &bytes)) return NULL;
  p = xte_aligned_alloc(bytes);
  if (p) memset(p, 0, bytes ? bytes : 1);
  return p;
}

void xte_aligned_free(void *p) {
  free(p);
}

void xte_internal_fail_alloc(int64_t nth) {
  atomic_store(&alloc_fail_at, (long long)(nth >= 0 ? nth : -1));
  atomic_store(&alloc_count, 0);
}

int64_t xte_internal_alloc_count(void) {
  return (int64_t)atomic_load(&alloc_count);
}

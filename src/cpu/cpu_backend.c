/* The built-in CPU backend table. */
#include <string.h>

#include "cpu/xte_cpu.h"
#include "xte_internal.h"

static xte_status cpu_init(const xte_core_services *svc, char *why, size_t why_size) {
  (void)svc;
  if (why_size) why[0] = '\0';
  return XTE_SUCCESS;
}
static int cpu_device_count(void) { return 1; }
static xte_status cpu_sync(void *h) {
  (void)h;
  return XTE_SUCCESS;
}
static xte_status cpu_alloc(int device, size_t bytes, void **ptr) {
  (void)device;
  *ptr = xte_aligned_alloc(bytes);
  if (!*ptr) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "bytes = %zu: out of host memory", bytes);
  return XTE_SUCCESS;
}
static xte_status cpu_dealloc(int device, void *ptr) {
  (void)device;
  xte_aligned_free(ptr);
  return XTE_SUCCESS;
}
static xte_status cpu_copy(void *h, void *dst, const void *src, size_t bytes, int kind) {
  (void)h;
  (void)kind;
  memmove(dst, src, bytes);
  return XTE_SUCCESS;
}
static xte_status cpu_fill(void *h, void *dst, int value, size_t bytes) {
  (void)h;
  memset(dst, value, bytes);
  return XTE_SUCCESS;
}

static xte_backend_ops cpu_ops = {
    XTE_PLUGIN_ABI, "cpu",      cpu_init,          cpu_device_count,   NULL,
    NULL,           NULL,       cpu_sync,          cpu_alloc,          cpu_dealloc,
    cpu_copy,       cpu_fill,   xte_cpu_quantize,  xte_cpu_dequantize, xte_cpu_cast,
    {NULL}};

const xte_backend_ops *xte_cpu_backend_ops(void) { return &cpu_ops; }

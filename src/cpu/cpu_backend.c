/* The built-in CPU backend table. */
#include <pthread.h>
#include <string.h>

#include "cpu/moe_cpu.h"
#include "cpu/xte_cpu.h"
#include "xte_ep_ops.h"
#include "xte_internal.h"

static xte_status cpu_init(const xte_core_services *svc, char *why, size_t why_size) {
  (void)svc;
  if (why_size) why[0] = '\0';
  return XTE_SUCCESS;
}
static int cpu_device_count(void) {
  return 1;
}
static xte_status cpu_sync(void *h) {
  (void)h;
  return XTE_SUCCESS;
}
static xte_status cpu_alloc(int device, size_t bytes, void **ptr) {
  (void)device;
  void *p = xte_aligned_alloc(bytes);
  if (!p) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "bytes = %zu: out of host memory", bytes);
  *ptr = p; /* written only on success */
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

/* The EP core's host block move (src/xte_ep_ops.h): moves of at least two cache lines are written
 * with the ISA's streaming stores from the first 64-byte boundary of the destination on (each
 * destination line written whole, never read first), the rest with memcpy / memset; one store
 * fence at the end orders the streaming stores before whatever the caller does next. */
static xte_status cpu_ep_blocks(void *h, const xte_ep_block *b, int64_t n) {
  const xte_quant_kernels *k = xte_quant_kernels_get();
  int64_t i;
  int streamed = 0;
  (void)h;
  for (i = 0; i < n; i++) {
    uint8_t *d = (uint8_t *)b[i].dst;
    const uint8_t *s = (const uint8_t *)b[i].src;
    size_t len = (size_t)b[i].len, head = (size_t)(-(uintptr_t)d & 63u);
    if (!s) {
      memset(d, 0, len);
    } else if (len < 128) {
      memcpy(d, s, len);
    } else {
      memcpy(d, s, head);
      k->copy_u8(d + head, s + head, (int64_t)(len - head), 1);
      streamed = 1;
    }
  }
  if (streamed) k->store_fence();
  return XTE_SUCCESS;
}
static const xte_ep_ops cpu_ep_ops = {NULL, NULL, cpu_ep_blocks};

static xte_backend_ops cpu_ops = {
    .abi = XTE_PLUGIN_ABI,
    .name = "cpu",
    .init = cpu_init,
    .device_count = cpu_device_count,
    .synchronize = cpu_sync,
    .alloc = cpu_alloc,
    .dealloc = cpu_dealloc,
    .copy = cpu_copy,
    .fill = cpu_fill,
    .quantize = xte_cpu_quantize,
    .dequantize = xte_cpu_dequantize,
    .cast = xte_cpu_cast,
    .ep = &cpu_ep_ops,
};

/* MoE: the ISA-independent drivers, and the ISA's kernels through its table */
static xte_status moe_router_forward(const xte_router_args *a, void *h) {
  return xte_cpu_isa_table_get()->moe->router_forward(a, h);
}
static xte_status moe_router_backward(const xte_router_bwd_args *a, void *h) {
  return xte_cpu_isa_table_get()->moe->router_backward(a, h);
}
static xte_status moe_unpermute(const xte_unpermute_args *a, int which, void *h) {
  return xte_cpu_isa_table_get()->moe->unpermute(a, which, h);
}
static xte_status moe_swiglu(const xte_swiglu_args *a, void *h) {
  return xte_cpu_isa_table_get()->moe->swiglu(a, h);
}
static const xte_moe_ops cpu_moe_ops = {
    moe_router_forward, moe_router_backward,     xte_cpu_moe_aux_loss,        xte_cpu_moe_permute,
    moe_unpermute,      xte_cpu_moe_sort_chunks, xte_cpu_moe_dispatch_layout, moe_swiglu};

const struct xte_moe_ops *xte_cpu_moe_ops(void) {
  return &cpu_moe_ops;
}

static void fill_capabilities(void) {
  cpu_ops.gemm = xte_cpu_gemm_ops();
  cpu_ops.attention = xte_cpu_attention_ops();
  cpu_ops.moe = xte_cpu_moe_ops();
}

const xte_backend_ops *xte_cpu_backend_ops(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, fill_capabilities);
  return &cpu_ops;
}

/* The device block move of expert parallelism (src/xte_ep_ops.h: xte_ep_ops.blocks): a list of
 * (src, dst, len) moves, or zero fills where src is NULL, in one launch. The core routes every
 * byte of tensor data it moves for a GPU group through it (scale rows, weights, padding rows,
 * the expert-major expansion), and the NCCL / MCCL transport packs and unpacks its staging
 * buffers with it. src/cuda/ep_nccl.cu launches it with the CUDA runtime; the host SIMT runner
 * (tests/simt/simt_plugin.cpp) compiles the same text for the host.
 *
 * Pure data movement: bytes are copied as they are (no arithmetic on them). One block of threads
 * per move (grid-stride over the moves), 16-byte accesses when the source, the destination and
 * the length are 16-byte aligned, 4-byte ones when 4-byte aligned, else single bytes. Nothing
 * depends on the warp size. */
#ifndef XTE_EP_KERNELS_CUH
#define XTE_EP_KERNELS_CUH

#include <stdint.h>

#include "xte_ep_ops.h"

#define XTE_EP_NT 256         /* threads per block */
#define XTE_EP_GRID_CAP 65535 /* blocks of a launch (grid-stride beyond) */

/* The grid of a launch over n moves. */
static inline unsigned xte_ep_grid(int64_t n) {
  return (unsigned)(n < XTE_EP_GRID_CAP ? (n > 0 ? n : 1) : XTE_EP_GRID_CAP);
}

__global__ void __launch_bounds__(XTE_EP_NT)
    xte_ep_blocks_kernel(const xte_ep_block *__restrict__ b, long long n) {
  for (long long i = blockIdx.x; i < n; i += gridDim.x) {
    const unsigned char *s = (const unsigned char *)b[i].src;
    unsigned char *d = (unsigned char *)b[i].dst;
    const long long len = b[i].len;
    const unsigned long long a = (unsigned long long)(uintptr_t)s |
                                 (unsigned long long)(uintptr_t)d | (unsigned long long)len;
    if ((a & 15) == 0) {
      const long long nv = len / 16;
      for (long long k = threadIdx.x; k < nv; k += blockDim.x)
        ((uint4 *)d)[k] = s ? ((const uint4 *)s)[k] : make_uint4(0u, 0u, 0u, 0u);
    } else if ((a & 3) == 0) {
      const long long nv = len / 4;
      for (long long k = threadIdx.x; k < nv; k += blockDim.x)
        ((unsigned *)d)[k] = s ? ((const unsigned *)s)[k] : 0u;
    } else {
      for (long long k = threadIdx.x; k < len; k += blockDim.x) d[k] = s ? s[k] : (unsigned char)0;
    }
  }
}

#endif /* XTE_EP_KERNELS_CUH */

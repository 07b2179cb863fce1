/* The GPU runtime as src/cuda/ sees it: CUDA's own header, or, when the same sources are
 * compiled for Moore Threads GPUs (the MUSA compiler defines __MUSACC__; src/musa also passes
 * -DXTE_MUSA), the MUSA runtime behind src/musa/xte_musa_compat.h, which maps every cuda* name
 * used here to its musa* twin. Sources under src/cuda/ include this header, never a runtime
 * header directly. */
#ifndef XTE_GPU_RUNTIME_H
#define XTE_GPU_RUNTIME_H

#if defined(__MUSACC__) || defined(XTE_MUSA)
#include "musa/xte_musa_compat.h"
#define XTE_GPU_NAME "musa"
#define XTE_GPU_LIB "libxte_musa.so"
#define XTE_GPU_ARCH_PREFIX "mp_"
#define XTE_GPU_DRIVER_LIB "libmusa.so"
#else
#include <cuda_runtime.h>
#define XTE_GPU_NAME "cuda"
#define XTE_GPU_LIB "libxte_cuda.so"
#define XTE_GPU_ARCH_PREFIX "sm_"
#define XTE_GPU_DRIVER_LIB "libcuda.so.1"
#endif

#endif /* XTE_GPU_RUNTIME_H */

/* XTE_GEMM_FAST on the GPU (src/cuda/cublaslt.cu): the hook gpu_gemm calls, and the line `xte
 * info` shows. Plugin-internal. */
#ifndef XTE_FAST_H
#define XTE_FAST_H

#include <stddef.h>

#include "cuda/xte_gpu.h"

/* true: the call ran through cuBLASLt (or failed there: *st says which); false: not applicable
 * (EXACT mode, no usable libcublasLt, not compute capability 9.x, a layout / dtype / epilogue it
 * cannot take): nothing was enqueued nor written, and *st is untouched; run the exact kernel. */
bool xte_gpu_gemm_fast(const xte_gemm_args *a, xte_gpu_stream *h, xte_status *st);

/* "FAST: cuBLASLt <version>" or "FAST: exact kernel (<why>)" for device dev (-1: no device). */
void xte_gpu_fast_describe(int dev, char *buf, size_t size);

#endif /* XTE_FAST_H */

/* XTE_GEMM_FAST on the GPU (src/cuda/cublaslt.cu): the hook gpu_gemm calls, and the line `xte
 * info` shows. Plugin-internal. */
#ifndef XTE_FAST_H
#define XTE_FAST_H

#include <stddef.h>

#include "cuda/xte_gpu.h"

/* true: the call ran through cuBLASLt (or failed there: *st says which) and was reported
 * (src/cuda/xte_gpu_report.h); false: not applicable (EXACT mode, no usable libcublasLt, not
 * compute capability 9.x, a layout / dtype / epilogue it cannot take, no algorithm without
 * split-K): nothing was enqueued nor written, *st is untouched and *why says why; the caller runs
 * the exact kernel and reports that with *why. libcublasLt is loaded at the first FAST call that
 * gets past the checks that need no library, never before. */
bool xte_gpu_gemm_fast(const xte_gemm_args *a, xte_gpu_stream *h, xte_status *st, const char **why);

/* Enqueues on st the epilogue of the exact kernels for problem p of a FAST call with a bias
 * (xte_gemm_bias_epilogue of gemm_kernels.cuh, src/cuda/gemm.cu): src [p->m, p->n] (row stride ld
 * floats) holds cuBLASLt's fp32 accumulators; D gets RNE_out(RNE_fp32(acc + bias[n])). The
 * caller checks the launch. */
void xte_gpu_gemm_bias_epilogue(const xte_gemm_args *a, const xte_gemm_problem *p, const float *src,
                                int64_t ld, cudaStream_t st);

/* The FAST line of `xte info` for device dev (-1: no device): "FAST: exact kernel (<why>)" when
 * the device or the build rules cuBLASLt out, "FAST: cuBLASLt <version>" once the library was
 * loaded, else "FAST: cuBLASLt (loaded at the first FAST call)": it never loads the library. */
void xte_gpu_fast_describe(int dev, char *buf, size_t size);

#endif /* XTE_FAST_H */

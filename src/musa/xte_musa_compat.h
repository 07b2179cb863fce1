/* CUDA runtime names -> MUSA runtime names (Moore Threads), in the style of ggml's
 * vendors/musa.h: the CUDA sources under src/cuda/ compile unchanged for MUSA GPUs through
 * src/cuda/xte_gpu_runtime.h, which includes this header instead of cuda_runtime.h when
 * __MUSACC__ or XTE_MUSA is defined.
 *
 * Every cuda* / CUDA_* identifier used under src/cuda/ must be mapped here: the test
 * check_gpu_musa_compat (tests/check_musa_compat.py) fails otherwise. Keep the list sorted by
 * group; mapping a name that src/cuda/ does not use yet is fine. */
#ifndef XTE_MUSA_COMPAT_H
#define XTE_MUSA_COMPAT_H

#include <musa_runtime.h>

/* errors */
#define cudaError_t musaError_t
#define cudaSuccess musaSuccess
#define cudaErrorInvalidValue musaErrorInvalidValue
#define cudaErrorMemoryAllocation musaErrorMemoryAllocation
#define cudaErrorNoDevice musaErrorNoDevice
#define cudaErrorInsufficientDriver musaErrorInsufficientDriver
#define cudaErrorNotReady musaErrorNotReady
#define cudaGetErrorName musaGetErrorName
#define cudaGetErrorString musaGetErrorString
#define cudaGetLastError musaGetLastError
#define cudaPeekAtLastError musaPeekAtLastError

/* devices */
#define cudaDeviceProp musaDeviceProp
#define cudaDeviceSynchronize musaDeviceSynchronize
#define cudaGetDevice musaGetDevice
#define cudaGetDeviceCount musaGetDeviceCount
#define cudaGetDeviceProperties musaGetDeviceProperties
#define cudaSetDevice musaSetDevice
#define cudaDeviceGetAttribute musaDeviceGetAttribute
#define cudaDevAttrComputeCapabilityMajor musaDevAttrComputeCapabilityMajor
#define cudaFuncAttributes musaFuncAttributes
#define cudaFuncGetAttributes musaFuncGetAttributes
#define cudaFuncSetAttribute musaFuncSetAttribute
#define cudaFuncAttributeMaxDynamicSharedMemorySize musaFuncAttributeMaxDynamicSharedMemorySize

/* memory */
#define cudaFree musaFree
#define cudaFreeHost musaFreeHost
#define cudaMalloc musaMalloc
#define cudaMallocHost musaMallocHost
#define cudaMemcpy musaMemcpy
#define cudaMemcpyAsync musaMemcpyAsync
#define cudaMemcpyDeviceToDevice musaMemcpyDeviceToDevice
#define cudaMemcpyDeviceToHost musaMemcpyDeviceToHost
#define cudaMemcpyHostToDevice musaMemcpyHostToDevice
#define cudaMemcpyKind musaMemcpyKind
#define cudaMemset musaMemset
#define cudaMemsetAsync musaMemsetAsync

/* streams and events */
#define cudaStream_t musaStream_t
#define cudaStreamCreate musaStreamCreate
#define cudaStreamCreateWithFlags musaStreamCreateWithFlags
#define cudaStreamDestroy musaStreamDestroy
#define cudaStreamNonBlocking musaStreamNonBlocking
#define cudaStreamSynchronize musaStreamSynchronize
#define cudaStreamWaitEvent musaStreamWaitEvent
#define cudaEvent_t musaEvent_t
#define cudaEventCreateWithFlags musaEventCreateWithFlags
#define cudaEventDisableTiming musaEventDisableTiming
#define cudaEventDestroy musaEventDestroy
#define cudaEventRecord musaEventRecord
#define cudaEventSynchronize musaEventSynchronize

/* the collective library of expert parallelism (src/ep/transport/ccl.h, loaded with dlopen): MCCL,
 * whose mccl* functions take NCCL's arguments (an int result, the communicator and the stream as
 * pointers, uint8 = 1). Its version numbering is its own (1.x), so no minimum is checked. */
#define XTE_CCL_NAME "mccl"
#define XTE_CCL_LIB "libmccl.so"
#define XTE_CCL_ENV "XTE_MCCL_LIBRARY"
#define XTE_CCL_MIN_VERSION 0

/* device passes: the architecture tests of src/cuda/ (xte_dmma.cuh, which MUSA builds never
 * include: XTE_GEMM_DMMA is 0 there, the tensor-core MMA being NVIDIA's) see MUSA's */
#if defined(__MUSA_ARCH__) && !defined(__CUDA_ARCH__)
#define __CUDA_ARCH__ __MUSA_ARCH__
#endif

#endif /* XTE_MUSA_COMPAT_H */

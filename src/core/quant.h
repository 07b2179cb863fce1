/* The quantized-output checks of the core, shared by xte_quantize and the fused SwiGLU quantize.
 * Not installed. */
#ifndef XTE_CORE_QUANT_H
#define XTE_CORE_QUANT_H

#include <stdint.h>

#include "xte/quantize.h"
#include "xte_kernel_args.h"

/* Validates the output quantized tensor and the config of a quantization of an [M, K] input
 * of kind in_kind (XTE_NUM_IN_*), and fills every field of a but the input pointer and ld_in. */
xte_status xte_quant_prepare(int64_t M, int64_t K, int in_kind, xte_qtensor *out,
                             const xte_quant_config *config, xte_quant_args *a);

#endif /* XTE_CORE_QUANT_H */

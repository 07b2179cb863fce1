/* xte: block-scaled FP8 GEMM and transformer kernels. Umbrella header. */
#ifndef XTE_XTE_H
#define XTE_XTE_H

#include "xte/core.h"
#include "xte/quantize.h"
#include "xte/gemm.h"
#include "xte/moe.h"
#include "xte/attention.h"
#include "xte/ep.h"

#endif /* XTE_XTE_H */

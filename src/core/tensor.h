/* The tensor unit of the core: dtype tables and the checked 2-D view of an xte_tensor that every
 * entry point takes of its tensors. Not installed. */
#ifndef XTE_CORE_TENSOR_H
#define XTE_CORE_TENSOR_H

#include <stdint.h>

#include "xte/core.h"

/* The largest tensor dimension and element count an entry point accepts. */
#define XTE_MAX_DIM ((int64_t)1 << 40)
#define XTE_MAX_ELEMS ((int64_t)1 << 50)

/* 2-D view [rows, cols] of t, checking pointer, dtype, rank, shape (each dimension and the
 * product of the leading ones at most XTE_MAX_DIM) and ld (0: dense; rows x ld at most
 * XTE_MAX_ELEMS); ld resolved. name is the argument's name in the error message. */
xte_status xte_tensor_view2d(const xte_tensor *t, const char *name, int64_t *rows, int64_t *cols,
                             int64_t *ld);

#endif /* XTE_CORE_TENSOR_H */

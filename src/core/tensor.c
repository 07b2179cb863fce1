/* The tensor unit of the core: dtype sizes and names, the checked 2-D view of a tensor. */
#include "core/tensor.h"

#include "xte_internal.h"

size_t xte_dtype_size(xte_dtype dtype) {
  switch (dtype) {
    case XTE_DTYPE_FP32:
    case XTE_DTYPE_INT32:
      return 4;
    case XTE_DTYPE_FP16:
    case XTE_DTYPE_BF16:
      return 2;
    case XTE_DTYPE_E4M3:
    case XTE_DTYPE_E5M2:
    case XTE_DTYPE_E8M0:
    case XTE_DTYPE_UINT8:
      return 1;
    case XTE_DTYPE_INT64:
    case XTE_DTYPE_FP64:
      return 8;
    default:
      return 0;
  }
}

const char *xte_dtype_name(xte_dtype dtype) {
  static const char *const names[XTE_DTYPE_COUNT] = {"fp32", "fp16",  "bf16",  "e4m3",  "e5m2",
                                                     "e8m0", "int32", "int64", "uint8", "fp64"};
  if ((unsigned)dtype >= XTE_DTYPE_COUNT) return "unknown";
  return names[dtype];
}

xte_status xte_tensor_view2d(const xte_tensor *t, const char *name, int64_t *rows, int64_t *cols,
                             int64_t *ld) {
  int64_t r = 1;
  int i;
  if (t == NULL) return xte_set_error(XTE_ERROR_NULL_POINTER, "%s is NULL", name);
  if (t->data == NULL) return xte_set_error(XTE_ERROR_NULL_POINTER, "%s->data is NULL", name);
  if ((unsigned)t->dtype >= XTE_DTYPE_COUNT)
    return xte_set_error(XTE_ERROR_DTYPE, "%s->dtype %d is not a dtype", name, (int)t->dtype);
  if (t->rank < 1 || t->rank > XTE_MAX_RANK)
    return xte_set_error(XTE_ERROR_SHAPE, "%s->rank %d is outside [1, %d]", name, t->rank,
                         XTE_MAX_RANK);
  for (i = 0; i < t->rank; i++)
    if (t->shape[i] < 0 || t->shape[i] > XTE_MAX_DIM)
      return xte_set_error(XTE_ERROR_SHAPE, "%s->shape[%d] = %lld is out of range", name, i,
                           (long long)t->shape[i]);
  for (i = 0; i + 1 < t->rank; i++)
    if (__builtin_mul_overflow(r, t->shape[i], &r) || r > XTE_MAX_DIM)
      return xte_set_error(XTE_ERROR_SHAPE,
                           "%s: the product of its leading dimensions is over 2^40", name);
  if (t->rank == 1) {
    *rows = 1;
    *cols = t->shape[0];
  } else {
    *rows = r;
    *cols = t->shape[t->rank - 1];
  }
  if (t->ld != 0 && t->ld < *cols)
    return xte_set_error(XTE_ERROR_SHAPE, "%s->ld = %lld is smaller than its %lld columns", name,
                         (long long)t->ld, (long long)*cols);
  if (t->ld != 0 && t->rank > 2)
    return xte_set_error(XTE_ERROR_SHAPE, "%s->ld must be 0 for rank > 2", name);
  *ld = t->ld ? t->ld : *cols;
  if (*ld > XTE_MAX_DIM || (*rows > 0 && *ld > (XTE_MAX_ELEMS / *rows)))
    return xte_set_error(XTE_ERROR_SHAPE, "%s spans more than 2^50 elements (rows x ld)", name);
  return XTE_SUCCESS;
}

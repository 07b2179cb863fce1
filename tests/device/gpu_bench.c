/* A short benchmark table of the CUDA backend for tests/device/run.sh, with no benchmark library:
 * each op on a bf16 [M, K] tensor (default 8192 x 8192, 128 MiB: larger than the H200's 50 MiB L2,
 * so that no L2 flush is needed between iterations), timed on the host around N iterations and
 * one xte_stream_synchronize, against the anchor of the same run: a device-to-device copy of the
 * input's bytes. GB/s counts the bytes each op must read and write once.
 *
 *   xte_device_bench [M K [iterations]]
 * Exit 0 when the table was printed, 77 with "SKIPPED: ..." when there is no CUDA device,
 * 1 when an op failed. Built by tests/gpu.cmake. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xte/xte.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define CHECK(call)                                                                    \
  do {                                                                                 \
    xte_status st_ = (call);                                                           \
    if (st_ != XTE_SUCCESS) {                                                          \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, xte_last_error()); \
      exit(1);                                                                         \
    }                                                                                  \
  } while (0)

enum { OP_COPY, OP_QUANT_ROW, OP_QUANT_BOTH, OP_DEQUANT, OP_CAST, OP_COUNT };
static const char *op_name[OP_COUNT] = {"d2d copy (anchor)", "quantize 1x128 rowwise",
                                        "quantize 1x128 row + col", "dequantize rowwise -> bf16",
                                        "cast bf16 -> e4m3"};

int main(int argc, char **argv) {
  int64_t M = argc > 2 ? atoll(argv[1]) : 8192, K = argc > 2 ? atoll(argv[2]) : 8192;
  int iters = argc > 3 ? atoi(argv[3]) : 20, op, i;
  size_t n = (size_t)(M * K), in_bytes = n * 2;
  xte_stream gpu;
  xte_status st = xte_stream_create(XTE_BACKEND_CUDA, 0, NULL, &gpu);
  void *d_in, *d_copy, *d_rq, *d_rs, *d_cq, *d_cs, *d_out, *d_amax;
  int64_t rsr, rsc, csr, csc;
  xte_quant_config cfg = xte_quant_config_default();
  xte_tensor in, out8, out16;
  xte_qtensor qr, qb;
  double gbs[OP_COUNT], us[OP_COUNT];
  uint16_t *h;

  if (st == XTE_ERROR_BACKEND_UNAVAILABLE) {
    printf("SKIPPED: no usable CUDA device: %s\n", xte_last_error());
    return 77;
  }
  CHECK(st);
  if (M <= 0 || K <= 0 || K % 128 != 0 || iters < 1) {
    fprintf(stderr, "usage: %s [M K [iterations]] (K a multiple of 128)\n", argv[0]);
    return 2;
  }
  CHECK(xte_quantize_scale_shape(M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, 0, &rsr, &rsc));
  CHECK(xte_quantize_scale_shape(M, K, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                                 XTE_SCALE_LAYOUT_COMPACT, 1, &csr, &csc));
  CHECK(xte_malloc(gpu, in_bytes, &d_in));
  CHECK(xte_malloc(gpu, in_bytes, &d_copy));
  CHECK(xte_malloc(gpu, n, &d_rq));
  CHECK(xte_malloc(gpu, n, &d_cq));
  CHECK(xte_malloc(gpu, (size_t)(rsr * rsc) * 4, &d_rs));
  CHECK(xte_malloc(gpu, (size_t)(csr * csc) * 4, &d_cs));
  CHECK(xte_malloc(gpu, in_bytes, &d_out));
  CHECK(xte_malloc(gpu, 4, &d_amax));
  h = (uint16_t *)malloc(in_bytes);
  if (!h) return 1;
  for (i = 0; i < (int)(n > 0x7FFFFFFF ? 0x7FFFFFFF : n); i++) /* finite bf16 in (-2, 2) */
    h[i] = (uint16_t)(((uint32_t)i * 2654435761u) >> 16) & 0xBFFFu;
  CHECK(xte_memcpy(gpu, d_in, h, in_bytes, XTE_MEMCPY_HOST_TO_DEVICE));
  free(h);

  in = xte_tensor_2d(d_in, XTE_DTYPE_BF16, M, K);
  memset(&qr, 0, sizeof qr);
  qr.scaling_mode = XTE_SCALING_BLOCK_1x128;
  qr.recipe = XTE_RECIPE_TE_BLOCK;
  qr.rowwise = xte_tensor_2d(d_rq, XTE_DTYPE_E4M3, M, K);
  qr.rowwise_scale_inv.data = d_rs;
  qr.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  qr.rowwise_scale_inv.rows = rsr;
  qr.rowwise_scale_inv.cols = rsc;
  qr.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  qr.amax = (float *)d_amax;
  qb = qr;
  qb.columnwise = xte_tensor_2d(d_cq, XTE_DTYPE_E4M3, K, M); /* TE_BLOCK: transposed copy */
  qb.columnwise_scale_inv = qr.rowwise_scale_inv;
  qb.columnwise_scale_inv.data = d_cs;
  qb.columnwise_scale_inv.rows = csr;
  qb.columnwise_scale_inv.cols = csc;
  out8 = xte_tensor_2d(d_rq, XTE_DTYPE_E4M3, M, K);
  out16 = xte_tensor_2d(d_out, XTE_DTYPE_BF16, M, K);

  for (op = 0; op < OP_COUNT; op++) {
    double t0 = 0, bytes;
    for (i = -3; i < iters; i++) { /* 3 warm-up runs */
      if (i == 0) {
        CHECK(xte_stream_synchronize(gpu));
        t0 = now();
      }
      switch (op) {
        case OP_COPY:
          CHECK(xte_memcpy(gpu, d_copy, d_in, in_bytes, XTE_MEMCPY_DEVICE_TO_DEVICE));
          break;
        case OP_QUANT_ROW:
          CHECK(xte_quantize(&in, &qr, &cfg, gpu));
          break;
        case OP_QUANT_BOTH:
          CHECK(xte_quantize(&in, &qb, &cfg, gpu));
          break;
        case OP_DEQUANT:
          CHECK(xte_dequantize(&qr, 0, &out16, gpu));
          break;
        default:
          CHECK(xte_cast(&in, &out8, 1, gpu));
      }
    }
    CHECK(xte_stream_synchronize(gpu));
    us[op] = (now() - t0) / iters * 1e6;
    bytes = op == OP_COPY        ? 2.0 * (double)in_bytes
            : op == OP_QUANT_ROW ? (double)in_bytes + (double)n + (double)(rsr * rsc) * 4
            : op == OP_QUANT_BOTH
                ? (double)in_bytes + 2.0 * (double)n + (double)(rsr * rsc + csr * csc) * 4
            : op == OP_DEQUANT ? (double)n + (double)(rsr * rsc) * 4 + (double)in_bytes
                               : (double)in_bytes + (double)n;
    gbs[op] = bytes / (us[op] * 1e-6) / 1e9;
  }
  printf("| op (bf16 %lld x %lld, %d iterations) | us | GB/s | x d2d copy |\n", (long long)M,
         (long long)K, iters);
  printf("|---|---:|---:|---:|\n");
  for (op = 0; op < OP_COUNT; op++)
    printf("| %s | %.1f | %.0f | %.2f |\n", op_name[op], us[op], gbs[op], gbs[op] / gbs[OP_COPY]);
  printf(
      "(host timing around %d launches and one synchronize; no L2 flush: the tensor is larger "
      "than L2)\n",
      iters);
  return 0;
}

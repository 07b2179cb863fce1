/* `xte info` without the xte program (which needs the benchmark dependencies): prints
 * xte_backend_info_string(). Built by tests/cmake/gpu.cmake as xte_device_info; tests/device/run.sh
 * runs it first. Exit 0 when the report was written.
 *
 *   xte_device_info [--fast]
 * --fast: also one FAST GEMM on CUDA device 0 (128 x 128 x 128, 1x128 x 128x128 e4m3, fp32 out,
 * GEMM-ready scales) and the line the plugin reported for it (src/cuda/xte_gpu_report.h):
 * "fast probe: gemm mode=fast path=cublaslt lib=... version=..." or "... path=exact why=...".
 * This is the first FAST call of the process, so it is where the plugin loads libcublasLt.
 * Exit 1 when the call failed or the plugin reported nothing; without a CUDA device the probe
 * line says "fast probe: SKIPPED: <why>". */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xte/xte.h>

static int fast_probe(void) {
  const int64_t n = 128;
  char path[64], line[512] = "";
  xte_stream gpu;
  xte_status st = xte_stream_create(XTE_BACKEND_CUDA, 0, NULL, &gpu);
  void *da, *db, *dsa, *dsb, *dd;
  int64_t sar, sac, sbr, sbc, i;
  float *ones;
  unsigned char *codes;
  xte_qtensor qa, qb;
  xte_tensor D;
  xte_gemm_config cfg = xte_gemm_config_default();
  FILE *f;
  if (st != XTE_SUCCESS) {
    printf("fast probe: SKIPPED: no usable CUDA device: %s\n", xte_last_error());
    return 0;
  }
  snprintf(path, sizeof path, "/tmp/xte_fast_probe.%ld", (long)getpid());
  setenv("XTE_GPU_REPORT", path, 1);
  remove(path);
  if (xte_quantize_scale_shape(n, n, XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK,
                               XTE_SCALE_LAYOUT_TE_GEMM, 0, &sar, &sac) != XTE_SUCCESS ||
      xte_quantize_scale_shape(n, n, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                               XTE_SCALE_LAYOUT_TE_GEMM, 0, &sbr, &sbc) != XTE_SUCCESS)
    return 1;
  ones = (float *)malloc(sizeof(float) * (size_t)(sar * sac + sbr * sbc));
  codes = (unsigned char *)malloc((size_t)(n * n));
  if (!ones || !codes) return 1;
  for (i = 0; i < sar * sac + sbr * sbc; i++) ones[i] = 1.0f;
  for (i = 0; i < n * n; i++) codes[i] = (unsigned char)(0x30 + i % 7); /* small e4m3 values */
  if (xte_malloc(gpu, (size_t)(n * n), &da) || xte_malloc(gpu, (size_t)(n * n), &db) ||
      xte_malloc(gpu, sizeof(float) * (size_t)(sar * sac), &dsa) ||
      xte_malloc(gpu, sizeof(float) * (size_t)(sbr * sbc), &dsb) ||
      xte_malloc(gpu, sizeof(float) * (size_t)(n * n), &dd) ||
      xte_memcpy(gpu, da, codes, (size_t)(n * n), XTE_MEMCPY_HOST_TO_DEVICE) ||
      xte_memcpy(gpu, db, codes, (size_t)(n * n), XTE_MEMCPY_HOST_TO_DEVICE) ||
      xte_memcpy(gpu, dsa, ones, sizeof(float) * (size_t)(sar * sac), XTE_MEMCPY_HOST_TO_DEVICE) ||
      xte_memcpy(gpu, dsb, ones, sizeof(float) * (size_t)(sbr * sbc), XTE_MEMCPY_HOST_TO_DEVICE)) {
    printf("fast probe: FAILED: device memory: %s\n", xte_last_error());
    return 1;
  }
  memset(&qa, 0, sizeof qa);
  qa.scaling_mode = XTE_SCALING_BLOCK_1x128;
  qa.recipe = XTE_RECIPE_TE_BLOCK;
  qa.rowwise = xte_tensor_2d(da, XTE_DTYPE_E4M3, n, n);
  qa.rowwise_scale_inv.data = dsa;
  qa.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  qa.rowwise_scale_inv.rows = sar;
  qa.rowwise_scale_inv.cols = sac;
  qa.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_TE_GEMM;
  qb = qa;
  qb.scaling_mode = XTE_SCALING_BLOCK_128x128;
  qb.rowwise = xte_tensor_2d(db, XTE_DTYPE_E4M3, n, n);
  qb.rowwise_scale_inv.data = dsb;
  qb.rowwise_scale_inv.rows = sbr;
  qb.rowwise_scale_inv.cols = sbc;
  D = xte_tensor_2d(dd, XTE_DTYPE_FP32, n, n);
  cfg.mode = XTE_GEMM_FAST;
  if (xte_gemm(&qa, &qb, NULL, &D, &cfg, gpu) != XTE_SUCCESS ||
      xte_stream_synchronize(gpu) != XTE_SUCCESS) {
    printf("fast probe: FAILED: xte_gemm: %s\n", xte_last_error());
    return 1;
  }
  f = fopen(path, "r");
  if (!f || !fgets(line, sizeof line, f)) {
    printf("fast probe: FAILED: the plugin reported no GEMM call (XTE_GPU_REPORT)\n");
    if (f) fclose(f);
    return 1;
  }
  fclose(f);
  remove(path);
  line[strcspn(line, "\n")] = '\0';
  printf("fast probe: %s\n", line);
  xte_free(gpu, da);
  xte_free(gpu, db);
  xte_free(gpu, dsa);
  xte_free(gpu, dsb);
  xte_free(gpu, dd);
  xte_stream_destroy(gpu);
  free(ones);
  free(codes);
  return 0;
}

int main(int argc, char **argv) {
  static char buf[8192];
  if (xte_backend_info_string(buf, sizeof buf) != XTE_SUCCESS) {
    fprintf(stderr, "xte_backend_info_string: %s\n", xte_last_error());
    return 1;
  }
  fputs(buf, stdout);
  if (argc > 1 && strcmp(argv[1], "--fast") == 0) return fast_probe();
  return 0;
}

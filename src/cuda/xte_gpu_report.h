/* What a GPU plugin really ran, reported by the plugin itself (never inferred by a caller): for
 * every GEMM call, the kernel(s) the exact driver launched, and for XTE_GEMM_FAST the path the
 * call took (cuBLASLt, or the exact kernel and why). tests/device/run.sh and `xte bench device`
 * read these lines to name the kernel of each row, to fail a forced kernel that did not run and a
 * FAST call that fell back where cuBLASLt should have run.
 *
 * The report goes to the file $XTE_GPU_REPORT names (appended, one write(2) per line, so lines
 * of concurrent calls never interleave); without it nothing is written. The process's last GEMM
 * report is also kept (xte_gpu_report_last), for `xte_device_info --fast`.
 *
 * Host C++ only (no CUDA): src/cuda/gemm.cu, src/cuda/cublaslt.cu and the host SIMT runner's
 * stand-in plugin (tests/simt/simt_plugin.cpp) include it. Plugin-internal. */
#ifndef XTE_GPU_REPORT_H
#define XTE_GPU_REPORT_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The names of the exact kernels (XTE_GEMM_KERNEL_* of gemm_kernels.cuh: 0 SIMT, 1 DMMA m8n8k4,
 * 2 DMMA m16n8k16, 3 the int8 digit kernel), as XTE_CUDA_GEMM_KERNEL spells them. */
static inline const char *xte_gemm_kernel_name(int k) {
  static const char *const n[4] = {"simt", "dmma4", "dmma16", "imma"};
  return k >= 0 && k < 4 ? n[k] : "?";
}

/* XTE_CUDA_GEMM_KERNEL's kernel (0..3), -1 when unset or empty ("auto"), -2 when unknown. */
static inline int xte_gemm_kernel_requested(const char *env) {
  int k;
  if (!env || !*env || strcmp(env, "auto") == 0) return -1;
  for (k = 0; k < 4; k++)
    if (strcmp(env, xte_gemm_kernel_name(k)) == 0) return k;
  return -2;
}

/* "simt", "dmma16+simt", ...: the kernels of a launch mask (bit k: kernel k launched); "none"
 * when no problem had work. */
static inline void xte_gemm_mask_names(unsigned mask, char *buf, size_t size) {
  size_t n = 0;
  int k;
  buf[0] = '\0';
  for (k = 0; k < 4; k++)
    if (mask & (1u << k)) {
      int w = snprintf(buf + n, size - n, "%s%s", n ? "+" : "", xte_gemm_kernel_name(k));
      if (w < 0 || (size_t)w >= size - n) break;
      n += (size_t)w;
    }
  if (!n) snprintf(buf, size, "none");
}

/* The last report line of the process (for xte_device_info --fast; racy between threads by
 * nature: the report file is the record). */
static inline char *xte_gpu_report_last(void) {
  static char last[320];
  return last;
}

/* Appends one line (a '\n' is added) to $XTE_GPU_REPORT and keeps it as the last report. */
static inline void xte_gpu_report_line(const char *line) {
  const char *path = getenv("XTE_GPU_REPORT");
  char buf[336];
  int n = snprintf(buf, sizeof buf, "%s\n", line);
  if (snprintf(xte_gpu_report_last(), 320, "%s", line) < 0) return;
  if (!path || !*path || n <= 0) return;
  if ((size_t)n >= sizeof buf) n = (int)sizeof buf - 1;
  {
    const int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (write(fd, buf, (size_t)n) != n) { /* a short report line is still a line */
    }
    close(fd);
  }
}

/* One exact GEMM call: mode (0 exact, 1 FAST that ran the exact kernel: fast_why says why),
 * the kernel asked for (XTE_CUDA_GEMM_KERNEL, -1 auto), the one chosen, the launch mask, and
 * when the request could not be honoured, why. */
static inline void xte_gpu_report_exact(int mode, int requested, int chosen, unsigned mask,
                                        const char *not_honoured, const char *fast_why) {
  char ran[48], line[320];
  xte_gemm_mask_names(mask, ran, sizeof ran);
  if (snprintf(line, sizeof line, "gemm mode=%s requested=%s chosen=%s ran=%s%s%.120s%s%s%.100s",
               mode ? "fast" : "exact", requested >= 0 ? xte_gemm_kernel_name(requested) : "auto",
               xte_gemm_kernel_name(chosen), ran, mode ? " path=exact why=\"" : "",
               mode ? (fast_why ? fast_why : "?") : "", mode ? "\"" : "",
               not_honoured ? " not_honoured=\"" : "", not_honoured ? not_honoured : "") < 0)
    return;
  if (not_honoured) {
    size_t n = strlen(line);
    if (n + 1 < sizeof line) snprintf(line + n, sizeof line - n, "\"");
  }
  xte_gpu_report_line(line);
}

/* One FAST call that ran through cuBLASLt (problems: the dense calls made; bias: the call has a
 * bias, added in fp32 after cuBLASLt by the exact kernels' epilogue: bias=fp32-epilogue). */
static inline void xte_gpu_report_lt(const char *lib, size_t version, long long problems,
                                     int bias) {
  char line[320];
  if (snprintf(line, sizeof line,
               "gemm mode=fast path=cublaslt lib=%.96s version=%zu.%zu.%zu calls=%lld bias=%s", lib,
               version / 10000, version / 100 % 100, version % 100, problems,
               bias ? "fp32-epilogue" : "none") < 0)
    return;
  xte_gpu_report_line(line);
}

#endif /* XTE_GPU_REPORT_H */

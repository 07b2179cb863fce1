/* `xte info` without the xte program (which needs the benchmark dependencies): prints
 * xte_backend_info_string(). Built by tests/gpu.cmake as xte_device_info; tests/device/run.sh
 * runs it when the xte program is not built. Exit 0 when the report was written. */
#include <stdio.h>
#include <xte/xte.h>

int main(void) {
  static char buf[8192];
  if (xte_backend_info_string(buf, sizeof buf) != XTE_SUCCESS) {
    fprintf(stderr, "xte_backend_info_string: %s\n", xte_last_error());
    return 1;
  }
  fputs(buf, stdout);
  return 0;
}

/* Consumer of an installed xte: quantizes a 1 x 4 fp32 row with TE block scaling and checks the
 * bytes. amax 448 gives scale 1: 1 -> 0x38, -2 -> 0xC0, 0.5 -> 0x30, 448 -> 0x7E. */
#include <stdio.h>
#include <string.h>
#include <xte/xte.h>

int main(void) {
  float x[4] = {1.0f, -2.0f, 0.5f, 448.0f}, sinv = -1.0f, amax = -1.0f;
  unsigned char q[4] = {0, 0, 0, 0};
  const unsigned char want[4] = {0x38, 0xC0, 0x30, 0x7E};
  xte_tensor in = xte_tensor_2d(x, XTE_DTYPE_FP32, 1, 4);
  xte_qtensor qt;
  xte_status st;
  memset(&qt, 0, sizeof qt);
  qt.rowwise = xte_tensor_2d(q, XTE_DTYPE_E4M3, 1, 4);
  qt.rowwise_scale_inv.data = &sinv;
  qt.rowwise_scale_inv.dtype = XTE_DTYPE_FP32;
  qt.rowwise_scale_inv.rows = 1;
  qt.rowwise_scale_inv.cols = 1;
  qt.rowwise_scale_inv.layout = XTE_SCALE_LAYOUT_COMPACT;
  qt.scaling_mode = XTE_SCALING_BLOCK_1x128;
  qt.recipe = XTE_RECIPE_TE_BLOCK;
  qt.amax = &amax;
  if (xte_version() != XTE_VERSION) {
    fprintf(stderr, "header version %d, library %d\n", XTE_VERSION, xte_version());
    return 1;
  }
  st = xte_quantize(&in, &qt, NULL, NULL);
  if (st != XTE_SUCCESS) {
    fprintf(stderr, "xte_quantize: %s: %s\n", xte_status_string(st), xte_last_error());
    return 1;
  }
  if (memcmp(q, want, 4) != 0 || sinv != 1.0f || amax != 448.0f) {
    fprintf(stderr, "got %02X %02X %02X %02X, scale_inv %g, amax %g\n", q[0], q[1], q[2], q[3],
            (double)sinv, (double)amax);
    return 1;
  }
  printf("xte consumer ok (xte %d)\n", xte_version());
  return 0;
}

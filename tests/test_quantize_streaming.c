/* Streaming stores do not change a byte.
 *
 * Large quantize calls write their copies with non-temporal stores (and the AVX-512 transposed
 * copy straight from its transpose network), which the other tests, on small shapes, never reach.
 * XTE_STREAMING_STORES=1 forces them; every SIMD ISA's bytes and scales must equal the scalar
 * path's (which tests/test_quantize_recipes.c checks against an independent oracle) on shapes with
 * 64-byte aligned rows (the streaming paths) and without (their fallbacks), bf16 and fp32 input,
 * power-of-two and general scales, 1x128, 128x128 and MXFP8 blocks. */
#define _POSIX_C_SOURCE 200809L /* setenv */

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

typedef struct shape {
  int64_t M, K;
} shape;

typedef struct out {
  uint8_t *q[2], *s[2];
  size_t sbytes[2];
} out;

static void *alloc64(size_t n) {
  void *p = aligned_alloc(64, (n + 63) / 64 * 64);
  cr_assert_not_null(p);
  return p;
}

/* Values of a magnitude per row from 2^-20 to 2^20, zeros and tiny values among them */
static void *make_input(xte_dtype dt, int64_t M, int64_t K) {
  float *f = (float *)alloc64((size_t)(M * K) * 4);
  uint64_t s = 0x2545F4914F6CDD1Dull;
  int64_t i, j;
  for (i = 0; i < M; i++) {
    float mag = ldexpf(1.0f, (int)(i * 7 % 41) - 20);
    for (j = 0; j < K; j++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      f[i * K + j] = (j % 97 == 5)   ? 0.0f
                     : (j % 89 == 3) ? mag * 1e-6f
                                     : mag * ((float)(s >> 40) / 8388608.0f - 1.0f);
    }
  }
  if (dt == XTE_DTYPE_FP32) return f;
  {
    uint16_t *b = (uint16_t *)alloc64((size_t)(M * K) * 2);
    xte_tensor x = xte_tensor_1d(f, XTE_DTYPE_FP32, M * K), y = xte_tensor_1d(b, dt, M * K);
    cr_assert_eq(xte_cast(&x, &y, 1, NULL), XTE_SUCCESS, "%s", xte_last_error());
    free(f);
    return b;
  }
}

static void run(const void *x, xte_dtype dt, shape sh, xte_recipe recipe, xte_scaling_mode mode,
                out *o) {
  const int mx = recipe == XTE_RECIPE_MX_TE;
  const xte_scale_layout L = mx ? XTE_SCALE_LAYOUT_MX_SWIZZLED : XTE_SCALE_LAYOUT_TE_GEMM;
  xte_tensor in = xte_tensor_2d((void *)x, dt, sh.M, sh.K);
  xte_qtensor q;
  int c;
  memset(&q, 0, sizeof q);
  for (c = 0; c < 2; c++) {
    int64_t r, k;
    xte_scale_tensor *s = c ? &q.columnwise_scale_inv : &q.rowwise_scale_inv;
    cr_assert_eq(xte_quantize_scale_shape(sh.M, sh.K, mode, recipe, L, c, &r, &k), XTE_SUCCESS);
    o->sbytes[c] = (size_t)(r * k) * (mx ? 1 : 4);
    o->q[c] = (uint8_t *)alloc64((size_t)(sh.M * sh.K));
    o->s[c] = (uint8_t *)alloc64(o->sbytes[c]);
    memset(o->q[c], 0xA5, (size_t)(sh.M * sh.K));
    *s = (xte_scale_tensor){o->s[c], mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32, r, k, L};
  }
  q.rowwise = xte_tensor_2d(o->q[0], XTE_DTYPE_E4M3, sh.M, sh.K);
  q.columnwise = mx ? xte_tensor_2d(o->q[1], XTE_DTYPE_E4M3, sh.M, sh.K)
                    : xte_tensor_2d(o->q[1], XTE_DTYPE_E4M3, sh.K, sh.M);
  q.scaling_mode = mode;
  q.recipe = recipe;
  cr_assert_eq(xte_quantize(&in, &q, NULL, NULL), XTE_SUCCESS, "%s", xte_last_error());
}

static void release(out *o) {
  int c;
  for (c = 0; c < 2; c++) {
    free(o->q[c]);
    free(o->s[c]);
  }
}

Test(quantize_streaming, forced_streaming_stores_same_bytes) {
  static const shape shapes[] = {{256, 384}, {192, 256}, {130, 320}, {64, 128}};
  static const xte_dtype dts[] = {XTE_DTYPE_BF16, XTE_DTYPE_FP32};
  static const struct {
    xte_recipe r;
    xte_scaling_mode m;
  } cfg[] = {{XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128},
             {XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_128x128},
             {XTE_RECIPE_DEEPGEMM, XTE_SCALING_BLOCK_1x128},
             {XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32}};
  static const xte_cpu_isa isas[] = {XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                     XTE_CPU_ISA_AVX512_SIMDE};
  size_t si, di, ci, ii;
  int compared = 0;
  cr_assert_eq(setenv("XTE_STREAMING_STORES", "1", 1), 0);
  for (si = 0; si < sizeof shapes / sizeof *shapes; si++)
    for (di = 0; di < 2; di++) {
      void *x = make_input(dts[di], shapes[si].M, shapes[si].K);
      for (ci = 0; ci < sizeof cfg / sizeof *cfg; ci++) {
        out ref, got;
        int c;
        cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_SCALAR), XTE_SUCCESS);
        run(x, dts[di], shapes[si], cfg[ci].r, cfg[ci].m, &ref);
        for (ii = 0; ii < sizeof isas / sizeof *isas; ii++) {
          xte_status st = xte_cpu_set_isa(isas[ii]);
          if (st == XTE_ERROR_UNSUPPORTED) continue;
          cr_assert_eq(st, XTE_SUCCESS);
          run(x, dts[di], shapes[si], cfg[ci].r, cfg[ci].m, &got);
          for (c = 0; c < 2; c++) {
            cr_expect_eq(memcmp(ref.q[c], got.q[c], (size_t)(shapes[si].M * shapes[si].K)), 0,
                         "%s copy differs: %s, %s, recipe %d mode %d, %lldx%lld",
                         c ? "columnwise" : "rowwise", xte_cpu_isa_name(isas[ii]),
                         xte_dtype_name(dts[di]), (int)cfg[ci].r, (int)cfg[ci].m,
                         (long long)shapes[si].M, (long long)shapes[si].K);
            cr_expect_eq(memcmp(ref.s[c], got.s[c], ref.sbytes[c]), 0, "%s scales differ: %s",
                         c ? "columnwise" : "rowwise", xte_cpu_isa_name(isas[ii]));
          }
          release(&got);
          compared++;
        }
        release(&ref);
      }
      free(x);
    }
  unsetenv("XTE_STREAMING_STORES");
  xte_cpu_set_isa(XTE_CPU_ISA_SCALAR);
  cr_assert_gt(compared, 0, "no SIMD ISA could run: nothing was compared");
}

/* NaN (both signs), +-inf, subnormals of the input format and -0 on the edges of the 128 x 128
 * tiles and in the row and column tails: the tiles that hold them leave the fast word sequences
 * (a NaN sends a tile down the general path, an inf makes its block's scale 1), with streaming
 * stores forced (XTE_STREAMING_STORES=1) and left to the size rule (these sizes: ordinary stores);
 * every SIMD ISA's bytes and scales must equal the scalar path's. Shapes with 64-byte aligned rows
 * (the streaming transposes) and without. */
static void plant_specials(void *x, xte_dtype dt, int64_t M, int64_t K) {
  static const uint32_t f32s[] = {0x7FC00000u, 0xFFC00001u, 0x7F800000u, 0xFF800000u,
                                  0x00000001u, 0x807FFFFFu, 0x80000000u, 0x00400000u};
  static const uint16_t bf16s[] = {0x7FC0u, 0xFFC1u, 0x7F80u, 0xFF80u,
                                   0x0001u, 0x807Fu, 0x8000u, 0x0040u};
  const int64_t rows[] = {0, 127, 128, 255, M - 1}, cols[] = {0, 127, 128, 255, K - 1};
  int i, j, n = 0;
  for (i = 0; i < 5; i++)
    for (j = 0; j < 5; j++, n++) {
      const int64_t r = rows[i] < M ? rows[i] : M - 1, c = cols[j] < K ? cols[j] : K - 1;
      if (dt == XTE_DTYPE_FP32)
        memcpy((float *)x + r * K + c, &f32s[n % 8], 4);
      else
        ((uint16_t *)x)[r * K + c] = bf16s[n % 8];
    }
}

Test(quantize_streaming, specials_at_tile_edges_same_bytes) {
  static const shape shapes[] = {{320, 448}, {200, 260}};
  static const xte_dtype dts[] = {XTE_DTYPE_BF16, XTE_DTYPE_FP32};
  static const struct {
    xte_recipe r;
    xte_scaling_mode m;
  } cfg[] = {{XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_1x128},
             {XTE_RECIPE_TE_BLOCK, XTE_SCALING_BLOCK_128x128},
             {XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALING_BLOCK_1x128},
             {XTE_RECIPE_MX_TE, XTE_SCALING_MXFP8_1x32}};
  static const xte_cpu_isa isas[] = {XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                     XTE_CPU_ISA_AVX512_SIMDE};
  size_t si, di, ci, ii;
  int forced, compared = 0;
  for (forced = 0; forced < 2; forced++) {
    if (forced)
      cr_assert_eq(setenv("XTE_STREAMING_STORES", "1", 1), 0);
    else
      unsetenv("XTE_STREAMING_STORES");
    for (si = 0; si < sizeof shapes / sizeof *shapes; si++)
      for (di = 0; di < 2; di++) {
        void *x = make_input(dts[di], shapes[si].M, shapes[si].K);
        plant_specials(x, dts[di], shapes[si].M, shapes[si].K);
        for (ci = 0; ci < sizeof cfg / sizeof *cfg; ci++) {
          out ref, got;
          int c;
          cr_assert_eq(xte_cpu_set_isa(XTE_CPU_ISA_SCALAR), XTE_SUCCESS);
          run(x, dts[di], shapes[si], cfg[ci].r, cfg[ci].m, &ref);
          for (ii = 0; ii < sizeof isas / sizeof *isas; ii++) {
            xte_status st = xte_cpu_set_isa(isas[ii]);
            if (st == XTE_ERROR_UNSUPPORTED) continue;
            cr_assert_eq(st, XTE_SUCCESS);
            run(x, dts[di], shapes[si], cfg[ci].r, cfg[ci].m, &got);
            for (c = 0; c < 2; c++) {
              cr_expect_eq(memcmp(ref.q[c], got.q[c], (size_t)(shapes[si].M * shapes[si].K)), 0,
                           "%s copy differs: %s, %s, recipe %d mode %d, %lldx%lld, forced %d",
                           c ? "columnwise" : "rowwise", xte_cpu_isa_name(isas[ii]),
                           xte_dtype_name(dts[di]), (int)cfg[ci].r, (int)cfg[ci].m,
                           (long long)shapes[si].M, (long long)shapes[si].K, forced);
              cr_expect_eq(memcmp(ref.s[c], got.s[c], ref.sbytes[c]), 0,
                           "%s scales differ: %s, recipe %d mode %d, forced %d",
                           c ? "columnwise" : "rowwise", xte_cpu_isa_name(isas[ii]), (int)cfg[ci].r,
                           (int)cfg[ci].m, forced);
            }
            release(&got);
            compared++;
          }
          release(&ref);
        }
        free(x);
      }
  }
  unsetenv("XTE_STREAMING_STORES");
  xte_cpu_set_isa(XTE_CPU_ISA_SCALAR);
  cr_assert_gt(compared, 0, "no SIMD ISA could run: nothing was compared");
}

/* The synthetic data of `xte moe` (see synth.h): vectorized, threaded fills of the
 * counter-based streams and the strip-wise generation + quantization of the expert weights. */
#include "synth.h"

#include <math.h>
#include <string.h>

#include "bench_common.h"

float moe_w_scale(int64_t fan_in) {
  return (float)sqrt(3.0 / (double)fan_in);
}

/* ---------------------------------------------------------------- fill kernels
 * One loop body, compiled for AVX-512 (64-bit multiplies in vector registers: vpmullq), AVX2
 * and plain x86-64 / other CPUs; the compiler vectorizes it. All integer arithmetic plus an exact
 * conversion and one fp32 multiply: the same bits from every version. */

enum { D_F32, D_F64, D_BF16 };

static inline __attribute__((always_inline)) void fill_body(void *out, int kind, size_t n,
                                                            uint64_t key, uint64_t i0, float a) {
  size_t i;
  if (kind == D_F32) {
    float *p = (float *)out;
    for (i = 0; i < n; i++) p[i] = moe_synth(key, i0 + i, a);
  } else if (kind == D_F64) {
    double *p = (double *)out;
    for (i = 0; i < n; i++) p[i] = (double)moe_synth(key, i0 + i, a);
  } else {
    uint16_t *p = (uint16_t *)out;
    for (i = 0; i < n; i++) p[i] = xte_f32_to_bf16(moe_synth(key, i0 + i, a));
  }
}

static void fill_generic(void *out, int kind, size_t n, uint64_t key, uint64_t i0, float a) {
  fill_body(out, kind, n, key, i0, a);
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define MOE_FILL_X86 1
__attribute__((target("avx2"))) static void fill_avx2(void *out, int kind, size_t n, uint64_t key,
                                                      uint64_t i0, float a) {
  fill_body(out, kind, n, key, i0, a);
}

__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw"))) static void fill_avx512(
    void *out, int kind, size_t n, uint64_t key, uint64_t i0, float a) {
  fill_body(out, kind, n, key, i0, a);
}
#endif

typedef void (*fill_fn)(void *, int, size_t, uint64_t, uint64_t, float);

static fill_fn pick_fill(void) {
#ifdef MOE_FILL_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
    return fill_avx512;
  if (__builtin_cpu_supports("avx2")) return fill_avx2;
#endif
  return fill_generic;
}

/* ---------------------------------------------------------------- threaded fills */

typedef struct fill_job {
  fill_fn fn;
  char *out;
  size_t esize, n;
  int kind;
  uint64_t key, i0; /* elements i0 .. i0 + n of the stream */
  float a;
} fill_job;

static void fill_part(void *ctx, int t, int nt) {
  const fill_job *j = (const fill_job *)ctx;
  /* parts of whole 64-byte lines, so that no two threads write one line */
  size_t per_line = 64 / j->esize, lines = (j->n + per_line - 1) / per_line;
  size_t lo = lines * (size_t)t / (size_t)nt * per_line;
  size_t hi = lines * (size_t)(t + 1) / (size_t)nt * per_line;
  if (hi > j->n) hi = j->n;
  if (lo < hi) j->fn(j->out + lo * j->esize, j->kind, hi - lo, j->key, j->i0 + lo, j->a);
}

static void fill_any(void *p, int kind, size_t esize, size_t n, uint64_t seed, uint64_t stream,
                     float a) {
  fill_job j;
  j.fn = pick_fill();
  j.out = (char *)p;
  j.esize = esize;
  j.n = n;
  j.kind = kind;
  j.key = moe_stream_key(seed, stream);
  j.i0 = 0;
  j.a = a;
  if (n < ((size_t)1 << 16))
    fill_part(&j, 0, 1);
  else
    xte_bench_team_run(fill_part, &j);
}

void moe_fill_f32(float *p, size_t n, uint64_t seed, uint64_t stream, float a) {
  fill_any(p, D_F32, 4, n, seed, stream, a);
}
void moe_fill_f64(double *p, size_t n, uint64_t seed, uint64_t stream, float a) {
  fill_any(p, D_F64, 8, n, seed, stream, a);
}
void moe_fill_bf16(uint16_t *p, size_t n, uint64_t seed, uint64_t stream, float a) {
  fill_any(p, D_BF16, 2, n, seed, stream, a);
}

/* ---------------------------------------------------------------- expert weights */

#define STRIP_FLOATS ((int64_t)1 << 22) /* 16 MiB of fp32: well inside the L3 */

static int64_t strip_rows(int64_t N, int64_t K) {
  int64_t r = STRIP_FLOATS / K / 128 * 128;
  if (r < 128) r = 128;
  return r < N ? r : N;
}

size_t moe_weight_stage_floats(int64_t N, int64_t K) {
  return (size_t)(strip_rows(N, K) * K);
}

xte_status moe_weight_expert(const xte_qtensor *W, int64_t g, int64_t N, int64_t K, float *stage,
                             uint64_t seed, uint64_t stream, xte_stream st) {
  int64_t S = strip_rows(N, K), sc = K / 128, r0;
  fill_job j;
  j.fn = pick_fill();
  j.out = (char *)stage;
  j.esize = 4;
  j.kind = D_F32;
  j.key = moe_stream_key(seed, stream);
  j.a = moe_w_scale(K);
  for (r0 = 0; r0 < N; r0 += S) {
    int64_t rows = N - r0 < S ? N - r0 : S, row = g * N + r0; /* row of the stack */
    xte_qtensor s = *W;
    xte_tensor in = xte_tensor_2d(stage, XTE_DTYPE_FP32, rows, K);
    xte_status rc;
    j.n = (size_t)(rows * K);
    j.i0 = (uint64_t)(r0 * K); /* the strip: elements r0 * K .. of the expert's stream */
    xte_bench_team_run(fill_part, &j);
    s.rowwise = xte_tensor_2d((uint8_t *)W->rowwise.data + row * K, XTE_DTYPE_E4M3, rows, K);
    s.rowwise_scale_inv.data = (float *)W->rowwise_scale_inv.data + row / 128 * sc;
    s.rowwise_scale_inv.rows = rows / 128;
    s.rowwise_scale_inv.cols = sc;
    if ((rc = xte_quantize(&in, &s, NULL, st)) != XTE_SUCCESS) return rc;
  }
  return XTE_SUCCESS;
}

/* xte_isa_digest: a fingerprint of the bytes every CPU operator of the public API writes.
 *
 * Each case calls one entry point on deterministic inputs (its own xorshift generator seeded from
 * the case's name, so adding a case never changes another; the quantize sweep shares its inputs,
 * seeded from their shape and dtype) and prints
 *     <case-name> <FNV-1a 64 of the status code and of every output byte, padding included>
 * or, for a combination the API refuses (enumerated on purpose, so that the set is visible),
 *     <case-name> UNSUPPORTED <status>
 * and last `TOTAL <FNV-1a 64 of every line above>`. Output buffers are filled with a fixed
 * pattern before each call, so bytes a call leaves alone (padding rows, scale padding) count too.
 * Covered: quantize (every scaling mode x recipe x scale layout, each copy, e4m3 / e5m2, from fp32
 * / bf16 / fp16, config variants), dequantize, cast, the exact GEMM (dense: every scaling pair,
 * dtype pair, transpose, epilogue, scale layout, small and large M; grouped: contiguous, masked,
 * K), attention forward / backward (BSHD / SBHD / THD, masks, windows, softcap, ALiBi, GQA, fp32 /
 * bf16 / fp16, e4m3 forward), the MoE router, aux scores and loss, token movement, SwiGLU (+
 * quantize), one-rank expert parallelism, and through two test hooks of src/ (weak: absent ones
 * are listed UNSUPPORTED) the attention past its cache limits and the vector exp.
 *
 * The numerics contract (docs/numerics.md) says the output is the same on every CPU ISA and thread
 * count: tests/isa_digest_check.sh (ctest isa_digest_identity) runs this program under each ISA
 * (xte_isa_run), with 1, 2 and 3 threads and on the other kernel paths, and diffs the lines. Run
 * before and after a change of src/cpu/, it shows every case whose bytes changed.
 * The ISA and the thread count come from the environment (XTE_CPU_ISA, XTE_NUM_THREADS), as for
 * any caller; they are reported on stderr only (with each group's time), so that stdout is the
 * same everywhere.
 *
 * Usage: xte_isa_digest [--small] [--dump CASE] [--filter SUBSTR] [--time]
 *   --small         fewer and smaller cases (the ctest run)
 *   --dump CASE     after CASE's line, print its outputs element by element
 *                   ("<buffer>[<index>] <hex> <value>"): diff two ISAs' dumps to find the first
 *                   differing element
 *   --filter SUBSTR print only the cases whose name contains SUBSTR (all cases still run; the TOTAL
 *                   line then covers the printed lines only)
 *   --time          each case's seconds on stderr
 * Exit status: 0; 1 when a call that must succeed failed (printed as "<case> FAILED ...") or a
 * case name repeats.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "xte/xte.h"

/* ================================================================== options, hashing, cases */

static int g_small;
static const char *g_dump;
static const char *g_filter;
static int g_failed;
static uint64_t g_total = 0xcbf29ce484222325ull;
static int g_lines, g_unsupported;
static int g_time; /* --time: each case's seconds on stderr */
static double now_s(void);

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = (const uint8_t *)p;
  size_t i;
  for (i = 0; i < n; i++) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

/* Memory: every allocation of the run is listed; a scope releases the ones made since its mark. */
#define MAX_ALLOCS 4096
static void *g_allocs[MAX_ALLOCS];
static int g_nalloc;

static void *xalloc(size_t bytes) {
  void *p = NULL;
  size_t n = (bytes + 64 + 63) / 64 * 64; /* slack, whole lines */
  if (g_nalloc >= MAX_ALLOCS || posix_memalign(&p, 64, n) != 0) {
    fprintf(stderr, "xte_isa_digest: out of memory (%zu bytes)\n", bytes);
    exit(2);
  }
  memset(p, 0, n);
  g_allocs[g_nalloc++] = p;
  return p;
}

static int mem_mark(void) {
  return g_nalloc;
}

static void mem_release(int mark) {
  while (g_nalloc > mark) free(g_allocs[--g_nalloc]);
}

/* The case being run: its name, its generator and its outputs. */
#define MAX_OUT 16
typedef struct obuf {
  const char *name;
  const void *p;
  size_t bytes;
  xte_dtype dt;
} obuf;

static struct {
  char name[200];
  uint64_t rng;
  double t0;
  obuf out[MAX_OUT];
  int nout;
} cur;

/* Every case name must be unique (the comparison matches lines by name): a set of their hashes. */
#define NAME_SET 16384
static uint64_t g_names[NAME_SET];

static void name_unique(const char *name) {
  uint64_t h = fnv(0xcbf29ce484222325ull, name, strlen(name)) | 1u;
  size_t i = (size_t)(h % NAME_SET), n;
  for (n = 0; n < NAME_SET; n++, i = (i + 1) % NAME_SET) {
    if (g_names[i] == 0) {
      g_names[i] = h;
      return;
    }
    if (g_names[i] == h) {
      fprintf(stderr, "xte_isa_digest: case name %s used twice\n", name);
      g_failed = 1;
      return;
    }
  }
  fprintf(stderr, "xte_isa_digest: more than %d cases\n", NAME_SET);
  exit(2);
}

static void case_begin(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cur.name, sizeof cur.name, fmt, ap);
  va_end(ap);
  name_unique(cur.name);
  cur.nout = 0;
  cur.t0 = g_time ? now_s() : 0.0;
  cur.rng = fnv(0xcbf29ce484222325ull, cur.name, strlen(cur.name)) | 1u;
}

static void emit(const char *line) {
  if (g_filter && !strstr(line, g_filter)) return;
  g_total = fnv(g_total, line, strlen(line));
  g_total = fnv(g_total, "\n", 1);
  g_lines++;
  printf("%s\n", line);
}

/* Registers an output buffer and fills it with the pattern (fill = 0: keep its bytes, for C = D).
 */
static void out_buf(const char *name, void *p, size_t bytes, xte_dtype dt, int fill) {
  size_t i;
  if (cur.nout >= MAX_OUT) {
    fprintf(stderr, "xte_isa_digest: %s: too many outputs\n", cur.name);
    exit(2);
  }
  if (fill)
    for (i = 0; i < bytes; i++) ((uint8_t *)p)[i] = (uint8_t)(0xA5u ^ (uint8_t)(i * 29u + 7u));
  cur.out[cur.nout].name = name;
  cur.out[cur.nout].p = p;
  cur.out[cur.nout].bytes = bytes;
  cur.out[cur.nout].dt = dt;
  cur.nout++;
}

static float h2f(uint16_t h);
static float fp8_to_f(uint8_t c, xte_dtype dt);

static void dump_case(void) {
  int o;
  for (o = 0; o < cur.nout; o++) {
    const obuf *b = &cur.out[o];
    size_t es = xte_dtype_size(b->dt), n = es ? b->bytes / es : 0, i;
    printf("# %s: %s, %zu bytes\n", b->name, xte_dtype_name(b->dt), b->bytes);
    for (i = 0; i < n; i++) {
      const uint8_t *p = (const uint8_t *)b->p + i * es;
      uint32_t u32;
      uint16_t u16;
      int32_t i32;
      int64_t i64;
      float f;
      switch (b->dt) {
        case XTE_DTYPE_FP32:
          memcpy(&u32, p, 4);
          memcpy(&f, p, 4);
          printf("%s[%zu] %08x %.9g\n", b->name, i, u32, (double)f);
          break;
        case XTE_DTYPE_BF16:
          memcpy(&u16, p, 2);
          u32 = (uint32_t)u16 << 16;
          memcpy(&f, &u32, 4);
          printf("%s[%zu] %04x %.9g\n", b->name, i, u16, (double)f);
          break;
        case XTE_DTYPE_FP16:
          memcpy(&u16, p, 2);
          printf("%s[%zu] %04x %.9g\n", b->name, i, u16, (double)h2f(u16));
          break;
        case XTE_DTYPE_E4M3:
        case XTE_DTYPE_E5M2:
        case XTE_DTYPE_E8M0:
          printf("%s[%zu] %02x %.9g\n", b->name, i, p[0], (double)fp8_to_f(p[0], b->dt));
          break;
        case XTE_DTYPE_INT32:
          memcpy(&i32, p, 4);
          printf("%s[%zu] %d\n", b->name, i, i32);
          break;
        case XTE_DTYPE_INT64:
          memcpy(&i64, p, 8);
          printf("%s[%zu] %lld\n", b->name, i, (long long)i64);
          break;
        default:
          printf("%s[%zu] %02x\n", b->name, i, p[0]);
          break;
      }
    }
  }
}

/* Ends the case: its line. reject_ok: a refusal (status other than success) is a listed
 * UNSUPPORTED combination, not a failure. */
static void case_end(xte_status st, int reject_ok) {
  char line[400];
  if (st == XTE_SUCCESS) {
    int32_t s32 = (int32_t)st;
    uint64_t h = fnv(0xcbf29ce484222325ull, &s32, 4);
    int o;
    for (o = 0; o < cur.nout; o++) h = fnv(h, cur.out[o].p, cur.out[o].bytes);
    snprintf(line, sizeof line, "%s %016llx", cur.name, (unsigned long long)h);
  } else if (reject_ok) {
    snprintf(line, sizeof line, "%s UNSUPPORTED %s", cur.name, xte_status_string(st));
    g_unsupported++;
  } else {
    snprintf(line, sizeof line, "%s FAILED %s: %s", cur.name, xte_status_string(st),
             xte_last_error());
    g_failed = 1;
  }
  emit(line);
  if (g_time) fprintf(stderr, "time %.6f %s\n", now_s() - cur.t0, cur.name);
  if (g_dump && !strcmp(g_dump, cur.name) && st == XTE_SUCCESS) dump_case();
}

/* A call that prepares a case's inputs failed: the case fails. */
static int setup_ok(xte_status st, const char *what) {
  char line[400];
  if (st == XTE_SUCCESS) return 1;
  snprintf(line, sizeof line, "%s FAILED setup %s: %s: %s", cur.name, what, xte_status_string(st),
           xte_last_error());
  emit(line);
  g_failed = 1;
  return 0;
}

/* ================================================================== data */

static uint32_t rnd(void) {
  uint64_t x = cur.rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  cur.rng = x;
  return (uint32_t)(x >> 16);
}

static uint32_t rndn(uint32_t n) {
  return n ? rnd() % n : 0;
}

static float rnd_unit(void) { /* [-1, 1) */
  return (float)((double)(rnd() & 0xFFFFFF) / 8388608.0 - 1.0);
}

static float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static uint16_t f2bf(float f) {
  uint32_t u = to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static uint16_t f2h(float f) {
  uint32_t x = to_bits(f), s = (x >> 16) & 0x8000u, m, h, rem;
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return (uint16_t)(s | 0x7E00u);
  if (x >= 0x477FF000u) return (uint16_t)(s | 0x7C00u); /* 65520 and up round to inf */
  if (x < 0x38800000u) /* below 2^-14: a subnormal (or zero) half, units of 2^-24, RNE */
    return (uint16_t)(s | (uint32_t)lrintf(from_bits(x) * 16777216.0f));
  m = x & 0x7FFFFFu;
  h = ((((x >> 23) - 112u) << 10) | (m >> 13));
  rem = m & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(s | h);
}

static float h2f(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  float v;
  if (e == 0x1F) return from_bits(s | 0x7F800000u | (m << 13));
  if (e == 0)
    v = (float)m * 5.9604644775390625e-8f; /* 2^-24 */
  else
    v = ldexpf((float)(m | 0x400u), (int)e - 25);
  return s ? -v : v;
}

static float fp8_to_f(uint8_t c, xte_dtype dt) {
  int s = c >> 7, e, m;
  float v;
  if (dt == XTE_DTYPE_E8M0) return c == 0xFF ? NAN : ldexpf(1.0f, (int)c - 127);
  if (dt == XTE_DTYPE_E4M3) {
    e = (c >> 3) & 15;
    m = c & 7;
    if (e == 15 && m == 7) return NAN;
    v = e ? ldexpf((float)(8 + m), e - 10) : ldexpf((float)m, -9);
  } else {
    e = (c >> 2) & 31;
    m = c & 3;
    if (e == 31) return m ? NAN : (s ? -INFINITY : INFINITY);
    v = e ? ldexpf((float)(4 + m), e - 17) : ldexpf((float)m, -16);
  }
  return s ? -v : v;
}

/* Value profiles of the generated inputs. */
enum {
  P_WILD, /* block magnitudes 2^-24..2^24, extreme / zero / constant blocks, NaN, inf, subnormals */
  P_FINITE, /* as WILD without NaN and inf */
  P_GEMM,   /* block magnitudes 2^-6..2^6, a few zero blocks and subnormal elements */
  P_UNIT,   /* [-1, 1) times the scale, an occasional zero / subnormal */
  P_TIES,   /* small integers / 8: many equal values */
  P_CLEAN   /* block magnitudes 2^-20..2^12 (fp16-safe), zero blocks, no NaN / inf / huge */
};

static const uint32_t specials_all[] = {0x7FC00000u, 0xFFC00001u, 0x7F800000u, 0xFF800000u,
                                        0x00000001u, 0x80012345u, 0x007FFFFFu, 0x80000000u,
                                        0x00000000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x43E00000u,
                                        0x47600000u, 0x477FE000u, 0x00800000u, 0x3F800000u};
#define N_SPECIALS_NONFINITE 4 /* the first four */

/* n fp32 values of a profile; scale multiplies everything. */
static void gen_f32(float *p, int64_t n, int prof, float scale) {
  int64_t i = 0;
  while (i < n) {
    int64_t len = 32, j;
    float mag = scale, cval = 0.0f;
    int kind = 0; /* 0 random, 1 zero, 2 constant */
    if (len > n - i) len = n - i;
    switch (prof) {
      case P_WILD:
      case P_FINITE: {
        uint32_t r = rndn(32);
        if (r == 0) {
          mag = scale * ldexpf(1.0f, -135); /* subnormal block */
        } else if (r == 1) {
          mag = scale * ldexpf(1.0f, 100);
        } else if (r == 2) {
          kind = 1;
        } else if (r == 3) {
          kind = 2;
          cval = scale * ldexpf(1.0f + (float)rndn(8) / 8.0f, (int)rndn(20) - 10);
        } else {
          mag = scale * ldexpf(1.0f, (int)rndn(49) - 24);
        }
        break;
      }
      case P_CLEAN:
        if (rndn(24) == 0)
          kind = 1;
        else
          mag = scale * ldexpf(1.0f, (int)rndn(33) - 20);
        break;
      case P_GEMM:
        if (rndn(40) == 0)
          kind = 1;
        else
          mag = scale * ldexpf(1.0f, (int)rndn(13) - 6);
        break;
      default:
        break;
    }
    for (j = 0; j < len; j++) {
      float v;
      if (kind == 1)
        v = 0.0f;
      else if (kind == 2)
        v = cval;
      else if (prof == P_TIES)
        v = scale * (float)((int)rndn(17) - 8) / 8.0f;
      else
        v = rnd_unit() * mag;
      if (prof == P_WILD && rndn(97) == 0) v = from_bits(specials_all[rndn(16)]);
      if (prof == P_FINITE && rndn(97) == 0)
        v = from_bits(specials_all[N_SPECIALS_NONFINITE + rndn(16 - N_SPECIALS_NONFINITE)]);
      if ((prof == P_GEMM || prof == P_UNIT || prof == P_CLEAN) && rndn(211) == 0)
        v = rndn(2) ? 0.0f : from_bits(0x00000005u | (rndn(2) << 31));
      p[i + j] = v;
    }
    i += len;
  }
}

/* n values of dtype dt (fp32 / bf16 / fp16: from gen_f32; other dtypes: random bytes). */
static void gen(void *p, xte_dtype dt, int64_t n, int prof, float scale) {
  int64_t i;
  if (dt == XTE_DTYPE_FP32) {
    gen_f32((float *)p, n, prof, scale);
  } else if (dt == XTE_DTYPE_BF16 || dt == XTE_DTYPE_FP16) {
    float *t = (float *)malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!t) exit(2);
    gen_f32(t, n, prof, scale);
    for (i = 0; i < n; i++) ((uint16_t *)p)[i] = dt == XTE_DTYPE_BF16 ? f2bf(t[i]) : f2h(t[i]);
    free(t);
  } else {
    size_t b = (size_t)n * xte_dtype_size(dt), k;
    for (k = 0; k < b; k++) ((uint8_t *)p)[k] = (uint8_t)rnd();
  }
}

/* Inputs shared by many cases (the quantize sweep): generated once per key, from the key's own
 * seed, kept for the whole run. */
#define MAX_SHARED 32
static struct {
  char key[96];
  void *p;
} g_shared[MAX_SHARED];
static int g_nshared;

static const void *shared_input(xte_dtype dt, int64_t n, int prof, float scale) {
  char key[96];
  int i;
  uint64_t save = cur.rng;
  void *p;
  snprintf(key, sizeof key, "%s.%lld.%d.%a", xte_dtype_name(dt), (long long)n, prof, (double)scale);
  for (i = 0; i < g_nshared; i++)
    if (!strcmp(g_shared[i].key, key)) return g_shared[i].p;
  if (g_nshared == MAX_SHARED) {
    fprintf(stderr, "xte_isa_digest: too many shared inputs\n");
    exit(2);
  }
  if (posix_memalign(&p, 64, xte_dtype_size(dt) * (size_t)(n > 0 ? n : 1) + 64) != 0) exit(2);
  cur.rng = fnv(0xcbf29ce484222325ull, key, strlen(key)) | 1u;
  gen(p, dt, n, prof, scale);
  cur.rng = save;
  snprintf(g_shared[g_nshared].key, sizeof g_shared[g_nshared].key, "%s", key);
  g_shared[g_nshared++].p = p;
  return p;
}

/* A new buffer of n elements of dt, generated. */
static void *gen_new(xte_dtype dt, int64_t n, int prof, float scale) {
  void *p = xalloc(xte_dtype_size(dt) * (size_t)(n > 0 ? n : 1));
  gen(p, dt, n, prof, scale);
  return p;
}

/* e4m3 codes of moderate magnitude (2^-4 .. 2^3), no NaN */
static void gen_e4m3_codes(uint8_t *p, int64_t n) {
  int64_t i;
  for (i = 0; i < n; i++) {
    uint32_t e = 3 + rndn(8), m = rndn(8), s = rndn(2);
    p[i] = (uint8_t)((s << 7) | (e << 3) | m);
    if (rndn(53) == 0) p[i] = (uint8_t)(rndn(2) ? 0x00 : (0x80 | rndn(8))); /* zero, subnormal */
  }
}

static xte_tensor t2(void *p, xte_dtype dt, int64_t r, int64_t c) {
  return xte_tensor_2d(p, dt, r, c);
}

static xte_tensor t1(void *p, xte_dtype dt, int64_t n) {
  return xte_tensor_1d(p, dt, n);
}

/* an output tensor [r, c] (c = 0: 1-D [r]), registered */
static xte_tensor out2(const char *name, xte_dtype dt, int64_t r, int64_t c) {
  int64_t n = r * (c ? c : 1);
  size_t bytes = xte_dtype_size(dt) * (size_t)n;
  void *p = xalloc(bytes);
  out_buf(name, p, bytes, dt, 1);
  return c ? t2(p, dt, r, c) : t1(p, dt, r);
}

static const char *dtn(xte_dtype dt) {
  return xte_dtype_name(dt);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ================================================================== quantize, dequantize, cast */

static const char *mode_name(xte_scaling_mode m) {
  static const char *n[] = {"pt", "1x128", "128x128", "mx32"};
  return (unsigned)m < 4 ? n[m] : "?";
}
static const char *recipe_name(xte_recipe r) {
  static const char *n[] = {"te_cur",   "te_del", "te_blk", "dg",
                            "dg_ue8m0", "mtfp8",  "mx_te",  "mx_ocp"};
  return (unsigned)r < 8 ? n[r] : "?";
}
static const char *layout_name(xte_scale_layout l) {
  static const char *n[] = {"compact", "te_gemm", "deepgemm", "mx_swz"};
  return (unsigned)l < 4 ? n[l] : "?";
}
static int is_mx(xte_recipe r) {
  return r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP;
}
static int col_transposed(xte_recipe r) {
  return !(is_mx(r) || r == XTE_RECIPE_MTFP8);
}

enum { C_ROW = 1, C_COL = 2, C_BOTH = 3 };
static const char *copies_name(int c) {
  return c == C_ROW ? "row" : c == C_COL ? "col" : "both";
}

/* Buffers of a qtensor for an [M, K] input with the given copies (scale dtype sdt: XTE_DTYPE_COUNT
 * for the recipe's own). as_out: registered as the case's outputs. Returns the status of
 * xte_quantize_scale_shape. */
static xte_status make_q(xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode,
                         xte_recipe rec, xte_scale_layout lay, xte_dtype qdt, int copies,
                         xte_dtype sdt, int as_out) {
  int k;
  int tr = col_transposed(rec);
  if (sdt == XTE_DTYPE_COUNT) sdt = is_mx(rec) ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
  memset(q, 0, sizeof *q);
  q->scaling_mode = mode;
  q->recipe = rec;
  for (k = 0; k < 2; k++) {
    int64_t sr = 0, sc = 0;
    size_t es = xte_dtype_size(sdt), db = (size_t)(M * K), sb;
    xte_scale_tensor *s = k ? &q->columnwise_scale_inv : &q->rowwise_scale_inv;
    void *d, *sd;
    xte_status st;
    if (!(copies & (k ? C_COL : C_ROW))) continue;
    st = xte_quantize_scale_shape(M, K, mode, rec, lay, k, &sr, &sc);
    if (st != XTE_SUCCESS) return st;
    sb = (size_t)(sr * sc) * es;
    d = xalloc(db);
    sd = xalloc(sb);
    if (k)
      q->columnwise = tr ? t2(d, qdt, K, M) : t2(d, qdt, M, K);
    else
      q->rowwise = t2(d, qdt, M, K);
    s->data = sd;
    s->dtype = sdt;
    s->rows = sr;
    s->cols = sc;
    s->layout = lay;
    if (as_out) {
      out_buf(k ? "col" : "row", d, db, qdt, 1);
      out_buf(k ? "col_scale_inv" : "row_scale_inv", sd, sb, sdt, 1);
    }
  }
  return XTE_SUCCESS;
}

typedef struct qopts {
  int force_pow_2; /* -1 default */
  int saturate;
  float eps;
  int amax;     /* amax output */
  int ld_pad;   /* input rows ld = K + ld_pad */
  float dscale; /* TE_DELAYED scale */
  const char *tag;
} qopts;

static qopts qopts_default(void) {
  qopts o;
  o.force_pow_2 = -1;
  o.saturate = 1;
  o.eps = 0.0f;
  o.amax = 1;
  o.ld_pad = 0;
  o.dscale = 0.375f;
  o.tag = "";
  return o;
}

/* One quantize case; with dq, the dequantize cases of each copy into fp32 / bf16 / fp16 follow. */
static void quant_case(int64_t M, int64_t K, xte_dtype in_dt, xte_scaling_mode mode, xte_recipe rec,
                       xte_scale_layout lay, xte_dtype qdt, int copies, const qopts *o, int prof,
                       int dq) {
  int mark = mem_mark();
  xte_qtensor q;
  xte_tensor in;
  xte_quant_config cfg = xte_quant_config_default();
  xte_status st;
  int64_t ld = K + o->ld_pad;
  void *x;
  char base[160];
  snprintf(base, sizeof base, "%s.%s.%s.%s.%s.%s.%lldx%lld%s", mode_name(mode), recipe_name(rec),
           layout_name(lay), dtn(in_dt), dtn(qdt), copies_name(copies), (long long)M, (long long)K,
           o->tag);
  case_begin("quantize.%s", base);
  x = (void *)shared_input(in_dt, M > 0 ? (M - 1) * ld + K : 0, prof, 3.0f);
  in = t2(x, in_dt, M, K);
  if (o->ld_pad) in.ld = ld;
  st = make_q(&q, M, K, mode, rec, lay, qdt, copies, XTE_DTYPE_COUNT, 1);
  if (st != XTE_SUCCESS) {
    case_end(st, 1);
    mem_release(mark);
    return;
  }
  cfg.force_pow_2 = o->force_pow_2;
  cfg.saturate = o->saturate;
  cfg.amax_epsilon = o->eps;
  if (o->amax) {
    q.amax = (float *)xalloc(4);
    out_buf("amax", q.amax, 4, XTE_DTYPE_FP32, 1);
  }
  if (rec == XTE_RECIPE_TE_DELAYED) {
    q.scale = (float *)xalloc(4);
    *q.scale = o->dscale;
  } else if (rec == XTE_RECIPE_TE_CURRENT) {
    q.scale = (float *)xalloc(4);
    out_buf("scale", q.scale, 4, XTE_DTYPE_FP32, 1);
  }
  st = xte_quantize(&in, &q, &cfg, NULL);
  case_end(st, 1);
  if (st == XTE_SUCCESS && dq) {
    static const xte_dtype odt[3] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
    int k, j;
    for (k = 0; k < 2; k++) {
      int tr = k && col_transposed(rec);
      if (!(copies & (k ? C_COL : C_ROW))) continue;
      for (j = 0; j < 3; j++) {
        xte_tensor out;
        int m2 = mem_mark();
        case_begin("dequantize.%s.%s.%s", base, k ? "col" : "row", dtn(odt[j]));
        out = out2("out", odt[j], tr ? K : M, tr ? M : K);
        case_end(xte_dequantize(&q, k, &out, NULL), 0);
        mem_release(m2);
      }
    }
  }
  mem_release(mark);
}

static void quantize_cases(void) {
  static const xte_dtype in_dts[3] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  static const xte_dtype q_dts[2] = {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2};
  const int64_t M = g_small ? 130 : 260, K = g_small ? 160 : 300;
  int mode, rec, lay, i, j, c;
  qopts o = qopts_default();
  for (mode = 0; mode < XTE_SCALING_COUNT; mode++)
    for (rec = 0; rec < XTE_RECIPE_COUNT; rec++)
      for (lay = 0; lay < XTE_SCALE_LAYOUT_COUNT; lay++) {
        int64_t r, cc;
        xte_scaling_mode m = (xte_scaling_mode)mode;
        xte_recipe re = (xte_recipe)rec;
        xte_scale_layout l = (xte_scale_layout)lay;
        xte_status st = xte_quantize_scale_shape(M, K, m, re, l, 0, &r, &cc);
        if (st != XTE_SUCCESS) { /* a combination the API does not define: listed once */
          case_begin("quantize.%s.%s.%s", mode_name(m), recipe_name(re), layout_name(l));
          case_end(st, 1);
          continue;
        }
        /* the other scale dtype: refused */
        {
          int mark = mem_mark();
          xte_qtensor q;
          xte_tensor in;
          xte_dtype other = is_mx(re) ? XTE_DTYPE_FP32 : XTE_DTYPE_E8M0;
          case_begin("quantize.%s.%s.%s.scale_%s", mode_name(m), recipe_name(re), layout_name(l),
                     dtn(other));
          in = t2(gen_new(XTE_DTYPE_FP32, 64 * 64, P_UNIT, 1.0f), XTE_DTYPE_FP32, 64, 64);
          st = make_q(&q, 64, 64, m, re, l, XTE_DTYPE_E4M3, C_BOTH, other, 1);
          if (st == XTE_SUCCESS) {
            if (re == XTE_RECIPE_TE_DELAYED) {
              q.scale = (float *)xalloc(4);
              *q.scale = 1.0f;
            }
            st = xte_quantize(&in, &q, NULL, NULL);
          }
          case_end(st, 1);
          mem_release(mark);
        }
        /* the main shape: every input dtype, fp8 dtype and set of copies */
        for (i = 0; i < 3; i++)
          for (j = 0; j < 2; j++)
            for (c = C_ROW; c <= C_BOTH; c++) {
              if (g_small && c != C_BOTH && !(i == 1 && j == 0)) continue;
              /* NaN / inf in a group of blocks send the SIMD kernels down their general path:
               * bf16 and one-copy fp16 inputs have none */
              quant_case(M, K, in_dts[i], m, re, l, q_dts[j], c, &o,
                         i == 1 || (i == 2 && c != C_BOTH) ? P_CLEAN : P_WILD,
                         c == C_BOTH && i == 0 && (j == 0 || !g_small));
            }
        /* odd small shapes, one row, empty; whole 128-blocks (the SIMD kernels' fast paths);
         * rows longer than one pass of the row kernel (256 blocks) */
        quant_case(1, 33, XTE_DTYPE_BF16, m, re, l, XTE_DTYPE_E4M3, C_BOTH, &o, P_WILD, 0);
        quant_case(0, 64, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E4M3, C_BOTH, &o, P_WILD, 0);
        quant_case(64, 0, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E4M3, C_BOTH, &o, P_WILD, 0);
        quant_case(40, 256, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E4M3, C_ROW, &o, P_CLEAN, 0);
        quant_case(41, 256, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E4M3, C_ROW, &o, P_WILD, 0);
        if (m == XTE_SCALING_BLOCK_1x128 || m == XTE_SCALING_MXFP8_1x32)
          quant_case(g_small ? 1 : 3, m == XTE_SCALING_MXFP8_1x32 ? 8300 : 33000, XTE_DTYPE_BF16, m,
                     re, l, XTE_DTYPE_E5M2, C_ROW, &o, P_WILD, 0);
        if (!g_small) {
          quant_case(7, 161, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E5M2, C_BOTH, &o, P_WILD, 1);
          quant_case(129, 1, XTE_DTYPE_FP16, m, re, l, XTE_DTYPE_E4M3, C_BOTH, &o, P_WILD, 0);
          quant_case(256, 384, XTE_DTYPE_BF16, m, re, l, XTE_DTYPE_E4M3, C_BOTH, &o, P_CLEAN, 0);
          quant_case(256, 384, XTE_DTYPE_FP32, m, re, l, XTE_DTYPE_E5M2, C_BOTH, &o, P_CLEAN, 0);
          quant_case(130, 512, XTE_DTYPE_FP16, m, re, l, XTE_DTYPE_E4M3, C_ROW, &o, P_CLEAN, 0);
        }
      }
  /* configuration variants on a few recipes */
  {
    static const struct {
      xte_scaling_mode m;
      xte_recipe r;
      xte_scale_layout l;
    } v[] = {
        {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_COMPACT},
        {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK, XTE_SCALE_LAYOUT_TE_GEMM},
        {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_MTFP8, XTE_SCALE_LAYOUT_COMPACT},
        {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM_UE8M0, XTE_SCALE_LAYOUT_DEEPGEMM},
        {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_OCP, XTE_SCALE_LAYOUT_COMPACT},
        {XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT, XTE_SCALE_LAYOUT_COMPACT},
        {XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_DELAYED, XTE_SCALE_LAYOUT_COMPACT},
    };
    int n = (int)(sizeof v / sizeof v[0]), k;
    for (k = 0; k < n; k++)
      for (j = 0; j < 2; j++) {
        qopts a = qopts_default();
        a.force_pow_2 = 0;
        a.tag = ".pow2_0";
        quant_case(M, K, XTE_DTYPE_FP32, v[k].m, v[k].r, v[k].l, q_dts[j], C_BOTH, &a, P_WILD, 0);
        a.force_pow_2 = 1;
        a.tag = ".pow2_1";
        quant_case(M, K, XTE_DTYPE_BF16, v[k].m, v[k].r, v[k].l, q_dts[j], C_BOTH, &a, P_WILD, 0);
        a = qopts_default();
        a.saturate = 0;
        a.dscale = 3000.0f; /* delayed: values overflow */
        a.tag = ".nosat";
        quant_case(M, K, XTE_DTYPE_FP32, v[k].m, v[k].r, v[k].l, q_dts[j], C_BOTH, &a, P_WILD, 0);
        a.saturate = 1;
        a.tag = ".sat_big";
        quant_case(M, K, XTE_DTYPE_FP16, v[k].m, v[k].r, v[k].l, q_dts[j], C_BOTH, &a, P_WILD, 0);
        a = qopts_default();
        a.eps = 1e-3f;
        a.tag = ".eps";
        quant_case(M, K, XTE_DTYPE_FP32, v[k].m, v[k].r, v[k].l, q_dts[j], C_ROW, &a, P_WILD, 0);
        a = qopts_default();
        a.ld_pad = 40;
        a.amax = 0;
        a.tag = ".ld";
        quant_case(M, K, XTE_DTYPE_BF16, v[k].m, v[k].r, v[k].l, q_dts[j], C_BOTH, &a, P_WILD,
                   !g_small);
      }
  }
}

static void cast_cases(void) {
  static const xte_dtype dts[6] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16,
                                   XTE_DTYPE_E4M3, XTE_DTYPE_E5M2, XTE_DTYPE_E8M0};
  int i, j, sat;
  for (i = 0; i < 6; i++)
    for (j = 0; j < 6; j++)
      for (sat = 0; sat < 2; sat++) {
        int mark = mem_mark();
        xte_dtype a = dts[i], b = dts[j];
        size_t es = xte_dtype_size(a);
        /* 16-bit and 8-bit inputs: every code, then random ones; fp32: the wild profile */
        int64_t n = es == 4 ? (g_small ? 3001 : 20011) : es == 2 ? 65536 + 77 : 256 + 1013, k;
        void *x = xalloc(es * (size_t)n);
        xte_tensor in, out;
        case_begin("cast.%s.%s.sat%d", dtn(a), dtn(b), sat);
        if (es == 4) {
          gen(x, a, n, P_WILD, 1.0f);
        } else {
          for (k = 0; k < n; k++) {
            uint32_t code = k < (es == 2 ? 65536 : 256) ? (uint32_t)k : rnd();
            if (es == 2)
              ((uint16_t *)x)[k] = (uint16_t)code;
            else
              ((uint8_t *)x)[k] = (uint8_t)code;
          }
        }
        in = t2(x, a, 1, n);
        out = out2("out", b, 1, n);
        case_end(xte_cast(&in, &out, sat, NULL), 1);
        mem_release(mark);
      }
  /* a 2-D cast with odd rows */
  {
    int mark = mem_mark();
    xte_tensor in, out;
    case_begin("cast.fp32.e4m3.sat1.37x113");
    in = t2(gen_new(XTE_DTYPE_FP32, 37 * 113, P_WILD, 300.0f), XTE_DTYPE_FP32, 37, 113);
    out = out2("out", XTE_DTYPE_E4M3, 37, 113);
    case_end(xte_cast(&in, &out, 1, NULL), 0);
    mem_release(mark);
  }
}

/* ================================================================== GEMM */

typedef struct opspec {
  xte_scaling_mode mode;
  xte_recipe rec;
  xte_scale_layout lay;
  xte_dtype dt;
  int copies;
} opspec;

/* A quantized operand from an fp32 [R, C] tensor (profile P_GEMM), with a few special codes
 * poked into each copy: NaN, zero, subnormals, e5m2 infinities. */
static int make_operand(xte_qtensor *q, int64_t R, int64_t C, const opspec *s, float scale,
                        int specials) {
  xte_tensor in = t2(gen_new(XTE_DTYPE_FP32, R * C, P_GEMM, scale), XTE_DTYPE_FP32, R, C);
  int k, n;
  if (!setup_ok(make_q(q, R, C, s->mode, s->rec, s->lay, s->dt, s->copies, XTE_DTYPE_COUNT, 0),
                "scale shape"))
    return 0;
  if (s->rec == XTE_RECIPE_TE_DELAYED) {
    q->scale = (float *)xalloc(4);
    *q->scale = 4.0f;
  }
  if (!setup_ok(xte_quantize(&in, q, NULL, NULL), "quantize")) return 0;
  q->scale = NULL;
  if (!specials || R * C == 0) return 1;
  for (k = 0; k < 2; k++) {
    uint8_t *d = (uint8_t *)(k ? q->columnwise.data : q->rowwise.data);
    static const uint8_t e4[] = {0x7F, 0xFF, 0x00, 0x80, 0x01, 0x86};
    static const uint8_t e5[] = {0x7C, 0xFC, 0x7E, 0x00, 0x01, 0x83};
    if (!d) continue;
    for (n = 0; n < specials; n++) {
      int64_t pos = (int64_t)(((uint64_t)rnd() << 16 ^ rnd()) % (uint64_t)(R * C));
      d[pos] = s->dt == XTE_DTYPE_E4M3 ? e4[rndn(6)] : e5[rndn(6)];
    }
  }
  return 1;
}

typedef struct gspec {
  opspec a, b;
  int64_t M, N, K;
  int ta, tb;
  xte_dtype d_dt;
  int acc; /* 0 none, 1 C fp32, 2 C bf16, 3 C = D (in place, D's dtype) */
  int bias;
  int specials; /* special codes per operand copy */
  int ld_d;     /* extra columns of D's rows (ld) */
} gspec;

static const char *pair_name(const gspec *g, char *buf, size_t n) {
  snprintf(buf, n, "%s_%s", mode_name(g->a.mode), mode_name(g->b.mode));
  return buf;
}

static gspec gspec_make(xte_scaling_mode ma, xte_scaling_mode mb, xte_dtype da, xte_dtype db,
                        int64_t M, int64_t N, int64_t K) {
  gspec g;
  memset(&g, 0, sizeof g);
  g.a.mode = ma;
  g.b.mode = mb;
  g.a.rec = g.b.rec = ma == XTE_SCALING_MXFP8_1x32   ? XTE_RECIPE_MX_TE
                      : ma == XTE_SCALING_PER_TENSOR ? XTE_RECIPE_TE_CURRENT
                                                     : XTE_RECIPE_TE_BLOCK;
  if (mb == XTE_SCALING_MXFP8_1x32) g.b.rec = XTE_RECIPE_MX_TE;
  if (mb == XTE_SCALING_PER_TENSOR) g.b.rec = XTE_RECIPE_TE_CURRENT;
  if (mb == XTE_SCALING_BLOCK_1x128 || mb == XTE_SCALING_BLOCK_128x128) {
    if (ma == XTE_SCALING_MXFP8_1x32 || ma == XTE_SCALING_PER_TENSOR) g.b.rec = XTE_RECIPE_TE_BLOCK;
  }
  g.a.lay = g.b.lay = XTE_SCALE_LAYOUT_COMPACT;
  g.a.dt = da;
  g.b.dt = db;
  g.a.copies = g.b.copies = C_BOTH;
  g.M = M;
  g.N = N;
  g.K = K;
  g.d_dt = XTE_DTYPE_BF16;
  g.specials = 3;
  return g;
}

static void gemm_case(const gspec *g, const char *tag) {
  int mark = mem_mark();
  xte_qtensor A, B;
  xte_tensor C, D, bias;
  xte_gemm_config cfg = xte_gemm_config_default();
  char pn[40];
  static const char *acc_n[] = {"", ".acc_fp32", ".acc_bf16", ".inplace"};
  int64_t ldd = g->N + g->ld_d;
  size_t ds = xte_dtype_size(g->d_dt);
  void *dp;
  case_begin("gemm.%s.%s%s.ta%dtb%d.%lldx%lldx%lld.%s%s%s%s%s", pair_name(g, pn, sizeof pn),
             g->a.dt == XTE_DTYPE_E4M3 ? "e4" : "e5", g->b.dt == XTE_DTYPE_E4M3 ? "e4" : "e5",
             g->ta, g->tb, (long long)g->M, (long long)g->N, (long long)g->K, dtn(g->d_dt),
             acc_n[g->acc], g->bias ? ".bias" : "", g->ld_d ? ".ld" : "", tag);
  if (!make_operand(&A, g->ta ? g->K : g->M, g->ta ? g->M : g->K, &g->a, 1.0f, g->specials) ||
      !make_operand(&B, g->tb ? g->K : g->N, g->tb ? g->N : g->K, &g->b, 1.0f, g->specials)) {
    mem_release(mark);
    return;
  }
  cfg.trans_a = g->ta;
  cfg.trans_b = g->tb;
  dp = xalloc(ds * (size_t)(g->M > 0 ? (g->M - 1) * ldd + g->N : 1));
  D = t2(dp, g->d_dt, g->M, g->N);
  if (g->ld_d) D.ld = ldd;
  memset(&C, 0, sizeof C);
  if (g->acc == 3) {
    gen(dp, g->d_dt, g->M > 0 ? (g->M - 1) * ldd + g->N : 0, P_UNIT, 50.0f);
    C = D;
    cfg.accumulate = 1;
  } else if (g->acc) {
    xte_dtype cdt = g->acc == 1 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
    C = t2(gen_new(cdt, g->M * g->N, P_UNIT, 50.0f), cdt, g->M, g->N);
    cfg.accumulate = 1;
  }
  out_buf("D", dp, ds * (size_t)(g->M > 0 ? (g->M - 1) * ldd + g->N : 0), g->d_dt, g->acc != 3);
  if (g->bias) {
    bias = t1(gen_new(XTE_DTYPE_FP32, g->N, P_UNIT, 10.0f), XTE_DTYPE_FP32, g->N);
    cfg.bias = &bias;
  }
  case_end(xte_gemm(&A, &B, cfg.accumulate ? &C : NULL, &D, &cfg, NULL), 1);
  mem_release(mark);
}

static void gemm_cases(void) {
  static const xte_scaling_mode pairs[][2] = {
      {XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_128x128},
      {XTE_SCALING_BLOCK_128x128, XTE_SCALING_BLOCK_1x128},
      {XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_1x128},
      {XTE_SCALING_PER_TENSOR, XTE_SCALING_PER_TENSOR},
      {XTE_SCALING_MXFP8_1x32, XTE_SCALING_MXFP8_1x32},
      {XTE_SCALING_BLOCK_128x128, XTE_SCALING_BLOCK_128x128}, /* refused */
      {XTE_SCALING_PER_TENSOR, XTE_SCALING_BLOCK_1x128},      /* refused */
  };
  static const xte_dtype dpairs[4][2] = {{XTE_DTYPE_E4M3, XTE_DTYPE_E4M3},
                                         {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2},
                                         {XTE_DTYPE_E5M2, XTE_DTYPE_E4M3},
                                         {XTE_DTYPE_E5M2, XTE_DTYPE_E5M2}};
  static const int64_t ms_full[] = {1, 2, 4, 5, 8, 9, 16, 32, 33, 130, 257};
  static const int64_t ms_small[] = {1, 5, 8, 33, 70};
  const int64_t *ms = g_small ? ms_small : ms_full;
  int nm = g_small ? 5 : 11;
  const int64_t n1 = g_small ? 40 : 72, k1 = g_small ? 260 : 300;
  int p, d, i, t, k;
  gspec g;
  /* 1. every pair x dtype pair x rows, TN, bf16 out */
  for (p = 0; p < 7; p++)
    for (d = 0; d < 4; d++)
      for (i = 0; i < nm; i++) {
        if ((p >= 5 || d == 3) && i > 0) continue; /* refused: listed once */
        g = gspec_make(pairs[p][0], pairs[p][1], dpairs[d][0], dpairs[d][1], ms[i], n1, k1);
        gemm_case(&g, "");
      }
  /* 2. transposes (each pair, e4 x e4 and e5 x e4) */
  for (p = 0; p < 5; p++)
    for (t = 1; t < 4; t++)
      for (i = 0; i < 2; i++) {
        g = gspec_make(pairs[p][0], pairs[p][1], i ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3,
                       XTE_DTYPE_E4M3, i ? 130 : 6, 40, 260);
        g.ta = t & 1;
        g.tb = t >> 1;
        if (g_small && i) g.M = 40;
        gemm_case(&g, "");
      }
  /* 3. epilogues: C fp32 / bf16 / in place, bias, D fp32 / bf16, ld */
  for (p = 0; p < 5; p += g_small ? 4 : 1)
    for (k = 0; k < 2; k++)
      for (i = 0; i < 7; i++) {
        g = gspec_make(pairs[p][0], pairs[p][1], XTE_DTYPE_E4M3, XTE_DTYPE_E4M3,
                       k ? (g_small ? 40 : 140) : 3, g_small ? 40 : 56, 200);
        g.d_dt = (i & 1) ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
        g.acc = i < 2 ? 1 + i : i < 4 ? 3 : i == 4 ? 0 : i == 5 ? 2 : 1;
        g.bias = i >= 4;
        g.ld_d = i == 6 ? 9 : 0;
        if (g.ld_d) g.acc = 0;
        gemm_case(&g, "");
      }
  /* 4. scale layouts of both operands */
  {
    static const xte_scale_layout lays[3] = {XTE_SCALE_LAYOUT_COMPACT, XTE_SCALE_LAYOUT_TE_GEMM,
                                             XTE_SCALE_LAYOUT_DEEPGEMM};
    int la, lb;
    for (p = 0; p < 3; p++)
      for (la = 0; la < 3; la++)
        for (lb = 0; lb < 3; lb++)
          for (i = 0; i < 2; i++) {
            char tag[64];
            if (g_small && i) continue;
            g = gspec_make(pairs[p][0], pairs[p][1], XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, i ? 130 : 20,
                           48, g_small ? 260 : 300);
            g.a.lay = lays[la];
            g.b.lay = lays[lb];
            g.tb = i; /* a transposed B reads the other copy's layout */
            snprintf(tag, sizeof tag, ".%s_%s", layout_name(lays[la]), layout_name(lays[lb]));
            gemm_case(&g, tag);
          }
    for (la = 0; la < 2; la++)
      for (lb = 0; lb < 2; lb++)
        for (t = 0; t < 2; t++) {
          char tag[64];
          g = gspec_make(XTE_SCALING_MXFP8_1x32, XTE_SCALING_MXFP8_1x32, XTE_DTYPE_E4M3,
                         XTE_DTYPE_E5M2, t ? 131 : 7, 40, 200);
          g.a.lay = la ? XTE_SCALE_LAYOUT_MX_SWIZZLED : XTE_SCALE_LAYOUT_COMPACT;
          g.b.lay = lb ? XTE_SCALE_LAYOUT_MX_SWIZZLED : XTE_SCALE_LAYOUT_COMPACT;
          g.ta = t;
          snprintf(tag, sizeof tag, ".%s_%s", layout_name(g.a.lay), layout_name(g.b.lay));
          gemm_case(&g, tag);
        }
  }
  /* 5. other recipes of the operands */
  {
    static const xte_recipe recs[4] = {XTE_RECIPE_DEEPGEMM, XTE_RECIPE_DEEPGEMM_UE8M0,
                                       XTE_RECIPE_MTFP8, XTE_RECIPE_MX_OCP};
    for (k = 0; k < 4; k++)
      for (p = 0; p < 3; p++)
        for (t = 0; t < 4; t++) {
          char tag[64];
          if (k == 3 && p > 0) continue;
          if (g_small && ((t != 0 && t != 3) || p == 1)) continue;
          g = k == 3 ? gspec_make(XTE_SCALING_MXFP8_1x32, XTE_SCALING_MXFP8_1x32, XTE_DTYPE_E4M3,
                                  XTE_DTYPE_E4M3, g_small ? 9 : 24, 40, 300)
                     : gspec_make(pairs[p][0], pairs[p][1], XTE_DTYPE_E4M3, XTE_DTYPE_E4M3,
                                  g_small ? 9 : 24, 40, 300);
          g.a.rec = g.b.rec = recs[k];
          g.ta = t & 1;
          g.tb = t >> 1;
          if (t == 3) g.M = g_small ? 40 : 140;
          snprintf(tag, sizeof tag, ".%s", recipe_name(recs[k]));
          gemm_case(&g, tag);
        }
    /* per-tensor delayed */
    g = gspec_make(XTE_SCALING_PER_TENSOR, XTE_SCALING_PER_TENSOR, XTE_DTYPE_E5M2, XTE_DTYPE_E4M3,
                   50, 40, 300);
    g.a.rec = g.b.rec = XTE_RECIPE_TE_DELAYED;
    gemm_case(&g, ".te_del");
  }
  /* 6. one copy only (the other absent): the operand read across its rows (strided) where the
   * blocks allow it (128x128, per-tensor), else refused */
  for (p = 0; p < 5; p++)
    for (k = 0; k < 4; k++)
      for (i = 0; i < 2; i++) {
        static const char *vn[4] = {".a_col_only", ".a_row_only", ".b_col_only", ".b_row_only"};
        if (g_small && i) continue;
        g = gspec_make(pairs[p][0], pairs[p][1], XTE_DTYPE_E4M3, XTE_DTYPE_E4M3, i ? 70 : 6, 40,
                       260);
        if (k < 2) {
          g.a.copies = k ? C_ROW : C_COL;
          g.ta = k;
        } else {
          g.b.copies = k == 3 ? C_ROW : C_COL;
          g.tb = k == 3;
        }
        gemm_case(&g, vn[k]);
      }
  /* 7. shapes: empty, K = 1, one K block, 3 K panels, N past one N panel, M past one M chunk */
  {
    static const int64_t shp[][3] = {{0, 40, 128},    {16, 0, 128},   {16, 40, 0},  {5, 40, 0},
                                     {9, 17, 1},      {37, 33, 32},   {3, 24, 129}, {40, 24, 129},
                                     {20, 40, 600},   {200, 40, 600}, {1, 1, 1000}, {40, 1600, 128},
                                     {1100, 24, 130}, {6, 1600, 256}};
    int ns = g_small ? 9 : (int)(sizeof shp / sizeof shp[0]);
    for (k = 0; k < ns; k++)
      for (p = 0; p < 5; p++)
        for (d = 0; d < 2; d++) {
          if (k >= 11 && !(p == 0 || p == 4)) continue;
          if (k >= 11 && d) continue;
          g = gspec_make(pairs[p][0], pairs[p][1], d ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3,
                         XTE_DTYPE_E4M3, shp[k][0], shp[k][1], shp[k][2]);
          g.d_dt = d ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
          gemm_case(&g, "");
        }
  }
  /* 8. special values everywhere: many NaN / inf / zero codes */
  for (p = 0; p < 5; p++)
    for (d = 0; d < 3; d++) {
      g = gspec_make(pairs[p][0], pairs[p][1], dpairs[d][0], dpairs[d][1],
                     d == 2 ? (g_small ? 33 : 70) : 7, 40, 300);
      g.specials = 40;
      gemm_case(&g, ".specials");
    }
}

/* ------------------------------------------------------------------ grouped GEMMs */

typedef struct ggspec {
  xte_gemm_grouping kind;
  xte_scaling_mode ma, mb;
  xte_dtype da, db;
  int G;
  int64_t sizes[8]; /* rows (contiguous, masked valid rows) or K per group */
  int64_t align;    /* contiguous */
  int64_t mmax;     /* masked */
  int64_t M, N, K;  /* K-grouped: M, N; others: N, K */
  int tb, acc, bias;
  xte_dtype d_dt;
} ggspec;

static void grouped_case(const ggspec *s) {
  int mark = mem_mark();
  xte_qtensor A, B;
  xte_tensor C, D, bias, mm;
  xte_gemm_config cfg = xte_gemm_config_default();
  xte_gemm_groups gr;
  int64_t rows = 0, g, Ksum = 0, drows;
  int32_t *mmv;
  char sz[80] = "";
  opspec oa, ob;
  static const char *kinds[] = {"contig", "masked", "kgroup"};
  for (g = 0; g < s->G; g++) {
    size_t l = strlen(sz);
    snprintf(sz + l, sizeof sz - l, "%s%lld", g ? "_" : "", (long long)s->sizes[g]);
  }
  case_begin("gemm_grouped.%s.%s_%s.%s%s.g%s.a%lld.m%lld.%lldx%lldx%lld.%s%s%s%s", kinds[s->kind],
             mode_name(s->ma), mode_name(s->mb), s->da == XTE_DTYPE_E4M3 ? "e4" : "e5",
             s->db == XTE_DTYPE_E4M3 ? "e4" : "e5", sz, (long long)s->align, (long long)s->mmax,
             (long long)s->M, (long long)s->N, (long long)s->K, dtn(s->d_dt), s->tb ? ".tb" : "",
             s->acc ? ".acc" : "", s->bias ? ".bias" : "");
  memset(&oa, 0, sizeof oa);
  oa.mode = s->ma;
  oa.rec = s->ma == XTE_SCALING_MXFP8_1x32   ? XTE_RECIPE_MX_TE
           : s->ma == XTE_SCALING_PER_TENSOR ? XTE_RECIPE_TE_CURRENT
                                             : XTE_RECIPE_TE_BLOCK;
  oa.lay = XTE_SCALE_LAYOUT_COMPACT;
  oa.dt = s->da;
  oa.copies = C_BOTH;
  ob = oa;
  ob.mode = s->mb;
  ob.rec = s->mb == XTE_SCALING_MXFP8_1x32   ? XTE_RECIPE_MX_TE
           : s->mb == XTE_SCALING_PER_TENSOR ? XTE_RECIPE_TE_CURRENT
                                             : XTE_RECIPE_TE_BLOCK;
  ob.dt = s->db;
  memset(&gr, 0, sizeof gr);
  gr.kind = s->kind;
  gr.num_groups = s->G;
  gr.group_sizes = s->sizes;
  gr.alignment = s->align;
  mmv = (int32_t *)xalloc(4 * (size_t)s->G);
  for (g = 0; g < s->G; g++) mmv[g] = (int32_t)s->sizes[g];
  mm = t1(mmv, XTE_DTYPE_INT32, s->G);
  gr.masked_m = &mm;
  if (s->kind == XTE_GEMM_GROUPED_K) {
    for (g = 0; g < s->G; g++) Ksum += s->sizes[g];
    /* dY [Ksum, M], X [Ksum, N]: D[g] = dY_g^T X_g (trans_a = trans_b = 1) */
    if (!make_operand(&A, Ksum, s->M, &oa, 1.0f, 3) ||
        !make_operand(&B, Ksum, s->N, &ob, 1.0f, 3)) {
      mem_release(mark);
      return;
    }
    cfg.trans_a = cfg.trans_b = 1;
    drows = s->G * s->M;
  } else {
    for (g = 0; g < s->G; g++) {
      int64_t al = s->align > 1 ? s->align : 1;
      rows += s->kind == XTE_GEMM_GROUPED_MASKED ? s->mmax : (s->sizes[g] + al - 1) / al * al;
    }
    /* B [G, N, K] (trans_b = 0) or [G, K, N]: the quantized X is [G * N, K] or [G * K, N] */
    if (!make_operand(&A, rows, s->K, &oa, 1.0f, 3) ||
        !make_operand(&B, s->G * (s->tb ? s->K : s->N), s->tb ? s->N : s->K, &ob, 1.0f, 3)) {
      mem_release(mark);
      return;
    }
    cfg.trans_b = s->tb;
    drows = rows;
  }
  D = out2("D", s->d_dt, drows, s->N);
  memset(&C, 0, sizeof C);
  if (s->acc) {
    C = t2(gen_new(XTE_DTYPE_FP32, drows * s->N, P_UNIT, 20.0f), XTE_DTYPE_FP32, drows, s->N);
    cfg.accumulate = 1;
  }
  if (s->bias) {
    bias = t1(gen_new(XTE_DTYPE_FP32, s->N, P_UNIT, 5.0f), XTE_DTYPE_FP32, s->N);
    cfg.bias = &bias;
  }
  case_end(xte_gemm_grouped(&A, &B, s->acc ? &C : NULL, &D, &gr, &cfg, NULL), 1);
  mem_release(mark);
}

static void grouped_cases(void) {
  static const xte_scaling_mode pairs[4][2] = {{XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_128x128},
                                               {XTE_SCALING_BLOCK_1x128, XTE_SCALING_BLOCK_1x128},
                                               {XTE_SCALING_MXFP8_1x32, XTE_SCALING_MXFP8_1x32},
                                               {XTE_SCALING_PER_TENSOR, XTE_SCALING_PER_TENSOR}};
  ggspec s;
  int p, v;
  /* contiguous */
  for (p = 0; p < 4; p++)
    for (v = 0; v < 6; v++) {
      static const int64_t al[6] = {128, 0, 16, 1, 128, 32};
      if (g_small && v > 2) continue;
      memset(&s, 0, sizeof s);
      s.kind = XTE_GEMM_GROUPED_CONTIGUOUS;
      s.ma = pairs[p][0];
      s.mb = pairs[p][1];
      s.da = v == 5 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
      s.db = XTE_DTYPE_E4M3;
      s.G = 5;
      s.sizes[0] = 0;
      s.sizes[1] = 1;
      s.sizes[2] = g_small ? 40 : 137;
      s.sizes[3] = 8;
      s.sizes[4] = 33;
      s.align = al[v];
      s.N = g_small ? 40 : 72;
      s.tb = v == 2 || v == 4;
      s.K = s.tb ? 256 : g_small ? 260 : 300; /* B [G, K, N]: K a multiple of the K block */
      s.acc = v == 3 || v == 4;
      s.bias = v >= 3;
      s.d_dt = (v & 1) ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
      grouped_case(&s);
    }
  /* masked */
  for (p = 0; p < 4; p++)
    for (v = 0; v < 3; v++) {
      if (g_small && v == 2) continue;
      memset(&s, 0, sizeof s);
      s.kind = XTE_GEMM_GROUPED_MASKED;
      s.ma = pairs[p][0];
      s.mb = pairs[p][1];
      s.da = XTE_DTYPE_E4M3;
      s.db = v == 1 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
      s.G = 4;
      s.mmax = v == 2 ? 130 : 40;
      s.sizes[0] = v == 2 ? 130 : 0;
      s.sizes[1] = v == 2 ? 1 : 40;
      s.sizes[2] = v == 2 ? 64 : 3;
      s.sizes[3] = v == 2 ? 0 : 17;
      s.N = 48;
      s.tb = v == 1;
      s.K = s.tb ? 384 : 260;
      s.acc = v == 1;
      s.bias = v == 2;
      s.d_dt = v == 1 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
      grouped_case(&s);
    }
  /* K-grouped */
  for (p = 0; p < 4; p++)
    for (v = 0; v < 3; v++) {
      static const int64_t ks[3][4] = {{128, 0, 200, 0}, {256, 44, 0, 0}, {128, 128, 128, 5}};
      static const int gs[3] = {3, 2, 4};
      int g;
      if (p == 0) continue; /* 128x128 A: not a weight gradient */
      if (g_small && v == 2) continue;
      memset(&s, 0, sizeof s);
      s.kind = XTE_GEMM_GROUPED_K;
      s.ma = pairs[p][0];
      s.mb = pairs[p][1];
      s.da = v == 1 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
      s.db = XTE_DTYPE_E4M3;
      s.G = gs[v];
      for (g = 0; g < s.G; g++) s.sizes[g] = p == 2 && ks[v][g] == 200 ? 192 : ks[v][g];
      s.M = v == 2 ? 9 : 40;
      s.N = 24 + 8 * v;
      s.acc = v != 1;
      s.bias = v == 2;
      s.d_dt = v == 1 ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
      grouped_case(&s);
    }
}

/* ================================================================== attention */

typedef struct aspec {
  xte_attn_layout layout;
  xte_dtype dt;     /* Q, K, V */
  xte_dtype out_dt; /* O (e4m3: bf16 / fp16 / fp32), else dt */
  int64_t b, sq, skv, hq, hkv, dqk, dv;
  xte_attn_mask mask;
  int64_t wl, wr;
  float softcap, scale;
  int alibi, pad, descale;
  int nlen;             /* THD sequences */
  int32_t lq[8], lk[8]; /* THD lengths; BSHD padding lengths */
  int specials;
  const char *tag;
} aspec;

static aspec aspec_make(xte_dtype dt, int64_t b, int64_t s, int64_t hq, int64_t hkv, int64_t d,
                        xte_attn_mask mask) {
  aspec a;
  memset(&a, 0, sizeof a);
  a.layout = XTE_ATTN_LAYOUT_BSHD;
  a.dt = a.out_dt = dt;
  a.b = b;
  a.sq = a.skv = s;
  a.hq = hq;
  a.hkv = hkv;
  a.dqk = a.dv = d;
  a.mask = mask;
  a.wl = a.wr = -1;
  a.tag = "";
  return a;
}

static xte_tensor attn_t(void *p, xte_dtype dt, const aspec *a, int64_t s, int64_t h, int64_t d) {
  xte_tensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.dtype = dt;
  if (a->layout == XTE_ATTN_LAYOUT_THD) {
    t.rank = 3;
    t.shape[0] = s;
    t.shape[1] = h;
    t.shape[2] = d;
  } else {
    t.rank = 4;
    t.shape[0] = a->layout == XTE_ATTN_LAYOUT_BSHD ? a->b : s;
    t.shape[1] = a->layout == XTE_ATTN_LAYOUT_BSHD ? s : a->b;
    t.shape[2] = h;
    t.shape[3] = d;
  }
  return t;
}

static void attn_case(const aspec *a, int bwd) {
  static const char *lays[] = {"bshd", "sbhd", "thd"};
  static const char *masks[] = {"none", "causal", "causal_br"};
  int mark = mem_mark();
  xte_attention_config cfg = xte_attention_config_default();
  int thd = a->layout == XTE_ATTN_LAYOUT_THD;
  int64_t b = thd ? 1 : a->b, sq = a->sq, skv = a->skv, i;
  int64_t nq, nk, nv, no, nl;
  size_t es = xte_dtype_size(a->dt), eo = xte_dtype_size(a->out_dt);
  xte_tensor Q, K, V, O, L, dO, dQ, dK, dV;
  void *q, *k, *v, *o, *l;
  xte_status st;
  int64_t nsq = a->sq, nskv = a->skv; /* THD: the tokens (those past the last sequence too) */
  if (thd)
    for (i = 0; i < a->nlen; i++) {
      nsq += a->lq[i];
      nskv += a->lk[i];
    }
  case_begin("attn_%s.%s.%s%s%s.b%lld.s%lldx%lld.h%lldx%lld.d%lldx%lld.%s%s%s%s%s%s%s%s",
             bwd ? "bwd" : "fwd", lays[a->layout], dtn(a->dt), a->out_dt != a->dt ? "_" : "",
             a->out_dt != a->dt ? dtn(a->out_dt) : "", (long long)(thd ? a->nlen : a->b),
             (long long)nsq, (long long)nskv, (long long)a->hq, (long long)a->hkv,
             (long long)a->dqk, (long long)a->dv, masks[a->mask],
             a->wl >= 0 || a->wr >= 0 ? ".win" : "", a->softcap > 0 ? ".softcap" : "",
             a->alibi ? ".alibi" : "", a->pad ? ".pad" : "", a->descale ? ".descale" : "",
             a->specials ? ".specials" : "", a->tag);
  cfg.layout = a->layout;
  cfg.mask = a->mask;
  cfg.window_left = a->wl;
  cfg.window_right = a->wr;
  cfg.softcap = a->softcap;
  cfg.softmax_scale = a->scale;
  if (thd || a->pad) {
    int n = thd ? a->nlen : (int)a->b;
    int32_t *cq = (int32_t *)xalloc(4 * (size_t)(n + 1)),
            *ck = (int32_t *)xalloc(4 * (size_t)(n + 1));
    int32_t mq = 0, mk = 0;
    for (i = 0; i < n; i++) { /* THD: the sequences; BSHD / SBHD: each entry's valid length */
      cq[i + 1] = cq[i] + a->lq[i];
      ck[i + 1] = ck[i] + a->lk[i];
      if (a->lq[i] > mq) mq = a->lq[i];
      if (a->lk[i] > mk) mk = a->lk[i];
    }
    cfg.cu_seqlens_q = cq;
    cfg.cu_seqlens_kv = ck;
    if (thd) {
      cfg.batch = n;
      cfg.max_seqlen_q = mq;
      cfg.max_seqlen_kv = mk;
      sq = cq[n] + a->sq; /* a->sq / a->skv: tokens past the last sequence */
      skv = ck[n] + a->skv;
    }
  }
  if (a->alibi) {
    float *sl = (float *)xalloc(4 * (size_t)a->hq);
    for (i = 0; i < a->hq; i++) sl[i] = ldexpf(1.0f, -(int)(i + 1));
    cfg.alibi_slopes = sl;
  }
  nq = b * sq * a->hq * a->dqk;
  nk = b * skv * a->hkv * a->dqk;
  nv = b * skv * a->hkv * a->dv;
  no = b * sq * a->hq * a->dv;
  nl = b * sq * a->hq;
  if (a->dt == XTE_DTYPE_E4M3) {
    q = xalloc((size_t)nq);
    k = xalloc((size_t)nk);
    v = xalloc((size_t)nv);
    gen_e4m3_codes((uint8_t *)q, nq);
    gen_e4m3_codes((uint8_t *)k, nk);
    gen_e4m3_codes((uint8_t *)v, nv);
    if (a->descale) {
      int64_t nd = (thd ? a->nlen : a->b) * a->hkv;
      float *d3 = (float *)xalloc(4 * (size_t)(3 * nd));
      for (i = 0; i < 3 * nd; i++) d3[i] = ldexpf(1.0f + (float)rndn(16) / 16.0f, -(int)rndn(4));
      cfg.descale_q = d3;
      cfg.descale_k = d3 + nd;
      cfg.descale_v = d3 + 2 * nd;
    }
  } else {
    q = gen_new(a->dt, nq, P_UNIT, 1.5f);
    k = gen_new(a->dt, nk, P_UNIT, 1.5f);
    v = gen_new(a->dt, nv, P_UNIT, 1.0f);
    if (a->specials) { /* NaN / inf / huge values in a few places */
      static const uint32_t sp[] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x501502F9u,
                                    0x00000001u};
      for (i = 0; i < 6; i++) {
        float f = from_bits(sp[rndn(5)]);
        int64_t pos;
        void *tgt = i % 3 == 0 ? q : i % 3 == 1 ? k : v;
        int64_t n = i % 3 == 0 ? nq : i % 3 == 1 ? nk : nv;
        pos = (int64_t)(rnd() % (uint32_t)n);
        if (a->dt == XTE_DTYPE_FP32)
          ((float *)tgt)[pos] = f;
        else
          ((uint16_t *)tgt)[pos] = a->dt == XTE_DTYPE_BF16 ? f2bf(f) : f2h(f);
      }
    }
  }
  Q = attn_t(q, a->dt, a, sq, a->hq, a->dqk);
  K = attn_t(k, a->dt, a, skv, a->hkv, a->dqk);
  V = attn_t(v, a->dt, a, skv, a->hkv, a->dv);
  o = xalloc(eo * (size_t)no);
  l = xalloc(4 * (size_t)nl);
  O = attn_t(o, a->out_dt, a, sq, a->hq, a->dv);
  if (thd) {
    L = t2(l, XTE_DTYPE_FP32, sq, a->hq);
  } else {
    memset(&L, 0, sizeof L);
    L.data = l;
    L.dtype = XTE_DTYPE_FP32;
    L.rank = 3;
    L.shape[0] = b;
    L.shape[1] = a->hq;
    L.shape[2] = sq;
  }
  if (!bwd) {
    out_buf("O", o, eo * (size_t)no, a->out_dt, 1);
    out_buf("lse", l, 4 * (size_t)nl, XTE_DTYPE_FP32, 1);
    case_end(xte_attention_fwd(&Q, &K, &V, &O, &L, &cfg, NULL), 1);
    mem_release(mark);
    return;
  }
  if (!setup_ok(xte_attention_fwd(&Q, &K, &V, &O, &L, &cfg, NULL), "attention_fwd")) {
    mem_release(mark);
    return;
  }
  dO = attn_t(gen_new(a->dt, no, P_UNIT, 1.0f), a->dt, a, sq, a->hq, a->dv);
  {
    void *dq = xalloc(es * (size_t)nq), *dk = xalloc(es * (size_t)nk),
         *dvp = xalloc(es * (size_t)nv);
    dQ = attn_t(dq, a->dt, a, sq, a->hq, a->dqk);
    dK = attn_t(dk, a->dt, a, skv, a->hkv, a->dqk);
    dV = attn_t(dvp, a->dt, a, skv, a->hkv, a->dv);
    out_buf("dQ", dq, es * (size_t)nq, a->dt, 1);
    out_buf("dK", dk, es * (size_t)nk, a->dt, 1);
    out_buf("dV", dvp, es * (size_t)nv, a->dt, 1);
  }
  st = xte_attention_bwd(&Q, &K, &V, &O, &dO, &L, &dQ, &dK, &dV, &cfg, NULL);
  case_end(st, 1);
  mem_release(mark);
}

static void attn_both(const aspec *a) {
  attn_case(a, 0);
  if (a->dt != XTE_DTYPE_E4M3) attn_case(a, 1);
}

static void attention_cases(void) {
  static const xte_dtype dts[3] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  int i, m;
  aspec a;
  /* BSHD, GQA, odd length: each dtype, causal and not */
  for (i = 0; i < 3; i++)
    for (m = 0; m < 2; m++) {
      a = g_small
              ? aspec_make(dts[i], 1, 37, 2, 1, 64, m ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE)
              : aspec_make(dts[i], 2, 77, 4, 2, 64, m ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE);
      attn_both(&a);
    }
  /* s_q != s_kv, bottom-right causal, head dim 40 */
  for (i = 0; i < 3; i++) {
    if (g_small && i == 2) continue;
    a = aspec_make(dts[i], 1, 33, 2, 2, 40, XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
    a.skv = g_small ? 70 : 130;
    attn_both(&a);
    a.mask = XTE_ATTN_MASK_CAUSAL; /* top-left with s_q < s_kv */
    attn_both(&a);
  }
  /* SBHD, MQA, d_qk != d_v, sliding window */
  for (i = 0; i < 2; i++) {
    a = aspec_make(dts[i], 3, g_small ? 33 : 65, 2, 1, 48, XTE_ATTN_MASK_NONE);
    a.layout = XTE_ATTN_LAYOUT_SBHD;
    a.dv = 24;
    a.wl = 16;
    a.wr = 3;
    attn_both(&a);
  }
  /* THD varlen: empty sequences, a token outside every sequence */
  for (i = 0; i < 3; i++)
    for (m = 0; m < 2; m++) {
      static const int32_t lq[5] = {5, 0, 70, 130, 33}, lk[5] = {5, 3, 70, 140, 64};
      int j;
      if ((g_small && (i == 2 || m == 0)) || (i > 0 && m == 0)) continue;
      a = aspec_make(dts[i], 1, 1, g_small ? 2 : 4, g_small ? 1 : 2, 64,
                     m ? XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT : XTE_ATTN_MASK_NONE);
      a.layout = XTE_ATTN_LAYOUT_THD;
      a.nlen = 5;
      for (j = 0; j < 5; j++) {
        a.lq[j] = g_small ? lq[j] / 2 : lq[j];
        a.lk[j] = g_small ? lk[j] / 2 : lk[j];
      }
      a.sq = 1;
      a.skv = 1;
      attn_both(&a);
    }
  /* softcap, ALiBi, explicit scale */
  for (i = 0; i < 2; i++) {
    a = aspec_make(dts[i], 1, g_small ? 50 : 80, 2, 2, 32, XTE_ATTN_MASK_CAUSAL);
    a.softcap = 30.0f;
    a.alibi = 1;
    a.scale = 0.3f;
    attn_both(&a);
    a.softcap = 0.0f; /* ALiBi alone (the S store of the backward) */
    attn_both(&a);
  }
  /* BSHD padding */
  for (i = 0; i < 2; i++) {
    a = aspec_make(dts[i], 2, 37, 2, 1, 64, i ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE);
    a.pad = 1;
    a.lq[0] = 20;
    a.lq[1] = 37;
    a.lk[0] = 37;
    a.lk[1] = 11;
    attn_both(&a);
  }
  /* MLA head dims, wide and tiny heads */
  a = aspec_make(XTE_DTYPE_BF16, 1, g_small ? 17 : 33, 2, g_small ? 1 : 2, 192,
                 XTE_ATTN_MASK_CAUSAL);
  a.dv = 128;
  attn_both(&a);
  if (!g_small) {
    a = aspec_make(XTE_DTYPE_FP32, 1, 20, 2, 1, 256, XTE_ATTN_MASK_NONE);
    attn_both(&a);
    a = aspec_make(XTE_DTYPE_FP16, 1, 20, 2, 1, 256, XTE_ATTN_MASK_CAUSAL);
    attn_both(&a);
  }
  a = aspec_make(XTE_DTYPE_FP32, 2, 19, 3, 1, 3, XTE_ATTN_MASK_NONE);
  attn_both(&a);
  a = aspec_make(XTE_DTYPE_BF16, 1, 1, 2, 2, 16, XTE_ATTN_MASK_CAUSAL); /* one token */
  attn_both(&a);
  /* longer: several KV blocks and query tiles */
  for (i = 0; i < 2; i++) {
    if (g_small && i) continue;
    a = aspec_make(dts[i], 1, g_small ? 70 : 200, 2, 1, 64, XTE_ATTN_MASK_CAUSAL);
    attn_both(&a);
  }
  /* special values */
  for (i = 0; i < 3; i++) {
    a = aspec_make(dts[i], 1, 40, 2, 2, 32, i == 1 ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE);
    a.specials = 1;
    attn_both(&a);
  }
  /* FP8 e4m3 forward: output bf16 / fp16 / fp32, descales or none; THD */
  for (i = 0; i < 3; i++)
    for (m = 0; m < 2; m++) {
      a = aspec_make(XTE_DTYPE_E4M3, 2, 37, g_small ? 2 : 4, g_small ? 1 : 2, 64,
                     m ? XTE_ATTN_MASK_CAUSAL : XTE_ATTN_MASK_NONE);
      a.out_dt = i == 0 ? XTE_DTYPE_BF16 : i == 1 ? XTE_DTYPE_FP16 : XTE_DTYPE_FP32;
      a.descale = m == 0 || i == 0;
      attn_both(&a);
    }
  {
    static const int32_t lq[3] = {17, 0, 40}, lk[3] = {17, 5, 64};
    int j;
    a = aspec_make(XTE_DTYPE_E4M3, 1, 0, 2, 2, 48, XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
    a.layout = XTE_ATTN_LAYOUT_THD;
    a.out_dt = XTE_DTYPE_BF16;
    a.nlen = 3;
    for (j = 0; j < 3; j++) {
      a.lq[j] = lq[j];
      a.lk[j] = lk[j];
    }
    a.descale = 1;
    attn_both(&a);
    a.out_dt = XTE_DTYPE_E4M3; /* refused: no fp8 output */
    a.tag = ".fp8_out";
    attn_case(&a, 0);
  }
}

/* ================================================================== MoE */

static const char *score_name(xte_router_score s) {
  static const char *n[] = {"softmax", "sigmoid", "sqrtsoftplus"};
  return (unsigned)s < 3 ? n[s] : "?";
}

typedef struct rspec {
  int64_t T, E;
  int topk, pre, groups, gtopk, bias;
  xte_router_score score;
  float sf;
  xte_dtype ldt, idt, gdt;
  int prof;
} rspec;

static void router_fill_bias(float *b, int64_t E) {
  int64_t e;
  for (e = 0; e < E; e++) b[e] = (float)((int)rndn(16) - 4) * 0.0625f;
}

static void router_case(const rspec *r, int bwd) {
  int mark = mem_mark();
  xte_router_config cfg = xte_router_config_default();
  xte_tensor logits, bias;
  xte_router_outputs o;
  void *x;
  case_begin("router_%s.%s%s.T%lld.E%lld.k%d.g%d_%d%s.sf%g.%s.%s%s%s", bwd ? "bwd" : "fwd",
             score_name(r->score), r->pre ? "_pre" : "", (long long)r->T, (long long)r->E, r->topk,
             r->groups, r->gtopk, r->bias ? ".bias" : "", (double)r->sf, dtn(r->ldt),
             bwd ? dtn(r->gdt) : dtn(r->idt), r->prof == P_TIES ? ".ties" : "",
             r->prof == P_WILD ? ".specials" : "");
  x = gen_new(r->ldt, r->T * r->E, r->prof, 4.0f);
  logits = t2(x, r->ldt, r->T, r->E);
  cfg.topk = r->topk;
  cfg.score_function = r->score;
  cfg.use_pre_softmax = r->pre;
  cfg.num_groups = r->groups;
  cfg.group_topk = r->gtopk;
  cfg.scaling_factor = r->sf;
  if (r->bias) {
    float *b = (float *)xalloc(4 * (size_t)r->E);
    router_fill_bias(b, r->E);
    bias = t1(b, XTE_DTYPE_FP32, r->E);
  }
  memset(&o, 0, sizeof o);
  if (!bwd) {
    o.probs = out2("probs", XTE_DTYPE_FP32, r->T, r->E);
    o.routing_map = out2("routing_map", XTE_DTYPE_UINT8, r->T, r->E);
    o.routing_bits = out2("routing_bits", XTE_DTYPE_UINT8, r->T, (r->E + 7) / 8);
    o.topk_idx = out2("topk_idx", r->idt, r->T, r->topk);
    o.topk_weights = out2("topk_weights", XTE_DTYPE_FP32, r->T, r->topk);
    o.saved = out2("saved", XTE_DTYPE_FP32, r->T, r->E);
    case_end(xte_router_forward(&logits, r->bias ? &bias : NULL, &cfg, &o, NULL), 1);
  } else {
    xte_tensor gp, gl;
    o.routing_map = t2(xalloc((size_t)(r->T * r->E)), XTE_DTYPE_UINT8, r->T, r->E);
    o.saved = t2(xalloc(4 * (size_t)(r->T * r->E)), XTE_DTYPE_FP32, r->T, r->E);
    if (!setup_ok(xte_router_forward(&logits, r->bias ? &bias : NULL, &cfg, &o, NULL),
                  "router_forward")) {
      mem_release(mark);
      return;
    }
    gp = t2(gen_new(XTE_DTYPE_FP32, r->T * r->E, P_UNIT, 1.0f), XTE_DTYPE_FP32, r->T, r->E);
    gl = out2("grad_logits", r->gdt, r->T, r->E);
    case_end(xte_router_backward(&gp, &o.routing_map, &o.saved, &logits, &cfg, &gl, NULL), 1);
  }
  mem_release(mark);
}

static void aux_scores_case(int64_t T, int64_t E, int topk, xte_router_score sc, int bwd) {
  int mark = mem_mark();
  xte_tensor logits = t2(gen_new(XTE_DTYPE_FP32, T * E, P_UNIT, 6.0f), XTE_DTYPE_FP32, T, E);
  case_begin("aux_scores_%s.%s.T%lld.E%lld.k%d", bwd ? "bwd" : "fwd", score_name(sc), (long long)T,
             (long long)E, topk);
  if (!bwd) {
    xte_tensor s = out2("scores", XTE_DTYPE_FP32, T, E),
               m = out2("routing_map", XTE_DTYPE_UINT8, T, E),
               sv = out2("saved", XTE_DTYPE_FP32, T, E);
    case_end(xte_router_aux_scores(&logits, topk, sc, &s, &m, &sv, NULL), 1);
  } else {
    xte_tensor s = t2(xalloc(4 * (size_t)(T * E)), XTE_DTYPE_FP32, T, E);
    xte_tensor sv = t2(xalloc(4 * (size_t)(T * E)), XTE_DTYPE_FP32, T, E), g, gl;
    if (!setup_ok(xte_router_aux_scores(&logits, topk, sc, &s, NULL, &sv, NULL), "aux_scores")) {
      mem_release(mark);
      return;
    }
    g = t2(gen_new(XTE_DTYPE_FP32, T * E, P_UNIT, 1.0f), XTE_DTYPE_FP32, T, E);
    gl = out2("grad_logits", XTE_DTYPE_FP32, T, E);
    case_end(xte_router_aux_scores_backward(&g, &sv, &logits, topk, sc, &gl, NULL), 1);
  }
  mem_release(mark);
}

static void aux_loss_cases(void) {
  int i, bwd;
  for (i = 0; i < 2; i++)
    for (bwd = 0; bwd < 2; bwd++) {
      int mark = mem_mark();
      const int64_t T = g_small ? 1100 : 2100, E = i ? 7 : 32;
      xte_dtype tdt = i ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
      void *tpe = xalloc(8 * (size_t)E);
      xte_tensor probs, tp;
      int64_t e;
      case_begin("aux_loss_%s.T%lld.E%lld.%s%s", bwd ? "bwd" : "fwd", (long long)T, (long long)E,
                 dtn(tdt), i ? ".nan" : "");
      probs = t2(gen_new(XTE_DTYPE_FP32, T * E, P_UNIT, 1.0f), XTE_DTYPE_FP32, T, E);
      if (i) { /* a NaN and an inf: the fixed-order NaN rule */
        ((float *)probs.data)[rndn((uint32_t)(T * E))] = NAN;
        ((float *)probs.data)[rndn((uint32_t)(T * E))] = INFINITY;
      }
      for (e = 0; e < E; e++) {
        if (i)
          ((int32_t *)tpe)[e] = (int32_t)rndn(1000);
        else
          ((int64_t *)tpe)[e] = (int64_t)rndn(1000);
      }
      tp = t1(tpe, tdt, E);
      if (bwd) {
        xte_tensor gp = out2("grad_probs", XTE_DTYPE_FP32, T, E);
        case_end(xte_moe_aux_loss_backward(&tp, T * 2, 4, 1e-2f, 0.75f, &gp, NULL), 1);
      } else {
        float *loss = (float *)xalloc(4);
        out_buf("aux_loss", loss, 4, XTE_DTYPE_FP32, 1);
        case_end(xte_moe_aux_loss_forward(&probs, &tp, T, 4, 1e-2f, loss, NULL), 1);
      }
      mem_release(mark);
    }
}

static void router_cases(void) {
  static const xte_router_score scs[3] = {XTE_ROUTER_SOFTMAX, XTE_ROUTER_SIGMOID,
                                          XTE_ROUTER_SQRTSOFTPLUS};
  int s, v, pre;
  for (s = 0; s < 3; s++)
    for (pre = 0; pre < (s == 0 ? 2 : 1); pre++)
      for (v = 0; v < 7; v++) {
        rspec r;
        if (g_small && v >= 4) continue;
        memset(&r, 0, sizeof r);
        r.score = scs[s];
        r.pre = pre;
        r.sf = 1.0f;
        r.ldt = XTE_DTYPE_FP32;
        r.idt = XTE_DTYPE_INT64;
        r.gdt = XTE_DTYPE_FP32;
        r.prof = P_UNIT;
        switch (v) {
          case 0:
            r.T = 53, r.E = 64, r.topk = 4;
            break;
          case 1:
            r.T = 53, r.E = 64, r.topk = 8, r.groups = 8, r.gtopk = 4, r.bias = 1, r.sf = 2.5f;
            r.ldt = XTE_DTYPE_BF16, r.idt = XTE_DTYPE_INT32, r.gdt = XTE_DTYPE_BF16;
            break;
          case 2:
            r.T = 19, r.E = 7, r.topk = 1;
            break;
          case 3:
            r.T = 31, r.E = 160, r.topk = 6, r.groups = 4, r.gtopk = 2, r.bias = 1;
            r.prof = P_TIES;
            break;
          case 4:
            r.T = 9, r.E = 512, r.topk = 16, r.ldt = XTE_DTYPE_BF16;
            break;
          case 5:
            r.T = 40, r.E = 24, r.topk = 3, r.prof = P_WILD, r.idt = XTE_DTYPE_INT32;
            break;
          default:
            r.T = 300, r.E = 48, r.topk = 2, r.bias = 1, r.sf = 0.75f, r.prof = P_TIES;
            break;
        }
        router_case(&r, 0);
        router_case(&r, 1);
      }
  if (!g_small) { /* outputs past 8 MiB: the SIMD router writes them with streaming stores */
    rspec r;
    memset(&r, 0, sizeof r);
    r.T = 8200, r.E = 256, r.topk = 8, r.groups = 8, r.gtopk = 4, r.bias = 1;
    r.score = XTE_ROUTER_SIGMOID, r.sf = 1.0f, r.ldt = XTE_DTYPE_BF16, r.idt = XTE_DTYPE_INT32;
    r.gdt = XTE_DTYPE_FP32, r.prof = P_UNIT;
    router_case(&r, 0);
    r.score = XTE_ROUTER_SOFTMAX, r.groups = 0, r.gtopk = 0, r.bias = 0, r.ldt = XTE_DTYPE_FP32;
    router_case(&r, 0);
    aux_scores_case(8200, 256, 4, XTE_ROUTER_SQRTSOFTPLUS, 0);
  }
  for (s = 0; s < 3; s++)
    for (v = 0; v < 2; v++) {
      aux_scores_case(v ? 19 : 120, v ? 7 : 64, v ? 1 : 4, scs[s], 0);
      aux_scores_case(v ? 19 : 120, v ? 7 : 64, v ? 1 : 4, scs[s], 1);
    }
  aux_loss_cases();
}

/* ------------------------------------------------------------------ token movement */

typedef struct routing {
  xte_tensor map, idx;
  xte_moe_routing r;
  int64_t T, E;
  int k;
} routing;

/* T tokens over E experts, k distinct each; topk_idx (use_map = 0) has about one slot in 7 at -1 */
static void gen_routing(routing *g, int64_t T, int64_t E, int k, int use_map, xte_dtype idt) {
  uint8_t *map = (uint8_t *)xalloc((size_t)(T * E));
  void *idx = xalloc(8 * (size_t)(T * k));
  int64_t t;
  int j, i;
  for (t = 0; t < T; t++) {
    int64_t sel[16];
    for (j = 0; j < k; j++) {
      int64_t e;
      int dup;
      do {
        e = (int64_t)rndn((uint32_t)E);
        dup = 0;
        for (i = 0; i < j; i++) dup |= sel[i] == e;
      } while (dup);
      sel[j] = e;
      if (!use_map && rndn(7) == 0) e = -1;
      if (e >= 0) map[t * E + e] = 1;
      if (idt == XTE_DTYPE_INT32)
        ((int32_t *)idx)[t * k + j] = (int32_t)e;
      else
        ((int64_t *)idx)[t * k + j] = e;
    }
  }
  g->map = t2(map, XTE_DTYPE_UINT8, T, E);
  g->idx = t2(idx, idt, T, k);
  g->r.routing_map = use_map ? &g->map : NULL;
  g->r.topk_idx = use_map ? NULL : &g->idx;
  g->r.num_experts = E;
  g->T = T;
  g->E = E;
  g->k = k;
}

static const char *rname(int use_map, xte_dtype idt) {
  return use_map ? "map" : idt == XTE_DTYPE_INT32 ? "idx32" : "idx64";
}

static void permute_cases(void) {
  static const xte_dtype dts[4] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_E4M3, XTE_DTYPE_E5M2};
  const int64_t T = g_small ? 97 : 300, E = 16, H = 200;
  const int k = 4;
  int d, rv, cv;
  /* permute_rows and permute: each dtype x routing kind x cap / align */
  for (d = 0; d < 4; d++)
    for (rv = 0; rv < 3; rv++)
      for (cv = 0; cv < 4; cv++) {
        static const int64_t caps[4] = {-1, -1, 250, 250}, als[4] = {1, 16, 1, 128};
        int mark = mem_mark();
        int use_map = rv == 0;
        xte_dtype idt = rv == 2 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
        routing g;
        xte_permute_config pc;
        xte_permute_outputs ex;
        xte_tensor in, ins, out, outs, rm;
        int64_t R = 0, OR, *rows;
        int fp8 = dts[d] == XTE_DTYPE_E4M3 || dts[d] == XTE_DTYPE_E5M2;
        xte_dtype sdt = dts[d] == XTE_DTYPE_E5M2 ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
        if (g_small && cv != 0 && cv != 3 && d != 1) {
          mem_release(mark);
          continue;
        }
        pc = xte_permute_config_default();
        pc.num_out_tokens = caps[cv];
        pc.align = als[cv];
        if (d == 0) { /* permute_rows (independent of the dtype) */
          case_begin("permute_rows.%s.T%lld.E%lld.k%d.cap%lld.al%lld", rname(use_map, idt),
                     (long long)T, (long long)E, k, (long long)pc.num_out_tokens,
                     (long long)pc.align);
          gen_routing(&g, T, E, k, use_map, idt);
          rows = (int64_t *)xalloc(8);
          out_buf("rows", rows, 8, XTE_DTYPE_INT64, 1);
          case_end(xte_moe_permute_rows(&g.r, &pc, rows, NULL), 0);
        }
        case_begin("permute.%s.%s.T%lld.E%lld.H%lld.k%d.cap%lld.al%lld", dtn(dts[d]),
                   rname(use_map, idt), (long long)T, (long long)E, (long long)H, k,
                   (long long)pc.num_out_tokens, (long long)pc.align);
        gen_routing(&g, T, E, k, use_map, idt);
        if (!setup_ok(xte_moe_permute_rows(&g.r, &pc, &R, NULL), "permute_rows")) {
          mem_release(mark);
          continue;
        }
        OR = R + 5;
        in = t2(gen_new(dts[d], T * H, P_WILD, 2.0f), dts[d], T, H);
        ins = t2(gen_new(sdt, T * 2, P_UNIT, 1.0f), sdt, T, 2);
        out = out2("output", dts[d], OR, H);
        outs = fp8 ? out2("output_scales", sdt, OR, 2) : t2(NULL, sdt, OR, 2);
        rm = out2("row_map", XTE_DTYPE_INT32, T, k);
        memset(&ex, 0, sizeof ex);
        ex.expert_offsets = out2("expert_offsets", XTE_DTYPE_INT64, E + 1, 0);
        ex.tokens_per_expert =
            out2("tokens_per_expert", rv == 2 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64, E, 0);
        ex.row_to_expert = out2("row_to_expert", XTE_DTYPE_INT32, OR, 0);
        case_end(xte_moe_permute(&in, fp8 ? &ins : NULL, &g.r, &pc, &out, fp8 ? &outs : NULL, &rm,
                                 &ex, NULL),
                 0);
        mem_release(mark);
      }
  /* unpermute and the backwards: fp32 / bf16, map / topk_idx, probs or none, cap + align */
  for (d = 0; d < 2; d++)
    for (rv = 0; rv < 3; rv++)
      for (cv = 0; cv < 2; cv++) {
        int op;
        for (op = 0; op < 3; op++) {
          int mark = mem_mark();
          int use_map = rv == 0, pr;
          xte_dtype idt = rv == 2 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64, dt = dts[d];
          routing g;
          xte_permute_config pc;
          xte_tensor x, px, rm, probs, out;
          int64_t R;
          static const char *ops[3] = {"unpermute", "permute_bwd", "unpermute_bwd"};
          pc = xte_permute_config_default();
          pc.num_out_tokens = cv ? 250 : -1;
          pc.align = cv ? 16 : 1;
          pr = (rv + cv + op) % 2 == 0 || op == 2;
          case_begin("%s.%s.%s.T%lld.E%lld.H%lld.k%d.cap%lld.al%lld%s", ops[op], dtn(dt),
                     rname(use_map, idt), (long long)T, (long long)E, (long long)H, k,
                     (long long)pc.num_out_tokens, (long long)pc.align,
                     op != 1 ? (pr ? ".probs" : ".noprobs") : "");
          gen_routing(&g, T, E, k, use_map, idt);
          if (!setup_ok(xte_moe_permute_rows(&g.r, &pc, &R, NULL), "permute_rows")) {
            mem_release(mark);
            continue;
          }
          x = t2(gen_new(dt, T * H, P_FINITE, 2.0f), dt, T, H);
          px = t2(xalloc(xte_dtype_size(dt) * (size_t)(R * H)), dt, R, H);
          rm = t2(xalloc(4 * (size_t)(T * k)), XTE_DTYPE_INT32, T, k);
          if (!setup_ok(xte_moe_permute(&x, NULL, &g.r, &pc, &px, NULL, &rm, NULL, NULL),
                        "permute")) {
            mem_release(mark);
            continue;
          }
          gen(px.data, dt, R * H, P_FINITE, 1.0f); /* the experts' outputs */
          probs = t2(gen_new(XTE_DTYPE_FP32, T * (use_map ? E : k), P_UNIT, 1.0f), XTE_DTYPE_FP32,
                     T, use_map ? E : k);
          if (op == 0) {
            out = out2("out", dt, T, H);
            case_end(xte_moe_unpermute(&px, &g.r, &rm, pr ? &probs : NULL, &out, NULL), 0);
          } else if (op == 1) {
            out = out2("grad_input", dt, T, H);
            case_end(xte_moe_permute_backward(&px, &g.r, &rm, &out, NULL), 0);
          } else {
            xte_tensor go = t2(gen_new(dt, T * H, P_UNIT, 1.0f), dt, T, H), gp;
            out = out2("grad_input", dt, R, H);
            gp = out2("grad_probs", XTE_DTYPE_FP32, T, use_map ? E : k);
            case_end(xte_moe_unpermute_backward(&go, &px, &g.r, &rm, &probs, &out,
                                                (rv + cv) % 2 ? NULL : &gp, NULL),
                     0);
          }
          mem_release(mark);
        }
      }
  /* mixed dtypes: fp32 input, bf16 out (and back) */
  for (d = 0; d < 2; d++) {
    int mark = mem_mark();
    routing g;
    xte_permute_config pc;
    xte_tensor x, px, rm, out;
    int64_t R;
    xte_dtype a = d ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32, b = d ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
    pc = xte_permute_config_default();
    pc.num_out_tokens = -1;
    pc.align = 1;
    case_begin("unpermute.%s_%s.idx64.T%lld", dtn(a), dtn(b), (long long)T);
    gen_routing(&g, T, E, k, 0, XTE_DTYPE_INT64);
    if (setup_ok(xte_moe_permute_rows(&g.r, &pc, &R, NULL), "permute_rows")) {
      x = t2(gen_new(a, T * H, P_FINITE, 2.0f), a, T, H);
      px = t2(xalloc(xte_dtype_size(a) * (size_t)(R * H)), a, R, H);
      rm = t2(xalloc(4 * (size_t)(T * k)), XTE_DTYPE_INT32, T, k);
      if (setup_ok(xte_moe_permute(&x, NULL, &g.r, &pc, &px, NULL, &rm, NULL, NULL), "permute")) {
        out = out2("out", b, T, H);
        case_end(xte_moe_unpermute(&px, &g.r, &rm, NULL, &out, NULL), 1);
      }
    }
    mem_release(mark);
  }
  /* sort chunks and its backward */
  {
    static const int64_t sizes[12] = {50, 7, 0, 100, 63, 41, 90, 1, 88, 60, 30, 70};
    static const int32_t order[12] = {3, 11, 0, 7, 2, 9, 5, 1, 10, 4, 8, 6};
    static const xte_dtype sdts[3] = {XTE_DTYPE_BF16, XTE_DTYPE_FP32, XTE_DTYPE_UINT8};
    int v;
    for (v = 0; v < 3; v++) {
      int mark = mem_mark(), i;
      int64_t R = 0, Hs = v == 2 ? 33 : 96;
      void *sp = xalloc(8 * 12);
      int32_t *ix = (int32_t *)xalloc(4 * 12);
      xte_dtype spdt = v == 1 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
      xte_tensor split, sorted, in, out, rm, gi;
      for (i = 0; i < 12; i++) {
        if (spdt == XTE_DTYPE_INT32)
          ((int32_t *)sp)[i] = (int32_t)sizes[i];
        else
          ((int64_t *)sp)[i] = sizes[i];
        ix[i] = order[i];
        R += sizes[i];
      }
      split = t1(sp, spdt, 12);
      sorted = t1(ix, XTE_DTYPE_INT32, 12);
      case_begin("sort_chunks.%s.R%lld.H%lld.split_%s", dtn(sdts[v]), (long long)R, (long long)Hs,
                 dtn(spdt));
      in = t2(gen_new(sdts[v], R * Hs, P_WILD, 1.0f), sdts[v], R, Hs);
      out = out2("output", sdts[v], R, Hs);
      rm = out2("row_map", XTE_DTYPE_INT32, R, 0);
      case_end(xte_moe_sort_chunks_by_index(&in, &split, &sorted, &out, &rm, NULL), 0);
      case_begin("sort_chunks_bwd.%s.R%lld.H%lld", dtn(sdts[v]), (long long)R, (long long)Hs);
      gi = out2("grad_input", sdts[v], R, Hs);
      case_end(xte_moe_sort_chunks_backward(&out, &rm, &gi, NULL), 0);
      mem_release(mark);
    }
  }
  /* dispatch layout */
  {
    int v;
    for (v = 0; v < 3; v++) {
      int mark = mem_mark();
      static const int ranks[3] = {8, 1, 3};
      static const int64_t es[3] = {64, 16, 9};
      routing g;
      xte_tensor tpr, tpe, inr;
      xte_dtype idt = v == 1 ? XTE_DTYPE_INT32 : XTE_DTYPE_INT64;
      case_begin("dispatch_layout.%s.T%lld.E%lld.r%d", dtn(idt), (long long)T, (long long)es[v],
                 ranks[v]);
      gen_routing(&g, T, es[v], v == 0 ? 8 : 3, 0, idt);
      tpr = out2("tokens_per_rank", XTE_DTYPE_INT32, ranks[v], 0);
      tpe = out2("tokens_per_expert", XTE_DTYPE_INT32, es[v], 0);
      inr = out2("is_token_in_rank", XTE_DTYPE_UINT8, T, ranks[v]);
      case_end(xte_moe_dispatch_layout(&g.idx, es[v], ranks[v], &tpr, &tpe, &inr, NULL), 0);
      mem_release(mark);
    }
  }
}

/* ------------------------------------------------------------------ SwiGLU */

static void swiglu_cases(void) {
  static const xte_dtype dts[2] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16};
  const int64_t T = g_small ? 37 : 67;
  int i, j, f;
  for (f = 0; f < 2; f++)
    for (i = 0; i < 2; i++)
      for (j = 0; j < 2; j++) {
        int mark = mem_mark();
        int64_t F = f ? 256 : 200;
        int prof = f ? P_CLEAN : P_WILD;
        xte_tensor in = t2(gen_new(dts[i], T * 2 * F, prof, 4.0f), dts[i], T, 2 * F), out, go;
        case_begin("swiglu.%s_%s.T%lld.F%lld", dtn(dts[i]), dtn(dts[j]), (long long)T,
                   (long long)F);
        out = out2("out", dts[j], T, F);
        case_end(xte_swiglu(&in, &out, NULL), 1);
        case_begin("dswiglu.%s_%s.T%lld.F%lld", dtn(dts[i]), dtn(dts[j]), (long long)T,
                   (long long)F);
        go = t2(gen_new(dts[i], T * F, prof, 1.0f), dts[i], T, F);
        out = out2("grad_input", dts[j], T, 2 * F);
        case_end(xte_dswiglu(&go, &in, &out, NULL), 1);
        mem_release(mark);
      }
  /* fused with quantization: every recipe x layout (1x128; 128x128 and MX refused), act dtype,
   * fp8 dtype, copies */
  {
    static const xte_recipe recs[6] = {XTE_RECIPE_TE_BLOCK,       XTE_RECIPE_DEEPGEMM,
                                       XTE_RECIPE_DEEPGEMM_UE8M0, XTE_RECIPE_MTFP8,
                                       XTE_RECIPE_MX_TE,          XTE_RECIPE_TE_CURRENT};
    int r, l, bwd, v;
    for (bwd = 0; bwd < 2; bwd++)
      for (r = 0; r < 6; r++)
        for (l = 0; l < 4; l++)
          for (v = 0; v < 6; v++) {
            int mark = mem_mark();
            xte_scaling_mode mode = r == 4   ? XTE_SCALING_MXFP8_1x32
                                    : r == 5 ? XTE_SCALING_PER_TENSOR
                                             : XTE_SCALING_BLOCK_1x128;
            xte_dtype idt = v == 1 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
            xte_dtype act = v == 2 ? XTE_DTYPE_FP32 : XTE_DTYPE_BF16;
            xte_dtype qdt = v == 3 ? XTE_DTYPE_E5M2 : XTE_DTYPE_E4M3;
            int copies = v == 4 ? C_ROW : v == 5 ? C_COL : C_BOTH;
            int64_t F = v == 1 ? 256 : 200, K = bwd ? 2 * F : F;
            xte_qtensor q;
            xte_tensor in, go;
            xte_quant_config cfg = xte_quant_config_default();
            xte_status st;
            int prof;
            if (v > 0 && (r >= 4 || l == 3)) {
              mem_release(mark);
              continue;
            }
            if (v > 0 && g_small && l != 0) {
              mem_release(mark);
              continue;
            }
            case_begin("%s.%s.%s.%s.%s.%s.%s.%s.T%lld.F%lld%s",
                       bwd ? "dswiglu_quantize" : "swiglu_quantize", mode_name(mode),
                       recipe_name(recs[r]), layout_name((xte_scale_layout)l), dtn(idt), dtn(act),
                       dtn(qdt), copies_name(copies), (long long)T, (long long)F,
                       v == 0 && (r + l) % 2 ? ".clean" : "");
            /* half the recipe x layout cases without NaN / inf (the kernels' fast paths) */
            prof = v == 0 && (r + l) % 2 ? P_CLEAN : P_WILD;
            in = t2(gen_new(idt, T * 2 * F, prof, 4.0f), idt, T, 2 * F);
            go = t2(gen_new(idt, T * F, prof, 1.0f), idt, T, F);
            st = make_q(&q, T, K, mode, recs[r], (xte_scale_layout)l, qdt, copies, XTE_DTYPE_COUNT,
                        1);
            if (st == XTE_SUCCESS) {
              q.amax = (float *)xalloc(4);
              out_buf("amax", q.amax, 4, XTE_DTYPE_FP32, 1);
              st = bwd ? xte_dswiglu_quantize(&go, &in, act, &q, &cfg, NULL)
                       : xte_swiglu_quantize(&in, act, &q, &cfg, NULL);
            }
            case_end(st, 1);
            mem_release(mark);
          }
    /* 128x128 blocks: refused */
    for (bwd = 0; bwd < 2; bwd++) {
      int mark = mem_mark();
      xte_qtensor q;
      xte_tensor in =
          t2(gen_new(XTE_DTYPE_BF16, 128 * 512, P_UNIT, 1.0f), XTE_DTYPE_BF16, 128, 512);
      xte_tensor go =
          t2(gen_new(XTE_DTYPE_BF16, 128 * 256, P_UNIT, 1.0f), XTE_DTYPE_BF16, 128, 256);
      xte_status st;
      case_begin("%s.128x128.te_blk.compact", bwd ? "dswiglu_quantize" : "swiglu_quantize");
      st = make_q(&q, 128, bwd ? 512 : 256, XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK,
                  XTE_SCALE_LAYOUT_COMPACT, XTE_DTYPE_E4M3, C_BOTH, XTE_DTYPE_COUNT, 1);
      if (st == XTE_SUCCESS)
        st = bwd ? xte_dswiglu_quantize(&go, &in, XTE_DTYPE_BF16, &q, NULL, NULL)
                 : xte_swiglu_quantize(&in, XTE_DTYPE_BF16, &q, NULL, NULL);
      case_end(st, 1);
      mem_release(mark);
    }
  }
}

/* ------------------------------------------------------------------ expert parallelism (one rank)
 */

static void ep_cases(void) {
  const int64_t T = g_small ? 40 : 100, H = 256, El = 8, K = 4, S = 2;
  int v;
  for (v = 0; v < 2; v++) {
    int mark = mem_mark();
    xte_ep_config cfg = xte_ep_config_default();
    xte_ep_threads_world world = NULL;
    xte_ep_group grp = NULL;
    size_t hb = 0;
    void *handle;
    xte_ep_counts counts, *pc;
    int32_t *idx = (int32_t *)xalloc(4 * (size_t)(T * K));
    float *w = (float *)xalloc(4 * (size_t)(T * K));
    xte_tensor ti, tw, x, xs, rx, rs, rw, tpe, y, out, slots, go, gy, gw, gr, gx, rti, rtw;
    int64_t t, j, rows;
    xte_dtype xdt = v ? XTE_DTYPE_BF16 : XTE_DTYPE_E4M3;
    const char *vn = v ? "bf16" : "e4m3";
    int ok = 1;
    for (t = 0; t < T; t++)
      for (j = 0; j < K; j++) {
        idx[t * K + j] = (int32_t)((t * 3 + j * 5) % El); /* distinct within a token */
        if ((t + j) % 11 == 0) idx[t * K + j] = -1;
        w[t * K + j] = (float)(t % 7 + j) / 8.0f;
      }
    ti = t2(idx, XTE_DTYPE_INT32, T, K);
    tw = t2(w, XTE_DTYPE_FP32, T, K);
    cfg.experts_per_rank = El;
    cfg.hidden = H;
    cfg.topk = (int32_t)K;
    cfg.align = v ? 1 : 16;
    cfg.max_tokens_per_rank = T;
    case_begin("ep1.prepare.%s", vn);
    if (!setup_ok(xte_ep_threads_world_create(1, &world), "world") ||
        !setup_ok(xte_ep_group_create_threads(world, 0, &cfg, &grp), "group") ||
        !setup_ok(xte_ep_handle_size(grp, &hb), "handle_size")) {
      ok = 0;
    }
    if (ok) {
      handle = xalloc(hb);
      pc = (xte_ep_counts *)xalloc(sizeof *pc);
      out_buf("counts", pc, sizeof *pc, XTE_DTYPE_INT64, 1);
      tpe = out2("tokens_per_expert", XTE_DTYPE_INT64, El, 0);
      case_end(xte_ep_prepare(grp, &ti, handle, hb, pc, &tpe, NULL), 0);
      counts = *pc;
      rows = counts.recv_rows;
      x = t2(gen_new(xdt, T * H, P_FINITE, 1.0f), xdt, T, H);
      xs = t2(gen_new(XTE_DTYPE_FP32, T * S, P_UNIT, 1.0f), XTE_DTYPE_FP32, T, S);
      case_begin("ep1.dispatch.%s", vn);
      rx = out2("recv_x", xdt, rows, H);
      rs = v ? t2(NULL, XTE_DTYPE_FP32, rows, S) : out2("recv_scales", XTE_DTYPE_FP32, rows, S);
      rw = out2("recv_weights", XTE_DTYPE_FP32, rows, 0);
      case_end(
          xte_ep_dispatch(grp, handle, &x, v ? NULL : &xs, &tw, &rx, v ? NULL : &rs, &rw, NULL), 0);
      case_begin("ep1.dispatch_tokens.%s", vn);
      {
        int64_t rt = counts.recv_tokens + 2;
        xte_tensor rx2 = out2("recv_x", xdt, rt, H);
        xte_tensor rs2 =
            v ? t2(NULL, XTE_DTYPE_FP32, rt, S) : out2("recv_scales", XTE_DTYPE_FP32, rt, S);
        rti = out2("recv_topk_idx", XTE_DTYPE_INT32, rt, K);
        rtw = out2("recv_topk_weights", XTE_DTYPE_FP32, rt, K);
        case_end(xte_ep_dispatch_tokens(grp, handle, &x, v ? NULL : &xs, &tw, &rx2, v ? NULL : &rs2,
                                        &rti, &rtw, NULL),
                 0);
      }
      /* the dispatch above counts as the step's: dispatch again so that combine follows it */
      if (setup_ok(
              xte_ep_dispatch(grp, handle, &x, v ? NULL : &xs, &tw, &rx, v ? NULL : &rs, &rw, NULL),
              "dispatch")) {
        y = t2(gen_new(XTE_DTYPE_BF16, rows * H, P_FINITE, 2.0f), XTE_DTYPE_BF16, rows, H);
        case_begin("ep1.combine.%s", vn);
        out = out2("out", XTE_DTYPE_BF16, T, H);
        slots = out2("slot_rows", XTE_DTYPE_BF16, counts.slot_rows, H);
        case_end(xte_ep_combine(grp, handle, &y, &tw, &out, &slots, NULL), 0);
        go = t2(gen_new(XTE_DTYPE_BF16, T * H, P_FINITE, 2.0f), XTE_DTYPE_BF16, T, H);
        case_begin("ep1.combine_bwd.%s", vn);
        gy = out2("grad_expert_out", XTE_DTYPE_BF16, rows + 3, H);
        gw = out2("grad_weights", XTE_DTYPE_FP32, T, K);
        case_end(xte_ep_combine_backward(grp, handle, &go, &tw, &slots, &gy, &gw, NULL), 0);
        gr = t2(gen_new(XTE_DTYPE_FP32, rows * H, P_FINITE, 2.0f), XTE_DTYPE_FP32, rows, H);
        case_begin("ep1.dispatch_bwd.%s", vn);
        gx = out2("grad_x", XTE_DTYPE_FP32, T, H);
        case_end(xte_ep_dispatch_backward(grp, handle, &gr, &gx, NULL), 0);
      }
    }
    if (grp) xte_ep_group_destroy(grp);
    if (world) xte_ep_threads_world_destroy(world);
    mem_release(mark);
  }
}

/* ================================================================== test hooks
 * Two test hooks of the CPU attention driver (declared under src/, exported for tests, not public
 * API; declared weak here so that a build without them lists these cases as UNSUPPORTED): the
 * attention with its per-thread head caches off and a small S store (the backward's paths past
 * the caches' size limit: operands read in place or converted block by block, S and dP
 * recomputed, the store in rounds), and the ISA's vector exp. */
XTE_API size_t xte_internal_attention_cache_limit(size_t bytes) __attribute__((weak));
XTE_API xte_status xte_internal_attention_exp(xte_cpu_isa isa, const float *x, float *y, int64_t n)
    __attribute__((weak));

static void internal_cases(void) {
  static const xte_dtype dts[3] = {XTE_DTYPE_FP32, XTE_DTYPE_BF16, XTE_DTYPE_FP16};
  int i;
  if (!xte_internal_attention_cache_limit) {
    case_begin("internal.attention_cache_limit");
    case_end(XTE_ERROR_UNSUPPORTED, 1);
  } else {
    size_t lim = xte_internal_attention_cache_limit(0); /* no caches, no store */
    aspec a;
    for (i = 0; i < 3; i++) {
      a = g_small ? aspec_make(dts[i], 1, 37, 2, 1, i == 2 ? 40 : 64, XTE_ATTN_MASK_CAUSAL)
                  : aspec_make(dts[i], 2, 37, 4, 2, i == 2 ? 40 : 64, XTE_ATTN_MASK_CAUSAL);
      a.tag = ".nocache";
      attn_both(&a);
    }
    if (!g_small) {
      a = aspec_make(XTE_DTYPE_BF16, 1, 150, 4, 2, 64, XTE_ATTN_MASK_NONE);
      a.tag = ".nocache";
      attn_both(&a);
      a = aspec_make(XTE_DTYPE_FP32, 1, 130, 2, 1, 64, XTE_ATTN_MASK_CAUSAL);
      a.tag = ".nocache";
      attn_both(&a);
    }
    a = aspec_make(XTE_DTYPE_FP32, 1, g_small ? 40 : 70, 2, 1, 48, XTE_ATTN_MASK_NONE);
    a.dv = 24;
    a.softcap = 20.0f;
    a.tag = ".nocache";
    attn_both(&a);
    a = aspec_make(XTE_DTYPE_BF16, 1, 1, 2, 1, 32, XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT);
    a.layout = XTE_ATTN_LAYOUT_THD;
    a.nlen = 3;
    a.lq[0] = 30, a.lq[1] = 0, a.lq[2] = 65;
    a.lk[0] = 31, a.lk[1] = 4, a.lk[2] = 70;
    a.tag = ".nocache";
    attn_both(&a);
    a = aspec_make(XTE_DTYPE_E4M3, 2, 37, g_small ? 2 : 4, g_small ? 1 : 2, 64,
                   XTE_ATTN_MASK_CAUSAL);
    a.out_dt = XTE_DTYPE_BF16;
    a.descale = 1;
    a.tag = ".nocache";
    attn_both(&a);
    /* a store of a few 64 x 64 tiles: a (sequence, KV head) pair in several rounds */
    xte_internal_attention_cache_limit((size_t)400 << 10);
    for (i = 0; i < (g_small ? 1 : 2); i++) { /* 300 keys: 5 blocks of 64, 160 KiB per tile row */
      a = aspec_make(dts[i], 1, g_small ? 140 : 300, 2, 1, i ? 64 : 32,
                     i ? XTE_ATTN_MASK_NONE : XTE_ATTN_MASK_CAUSAL);
      a.tag = ".store400k";
      attn_case(&a, 1);
    }
    xte_internal_attention_cache_limit(lim);
  }
  if (!xte_internal_attention_exp) {
    case_begin("internal.attention_exp");
    case_end(XTE_ERROR_UNSUPPORTED, 1);
  } else {
    int mark = mem_mark();
    const int64_t n = 4099;
    float *x = (float *)xalloc(4 * (size_t)n);
    xte_tensor y;
    int64_t k;
    case_begin("internal.attention_exp.n%lld", (long long)n);
    for (k = 0; k < n; k++) /* a sweep over [-110, 95], then the wild profile */
      x[k] = k < 2048 ? -110.0f + 205.0f * (float)k / 2047.0f : 0.0f;
    gen_f32(x + 2048, n - 2048, P_WILD, 30.0f);
    y = out2("y", XTE_DTYPE_FP32, n, 0);
    case_end(xte_internal_attention_exp(xte_cpu_get_isa(), x, (float *)y.data, n), 0);
    mem_release(mark);
  }
}

/* ================================================================== main */

int main(int argc, char **argv) {
  int i;
  double t0, t;
  char tot[64];
  static const struct {
    const char *name;
    void (*fn)(void);
  } groups[] = {
      {"quantize", quantize_cases},    {"cast", cast_cases},           {"gemm", gemm_cases},
      {"gemm_grouped", grouped_cases}, {"attention", attention_cases}, {"router", router_cases},
      {"permute", permute_cases},      {"swiglu", swiglu_cases},       {"ep", ep_cases},
      {"internal", internal_cases}};
  for (i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--small"))
      g_small = 1;
    else if (!strcmp(argv[i], "--time"))
      g_time = 1;
    else if (!strcmp(argv[i], "--dump") && i + 1 < argc)
      g_dump = argv[++i];
    else if (!strcmp(argv[i], "--filter") && i + 1 < argc)
      g_filter = argv[++i];
    else {
      fprintf(stderr,
              "usage: xte_isa_digest [--small] [--dump CASE] [--filter SUBSTR] [--time]\n"
              "  prints '<case> <FNV-1a 64 of its outputs>' per case and 'TOTAL <hash>'\n");
      return 2;
    }
  }
  fprintf(stderr, "xte_isa_digest: isa %s, %d threads, %s set\n",
          xte_cpu_isa_name(xte_cpu_get_isa()), xte_cpu_get_num_threads(),
          g_small ? "small" : "default");
  t0 = now_s();
  for (i = 0; i < (int)(sizeof groups / sizeof groups[0]); i++) {
    double ts = now_s();
    groups[i].fn();
    fflush(stdout);
    fprintf(stderr, "xte_isa_digest: %-13s %7.3f s\n", groups[i].name, now_s() - ts);
  }
  t = now_s() - t0;
  snprintf(tot, sizeof tot, "%016llx", (unsigned long long)g_total);
  printf("TOTAL %s\n", tot);
  fprintf(stderr, "xte_isa_digest: %d cases (%d unsupported), %.3f s, isa %s%s\n", g_lines,
          g_unsupported, t, xte_cpu_isa_name(xte_cpu_get_isa()), g_failed ? ", FAILURES" : "");
  return g_failed ? 1 : 0;
}

/* xte_isa_digest (digest.h): options, hashing, the case lines, allocation, deterministic inputs. */
#define _POSIX_C_SOURCE 200809L
#include "digest.h"

/* ================================================================== options, hashing, cases */

int g_small;
const char *g_dump;
const char *g_filter;
int g_failed;
uint64_t g_total = 0xcbf29ce484222325ull;
int g_lines, g_unsupported;
int g_time; /* --time: each case's seconds on stderr */
double now_s(void);

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

void *xalloc(size_t bytes) {
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

int mem_mark(void) {
  return g_nalloc;
}

void mem_release(int mark) {
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

void case_begin(const char *fmt, ...) {
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
void out_buf(const char *name, void *p, size_t bytes, xte_dtype dt, int fill) {
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
void case_end(xte_status st, int reject_ok) {
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
int setup_ok(xte_status st, const char *what) {
  char line[400];
  if (st == XTE_SUCCESS) return 1;
  snprintf(line, sizeof line, "%s FAILED setup %s: %s: %s", cur.name, what, xte_status_string(st),
           xte_last_error());
  emit(line);
  g_failed = 1;
  return 0;
}

/* ================================================================== data */

uint32_t rnd(void) {
  uint64_t x = cur.rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  cur.rng = x;
  return (uint32_t)(x >> 16);
}

uint32_t rndn(uint32_t n) {
  return n ? rnd() % n : 0;
}

static float rnd_unit(void) { /* [-1, 1) */
  return (float)((double)(rnd() & 0xFFFFFF) / 8388608.0 - 1.0);
}

float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint32_t to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

uint16_t f2bf(float f) {
  uint32_t u = to_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

uint16_t f2h(float f) {
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

static const uint32_t specials_all[] = {0x7FC00000u, 0xFFC00001u, 0x7F800000u, 0xFF800000u,
                                        0x00000001u, 0x80012345u, 0x007FFFFFu, 0x80000000u,
                                        0x00000000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x43E00000u,
                                        0x47600000u, 0x477FE000u, 0x00800000u, 0x3F800000u};
#define N_SPECIALS_NONFINITE 4 /* the first four */

/* n fp32 values of a profile; scale multiplies everything. */
void gen_f32(float *p, int64_t n, int prof, float scale) {
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
void gen(void *p, xte_dtype dt, int64_t n, int prof, float scale) {
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

const void *shared_input(xte_dtype dt, int64_t n, int prof, float scale) {
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
void *gen_new(xte_dtype dt, int64_t n, int prof, float scale) {
  void *p = xalloc(xte_dtype_size(dt) * (size_t)(n > 0 ? n : 1));
  gen(p, dt, n, prof, scale);
  return p;
}

/* e4m3 codes of moderate magnitude (2^-4 .. 2^3), no NaN */
void gen_e4m3_codes(uint8_t *p, int64_t n) {
  int64_t i;
  for (i = 0; i < n; i++) {
    uint32_t e = 3 + rndn(8), m = rndn(8), s = rndn(2);
    p[i] = (uint8_t)((s << 7) | (e << 3) | m);
    if (rndn(53) == 0) p[i] = (uint8_t)(rndn(2) ? 0x00 : (0x80 | rndn(8))); /* zero, subnormal */
  }
}

xte_tensor t2(void *p, xte_dtype dt, int64_t r, int64_t c) {
  return xte_tensor_2d(p, dt, r, c);
}

xte_tensor t1(void *p, xte_dtype dt, int64_t n) {
  return xte_tensor_1d(p, dt, n);
}

/* an output tensor [r, c] (c = 0: 1-D [r]), registered */
xte_tensor out2(const char *name, xte_dtype dt, int64_t r, int64_t c) {
  int64_t n = r * (c ? c : 1);
  size_t bytes = xte_dtype_size(dt) * (size_t)n;
  void *p = xalloc(bytes);
  out_buf(name, p, bytes, dt, 1);
  return c ? t2(p, dt, r, c) : t1(p, dt, r);
}

const char *dtn(xte_dtype dt) {
  return xte_dtype_name(dt);
}

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

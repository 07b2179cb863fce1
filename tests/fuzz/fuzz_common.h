/* Shared helpers of the libFuzzer targets (tests/fuzz/fuzz_*.c).
 *
 * A target decodes the fuzz bytes into descriptors (shapes, dtypes, enums, lds, flags, index
 * arrays) and buffers, calls one entry point and checks the contract of include/xte:
 *  - an error status leaves every buffer (outputs and inputs) byte for byte as it was, and
 *    xte_last_error() is not empty;
 *  - a success returns "" from xte_last_error() and leaves every input buffer unchanged;
 *  - a success on a descriptor that no valid call can have (a negative dimension, a tensor whose
 *    size overflows, a scale buffer smaller than xte_quantize_scale_shape's, ...) is a violation.
 * A violation prints what was seen and calls __builtin_trap(), so libFuzzer saves the input.
 *
 * Buffers are always as large as the descriptors claim (an overflowing or impossible claim gets a
 * small buffer and must be rejected), so an AddressSanitizer report is a real bug. */
#ifndef XTE_FUZZ_COMMON_H
#define XTE_FUZZ_COMMON_H

#define _POSIX_C_SOURCE 200809L /* setenv, posix_memalign */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xte/xte.h>

#if defined(__GNUC__)
#define FZ_UNUSED __attribute__((unused))
#else
#define FZ_UNUSED
#endif

/* ------------------------------------------------------------------ the byte reader */
typedef struct fz {
  const uint8_t *p;
  size_t n, i;
  uint64_t rng; /* fills buffers once the bytes run out */
} fz;

static FZ_UNUSED uint8_t fz_u8(fz *f) {
  if (f->i < f->n) return f->p[f->i++];
  return 0;
}
static FZ_UNUSED uint32_t fz_u16(fz *f) {
  uint32_t a = fz_u8(f);
  return a | (uint32_t)fz_u8(f) << 8;
}
static FZ_UNUSED uint32_t fz_u32(fz *f) {
  uint32_t a = fz_u16(f);
  return a | fz_u16(f) << 16;
}
static FZ_UNUSED uint64_t fz_u64(fz *f) {
  uint64_t a = fz_u32(f);
  return a | (uint64_t)fz_u32(f) << 32;
}
static FZ_UNUSED float fz_f32(fz *f) {
  uint32_t u = fz_u32(f);
  float x;
  memcpy(&x, &u, 4);
  return x;
}
/* Wrapping arithmetic on hostile values (the harness itself must stay free of UB). */
static FZ_UNUSED int64_t fz_wadd(int64_t a, int64_t b) {
  return (int64_t)((uint64_t)a + (uint64_t)b);
}
static FZ_UNUSED int64_t fz_wmul(int64_t a, int64_t b) {
  return (int64_t)((uint64_t)a * (uint64_t)b);
}
/* Byte b < 256 - k: "usually" (probability about 1 - k/256). */
static FZ_UNUSED int fz_rare(fz *f, int k) {
  return fz_u8(f) >= 256 - k;
}

static const int64_t fz_hostile_i64[] = {
    -1,
    -2,
    INT64_MIN,
    INT64_MAX,
    INT64_MAX - 1,
    (int64_t)1 << 31,
    ((int64_t)1 << 31) - 1,
    ((int64_t)1 << 32) + 1,
    (int64_t)1 << 40,
    (int64_t)1 << 60,
    ((int64_t)1 << 62) + 1,
    (int64_t)INT32_MAX,
    (int64_t)INT32_MIN,
    (int64_t)1 << 20,
    (int64_t)1 << 16,
    (int64_t)UINT32_MAX,
};
#define FZ_NHOSTILE ((int)(sizeof fz_hostile_i64 / sizeof fz_hostile_i64[0]))

/* A dimension: mostly small (0..small), sometimes near a block edge, sometimes hostile. */
static FZ_UNUSED int64_t fz_dim(fz *f, int64_t small) {
  uint8_t b = fz_u8(f);
  if (b < 200) return (int64_t)(fz_u8(f) % (uint64_t)(small + 1));
  if (b < 215) return 0;
  if (b < 235) {
    static const int64_t edge[] = {1, 31, 32, 33, 127, 128, 129, 255, 256, 257, 2, 3, 5, 7, 63, 64};
    return edge[fz_u8(f) % 16];
  }
  return fz_hostile_i64[fz_u8(f) % FZ_NHOSTILE];
}
/* An enum value: mostly in [0, count), sometimes out of range. */
static FZ_UNUSED int fz_enum(fz *f, int count) {
  uint8_t b = fz_u8(f);
  if (b < 240) return (int)(fz_u8(f) % (unsigned)count);
  switch (b & 7) {
    case 0:
      return -1;
    case 1:
      return count;
    case 2:
      return count + 1;
    case 3:
      return INT32_MIN;
    case 4:
      return INT32_MAX;
    case 5:
      return 1000;
    default:
      return (int)fz_u32(f);
  }
}
/* A flag that should be 0 or 1: sometimes something else. */
static FZ_UNUSED int fz_flag(fz *f) {
  uint8_t b = fz_u8(f);
  if (b < 244) return b & 1;
  static const int odd[] = {2, -1, 5, 255, INT32_MIN, INT32_MAX, 7, 1 << 16};
  return odd[b & 7];
}
/* A dtype: from the given list mostly, sometimes any value. */
static FZ_UNUSED xte_dtype fz_dtype(fz *f, const xte_dtype *list, int n) {
  uint8_t b = fz_u8(f);
  if (b < 236) return list[fz_u8(f) % (unsigned)n];
  if (b < 252) return (xte_dtype)(fz_u8(f) % XTE_DTYPE_COUNT);
  return (xte_dtype)(b & 1 ? -1 : XTE_DTYPE_COUNT + (b & 7));
}

/* ------------------------------------------------------------------ buffers */
#define FZ_MAX_BUFS 64
/* The largest buffer a target allocates; a possible claim above it skips the call. */
#define FZ_CAP_BYTES ((size_t)1 << 20)

typedef struct fz_buf {
  void *base;
  uint8_t *data;
  size_t bytes;
  uint8_t *snap;
  int output;
  const char *name;
} fz_buf;

typedef struct fz_state {
  fz_buf b[FZ_MAX_BUFS];
  int nb;
  int impossible; /* a consulted descriptor no valid call can have */
  const char *why;
  int skip; /* a possible descriptor too large to allocate: do not call */
} fz_state;

static fz_state fz_g;

/* XTE_FUZZ_AVOID: a comma-separated list of known, still open defects whose region the decoders
 * stay out of (so a long run can make progress past them); empty (CI): nothing is avoided.
 * Names: empty_huge, router_aux_bwd_null, sort_chunks_ws_align. */
static const char *fz_avoid_list;
static FZ_UNUSED int fz_avoid(const char *name) {
  const char *p = fz_avoid_list;
  size_t n = strlen(name);
  while (p && (p = strstr(p, name)) != NULL) {
    if ((p == fz_avoid_list || p[-1] == ',') && (p[n] == '\0' || p[n] == ',')) return 1;
    p += n;
  }
  return 0;
}

static FZ_UNUSED void fz_begin(fz *f, const uint8_t *data, size_t size) {
  f->p = data;
  f->n = size;
  f->i = 0;
  f->rng = 0x9E3779B97F4A7C15ull ^ size;
  memset(&fz_g, 0, sizeof fz_g);
}

static FZ_UNUSED void fz_end(void) {
  int i;
  for (i = 0; i < fz_g.nb; i++) {
    free(fz_g.b[i].base);
    free(fz_g.b[i].snap);
  }
  fz_g.nb = 0;
}

static FZ_UNUSED void fz_mark_impossible(const char *why) {
  if (!fz_g.impossible) fz_g.why = why;
  fz_g.impossible = 1;
}

static FZ_UNUSED uint8_t fz_fill_byte(fz *f) {
  if (f->i < f->n) return f->p[f->i++];
  f->rng ^= f->rng << 13;
  f->rng ^= f->rng >> 7;
  f->rng ^= f->rng << 17;
  return (uint8_t)(f->rng >> 24);
}

/* A buffer of exactly `bytes` bytes (its end is the allocation's end, so ASan sees one byte
 * past it), at an offset of `misalign` bytes from a 64-byte boundary. Outputs are filled with a
 * sentinel pattern, inputs with fuzz bytes in one of a few styles. */
static FZ_UNUSED void *fz_alloc(fz *f, size_t bytes, size_t misalign, int output,
                                const char *name) {
  fz_buf *b;
  void *base = NULL;
  size_t i;
  if (fz_g.nb >= FZ_MAX_BUFS) abort(); /* a target bug */
  if (posix_memalign(&base, 64, bytes + misalign) != 0) abort();
  b = &fz_g.b[fz_g.nb++];
  b->base = base;
  b->data = (uint8_t *)base + misalign;
  b->bytes = bytes;
  b->output = output;
  b->name = name;
  if (output) {
    for (i = 0; i < bytes; i++) b->data[i] = (uint8_t)(0xA5 ^ (i * 0x3B));
  } else {
    uint8_t style = fz_u8(f) & 7;
    if (style == 0) {
      memset(b->data, 0, bytes);
    } else if (style == 1 && bytes >= 4) { /* fp32 specials and small values */
      static const uint32_t sp[] = {0x7FC00000u, 0x7F800000u, 0xFF800000u, 0x00000001u,
                                    0x80000000u, 0x3F800000u, 0xBF800000u, 0x7F7FFFFFu,
                                    0x43E00000u, 0x47600000u, 0x00800000u, 0x7FFFFFFFu,
                                    0x42C80000u, 0xC2C80000u, 0x3A800000u, 0x00000000u};
      for (i = 0; i + 4 <= bytes; i += 4) memcpy(b->data + i, &sp[fz_fill_byte(f) & 15], 4);
      for (; i < bytes; i++) b->data[i] = fz_fill_byte(f);
    } else if (style == 2) { /* small magnitudes of any dtype: low bytes random, high bytes ~0 */
      for (i = 0; i < bytes; i++)
        b->data[i] = (i & 1) ? (uint8_t)(0x3C ^ (fz_fill_byte(f) & 3)) : fz_fill_byte(f);
    } else {
      for (i = 0; i < bytes; i++) b->data[i] = fz_fill_byte(f);
    }
  }
  b->snap = (uint8_t *)malloc(bytes ? bytes : 1);
  if (!b->snap) abort();
  memcpy(b->snap, b->data, bytes);
  return b->data;
}

/* Re-snapshots a buffer the target changed after allocation (e.g. an index array it wrote). */
static FZ_UNUSED void fz_resnap(const void *p) {
  int i;
  for (i = 0; i < fz_g.nb; i++)
    if (fz_g.b[i].data == p) memcpy(fz_g.b[i].snap, fz_g.b[i].data, fz_g.b[i].bytes);
}

/* ------------------------------------------------------------------ tensors */
/* Bytes a tensor's descriptor claims; *bad = 1 when no valid call can have it (unknown dtype,
 * rank outside [1, 8], a negative dimension or ld, a size that overflows). */
static FZ_UNUSED size_t fz_tensor_bytes(const xte_tensor *t, int *bad) {
  int64_t rows = 1, cols, ld, n;
  size_t es;
  int r, zero = 0;
  *bad = 0;
  es = ((unsigned)t->dtype < XTE_DTYPE_COUNT) ? xte_dtype_size(t->dtype) : 0;
  if (es == 0 || t->rank < 1 || t->rank > XTE_MAX_RANK) {
    *bad = 1;
    return 0;
  }
  for (r = 0; r < t->rank; r++) {
    if (t->shape[r] < 0) {
      *bad = 1;
      return 0;
    }
    if (t->shape[r] == 0) zero = 1;
  }
  if (t->ld < 0) {
    *bad = 1;
    return 0;
  }
  if (zero) return 0;
  for (r = 0; r + 1 < t->rank; r++)
    if (__builtin_mul_overflow(rows, t->shape[r], &rows)) {
      *bad = 1;
      return 0;
    }
  cols = t->shape[t->rank - 1];
  ld = t->ld ? t->ld : cols;
  if (ld < cols) ld = cols; /* a short ld is the library's to reject; never read past cols */
  if (__builtin_mul_overflow(rows - 1, ld, &n) || __builtin_add_overflow(n, cols, &n) ||
      __builtin_mul_overflow(n, (int64_t)es, &n)) {
    *bad = 1;
    return 0;
  }
  return (size_t)n;
}

/* Misalignment for a data pointer: usually 0, sometimes 1..3 or 8 bytes. */
static FZ_UNUSED size_t fz_misalign(fz *f) {
  uint8_t b = fz_u8(f);
  if (b < 246) return 0;
  return (size_t)((b & 3) ? (b & 3) : 8);
}

/* Sets t: rank-2 [rows, cols] (sometimes rank 1 or 3 with the same count: the library flattens),
 * an ld (0, cols, or larger; sometimes hostile), and a buffer for it. consulted: the call reads
 * or writes this tensor (an impossible descriptor then must be rejected). present = 0: data NULL.
 * Returns the data pointer. */
static FZ_UNUSED void *fz_tensor_buf(fz *f, xte_tensor *t, int output, int consulted,
                                     const char *name) {
  int bad;
  size_t bytes = fz_tensor_bytes(t, &bad);
  if (bad) {
    if (consulted) fz_mark_impossible(name);
    t->data = fz_alloc(f, 64, 0, output, name);
    return t->data;
  }
  if (bytes > FZ_CAP_BYTES) {
    fz_g.skip = 1;
    t->data = fz_alloc(f, 64, 0, output, name);
    return t->data;
  }
  /* Known defect (fuzz finding, issue 15): a zero-element tensor with a huge row count (e.g.
   * [2^40, 0]) makes the kernels loop over every empty row (a hang). XTE_FUZZ_AVOID=empty_huge
   * skips such calls while it is open. */
  if (bytes == 0 && fz_avoid("empty_huge")) {
    int r;
    for (r = 0; r < t->rank; r++)
      if (t->shape[r] > ((int64_t)1 << 20)) fz_g.skip = 1;
  }
  t->data = fz_alloc(f, bytes, fz_misalign(f), output, name);
  return t->data;
}

static FZ_UNUSED void fz_shape2(fz *f, xte_tensor *t, xte_dtype dt, int64_t rows, int64_t cols) {
  int i;
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->rank = 2;
  t->shape[0] = rows;
  t->shape[1] = cols;
  /* the dimensions past the rank are ignored: make them hostile sometimes */
  if (fz_rare(f, 16))
    for (i = 2; i < XTE_MAX_RANK; i++) t->shape[i] = -1 - i;
  switch (fz_u8(f) >> 4) {
    case 0: /* rank 3 with the same rows */
      if (rows > 0 && rows % 2 == 0) {
        t->rank = 3;
        t->shape[0] = 2;
        t->shape[1] = rows / 2;
        t->shape[2] = cols;
      }
      break;
    case 1: /* rank 1 when one row */
      if (rows == 1) {
        t->rank = 1;
        t->shape[0] = cols;
        t->shape[1] = 0;
      }
      break;
    case 2:
      t->ld = fz_wadd(cols, fz_u8(f) & 7);
      break;
    case 3:
      t->ld = cols;
      break;
    case 4:
      if (fz_rare(f, 64))
        t->ld = fz_hostile_i64[fz_u8(f) % FZ_NHOSTILE];
      else
        t->ld = cols > 0 ? cols - 1 : 1; /* short ld */
      break;
    case 5:
      if (fz_rare(f, 64)) t->rank = fz_enum(f, XTE_MAX_RANK + 2);
      break;
    default:
      break;
  }
}

/* A 2-D tensor with a buffer. */
static FZ_UNUSED void *fz_tensor2(fz *f, xte_tensor *t, xte_dtype dt, int64_t rows, int64_t cols,
                                  int output, int consulted, const char *name) {
  fz_shape2(f, t, dt, rows, cols);
  return fz_tensor_buf(f, t, output, consulted, name);
}

/* A dense tensor of the given rank and shape (no ld games), with a buffer. */
static FZ_UNUSED void *fz_tensorn(fz *f, xte_tensor *t, xte_dtype dt, int rank,
                                  const int64_t *shape, int output, int consulted,
                                  const char *name) {
  int i;
  memset(t, 0, sizeof *t);
  t->dtype = dt;
  t->rank = rank;
  for (i = 0; i < rank && i < XTE_MAX_RANK; i++) t->shape[i] = shape[i];
  return fz_tensor_buf(f, t, output, consulted, name);
}

/* An index value in [lo, hi) usually, sometimes hostile. */
static FZ_UNUSED int64_t fz_index(fz *f, int64_t lo, int64_t hi, int hostile_k) {
  if (fz_rare(f, hostile_k)) {
    uint8_t b = fz_u8(f);
    if (b & 1) return fz_wadd(hi, b >> 4);
    if (b & 2) return fz_wadd(lo, -1 - (b >> 4));
    return fz_hostile_i64[(b >> 2) % FZ_NHOSTILE];
  }
  if (hi <= lo) return lo;
  return fz_wadd(lo, (int64_t)(fz_u16(f) % ((uint64_t)hi - (uint64_t)lo)));
}

/* Writes an int index value into element i of an int32 / int64 buffer (int32 truncates). */
static FZ_UNUSED void fz_put_index(void *buf, xte_dtype dt, int64_t i, int64_t v) {
  if (dt == XTE_DTYPE_INT64) {
    memcpy((char *)buf + i * 8, &v, 8);
  } else {
    int32_t w = (int32_t)v;
    memcpy((char *)buf + i * 4, &w, 4);
  }
}

static FZ_UNUSED int64_t fz_get_index(const void *buf, xte_dtype dt, int64_t i) {
  if (dt == XTE_DTYPE_INT64) {
    int64_t v;
    memcpy(&v, (const char *)buf + i * 8, 8);
    return v;
  } else {
    int32_t w;
    memcpy(&w, (const char *)buf + i * 4, 4);
    return w;
  }
}

/* ------------------------------------------------------------------ qtensors */
/* The scale buffer of one copy: the shape xte_quantize_scale_shape gives, sometimes one row or
 * column short (too small: the call must fail), sometimes larger. */
static FZ_UNUSED void fz_scale(fz *f, xte_scale_tensor *s, int64_t M, int64_t K,
                               xte_scaling_mode mode, xte_recipe recipe, xte_scale_layout layout,
                               int columnwise, int output, int consulted, const char *name) {
  int64_t r = 0, c = 0, n;
  int mx = recipe == XTE_RECIPE_MX_TE || recipe == XTE_RECIPE_MX_OCP;
  xte_status st = xte_quantize_scale_shape(M, K, mode, recipe, layout, columnwise, &r, &c);
  size_t es;
  memset(s, 0, sizeof *s);
  s->layout = layout;
  s->dtype = mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32;
  if (fz_rare(f, 8)) s->dtype = (xte_dtype)(fz_u8(f) % (XTE_DTYPE_COUNT + 1));
  if (fz_rare(f, 8)) s->layout = (xte_scale_layout)fz_enum(f, XTE_SCALE_LAYOUT_COUNT);
  if (st != XTE_SUCCESS || r < 0 || c < 0 || __builtin_mul_overflow(r, c, &n)) {
    r = fz_u8(f) & 7;
    c = fz_u8(f) & 7;
  } else {
    uint8_t b = fz_u8(f);
    if (b >= 236 && consulted && (r > 0 && c > 0)) {
      /* too small for the copy: the call must not succeed */
      if (b & 1)
        r -= 1;
      else
        c -= 1;
      if (s->dtype == (mx ? XTE_DTYPE_E8M0 : XTE_DTYPE_FP32) && s->layout == layout)
        fz_mark_impossible(name);
    } else if (b >= 226) {
      r = fz_wadd(r, b & 3);
      c = fz_wadd(c, (b >> 2) & 1);
    } else if (b >= 222) {
      int64_t t = r; /* transposed claim */
      r = c;
      c = t;
    }
  }
  s->rows = r;
  s->cols = c;
  es = ((unsigned)s->dtype < XTE_DTYPE_COUNT) ? xte_dtype_size(s->dtype) : 1;
  if (es == 0) es = 1;
  if (r < 0 || c < 0 || __builtin_mul_overflow(r, c, &n) ||
      __builtin_mul_overflow(n, (int64_t)es, &n)) {
    if (consulted) fz_mark_impossible(name);
    s->data = fz_alloc(f, 64, 0, output, name);
    return;
  }
  if ((size_t)n > FZ_CAP_BYTES) {
    fz_g.skip = 1;
    s->data = fz_alloc(f, 64, 0, output, name);
    return;
  }
  s->data = fz_alloc(f, (size_t)n, fz_misalign(f), output, name);
}

/* A (mode, recipe, layout) triple: valid combinations mostly. */
static FZ_UNUSED void fz_recipe(fz *f, xte_scaling_mode *mode, xte_recipe *recipe,
                                xte_scale_layout *layout, int block_only) {
  static const struct {
    xte_scaling_mode m;
    xte_recipe r;
  } combos[] = {
      {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_TE_BLOCK},
      {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM},
      {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_DEEPGEMM_UE8M0},
      {XTE_SCALING_BLOCK_1x128, XTE_RECIPE_MTFP8},
      {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_TE_BLOCK},
      {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_DEEPGEMM},
      {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_DEEPGEMM_UE8M0},
      {XTE_SCALING_BLOCK_128x128, XTE_RECIPE_MTFP8},
      {XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_CURRENT},
      {XTE_SCALING_PER_TENSOR, XTE_RECIPE_TE_DELAYED},
      {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_TE},
      {XTE_SCALING_MXFP8_1x32, XTE_RECIPE_MX_OCP},
  };
  uint8_t b = fz_u8(f);
  int n = block_only ? 4 : 12;
  if (b < 240) {
    int i = fz_u8(f) % n;
    int mx;
    *mode = combos[i].m;
    *recipe = combos[i].r;
    mx = *recipe == XTE_RECIPE_MX_TE || *recipe == XTE_RECIPE_MX_OCP;
    if (mx)
      *layout = (fz_u8(f) & 1) ? XTE_SCALE_LAYOUT_MX_SWIZZLED : XTE_SCALE_LAYOUT_COMPACT;
    else
      *layout = (xte_scale_layout)(fz_u8(f) % 3);
  } else {
    *mode = (xte_scaling_mode)fz_enum(f, XTE_SCALING_COUNT);
    *recipe = (xte_recipe)fz_enum(f, XTE_RECIPE_COUNT);
    *layout = (xte_scale_layout)fz_enum(f, XTE_SCALE_LAYOUT_COUNT);
  }
}

static FZ_UNUSED int fz_col_transposed(xte_recipe r) {
  return !(r == XTE_RECIPE_MTFP8 || r == XTE_RECIPE_MX_TE || r == XTE_RECIPE_MX_OCP);
}

/* A qtensor of an [M, K] tensor X: the rowwise copy [M, K] and / or the columnwise copy
 * ([K, M] for the transposing recipes, else [M, K]), each with its scales. want: bit 0 rowwise,
 * bit 1 columnwise; consult: the copies the call certainly reads or writes (an impossible
 * descriptor there must be rejected). output: the qtensor is written by the call (quantize); else
 * read (gemm). */
static FZ_UNUSED void fz_qtensor(fz *f, xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode,
                                 xte_recipe recipe, xte_scale_layout layout, unsigned want,
                                 unsigned consult, int output, const char *name) {
  static const xte_dtype fp8[] = {XTE_DTYPE_E4M3, XTE_DTYPE_E5M2};
  xte_dtype dt = fz_dtype(f, fp8, 2);
  memset(q, 0, sizeof *q);
  q->scaling_mode = mode;
  q->recipe = recipe;
  if (want & 1) {
    fz_tensor2(f, &q->rowwise, dt, M, K, output, consult & 1, name);
    fz_scale(f, &q->rowwise_scale_inv, M, K, mode, recipe, layout, 0, output, consult & 1, name);
  }
  if (want & 2) {
    int tr = fz_col_transposed(recipe);
    xte_dtype dc = fz_rare(f, 32) ? fz_dtype(f, fp8, 2) : dt;
    fz_tensor2(f, &q->columnwise, dc, tr ? K : M, tr ? M : K, output, (consult >> 1) & 1, name);
    fz_scale(f, &q->columnwise_scale_inv, M, K, mode, recipe, layout, 1, output, (consult >> 1) & 1,
             name);
  }
}

/* ------------------------------------------------------------------ the contract */
static FZ_UNUSED void fz_fail(const char *what, const char *target, xte_status st) {
  fprintf(stderr, "\nxte fuzz %s: CONTRACT VIOLATION: %s (status %s, last error \"%s\"%s%s)\n",
          target, what, xte_status_string(st), xte_last_error(), fz_g.why ? ", impossible: " : "",
          fz_g.why ? fz_g.why : "");
  fflush(stderr);
  __builtin_trap();
}

/* Checks one call's status against the buffers. inputs_const: inputs must never change. */
static int fz_report; /* XTE_FUZZ_REPORT set: every checked call prints its status (make_corpus) */

static FZ_UNUSED void fz_check(xte_status st, const char *target) {
  int i;
  const char *msg = xte_last_error();
  if (fz_report) fprintf(stderr, "xte-fuzz-call %s %s\n", target, xte_status_string(st));
  if (msg == NULL) fz_fail("xte_last_error() returned NULL", target, st);
  if ((unsigned)st > XTE_ERROR_INTERNAL) fz_fail("status is not an xte_status", target, st);
  if (st != XTE_SUCCESS) {
    if (msg[0] == '\0') fz_fail("error with an empty xte_last_error()", target, st);
    for (i = 0; i < fz_g.nb; i++) {
      fz_buf *b = &fz_g.b[i];
      if (memcmp(b->data, b->snap, b->bytes) != 0) {
        fprintf(stderr, "xte fuzz %s: buffer %s (%s, %zu bytes) changed on error\n", target,
                b->name, b->output ? "output" : "input", b->bytes);
        fz_fail("error with a changed buffer byte", target, st);
      }
    }
    return;
  }
  if (msg[0] != '\0') fz_fail("success with a non-empty xte_last_error()", target, st);
  if (fz_g.impossible) fz_fail("success on a descriptor no valid call can have", target, st);
  for (i = 0; i < fz_g.nb; i++) {
    fz_buf *b = &fz_g.b[i];
    if (!b->output && memcmp(b->data, b->snap, b->bytes) != 0) {
      fprintf(stderr, "xte fuzz %s: input buffer %s changed\n", target, b->name);
      fz_fail("success with a changed input buffer", target, st);
    }
  }
}

/* Re-snapshots every buffer (between two calls of one input). */
static FZ_UNUSED void fz_resnap_all(void) {
  int i;
  for (i = 0; i < fz_g.nb; i++) memcpy(fz_g.b[i].snap, fz_g.b[i].data, fz_g.b[i].bytes);
}

/* ------------------------------------------------------------------ setup */
static xte_stream fz_stream;

static FZ_UNUSED void fz_init(void) {
  setenv("XTE_NUM_THREADS", "2", 1);
  setenv("XTE_BACKEND", "cpu", 1);
  fz_report = getenv("XTE_FUZZ_REPORT") != NULL;
  fz_avoid_list = getenv("XTE_FUZZ_AVOID");
  if (xte_stream_create(XTE_BACKEND_CPU, 0, NULL, &fz_stream) != XTE_SUCCESS) {
    fprintf(stderr, "xte fuzz: no CPU stream: %s\n", xte_last_error());
    abort();
  }
}

/* libFuzzer's start-up hook, the same for every target (each target includes this header once). */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fz_init();
  return 0;
}

/* The ISA for this input (the first byte): the kernels differ per ISA. */
static FZ_UNUSED void fz_pick_isa(fz *f) {
  static const xte_cpu_isa isas[] = {XTE_CPU_ISA_SCALAR, XTE_CPU_ISA_AVX2, XTE_CPU_ISA_AVX512,
                                     XTE_CPU_ISA_AVX512};
  xte_cpu_isa isa = isas[fz_u8(f) & 3];
  if (xte_cpu_set_isa(isa) != XTE_SUCCESS) xte_cpu_set_isa(XTE_CPU_ISA_SCALAR);
}

/* The stream of a call: the CPU stream, or NULL (the default backend, the CPU here). */
static FZ_UNUSED xte_stream fz_pick_stream(fz *f) {
  return (fz_u8(f) & 1) ? fz_stream : NULL;
}

#endif /* XTE_FUZZ_COMMON_H */

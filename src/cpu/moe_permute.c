/* CPU token movement: permute / unpermute (and their backward), sort chunks, DeepEP dispatch
 * layout. The row map is built in one sequential pass over the tokens (O(T k)); the data moves
 * in parallel over tokens, each output row written by exactly one token, so the bytes never
 * depend on the thread count. Data-dependent checks come before any write. */
#include <string.h>

#include "cpu/moe_cpu.h"
#include "numerics/xte_math.h"
#include "numerics/xte_moe_numerics.h"

#ifndef XTE_MOE_NAME
/* The generic build of this file: the ISA-independent drivers, and the scalar ISA's kernels
 * (XTE_MOE_NAME(x) = x##_scalar, in src/cpu/scalar/table_scalar.c). src/cpu/avx2/moe_avx2.c
 * compiles the kernels again with -mfma (the explicit fmaf of the shared numerics become one
 * instruction instead of a libm call) under XTE_MOE_NAME(x) = x##_avx2; the results are the same
 * bits (fmaf is exactly rounded). */
#define XTE_MOE_NAME(x) x##_scalar
#define XTE_MOE_GENERIC 1
#endif

static int64_t idx_at(const xte_moe_view *v, int64_t t, int64_t j) {
  return v->dtype == XTE_DTYPE_INT32 ? (int64_t)((const int32_t *)v->data)[t * v->ld + j]
                                     : ((const int64_t *)v->data)[t * v->ld + j];
}

static size_t esize(int dtype) {
  return xte_dtype_size((xte_dtype)dtype);
}

/* Element i of an fp32 / bf16 / fp16 array as fp32 (exact), and fp32 rounded (RNE) into one. */
static inline float ld_f32(int dtype, const void *p, int64_t i) {
  if (dtype == XTE_DTYPE_FP32) return ((const float *)p)[i];
  if (dtype == XTE_DTYPE_BF16) return xte_bf16_to_f32(((const uint16_t *)p)[i]);
  return xte_fp16_to_f32(((const uint16_t *)p)[i]);
}

static inline void st_f32(int dtype, void *p, int64_t i, float x) {
  if (dtype == XTE_DTYPE_FP32)
    ((float *)p)[i] = x;
  else if (dtype == XTE_DTYPE_BF16)
    ((uint16_t *)p)[i] = xte_f32_to_bf16(x);
  else
    ((uint16_t *)p)[i] = xte_f32_to_fp16(x);
}

/* The expert of every slot (T x K, -1 none), validated: indices in [-1, E), no expert twice in
 * a token, at most K experts per token in a map. Returns NULL (error set) on bad data. */
static int32_t *route_slots(const xte_moe_route *r, xte_status *st_out) {
  int32_t *s = NULL;
  int64_t t, j, e, n_slots = 0;
  size_t bytes = 0;
  if (!__builtin_mul_overflow(r->T, r->K, &n_slots) && xte_moe_ws_bytes(n_slots, 4, 0, &bytes))
    s = (int32_t *)xte_aligned_alloc(bytes);
  if (!s) {
    *st_out = xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "routing workspace of %lld x %lld slots",
                            (long long)r->T, (long long)r->K);
    return NULL;
  }
  for (t = 0; t < r->T; t++) {
    int32_t *st = s + t * r->K;
    if (r->map.data) {
      const uint8_t *m = (const uint8_t *)r->map.data + t * r->map.ld;
      int64_t n = 0;
      for (e = 0; e < r->E; e++) {
        if (!m[e]) continue;
        if (n == r->K) {
          xte_aligned_free(s);
          *st_out =
              xte_set_error(XTE_ERROR_SHAPE,
                            "routing->routing_map row %lld routes to more than the %lld experts "
                            "row_map has columns for",
                            (long long)t, (long long)r->K);
          return NULL;
        }
        st[n++] = (int32_t)e;
      }
      for (; n < r->K; n++) st[n] = -1;
    } else {
      for (j = 0; j < r->K; j++) {
        int64_t v = idx_at(&r->idx, t, j), i;
        if (v < -1 || v >= r->E) {
          xte_aligned_free(s);
          *st_out = xte_set_error(
              XTE_ERROR_INVALID_ARGUMENT,
              "routing->topk_idx[%lld, %lld] = %lld: want -1 or an expert in [0, %lld)",
              (long long)t, (long long)j, (long long)v, (long long)r->E);
          return NULL;
        }
        for (i = 0; i < j && v >= 0; i++)
          if (st[i] == v) {
            xte_aligned_free(s);
            *st_out = xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                                    "routing->topk_idx row %lld lists expert %lld twice",
                                    (long long)t, (long long)v);
            return NULL;
          }
        st[j] = (int32_t)v;
      }
    }
  }
  return s;
}

#ifdef XTE_MOE_GENERIC
typedef struct pctx {
  const xte_permute_args *a;
  const int32_t *slots;
  const int64_t *poff, *kept;
  int64_t R;
} pctx;

static void move_rows(void *vctx, int64_t b, int64_t e, int tid) {
  pctx *c = (pctx *)vctx;
  const xte_permute_args *a = c->a;
  const size_t es = esize(a->in.dtype), rb = (size_t)a->in.cols * es;
  const size_t ss = a->in_s.data ? esize(a->in_s.dtype) : 0, sb = (size_t)a->in_s.cols * ss;
  int64_t t, j;
  (void)tid;
  for (t = b; t < e; t++) {
    const int32_t *rm = (const int32_t *)a->row_map.data + t * a->row_map.ld;
    for (j = 0; j < a->r.K; j++) {
      int64_t row = rm[j];
      if (row < 0) continue;
      memcpy((char *)a->out.data + (size_t)row * (size_t)a->out.ld * es,
             (const char *)a->in.data + (size_t)t * (size_t)a->in.ld * es, rb);
      if (ss)
        memcpy((char *)a->out_s.data + (size_t)row * (size_t)a->out_s.ld * ss,
               (const char *)a->in_s.data + (size_t)t * (size_t)a->in_s.ld * ss, sb);
    }
  }
}

/* zero rows: expert padding and the rows past R (work item = expert, or E for the tail) */
static void zero_rows(void *vctx, int64_t b, int64_t e, int tid) {
  pctx *c = (pctx *)vctx;
  const xte_permute_args *a = c->a;
  const size_t es = esize(a->in.dtype), rb = (size_t)a->in.cols * es;
  const size_t ss = a->in_s.data ? esize(a->in_s.dtype) : 0, sb = (size_t)a->in_s.cols * ss;
  int64_t x, row;
  (void)tid;
  for (x = b; x < e; x++) {
    int64_t r0 = x < a->r.E ? c->poff[x] + c->kept[x] : c->R;
    int64_t r1 = x < a->r.E ? c->poff[x + 1] : a->out.rows;
    for (row = r0; row < r1; row++) {
      memset((char *)a->out.data + (size_t)row * (size_t)a->out.ld * es, 0, rb);
      if (ss) memset((char *)a->out_s.data + (size_t)row * (size_t)a->out_s.ld * ss, 0, sb);
    }
  }
}

xte_status xte_cpu_moe_permute(const xte_permute_args *a, void *handle) {
  const int64_t T = a->r.T, E = a->r.E, K = a->r.K;
  int32_t *slots;
  int64_t *count, *poff, *kept, *cursor, t, j, e, uoff, R;
  xte_status st = XTE_SUCCESS;
  pctx c;
  (void)handle;
  size_t cbytes = 0;
  slots = route_slots(&a->r, &st);
  if (!slots) return st;
  count = NULL;
  if (xte_moe_ws_bytes(E, 4 * 8, 8, &cbytes)) count = (int64_t *)xte_aligned_alloc(cbytes);
  if (!count) {
    xte_aligned_free(slots);
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "permute workspace");
  }
  poff = count + E;
  kept = poff + E + 1;
  cursor = kept + E;
  for (e = 0; e < E; e++) count[e] = 0;
  for (t = 0; t < T * K; t++)
    if (slots[t] >= 0) count[slots[t]]++;
  uoff = 0;
  poff[0] = 0;
  for (e = 0; e < E; e++) {
    int64_t k = count[e];
    if (a->cap >= 0) {
      int64_t room = a->cap - uoff;
      k = room < 0 ? 0 : (room < k ? room : k);
    }
    kept[e] = k;
    uoff += count[e];
    poff[e + 1] = poff[e] + (k + a->align - 1) / a->align * a->align;
    cursor[e] = 0;
  }
  R = poff[E];
  if (R > INT32_MAX) { /* row_map is int32 */
    xte_aligned_free(count);
    xte_aligned_free(slots);
    return xte_set_error(XTE_ERROR_SHAPE,
                         "the routing needs %lld output rows: row_map (int32) holds at most %d",
                         (long long)R, INT32_MAX);
  }
  if (a->rows_out) {
    *a->rows_out = R;
    xte_aligned_free(count);
    xte_aligned_free(slots);
    return XTE_SUCCESS;
  }
  if (a->out.rows < R) {
    xte_aligned_free(count);
    xte_aligned_free(slots);
    return xte_set_error(XTE_ERROR_SHAPE,
                         "output has %lld rows: the routing needs %lld (xte_moe_permute_rows)",
                         (long long)a->out.rows, (long long)R);
  }
  /* row map (tokens ascending: the rank within an expert is the token order) */
  for (t = 0; t < T; t++) {
    int32_t *rm = (int32_t *)a->row_map.data + t * a->row_map.ld;
    for (j = 0; j < K; j++) {
      int32_t ex = slots[t * K + j];
      int64_t rank;
      if (ex < 0) {
        rm[j] = -1;
        continue;
      }
      rank = cursor[ex]++;
      rm[j] = rank < kept[ex] ? (int32_t)(poff[ex] + rank) : -1;
    }
  }
  if (a->offsets.data)
    for (e = 0; e <= E; e++) ((int64_t *)a->offsets.data)[e] = poff[e];
  if (a->tpe.data)
    for (e = 0; e < E; e++) {
      if (a->tpe.dtype == XTE_DTYPE_INT32)
        ((int32_t *)a->tpe.data)[e] = (int32_t)kept[e];
      else
        ((int64_t *)a->tpe.data)[e] = kept[e];
    }
  if (a->row_to_expert.data) {
    int32_t *re = (int32_t *)a->row_to_expert.data;
    int64_t r;
    for (e = 0; e < E; e++) {
      for (r = poff[e]; r < poff[e] + kept[e]; r++) re[r] = (int32_t)e;
      for (; r < poff[e + 1]; r++) re[r] = -1;
    }
    for (r = R; r < a->out.rows; r++) re[r] = -1;
  }
  c.a = a;
  c.slots = slots;
  c.poff = poff;
  c.kept = kept;
  c.R = R;
  xte_parallel_for(T, move_rows, &c);
  /* rows of no bytes (an empty [rows, 0] output, no scales) need no zeroing: else the tail
   * [R, rows) alone is up to 2^40 iterations of nothing */
  if (a->in.cols > 0 || (a->in_s.data && a->in_s.cols > 0)) xte_parallel_for(E + 1, zero_rows, &c);
  xte_aligned_free(count);
  xte_aligned_free(slots);
  return XTE_SUCCESS;
}

#endif /* XTE_MOE_GENERIC */

/* ---------------------------------------------------------------- unpermute */

typedef struct uctx {
  const xte_unpermute_args *a;
  const int32_t *slots;
  int which;
} uctx;

static float slot_weight(const xte_unpermute_args *a, const int32_t *slots, int64_t t, int64_t j) {
  if (!a->probs.data) return 1.0f;
  if (a->probs_dense)
    return ((const float *)a->probs.data)[t * a->probs.ld + slots[t * a->r.K + j]];
  return ((const float *)a->probs.data)[t * a->probs.ld + j];
}

#define HCHUNK 2048

/* The unpermute forward one token at a time, the hidden dim in chunks of HCHUNK on the stack:
 * per element, the fmaf chain over the token's slots in ascending j from +0, rounded once. */
static void unpermute_range_portable(void *vctx, int64_t b, int64_t e, int tid) {
  uctx *c = (uctx *)vctx;
  const xte_unpermute_args *a = c->a;
  const int64_t K = a->r.K, H = a->in.cols;
  const size_t ies = esize(a->in.dtype), oes = esize(a->out.dtype);
  float acc[HCHUNK];
  int64_t t, j, h0, h, n;
  (void)tid;
  for (t = b; t < e; t++) {
    const int32_t *rm = (const int32_t *)a->row_map.data + t * a->row_map.ld;
    for (h0 = 0; h0 < H; h0 += HCHUNK) {
      n = H - h0 < HCHUNK ? H - h0 : HCHUNK;
      for (h = 0; h < n; h++) acc[h] = 0.0f;
      for (j = 0; j < K; j++) {
        int64_t row = rm[j];
        float w;
        if (row < 0) continue;
        w = slot_weight(a, c->slots, t, j);
        if (a->in.dtype == XTE_DTYPE_FP32) {
          const float *x = (const float *)a->in.data + row * a->in.ld + h0;
          for (h = 0; h < n; h++) acc[h] = xte_fma_nanprop(w, x[h], acc[h]);
        } else if (a->in.dtype == XTE_DTYPE_BF16) {
          const uint16_t *x = (const uint16_t *)a->in.data + row * a->in.ld + h0;
          for (h = 0; h < n; h++) acc[h] = xte_fma_nanprop(w, xte_bf16_to_f32(x[h]), acc[h]);
        } else {
          const uint16_t *x = (const uint16_t *)a->in.data + row * a->in.ld + h0;
          for (h = 0; h < n; h++) acc[h] = xte_fma_nanprop(w, xte_fp16_to_f32(x[h]), acc[h]);
        }
      }
      if (a->out.dtype == XTE_DTYPE_FP32) {
        memcpy((char *)a->out.data + ((size_t)t * (size_t)a->out.ld + (size_t)h0) * oes, acc,
               (size_t)n * 4);
      } else {
        for (h = 0; h < n; h++) st_f32(a->out.dtype, a->out.data, t * a->out.ld + h0 + h, acc[h]);
      }
    }
  }
  (void)ies;
}

#ifdef XTE_MOE_UNPERMUTE_AVX2
/* The forward on explicit AVX2 (src/cpu/avx2/moe_avx2.c): per token, the hidden dim in blocks of
 * 64 held in 8 registers, each accumulated over the token's slots in ascending j with one fmaf
 * per element (the order of the portable loop), then rounded and stored; the source rows are
 * prefetched ahead (into the next token's rows at the end of a token), and a large output is
 * written with non-temporal stores. */
#define UNP_MAXK 64
#define UNP_PREFETCH 768 /* elements ahead */

typedef struct unp_tok {
  const char *src[UNP_MAXK];
  float w[UNP_MAXK];
  int n;
} unp_tok;

static int unp_gather(const uctx *c, int64_t t, unp_tok *k) {
  const xte_unpermute_args *a = c->a;
  const int32_t *rm = (const int32_t *)a->row_map.data + t * a->row_map.ld;
  const size_t ies = esize(a->in.dtype);
  int64_t j;
  k->n = 0;
  /* fp16 (no lane conversion here) and more slots than the lists hold: the portable loop */
  if (a->r.K > UNP_MAXK || a->in.dtype == XTE_DTYPE_FP16 || a->out.dtype == XTE_DTYPE_FP16)
    return 0;
  for (j = 0; j < a->r.K; j++) {
    if (rm[j] < 0) continue;
    k->src[k->n] = (const char *)a->in.data + (size_t)rm[j] * (size_t)a->in.ld * ies;
    k->w[k->n++] = slot_weight(a, c->slots, t, j);
  }
  return 1;
}

static inline __m256 unp_ld(const char *p, int bf16) {
  if (bf16)
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
  return _mm256_loadu_ps((const float *)p);
}

/* xte_f32_to_bf16 on 8 lanes */
static inline __m128i unp_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                   _mm256_set1_epi32(0x7F800000));
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i rn =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), lsb), 16);
  __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  __m256i r = _mm256_blendv_epi8(rn, qn, nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

static void unpermute_range(void *vctx, int64_t b, int64_t e, int tid) {
  uctx *c = (uctx *)vctx;
  const xte_unpermute_args *a = c->a;
  const int64_t H = a->in.cols;
  const int ibf = a->in.dtype != XTE_DTYPE_FP32, obf = a->out.dtype != XTE_DTYPE_FP32;
  const size_t ies = esize(a->in.dtype), oes = esize(a->out.dtype);
  const int stream = (int64_t)a->out.rows * H * (int64_t)oes >= ((int64_t)8 << 20);
  unp_tok tk[2];
  int cur = 0, have_next;
  int64_t t, h0, j;
  (void)tid;
  if (b >= e) return;
  if (!unp_gather(c, b, &tk[0])) {
    /* fp16, or more slots than the fixed lists hold: the portable loop (the same chains) */
    unpermute_range_portable(vctx, b, e, tid);
    return;
  }
  for (t = b; t < e; t++) {
    const unp_tok *k = &tk[cur];
    char *out = (char *)a->out.data + (size_t)t * (size_t)a->out.ld * oes;
    have_next = t + 1 < e && unp_gather(c, t + 1, &tk[cur ^ 1]);
    for (h0 = 0; h0 + 64 <= H; h0 += 64) {
      __m256 acc[8];
      int q;
      int64_t pf = h0 + UNP_PREFETCH;
      const unp_tok *pk = k;
      if (pf >= H && have_next) {
        pf -= H;
        pk = &tk[cur ^ 1];
      }
      if (pf < H)
        for (j = 0; j < pk->n; j++) {
          const char *p = pk->src[j] + (size_t)pf * ies;
          size_t o;
          for (o = 0; o < 64 * ies; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
        }
      for (q = 0; q < 8; q++) acc[q] = _mm256_setzero_ps();
      for (j = 0; j < k->n; j++) {
        const __m256 w = _mm256_set1_ps(k->w[j]);
        const char *p = k->src[j] + (size_t)h0 * ies;
        for (q = 0; q < 8; q++)
          acc[q] = _mm256_fmadd_ps(w, unp_ld(p + (size_t)q * 8 * ies, ibf), acc[q]);
      }
      if (obf) {
        char *d = out + (size_t)h0 * 2;
        for (q = 0; q < 8; q += 2) {
          __m256i v = _mm256_set_m128i(unp_bf16(acc[q + 1]), unp_bf16(acc[q]));
          if (stream && ((uintptr_t)(d + q * 16) & 31) == 0)
            _mm256_stream_si256((__m256i *)(d + q * 16), v);
          else
            _mm256_storeu_si256((__m256i *)(d + q * 16), v);
        }
      } else {
        float *d = (float *)out + h0;
        for (q = 0; q < 8; q++) {
          if (stream && ((uintptr_t)(d + q * 8) & 31) == 0)
            _mm256_stream_ps(d + q * 8, acc[q]);
          else
            _mm256_storeu_ps(d + q * 8, acc[q]);
        }
      }
    }
    for (; h0 < H; h0++) { /* tail: the same steps one element at a time */
      float acc = 0.0f;
      for (j = 0; j < k->n; j++) {
        const char *p = k->src[j] + (size_t)h0 * ies;
        acc = xte_fma_nanprop(k->w[j],
                              ibf ? xte_bf16_to_f32(*(const uint16_t *)p) : *(const float *)p, acc);
      }
      if (obf)
        ((uint16_t *)out)[h0] = xte_f32_to_bf16(acc);
      else
        ((float *)out)[h0] = acc;
    }
    cur ^= 1;
  }
  if (stream) _mm_sfence();
}
#else
static void unpermute_range(void *vctx, int64_t b, int64_t e, int tid) {
  unpermute_range_portable(vctx, b, e, tid);
}
#endif

static void zero_grad_in(void *vctx, int64_t b, int64_t e, int tid) {
  uctx *c = (uctx *)vctx;
  const xte_moe_view *v = &c->a->grad_in;
  const size_t es = esize(v->dtype);
  int64_t r;
  (void)tid;
  for (r = b; r < e; r++)
    memset((char *)v->data + (size_t)r * (size_t)v->ld * es, 0, (size_t)v->cols * es);
}

/* n elements of row `row` from column h0 of v as fp32 (x) / from fp32 into v. */
static void load_f32_part(const xte_moe_view *v, int64_t row, int64_t h0, int64_t n, float *x) {
  int64_t h;
  if (v->dtype == XTE_DTYPE_FP32) {
    memcpy(x, (const float *)v->data + row * v->ld + h0, (size_t)n * 4);
  } else {
    for (h = 0; h < n; h++) x[h] = ld_f32(v->dtype, v->data, row * v->ld + h0 + h);
  }
}

static void store_f32_part(const xte_moe_view *v, int64_t row, int64_t h0, int64_t n,
                           const float *x) {
  int64_t h;
  if (v->dtype == XTE_DTYPE_FP32) {
    memcpy((float *)v->data + row * v->ld + h0, x, (size_t)n * 4);
  } else {
    for (h = 0; h < n; h++) st_f32(v->dtype, v->data, row * v->ld + h0 + h, x[h]);
  }
}

/* Per token, per slot: the hidden dim in chunks of HCHUNK on the stack (no allocation inside
 * the pool), the dot product carried across the chunks in ascending h. */
static void unpermute_bwd_range(void *vctx, int64_t b, int64_t e, int tid) {
  uctx *c = (uctx *)vctx;
  const xte_unpermute_args *a = c->a;
  const int64_t K = a->r.K, H = a->grad_out.cols;
  float g[HCHUNK], x[HCHUNK];
  int64_t t, j, h, h0, n;
  (void)tid;
  for (t = b; t < e; t++) {
    const int32_t *rm = (const int32_t *)a->row_map.data + t * a->row_map.ld;
    float *gp = a->grad_probs.data ? (float *)a->grad_probs.data + t * a->grad_probs.ld : NULL;
    if (gp)
      for (h = 0; h < a->grad_probs.cols; h++) gp[h] = 0.0f;
    for (j = 0; j < K; j++) {
      int64_t row = rm[j];
      float w;
      double dot = 0.0;
      if (row < 0) continue;
      w = slot_weight(a, c->slots, t, j);
      for (h0 = 0; h0 < H; h0 += HCHUNK) {
        n = H - h0 < HCHUNK ? H - h0 : HCHUNK;
        load_f32_part(&a->grad_out, t, h0, n, g);
        for (h = 0; h < n; h++) x[h] = xte_mul_nanprop(w, g[h]);
        store_f32_part(&a->grad_in, row, h0, n, x);
        if (gp) {
          load_f32_part(&a->fwd_in, row, h0, n, x);
          for (h = 0; h < n; h++) dot = xte_dot_step_f64(dot, g[h], x[h]);
        }
      }
      if (gp) gp[a->probs_dense ? c->slots[t * K + j] : j] = xte_f64_to_f32(dot);
    }
  }
}

/* Every row_map entry checked before anything is written: -1 (no row), or a row in [0, rows) on
 * a slot that has an expert, no row twice (a bitmap over the rows). */
static xte_status check_row_map(const xte_unpermute_args *a, const int32_t *slots, int64_t rows,
                                const char *rows_name) {
  const int64_t T = a->r.T, K = a->r.K;
  size_t nb = 0;
  uint8_t *seen = NULL;
  xte_status st = XTE_SUCCESS;
  int64_t t, j;
  /* row_map entries are int32: no row past INT32_MAX can be named, so the bitmap never needs
   * more than 2^31 bits (256 MiB), whatever the rows of the tensor */
  int64_t nbits = rows < (int64_t)INT32_MAX + 1 ? rows : (int64_t)INT32_MAX + 1, top = 0;
  /* and none past the largest entry in range: a [2^40, 0] tensor of no bytes with a small
   * row_map needs a small bitmap, not 256 MiB zeroed */
  for (t = 0; t < T; t++) {
    const int32_t *rm = (const int32_t *)a->row_map.data + t * a->row_map.ld;
    for (j = 0; j < K; j++)
      if (rm[j] >= top && rm[j] < nbits) top = (int64_t)rm[j] + 1;
  }
  nbits = top;
  if (xte_moe_ws_bytes((nbits + 7) / 8, 1, 0, &nb)) seen = (uint8_t *)xte_aligned_calloc(nb, 1);
  if (!seen) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "row_map check workspace");
  for (t = 0; t < T && st == XTE_SUCCESS; t++) {
    const int32_t *rm = (const int32_t *)a->row_map.data + t * a->row_map.ld;
    for (j = 0; j < K; j++) {
      const int64_t v = rm[j];
      if (v == -1) continue;
      if (v < 0 || v >= rows) {
        st = xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "row_map[%lld, %lld] = %lld: want -1 or a row of %s in [0, %lld)",
                           (long long)t, (long long)j, (long long)v, rows_name, (long long)rows);
        break;
      }
      if (slots[t * K + j] < 0) {
        st = xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "row_map[%lld, %lld] = %lld: the routing has no expert in slot %lld of "
                           "token %lld (want -1)",
                           (long long)t, (long long)j, (long long)v, (long long)j, (long long)t);
        break;
      }
      if (seen[v >> 3] & (1u << (v & 7))) {
        st = xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                           "row_map[%lld, %lld] = %lld: row %lld is mapped by an earlier slot too",
                           (long long)t, (long long)j, (long long)v, (long long)v);
        break;
      }
      seen[v >> 3] |= (uint8_t)(1u << (v & 7));
    }
  }
  xte_aligned_free(seen);
  return st;
}

xte_status XTE_MOE_NAME(xte_cpu_moe_unpermute)(const xte_unpermute_args *a, int which,
                                               void *handle) {
  uctx c;
  int32_t *slots = NULL;
  xte_status st = XTE_SUCCESS;
  (void)handle;
  slots = route_slots(&a->r, &st);
  if (!slots) return st;
  /* the rows the map points into: the input (forward, permute backward) or grad_input */
  if (which == XTE_UNPERMUTE_FWD)
    st = check_row_map(a, slots, a->in.rows, "the input");
  else
    st = check_row_map(a, slots, a->grad_in.rows, "grad_input");
  if (st != XTE_SUCCESS) {
    xte_aligned_free(slots);
    return st;
  }
  c.a = a;
  c.slots = slots;
  c.which = which;
  if (which == XTE_UNPERMUTE_FWD) {
    xte_parallel_for(a->out.rows, unpermute_range, &c);
  } else {
    /* an empty [rows, 0] grad_input has nothing to zero, however many rows it claims */
    if (a->grad_in.cols > 0) xte_parallel_for(a->grad_in.rows, zero_grad_in, &c);
    xte_parallel_for(a->grad_out.rows, unpermute_bwd_range, &c);
  }
  xte_aligned_free(slots);
  return XTE_SUCCESS;
}

#ifdef XTE_MOE_GENERIC
/* ---------------------------------------------------------------- sort chunks */

typedef struct sctx {
  const xte_sort_chunks_args *a;
  const int32_t *map; /* output row of each input row */
} sctx;

static void sort_range(void *vctx, int64_t b, int64_t e, int tid) {
  sctx *c = (sctx *)vctx;
  const xte_sort_chunks_args *a = c->a;
  const size_t es = esize(a->in.dtype), rb = (size_t)a->in.cols * es;
  int64_t r;
  (void)tid;
  for (r = b; r < e; r++) {
    if (a->backward)
      memcpy((char *)a->out.data + (size_t)r * (size_t)a->out.ld * es,
             (const char *)a->in.data + (size_t)c->map[r] * (size_t)a->in.ld * es, rb);
    else
      memcpy((char *)a->out.data + (size_t)c->map[r] * (size_t)a->out.ld * es,
             (const char *)a->in.data + (size_t)r * (size_t)a->in.ld * es, rb);
  }
}

xte_status xte_cpu_moe_sort_chunks(const xte_sort_chunks_args *a, void *handle) {
  const int64_t R = a->in.rows, n = a->n;
  int32_t *map;
  int64_t *start, *dst, i, r, total = 0;
  int need_map;
  sctx c;
  (void)handle;
  if (a->backward) {
    const int32_t *m = (const int32_t *)a->row_map.data;
    for (r = 0; r < R; r++)
      if (m[r] < 0 || m[r] >= R)
        return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "row_map[%lld] = %d: want [0, %lld)",
                             (long long)r, m[r], (long long)R);
    c.a = a;
    c.map = m;
    xte_parallel_for(R, sort_range, &c);
    return XTE_SUCCESS;
  }
  if (R > INT32_MAX) /* the row map is int32 */
    return xte_set_error(XTE_ERROR_SHAPE, "input has %lld rows: row_map (int32) holds at most %d",
                         (long long)R, INT32_MAX);
  /* rows to move or a row map to write: else (an empty [R, 0] input, no row_map) only the
   * checks run, and no R-sized map is made (R may be 2^31 with no byte behind it) */
  need_map = a->in.cols > 0 || a->row_map.data != NULL;
  {
    /* map: int32 [R] (rounded up to 8 bytes), start, dst: int64 [n], seen: uint8 [n] */
    /* R <= INT32_MAX: the offset of start is exact (and 0, not xte_moe_ws_bytes' minimum of one
     * byte, when R = 0: start stays 8-byte aligned) */
    size_t off = need_map ? (size_t)((R + 1) / 2) * 8 : 0, bytes = 0;
    map = NULL;
    if (xte_moe_ws_bytes(n, 17, (int64_t)off, &bytes)) map = (int32_t *)xte_aligned_alloc(bytes);
    if (!map) return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "sort chunks workspace");
    start = (int64_t *)((char *)map + off);
  }
  dst = start + n;
  {
    uint8_t *seen = (uint8_t *)(dst + n);
    memset(seen, 0, (size_t)n);
    for (i = 0; i < n; i++) {
      int64_t s = idx_at(&a->split, 0, i), x = idx_at(&a->index, 0, i);
      /* 0 <= total <= R holds before each step, so total + s cannot overflow once s <= R */
      if (s < 0 || s > R - total) {
        xte_aligned_free(map);
        if (s < 0)
          return xte_set_error(XTE_ERROR_INVALID_ARGUMENT, "split_sizes[%lld] = %lld is negative",
                               (long long)i, (long long)s);
        return xte_set_error(XTE_ERROR_SHAPE,
                             "split_sizes[%lld] = %lld: the sizes up to it sum past the %lld "
                             "input rows",
                             (long long)i, (long long)s, (long long)R);
      }
      if (x < 0 || x >= n || seen[x]) {
        xte_aligned_free(map);
        return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                             "sorted_index[%lld] = %lld: want a permutation of 0..%lld",
                             (long long)i, (long long)x, (long long)(n - 1));
      }
      seen[x] = 1;
      start[i] = total;
      total += s;
    }
  }
  if (total != R) {
    xte_aligned_free(map);
    return xte_set_error(XTE_ERROR_SHAPE, "split_sizes sum to %lld: input has %lld rows",
                         (long long)total, (long long)R);
  }
  if (!need_map) {
    xte_aligned_free(map);
    return XTE_SUCCESS;
  }
  total = 0;
  for (i = 0; i < n; i++) {
    int64_t x = idx_at(&a->index, 0, i);
    dst[x] = total;
    total += idx_at(&a->split, 0, x);
  }
  for (i = 0; i < n; i++)
    for (r = 0; r < idx_at(&a->split, 0, i); r++) map[start[i] + r] = (int32_t)(dst[i] + r);
  if (a->row_map.data) memcpy(a->row_map.data, map, (size_t)R * 4);
  c.a = a;
  c.map = map;
  xte_parallel_for(R, sort_range, &c);
  xte_aligned_free(map);
  return XTE_SUCCESS;
}

/* ---------------------------------------------------------------- dispatch layout */

xte_status xte_cpu_moe_dispatch_layout(const xte_dispatch_args *a, void *handle) {
  const int64_t per = a->E / a->ranks, K = a->idx.cols;
  const int64_t nl = K < a->ranks ? K : a->ranks; /* distinct ranks of one token, at most */
  int64_t t, j, i, n;
  uint8_t *flag;
  int64_t *list;
  (void)handle;
  /* K = 0 (tokens routed nowhere) leaves only the zeroing: no loop over T, which a [2^32, 0]
   * topk_idx of no bytes would otherwise spin through for minutes (fuzz_permute) */
  for (t = 0; K > 0 && t < a->T; t++)
    for (j = 0; j < K; j++) {
      int64_t v = idx_at(&a->idx, t, j);
      if (v < -1 || v >= a->E)
        return xte_set_error(XTE_ERROR_INVALID_ARGUMENT,
                             "topk_idx[%lld, %lld] = %lld: want -1 or an expert in [0, %lld)",
                             (long long)t, (long long)j, (long long)v, (long long)a->E);
    }
  /* flag[r]: token t reaches rank r; list: the ranks set for t, so that a token costs O(K), not
   * O(ranks), where is_token_in_rank is not asked for */
  flag = (uint8_t *)xte_aligned_calloc((size_t)a->ranks, 1);
  list = (int64_t *)xte_aligned_alloc((size_t)(nl > 0 ? nl : 1) * sizeof(int64_t));
  if (!flag || !list) {
    xte_aligned_free(flag);
    xte_aligned_free(list);
    return xte_set_error(XTE_ERROR_OUT_OF_MEMORY, "dispatch layout workspace");
  }
  if (a->tpr.data) memset(a->tpr.data, 0, (size_t)a->ranks * 4);
  if (a->tpe.data) memset(a->tpe.data, 0, (size_t)a->E * 4);
  for (t = 0; (K > 0 || a->in_rank.data) && t < a->T; t++) {
    uint8_t *row = a->in_rank.data ? (uint8_t *)a->in_rank.data + t * a->in_rank.ld : NULL;
    n = 0;
    for (j = 0; j < K; j++) {
      int64_t v = idx_at(&a->idx, t, j);
      if (v < 0) continue;
      if (a->tpe.data) ((int32_t *)a->tpe.data)[v]++;
      if (!flag[v / per]) {
        flag[v / per] = 1;
        list[n++] = v / per;
      }
    }
    if (row) memset(row, 0, (size_t)a->ranks);
    for (i = 0; i < n; i++) {
      if (a->tpr.data) ((int32_t *)a->tpr.data)[list[i]]++;
      if (row) row[list[i]] = 1;
      flag[list[i]] = 0;
    }
  }
  xte_aligned_free(list);
  xte_aligned_free(flag);
  return XTE_SUCCESS;
}
#endif /* XTE_MOE_GENERIC */

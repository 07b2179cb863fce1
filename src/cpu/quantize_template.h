/* The quantize kernels' loops that are one algorithm at every vector width, written once over a
 * small fp32 vector layer and compiled per ISA: src/cpu/avx2/quantize_avx2.c (8 lanes) and
 * src/cpu/avx512/quantize_avx512.c (16 lanes, natively and against SIMDe) define the layer below
 * and include this file, as the GEMM kernels share src/cpu/gemm_template.h. Every output element
 * takes the same operations on every ISA, so the bytes are the scalar kernel's.
 *
 * The including file defines, before including this file:
 *   XQ_W            the fp32 lanes of xq_f
 *   xq_f            the fp32 vector of XQ_W lanes
 *   xq_zero()       +0 in every lane
 *   xq_max(a, b)    lane by lane max, b where either is NaN (maxps)
 *   xq_abs(x)       |x| lane by lane (the sign bit cleared)
 *   xq_ld(p)        an unaligned load of XQ_W floats; xq_st(p, v) an unaligned store
 *   xq_ldk(src, kind, i)   XQ_W elements src[i..] of input kind kind (XTE_NUM_IN_*) as fp32
 *   xq_hmax(v)      the max over v's lanes (v holds no NaN)
 *   xq_stream_u8(d, s)   sizeof(xq_f) bytes from s (unaligned) to d (aligned), non-temporal
 *   xq_w            the integer vector of 2 XQ_W bf16 words; xq_wlo(v), xq_whi(v) its first and
 *                   second XQ_W words as fp32 (the word in the high half of each lane)
 *   XTE_AI          static inline __attribute__((always_inline))
 * It defines the static functions amax_cols and copy_u8 of xte_quant_kernels (src/cpu/xte_cpu.h)
 * and the always-inline ld1, load_amax_row and words_f32. The bodies take the input
 * kind as a constant: the callers inline them into one copy per kind. */
#ifndef XTE_CPU_QUANTIZE_TEMPLATE_H
#define XTE_CPU_QUANTIZE_TEMPLATE_H

/* element i of src (input kind kind) as fp32, the header's conversion */
XTE_AI float ld1(const void *src, int kind, int64_t i) {
  if (kind == XTE_NUM_IN_F32) return ((const float *)src)[i];
  if (kind == XTE_NUM_IN_BF16) return xte_bf16_to_f32(((const uint16_t *)src)[i]);
  return xte_fp16_to_f32(((const uint16_t *)src)[i]);
}

/* max |x| over the n elements of one row (NaN as xte_amax_update has it); with acc, also
 * acc[i] = max(acc[i], |x[i]|). Without acc two accumulators hide the max latency. */
XTE_AI float load_amax_row(const void *src, int kind, int64_t n, float *acc) {
  xq_f m0 = xq_zero(), m1 = xq_zero();
  int64_t i = 0;
  float r;
  if (acc) {
    for (; i + XQ_W <= n; i += XQ_W) {
      xq_f ax = xq_abs(xq_ldk(src, kind, i));
      m0 = xq_max(ax, m0);
      xq_st(acc + i, xq_max(ax, xq_ld(acc + i)));
    }
  } else {
    for (; i + 2 * XQ_W <= n; i += 2 * XQ_W) {
      m0 = xq_max(xq_abs(xq_ldk(src, kind, i)), m0);
      m1 = xq_max(xq_abs(xq_ldk(src, kind, i + XQ_W)), m1);
    }
    for (; i + XQ_W <= n; i += XQ_W) m0 = xq_max(xq_abs(xq_ldk(src, kind, i)), m0);
  }
  r = xq_hmax(xq_max(m0, m1));
  for (; i < n; i++) {
    float x = ld1(src, kind, i);
    r = xte_amax_update(r, x);
    if (acc) acc[i] = xte_amax_update(acc[i], x);
  }
  return r;
}

/* acc[c] = max(acc[c], |x[r][c]|) over rows, XQ_W columns at a time (maxps returns acc where
 * x is NaN: NaN never wins, as xte_amax_update) */
static void amax_cols(const float *x, int64_t rows, int64_t cols, int64_t ld, float *acc) {
  int64_t r, c = 0;
  for (; c + XQ_W <= cols; c += XQ_W) {
    xq_f m = xq_ld(acc + c);
    for (r = 0; r < rows; r++) m = xq_max(xq_abs(xq_ld(x + r * ld + c)), m);
    xq_st(acc + c, m);
  }
  for (; c < cols; c++)
    for (r = 0; r < rows; r++) acc[c] = xte_amax_update(acc[c], x[r * ld + c]);
}

/* The bf16 words of the n vectors w (xq_w: 2 XQ_W words each) as fp32, in order, into dst, or
 * with max into dst[j] = max(word j, dst[j]) (maxps: dst's value where either is NaN) */
XTE_AI void words_f32(float *dst, const xq_w *w, int n, int max) {
  int i;
  for (i = 0; i < n; i++) {
    float *d = dst + 2 * XQ_W * i;
    xq_f x0 = xq_wlo(w[i]), x1 = xq_whi(w[i]);
    if (max) {
      x0 = xq_max(x0, xq_ld(d));
      x1 = xq_max(x1, xq_ld(d + XQ_W));
    }
    xq_st(d, x0);
    xq_st(d + XQ_W, x1);
  }
}

/* n bytes from src to dst; with nt and dst aligned to a vector, non-temporal vector stores */
static void copy_u8(uint8_t *dst, const uint8_t *src, int64_t n, int nt) {
  const int64_t vb = (int64_t)sizeof(xq_f);
  int64_t i = 0;
  if (nt && !((uintptr_t)dst & (uintptr_t)(vb - 1)))
    for (; i + vb <= n; i += vb) xq_stream_u8(dst + i, src + i);
  if (i < n) memcpy(dst + i, src + i, (size_t)(n - i));
}

#endif

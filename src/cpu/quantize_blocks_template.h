/* quant_sq_run (xte_quant_kernels, src/cpu/xte_cpu.h: runs of 128x128 blocks) written once over
 * a per-ISA row conversion: src/cpu/avx2/quantize_avx2_blocks.h (8 lanes) and
 * src/cpu/avx512/quantize_avx512_blocks.h (16 lanes, natively and against SIMDe) define the layer
 * below and include this file at their end, as the GEMM kernels share src/cpu/gemm_template.h.
 *
 * Row r of the run is converted, then row r of the next run read for its tiles' amaxes, then row
 * r of the run after it prefetched into L2: the memory streams while the run converts from L2.
 *
 * The including file defines, before including this file:
 *   XQB_V                  the integer vector type of the ISA (V8, V16)
 *   XQB_ALIGN              its size in bytes (the aligned and non-temporal stores need it)
 *   xqb_zero()             an XQB_V of zeros
 *   XQB_SQ_SCALE_OK(f32, s)   whether scale s takes the ISA's sequence (f32: fp32 input, else bf16)
 *   SQ_GMAX                the most tiles of a run (the tables below hold one entry a tile)
 *   sq_row_k               the run's constants (from its g scales)
 *   sq_row_init(k, g, s, fmt, sat, f32)   fills *k
 *   sq_row_convert(k, p, g, s, d, nt, q2, f32)   row p of the run's g tiles (128 elements each)
 *                          into d (non-temporal when nt), and into q2 + i * 16384 for tile i when
 *                          q2 is not NULL (aligned)
 *   sq_amax_row(p, gn, f32, acc)   acc[i] = max(acc[i], |x| bits of tile i of row p), i < gn
 * and, from its translation unit: hmax_u32, hmax_u16 (of XQB_V), ROW, XTE_AI. */
#ifndef XTE_CPU_QUANTIZE_BLOCKS_TEMPLATE_H
#define XTE_CPU_QUANTIZE_BLOCKS_TEMPLATE_H

XTE_AI void quant_sq_run_body(const void *src, int64_t lds, int64_t nr, int64_t g, const float *s,
                              int fmt, int sat, uint8_t *q, int64_t ldq, int nt, uint8_t *q2,
                              const void *nsrc, int64_t nrn, int64_t gn, float *nam, const void *pf,
                              int64_t pf_rows, int64_t pf_bytes, int f32) {
  const size_t es = f32 ? 4 : 2;
  sq_row_k k;
  XQB_V acc[SQ_GMAX];
  int64_t r, i, rows = nr > nrn ? nr : nrn;
  sq_row_init(&k, g, s, fmt, sat, f32);
  for (i = 0; i < gn; i++) acc[i] = xqb_zero();
  for (r = 0; r < rows; r++) {
    if (r < nr)
      sq_row_convert(&k, ROW(src, r, lds, es), g, s, q + r * ldq, nt, q2 ? q2 + r * 128 : NULL,
                     f32);
    if (r < nrn) sq_amax_row(ROW(nsrc, r, lds, es), gn, f32, acc);
    if (r < pf_rows) {
      const char *x = ROW(pf, r, lds, es);
      int64_t o;
      for (o = 0; o < pf_bytes; o += 64) _mm_prefetch(x + o, _MM_HINT_T1);
    }
  }
  for (i = 0; i < gn; i++) {
    const uint32_t mb = f32 ? hmax_u32(acc[i]) : hmax_u16(acc[i]) << 16;
    nam[i] = mb > 0x7F800000u ? -1.0f : xte_bits_f32(mb);
  }
}

static int quant_sq_run(const void *src, int64_t lds, int in_kind, int64_t nr, int64_t g,
                        const float *s, int fmt, int sat, uint8_t *q, int64_t ldq, int nt,
                        uint8_t *q2, const void *nsrc, int64_t nrn, int64_t gn, float *nam,
                        const void *pf, int64_t pf_rows, int64_t pf_bytes) {
  const int f32 = in_kind == XTE_NUM_IN_F32;
  int64_t i;
  if ((in_kind != XTE_NUM_IN_BF16 && !f32) || g > SQ_GMAX || gn > SQ_GMAX ||
      ((uintptr_t)q2 & (XQB_ALIGN - 1)))
    return 0;
  for (i = 0; i < g; i++)
    if (!XQB_SQ_SCALE_OK(f32, s[i])) return 0;
  nt = nt && !((uintptr_t)q & (XQB_ALIGN - 1)) && !(ldq & (XQB_ALIGN - 1));
  if (f32)
    quant_sq_run_body(src, lds, nr, g, s, fmt, sat, q, ldq, nt, q2, nsrc, nrn, gn, nam, pf, pf_rows,
                      pf_bytes, 1);
  else
    quant_sq_run_body(src, lds, nr, g, s, fmt, sat, q, ldq, nt, q2, nsrc, nrn, gn, nam, pf, pf_rows,
                      pf_bytes, 0);
  return 1;
}

#endif /* XTE_CPU_QUANTIZE_BLOCKS_TEMPLATE_H */

/* quant_blocks (xte_quant_kernels, src/cpu/xte_cpu.h) for any block width, block by block: the
 * amax (load_amax), the scale, then the general sequence (load_quant). The scalar table's
 * quant_blocks, and the AVX-512 one's for the block widths its group kernels do not take.
 * Part of the including translation unit: it defines ROW and its ISA's load_amax and load_quant
 * (the kernel table's signatures) before including this file. */
#ifndef XTE_CPU_QUANTIZE_BLOCKS_EACH_H
#define XTE_CPU_QUANTIZE_BLOCKS_EACH_H

static float quant_blocks_each(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                               int64_t bw, const xte_quant_args *a, uint8_t *q, int64_t ldq,
                               xte_block_scale *sc, float *acc, int nt) {
  const size_t es = in_kind == XTE_NUM_IN_F32 ? 4 : 2;
  const int64_t nbr = (n + bw - 1) / bw;
  float m = 0.0f;
  int64_t r, j, b;
  for (r = 0; r < rows; r++)
    for (j = 0, b = 0; j < n; j += bw, b++) {
      int64_t len = n - j < bw ? n - j : bw;
      const void *s = ROW(src, r, lds, es) + (size_t)j * es;
      float am = load_amax(s, 0, in_kind, 1, len, acc ? acc + j : NULL);
      sc[r * nbr + b] = xte_quant_block_scale(a, am);
      m = xte_fmaxf(m, am);
      (void)load_quant(s, 0, in_kind, 1, len, sc[r * nbr + b].scale, a->fmt, a->saturate,
                       q + r * ldq + j, 0, nt);
    }
  return m;
}

#endif /* XTE_CPU_QUANTIZE_BLOCKS_EACH_H */

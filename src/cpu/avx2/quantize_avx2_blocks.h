/* AVX2 quantize kernels over many blocks at once: quant_blocks (groups of 128-element chunks:
 * the amaxes, the scales, then the quantization, with the bf16-word sequence when every scale is
 * a power of two), quant_rc (the rowwise and the columnwise copy of 1x128 blocks from one read)
 * and quant_sq_run (runs of 128x128 blocks).
 * This file is part of quantize_avx2.c's translation unit, not a standalone header: that file
 * includes it once, after the helpers these kernels use (the fp8 conversion, the TE scale
 * rule, the bf16-word sequences of cpu/p2w.h), and puts them in its kernel table. */
#ifndef XTE_CPU_QUANTIZE_AVX2_BLOCKS_H
#define XTE_CPU_QUANTIZE_AVX2_BLOCKS_H

/* bf16 (f32 0) or fp32 (f32 1: words rounded to odd, acc NULL), blocks of bw = 32 or 128,
 * n % 128 == 0 (acc: n == 128, its maxima kept as words): groups of QG 128-element chunks (in L1):
 * the amaxes, the scales, then the word sequence when every scale of the group is a power of two
 * it takes (else, or with a NaN in the group, the general sequence block by block). */
#define QG 16
XTE_AI float quant_blocks_w(const void *in, int64_t lds, int64_t rows, int64_t n, int bw,
                            const xte_quant_args *a, uint8_t *q, int64_t ldq, xte_block_scale *sc,
                            float *acc, int nt, int f32) {
  const int zb = bw / 16, nb = 128 / bw, kind = f32 ? XTE_NUM_IN_F32 : XTE_NUM_IN_BF16;
  const int64_t es = f32 ? 4 : 2;
  const V8 perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), am = _mm256_set1_epi32(0x7FFFFFFF);
  const int64_t total = rows * (n / 128);
  const p2wk w = p2wk_make(a->fmt, a->saturate);
  const int te = xte_quant_is_te(a);
  const tesk tc = tesk_make(a);
  V8 acw[8];
  float m = 0.0f;
  int64_t t0, r, row = 0, col = 0;
  int nan_seen = 0, i;
  /* offsets of this group's chunks in the input (ci) and the output (cq), the next group's (ni,
   * nq: prefetched); by increment */
  int64_t ci[QG], cq[QG], ni[QG], nq[QG];
  for (i = 0; i < 8; i++) acw[i] = _mm256_setzero_si256();
  nt = nt && !((uintptr_t)q & 31) && !(ldq & 31);
  for (i = 0; i < 2 * QG; i++) {
    if (i < QG) {
      ci[i] = row * lds + col;
      cq[i] = row * ldq + col;
    } else {
      ni[i - QG] = row * lds + col;
      nq[i - QG] = row * ldq + col;
    }
    if ((col += 128) == n) {
      col = 0;
      row++;
    }
  }
  for (t0 = 0; t0 < total; t0 += QG) {
    const int nch = (int)(total - t0 < QG ? total - t0 : QG), nblk = nch * nb;
    xte_block_scale *bs = sc + t0 * nb; /* n % 128 == 0: the group's blocks are consecutive */
    int c, b, t, p2 = 1;
    uint32_t any = 0;
    _Alignas(32) float amf[QG * 4], sf[QG * 4];
    _Alignas(32) uint16_t pd[QG * 4], pt[QG * 4];
    for (c = 0; c < nch; c++) {
      const char *p = (const char *)in + ci[c] * es;
      if (f32) { /* 16 x 8 floats, bw / 8 per block */
        V8 xa[16];
#pragma GCC unroll 16
        for (i = 0; i < 16; i++)
          xa[i] = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 32 * i)), am);
#pragma GCC unroll 4
        for (b = 0; b < nb; b++) {
          V8 mm = xa[b * 2 * zb];
          uint32_t mb;
          for (i = 1; i < 2 * zb; i++) mm = _mm256_max_epu32(mm, xa[b * 2 * zb + i]);
          mb = hmax_u32(mm);
          any |= mb > 0x7F800000u;
          amf[c * nb + b] = xte_bits_f32(mb);
        }
      } else {
        V8 za[8];
#pragma GCC unroll 8
        for (i = 0; i < 8; i++) {
          za[i] = absw(ldw((const uint16_t *)p + 16 * i));
          if (acc) acw[i] = _mm256_max_epu16(acw[i], za[i]);
        }
#pragma GCC unroll 4
        for (b = 0; b < nb; b++) {
          V8 mm = za[b * zb];
          uint32_t mb;
          for (i = 1; i < zb; i++) mm = _mm256_max_epu16(mm, za[b * zb + i]);
          mb = hmax_u16(mm);
          any |= mb > 0x7F80u;
          amf[c * nb + b] = xte_bits_f32(mb << 16);
        }
      }
    }
    if (any) { /* a NaN: block amaxes with NaN never winning, the general sequence */
      nan_seen = 1;
      for (c = 0; c < nch; c++)
        for (b = 0; b < nb; b++)
          amf[c * nb + b] =
              load_amax_r1((const char *)in + (ci[c] + bw * b) * (int64_t)es, kind, bw, NULL);
    }
    if (te && !any) { /* 8 blocks at a time: scales, p2w_ok, p2w_d, p2w_t */
      __m256 mv = _mm256_setzero_ps();
      int over = 0;
      for (t = nblk; t < ((nblk + 7) & ~7); t++) amf[t] = 0.0f; /* te_params8 reads 8 */
      for (t = 0; t < nblk; t += 8)
        mv = _mm256_max_ps(mv, te_params8(&tc, amf + t, nblk - t < 8 ? nblk - t : 8, a->fmt, bs + t,
                                          sf + t, pd + t, pt + t, &p2, &over));
      m = xte_fmaxf(m, hmax8(mv));
    } else {
      for (t = 0; t < nblk; t++) {
        bs[t] = xte_quant_block_scale(a, amf[t]);
        sf[t] = bs[t].scale;
        m = xte_fmaxf(m, amf[t]);
        p2 &= p2w_ok(bs[t].scale);
        pd[t] = p2w_d(sf[t], a->fmt);
        pt[t] = p2w_t(sf[t], a->fmt);
      }
    }
    if (p2 && !any) {
      for (c = 0; c < nch; c++) {
        const char *p = (const char *)in + ci[c] * es;
        if (t0 + QG + c < total) /* the next group's chunk c into L1 */
          for (i = 0; i < 128 * es; i += 64)
            _mm_prefetch((const char *)in + ni[c] * es + i, _MM_HINT_T0);
        xte_prefetch_far(a, p, (size_t)(128 * es));
#pragma GCC unroll 4
        for (i = 0; i < 8; i += 2) { /* 32 elements */
          const int tb = c * nb + i / zb;
          const V8 d = _mm256_set1_epi16((short)pd[tb]);
          const V8 th = _mm256_set1_epi16((short)pt[tb]);
          const __m256 sv = _mm256_set1_ps(sf[tb]);
          V8 z0, z1;
          ldw32(p, i, f32, &z0, &z1);
          {
            const V8 bb = p2w_codes1(&w, z0, z1, d, th, sv, 1, P2W_SUB_RARE);
            /* in order: the 64-bit quarters (bf16 words), the 32-bit groups (fp32) */
            p2w_st(q + cq[c] + 16 * i, f32 ? _mm256_permutevar8x32_epi32(bb, perm) : p2w_order(bb),
                   nt);
          }
        }
      }
    } else {
      for (c = 0; c < nch; c++)
        for (b = 0; b < nb; b++)
          (void)load_quant_r1((const char *)in + (ci[c] + bw * b) * (int64_t)es, kind, bw,
                              sf[c * nb + b], a->fmt, a->saturate, q + cq[c] + bw * b, nt);
    }
    for (c = 0; c < QG; c++) { /* the next group's chunks, and the one after's */
      ci[c] = ni[c];
      cq[c] = nq[c];
      ni[c] = row * lds + col;
      nq[c] = row * ldq + col;
      if ((col += 128) == n) {
        col = 0;
        row++;
      }
    }
  }
  if (acc) {
    if (nan_seen) {
      for (r = 0; r < rows; r++)
        (void)load_amax_r1((const uint16_t *)in + r * lds, XTE_NUM_IN_BF16, 128, acc);
    } else {
      words_f32(acc, acw, 8, 1);
    }
  }
  return m;
}
#undef QG

/* The blocks of all rows, 16 at a time: the amax pass, the scales (independent divisions), then
 * the quantizing pass (the blocks are in L1 by then). */
/* Blocks of bw (8 | bw, bw | 128) elements, the full 128-element chunks of all rows QG at a time
 * (in L1): block amaxes, the scales, then the fast sequence when the group is NaN-free and its
 * scales finite and > 0 (else the general one), prefetching the next group's chunks while it
 * converts. Each row's tail (n % 128) after, block by block. */
#define QG 16
XTE_AI float quant_blocks_grp(const void *src, int64_t lds, int kind, int64_t rows, int64_t n,
                              int bw, const xte_quant_args *a, uint8_t *q, int64_t ldq,
                              xte_block_scale *sc, float *acc, int nt) {
  const size_t es = kind == XTE_NUM_IN_F32 ? 4 : 2;
  const int nvb = bw / 8, nb = 128 / bw;
  const int64_t cpr = n / 128, nbr = (n + bw - 1) / bw, total = rows * cpr;
  const fp8k k = fp8k_make(a->fmt, a->saturate);
  float m = 0.0f;
  int64_t t0, r;
  nt = nt && !((uintptr_t)q & 31) && !(ldq & 31);
  for (t0 = 0; t0 < total; t0 += QG) {
    const int nch = (int)(total - t0 < QG ? total - t0 : QG);
    int64_t cr[QG], co[QG];
    int c, v, b, fast = 1;
    uint32_t any = 0;
    float amf[QG * 16], sf[QG * 16];
    for (c = 0; c < nch; c++) {
      cr[c] = (t0 + c) / cpr;
      co[c] = (t0 + c - cr[c] * cpr) * 128;
    }
    for (c = 0; c < nch; c++) {
      const void *s = ROW(src, cr[c], lds, es);
      for (b = 0; b < nb; b++) {
        V8 mm = _mm256_setzero_si256();
        uint32_t mb;
        for (v = 0; v < nvb; v++) {
          const int64_t o = co[c] + bw * b + 8 * v;
          __m256 ax = abs8(ld8(s, kind, o));
          mm = _mm256_max_epu32(mm, _mm256_castps_si256(ax));
          if (acc) _mm256_storeu_ps(acc + o, _mm256_max_ps(ax, _mm256_loadu_ps(acc + o)));
        }
        mb = hmax_u32(mm);
        any |= mb > 0x7F800000u;
        amf[c * nb + b] = xte_bits_f32(mb);
      }
    }
    if (any) /* a NaN: block amaxes with NaN never winning */
      for (c = 0; c < nch; c++)
        for (b = 0; b < nb; b++)
          amf[c * nb + b] =
              load_amax_row((const char *)ROW(src, cr[c], lds, es) + (size_t)(co[c] + bw * b) * es,
                            kind, bw, NULL);
    for (c = 0; c < nch; c++)
      for (b = 0; b < nb; b++) {
        xte_block_scale bs = xte_quant_block_scale(a, amf[c * nb + b]);
        sc[cr[c] * nbr + co[c] / bw + b] = bs;
        sf[c * nb + b] = bs.scale;
        m = xte_fmaxf(m, amf[c * nb + b]);
        fast &= pos_finite(bs.scale);
      }
    for (c = 0; c < nch; c++) {
      const void *s = ROW(src, cr[c], lds, es);
      uint8_t *d = q + cr[c] * ldq + co[c];
      if (t0 + QG + c < total) { /* the next group's chunk c into L1 */
        const int64_t tn = t0 + QG + c;
        const char *pn = ROW(src, tn / cpr, lds, es) + (size_t)(tn % cpr) * 128 * es;
        for (v = 0; v < (int)(128 * es); v += 64) _mm_prefetch(pn + v, _MM_HINT_T0);
      }
      xte_prefetch_far(a, (const char *)s + (size_t)co[c] * es, 128 * es);
      for (v = 0; v < 16; v += 4) {
        const __m256 sv = _mm256_set1_ps(sf[c * nb + 8 * v / bw]);
        __m256 x0 = ld8(s, kind, co[c] + 8 * v), x1 = ld8(s, kind, co[c] + 8 * v + 8);
        __m256 x2 = ld8(s, kind, co[c] + 8 * v + 16), x3 = ld8(s, kind, co[c] + 8 * v + 24);
        V8 r0, r1, r2, r3;
        if (fast && !any) {
          r0 = cvt_scaled(&k, x0, abs8(x0), sv);
          r1 = cvt_scaled(&k, x1, abs8(x1), sv);
          r2 = cvt_scaled(&k, x2, abs8(x2), sv);
          r3 = cvt_scaled(&k, x3, abs8(x3), sv);
        } else {
          r0 = cvt(&k, _mm256_mul_ps(x0, sv));
          r1 = cvt(&k, _mm256_mul_ps(x1, sv));
          r2 = cvt(&k, _mm256_mul_ps(x2, sv));
          r3 = cvt(&k, _mm256_mul_ps(x3, sv));
        }
        if (nt)
          store32nt(d + 8 * v, r0, r1, r2, r3);
        else
          store32(d + 8 * v, r0, r1, r2, r3);
      }
    }
  }
  if (n > cpr * 128)
    for (r = 0; r < rows; r++) {
      const char *s = ROW(src, r, lds, es);
      int64_t j, bi;
      for (j = cpr * 128, bi = cpr * nb; j < n; j += bw, bi++) {
        const int64_t len = n - j < bw ? n - j : bw;
        const float am = load_amax_row(s + (size_t)j * es, kind, len, acc ? acc + j : NULL);
        const xte_block_scale bs = xte_quant_block_scale(a, am);
        sc[r * nbr + bi] = bs;
        m = xte_fmaxf(m, am);
        (void)load_quant_slow(s + (size_t)j * es, kind, len, bs.scale, a->fmt, a->saturate,
                              q + r * ldq + j, 0);
      }
    }
  return m;
}
#undef QG

/* one copy of quant_blocks_w per input kind */
static float quant_blocks_bf16(const void *src, int64_t lds, int64_t rows, int64_t n, int bw,
                               const xte_quant_args *a, uint8_t *q, int64_t ldq,
                               xte_block_scale *sc, float *acc, int nt) {
  return quant_blocks_w(src, lds, rows, n, bw, a, q, ldq, sc, acc, nt, 0);
}

static float quant_blocks_f32(const void *src, int64_t lds, int64_t rows, int64_t n, int bw,
                              const xte_quant_args *a, uint8_t *q, int64_t ldq, xte_block_scale *sc,
                              int nt) {
  return quant_blocks_w(src, lds, rows, n, bw, a, q, ldq, sc, NULL, nt, 1);
}

static float quant_blocks(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                          int64_t bw, const xte_quant_args *a, uint8_t *q, int64_t ldq,
                          xte_block_scale *sc, float *acc, int nt) {
  const size_t es = in_kind == XTE_NUM_IN_F32 ? 4 : 2;
  const int64_t nbr = (n + bw - 1) / bw, total = rows * nbr;
  float m = 0.0f;
  int64_t t0, t;
  if (in_kind == XTE_NUM_IN_BF16 && (bw == 128 || bw == 32) && n % 128 == 0 && (!acc || n == 128))
    return quant_blocks_bf16(src, lds, rows, n, (int)bw, a, q, ldq, sc, acc, nt);
  if (in_kind == XTE_NUM_IN_F32 && (bw == 128 || bw == 32) && n % 128 == 0 && !acc)
    return quant_blocks_f32(src, lds, rows, n, (int)bw, a, q, ldq, sc, nt);
#define QB(KIND, BW) return quant_blocks_grp(src, lds, KIND, rows, n, BW, a, q, ldq, sc, acc, nt)
  if (bw == 128) {
    if (in_kind == XTE_NUM_IN_F32) QB(XTE_NUM_IN_F32, 128);
    if (in_kind == XTE_NUM_IN_BF16) QB(XTE_NUM_IN_BF16, 128);
    QB(XTE_NUM_IN_F16, 128);
  }
  if (bw == 32) {
    if (in_kind == XTE_NUM_IN_F32) QB(XTE_NUM_IN_F32, 32);
    if (in_kind == XTE_NUM_IN_BF16) QB(XTE_NUM_IN_BF16, 32);
    QB(XTE_NUM_IN_F16, 32);
  }
#undef QB
  nt = nt && !(ldq & 31);
  for (t0 = 0; t0 < total; t0 += 16) {
    const int64_t nb = total - t0 < 16 ? total - t0 : 16;
    float am[16];
    for (t = 0; t < nb; t++) {
      const int64_t r = (t0 + t) / nbr, j = (t0 + t - r * nbr) * bw, len = n - j < bw ? n - j : bw;
      am[t] =
          load_amax_r1(ROW(src, r, lds, es) + (size_t)j * es, in_kind, len, acc ? acc + j : NULL);
      m = xte_fmaxf(m, am[t]);
    }
    for (t = 0; t < nb; t++) sc[t0 + t] = xte_quant_block_scale(a, am[t]);
    for (t = 0; t < nb; t++) {
      const int64_t r = (t0 + t) / nbr, j = (t0 + t - r * nbr) * bw, len = n - j < bw ? n - j : bw;
      (void)load_quant_r1(ROW(src, r, lds, es) + (size_t)j * es, in_kind, len, sc[t0 + t].scale,
                          a->fmt, a->saturate, q + r * ldq + j, nt);
    }
  }
  return m;
}

/* ---------------------------------------------------------------- one read, both copies
 * quant_rc (see the kernel table): a 128-column tile of bf16 or fp32 input in 1 x 128 row blocks
 * and 128 x 1 column blocks. A first pass for the exact maxima of each row and each column, the
 * scales, then per row the row codes (its scale broadcast) and the column codes (the columns'
 * scales per lane) from the same words: bf16 words, or for fp32 the bf16 words rounded to odd (the
 * high half, the low bit set when the low half is not zero), which round at the fp8 precision or
 * the subnormal quantum (two or more bits below the kept ones) as x itself does and are below T
 * exactly when x is. */

/* The first pass of quant_rc and the tile's parameters: rsc, csc, pd / pt / sl / sh by word
 * position, *amax, and *clamp 0 when no |x| s of the tile passes the largest finite value (true
 * for the TE and DeepGEMM scales). 0: not a tile for the word sequence. */
static int rc_prepare(const void *src, int64_t lds, int64_t nr, const xte_quant_args *a, int f32,
                      xte_block_scale *rsc, xte_block_scale *csc, float *rs, uint16_t *rd,
                      uint16_t *rt, uint16_t *pd, uint16_t *pt, float *sl, float *sh, float *amax,
                      int *clamp) {
  const size_t es = f32 ? 4 : 2;
  const float fmax = xte_fp8_max(a->fmt);
  V8 acc[16];
  _Alignas(32) float ram[128], cam[128], cs[128];
  _Alignas(32) uint16_t pdn[128], ptn[128];
  int col[128];
  uint32_t bad = 0;
  int64_t r;
  int i, j, over = 0;
  for (i = 0; i < 16; i++) acc[i] = _mm256_setzero_si256();
  for (r = 0; r < nr; r++) {
    const char *p = (const char *)src + (size_t)r * (size_t)lds * es;
    V8 mm = _mm256_setzero_si256();
    uint32_t mb;
    if (f32) {
      for (i = 0; i < 16; i++) {
        V8 x = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(p + 32 * i)),
                                _mm256_set1_epi32(0x7FFFFFFF));
        acc[i] = _mm256_max_epu32(acc[i], x);
        mm = _mm256_max_epu32(mm, x);
      }
      mb = hmax_u32(mm);
      bad |= mb > 0x7F800000u;
      ram[r] = xte_bits_f32(mb);
    } else {
      for (i = 0; i < 8; i++) {
        V8 x = absw(ldw((const uint16_t *)p + 16 * i));
        acc[i] = _mm256_max_epu16(acc[i], x);
        mm = _mm256_max_epu16(mm, x);
      }
      mb = hmax_u16(mm);
      bad |= mb > 0x7F80u;
      ram[r] = xte_bits_f32(mb << 16);
    }
  }
  if (bad) return 0;
  if (f32) {
    for (i = 0; i < 16; i++) _mm256_store_si256((__m256i *)(cam + 8 * i), acc[i]);
  } else {
    words_f32(cam, acc, 8, 0);
  }
  for (i = 0; i < 128; i++) col[i] = f32 ? p2w_rto_col(i, 16) : i;
  if (xte_quant_is_te(a)) { /* 8 scales at a time, with their word-path parameters */
    const tesk tc = tesk_make(a);
    __m256 mv = _mm256_setzero_ps();
    int ok = 1;
    for (r = nr; r < ((nr + 7) & ~7); r++) ram[r] = 0.0f; /* te_params8 reads 8 */
    for (r = 0; r < nr; r += 8)
      mv = _mm256_max_ps(mv, te_params8(&tc, ram + r, nr - r < 8 ? (int)(nr - r) : 8, a->fmt,
                                        rsc + r, rs + r, rd + r, rt + r, &ok, &over));
    for (i = 0; i < 128; i += 8)
      (void)te_params8(&tc, cam + i, 8, a->fmt, csc + i, cs + i, pdn + i, ptn + i, &ok, &over);
    if (!ok) return 0;
    *amax = hmax8(mv);
    for (i = 0; i < 128; i++) { /* by word position */
      pd[i] = pdn[col[i]];
      pt[i] = ptn[col[i]];
    }
  } else {
    block_scales(a, ram, nr, rsc);
    block_scales(a, cam, 128, csc);
    if (!p2w_tile_params(a, rsc, ram, nr, csc, col, pd, pt, amax)) return 0;
    over |= p2w_row_params(rsc, ram, nr, a->fmt, fmax, rs, rd, rt);
    for (i = 0; i < 128; i++) {
      cs[i] = csc[i].scale;
      over |= !(cam[i] * csc[i].scale <= fmax);
    }
  }
  *clamp = over;
  for (i = 0; i < 128; i += 16) /* the fma's scales: words 0-3, 8-11 (lo) and 4-7, 12-15 (hi) */
    for (j = 0; j < 4; j++) {
      sl[i / 2 + j] = cs[col[i + j]];
      sl[i / 2 + 4 + j] = cs[col[i + 8 + j]];
      sh[i / 2 + j] = cs[col[i + 4 + j]];
      sh[i / 2 + 4 + j] = cs[col[i + 12 + j]];
    }
  return 1;
}

/* The second pass of quant_rc: per row the row codes and the column codes of the same words */
XTE_AI void rc_convert(const void *src, int64_t lds, int64_t nr, const xte_quant_args *a,
                       uint8_t *rq, int64_t ldrq, const float *rs, const uint16_t *rd,
                       const uint16_t *rt, uint8_t *cq, const uint16_t *pd, const uint16_t *pt,
                       const float *sl, const float *sh, const void *pf, int64_t pf_rows, int nt,
                       int f32, int clamp) {
  const size_t es = f32 ? 4 : 2;
  const p2wk w = p2wk_make(a->fmt, a->saturate);
  const V8 perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t r;
  int i, j;
  for (r = 0; r < nr; r++) {
    const char *p = (const char *)src + (size_t)r * (size_t)lds * es;
    const V8 d = _mm256_set1_epi16((short)rd[r]), t = _mm256_set1_epi16((short)rt[r]);
    const __m256 sv = _mm256_set1_ps(rs[r]);
    if (pf && r < pf_rows) {
      const char *pn = (const char *)pf + (size_t)r * (size_t)lds * es;
      for (j = 0; j < (int)(128 * es); j += 64) _mm_prefetch(pn + j, _MM_HINT_T1);
    }
    V8 zb[8];
    for (i = 0; i < 8; i += 2) { /* the row codes (and the words, kept for the column codes) */
      V8 z0, z1, br;
      ldw32(p, i, f32, &z0, &z1);
      zb[i] = z0;
      zb[i + 1] = z1;
      br = p2w_codes1(&w, z0, z1, d, t, sv, clamp, P2W_SUB_RARE);
      /* in order: the 64-bit quarters (bf16 words), the 32-bit groups of rto_words (fp32) */
      br = f32 ? _mm256_permutevar8x32_epi32(br, perm) : _mm256_permute4x64_epi64(br, 0xD8);
      if (nt)
        _mm256_stream_si256((__m256i *)(rq + r * ldrq + 16 * i), br);
      else
        _mm256_storeu_si256((__m256i *)(rq + r * ldrq + 16 * i), br);
    }
    for (i = 0; i < 8; i += 2) { /* the column codes */
      const V8 z0 = zb[i], z1 = zb[i + 1];
      V8 bc = p2w_codes(
          &w, z0, _mm256_load_si256((const __m256i *)(pd + 16 * i)),
          _mm256_load_si256((const __m256i *)(pt + 16 * i)), _mm256_load_ps(sl + 8 * i),
          _mm256_load_ps(sh + 8 * i), z1, _mm256_load_si256((const __m256i *)(pd + 16 * i + 16)),
          _mm256_load_si256((const __m256i *)(pt + 16 * i + 16)), _mm256_load_ps(sl + 8 * i + 8),
          _mm256_load_ps(sh + 8 * i + 8), clamp, P2W_SUB_ALWAYS);
      bc = f32 ? _mm256_permutevar8x32_epi32(bc, perm) : _mm256_permute4x64_epi64(bc, 0xD8);
      _mm256_storeu_si256((__m256i *)(cq + r * 128 + 16 * i), bc);
    }
  }
}

static int quant_rc(const void *src, int64_t lds, int64_t nr, const xte_quant_args *a, uint8_t *rq,
                    int64_t ldrq, xte_block_scale *rsc, uint8_t *cq, xte_block_scale *csc,
                    float *amax, const void *pf, int64_t pf_rows, int nt) {
  const int f32 = a->in_kind == XTE_NUM_IN_F32;
  _Alignas(32) float sl[128], sh[128], rs[128];
  _Alignas(32) uint16_t pd[128], pt[128], rd[128], rt[128];
  int clamp;
  if ((!f32 && a->in_kind != XTE_NUM_IN_BF16) || nr < 1 || nr > 128 ||
      !rc_prepare(src, lds, nr, a, f32, rsc, csc, rs, rd, rt, pd, pt, sl, sh, amax, &clamp))
    return 0;
  nt = nt && !((uintptr_t)rq & 31) && !(ldrq & 31);
#define RC(F, C) \
  rc_convert(src, lds, nr, a, rq, ldrq, rs, rd, rt, cq, pd, pt, sl, sh, pf, pf_rows, nt, F, C)
  if (f32 && clamp)
    RC(1, 1);
  else if (f32)
    RC(1, 0);
  else if (clamp)
    RC(0, 1);
  else
    RC(0, 0);
#undef RC
  return 1;
}

/* ---------------------------------------------------------------- 128x128 runs (quant_sq_run)
 * src/cpu/quantize_blocks_template.h over the amax of a row of tiles and the conversion below. */
#define SQ_GMAX 16

XTE_AI void sq_amax_row(const char *p, int64_t gn, int f32, V8 *acc) {
  int64_t i;
  int j;
  if (f32) {
    const V8 m = _mm256_set1_epi32(0x7FFFFFFF);
    for (i = 0; i < gn; i++) {
      const __m256i *x = (const __m256i *)(p + i * 512);
      V8 u0 = _mm256_setzero_si256(), u1 = _mm256_setzero_si256();
      for (j = 0; j < 16; j += 2) {
        u0 = _mm256_max_epu32(u0, _mm256_and_si256(_mm256_loadu_si256(x + j), m));
        u1 = _mm256_max_epu32(u1, _mm256_and_si256(_mm256_loadu_si256(x + j + 1), m));
      }
      acc[i] = _mm256_max_epu32(acc[i], _mm256_max_epu32(u0, u1));
    }
  } else {
    for (i = 0; i < gn; i++) {
      const uint16_t *x = (const uint16_t *)(p + i * 256);
      V8 u0 = _mm256_setzero_si256(), u1 = _mm256_setzero_si256();
      for (j = 0; j < 128; j += 32) {
        u0 = _mm256_max_epu16(u0, absw(ldw(x + j)));
        u1 = _mm256_max_epu16(u1, absw(ldw(x + j + 16)));
      }
      acc[i] = _mm256_max_epu16(acc[i], _mm256_max_epu16(u0, u1));
    }
  }
}

/* quant_sq_run's row conversion (src/cpu/quantize_blocks_template.h): load_quant_p2w's sequence
 * on bf16 words, or on fp32 words rounded to odd */
typedef struct sq_row_k {
  p2wk w;
  _Alignas(32) uint16_t pd[SQ_GMAX], pt[SQ_GMAX];
} sq_row_k;

XTE_AI void sq_row_init(sq_row_k *k, int64_t g, const float *s, int fmt, int sat, int f32) {
  int64_t i;
  (void)f32;
  k->w = p2wk_make(fmt, sat);
  for (i = 0; i < g; i++) {
    k->pd[i] = p2w_d(s[i], fmt);
    k->pt[i] = p2w_t(s[i], fmt);
  }
}

XTE_AI void sq_row_convert(const sq_row_k *k, const char *p, int64_t g, const float *s, uint8_t *d,
                           int nt, uint8_t *q2, int f32) {
  const size_t es = f32 ? 4 : 2;
  const V8 perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i;
  for (i = 0; i < g; i++) {
    const V8 dv = _mm256_set1_epi16((short)k->pd[i]), tv = _mm256_set1_epi16((short)k->pt[i]);
    const __m256 sv = _mm256_set1_ps(s[i]);
    int j;
    for (j = 0; j < 4; j++) { /* 32 elements */
      V8 z0, z1, b;
      ldw32(p + (size_t)i * 128 * es, 2 * j, f32, &z0, &z1);
      b = p2w_codes1(&k->w, z0, z1, dv, tv, sv, 1, P2W_SUB_ALWAYS);
      b = f32 ? _mm256_permutevar8x32_epi32(b, perm) : _mm256_permute4x64_epi64(b, 0xD8);
      p2w_st(d + i * 128 + 32 * j, b, nt);
      if (q2) _mm256_store_si256((__m256i *)(q2 + i * 16384 + 32 * j), b);
    }
  }
}

#define XQB_V V8
#define XQB_ALIGN 32
#define xqb_zero() _mm256_setzero_si256()
#define XQB_SQ_SCALE_OK(f32, s) p2w_ok(s)
#include "cpu/quantize_blocks_template.h"

#endif /* XTE_CPU_QUANTIZE_AVX2_BLOCKS_H */

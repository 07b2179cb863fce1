/* AVX-512 quantize kernels over many blocks at once (both builds, native and SIMDe): quant_blocks
 * (groups of 128-element chunks: the amaxes, the scales, then the quantization, with the bf16-word
 * sequence when every scale is a power of two), quant_rc (the rowwise and the columnwise copy of
 * 1x128 blocks from one read) and quant_sq_run (runs of 128x128 blocks).
 * This file is part of quantize_avx512.c's translation unit, not a standalone header: that file
 * includes it once, after the helpers these kernels use (the fp8 conversion, the TE scale
 * rule, the bf16-word sequences of cpu/p2w.h), and puts them in its kernel table. */
#ifndef XTE_CPU_QUANTIZE_AVX512_BLOCKS_H
#define XTE_CPU_QUANTIZE_AVX512_BLOCKS_H

#define QG 16

/* The positions (row, column) of QG consecutive 128-element chunks of rows of w elements (w a
 * multiple of 128) from *row, *col on, which advance past them */
XTE_AI void chunk_pos(int64_t *row, int64_t *col, int64_t w, int64_t *cr, int64_t *co) {
  int c;
  for (c = 0; c < QG; c++) {
    cr[c] = *row;
    co[c] = *col;
    if ((*col += 128) == w) {
      *col = 0;
      ++*row;
    }
  }
}

XTE_AI void prefetch_l1(const void *p, size_t bytes) {
  size_t o;
  for (o = 0; o < bytes; o += 64) _mm_prefetch((const char *)p + o, _MM_HINT_T0);
}

/* The general scales of a group's nblk blocks of maxima amf: bs, sf (the scale of each), *m the
 * running max of the maxima; 1 when every scale is finite and > 0 (the fast sequences' case) */
XTE_AI int group_scales(const xte_quant_args *a, const float *amf, int nblk, xte_block_scale *bs,
                        float *sf, float *m) {
  int t, fast = 1;
  block_scales(a, amf, nblk, bs);
  for (t = 0; t < nblk; t++) {
    sf[t] = bs[t].scale;
    *m = xte_fmaxf(*m, amf[t]);
    fast &= pos_finite(bs[t].scale);
  }
  return fast;
}

/* Blocks of bw (16 | bw, bw | 128) elements. The full 128-element chunks of all rows are taken
 * QG at a time (in L1): a first pass for the block amaxes, the scales (independent divisions,
 * pipelined), a second pass to convert and store: the fast sequence when the chunks are NaN-free
 * and the scales finite and > 0, else the general one. Each row's tail (n % 128) after. */
XTE_AI float quant_blocks_body(const void *src, int64_t lds, int kind, int64_t rows, int64_t n,
                               int bw, const xte_quant_args *a, uint8_t *q, int64_t ldq,
                               xte_block_scale *sc, float *acc, int nt) {
  const size_t es = kind == XTE_NUM_IN_F32 ? 4 : 2;
  const int nvb = bw / 16, nb = 128 / bw;
  const int64_t cpr = n / 128, nbr = (n + bw - 1) / bw, total = rows * cpr;
  fp8k k = fp8k_make(a->fmt, a->saturate);
  const int te = xte_quant_is_te(a);
  const tesk tc = tesk_make(a);
  float m = 0.0f;
  int64_t t0, r, cr[QG], co[QG], pr[QG], pc[QG], prow = 0, pcol = 0;
  nt = nt && !((uintptr_t)q & 63) && !(ldq & 63);
  chunk_pos(&prow, &pcol, cpr * 128, cr, co); /* row, column of each chunk */
  for (t0 = 0; t0 < total; t0 += QG) {
    const int nch = (int)(total - t0 < QG ? total - t0 : QG);
    int c, v, b, fast = 1;
    uint32_t bm[QG * 8], any = 0;
    float sf[QG * 8];
    chunk_pos(&prow, &pcol, cpr * 128, pr, pc); /* the next group's (prefetched) */
    for (c = 0; c < nch; c++) {
      const void *s = ROW(src, cr[c], lds, es);
      const int64_t o = co[c];
      V16 av[8];
#pragma GCC unroll 8
      for (v = 0; v < 8; v++) {
        __m512 ax = abs16(ld16(s, kind, o + 16 * v));
        av[v] = _mm512_castps_si512(ax);
        if (acc)
          _mm512_storeu_ps(acc + o + 16 * v, _mm512_max_ps(ax, _mm512_loadu_ps(acc + o + 16 * v)));
      }
#pragma GCC unroll 8
      for (b = 0; b < nb; b++) {
        V16 mm = av[b * nvb];
#pragma GCC unroll 8
        for (v = 1; v < nvb; v++) mm = _mm512_max_epu32(av[b * nvb + v], mm);
        bm[c * nb + b] = hmax_u32(mm);
        any |= bm[c * nb + b] > 0x7F800000u;
      }
    }
    if (any) /* a NaN: block amaxes with NaN never winning */
      for (c = 0; c < nch; c++)
        for (b = 0; b < nb; b++) {
          const void *s = ROW(src, cr[c], lds, es);
          __m512 mm = _mm512_setzero_ps();
          for (v = 0; v < nvb; v++)
            mm = _mm512_max_ps(abs16(ld16(s, kind, co[c] + bw * b + 16 * v)), mm);
          bm[c * nb + b] = xte_f32_bits(hmax16(mm));
        }
    {
      /* n % 128 == 0: the group's blocks are consecutive in sc, written in place */
      const int nblk = nch * nb, inplace = n % 128 == 0;
      xte_block_scale bsl[QG * 8], *bs = inplace ? sc + t0 * nb : bsl;
      float amf[QG * 8];
      int t;
      for (t = 0; t < nblk; t++) amf[t] = xte_bits_f32(bm[t]);
      if (te && !any) { /* 16 blocks at a time (TE scales are finite and > 0) */
        __m512 mv = _mm512_setzero_ps();
        for (t = 0; t < nblk; t += 16) {
          const int cnt = nblk - t < 16 ? nblk - t : 16;
          const __mmask16 mk = (__mmask16)((1u << cnt) - 1u);
          const __m512 av = _mm512_maskz_loadu_ps(mk, amf + t), qv = te_scale16(&tc, av);
          mv = _mm512_max_ps(mv, av);
          _mm512_mask_storeu_ps(sf + t, mk, qv);
          store_scales16(bs + t, qv, tc.one, cnt);
        }
        m = xte_fmaxf(m, _mm512_reduce_max_ps(mv));
      } else {
        fast = group_scales(a, amf, nblk, bs, sf, &m);
      }
      if (!inplace)
        for (c = 0; c < nch; c++)
          for (b = 0; b < nb; b++) sc[cr[c] * nbr + co[c] / bw + b] = bs[c * nb + b];
    }
    if (fast && !any) {
      for (c = 0; c < nch; c++) {
        const void *s = ROW(src, cr[c], lds, es);
        uint8_t *d = q + cr[c] * ldq + co[c];
        V16 rr[8];
        if (t0 + QG + c < total)
          prefetch_l1(ROW(src, pr[c], lds, es) + (size_t)pc[c] * es, 128 * es);
        xte_prefetch_far(a, (const char *)s + (size_t)co[c] * es, 128 * es);
#pragma GCC unroll 8
        for (v = 0; v < 8; v++) {
          __m512 x = ld16(s, kind, co[c] + 16 * v);
          rr[v] = cvt_scaled(&k, x, abs16(x), _mm512_set1_ps(sf[c * nb + v / nvb]));
        }
        store64(d, pack4(rr[0], rr[1], rr[2], rr[3]), nt);
        store64(d + 64, pack4(rr[4], rr[5], rr[6], rr[7]), nt);
      }
    } else {
      for (c = 0; c < nch; c++) {
        const void *s = ROW(src, cr[c], lds, es);
        uint8_t *d = q + cr[c] * ldq + co[c];
        V16 rr[8];
#pragma GCC unroll 8
        for (v = 0; v < 8; v++)
          rr[v] = cvt(&k, _mm512_mul_ps(ld16(s, kind, co[c] + 16 * v),
                                        _mm512_set1_ps(sf[c * nb + v / nvb])));
        store64(d, pack4(rr[0], rr[1], rr[2], rr[3]), nt);
        store64(d + 64, pack4(rr[4], rr[5], rr[6], rr[7]), nt);
      }
    }
    memcpy(cr, pr, sizeof cr);
    memcpy(co, pc, sizeof co);
  }
  if (n > cpr * 128)
    for (r = 0; r < rows; r++) {
      const void *s = ROW(src, r, lds, es);
      int64_t j, bi;
      for (j = cpr * 128, bi = cpr * nb; j < n; j += bw, bi++) {
        int64_t len = n - j < bw ? n - j : bw;
        const void *sj = (const char *)s + (size_t)j * es;
        float am = load_amax_row(sj, kind, len, acc ? acc + j : NULL);
        xte_block_scale bs = xte_quant_block_scale(a, am);
        sc[r * nbr + bi] = bs;
        m = xte_fmaxf(m, am);
        (void)load_quant_slow(&k, sj, kind, len, bs.scale, a->fmt, a->saturate, q + r * ldq + j, 0);
      }
    }
  return m;
}

/* bf16, bw 32 or 128, n % 128 == 0 (acc: n == 128, its maxima kept as words in registers): as
 * quant_blocks_body with word amaxes and the bf16 packing. */
XTE_AI float quant_blocks_bf16(const void *src, int64_t lds, int64_t rows, int64_t n, int bw,
                               const xte_quant_args *a, uint8_t *q, int64_t ldq,
                               xte_block_scale *sc, float *acc, int nt) {
  const int zb = bw / 32, nb = 128 / bw;
  const int64_t total = rows * (n / 128);
  const float fmax = xte_fp8_max(a->fmt);
  const uint16_t *in = (const uint16_t *)src;
  fp8k k = fp8k_make(a->fmt, a->saturate);
  const p2wk w = p2wk_make(a->fmt, a->saturate);
  const int te = xte_quant_is_te(a);
  const tesk tc = tesk_make(a);
  V16 acw[4];
  float m = 0.0f;
  int64_t t0, r, cr[QG], co[QG], pr[QG], pc[QG], prow = 0, pcol = 0;
  int nan_seen = 0, i;
  for (i = 0; i < 4; i++) acw[i] = _mm512_setzero_si512();
  nt = nt && !((uintptr_t)q & 63) && !(ldq & 63);
  chunk_pos(&prow, &pcol, n, cr, co);
  for (t0 = 0; t0 < total; t0 += QG) {
    const int nch = (int)(total - t0 < QG ? total - t0 : QG), nblk = nch * nb;
    int c, b, t, fast = 1, p2 = 1, over = 0;
    uint32_t any = 0;
    float amf[QG * 4], sf[QG * 4];
    uint16_t pd[QG * 4], pt[QG * 4];
    xte_block_scale *bs = sc + t0 * nb; /* n % 128 == 0: the group's blocks are consecutive */
    chunk_pos(&prow, &pcol, n, pr, pc); /* the next group's chunks (prefetched) */
    for (c = 0; c < nch; c++) {
      const uint16_t *p = in + cr[c] * lds + co[c];
      V16 za[4];
#pragma GCC unroll 4
      for (i = 0; i < 4; i++) {
        za[i] = absw(ldw(p + 32 * i));
        if (acc) acw[i] = _mm512_max_epu16(acw[i], za[i]);
      }
      if (zb == 4) {
        uint32_t mb = hmax_u16(
            _mm512_max_epu16(_mm512_max_epu16(za[0], za[1]), _mm512_max_epu16(za[2], za[3])));
        any |= mb > 0x7F80u;
        amf[c] = xte_bits_f32(mb << 16);
      } else {
#pragma GCC unroll 4
        for (b = 0; b < 4; b++) {
          uint32_t mb = hmax_u16(za[b]);
          any |= mb > 0x7F80u;
          amf[c * 4 + b] = xte_bits_f32(mb << 16);
        }
      }
    }
    if (any) { /* a NaN: block amaxes with NaN never winning */
      nan_seen = 1;
      for (c = 0; c < nch; c++)
        for (b = 0; b < nb; b++)
          amf[c * nb + b] =
              load_amax_row(in + cr[c] * lds + co[c] + bw * b, XTE_NUM_IN_BF16, bw, NULL);
    }
    if (te && !any) { /* 16 blocks at a time: scales, p2w_ok, p2w_d, p2w_t, the clamp test */
      __m512 mv = _mm512_setzero_ps();
      for (t = 0; t < nblk; t += 16)
        mv = _mm512_max_ps(mv, te_params16(&tc, amf + t, nblk - t < 16 ? nblk - t : 16, a->fmt,
                                           bs + t, sf + t, pd + t, pt + t, &p2, &over));
      m = xte_fmaxf(m, _mm512_reduce_max_ps(mv));
    } else {
      fast = group_scales(a, amf, nblk, bs, sf, &m);
      for (t = 0; t < nblk; t++) {
        p2 &= p2w_ok(bs[t].scale);
        over |= !(amf[t] * bs[t].scale <= fmax); /* exact for 2^k scales */
        pd[t] = p2w_d(bs[t].scale, a->fmt);
        pt[t] = p2w_t(bs[t].scale, a->fmt);
      }
    }
    if (fast && !any && p2) {
      for (c = 0; c < nch; c++) {
        const uint16_t *p = in + cr[c] * lds + co[c];
        uint8_t *d = q + cr[c] * ldq + co[c];
        V16 cc[4];
        if (t0 + QG + c < total) prefetch_l1(in + pr[c] * lds + pc[c], 256);
        xte_prefetch_far(a, p, 256);
#pragma GCC unroll 4
        for (i = 0; i < 4; i++) {
          const int tb = c * nb + i / zb;
          const V16 z = ldw(p + 32 * i);
          const V16 dd = _mm512_set1_epi16((short)pd[tb]), tt = _mm512_set1_epi16((short)pt[tb]);
          const __m512 sv = _mm512_set1_ps(sf[tb]);
          /* no clamp when no |x| s of the group passes the largest finite value */
          cc[i] = _mm512_ternarylogic_epi32(over ? p2w_mag(&w, z, dd, tt, sv, sv, 1, P2W_SUB_RARE)
                                                 : p2w_mag(&w, z, dd, tt, sv, sv, 0, P2W_SUB_RARE),
                                            _mm512_srli_epi16(z, 8), w.sgn, 0xF8);
        }
        store64(d, p2w_pack(cc[0], cc[1]), nt);
        store64(d + 64, p2w_pack(cc[2], cc[3]), nt);
      }
    } else if (fast && !any) {
      for (c = 0; c < nch; c++) {
        const uint16_t *p = in + cr[c] * lds + co[c];
        uint8_t *d = q + cr[c] * ldq + co[c];
        V16 z[4], rr[8];
        if (t0 + QG + c < total) prefetch_l1(in + pr[c] * lds + pc[c], 256);
        xte_prefetch_far(a, p, 256);
#pragma GCC unroll 4
        for (i = 0; i < 4; i++) {
          __m512 sv = _mm512_set1_ps(sf[c * nb + i / zb]);
          V16 za;
          z[i] = ldw(p + 32 * i);
          za = absw(z[i]);
          rr[2 * i] = mag_code(&k, wlo(za), sv);
          rr[2 * i + 1] = mag_code(&k, whi(za), sv);
        }
        store64(d, pack_bf16(rr[0], rr[1], rr[2], rr[3], z[0], z[1]), nt);
        store64(d + 64, pack_bf16(rr[4], rr[5], rr[6], rr[7], z[2], z[3]), nt);
      }
    } else {
      for (c = 0; c < nch; c++) {
        const uint16_t *p = in + cr[c] * lds + co[c];
        uint8_t *d = q + cr[c] * ldq + co[c];
        V16 rr[8];
        int v;
#pragma GCC unroll 8
        for (v = 0; v < 8; v++)
          rr[v] = cvt(&k, _mm512_mul_ps(ld16(p, XTE_NUM_IN_BF16, 16 * v),
                                        _mm512_set1_ps(sf[c * nb + v / (2 * zb)])));
        store64(d, pack4(rr[0], rr[1], rr[2], rr[3]), nt);
        store64(d + 64, pack4(rr[4], rr[5], rr[6], rr[7]), nt);
      }
    }
    memcpy(cr, pr, sizeof cr);
    memcpy(co, pc, sizeof co);
  }
  if (acc) {
    if (nan_seen) {
      for (r = 0; r < rows; r++) (void)load_amax_row(in + r * lds, XTE_NUM_IN_BF16, 128, acc);
    } else {
      words_f32(acc, acw, 4, 1);
    }
  }
  return m;
}

#include "cpu/quantize_blocks_each.h"

static float quant_blocks(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                          int64_t bw, const xte_quant_args *a, uint8_t *q, int64_t ldq,
                          xte_block_scale *sc, float *acc, int nt) {
#define QB(KIND, BW) return quant_blocks_body(src, lds, KIND, rows, n, BW, a, q, ldq, sc, acc, nt)
  if (bw == 128) {
    if (in_kind == XTE_NUM_IN_F32) QB(XTE_NUM_IN_F32, 128);
    if (in_kind == XTE_NUM_IN_BF16 && n % 128 == 0 && (!acc || n == 128))
      return quant_blocks_bf16(src, lds, rows, n, 128, a, q, ldq, sc, acc, nt);
    if (in_kind == XTE_NUM_IN_BF16) QB(XTE_NUM_IN_BF16, 128);
    QB(XTE_NUM_IN_F16, 128);
  }
  if (bw == 32) {
    if (in_kind == XTE_NUM_IN_F32) QB(XTE_NUM_IN_F32, 32);
    if (in_kind == XTE_NUM_IN_BF16 && n % 128 == 0 && (!acc || n == 128))
      return quant_blocks_bf16(src, lds, rows, n, 32, a, q, ldq, sc, acc, nt);
    if (in_kind == XTE_NUM_IN_BF16) QB(XTE_NUM_IN_BF16, 32);
    QB(XTE_NUM_IN_F16, 32);
  }
#undef QB
  return quant_blocks_each(src, lds, in_kind, rows, n, bw, a, q, ldq, sc, acc, 0);
}

/* fp32 x with a power-of-two scale: the bf16 word of x rounded to odd (its high half, the low bit
 * set when the low half is not zero) rounds, at 3 or 2 mantissa bits (normal results) or at the
 * subnormal quantum, as x itself does (two or more bits below the kept ones: rounding to odd then
 * to nearest even is rounding to nearest even), and is below T exactly when x is. Two vectors of
 * 16 -> 32 words: in each 128-bit lane L elements 4L..4L+3 of x0, then of x1 (the packus order,
 * p2w_rto_col; pack4's permutation puts the codes back in order). */
XTE_AI V16 rto_words(V16 x0, V16 x1) {
  const V16 lo1 = S1(0xFFFF0001), one = S1(1);
  V16 t0 = _mm512_min_epu16(x0, lo1), t1 = _mm512_min_epu16(x1, lo1);
  return _mm512_packus_epi32(_mm512_ternarylogic_epi32(_mm512_srli_epi32(t0, 16), t0, one, 0xF8),
                             _mm512_ternarylogic_epi32(_mm512_srli_epi32(t1, 16), t1, one, 0xF8));
}

/* 2 x 32 codes of rto_words order -> 64 bytes in order */
XTE_AI V16 rto_pack(V16 c0, V16 c1) {
  return _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15),
      _mm512_packus_epi16(c0, c1));
}

/* quant_rc's second pass: per row the row codes and the column codes of the same words; clamp 0
 * when no |x| s of the tile passes the largest finite value (true for the TE and DeepGEMM
 * scales) */
XTE_AI void rc_convert(const void *src, int64_t lds, int64_t nr, const xte_quant_args *a,
                       uint8_t *rq, int64_t ldrq, const float *rs, const uint16_t *rd,
                       const uint16_t *rt, uint8_t *cq, const V16 *dv, const V16 *tv,
                       const __m512 *sp, const void *pf, int64_t pf_rows, int nt, int f32,
                       int clamp) {
  const size_t es = f32 ? 4 : 2;
  const p2wk w = p2wk_make(a->fmt, a->saturate);
  int64_t r;
  int i;
  for (r = 0; r < nr; r++) {
    const char *p = (const char *)src + (size_t)r * (size_t)lds * es;
    const V16 d = _mm512_set1_epi16((short)rd[r]), t = _mm512_set1_epi16((short)rt[r]);
    const __m512 sv = _mm512_set1_ps(rs[r]);
    V16 cr[4], cc[4];
    if (pf && r < pf_rows) {
      const char *pn = (const char *)pf + (size_t)r * (size_t)lds * es;
      for (i = 0; i < (int)(128 * es); i += 64) _mm_prefetch(pn + i, _MM_HINT_T1);
    }
    for (i = 0; i < 4; i++) {
      const V16 z = f32 ? rto_words(_mm512_loadu_si512((const void *)(p + 128 * i)),
                                    _mm512_loadu_si512((const void *)(p + 128 * i + 64)))
                        : _mm512_loadu_si512((const void *)(p + 64 * i));
      const V16 sg = _mm512_srli_epi16(z, 8);
      cr[i] = _mm512_ternarylogic_epi32(p2w_mag(&w, z, d, t, sv, sv, clamp, P2W_SUB_RARE), sg,
                                        w.sgn, 0xF8);
      cc[i] = _mm512_ternarylogic_epi32(
          p2w_mag(&w, z, dv[i], tv[i], sp[2 * i], sp[2 * i + 1], clamp, P2W_SUB_ALWAYS), sg, w.sgn,
          0xF8);
    }
    for (i = 0; i < 2; i++) {
      store64(rq + r * ldrq + 64 * i,
              f32 ? rto_pack(cr[2 * i], cr[2 * i + 1]) : p2w_pack(cr[2 * i], cr[2 * i + 1]), nt);
      store64(cq + r * 128 + 64 * i,
              f32 ? rto_pack(cc[2 * i], cc[2 * i + 1]) : p2w_pack(cc[2 * i], cc[2 * i + 1]), 0);
    }
  }
}

/* One 128-column tile, both copies from one read (see the table): a first pass for the exact
 * maxima of each row and each column, the scales, then per row the row codes (the row's scale
 * broadcast) and the column codes (the columns' scales per lane) of the same words: bf16 words,
 * or for fp32 (f32, a constant) rto_words. */
XTE_AI int quant_rc_body(const void *src, int64_t lds, int64_t nr, const xte_quant_args *a,
                         uint8_t *rq, int64_t ldrq, xte_block_scale *rsc, uint8_t *cq,
                         xte_block_scale *csc, float *amax, const void *pf, int64_t pf_rows, int nt,
                         int f32) {
  const V16 ilo = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
  const V16 ihi = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const size_t es = f32 ? 4 : 2;
  V16 acc[8], dv[4], tv[4];
  __m512 sp[8];
  _Alignas(64) float ram[128], cam[128], cs[128], rs[128];
  _Alignas(64) uint16_t pd[128], pt[128], rd[128], rt[128];
  int col[128];
  const float fmax = xte_fp8_max(a->fmt);
  uint32_t bad = 0;
  int64_t r;
  int i, over = 0;
  if (nr < 1 || nr > 128) return 0;
  for (i = 0; i < 8; i++) acc[i] = _mm512_setzero_si512();
  for (r = 0; r < nr; r++) {
    const char *p = (const char *)src + (size_t)r * (size_t)lds * es;
    V16 mm = _mm512_setzero_si512();
    for (i = 0; i < (f32 ? 8 : 4); i++) {
      V16 x = _mm512_loadu_si512((const void *)(p + 64 * i));
      x = f32 ? _mm512_and_si512(x, S1(0x7FFFFFFF)) : absw(x);
      acc[i] = f32 ? _mm512_max_epu32(acc[i], x) : _mm512_max_epu16(acc[i], x);
      mm = f32 ? _mm512_max_epu32(mm, x) : _mm512_max_epu16(mm, x);
    }
    if (f32) {
      const uint32_t mb = hmax_u32(mm);
      bad |= mb > 0x7F800000u;
      ram[r] = xte_bits_f32(mb);
    } else {
      const uint32_t mb = hmax_u16(mm);
      bad |= mb > 0x7F80u;
      ram[r] = xte_bits_f32(mb << 16);
    }
  }
  if (bad) return 0;
  if (f32)
    for (i = 0; i < 8; i++) _mm512_store_si512((void *)(cam + 16 * i), acc[i]);
  else
    words_f32(cam, acc, 4, 0);
  if (xte_quant_is_te(a)) { /* 16 scales at a time, with their word-path parameters */
    const tesk tc = tesk_make(a);
    __m512 mv = _mm512_setzero_ps();
    int ok = 1;
    for (r = 0; r < nr; r += 16)
      mv = _mm512_max_ps(mv, te_params16(&tc, ram + r, nr - r < 16 ? (int)(nr - r) : 16, a->fmt,
                                         rsc + r, rs + r, rd + r, rt + r, &ok, &over));
    for (i = 0; i < 128; i += 16)
      (void)te_params16(&tc, cam + i, 16, a->fmt, csc + i, cs + i, pd + i, pt + i, &ok, &over);
    if (!ok) return 0;
    *amax = _mm512_reduce_max_ps(mv);
    if (f32) { /* pd / pt by word position (p2w_rto_col: within each 32) */
      _Alignas(64) uint16_t pc[32];
      for (i = 0; i < 32; i++) pc[i] = (uint16_t)p2w_rto_col(i, 32);
      for (i = 0; i < 4; i++) {
        const V16 ix = _mm512_load_si512((const void *)pc);
        _mm512_store_si512(
            (void *)(pd + 32 * i),
            _mm512_permutexvar_epi16(ix, _mm512_load_si512((const void *)(pd + 32 * i))));
        _mm512_store_si512(
            (void *)(pt + 32 * i),
            _mm512_permutexvar_epi16(ix, _mm512_load_si512((const void *)(pt + 32 * i))));
      }
    }
  } else {
    block_scales(a, ram, nr, rsc);
    block_scales(a, cam, 128, csc);
    for (i = 0; i < 128; i++) {
      col[i] = p2w_rto_col(i, 32);
      cs[i] = csc[i].scale;
    }
    if (!p2w_tile_params(a, rsc, ram, nr, csc, f32 ? col : NULL, pd, pt, amax)) return 0;
    over |= p2w_row_params(rsc, ram, nr, a->fmt, fmax, rs, rd, rt);
    for (i = 0; i < 128; i++) over |= !(cam[i] * csc[i].scale <= fmax);
  }
  for (i = 0; i < 4; i++) { /* the fma's scales in wlo / whi order (fp32: the columns in order) */
    __m512 s0 = _mm512_load_ps(cs + 32 * i), s1 = _mm512_load_ps(cs + 32 * i + 16);
    sp[2 * i] = f32 ? s0 : _mm512_permutex2var_ps(s0, ilo, s1);
    sp[2 * i + 1] = f32 ? s1 : _mm512_permutex2var_ps(s0, ihi, s1);
    dv[i] = _mm512_load_si512((const void *)(pd + 32 * i));
    tv[i] = _mm512_load_si512((const void *)(pt + 32 * i));
  }
  nt = nt && !((uintptr_t)rq & 63) && !(ldrq & 63);
  if (over)
    rc_convert(src, lds, nr, a, rq, ldrq, rs, rd, rt, cq, dv, tv, sp, pf, pf_rows, nt, f32, 1);
  else
    rc_convert(src, lds, nr, a, rq, ldrq, rs, rd, rt, cq, dv, tv, sp, pf, pf_rows, nt, f32, 0);
  return 1;
}

static int quant_rc(const void *src, int64_t lds, int64_t nr, const xte_quant_args *a, uint8_t *rq,
                    int64_t ldrq, xte_block_scale *rsc, uint8_t *cq, xte_block_scale *csc,
                    float *amax, const void *pf, int64_t pf_rows, int nt) {
  if (a->in_kind == XTE_NUM_IN_BF16)
    return quant_rc_body(src, lds, nr, a, rq, ldrq, rsc, cq, csc, amax, pf, pf_rows, nt, 0);
  if (a->in_kind == XTE_NUM_IN_F32)
    return quant_rc_body(src, lds, nr, a, rq, ldrq, rsc, cq, csc, amax, pf, pf_rows, nt, 1);
  return 0;
}

/* ---------------------------------------------------------------- 128x128 runs (quant_sq_run)
 * src/cpu/quantize_blocks_template.h over the amax of a row of tiles and the conversion below. */

/* The max |x| bits of the 128 elements of each of the gn tiles of row p into acc[i] */
XTE_AI void sq_amax_row(const char *p, int64_t gn, int f32, V16 *acc) {
  int64_t i;
  if (f32) {
    const V16 m = S1(0x7FFFFFFF);
    for (i = 0; i < gn; i++) {
      const char *x = p + i * 512;
      V16 u[8];
      int j;
      for (j = 0; j < 8; j++)
        u[j] = _mm512_and_si512(_mm512_loadu_si512((const void *)(x + 64 * j)), m);
      u[0] = _mm512_max_epu32(_mm512_max_epu32(u[0], u[1]), _mm512_max_epu32(u[2], u[3]));
      u[4] = _mm512_max_epu32(_mm512_max_epu32(u[4], u[5]), _mm512_max_epu32(u[6], u[7]));
      acc[i] = _mm512_max_epu32(acc[i], _mm512_max_epu32(u[0], u[4]));
    }
  } else {
    for (i = 0; i < gn; i++) {
      const char *x = p + i * 256;
      V16 u0 = _mm512_max_epu16(absw(_mm512_loadu_si512((const void *)x)),
                                absw(_mm512_loadu_si512((const void *)(x + 64))));
      V16 u1 = _mm512_max_epu16(absw(_mm512_loadu_si512((const void *)(x + 128))),
                                absw(_mm512_loadu_si512((const void *)(x + 192))));
      acc[i] = _mm512_max_epu16(acc[i], _mm512_max_epu16(u0, u1));
    }
  }
}

#define SQ_GMAX 16

/* quant_sq_run's row conversion (src/cpu/quantize_blocks_template.h): bf16 words under a
 * power-of-two scale, fp32 by cvt_scaled */
typedef struct sq_row_k {
  fp8k k;
  p2wk w;
  V16 dv[SQ_GMAX], tv[SQ_GMAX];
  __m512 sv[SQ_GMAX];
} sq_row_k;

XTE_AI void sq_row_init(sq_row_k *k, int64_t g, const float *s, int fmt, int sat, int f32) {
  int64_t i;
  k->k = fp8k_make(fmt, sat);
  k->w = p2wk_make(fmt, sat);
  for (i = 0; i < g; i++) {
    k->sv[i] = _mm512_set1_ps(s[i]);
    if (!f32) {
      k->dv[i] = _mm512_set1_epi16((short)p2w_d(s[i], fmt));
      k->tv[i] = _mm512_set1_epi16((short)p2w_t(s[i], fmt));
    }
  }
}

XTE_AI void sq_row_convert(const sq_row_k *k, const char *p, int64_t g, const float *s, uint8_t *d,
                           int nt, uint8_t *q2, int f32) {
  const fp8k *kk = &k->k;
  const p2wk *w = &k->w;
  const __m512 *sv = k->sv;
  const V16 *dv = k->dv, *tv = k->tv;
  int64_t i;
  (void)s;
  for (i = 0; i < g; i++) {
    V16 b0, b1;
    if (f32) {
      const float *x = (const float *)p + i * 128;
      __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
      __m512 x2 = _mm512_loadu_ps(x + 32), x3 = _mm512_loadu_ps(x + 48);
      b0 = pack4(cvt_scaled(kk, x0, abs16(x0), sv[i]), cvt_scaled(kk, x1, abs16(x1), sv[i]),
                 cvt_scaled(kk, x2, abs16(x2), sv[i]), cvt_scaled(kk, x3, abs16(x3), sv[i]));
      x0 = _mm512_loadu_ps(x + 64);
      x1 = _mm512_loadu_ps(x + 80);
      x2 = _mm512_loadu_ps(x + 96);
      x3 = _mm512_loadu_ps(x + 112);
      b1 = pack4(cvt_scaled(kk, x0, abs16(x0), sv[i]), cvt_scaled(kk, x1, abs16(x1), sv[i]),
                 cvt_scaled(kk, x2, abs16(x2), sv[i]), cvt_scaled(kk, x3, abs16(x3), sv[i]));
    } else {
      const uint16_t *x = (const uint16_t *)p + i * 128;
      b0 = p2w_pack(p2w_code(w, ldw(x), dv[i], tv[i], sv[i], sv[i], P2W_SUB_ALWAYS),
                    p2w_code(w, ldw(x + 32), dv[i], tv[i], sv[i], sv[i], P2W_SUB_ALWAYS));
      b1 = p2w_pack(p2w_code(w, ldw(x + 64), dv[i], tv[i], sv[i], sv[i], P2W_SUB_ALWAYS),
                    p2w_code(w, ldw(x + 96), dv[i], tv[i], sv[i], sv[i], P2W_SUB_ALWAYS));
    }
    store64(d + i * 128, b0, nt);
    store64(d + i * 128 + 64, b1, nt);
    if (q2) {
      _mm512_store_si512((void *)(q2 + i * 16384), b0);
      _mm512_store_si512((void *)(q2 + i * 16384 + 64), b1);
    }
  }
}

#define XQB_V V16
#define XQB_ALIGN 64
#define xqb_zero() _mm512_setzero_si512()
#define XQB_SQ_SCALE_OK(f32, s) ((f32) ? pos_finite(s) : p2w_ok(s))
#include "cpu/quantize_blocks_template.h"

#endif /* XTE_CPU_QUANTIZE_AVX512_BLOCKS_H */

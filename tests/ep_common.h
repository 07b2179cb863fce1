/* Expert parallelism checks shared by the threads test (tests/test_ep.c) and the MPI test
 * (tests/ep/test_ep_mpi.c): one problem (every rank's tokens, routing, rows), its one-process
 * result from the one-process calls (xte_moe_permute / unpermute and their backwards: the
 * contract of include/xte/ep.h is byte identity with them), and one rank's EP run compared with
 * it byte for byte. Every rank builds the whole problem from the same seed. */
#ifndef XTE_TESTS_EP_COMMON_H
#define XTE_TESTS_EP_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xte/xte.h"

typedef struct ep_problem {
  int R, K, align, skew;
  int64_t El, E, H, Tall, S;
  int64_t T[64], toff[65];
  xte_dtype xdt, sdt, ydt; /* x, its scales (fp8 x only), expert rows / outputs */
  int32_t *topk;           /* [Tall, K] */
  float *w;                /* [Tall, K] */
  uint8_t *x, *xs;         /* [Tall, H], [Tall, S] */
  /* one-process results */
  int64_t rows;      /* permuted rows */
  int64_t *eoff;     /* [E + 1] */
  int32_t *row_map;  /* [Tall, K] */
  uint8_t *px, *pxs; /* permuted x and scales */
  float *pw;         /* [rows] weight of each permuted row, 0 on padding */
  uint8_t *Y;        /* [rows, H] expert outputs (ydt) */
  uint8_t *out;      /* [Tall, H] combine (unpermute) */
  uint8_t *gout;     /* [Tall, H] grad of out */
  uint8_t *gY;       /* [rows, H] unpermute backward grad_input */
  float *gw;         /* [Tall, K] grad_probs */
  uint8_t *G;        /* [rows, H] grad of permuted x */
  uint8_t *gx;       /* [Tall, H] permute backward */
} ep_problem;

static uint64_t ep_rng(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* finite values of a float dtype, as bytes; fp8 / e8m0: any byte (bytes only move) */
static void ep_fill(uint8_t *p, int64_t n, xte_dtype dt, uint64_t *s) {
  int64_t i;
  for (i = 0; i < n; i++) {
    uint64_t r = ep_rng(s);
    if (dt == XTE_DTYPE_FP32) {
      float f = (float)((int64_t)(r % 2000001) - 1000000) / 65536.0f;
      memcpy(p + 4 * i, &f, 4);
    } else if (dt == XTE_DTYPE_BF16) {
      float f = (float)((int64_t)(r % 2001) - 1000) / 64.0f;
      uint32_t u;
      uint16_t h;
      memcpy(&u, &f, 4);
      h = (uint16_t)(u >> 16); /* exact: few significant bits */
      memcpy(p + 2 * i, &h, 2);
    } else {
      p[i] = (uint8_t)r;
    }
  }
}

static size_t ep_sz(xte_dtype d) {
  return xte_dtype_size(d);
}

static xte_tensor ep_t2(void *data, xte_dtype dt, int64_t r, int64_t c) {
  static char empty[64];
  return xte_tensor_2d(data ? data : (void *)empty, dt, r, c);
}

static void ep_problem_free(ep_problem *p) {
  free(p->topk);
  free(p->w);
  free(p->x);
  free(p->xs);
  free(p->eoff);
  free(p->row_map);
  free(p->px);
  free(p->pxs);
  free(p->pw);
  free(p->Y);
  free(p->out);
  free(p->gout);
  free(p->gY);
  free(p->gw);
  free(p->G);
  free(p->gx);
  memset(p, 0, sizeof *p);
}

static void *ep_alloc(int64_t n) {
  void *q = calloc((size_t)(n > 0 ? n : 1), 1);
  if (!q) abort();
  return q;
}

/* Builds the problem: R ranks holding T[r] tokens each, El experts per rank, k slots.
 * skew 0: uniform experts; 1: 70% of the picks on rank 0's experts; 2: as 1 and the last rank's
 * experts never picked (a rank that receives nothing). About 1 slot in 10 is -1. */
static int ep_problem_make(ep_problem *p, int R, int64_t El, int K, int64_t H, const int64_t *T,
                           int skew, xte_dtype xdt, xte_dtype sdt, int64_t S, int align,
                           uint64_t seed) {
  uint64_t s = seed;
  int64_t t, j, r;
  int64_t E;
  memset(p, 0, sizeof *p);
  p->R = R;
  p->El = El;
  p->E = E = El * R;
  p->K = K;
  p->H = H;
  p->skew = skew;
  p->align = align;
  p->xdt = xdt;
  p->sdt = sdt;
  p->S = (xdt == XTE_DTYPE_E4M3 || xdt == XTE_DTYPE_E5M2) ? S : 0;
  p->ydt = xdt == XTE_DTYPE_BF16 ? XTE_DTYPE_BF16 : XTE_DTYPE_FP32;
  p->toff[0] = 0;
  for (r = 0; r < R; r++) {
    p->T[r] = T[r];
    p->toff[r + 1] = p->toff[r] + T[r];
  }
  p->Tall = p->toff[R];
  p->topk = (int32_t *)ep_alloc(p->Tall * K * 4);
  p->w = (float *)ep_alloc(p->Tall * K * 4);
  for (t = 0; t < p->Tall; t++) {
    for (j = 0; j < K; j++) {
      int32_t e;
      int tries = 0, dup;
      do {
        uint64_t u = ep_rng(&s);
        int64_t span = (skew == 2 && R > 1) ? E - El : E;
        if (skew && u % 10 < 7)
          e = (int32_t)((u >> 8) % El);
        else
          e = (int32_t)((u >> 8) % span);
        dup = 0;
        for (int64_t q = 0; q < j; q++) dup |= p->topk[t * K + q] == e;
      } while (dup && ++tries < 100);
      if (dup || ep_rng(&s) % 10 == 0) e = -1;
      p->topk[t * K + j] = e;
      p->w[t * K + j] = (float)(ep_rng(&s) % 1000) / 997.0f;
    }
  }
  p->x = (uint8_t *)ep_alloc(p->Tall * H * (int64_t)ep_sz(xdt));
  ep_fill(p->x, p->Tall * H, xdt, &s);
  if (p->S) {
    p->xs = (uint8_t *)ep_alloc(p->Tall * p->S * (int64_t)ep_sz(sdt));
    ep_fill(p->xs, p->Tall * p->S, sdt, &s);
  }
  return 0;
}

#define EP_FAIL(...)                    \
  do {                                  \
    snprintf(err, errlen, __VA_ARGS__); \
    return 1;                           \
  } while (0)

#define EP_OK(call)                                                            \
  do {                                                                         \
    xte_status st_ = (call);                                                   \
    if (st_ != XTE_SUCCESS)                                                    \
      EP_FAIL("%s: %s (%s)", #call, xte_status_string(st_), xte_last_error()); \
  } while (0)

/* The group config for problem p: its experts per rank, hidden size, k and align, and the most
 * tokens any rank holds. */
static xte_ep_config ep_problem_config(const ep_problem *p) {
  xte_ep_config c = xte_ep_config_default();
  int r;
  c.experts_per_rank = p->El;
  c.hidden = p->H;
  c.topk = (int32_t)p->K;
  c.align = p->align;
  c.max_tokens_per_rank = 0;
  for (r = 0; r < p->R; r++)
    if (p->T[r] > c.max_tokens_per_rank) c.max_tokens_per_rank = p->T[r];
  return c;
}

/* The one-process result. */
static int ep_problem_reference(ep_problem *p, char *err, size_t errlen) {
  uint64_t s = 0x5eed0000ull + (uint64_t)p->Tall;
  int64_t H = p->H, K = p->K, T = p->Tall, t, j;
  size_t xe = ep_sz(p->xdt), ye = ep_sz(p->ydt);
  xte_tensor idx = ep_t2(p->topk, XTE_DTYPE_INT32, T, K);
  xte_moe_routing routing = {NULL, &idx, p->E};
  xte_permute_config pc = xte_permute_config_default();
  xte_permute_outputs extra;
  xte_tensor x, xs, px, pxs, rm, y, out, gout, gy, gw, w, g, gx;
  pc.align = p->align;
  memset(&extra, 0, sizeof extra);
  EP_OK(xte_moe_permute_rows(&routing, &pc, &p->rows, NULL));
  p->eoff = (int64_t *)ep_alloc((p->E + 1) * 8);
  p->row_map = (int32_t *)ep_alloc(T * K * 4);
  p->px = (uint8_t *)ep_alloc(p->rows * H * (int64_t)xe);
  if (p->S) p->pxs = (uint8_t *)ep_alloc(p->rows * p->S * (int64_t)ep_sz(p->sdt));
  extra.expert_offsets = ep_t2(p->eoff, XTE_DTYPE_INT64, 1, p->E + 1);
  x = ep_t2(p->x, p->xdt, T, H);
  xs = ep_t2(p->xs, p->sdt, T, p->S);
  px = ep_t2(p->px, p->xdt, p->rows, H);
  pxs = ep_t2(p->pxs, p->sdt, p->rows, p->S);
  rm = ep_t2(p->row_map, XTE_DTYPE_INT32, T, K);
  EP_OK(xte_moe_permute(&x, p->S ? &xs : NULL, &routing, &pc, &px, p->S ? &pxs : NULL, &rm, &extra,
                        NULL));
  p->pw = (float *)ep_alloc(p->rows * 4);
  for (t = 0; t < T; t++)
    for (j = 0; j < K; j++)
      if (p->row_map[t * K + j] >= 0) p->pw[p->row_map[t * K + j]] = p->w[t * K + j];
  p->Y = (uint8_t *)ep_alloc(p->rows * H * (int64_t)ye);
  ep_fill(p->Y, p->rows * H, p->ydt, &s);
  p->out = (uint8_t *)ep_alloc(T * H * (int64_t)ye);
  y = ep_t2(p->Y, p->ydt, p->rows, H);
  out = ep_t2(p->out, p->ydt, T, H);
  w = ep_t2(p->w, XTE_DTYPE_FP32, T, K);
  EP_OK(xte_moe_unpermute(&y, &routing, &rm, &w, &out, NULL));
  p->gout = (uint8_t *)ep_alloc(T * H * (int64_t)ye);
  ep_fill(p->gout, T * H, p->ydt, &s);
  p->gY = (uint8_t *)ep_alloc(p->rows * H * (int64_t)ye);
  p->gw = (float *)ep_alloc(T * K * 4);
  gout = ep_t2(p->gout, p->ydt, T, H);
  gy = ep_t2(p->gY, p->ydt, p->rows, H);
  gw = ep_t2(p->gw, XTE_DTYPE_FP32, T, K);
  EP_OK(xte_moe_unpermute_backward(&gout, &y, &routing, &rm, &w, &gy, &gw, NULL));
  p->G = (uint8_t *)ep_alloc(p->rows * H * (int64_t)ye);
  ep_fill(p->G, p->rows * H, p->ydt, &s);
  p->gx = (uint8_t *)ep_alloc(T * H * (int64_t)ye);
  g = ep_t2(p->G, p->ydt, p->rows, H);
  gx = ep_t2(p->gx, p->ydt, T, H);
  EP_OK(xte_moe_permute_backward(&g, &routing, &rm, &gx, NULL));
  return 0;
}

static int ep_cmp(const char *what, const uint8_t *got, const uint8_t *want, size_t n, char *err,
                  size_t errlen) {
  size_t i;
  for (i = 0; i < n; i++)
    if (got[i] != want[i])
      EP_FAIL("%s: byte %zu of %zu is 0x%02x, want 0x%02x", what, i, n, got[i], want[i]);
  return 0;
}

static int ep_all(const char *what, const uint8_t *got, uint8_t v, size_t n, char *err,
                  size_t errlen) {
  size_t i;
  for (i = 0; i < n; i++)
    if (got[i] != v) EP_FAIL("%s: byte %zu of %zu is 0x%02x, want 0x%02x", what, i, n, got[i], v);
  return 0;
}

/* One rank's whole step on group g, compared with the one-process result. */
static int ep_rank_run(const ep_problem *p, xte_ep_group g, int rank, char *err, size_t errlen) {
  int64_t H = p->H, K = p->K, T = p->T[rank], t0 = p->toff[rank];
  int64_t lo = p->eoff[rank * p->El], hi = p->eoff[(rank + 1) * p->El], nr = hi - lo, extra = 3;
  size_t xe = ep_sz(p->xdt), ye = ep_sz(p->ydt), se = p->S ? ep_sz(p->sdt) : 0, hb = 0;
  void *handle;
  xte_ep_counts c;
  int64_t *tpe = (int64_t *)ep_alloc(p->El * 8), e, i;
  uint8_t *rx, *rs = NULL, *out, *slots, *gy, *gx;
  float *rw, *gw;
  xte_tensor idx, x, xs, w, trx, trs, trw, tpe_t, ty, tout, tslots, tgout, tgy, tgw, tG, tgx;
  int rc = 0;
  EP_OK(xte_ep_handle_size(g, &hb));
  handle = ep_alloc((int64_t)hb);
  idx = ep_t2(p->topk + t0 * K, XTE_DTYPE_INT32, T, K);
  tpe_t = ep_t2(tpe, XTE_DTYPE_INT64, 1, p->El);
  EP_OK(xte_ep_prepare(g, &idx, handle, hb, &c, &tpe_t, NULL));
  /* a mismatch is recorded and the collectives go on: a rank leaving early would hang the rest */
  if (c.recv_rows != nr) {
    snprintf(err, errlen, "recv_rows %lld, want %lld", (long long)c.recv_rows, (long long)nr);
    rc = 1;
    nr = c.recv_rows < nr ? c.recv_rows : nr;
  }
  for (e = 0; e < p->El && !rc; e++) {
    int64_t want = 0, q;
    for (q = 0; q < p->Tall * K; q++) want += p->topk[q] == rank * p->El + e;
    if (tpe[e] != want) {
      snprintf(err, errlen, "tokens_per_expert[%lld] = %lld, want %lld", (long long)e,
               (long long)tpe[e], (long long)want);
      rc = 1;
    }
  }
  /* dispatch into buffers with extra rows, pre-filled with garbage */
  rx = (uint8_t *)ep_alloc((nr + extra) * H * (int64_t)xe);
  memset(rx, 0xAB, (size_t)((nr + extra) * H) * xe);
  if (p->S) {
    rs = (uint8_t *)ep_alloc((nr + extra) * p->S * (int64_t)se);
    memset(rs, 0xAB, (size_t)((nr + extra) * p->S) * se);
  }
  rw = (float *)ep_alloc((nr + extra) * 4);
  memset(rw, 0xAB, (size_t)(nr + extra) * 4);
  x = ep_t2(p->x + (size_t)(t0 * H) * xe, p->xdt, T, H);
  xs = ep_t2(p->S ? p->xs + (size_t)(t0 * p->S) * se : NULL, p->sdt, T, p->S);
  w = ep_t2(p->w + t0 * K, XTE_DTYPE_FP32, T, K);
  trx = ep_t2(rx, p->xdt, nr + extra, H);
  trs = ep_t2(rs, p->sdt, nr + extra, p->S);
  trw = ep_t2(rw, XTE_DTYPE_FP32, 1, nr + extra);
  EP_OK(
      xte_ep_dispatch(g, handle, &x, p->S ? &xs : NULL, &w, &trx, p->S ? &trs : NULL, &trw, NULL));
  if (!rc)
    rc |= ep_cmp("recv_x", rx, p->px + (size_t)(lo * H) * xe, (size_t)(nr * H) * xe, err, errlen);
  if (!rc)
    rc |= ep_all("recv_x extra rows", rx + (size_t)(nr * H) * xe, 0, (size_t)(extra * H) * xe, err,
                 errlen);
  if (!rc && p->S)
    rc |= ep_cmp("recv_scales", rs, p->pxs + (size_t)(lo * p->S) * se, (size_t)(nr * p->S) * se,
                 err, errlen);
  if (!rc)
    rc |= ep_cmp("recv_weights", (const uint8_t *)rw, (const uint8_t *)(p->pw + lo), (size_t)nr * 4,
                 err, errlen);
  if (!rc)
    rc |= ep_all("recv_weights extra rows", (const uint8_t *)(rw + nr), 0, (size_t)extra * 4, err,
                 errlen);
  /* combine */
  out = (uint8_t *)ep_alloc(T * H * (int64_t)ye);
  slots = (uint8_t *)ep_alloc(c.slot_rows * H * (int64_t)ye);
  ty = ep_t2(p->Y + (size_t)(lo * H) * ye, p->ydt, nr, H);
  tout = ep_t2(out, p->ydt, T, H);
  tslots = ep_t2(slots, p->ydt, c.slot_rows, H);
  {
    EP_OK(xte_ep_combine(g, handle, &ty, &w, &tout, &tslots, NULL));
    if (!rc)
      rc |= ep_cmp("combine out", out, p->out + (size_t)(t0 * H) * ye, (size_t)(T * H) * ye, err,
                   errlen);
  }
  /* combine backward */
  gy = (uint8_t *)ep_alloc((nr + extra) * H * (int64_t)ye);
  memset(gy, 0xAB, (size_t)((nr + extra) * H) * ye);
  gw = (float *)ep_alloc(T * K * 4);
  tgout = ep_t2(p->gout + (size_t)(t0 * H) * ye, p->ydt, T, H);
  tgy = ep_t2(gy, p->ydt, nr + extra, H);
  tgw = ep_t2(gw, XTE_DTYPE_FP32, T, K);
  {
    EP_OK(xte_ep_combine_backward(g, handle, &tgout, &w, &tslots, &tgy, &tgw, NULL));
    if (!rc)
      rc |= ep_cmp("grad_expert_out", gy, p->gY + (size_t)(lo * H) * ye, (size_t)(nr * H) * ye, err,
                   errlen);
    if (!rc)
      rc |= ep_all("grad_expert_out extra rows", gy + (size_t)(nr * H) * ye, 0,
                   (size_t)(extra * H) * ye, err, errlen);
    if (!rc)
      rc |= ep_cmp("grad_weights", (const uint8_t *)gw, (const uint8_t *)(p->gw + t0 * K),
                   (size_t)(T * K) * 4, err, errlen);
  }
  /* dispatch backward */
  gx = (uint8_t *)ep_alloc(T * H * (int64_t)ye);
  tG = ep_t2(p->G + (size_t)(lo * H) * ye, p->ydt, nr, H);
  tgx = ep_t2(gx, p->ydt, T, H);
  {
    EP_OK(xte_ep_dispatch_backward(g, handle, &tG, &tgx, NULL));
    if (!rc)
      rc |= ep_cmp("grad_x", gx, p->gx + (size_t)(t0 * H) * ye, (size_t)(T * H) * ye, err, errlen);
  }
  if (rc) {
    size_t n = strlen(err);
    snprintf(err + n, errlen - n, " (rank %d)", rank);
  }
  (void)i;
  free(tpe);
  free(rx);
  free(rs);
  free(rw);
  free(out);
  free(slots);
  free(gy);
  free(gw);
  free(gx);
  free(handle);
  return rc;
}

/* Copies n rows of b bytes from src (dense) to dst rows ld bytes apart, or back (to_dense). */
static void ep_rows(uint8_t *dst, const uint8_t *src, int64_t n, size_t b, size_t ld,
                    int to_dense) {
  int64_t i;
  for (i = 0; i < n; i++) {
    if (to_dense)
      memcpy(dst + (size_t)i * b, src + (size_t)i * ld, b);
    else
      memcpy(dst + (size_t)i * ld, src + (size_t)i * b, b);
  }
}

/* One rank's step with views whose rows are not back to back on some ranks (bit 0 of the rank:
 * x, expert_out and grad_recv; bit 1: recv_x and grad_expert_out), so that the two sides of a
 * pair cut their streams with different layouts: xte_ep_dispatch_tokens against rows picked
 * here from the problem (each source rank's tokens that route here, ascending), then dispatch,
 * combine, combine_backward and dispatch_backward against the one-process result. A view's gap
 * bytes are 0xCD before and after. */
static int ep_rank_run_views(const ep_problem *p, xte_ep_group g, int rank, char *err,
                             size_t errlen) {
  const int64_t H = p->H, K = p->K, T = p->T[rank], t0 = p->toff[rank], El = p->El, P = 3;
  const int64_t lo = p->eoff[rank * El], nr = p->eoff[(rank + 1) * El] - lo, extra = 2;
  const size_t xe = ep_sz(p->xdt), ye = ep_sz(p->ydt), se = p->S ? ep_sz(p->sdt) : 0;
  const int a = rank & 1, b = (rank >> 1) & 1;
  const size_t ldx = (size_t)(H + (a ? P : 0)) * xe, ldr = (size_t)(H + (b ? P : 0)) * xe;
  const size_t ldy = (size_t)(H + (a ? P : 0)) * ye, ldg = (size_t)(H + (b ? P : 0)) * ye;
  size_t hb = 0;
  int64_t ntok = 0, t, j, s, i, rows;
  xte_ep_counts c;
  void *handle;
  uint8_t *xv, *rx, *rs, *dense, *yv, *gv, *out, *slots;
  int32_t *ti;
  float *tw, *rw, *gw;
  xte_tensor idx, x, xs, w, trx, trs, tti, ttw, trw, ty, tout, tsl, tgo, tgy, tgw, tgx;
  int rc = 0;
  EP_OK(xte_ep_handle_size(g, &hb));
  handle = ep_alloc((int64_t)hb);
  idx = ep_t2(p->topk + t0 * K, XTE_DTYPE_INT32, T, K);
  EP_OK(xte_ep_prepare(g, &idx, handle, hb, &c, NULL, NULL));
  rows = (c.recv_rows > c.recv_tokens ? c.recv_rows : c.recv_tokens) + extra;
  xv = (uint8_t *)ep_alloc((T ? T : 1) * (int64_t)ldx);
  memset(xv, 0xCD, (size_t)T * ldx);
  ep_rows(xv, p->x + (size_t)(t0 * H) * xe, T, (size_t)H * xe, ldx, 0);
  rx = (uint8_t *)ep_alloc(rows * (int64_t)ldr);
  rs = (uint8_t *)ep_alloc(rows * (p->S ? p->S : 1) * (int64_t)(se ? se : 1));
  dense = (uint8_t *)ep_alloc(rows * H * 4 + rows * K * 8);
  ti = (int32_t *)ep_alloc(rows * K * 4);
  tw = (float *)ep_alloc(rows * K * 4);
  rw = (float *)ep_alloc(rows * 4);
  x = ep_t2(xv, p->xdt, T, H);
  x.ld = a ? H + P : 0;
  xs = ep_t2(p->S ? p->xs + (size_t)(t0 * p->S) * se : NULL, p->sdt, T, p->S);
  w = ep_t2(p->w + t0 * K, XTE_DTYPE_FP32, T, K);
  trx = ep_t2(rx, p->xdt, rows, H);
  trx.ld = b ? H + P : 0;
  trs = ep_t2(rs, p->sdt, rows, p->S);
  tti = ep_t2(ti, XTE_DTYPE_INT32, rows, K);
  ttw = ep_t2(tw, XTE_DTYPE_FP32, rows, K);
  trw = ep_t2(rw, XTE_DTYPE_FP32, 1, rows);
  /* token-major */
  memset(rx, 0xCD, (size_t)rows * ldr);
  EP_OK(xte_ep_dispatch_tokens(g, handle, &x, p->S ? &xs : NULL, &w, &trx, p->S ? &trs : NULL, &tti,
                               &ttw, NULL));
  for (s = 0; s < p->R && !rc; s++)
    for (t = p->toff[s]; t < p->toff[s] + p->T[s] && !rc; t++) {
      int any = 0;
      for (j = 0; j < K; j++)
        any |= p->topk[t * K + j] >= rank * El && p->topk[t * K + j] < (rank + 1) * El;
      if (!any) continue;
      if (ntok >= c.recv_tokens) {
        snprintf(err, errlen, "more tokens route here than recv_tokens %lld",
                 (long long)c.recv_tokens);
        rc = 1;
        break;
      }
      rc |= ep_cmp("tokens recv_x", rx + (size_t)ntok * ldr, p->x + (size_t)(t * H) * xe,
                   (size_t)H * xe, err, errlen);
      if (!rc && b)
        rc |= ep_all("tokens recv_x gap", rx + (size_t)ntok * ldr + (size_t)H * xe, 0xCD,
                     (size_t)P * xe, err, errlen);
      if (!rc && p->S)
        rc |= ep_cmp("tokens recv_scales", rs + (size_t)(ntok * p->S) * se,
                     p->xs + (size_t)(t * p->S) * se, (size_t)p->S * se, err, errlen);
      for (j = 0; j < K && !rc; j++) {
        int32_t e = p->topk[t * K + j];
        int32_t l = e >= rank * El && e < (rank + 1) * El ? (int32_t)(e - rank * El) : -1;
        float wv = l >= 0 ? p->w[t * K + j] : 0.0f;
        if (ti[ntok * K + j] != l) {
          snprintf(err, errlen, "recv_topk_idx[%lld, %lld] = %d, want %d", (long long)ntok,
                   (long long)j, ti[ntok * K + j], l);
          rc = 1;
        }
        rc |= ep_cmp("recv_topk_weights", (const uint8_t *)&tw[ntok * K + j], (const uint8_t *)&wv,
                     4, err, errlen);
      }
      ntok++;
    }
  if (!rc && ntok != c.recv_tokens) {
    snprintf(err, errlen, "recv_tokens %lld, want %lld", (long long)c.recv_tokens, (long long)ntok);
    rc = 1;
  }
  for (i = ntok; i < rows && !rc; i++)
    rc |= ep_all("tokens recv_x rows past recv_tokens", rx + (size_t)i * ldr, 0, (size_t)H * xe,
                 err, errlen);
  /* expert-major */
  memset(rx, 0xCD, (size_t)rows * ldr);
  EP_OK(
      xte_ep_dispatch(g, handle, &x, p->S ? &xs : NULL, &w, &trx, p->S ? &trs : NULL, &trw, NULL));
  ep_rows(dense, rx, rows, (size_t)H * xe, ldr, 1);
  if (!rc)
    rc |=
        ep_cmp("recv_x", dense, p->px + (size_t)(lo * H) * xe, (size_t)(nr * H) * xe, err, errlen);
  for (i = 0; i < rows && !rc && b; i++)
    rc |= ep_all("recv_x gap", rx + (size_t)i * ldr + (size_t)H * xe, 0xCD, (size_t)P * xe, err,
                 errlen);
  /* combine, from expert rows with a gap on odd ranks */
  yv = (uint8_t *)ep_alloc((nr + extra) * (int64_t)ldy);
  ep_rows(yv, p->Y + (size_t)(lo * H) * ye, nr, (size_t)H * ye, ldy, 0);
  out = (uint8_t *)ep_alloc(T * H * (int64_t)ye);
  slots = (uint8_t *)ep_alloc(c.slot_rows * H * (int64_t)ye);
  ty = ep_t2(yv, p->ydt, nr, H);
  ty.ld = a ? H + P : 0;
  tout = ep_t2(out, p->ydt, T, H);
  tsl = ep_t2(slots, p->ydt, c.slot_rows, H);
  EP_OK(xte_ep_combine(g, handle, &ty, &w, &tout, &tsl, NULL));
  if (!rc)
    rc |= ep_cmp("combine out", out, p->out + (size_t)(t0 * H) * ye, (size_t)(T * H) * ye, err,
                 errlen);
  /* combine backward into rows with a gap where bit 1 */
  gv = (uint8_t *)ep_alloc((nr + extra) * (int64_t)ldg);
  memset(gv, 0xCD, (size_t)(nr + extra) * ldg);
  gw = (float *)ep_alloc(T * K * 4);
  tgo = ep_t2(p->gout + (size_t)(t0 * H) * ye, p->ydt, T, H);
  tgy = ep_t2(gv, p->ydt, nr + extra, H);
  tgy.ld = b ? H + P : 0;
  tgw = ep_t2(gw, XTE_DTYPE_FP32, T, K);
  EP_OK(xte_ep_combine_backward(g, handle, &tgo, &w, &tsl, &tgy, &tgw, NULL));
  ep_rows(dense, gv, nr, (size_t)H * ye, ldg, 1);
  if (!rc)
    rc |= ep_cmp("grad_expert_out", dense, p->gY + (size_t)(lo * H) * ye, (size_t)(nr * H) * ye,
                 err, errlen);
  if (!rc)
    rc |= ep_cmp("grad_weights", (const uint8_t *)gw, (const uint8_t *)(p->gw + t0 * K),
                 (size_t)(T * K) * 4, err, errlen);
  /* dispatch backward, from rows with a gap on odd ranks */
  ep_rows(yv, p->G + (size_t)(lo * H) * ye, nr, (size_t)H * ye, ldy, 0);
  tgx = ep_t2(out, p->ydt, T, H);
  EP_OK(xte_ep_dispatch_backward(g, handle, &ty, &tgx, NULL));
  if (!rc)
    rc |= ep_cmp("grad_x", out, p->gx + (size_t)(t0 * H) * ye, (size_t)(T * H) * ye, err, errlen);
  if (rc) {
    size_t n = strlen(err);
    snprintf(err + n, errlen - n, " (views, rank %d)", rank);
  }
  free(handle);
  free(xv);
  free(rx);
  free(rs);
  free(dense);
  free(ti);
  free(tw);
  free(rw);
  free(yv);
  free(out);
  free(slots);
  free(gv);
  free(gw);
  return rc;
}

#endif /* XTE_TESTS_EP_COMMON_H */

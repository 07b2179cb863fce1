/* XTE_ATTENTION_FAST on the CPU (docs/numerics.md section 7, "FAST"), run once per ISA
 * (test_attention_fast@<isa>):
 *  - the FAST exp's relative error against libm's exp in double on a sweep of the fp32 inputs
 *    (every TA_EXP_STRIDE-th float of [-86.5, 88.72], default 97; TA_EXP_STRIDE=1 is the
 *    exhaustive measurement quoted in numerics.md) and its special values;
 *  - FlashAttention's criterion against the fp64 oracle of test_attention_oracle.h, forward and
 *    backward, on fp32 / bf16 / fp16 cases with masks, windows, GQA, THD, softcap, ALiBi and
 *    padding (the table-driven attention tests also run whole in FAST: <test>@fast@<isa>);
 *  - bf16 inputs on the bf16 dot products where the ISA has them attached (AMX-BF16 tiles, and
 *    AVX512-BF16 through xte_internal_attention_fast_bf16(2)) and on the fp32 ones
 *    (xte_internal_attention_fast_bf16(0)), each within the same criterion, with head dims past
 *    the kernels' K chunk and odd ones; each bf16 path really taken;
 *  - the same bytes run to run; config->mode checked; FAST really taken (its bytes differ from
 *    EXACT's). */
#include <criterion/criterion.h>

#include "test_attention_oracle.h"
#include "xte/xte.h"

/* the test hooks of src/cpu/attention_kernels.h (exported, not in a public header) */
XTE_API xte_status xte_internal_attention_exp_fast(xte_cpu_isa isa, const float *x, float *y,
                                                   int64_t n);
XTE_API int xte_internal_attention_fast_bf16(int on);
XTE_API xte_status xte_internal_attention_bf16_gemm(int kind, int fold, int64_t M, int64_t N,
                                                    int64_t K, const float *A, int64_t a_rs,
                                                    int64_t a_ks, const float *B, int64_t ldb,
                                                    const float *C0, int64_t ldc0, float *D,
                                                    int64_t ldd, const float *alpha, int acc);

/* The documented maximum relative error of the FAST exp on [-86.5, 88.72] (numerics.md). */
#define FAST_EXP_MAX_REL 2.0e-7

static float f_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint32_t u_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* max relative error of the fast exp over the floats [lo_bits .. hi_bits] (one sign) by step */
static double sweep(uint32_t from, uint32_t to, uint32_t step, double *worst_x) {
  enum { N = 4096 };
  static float x[N], y[N];
  double worst = 0.0;
  uint64_t u = from;
  const xte_cpu_isa isa = xte_cpu_get_isa();
  while (u <= to) {
    int n = 0, i;
    for (; n < N && u <= to; n++, u += step) x[n] = f_of((uint32_t)u);
    cr_assert_eq(xte_internal_attention_exp_fast(isa, x, y, n), XTE_SUCCESS);
    for (i = 0; i < n; i++) {
      const double ref = exp((double)x[i]), e = fabs((double)y[i] - ref) / ref;
      if (!(e <= worst)) {
        worst = isnan(e) ? INFINITY : e;
        *worst_x = x[i];
      }
    }
  }
  return worst;
}

Test(attention_fast, exp_error_and_special_values) {
  const char *env = getenv("TA_EXP_STRIDE");
  const uint32_t step = env ? (uint32_t)atoi(env) : 97u;
  double wn = 0, wp = 0, xn = 0, xp = 0;
  static const float special[8] = {-INFINITY, -1000.0f, -86.51f,  -87.0f,
                                   88.73f,    1000.0f,  INFINITY, 0.0f};
  float y[8], q[1] = {NAN}, qy[1];
  /* [-86.5, -0] and [+0, 88.72] (exp(x) a normal float, not rounded to inf) */
  wn = sweep(0x80000000u, u_of(-86.5f), step, &xn);
  wp = sweep(0u, u_of(88.72f), step, &xp);
  printf(
      "fast exp (%s), every %u-th float: max rel err %.3g (x = %.9g) on [-86.5, 0], %.3g "
      "(x = %.9g) on [0, 88.72]\n",
      xte_cpu_isa_name(xte_cpu_get_isa()), step, wn, xn, wp, xp);
  fflush(stdout);
  cr_expect(wn <= FAST_EXP_MAX_REL, "rel err %g at x = %.9g", wn, xn);
  cr_expect(wp <= FAST_EXP_MAX_REL, "rel err %g at x = %.9g", wp, xp);
  cr_assert_eq(xte_internal_attention_exp_fast(xte_cpu_get_isa(), special, y, 8), XTE_SUCCESS);
  /* below -86.5: +0 on the vector ISAs, xte_expf's value (< 2.7e-38) on the scalar one */
  cr_expect(u_of(y[0]) == 0u && u_of(y[1]) == 0u && y[2] >= 0.0f && y[2] < 2.7e-38f &&
                y[3] >= 0.0f && y[3] < 2.7e-38f,
            "exp(-inf), exp(-1000) = +0, below -86.5 under 2.7e-38: %g %g %g %g", y[0], y[1], y[2],
            y[3]);
  cr_expect(isinf(y[4]) && isinf(y[5]) && isinf(y[6]) && y[4] > 0 && y[6] > 0,
            "past 88.7228 the FAST exp is +inf: %g %g %g", y[4], y[5], y[6]);
  cr_expect(y[7] == 1.0f, "exp(0) = %.9g", y[7]);
  cr_assert_eq(xte_internal_attention_exp_fast(xte_cpu_get_isa(), q, qy, 1), XTE_SUCCESS);
  cr_expect(isnan(qy[0]), "exp(NaN) = %g", qy[0]);
}

static acase fk(xte_attn_layout L, xte_dtype dt, int64_t b, int64_t sq, int64_t skv, int64_t hq,
                int64_t hkv, int64_t dqk, int64_t dv, xte_attn_mask m) {
  acase c = ta_case(L, dt, b, sq, skv, hq, hkv, dqk, dv, m);
  c.seed = (uint64_t)(sq * 131 + skv * 7 + hq * 3 + dqk + (int)m * 1000 + (int)dt * 77 + 5);
  c.fast = 1;
  return c;
}

/* Case k < NCASES of dtype dt: every kind of case (masks, windows, GQA, THD, padding, softcap,
 * ALiBi, odd and MLA head dims, head dims past the bf16 kernels' K chunk of 128). */
#define NCASES 11
static acase fcase(int k, xte_dtype dt) {
  static int32_t lq[3] = {70, 0, 129}, lk[3] = {90, 33, 129};
  acase c;
  switch (k) {
    case 0:
      c = fk(BSHD, dt, 2, 150, 150, 4, 4, 64, 64, NOMASK);
      break;
    case 1:
      c = fk(BSHD, dt, 1, 130, 200, 4, 2, 64, 64, CAUSAL);
      break;
    case 2:
      c = fk(SBHD, dt, 2, 200, 130, 4, 1, 32, 48, CAUSAL_BR);
      break;
    case 3:
      c = fk(BSHD, dt, 1, 160, 160, 2, 2, 80, 80, NOMASK);
      c.wl = 40;
      c.wr = 5;
      break;
    case 4:
      c = fk(BSHD, dt, 1, 100, 100, 2, 1, 128, 128, CAUSAL);
      c.softcap = 15.0f;
      break;
    case 5:
      c = fk(BSHD, dt, 1, 100, 120, 2, 2, 64, 64, CAUSAL_BR);
      c.alibi = 1;
      break;
    case 6:
      c = fk(THD, dt, 3, 129, 129, 4, 2, 64, 64, CAUSAL);
      c.lens_q = lq;
      c.lens_kv = lk;
      break;
    case 7:
      c = fk(BSHD, dt, 3, 129, 129, 2, 1, 64, 64, NOMASK);
      c.lens_q = lq;
      c.lens_kv = lk;
      c.padded = 1;
      break;
    case 8: /* few query rows, odd head dims, MLA-like d_qk != d_v */
      c = fk(BSHD, dt, 2, 5, 150, 2, 2, 7, 3, NOMASK);
      break;
    case 9:
      c = fk(BSHD, dt, 1, 64, 300, 2, 2, 192, 128, NOMASK);
      c.scale = 0.05f;
      break;
    default: /* K = 255: two K chunks of the bf16 kernels (128), the second odd; 48 value columns */
      c = fk(BSHD, dt, 1, 70, 140, 2, 1, 255, 48, CAUSAL_BR);
      break;
  }
  return c;
}

/* Every kind of case in each input dtype: forward and backward within the criterion. */
Test(attention_fast, criterion_cases) {
  static const xte_dtype dts[3] = {F32, BF16, F16};
  int t, k, fails = 0, n = 0;
  for (t = 0; t < 3; t++)
    for (k = 0; k < NCASES; k++) {
      const xte_dtype dt = dts[t];
      const acase c = fcase(k, dt);
      n++;
      if (ta_run_check(&c, 1)) {
        fails++;
        cr_expect(0, "FAST case %d dtype %s fails the criterion", k, xte_dtype_name(dt));
      }
    }
  printf("attention FAST criterion (%s): %d cases, %d failing\n",
         xte_cpu_isa_name(xte_cpu_get_isa()), n, fails);
  fflush(stdout);
}

/* the outputs of one forward + backward */
typedef struct outs {
  void *o, *dq, *dk, *dv;
  float *lse;
} outs;

static void run_both(adata *d, outs *r) {
  cr_assert_eq(xte_attention_fwd(&d->Q, &d->K, &d->V, &d->O, &d->L, &d->cfg, NULL), XTE_SUCCESS,
               "%s", xte_last_error());
  cr_assert_eq(xte_attention_bwd(&d->Q, &d->K, &d->V, &d->O, &d->dO, &d->L, &d->dQ, &d->dK, &d->dV,
                                 &d->cfg, NULL),
               XTE_SUCCESS, "%s", xte_last_error());
  r->o = malloc((size_t)d->no * 4);
  r->dq = malloc((size_t)d->nq * 4);
  r->dk = malloc((size_t)d->nk * 4);
  r->dv = malloc((size_t)d->nv * 4);
  r->lse = malloc((size_t)d->nl * 4);
  memcpy(r->o, d->Or, (size_t)d->no * 4);
  memcpy(r->dq, d->dQr, (size_t)d->nq * 4);
  memcpy(r->dk, d->dKr, (size_t)d->nk * 4);
  memcpy(r->dv, d->dVr, (size_t)d->nv * 4);
  memcpy(r->lse, d->lse, (size_t)d->nl * 4);
}

static void free_outs(outs *r) {
  free(r->o);
  free(r->dq);
  free(r->dk);
  free(r->dv);
  free(r->lse);
}

/* 0 when every byte is the same (sizes of the fp32 buffers; narrower dtypes use a prefix) */
static int differ(const adata *d, const outs *a, const outs *b) {
  return memcmp(a->o, b->o, (size_t)d->no * 4) != 0 || memcmp(a->dq, b->dq, (size_t)d->nq * 4) ||
         memcmp(a->dk, b->dk, (size_t)d->nk * 4) || memcmp(a->dv, b->dv, (size_t)d->nv * 4) ||
         memcmp(a->lse, b->lse, (size_t)d->nl * 4);
}

Test(attention_fast, same_bytes_run_to_run) {
  static const xte_dtype dts[3] = {F32, BF16, F16};
  int t, r;
  for (t = 0; t < 3; t++) {
    acase c = fk(BSHD, dts[t], 2, 300, 300, 4, 2, 64, 64, CAUSAL);
    adata d;
    outs first, again;
    ta_setup(&d, &c);
    run_both(&d, &first);
    for (r = 0; r < 3; r++) {
      run_both(&d, &again);
      cr_expect(!differ(&d, &first, &again), "%s: run %d differs from run 0",
                xte_dtype_name(dts[t]), r + 1);
      free_outs(&again);
    }
    free_outs(&first);
    ta_free(&d);
  }
}

/* FAST is taken: the backward has no renormalisation on every ISA, and the vector ISAs' exps
 * differ from xte_expf, so some bytes differ from EXACT's. */
Test(attention_fast, differs_from_exact) {
  acase c = fk(BSHD, F32, 1, 200, 200, 2, 2, 64, 64, NOMASK);
  adata d;
  outs f, e;
  ta_setup(&d, &c);
  run_both(&d, &f);
  d.cfg.mode = XTE_ATTENTION_EXACT;
  run_both(&d, &e);
  cr_expect(memcmp(f.dq, e.dq, (size_t)d.nq * 4) != 0, "FAST dQ is EXACT's");
  if (xte_cpu_get_isa() != XTE_CPU_ISA_SCALAR)
    cr_expect(memcmp(f.o, e.o, (size_t)d.no * 4) != 0, "FAST O is EXACT's on %s",
              xte_cpu_isa_name(xte_cpu_get_isa()));
  free_outs(&f);
  free_outs(&e);
  ta_free(&d);
}

/* bf16 inputs on the other paths than the default's (criterion_cases): the fp32 dot products
 * (on = 0, as on ISAs without bf16 ones) and the AVX512-BF16 ones where AMX-BF16 is the default
 * (on = 2): every case within the same criterion. */
Test(attention_fast, bf16_other_paths) {
  static const char *name[3] = {"fp32", "AMX-BF16", "AVX512-BF16"};
  int on, k;
  for (on = 0; on <= 2; on += 2) {
    int fails = 0;
    const int kind = xte_internal_attention_fast_bf16(on);
    if (kind != on) continue; /* AVX512-BF16 not attached here */
    for (k = 0; k < NCASES; k++) {
      const acase c = fcase(k, BF16);
      if (ta_run_check(&c, 1)) {
        fails++;
        cr_expect(0, "FAST case %d bf16 on the %s dot products fails the criterion", k, name[on]);
      }
    }
    printf("attention FAST bf16 on the %s dot products (%s): %d cases, %d failing\n", name[on],
           xte_cpu_isa_name(xte_cpu_get_isa()), NCASES, fails);
  }
  (void)xte_internal_attention_fast_bf16(1);
  fflush(stdout);
}

/* Where bf16 dot products are attached (avx512 on a CPU with AVX512-BF16 / AMX-BF16), bf16 FAST
 * takes them in the forward and in both backward passes (O, dQ, dK and dV each differ from the
 * fp32 path's bytes; the criterion tests check their error), with the same bytes run to run;
 * both kinds where both are attached. */
Test(attention_fast, bf16_dot_products_taken) {
  static const int64_t shape[2][4] = {{200, 200, 64, 64}, {150, 90, 255, 48}};
  int on, sh, checked = 0;
  for (sh = 0; sh < 2; sh++) {
    acase c = fk(BSHD, BF16, 1, shape[sh][0], shape[sh][1], 2, 2, shape[sh][2], shape[sh][3],
                 sh ? CAUSAL_BR : CAUSAL);
    adata d;
    outs off;
    ta_setup(&d, &c);
    (void)xte_internal_attention_fast_bf16(0);
    run_both(&d, &off);
    for (on = 1; on <= 2; on++) {
      outs a, again;
      if (xte_internal_attention_fast_bf16(on) != on) continue;
      checked++;
      run_both(&d, &a);
      run_both(&d, &again);
      cr_expect(memcmp(a.o, off.o, (size_t)d.no * 2) != 0, "O: bf16 dot products %d not taken", on);
      cr_expect(memcmp(a.dq, off.dq, (size_t)d.nq * 2) != 0, "dQ: bf16 dot products %d not taken",
                on);
      cr_expect(memcmp(a.dk, off.dk, (size_t)d.nk * 2) != 0, "dK: bf16 dot products %d not taken",
                on);
      cr_expect(memcmp(a.dv, off.dv, (size_t)d.nv * 2) != 0, "dV: bf16 dot products %d not taken",
                on);
      cr_expect(!differ(&d, &a, &again), "bf16 dot products %d: a second run differs", on);
      free_outs(&a);
      free_outs(&again);
    }
    (void)xte_internal_attention_fast_bf16(1);
    free_outs(&off);
    ta_free(&d);
  }
  printf("attention FAST (%s): bf16 dot products checked taken in %d shape x kind runs\n",
         xte_cpu_isa_name(xte_cpu_get_isa()), checked);
  fflush(stdout);
}

/* x rounded to bf16 (the oracle header's rounding: 7 fraction bits, to nearest even) */
static double bf16_rne(float x) {
  return ta_round((double)x, 7, -126);
}

/* uniform in [0, 1) */
static double unif(uint64_t *s) {
  return (double)(ta_rng(s) >> 11) * 0x1p-53;
}

/* The bf16 dot-product kernels alone against fp64: each output within the fp32 summation bound
 * (K + 2) 2^-24 sum |a b| of the exact sum of the bf16-rounded operands' products (a kernel that
 * truncates instead of rounding, drops a K tail, skips a tile or a fold step is off by 2^-9 of a
 * product or more); shapes with row and K tails, both layouts of A (rows along K, the keys x rows
 * tiles of P and dS), gemm from +0 and from C, gemm_fold with and without alpha and C0; a NaN in A
 * gives its row NaN. */
Test(attention_fast, bf16_kernels) {
  static const int64_t shp[8][3] = {{64, 64, 128}, {5, 16, 7},   {37, 48, 255}, {64, 128, 64},
                                    {1, 16, 1},    {17, 32, 33}, {50, 80, 256}, {20, 272, 40}};
  int kind, s, lay, mode, runs = 0, pbruns = 0;
  uint64_t st = 12345;
  for (kind = 1; kind <= 2; kind++)
    for (s = 0; s < 8; s++)
      for (lay = 0; lay < 2; lay++)
        for (mode = 0; mode < 4; mode++) {
          const int64_t M = shp[s][0], N = shp[s][1], K = shp[s][2], ldb = N + 5, ldd = N + 3;
          const int64_t a_rs = lay ? 1 : K + 1, a_ks = lay ? M + 2 : 1;
          const size_t na = (size_t)(lay ? K * a_ks : M * a_rs);
          float *A = malloc(na * 4), *B = malloc((size_t)(K * ldb) * 4);
          float *D = malloc((size_t)(M * ldd) * 4), *C0 = malloc((size_t)(M * ldd) * 4);
          float *D0 = malloc((size_t)(M * ldd) * 4), al[64];
          const int fold = mode >= 2, acc = mode == 1, use_al = mode == 3, use_c0 = mode == 2;
          int64_t r, c, k, bad = 0;
          size_t i;
          xte_status stt;
          for (i = 0; i < na; i++) A[i] = (float)unif(&st) * 2.0f - 1.0f;
          for (i = 0; i < (size_t)(K * ldb); i++) B[i] = (float)unif(&st) * 2.0f - 1.0f;
          for (i = 0; i < (size_t)(M * ldd); i++) {
            D0[i] = D[i] = (float)unif(&st) - 0.5f;
            C0[i] = (float)unif(&st) - 0.5f;
          }
          for (r = 0; r < 64; r++) al[r] = (float)unif(&st);
          stt = xte_internal_attention_bf16_gemm(kind, fold, M, N, K, A, a_rs, a_ks, B, ldb,
                                                 use_c0 ? C0 : NULL, ldd, D, ldd,
                                                 use_al ? al : NULL, acc);
          if (stt == XTE_ERROR_UNSUPPORTED) {
            free(A), free(B), free(D), free(C0), free(D0);
            continue;
          }
          cr_assert_eq(stt, XTE_SUCCESS);
          runs++;
          for (r = 0; r < M; r++)
            for (c = 0; c < N; c++) {
              double ref = 0, mag = 0, t0 = 0, want, tol;
              for (k = 0; k < K; k++) {
                const double p = bf16_rne(A[r * a_rs + k * a_ks]) * bf16_rne(B[k * ldb + c]);
                ref += p;
                mag += fabs(p);
              }
              if (use_c0 || acc) t0 = use_c0 ? C0[r * ldd + c] : D0[r * ldd + c];
              tol = (double)(K + 2) * ldexp(mag + fabs(t0), -24);
              ref += t0;
              if (!fold) {
                want = ref;
              } else {
                const double base = use_al ? (double)D0[r * ldd + c] * al[r] : D0[r * ldd + c];
                want = base + ref;
                tol += ldexp(fabs(base) + fabs(ref), -23);
              }
              if (!(fabs((double)D[r * ldd + c] - want) <= tol)) {
                if (!bad)
                  fprintf(stderr,
                          "kind %d M %lld N %lld K %lld layout %d mode %d: [%lld][%lld] %.9g want "
                          "%.9g tol %.3g\n",
                          kind, (long long)M, (long long)N, (long long)K, lay, mode, (long long)r,
                          (long long)c, (double)D[r * ldd + c], want, tol);
                bad++;
              }
            }
          cr_expect_eq(bad, 0,
                       "bf16 kernel %d (M %lld, N %lld, K %lld, layout %d, mode %d): %lld bad",
                       kind, (long long)M, (long long)N, (long long)K, lay, mode, (long long)bad);
          if (mode == 0) { /* B packed once (gemm_pb, where the kind has it): gemm's bytes */
            float *P = malloc((size_t)(M * ldd) * 4);
            memcpy(P, D0, (size_t)(M * ldd) * 4);
            stt = xte_internal_attention_bf16_gemm(kind, 2, M, N, K, A, a_rs, a_ks, B, ldb, NULL, 0,
                                                   P, ldd, NULL, 0);
            if (stt == XTE_SUCCESS) {
              pbruns++;
              for (r = 0; r < M; r++)
                cr_expect(memcmp(P + r * ldd, D + r * ldd, (size_t)N * 4) == 0,
                          "kind %d: gemm_pb row %lld differs from gemm's (M %lld N %lld K %lld)",
                          kind, (long long)r, (long long)M, (long long)N, (long long)K);
            } else {
              cr_expect_eq(stt, XTE_ERROR_UNSUPPORTED);
            }
            free(P);
          }
          if (mode == 0) { /* a NaN in row 0 of A: row 0 NaN, row 1 finite */
            A[0] = NAN;
            cr_assert_eq(xte_internal_attention_bf16_gemm(kind, 0, M, N, K, A, a_rs, a_ks, B, ldb,
                                                          NULL, 0, D, ldd, NULL, 0),
                         XTE_SUCCESS);
            for (c = 0; c < N; c++) {
              cr_expect(isnan(D[c]), "kind %d: NaN in A, D[0][%lld] = %g", kind, (long long)c,
                        (double)D[c]);
              if (M > 1) cr_expect(!isnan(D[ldd + c]), "kind %d: row 1 NaN", kind);
            }
          }
          free(A), free(B), free(D), free(C0), free(D0);
        }
  printf("attention FAST bf16 kernels (%s): %d runs against fp64, %d packed-B runs\n",
         xte_cpu_isa_name(xte_cpu_get_isa()), runs, pbruns);
  fflush(stdout);
}

Test(attention_fast, bad_mode) {
  static const int bad[3] = {2, -1, 1000};
  int i;
  for (i = 0; i < 3; i++) {
    acase c = fk(BSHD, F32, 1, 20, 20, 1, 1, 16, 16, NOMASK);
    adata d;
    int64_t k;
    ta_setup(&d, &c);
    memset(d.Or, 0x5A, (size_t)d.no * 4);
    d.cfg.mode = (xte_attention_mode)bad[i];
    cr_expect_eq(xte_attention_fwd(&d.Q, &d.K, &d.V, &d.O, &d.L, &d.cfg, NULL),
                 XTE_ERROR_INVALID_ARGUMENT);
    cr_expect(strstr(xte_last_error(), "config->mode") != NULL, "error: %s", xte_last_error());
    cr_expect_eq(
        xte_attention_bwd(&d.Q, &d.K, &d.V, &d.O, &d.dO, &d.L, &d.dQ, &d.dK, &d.dV, &d.cfg, NULL),
        XTE_ERROR_INVALID_ARGUMENT);
    cr_expect(strstr(xte_last_error(), "config->mode") != NULL, "error: %s", xte_last_error());
    for (k = 0; k < d.no * 4; k++)
      if (((unsigned char *)d.Or)[k] != 0x5A) break;
    cr_expect_eq(k, d.no * 4, "O written on a bad mode");
    ta_free(&d);
  }
  cr_expect_eq(xte_attention_config_default().mode, XTE_ATTENTION_EXACT);
}

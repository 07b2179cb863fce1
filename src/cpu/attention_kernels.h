/* The CPU attention kernels of an ISA (the attn entry of src/cpu/xte_cpu.h's
 * xte_cpu_isa_table), what the driver, src/cpu/attention_driver.c, calls; and the driver's test
 * hooks. */
#ifndef XTE_CPU_ATTENTION_KERNELS_H
#define XTE_CPU_ATTENTION_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "xte/core.h"

/* ---------------------------------------------------------------- CPU micro-kernels
 * Every ISA gives the scalar kernels' bytes: each output element is one fixed sequence of IEEE
 * operations (vectorised across independent outputs, never across a reduction). */
typedef struct xte_attn_kernels {
  int isa; /* xte_cpu_isa */
  /* C[r*ldc + c] = fmaf chain over k = 0 .. K-1 (in order) of A[r*a_rs + k*a_ks] * B[k*ldb + c],
   * starting from C[r*ldc + c] (acc = 1) or +0 (acc = 0); r < M, c < N; N a multiple of 16. */
  void (*gemm)(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
               const float *B, int64_t ldb, float *C, int64_t ldc, int acc);
  /* p[j] = xte_attn_exp(x[j], m) = xte_expf(x[j] - m) for j < n, n a multiple of 16 */
  void (*exp_sub)(const float *x, float m, int64_t n, float *p);
  /* o[c] = xte_attn_rescale(o[c], alpha, pv[c]) = fmaf(o[c], alpha, pv[c]) for c < n, n a
   * multiple of 16 */
  void (*rescale)(float *o, float alpha, const float *pv, int64_t n);
  /* The forward's online-softmax step of one KV block on a transposed tile: column r < n (n a
   * multiple of 16) is query row r, its 64 slots at S[j * ld + r]. scaled: the logit is
   * x = S * scale for a[r] <= j < e[r], -inf elsewhere; otherwise S holds the logits x. Per
   * column, the scalar order: mb = xte_fmaxf chain over j = 0..63 from -inf,
   * alpha[r] = xte_attn_new_max(&m[r], mb), P[j * ld + r] = xte_attn_exp(x_j, m[r]),
   * l[r] = fmaf(l[r], alpha[r], xte_attn_sum64(column r of P)). Every column is updated (the
   * caller keeps m, l of the rows that do not see the block). */
  void (*fwd_softmax_t)(const float *S, int64_t ld, int64_t n, int scaled, float scale,
                        const int32_t *a, const int32_t *e, float *m, float *l, float *alpha,
                        float *P);
  /* The backward's probabilities and dS of one KV block on a transposed tile (column r < n,
   * n a multiple of 16, is query row r; slot j at [j * ld + r], j < 64): x as in fwd_softmax_t,
   * u = xte_expf((x - L[r]) - C[r]) (C NULL: - 0), P = u, dS = (u * (dP - D[r])) * g with
   * g = G[j * ld + r] (G NULL: g = scale); sum (non-NULL): sum[r] = xte_attn_sum64(column r
   * of P). */
  void (*bwd_p_t)(const float *S, const float *dP, const float *G, int64_t ld, int64_t n,
                  int scaled, float scale, const int32_t *a, const int32_t *e, const float *L,
                  const float *C, const float *D, float *P, float *dS, float *sum);
  /* y[j] = xte_expf(x[j]) for j < n, any n, every element through the ISA's lanes (tests) */
  void (*exp_n)(const float *x, float *y, int64_t n);
  /* gemm's chains folded into D instead of stored: t = the fmaf chain over k = 0 .. K-1 of
   * A[r*a_rs + k*a_ks] * B[k*ldb + c] from C0[r*ldc0 + c] (C0 NULL: from +0), then
   * D[r*ldd + c] = xte_attn_add(D[r*ldd + c], t) (alpha NULL) or
   * xte_attn_rescale(D[r*ldd + c], alpha[r], t); r < M, c < N, N a multiple of 16. */
  void (*gemm_fold)(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                    const float *B, int64_t ldb, const float *C0, int64_t ldc0, float *D,
                    int64_t ldd, const float *alpha);
  /* out[r] = the fmaf chain over c = 0 .. d-1 (in order) from +0 of xte_fmaf(X[r*ld + c],
   * Y[r*ld + c], .) for r < n (the backward's D = dO . O) */
  void (*dot_rows)(int64_t n, int64_t d, const float *X, const float *Y, int64_t ld, float *out);
  /* A tile's rows transposed (a copy: the same bits): dst[k * XTE_ATTN_BM + r] = X[r * ldx + k]
   * for r < n, k < d, and +0 for n <= r < XTE_ATTN_BM (n <= XTE_ATTN_BM) */
  void (*load_t)(const float *X, int64_t ldx, int64_t n, int64_t d, float *dst);
  /* XTE_ATTENTION_FAST's kernels of this ISA (NULL: the ones above): the same entries, with
   * exp_sub, fwd_softmax_t, bwd_p_t and exp_n through the ISA's fast exp (exp_fast_v,
   * docs/numerics.md section 7, "FAST") instead of xte_expf; their own fast is NULL */
  const struct xte_attn_kernels *fast;
} xte_attn_kernels;

/* XTE_ATTENTION_FAST's bf16 dot products (src/cpu/bf16/attention_bf16.c, AVX512-BF16): gemm and
 * gemm_fold with xte_attn_kernels' arguments and layout, each operand rounded to bf16 (round to
 * nearest even) and the products summed in fp32 pair by pair (VDPBF16PS, a fixed order). The
 * driver takes them for bf16 inputs in FAST where isa.c attached them (the xte_cpu_isa_table's
 * attn_amx: AMX-BF16 tiles, src/cpu/bf16/attention_amx_bf16.c, else attn_bf16) and
 * xte_internal_attention_fast_bf16 has not turned them off. */
typedef struct xte_attn_bf16_kernels {
  void (*gemm)(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
               const float *B, int64_t ldb, float *C, int64_t ldc, int acc);
  void (*gemm_fold)(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                    const float *B, int64_t ldb, const float *C0, int64_t ldc0, float *D,
                    int64_t ldd, const float *alpha);
  /* Optional (NULL: none). gemm from +0 (acc = 0) with B packed once for several calls: pack_b
   * packs B (K <= 256 rows, N <= XTE_ATTN_PB_LD columns) into pb (XTE_ATTN_PB_WORDS words);
   * gemm_pb(M, N, K, A, a_rs, a_ks, pb + c0, C, ldc) is gemm's result for B's columns [c0, c0 + N)
   * (the same bytes: the same roundings and order). */
  void (*pack_b)(int64_t K, int64_t N, const float *B, int64_t ldb, uint32_t *pb);
  void (*gemm_pb)(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                  const uint32_t *pb, float *C, int64_t ldc);
  /* Optional (NULL: none): the forward's K and V packed once per head. pack_a packs A's rows
   * (A[r * lda + k], K <= 256) to pa, row r's ceil(K / 32) * 16 words at pa + r * ceil(K / 32) *
   * 16, rows [M, Mpad) zero; gemm_pa(M, N, K, pa, pb + c0, C, ldc) is gemm_pb's result with A's
   * rows read from pa (rows up to M rounded up to 16 are read). pack_bn packs B's rows [0, K) in
   * pairs (N <= 256 columns, a multiple of 16), pair row k2 < Kpad / 2 at p + k2 * ld words, rows
   * [K, Kpad) zero (Kpad even); gemm_fold_pb(M, N, K, A, a_rs, a_ks, p, ld, D, ldd, alpha) is
   * gemm_fold's result without C0 (K <= 256, pair rows up to ceil(K / 32) * 16 read, zero past
   * K). The same bytes as the unpacked calls: the same roundings and order. */
  void (*pack_a)(int64_t M, int64_t Mpad, int64_t K, const float *A, int64_t lda, uint32_t *pa);
  void (*gemm_pa)(int64_t M, int64_t N, int64_t K, const uint32_t *pa, const uint32_t *pb, float *C,
                  int64_t ldc);
  void (*pack_bn)(int64_t K, int64_t Kpad, int64_t N, const float *B, int64_t ldb, uint32_t *p,
                  int64_t ld);
  void (*gemm_fold_pb)(int64_t M, int64_t N, int64_t K, const float *A, int64_t a_rs, int64_t a_ks,
                       const uint32_t *pb, int64_t ldpb, float *D, int64_t ldd, const float *alpha);
} xte_attn_bf16_kernels;

/* the packed B of xte_attn_bf16_kernels.pack_b: rows of XTE_ATTN_PB_LD words, 128 rows */
#define XTE_ATTN_PB_LD 64
#define XTE_ATTN_PB_WORDS (128 * XTE_ATTN_PB_LD)

/* Test hook, not public API (no public header declares it): the attention kernels' exp of ISA
 * isa (exp_n above) on x[0 .. n), into y. XTE_ERROR_UNSUPPORTED when the ISA cannot run here.
 * Exported only so that tests/test_attention_lanes.c can check every lane exhaustively. */
XTE_API xte_status xte_internal_attention_exp(xte_cpu_isa isa, const float *x, float *y, int64_t n);

/* Test hook, not public API: the same through the FAST kernels' exp of ISA isa (the exact one
 * where the ISA has no FAST kernels), for tests/test_attention_fast.c's error measurement. */
XTE_API xte_status xte_internal_attention_exp_fast(xte_cpu_isa isa, const float *x, float *y,
                                                   int64_t n);

/* Test hook, not public API: sets the most bytes the CPU driver's per-thread fp32 head caches
 * (bf16 / fp16 / e4m3 inputs, src/cpu/attention_driver.c) may take in all, above which it
 * converts block by block; returns the previous limit (default 256 MiB). 0 turns them off.
 * Not thread-safe: for tests that compare the two paths' bytes. */
XTE_API size_t xte_internal_attention_cache_limit(size_t bytes);

/* Test hook, not public API: which of FAST's bf16 dot products (xte_attn_bf16_kernels) the calls
 * that follow take: on = 0 none (the fp32 ones), 1 the attached ones (the default: AMX-BF16 where
 * attached, else AVX512-BF16), 2 AVX512-BF16 even where AMX-BF16 is attached; other values leave
 * the setting. Returns what the ISA in use then takes: 0 none, 1 AMX-BF16, 2 AVX512-BF16. Not
 * thread-safe: for tests that run every path in one process (XTE_CPU_AVX512_BF16=0 keeps both
 * off for a whole process, XTE_CPU_AMX_BF16=0 the tiles). */
XTE_API int xte_internal_attention_fast_bf16(int on);

/* Test hook, not public API: the bf16 dot products of kind 1 (AMX-BF16) or 2 (AVX512-BF16) of the
 * ISA in use, called directly: gemm (fold = 0: D is its C, acc its acc), gemm_fold (fold = 1:
 * C0, ldc0, D, ldd, alpha as there) or pack_b then gemm_pb (fold = 2: into D; unsupported where
 * the kind has none, K > 256 or N > XTE_ATTN_PB_LD), for tests/test_attention_fast.c's check of
 * their roundings and tails against an fp64 oracle. XTE_ERROR_UNSUPPORTED when that kind is not
 * attached. */
XTE_API xte_status xte_internal_attention_bf16_gemm(int kind, int fold, int64_t M, int64_t N,
                                                    int64_t K, const float *A, int64_t a_rs,
                                                    int64_t a_ks, const float *B, int64_t ldb,
                                                    const float *C0, int64_t ldc0, float *D,
                                                    int64_t ldd, const float *alpha, int acc);

#endif /* XTE_CPU_ATTENTION_KERNELS_H */

/* The cases of the table of valid calls (tests/calls/calls.h), in parts by operator family:
 *   calls.c              the context, the data helpers, the table
 *   quant_gemm_router.c  quantize, dequantize, cast; GEMM (dense, grouped); router, aux loss
 *   moe.c                token movement (permute, unpermute, sort chunks, layout); SwiGLU
 *   attention_ep.c       attention; streams and memory; expert parallelism (one rank)
 * Every case is a setup_<name> (0: ready; else c->err says why) and a run; this header is what the
 * parts share. */
#ifndef XTE_TESTS_CALLS_CASES_H
#define XTE_TESTS_CALLS_CASES_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "calls.h"

/* the state struct of a case */
#define STATE(T)                                 \
  T *s = (T *)calls_alloc(c, sizeof(T));         \
  if (!s) return fail(c, "out of buffer slots"); \
  c->state = s
#define ALLOC(p, T, n)                                        \
  do {                                                        \
    (p) = (T *)calls_alloc(c, sizeof(T) * (size_t)(n));       \
    if (!(p)) return fail(c, "out of buffer slots (%s)", #p); \
  } while (0)
#define TRY_X(call)                                                                   \
  do {                                                                                \
    xte_status st_ = (call);                                                          \
    if (st_ != XTE_SUCCESS)                                                           \
      return fail(c, "%s: %s (%s)", #call, xte_status_string(st_), xte_last_error()); \
  } while (0)

/* ------------------------------------------------------------------ calls.c: data helpers */
void *data(calls_ctx *c, xte_dtype dt, int64_t n, float scale, int specials);
int fail(calls_ctx *c, const char *fmt, ...);
int make_q(calls_ctx *c, xte_qtensor *q, int64_t M, int64_t K, xte_scaling_mode mode,
           xte_recipe rec, xte_scale_layout lay, xte_dtype dt, int col, int as_out);
int out2d(calls_ctx *c, xte_tensor *t, xte_dtype dt, int64_t r, int64_t cols, const char *name);
int quantized(calls_ctx *c, xte_qtensor *q, const float *x, int64_t M, int64_t K,
              xte_scaling_mode mode, xte_recipe rec, xte_scale_layout lay, xte_dtype dt, int col);
uint32_t rnd(calls_ctx *c);

/* ------------------------------------------------------------------ quant_gemm_router.c: quantize,
 * dequantize, cast, GEMM, router */
xte_status aux_loss_run(calls_ctx *c);
xte_status cast_run(calls_ctx *c);
xte_status dequant_run(calls_ctx *c);
xte_status gemm_run(calls_ctx *c);
xte_status qb_run(calls_ctx *c);
xte_status quant_run(calls_ctx *c);
xte_status router_run(calls_ctx *c);
int setup_quantize_1x128(calls_ctx *c);
int setup_quantize_128x128(calls_ctx *c);
int setup_quantize_mxfp8(calls_ctx *c);
int setup_quantize_current(calls_ctx *c);
int setup_dequantize_1x128_col(calls_ctx *c);
int setup_dequantize_128x128(calls_ctx *c);
int setup_cast_fp32_e5m2(calls_ctx *c);
int setup_cast_e4m3_bf16(calls_ctx *c);
int setup_gemm_1x128_128x128(calls_ctx *c);
int setup_gemm_trans_b_acc_bias(calls_ctx *c);
int setup_gemm_grouped_contiguous(calls_ctx *c);
int setup_gemm_grouped_masked(calls_ctx *c);
int setup_gemm_fast_e5m2_acc_bias(calls_ctx *c);
int setup_gemm_grouped_masked_fast(calls_ctx *c);
int setup_gemm_grouped_k(calls_ctx *c);
int setup_router_fwd_softmax(calls_ctx *c);
int setup_router_fwd_sigmoid_grouped(calls_ctx *c);
int setup_router_bwd_softmax(calls_ctx *c);
int setup_router_bwd_sigmoid_grouped(calls_ctx *c);
int setup_aux_scores_softmax(calls_ctx *c);
int setup_aux_scores_sigmoid(calls_ctx *c);
int setup_aux_scores_bwd_softmax(calls_ctx *c);
int setup_aux_scores_bwd_sigmoid(calls_ctx *c);
int setup_aux_loss_fwd(calls_ctx *c);
int setup_aux_loss_bwd(calls_ctx *c);
int setup_router_qb(calls_ctx *c);
int setup_aux_scores_bits(calls_ctx *c);
int setup_aux_loss_seq_fwd(calls_ctx *c);
int setup_aux_loss_seq_bwd(calls_ctx *c);

/* ------------------------------------------------------------------ moe.c: token movement, SwiGLU
 */
xte_status perm_run(calls_ctx *c);
xte_status swiglu_run(calls_ctx *c);
int setup_permute_rows_map(calls_ctx *c);
int setup_permute_rows_topk_align(calls_ctx *c);
int setup_permute_map_bf16(calls_ctx *c);
int setup_permute_topk_e4m3_align(calls_ctx *c);
int setup_unpermute_map_fp32(calls_ctx *c);
int setup_unpermute_topk_bf16(calls_ctx *c);
int setup_permute_bwd_map(calls_ctx *c);
int setup_permute_bwd_topk_bf16(calls_ctx *c);
int setup_unpermute_bwd_topk_fp32(calls_ctx *c);
int setup_unpermute_bwd_map_bf16(calls_ctx *c);
int setup_sort_chunks(calls_ctx *c);
int setup_sort_chunks_bwd(calls_ctx *c);
int setup_dispatch_layout(calls_ctx *c);
int setup_swiglu_fp32(calls_ctx *c);
int setup_dswiglu_bf16(calls_ctx *c);
int setup_swiglu_quantize(calls_ctx *c);
int setup_dswiglu_quantize(calls_ctx *c);

/* ------------------------------------------------------------------ attention_ep.c: attention,
 * streams and memory, EP */
xte_status attn_run(calls_ctx *c);
xte_status ep_run(calls_ctx *c);
xte_status malloc_run(calls_ctx *c);
int mem_setup(calls_ctx *c);
xte_status stream_run(calls_ctx *c);
int setup_attn_fwd_bshd_fp32(calls_ctx *c);
int setup_attn_fwd_bshd_bf16(calls_ctx *c);
int setup_attn_fwd_thd_fp32(calls_ctx *c);
int setup_attn_fwd_thd_bf16(calls_ctx *c);
int setup_attn_bwd_bshd_fp32(calls_ctx *c);
int setup_attn_bwd_bshd_bf16(calls_ctx *c);
int setup_attn_bwd_thd_fp32(calls_ctx *c);
int setup_attn_bwd_thd_bf16(calls_ctx *c);
int setup_attn_fast_fwd_thd_bf16(calls_ctx *c);
int setup_attn_fast_bwd_bshd_fp32(calls_ctx *c);
int setup_ep_prepare(calls_ctx *c);
int setup_ep_dispatch_e4m3(calls_ctx *c);
int setup_ep_combine_bf16(calls_ctx *c);
int setup_ep_combine_bwd(calls_ctx *c);
int setup_ep_dispatch_bwd(calls_ctx *c);

#endif /* XTE_TESTS_CALLS_CASES_H */

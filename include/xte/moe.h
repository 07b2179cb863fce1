/* xte MoE: the fused router (top-k with a score function, forward and backward, aux loss), token
 * movement (permute / unpermute and their backward, sort chunks, DeepEP dispatch layout) and the
 * fused SwiGLU with 1x128 quantization. Fixed reduction orders: docs/numerics.md section 8.
 *
 * Every call validates all of its arguments first: on error it returns the status, names the
 * argument in xte_last_error() and writes nothing. Results never depend on the thread count or
 * the CPU ISA. */
#ifndef XTE_MOE_H
#define XTE_MOE_H

#include "xte/core.h"
#include "xte/quantize.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ================================================================== router */

typedef enum xte_router_score {
  XTE_ROUTER_SOFTMAX = 0,      /* softmax over the experts (see use_pre_softmax) */
  XTE_ROUTER_SIGMOID = 1,      /* 1 / (1 + e^-x), normalised over the top-k when topk > 1 */
  XTE_ROUTER_SQRTSOFTPLUS = 2, /* sqrt(log(1 + e^x)), normalised over the top-k when topk > 1 */
  XTE_ROUTER_SCORE_COUNT
} xte_router_score;

typedef struct xte_router_config {
  size_t struct_size; /* sizeof(xte_router_config) (xte_router_config_default sets it) */
  int topk;           /* experts per token, 1..E */
  xte_router_score score_function;
  int use_pre_softmax;  /* softmax only: 1 softmax over all E then top-k; 0 top-k of the
                           logits then softmax over those k */
  int num_groups;       /* 0 or 1: no grouping; else E % num_groups == 0 */
  int group_topk;       /* groups kept (1..num_groups); topk / group_topk experts score
                           each group */
  float scaling_factor; /* probs = scaling_factor * weight (default 1) */
} xte_router_config;

XTE_API xte_router_config xte_router_config_default(void); /* topk 1, softmax, pre 0, scale 1 */

/* Router outputs; a tensor whose data is NULL is not produced (at least one must be given).
 *  probs        fp32 [T, E]: scaling_factor * weight at the selected experts, 0 elsewhere
 *  routing_map  uint8 [T, E]: 1 at the selected experts, 0 elsewhere
 *  routing_bits uint8 [T, ceil(E/8)]: bit (e % 8) of byte e / 8 set for a selected expert
 *  topk_idx     int32 or int64 [T, k]: the selected experts in rank order (score + bias
 *               descending, then expert index ascending)
 *  topk_weights fp32 [T, k]: probs of topk_idx, in the same order
 *  saved        fp32 [T, E]: the intermediate the backward takes (softmax: the softmax output,
 *               over all E with use_pre_softmax, else over the k selected and 0 elsewhere;
 *               sigmoid / sqrtsoftplus: the scores of all E before normalisation) */
typedef struct xte_router_outputs {
  xte_tensor probs;
  xte_tensor routing_map;
  xte_tensor routing_bits;
  xte_tensor topk_idx;
  xte_tensor topk_weights;
  xte_tensor saved;
} xte_router_outputs;

/* The most experts (logits' columns) the router and the aux scores take; topk is 1..E. */
#define XTE_ROUTER_MAX_EXPERTS 65536

/* logits: fp32 or bf16 [T, E], E <= XTE_ROUTER_MAX_EXPERTS. expert_bias: NULL or fp32 [E], added
 * to the scores for the selection only. */
XTE_API xte_status xte_router_forward(const xte_tensor *logits, const xte_tensor *expert_bias,
                                      const xte_router_config *config, xte_router_outputs *out,
                                      xte_stream stream);

/* Quantile Balancing (TransformerEngine main's fused_topk_with_score_function with qb_*):
 * sigmoid scores s, the selection score s + expert_bias (fp32 [E], required); the top topk + 1
 * in rank order are taken and the last of them dropped: the outputs hold the other topk as the
 * router's (normalised over them when topk > 1, times scaling_factor), cutoff (fp32 [T]) the
 * dropped expert's s + bias. out->saved (the scores s, fp32 [T, E]) is required. histogram
 * (int32 [E, bins], accumulated in place) gains, for every token t and expert e, one count in
 * bin clamp(floor(((cutoff_t - s_te) - lower) * scale), 0, bins - 1), scale =
 * fp32(fp32(1 / (upper - lower)) * bins), every step in fp32 (TE's reference order); NaN, +-inf
 * and values >= 2^63 count in bin 0. lower, upper finite with lower < upper; topk 1..E - 1. The
 * backward is xte_router_backward with the sigmoid config of topk (the map and saved above). */
XTE_API xte_status xte_router_qb_forward(const xte_tensor *logits, const xte_tensor *expert_bias,
                                         int topk, float scaling_factor, float lower, float upper,
                                         xte_router_outputs *out, xte_tensor *cutoff,
                                         xte_tensor *histogram, xte_stream stream);

/* grad_logits [T, E] (fp32 or bf16) from grad_probs (fp32 [T, E]), the routing_map (uint8
 * [T, E]) and saved (fp32 [T, E]) of the forward; logits (as in the forward) is needed for
 * sqrtsoftplus only (may be NULL otherwise). The bias and the group limit carry no gradient. */
XTE_API xte_status xte_router_backward(const xte_tensor *grad_probs, const xte_tensor *routing_map,
                                       const xte_tensor *saved, const xte_tensor *logits,
                                       const xte_router_config *config, xte_tensor *grad_logits,
                                       xte_stream stream);

/* Scores for the aux loss (TransformerEngine's compute_score_for_moe_aux_loss): softmax over all
 * E, or sigmoid / sqrtsoftplus normalised over all E (s / (sum s + 1e-20)) for every topk, 1
 * included, as TE does; no bias, no groups. scores fp32 [T, E] (required), routing_map uint8 [T, E]
 * (optional: the top-k of the scores), saved fp32 [T, E] (required: softmax output / unnormalised
 * scores). */
XTE_API xte_status xte_router_aux_scores(const xte_tensor *logits, int topk,
                                         xte_router_score score_function, xte_tensor *scores,
                                         xte_tensor *routing_map, xte_tensor *saved,
                                         xte_stream stream);
/* The same with the routing map also (or only) as bits: routing_bits uint8 [T, ceil(E/8)], bit
 * (e % 8) of byte e / 8 set for a selected expert (NULL or data NULL: not produced). */
XTE_API xte_status xte_router_aux_scores_ex(const xte_tensor *logits, int topk,
                                            xte_router_score score_function, xte_tensor *scores,
                                            xte_tensor *routing_map, xte_tensor *routing_bits,
                                            xte_tensor *saved, xte_stream stream);
/* grad_logits from grad_scores (fp32 [T, E]) and saved (and logits for sqrtsoftplus), through
 * the normalisation over all E for sigmoid / sqrtsoftplus (every topk). */
XTE_API xte_status xte_router_aux_scores_backward(const xte_tensor *grad_scores,
                                                  const xte_tensor *saved, const xte_tensor *logits,
                                                  int topk, xte_router_score score_function,
                                                  xte_tensor *grad_logits, xte_stream stream);

/* aux = C * sum_e (sum_t probs[t, e]) * tokens_per_expert[e], C = E * coeff / (topk * N^2)
 * with N = total_num_tokens. probs fp32 [T, E]; tokens_per_expert int32, int64, fp32 or bf16 [E].
 * aux_loss: one fp32, 4-byte aligned. Sums in fp64 in a fixed order (docs/numerics.md section 8),
 * rounded once. */
XTE_API xte_status xte_moe_aux_loss_forward(const xte_tensor *probs,
                                            const xte_tensor *tokens_per_expert,
                                            int64_t total_num_tokens, int topk, float coeff,
                                            float *aux_loss, xte_stream stream);
/* grad_probs[t, e] = (C * tokens_per_expert[e]) * grad_aux (fp32 [T, E]). */
XTE_API xte_status xte_moe_aux_loss_backward(const xte_tensor *tokens_per_expert,
                                             int64_t total_num_tokens, int topk, float coeff,
                                             float grad_aux, xte_tensor *grad_probs,
                                             xte_stream stream);
/* The same with C = num_experts * coeff / (topk * N^2), num_experts dividing probs' columns E:
 * the sequence-level aux loss (E = num_experts * sequences, tokens_per_expert [E]); topk is
 * 1..num_experts. num_experts = E is the call above. */
XTE_API xte_status xte_moe_aux_loss_forward_ex(const xte_tensor *probs,
                                               const xte_tensor *tokens_per_expert,
                                               int64_t total_num_tokens, int64_t num_experts,
                                               int topk, float coeff, float *aux_loss,
                                               xte_stream stream);
XTE_API xte_status xte_moe_aux_loss_backward_ex(const xte_tensor *tokens_per_expert,
                                                int64_t total_num_tokens, int64_t num_experts,
                                                int topk, float coeff, float grad_aux,
                                                xte_tensor *grad_probs, xte_stream stream);

/* ================================================================== token movement
 * The routing is given either as a byte routing map [T, E] (uint8, non-zero = routed) or as
 * topk_idx [T, k] (int32 / int64; -1 = no expert). Slot j of token t is its j-th routed expert:
 * with a map, the j-th in ascending expert index; with topk_idx, column j.
 *
 * Permuted order: expert-major, tokens ascending within an expert. With a cap num_out_tokens
 * >= 0, the rows whose unpadded expert-major position is >= num_out_tokens are dropped (their
 * row_map entry is -1). With align > 1 each expert's kept rows are padded with zero rows to a
 * multiple of align. Output rows used: R = sum_e roundup(kept_e, align); the output may have more
 * rows (they, and the padding rows, are written as zeros). */
/* The most experts token movement and the dispatch layout take (num_experts 1..this): a bound far
 * above any model's, so that every workspace size stays small and exact. The router takes at most
 * XTE_ROUTER_MAX_EXPERTS (the logits' columns). */
#define XTE_MOE_MAX_EXPERTS ((int64_t)1 << 20)

typedef struct xte_moe_routing {
  const xte_tensor *routing_map; /* uint8 [T, E], or NULL */
  const xte_tensor *topk_idx;    /* int32 / int64 [T, k], or NULL (exactly one given) */
  int64_t num_experts;           /* E, 1..XTE_MOE_MAX_EXPERTS (= routing_map's columns) */
} xte_moe_routing;

typedef struct xte_permute_config {
  size_t struct_size;     /* sizeof(xte_permute_config) (xte_permute_config_default sets it) */
  int64_t num_out_tokens; /* < 0: no cap */
  int64_t align;          /* <= 1: no padding; else pad each expert to a multiple (e.g. 128) */
} xte_permute_config;

XTE_API xte_permute_config xte_permute_config_default(void); /* no cap (-1), align 1 */

/* Optional outputs of a permute (data NULL: not produced).
 *  expert_offsets     int64 [E + 1]: first output row of each expert (padded), last = R
 *  tokens_per_expert  int32 or int64 [E]: kept rows per expert (unpadded)
 *  row_to_expert      int32 [rows of output]: expert of each output row, -1 for padding */
typedef struct xte_permute_outputs {
  xte_tensor expert_offsets;
  xte_tensor tokens_per_expert;
  xte_tensor row_to_expert;
} xte_permute_outputs;

/* Rows the output must have at least (R above, from the routing without moving data; R is at
 * most INT32_MAX, as row_map is int32). rows: 8-byte aligned. */
XTE_API xte_status xte_moe_permute_rows(const xte_moe_routing *routing,
                                        const xte_permute_config *config, int64_t *rows,
                                        xte_stream stream);

/* input [T, H]: fp32, bf16, fp16, e4m3 or e5m2; for fp8, input_scales (fp32 or e8m0, [T, S]
 * row-major, e.g. the COMPACT 1x128 scales [T, ceil(H/128)]) is moved along bit for bit into
 * output_scales [rows, S] (NULL for other dtypes). output [rows >= R, H] of the input's dtype.
 * row_map: int32 [T, k] (k: topk_idx's columns, or for a map the most experts a token may have),
 * the output row of each slot, -1 where none or dropped. */
XTE_API xte_status xte_moe_permute(const xte_tensor *input, const xte_tensor *input_scales,
                                   const xte_moe_routing *routing, const xte_permute_config *config,
                                   xte_tensor *output, xte_tensor *output_scales,
                                   xte_tensor *row_map, xte_permute_outputs *extra,
                                   xte_stream stream);

/* row_map of the unpermute and of both backwards is checked before anything is written: every
 * entry is -1 or a row of the permuted tensor (in [0, its rows)) on a slot the routing gives an
 * expert, and no row appears twice; otherwise XTE_ERROR_INVALID_ARGUMENT naming the entry.
 *
 * out[t] = sum over the slots j of token t (ascending j) with row_map[t, j] >= 0 of
 * w[t, j] * input[row_map[t, j]], accumulated in fp32 with fmaf from +0, rounded once to out's
 * dtype. w: probs NULL -> 1; with a routing map probs is fp32 [T, E] (read at the slot's
 * expert: the router's probs); with topk_idx it is fp32 [T, k] (per slot: topk_weights).
 * input [rows, H] fp32 / bf16 / fp16; out [T, H] fp32 / bf16 / fp16. */
XTE_API xte_status xte_moe_unpermute(const xte_tensor *input, const xte_moe_routing *routing,
                                     const xte_tensor *row_map, const xte_tensor *probs,
                                     xte_tensor *out, xte_stream stream);

/* Backward of the permute: grad_input[t] = sum over slots (ascending j) of grad_output[row]
 * (the unpermute with unit weights). grad_output [rows, H], grad_input [T, H]; fp32 / bf16 /
 * fp16. */
XTE_API xte_status xte_moe_permute_backward(const xte_tensor *grad_output,
                                            const xte_moe_routing *routing,
                                            const xte_tensor *row_map, xte_tensor *grad_input,
                                            xte_stream stream);

/* Backward of the unpermute: grad_input[row_map[t, j]] = RNE(w[t, j] * grad_out[t]) (fp32
 * product), other rows zero; grad_probs (same shape as probs, may be NULL) at slot (t, j):
 * the sum over h ascending of grad_out[t, h] * input[row, h] in fp64 from +0 (the products are
 * exact in fp64), rounded once to fp32 (0 elsewhere).
 * input is the forward's input (needed for grad_probs only). grad_out, input, grad_input: fp32 /
 * bf16 / fp16. */
XTE_API xte_status xte_moe_unpermute_backward(const xte_tensor *grad_out, const xte_tensor *input,
                                              const xte_moe_routing *routing,
                                              const xte_tensor *row_map, const xte_tensor *probs,
                                              xte_tensor *grad_input, xte_tensor *grad_probs,
                                              xte_stream stream);

/* Sorts chunks of rows: input [R, H] (R <= INT32_MAX) is split into n chunks of split_sizes[i]
 * rows (int32 / int64 [n], each >= 0, summing to R: checked step by step, never wrapping); output
 * concatenates chunk sorted_index[0], sorted_index[1], ... (a permutation of 0..n-1). row_map
 * (int32 [R], optional): the output row of each input row. Any dtype (rows are moved as bytes). */
XTE_API xte_status xte_moe_sort_chunks_by_index(const xte_tensor *input,
                                                const xte_tensor *split_sizes,
                                                const xte_tensor *sorted_index, xte_tensor *output,
                                                xte_tensor *row_map, xte_stream stream);
/* Its backward: grad_input[r] = grad_output[row_map[r]]. */
XTE_API xte_status xte_moe_sort_chunks_backward(const xte_tensor *grad_output,
                                                const xte_tensor *row_map, xte_tensor *grad_input,
                                                xte_stream stream);

/* DeepEP's get_dispatch_layout: experts are split over num_ranks ranks, E / num_ranks each,
 * contiguous. topk_idx int32 / int64 [T, k] (-1: none). Outputs (each optional):
 * tokens_per_rank int32 [num_ranks], tokens_per_expert int32 [E], is_token_in_rank uint8
 * [T, num_ranks]. */
XTE_API xte_status xte_moe_dispatch_layout(const xte_tensor *topk_idx, int64_t num_experts,
                                           int num_ranks, xte_tensor *tokens_per_rank,
                                           xte_tensor *tokens_per_expert,
                                           xte_tensor *is_token_in_rank, xte_stream stream);

/* ================================================================== SwiGLU
 * Layout as TransformerEngine: input [T, 2F], gate = input[:, :F], up = input[:, F:];
 * y = silu(gate) * up with silu(g) = g / (1 + e^-g) (src/numerics/xte_math.h), fp32. */

/* out [T, F] fp32 / bf16 (RNE); input fp32 / bf16. */
XTE_API xte_status xte_swiglu(const xte_tensor *input, xte_tensor *out, xte_stream stream);

/* grad_input [T, 2F] from grad_out [T, F] and the forward input [T, 2F]:
 * d_gate = (dy * up) * dsilu(gate), d_up = dy * silu(gate),
 * dsilu(g) = sig(g) * fmaf(g, 1 - sig(g), 1). fp32 / bf16. */
XTE_API xte_status xte_dswiglu(const xte_tensor *grad_out, const xte_tensor *input,
                               xte_tensor *grad_input, xte_stream stream);

/* One pass: y = swiglu(input) rounded to act_dtype (fp32 or bf16), quantized into out as
 * xte_quantize(y) would, byte for byte. out: 1x128 blocks (TE_BLOCK, DEEPGEMM, DEEPGEMM_UE8M0,
 * MTFP8), rowwise and/or columnwise copies, COMPACT / TE_GEMM / DEEPGEMM scale layouts. */
XTE_API xte_status xte_swiglu_quantize(const xte_tensor *input, xte_dtype act_dtype,
                                       xte_qtensor *out, const xte_quant_config *config,
                                       xte_stream stream);

/* The same for the backward: dx = dswiglu(grad_out, input) [T, 2F] rounded to act_dtype, then
 * quantized into out as xte_quantize(dx) would. */
XTE_API xte_status xte_dswiglu_quantize(const xte_tensor *grad_out, const xte_tensor *input,
                                        xte_dtype act_dtype, xte_qtensor *out,
                                        const xte_quant_config *config, xte_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* XTE_MOE_H */

/* xte attention: flash-style scaled dot-product attention, forward and backward.
 *
 * ---------------------------------------------------------------- tensors and layouts
 * Q [.., h_q, d_qk], K [.., h_kv, d_qk], V [.., h_kv, d_v], O [.., h_q, d_v], dense row-major
 * (ld 0 or equal to the head dim). The leading dimensions depend on the layout:
 *   BSHD  rank 4: Q [b, s_q, h_q, d_qk], K/V [b, s_kv, h_kv, d], O [b, s_q, h_q, d_v]
 *   SBHD  rank 4: Q [s_q, b, h_q, d_qk], K/V [s_kv, b, h_kv, d], O [s_q, b, h_q, d_v]
 *   THD   rank 3: Q [total_q, h_q, d_qk], K/V [total_kv, h_kv, d], O [total_q, h_q, d_v]; the
 *         sequences are packed: sequence i holds tokens [cu_seqlens[i], cu_seqlens[i+1]).
 * LSE (fp32, the natural-log sum of exp of each row's logits, kept for the backward):
 *   BSHD / SBHD [b, h_q, s_q]; THD [total_q, h_q].
 * Head dims d_qk and d_v may differ (MLA: 192 / 128), each in [1, 256]. GQA / MQA: h_q is a
 * multiple of h_kv, query head h reads KV head h / (h_q / h_kv) (contiguous groups).
 *
 * ---------------------------------------------------------------- logits and masks
 * For query row i and key j of one sequence (lengths L_q, L_kv; off = L_kv - L_q, the bottom-right
 * alignment of the diagonal):
 *   x_ij = s_ij * scale                         s_ij = sum_k q_ik k_jk, scale = softmax_scale
 *   x_ij = cap * tanh(s_ij * scale / cap)       when softcap = cap > 0
 *   x_ij += -slope_h * |i + off - j|            when alibi_slopes (ALiBi, bottom-right aligned)
 * Key j is visible to row i when j in [0, L_kv) and
 *   XTE_ATTN_MASK_CAUSAL                 j <= i            (top-left diagonal)
 *   XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT    j <= i + off
 *   window_left  >= 0                    j >= i + off - window_left
 *   window_right >= 0                    j <= i + off + window_right
 * (window_* = -1: unbounded on that side; the masks intersect). O_i = sum_j softmax_j(x_i.) v_j,
 * LSE_i = log sum_j exp(x_ij) over visible keys. A row that sees no key gives O_i = 0 and
 * LSE_i = -inf (never NaN); its gradients are 0.
 * Padding: in THD the sequences are given by cu_seqlens_q / cu_seqlens_kv. In BSHD / SBHD
 * cu_seqlens_q / cu_seqlens_kv are optional: when given, batch entry i uses only its first
 * cu[i+1] - cu[i] positions (<= s); the positions past that are padding: their O rows and
 * gradients are written as 0 and their LSE as -inf. THD tokens outside every sequence are
 * treated the same way.
 *
 * ---------------------------------------------------------------- numerics
 * fp32 online softmax over KV blocks of 64 keys with xte_expf; every dot product and sum has a
 * fixed order, the long sums blocked by 64 keys or 64 query rows (docs/numerics.md, "Attention"),
 * so the result (forward and backward) is the same on every ISA and thread count, run after run.
 * The backward renormalises the probabilities it recomputes from the fp32 LSE, and is
 * deterministic (no atomics). Memory is O(sequence length), never s_q x s_kv.
 * Errors: nothing is written unless the call succeeds (bad arguments, misaligned pointers -
 * each tensor's data aligned to its element size, the config's arrays to 4 bytes - and
 * allocation failures alike).
 *
 * Dtypes: Q, K, V fp32, bf16 or fp16 (all the same); O, dO, dQ, dK, dV in that dtype. Forward
 * only: Q, K, V in e4m3 with per-(batch, KV head) fp32 descale factors descale_q, descale_k,
 * descale_v [b, h_kv] (as FlashAttention-3); O is then bf16, fp16 or fp32.
 */
#ifndef XTE_ATTENTION_H
#define XTE_ATTENTION_H

#include "xte/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XTE_ATTN_MAX_HEAD_DIM 256

typedef enum xte_attn_layout {
  XTE_ATTN_LAYOUT_BSHD = 0,
  XTE_ATTN_LAYOUT_SBHD = 1,
  XTE_ATTN_LAYOUT_THD = 2,
  XTE_ATTN_LAYOUT_COUNT
} xte_attn_layout;

typedef enum xte_attn_mask {
  XTE_ATTN_MASK_NONE = 0,
  XTE_ATTN_MASK_CAUSAL = 1,              /* top-left aligned: j <= i */
  XTE_ATTN_MASK_CAUSAL_BOTTOM_RIGHT = 2, /* j <= i + L_kv - L_q */
  XTE_ATTN_MASK_COUNT
} xte_attn_mask;

/* The numerics of a call (docs/numerics.md section 7). EXACT (the default): the bytes stated
 * above, the same on every ISA and thread count. FAST: bounded, not bitwise: O, dQ, dK, dV within
 * FlashAttention's criterion against fp64 (2 x the error of the plain computation in the input
 * precision + a small absolute term), deterministic run to run for a given ISA and thread count,
 * not across ISAs. The contract allows a cheaper exp, no renormalisation in the backward, any
 * fixed summation order and bf16 dot products; the CPU uses a vectorised exp with a documented
 * maximum error (AVX-512 / AVX2), no renormalisation, and for bf16 inputs bf16 dot products with
 * P and dS rounded to bf16 where the CPU has AVX512-BF16 (XTE_CPU_AVX512_BF16=0: off). The GPU
 * plugins run their exact kernels in FAST mode. */
typedef enum xte_attention_mode {
  XTE_ATTENTION_EXACT = 0,
  XTE_ATTENTION_FAST = 1
} xte_attention_mode;

typedef struct xte_attention_config {
  size_t struct_size; /* sizeof(xte_attention_config) (xte_attention_config_default sets it) */
  xte_attn_layout layout;
  xte_attn_mask mask;
  int64_t window_left, window_right; /* sliding window; -1 = unbounded */
  float softmax_scale;               /* 0: 1 / sqrt(d_qk) */
  float softcap;                     /* 0: off; > 0: cap * tanh(x / cap) */
  const float *alibi_slopes;         /* NULL or [h_q] fp32 (memory of the stream's backend) */
  /* THD: required, [batch + 1] int32, non-decreasing, within the tensors.
   * BSHD / SBHD: optional (padding), [batch + 1], every length <= s. Backend memory. */
  const int32_t *cu_seqlens_q, *cu_seqlens_kv;
  int64_t batch;                       /* THD: the number of sequences */
  int64_t max_seqlen_q, max_seqlen_kv; /* THD: no sequence is longer */
  /* e4m3 inputs only: [batch, h_kv] fp32 factors (NULL: 1). */
  const float *descale_q, *descale_k, *descale_v;
  xte_attention_mode mode; /* XTE_ATTENTION_EXACT (default) or XTE_ATTENTION_FAST */
} xte_attention_config;

/* BSHD, no mask, no window, default scale, no softcap / ALiBi / padding, EXACT. */
XTE_API xte_attention_config xte_attention_config_default(void);

/* O = softmax(mask(Q K^T)) V and LSE. */
XTE_API xte_status xte_attention_fwd(const xte_tensor *Q, const xte_tensor *K, const xte_tensor *V,
                                     xte_tensor *O, xte_tensor *lse,
                                     const xte_attention_config *config, xte_stream stream);

/* Gradients dQ, dK, dV from dO and the forward's O and LSE (recomputing the probabilities). */
XTE_API xte_status xte_attention_bwd(const xte_tensor *Q, const xte_tensor *K, const xte_tensor *V,
                                     const xte_tensor *O, const xte_tensor *dO,
                                     const xte_tensor *lse, xte_tensor *dQ, xte_tensor *dK,
                                     xte_tensor *dV, const xte_attention_config *config,
                                     xte_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* XTE_ATTENTION_H */

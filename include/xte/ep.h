/* xte expert parallelism: tokens moved to the ranks that hold their experts and back (DeepEP's
 * dispatch and combine), over an existing communication engine (MPI on the CPU; a
 * threads-in-one-process transport for tests; NCCL in the CUDA plugin, MCCL in the MUSA plugin).
 * Never a transport of xte's own.
 *
 * Experts are split over the R ranks of a group in contiguous blocks: global expert e lives on
 * rank e / experts_per_rank as local expert e % experts_per_rank (DeepEP's convention, as in
 * xte_moe_dispatch_layout).
 *
 * A step:
 *   xte_ep_prepare     topk_idx [T, k] -> the routing handle (caller memory, reused by every call
 *                      of the step, forward and backward) and the rows this rank receives
 *   xte_ep_dispatch    x [T, H] (+ its scale rows for fp8, + topk_weights) -> recv_x [rows, H]:
 *                      the rows of this rank's local experts, expert-major, tokens in global
 *                      order (rank, then token) within an expert, each expert padded with zero
 *                      rows to a multiple of align: the contiguous grouped GEMM's input. A token
 *                      travels once per rank, not once per expert.
 *   xte_ep_combine     expert outputs [rows, H] -> out [T, H] on the tokens' ranks, weighted and
 *                      summed in xte_moe_unpermute's fixed order
 *   xte_ep_combine_backward, xte_ep_dispatch_backward
 *
 * Byte identity with one process (the contract, docs/numerics.md section 10): with the tokens of
 * all ranks concatenated in rank order into one [sum T, H] tensor and topk_idx likewise,
 *  - rank r's recv_x / recv_scales rows of local expert l are the bytes of the rows of global
 *    expert r * experts_per_rank + l in xte_moe_permute's output (same align), padding included;
 *  - combine's out is xte_moe_unpermute's out for this rank's tokens (probs = topk_weights);
 *  - combine_backward gives xte_moe_unpermute_backward's grad_input rows (at the same expert
 *    rows) and grad_probs; dispatch_backward gives xte_moe_permute_backward's grad_input,
 * for every number of ranks. Data only moves: every sum is done where the one-process call would
 * do it, in its order.
 *
 * Collective calls (every rank of the group calls them, in the same order): group creation,
 * prepare, dispatch, combine and the backwards. Each first checks its arguments on every rank and
 * the ranks agree before any data moves: an argument error on one rank (or arguments that
 * disagree between ranks: hidden size, dtypes, scale columns) is an error status on every rank,
 * never a hang. The failing rank's xte_last_error() names its argument; the others name the
 * rank and repeat its message. A rank with zero tokens takes part normally.
 *
 * Streams: an MPI or threads group runs on the CPU backend (stream NULL or a CPU stream). An NCCL
 * (MCCL) group runs on device memory: every tensor of its calls is device memory of the group's
 * device, and each call takes a CUDA (MUSA) stream of that device (the creation stream or another
 * one). The core never dereferences a GPU group's tensors: rows, scale rows and weights move by
 * the plugin's block-move kernel and the library's grouped send / receive; the host reads
 * topk_idx in prepare (a device-to-host copy, synchronized, as DeepEP's normal mode does for its
 * counts) and writes the small host-made results (tokens_per_expert, recv_topk_idx) by copies;
 * the routing handle stays in host memory. Each GPU call returns when its stream has finished its
 * work. The sums run in xte_moe_unpermute / the backwards on the same stream (the CUDA plugin's
 * kernels give the CPU's bytes), so the byte identity above holds on GPUs too.
 */
#ifndef XTE_EP_H
#define XTE_EP_H

#include "xte/core.h"

#ifdef __cplusplus
extern "C" {
#endif

#define XTE_EP_MAX_TOPK 16

typedef struct xte_ep_group_s *xte_ep_group;

/* Size-versioned as every config (docs/api.md): struct_size is sizeof(xte_ep_config) of the
 * caller's header (set by xte_ep_config_default), so fields can be added at the end without
 * breaking the ABI. */
typedef struct xte_ep_config {
  size_t struct_size;
  int64_t experts_per_rank;    /* >= 1; the group holds experts_per_rank * R experts */
  int64_t hidden;              /* H, the row length of x and of the expert outputs, >= 1 */
  int32_t topk;                /* k, 1..XTE_EP_MAX_TOPK (topk_idx's columns) */
  int32_t align;               /* each local expert's rows padded to a multiple (<= 1: none) */
  int64_t max_tokens_per_rank; /* the most tokens any rank gives prepare (sizes the handle) */
} xte_ep_config;

/* experts_per_rank 1, hidden 0 (must be set), topk 1, align 1, max_tokens_per_rank 0 (must be
 * set), struct_size = sizeof(xte_ep_config). */
XTE_API xte_ep_config xte_ep_config_default(void);

/* An EP group over a borrowed MPI communicator: mpi_comm points to an MPI_Comm (the caller has
 * initialised MPI; xte duplicates the communicator and frees its duplicate in
 * xte_ep_group_destroy). Collective. XTE_ERROR_UNSUPPORTED when xte was built without MPI
 * (xte_backend_info_string says which transports it has). */
XTE_API xte_status xte_ep_group_create_mpi(const void *mpi_comm, const xte_ep_config *config,
                                           xte_ep_group *group);

/* The threads-in-one-process transport (for tests and single-node experiments): a world of
 * num_ranks ranks; each rank is a thread calling xte_ep_group_create_threads with its rank and
 * then the collectives. The world outlives its groups. */
typedef struct xte_ep_threads_world_s *xte_ep_threads_world;
XTE_API xte_status xte_ep_threads_world_create(int num_ranks, xte_ep_threads_world *world);
XTE_API xte_status xte_ep_threads_world_destroy(xte_ep_threads_world world);
XTE_API xte_status xte_ep_group_create_threads(xte_ep_threads_world world, int rank,
                                               const xte_ep_config *config, xte_ep_group *group);

/* An EP group over the CUDA plugin's NCCL (loaded with dlopen: libnccl.so.2, or the path in
 * $XTE_NCCL_LIBRARY; NCCL >= 2.7). nccl_comm points to an ncclComm_t the caller made (borrowed:
 * never destroyed by xte; it outlives the group); stream: a CUDA stream (xte_stream_create) of the
 * communicator's device, which must outlive the group; the group's tensors are device memory of
 * that device. Collective. XTE_ERROR_UNSUPPORTED (with the reason in xte_last_error()) when the
 * CUDA plugin has no EP table or NCCL cannot be loaded. */
XTE_API xte_status xte_ep_group_create_nccl(const void *nccl_comm, const xte_ep_config *config,
                                            xte_stream stream, xte_ep_group *group);
/* The same over the MUSA plugin's MCCL (libmccl.so, or $XTE_MCCL_LIBRARY): mccl_comm points to an
 * mcclComm_t, stream is a MUSA stream. */
XTE_API xte_status xte_ep_group_create_mccl(const void *mccl_comm, const xte_ep_config *config,
                                            xte_stream stream, xte_ep_group *group);

/* Not collective. Frees the group (NULL: nothing). */
XTE_API xte_status xte_ep_group_destroy(xte_ep_group group);
/* rank / num_ranks / the transport's name ("mpi", "threads", "nccl", "mccl"); each output may be
 * NULL. */
XTE_API xte_status xte_ep_group_info(xte_ep_group group, int *rank, int *num_ranks,
                                     const char **transport);

/* Where a group's time went, summed over its dispatch / combine / backward calls since creation
 * or the last reset (prepare is not counted): packing rows into send buffers (and scattering
 * received rows), the transport's exchange, and the local token movement (the permute /
 * unpermute calls). Bytes exclude what a rank keeps for itself. Not collective. stats->struct_size
 * must be set (sizeof(xte_ep_stats)); stats may be NULL to only reset. */
typedef struct xte_ep_stats {
  size_t struct_size;
  int64_t calls;
  int64_t pack_ns, exchange_ns, local_ns;
  int64_t bytes_sent, bytes_received;
} xte_ep_stats;
XTE_API xte_status xte_ep_group_stats(xte_ep_group group, xte_ep_stats *stats, int reset);

/* Bytes of the routing handle of this group (from R, k, experts_per_rank and
 * max_tokens_per_rank). The caller allocates it (8-byte aligned) and passes it to prepare. */
XTE_API xte_status xte_ep_handle_size(xte_ep_group group, size_t *bytes);

/* Counts of a prepared step:
 *  recv_rows    rows recv_x must have at least (this rank's local experts, padded)
 *  slot_rows    this rank's routed (token, slot) pairs: the rows of combine's slot_rows
 *  recv_tokens  tokens received (each once, whatever its number of local experts) */
typedef struct xte_ep_counts {
  int64_t recv_rows;
  int64_t slot_rows;
  int64_t recv_tokens;
} xte_ep_counts;

/* Collective. topk_idx int32 / int64 [T, k] (T <= max_tokens_per_rank; entries -1 or a global
 * expert in [0, experts_per_rank * R)) -> the handle (handle_bytes >= xte_ep_handle_size) and the
 * counts (may be NULL). tokens_per_expert (optional) int32 / int64 [experts_per_rank]: the
 * unpadded rows of each local expert. */
XTE_API xte_status xte_ep_prepare(xte_ep_group group, const xte_tensor *topk_idx, void *handle,
                                  size_t handle_bytes, xte_ep_counts *counts,
                                  xte_tensor *tokens_per_expert, xte_stream stream);

/* Collective. x [T, H]: fp32, bf16, e4m3 or e5m2; an fp8 x moves its scale rows x_scales
 * [T, S] (fp32 or e8m0, e.g. COMPACT 1x128 scales [T, ceil(H / 128)]) bit for bit into
 * recv_scales [rows, S] (NULL for other dtypes). topk_weights (optional) fp32 [T, k]: recv_weights
 * (optional, fp32 [rows]) gets each received row's weight (0 on padding rows). recv_x [rows >=
 * recv_rows, H] of x's dtype; rows past recv_rows and padding rows are zero. */
XTE_API xte_status xte_ep_dispatch(xte_ep_group group, void *handle, const xte_tensor *x,
                                   const xte_tensor *x_scales, const xte_tensor *topk_weights,
                                   xte_tensor *recv_x, xte_tensor *recv_scales,
                                   xte_tensor *recv_weights, xte_stream stream);

/* Collective: dispatch without the expert-major expansion (DeepEP's normal-mode layout): one row
 * per received token, so only the bytes that cross ranks are written. recv_x [rows >=
 * counts.recv_tokens, H] of x's dtype gets the tokens in (source rank, token) order, each once;
 * recv_scales [rows, S] their scale rows (fp8 x only); recv_topk_idx (optional, int32 [rows, k])
 * the local expert (0..experts_per_rank - 1) of each of the token's k slots, -1 where the expert
 * lives elsewhere; recv_topk_weights (optional, fp32 [rows, k], needs topk_weights) the slot's
 * weight, 0 where recv_topk_idx is -1. Rows past recv_tokens: zero rows, -1 and 0.
 * xte_moe_permute of these rows (routing topk_idx = recv_topk_idx's first recv_tokens rows,
 * num_experts = experts_per_rank, the group's align) gives xte_ep_dispatch's recv_x /
 * recv_scales bytes and row order, so combine and the backwards take the expert outputs as after
 * xte_ep_dispatch; this call counts as the step's dispatch. */
XTE_API xte_status xte_ep_dispatch_tokens(xte_ep_group group, void *handle, const xte_tensor *x,
                                          const xte_tensor *x_scales,
                                          const xte_tensor *topk_weights, xte_tensor *recv_x,
                                          xte_tensor *recv_scales, xte_tensor *recv_topk_idx,
                                          xte_tensor *recv_topk_weights, xte_stream stream);

/* Collective, after dispatch. expert_out [rows >= recv_rows, H] fp32 / bf16 (the experts' outputs
 * at recv_x's rows) -> out [T, H] fp32 / bf16: out[t] = sum over slots j ascending of
 * w[t, j] * expert_out row of (t, j), fmaf in fp32 from +0, one rounding (xte_moe_unpermute;
 * topk_weights NULL: w = 1). slot_rows (optional, [counts.slot_rows, H] of expert_out's dtype)
 * receives the rows that came back, in the handle's order: combine_backward needs them for
 * grad_weights. */
XTE_API xte_status xte_ep_combine(xte_ep_group group, void *handle, const xte_tensor *expert_out,
                                  const xte_tensor *topk_weights, xte_tensor *out,
                                  xte_tensor *slot_rows, xte_stream stream);

/* Collective, after dispatch. grad_out [T, H] fp32 / bf16 -> grad_expert_out [rows >=
 * recv_rows, H] fp32 / bf16: row of (t, j) = RNE(w[t, j] * grad_out[t]), padding and extra rows
 * zero (xte_moe_unpermute_backward). grad_weights (optional, fp32 [T, k], needs topk_weights and
 * slot_rows from combine): sum over h ascending of fmaf(grad_out[t, h], row of (t, j)[h]) from +0,
 * 0 on unrouted slots. */
XTE_API xte_status xte_ep_combine_backward(xte_ep_group group, void *handle,
                                           const xte_tensor *grad_out,
                                           const xte_tensor *topk_weights,
                                           const xte_tensor *slot_rows, xte_tensor *grad_expert_out,
                                           xte_tensor *grad_weights, xte_stream stream);

/* Collective, after dispatch. grad_recv [rows >= recv_rows, H] fp32 / bf16 (the gradient of
 * recv_x) -> grad_x [T, H] fp32 / bf16: grad_x[t] = sum over slots j ascending of the row of
 * (t, j), fp32 from +0, one rounding (xte_moe_permute_backward). */
XTE_API xte_status xte_ep_dispatch_backward(xte_ep_group group, void *handle,
                                            const xte_tensor *grad_recv, xte_tensor *grad_x,
                                            xte_stream stream);

#ifdef __cplusplus
}
#endif

#endif /* XTE_EP_H */

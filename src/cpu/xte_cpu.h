/* CPU backend internals: ISA selection, the thread pool, and the per-ISA kernel table. */
#ifndef XTE_CPU_H
#define XTE_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "xte/xte.h"
#include "xte_kernel_args.h"

/* Streaming rows: the row kernels also prefetch into L2 the input XTE_PF_FAR bytes past the
 * chunk they convert (within the tensor): the hardware prefetchers alone leave a core waiting on
 * memory for inputs past the last-level cache (docs/performance.md, quantize). */
#define XTE_PF_FAR (16 << 10)

static inline void xte_prefetch_far(const xte_quant_args *a, const void *p, size_t bytes) {
  const size_t es = a->in_kind == XTE_NUM_IN_F32 ? 4u : 2u;
  const size_t off = (size_t)((const char *)p - (const char *)a->in) + XTE_PF_FAR;
  size_t o;
  if (off + bytes <= ((size_t)(a->M - 1) * (size_t)a->ld_in + (size_t)a->K) * es) /* the end */
    for (o = 0; o < bytes; o += 64) __builtin_prefetch((const char *)a->in + off + o, 0, 2);
}

/* ---------------------------------------------------------------- quantize kernels per ISA
 * Tiny kernels, BLIS-style: they know nothing of threads, layouts or recipes. Every ISA's
 * version gives the scalar version's bytes (tests prove it). Each ISA folder's quantize_<isa>.c
 * defines its table, reached through the ISA's xte_cpu_isa_table. */
typedef struct xte_quant_kernels {
  xte_cpu_isa isa;
  /* dst[i] = fp32(src[i]) for an input of kind XTE_NUM_IN_F32 / BF16 / F16 (exact) */
  void (*load_f32)(const void *src, int in_kind, int64_t n, float *dst);
  /* max |x[i]| with fmaxf semantics (NaN never wins), starting from 0 */
  float (*amax)(const float *x, int64_t n);
  /* acc[c] = max(acc[c], max_r |x[r*ld + c]|) for c < cols */
  void (*amax_cols)(const float *x, int64_t rows, int64_t cols, int64_t ld, float *acc);
  /* q[i] = fp8_RNE(x[i] * scale) */
  void (*quant)(const float *x, int64_t n, float scale, int fmt, int sat, uint8_t *q);
  /* q[i] = fp8_RNE(x[i] * scale[i]) */
  void (*quant_vs)(const float *x, int64_t n, const float *scale, int fmt, int sat, uint8_t *q);
  /* q[i] = fp8_RNE(x[i]) with no scaling */
  void (*cast_fp8)(const float *x, int64_t n, int fmt, int sat, uint8_t *q);
  void (*cast_bf16)(const float *x, int64_t n, uint16_t *y);
  void (*cast_fp16)(const float *x, int64_t n, uint16_t *y);
  /* dst[c*ldd + r] = src[r*lds + c] */
  void (*transpose_u8)(const uint8_t *src, int64_t rows, int64_t cols, int64_t lds, uint8_t *dst,
                       int64_t ldd);
  /* Fused kernels over rows x n elements of the input (kind XTE_NUM_IN_*, row stride lds
   * elements), read directly with no fp32 buffer; the fp8 output q has row stride ldq. nt: q may be
   * written with streaming (non-temporal) stores; a thread that used them calls store_fence before
   * its results are read elsewhere. Same bytes as load_f32 + the kernels above.
   * Returns max |x| (amax semantics); acc != NULL: acc[c] = max(acc[c], max_r |x[r][c]|) too. */
  float (*load_amax)(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                     float *acc);
  /* q[r][c] = fp8_RNE(x[r][c] * scale); returns max |x| */
  float (*load_quant)(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                      float scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt);
  /* q[r][c] = fp8_RNE(x[r][c] * scale[c]) */
  void (*load_quant_vs)(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                        const float *scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt);
  /* Each row in blocks of bw elements (the last may be shorter): per block the amax, its scale
   * sc[r * ceil(n / bw) + b] = xte_quant_block_scale(a, amax), q = fp8_RNE(x * scale) (a->fmt,
   * a->saturate); acc as in load_amax. Returns the max of the block amaxes. */
  float (*quant_blocks)(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                        int64_t bw, const xte_quant_args *a, uint8_t *q, int64_t ldq,
                        xte_block_scale *sc, float *acc, int nt);
  /* s[i] = xte_quant_block_scale(a, amax[i]) */
  void (*block_scales)(const xte_quant_args *a, const float *amax, int64_t n, xte_block_scale *s);
  /* dst[i] = src[i] */
  void (*copy_u8)(uint8_t *dst, const uint8_t *src, int64_t n, int nt);
  void (*store_fence)(void);
  /* Optional (NULL: none). One tile of nr <= 128 rows x 128 columns of input (a->in_kind, any the
   * kernel takes: else it returns 0) in 1 x 128 row
   * blocks and one 128 x 1 column block per column, in one read of the tile for both copies: the
   * row copy rq (row stride ldrq), the column codes cq (nr x 128, row stride 128, not transposed),
   * the scales rsc[nr] and csc[128] (xte_quant_block_scale), *amax the tile's max |x|; while it
   * converts it prefetches pf_rows rows (stride lds) of 128 elements from pf into L2. Returns 0,
   * leaving to the caller's general path every output it may have written, when the tile holds a
   * NaN or a scale that its fast sequence does not take. Same bytes as quant_blocks + block_scales
   * + load_quant_vs. */
  int (*quant_rc)(const void *src, int64_t lds, int64_t nr, const xte_quant_args *a, uint8_t *rq,
                  int64_t ldrq, xte_block_scale *rsc, uint8_t *cq, xte_block_scale *csc,
                  float *amax, const void *pf, int64_t pf_rows, int nt);
  /* Optional (NULL: none). transpose_u8 that writes dst directly, in whole 64-byte rows of dst
   * with streaming stores when nt (the caller fences), for the transposed columnwise copies. */
  void (*transpose_nt)(const uint8_t *src, int64_t rows, int64_t cols, int64_t lds, uint8_t *dst,
                       int64_t ldd, int nt);
  /* Optional (NULL: none). load_quant's bytes written twice from one conversion: to q (row stride
   * ldq, streaming stores when nt) and to q2 (row stride ldq2, cached: a tile's transpose buffer),
   * *amax set; for the rows it takes (no NaN; bf16 or fp32, the scales its sequences take).
   * Returns 0 for others, which the caller then converts the general way (overwriting whatever
   * was written). */
  int (*load_quant_dup)(const void *src, int64_t lds, int in_kind, int64_t rows, int64_t n,
                        float scale, int fmt, int sat, uint8_t *q, int64_t ldq, int nt, uint8_t *q2,
                        int64_t ldq2, float *amax);
  /* Optional (NULL: none). 128 x 128 blocks, a run of g <= 16 full 128-column tiles side by side
   * (bf16 or fp32), software-pipelined with the next runs: row r of the run (r < nr) converted,
   * tile i under the scale s[i], to q + r ldq + 128 i (streaming stores when nt) and, when q2 (64-
   * byte aligned), to q2 + 16384 i + 128 r (cached); then row r of the next run (r < nrn, gn tiles
   * from nsrc, row stride lds) read for its tiles' max |x|: nam[i] as load_amax gives it, -1 for a
   * tile with a NaN; then pf_bytes of row r of pf (r < pf_rows) prefetched into L2. The run must
   * be NaN-free. Returns 0, having written nothing, for an input kind or a scale its sequences
   * do not take; else load_quant's bytes. */
  int (*quant_sq_run)(const void *src, int64_t lds, int in_kind, int64_t nr, int64_t g,
                      const float *s, int fmt, int sat, uint8_t *q, int64_t ldq, int nt,
                      uint8_t *q2, const void *nsrc, int64_t nrn, int64_t gn, float *nam,
                      const void *pf, int64_t pf_rows, int64_t pf_bytes);
} xte_quant_kernels;

/* ---------------------------------------------------------------- one table per ISA
 * The BLIS context: every kernel an ISA folder of src/cpu/ has (scalar/, avx2/, avx512/ and its
 * SIMDe build), one table per folder (<isa>/table_<isa>.c). src/cpu/isa.c alone names the ISAs:
 * it detects what this CPU runs, picks the table once (XTE_CPU_ISA, xte_cpu_set_isa) and attaches
 * the extensions (amx/, vnni/) where they are built and usable. Drivers call through the table
 * and never name an ISA. */
struct xte_gemm_ukernel;          /* src/cpu/gemm_kernels.h */
struct xte_attn_kernels;          /* src/cpu/attention_kernels.h */
struct xte_attn_bf16_kernels;     /* src/cpu/attention_kernels.h */
struct xte_moe_kernels;           /* src/cpu/moe_cpu.h */
struct xte_gemm_amx_kernels;      /* src/cpu/gemm_kernels.h */
struct xte_gemm_vnni_kernels;     /* src/cpu/gemm_kernels.h */
struct xte_gemm_fast_kernels;     /* src/cpu/gemm_kernels.h */
struct xte_gemm_fast_amx_kernels; /* src/cpu/gemm_kernels.h */
typedef struct xte_cpu_isa_table {
  xte_cpu_isa isa;
  const xte_quant_kernels *quant;
  const struct xte_gemm_ukernel *gemm;
  const struct xte_attn_kernels *attn;
  const struct xte_moe_kernels *moe;
  const struct xte_gemm_fast_kernels *gemm_fast; /* XTE_GEMM_FAST (src/cpu/gemm_fast.c) */
  /* extensions (NULL: none): the exact e4m3 GEMM on AMX-INT8 tiles, and for a few rows on
   * AVX512-VNNI; attached by isa.c to the avx512 table where built, usable on this CPU and OS, and
   * not turned off (XTE_CPU_AMX=0, XTE_CPU_VNNI=0) */
  const struct xte_gemm_amx_kernels *amx;
  const struct xte_gemm_vnni_kernels *vnni;
  /* extension (NULL: none): XTE_GEMM_FAST's panel path on AMX-BF16 tiles; attached by isa.c to the
   * avx512 table where built, the CPU has AMX-BF16, the OS grants the tiles, and neither
   * XTE_CPU_AMX nor XTE_CPU_AMX_BF16 is "0" */
  const struct xte_gemm_fast_amx_kernels *fast_amx;
  /* extensions (NULL: none): XTE_ATTENTION_FAST's bf16 dot products (bf16 inputs), on
   * AVX512-BF16 (attn_bf16: where built, the CPU has AVX512-BF16 and XTE_CPU_AVX512_BF16 is not
   * "0") and on AMX-BF16 tiles (attn_amx: where built, the CPU has AMX-BF16, the OS grants the
   * tiles, neither XTE_CPU_AMX nor XTE_CPU_AMX_BF16 is "0"), attached by isa.c to the avx512
   * table; the driver takes attn_amx where attached, else attn_bf16 */
  const struct xte_attn_bf16_kernels *attn_bf16;
  const struct xte_attn_bf16_kernels *attn_amx;
} xte_cpu_isa_table;

/* The table of the ISA in use. */
const xte_cpu_isa_table *xte_cpu_isa_table_get(void);
/* The table of one ISA (NULL if not built or not runnable here). */
const xte_cpu_isa_table *xte_cpu_isa_table_for(xte_cpu_isa isa);
/* The quantize kernels of the ISA in use. */
static inline const xte_quant_kernels *xte_quant_kernels_get(void) {
  return xte_cpu_isa_table_get()->quant;
}

void xte_cpu_fill_info(xte_backend_info *info);
void xte_cpu_isa_info(xte_backend_info *info);
/* What became of XTE_CPU_ISA when it named an ISA that cannot run here or no ISA (NULL: nothing
 * to say), and why an ISA cannot run here (NULL: it can). */
const char *xte_cpu_isa_note(void);

/* Test hook, not public API (no public header declares it): the ISA each kernel family of ISA
 * isa's table was built for, out[0..3] = quant, gemm, attn, moe (each must be isa: a table that
 * points at another folder's kernels would give the same bytes and pass every byte test), and
 * out[4], out[5] = 1 where the AMX / VNNI extensions are attached. XTE_ERROR_UNSUPPORTED when the
 * ISA cannot run here. */
XTE_API xte_status xte_internal_cpu_isa_kernels(xte_cpu_isa isa, int out[6]);
const char *xte_cpu_isa_unavailable(xte_cpu_isa isa);

/* ---------------------------------------------------------------- thread pool
 * xte_parallel_for splits [0, n) into contiguous chunks, one per thread (static, so the
 * partition depends only on n and the thread count), and runs fn(ctx, begin, end, tid).
 * Nested calls run inline on the caller. */
typedef void (*xte_range_fn)(void *ctx, int64_t begin, int64_t end, int tid);
void xte_parallel_for(int64_t n, xte_range_fn fn, void *ctx);
/* The same with at most max_threads threads (callers that sized per-thread buffers). */
void xte_parallel_for_max(int64_t n, int max_threads, xte_range_fn fn, void *ctx);
/* The max_threads for a streaming job over `elements` elements: 1 (the calling thread) below
 * XTE_SMALL_JOB_ELEMENTS, where waking the pool costs more than the work (docs/performance.md,
 * Python call overhead), else 0 (no cap). */
#define XTE_SMALL_JOB_ELEMENTS ((int64_t)1 << 15)
static inline int xte_threads_for(int64_t elements) {
  return elements < XTE_SMALL_JOB_ELEMENTS ? 1 : 0;
}
/* Runs fn(ctx, t, t+1, t) for each thread t of the pool; returns the thread count used. */
int xte_parallel_threads(xte_range_fn fn, void *ctx);
int xte_cpu_threads(void);

/* Cache sizes (hwloc or sysfs) */
size_t xte_cpu_l1d(void);
size_t xte_cpu_l2(void);
size_t xte_cpu_l3(void);

/* 64-byte aligned host memory: xte_aligned_alloc / xte_aligned_free (src/xte_internal.h) */

/* 1 when the exact GEMM runs e4m3 x e4m3 (K block 128) on the AMX-INT8 kernels: the table in use
 * has the AMX extension (built with it, ISA avx512 in use, the CPU and OS allow AMX and
 * XTE_CPU_AMX is not "0"). */
int xte_cpu_gemm_amx(void);

/* 1 when XTE_GEMM_FAST's panel path (the problems its small-M path does not take) runs on the
 * AMX-BF16 tiles: the table in use has the fast_amx extension (built with it, ISA avx512 in use,
 * the CPU has AMX-BF16, the OS grants the tiles, XTE_CPU_AMX and XTE_CPU_AMX_BF16 are not "0"). */
int xte_cpu_gemm_fast_amx(void);
/* 1 when XTE_GEMM_FAST hands a problem of m rows (e4m3 x e4m3, K block 128, B along K) to the
 * exact driver on the ISA in use (src/cpu/gemm_fast.c: where its VNNI / AMX-INT8 small-M paths
 * are faster than the fp32 kernels). */
int xte_cpu_gemm_fast_small_exact(int64_t m);

/* The most rows of A for which the exact GEMM runs e4m3 x e4m3 (K block 128, B read along K) on
 * the AVX512-VNNI small-M kernels (8 where AMX is in use, else all small-M ones, 32), 0 when it
 * does not use them: built with them, ISA avx512 in use, the CPU has AVX512-VNNI and -VBMI and
 * XTE_CPU_VNNI is not "0". */
int xte_cpu_gemm_vnni_rows(void);

/* Drivers */
xte_status xte_cpu_quantize(const xte_quant_args *a, void *handle);
xte_status xte_cpu_dequantize(const xte_dequant_args *a, void *handle);
xte_status xte_cpu_cast(const xte_cast_args *a, void *handle);

/* Capability tables of the CPU backend (see src/xte_backend.h), each defined by its driver. */
const struct xte_gemm_ops *xte_cpu_gemm_ops(void);
const struct xte_attention_ops *xte_cpu_attention_ops(void);
const struct xte_moe_ops *xte_cpu_moe_ops(void);

#endif /* XTE_CPU_H */

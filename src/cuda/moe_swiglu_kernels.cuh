/* SwiGLU on the CUDA plugin: forward, backward, and both fused with 1x128 quantization, over the
 * runtime policy RT of moe_kernels.cuh (src/cuda/moe.cu: CUDA; tests/simt/simt_plugin.cpp: the
 * host SIMT runner, checked byte for byte against the CPU backend by test_simt_router).
 *
 * Every output element is one thread's xte_swiglu_fwd / xte_dswiglu_gate / xte_dswiglu_up
 * (src/numerics/xte_moe_numerics.h), as the CPU's act_value; blocks over rows, threads over
 * columns. The fused forms write the activation rounded to act_dtype (fp32 or bf16) into device
 * workspace and quantize it with the backend's own quantize (the caller's functor), so the bytes
 * are xte_quantize(xte_swiglu(x)), which is what the CPU's one-pass kernel is tested to give
 * (docs/numerics.md section 8). */
#ifndef XTE_MOE_SWIGLU_KERNELS_CUH
#define XTE_MOE_SWIGLU_KERNELS_CUH

#include "cuda/moe_kernels.cuh"
#include "numerics/xte_moe_numerics.h"

/* out[r, c] for the T x out.cols elements (out: the result, or the fused form's workspace). */
__global__ void __launch_bounds__(XTE_MOE_NT)
    xte_swiglu_kernel(xte_swiglu_args a, xte_moe_view out) {
  const int64_t F = a.F;
  for (int64_t r = blockIdx.x; r < a.T; r += gridDim.x) {
    for (int64_t c = threadIdx.x; c < out.cols; c += blockDim.x) {
      float v;
      if (!a.backward)
        v = xte_swiglu_fwd(xte_moe_load(a.x, r, c), xte_moe_load(a.x, r, c + F));
      else if (c < F)
        v = xte_dswiglu_gate(xte_moe_load(a.dy, r, c), xte_moe_load(a.x, r, c),
                             xte_moe_load(a.x, r, c + F));
      else
        v = xte_dswiglu_up(xte_moe_load(a.dy, r, c - F), xte_moe_load(a.x, r, c - F));
      xte_moe_store(out, r, c, v);
    }
  }
}

/* quant(const xte_quant_args *q): the backend's quantize, enqueued after the kernels of rt. */
template <class RT, class Q>
static xte_status xte_swiglu_run(RT &rt, const xte_swiglu_args *a, Q &&quant) {
  if (!a->fused) {
    /* an empty [T, 0] tensor has nothing to write, however many rows it claims */
    if (a->T <= 0 || a->F <= 0) return XTE_SUCCESS;
    XTE_MOE_TRY(rt.launch(xte_moe_grid(a->T), xte_swiglu_kernel, *a, a->out));
    return rt.finish();
  }
  const int64_t M = a->q.M, K = a->q.K;
  int64_t n = 0;
  size_t total = 0, o_act;
  char *ws = NULL;
  xte_status st = XTE_SUCCESS;
  if (M < 0 || K < 0 || __builtin_mul_overflow(M, K, &n) ||
      !xte_moe_ws_add(&total, n, xte_moe_esize(a->act_dtype), &o_act))
    return rt.svc->set_error(XTE_ERROR_OUT_OF_MEMORY, "fused SwiGLU workspace");
  XTE_MOE_TRY(rt.alloc((void **)&ws, total));
  xte_moe_view act;
  act.data = ws + o_act;
  act.dtype = a->act_dtype;
  act.rows = M;
  act.cols = K;
  act.ld = K;
  xte_quant_args q = a->q;
  q.in = act.data;
  q.ld_in = K;
  do {
    if (M > 0 && K > 0 &&
        (st = rt.launch(xte_moe_grid(M), xte_swiglu_kernel, *a, act)) != XTE_SUCCESS)
      break;
    if ((st = rt.finish()) != XTE_SUCCESS) break;
    st = quant(&q);
  } while (0);
  rt.release(ws);
  return st;
}

#endif /* XTE_MOE_SWIGLU_KERNELS_CUH */

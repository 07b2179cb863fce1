"""torch.library custom ops over the xte C API (namespace "xte"), with fake kernels and autograd.

Importing this module registers every op; the ops live in one module per family, as xte.ops:

    _quantize    xte::quantize, dequantize, cast
    _gemm        xte::gemm, gemm_grouped; DeepGEMM's fp8_gemm_{nt,nn,tn,tt},
                 m_grouped_fp8_gemm_nt_contiguous / _masked, k_grouped_fp8_gemm_tn_contiguous
    _attention   xte::attention_fwd, attention_bwd
    _moe         xte::router, router_probs, router_backward, router_aux_scores(_backward),
                 moe_aux_loss(_backward), swiglu, dswiglu, swiglu_quantize, dswiglu_quantize
    _permute     xte::moe_permute, moe_unpermute, moe_permute_mask, moe_unpermute_mask,
                 moe_permute_fp8, moe_sort_chunks_by_index (and their backwards)
    _ep          xte::moe_dispatch_layout
    _te_router   xte::te_router, te_router_qb, te_aux_scores, te_aux_loss(_backward)
                 (xte.transformer_engine.pytorch.router)
    _te_permute  xte::te_permute_mask, te_unpermute_mask, te_permute_index, te_unpermute_index,
                 te_sort_chunks (and their backwards) (xte.transformer_engine.pytorch.permutation)
    _common      what several families share (no ops)

Every op is registered with torch.library.custom_op for the CPU and CUDA dispatch keys, a fake
kernel whose shapes come from xte's own shape queries (xte_quantize_scale_shape) or from the
static arguments (never by running the op), and, where the C API has a backward, an autograd
formula. DeepGEMM's destination-passing GEMMs are mutating ops on d.

Data-dependent sizes are static here: the permutes return permute_capacity(...) rows (the worst
case for the static shapes and the cap num_out_tokens; unused rows are zeros) unless given rows=
(a static int: eager callers pass permute_rows(...), the rows the routing uses), so fake
tensors have static shapes and torch.compile(fullgraph=True) never breaks the graph.

The op bodies only marshal arguments (zero-copy Views of the foundation) and call the C
functions; they add no arithmetic (the te_* ops also fill TE's row_id_map columns and move the
probs, [T, E] or [rows] values, with torch index operations).

OPS: name -> op of the ops tests/python/test_torch_ops*.py opcheck (the te_* permutation ops and
te_aux_loss_backward are opchecked with their TE wrappers in test_te_permutation.py /
test_te_router.py).
"""

from . import (_attention, _ep, _gemm, _moe, _permute, _quantize, _te_permute,  # noqa: F401
               _te_router)
from ._common import permute_capacity, permute_rows, scale_shape, split_copies  # noqa: F401

OPS = {}
for _family in (_quantize, _gemm, _moe, _permute, _attention, _ep, _te_router):
    OPS.update(_family.OPS)
del _family

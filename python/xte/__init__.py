"""xte: block-scaled FP8 GEMM and transformer kernels (Python package over the C API).

The operators live in xte.ops.* (one module per C header) and are re-exported here.
"""

from . import _lib
from ._lib import (XteAlignmentError, XteBackendUnavailableError, XteBufferTooSmallError,
                   XteDeviceError, XteDTypeError, XteError, XteInternalError,
                   XteOutOfMemoryError, XteShapeError, XteUnsupportedError, XteValueError)
from ._lib import (AttnLayout, AttnMask, Backend, CpuIsa, DType, GemmMode, Recipe, RouterScore,
                   ScaleLayout, ScalingMode, Status)
from ._qtensor import QuantizedTensor
from ._tensor import XteLayoutError

__version__ = "{}.{}.{}".format(_lib.version() // 10000, _lib.version() // 100 % 100,
                                _lib.version() % 100)
library_path = _lib.library_path

from . import recipe, testing
from .ops.attention import attention_bwd, attention_fwd
from .ops.ep import EPGroup, EPHandle, ThreadsWorld
from .ops.moe import (RowIdMap, dispatch_layout, dswiglu, dswiglu_quantize,
                      fused_compute_score_for_moe_aux_loss,
                      fused_compute_score_for_moe_aux_loss_backward, fused_moe_aux_loss,
                      fused_moe_aux_loss_backward, fused_topk_with_score_function,
                      fused_topk_with_score_function_backward, moe_permute, moe_permute_backward,
                      moe_sort_chunks_backward, moe_sort_chunks_by_index,
                      moe_sort_chunks_by_index_with_probs, moe_unpermute, moe_unpermute_backward,
                      swiglu, swiglu_quantize)
from .ops.quantize import (as_quantized, cast, dequantize, per_block_cast_to_fp8,
                           per_token_cast_to_fp8, quantize, quantize_scale_shape)
from .ops.gemm import (fp8_gemm_nn, fp8_gemm_nt, fp8_gemm_tn, fp8_gemm_tt, gemm, gemm_grouped,
                       k_grouped_fp8_gemm_tn_contiguous, m_grouped_fp8_gemm_nt_contiguous,
                       m_grouped_fp8_gemm_nt_masked)


def __getattr__(name):
    # xte.torch (custom ops) and xte.nn (modules) import torch: loaded on first use only
    if name in ("torch", "nn"):
        import importlib
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'xte' has no attribute {name!r}")

"""transformer_engine.pytorch.custom_recipes.reference_current_scaling over xte: a per-tensor
current-scaling reference written in plain torch (no xte kernels), so that it can check xte's
quantizer: scale = fp8_max / max(amax, eps) (inf -> the input dtype's max; rounded down to a
power of two with pow_2_scales; 1 for amax 0), data = fp8(clamp(x * scale)), scale_inv =
1 / scale; qgemm = the product of the dequantized operands in fp32."""
import dataclasses
from typing import Optional

import torch

__all__ = ["CurrentScalingQuantizerRef", "CurrentScalingTensorRef"]


@dataclasses.dataclass
class CurrentScalingTensorRef:
    """data (fp8 [M, K]) and scale (the fp32 scale_inv [1]); data_t / scale_t: the transposed
    copy when columnwise."""
    data: Optional[torch.Tensor]
    scale: Optional[torch.Tensor]
    data_t: Optional[torch.Tensor] = None
    scale_t: Optional[torch.Tensor] = None


class CurrentScalingQuantizerRef:
    """Reference per-tensor current-scaling quantizer (torch only)."""

    def __init__(self, dtype, rowwise=True, columnwise=True, pow_2_scales=False, eps=0.0):
        self.dtype, self.rowwise, self.columnwise = dtype, rowwise, columnwise
        self.pow_2_scales, self.eps = pow_2_scales, float(eps)

    def compute_scale(self, x):
        fp8_max = torch.finfo(self.dtype).max
        amax = torch.max(x.abs().max().float(), torch.tensor(self.eps))
        scale = torch.tensor(fp8_max, dtype=torch.float32) / amax
        if torch.isinf(scale):
            scale = torch.tensor(torch.finfo(x.dtype).max, dtype=torch.float32)
        if self.pow_2_scales and amax > 0 and torch.isfinite(amax):
            scale = torch.exp2(torch.floor(torch.log2(scale)))
        if amax == 0:
            scale = torch.tensor(1.0)
        return scale.reshape(1), (1.0 / scale).reshape(1)

    def quantize(self, x):
        scale, scale_inv = self.compute_scale(x)
        fp8_max = torch.finfo(self.dtype).max
        q = torch.clamp(x.float() * scale, -fp8_max, fp8_max).to(self.dtype)
        return CurrentScalingTensorRef(q if self.rowwise else None,
                                       scale_inv if self.rowwise else None,
                                       q.t().contiguous() if self.columnwise else None,
                                       scale_inv if self.columnwise else None)

    def dequantize(self, q, scale_inv, dtype=torch.float32):
        return (q.float() * scale_inv.float()).to(dtype)

    def qgemm(self, qx, qw, m_params=None, out_dtype=torch.float32, sx=None, sw=None,
              bias=None, out=None, accumulate=False, gemm_type=None, qresult_x=None,
              qresult_w=None):
        """y = deq(qx) deq(qw)^T (+ bias) (+ out when accumulate), fp32 then out_dtype."""
        y = (qx.float() * sx.float()) @ (qw.float() * sw.float()).t()
        if bias is not None:
            y = y + bias.float()
        if accumulate and out is not None:
            y = y + out.float()
        return y.to(out_dtype)

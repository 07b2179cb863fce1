"""xte.check: judge another library's FP8 outputs against a named recipe and xte's contract.

Given the inputs and the outputs another library produced (torch / NumPy tensors, or files:
safetensors, .npy / .npz, torch.save), each check recomputes with xte and returns a Report: one
Verdict per tensor (PASS / FAIL and why, difference classes with counts, the first examples),
renderable as JSON (Report.to_json) and as a short table (Report.table). The families, one
module each:

    quantize  check_quantize, check_cast      bytes of data and scales, differences classified
    gemm      check_gemm, check_gemm_grouped  error vs EXACT in units of the FAST bound, ulps,
                                              calc_diff, padding rows
    attention check_attention                 error vs fp64, ratio to the naive computation in
                                              the input precision (FlashAttention's criterion),
                                              rows that see no key
    moe       check_router, check_aux_loss,   selection differences classified (tie order, key
              check_permute, check_unpermute  rounding, group ties), prob ulps, row bytes

The CLI is `python -m xte.check` (and `xte check`, which runs it): see xte/check/__main__.py.
"""

from ._io import load, save, to_host
from ._report import Report, Verdict
from .attention import attention_reference, check_attention
from .gemm import check_gemm, check_gemm_grouped, fast_bound
from .moe import (check_aux_loss, check_permute, check_router, check_router_backward,
                  check_unpermute)
from .quantize import check_cast, check_quantize

__all__ = ["Report", "Verdict", "load", "save", "to_host", "check_quantize", "check_cast",
           "check_gemm", "check_gemm_grouped", "fast_bound",
           "check_attention", "attention_reference",
           "check_router", "check_router_backward", "check_aux_loss",
           "check_permute", "check_unpermute"]

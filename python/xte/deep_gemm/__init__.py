"""DeepGEMM's Python API over xte: `import xte.deep_gemm as deep_gemm` is the only change a
DeepGEMM user's code needs on CPU tensors (docs/python.md, "Coming from DeepGEMM /
TransformerEngine").

Kernels (FP8 e4m3 / e5m2 operands as (data, scales) pairs; the fp8_fp4_* names are the same
functions, FP4 operands raise NotImplementedError): fp8_gemm_{nt,nn,tn,tt},
m_grouped_fp8_gemm_{nt,nn}_contiguous, m_grouped_fp8_gemm_nt_masked (and v2.0's
fp8_m_grouped_gemm_nt_masked), k_grouped_fp8_gemm_{tn,nt}_contiguous, cublaslt_gemm_* (unscaled
FP8). Runtime settings: set_num_sms / get_num_sms (xte's CPU thread count), the contiguous
layout alignment (utils), and DeepGEMM's tuning knobs (accepted, no effect on the CPU).
xte's own setting: set_gemm_mode("exact" | "fast") / get_gemm_mode(), the GEMM mode of every
call ("exact" by default: DeepGEMM's signatures carry no mode).
"""

from typing import Any, Dict

from .. import _lib
from . import testing, utils
from ._gemm import (cublaslt_gemm_nn, cublaslt_gemm_nt, cublaslt_gemm_tn, cublaslt_gemm_tt,
                    fp8_gemm_nn, fp8_gemm_nt, fp8_gemm_tn, fp8_gemm_tt, get_gemm_mode,
                    set_gemm_mode,
                    k_grouped_fp8_gemm_nt_contiguous, k_grouped_fp8_gemm_tn_contiguous,
                    m_grouped_fp8_gemm_nn_contiguous, m_grouped_fp8_gemm_nt_contiguous,
                    m_grouped_fp8_gemm_nt_masked)
from .utils import *  # noqa: F401,F403

fp8_fp4_gemm_nt = fp8_gemm_nt
fp8_fp4_gemm_nn = fp8_gemm_nn
fp8_fp4_gemm_tn = fp8_gemm_tn
fp8_fp4_gemm_tt = fp8_gemm_tt
m_grouped_fp8_fp4_gemm_nt_contiguous = m_grouped_fp8_gemm_nt_contiguous
m_grouped_fp8_fp4_gemm_nn_contiguous = m_grouped_fp8_gemm_nn_contiguous
m_grouped_fp8_fp4_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked  # DeepGEMM v2.0's name

__version__ = "2.6.1+xte"  # the DeepGEMM API version these names follow


def set_num_sms(new_num_sms: int) -> None:
    """DeepGEMM's SM count; on xte's CPU backend the worker threads (xte_cpu_set_num_threads)."""
    _lib.call("xte_cpu_set_num_threads", int(new_num_sms))


def get_num_sms() -> int:
    return int(_lib.lib.xte_cpu_get_num_threads())


_knobs: Dict[str, Any] = {"tc_util": 100, "pdl": False, "ignore_compile_dims": False,
          "block_size_multiple_of": (1, 1)}


def set_tc_util(new_tc_util: int) -> None:
    """Accepted for DeepGEMM code; no effect on the CPU backend."""
    _knobs["tc_util"] = int(new_tc_util)


def get_tc_util() -> int:
    return _knobs["tc_util"]


def set_pdl(new_enable_pdl: bool) -> None:
    """Accepted for DeepGEMM code (programmatic dependent launch); no effect on the CPU."""
    _knobs["pdl"] = bool(new_enable_pdl)


def get_pdl() -> bool:
    return _knobs["pdl"]


def set_ignore_compile_dims(new_value: bool) -> None:
    """Accepted for DeepGEMM code (JIT specialisation); no effect in xte."""
    _knobs["ignore_compile_dims"] = bool(new_value)


def set_block_size_multiple_of(new_value) -> None:
    """Accepted for DeepGEMM code (tile-size heuristics); no effect in xte."""
    _knobs["block_size_multiple_of"] = new_value

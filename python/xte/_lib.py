"""ctypes binding of the xte C API: library loading, every struct and enum of include/xte/*.h,
every function prototype, and the mapping of xte_status to exception classes.

Mirrors the headers one to one and adds no arithmetic. The struct layouts are checked against
the C compiler's sizeof / offsetof by tests/python/test_bindings.py.
"""

import ctypes
import ctypes.util
import enum
import glob
import os

__all__ = [
    "lib", "check", "XteError", "XteValueError", "XteShapeError", "XteDTypeError",
    "XteAlignmentError", "XteBufferTooSmallError", "XteUnsupportedError",
    "XteBackendUnavailableError", "XteDeviceError", "XteOutOfMemoryError", "XteInternalError",
]

# --------------------------------------------------------------------------- library loading


def _candidates():
    env = os.environ.get("XTE_LIBRARY")
    if env:
        yield env
        return
    here = os.path.dirname(os.path.abspath(__file__))
    for pat in ("libxte.so", "libxte.so.*", "libxte.dylib", "xte.dll"):
        for p in sorted(glob.glob(os.path.join(here, "lib", pat))):
            yield p
    found = ctypes.util.find_library("xte")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        try:
            # ctypes.CDLL releases the GIL for the duration of every foreign call.
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append(f"{path}: {e}")
    raise ImportError(
        "xte: cannot load the C library libxte (set XTE_LIBRARY to its path, or install the "
        "package with `pip install .`); tried: " + ("; ".join(tried) if tried else "nothing found"))


lib, library_path = _load()

# --------------------------------------------------------------------------- enums


class Status(enum.IntEnum):
    SUCCESS = 0
    INVALID_ARGUMENT = 1
    NULL_POINTER = 2
    DTYPE = 3
    SHAPE = 4
    BUFFER_TOO_SMALL = 5
    ALIGNMENT = 6
    UNSUPPORTED = 7
    BACKEND_UNAVAILABLE = 8
    DEVICE = 9
    OUT_OF_MEMORY = 10
    INTERNAL = 11


class DType(enum.IntEnum):
    FP32 = 0
    FP16 = 1
    BF16 = 2
    E4M3 = 3
    E5M2 = 4
    E8M0 = 5
    INT32 = 6
    INT64 = 7
    UINT8 = 8
    FP64 = 9


class Backend(enum.IntEnum):
    CPU = 0
    CUDA = 1
    MUSA = 2


class CpuIsa(enum.IntEnum):
    SCALAR = 0
    AVX2 = 1
    AVX512 = 2
    AVX512_SIMDE = 3


class MemcpyKind(enum.IntEnum):
    HOST_TO_DEVICE = 0
    DEVICE_TO_HOST = 1
    DEVICE_TO_DEVICE = 2


class ScalingMode(enum.IntEnum):
    PER_TENSOR = 0
    BLOCK_1x128 = 1
    BLOCK_128x128 = 2
    MXFP8_1x32 = 3


class Recipe(enum.IntEnum):
    TE_CURRENT = 0
    TE_DELAYED = 1
    TE_BLOCK = 2
    DEEPGEMM = 3
    DEEPGEMM_UE8M0 = 4
    MTFP8 = 5
    MX_TE = 6
    MX_OCP = 7


class ScaleLayout(enum.IntEnum):
    COMPACT = 0
    TE_GEMM = 1
    DEEPGEMM = 2
    MX_SWIZZLED = 3


class GemmMode(enum.IntEnum):
    EXACT = 0
    FAST = 1


class GemmGrouping(enum.IntEnum):
    CONTIGUOUS = 0
    MASKED = 1
    K = 2


class RouterScore(enum.IntEnum):
    SOFTMAX = 0
    SIGMOID = 1
    SQRTSOFTPLUS = 2


class AttnLayout(enum.IntEnum):
    BSHD = 0
    SBHD = 1
    THD = 2


class AttnMask(enum.IntEnum):
    NONE = 0
    CAUSAL = 1
    CAUSAL_BOTTOM_RIGHT = 2


class AttnMode(enum.IntEnum):
    """xte_attention_mode"""
    EXACT = 0
    FAST = 1


MAX_RANK = 8
INFO_MAX_GPUS = 16
MOE_MAX_EXPERTS = 1 << 20

# --------------------------------------------------------------------------- structs

_c_enum = ctypes.c_int  # every xte enum is a C enum with int range
_p_tensor = None  # set below


class Tensor(ctypes.Structure):
    """xte_tensor"""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", _c_enum), ("rank", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_RANK), ("ld", ctypes.c_int64)]


class ScaleTensor(ctypes.Structure):
    """xte_scale_tensor"""
    _fields_ = [("data", ctypes.c_void_p), ("dtype", _c_enum), ("rows", ctypes.c_int64),
                ("cols", ctypes.c_int64), ("layout", _c_enum)]


class QTensor(ctypes.Structure):
    """xte_qtensor"""
    _fields_ = [("rowwise", Tensor), ("rowwise_scale_inv", ScaleTensor), ("columnwise", Tensor),
                ("columnwise_scale_inv", ScaleTensor), ("scaling_mode", _c_enum),
                ("recipe", _c_enum), ("amax", ctypes.POINTER(ctypes.c_float)),
                ("scale", ctypes.POINTER(ctypes.c_float))]


class _Config(ctypes.Structure):
    """A config struct (xte_*_config): its first field, struct_size, is set to its ctypes size
    when constructed (docs/api.md, the config ABI rule); xte_*_config_default() sets it too."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.struct_size:
            self.struct_size = ctypes.sizeof(self)


class QuantConfig(_Config):
    """xte_quant_config"""
    _fields_ = [("struct_size", ctypes.c_size_t), ("amax_epsilon", ctypes.c_float), ("force_pow_2", ctypes.c_int),
                ("saturate", ctypes.c_int)]


class GpuInfo(ctypes.Structure):
    """xte_gpu_info"""
    _fields_ = [("name", ctypes.c_char * 128), ("arch", ctypes.c_char * 32),
                ("memory_bytes", ctypes.c_size_t)]


class BackendInfo(ctypes.Structure):
    """xte_backend_info"""
    _fields_ = [("version", ctypes.c_int), ("cpu_isa", _c_enum), ("cpu_isa_best", _c_enum),
                ("cpu_isa_available", ctypes.c_uint), ("cpu_cores", ctypes.c_int),
                ("cpu_threads", ctypes.c_int), ("l1d_bytes", ctypes.c_size_t),
                ("l2_bytes", ctypes.c_size_t), ("l3_bytes", ctypes.c_size_t),
                ("cpu_name", ctypes.c_char * 128), ("cuda_plugin_found", ctypes.c_int),
                ("musa_plugin_found", ctypes.c_int), ("cuda_plugin_status", ctypes.c_char * 160),
                ("musa_plugin_status", ctypes.c_char * 160), ("num_cuda_gpus", ctypes.c_int),
                ("num_musa_gpus", ctypes.c_int), ("cuda_gpus", GpuInfo * INFO_MAX_GPUS),
                ("musa_gpus", GpuInfo * INFO_MAX_GPUS)]


class GemmConfig(_Config):
    """xte_gemm_config"""
    _fields_ = [("struct_size", ctypes.c_size_t), ("trans_a", ctypes.c_int), ("trans_b", ctypes.c_int), ("accumulate", ctypes.c_int),
                ("bias", ctypes.POINTER(Tensor)), ("mode", _c_enum)]


class GemmGroups(ctypes.Structure):
    """xte_gemm_groups"""
    _fields_ = [("kind", _c_enum), ("num_groups", ctypes.c_int),
                ("group_sizes", ctypes.POINTER(ctypes.c_int64)), ("alignment", ctypes.c_int64),
                ("masked_m", ctypes.POINTER(Tensor))]


class RouterConfig(_Config):
    """xte_router_config"""
    _fields_ = [("struct_size", ctypes.c_size_t), ("topk", ctypes.c_int), ("score_function", _c_enum),
                ("use_pre_softmax", ctypes.c_int), ("num_groups", ctypes.c_int),
                ("group_topk", ctypes.c_int), ("scaling_factor", ctypes.c_float)]


class RouterOutputs(ctypes.Structure):
    """xte_router_outputs"""
    _fields_ = [("probs", Tensor), ("routing_map", Tensor), ("routing_bits", Tensor),
                ("topk_idx", Tensor), ("topk_weights", Tensor), ("saved", Tensor)]


class MoeRouting(ctypes.Structure):
    """xte_moe_routing"""
    _fields_ = [("routing_map", ctypes.POINTER(Tensor)), ("topk_idx", ctypes.POINTER(Tensor)),
                ("num_experts", ctypes.c_int64)]


class PermuteConfig(_Config):
    """xte_permute_config"""
    _fields_ = [("struct_size", ctypes.c_size_t), ("num_out_tokens", ctypes.c_int64), ("align", ctypes.c_int64)]


class PermuteOutputs(ctypes.Structure):
    """xte_permute_outputs"""
    _fields_ = [("expert_offsets", Tensor), ("tokens_per_expert", Tensor),
                ("row_to_expert", Tensor)]


class AttentionConfig(_Config):
    """xte_attention_config"""
    _fields_ = [("struct_size", ctypes.c_size_t), ("layout", _c_enum), ("mask", _c_enum), ("window_left", ctypes.c_int64),
                ("window_right", ctypes.c_int64), ("softmax_scale", ctypes.c_float),
                ("softcap", ctypes.c_float), ("alibi_slopes", ctypes.POINTER(ctypes.c_float)),
                ("cu_seqlens_q", ctypes.POINTER(ctypes.c_int32)),
                ("cu_seqlens_kv", ctypes.POINTER(ctypes.c_int32)), ("batch", ctypes.c_int64),
                ("max_seqlen_q", ctypes.c_int64), ("max_seqlen_kv", ctypes.c_int64),
                ("descale_q", ctypes.POINTER(ctypes.c_float)),
                ("descale_k", ctypes.POINTER(ctypes.c_float)),
                ("descale_v", ctypes.POINTER(ctypes.c_float)), ("mode", _c_enum)]


class EpConfig(_Config):
    """xte_ep_config"""
    _fields_ = [("struct_size", ctypes.c_size_t), ("experts_per_rank", ctypes.c_int64),
                ("hidden", ctypes.c_int64), ("topk", ctypes.c_int32), ("align", ctypes.c_int32),
                ("max_tokens_per_rank", ctypes.c_int64)]


class EpCounts(ctypes.Structure):
    """xte_ep_counts"""
    _fields_ = [("recv_rows", ctypes.c_int64), ("slot_rows", ctypes.c_int64),
                ("recv_tokens", ctypes.c_int64)]


class EpStats(ctypes.Structure):
    """xte_ep_stats"""
    _fields_ = [("struct_size", ctypes.c_size_t), ("calls", ctypes.c_int64),
                ("pack_ns", ctypes.c_int64), ("exchange_ns", ctypes.c_int64),
                ("local_ns", ctypes.c_int64), ("bytes_sent", ctypes.c_int64),
                ("bytes_received", ctypes.c_int64)]


# The structs by their C names (for the layout test).
STRUCTS = {
    "xte_tensor": Tensor, "xte_scale_tensor": ScaleTensor, "xte_qtensor": QTensor,
    "xte_quant_config": QuantConfig, "xte_gpu_info": GpuInfo, "xte_backend_info": BackendInfo,
    "xte_gemm_config": GemmConfig, "xte_gemm_groups": GemmGroups,
    "xte_router_config": RouterConfig, "xte_router_outputs": RouterOutputs,
    "xte_moe_routing": MoeRouting, "xte_permute_config": PermuteConfig,
    "xte_permute_outputs": PermuteOutputs, "xte_attention_config": AttentionConfig,
    "xte_ep_config": EpConfig, "xte_ep_counts": EpCounts, "xte_ep_stats": EpStats,
}

# --------------------------------------------------------------------------- prototypes

_P = ctypes.POINTER
_T = _P(Tensor)
_Q = _P(QTensor)
_S = ctypes.c_void_p  # xte_stream (opaque)
_st = ctypes.c_int  # xte_status
_i64 = ctypes.c_int64
_int = ctypes.c_int
_f32 = ctypes.c_float

_PROTOTYPES = {
    # core.h
    "xte_status_string": (ctypes.c_char_p, [_st]),
    "xte_last_error": (ctypes.c_char_p, []),
    "xte_version": (_int, []),
    "xte_dtype_size": (ctypes.c_size_t, [_c_enum]),
    "xte_dtype_name": (ctypes.c_char_p, [_c_enum]),
    "xte_backend_name": (ctypes.c_char_p, [_c_enum]),
    "xte_cpu_isa_name": (ctypes.c_char_p, [_c_enum]),
    "xte_cpu_get_isa": (_c_enum, []),
    "xte_cpu_set_isa": (_st, [_c_enum]),
    "xte_cpu_set_num_threads": (_st, [_int]),
    "xte_cpu_get_num_threads": (_int, []),
    "xte_get_backend_info": (_st, [_P(BackendInfo)]),
    "xte_backend_info_string": (_st, [ctypes.c_char_p, ctypes.c_size_t]),
    "xte_stream_create": (_st, [_c_enum, _int, ctypes.c_void_p, _P(ctypes.c_void_p)]),
    "xte_stream_destroy": (_st, [_S]),
    "xte_stream_synchronize": (_st, [_S]),
    "xte_stream_backend": (_c_enum, [_S]),
    "xte_malloc": (_st, [_S, ctypes.c_size_t, _P(ctypes.c_void_p)]),
    "xte_free": (_st, [_S, ctypes.c_void_p]),
    "xte_memcpy": (_st, [_S, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, _c_enum]),
    "xte_memset": (_st, [_S, ctypes.c_void_p, _int, ctypes.c_size_t]),
    # quantize.h
    "xte_quant_config_default": (QuantConfig, []),
    "xte_quantize_scale_shape": (_st, [_i64, _i64, _c_enum, _c_enum, _c_enum, _int, _P(_i64),
                                       _P(_i64)]),
    "xte_quantize": (_st, [_T, _Q, _P(QuantConfig), _S]),
    "xte_dequantize": (_st, [_Q, _int, _T, _S]),
    "xte_cast": (_st, [_T, _T, _int, _S]),
    # gemm.h
    "xte_gemm_config_default": (GemmConfig, []),
    "xte_gemm": (_st, [_Q, _Q, _T, _T, _P(GemmConfig), _S]),
    "xte_gemm_grouped": (_st, [_Q, _Q, _T, _T, _P(GemmGroups), _P(GemmConfig), _S]),
    # moe.h
    "xte_router_config_default": (RouterConfig, []),
    "xte_router_forward": (_st, [_T, _T, _P(RouterConfig), _P(RouterOutputs), _S]),
    "xte_router_backward": (_st, [_T, _T, _T, _T, _P(RouterConfig), _T, _S]),
    "xte_router_aux_scores": (_st, [_T, _int, _c_enum, _T, _T, _T, _S]),
    "xte_router_aux_scores_ex": (_st, [_T, _int, _c_enum, _T, _T, _T, _T, _S]),
    "xte_router_qb_forward": (_st, [_T, _T, _int, _f32, _f32, _f32, _P(RouterOutputs), _T, _T,
                                    _S]),
    "xte_router_aux_scores_backward": (_st, [_T, _T, _T, _int, _c_enum, _T, _S]),
    "xte_moe_aux_loss_forward": (_st, [_T, _T, _i64, _int, _f32, _P(_f32), _S]),
    "xte_moe_aux_loss_backward": (_st, [_T, _i64, _int, _f32, _f32, _T, _S]),
    "xte_moe_aux_loss_forward_ex": (_st, [_T, _T, _i64, _i64, _int, _f32, _P(_f32), _S]),
    "xte_moe_aux_loss_backward_ex": (_st, [_T, _i64, _i64, _int, _f32, _f32, _T, _S]),
    "xte_permute_config_default": (PermuteConfig, []),
    "xte_moe_permute_rows": (_st, [_P(MoeRouting), _P(PermuteConfig), _P(_i64), _S]),
    "xte_moe_permute": (_st, [_T, _T, _P(MoeRouting), _P(PermuteConfig), _T, _T, _T,
                              _P(PermuteOutputs), _S]),
    "xte_moe_unpermute": (_st, [_T, _P(MoeRouting), _T, _T, _T, _S]),
    "xte_moe_permute_backward": (_st, [_T, _P(MoeRouting), _T, _T, _S]),
    "xte_moe_unpermute_backward": (_st, [_T, _T, _P(MoeRouting), _T, _T, _T, _T, _S]),
    "xte_moe_sort_chunks_by_index": (_st, [_T, _T, _T, _T, _T, _S]),
    "xte_moe_sort_chunks_backward": (_st, [_T, _T, _T, _S]),
    "xte_moe_dispatch_layout": (_st, [_T, _i64, _int, _T, _T, _T, _S]),
    "xte_swiglu": (_st, [_T, _T, _S]),
    "xte_dswiglu": (_st, [_T, _T, _T, _S]),
    "xte_swiglu_quantize": (_st, [_T, _c_enum, _Q, _P(QuantConfig), _S]),
    "xte_dswiglu_quantize": (_st, [_T, _T, _c_enum, _Q, _P(QuantConfig), _S]),
    # attention.h
    "xte_attention_config_default": (AttentionConfig, []),
    "xte_attention_fwd": (_st, [_T, _T, _T, _T, _T, _P(AttentionConfig), _S]),
    "xte_attention_bwd": (_st, [_T, _T, _T, _T, _T, _T, _T, _T, _T, _P(AttentionConfig), _S]),
    # ep.h (groups, worlds and handles are opaque pointers)
    "xte_ep_config_default": (EpConfig, []),
    "xte_ep_group_create_mpi": (_st, [ctypes.c_void_p, _P(EpConfig), _P(ctypes.c_void_p)]),
    "xte_ep_group_create_nccl": (_st, [ctypes.c_void_p, _P(EpConfig), _S, _P(ctypes.c_void_p)]),
    "xte_ep_group_create_mccl": (_st, [ctypes.c_void_p, _P(EpConfig), _S, _P(ctypes.c_void_p)]),
    "xte_ep_threads_world_create": (_st, [_int, _P(ctypes.c_void_p)]),
    "xte_ep_threads_world_destroy": (_st, [ctypes.c_void_p]),
    "xte_ep_group_create_threads": (_st, [ctypes.c_void_p, _int, _P(EpConfig),
                                          _P(ctypes.c_void_p)]),
    "xte_ep_group_destroy": (_st, [ctypes.c_void_p]),
    "xte_ep_group_info": (_st, [ctypes.c_void_p, _P(_int), _P(_int), _P(ctypes.c_char_p)]),
    "xte_ep_group_stats": (_st, [ctypes.c_void_p, _P(EpStats), _int]),
    "xte_ep_handle_size": (_st, [ctypes.c_void_p, _P(ctypes.c_size_t)]),
    "xte_ep_prepare": (_st, [ctypes.c_void_p, _T, ctypes.c_void_p, ctypes.c_size_t, _P(EpCounts),
                             _T, _S]),
    "xte_ep_dispatch": (_st, [ctypes.c_void_p, ctypes.c_void_p, _T, _T, _T, _T, _T, _T, _S]),
    "xte_ep_dispatch_tokens": (_st, [ctypes.c_void_p, ctypes.c_void_p, _T, _T, _T, _T, _T, _T, _T,
                                     _S]),
    "xte_ep_combine": (_st, [ctypes.c_void_p, ctypes.c_void_p, _T, _T, _T, _T, _S]),
    "xte_ep_combine_backward": (_st, [ctypes.c_void_p, ctypes.c_void_p, _T, _T, _T, _T, _T, _S]),
    "xte_ep_dispatch_backward": (_st, [ctypes.c_void_p, ctypes.c_void_p, _T, _T, _S]),
}

for _name, (_res, _args) in _PROTOTYPES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

# --------------------------------------------------------------------------- errors


class XteError(Exception):
    """An xte call failed: .status (Status) and .message (xte_last_error())."""

    def __init__(self, status, message, function=None):
        self.status = Status(status) if status in Status._value2member_map_ else status
        self.message = message
        self.function = function
        where = f"{function}: " if function else ""
        name = self.status.name if isinstance(self.status, Status) else str(status)
        super().__init__(f"{where}{message} [XTE_{'ERROR_' if status else ''}{name}]")


class XteValueError(XteError, ValueError):
    """A value out of range, an unknown enum, a NULL where a pointer is required."""


class XteShapeError(XteValueError):
    """Shapes that do not match."""


class XteBufferTooSmallError(XteValueError):
    """A scale or workspace buffer smaller than required."""


class XteAlignmentError(XteValueError):
    """A pointer or leading dimension misaligned (or a layout xte cannot take)."""


class XteDTypeError(XteError, TypeError):
    """A dtype the operation does not take."""


class XteUnsupportedError(XteError, NotImplementedError):
    """A valid request this build or recipe does not define."""


class XteBackendUnavailableError(XteError, RuntimeError):
    """A plugin library is missing or there is no device."""


class XteDeviceError(XteError, RuntimeError):
    """A GPU runtime call failed."""


class XteOutOfMemoryError(XteError, MemoryError):
    """An allocation failed."""


class XteInternalError(XteError, RuntimeError):
    """An internal error (a bug: please report it)."""


_EXC = {
    Status.INVALID_ARGUMENT: XteValueError,
    Status.NULL_POINTER: XteValueError,
    Status.DTYPE: XteDTypeError,
    Status.SHAPE: XteShapeError,
    Status.BUFFER_TOO_SMALL: XteBufferTooSmallError,
    Status.ALIGNMENT: XteAlignmentError,
    Status.UNSUPPORTED: XteUnsupportedError,
    Status.BACKEND_UNAVAILABLE: XteBackendUnavailableError,
    Status.DEVICE: XteDeviceError,
    Status.OUT_OF_MEMORY: XteOutOfMemoryError,
    Status.INTERNAL: XteInternalError,
}


def parse_enum(value, table, enum_cls, what):
    """An enum from the enum itself, its int value, or a key of `table` (strings matched in
    lower case; lists as tuples); else an XteValueError naming `what` and the accepted names."""
    if isinstance(value, enum_cls):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return enum_cls(value)
        except ValueError:
            pass
    key = value.lower() if isinstance(value, str) else value
    if isinstance(key, list):
        key = tuple(key)
    try:
        return table[key]
    except (KeyError, TypeError):
        names = sorted(str(k) for k in table if isinstance(k, str))
        raise XteValueError(Status.INVALID_ARGUMENT,
                            f"{what}: {value!r} is not one of {', '.join(names)}") from None


def exception_for(status):
    """The exception class of an xte_status value."""
    return _EXC.get(status, XteError)


def check(status, function=None):
    """Raise the mapped exception (with xte_last_error()) unless status is XTE_SUCCESS."""
    if status == 0:
        return
    msg = lib.xte_last_error()
    msg = msg.decode("utf-8", "replace") if msg else ""
    raise exception_for(status)(status, msg, function)


def call(name, *args):
    """Call xte function `name` and raise on a non-success status."""
    check(getattr(lib, name)(*args), name)


def version():
    """xte_version(): major * 10000 + minor * 100 + patch."""
    return lib.xte_version()

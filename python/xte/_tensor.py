"""Arrays of any framework as xte_tensor views, without copies, and outputs in the input's framework.

torch tensors are read directly (data_ptr, shape, stride, dtype, device); NumPy arrays through
__array_interface__ (bf16 / fp8 / e8m0 with ml_dtypes); any other producer through DLPack
(__dlpack__, versioned or not). A layout xte cannot take (a last dimension with a non-unit
stride, outer dimensions that are not dense over the rows, negative or overlapping strides) is
an XteLayoutError naming the argument: nothing is ever copied behind the caller's back.

Outputs are allocated in the framework and on the device of a reference input (torch in, torch
out; NumPy or another DLPack producer in, NumPy out). CPU arrays run on the CPU backend; CUDA
tensors on the CUDA plugin, on torch's current stream (one xte stream per torch stream, cached).
"""

import ctypes
import sys
import threading
from typing import Any, Dict

from . import _lib
from ._lib import DType, Status, Tensor, XteValueError, lib

__all__ = ["View", "view", "view_opt", "empty", "stream_of", "cuda_stream", "XteLayoutError",
           "dtype_of"]


class XteLayoutError(XteValueError):
    """A tensor layout xte cannot take without a copy (xte never copies behind your back)."""

    def __init__(self, message):
        super().__init__(Status.INVALID_ARGUMENT, message)


_BY_NAME = {
    "float32": DType.FP32, "float16": DType.FP16, "bfloat16": DType.BF16,
    "float8_e4m3fn": DType.E4M3, "float8_e5m2": DType.E5M2, "float8_e8m0fnu": DType.E8M0,
    "int32": DType.INT32, "int64": DType.INT64, "uint8": DType.UINT8, "float64": DType.FP64,
    "bool": DType.UINT8,  # read as bytes 0 / 1 (routing maps); outputs are never bool
}
_NAME_OF = {v: k for k, v in _BY_NAME.items() if k != "bool"}
_CPU = ("cpu", 0)
_SIZE = {DType.FP32: 4, DType.FP16: 2, DType.BF16: 2, DType.E4M3: 1, DType.E5M2: 1,
         DType.E8M0: 1, DType.INT32: 4, DType.INT64: 8, DType.UINT8: 1, DType.FP64: 8}

# ------------------------------------------------------------------------------- frameworks


def loaded_torch():
    """The torch module if something has imported it, else None (xte never imports torch)."""
    return sys.modules.get("torch")


def _is_torch(x):
    t = loaded_torch()
    return t is not None and isinstance(x, t.Tensor)


def _numpy():
    import numpy
    return numpy


_NP_DTYPES: Dict[Any, Any] = {}


def _np_dtype(d):
    r = _NP_DTYPES.get(d)
    if r is None:
        r = _NP_DTYPES[d] = _np_dtype_make(d)
    return r


def _np_dtype_make(d):
    np = _numpy()
    name = _NAME_OF[DType(d)]
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"):
        import ml_dtypes
        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name)


_TORCH_DT: Dict[Any, Any] = {}


def torch_dtype(d):
    """The torch dtype of an xte dtype."""
    try:
        return _TORCH_DT[d]
    except KeyError:
        r = _TORCH_DT[d] = getattr(loaded_torch(), _NAME_OF[DType(d)])
        return r


_DT_CACHE: Dict[Any, Any] = {}


def dtype_of(x):
    """The xte dtype of a torch / NumPy dtype (or an array's dtype), or None."""
    dt = x if isinstance(x, type) else getattr(x, "dtype", x)
    try:
        return _DT_CACHE[dt]
    except KeyError:
        pass
    except TypeError:  # unhashable
        return None
    r = _BY_NAME.get(str(dt).rsplit(".", 1)[-1])
    if r is None and isinstance(dt, type):  # a NumPy scalar type (np.float32, ml_dtypes.bfloat16)
        try:
            r = _BY_NAME.get(_numpy().dtype(dt).name)
        except TypeError:
            r = None
    _DT_CACHE[dt] = r
    return r


# ------------------------------------------------------------------------------- DLPack

class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class _DLVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedVersioned(ctypes.Structure):
    _fields_ = [("version", _DLVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


# (type code, bits) -> xte dtype; codes from dlpack.h v1.1 (kDLInt 0, kDLUInt 1, kDLFloat 2,
# kDLBfloat 4, kDLBool 6, kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12, kDLFloat8_e8m0fnu 14)
_DL_DTYPES = {(2, 32): DType.FP32, (2, 16): DType.FP16, (4, 16): DType.BF16, (10, 8): DType.E4M3,
              (12, 8): DType.E5M2, (14, 8): DType.E8M0, (0, 32): DType.INT32,
              (0, 64): DType.INT64, (1, 8): DType.UINT8, (2, 64): DType.FP64, (6, 8): DType.UINT8}
_DL_READ_ONLY = 1

_capi = ctypes.pythonapi
_capi.PyCapsule_IsValid.restype = ctypes.c_int
_capi.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_GetPointer.restype = ctypes.c_void_p
_capi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capi.PyCapsule_SetName.restype = ctypes.c_int
_capi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_USED = ctypes.c_char_p(b"used_dltensor")
_USED_V = ctypes.c_char_p(b"used_dltensor_versioned")


class _DLHolder:
    """Owns a consumed DLPack capsule's tensor and calls its deleter when dropped."""

    def __init__(self, addr, managed):
        self.addr = addr
        self.managed = managed

    def __del__(self):
        d = self.managed.deleter
        if d:
            d(self.addr)


def _from_dlpack(x, name):
    dev = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else (1, 0)
    if int(dev[0]) not in (1, 3):
        raise XteLayoutError(f"{name}: DLPack device type {int(dev[0])} (only CPU memory is read "
                             "through DLPack; pass CUDA tensors as torch tensors)")
    try:
        cap = x.__dlpack__(max_version=(1, 1))
    except TypeError:
        cap = x.__dlpack__()
    if _capi.PyCapsule_IsValid(cap, b"dltensor_versioned"):
        addr = _capi.PyCapsule_GetPointer(cap, b"dltensor_versioned")
        m = _DLManagedVersioned.from_address(addr)
        _capi.PyCapsule_SetName(cap, _USED_V)
        read_only = bool(m.flags & _DL_READ_ONLY)
    elif _capi.PyCapsule_IsValid(cap, b"dltensor"):
        addr = _capi.PyCapsule_GetPointer(cap, b"dltensor")
        m = _DLManaged.from_address(addr)
        _capi.PyCapsule_SetName(cap, _USED)
        read_only = False
    else:
        raise XteLayoutError(f"{name}: __dlpack__ returned no DLPack capsule")
    holder = _DLHolder(addr, m)
    t = m.dl_tensor
    key = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or key not in _DL_DTYPES:
        raise _lib.XteDTypeError(Status.DTYPE, f"{name}: DLPack dtype code {t.dtype.code} bits "
                                 f"{t.dtype.bits} lanes {t.dtype.lanes} has no xte dtype")
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    ptr = (t.data or 0) + t.byte_offset
    return ptr, shape, strides, _DL_DTYPES[key], holder, read_only


# ------------------------------------------------------------------------------- views


class View:
    """One argument as xte sees it: .t (the xte_tensor), .obj (the caller's array), .fw
    ('torch' / 'numpy' / 'dlpack'), .device (('cpu', 0) or ('cuda', index)), .shape."""

    __slots__ = ("t", "f", "obj", "fw", "device", "shape", "dtype", "keep", "read_only", "name")

    @property
    def ptr(self):
        """A pointer to the xte_tensor (assignable to struct fields too)."""
        return ctypes.pointer(self.t)

    @property
    def ref(self):
        """ctypes.byref of the xte_tensor: a cheaper argument for a call."""
        return ctypes.byref(self.t)

    @property
    def data(self):
        return self.t.data


def _ld(shape, strides, name):
    rank = len(shape)
    if rank == 0:
        raise XteLayoutError(f"{name}: a 0-d tensor (xte takes rank 1..8)")
    if rank > _lib.MAX_RANK:
        raise XteLayoutError(f"{name}: rank {rank} > {_lib.MAX_RANK}")
    if any(s == 0 for s in shape):
        return 0
    if any(s < 0 for s in strides):
        raise XteLayoutError(f"{name}: negative strides {strides}")
    cols = shape[-1]
    if cols != 1 and strides[-1] != 1:
        raise XteLayoutError(
            f"{name}: the last dimension has stride {strides[-1]}, xte takes unit-stride rows "
            f"(shape {tuple(shape)}, strides {tuple(strides)}); make it contiguous explicitly")
    if rank == 1:
        return 0
    row = strides[-2] if shape[-2] != 1 else cols
    if row < cols:
        raise XteLayoutError(f"{name}: row stride {row} < {cols} columns (overlapping rows)")
    expect = row * shape[-2]
    for i in range(rank - 3, -1, -1):
        if shape[i] != 1 and strides[i] != expect:
            raise XteLayoutError(
                f"{name}: dimension {i} has stride {strides[i]}, xte needs {expect} (all "
                f"dimensions but the last two dense over the rows; shape {tuple(shape)}, "
                f"strides {tuple(strides)})")
        expect *= shape[i]
    return 0 if row == cols else row


_Shape = ctypes.c_int64 * _lib.MAX_RANK
# an xte_tensor built from packed bytes: cheaper than the ctypes Structure constructor
# (docs/performance.md, Python call overhead)
_pack = __import__("struct").Struct("@Pii%dqq" % _lib.MAX_RANK).pack
_from_bytes = Tensor.from_buffer_copy
_ZEROS = [(0,) * (_lib.MAX_RANK - r) for r in range(_lib.MAX_RANK + 1)]
_ndarray = None
# The pointer given for an array with no element whose framework says NULL (never read or
# written); a NULL pointer with elements is an error naming the argument.
_EMPTY_BUF = ctypes.create_string_buffer(256)
_EMPTY_PTR = (ctypes.addressof(_EMPTY_BUF) + 127) // 128 * 128


def _np_ndarray():
    global _ndarray
    np = sys.modules.get("numpy")
    if np is None:
        return ()
    _ndarray = np.ndarray
    return _ndarray

# NumPy's __array_interface__ builds a dict per call, several times the C call's own cost. The data
# pointer is read instead from the array object's C struct (PyArrayObject: the object header,
# then `char *data`, a layout NumPy has kept since 1.0), after checking once against
# __array_interface__ on arrays with and without an offset; any mismatch keeps the slow path.
_NP_DATA_OFFSET = object.__basicsize__
_c_void_p = ctypes.c_void_p
_np_fast = None


def _np_fast_check():
    global _np_fast
    np = _numpy()
    base = np.zeros((4, 6), np.float32)
    ok = True
    for a in (base, base[1:, 2:], base[::2], np.zeros(0, np.uint8), base.T):
        ok = ok and _c_void_p.from_address(id(a) + _NP_DATA_OFFSET).value == \
            a.__array_interface__["data"][0]
    _np_fast = ok


def view(x, name, dtypes=None, writable=False):
    """x (torch tensor, NumPy array or DLPack producer) as an xte_tensor View, zero-copy."""
    v = View()
    v.name = name
    v.obj = x
    v.keep = None
    v.read_only = False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        d = dtype_of(x.dtype)
        if d is None:
            raise _lib.XteDTypeError(Status.DTYPE, f"{name}: torch dtype {x.dtype} has no xte dtype")
        shape = tuple(x.shape)
        ptr = x.data_ptr()
        dev = x.device
        v.fw = "torch"
        v.device = _CPU if dev.type == "cpu" else (dev.type, dev.index or 0)
        if 0 < len(shape) <= _lib.MAX_RANK and x.is_contiguous():
            ld = 0
        else:
            ld = _ld(shape, x.stride(), name)
    elif isinstance(x, _ndarray or _np_ndarray()):
        d = dtype_of(x.dtype)
        if d is None:
            raise _lib.XteDTypeError(Status.DTYPE, f"{name}: NumPy dtype {x.dtype} has no xte dtype")
        if _np_fast is None:
            _np_fast_check()
        if _np_fast:
            ptr = _c_void_p.from_address(id(x) + _NP_DATA_OFFSET).value
            v.read_only = not x.flags.writeable
        else:
            ptr, ro = x.__array_interface__["data"]
            v.read_only = bool(ro)
        shape = x.shape
        v.fw = "numpy"
        v.device = _CPU
        if 0 < len(shape) <= _lib.MAX_RANK and x.flags.c_contiguous:
            ld = 0
        else:
            isz = x.itemsize
            if any(s % isz for s in x.strides):
                raise XteLayoutError(f"{name}: strides {x.strides} are not whole elements")
            ld = _ld(shape, tuple(s // isz for s in x.strides), name)
    elif hasattr(x, "__dlpack__"):
        ptr, shape, strides, d, v.keep, v.read_only = _from_dlpack(x, name)
        v.fw = "dlpack"
        v.device = _CPU
        ld = _ld(shape, strides, name)
    else:
        raise _lib.XteDTypeError(Status.DTYPE, f"{name}: {type(x).__name__} is not a tensor "
                                 "(torch, NumPy or a DLPack producer)")
    if dtypes is not None and d not in dtypes:
        want = "/".join(_NAME_OF[k] for k in dtypes)
        raise _lib.XteDTypeError(Status.DTYPE, f"{name}: dtype {_NAME_OF[d]}, expected {want}")
    if writable and v.read_only:
        raise XteLayoutError(f"{name}: a read-only array cannot be written")
    rank = len(shape)
    if not ptr:
        if 0 in shape:  # torch gives 0 for an empty tensor; xte wants a pointer all the same
            ptr = _EMPTY_PTR
        else:
            raise _lib.XteValueError(Status.NULL_POINTER, f"{name}: NULL data pointer")
    v.f = (ptr, d, rank, *shape, *_ZEROS[rank], ld)  # the xte_tensor's fields, in order
    v.t = _from_bytes(_pack(*v.f))
    v.shape = tuple(shape)
    v.dtype = d
    return v


def data_ptr(a):
    """The data pointer of a torch tensor or NumPy array (the pointer given for an empty one)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        p = a.data_ptr()
    else:
        if _np_fast is None:
            _np_fast_check()
        if _np_fast:
            p = _c_void_p.from_address(id(a) + _NP_DATA_OFFSET).value
        else:
            p = a.__array_interface__["data"][0]
    return p or _EMPTY_PTR


def view_opt(x, name, dtypes=None, writable=False):
    """view(), or None for None."""
    return None if x is None else view(x, name, dtypes, writable)


def ptr(v):
    """A pointer to the xte_tensor of a View, or NULL for None."""
    return None if v is None else ctypes.pointer(v.t)


def _torch_device(like):
    return "cpu" if like.device[0] == "cpu" else f"{like.device[0]}:{like.device[1]}"


def empty(like, shape, dtype):
    """A new uninitialised array of xte dtype `dtype` in the framework / device of View `like`."""
    if like.fw != "torch":
        return _np_empty(shape, dtype=_np_dtype(dtype))
    if like.device is _CPU:  # the common case: no device argument, no shape conversion
        return loaded_torch().empty(shape, dtype=torch_dtype(dtype))
    return loaded_torch().empty(tuple(int(s) for s in shape), dtype=torch_dtype(dtype),
                          device=_torch_device(like))


def _np_empty(shape, dtype):
    global _np_empty
    _np_empty = _numpy().empty
    return _np_empty(shape, dtype=dtype)


def zeros(like, shape, dtype):
    """empty() filled with zero bytes."""
    if like.fw != "torch":
        return _numpy().zeros(shape, dtype=_np_dtype(dtype))
    return loaded_torch().zeros(tuple(int(s) for s in shape), dtype=torch_dtype(dtype),
                          device=_torch_device(like))


# ------------------------------------------------------------------------------- streams

_streams: Dict[Any, Any] = {}
_streams_lock = threading.Lock()
_BACKEND_OF = {"cpu": _lib.Backend.CPU, "cuda": _lib.Backend.CUDA, "musa": _lib.Backend.MUSA}


def _make_stream(backend, device, native):
    s = ctypes.c_void_p()
    _lib.check(lib.xte_stream_create(int(backend), device, native, ctypes.byref(s)),
               "xte_stream_create")
    return s.value


def cuda_stream(device):
    """The xte stream over torch's current stream of CUDA device `device` (cached, as stream_of's;
    without a CUDA-capable torch: the plugin's own stream of that device)."""
    t = loaded_torch()
    native = None
    if t is not None and hasattr(t, "cuda") and t.cuda.is_available():
        native = t.cuda.current_stream(device).cuda_stream
    key = ("cuda", int(device), native or 0)
    s = _streams.get(key)
    if s is None:
        with _streams_lock:
            s = _streams.get(key)
            if s is None:
                s = _make_stream(_lib.Backend.CUDA, key[1], key[2] or None)
                _streams[key] = s
    return s


def stream_of(*views):
    """The xte stream for the Views' device (all on one device, else an error naming the
    argument): the CPU backend for host memory; for CUDA tensors the xte stream over torch's
    current stream of that device."""
    dev = None
    first = None
    for v in views:
        if v is None:
            continue
        if dev is None:
            dev, first = v.device, v.name
        elif v.device != dev:
            raise XteValueError(Status.INVALID_ARGUMENT,
                                f"{v.name}: on {v.device[0]}:{v.device[1]}, but {first} is on "
                                f"{dev[0]}:{dev[1]} (one device per call)")
    if dev is None or dev[0] == "cpu":
        key = ("cpu", 0, 0)
    elif dev[0] == "cuda":
        native = loaded_torch().cuda.current_stream(dev[1]).cuda_stream
        key = ("cuda", dev[1], native)
    else:
        raise XteValueError(Status.INVALID_ARGUMENT, f"{first}: device type {dev[0]} is not "
                            "supported by the Python package")
    s = _streams.get(key)
    if s is None:
        with _streams_lock:
            s = _streams.get(key)
            if s is None:
                s = _make_stream(_BACKEND_OF[key[0]], key[1], key[2] or None)
                _streams[key] = s
    return s


assert __import__("struct").calcsize("@Pii%dqq" % _lib.MAX_RANK) == ctypes.sizeof(Tensor)

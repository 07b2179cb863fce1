# ctest: no-isa-variants (binding layout, errors and tensor views: no kernel result is checked)
"""The ctypes binding against the C headers: struct sizes and field offsets as the C compiler
lays them out, enum values, every XTE_API function bound; status -> exception mapping; the
tensor views (zero-copy, layouts, DLPack)."""

import ctypes
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import xte
from xte import _lib, _tensor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
INCLUDE = os.path.join(ROOT, "include")
HEADERS = ["core", "quantize", "gemm", "moe", "attention", "ep"]

ENUM_PREFIX = {
    _lib.DType: "XTE_DTYPE_", _lib.Backend: "XTE_BACKEND_", _lib.CpuIsa: "XTE_CPU_ISA_",
    _lib.MemcpyKind: "XTE_MEMCPY_", _lib.ScalingMode: "XTE_SCALING_",
    _lib.Recipe: "XTE_RECIPE_", _lib.ScaleLayout: "XTE_SCALE_LAYOUT_", _lib.GemmMode: "XTE_GEMM_",
    _lib.GemmGrouping: "XTE_GEMM_GROUPED_", _lib.RouterScore: "XTE_ROUTER_",
    _lib.AttnLayout: "XTE_ATTN_LAYOUT_", _lib.AttnMask: "XTE_ATTN_MASK_",
    _lib.AttnMode: "XTE_ATTENTION_",
}
# enums whose C type ends with a *_COUNT member: the binding must have every member
ENUM_COUNT = {
    _lib.DType: "XTE_DTYPE_COUNT", _lib.CpuIsa: "XTE_CPU_ISA_COUNT",
    _lib.ScalingMode: "XTE_SCALING_COUNT", _lib.Recipe: "XTE_RECIPE_COUNT",
    _lib.ScaleLayout: "XTE_SCALE_LAYOUT_COUNT", _lib.RouterScore: "XTE_ROUTER_SCORE_COUNT",
    _lib.AttnLayout: "XTE_ATTN_LAYOUT_COUNT", _lib.AttnMask: "XTE_ATTN_MASK_COUNT",
}


def _c_name(enum_cls, member):
    if enum_cls is _lib.Status:
        return "XTE_SUCCESS" if member.value == 0 else "XTE_ERROR_" + member.name
    return ENUM_PREFIX[enum_cls] + member.name


def _version_include():
    libdir = os.path.dirname(os.path.abspath(_lib.library_path))
    for d in (os.path.join(libdir, "include"), os.path.join(libdir, "..", "include")):
        if os.path.exists(os.path.join(d, "xte", "version.h")):
            return d
    return None


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    """Runs a C program printing sizeof / offsetof of every bound struct and every enum value."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.fail("no C compiler (cc / gcc / clang) to check the struct layouts with")
    d = tmp_path_factory.mktemp("layout")
    inc = [INCLUDE]
    vinc = _version_include()
    if vinc is None:  # an installed wheel without the build tree: a stand-in version.h
        os.makedirs(d / "xte")
        (d / "xte" / "version.h").write_text("#define XTE_VERSION 0\n")
        inc.append(str(d))
    else:
        inc.append(vinc)
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <xte/xte.h>",
             "int main(void) {"]
    for cname, cls in _lib.STRUCTS.items():
        lines.append(f'printf("S {cname} %zu %zu\\n", sizeof({cname}), _Alignof({cname}));')
        for fname, _ in cls._fields_:
            lines.append(f'printf("F {cname} {fname} %zu\\n", offsetof({cname}, {fname}));')
    for cls in list(ENUM_PREFIX) + [_lib.Status]:
        for m in cls:
            n = _c_name(cls, m)
            lines.append(f'printf("E {n} %d\\n", (int){n});')
    for cls, n in ENUM_COUNT.items():
        lines.append(f'printf("E {n} %d\\n", (int){n});')
    lines += ['printf("E XTE_MAX_RANK %d\\n", XTE_MAX_RANK);',
              'printf("E XTE_INFO_MAX_GPUS %d\\n", XTE_INFO_MAX_GPUS);',
              'printf("E XTE_MOE_MAX_EXPERTS %lld\\n", (long long)XTE_MOE_MAX_EXPERTS);',
              "return 0; }"]
    src = d / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = d / "layout"
    args = [cc, "-std=c11", "-o", str(exe), str(src)] + [f"-I{i}" for i in inc]
    r = subprocess.run(args, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    res = {"S": {}, "F": {}, "E": {}}
    for line in out.splitlines():
        kind, *rest = line.split()
        if kind == "S":
            res["S"][rest[0]] = (int(rest[1]), int(rest[2]))
        elif kind == "F":
            res["F"][(rest[0], rest[1])] = int(rest[2])
        else:
            res["E"][rest[0]] = int(rest[1])
    return res


@pytest.mark.parametrize("cname", sorted(_lib.STRUCTS))
def test_struct_layout_matches_c(c_layout, cname):
    cls = _lib.STRUCTS[cname]
    size, align = c_layout["S"][cname]
    assert ctypes.sizeof(cls) == size, f"{cname}: ctypes size {ctypes.sizeof(cls)}, C {size}"
    assert ctypes.alignment(cls) == align
    for fname, _ in cls._fields_:
        assert getattr(cls, fname).offset == c_layout["F"][(cname, fname)], (cname, fname)


def test_struct_fields_complete():
    """Every field the header declares is bound (a field added to the C struct breaks this)."""
    text = "".join(open(os.path.join(INCLUDE, "xte", h + ".h")).read() for h in HEADERS)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    for cname, cls in _lib.STRUCTS.items():
        m = re.search(r"typedef struct " + cname + r"\s*\{(.*?)\}\s*" + cname + ";", text, re.S)
        assert m, cname
        body = m.group(1)
        names = []
        for decl in body.split(";"):
            decl = decl.strip()
            if not decl:
                continue
            decl = re.sub(r"\[[^\]]*\]", "", decl)
            for part in decl.split(","):
                names.append(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", part)[-1])
        assert names == [f for f, _ in cls._fields_], cname


def test_enum_values_match_c(c_layout):
    for cls in list(ENUM_PREFIX) + [_lib.Status]:
        for m in cls:
            assert c_layout["E"][_c_name(cls, m)] == m.value, _c_name(cls, m)
    for cls, n in ENUM_COUNT.items():
        assert c_layout["E"][n] == len(cls), f"{cls.__name__} lacks members of {n}"
    assert c_layout["E"]["XTE_MAX_RANK"] == _lib.MAX_RANK
    assert c_layout["E"]["XTE_INFO_MAX_GPUS"] == _lib.INFO_MAX_GPUS
    assert c_layout["E"]["XTE_MOE_MAX_EXPERTS"] == _lib.MOE_MAX_EXPERTS


def test_every_function_bound():
    text = "".join(open(os.path.join(INCLUDE, "xte", h + ".h")).read() for h in HEADERS)
    declared = set(re.findall(r"XTE_API\s+[^;(]*?\b(xte_[a-z0-9_]+)\s*\(", text))
    assert declared, "no XTE_API declarations found"
    assert declared == set(_lib._PROTOTYPES), (declared ^ set(_lib._PROTOTYPES))
    for name in declared:
        assert getattr(_lib.lib, name).argtypes is not None, name


def test_defaults_by_value():
    q = _lib.lib.xte_quant_config_default()
    assert (q.amax_epsilon, q.force_pow_2, q.saturate) == (0.0, -1, 1)
    r = _lib.lib.xte_router_config_default()
    assert (r.topk, r.score_function, r.use_pre_softmax, r.scaling_factor) == (1, 0, 0, 1.0)
    a = _lib.lib.xte_attention_config_default()
    assert (a.window_left, a.window_right, a.softmax_scale) == (-1, -1, 0.0)

    p = _lib.lib.xte_permute_config_default()
    assert (p.num_out_tokens, p.align) == (-1, 1)


CONFIGS = [_lib.QuantConfig, _lib.GemmConfig, _lib.RouterConfig, _lib.PermuteConfig,
           _lib.AttentionConfig, _lib.EpConfig]


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_config_struct_size(cls):
    """The config ABI rule (docs/api.md): every config starts with struct_size, which the Python
    mirror sets on construction and the C default sets too."""
    assert cls._fields_[0] == ("struct_size", ctypes.c_size_t)
    assert cls().struct_size == ctypes.sizeof(cls)
    assert cls(struct_size=8).struct_size == 8  # an explicit size is kept
    name = {"QuantConfig": "quant", "GemmConfig": "gemm", "RouterConfig": "router",
            "PermuteConfig": "permute", "AttentionConfig": "attention", "EpConfig": "ep"}
    d = getattr(_lib.lib, f"xte_{name[cls.__name__]}_config_default")()
    assert d.struct_size == ctypes.sizeof(cls)


def test_config_bad_struct_size_refused():
    idx = np.array([[0, 1], [1, 2], [3, 0]], np.int64)
    t_idx = _tensor.view(idx, "topk_idx")
    routing = _lib.MoeRouting(topk_idx=t_idx.ptr, num_experts=4)
    rows = ctypes.c_int64(-5)
    for size in (0, ctypes.sizeof(_lib.PermuteConfig) + 8):
        cfg = _lib.PermuteConfig(num_out_tokens=-1, align=1)
        cfg.struct_size = size  # (construction would set 0 to the size)
        with pytest.raises(xte.XteError) as e:
            _lib.call("xte_moe_permute_rows", ctypes.byref(routing), ctypes.byref(cfg),
                      ctypes.byref(rows), None)
        assert e.value.status == _lib.Status.INVALID_ARGUMENT
        assert "config->struct_size" in e.value.message
        assert rows.value == -5  # nothing written on error
    cfg = _lib.PermuteConfig(num_out_tokens=-1, align=1)
    _lib.call("xte_moe_permute_rows", ctypes.byref(routing), ctypes.byref(cfg),
              ctypes.byref(rows), None)
    assert rows.value == 6


def test_version_and_info():
    v = _lib.version()
    assert xte.__version__ == f"{v // 10000}.{v // 100 % 100}.{v % 100}"
    info = _lib.BackendInfo()
    _lib.check(_lib.lib.xte_get_backend_info(ctypes.byref(info)))
    assert info.cpu_threads >= 1 and info.cpu_name


# ------------------------------------------------------------------------------- errors

EXPECTED_CLASSES = {
    1: (ValueError,), 2: (ValueError,), 3: (TypeError,), 4: (ValueError, xte.XteShapeError),
    5: (ValueError,), 6: (ValueError,), 7: (NotImplementedError,), 8: (RuntimeError,),
    9: (RuntimeError,), 10: (MemoryError,), 11: (RuntimeError,),
}


@pytest.mark.parametrize("status", sorted(EXPECTED_CLASSES))
def test_status_maps_to_exception(status):
    cls = _lib.exception_for(status)
    assert issubclass(cls, xte.XteError)
    for base in EXPECTED_CLASSES[status]:
        assert issubclass(cls, base)


def test_error_carries_last_error_message():
    x = np.zeros((4, 8), np.float32)
    out = np.full((4, 8), 7, np.uint8).view(np.dtype("uint8"))
    t_in = _tensor.view(x, "input")
    t_out = _tensor.view(out, "out")  # uint8 is not a cast target
    with pytest.raises(xte.XteDTypeError) as e:
        _lib.call("xte_cast", t_in.ptr, t_out.ptr, 1, _tensor.stream_of(t_in, t_out))
    assert e.value.status == _lib.Status.DTYPE
    assert "out" in e.value.message and e.value.function == "xte_cast"
    assert (out == 7).all()  # nothing written on error


# ------------------------------------------------------------------------------- views


def test_numpy_view_zero_copy_and_ld():
    a = np.arange(6 * 10, dtype=np.float32).reshape(6, 10)
    v = _tensor.view(a[:, :7], "x")
    assert v.t.data == a.ctypes.data and v.t.ld == 10 and tuple(v.t.shape[:2]) == (6, 7)
    assert v.t.rank == 2 and v.t.dtype == _lib.DType.FP32
    v = _tensor.view(a, "x")
    assert v.t.ld == 0
    b = np.zeros((3, 4, 5), np.float32)
    v = _tensor.view(b, "x")
    assert v.t.rank == 3 and v.t.ld == 0


@pytest.mark.parametrize("bad", ["transpose", "step", "outer", "negative"])
def test_layouts_xte_cannot_take_raise(bad):
    a = np.zeros((6, 8, 4), np.float32)
    x = {"transpose": a[0].T, "step": a[0][:, ::2], "outer": a[:, :3, :],
         "negative": a[0][::-1]}[bad]
    with pytest.raises(xte.XteLayoutError, match="weights"):
        _tensor.view(x, "weights")


def test_ml_dtypes_and_read_only():
    import ml_dtypes
    for name, d in [("bfloat16", _lib.DType.BF16), ("float8_e4m3fn", _lib.DType.E4M3),
                    ("float8_e5m2", _lib.DType.E5M2), ("float8_e8m0fnu", _lib.DType.E8M0)]:
        x = np.zeros((2, 3), getattr(ml_dtypes, name))
        assert _tensor.view(x, "x").t.dtype == d
    x = np.zeros(4, np.float32)
    x.setflags(write=False)
    _tensor.view(x, "x")
    with pytest.raises(xte.XteLayoutError, match="read-only"):
        _tensor.view(x, "out", writable=True)
    with pytest.raises(xte.XteDTypeError, match="x"):
        _tensor.view(np.zeros(3, np.complex64), "x")
    with pytest.raises(xte.XteDTypeError, match="x"):
        _tensor.view(np.zeros(3, np.float32), "x", dtypes=(_lib.DType.BF16,))


class _DLPackOnly:
    """A producer that exposes only the DLPack protocol (like a JAX / CuPy / TVM array)."""

    def __init__(self, inner):
        self.inner = inner

    def __dlpack__(self, **kw):
        return self.inner.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.inner.__dlpack_device__()


def test_dlpack_producer_zero_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = _tensor.view(_DLPackOnly(a), "x")
    assert v.fw == "dlpack" and v.t.data == a.ctypes.data and tuple(v.t.shape[:2]) == (3, 4)
    out = _tensor.empty(v, (3, 4), _lib.DType.FP32)
    assert isinstance(out, np.ndarray)
    del v  # the capsule's deleter runs; the producer's array stays valid
    assert a[2, 3] == 11


def test_torch_view_and_dlpack():
    torch = pytest.importorskip("torch")
    t = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    v = _tensor.view(t[:, 1:4], "x")
    assert v.t.data == t.data_ptr() + 4 and v.t.ld == 5 and v.fw == "torch"
    with pytest.raises(xte.XteLayoutError, match="x"):
        _tensor.view(t.t(), "x")
    for dt, code in [(torch.bfloat16, _lib.DType.BF16), (torch.float8_e4m3fn, _lib.DType.E4M3),
                     (torch.float8_e5m2, _lib.DType.E5M2)]:
        x = torch.zeros(2, 8, dtype=dt)
        assert _tensor.view(x, "x").t.dtype == code
        d = _tensor.view(_DLPackOnly(x), "x")  # DLPack codes for bf16 / fp8
        assert d.t.dtype == code and d.t.data == x.data_ptr()
    if hasattr(torch, "float8_e8m0fnu"):
        x = torch.zeros(3, dtype=torch.float8_e8m0fnu)
        assert _tensor.view(_DLPackOnly(x), "x").t.dtype == _lib.DType.E8M0
    o = _tensor.empty(_tensor.view(t, "x"), (2, 3), _lib.DType.BF16)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.bfloat16


def test_devices_must_agree():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the cross-device check needs one")
    a = _tensor.view(torch.zeros(2), "a")
    b = _tensor.view(torch.zeros(2, device="cuda"), "b")
    with pytest.raises(xte.XteValueError, match="b"):
        _tensor.stream_of(a, b)



def test_packed_structs_equal_field_by_field():
    """The hot path packs xte_tensor / xte_qtensor as bytes: the same bytes as ctypes fields."""
    from xte import _qtensor
    a = np.zeros((3, 10), np.float32)
    v = _tensor.view(a[:, :7], "a")
    t = _lib.Tensor()
    t.data, t.dtype, t.rank, t.ld = a.ctypes.data, _lib.DType.FP32, 2, 10
    t.shape[0], t.shape[1] = 3, 7
    assert bytes(v.t) == bytes(t)
    q = _qtensor.qpack_rowwise(0x1000, 3, 5, 7, 0x2000, 0, 11, 13, 2, 1, 3)
    ref = _lib.QTensor()
    ref.rowwise.data, ref.rowwise.dtype, ref.rowwise.rank = 0x1000, 3, 2
    ref.rowwise.shape[0], ref.rowwise.shape[1] = 5, 7
    s = ref.rowwise_scale_inv
    s.data, s.dtype, s.rows, s.cols, s.layout = 0x2000, 0, 11, 13, 2
    ref.scaling_mode, ref.recipe = 1, 3
    assert bytes(q) == bytes(ref)
    # qview with every member present
    data = np.zeros((4, 8), xte._tensor._np_dtype(_lib.DType.E4M3))
    cdata = np.zeros((8, 4), xte._tensor._np_dtype(_lib.DType.E4M3))
    sc, csc = np.zeros((4, 1), np.float32), np.zeros((2, 3, 1), np.float32)
    amax, scale = np.zeros(1, np.float32), np.zeros(1, np.float32)
    qt = xte.QuantizedTensor(data, sc, scaling_mode="1x128", recipe="te_current",
                             layout="te_gemm", columnwise_data=cdata, columnwise_scale_inv=csc,
                             columnwise_layout="compact", amax=amax, scale=scale)
    got, _ = _qtensor.qview(qt, "q")
    ref = _lib.QTensor()
    ref.rowwise = _tensor.view(data, "d").t
    ref.columnwise = _tensor.view(cdata, "c").t
    for dst, arr, rows, cols, lay in ((ref.rowwise_scale_inv, sc, 4, 1, 1),
                                      (ref.columnwise_scale_inv, csc, 6, 1, 0)):
        dst.data, dst.dtype, dst.rows, dst.cols, dst.layout = arr.ctypes.data, 0, rows, cols, lay
    ref.scaling_mode, ref.recipe = 1, 0
    ref.amax = ctypes.cast(amax.ctypes.data, ctypes.POINTER(ctypes.c_float))
    ref.scale = ctypes.cast(scale.ctypes.data, ctypes.POINTER(ctypes.c_float))
    assert bytes(got) == bytes(ref)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

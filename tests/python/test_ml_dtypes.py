"""External oracle: xte_cast (E8M0 both ways included), TE's per-tensor current scaling and the
TE / DeepGEMM block recipes of libxte, through ctypes, against ml_dtypes (float8_e4m3fn,
float8_e5m2, bfloat16, float8_e8m0fnu) and numpy re-statements of docs/numerics.md
(sections 3-4).

ml_dtypes does not saturate (465 -> NaN, inf -> NaN in e4m3fn), so the saturating expectations
clamp to +-448 / +-57344 before converting. NaN results are compared as NaN.
The library is the file named by XTE_LIBRARY (set by tests/cmake/python.cmake)."""

import ctypes
import os

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

E4M3 = ml_dtypes.float8_e4m3fn
E5M2 = ml_dtypes.float8_e5m2
BF16 = ml_dtypes.bfloat16
E8M0 = ml_dtypes.float8_e8m0fnu

# xte_dtype
DT_FP32, DT_FP16, DT_BF16, DT_E4M3, DT_E5M2, DT_E8M0 = 0, 1, 2, 3, 4, 5
NP_OF_DT = {DT_FP32: np.float32, DT_FP16: np.float16, DT_BF16: BF16, DT_E4M3: E4M3,
            DT_E5M2: E5M2, DT_E8M0: E8M0}
# xte_scaling_mode, xte_recipe, xte_scale_layout
PER_TENSOR, BLOCK_1x128, BLOCK_128x128 = 0, 1, 2
TE_CURRENT, TE_BLOCK, DEEPGEMM, DEEPGEMM_UE8M0, MX_TE = 0, 2, 3, 4, 6
MXFP8_1x32 = 3
COMPACT = 0
MAX_RANK = 8


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rank", ctypes.c_int32),
                ("shape", ctypes.c_int64 * MAX_RANK), ("ld", ctypes.c_int64)]


class ScaleTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("rows", ctypes.c_int64),
                ("cols", ctypes.c_int64), ("layout", ctypes.c_int)]


class QTensor(ctypes.Structure):
    _fields_ = [("rowwise", Tensor), ("rowwise_scale_inv", ScaleTensor),
                ("columnwise", Tensor), ("columnwise_scale_inv", ScaleTensor),
                ("scaling_mode", ctypes.c_int), ("recipe", ctypes.c_int),
                ("amax", ctypes.POINTER(ctypes.c_float)),
                ("scale", ctypes.POINTER(ctypes.c_float))]


class QuantConfig(ctypes.Structure):
    # struct_size: sizeof(xte_quant_config) (the config ABI rule, docs/api.md)
    _fields_ = [("struct_size", ctypes.c_size_t), ("amax_epsilon", ctypes.c_float), ("force_pow_2", ctypes.c_int),
                ("saturate", ctypes.c_int)]


@pytest.fixture(scope="module")
def lib():
    path = os.environ.get("XTE_LIBRARY")
    assert path, "XTE_LIBRARY must name the built libxte.so"
    so = ctypes.CDLL(path)
    so.xte_cast.argtypes = [ctypes.POINTER(Tensor), ctypes.POINTER(Tensor), ctypes.c_int,
                            ctypes.c_void_p]
    so.xte_cast.restype = ctypes.c_int
    so.xte_quantize.argtypes = [ctypes.POINTER(Tensor), ctypes.POINTER(QTensor),
                                ctypes.POINTER(QuantConfig), ctypes.c_void_p]
    so.xte_quantize.restype = ctypes.c_int
    so.xte_quantize_scale_shape.argtypes = [ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                            ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                            ctypes.POINTER(ctypes.c_int64),
                                            ctypes.POINTER(ctypes.c_int64)]
    so.xte_quantize_scale_shape.restype = ctypes.c_int
    so.xte_last_error.restype = ctypes.c_char_p
    so.xte_version.restype = ctypes.c_int
    return so


def tensor(arr, dtype):
    t = Tensor()
    assert arr.flags["C_CONTIGUOUS"]
    t.data = arr.ctypes.data
    t.dtype = dtype
    t.rank = arr.ndim
    for i, n in enumerate(arr.shape):
        t.shape[i] = n
    t.ld = 0
    return t


def cast(lib, x, in_dt, out_dt, saturate):
    out = np.empty(x.shape, dtype=NP_OF_DT[out_dt])
    st = lib.xte_cast(ctypes.byref(tensor(x, in_dt)), ctypes.byref(tensor(out, out_dt)),
                      saturate, None)
    assert st == 0, lib.xte_last_error().decode()
    return out


def expect_fp8(x32, np_dt, saturate):
    """ml_dtypes conversion of fp32 values, clamped first when saturating."""
    if saturate:
        lim = float(ml_dtypes.finfo(np_dt).max)
        x32 = np.clip(x32, -lim, lim)  # NaN stays NaN; +-inf -> +-max
    return x32.astype(np_dt)


def assert_same(got, want, what):
    """Bitwise equality, NaN compared as NaN."""
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    nan_w = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan_w), f"{what}: NaN positions differ"
    gb = got.view(np.uint8 if got.itemsize == 1 else np.uint16 if got.itemsize == 2 else np.uint32)
    wb = want.view(gb.dtype)
    bad = np.nonzero((gb != wb) & ~nan_w)[0]
    assert bad.size == 0, (
        f"{what}: {bad.size} differ, first at {bad[0]}: got 0x{int(gb[bad[0]]):X}, "
        f"want 0x{int(wb[bad[0]]):X}")


def test_library_loads(lib):
    assert lib.xte_version() > 0


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("out_dt", [DT_E4M3, DT_E5M2])
def test_all_bf16_to_fp8(lib, out_dt, saturate):
    x = np.arange(65536, dtype=np.uint16).view(BF16)
    got = cast(lib, x, DT_BF16, out_dt, saturate)
    want = expect_fp8(x.astype(np.float32), NP_OF_DT[out_dt], saturate)
    assert_same(got, want, f"bf16 -> {NP_OF_DT[out_dt].__name__} sat {saturate}")


@pytest.mark.parametrize("out_dt", [DT_FP32, DT_FP16])
def test_all_bf16_to_wider(lib, out_dt):
    x = np.arange(65536, dtype=np.uint16).view(BF16)
    got = cast(lib, x, DT_BF16, out_dt, 1)
    assert_same(got, x.astype(NP_OF_DT[out_dt]), f"bf16 -> {NP_OF_DT[out_dt].__name__}")


@pytest.fixture(scope="module")
def random_f32():
    rng = np.random.default_rng(20240611)
    n = 1_000_000
    bits = rng.integers(0, 2**32, size=n // 2, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # log-uniform magnitudes over the fp8 ranges, with signs
    mags = np.exp2(rng.uniform(-20.0, 17.0, size=n - n // 2)).astype(np.float32)
    mags *= np.where(rng.integers(0, 2, size=mags.size) == 1, -1, 1).astype(np.float32)
    x = np.concatenate([bits, mags])
    x[:8] = [0.0, -0.0, 448.0, 464.0, 465.0, 57344.0, 61440.0, np.inf]
    return x


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("out_dt", [DT_E4M3, DT_E5M2])
def test_random_f32_to_fp8(lib, random_f32, out_dt, saturate):
    got = cast(lib, random_f32, DT_FP32, out_dt, saturate)
    want = expect_fp8(random_f32, NP_OF_DT[out_dt], saturate)
    assert_same(got, want, f"fp32 -> {NP_OF_DT[out_dt].__name__} sat {saturate}")


@pytest.mark.parametrize("out_dt", [DT_BF16, DT_FP16])
def test_random_f32_to_16bit(lib, random_f32, out_dt):
    got = cast(lib, random_f32, DT_FP32, out_dt, 1)
    assert_same(got, random_f32.astype(NP_OF_DT[out_dt]), f"fp32 -> {NP_OF_DT[out_dt].__name__}")


@pytest.mark.parametrize("in_dt", [DT_E4M3, DT_E5M2])
def test_all_fp8_decode(lib, in_dt):
    x = np.arange(256, dtype=np.uint8).view(NP_OF_DT[in_dt])
    got = cast(lib, x, in_dt, DT_FP32, 1)
    assert_same(got, x.astype(np.float32), f"{NP_OF_DT[in_dt].__name__} -> fp32")


# ------------------------------------------------------------------ E8M0

def test_all_e8m0_decode(lib):
    """Every E8M0 code to fp32 / bf16 / fp16 as ml_dtypes decodes it (2^(e-127), 0xFF NaN)."""
    x = np.arange(256, dtype=np.uint8).view(E8M0)
    for out_dt in (DT_FP32, DT_BF16, DT_FP16):
        got = cast(lib, x, DT_E8M0, out_dt, 1)
        assert_same(got, x.astype(np.float32).astype(NP_OF_DT[out_dt]),
                    f"e8m0 -> {NP_OF_DT[out_dt].__name__}")


def expect_e8m0(x32, saturate):
    """ml_dtypes' float8_e8m0fnu, with saturation: +inf and finite values past 2^127 -> 2^127."""
    want = x32.astype(E8M0).view(np.uint8).copy()
    if saturate:
        over = (x32 >= np.float32(1.5 * 2.0**127)) & ~np.isnan(x32)  # +inf included
        want[over] = 0xFE
    return want


@pytest.mark.parametrize("saturate", [0, 1])
def test_e8m0_encode(lib, random_f32, saturate):
    """fp32 and every bf16 to E8M0 against ml_dtypes: the random values, every exponent with
    the significands around the ties, every fp32 subnormal, zeros, negatives, inf, NaN."""
    ex = np.arange(256, dtype=np.uint32)
    mants = np.array([0, 1, 0x3FFFFF, 0x400000, 0x400001, 0x5FFFFF, 0x600000, 0x600001,
                      0x7FFFFF], dtype=np.uint32)
    edges = ((ex[:, None] << 23) | mants[None, :]).ravel()
    bits = np.concatenate([edges, edges | np.uint32(0x80000000),
                           np.arange(0, 1 << 23, dtype=np.uint32)])
    x = np.concatenate([random_f32, bits.view(np.float32),
                        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan],
                                 dtype=np.float32)])
    got = cast(lib, x, DT_FP32, DT_E8M0, saturate)
    np.testing.assert_array_equal(got.view(np.uint8), expect_e8m0(x, saturate),
                                  f"fp32 -> e8m0 sat {saturate}")
    xb = np.arange(65536, dtype=np.uint16).view(BF16)
    got = cast(lib, xb, DT_BF16, DT_E8M0, saturate)
    np.testing.assert_array_equal(got.view(np.uint8), expect_e8m0(xb.astype(np.float32), saturate),
                                  f"bf16 -> e8m0 sat {saturate}")


# ------------------------------------------------------------------ per-tensor current scaling

def xte_quantize_current(lib, x, in_dt, force_pow_2):
    """TE_CURRENT per-tensor quantize of x to e4m3 (rowwise only): codes, scale_inv, scale."""
    m, k = x.shape
    q = QTensor()
    rq = np.zeros((m, k), dtype=E4M3)
    s = np.zeros((1, 1), dtype=np.float32)
    q.rowwise = tensor(rq, DT_E4M3)
    q.rowwise_scale_inv = ScaleTensor(s.ctypes.data, DT_FP32, 1, 1, COMPACT)
    q.scaling_mode, q.recipe = PER_TENSOR, TE_CURRENT
    scale = ctypes.c_float(-1.0)
    q.scale = ctypes.pointer(scale)
    cfg = QuantConfig(ctypes.sizeof(QuantConfig), 0.0, force_pow_2, 1)
    st = lib.xte_quantize(ctypes.byref(tensor(x, in_dt)), ctypes.byref(q), ctypes.byref(cfg), None)
    assert st == 0, lib.xte_last_error().decode()
    return rq, s[0, 0], np.float32(scale.value)


@pytest.mark.parametrize("force_pow_2", [-1, 0, 1])
@pytest.mark.parametrize("in_dt", [DT_FP32, DT_BF16, DT_FP16])
def test_current_scaling(lib, in_dt, force_pow_2):
    """TE's current scaling: FLT_MAX when 448 / amax overflows, for every input dtype (bf16's tiny
    amax included); power-of-two scales only when asked (-1: TE's default, off)."""
    for tiny in (np.float32(2.0**-133), np.float32(2.0**-149), np.float32(2.0**-120 * 1.75),
                 np.float32(0.0), np.float32(3.0)):
        x = np.full((2, 40), tiny, dtype=np.float32)
        x[1, ::2] = -tiny
        x = x.astype(NP_OF_DT[in_dt])
        x32 = x.astype(np.float32)
        rq, sinv, scale = xte_quantize_current(lib, x, in_dt, force_pow_2)
        want, want_inv = te_scale(np.array([np.fmax.reduce(np.abs(x32).ravel())]), 448.0,
                                  force_pow_2=force_pow_2 == 1)
        assert scale.view(np.uint32) == want[0].view(np.uint32), (tiny, scale, want[0])
        assert sinv.view(np.uint32) == want_inv[0].view(np.uint32), (tiny, sinv, want_inv[0])
        assert_same(rq.ravel(), expect_fp8((x32 * want[0]).astype(np.float32), E4M3, True).ravel(),
                    f"current scaling codes, amax {tiny}")


# ------------------------------------------------------------------ block recipes

def block_amax(x, bh, bw):
    """max |x| over bh x bw blocks, NaN never winning (fmax), in fp32."""
    m, k = x.shape
    gr, gc = -(-m // bh), -(-k // bw)
    pad = np.zeros((gr * bh, gc * bw), dtype=np.float32)
    pad[:m, :k] = np.abs(x)
    blocks = pad.reshape(gr, bh, gc, bw)
    return np.fmax.reduce(np.fmax.reduce(blocks, axis=3), axis=1).astype(np.float32)


def te_scale(amax, fmax, force_pow_2=True, in_max=np.finfo(np.float32).max):
    amax = amax.astype(np.float32)
    with np.errstate(divide="ignore", over="ignore"):
        scale = np.float32(fmax) / amax
    scale = np.where(np.isinf(scale), np.float32(in_max), scale).astype(np.float32)
    if force_pow_2:
        scale = (scale.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    degenerate = (amax == 0) | np.isinf(amax) | np.isnan(amax)
    scale = np.where(degenerate, np.float32(1.0), scale).astype(np.float32)
    return scale, (np.float32(1.0) / scale).astype(np.float32)


def deepgemm_scale(amax, fmax, ue8m0):
    sf = (np.maximum(amax, np.float32(1e-4)) / np.float32(fmax)).astype(np.float32)
    if ue8m0:
        mant, ex = np.frexp(sf)  # sf = mant * 2^ex, mant in [0.5, 1)
        up = np.where(mant == 0.5, sf, np.ldexp(np.float32(1.0), ex))
        sf = np.where(np.isfinite(sf), up, sf).astype(np.float32)  # inf stays inf
    return (np.float32(1.0) / sf).astype(np.float32), sf


def expand(grid, bh, bw, shape):
    return np.repeat(np.repeat(grid, bh, axis=0), bw, axis=1)[:shape[0], :shape[1]]


def numpy_quantize(x32, recipe, bh, bw, np_dt):
    fmax = float(ml_dtypes.finfo(np_dt).max)
    amax = block_amax(x32, bh, bw)
    if recipe == TE_BLOCK:
        scale, sinv = te_scale(amax, fmax)
    else:
        scale, sinv = deepgemm_scale(amax, fmax, recipe == DEEPGEMM_UE8M0)
    y = (x32 * expand(scale, bh, bw, x32.shape)).astype(np.float32)
    return expect_fp8(y, np_dt, True), sinv


def xte_quantize(lib, x, in_dt, recipe, mode, out_dt):
    m, k = x.shape
    q = QTensor()
    rq = np.zeros((m, k), dtype=NP_OF_DT[out_dt])
    cq = np.zeros((k, m), dtype=NP_OF_DT[out_dt])
    scales = []
    for col, data in ((0, rq), (1, cq)):
        r, c = ctypes.c_int64(), ctypes.c_int64()
        assert lib.xte_quantize_scale_shape(m, k, mode, recipe, COMPACT, col, ctypes.byref(r),
                                            ctypes.byref(c)) == 0
        s = np.zeros((r.value, c.value), dtype=np.float32)
        st = ScaleTensor(s.ctypes.data, DT_FP32, r.value, c.value, COMPACT)
        if col:
            q.columnwise, q.columnwise_scale_inv = tensor(data, out_dt), st
        else:
            q.rowwise, q.rowwise_scale_inv = tensor(data, out_dt), st
        scales.append(s)
    q.scaling_mode, q.recipe = mode, recipe
    amax = ctypes.c_float(-1.0)
    q.amax = ctypes.pointer(amax)
    cfg = QuantConfig(ctypes.sizeof(QuantConfig), 0.0, 1, 1)
    st = lib.xte_quantize(ctypes.byref(tensor(x, in_dt)), ctypes.byref(q), ctypes.byref(cfg), None)
    assert st == 0, lib.xte_last_error().decode()
    return rq, scales[0], cq, scales[1], amax.value


def recipe_input(shape, in_dt, seed):
    rng = np.random.default_rng(seed)
    m, k = shape
    x = rng.standard_normal((m, k)).astype(np.float32)
    # per-32-row / per-64-column magnitudes spanning many binades
    x *= np.exp2(rng.integers(-24, 24, size=(-(-m // 32), -(-k // 64)))).astype(np.float32).repeat(
        32, axis=0).repeat(64, axis=1)[:m, :k]
    x[: min(m, 5), : min(k, 128)] = 0.0  # an all-zero block
    x[-1, -1] = np.nan
    if m > 2 and k > 2:
        x[1, 2] = -np.inf
    return x.astype(NP_OF_DT[in_dt])


@pytest.mark.parametrize("shape", [(256, 384), (130, 257)])
@pytest.mark.parametrize("in_dt", [DT_FP32, DT_BF16])
@pytest.mark.parametrize("out_dt", [DT_E4M3, DT_E5M2])
@pytest.mark.parametrize("mode", [BLOCK_1x128, BLOCK_128x128])
@pytest.mark.parametrize("recipe", [TE_BLOCK, DEEPGEMM, DEEPGEMM_UE8M0])
def test_block_recipes(lib, recipe, mode, out_dt, in_dt, shape):
    x = recipe_input(shape, in_dt, seed=recipe * 1000 + mode * 100 + out_dt * 10 + in_dt)
    x32 = x.astype(np.float32)
    np_dt = NP_OF_DT[out_dt]
    rq, rs, cq, cs, amax = xte_quantize(lib, x, in_dt, recipe, mode, out_dt)
    bh, bw = (1, 128) if mode == BLOCK_1x128 else (128, 128)
    want_q, want_s = numpy_quantize(x32, recipe, bh, bw, np_dt)
    assert_same(rq.ravel(), want_q.ravel(), "rowwise data")
    np.testing.assert_array_equal(rs.view(np.uint32), want_s.view(np.uint32), "rowwise scale_inv")
    # the columnwise copy: the transpose, quantized along M
    want_q, want_s = numpy_quantize(np.ascontiguousarray(x32.T), recipe, bh, bw, np_dt)
    assert_same(cq.ravel(), want_q.ravel(), "columnwise data")
    np.testing.assert_array_equal(cs.view(np.uint32), want_s.view(np.uint32),
                                  "columnwise scale_inv")
    assert np.float32(amax) == np.fmax.reduce(np.abs(x32).ravel())


def test_mx_te_scales_decode_with_e8m0(lib):
    """MX_TE E8M0 scales, decoded by ml_dtypes float8_e8m0fnu: the smallest power of two at
    or above amax * fp32(1/448) (the ceil rule)."""
    rng = np.random.default_rng(7)
    m, k = 64, 256
    x = (rng.standard_normal((m, k)) * np.exp2(rng.integers(-30, 30, size=(m, 1)))).astype(
        np.float32)
    q = QTensor()
    rq = np.zeros((m, k), dtype=E4M3)
    s = np.zeros((m, k // 32), dtype=np.uint8)
    q.rowwise = tensor(rq, DT_E4M3)
    q.rowwise_scale_inv = ScaleTensor(s.ctypes.data, DT_E8M0, m, k // 32, COMPACT)
    q.scaling_mode, q.recipe = MXFP8_1x32, MX_TE
    assert lib.xte_quantize(ctypes.byref(tensor(x, DT_FP32)), ctypes.byref(q), None, None) == 0
    v = (block_amax(x, 1, 32) * np.float32(1.0 / 448.0)).astype(np.float64)
    dec = s.view(E8M0).astype(np.float64)
    assert np.all(dec >= v) and np.all(dec / 2 < v)
    # elements: x * 2^(127 - e) = x / decoded scale, saturated
    want = expect_fp8((x / expand(dec, 1, 32, x.shape)).astype(np.float32), E4M3, True)
    assert_same(rq.ravel(), want.ravel(), "MX_TE elements")

"""xte.transformer_engine (TransformerEngine's FP8 modules, recipes, autocast and quantizers).

Oracles, written here independently of xte:
- np_quant: TE Float8BlockScaling / per-tensor current scaling in NumPy + ml_dtypes, from
  docs/numerics.md section 4 (recipes 1 and 6): amax per block (over the elements present),
  amax < eps -> eps, amax 0 / inf -> scale 1, else fp8_max / amax in fp32 (inf -> the input
  dtype's max for the block recipe, FLT_MAX for current scaling), power of two by masking the
  mantissa, scale_inv = 1 / scale, q = fp8_RNE(saturate(x * scale)); then TE's GEMM-ready scale
  layout (section 5, TE_GEMM): 1x128 grids transposed to [ceil(K/128), roundup(M, 4)], 128x128
  grids [ceil(M/128), roundup(ceil(K/128), 4)], zero padding. Quantizer bytes must be equal.
- The modules: torch fp64 products of the oracle's dequantized operands. Bound (the GEMM
  contract, docs/numerics.md section 6: each 128-element block partial rounded once to fp32,
  times fp32(sa * sb) (exact for power-of-two scales, one rounding otherwise), one fmaf per
  block, then bias in fp32 and the rounding to the output dtype), elementwise, nb = number of K
  blocks, r = 1 for power-of-two scales else 2, u = the output's unit roundoff:
      |out - ref| <= (r * nb + 2) * 2^-24 * (|A| @ |B|^T + |bias|) + u * |ref|
- GroupedLinear: each expert's weight is quantized on its own (as TE), so expert e's rows equal
  xte's Linear on expert e alone byte for byte, and the fp64 reference uses per-expert tiles;
  the experts' weights differ in magnitude by 10^4 so that one tile shared by two experts
  (the old behaviour with out_features % 128 != 0) changes the scale and leaves the bound.
Needs torch and ml_dtypes (CI installs them)."""

# ctest: no-isa-variants  (the same bytes on every ISA: docs/numerics.md section 1)

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")

import xte.nn.functional as XF  # noqa: E402
import xte.transformer_engine.pytorch as te  # noqa: E402
from xte.transformer_engine.common import recipe  # noqa: E402
from xte.transformer_engine.pytorch.constants import TE_DType  # noqa: E402

F64 = torch.float64
NPF8 = {torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn, torch.float8_e5m2: ml_dtypes.float8_e5m2}
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
DT_MAX = {torch.float32: np.finfo(np.float32).max, torch.bfloat16: np.float32(3.3895314e38),
          torch.float16: np.float32(65504.0)}
# unit roundoffs (RNE) of the outputs. fp16 outputs are the GEMM's fp32 result rounded to fp16:
# |fp16(t) - ref| <= |t - ref| + 2^-11 |t| (+ 2^-25 absolute below fp16's normal range), which
# the bound below covers with u = 2^-11 + 2^-23, one more 2^-24 |A||B| term (nb + 2 <= 2048)
# and ABS[fp16] = 2^-25.
U = {torch.float32: 2.0 ** -24, torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11 + 2.0 ** -23}
EXTRA = {torch.float32: 0, torch.bfloat16: 0, torch.float16: 1}
ABS = {torch.float32: 0.0, torch.bfloat16: 0.0, torch.float16: 2.0 ** -25}


# ----------------------------------------------------------------------------- NumPy oracle


def _scale(amax, fp8_max, eps, pow2, inf_to):
    """scale, scale_inv (fp32 arrays) of an amax array, recipe 1 / 6 steps."""
    amax = amax.astype(np.float32)
    amax = np.where(amax < np.float32(eps), np.float32(eps), amax)
    bad = (amax == 0) | np.isinf(amax)
    with np.errstate(divide="ignore", over="ignore"):
        s = np.where(bad, np.float32(1), np.float32(fp8_max) / np.where(bad, 1, amax))
    s = np.where(np.isinf(s), np.float32(inf_to), s).astype(np.float32)
    if pow2:
        s = (s.view(np.uint32) & np.uint32(0xFF800000)).view(np.float32)
    return s, (np.float32(1) / s).astype(np.float32)


def _to_np32(x):
    return x.detach().to(torch.float32).numpy()


def np_block_quant(x, br, bc, qdt, pow2, eps):
    """(uint8 data [M, K], fp32 scale_inv grid [ceil(M/br), ceil(K/bc)]) of x [M, K]."""
    xv = _to_np32(x)
    M, K = xv.shape
    gr, gc = -(-M // br), -(-K // bc)
    pad = np.zeros((gr * br, gc * bc), np.float32)
    pad[:M, :K] = np.abs(xv)
    amax = pad.reshape(gr, br, gc, bc).max(axis=(1, 3))
    s, sinv = _scale(amax, FP8_MAX[qdt], eps, pow2, DT_MAX[x.dtype])
    full = np.repeat(np.repeat(s, br, 0), bc, 1)[:M, :K]
    y = np.clip(xv * full, -FP8_MAX[qdt], FP8_MAX[qdt])   # the saturation rule
    return y.astype(NPF8[qdt]).view(np.uint8), sinv


def te_gemm_layout(grid, one_d):
    """TE's GEMM-ready scales: 1xB grids [R, GC] -> [GC, roundup(R, 4)]; 128x128 grids [GR, GC]
    -> [GR, roundup(GC, 4)]; zero padding."""
    g = grid.T if one_d else grid
    r, c = g.shape
    out = np.zeros((r, -(-c // 4) * 4), np.float32)
    out[:, :c] = g
    return out


def fq64(x, br, bc, qdt=torch.float8_e4m3fn, pow2=True, eps=0.0):
    """x fake-quantized (oracle bytes, dequantized exactly) in fp64."""
    q, sinv = np_block_quant(x, br, bc, qdt, pow2, eps)
    M, K = q.shape
    v = q.view(NPF8[qdt]).astype(np.float64)
    s = np.repeat(np.repeat(sinv.astype(np.float64), br, 0), bc, 1)[:M, :K]
    return torch.from_numpy(v * s)


def np_mx_quant(xv):
    """MXFP8 as TE (recipe 4), e4m3, 1x32 blocks along the last axis of fp32 xv [R, C]:
    (uint8 data, E8M0 bytes [R, C / 32])."""
    R, C = xv.shape
    amax = np.abs(xv).reshape(R, C // 32, 32).max(axis=2).astype(np.float32)
    v = (amax * np.float32(1.0 / 448.0)).astype(np.float32).view(np.uint32)
    e = ((v >> 23) & 0xFF) + ((v & 0x7FFFFF) != 0)
    s = np.ldexp(np.float32(1), (127 - e.astype(np.int32))).astype(np.float32)
    q = np.clip(xv * np.repeat(s, 32, 1), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return q.view(np.uint8), e.astype(np.uint8)


def np_mx_deq64(xv):
    q, e = np_mx_quant(xv)
    s = np.repeat(np.ldexp(1.0, e.astype(np.int32) - 127), 32, 1)
    return torch.from_numpy(q.view(ml_dtypes.float8_e4m3fn).astype(np.float64) * s)


def gemm_ref(A, B, nb, u, bias=None, r=1, dtype=None):
    ref = A @ B.T + (0 if bias is None else bias)
    absprod = A.abs() @ B.abs().T + (0 if bias is None else bias.abs())
    extra, absb = (EXTRA[dtype], ABS[dtype]) if dtype is not None else (0, 0.0)
    return ref, (r * nb + 2 + extra) * 2.0 ** -24 * absprod + u * ref.abs() + absb


def assert_within(out, ref, bound, what):
    err = (out.detach().to(F64) - ref).abs()
    bad = err > bound
    assert not bool(bad.any()), (f"{what}: {int(bad.sum())} elements outside the bound, worst "
                                 f"excess {float((err - bound).max()):.3g}")


def special_input(M, K, dtype, g):
    """random values over many magnitudes, a zero block, an inf, subnormals, a block whose
    fp8_max / amax overflows (amax a tiny subnormal)."""
    x = torch.randn(M, K, generator=g) * torch.exp2(torch.randint(-20, 20, (M, 1), generator=g))
    x[:, :1] *= 1e4
    if M > 2 and K > 130:
        x[1, 128:256] = 0.0
        x[2, 0] = float("inf")
        x[0, 128:256] = 1e-40 * torch.sign(torch.randn(128, generator=g))
    return x.to(dtype)


# ----------------------------------------------------------------------------- quantizers


@pytest.mark.parametrize("dim", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("qdt", [torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("pow2,eps", [(True, 0.0), (False, 0.0), (False, 0.25)])
@pytest.mark.parametrize("M,K", [(131, 300), (1, 5), (256, 128)])
def test_block_quantizer_bytes_and_layout(dim, dtype, qdt, pow2, eps, M, K):
    g = torch.Generator().manual_seed(M * 7 + K)
    x = special_input(M, K, dtype, g)
    quant = te.Float8BlockQuantizer(fp8_dtype=TE_DType[qdt], rowwise=True, columnwise=True,
                                    amax_epsilon=eps, force_pow_2_scales=pow2,
                                    block_scaling_dim=dim)
    out = quant.update_quantized(x, quant.make_empty((M, K), dtype=dtype))
    br = 1 if dim == 1 else 128
    q, s = np_block_quant(x, br, 128, qdt, pow2, eps)
    assert out._rowwise_data.dtype == torch.uint8 and out._rowwise_data.shape == (M, K)
    assert np.array_equal(out._rowwise_data.numpy(), q)
    exp = te_gemm_layout(s, dim == 1)
    assert tuple(out._rowwise_scale_inv.shape) == exp.shape == quant.get_scale_shape((M, K),
                                                                                      False)
    assert np.array_equal(out._rowwise_scale_inv.numpy(), exp)
    # columnwise: the transpose [K, M] quantized along M
    qt, st = np_block_quant(x.t().contiguous(), br, 128, qdt, pow2, eps)
    assert np.array_equal(out._columnwise_data.numpy(), qt)
    expt = te_gemm_layout(st, dim == 1)
    assert tuple(out._columnwise_scale_inv.shape) == expt.shape == quant.get_scale_shape(
        (M, K), True)
    assert np.array_equal(out._columnwise_scale_inv.numpy(), expt)
    # the call form and dequantize (fp32(q * scale_inv))
    again = quant(x)
    assert torch.equal(again._rowwise_data, out._rowwise_data)
    if dim == 2 and bool(torch.isfinite(x).all()):
        deq = fq64(x, 128, 128, qdt, pow2, eps).to(torch.float32)
        assert torch.equal(out.dequantize(dtype=torch.float32), deq)


def test_block_quantizer_rowwise_only_and_errors():
    x = torch.randn(64, 256)
    quant = te.Float8BlockQuantizer(te.DType.kFloat8E4M3, rowwise=True, columnwise=False,
                                    block_scaling_dim=1)
    out = quant(x)
    assert out._columnwise_data is None and out._columnwise_scale_inv is None
    with pytest.raises(NotImplementedError, match="FP4"):
        te.Float8BlockQuantizer(te.DType.kFloat4E2M1, rowwise=True, columnwise=False)
    with pytest.raises(RuntimeError, match="block_scaling_dim"):
        te.Float8BlockQuantizer(te.DType.kFloat8E4M3, rowwise=True, columnwise=False,
                                block_scaling_dim=3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pow2", [False, True])
def test_current_scaling_quantizer_bytes(dtype, pow2):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(70, 130, generator=g) * 37).to(dtype)
    quant = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, device="cpu",
                                             force_pow_2_scales=pow2)
    out = quant(x)
    amax = np.abs(_to_np32(x)).max(keepdims=True)
    s, sinv = _scale(amax, 448.0, 0.0, pow2, np.finfo(np.float32).max)
    q = np.clip(_to_np32(x) * s, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    assert np.array_equal(out._data.numpy(), q)
    assert np.array_equal(out._transpose.numpy(), q.T)
    assert np.array_equal(out._scale_inv.numpy().reshape(1), sinv.reshape(1))


def test_mxfp8_and_delayed_quantizers_bytes():
    """MXFP8 (recipe 4: e = E8M0_ceil(amax * fp32(1 / fp8_max)), scale 2^(127 - e)) in TE's
    padded unswizzled layouts; Float8Quantizer with the caller's scale (scale_inv = 1 / scale,
    amax = max |x|)."""
    g = torch.Generator().manual_seed(4)
    M, K = 64, 96
    x = torch.randn(M, K, generator=g) * torch.exp2(torch.randint(-30, 30, (M, 1), generator=g))
    x[3, :32] = 0.0
    x[5, 40] = 1e-42                              # a subnormal block amax
    x[7, 64:96] = 3.0e38
    out = te.MXFP8Quantizer(te.DType.kFloat8E4M3)(x)

    xv = _to_np32(x)
    q, e = np_mx_quant(xv)
    assert np.array_equal(out._rowwise_data.numpy(), q)
    exp = np.zeros((128, 4), np.uint8)
    exp[:M, :K // 32] = e
    assert np.array_equal(out._rowwise_scale_inv.numpy(), exp)
    qc, ec = np_mx_quant(np.ascontiguousarray(xv.T))        # 32x1 blocks: the same on the transpose
    assert np.array_equal(out._columnwise_data.numpy(), qc.T)
    expc = np.zeros((4, 128), np.uint8)
    expc[:M // 32, :K] = ec.T
    assert np.array_equal(out._columnwise_scale_inv.numpy(), expc)
    # delayed-scaling quantizer: the caller's scale
    amax = torch.zeros(1)
    fq = te.Float8Quantizer(scale=torch.full([1], 0.5).squeeze(), amax=amax,
                            fp8_dtype=te.DType.kFloat8E5M2)
    t = fq.update_quantized(x, fq.make_empty(x.shape, dtype=x.dtype, device=x.device))
    qd = np.clip(xv * np.float32(0.5), -57344, 57344).astype(ml_dtypes.float8_e5m2)
    assert np.array_equal(t._data.numpy(), qd.view(np.uint8))
    assert np.array_equal(t._transpose.numpy(), qd.view(np.uint8).T)
    assert float(t._scale_inv) == 2.0 and float(amax) == float(np.abs(xv).max())


def test_fp8_padding_roundtrip():
    x = torch.randn(10, 4, requires_grad=True)
    with te.autocast(enabled=True, recipe=recipe.Float8BlockScaling()):
        out, padded = te.Fp8Padding(3)(x, [3, 0, 7])   # TE's alignment 16
    assert padded == [16, 0, 16] and out.shape == (32, 4)
    assert torch.equal(out[:3], x[:3]) and torch.equal(out[16:23], x[3:])
    assert float(out.detach()[3:16].abs().sum()) == 0 and float(out.detach()[23:].abs().sum()) == 0
    back = te.Fp8Unpadding(3, 16)(out, [3, 0, 7])
    assert torch.equal(back, x)
    out.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


# ----------------------------------------------------------------------------- recipes, autocast


def test_recipe_queries_and_formats():
    b, c, d, m = (recipe.Float8BlockScaling(), recipe.Float8CurrentScaling(),
                  recipe.DelayedScaling(), recipe.MXFP8BlockScaling())
    assert b.float8_block_scaling() and not b.float8_current_scaling() and not b.delayed()
    assert c.float8_current_scaling() and c.float8_per_tensor_scaling()
    assert not c.float8_block_scaling()
    assert d.delayed() and d.float8_per_tensor_scaling() and not d.mxfp8()
    assert m.mxfp8() and not m.float8_block_scaling() and not m.nvfp4()
    assert recipe.NVFP4BlockScaling().nvfp4()
    assert recipe.Format.E4M3.value.max_fwd == 448
    assert recipe.Format.HYBRID.value.max_bwd == 57344
    assert b.fp8_format == recipe.Format.E4M3 and c.fp8_format == recipe.Format.HYBRID
    assert b.fp8_quant_fwd_weight.power_2_scale and not c.fp8_quant_fwd_inp.power_2_scale
    assert b.x_block_scaling_dim == 1 and b.w_block_scaling_dim == 2
    from xte.transformer_engine.pytorch.quantization import get_fp8_torch_dtype
    assert get_fp8_torch_dtype(c, fprop_tensor=False) == torch.float8_e5m2
    assert get_fp8_torch_dtype(b, fprop_tensor=False) == torch.float8_e4m3fn


def test_autocast_state_and_refusals():
    lin = te.Linear(128, 128, params_dtype=torch.float32)
    x = torch.randn(4, 128)
    mgr = te.FP8GlobalStateManager
    assert not mgr.is_fp8_enabled()
    with te.autocast(enabled=True, recipe=recipe.Float8BlockScaling()):
        assert mgr.is_fp8_enabled() and mgr.get_fp8_recipe().float8_block_scaling()
        with te.autocast(enabled=False):
            assert not mgr.is_fp8_enabled()
            assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))
        assert mgr.is_fp8_enabled()
    assert not mgr.is_fp8_enabled()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ctx = te.fp8_autocast(enabled=True)          # recipe None: Float8BlockScaling
    assert any(issubclass(i.category, DeprecationWarning) for i in w)
    with ctx:
        assert mgr.get_fp8_recipe().float8_block_scaling()
    for r, what in ((recipe.DelayedScaling(), "DelayedScaling"),
                    (recipe.NVFP4BlockScaling(), "FP4"), (recipe.CustomRecipe(), "Custom")):
        with pytest.raises(NotImplementedError, match=what):
            with te.autocast(enabled=True, recipe=r):
                pass
        assert not mgr.is_fp8_enabled()
    with pytest.raises(NotImplementedError, match="DelayedScaling"):
        XF.linear(x, lin.weight, None, recipe.DelayedScaling())
    with pytest.raises(NotImplementedError, match="tp_size"):
        te.Linear(128, 128, tp_size=2)
    with pytest.raises(NotImplementedError, match="fuse_wgrad_accumulation"):
        te.Linear(128, 128, fuse_wgrad_accumulation=True)


# ----------------------------------------------------------------------------- Linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("pow2", [True, False])
def test_linear_fwd_bwd_against_fp64(dtype, pow2):
    g = torch.Generator().manual_seed(21)
    M, K, N = 70, 300, 136
    lin = te.Linear(K, N, bias=True, params_dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(N, K, generator=g))
        lin.bias.copy_(torch.randn(N, generator=g))
    x = (torch.randn(2, M // 2, K, generator=g) * 5).to(dtype).requires_grad_(True)
    dy = torch.randn(2, M // 2, N, generator=g).to(dtype)
    rcp = recipe.Float8BlockScaling(use_f32_scales=not pow2)
    with te.autocast(enabled=True, recipe=rcp):
        y = lin(x)
    y.backward(dy)
    assert y.dtype == dtype and y.shape == (2, M // 2, N)
    x2, dy2, W = x.detach().reshape(M, K), dy.reshape(M, N), lin.weight.detach()
    r = 1 if pow2 else 2
    ref, bnd = gemm_ref(fq64(x2, 1, 128, pow2=pow2), fq64(W, 128, 128, pow2=pow2),
                        -(-K // 128), U[dtype], lin.bias.detach().to(F64), r, dtype)
    assert_within(y.reshape(M, N), ref, bnd, "y")
    ref, bnd = gemm_ref(fq64(dy2, 1, 128, pow2=pow2),
                        fq64(W, 128, 128, pow2=pow2).T.contiguous(), -(-N // 128), U[dtype],
                        r=r, dtype=dtype)
    assert_within(x.grad.reshape(M, K), ref, bnd, "dx")
    ref, bnd = gemm_ref(fq64(dy2.t().contiguous(), 1, 128, pow2=pow2),
                        fq64(x2.t().contiguous(), 1, 128, pow2=pow2), -(-M // 128), U[dtype],
                        r=r, dtype=dtype)
    assert lin.weight.grad.dtype == dtype
    assert_within(lin.weight.grad, ref, bnd, "dW")
    assert lin.bias.grad.dtype == dtype
    assert torch.equal(lin.bias.grad, dy2.float().sum(0).to(dtype))


def test_layernorm_linear_and_other_recipes_run():
    g = torch.Generator().manual_seed(5)
    ln = te.LayerNormLinear(256, 128, return_layernorm_output=True, params_dtype=torch.bfloat16)
    x = torch.randn(16, 256, generator=g).to(torch.bfloat16).requires_grad_(True)
    with te.autocast(enabled=True, recipe=recipe.Float8BlockScaling()):
        y, ln_out = ln(x)
    y.float().sum().backward()
    ref_ln = torch.nn.functional.layer_norm(x.detach(), (256,), ln.layer_norm_weight.detach(),
                                            ln.layer_norm_bias.detach(), 1e-5)
    assert torch.equal(ln_out.detach(), ref_ln)
    assert torch.equal(y.detach(), XF.linear(ref_ln, ln.weight.detach(), ln.bias.detach(),
                                             recipe.Float8BlockScaling()))
    assert ln.layer_norm_weight.grad is not None and x.grad.shape == x.shape
    # per-tensor current scaling and MXFP8: the recipe's quantization, within the same bound
    lin = te.Linear(256, 64, bias=False, params_dtype=torch.float32)
    xf = torch.randn(32, 256, generator=g)
    with te.autocast(enabled=True, recipe=recipe.Float8CurrentScaling()):
        y = lin(xf)
    qx = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, "cpu")(xf)
    qw = te.Float8CurrentScalingQuantizer(te.DType.kFloat8E4M3, "cpu")(lin.weight.detach())
    A, B = qx.dequantize(dtype=F64), qw.dequantize(dtype=F64)
    ref, bnd = gemm_ref(A, B, 2, U[torch.float32], r=2)
    assert_within(y, ref, bnd, "y (current scaling)")
    with te.autocast(enabled=True, recipe=recipe.MXFP8BlockScaling()):
        y = lin(xf)
    ref, bnd = gemm_ref(np_mx_deq64(_to_np32(xf)), np_mx_deq64(_to_np32(lin.weight)), 256 // 32,
                        U[torch.float32])
    assert_within(y, ref, bnd, "y (MXFP8)")


# ----------------------------------------------------------------------------- GroupedLinear


def _grouped_setup(N, splits, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    E, K = len(splits), 200
    gl = te.GroupedLinear(E, K, N, bias=True, params_dtype=dtype)
    with torch.no_grad():
        for e in range(E):   # magnitudes 1, 1e4, 1e-4...: a shared tile would change scales
            getattr(gl, f"weight{e}").copy_(torch.randn(N, K, generator=g) * 10.0 ** (4 * (
                (e % 3) - (e % 3 == 2) * 3)))
            getattr(gl, f"bias{e}").copy_(torch.randn(N, generator=g))
    x = torch.randn(sum(splits), K, generator=g).to(dtype).requires_grad_(True)
    dy = torch.randn(sum(splits), N, generator=g).to(dtype)
    return gl, x, dy


@pytest.mark.parametrize("N", [96, 200, 128])
@pytest.mark.parametrize("splits", [[128, 0, 128, 40], [100, 28, 1, 70]])
def test_grouped_linear_per_expert_weights(N, splits):
    dtype = torch.float32
    gl, x, dy = _grouped_setup(N, splits, dtype, N + len(splits))
    E, K = len(splits), 200
    with te.autocast(enabled=True, recipe=recipe.Float8BlockScaling()):
        y = gl(x, torch.tensor(splits))
    # forward first (a tile shared by two experts changes y before dgrad can fail)
    offs = np.cumsum([0] + splits)
    for e in range(E):
        sl = slice(int(offs[e]), int(offs[e + 1]))
        if splits[e]:
            ye = XF.linear(x.detach()[sl], getattr(gl, f"weight{e}").detach(),
                           getattr(gl, f"bias{e}").detach(), recipe.Float8BlockScaling())
            assert torch.equal(y.detach()[sl], ye), f"forward y[{e}]"
    y.backward(dy)
    off = 0
    for e, m in enumerate(splits):
        sl = slice(off, off + m)
        off += m
        W = getattr(gl, f"weight{e}")
        if m == 0:
            assert float(W.grad.abs().max()) == 0.0
            continue
        b = getattr(gl, f"bias{e}").detach()
        # expert e alone through xte's Linear: the same bytes (each expert quantized alone)
        xe = x.detach()[sl].clone().requires_grad_(True)
        We = W.detach().clone().requires_grad_(True)
        ye = XF.linear(xe, We, b, recipe.Float8BlockScaling())
        ye.backward(dy[sl])
        assert torch.equal(y[sl], ye), f"y[{e}]"
        assert torch.equal(x.grad[sl], xe.grad), f"dx[{e}]"
        assert torch.equal(W.grad, We.grad), f"dW[{e}]"
        # and the fp64 reference with expert e's own tiles
        Wd = fq64(W.detach(), 128, 128)
        ref, bnd = gemm_ref(fq64(x.detach()[sl], 1, 128), Wd, -(-K // 128), U[dtype],
                            b.to(F64))
        assert_within(y[sl], ref, bnd, f"y[{e}]")
        ref, bnd = gemm_ref(fq64(dy[sl], 1, 128), Wd.T.contiguous(), -(-N // 128), U[dtype])
        assert_within(x.grad[sl], ref, bnd, f"dx[{e}]")
        ref, bnd = gemm_ref(fq64(dy[sl].t().contiguous(), 1, 128),
                            fq64(x.detach()[sl].t().contiguous(), 1, 128), -(-m // 128),
                            U[dtype])
        assert_within(W.grad, ref, bnd, f"dW[{e}]")
        torch.testing.assert_close(getattr(gl, f"bias{e}").grad, dy[sl].sum(0), rtol=1e-6,
                                   atol=1e-5)


def test_xte_nn_grouped_linear_per_expert_tiles():
    """xte.nn.GroupedLinear (one stacked [E, N, K] weight), N % 128 != 0: forward and dgrad per
    expert, the same bytes as each expert alone (the old [E * N, K] tiles raised in dgrad)."""
    import xte.nn as xnn
    g = torch.Generator().manual_seed(8)
    E, K, N = 3, 256, 96
    gl = xnn.GroupedLinear(E, K, N)
    with torch.no_grad():
        gl.weight.copy_(torch.randn(E, N, K, generator=g) *
                        torch.tensor([1.0, 1e4, 1e-4]).reshape(E, 1, 1))
    x = torch.randn(3 * 128, K, generator=g, requires_grad=True)
    y = gl(x, torch.tensor([128, 128, 128]))
    y.sum().backward()
    for e in range(E):
        sl = slice(128 * e, 128 * (e + 1))
        xe = x.detach()[sl].clone().requires_grad_(True)
        ye = XF.linear(xe, gl.weight.detach()[e], None)
        ye.sum().backward()
        assert torch.equal(y[sl], ye) and torch.equal(x.grad[sl], xe.grad)


def test_grouped_linear_high_precision_outside_autocast():
    gl, x, dy = _grouped_setup(64, [3, 5], torch.float32, 1)
    y = gl(x, [3, 5])
    ref = torch.cat([torch.nn.functional.linear(x[:3], gl.weight0, gl.bias0),
                     torch.nn.functional.linear(x[3:], gl.weight1, gl.bias1)])
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)


def test_torch_compile_fullgraph_modules():
    """te.Linear and te.GroupedLinear under torch.compile(fullgraph=True), the autocast inside
    the compiled function (the recipe built outside it, as TE requires): the eager bytes."""
    torch.manual_seed(2)
    lin = te.Linear(256, 128)
    gl = te.GroupedLinear(2, 128, 96, bias=False)
    rcp = recipe.Float8BlockScaling()

    def f(x):
        with te.autocast(enabled=True, recipe=rcp):
            return gl(lin(x), [128, 128])             # m_splits as TE's older list form

    x = torch.randn(256, 256, requires_grad=True)
    y0 = f(x)
    y0.sum().backward()
    g0 = x.grad.clone()
    x.grad = None
    y1 = torch.compile(f, fullgraph=True)(x)
    y1.sum().backward()
    assert torch.equal(y0, y1) and torch.equal(g0, x.grad)

"""DeepGEMM's deep_gemm.utils over xte: the contiguous-layout alignment setting, the FP8 casts
(per_token / per_channel / per_block_cast_to_fp8, with use_ue8m0, gran_k and use_packed_ue8m0),
ceil_div / align, get_tma_aligned_size and the FP4 helpers DeepGEMM's test generators import
(per_token_cast_to_fp4, transpose_packed_fp4: xte's GEMMs take no FP4 operands).

The casts are written here in torch (DeepGEMM's definition: sf = max(amax, 1e-4) / 448 per block,
rounded up to a power of two with use_ue8m0, data = e4m3(x * (1 / sf))); the 1x128 / 128x128
casts with gran_k = 128 run xte's quantize kernel (recipe DEEPGEMM), which gives the same bytes.
"""

import torch

from ..ops import quantize as _Q

__all__ = ["ceil_div", "align", "get_mk_alignment_for_contiguous_layout",
           "set_mk_alignment_for_contiguous_layout",
           "get_theoretical_mk_alignment_for_contiguous_layout",
           "get_m_alignment_for_contiguous_layout", "get_k_alignment_for_contiguous_layout",
           "get_tma_aligned_size", "ceil_to_ue8m0", "pack_ue8m0_to_int", "unpack_ue8m0_from_int",
           "per_token_cast_to_fp8", "per_channel_cast_to_fp8", "per_block_cast_to_fp8",
           "per_token_cast_to_fp4", "transpose_packed_fp4", "get_mn_major_tma_aligned_tensor",
           "transform_sf_into_required_layout"]

# DeepGEMM's legacy M / K alignment of the contiguous grouped layouts (its SM90 value and
# SM100's initial setting); xte's kernels take any alignment >= 1.
_LEGACY_ALIGNMENT = 128
_alignment = [_LEGACY_ALIGNMENT]


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def set_mk_alignment_for_contiguous_layout(new_value: int) -> None:
    """The row (M) / K alignment of the groups that the contiguous grouped GEMMs of this module
    assume (m_indices / PSUM layouts, k-grouped PSUM layouts); a positive int."""
    v = int(new_value)
    if v < 1:
        raise ValueError(f"set_mk_alignment_for_contiguous_layout: {new_value}: want >= 1")
    _alignment[0] = v


def get_mk_alignment_for_contiguous_layout() -> int:
    return _alignment[0]


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m=None) -> int:
    """DeepGEMM's choice for the SM100 feature set xte.deep_gemm.testing.get_arch_major()
    reports: block_m 224, lowered in steps of 32 (not below 32) while it still covers
    expected_m. xte's CPU kernels run any alignment at the same speed."""
    block_m = 224
    if expected_m is not None:
        while block_m > 32 and block_m - 32 >= int(expected_m):
            block_m -= 32
    return block_m


get_m_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout
get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """x rounded up to a multiple of 16 bytes' worth of elements (DeepGEMM's TMA alignment)."""
    return align(int(x), 16 // int(element_size))


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= |x| (fp32; 2^-126 .. 2^127), by the fp32 bit fields."""
    bits = x.abs().float().view(torch.int32)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (e.clamp(1, 254) << 23).view(torch.float32)


def pack_ue8m0_to_int(x: torch.Tensor) -> torch.Tensor:
    """fp32 powers of two [..., 4n] -> their UE8M0 bytes, four per int32 [..., n] (little
    endian: element 4i in the low byte)."""
    if x.dtype != torch.float32 or x.size(-1) % 4:
        raise ValueError("pack_ue8m0_to_int: want fp32 [..., 4n]")
    bits = x.contiguous().view(torch.int32)
    if bool(((bits < 0) | ((bits & 0x7FFFFF) != 0)).any()):
        raise ValueError("pack_ue8m0_to_int: values must be non-negative powers of two")
    return (bits >> 23).to(torch.uint8).view(torch.int32)


def unpack_ue8m0_from_int(packed: torch.Tensor) -> torch.Tensor:
    return (packed.contiguous().view(torch.uint8).to(torch.int32) << 23).view(torch.float32)


def _block_scales(amax, use_ue8m0, fmax=448.0):
    sf = amax.clamp(min=1e-4) / fmax
    return ceil_to_ue8m0(sf) if use_ue8m0 else sf


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128,
                          use_packed_ue8m0: bool = False):
    """[M, K] -> (e4m3 [M, K], scales fp32 [M, ceil(K / gran_k)]; with use_packed_ue8m0 the
    UE8M0 bytes packed four per int32, [M, ceil(ceil(K / gran_k) / 4)])."""
    if x.dim() != 2:
        raise ValueError("per_token_cast_to_fp8: want a 2-D tensor")
    if use_packed_ue8m0 and not use_ue8m0:
        raise ValueError("per_token_cast_to_fp8: use_packed_ue8m0 needs use_ue8m0")
    if gran_k == 128 and not use_packed_ue8m0:
        return _Q.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    m, k = x.shape
    kp = align(k, gran_k)
    xp = torch.zeros((m, kp), dtype=x.dtype, device=x.device)
    xp[:, :k] = x
    xv = xp.view(m, kp // gran_k, gran_k)
    sf = _block_scales(xv.abs().float().amax(dim=2), use_ue8m0)
    q = (xv * (1.0 / sf.unsqueeze(2))).to(torch.float8_e4m3fn).view(m, kp)[:, :k].contiguous()
    if use_packed_ue8m0:
        n = sf.size(1)
        if n % 4:
            sf = torch.cat([sf, sf.new_ones((m, 4 - n % 4))], dim=1)
        return q, pack_ue8m0_to_int(sf)
    return q, sf


def per_channel_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128):
    """[K, N] with K a multiple of gran_k -> (e4m3 [K, N], fp32 scales [K / gran_k, N]): one
    scale per gran_k rows of each column (the k-grouped GEMMs' MN-major operands)."""
    if x.dim() != 2 or x.size(0) % gran_k:
        raise ValueError(f"per_channel_cast_to_fp8: want [K, N] with K a multiple of {gran_k}")
    k, n = x.shape
    xv = x.view(k // gran_k, gran_k, n)
    sf = _block_scales(xv.abs().float().amax(dim=1), use_ue8m0)
    return (xv * (1.0 / sf.unsqueeze(1))).to(torch.float8_e4m3fn).view(k, n), sf


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128):
    """[M, K] -> (e4m3 [M, K], fp32 scales [ceil(M / gran_k), ceil(K / gran_k)]): one scale per
    gran_k x gran_k tile."""
    if x.dim() != 2:
        raise ValueError("per_block_cast_to_fp8: want a 2-D tensor")
    if gran_k == 128:
        return _Q.per_block_cast_to_fp8(x, use_ue8m0=use_ue8m0)
    m, k = x.shape
    mp, kp = align(m, gran_k), align(k, gran_k)
    xp = torch.zeros((mp, kp), dtype=x.dtype, device=x.device)
    xp[:m, :k] = x
    xv = xp.view(mp // gran_k, gran_k, kp // gran_k, gran_k)
    sf = _block_scales(xv.abs().float().amax(dim=(1, 3), keepdim=True), use_ue8m0)
    q = (xv * (1.0 / sf)).to(torch.float8_e4m3fn).view(mp, kp)[:m, :k].contiguous()
    return q, sf.view(mp // gran_k, kp // gran_k)


_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # midpoints of 0, .5, 1, 1.5, 2, 3, 4, 6


def per_token_cast_to_fp4(x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128,
                          use_packed_ue8m0: bool = False):
    """[M, K] (K even) -> (E2M1 codes packed two per int8 [M, K / 2], element 2j in the low
    nibble; scales max(amax, 1e-4) / 6 per 1 x gran_k block). A helper of DeepGEMM's tests:
    xte's GEMMs reject FP4 operands (NotImplementedError)."""
    m, k = x.shape
    if k % 2:
        raise ValueError("per_token_cast_to_fp4: K must be even")
    if use_packed_ue8m0 and not use_ue8m0:
        raise ValueError("per_token_cast_to_fp4: use_packed_ue8m0 needs use_ue8m0")
    kp = align(k, gran_k)
    xp = torch.zeros((m, kp), dtype=x.dtype, device=x.device)
    xp[:, :k] = x
    xv = xp.view(m, kp // gran_k, gran_k)
    sf = _block_scales(xv.abs().float().amax(dim=2), use_ue8m0, 6.0)
    y = (xv.float() * (1.0 / sf.unsqueeze(2))).view(m, kp)
    mag = torch.zeros(y.shape, dtype=torch.int32, device=x.device)
    for t in _E2M1_BOUNDS:
        mag += (y.abs() > t).to(torch.int32)
    code = mag | (((y < 0) & (mag != 0)).to(torch.int32) << 3)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    packed = packed[:, :k // 2].contiguous()
    if use_packed_ue8m0:
        n = sf.size(1)
        if n % 4:
            sf = torch.cat([sf, sf.new_ones((m, 4 - n % 4))], dim=1)
        return packed, pack_ue8m0_to_int(sf)
    return packed, sf


def transpose_packed_fp4(a: torch.Tensor) -> torch.Tensor:
    """Packed E2M1 [M, K / 2] (M even) -> the packed transpose [K, M / 2]."""
    if a.dtype != torch.int8 or a.dim() != 2 or a.size(0) % 2:
        raise ValueError("transpose_packed_fp4: want int8 [M, K / 2] with M even")
    u = a.view(torch.uint8).to(torch.int32)
    codes = torch.stack([u & 0xF, u >> 4], dim=-1).reshape(a.size(0), -1)  # [M, K]
    t = codes.t().contiguous()
    return (t[:, 0::2] | (t[:, 1::2] << 4)).to(torch.uint8).view(torch.int8).contiguous()


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """sf [..., MN, S] in DeepGEMM's MN-major TMA-aligned storage: the same values, column
    stride get_tma_aligned_size(MN) (a scale copy). xte reads any scale storage its GEMM
    wrappers are given; this is for code that prepares DeepGEMM's layout itself."""
    mn, s = sf.shape[-2], sf.shape[-1]
    al = get_tma_aligned_size(mn, sf.element_size())
    buf = sf.new_empty((*sf.shape[:-2], s, al))
    buf[..., :mn] = sf.transpose(-1, -2)
    return buf[..., :mn].transpose(-1, -2)


def transform_sf_into_required_layout(sf, mn, k, recipe, num_groups=None, is_sfa=None,
                                      disable_ue8m0_cast=False, psum_layout=None):
    """The scales xte's GEMMs read for DeepGEMM's sf (fp32, of an [mn, k] operand with the
    recipe's (gran_mn, gran_k)): the same values, dense row-major (a scale copy; xte needs no
    TMA alignment nor UE8M0 packing). Checks the shape as DeepGEMM does."""
    if len(recipe) == 3:
        if is_sfa is None:
            raise ValueError("transform_sf_into_required_layout: a 3-tuple recipe needs is_sfa")
        gran_mn, gran_k = (recipe[0] if is_sfa else recipe[1]), recipe[2]
    else:
        gran_mn, gran_k = recipe
    want = (ceil_div(mn, gran_mn), ceil_div(k, gran_k))
    if num_groups is not None:
        want = (int(num_groups),) + want
    if sf.dtype == torch.int32:
        want = want[:-1] + (ceil_div(want[-1], 4),)
    if tuple(sf.shape) != want:
        raise ValueError(f"transform_sf_into_required_layout: sf shape {tuple(sf.shape)}, want "
                         f"{want}")
    return sf.contiguous()

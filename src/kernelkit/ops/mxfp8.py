"""MXFP8 (OCP Microscaling Formats v1.0): quantisation to e4m3 values with one ue8m0 scale per
32 consecutive values along an axis, its inverse, and the tensor-ops talk's matmul on such data.
The quantisation kernels' shared code is `mxfp8.metal`.

Padding rule: a row whose length is not a multiple of 32 ends with a shorter block, quantised as
if padded with zeros (its scale comes from the values present); `data` keeps x's shape, `scales`
has ceil(n / 32) entries along the axis. A block holding a NaN or an infinity gets the NaN scale
(255): no scale represents it; its values dequantise to NaN.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from .. import cuda_kernel, metal_kernel
from ..arrays import aligned
from ..preconditions import Preconditions
from . import hopper

BLOCK = 32
_HEADER = (Path(__file__).with_name("mxfp8.metal")).read_text()

_QUANTIZE = """
    uint b = thread_position_in_grid.x;            // one thread a block
    uint row = b / blocks, k0 = (b % blocks) * 32, k1 = metal::min(k0 + 32, n);
    const device T* src = x + ulong(row) * n;
    float amax = 0.0f;
    bool finite = true;
    for (uint k = k0; k < k1; ++k) {
      float v = float(src[k]);
      finite = finite && metal::isfinite(v);
      amax = metal::max(amax, metal::abs(v));
    }
    int e = mx_shared_exponent(amax);
    float inverse = mx_pow2(-e);                   // exact: e in [-127, 119] for a finite amax
    for (uint k = k0; k < k1; ++k) data[ulong(row) * n + k] = mx_to_e4m3(float(src[k]) * inverse);
    scales[b] = finite ? uchar(e + 127) : uchar(0xff);
"""

_DEQUANTIZE = """
    uint i = thread_position_in_grid.x;            // one thread a value
    uint row = i / n, k = i % n;
    uchar s = scales[row * blocks + k / 32];
    float scale = s == 0xff ? metal::numeric_limits<float>::quiet_NaN()
                : s == 0 ? 0.5f * mx_pow2(-126) : mx_pow2(int(s) - 127);
    out[i] = T(mx_from_e4m3(data[i]) * scale);
"""

# The tensor-ops talk's quantized matmul: MXFP8 tensors (e4m3 data, a ue8m0 scales plane of 32 x 1
# blocks along K), each threadgroup slicing its tile of C and running matmul2d over all of K; `run`
# dequantises. B is given K-major (N x K, as weights are stored): transpose_right.
_MATMUL_HEADER = """#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace mpp::tensor_ops;
using scales_plane = tensor_blockwise<tensor_plane_scales, device metal_fp8_ue8m0_format, 32, 1>;
using mxfp8_tensor = tensor<device metal_fp8_e4m3_format, dextents<int, 2>, tensor_inline, scales_plane>;
"""
_MATMUL = """
    const uint2 tgid = threadgroup_position_in_grid.xy;
    const int M = a_shape[0], K = a_shape[1], N = b_shape[0];
    auto A = mxfp8_tensor((device metal_fp8_e4m3_format*)a, dextents<int, 2>(K, M),
                          array<int, 2>({1, K}), scales_plane(a_scales));
    auto B = mxfp8_tensor((device metal_fp8_e4m3_format*)b, dextents<int, 2>(K, N),
                          array<int, 2>({1, K}), scales_plane(b_scales));
    auto C = tensor(c, dextents<int, 2>(N, M));
    auto tA = A.slice(0, tgid.y * TILEM);
    auto tB = B.slice(0, tgid.x * TILEN);
    auto tC = C.slice(tgid.x * TILEN, tgid.y * TILEM);
    constexpr auto descriptor = matmul2d_descriptor(TILEM, TILEN, dynamic_length_v<int>, false, true);
    matmul2d<descriptor, execution_simdgroups<8>> op;
    op.run(tA, tB, tC);
"""
# (TILEM, TILEN): a threadgroup of 8 SIMD-groups computes a 128 x 64 tile of C; on Hopper, two
# warpgroups sharing B's stages, each 64 rows, a 32-element block of K a QGMMA (run_scaled in
# sm90_wgmma.h): 32 accumulators and twice 32 for the blocks' products a thread (~170
# registers; 128 x 128 spills at 255 and measured 157 TFLOP/s against 216 at 8192^3).
_TILE = (128, 64)
_THREADS = 256

# Exact bit work: no flushing of subnormals (a block of float32 subnormals has scale 2^-127 and
# values that are not zero); no contractions (mxfp8.metal's pragma).
_EXACT = {"math_mode": "safe"}
_quantize = metal_kernel(name="quantize_mxfp8", input_names=["x", "n", "blocks"],
                         output_names=["data", "scales"], source=_QUANTIZE, header=_HEADER, compile_options=_EXACT)
_dequantize = metal_kernel(name="dequantize_mxfp8", input_names=["data", "scales", "n", "blocks"],
                           output_names=["out"], source=_DEQUANTIZE, header=_HEADER, compile_options=_EXACT)


def quantize_mxfp8(x: torch.Tensor, axis: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, scales): x as MXFP8 along `axis`. data: torch.float8_e4m3fn of x's shape; scales:
    torch.uint8 ue8m0 exponents (2^(s - 127); 255 is NaN), x's shape with ceil(n / 32) along
    `axis`. float16, bfloat16 and float32 inputs."""
    pre = Preconditions("quantize_mxfp8")
    pre.tensor("x", x, dtype=(torch.float16, torch.bfloat16, torch.float32))
    axis = _axis(pre, axis, x.dim())
    moved = x.movedim(axis, -1).contiguous()
    n = moved.shape[-1]
    blocks = -(-n // BLOCK)
    rows = math.prod(moved.shape[:-1])
    data, scales = _quantize(inputs=[moved, n, blocks], template=[("T", x.dtype)],
                             output_shapes=[moved.shape, (*moved.shape[:-1], blocks)],
                             output_dtypes=[torch.uint8, torch.uint8],
                             grid=(rows * blocks, 1, 1), threadgroup=(128, 1, 1))
    return data.view(torch.float8_e4m3fn).movedim(-1, axis), scales.movedim(-1, axis)


def dequantize_mxfp8(data: torch.Tensor, scales: torch.Tensor, axis: int = -1,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values of (data, scales) from quantize_mxfp8, as `dtype`."""
    pre = Preconditions("dequantize_mxfp8")
    pre.tensor("data", data, dtype=(torch.float8_e4m3fn, torch.uint8))
    pre.tensor("scales", scales, dtype=(torch.uint8,))
    axis = _axis(pre, axis, data.dim())
    d = data.movedim(axis, -1).contiguous().view(torch.uint8)
    s = scales.movedim(axis, -1).contiguous()
    n = d.shape[-1]
    blocks = -(-n // BLOCK)
    if tuple(s.shape) != (*d.shape[:-1], blocks):
        pre.fail(f"scales has shape {tuple(scales.shape)}; expected data's shape with "
                 f"ceil({n} / {BLOCK}) = {blocks} along axis {axis}.")
    out = _dequantize(inputs=[d, s, n, blocks], template=[("T", dtype)], output_shapes=[d.shape],
                      output_dtypes=[dtype], grid=(d.numel(), 1, 1), threadgroup=(256, 1, 1))[0]
    return out.movedim(-1, axis)


# (subnormal products kept: the scale 2^-127 is a subnormal float)
_matmul = metal_kernel(name="mxfp8_matmul", input_names=["a", "a_scales", "b", "b_scales"],
                       output_names=["c"], source=_MATMUL, header=_MATMUL_HEADER,
                       compile_options={"math_mode": "relaxed"})


# Hopper: the layer's persistent GEMM, scaled (one threadgroup an SM, 128 x 128 tiles, the scales
# staged beside the operands), where its TMA copies can read the operands.
_persistent_matmul = cuda_kernel(
    name="mxfp8_matmul_sm90", input_names=["a", "a_scales", "b", "b_scales"], output_names=["c"],
    source=Path(__file__).with_name("mxfp8_matmul_sm90.cu").read_text(), header=hopper.HEADER,
    ensure_row_contiguous=False)


def _persistent(a, a_scales, b, b_scales, out_dtype) -> torch.Tensor | None:
    """The product by the persistent Hopper kernel, or None where it does not apply: TMA reads
    rows 16-byte aligned (K % 16 == 0) and writes C's (N a multiple of 16 bytes of out_dtype)."""
    dev = a.device
    if dev.type != "cuda" or hopper.sm90_sms(dev) is None:
        return None
    (M, K), N = a.shape, b.shape[0]
    if (min(M, N, K) == 0 or K % 16 or (N * out_dtype.itemsize) % 16 or max(M, N, K) >= 2**31
            or a.stride(1) != 1 or b.stride(1) != 1 or a.stride(0) % 16 or b.stride(0) % 16
            or not (aligned(a, 16) and aligned(b, 16))):
        return None
    launch = hopper.launch(dev, -(-M // 128) * -(-N // 128))
    if launch is None:
        return None
    return _persistent_matmul(inputs=[a, a_scales.contiguous(), b, b_scales.contiguous()],
                              template=[("TC", out_dtype)], output_shapes=[(M, N)],
                              output_dtypes=[out_dtype], **launch)[0]


def mxfp8_matmul(a_data: torch.Tensor, a_scales: torch.Tensor, b_data: torch.Tensor,
                 b_scales: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """dequant(a) @ dequant(b)^T for MXFP8 operands quantised along K (both K-major, as
    quantize_mxfp8(x, axis=-1) gives them): a (M, K) with scales (M, ceil(K / 32)), b (N, K)
    with scales (N, ceil(K / 32)). Products exact, sums in float32, the result in out_dtype
    (bfloat16, float16 or float32). On Hopper each 32-value block is one fp8 tensor-core product
    (QGMMA), whose adder keeps ~14 significant bits (as torch._scaled_mm's); the blocks' sums,
    times their scales, are added in float32."""
    pre = Preconditions("mxfp8_matmul")
    fp8 = (torch.float8_e4m3fn, torch.uint8)
    pre.tensor("a_data", a_data, dtype=fp8, shape=("M", "K"))
    pre.tensor("b_data", b_data, dtype=fp8, shape=("N", "K"))
    blocks = -(-pre["K"] // BLOCK)
    pre.tensor("a_scales", a_scales, dtype=(torch.uint8,), shape=("M", blocks))
    pre.tensor("b_scales", b_scales, dtype=(torch.uint8,), shape=("N", blocks))
    pre.choice("out_dtype", out_dtype, (torch.bfloat16, torch.float16, torch.float32))
    a, b = a_data.view(torch.uint8), b_data.view(torch.uint8)
    fast = _persistent(a, a_scales, b, b_scales, out_dtype)
    return fast if fast is not None else tiled_matmul(a, a_scales, b, b_scales, out_dtype)


def tiled_matmul(a, a_scales, b, b_scales, out_dtype) -> torch.Tensor:
    """mxfp8_matmul by the talk's kernel (a threadgroup a tile, matmul2d over all of K), on any
    backend; a and b as uint8."""
    (M, _), N = a.shape, b.shape[0]
    TM, TN = _TILE
    return _matmul(inputs=[a, a_scales, b, b_scales], template=_template(), output_shapes=[(M, N)],
                   output_dtypes=[out_dtype], grid=(_THREADS * -(-N // TN), -(-M // TM), 1),
                   threadgroup=(_THREADS, 1, 1))[0]


def _template() -> list:
    return [("TILEM", _TILE[0]), ("TILEN", _TILE[1])]


def _axis(pre: Preconditions, axis: int, ndim: int) -> int:
    if not isinstance(axis, int) or isinstance(axis, bool) or not -ndim <= axis < max(ndim, 1):
        pre.fail(f"axis {axis!r} is not an axis of a {ndim}-d tensor.")
    return axis % ndim


def pow2(e: torch.Tensor) -> torch.Tensor:
    """2 ** e as float64, exactly, for integer e in [-1022, 1023]: built from the exponent bits
    (torch.pow rounds on some GPUs)."""
    return ((e.to(torch.int64) + 1023) << 52).view(torch.float64)


def quantize_mxfp8_reference(x: torch.Tensor, axis: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """The OCP rules in plain torch (the tests' reference)."""
    moved = x.movedim(axis, -1).float()
    n = moved.shape[-1]
    blocks = -(-n // BLOCK)
    padded = torch.nn.functional.pad(moved, (0, blocks * BLOCK - n)).unflatten(-1, (blocks, BLOCK))
    amax = padded.abs().amax(-1)
    _, exponent = torch.frexp(amax)  # amax = m * 2^exponent, m in [0.5, 1): floor(log2) = exponent - 1
    normal = amax >= torch.finfo(torch.float32).tiny
    e = torch.where(normal, (exponent - 1 - 8).clamp(-127, 127), torch.full_like(exponent, -127))
    scaled = padded * pow2(-e).float().unsqueeze(-1)
    data = scaled.clamp(-448, 448).to(torch.float8_e4m3fn).flatten(-2)[..., :n]
    scales = torch.where(torch.isfinite(amax), e + 127, torch.full_like(e, 255)).to(torch.uint8)
    return data.movedim(-1, axis), scales.movedim(-1, axis)

"""quantize_mxfp8 / dequantize_mxfp8 against the OCP rules written in plain torch (exact bits)."""

import pytest
import torch

import kernelkit as kk
from kernelkit.ops import dequantize_mxfp8, quantize_mxfp8, quantize_mxfp8_reference
from kernelkit.ops.mxfp8 import pow2


def _spread(shape, device, dtype=torch.float32, seed=0):
    """Values over ~40 binades, blocks of very different sizes, zeros, and edge magnitudes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    x = x * torch.pow(2.0, torch.randint(-20, 20, shape, generator=g).double())
    flat = x.view(-1)
    flat[: min(40, flat.numel())] = 0  # an all-zero block
    if flat.numel() > 100:
        flat[64:96] *= 1e-40  # a block of float32 subnormals
        flat[97] = 448.0 * 2 ** 3  # exactly at the top of its block's range
    return x.to(dtype).to(device)


def _check_bits(x, axis):
    data, scales = quantize_mxfp8(x, axis)
    ref_data, ref_scales = quantize_mxfp8_reference(x, axis)
    assert data.dtype == torch.float8_e4m3fn and scales.dtype == torch.uint8
    assert data.shape == x.shape
    assert torch.equal(scales.cpu(), ref_scales.cpu())
    # blocks with the NaN scale (a NaN or an infinity in them) dequantise to NaN whatever their data
    n = x.shape[axis]
    finite = (scales != 255).movedim(axis, -1).repeat_interleave(32, -1)[..., :n].movedim(-1, axis)
    assert torch.equal(data.view(torch.uint8)[finite].cpu(), ref_data.view(torch.uint8)[finite].cpu())
    return data, scales


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape, axis", [((4, 96), -1), ((3, 70), 1), ((45, 5), 0), ((2, 33, 3), 1)])
def test_quantize_matches_the_ocp_rules_bit_for_bit(device, dtype, shape, axis):
    _check_bits(_spread(shape, device, dtype), axis)


def test_round_trip(device):
    x = _spread((8, 200), device)
    data, scales = _check_bits(x, -1)
    out = dequantize_mxfp8(data, scales)
    ref_data, ref_scales = quantize_mxfp8_reference(x)
    factor = pow2(ref_scales.int() - 127).repeat_interleave(32, -1)[..., :200]
    torch.testing.assert_close(out.double().cpu(), (ref_data.double() * factor).cpu(), rtol=0, atol=0)
    # within half a step of e4m3 (16 at the top binade, in units of the scale), but for values
    # the scale puts past 448 (saturated: the OCP scale keeps amax / X below 512)
    scaled = x.double() / factor.to(x.device)
    err = (out.double() - x.double()).abs() / factor.to(x.device)
    assert float(err[scaled.abs() <= 448].max()) <= 16
    assert torch.equal(out[scaled > 448], (448 * factor.to(x.device)[scaled > 448]).float())


@pytest.mark.parametrize("special", [float("nan"), float("inf"), -float("inf")])
def test_nan_block_and_saturation(device, special):
    x = torch.randn(2, 64, device=device)
    x[0, 5] = special
    x[1, 40] = 1e6  # its block's scale makes it 448 * 2^k; others in that block shrink
    data, scales = quantize_mxfp8(x)
    assert scales[0, 0] == 255 and torch.isnan(dequantize_mxfp8(data, scales)[0, :32]).all()
    assert not torch.isnan(dequantize_mxfp8(data, scales)[1]).any()


def test_errors():
    with pytest.raises(TypeError, match="quantize_mxfp8: x"):
        quantize_mxfp8(torch.zeros(4, 32, dtype=torch.int32))
    with pytest.raises(ValueError, match="axis 2 is not an axis of a 2-d tensor"):
        quantize_mxfp8(torch.zeros(4, 32), axis=2)
    data, scales = quantize_mxfp8(torch.randn(4, 64))
    with pytest.raises(ValueError, match=r"scales has shape \(4, 3\); expected data's shape with "
                                         r"ceil\(64 / 32\) = 2 along axis 1"):
        dequantize_mxfp8(data, torch.zeros(4, 3, dtype=torch.uint8))
    assert kk.ops.dequantize_mxfp8 is dequantize_mxfp8


@pytest.mark.parametrize("M, N, K", [(40, 24, 96), (70, 33, 70), (200, 136, 544)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_mxfp8_matmul_against_the_dequantised_product(device, M, N, K, out_dtype):
    """K-major both; shapes off the 128 x 128 tile and K off the 32-value blocks (on Hopper: rows
    TMA takes and rows it does not, several stages of K, zero and NaN scales)."""
    a = _spread((M, K), device, seed=1) / 2**10
    b = torch.randn(N, K, device=device)
    if K > 500:
        a[M - 1, 40] = float("inf")  # a NaN scale: that row of the product is NaN
    qa, sa = quantize_mxfp8(a)
    qb, sb = quantize_mxfp8(b)
    c = kk.ops.mxfp8_matmul(qa, sa, qb, sb, out_dtype=out_dtype)
    assert c.shape == (M, N) and c.dtype == out_dtype
    ref = dequantize_mxfp8(qa, sa).double() @ dequantize_mxfp8(qb, sb).double().T
    # exact products, float32 sums (then the output's rounding): relative to the largest magnitude.
    # On a GPU each 32-value block is summed by the fp8 tensor cores, whose adder keeps ~14
    # significant bits (DeepSeek-V3 report, 3.3.2; torch._scaled_mm's are the same); the blocks
    # are then added in float32.
    tol = 1e-2 if out_dtype != torch.float32 else 3e-4 if c.is_cuda else 1e-5
    torch.testing.assert_close(c.double(), ref, rtol=tol, atol=tol * ref.nan_to_num().abs().max().item(),
                               equal_nan=True)


@pytest.mark.gpu
@pytest.mark.parametrize("M, N, K, out_dtype", [(300, 264, 1040, torch.float16), (1100, 1040, 208, torch.bfloat16),
                                                (129, 136, 80, torch.float32), (2048, 2304, 256, torch.bfloat16)])
def test_mxfp8_matmul_on_hopper_matches_the_tiled_kernel(M, N, K, out_dtype):
    """The persistent Hopper path (several tiles an SM, the ring of stages wrapped, K off the
    stage and the block) against the float64 product and against the talk's tiled kernel, which
    sums the same blocks in the same order."""
    from kernelkit.ops import hopper, mxfp8
    if not torch.cuda.is_available() or hopper.sm90_sms(torch.device("cuda")) is None:
        pytest.skip("needs a Hopper GPU")
    qa, sa = quantize_mxfp8(_spread((M, K), "cuda", seed=2) / 2**10)
    qb, sb = quantize_mxfp8(torch.randn(N, K, device="cuda"))
    c = kk.ops.mxfp8_matmul(qa, sa, qb, sb, out_dtype=out_dtype)
    ref = dequantize_mxfp8(qa, sa).double() @ dequantize_mxfp8(qb, sb).double().T
    tol = 3e-4 if out_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(c.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())
    tiled = mxfp8.tiled_matmul(qa.view(torch.uint8), sa, qb.view(torch.uint8), sb, out_dtype)
    torch.testing.assert_close(c, tiled, rtol=1e-6, atol=1e-6 * ref.abs().max().item())


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_mxfp8_matmul_persistent_compiles_for_sm90a(out_dtype, nvrtc):
    """The persistent Hopper kernel (never launched without a GPU) in each output type, compiled
    by NVRTC as an H100 launches it."""
    from kernelkit.ops import mxfp8
    meta = [torch.empty(256, 320, dtype=torch.uint8, device="meta"),  # data, then scales
            torch.empty(256, 10, dtype=torch.uint8, device="meta")]
    compiled = kk.compile_for(mxfp8._persistent_matmul, "sm_90", inputs=meta * 2, output_dtypes=[out_dtype],
                              output_shapes=[(256, 256)], template=[("TC", out_dtype)], grid=(384, 1, 1),
                              threadgroup=(384, 1, 1))
    assert compiled.arch == "sm_90a" and compiled.binary


def test_mxfp8_matmul_errors():
    qa, sa = quantize_mxfp8(torch.randn(8, 64))
    qb, sb = quantize_mxfp8(torch.randn(4, 32))
    with pytest.raises(ValueError, match="mxfp8_matmul: b_data has shape"):
        kk.ops.mxfp8_matmul(qa, sa, qb, sb)
    qb, sb = quantize_mxfp8(torch.randn(4, 64))
    with pytest.raises(ValueError, match="mxfp8_matmul: out_dtype"):
        kk.ops.mxfp8_matmul(qa, sa, qb, sb, out_dtype=torch.int32)
    with pytest.raises(TypeError, match="mxfp8_matmul: a_data"):
        kk.ops.mxfp8_matmul(qa.float(), sa, qb, sb)

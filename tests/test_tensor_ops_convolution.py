"""Apple's convolution2d tensor op (MPPTensorOpsConvolution2d.h) in kernel bodies, as an Apple user
writes them: NHWC activations, HWIO weights, NHWO destinations (extents innermost first), a tile
per threadgroup placed by set_offsets, against torch.nn.functional.conv2d in float64. Every kernel
here is also compiled for sm_90a in CI (conftest) and runs on the GPU with `device`."""

import pytest
import torch

import kernelkit as kk

HEADER = """#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using namespace mpp::tensor_ops;
"""

# One output tile of TW x TH pixels (all O channels) per threadgroup, the batch on the grid's z.
# The window of destination pixel (x, y) is centred on offset + (x, y) * strides, so a tile at
# (x0, y0) of a convolution padded by (PX, PY) sets its offset to (x0, y0) * strides - padding plus
# half the dilated window, rounded up.
TILED = """
  const uint3 tgid = threadgroup_position_in_grid;
  auto A = tensor(x, dextents<int, 4>(C, W, H, N));
  auto Wt = tensor(w, dextents<int, 4>(O, C, KW, KH));
  auto D = tensor(y, dextents<int, 4>(O, WO, HO, N));
  constexpr auto desc = convolution2d_descriptor(int4(O, TW, TH, 1), int4(C, W, H, 1), int2(KW, KH),
      convolution2d_activation_layout::nhwc, convolution2d_weights_layout::hwio, int2(SX, SY), int2(DX, DY), 1,
      false, ACC ? convolution2d_descriptor::mode::multiply_accumulate : convolution2d_descriptor::mode::multiply);
  convolution2d<desc, execution_simdgroups<SG>> op;
  const int x0 = tgid.x * TW, y0 = tgid.y * TH;
  op.set_offsets(int2(x0 * SX - PX + ((KW - 1) * DX + 1) / 2, y0 * SY - PY + ((KH - 1) * DY + 1) / 2));
  auto tA = A.slice(0, 0, 0, tgid.z);
  op.run(tA, Wt, D.slice(0, x0, y0, tgid.z));
"""


def _rand(shape, dtype, device):
    if dtype in (torch.int8, torch.uint8):
        return torch.randint(-8 if dtype == torch.int8 else 0, 8, shape, dtype=dtype, device=device)
    return torch.randn(shape, device=device).to(dtype)


def _poison(dtype):
    """What unwritten outputs hold: NaN, or the lowest integer."""
    return float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min


def _reference(x, w, stride, padding, dilation):
    """NHWC x HWIO -> NHWO, in float64."""
    out = torch.nn.functional.conv2d(x.double().permute(0, 3, 1, 2), w.double().permute(3, 2, 0, 1),
                                     stride=stride, padding=padding, dilation=dilation)
    return out.permute(0, 2, 3, 1)


def _tiled(device, dtype, out_dtype, N, H, W, C, O, K, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
           tile=(8, 4), simdgroups=2, acc=False):
    (KH, KW), (SY, SX), (PY, PX), (DY, DX), (TH, TW) = K, stride, padding, dilation, tile
    HO, WO = (H + 2 * PY - DY * (KH - 1) - 1) // SY + 1, (W + 2 * PX - DX * (KW - 1) - 1) // SX + 1
    k = kk.metal_kernel("tops_conv_tiled", ["x", "w"], ["y"], TILED, header=HEADER)
    x, w = _rand((N, H, W, C), dtype, device), _rand((KH, KW, C, O), dtype, device)
    consts = dict(N=N, H=H, W=W, C=C, O=O, KH=KH, KW=KW, SY=SY, SX=SX, PY=PY, PX=PX, DY=DY, DX=DX, HO=HO, WO=WO,
                  TH=TH, TW=TW, SG=simdgroups)
    y = k(inputs=[x, w], output_shapes=[(N, HO, WO, O)], output_dtypes=[out_dtype],
          grid=(32 * simdgroups * -(-WO // TW), -(-HO // TH), N), threadgroup=(32 * simdgroups, 1, 1),
          template=[*consts.items(), ("ACC", acc)], init_value=1 if acc else _poison(out_dtype))[0]
    return y, _reference(x, w, stride, padding, dilation) + (1 if acc else 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_same_convolution_edge_tiles(device, dtype):
    """3 x 3, padding 1 over 11 x 9 pixels in tiles of 8 rows x 4 columns: edge tiles run past the image."""
    y, ref = _tiled(device, dtype, torch.float32, N=2, H=11, W=9, C=5, O=7, K=(3, 3), padding=(1, 1))
    tol = 1e-5 if dtype == torch.float32 else 1e-4
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("K,stride,padding,dilation,simdgroups", [
    ((3, 2), (2, 1), (2, 1), (2, 3), 1),   # an even kernel width, dilated
    ((5, 5), (2, 2), (2, 2), (1, 1), 4),
    ((1, 1), (1, 2), (0, 0), (1, 1), 2),   # pointwise, strided across
    ((2, 3), (1, 1), (1, 2), (2, 2), 2),
], ids=["3x2-s21-d23", "5x5-s2", "1x1-s12", "2x3-d2"])
def test_strides_dilations_padding(device, K, stride, padding, dilation, simdgroups):
    y, ref = _tiled(device, torch.float16, torch.float32, N=2, H=13, W=10, C=6, O=9, K=K, stride=stride,
                    padding=padding, dilation=dilation, simdgroups=simdgroups)
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_multiply_accumulate_into_16_bits(device, dtype):
    """mode::multiply_accumulate adds to the destination (1 everywhere), of the operands' type."""
    y, ref = _tiled(device, dtype, dtype, N=1, H=7, W=12, C=3, O=16, K=(3, 3), padding=(1, 1), tile=(4, 8),
                    acc=True)
    tol = 2e-3 if dtype == torch.float16 else 1e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype,out_dtype", [(torch.int8, torch.int32), (torch.uint8, torch.int32),
                                             (torch.int8, torch.float32)])
def test_8_bit_integers(device, dtype, out_dtype):
    """Exact: int32 accumulators into integers, float ones (exact below 2^24) into float."""
    y, ref = _tiled(device, dtype, out_dtype, N=2, H=6, W=7, C=9, O=5, K=(3, 3), stride=(2, 2), padding=(1, 1))
    assert torch.equal(y.double(), ref)


# A cooperative destination as convolution epilogues use one: the bias loaded from a rank-1 tensor
# (broadcast over every pixel), the convolution added to it, ReLU through the iterators, then stored
# to the tile; and each element also written where get_multidimensional_index (o, x, y, n) says.
EPILOGUE = """
  const uint2 tgid = threadgroup_position_in_grid.xy;
  auto A = tensor(x, dextents<int, 4>(C, W, H, 1));
  auto Wt = tensor(w, dextents<int, 4>(O, C, 3, 3));
  auto D = tensor(y, dextents<int, 4>(O, W, H, 1));
  auto tBias = tensor(bias, dextents<int, 1>(O));
  constexpr auto desc = convolution2d_descriptor(int4(O, 8, 8, 1), int4(C, W, H, 1), int2(3, 3),
      convolution2d_activation_layout::nhwc, convolution2d_weights_layout::hwio, int2(1, 1), int2(1, 1), 1, false,
      convolution2d_descriptor::mode::multiply_accumulate);
  convolution2d<desc, execution_simdgroups<4>> op;
  const int x0 = tgid.x * 8, y0 = tgid.y * 8;
  op.set_offsets(int2(x0, y0));  // 3 x 3 windows centred on the pixels: padding 1
  auto ct = op.get_destination_cooperative_tensor<decltype(A), decltype(Wt), float>();
  ct.load(tBias);
  op.run(A, Wt, ct);
  for (auto it = ct.begin(); it != ct.end(); it++) *it = max(*it, 0.0f);
  ct.store(D.slice(0, x0, y0, 0));
  for (ushort i = 0; i < ct.get_capacity(); ++i) {
    if (!ct.is_valid_element(i)) continue;
    auto idx = ct.get_multidimensional_index(i);
    const int o = idx[0], px = x0 + idx[1], py = y0 + idx[2];
    if (idx[3] == 0 && px < W && py < H) z[(py * W + px) * O + o] = ct[i];
  }
"""


def test_cooperative_destination_epilogue(device):
    H, W, C, O = 13, 11, 4, 12
    k = kk.metal_kernel("tops_conv_epilogue", ["x", "w", "bias"], ["y", "z"], EPILOGUE,
                        header=HEADER + f"constexpr int H = {H}, W = {W}, C = {C}, O = {O};\n")
    x, w, bias = _rand((1, H, W, C), torch.float16, device), _rand((3, 3, C, O), torch.float16, device), \
        torch.randn(O, device=device)
    y, z = k(inputs=[x, w, bias], output_shapes=[(1, H, W, O)] * 2, output_dtypes=[torch.float32] * 2,
             grid=(128 * 2, 2, 1), threadgroup=(128, 1, 1), init_value=float("nan"))
    ref = torch.relu(_reference(x, w, 1, 1, 1) + bias.double())
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(z.double(), ref, rtol=1e-4, atol=1e-4)


# Without set_offsets (offset 0) the whole image is one tile and each window is centred on its pixel,
# starting ceil((K - 1) * dilation / 2) before it: a "same" convolution (its first H x W outputs).
WHOLE = """
  auto A = tensor(x, dextents<int, 4>(C, W, H, N));
  auto Wt = tensor(w, dextents<int, 4>(O, C, KW, KH));
  auto D = tensor(y, dextents<int, 4>(O, W, H, N));
  constexpr auto desc = convolution2d_descriptor(int4(O, W, H, N), int4(C, W, H, N), int2(KW, KH),
      convolution2d_activation_layout::nhwc, convolution2d_weights_layout::hwio, int2(1, 1), int2(DX, DY));
  convolution2d<desc, execution_simdgroups<4>> op;
  op.run(A, Wt, D);
"""


def test_default_offsets_centre_the_windows(device):
    N, H, W, C, O, (KH, KW), (DY, DX) = 2, 6, 9, 3, 5, (3, 2), (1, 3)
    k = kk.metal_kernel("tops_conv_whole", ["x", "w"], ["y"], WHOLE, header=HEADER)
    x, w = _rand((N, H, W, C), torch.float32, device), _rand((KH, KW, C, O), torch.float32, device)
    consts = dict(N=N, H=H, W=W, C=C, O=O, KH=KH, KW=KW, DY=DY, DX=DX)
    y = k(inputs=[x, w], output_shapes=[(N, H, W, O)], output_dtypes=[torch.float32], grid=(128, 1, 1),
          threadgroup=(128, 1, 1), template=list(consts.items()), init_value=float("nan"))[0]
    padding = (((KH - 1) * DY + 1) // 2, ((KW - 1) * DX + 1) // 2)  # (1, 2)
    ref = _reference(x, w, 1, padding, (DY, DX))[:, :H, :W]
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5)


# The same op in a CUDA-dialect body: `#include <kernelkit/tensor_ops.h>`, CUDA's int4 / int2; the
# input channels left to the activation's extent (source_dimensions.x = -1).
CUDA_CONV = """
  using namespace metal;
  using namespace mpp::tensor_ops;
  auto A = tensor(x, dextents<int, 4>(C, 2 * W, 2 * H, 1));
  auto Wt = tensor(w, dextents<int, 4>(O, C, 3, 3));
  auto D = tensor(y, dextents<int, 4>(O, W, H, 1));
  constexpr auto desc = convolution2d_descriptor(int4{O, W, H, 1}, int4{-1, 2 * W, 2 * H, 1}, int2{3, 3},
      convolution2d_activation_layout::nhwc, convolution2d_weights_layout::hwio, int2{2, 2});
  convolution2d<desc, execution_simdgroups<2>> op;
  op.set_offsets(int2{0, 1});  // pixel (x, y) reads rows 2y..2y + 2 and columns 2x - 1..2x + 1
  op.run(A, Wt, D);
"""


def test_cuda_dialect(device):
    H, W, C, O = 9, 7, 3, 4
    k = kk.cuda_kernel("tops_conv_cuda", ["x", "w"], ["y"], CUDA_CONV,
                       header=f"#include <kernelkit/tensor_ops.h>\nconstexpr int H = {H}, W = {W}, C = {C}, O = {O};\n")
    x, w = _rand((1, 2 * H, 2 * W, C), torch.bfloat16, device), _rand((3, 3, C, O), torch.bfloat16, device)
    y = k(inputs=[x, w], output_shapes=[(1, H, W, O)], output_dtypes=[torch.float32], grid=(64, 1, 1),
          threadgroup=(64, 1, 1))[0]
    ref = _reference(torch.nn.functional.pad(x, (0, 0, 1, 1, 0, 1)), w, 2, 0, 1)  # zero column left, row below
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("old,new,message", [
    ("int2(DX, DY)", "int2(DX, DY), 2", "only group size 1 supported currently"),
    ("int2(1, 1), int2(DX, DY)", "int2(0, 1), int2(DX, DY)", "strides and dilations must be positive"),
    ("dextents<int, 4>(C, W, H, N)", "dextents<int, 2>(C, W * H * N)", "Activation must be rank 4"),
], ids=["groups", "stride-0", "rank-2"])
def test_compile_errors_are_clear(old, new, message):
    k = kk.metal_kernel("tops_conv_bad", ["x", "w"], ["y"], WHOLE.replace(old, new, 1), header=HEADER)
    with pytest.raises(kk.CompileError, match=message):
        k(inputs=[torch.randn(1, 4, 4, 2), torch.randn(3, 3, 2, 2)], output_shapes=[(1, 4, 4, 2)],
          output_dtypes=[torch.float32], grid=(128, 1, 1), threadgroup=(128, 1, 1),
          template=list(dict(N=1, H=4, W=4, C=2, O=2, KH=3, KW=3, DY=1, DX=1).items()))


def test_compiles_for_sm90a(nvrtc):
    """The tiled kernel as an H100 would launch it, compiled by NVRTC without a GPU."""
    k = kk.metal_kernel("tops_conv_tiled", ["x", "w"], ["y"], TILED, header=HEADER)
    consts = dict(N=2, H=32, W=32, C=16, O=32, KH=3, KW=3, SY=1, SX=1, PY=1, PX=1, DY=1, DX=1, HO=32, WO=32,
                  TH=8, TW=8, SG=4)
    x = torch.empty(2, 32, 32, 16, dtype=torch.float16, device="meta")
    w = torch.empty(3, 3, 16, 32, dtype=torch.float16, device="meta")
    compiled = kk.compile_for(k, "sm_90", inputs=[x, w], output_dtypes=[torch.float32],
                              template=[*consts.items(), ("ACC", False)])
    assert compiled.arch == "sm_90a" and compiled.binary

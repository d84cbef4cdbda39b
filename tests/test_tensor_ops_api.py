"""Apple's TensorOps API as its documentation writes it: kernels copied from the Metal Shading Language
specification (§7.2.1's matrixMultiply, gemmBias, gemm_reduce and gemm_map), from the comments of
MPPTensorOpsMatMul2d.h and from <metal_cooperative_tensor>'s members, against torch in float64.
Every kernel here is also compiled for sm_90a in CI (conftest) and runs on the GPU with `device`."""

import torch

import kernelkit as kk

# The specification's examples: `using namespace mpp` and tensor_ops:: names.
SPEC_HEADER = """#include <metal_stdlib>
#include <metal_tensor>
#include <metal_cooperative_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using namespace mpp;
"""
HEADER = """#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using namespace mpp::tensor_ops;
"""


def _consts(**values):
    return "".join(f"constexpr int {k} = {v};\n" for k, v in values.items())


# MSL spec §7.2.1, matrixMultiply: K = 0 in the descriptor (the op reads K from the operands).
SPEC_MATMUL = """
  auto a_t = tensor(a, dextents<int, 2>(K, M));
  auto b_t = tensor(b, dextents<int, 2>(N, K));
  auto c_t = tensor(c, dextents<int, 2>(N, M));
  const uint2 tgid = threadgroup_position_in_grid.xy;
  constexpr auto matmulDescriptor = tensor_ops::matmul2d_descriptor(64, 32, 0);
  tensor_ops::matmul2d<matmulDescriptor, execution_simdgroups<4>> matmulOp;
  auto mA = a_t.slice(0, tgid.y * 64);
  auto mB = b_t.slice(tgid.x * 32, 0);
  auto mC = c_t.slice(tgid.x * 32, tgid.y * 64);
  matmulOp.run(mA, mB, mC);
"""


def test_spec_matrix_multiply_k_zero(device):
    M, N, K = 100, 70, 37
    k = kk.metal_kernel("tops_api_spec_matmul", ["a", "b"], ["c"], SPEC_MATMUL,
                        header=SPEC_HEADER + _consts(M=M, N=N, K=K))
    a, b = torch.randn(M, K, device=device).half(), torch.randn(K, N, device=device).half()
    c = k(inputs=[a, b], output_shapes=[(M, N)], output_dtypes=[torch.float32],
          grid=(128 * -(-N // 32), -(-M // 64), 1), threadgroup=(128, 1, 1))[0]
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)


# MSL spec §7.2.1, gemmBias: a rank-1 bias loaded into the destination cooperative tensor (one
# value per column, over every row), then multiply_accumulate onto it. The tensors are smaller than
# the op's 64 x 32 tile: the op reads zero past them and stores only what lies inside.
SPEC_GEMM_BIAS = """
  auto a_t = tensor(a, dextents<int, 2>(K, M));
  auto b_t = tensor(b, dextents<int, 2>(N, K));
  auto c_t = tensor(c, dextents<int, 2>(N, M));
  array<int, 1> stride = {1};
  tensor<const device float, dextents<int, 1>, tensor_inline> tBias(bias, dextents<int, 1>(N), stride);
  constexpr auto matmulDescriptor = tensor_ops::matmul2d_descriptor(
      64, 32, 0, false, false, false, tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);
  tensor_ops::matmul2d<matmulDescriptor, execution_simdgroups<4>> matmulOp;
  auto cTc = matmulOp.get_destination_cooperative_tensor<decltype(a_t), decltype(b_t), float>();
  cTc.load(tBias);
  matmulOp.run(a_t, b_t, cTc);
  cTc.store(c_t);
"""


def test_spec_gemm_bias_rank1_load(device):
    M, N, K = 50, 27, 40
    k = kk.metal_kernel("tops_api_spec_gemm_bias", ["a", "b", "bias"], ["c"], SPEC_GEMM_BIAS,
                        header=SPEC_HEADER + _consts(M=M, N=N, K=K))
    a, b, bias = torch.randn(M, K, device=device), torch.randn(K, N, device=device), torch.randn(N, device=device)
    c = k(inputs=[a, b, bias], output_shapes=[(M, N)], output_dtypes=[torch.float32],
          grid=(128, 1, 1), threadgroup=(128, 1, 1))[0]
    ref = a.double() @ b.double() + bias.double()[None, :]
    torch.testing.assert_close(c.double(), ref, rtol=1e-5, atol=1e-5)


# MSL spec §7.2.1, gemm_reduce and gemm_map in one kernel: the row sums stored from the row
# reduction cooperative tensor into a rank-1 tensor, then each element plus its row's minimum
# through is_iterator_compatible and map_iterator. (gemm_map passes numeric_limits::lowest() as
# the identity of a min: the identity a min needs is the highest value, min_identity.)
SPEC_REDUCE_MAP = """
  auto aT = tensor(a, dextents<int, 2>(K, 64));
  auto bT = tensor(b, dextents<int, 2>(32, K));
  auto dT = tensor(c, dextents<int, 2>(32, 64));
  auto dR = tensor(rsum, dextents<int, 1>(64));
  constexpr auto matmulDescriptor = tensor_ops::matmul2d_descriptor(64, 32, 0);
  tensor_ops::matmul2d<matmulDescriptor, execution_simdgroup> matmulOp;
  auto cTdest = matmulOp.get_destination_cooperative_tensor<decltype(aT), decltype(bT), float>();
  matmulOp.run(aT, bT, cTdest);
  auto cTred = matmulOp.get_row_reduction_destination_cooperative_tensor<decltype(aT), decltype(bT), float>();
  reduce_rows(cTdest, cTred, tensor_ops::reduction_operation::sum, 0.0f);
  cTred.store(dR);
  auto cTmin = matmulOp.get_row_reduction_destination_cooperative_tensor<decltype(aT), decltype(bT), float>();
  auto identity = tensor_ops::reduction_operation_identity<float>::min_identity;
  reduce_rows(cTdest, cTmin, tensor_ops::reduction_operation::min, identity);
  if (tensor_ops::is_iterator_compatible(cTdest, cTmin)) {
    for (auto it = cTdest.begin(); it != cTdest.end(); it++) {
      auto cTred_it = cTmin.map_iterator(it);
      *it += *cTred_it;
    }
  }
  cTdest.store(dT);
"""


def test_spec_reduce_rows_store_and_map_iterator(device):
    K = 40
    k = kk.metal_kernel("tops_api_spec_reduce_map", ["a", "b"], ["c", "rsum"], SPEC_REDUCE_MAP,
                        header=SPEC_HEADER + _consts(K=K))
    a, b = torch.randn(64, K, device=device), torch.randn(K, 32, device=device)
    c, rsum = k(inputs=[a, b], output_shapes=[(64, 32), (64,)], output_dtypes=[torch.float32] * 2,
                grid=(32, 1, 1), threadgroup=(32, 1, 1))
    s = a.double() @ b.double()
    torch.testing.assert_close(rsum.double(), s.sum(1), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(c.double(), s + s.min(1, keepdim=True).values, rtol=1e-5, atol=1e-4)


# <metal_cooperative_tensor>'s element-pointer overloads (is_valid_element, get_multidimensional_index,
# get_iterator), a range-for over the elements, and map_iterator on a const cooperative tensor. The
# 20 x 12 tile leaves invalid elements in the fragment layout; the descriptor is written in place.
ELEMENT_POINTERS = """
  auto tA = tensor(a, dextents<int, 2>(K, 20));
  auto tB = tensor(b, dextents<int, 2>(12, K));
  matmul2d<matmul2d_descriptor(20, 12, K), execution_simdgroup> op;
  auto ct = op.get_destination_cooperative_tensor<decltype(tA), decltype(tB), float>();
  op.run(tA, tB, ct);
  auto rows = op.get_row_reduction_destination_cooperative_tensor<decltype(tA), decltype(tB), float>();
  reduce_rows(ct, rows, reduction_operation::max, reduction_operation_identity<float>::max_identity);
  const auto& crows = rows;
  for (auto& x : ct) {
    if (!ct.is_valid_element(&x)) continue;
    const auto idx = ct.get_multidimensional_index(&x);   // (column, row)
    x = x - *crows.map_iterator(ct.get_iterator(&x)) + 10.0f * idx[0] + 1000.0f * idx[1];
  }
  ct.store(tensor(c, dextents<int, 2>(12, 20)));
"""


def test_element_pointer_overloads_and_const_map_iterator(device):
    K = 24
    k = kk.metal_kernel("tops_api_element_pointers", ["a", "b"], ["c"], ELEMENT_POINTERS,
                        header=HEADER + _consts(K=K))
    a, b = torch.randn(20, K, device=device).half(), torch.randn(K, 12, device=device).half()
    c = k(inputs=[a, b], output_shapes=[(20, 12)], output_dtypes=[torch.float32],
          grid=(32, 1, 1), threadgroup=(32, 1, 1))[0]
    s = a.double() @ b.double()
    rows, cols = torch.meshgrid(torch.arange(20.0, device=device), torch.arange(12.0, device=device), indexing="ij")
    ref = s - s.max(1, keepdim=True).values + 10 * cols.double() + 1000 * rows.double()
    torch.testing.assert_close(c.double().cpu(), ref.cpu(), rtol=1e-5, atol=1e-3)


# Slices of rank-3 and rank-4 tensors (convolution2d's operands are rank 4): slice(origin...) keeps
# what remains of each extent, slice<E...>(origin...) takes static extents.
HIGH_RANK_SLICES = """
  if (thread_position_in_grid.x != 0) return;
  auto X = tensor(x, dextents<int, 4>(C, W, H, B));              // x: (B, H, W, C)
  auto s = X.slice(1, 2, 1, 1);
  auto Y = tensor(y, dextents<int, 4>(C - 1, W - 2, H - 1, B - 1));
  for (int n = 0; n < B - 1; ++n)
    for (int h = 0; h < H - 1; ++h)
      for (int w = 0; w < W - 2; ++w)
        for (int ch = 0; ch < C - 1; ++ch) Y(ch, w, h, n) = s(ch, w, h, n);
  auto X3 = tensor(x, dextents<int, 3>(C, W, H * B));          // x: (B * H, W, C)
  auto s3 = X3.slice<2, 3, 2>(1, 1, 2);
  auto Z = tensor(z, dextents<int, 3>(2, 3, 2));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int l = 0; l < 2; ++l) Z(i, j, l) = s3(i, j, l);
  for (int r = 0; r < 4; ++r) ext[r] = s.get_extent(r);
  for (int r = 0; r < 3; ++r) ext[4 + r] = s3.get_extent(r);
"""


def test_rank3_and_rank4_slices(device):
    B, H, W, C = 3, 4, 5, 6
    k = kk.metal_kernel("tops_api_high_rank_slices", ["x"], ["y", "z", "ext"], HIGH_RANK_SLICES,
                        header=HEADER + _consts(B=B, H=H, W=W, C=C))
    x = torch.randn(B, H, W, C, device=device)
    y, z, ext = k(inputs=[x], output_shapes=[(B - 1, H - 1, W - 2, C - 1), (2, 3, 2), (7,)],
                  output_dtypes=[torch.float32, torch.float32, torch.int32], grid=(32, 1, 1), threadgroup=(32, 1, 1))
    torch.testing.assert_close(y, x[1:, 1:, 2:, 1:])
    torch.testing.assert_close(z, x.reshape(B * H, W, C)[2:4, 1:4, 1:3])
    assert ext.tolist() == [C - 1, W - 2, H - 1, B - 1, 2, 3, 2]


# MPPTensorOpsMatMul2d.h's second and third examples as their comments write them: interior tiles
# by static_slice<...> with the K loop in the kernel (k = 16, multiply_accumulate onto a zeroed
# C, the last chunk a dynamic_extent slice), edge tiles by dynamic slices and an op over all of K.
HEADER_KLOOP = """
  const uint2 tgid = threadgroup_position_in_grid.xy;
  auto A = tensor(a, dextents<int, 2>(K, M));
  auto B = tensor(b, dextents<int, 2>(N, K));
  auto C = tensor(c, dextents<int, 2>(N, M));
  constexpr auto matmulDescriptor = matmul2d_descriptor(64, 32, 16, false, false, false,
                                                        matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<matmulDescriptor, execution_simdgroups<4>> matmulOp;
  constexpr int tilek = 16;
  if (tgid.y * 64 + 63 < M && tgid.x * 32 + 31 < N) {
    auto tC = C.static_slice<32, 64>(tgid.x * 32, tgid.y * 64);
    int k = 0;
    for (; k + tilek - 1 < K; k += tilek) {
      auto tA = A.static_slice<tilek, 64>(k, tgid.y * 64);
      auto tB = B.static_slice<32, tilek>(tgid.x * 32, k);
      matmulOp.run(tA, tB, tC);
    }
    auto tA = A.static_slice<dynamic_extent, 64>(k, tgid.y * 64);
    auto tB = B.static_slice<32, dynamic_extent>(tgid.x * 32, k);
    matmulOp.run(tA, tB, tC);
  } else {
    constexpr auto edgeDescriptor = matmul2d_descriptor(64, 32, static_cast<int>(dynamic_extent));
    matmul2d<edgeDescriptor, execution_simdgroups<4>> edgeOp;
    auto tA = A.slice(0, tgid.y * 64);
    auto tB = B.slice(tgid.x * 32, 0);
    auto tC = C.slice(tgid.x * 32, tgid.y * 64);
    edgeOp.run(tA, tB, tC);
  }
"""


def test_header_examples_static_slice_k_loop(device):
    M, N, K = 130, 70, 40  # interior tiles with a K remainder of 8, and edge tiles
    k = kk.metal_kernel("tops_api_static_slice_k_loop", ["a", "b"], ["c"], HEADER_KLOOP,
                        header=HEADER + _consts(M=M, N=N, K=K))
    a, b = torch.randn(M, K, device=device).half(), torch.randn(K, N, device=device).half()
    c = k(inputs=[a, b], output_shapes=[(M, N)], output_dtypes=[torch.float32],
          grid=(128 * -(-N // 32), -(-M // 64), 1), threadgroup=(128, 1, 1), init_value=0)[0]
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)


# A dextents tensor built from static extents, with and without strides: <metal_tensor>'s extents
# convert as std::extents do (liuliu/example_matmul_metal4's attention declares its threadgroup P
# tile this way). Also make_filled_simdgroup_matrix<T, 8>, Rows defaulting to Cols (llama.cpp).
STATIC_TO_DYNAMIC_EXTENTS = """
  auto tA = tensor<device half, dextents<int32_t, 2>, tensor_inline>((device half *)a, extents<int32_t, 16, 16>());
  auto tB = tensor<device half, dextents<int32_t, 2>, tensor_inline>((device half *)b, extents<int32_t, 8, 16>(),
                                                                     array<int, 2>{1, 8});
  auto tC = tensor<device float, dextents<int, 2>, tensor_inline>(c, extents<short, 8, 16>());
  matmul2d<matmul2d_descriptor(16, 8, dynamic_length_v<int>), execution_simdgroup> op;
  op.run(tA, tB, tC);
  simdgroup_float8x8 z = make_filled_simdgroup_matrix<float, 8>(2.0f);
  simdgroup_store(z, filled, 8);
"""


def test_dextents_tensor_from_static_extents(device):
    k = kk.metal_kernel("tops_api_static_to_dynamic_extents", ["a", "b"], ["c", "filled"], STATIC_TO_DYNAMIC_EXTENTS,
                        header=HEADER)
    a, b = torch.randn(16, 16, device=device).half(), torch.randn(16, 8, device=device).half()
    c, filled = k(inputs=[a, b], output_shapes=[(16, 8), (8, 8)], output_dtypes=[torch.float32] * 2,
                  grid=(32, 1, 1), threadgroup=(32, 1, 1))
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-4, atol=1e-4)
    assert bool((filled == 2).all())

"""Tensor ops in kernel bodies (SPEC §8, DESIGN.md "Tensor ops"): Apple's TensorOps (metal::tensor,
matmul2d, cooperative tensors, reductions) and MSL's simdgroup_matrix, against torch in float64.
Every kernel here is also compiled for sm_90a in CI (conftest) and runs on the GPU with `device`."""

import pytest
import torch

import kernelkit as kk

HEADER = """#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace mpp::tensor_ops;
"""

# The talk's tiled matmul: each threadgroup slices its tile and calls run once over all of K.
TILE_MATMUL = """
  const uint2 tgid = threadgroup_position_in_grid.xy;
  const int M = TL ? a_shape[1] : a_shape[0], K = TL ? a_shape[0] : a_shape[1], N = TR ? b_shape[0] : b_shape[1];
  auto A = TL ? tensor(a, dextents<int, 2>(M, K), array<int, 2>({1, M})) : tensor(a, dextents<int, 2>(K, M), array<int, 2>({1, K}));
  auto B = TR ? tensor(b, dextents<int, 2>(K, N)) : tensor(b, dextents<int, 2>(N, K));
  auto C = tensor(c, dextents<int, 2>(N, M));
  auto tA = TL ? A.slice(tgid.y * TILEM, 0) : A.slice(0, tgid.y * TILEM);
  auto tB = TR ? B.slice(0, tgid.x * TILEN) : B.slice(tgid.x * TILEN, 0);
  auto tC = C.slice(tgid.x * TILEN, tgid.y * TILEM);
  constexpr auto descriptor = matmul2d_descriptor(TILEM, TILEN, dynamic_length_v<int>, TL, TR, RELAXED,
      ACC ? matmul2d_descriptor::mode::multiply_accumulate : matmul2d_descriptor::mode::multiply);
  matmul2d<descriptor, execution_simdgroups<4>> op;
  op.run(tA, tB, tC);
"""


def _rand(shape, dtype, device):
    if dtype in (torch.int8, torch.uint8):
        lo = -8 if dtype == torch.int8 else 0
        return torch.randint(lo, 8, shape, dtype=dtype, device=device)
    return torch.randn(shape, device=device).to(dtype)


def _tile_matmul(device, dtype, out_dtype, M, N, K, TM=32, TN=16, tl=False, tr=False, acc=False, relaxed=False):
    k = kk.metal_kernel("tops_tile_matmul", ["a", "b"], ["c"], TILE_MATMUL, header=HEADER)
    a, b = _rand((K, M) if tl else (M, K), dtype, device), _rand((N, K) if tr else (K, N), dtype, device)
    grid = (128 * -(-N // TN), -(-M // TM), 1)
    init = 1 if acc else None
    c = k(inputs=[a, b], output_shapes=[(M, N)], output_dtypes=[out_dtype], grid=grid, threadgroup=(128, 1, 1),
          template=[("TILEM", TM), ("TILEN", TN), ("TL", tl), ("TR", tr), ("ACC", acc), ("RELAXED", relaxed)],
          init_value=init)[0]
    ref = (a.double().T if tl else a.double()) @ (b.double().T if tr else b.double()) + (1 if acc else 0)
    return c, ref


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_tile_matmul_edge_tiles(device, dtype):
    """Slices past the edges (70 x 45 with 32 x 16 tiles, K = 37) are clipped; float is exact."""
    c, ref = _tile_matmul(device, dtype, torch.float32, 70, 45, 37)
    tol = 1e-5 if dtype == torch.float32 else 1e-4
    torch.testing.assert_close(c.double(), ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tile_matmul_warpgroup_tiles(device, dtype):
    """64 x 64 tiles over 4 SIMD-groups: the shape Hopper's warpgroup path (wgmma) takes."""
    c, ref = _tile_matmul(device, dtype, torch.float32, 130, 70, 100, TM=64, TN=64)
    torch.testing.assert_close(c.double(), ref, rtol=1e-4, atol=1e-4)


def test_tile_matmul_transposed_accumulate_relaxed(device):
    """transpose_right, multiply_accumulate onto the destination, relaxed float (tf32 allowed)."""
    c, ref = _tile_matmul(device, torch.float32, torch.float32, 40, 33, 50, tr=True, acc=True, relaxed=True)
    torch.testing.assert_close(c.double(), ref, rtol=3e-3, atol=3e-2)


def test_tile_matmul_both_transposed(device):
    c, ref = _tile_matmul(device, torch.float16, torch.float32, 40, 33, 50, tl=True, tr=True)
    torch.testing.assert_close(c.double(), ref, rtol=1e-4, atol=1e-4)


def test_int8_matmul_into_int32(device):
    c, ref = _tile_matmul(device, torch.int8, torch.int32, 48, 20, 70)
    assert torch.equal(c.long(), ref.long())


# The talk's attention step (its snippets as they are: a kernel that is a template would write
# `op.template get_...`), per SIMD-group: QK^T into a cooperative tensor, the row max by
# reduce_rows, exp(s - max) with map_iterator, the scores reused as the left input of P V (or stored
# and reloaded through threadgroup memory), and the row sums by reduce_rows.
ATTENTION = """
  const uint sgid = simdgroup_index_in_threadgroup;
  auto tQ = tensor(q, dextents<int, 2>(D, q_shape[0]));
  auto tK = tensor(k, dextents<int, 2>(D, BK));
  auto tV = tensor(v, dextents<int, 2>(D, BK));
  constexpr auto qk_desc = matmul2d_descriptor(ROWS, BK, D, false, true);
  matmul2d<qk_desc, execution_simdgroup> mul_qk_op;
  auto tQSlice = tQ.slice<D, ROWS>(0, sgid * ROWS);
  auto tKSlice = tK.slice<D, BK>(0, 0);
  auto tVSlice = tV.slice<D, BK>(0, 0);
  auto ctQK = mul_qk_op.get_destination_cooperative_tensor<decltype(tQSlice), decltype(tKSlice), float>();
  mul_qk_op.run(tQSlice, tKSlice, ctQK);
  auto ctRowMax = mul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(tQSlice), decltype(tKSlice), float>();
  reduce_rows(ctQK, ctRowMax, reduction_operation::max, -INFINITY);
  #pragma clang loop unroll(full)
  for (auto it = ctQK.begin(); it != ctQK.end(); it++) {
    auto row_it = ctRowMax.map_iterator(it);
    *it = exp(*it - *row_it);
  }
  auto ctRowSum = mul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(tQSlice), decltype(tKSlice), float>();
  reduce_rows(ctQK, ctRowSum, reduction_operation::sum, reduction_operation_identity<float>::sum_identity);
  for (ushort i = 0; i < ctRowSum.get_capacity(); ++i)
    if (ctRowSum.is_valid_element(i)) {
      const int r = sgid * ROWS + ctRowSum.get_multidimensional_index(i)[0];
      if (r < q_shape[0]) stats[2 * r] = ctRowMax[i], stats[2 * r + 1] = ctRowSum[i];
    }

  constexpr auto mul_sv_op_desc = matmul2d_descriptor(ROWS, D, BK, false, false, false,
                                                      matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<mul_sv_op_desc, metal::execution_simdgroup> mul_sv_op;
  auto ctO = mul_sv_op.get_destination_cooperative_tensor<
      decltype(mul_sv_op.get_left_input_cooperative_tensor<float, half, float>()), decltype(tVSlice), float>();
  threadgroup float scratch[4 * ROWS * BK];
  auto tgTensor = tensor<threadgroup float, dextents<int, 2>, tensor_inline>(scratch + sgid * ROWS * BK,
                                                                           dextents<int, 2>(BK, ROWS));
  if (!FALLBACK && mul_sv_op.is_compatible_as_left_input<float, half, float>(ctQK)) {
    auto ctQKIn = mul_sv_op.get_left_input_cooperative_tensor<float, half, float>(ctQK);
    mul_sv_op.run(ctQKIn, tVSlice, ctO);
  } else {
    ctQK.store(tgTensor);
    simdgroup_barrier(mem_flags::mem_threadgroup);
    auto ctQKIn = mul_sv_op.get_left_input_cooperative_tensor<float, half, float>();
    ctQKIn.load(tgTensor);
    mul_sv_op.run(ctQKIn, tVSlice, ctO);
  }
  auto tO = tensor(o, dextents<int, 2>(D, q_shape[0]));
  ctO.store(tO.slice(0, sgid * ROWS));
"""


@pytest.mark.parametrize("fallback", [False, True])
def test_attention_step(device, fallback):
    D, BK, ROWS, M = 16, 32, 16, 56  # 4 SIMD-groups x 16 rows, the last one partly past q's rows
    consts = f"constexpr int D = {D}, BK = {BK}, ROWS = {ROWS};\nconstexpr bool FALLBACK = {str(fallback).lower()};\n"
    k = kk.metal_kernel("tops_attention", ["q", "k", "v"], ["o", "stats"], ATTENTION, header=HEADER + consts)
    q = torch.randn(M, D, device=device).half()
    kt = torch.randn(BK, D, device=device).half()
    v = torch.randn(BK, D, device=device).half()
    o, stats = k(inputs=[q, kt, v], output_shapes=[(M, D), (M, 2)], output_dtypes=[torch.float32] * 2,
                 grid=(128, 1, 1), threadgroup=(128, 1, 1))
    s = q.double() @ kt.double().T
    mx = s.max(dim=1, keepdim=True).values
    p = torch.exp(s - mx)
    torch.testing.assert_close(stats[:, 0].double(), mx[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(stats[:, 1].double(), p.sum(1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(o.double(), p @ v.double(), rtol=1e-4, atol=1e-4)


# A fused epilogue: bias loaded into a cooperative tensor of the destination's layout, a
# coordinate-dependent mask, column sums by reduce_columns, the right input from another op's
# destination (a register exchange: not compatible), and execution_thread for the leftovers.
EPILOGUE = """
  const uint sgid = simdgroup_index_in_threadgroup;
  auto tA = tensor(a, dextents<int, 2>(K, M));
  auto tB = tensor(b, dextents<int, 2>(N, K));
  auto tBias = tensor(bias, dextents<int, 2>(N, M));
  constexpr auto desc = matmul2d_descriptor(M, N, K);
  matmul2d<desc, execution_simdgroup> op;
  auto ct = op.get_destination_cooperative_tensor<decltype(tA), decltype(tB), float>();
  op.run(tA, tB, ct);
  auto ctBias = op.get_destination_cooperative_tensor<decltype(tA), decltype(tB), float>();
  ctBias.load(tBias);
  for (ushort i = 0; i < ct.get_capacity(); ++i) {
    if (!ct.get_mask(i)) continue;
    auto idx = ct.get_multidimensional_index(i);
    ct[i] = idx[0] > idx[1] ? 0.0f : ct[i] + ctBias[i];   // keep the lower triangle (col <= row)
  }
  auto colsum = op.get_column_reduction_destination_cooperative_tensor<decltype(tA), decltype(tB), float>();
  reduce_columns(ct, colsum, reduction_operation::sum, 0.0f);
  for (ushort i = 0; i < colsum.get_capacity(); ++i)
    if (colsum.is_valid_element(i)) sums[colsum.get_multidimensional_index(i)[0]] = colsum[i];
  ct.store(tensor(c, dextents<int, 2>(N, M)));

  // (c as the right input of a second op: out2 = a2 (M x M) * c (M x N))
  auto tA2 = tensor(a2, dextents<int, 2>(M, M));
  constexpr auto desc2 = matmul2d_descriptor(M, N, M);
  matmul2d<desc2, execution_simdgroup> op2;
  auto right = op2.get_right_input_cooperative_tensor<float, float, float>(ct);
  auto out = op2.get_destination_cooperative_tensor<decltype(tA2), decltype(right), float>();
  if (op2.is_compatible_as_right_input<float, float, float>(ct)) return;  // never: a right input is held transposed
  op2.run(tA2, right, out);
  out.store(tensor(c2, dextents<int, 2>(N, M)));

  // One thread does a whole (small) product on its own.
  constexpr auto desc3 = matmul2d_descriptor(3, 5, K);
  matmul2d<desc3, execution_thread> op3;
  if (thread_index_in_simdgroup == 7) {
    auto t3 = tensor(c3, dextents<int, 2>(5, 3));
    op3.run(tA, tB, t3);
  }
"""


def test_epilogue_reductions_right_input_thread_scope(device):
    M, N, K = 16, 24, 20
    consts = f"constexpr int M = {M}, N = {N}, K = {K};\n"
    k = kk.metal_kernel("tops_epilogue", ["a", "b", "bias", "a2"], ["c", "sums", "c2", "c3"], EPILOGUE,
                        header=HEADER + consts)
    a, b, bias, a2 = (torch.randn(s, device=device) for s in [(M, K), (K, N), (M, N), (M, M)])
    c, sums, c2, c3 = k(inputs=[a, b, bias, a2], output_shapes=[(M, N), (N,), (M, N), (3, 5)],
                        output_dtypes=[torch.float32] * 4, grid=(32, 1, 1), threadgroup=(32, 1, 1))
    ref = torch.tril(a.double() @ b.double() + bias.double())
    torch.testing.assert_close(c.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sums.double(), ref.sum(0), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(c2.double(), a2.double() @ ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(c3.double(), (a.double() @ b.double())[:3, :5], rtol=1e-5, atol=1e-5)


# The talk's quantized matmul: MXFP8 tensors (e4m3 with a ue8m0 scales plane of 32 x 1 blocks);
# without SCALED, plain fp8 tensors (e4m3 x e5m2, a per-tensor scale applied after).
FP8 = """
  const uint2 tgid = threadgroup_position_in_grid.xy;
#if SCALED
  using scales_plane = tensor_blockwise<tensor_plane_scales, device metal_fp8_ue8m0_format, 32, 1>;
  using mxfp8_tensor_inline = tensor<device metal_fp8_e4m3_format, dextents<int, 2>, tensor_inline, scales_plane>;
  auto matrixA = mxfp8_tensor_inline((device metal_fp8_e4m3_format*)a, dextents<int, 2>(K, M), array<int, 2>({1, K}),
                                     scales_plane(sa));
  auto matrixB = mxfp8_tensor_inline((device metal_fp8_e4m3_format*)bt, dextents<int, 2>(K, N), array<int, 2>({1, K}),
                                     scales_plane(sb));
#else
  // (a uint8 buffer holds 8-bit formats: no cast needed)
  auto matrixA = tensor<const device metal_fp8_e4m3_format, dextents<int, 2>, tensor_inline>(a, dextents<int, 2>(K, M));
  auto matrixB = tensor<const device metal_fp8_e5m2_format, dextents<int, 2>, tensor_inline>(bt, dextents<int, 2>(K, N));
#endif
  auto matrixC = tensor(c, dextents<int, 2>(N, M));
  auto tA = matrixA.slice(0, tgid.y * TILEM);
  auto tB = matrixB.slice(0, tgid.x * TILEN);
  auto tC = matrixC.slice(tgid.x * TILEN, tgid.y * TILEM);
  constexpr auto descriptor = matmul2d_descriptor(TILEM, TILEN, dynamic_length_v<int>, false, true);
  matmul2d<descriptor, execution_simdgroups<4>> op;
  op.run(tA, tB, tC);
"""


@pytest.mark.parametrize("scaled", [True, False])
def test_fp8_matmul(device, scaled):
    M, N, K, TM, TN = 40, 24, 96, 32, 16
    consts = f"#define SCALED {int(scaled)}\nconstexpr int TILEM = {TM}, TILEN = {TN}, M = {M}, N = {N}, K = {K};\n"
    k = kk.metal_kernel("tops_fp8", ["a", "sa", "bt", "sb"], ["c"], FP8, header=HEADER + consts)
    a, bt = torch.randn(M, K, device=device) * 4, torch.randn(N, K, device=device) * 4
    sa = torch.randint(120, 134, (M, K // 32), dtype=torch.uint8, device=device)
    sb = torch.randint(120, 134, (N, K // 32), dtype=torch.uint8, device=device)
    fb = torch.float8_e4m3fn if scaled else torch.float8_e5m2
    qa, qb = a.to(torch.float8_e4m3fn).view(torch.uint8), bt.to(fb).view(torch.uint8)
    c = k(inputs=[qa, sa, qb, sb], output_shapes=[(M, N)], output_dtypes=[torch.float32],
          grid=(128 * -(-N // TN), -(-M // TM), 1), threadgroup=(128, 1, 1))[0]

    def deq(q, f, s):
        x = q.view(f).double()
        return x * torch.exp2(s.double() - 127).repeat_interleave(32, dim=1) if scaled else x
    ref = deq(qa, torch.float8_e4m3fn, sa) @ deq(qb, fb, sb).T
    # exact products, float32 sums: errors relative to the largest magnitude (the scales span 2^13)
    torch.testing.assert_close(c.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


# A GEMM as MLX's steel kernels write it: 8 x 8 simdgroup_matrix fragments, thread_elements()
# filled at the documented coordinates, simdgroup_multiply_accumulate, simdgroup_store.
SIMDGROUP_GEMM = """
  const uint lane = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
  const short qid = lane / 4;
  const short fm = (qid & 4) + ((lane / 2) % 4), fn = (qid & 2) * 2 + (lane % 2) * 2;
  const int row0 = (threadgroup_position_in_grid.y * 2 + sg / 2) * 16, col0 = (threadgroup_position_in_grid.x * 2 + sg % 2) * 16;
  simdgroup_matrix<T, 8, 8> acc[2][2];
  for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<T, 8, 8>(T(0));
  for (int k = 0; k < K; k += 8) {
    simdgroup_matrix<TI, 8, 8> fa[2], fb[2];
    for (int i = 0; i < 2; ++i) {
      fa[i].thread_elements()[0] = a[(row0 + 8 * i + fm) * K + k + fn];
      fa[i].thread_elements()[1] = a[(row0 + 8 * i + fm) * K + k + fn + 1];
      simdgroup_load(fb[i], b, N, ulong2(col0 + 8 * i, k));
    }
    for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) simdgroup_multiply_accumulate(acc[i][j], fa[i], fb[j], acc[i][j]);
  }
  for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) simdgroup_store(acc[i][j], c, N, ulong2(col0 + 8 * j, row0 + 8 * i));
  if (sg == 0 && threadgroup_position_in_grid.x == 0 && threadgroup_position_in_grid.y == 0) {
    simdgroup_matrix<T, 8, 8> x, y, z;
    simdgroup_load(x, a, K, ulong2(0, 0), true);      // a[0:8, 0:8] transposed
    y = simdgroup_matrix<T, 8, 8>(T(2));             // 2 * identity
    simdgroup_multiply(z, x, y);
    simdgroup_store(z, extra, 8);
  }
"""


@pytest.mark.parametrize("dtype,acc", [(torch.float32, torch.float32), (torch.float16, torch.float16),
                                       (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)])
def test_simdgroup_matrix_gemm(device, dtype, acc):
    """Fragments of dtype into accumulators of acc (MLX: half fragments, float accumulators)."""
    M, N, K = 64, 32, 24
    k = kk.metal_kernel("tops_sg_gemm", ["a", "b"], ["c", "extra"], SIMDGROUP_GEMM,
                        header="#include <metal_simdgroup_matrix>\n")
    a, b = torch.randn(M, K, device=device).to(dtype), torch.randn(K, N, device=device).to(dtype)
    c, extra = k(inputs=[a, b], output_shapes=[(M, N), (8, 8)], output_dtypes=[acc, acc],
                 grid=(128 * (N // 32), M // 32, 1), threadgroup=(128, 1, 1),
                 template=[("T", acc), ("TI", dtype), ("N", N), ("K", K)])
    tol = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 8e-2}[acc]
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=tol, atol=tol)
    torch.testing.assert_close(extra.double(), 2 * a[:8, :8].double().T, rtol=tol, atol=tol)


@pytest.mark.parametrize("threads", [64, 40], ids=["whole-warps", "partial-warp"])
def test_simdgroup_matrix_in_either_lane_order(device, threads):
    """A threadgroup of whole warps runs its lanes in mma.sync's order, one with a partial warp in the
    hardware's (its first SIMD-group is whole and multiplies): both give the product, and the lanes'
    own numbering is Metal's either way."""
    body = """
  const uint lane = thread_index_in_simdgroup;
  lanes[thread_index_in_threadgroup] = simd_shuffle(lane, (lane + 5) % 32u);
  if (simdgroup_index_in_threadgroup != 0) return;
  simdgroup_matrix<T, 8, 8> x, y, z;
  simdgroup_load(x, a, 8);
  simdgroup_load(y, b, 8, ulong2(0, 0), true);   // b transposed
  simdgroup_multiply(z, x, y);
  simdgroup_store(z, c, 8);
"""
    k = kk.metal_kernel("tops_sg_lane_orders", ["a", "b"], ["c", "lanes"], body,
                        header="#include <metal_simdgroup_matrix>\n")
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        a, b = (torch.randn(8, 8, device=device).to(dtype) for _ in range(2))
        c, lanes = k(inputs=[a, b], output_shapes=[(8, 8), (threads,)], output_dtypes=[dtype, torch.int32],
                     grid=(threads, 1, 1), threadgroup=(threads, 1, 1), template=[("T", dtype)], init_value=-1)
        tol = {torch.float32: 1e-5, torch.float16: 2e-2, torch.bfloat16: 8e-2}[dtype]
        torch.testing.assert_close(c.double(), a.double() @ b.double().T, rtol=tol, atol=tol)
        t = torch.arange(threads)
        size = torch.clamp(threads - t // 32 * 32, max=32)  # the SIMD-group's lanes
        want = torch.where((t % 32 + 5) % 32 < size, t // 32 * 32 + (t % 32 + 5) % 32, t) % 32
        assert torch.equal(lanes.cpu(), want.int())


# MLX's steel GEMM (mlx/backend/metal/kernels/steel/gemm: BlockMMA, MMATile, BaseMMAFrag) as a body:
# 64 x 64 x 16 threadgroup tiles staged in threadgroup memory (rows padded by 16 bytes, 16-byte
# vector copies), 2 x 2 SIMD-groups of 4 x 4 float fragments each, fragments filled from
# threadgroup memory at get_coord's place, simdgroup_multiply_accumulate in serpentine order.
STEEL_HEADER = """#include <metal_simdgroup_matrix>
struct Frag {  // BaseMMAFrag<float, 8, 8>
  typedef simdgroup_matrix<float, 8, 8> mat_type;
  typedef vec<float, 2> frag_type;
  static short2 get_coord(ushort simd_lane_id) {
    const short qid = simd_lane_id / 4;
    const short fm = (qid & 4) + ((simd_lane_id / 2) % 4);
    const short fn = (qid & 2) * 2 + (simd_lane_id % 2) * 2;
    return short2{fn, fm};
  }
  static void mma(thread frag_type& D, thread frag_type& A, thread frag_type& B, thread frag_type& C) {
    mat_type D_mat, A_mat, B_mat, C_mat;
    reinterpret_cast<thread frag_type&>(A_mat.thread_elements()) = A;
    reinterpret_cast<thread frag_type&>(B_mat.thread_elements()) = B;
    reinterpret_cast<thread frag_type&>(C_mat.thread_elements()) = C;
    simdgroup_multiply_accumulate(D_mat, A_mat, B_mat, C_mat);
    D = reinterpret_cast<thread frag_type&>(D_mat.thread_elements());
  }
};
struct alignas(16) ReadVector { uint8_t v[16]; };
#define STEEL_PRAGMA_UNROLL _Pragma("clang loop unroll(full)")
"""
STEEL_GEMM = """
  constexpr short BM = 64, BN = 64, BK = 16, WM = 2, WN = 2, PAD = 16 / sizeof(T);
  constexpr short TM = BM / (8 * WM), TN = BN / (8 * WN), LDA = BK + PAD, LDB = BN + PAD;
  constexpr short VEC = 16 / sizeof(T);
  threadgroup T As[BM * LDA];
  threadgroup T Bs[BK * LDB];
  const ushort lane = thread_index_in_simdgroup, sg = simdgroup_index_in_threadgroup;
  const ushort tid = thread_index_in_threadgroup;
  const int K = a_shape[1], N = b_shape[1];
  const int m0 = threadgroup_position_in_grid.y * BM, n0 = threadgroup_position_in_grid.x * BN;
  const short2 coord = Frag::get_coord(lane);
  const short sm = 8 * (sg / WN) + coord.y, sn = 8 * (sg % WN) + coord.x;
  Frag::frag_type Ctile[TM * TN];
  STEEL_PRAGMA_UNROLL
  for (short i = 0; i < TM * TN; ++i) Ctile[i] = Frag::frag_type(0);
  for (int k0 = 0; k0 < K; k0 += BK) {
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (short v = tid; v < BM * BK / VEC; v += 32 * WM * WN) {
      const short r = v / (BK / VEC), c = (v % (BK / VEC)) * VEC;
      *((threadgroup ReadVector*)(&As[r * LDA + c])) = *((const device ReadVector*)(&a[(m0 + r) * K + k0 + c]));
    }
    for (short v = tid; v < BK * BN / VEC; v += 32 * WM * WN) {
      const short r = v / (BN / VEC), c = (v % (BN / VEC)) * VEC;
      *((threadgroup ReadVector*)(&Bs[r * LDB + c])) = *((const device ReadVector*)(&b[(k0 + r) * N + n0 + c]));
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    STEEL_PRAGMA_UNROLL
    for (short kk = 0; kk < BK; kk += 8) {
      simdgroup_barrier(mem_flags::mem_none);
      Frag::frag_type Atile[TM], Btile[TN];
      STEEL_PRAGMA_UNROLL
      for (short i = 0; i < TM; ++i)
        STEEL_PRAGMA_UNROLL
        for (short j = 0; j < 2; ++j) Atile[i][j] = static_cast<float>(As[(sm + i * 8 * WM) * LDA + kk + coord.x + j]);
      simdgroup_barrier(mem_flags::mem_none);
      STEEL_PRAGMA_UNROLL
      for (short i = 0; i < TN; ++i)
        STEEL_PRAGMA_UNROLL
        for (short j = 0; j < 2; ++j) Btile[i][j] = static_cast<float>(Bs[(kk + coord.y) * LDB + sn + i * 8 * WN + j]);
      simdgroup_barrier(mem_flags::mem_none);
      STEEL_PRAGMA_UNROLL
      for (short m = 0; m < TM; ++m)
        STEEL_PRAGMA_UNROLL
        for (short n = 0; n < TN; ++n) {
          const short n_serp = (m % 2) ? (TN - 1 - n) : n;
          Frag::mma(Ctile[m * TN + n_serp], Atile[m], Btile[n_serp], Ctile[m * TN + n_serp]);
        }
    }
  }
  STEEL_PRAGMA_UNROLL
  for (short i = 0; i < TM; ++i)
    STEEL_PRAGMA_UNROLL
    for (short j = 0; j < TN; ++j)
      STEEL_PRAGMA_UNROLL
      for (short e = 0; e < 2; ++e)
        c[(m0 + sm + i * 8 * WM) * N + n0 + sn + j * 8 * WN + e] = Ctile[i * TN + j][e];
"""


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_steel_gemm(device, dtype):
    """MLX's steel GEMM (float fragments) on bfloat, half and float data, fp32 accuracy."""
    M, N, K = 128, 64, 48
    k = kk.metal_kernel("tops_steel_gemm", ["a", "b"], ["c"], STEEL_GEMM, header=STEEL_HEADER)
    a, b = torch.randn(M, K, device=device).to(dtype), torch.randn(K, N, device=device).to(dtype)
    c, = k(inputs=[a, b], output_shapes=[(M, N)], output_dtypes=[torch.float32], template=[("T", dtype)],
           grid=(128 * (N // 64), M // 64, 1), threadgroup=(128, 1, 1))
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)


# The same layer in a CUDA-dialect body: `#include <kernelkit/tensor_ops.h>`, the same names.
CUDA_MATMUL = """
  using namespace metal;
  using namespace mpp::tensor_ops;
  auto A = tensor(a, dextents<int, 2>(K, M));
  auto B = tensor(b, dextents<int, 2>(N, K));
  auto C = tensor(c, dextents<int, 2>(N, M));
  constexpr auto desc = matmul2d_descriptor(M, N, K);
  matmul2d<desc, execution_simdgroups<2>> op;
  auto ct = op.get_destination_cooperative_tensor<decltype(A), decltype(B), float>();
  op.run(A, B, ct);
  auto rows = op.get_row_reduction_destination_cooperative_tensor<decltype(A), decltype(B), float>();
  reduce_rows(ct, rows, reduction_operation::max, reduction_operation_identity<float>::max_identity);
  auto cols = op.get_column_reduction_destination_cooperative_tensor<decltype(A), decltype(B), float>();
  reduce_columns(ct, cols, reduction_operation::min, reduction_operation_identity<float>::min_identity);
  for (auto it = ct.begin(); it != ct.end(); ++it) *it -= *rows.map_iterator(it);
  ct.store(C);
  if (threadIdx.x < 32)  // every SIMD-group holds the column minima: the first one writes them
    for (int i = 0; i < cols.get_capacity(); ++i)
      if (cols.is_valid_element(i)) colmin[cols.get_multidimensional_index(i)[0]] = cols[i];
"""


def test_cuda_dialect(device):
    M, N, K = 40, 24, 32  # two SIMD-groups share the rows in blocks of 16 (the second holds 16..31)
    k = kk.cuda_kernel("tops_cuda", ["a", "b"], ["c", "colmin"], CUDA_MATMUL,
                       header=f"#include <kernelkit/tensor_ops.h>\nconstexpr int M = {M}, N = {N}, K = {K};\n")
    a, b = torch.randn(M, K, device=device).half(), torch.randn(K, N, device=device).half()
    c, colmin = k(inputs=[a, b], output_shapes=[(M, N), (N,)], output_dtypes=[torch.float32] * 2,
                  grid=(64, 1, 1), threadgroup=(64, 1, 1))
    s = a.double() @ b.double()
    torch.testing.assert_close(c.double(), s - s.max(1, keepdim=True).values, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(colmin.double(), s.min(0).values, rtol=1e-4, atol=1e-4)


# The documented element-to-thread layout (layout.h, README): each thread reports where its
# elements are, for a destination and its row reduction over two SIMD-groups, and for the left and
# right inputs of a SIMD-group op.
LAYOUT = """
  const int tid = thread_index_in_threadgroup;
  auto A = tensor(a, dextents<int, 2>(16, 40));
  constexpr auto desc = matmul2d_descriptor(40, 24, 16);
  matmul2d<desc, execution_simdgroups<2>> op;
  auto d = op.get_destination_cooperative_tensor<decltype(A), decltype(A), float>();
  auto r = op.get_row_reduction_destination_cooperative_tensor<decltype(A), decltype(A), float>();
  for (int i = 0; i < d.get_capacity(); ++i)
    if (d.is_valid_element(i)) dest[d.get_multidimensional_index(i)[1] * 24 + d.get_multidimensional_index(i)[0]] = tid * 100 + i;
  for (auto it = r.begin(); it != r.end(); ++it)
    if (it.is_valid_element()) rows[it.get_multidimensional_index()[0] * 64 + tid] = it.get_index();
  constexpr auto desc2 = matmul2d_descriptor(16, 8, 16);
  matmul2d<desc2, execution_simdgroup> op2;
  auto l = op2.get_left_input_cooperative_tensor<half, half, float>();
  auto rt = op2.get_right_input_cooperative_tensor<half, half, float>();
  if (tid < 32) {
    for (int i = 0; i < l.get_capacity(); ++i)
      if (l.is_valid_element(i)) left[l.get_multidimensional_index(i)[1] * 16 + l.get_multidimensional_index(i)[0]] = tid * 100 + i;
    for (int i = 0; i < rt.get_capacity(); ++i)
      if (rt.is_valid_element(i)) right[rt.get_multidimensional_index(i)[1] * 8 + rt.get_multidimensional_index(i)[0]] = tid * 100 + i;
  }
"""


def _documented(outer, inner, simdgroups, threads):
    """{(outer, inner): thread * 100 + i} by the documented formula; each element once."""
    held, ib = {}, -(-inner // 8)
    for tid in range(threads):
        lane, w = tid % 32, (tid // 32) % simdgroups
        obw = -(-(-(-outer // 16)) // simdgroups)  # 16-row blocks a SIMD-group
        band = 4 if simdgroups % 4 == 0 else simdgroups  # SIMD-groups sharing a band of rows
        for i in range(obw * ib * 4):
            e, j = i % 4, i // 4
            o = 16 * ((w // band) * obw * band + (j // ib) * band + w % band) + lane // 4 + 8 * (e // 2)
            n = 8 * (j % ib) + 2 * (lane % 4) + e % 2
            if o < outer and n < inner:
                assert (o, n) not in held
                held[(o, n)] = tid * 100 + i
    assert len(held) == outer * inner
    return held


def test_cooperative_layout_is_documented(device):
    k = kk.metal_kernel("tops_layout", ["a"], ["dest", "rows", "left", "right"], LAYOUT, header=HEADER)
    a = torch.zeros(40, 16, device=device)
    dest, rows, left, right = k(inputs=[a], output_shapes=[(40, 24), (40, 64), (16, 16), (16, 8)],
                                output_dtypes=[torch.int32] * 4, grid=(64, 1, 1), threadgroup=(64, 1, 1),
                                init_value=-1)
    for out, (outer, inner, w, threads), transposed in [(dest, (40, 24, 2, 64), False), (left, (16, 16, 1, 32), False),
                                                       (right, (8, 16, 1, 32), True)]:
        want = torch.full_like(out, -1, device="cpu")
        for (o, n), v in _documented(outer, inner, w, threads).items():
            want[(n, o) if transposed else (o, n)] = v
        assert torch.equal(out.cpu(), want)
    # a row reduction: per owned 16-row block, rows g and g + 8 in the four lanes of quad g
    want = torch.full((40, 64), -1, dtype=torch.int32)
    for tid in range(64):
        lane, w = tid % 32, tid // 32
        for slot in range(4):
            row = 16 * ((slot // 2) * 2 + w) + lane // 4 + 8 * (slot % 2)
            if row < 40:
                want[row, tid] = slot
    assert torch.equal(rows.cpu(), want)


# Two warpgroups (execution_simdgroups<8>): each four SIMD-groups take a band of rows, as wgmma's
# accumulators; map_iterator into the row reduction finds each element's row there.
LAYOUT8 = """
  const int tid = thread_index_in_threadgroup;
  auto A = tensor(a, dextents<int, 2>(16, 150));
  constexpr auto desc = matmul2d_descriptor(150, 24, 16);
  matmul2d<desc, execution_simdgroups<8>> op;
  auto d = op.get_destination_cooperative_tensor<decltype(A), decltype(A), float>();
  auto r = op.get_row_reduction_destination_cooperative_tensor<decltype(A), decltype(A), float>();
  for (auto it = r.begin(); it != r.end(); ++it)
    if (it.is_valid_element()) *it = float(it.get_multidimensional_index()[0]);
  for (auto it = d.begin(); it != d.end(); ++it) {
    if (!it.is_valid_element()) continue;
    auto idx = it.get_multidimensional_index();
    dest[idx[1] * 24 + idx[0]] = tid * 100 + it.get_index();
    rows[idx[1] * 24 + idx[0]] = int(*r.map_iterator(it));
  }
"""


def test_cooperative_layout_of_two_warpgroups(device):
    k = kk.metal_kernel("tops_layout8", ["a"], ["dest", "rows"], LAYOUT8, header=HEADER)
    a = torch.zeros(150, 16, device=device)
    dest, rows = k(inputs=[a], output_shapes=[(150, 24), (150, 24)], output_dtypes=[torch.int32] * 2,
                   grid=(256, 1, 1), threadgroup=(256, 1, 1), init_value=-1)
    want = torch.full_like(dest, -1, device="cpu")
    for (o, n), v in _documented(150, 24, 8, 256).items():
        want[o, n] = v
    assert torch.equal(dest.cpu(), want)
    assert torch.equal(rows.cpu(), torch.arange(150, dtype=torch.int32)[:, None].expand(150, 24))


def test_scope_mismatch_is_a_clear_error():
    """execution_simdgroups<4> in a threadgroup of 64 threads: the CPU names the op, line and sizes."""
    k = kk.metal_kernel("tops_tile_matmul", ["a", "b"], ["c"], TILE_MATMUL, header=HEADER)
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    with pytest.raises(kk.KernelLaunchError, match=r"matmul2d::run \(body:\d+\).*4 SIMD-group.*has 64 threads"):
        k(inputs=[a, b], output_shapes=[(8, 8)], output_dtypes=[torch.float32], grid=(64, 1, 1), threadgroup=(64, 1, 1),
          template=[("TILEM", 32), ("TILEN", 16), ("TL", False), ("TR", False), ("ACC", False), ("RELAXED", False)])


def test_bad_operand_is_a_clear_compile_error():
    body = """
  auto A = tensor(a, dextents<int, 1>(8));
  auto B = tensor(a, dextents<int, 2>(8, 1));
  auto C = tensor(c, dextents<int, 2>(8, 8));
  matmul2d<matmul2d_descriptor(8, 8), execution_thread> op;
  op.run(A, B, C);
"""
    k = kk.metal_kernel("tops_bad_rank", ["a"], ["c"], body, header=HEADER)
    with pytest.raises(kk.CompileError, match="tensor operands must be rank 2"):
        k(inputs=[torch.randn(8)], output_shapes=[(8, 8)], output_dtypes=[torch.float32], grid=(1, 1, 1),
          threadgroup=(1, 1, 1))


# Cooperative inputs filled by hand at their get_multidimensional_index coordinates, in a K loop
# (the pattern of in-register dequantisation kernels): (k, m) for a left input, (n, k) for a right.
COOP_INPUTS = """
  constexpr auto desc = matmul2d_descriptor(16, 32, 16, false, false, false, matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<desc, execution_simdgroup> op;
  auto aa = op.get_left_input_cooperative_tensor<half, half, float>();
  auto bb = op.get_right_input_cooperative_tensor<half, half, float>();
  auto acc = op.get_destination_cooperative_tensor<decltype(aa), decltype(bb), float>();
  for (int i = 0; i < acc.get_capacity(); ++i) if (acc.is_valid_element(i)) acc[i] = 0.0f;
  for (int kb = 0; kb < K; kb += 16) {
    for (int i = 0; i < aa.get_capacity(); ++i) {
      if (!aa.is_valid_element(i)) continue;
      auto c = aa.get_multidimensional_index(i);
      const int r = c[1], k = kb + c[0];
      aa[i] = r < M && k < K ? x[r * K + k] : half(0);
    }
    for (int i = 0; i < bb.get_capacity(); ++i) {
      if (!bb.is_valid_element(i)) continue;
      auto c = bb.get_multidimensional_index(i);
      const int n = c[0], k = kb + c[1];
      bb[i] = k < K ? half(float(w[k * 32 + n]) * 0.5f) : half(0);   // dequantised: int8 * scale
    }
    op.run(aa, bb, acc);
  }
  acc.store(tensor(out, dextents<int, 2>(32, M)));
"""


def test_cooperative_inputs_k_loop(device):
    M, K = 13, 40
    k = kk.metal_kernel("tops_coop_inputs", ["x", "w"], ["out"], COOP_INPUTS,
                        header=HEADER + f"constexpr int M = {M}, K = {K};\n")
    x = torch.randn(M, K, device=device).half()
    w = torch.randint(-8, 8, (K, 32), dtype=torch.int8, device=device)
    out = k(inputs=[x, w], output_shapes=[(M, 32)], output_dtypes=[torch.float32], grid=(32, 1, 1),
            threadgroup=(32, 1, 1))[0]
    torch.testing.assert_close(out.double(), x.double() @ (w.double() * 0.5), rtol=1e-4, atol=1e-4)


# `name_tensor`: an input seen as a metal::tensor with its shape and strides (innermost first).
VIEWS = """
  const uint2 tgid = threadgroup_position_in_grid.xy;
  auto tC = tensor(c, dextents<int, 2>(b_tensor.get_extent(0), a_tensor.get_extent(1)));
  constexpr auto desc = matmul2d_descriptor(32, 16);
  matmul2d<desc, execution_simdgroups<4>> op;
  op.run(a_tensor.slice(0, tgid.y * 32), b_tensor.slice(tgid.x * 16, 0), tC.slice(tgid.x * 16, tgid.y * 32));
  if (thread_position_in_grid.x == 0 && thread_position_in_grid.y == 0) {
    for (int d = 0; d < 3; ++d) info[d] = x_tensor.get_extent(d);
    info[3] = x_tensor(1, 2, 0);
    tensor<const device float, dextents<int, 2>, tensor_offset> bo(b, dextents<int, 2>(20, 24));  // Apple's comments' spelling
    info[4] = bo.slice(1, 2)(0, 0);
  }
"""


def test_input_tensor_views(device):
    """a is a transposed view (ensure_row_contiguous=False): its strides come along."""
    M, N, K = 40, 20, 24
    k = kk.metal_kernel("tops_views", ["a", "b", "x"], ["c", "info"], VIEWS, header=HEADER, ensure_row_contiguous=False)
    a = torch.randn(K, M, device=device).T
    b, x = torch.randn(K, N, device=device), torch.randn(2, 3, 4, device=device)
    c, info = k(inputs=[a, b, x], output_shapes=[(M, N), (5,)], output_dtypes=[torch.float32] * 2,
                grid=(128 * 2, 2, 1), threadgroup=(128, 1, 1))
    torch.testing.assert_close(c.double(), a.double() @ b.double(), rtol=1e-5, atol=1e-5)
    assert info.tolist() == [4, 3, 2, float(x[0, 2, 1]), float(b[2, 1])]


# Every 8-bit code of e4m3 and e5m2 (but NaN and infinity) times the identity: decoded exactly.
FP8_CODES = """
  constexpr auto desc = matmul2d_descriptor(16, 16, 16);
  matmul2d<desc, execution_simdgroup> op;
  auto A4 = tensor<const device metal_fp8_e4m3_format, dextents<int, 2>, tensor_inline>(a4, dextents<int, 2>(16, 16));
  auto I4 = tensor<const device metal_fp8_e4m3_format, dextents<int, 2>, tensor_inline>(i4, dextents<int, 2>(16, 16));
  auto A5 = tensor<const device metal_fp8_e5m2_format, dextents<int, 2>, tensor_inline>(a5, dextents<int, 2>(16, 16));
  auto I5 = tensor<const device metal_fp8_e5m2_format, dextents<int, 2>, tensor_inline>(i5, dextents<int, 2>(16, 16));
  auto C4 = tensor(o4, dextents<int, 2>(16, 16));
  auto C5 = tensor(o5, dextents<int, 2>(16, 16));
  op.run(A4, I4, C4);
  op.run(A5, I5, C5);
"""


def test_fp8_codes_decode_exactly(device):
    k = kk.metal_kernel("tops_fp8_codes", ["a4", "i4", "a5", "i5"], ["o4", "o5"], FP8_CODES, header=HEADER)
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 16)
    outs, refs, inputs = [], [], []
    for fmt, one in ((torch.float8_e4m3fn, 0x38), (torch.float8_e5m2, 0x3C)):
        finite = codes.view(fmt).float().isfinite()
        a = torch.where(finite, codes, torch.zeros_like(codes))
        inputs += [a.to(device), (torch.eye(16, dtype=torch.uint8) * one).to(device)]
        refs.append(a.view(fmt).double())
    outs = k(inputs=inputs, output_shapes=[(16, 16)] * 2, output_dtypes=[torch.float32] * 2,
             grid=(32, 1, 1), threadgroup=(32, 1, 1))
    for out, ref in zip(outs, refs):
        assert torch.equal(out.double().cpu(), ref)


def test_warpgroup_shared_memory_is_read_from_the_cubin():
    """Each warpgroup run site names its shared memory in a symbol; the backend launches with the most."""
    from kernelkit.backends import cuda
    cubin = b"\x00_Z20kk_tops_dynamic_smemILi50176EE\x00_Z20kk_tops_dynamic_smemILi99328EE\x00other"
    assert cuda.tensor_ops_shared(cubin) == 99328
    assert cuda.tensor_ops_shared(b"no tensor ops") == 0
    assert cuda.target_arch("sm_90", "#define KK_TENSOR_OPS 1\n") == "sm_90a"
    assert cuda.target_arch("sm_90", "plain") == "sm_90"
    assert cuda.target_arch("sm_80", "#define KK_TENSOR_OPS 1") == "sm_80"


# A 64 x 40 tile on execution_simdgroups<4> from tensors over rows of LA / LB elements starting OFF
# elements in, in threadgroup memory (SH) or device memory: mma_sync.h reads interior fragments
# with ldmatrix (16-byte aligned threadgroup rows), 32-bit loads (4-byte aligned rows; movmatrix
# for rows along m or n) or bytes, and the rest element by element.
ROWS_TILE = """
  const int M = p[0], N = p[1], K = p[2], LA = p[3], LB = p[4], OFF = p[5];
  const int AR = TL ? K : M, BR = TR ? N : K;
  threadgroup uint4 a_raw[(64 * 96 + 16) * sizeof(T) / 16];
  threadgroup uint4 b_raw[(64 * 96 + 16) * sizeof(T) / 16];
  threadgroup T* As = reinterpret_cast<threadgroup T*>(a_raw);
  threadgroup T* Bs = reinterpret_cast<threadgroup T*>(b_raw);
  for (int i = thread_index_in_threadgroup; i < OFF + AR * LA; i += 128) As[i] = a[i];
  for (int i = thread_index_in_threadgroup; i < OFF + BR * LB; i += 128) Bs[i] = b[i];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  auto C = tensor(c, dextents<int, 2>(N, M));
  constexpr auto descriptor = matmul2d_descriptor(64, 40, dynamic_length_v<int>, TL, TR);
  matmul2d<descriptor, execution_simdgroups<4>> op;
  const auto ea = TL ? dextents<int, 2>(M, K) : dextents<int, 2>(K, M);
  const auto eb = TR ? dextents<int, 2>(K, N) : dextents<int, 2>(N, K);
  if (p[6]) op.run(tensor(As + OFF, ea, array<int, 2>({1, LA})), tensor(Bs + OFF, eb, array<int, 2>({1, LB})), C);
  else op.run(tensor(a + OFF, ea, array<int, 2>({1, LA})), tensor(b + OFF, eb, array<int, 2>({1, LB})), C);
"""


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int8])
@pytest.mark.parametrize("tl,tr", [(False, False), (True, True), (False, True), (True, False)])
def test_tile_matmul_memory_rows(device, dtype, tl, tr):
    """Whole tiles and ragged ones (58 x 37, K = 44), rows padded to 16-byte multiples (ldmatrix),
    to 4-byte ones (32-bit loads), odd or off by one element (element reads), from both memories."""
    k = kk.metal_kernel("tops_rows_tile", ["a", "b", "p"], ["c"], ROWS_TILE, header=HEADER)
    out = torch.int32 if dtype == torch.int8 else torch.float32
    unit = 16 // dtype.itemsize  # elements in 16 bytes
    word = 4 // dtype.itemsize
    for M, N, K in [(64, 40, 64), (58, 37, 44)]:
        A, B = _rand((M, K), dtype, device), _rand((K, N), dtype, device)
        ref = A.double() @ B.double()
        am, bm = (A.T if tl else A), (B.T if tr else B)  # as memory rows
        for pad, off in [(0, 0), (unit, 0), (word, word), (1, 0), (0, 1)]:
            la, lb = -(-am.shape[1] // unit) * unit + pad, -(-bm.shape[1] // unit) * unit + pad

            def flat(x, ld):
                rows = torch.zeros(x.shape[0], ld, dtype=dtype, device=device)
                rows[:, :x.shape[1]] = x
                return torch.cat([torch.zeros(off, dtype=dtype, device=device), rows.flatten()])

            for shared in (1, 0):
                p = torch.tensor([M, N, K, la, lb, off, shared], dtype=torch.int32, device=device)
                c = k(inputs=[flat(am, la), flat(bm, lb), p], output_shapes=[(M, N)], output_dtypes=[out],
                      grid=(128, 1, 1), threadgroup=(128, 1, 1),
                      template=[("T", dtype), ("TL", tl), ("TR", tr)])[0]
                what = f"{M}x{N}x{K} pad {pad} offset {off} {'threadgroup' if shared else 'device'}"
                if dtype == torch.int8:
                    assert torch.equal(c.long(), ref.long()), what
                else:
                    torch.testing.assert_close(c.double(), ref, rtol=1e-4, atol=1e-4, msg=what)

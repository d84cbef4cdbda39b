"""The talk's matmul as the issue's benchmark writes it (bench/bench_talk_matmul.py): each
threadgroup slices its tile and runs matmul2d once over all of K, on execution_simdgroups<8> (two
Hopper warpgroups sharing a 256 x 128 tile) and <4> (one, 128 x 128), with tiles walked in bands
or not; sizes that are not tile multiples, output in the input type or float, rows that are
whole 16-byte chunks or not."""

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
HEADER = """#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace mpp::tensor_ops;
"""


def _bench():
    spec = importlib.util.spec_from_file_location("bench_talk_matmul", ROOT / "bench" / "bench_talk_matmul.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("variant", ["256x128sg8b8", "256x128sg8", "128x128sg4b16"])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)])
@pytest.mark.parametrize("N", [200, 203])  # rows of whole 16-byte chunks or not (staged_io.h)
def test_talk_matmul(device, variant, dtype, out_dtype, N):
    bench = _bench()
    M, K = 300, 100
    a, b = torch.randn(M, K, device=device).to(dtype), torch.randn(K, N, device=device).to(dtype)
    c = bench.kernel(dtype, out_dtype, variant)(**bench.call_args(a, b, out_dtype, variant))[0]
    ref = a.double() @ b.double()
    tol = 1e-2 if out_dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(c.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


@pytest.mark.parametrize("variant", ["256x128sg8b8", "128x128sg4b16"])
def test_talk_matmul_long_k(device, variant):
    """K of 16 stage tiles and more: on Hopper the runs stage through TMA (shorter ones, cp.async)."""
    bench = _bench()
    M, K, N = 260, 1040, 136
    a, b = torch.randn(M, K, device=device).to(torch.bfloat16), torch.randn(K, N, device=device).to(torch.bfloat16)
    c = bench.kernel(torch.bfloat16, torch.float32, variant)(**bench.call_args(a, b, torch.float32, variant))[0]
    ref = a.double() @ b.double()
    torch.testing.assert_close(c.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


def test_two_warpgroups_take_their_shared_memory(nvrtc):
    """execution_simdgroups<8> on sm_90a instantiates warpgroup_gemm<256, 128, .., 4 stages, 2
    warpgroups>: the cubin asks the launcher for its 4 * (256 + 128) * 128 + 1536 bytes."""
    from kernelkit.backends import cuda
    import kernelkit as kk
    bench = _bench()
    meta = torch.empty(512, 512, dtype=torch.bfloat16, device="meta")
    args = bench.call_args(meta, meta, torch.bfloat16, "256x128sg8b8")
    compiled = kk.compile_for(bench.kernel(torch.bfloat16, torch.bfloat16, "256x128sg8b8"), "sm_90",
                              inputs=args["inputs"], output_dtypes=args["output_dtypes"], template=args["template"])
    assert compiled.arch == "sm_90a"
    assert cuda.tensor_ops_shared(compiled.binary) == 4 * (256 + 128) * 128 + 1536


# Warpgroups of one threadgroup running ops of different sizes at the same time, then one op over
# both (warpgroup.h: only the first group of a width takes the warpgroup path; sm90_wgmma.h: each
# width its own barriers, a two-warpgroup run starts at its barrier). Slices at j * bytes of each
# op's size gave the second warpgroup's small op memory inside the first's large one (wrong sums).
GROUPS = """
  const uint wg = simdgroup_index_in_threadgroup / 4;
  auto A = tensor(a, dextents<int, 2>(K, 128));
  auto B = tensor(b, dextents<int, 2>(192, K));
  if (wg == 0) {
    constexpr auto dx = matmul2d_descriptor(64, 192, dynamic_length_v<int>);
    matmul2d<dx, execution_simdgroups<4>> x;
    x.run(A, B, tensor(cx, dextents<int, 2>(192, 64)));
  } else {
    constexpr auto dy = matmul2d_descriptor(64, 64, dynamic_length_v<int>);
    matmul2d<dy, execution_simdgroups<4>> y;
    y.run(A.slice(0, 64), B, tensor(cy, dextents<int, 2>(64, 64)));
  }
  constexpr auto dz = matmul2d_descriptor(128, 128, dynamic_length_v<int>);
  matmul2d<dz, execution_simdgroups<8>> z;
  z.run(A, B, tensor(cz, dextents<int, 2>(128, 128)));
"""


def test_groups_of_one_threadgroup_running_different_ops(device):
    import kernelkit as kk
    K = 1024  # 16 K tiles: on Hopper the runs stage through TMA
    k = kk.metal_kernel("tops_groups", ["a", "b"], ["cx", "cy", "cz"], GROUPS, header=HEADER)
    a = torch.randn(128, K, device=device).to(torch.bfloat16)
    b = torch.randn(K, 192, device=device).to(torch.bfloat16)
    outs = k(inputs=[a, b], output_shapes=[(64, 192), (64, 64), (128, 128)], output_dtypes=[torch.float32] * 3,
             grid=(256 * 8, 1, 1), threadgroup=(256, 1, 1), template=[("K", K)], init_value=float("nan"))
    ad, bd = a.double(), b.double()
    for out, ref in zip(outs, (ad[:64] @ bd, ad[64:] @ bd[:, :64], ad @ bd[:, :128])):
        torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())


# kernelkit's extension of Apple's API: a left input cooperative tensor on execution_simdgroups<W>
# (Apple's SDK takes input cooperative tensors on execution_simdgroup only). On Hopper it is
# wgmma's register operand: C = A B into a destination cooperative tensor, then O = C V1 + C V2,
# C reused in registers as the left input (flash attention's pattern), the right operands read
# from device memory, rows, columns and keys past the tensors' ends included.
_REGISTERS = """
  constexpr auto mul_desc = matmul2d_descriptor(M, N, K, false, TB);
  matmul2d<mul_desc, execution_simdgroups<W>> mul_op;
  constexpr auto acc_desc = matmul2d_descriptor(M, NV, N, false, false, false, matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<acc_desc, execution_simdgroups<W>> acc_op;
  const int rows = a_shape[0], nb = TB ? b_shape[0] : b_shape[1], row0 = threadgroup_position_in_grid.x * M;
  auto tA = tensor(a, dextents<int, 2>(K, rows), array<int, 2>({1, K}));
  auto tB = TB ? tensor(b, dextents<int, 2>(K, nb), array<int, 2>({1, K})) : tensor(b, dextents<int, 2>(nb, K), array<int, 2>({1, nb}));
  auto tV = tensor(v, dextents<int, 2>(NV, int(v_shape[0])), array<int, 2>({1, NV}));
  auto ctA = mul_op.template get_left_input_cooperative_tensor<T, T, float>();
  ctA.load(tA.slice(0, row0));
  auto ctC = mul_op.template get_destination_cooperative_tensor<decltype(ctA), decltype(tB), float>();
  mul_op.run(ctA, tB, ctC);
  auto ctP = acc_op.template get_left_input_cooperative_tensor<T, T, float>(ctC);
  auto ctO = acc_op.template get_destination_cooperative_tensor<decltype(ctP), decltype(tV), float>();
  acc_op.run(ctP, tV, ctO);
  acc_op.run(ctP, tV.slice(0, N), ctO);
  auto tO = tensor(o, dextents<int, 2>(NV, rows), array<int, 2>({1, NV}));
  ctO.store(tO.slice(0, row0));
"""


@pytest.mark.parametrize("W, M", [(4, 64), (4, 128), (8, 128)])  # 16 or 32 rows a SIMD-group
@pytest.mark.parametrize("TB", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_left_input_cooperative_on_simdgroups(device, W, M, TB, dtype):
    import kernelkit as kk
    N, K, NV = 128, 64, 64
    rows, nb, nv = 150, 100, 200  # a tail of rows, fewer columns of B than N, V2 with N - 56 rows
    a = torch.randn(rows, K, device=device).to(dtype)
    b = torch.randn((nb, K) if TB else (K, nb), device=device).to(dtype)
    v = torch.randn(nv, NV, device=device).to(dtype)
    kernel = kk.metal_kernel(name="left_input_cooperative", input_names=["a", "b", "v"], output_names=["o"],
                             source=_REGISTERS, header=HEADER)
    o = kernel(inputs=[a, b, v], template=[("T", dtype), ("M", M), ("N", N), ("K", K), ("NV", NV), ("W", W), ("TB", TB)],
               output_shapes=[(rows, NV)], output_dtypes=[torch.float32], init_value=float("nan"),
               grid=(32 * W * -(-rows // M), 1, 1), threadgroup=(32 * W, 1, 1))[0]
    c = a.double() @ (b.double().T if TB else b.double())  # rows x nb; columns nb..N read as zero
    p = torch.zeros(rows, N, dtype=torch.float64, device=device)
    p[:, :nb] = c.to(dtype).double()
    vz = torch.zeros(2 * N, NV, dtype=torch.float64, device=device)
    vz[:nv] = v.double()
    ref = p @ vz[:N] + p @ vz[N:]
    torch.testing.assert_close(o.double(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_right_input_cooperative_needs_one_simdgroup():
    import kernelkit as kk
    src = """
  constexpr auto desc = matmul2d_descriptor(64, 64, 64);
  matmul2d<desc, execution_simdgroups<4>> op;
  auto ct = op.template get_right_input_cooperative_tensor<float, float, float>();
  o[0] = ct.get_capacity();
"""
    kernel = kk.metal_kernel(name="right_input_cooperative", input_names=["a"], output_names=["o"], source=src,
                             header=HEADER)
    with pytest.raises(kk.CompileError, match="Input cooperative tensors require a single SIMD group"):
        kernel(inputs=[torch.zeros(1)], output_shapes=[(1,)], output_dtypes=[torch.float32], grid=(128, 1, 1),
               threadgroup=(128, 1, 1))


# One tile read both ways: C = A K^T, then O = C K (flash attention's dQ), K-major then MN-major
# on Hopper (the same bytes of shared memory once staged); and the tile as the kernel's own
# output, rewritten between the runs, which the second run must read again.
_BOTH_WAYS = """
  constexpr auto qk_desc = matmul2d_descriptor(64, 64, D, false, true);
  matmul2d<qk_desc, execution_simdgroups<4>> qk_op;
  constexpr auto pk_desc = matmul2d_descriptor(64, D, 64);
  matmul2d<pk_desc, execution_simdgroups<4>> pk_op;
  const uint tid = thread_index_in_threadgroup;
  auto tA = tensor(a, dextents<int, 2>(D, 64));
  auto ctA = qk_op.template get_left_input_cooperative_tensor<T, T, float>();
  ctA.load(tA);
  auto ctC = qk_op.template get_destination_cooperative_tensor<decltype(ctA), decltype(tA), float>();
  if (FROM_OUTPUT) {
    for (uint i = tid; i < 64 * D; i += 128) w[i] = k[i];
    threadgroup_barrier(mem_flags::mem_device);
    qk_op.run(ctA, tensor(w, dextents<int, 2>(D, 64)), ctC);
    threadgroup_barrier(mem_flags::mem_device);
    for (uint i = tid; i < 64 * D; i += 128) w[i] = T(2) * k[i];
    threadgroup_barrier(mem_flags::mem_device);
  } else {
    qk_op.run(ctA, tensor(k, dextents<int, 2>(D, 64)), ctC);
  }
  auto ctP = pk_op.template get_left_input_cooperative_tensor<T, T, float>(ctC);
  auto ctO = pk_op.template get_destination_cooperative_tensor<decltype(ctP), decltype(tA), float>();
  if (FROM_OUTPUT) pk_op.run(ctP, tensor(w, dextents<int, 2>(D, 64)), ctO);
  else pk_op.run(ctP, tensor(k, dextents<int, 2>(D, 64)), ctO);
  ctO.store(tensor(o, dextents<int, 2>(D, 64)));
"""


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("from_output", [False, True])
def test_a_tile_read_both_ways(device, D, from_output):
    import kernelkit as kk
    dtype = torch.bfloat16
    a, k = (torch.randn(64, D, device=device).to(dtype) for _ in range(2))
    kernel = kk.metal_kernel(name="tile_read_both_ways", input_names=["a", "k"], output_names=["o", "w"],
                             source=_BOTH_WAYS, header=HEADER)
    o, _ = kernel(inputs=[a, k], template=[("T", dtype), ("D", D), ("FROM_OUTPUT", from_output)],
                  output_shapes=[(64, D), (64, D)], output_dtypes=[torch.float32, dtype], init_value=float("nan"),
                  grid=(128, 1, 1), threadgroup=(128, 1, 1))
    p = (a.double() @ k.double().T).to(dtype).double()
    ref = p @ (k.double() * (2 if from_output else 1))
    torch.testing.assert_close(o.double(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())

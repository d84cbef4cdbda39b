r"""Real-world Metal code that uses Apple's tensor ops (Metal 4's MetalPerformancePrimitives
`mpp::tensor_ops`) or `simdgroup_matrix`, run through kernelkit as written.

As in test_real_world_kernels_*.py, each kernel is adapted the way an MLX user would: the `[[kernel]]`
function's body becomes the `source`, what precedes it the `header`; the tensor-op code itself is
verbatim. Where a project generates its Metal in Swift, the generator is ported line by line (its
templates kept, `\(...)` interpolations evaluated by `_swift`). The adaptations, each small: kernel
parameters become a prologue (MLX passes inputs as `const device T*`, so buffers the code declares
non-const are cast; attributes such as `[[threadgroup_position_in_grid]]` become locals from
kernelkit's names; a `[[threadgroup(0)]]` buffer is declared in the body at the size the host sets);
function constants become `constant` values; scalar `constant int&` buffers become template ints.
Inputs are fresh random tensors; references are float64 torch (exact for integers).

Sources:
- liuliu/example_matmul_metal4 @ b9fa4a847278d6aaa4fdbc11e03b6f5baa4ef3af
  - Sources/matmul/matmul.swift, createSource: a generated GEMM (static and dynamic slices, a
    cooperative half destination with a bias, split-K and its reduce_sum_2, preemptive SIMD-groups);
  - Sources/attention/attention.swift, createSource: flash attention on execution_simdgroups<1> ops
    (row reductions, map_iterator, a threadgroup tensor with static extents, the QK destination
    copied element by element into the PV op's left input cooperative tensor);
  - Sources/convolution/convolution.swift, createProbeSource / createTiledProbeSource: convolution2d
    with set_offsets, a half cooperative destination, rank-4 static and dynamic slices.
- Anemll/fp8-mlp-metal41-bench @ 3b3157a774ab8794ac3cf932bef6a91a7b2d1e30, fp8_mlp.metal:
  mlp_gemm_impl (dynamic_length_v K, slice<dynamic_extent, 64>) for half, half x int8, int8 x int8
  into int, half x E4M3 and E4M3 x E4M3 (fp8 tensors over uchar buffers). Its Metal 4.1 fp4 /
  MXFP4 kernels are left out: kernelkit has no metal_fp4_e2m1_format.
- ggml-org/llama.cpp @ 000cfab8cb4d95dd32c0c0adf47a741030c326c2,
  ggml/src/ggml-metal/kernels/mul_mm.metal, kernel_mul_mm (instantiated as kernel_mul_mm_f16_f32;
  constants and kargs from ggml-metal-impl.h): both bodies, the GGML_METAL_HAS_TENSOR one (matmul2d
  over a device and a threadgroup operand) and the classic simdgroup_matrix one.
- ml-explore/mlx @ 846d176227a0ac13d2667e58d2bb68b322109ab0,
  mlx/backend/metal/kernels/steel/gemm/nax.h, BaseNAXFrag::mma: an expected failure, kernelkit's
  one known departure here (the cooperative tensors' element order; see its test).

What this sweep changed in kernelkit: a dextents tensor built from static extents (tensor.h) and
make_filled_simdgroup_matrix<T, 8> (simdgroup_matrix.h); regression tests in test_tensor_ops_api.py.
"""

import math
import re
from types import SimpleNamespace as NS

import pytest
import torch

import kernelkit as kk


def launch(kernel, device, **call):
    """`kernel(**call)` on `device` (conftest compiles each variant for sm_90a too, without a GPU)."""
    return kernel(stream=device, **call)


def close(actual, expected, rtol=1e-5, atol=1e-5):
    torch.testing.assert_close(actual.double().cpu(), expected.double().cpu(), rtol=rtol, atol=atol)


def _swift(template, **env):
    r"""Swift string interpolation: each `\(expr)` of `template` evaluated over `env` (`$0` is `_0`;
    `c ? a : b` and Int `/` as Swift means them), so the Metal text stays as the project writes it."""
    out, i = [], 0
    while (j := template.find("\\(", i)) >= 0:
        depth, k, quoted = 1, j + 2, False
        while depth:
            ch = template[k]
            quoted ^= ch == '"'
            depth += (not quoted) * ((ch == "(") - (ch == ")"))
            k += 1
        expr = template[j + 2:k - 1].replace("$0", "_0").replace(" / ", " // ")
        if m := re.fullmatch(r'(.*?)\s*\?\s*("[^"]*")\s*:\s*("[^"]*")', expr):
            expr = f"({m[2]} if {m[1]} else {m[3]})"
        value = eval(expr, {"max": max, "min": min}, env)  # noqa: S307 - the templates below
        out += [template[i:j], str(value).lower() if isinstance(value, bool) else str(value)]
        i = k
    return "".join(out + [template[i:]])


def _split_kernel(source, name):
    """An MLX user's port of a Metal source: what precedes `kernel void name(` is the header, the
    function's body the source (its parameters become kernelkit's inputs and attributes)."""
    start = source.index(f"kernel void {name}(")
    brace = source.index("{", source.index(")", start))
    depth, k = 1, brace + 1
    while depth:
        depth += (source[k] == "{") - (source[k] == "}")
        k += 1
    return source[:start], source[brace + 1:k - 1]


def _function_constants(header, **values):
    """`constant uint X [[function_constant(i)]];` given its value, as MTLFunctionConstantValues does."""
    for name, value in values.items():
        header, n = re.subn(rf"constant (\w+) {name} \[\[function_constant\(\d+\)\]\];",
                            rf"constant \1 {name} = {value};", header)
        assert n == 1, name
    return header


# --- liuliu/example_matmul_metal4: Sources/matmul/matmul.swift ---------------------------------

def _liuliu_gemm_source(matrixDimensions, blockDimensions, transpose, bias, buildOptions):
    """createSource(matrixDimensions:blockDimensions:transpose:bias:buildOptions:), ported line by line."""
    bD, bO = blockDimensions, buildOptions
    env = dict(blockDimensions=bD, buildOptions=bO, transpose=transpose)
    s = lambda t, **kw: _swift(t, **env, **kw)  # noqa: E731
    if bias:
        biasInputTerm = "device half *bias_buf [[buffer(3)]],"
        if bO.splitK > 1:
            initializeC = s(r"""
        if (k_split_idx == 0) {
          #pragma clang loop unroll(full)
          for (unsigned short k = 0; k < cT.get_capacity(); ++k) {
            if(cT.is_valid_element(k)) {
              auto idx = cT.get_multidimensional_index(k);
              cT[k] = bias_buf[idx[0] + tgid.x * \(blockDimensions.N)];
            }
          }
        } else {
          #pragma clang loop unroll(full)
          for (unsigned short k = 0; k < cT.get_capacity(); ++k) {
            if(cT.is_valid_element(k)) {
              cT[k] = 0;
            }
          }
        }
""")
        else:
            initializeC = s(r"""
        #pragma clang loop unroll(full)
        for (unsigned short k = 0; k < cT.get_capacity(); ++k) {
          if(cT.is_valid_element(k)) {
            auto idx = cT.get_multidimensional_index(k);
            cT[k] = bias_buf[idx[0] + tgid.x * \(blockDimensions.N)];
          }
        }
""")
    else:
        biasInputTerm = ""
        initializeC = """
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cT.get_capacity(); ++k) {
      if(cT.is_valid_element(k)) {
        cT[k] = 0;
      }
    }
"""
    if transpose.left:
        aSlice = s(r"\(blockDimensions.M), \(blockDimensions.K)")
        aMatrixSize = "M, K"
        aTile0Size = s(r"tgid.y * \(blockDimensions.M), 0")
        aTileK1Size = s(r"tgid.y * \(blockDimensions.M), k")
        aTileK2Size = s(r"tgid.y * \(blockDimensions.M), k + \(blockDimensions.K)")
        aTileLastK2Size = s(r"tgid.y * \(blockDimensions.M), K / \(blockDimensions.K * 2) * \(blockDimensions.K * 2)")
        aTileLastKSize = s(r"tgid.y * \(blockDimensions.M), K / \(blockDimensions.K) * \(blockDimensions.K)")
        aResidualSlice = s(r"\(blockDimensions.M), dynamic_extent")
    else:
        aSlice = s(r"\(blockDimensions.K), \(blockDimensions.M)")
        aMatrixSize = "K, M"
        aTile0Size = s(r"0, tgid.y * \(blockDimensions.M)")
        aTileK1Size = s(r"k, tgid.y * \(blockDimensions.M)")
        aTileK2Size = s(r"k + \(blockDimensions.K), tgid.y * \(blockDimensions.M)")
        aTileLastK2Size = s(r"K / \(blockDimensions.K * 2) * \(blockDimensions.K * 2), tgid.y * \(blockDimensions.M)")
        aTileLastKSize = s(r"K / \(blockDimensions.K) * \(blockDimensions.K), tgid.y * \(blockDimensions.M)")
        aResidualSlice = s(r"dynamic_extent, \(blockDimensions.M)")
    if transpose.right:
        bSlice = s(r"\(blockDimensions.K), \(blockDimensions.N)")
        bMatrixSize = "K, N"
        bTile0Size = s(r"0, tgid.x * \(blockDimensions.N)")
        bTileK1Size = s(r"k, tgid.x * \(blockDimensions.N)")
        bTileK2Size = s(r"k + \(blockDimensions.K), tgid.x * \(blockDimensions.N)")
        bTileLastK2Size = s(r"K / \(blockDimensions.K * 2) * \(blockDimensions.K * 2), tgid.x * \(blockDimensions.N)")
        bTileLastKSize = s(r"K / \(blockDimensions.K) * \(blockDimensions.K), tgid.x * \(blockDimensions.N)")
        bResidualSlice = s(r"dynamic_extent, \(blockDimensions.N)")
    else:
        bSlice = s(r"\(blockDimensions.N), \(blockDimensions.K)")
        bMatrixSize = "N, K"
        bTile0Size = s(r"tgid.x * \(blockDimensions.N), 0")
        bTileK1Size = s(r"tgid.x * \(blockDimensions.N), k")
        bTileK2Size = s(r"tgid.x * \(blockDimensions.N), k + \(blockDimensions.K)")
        bTileLastK2Size = s(r"tgid.x * \(blockDimensions.N), K / \(blockDimensions.K * 2) * \(blockDimensions.K * 2)")
        bTileLastKSize = s(r"tgid.x * \(blockDimensions.N), K / \(blockDimensions.K) * \(blockDimensions.K)")
        bResidualSlice = s(r"\(blockDimensions.N), dynamic_extent")
    swapXY = "tgid.xy = tgid.yx;" if bO.swapMN else ""
    env.update(aSlice=aSlice, bSlice=bSlice, aTileK1Size=aTileK1Size, aTileK2Size=aTileK2Size,
               bTileK1Size=bTileK1Size, bTileK2Size=bTileK2Size)
    if bO.splitK > 1:
        if bO.swapMN:
            splitKPrologue = s(r"""
  const uint k_split_idx = tgid.x / ((M + \(blockDimensions.M - 1)) / \(blockDimensions.M));
  tgid.x = tgid.x % ((M + \(blockDimensions.M - 1)) / \(blockDimensions.M));
""")
        else:
            splitKPrologue = s(r"""
  const uint k_split_idx = tgid.x / ((N + \(blockDimensions.N - 1)) / \(blockDimensions.N));
  tgid.x = tgid.x % ((N + \(blockDimensions.N - 1)) / \(blockDimensions.N));
""")
        streamKLoop = s(r"""
    if (k_split_idx == 0) {
      #pragma clang loop unroll(full)
      for (ushort k = 0; k < K_split; k += \(blockDimensions.K * 2)) {
        // Create appropriate slice for this thread group to work on.
        auto mA0 = A.slice<\(aSlice)>(\(aTileK1Size));
        auto mB0 = B.slice<\(bSlice)>(\(bTileK1Size));
        auto mA1 = A.slice<\(aSlice)>(\(aTileK2Size));
        auto mB1 = B.slice<\(bSlice)>(\(bTileK2Size));
        matmul_op.run(mA0, mB0, cT);
        matmul_op.run(mA1, mB1, cT);
      }
    }
""")
        for k in range(1, bO.splitK - 1):
            streamKLoop += s(r"""
        else if (k_split_idx == \(k)) {
          #pragma clang loop unroll(full)
          for (ushort k = \(k) * K_split; k < \(k + 1) * K_split; k += \(blockDimensions.K * 2)) {
            // Create appropriate slice for this thread group to work on.
            auto mA0 = A.slice<\(aSlice)>(\(aTileK1Size));
            auto mB0 = B.slice<\(bSlice)>(\(bTileK1Size));
            auto mA1 = A.slice<\(aSlice)>(\(aTileK2Size));
            auto mB1 = B.slice<\(bSlice)>(\(bTileK2Size));
            matmul_op.run(mA0, mB0, cT);
            matmul_op.run(mA1, mB1, cT);
          }
        }
    """, k=k)
        streamKLoop += s(r"""
    else {
      #pragma clang loop unroll(full)
      for (ushort k = \(buildOptions.splitK - 1) * K_split; k < K_edge; k += \(blockDimensions.K * 2)) {
        // Create appropriate slice for this thread group to work on.
        auto mA0 = A.slice<\(aSlice)>(\(aTileK1Size));
        auto mB0 = B.slice<\(bSlice)>(\(bTileK1Size));
        auto mA1 = A.slice<\(aSlice)>(\(aTileK2Size));
        auto mB1 = B.slice<\(bSlice)>(\(bTileK2Size));
        matmul_op.run(mA0, mB0, cT);
        matmul_op.run(mA1, mB1, cT);
      }
    }
""")
        splitKStoreOffset = s(r"tgid.x * \(blockDimensions.N * buildOptions.splitK) + k_split_idx * \(blockDimensions.N)")
    else:
        splitKPrologue = ""
        streamKLoop = s(r"""
    #pragma clang loop unroll(full)
    for (ushort k = 0; k < K_edge; k += \(blockDimensions.K * 2)) {
      // Create appropriate slice for this thread group to work on.
      auto mA0 = A.slice<\(aSlice)>(\(aTileK1Size));
      auto mB0 = B.slice<\(bSlice)>(\(bTileK1Size));
      auto mA1 = A.slice<\(aSlice)>(\(aTileK2Size));
      auto mB1 = B.slice<\(bSlice)>(\(bTileK2Size));
      matmul_op.run(mA0, mB0, cT);
      matmul_op.run(mA1, mB1, cT);
    }
""")
        splitKStoreOffset = s(r"tgid.x * \(blockDimensions.N)")
    if bO.preemptiveExecutionSIMDGroups > 1:
        if bO.swapMN:
            updateTgidX = s(r"""
  tgid.x = tgid.x * \(buildOptions.preemptiveExecutionSIMDGroups) + sgid;
  if (tgid.x * \(blockDimensions.M) >= M) {
    return;
  }
""")
        else:
            updateTgidX = s(r"""
  tgid.x = tgid.x * \(buildOptions.preemptiveExecutionSIMDGroups) + sgid;
  if (tgid.x * \(blockDimensions.N) >= N) {
    return;
  }
""")
    else:
        updateTgidX = ""
    return s(r"""

#include <metal_stdlib>
#include <metal_tensor>
// Doesn't seem this header is provided at runtime, hence JIT shader won't work unless we package all the headers too.
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;
using namespace mpp::tensor_ops;

constant uint M [[function_constant(0)]];
constant uint N [[function_constant(1)]];
constant uint K [[function_constant(2)]];

constant uint K_split = K / \(buildOptions.splitK) / \(blockDimensions.K * 2) * \(blockDimensions.K * 2);
constant uint K_edge = K > \(blockDimensions.K * 2) - 1 ? K + 1 - \(blockDimensions.K * 2) : 0;

kernel void matmul(device half *A_buf [[buffer(0)]],
                   device half *B_buf [[buffer(1)]],
                   device half *C_buf [[buffer(2)]], \(biasInputTerm)
                   ushort sgid [[simdgroup_index_in_threadgroup]],
                   uint2 tgid [[threadgroup_position_in_grid]])
{
  // Construct shader allocated tensors. This is easier since we can just bind buffer directly with Metal 3 APIs.
  auto A = tensor<device half,  dextents<int32_t, 2>, tensor_inline>(A_buf, dextents<int32_t, 2>(\(aMatrixSize)));
  auto B = tensor<device half,  dextents<int32_t, 2>, tensor_inline>(B_buf, dextents<int32_t, 2>(\(bMatrixSize)));
  auto C = tensor<device half,  dextents<int32_t, 2>, tensor_inline>(C_buf, dextents<int32_t, 2>(N * \(max(buildOptions.splitK, 1)), M));
\(updateTgidX)
\(splitKPrologue)
\(swapXY)

  if (tgid.x * \(blockDimensions.N) + \(blockDimensions.N - 1) < N && tgid.y * \(blockDimensions.M) + \(blockDimensions.M - 1) < M) {
    // Use static slice.
    // descriptor to create matmul operation that does \(blockDimensions.K)x\(blockDimensions.M) times \(blockDimensions.N)x\(blockDimensions.K) producing \(blockDimensions.N)x\(blockDimensions.M)
    constexpr auto matmulDescriptor = matmul2d_descriptor(\(blockDimensions.M), \(blockDimensions.N), \(blockDimensions.K), \(transpose.left ? "true" : "false"), \(transpose.right ? "true" : "false"), false, matmul2d_descriptor::mode::multiply_accumulate);

    // create matmul op from above descriptor with \(buildOptions.cooperativeExecutionSIMDGroups) SIMD-Groups.
    matmul2d<matmulDescriptor, execution_simdgroups<\(buildOptions.cooperativeExecutionSIMDGroups)>> matmul_op;

    auto mA = A.slice<\(aSlice)>(\(aTile0Size));
    auto mB = B.slice<\(bSlice)>(\(bTile0Size));
    auto cT = matmul_op.get_destination_cooperative_tensor<decltype(mA), decltype(mB), half>();
\(initializeC)
\(streamKLoop)
    if (K % \(blockDimensions.K * 2) >= \(blockDimensions.K)) {
      auto mA = A.slice<\(aSlice)>(\(aTileLastK2Size));
      auto mB = B.slice<\(bSlice)>(\(bTileLastK2Size));
      matmul_op.run(mA, mB, cT);
    }
    if (K % \(blockDimensions.K) != 0) {
      constexpr auto matmulDescriptor = matmul2d_descriptor(\(blockDimensions.M), \(blockDimensions.N), dynamic_length_v<int>, \(transpose.left ? "true" : "false"), \(transpose.right ? "true" : "false"), false, matmul2d_descriptor::mode::multiply_accumulate);
      matmul2d<matmulDescriptor, execution_simdgroups<\(buildOptions.cooperativeExecutionSIMDGroups)>> matmul_op;
      auto mA = A.slice<\(aResidualSlice)>(\(aTileLastKSize));
      auto mB = B.slice<\(bResidualSlice)>(\(bTileLastKSize));
      matmul_op.run(mA, mB, cT);
    }
    auto mC = C.slice<\(blockDimensions.N), \(blockDimensions.M)>(\(splitKStoreOffset), tgid.y * \(blockDimensions.M));
    cT.store(mC);
  } else {
    // Use dynamic slice for this edge case.
    // descriptor to create matmul operation that does \(blockDimensions.K)x\(blockDimensions.M) times \(blockDimensions.N)x\(blockDimensions.K) producing \(blockDimensions.N)x\(blockDimensions.M)
    constexpr auto matmulDescriptor = matmul2d_descriptor(\(blockDimensions.M), \(blockDimensions.N), dynamic_length_v<int>, \(transpose.left ? "true" : "false"), \(transpose.right ? "true" : "false"), false, matmul2d_descriptor::mode::multiply_accumulate);

    // create matmul op from above descriptor with \(buildOptions.cooperativeExecutionSIMDGroups) SIMD-Groups.
    matmul2d<matmulDescriptor, execution_simdgroups<\(buildOptions.cooperativeExecutionSIMDGroups)>> matmul_op;

    auto mA = A.slice(\(aTile0Size));
    auto mB = B.slice(\(bTile0Size));
    auto cT = matmul_op.get_destination_cooperative_tensor<decltype(mA), decltype(mB), half>();
\(initializeC)
    matmul_op.run(mA, mB, cT);
    auto mC = C.slice(tgid.x * \(blockDimensions.N), tgid.y * \(blockDimensions.M));
    cT.store(mC);
  }
}

kernel void reduce_sum_2(device half2 *A_buf [[buffer(0)]],
                      device half2 *B_buf [[buffer(1)]],
                   uint2 tpig [[thread_position_in_grid]]) {
  if (tpig.x >= M * N / 2) {
    return;
  }
  A_buf += tpig.x / \(blockDimensions.N / 2) * \(blockDimensions.N / 2 * max(1, buildOptions.splitK)) + tpig.x % \(blockDimensions.N / 2);
  auto val = A_buf[0];
  #pragma clang loop unroll(full)
  for (unsigned short k = 1; k < \(buildOptions.splitK); k++) {
    val += A_buf[k * \(blockDimensions.N / 2)];
  }
  B_buf[tpig.x] = val;
}
""", biasInputTerm=biasInputTerm, initializeC=initializeC, aMatrixSize=aMatrixSize, bMatrixSize=bMatrixSize,
             aTile0Size=aTile0Size, bTile0Size=bTile0Size, updateTgidX=updateTgidX, splitKPrologue=splitKPrologue,
             swapXY=swapXY, streamKLoop=streamKLoop, aTileLastK2Size=aTileLastK2Size,
             bTileLastK2Size=bTileLastK2Size, aResidualSlice=aResidualSlice, bResidualSlice=bResidualSlice,
             aTileLastKSize=aTileLastKSize, bTileLastKSize=bTileLastKSize, splitKStoreOffset=splitKStoreOffset)


# run(M:N:K:blockDimensions:buildOptions:), as profileCorrectness() and main() call it (transpose
# (false, true) and a bias; swapMN is M > N, as run() sets it), at small sizes.
@pytest.mark.parametrize("M,N,K,block,coop,preempt,splitK", [
    (45, 70, 150, (32, 64, 64), 1, 4, 1),     # profileCorrectness's configuration, edge tiles and a K residue
    (128, 64, 192, (64, 32, 32), 4, 1, 3),    # main()'s cooperative split-K (whole tiles, K a multiple of 2 * block K)
])
def test_liuliu_gemm(device, M, N, K, block, coop, preempt, splitK):
    bD = NS(M=block[0], N=block[1], K=block[2])
    bO = NS(cooperativeExecutionSIMDGroups=coop, preemptiveExecutionSIMDGroups=preempt, swapMN=M > N, splitK=splitK)
    source = _liuliu_gemm_source(NS(M=M, N=N, K=K), bD, NS(left=False, right=True), True, bO)
    header, body = _split_kernel(source, "matmul")
    header = _function_constants(header, M=M, N=N, K=K)
    # MLX passes inputs as const pointers and names the attributes itself.
    body = ("device half *A_buf = (device half *)a; device half *B_buf = (device half *)b;\n"
            "device half *bias_buf = (device half *)bias_in; device half *C_buf = c;\n"
            "ushort sgid = simdgroup_index_in_threadgroup; uint2 tgid = threadgroup_position_in_grid.xy;\n" + body)
    matmul = kk.metal_kernel(name=f"liuliu_gemm_{splitK}", input_names=["a", "b", "bias_in"], output_names=["c"],
                             source=body, header=header)
    a, b, bias = (torch.rand(M, K) / math.sqrt(K)).half(), (torch.rand(N, K) / math.sqrt(K)).half(), torch.rand(N).half()
    if bO.swapMN:
        groups = (-(-M // (bD.M * preempt)) * splitK, -(-N // bD.N))
    else:
        groups = (-(-N // (bD.N * preempt)) * splitK, -(-M // bD.M))
    threads = 32 * max(preempt, coop)
    c = launch(matmul, device, inputs=[t.to(device) for t in (a, b, bias)],
               grid=(groups[0] * threads, groups[1], 1), threadgroup=(threads, 1, 1),
               output_shapes=[(M, N * splitK)], output_dtypes=[torch.float16], init_value=0)[0]
    if splitK > 1:
        _, reduce_body = _split_kernel(source, "reduce_sum_2")
        reduce = kk.metal_kernel(name="liuliu_reduce_sum_2", input_names=["partial"], output_names=["c"],
                                 source="device half2 *A_buf = (device half2 *)partial; device half2 *B_buf = (device half2 *)c;\n"
                                        "uint2 tpig = thread_position_in_grid.xy;\n" + reduce_body, header=header)
        c = launch(reduce, device, inputs=[c], grid=(M * N // 2, 1, 1), threadgroup=(256, 1, 1),
                   output_shapes=[(M, N)], output_dtypes=[torch.float16])[0]
    ref = a.double() @ b.double().T + bias.double()
    close(c, ref, rtol=2e-2, atol=2e-2)


# --- liuliu/example_matmul_metal4: Sources/attention/attention.swift -----------------------------

def _liuliu_attention_source(blockDimensions, attentionDimensions, buildOptions):
    """createSource(blockDimensions:attentionDimensions:buildOptions:), ported line by line."""
    bD, aD, bO = blockDimensions, attentionDimensions, buildOptions
    dotScale = 1.442695041 * 1 / math.sqrt(float(aD.K))
    kBlocks = (aD.K + bD.K - 1) // bD.K
    preferredP = "cP" if bO.bypassThreadgroupMemory else "P"
    env = dict(blockDimensions=bD, attentionDimensions=aD, buildOptions=bO, preferredP=preferredP, dotScale=dotScale)
    s = lambda t, **kw: _swift(t, **env, **kw)  # noqa: E731
    if bO.bypassThreadgroupMemory:
        allocateP = "    auto cP = matmul_pv_op.get_left_input_cooperative_tensor<half, half, float>();"
    else:
        allocateP = ""
    allocateO = "\n".join(s(r"  auto cO_\($0) = matmul_pv_op.get_destination_cooperative_tensor<decltype(\(preferredP)), decltype(mV), float>();", _0=i) for i in range(kBlocks))
    initializeO = "\n".join(s(r"          cO_\($0)[k] = 0;", _0=i) for i in range(kBlocks))
    correctO = "\n".join(s(r"          cO_\($0)[k] *= *dst_it;", _0=i) for i in range(kBlocks))
    accumulateO0 = "\n".join(s(r"""
    auto mV_0_\($0) = V.slice<\(blockDimensions.K), \(blockDimensions.C)>(tgid.y * \(attentionDimensions.K) + \($0 * blockDimensions.K), c);
    matmul_pv_op.run(\(preferredP), mV_0_\($0), cO_\($0));
""", _0=i) for i in range(kBlocks))
    accumulateO1 = "\n".join(s(r"""
    auto mV_1_\($0) = V.slice<\(blockDimensions.K), \(blockDimensions.C)>(tgid.y * \(attentionDimensions.K) + \($0 * blockDimensions.K), c + \(blockDimensions.C));
    matmul_pv_op.run(\(preferredP), mV_1_\($0), cO_\($0));
""", _0=i) for i in range(kBlocks))

    def moveP(S):
        if bO.bypassThreadgroupMemory:
            return s(r"""
      #pragma clang loop unroll(full)
      for (unsigned short k = 0; k < \(S).get_capacity(); ++k) {
        if (\(S).is_valid_element(k)) {
          cP[k] = (half)\(S)[k];
        }
      }
""", S=S)
        return s(r"""
      #pragma clang loop unroll(full)
      for (unsigned short k = 0; k < \(S).get_capacity(); ++k) {
        if(\(S).is_valid_element(k)) {
          auto idx = \(S).get_multidimensional_index(k);
          P_buf[idx[0] + idx[1] * \(blockDimensions.C)] = (half)\(S)[k];
        }
      }
      simdgroup_barrier(mem_flags::mem_threadgroup);
""", S=S)
    accumulateO0Remainder = "\n".join(s(r"""
      auto mV_0_\($0) = V.slice<\(blockDimensions.K), \(blockDimensions.C)>(tgid.y * \(attentionDimensions.K) + \($0 * blockDimensions.K), C - C_remainder);
      matmul_pv_op.run(cP, mV_0_\($0), cO_\($0));
""", _0=i) for i in range(kBlocks))

    def writeO_(i):
        if i < kBlocks - 1 or aD.K % bD.K == 0:
            return s(r"""
        O[idx[0] + \($0 * blockDimensions.K) + idx[1] * K_Hq] = (half)(cO_\($0)[k] * L_reciprocal);
""", _0=i)
        return s(r"""
        if (idx[0] + \($0 * blockDimensions.K) < \(attentionDimensions.K)) {
          O[idx[0] + \($0 * blockDimensions.K) + idx[1] * K_Hq] = (half)(cO_\($0)[k] * L_reciprocal);
        }
""", _0=i)
    writeO = "\n".join(writeO_(i) for i in range(kBlocks))
    pvInnerDim = str(bD.C) if bD.C % 32 == 0 or bO.bypassThreadgroupMemory else "dynamic_length_v<int>"
    qkInnerDim = str(bD.K) if bD.K % 32 == 0 else "dynamic_length_v<int>"
    return s(r"""

#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;
using namespace mpp::tensor_ops;

constant uint R [[function_constant(0)]];
constant uint C [[function_constant(1)]];
constant uint Hq [[function_constant(2)]];
constant uint Hk [[function_constant(3)]];

constant uint C_edge_1 = C >= \(blockDimensions.C * 2) ? C + 1 - \(blockDimensions.C * 2) : 0;
// In this special case, leaving the rest to the trailing block to process.
constant uint C_edge = (C % \(blockDimensions.C * 2)) == \(blockDimensions.C) ? C_edge_1 : (C >= \(blockDimensions.C) ? C + 1 - \(blockDimensions.C) : 0);
constant uint C_remainder = (C % \(blockDimensions.C * 2)) == \(blockDimensions.C) ? \(blockDimensions.C) : (C % \(blockDimensions.C));
constant uint C_remainder_1 = C % \(blockDimensions.C * 2);
constant uint R_edge = R >= \(blockDimensions.R) ? R + 1 - \(blockDimensions.R) : 0;
constant uint R_remainder = R % \(blockDimensions.R);
constant uint K_edge = \(attentionDimensions.K) - \(blockDimensions.K) + 1;
constant uint K_Hq = \(attentionDimensions.K) * Hq;
constant uint K_Hk = \(attentionDimensions.K) * Hk;

kernel void attention(device half *Q_buf [[buffer(0)]],
                      device half *K_buf [[buffer(1)]],
                      device half *V_buf [[buffer(2)]],
                      device half *O_buf [[buffer(3)]],
                      threadgroup uchar *threadgroup_block [[threadgroup(0)]],
                      ushort sgid [[simdgroup_index_in_threadgroup]],
                      uint2 tgid [[threadgroup_position_in_grid]])
{
  tgid = { tgid.x / \(attentionDimensions.Hq), tgid.x % \(attentionDimensions.Hq) };
  tgid.x = tgid.x * \(buildOptions.executionSIMDGroups) + sgid;
  if (tgid.x * \(blockDimensions.R) >= \(attentionDimensions.R)) {
    return;
  }
  auto Q = tensor<device half,  dextents<int32_t, 2>, tensor_inline>(Q_buf, dextents<int32_t, 2>(K_Hq, R));
  auto K = tensor<device half,  dextents<int32_t, 2>, tensor_inline>(K_buf, dextents<int32_t, 2>(K_Hk, C));
  auto V = tensor<device half,  dextents<int32_t, 2>, tensor_inline>(V_buf, dextents<int32_t, 2>(K_Hk, C));
  threadgroup half *P_buf = (threadgroup half*)threadgroup_block + \(blockDimensions.C) * \(blockDimensions.R) * sgid;
  auto P = tensor<threadgroup half, dextents<int32_t, 2>, tensor_inline>(P_buf, extents<int32_t, \(blockDimensions.C), \(blockDimensions.R)>());
  constexpr auto qk_desc = matmul2d_descriptor(\(blockDimensions.R), \(blockDimensions.C), \(qkInnerDim), false, true, false, matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<qk_desc, execution_simdgroups<1>> matmul_qk_op;
  constexpr auto qk_desc_remainder = matmul2d_descriptor(\(blockDimensions.R), \(blockDimensions.C), dynamic_length_v<int>, false, true, false, matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<qk_desc_remainder, execution_simdgroups<1>> matmul_qk_op_remainder;
  auto mQ = Q.slice<\(blockDimensions.K), \(blockDimensions.R)>(tgid.y * \(attentionDimensions.K), tgid.x * \(blockDimensions.R));
  auto mK = K.slice<\(blockDimensions.K), \(blockDimensions.C)>(tgid.y * \(attentionDimensions.K), 0);
  auto cS_0 = matmul_qk_op.get_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
  auto cS_1 = matmul_qk_op.get_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
  auto cM = matmul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
  auto cL = matmul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
  auto correction = matmul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
  #pragma clang loop unroll(full)
  for (unsigned short k = 0; k < cM.get_capacity(); ++k) {
    if (cM.is_valid_element(k)) {
      cM[k] = -numeric_limits<float>::infinity();
      cL[k] = numeric_limits<float>::denorm_min();
    }
  }
  auto mV = V.slice<\(blockDimensions.K), \(blockDimensions.C)>(0, 0);
  constexpr auto pv_desc = matmul2d_descriptor(\(blockDimensions.R), \(blockDimensions.K), \(pvInnerDim), false, false, false, matmul2d_descriptor::mode::multiply_accumulate);
  matmul2d<pv_desc, execution_simdgroups<1>> matmul_pv_op;
\(allocateP)
\(allocateO)
  for (uint c = 0; c < C_edge; c += \(blockDimensions.C * 2)) {
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cS_0.get_capacity(); ++k) {
      if (cS_0.is_valid_element(k)) {
        cS_0[k] = 0;
        if (c < C_edge_1) {
          cS_1[k] = 0;
        } else {
          auto idx = cS_1.get_multidimensional_index(k);
          if (idx[0] >= (int)C_remainder) {
            cS_1[k] = -numeric_limits<float>::infinity();
          } else {
            cS_1[k] = 0;
          }
        }
      }
    }
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < K_edge; k += \(blockDimensions.K)) {
      auto mQ = Q.slice<\(blockDimensions.K), \(blockDimensions.R)>(tgid.y * \(attentionDimensions.K) + k, tgid.x * \(blockDimensions.R));
      auto mK_0 = K.slice<\(blockDimensions.K), \(blockDimensions.C)>(tgid.y * \(attentionDimensions.K) + k, c);
      matmul_qk_op.run(mQ, mK_0, cS_0);
      auto mK_1 = K.slice<\(blockDimensions.K), \(blockDimensions.C)>(tgid.y * \(attentionDimensions.K) + k, c + \(blockDimensions.C));
      matmul_qk_op.run(mQ, mK_1, cS_1);
    }
    if (\(attentionDimensions.K % blockDimensions.K > 0 ? "true" : "false")) {
      auto mQ = Q.slice<\(attentionDimensions.K % blockDimensions.K), \(blockDimensions.R)>(tgid.y * \(attentionDimensions.K) + \(attentionDimensions.K - (attentionDimensions.K % blockDimensions.K)), tgid.x * \(blockDimensions.R));
      auto mK_0 = K.slice<\(attentionDimensions.K % blockDimensions.K), \(blockDimensions.C)>(tgid.y * \(attentionDimensions.K) + \(attentionDimensions.K - (attentionDimensions.K % blockDimensions.K)), c);
      matmul_qk_op_remainder.run(mQ, mK_0, cS_0);
      auto mK_1 = K.slice<\(attentionDimensions.K % blockDimensions.K), \(blockDimensions.C)>(tgid.y * \(attentionDimensions.K) + \(attentionDimensions.K - (attentionDimensions.K % blockDimensions.K)), c + \(blockDimensions.C));
      matmul_qk_op_remainder.run(mQ, mK_1, cS_1);
    }
    // Online reduce maximum.
    auto cM_0_new = matmul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
    reduce_rows(cS_0, cM_0_new, reduction_operation::max, -numeric_limits<float>::infinity());
    auto cM_1_new = matmul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
    reduce_rows(cS_1, cM_1_new, reduction_operation::max, -numeric_limits<float>::infinity());
    // Online correct O
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cM.get_capacity(); ++k) {
      if (cM.is_valid_element(k)) {
        correction[k] = 1;
        const float M_new = max(cM_0_new[k], cM_1_new[k]) * \(dotScale);
        if (M_new > cM[k]) {
          correction[k] = fast::exp2(cM[k] - M_new);
          cM[k] = M_new;
        }
      }
    }
    // Softmax. cS becomes cP.
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cS_0.get_capacity(); ++k) {
      if (cS_0.is_valid_element(k)) {
        auto it = cS_0.get_iterator(k);
        auto dst_it = cM.map_iterator(it);
        cS_0[k] = fast::exp2(cS_0[k] * \(dotScale) - *dst_it);
        if (c < C_edge_1) {
          cS_1[k] = fast::exp2(cS_1[k] * \(dotScale) - *dst_it);
        } else {
          auto idx = cS_1.get_multidimensional_index(k);
          if (idx[0] >= (int)C_remainder) {
            cS_1[k] = 0;
          } else {
            cS_1[k] = fast::exp2(cS_1[k] * \(dotScale) - *dst_it);
          }
        }
      }
    }
    // Online reduce sum.
    auto cL_0_new = matmul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
    reduce_rows(cS_0, cL_0_new, reduction_operation::sum, (float)0);
    auto cL_1_new = matmul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
    reduce_rows(cS_1, cL_1_new, reduction_operation::sum, (float)0);
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cL.get_capacity(); ++k) {
      if(cL.is_valid_element(k)) {
        cL[k] = cL[k] * correction[k] + cL_0_new[k] + cL_1_new[k];
      }
    }
    if (c == 0) {
      #pragma clang loop unroll(full)
      for (unsigned short k = 0; k < cO_0.get_capacity(); ++k) {
        if (cO_0.is_valid_element(k)) {
\(initializeO)
        }
      }
    } else {
      #pragma clang loop unroll(full)
      for (unsigned short k = 0; k < cO_0.get_capacity(); ++k) {
        if (cO_0.is_valid_element(k)) {
          auto it = cO_0.get_iterator(k);
          auto dst_it = correction.map_iterator(it);
\(correctO)
        }
      }
    }
    simdgroup_barrier(mem_flags::mem_none);
\(moveP("cS_0"))
\(accumulateO0)
    if (c < C_edge_1) {
\(moveP("cS_1"))
\(accumulateO1)
    } else {
\(moveP("cS_1"))
\(accumulateO0Remainder)
    }
  }
  if (C_remainder > 0 && C_remainder_1 <= \(blockDimensions.C)) {
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cS_0.get_capacity(); ++k) {
      if (cS_0.is_valid_element(k)) {
        auto idx = cS_0.get_multidimensional_index(k);
        if (idx[0] >= (int)C_remainder) {
          cS_0[k] = -numeric_limits<float>::infinity();
        } else {
          cS_0[k] = 0;
        }
      }
    }
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < K_edge; k += \(blockDimensions.K)) {
      auto mQ = Q.slice<\(blockDimensions.K), \(blockDimensions.R)>(tgid.y * \(attentionDimensions.K) + k, tgid.x * \(blockDimensions.R));
      auto mK_0 = K.slice<\(blockDimensions.K), \(blockDimensions.C)>(tgid.y * \(attentionDimensions.K) + k, C - C_remainder);
      matmul_qk_op.run(mQ, mK_0, cS_0);
    }
    if (\(attentionDimensions.K % blockDimensions.K > 0 ? "true" : "false")) {
      auto mQ = Q.slice<\(attentionDimensions.K % blockDimensions.K), \(blockDimensions.R)>(tgid.y * \(attentionDimensions.K) + \(attentionDimensions.K - (attentionDimensions.K % blockDimensions.K)), tgid.x * \(blockDimensions.R));
      auto mK_0 = K.slice<\(attentionDimensions.K % blockDimensions.K), \(blockDimensions.C)>(tgid.y * \(attentionDimensions.K) + \(attentionDimensions.K - (attentionDimensions.K % blockDimensions.K)), C - C_remainder);
      matmul_qk_op_remainder.run(mQ, mK_0, cS_0);
    }
    // Online reduce maximum.
    auto cM_0_new = matmul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
    reduce_rows(cS_0, cM_0_new, reduction_operation::max, -numeric_limits<float>::infinity());
    // Online correct O
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cM.get_capacity(); ++k) {
      if (cM.is_valid_element(k)) {
        correction[k] = 1;
        const float M_new = cM_0_new[k] * \(dotScale);
        if (M_new > cM[k]) {
          correction[k] = fast::exp2(cM[k] - M_new);
          cM[k] = M_new;
        }
      }
    }
    // Softmax. cS becomes cP.
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cS_0.get_capacity(); ++k) {
      if (cS_0.is_valid_element(k)) {
        auto it = cS_0.get_iterator(k);
        auto dst_it = cM.map_iterator(it);
        auto idx = cS_0.get_multidimensional_index(k);
        if (idx[0] >= (int)C_remainder) {
          cS_0[k] = 0;
        } else {
          cS_0[k] = fast::exp2(cS_0[k] * \(dotScale) - *dst_it);
        }
      }
    }
    // Online reduce sum.
    auto cL_0_new = matmul_qk_op.get_row_reduction_destination_cooperative_tensor<decltype(mQ), decltype(mK), float>();
    reduce_rows(cS_0, cL_0_new, reduction_operation::sum, (float)0);
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cL.get_capacity(); ++k) {
      if(cL.is_valid_element(k)) {
        cL[k] = cL[k] * correction[k] + cL_0_new[k];
      }
    }
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cO_0.get_capacity(); ++k) {
      if (cO_0.is_valid_element(k)) {
        auto it = cO_0.get_iterator(k);
        auto dst_it = correction.map_iterator(it);
\(correctO)
      }
    }
    simdgroup_barrier(mem_flags::mem_none);
\(moveP("cS_0"))
\(accumulateO0Remainder)
  }
  auto O = O_buf + tgid.x * (\(blockDimensions.R) * K_Hq) + tgid.y * \(attentionDimensions.K);
  if (R_remainder > 0 && tgid.x * \(blockDimensions.R) >= R_edge) {
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cO_0.get_capacity(); ++k) {
      if (cO_0.is_valid_element(k)) {
        auto idx = cO_0.get_multidimensional_index(k);
        if (idx[1] < (int)R_remainder) {
          auto it = cO_0.get_iterator(k);
          auto dst_it = cL.map_iterator(it);
          auto L_reciprocal = fast::divide(1, *dst_it);
\(writeO)
        }
      }
    }
  } else {
    #pragma clang loop unroll(full)
    for (unsigned short k = 0; k < cO_0.get_capacity(); ++k) {
      if (cO_0.is_valid_element(k)) {
        auto it = cO_0.get_iterator(k);
        auto dst_it = cL.map_iterator(it);
        auto L_reciprocal = fast::divide(1, *dst_it);
        auto idx = cO_0.get_multidimensional_index(k);
\(writeO)
      }
    }
  }
}
""", allocateP=allocateP, allocateO=allocateO, initializeO=initializeO, correctO=correctO,
             accumulateO0=accumulateO0, accumulateO1=accumulateO1, accumulateO0Remainder=accumulateO0Remainder,
             moveP=moveP, writeO=writeO, pvInnerDim=pvInnerDim, qkInnerDim=qkInnerDim)


# run(sequenceDimension:headDimension:Hq:Hk:buildOptions:): BlockDimenions(R: 16, C: 64, K: 128) as
# run() sets it, bypassThreadgroupMemory as profileCorrectness() runs it (the generator's other
# branch still names cP in its remainder path), at sequence lengths that take each of its edge
# paths (a C remainder; C % 128 == 64; R remainders) and a head of 192 (two K blocks, the second
# partial). Heads below the block's 128 would wrap its `uint K_edge`.
@pytest.mark.parametrize("seq,head", [(70, 128), (64, 192), (150, 128)])
def test_liuliu_attention(device, seq, head):
    bypass = True
    Hq = Hk = 2
    sg = 4
    bD = NS(R=16, C=64, K=128)
    source = _liuliu_attention_source(bD, NS(R=seq, C=seq, K=head, Hq=Hq, Hk=Hk),
                                      NS(executionSIMDGroups=sg, bypassThreadgroupMemory=bypass))
    header, body = _split_kernel(source, "attention")
    header = _function_constants(header, R=seq, C=seq, Hq=Hq, Hk=Hk)
    # The threadgroup(0) buffer, setThreadgroupMemoryLength(R * C * SIMD-groups * 2), is declared in the body.
    body = (f"threadgroup uchar threadgroup_block[{bD.R * bD.C * sg * 2}];\n"
            "device half *Q_buf = (device half *)q; device half *K_buf = (device half *)k;\n"
            "device half *V_buf = (device half *)v; device half *O_buf = o;\n"
            "ushort sgid = simdgroup_index_in_threadgroup; uint2 tgid = threadgroup_position_in_grid.xy;\n" + body)
    attention = kk.metal_kernel(name="liuliu_attention", input_names=["q", "k", "v"], output_names=["o"],
                                source=body, header=header)
    q, k, v = (torch.randn(seq, Hq, head).half() for _ in range(3))
    groups = -(-seq // (bD.R * sg)) * Hq
    o = launch(attention, device, inputs=[t.to(device) for t in (q, k, v)], grid=(groups * 32 * sg, 1, 1),
               threadgroup=(32 * sg, 1, 1), output_shapes=[(seq, Hq, head)], output_dtypes=[torch.float16])[0]
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k, v))
    ref = torch.softmax(qd @ kd.transpose(1, 2) / math.sqrt(head), dim=-1) @ vd
    close(o, ref.transpose(0, 1), rtol=1e-2, atol=5e-3)


# --- liuliu/example_matmul_metal4: Sources/convolution/convolution.swift ---------------------------

inputWidth = inputHeight = outputWidth = outputHeight = 5
kernelWidth = kernelHeight = 3


def _liuliu_conv_probe_source(offsetX, offsetY):
    """createProbeSource(offsetX:offsetY:)."""
    return _swift(r"""

#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;
using namespace mpp::tensor_ops;

kernel void conv2d_offset_probe(device half *activation_buf [[buffer(0)]],
                                device half *weights_buf [[buffer(1)]],
                                device half *output_buf [[buffer(2)]])
{
  auto activation = tensor<device half, dextents<int32_t, 4>, tensor_inline>(
      activation_buf,
      dextents<int32_t, 4>(1, \(inputWidth), \(inputHeight), 1));
  auto weights = tensor<device half, dextents<int32_t, 4>, tensor_inline>(
      weights_buf,
      dextents<int32_t, 4>(1, 1, \(kernelWidth), \(kernelHeight)));
  auto output = tensor<device half, dextents<int32_t, 4>, tensor_inline>(
      output_buf,
      dextents<int32_t, 4>(1, \(outputWidth), \(outputHeight), 1));

  constexpr auto descriptor = convolution2d_descriptor(
      int4(1, \(outputWidth), \(outputHeight), 1),
      int4(1, \(inputWidth), \(inputHeight), 1),
      int2(\(kernelWidth), \(kernelHeight)),
      convolution2d_activation_layout::nhwc,
      convolution2d_weights_layout::hwio,
      int2(1, 1),
      int2(1, 1),
      1,
      false,
      convolution2d_descriptor::mode::multiply);
  convolution2d<descriptor, execution_simdgroups<1>> conv2d_op;
  conv2d_op.set_offsets(int2(\(offsetX), \(offsetY)));

  auto cOutput = conv2d_op.get_destination_cooperative_tensor<decltype(activation), decltype(weights), half>();
  #pragma clang loop unroll(full)
  for (unsigned short i = 0; i < cOutput.get_capacity(); ++i) {
    if (cOutput.is_valid_element(i)) {
      cOutput[i] = 0;
    }
  }
  conv2d_op.run(activation, weights, cOutput);
  cOutput.store(output);
}

""", **globals(), offsetX=offsetX, offsetY=offsetY)


def _liuliu_conv_tiled_probe_source(offsetX, offsetY, tileWidth, tileHeight, subtractPaddingFromInputOrigin):
    """createTiledProbeSource(offsetX:offsetY:tileWidth:tileHeight:subtractPaddingFromInputOrigin:)."""
    inputOriginAdjustmentX = "- 1" if subtractPaddingFromInputOrigin else ""
    inputOriginAdjustmentY = "- 1" if subtractPaddingFromInputOrigin else ""
    inputTileWidth = (tileWidth - 1) + (kernelWidth - 1) + 1
    inputTileHeight = (tileHeight - 1) + (kernelHeight - 1) + 1
    return _swift(r"""

#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;
using namespace mpp::tensor_ops;

kernel void conv2d_tiled_offset_probe(device half *activation_buf [[buffer(0)]],
                                      device half *weights_buf [[buffer(1)]],
                                      device half *output_buf [[buffer(2)]],
                                      uint2 threadgroup_position_in_grid [[threadgroup_position_in_grid]])
{
  const int output_origin_x = int(threadgroup_position_in_grid.x) * \(tileWidth);
  const int output_origin_y = int(threadgroup_position_in_grid.y) * \(tileHeight);
  if (output_origin_x >= \(outputWidth) || output_origin_y >= \(outputHeight)) {
    return;
  }

  const int input_origin_x = output_origin_x \(inputOriginAdjustmentX);
  const int input_origin_y = output_origin_y \(inputOriginAdjustmentY);

  auto activation_base = tensor<device half, dextents<int32_t, 4>, tensor_inline>(
      activation_buf,
      dextents<int32_t, 4>(1, \(inputWidth), \(inputHeight), 1));
  auto weights = tensor<device half, dextents<int32_t, 4>, tensor_inline>(
      weights_buf,
      dextents<int32_t, 4>(1, 1, \(kernelWidth), \(kernelHeight)));
  auto output_base = tensor<device half, dextents<int32_t, 4>, tensor_inline>(
      output_buf,
      dextents<int32_t, 4>(1, \(outputWidth), \(outputHeight), 1));

  constexpr auto descriptor = convolution2d_descriptor(
      int4(1, \(tileWidth), \(tileHeight), 1),
      int4(1, \(inputTileWidth), \(inputTileHeight), 1),
      int2(\(kernelWidth), \(kernelHeight)),
      convolution2d_activation_layout::nhwc,
      convolution2d_weights_layout::hwio,
      int2(1, 1),
      int2(1, 1),
      1,
      false,
      convolution2d_descriptor::mode::multiply);
  convolution2d<descriptor, execution_simdgroups<1>> conv2d_op;
  conv2d_op.set_offsets(int2(\(offsetX), \(offsetY)));

  if (output_origin_x + \(tileWidth) <= \(outputWidth) &&
      output_origin_y + \(tileHeight) <= \(outputHeight)) {
    auto activation = activation_base.slice<1, \(inputTileWidth), \(inputTileHeight), 1>(
        0,
        input_origin_x,
        input_origin_y,
        0);
    auto output = output_base.slice<1, \(tileWidth), \(tileHeight), 1>(
        0,
        output_origin_x,
        output_origin_y,
        0);
    auto cOutput = conv2d_op.get_destination_cooperative_tensor<decltype(activation), decltype(weights), half>();
    #pragma clang loop unroll(full)
    for (unsigned short i = 0; i < cOutput.get_capacity(); ++i) {
      if (cOutput.is_valid_element(i)) {
        cOutput[i] = 0;
      }
    }
    conv2d_op.run(activation, weights, cOutput);
    cOutput.store(output);
  } else {
    auto activation = activation_base.slice(
        0,
        input_origin_x,
        input_origin_y,
        0);
    auto output = output_base.slice(
        0,
        output_origin_x,
        output_origin_y,
        0);
    auto cOutput = conv2d_op.get_destination_cooperative_tensor<decltype(activation), decltype(weights), half>();
    #pragma clang loop unroll(full)
    for (unsigned short i = 0; i < cOutput.get_capacity(); ++i) {
      if (cOutput.is_valid_element(i)) {
        cOutput[i] = 0;
      }
    }
    conv2d_op.run(activation, weights, cOutput);
    cOutput.store(output);
  }
}

""", **globals(), offsetX=offsetX, offsetY=offsetY, tileWidth=tileWidth, tileHeight=tileHeight,
                  inputOriginAdjustmentX=inputOriginAdjustmentX, inputOriginAdjustmentY=inputOriginAdjustmentY,
                  inputTileWidth=inputTileWidth, inputTileHeight=inputTileHeight)


def _conv_reference(activation, weights, offsetX, offsetY):
    """referenceForOffset(activation:weights:offsetX:offsetY:), in float64."""
    centerX, centerY = kernelWidth // 2, kernelHeight // 2
    out = torch.zeros(outputHeight, outputWidth, dtype=torch.float64)
    for oh in range(outputHeight):
        for ow in range(outputWidth):
            for kh in range(kernelHeight):
                for kw in range(kernelWidth):
                    ih, iw = oh + kh + offsetY - centerY, ow + kw + offsetX - centerX
                    if 0 <= ih < inputHeight and 0 <= iw < inputWidth:
                        out[oh, ow] += float(activation[ih, iw]) * float(weights[kh, kw])
    return out


# main()'s probes: offsets 0..2 on the whole 5 x 5 image with one SIMD-group, and the 2 x 2 tiles
# (edge tiles on the dynamic-slice branch). The activation and the dense weights are fresh random
# values rather than main()'s ramps. Of the tiled cases, the one whose windows stay inside each
# tile's activation slice: offset (1, 1) from an input origin at the output's. (The others read
# before a slice's origin, or slice from -1: left alone, as Apple's header does not say what they read.)
@pytest.mark.parametrize("offset", [(0, 0), (1, 1), (2, 1)])
def test_liuliu_conv2d_offset_probe(device, offset):
    header, body = _split_kernel(_liuliu_conv_probe_source(*offset), "conv2d_offset_probe")
    body = ("device half *activation_buf = (device half *)act; device half *weights_buf = (device half *)w;\n"
            "device half *output_buf = out;\n" + body)
    probe = kk.metal_kernel(name="liuliu_conv_probe", input_names=["act", "w"], output_names=["out"],
                            source=body, header=header)
    act, w = torch.randn(inputHeight, inputWidth).half(), torch.randn(kernelHeight, kernelWidth).half()
    out = launch(probe, device, inputs=[act.to(device), w.to(device)], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                 output_shapes=[(outputHeight, outputWidth)], output_dtypes=[torch.float16])[0]
    close(out, _conv_reference(act, w, *offset), rtol=1e-2, atol=1e-2)


def test_liuliu_conv2d_tiled_probe(device):
    header, body = _split_kernel(_liuliu_conv_tiled_probe_source(1, 1, 2, 2, False), "conv2d_tiled_offset_probe")
    body = ("device half *activation_buf = (device half *)act; device half *weights_buf = (device half *)w;\n"
            "device half *output_buf = out;\n" + body)
    probe = kk.metal_kernel(name="liuliu_conv_tiled_probe", input_names=["act", "w"], output_names=["out"],
                            source=body, header=header)
    act, w = torch.randn(inputHeight, inputWidth).half(), torch.randn(kernelHeight, kernelWidth).half()
    out = launch(probe, device, inputs=[act.to(device), w.to(device)], grid=(3 * 32, 3, 1), threadgroup=(32, 1, 1),
                 output_shapes=[(outputHeight, outputWidth)], output_dtypes=[torch.float16])[0]
    close(out, _conv_reference(act, w, 1, 1), rtol=1e-2, atol=1e-2)


# --- Anemll/fp8-mlp-metal41-bench: fp8_mlp.metal --------------------------------------------------

# The file up to its kernels, less data_ptr<metal_fp4_e2m1_format> (Metal 4.1's fp4, which kernelkit
# lacks: its f4f4 / MXFP4 kernels are left out).
ANEMLL_HEADER = """
#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>

using namespace metal;
using namespace mpp;
using namespace mpp::tensor_ops;

constant int TG_M = 64;  // rows of X / Y per threadgroup
constant int TG_N = 32;  // cols of W / Y per threadgroup

template <typename T>
struct data_ptr;

template <>
struct data_ptr<half> {
    using type = device half *;
};

template <>
struct data_ptr<float> {
    using type = device float *;
};

template <>
struct data_ptr<int> {
    using type = device int *;
};

template <>
struct data_ptr<int8_t> {
    using type = device int8_t *;
};

template <>
struct data_ptr<metal_fp8_e4m3_format> {
    using type = device uchar *;
};

// XT/WT/YT are the tensor element types. int8×int8→int is the 2× integer path.
// half×int8→float stays on the floating-point accumulator path.
template <typename XT, typename WT, typename YT>
METAL_FUNC void mlp_gemm_impl(
    typename data_ptr<XT>::type X,
    typename data_ptr<WT>::type W,
    typename data_ptr<YT>::type Y,
    int N, int K, int M,
    uint2 tgid)
{
    const int row0 = int(tgid.y) * TG_M;
    const int col0 = int(tgid.x) * TG_N;
    if (row0 >= N || col0 >= M) {
        return;
    }

    auto tX = tensor<device XT, dextents<int, 2>, tensor_inline>(
        X,
        dextents<int, 2>{K, N},
        array<int, 2>{1, K});

    auto tW = tensor<device WT, dextents<int, 2>, tensor_inline>(
        W,
        dextents<int, 2>{M, K},
        array<int, 2>{1, M});

    auto tY = tensor<device YT, dextents<int, 2>, tensor_inline>(
        Y,
        dextents<int, 2>{M, N},
        array<int, 2>{1, M});

    constexpr auto desc = matmul2d_descriptor(
        TG_M, TG_N, dynamic_length_v<int>,
        /*transpose_left=*/false,
        /*transpose_right=*/false,
        /*relaxed_precision=*/false,
        matmul2d_descriptor::mode::multiply);

    matmul2d<desc, execution_simdgroups<4>> op;

    // Full tiles get static extents so the op can skip edge checks.
    // Leftover rows/cols keep dynamic extents equal to the remaining matrix,
    // which is what matmul2d clamps against (fixed 64x32 descriptor tile).
    if (row0 + TG_M <= N && col0 + TG_N <= M) {
        auto sX = tX.template slice<dynamic_extent, 64>(0, row0);
        auto sW = tW.template slice<32, dynamic_extent>(col0, 0);
        auto sY = tY.template slice<32, 64>(col0, row0);
        op.run(sX, sW, sY);
    } else {
        auto sX = tX.slice(0, row0);
        auto sW = tW.slice(col0, 0);
        auto sY = tY.slice(col0, row0);
        op.run(sX, sW, sY);
    }
}
"""

# Each kernel's body, as its `kernel void` writes it; N, K, M (constant int& there) are template ints.
ANEMLL_KERNELS = {
    "fp16_mlp_gemm": ("half", "half", "float", "mlp_gemm_impl<half, half, float>(X, W, Y, N, K, M, tgid);"),
    "int8_mlp_gemm": ("half", "int8_t", "float", "mlp_gemm_impl<half, int8_t, float>(X, W, Y, N, K, M, tgid);"),
    "i8i8_mlp_gemm": ("int8_t", "int8_t", "int", "mlp_gemm_impl<int8_t, int8_t, int>(X, W, Y, N, K, M, tgid);"),
    "fp8_mlp_gemm": ("half", "uchar", "float",
                     "mlp_gemm_impl<half, metal_fp8_e4m3_format, float>(X, W, Y, N, K, M, tgid);"),
    "f8f8_mlp_gemm": ("uchar", "uchar", "float",
                      "mlp_gemm_impl<metal_fp8_e4m3_format, metal_fp8_e4m3_format, float>(X, W, Y, N, K, M, tgid);"),
}


def _anemll_operand(kind, shape, device):
    """(what the kernel is given, its exact float64 value)."""
    if kind == "half":
        t = torch.randn(shape).half()
        return t.to(device), t.double()
    if kind == "int8_t":
        t = torch.randint(-128, 128, shape, dtype=torch.int8)
        return t.to(device), t.double()
    t = (torch.randn(shape) * 8).to(torch.float8_e4m3fn)  # E4M3 bytes
    return t.view(torch.uint8).to(device), t.double()


# Y[N, M] = X[N, K] @ W[K, M] in 64 x 32 tiles of 4 SIMD-groups, at a size with whole and edge tiles
# (main.swift dispatches ceil(M / 32) x ceil(N / 64) threadgroups of 128 threads).
@pytest.mark.parametrize("name", list(ANEMLL_KERNELS))
def test_anemll_mlp_gemm(device, name):
    XP, WP, YP, call = ANEMLL_KERNELS[name]
    N, K, M = 70, 96, 40
    body = (f"device {XP} *X = (device {XP} *)x; device {WP} *W = (device {WP} *)w; device {YP} *Y = y;\n"
            f"uint2 tgid = threadgroup_position_in_grid.xy;\n{call}\n")
    gemm = kk.metal_kernel(name=f"anemll_{name}", input_names=["x", "w"], output_names=["y"], source=body,
                           header=ANEMLL_HEADER)
    (x, xd), (w, wd) = _anemll_operand(XP, (N, K), device), _anemll_operand(WP, (K, M), device)
    y = launch(gemm, device, inputs=[x, w], template=[("N", N), ("K", K), ("M", M)],
               grid=(-(-M // 32) * 128, -(-N // 64), 1), threadgroup=(128, 1, 1), output_shapes=[(N, M)],
               output_dtypes=[torch.int32 if YP == "int" else torch.float32])[0]
    ref = xd @ wd
    if YP == "int":
        assert torch.equal(y.cpu().long(), ref.long())
    else:
        close(y, ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


# --- ggml-org/llama.cpp: ggml/src/ggml-metal/kernels/mul_mm.metal, kernel_mul_mm ---------------------

# What the two bodies need from ggml-metal-impl.h and common.h / dequantize.h, the instantiation
# kernel_mul_mm_f16_f32 (<half, half4x4, simdgroup_half8x8, half, half2x4, simdgroup_half8x8, half4x4,
# 1, dequantize_f16, half, half4x4, float, float2x4>) as typedefs, and the function constants the host
# sets (ggml-metal-ops.cpp: bc_inp = K % 32 != 0, bc_out = M % 64 != 0 || N % 32 != 0; no broadcast).
GGML_HEADER = """
#include <metal_stdlib>
#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using namespace mpp::tensor_ops;

#define N_SIMDWIDTH 32 // assuming SIMD group size is 32
#define SZ_SIMDGROUP 16
#define N_MM_NK 2
#define N_MM_NK_TOTAL (SZ_SIMDGROUP * N_MM_NK)

#define N_MM_BLOCK_X 4
#define N_MM_BLOCK_Y 2
#define N_MM_SIMD_GROUP_X 2
#define N_MM_SIMD_GROUP_Y 2

#define FOR_UNROLL(x) _Pragma("clang loop unroll(full)") for (x)

typedef struct {
    int32_t  ne00;
    int32_t  ne02;
    uint64_t nb01;
    uint64_t nb02;
    uint64_t nb03;
    int32_t  ne12;
    uint64_t nb10;
    uint64_t nb11;
    uint64_t nb12;
    uint64_t nb13;
    int32_t  ne0;
    int32_t  ne1;
    int16_t  r2;
    int16_t  r3;
} ggml_metal_kargs_mul_mm;

template <typename type4x4>
void dequantize_f16(device const half4x4 * src, short il, thread type4x4 & reg) {
    reg = (type4x4)(*src);
}

using SA = half; using SA_4x4 = half4x4; using SA_8x8 = simdgroup_half8x8;
using SB = half; using SB_2x4 = half2x4; using SB_8x8 = simdgroup_half8x8;
using S0 = half; using S0_4x4 = half4x4; using S0_8x8 = simdgroup_half8x8;
using S1 = half; using S1_2x4 = half2x4; using S1_8x8 = simdgroup_half8x8;
using block_q = half4x4;
constant short nl = 1;
using T0 = half; using T0_4x4 = half4x4; using T1 = float; using T1_2x4 = float2x4;
inline void dequantize_func(device const block_q * src, short il, thread S0_4x4 & reg) { dequantize_f16(src, il, reg); }

constant short FC_mul_mm_ne12 = 1;
constant short FC_mul_mm_ne13 = 1;
constant short FC_mul_mm_r2 = 1;
constant short FC_mul_mm_r3 = 1;
"""

# The GGML_METAL_HAS_TENSOR branch's body: matmul2d on execution_simdgroups<4>, src1 straight from
# device memory as the left operand, the dequantized src0 tile from threadgroup memory as the
# transposed right one, a float cooperative destination stored once.
GGML_MUL_MM_TENSOR = """
    (void) sgitg;

    // Matrix dimensions: A(M,K) x B(K,N) -> C(M,N)
    const int K = args.ne00;
    const int M = args.ne0;
    const int N = args.ne1;

    // Batch dimension handling
    const int im = tgpig.z;
    const int i12 = im % FC_mul_mm_ne12;
    const int i13 = im / FC_mul_mm_ne12;

    // Batch offsets for srcA and srcB
    const uint64_t offset0 = (i12/FC_mul_mm_r2)*args.nb02 + (i13/FC_mul_mm_r3)*args.nb03;

    // Tile dimensions
    constexpr int NRB = SZ_SIMDGROUP * N_MM_BLOCK_X * N_MM_SIMD_GROUP_X;
    constexpr int NRA = SZ_SIMDGROUP * N_MM_BLOCK_Y * N_MM_SIMD_GROUP_Y;

    // Tile offsets in output matrix
    const int ra = tgpig.y * NRA;
    const int rb = tgpig.x * NRB;

    // Threadgroup memory for dequantized A tile only
    threadgroup SA * sa = (threadgroup SA *)(shmem);

    // Work-item count for A loading
    constexpr int A_WORK_ITEMS = NRA * N_MM_NK;
    constexpr int NUM_THREADS = N_SIMDWIDTH * N_MM_SIMD_GROUP_X * N_MM_SIMD_GROUP_Y;

    // tA wraps threadgroup memory
    auto tA = tensor(sa, dextents<int32_t, 2>(N_MM_NK_TOTAL, NRA));

    // tB wraps device memory directly
    device T1 * ptrB = (device T1 *)(srcB + args.nb12*i12 + args.nb13*i13);
    const int strideB = args.nb11 / sizeof(T1);
    auto tB = tensor(ptrB, dextents<int32_t, 2>(K, N), array<int, 2>({1, strideB}));

    // Configure matmul operation
    // note: K is dynamic_extent (clamped to the valid range in PHASE 2), since a static
    //       N_MM_NK_TOTAL K tile would read src1 out of bounds when K % N_MM_NK_TOTAL != 0
    // ref: https://github.com/ggml-org/llama.cpp/pull/27064
    mpp::tensor_ops::matmul2d<
        mpp::tensor_ops::matmul2d_descriptor(
            NRB, NRA, static_cast<int>(dynamic_extent), false, true, true,
            mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate),
        execution_simdgroups<N_MM_SIMD_GROUP_X * N_MM_SIMD_GROUP_Y>> mm;

    auto cT = mm.get_destination_cooperative_tensor<decltype(tB), decltype(tA), float>();

    // Accumulate partial results over K dimension
    for (int loop_k = 0; loop_k < K; loop_k += N_MM_NK_TOTAL) {
        // === PHASE 1: Dequantization of A into threadgroup memory ===
        for (int work = tiitg; work < A_WORK_ITEMS; work += NUM_THREADS) {
            const int row = work / N_MM_NK;
            const int k_chunk = work % N_MM_NK;
            const int k_pos = loop_k + k_chunk * 16;
            const short k_base = k_chunk * 16;

            // Bounds check: skip device read if row is out of matrix bounds
            if (ra + row < M) {
                if (is_same<T0_4x4, block_q>::value && FC_mul_mm_bc_inp) {
                    // Element-wise reads when K is not aligned (nb01 not aligned for half4x4/float4x4).
                    // MSL spec Table 2.5: half4x4 requires 8-byte alignment. When K is odd,
                    // nb01 = K*2 is not 8-byte aligned, so odd-row pointers are misaligned.
                    // Mirrors the legacy kernel's existing guard.
                    device const T0 * row_ptr = (device const T0 *)(srcA + args.nb01 * (ra + row) + offset0);

                    FOR_UNROLL (short i = 0; i < 16; i++) {
                        sa[row * N_MM_NK_TOTAL + (k_base + i)] = (k_pos + i < K) ? (SA) row_ptr[k_pos + i] : (SA)0;
                    }
                } else {
                    const int block_idx = k_pos / (16 * nl);
                    const short il = (k_pos / 16) % nl;

                    device const block_q * row_ptr = (device const block_q *)(srcA + args.nb01 * (ra + row) + offset0);

                    SA_4x4 temp_a;
                    dequantize_func(row_ptr + block_idx, il, temp_a);

                    FOR_UNROLL (short i = 0; i < 16; i++) {
                        // Zero-pad A for K positions beyond valid range (handles partial K iterations)
                        sa[row * N_MM_NK_TOTAL + (k_base + i)] = (k_pos + i < K) ? temp_a[i/4][i%4] : (SA)0;
                    }
                }
            } else {
                // Zero-pad rows beyond matrix bounds
                FOR_UNROLL (short i = 0; i < 16; i++) {
                    sa[row * N_MM_NK_TOTAL + (k_base + i)] = (SA)0;
                }
            }
        }

        threadgroup_barrier(mem_flags::mem_threadgroup);

        // === PHASE 2: Tensor matmul ===
        // Clamp the K extent of both operand tensors to the remaining valid K range so
        // the dynamic-K op never reads past the K extent of src1 (or the staged A tile).
        const int kExt = min(N_MM_NK_TOTAL, K - loop_k);

        auto tAv = tensor(sa, dextents<int32_t, 2>(kExt, NRA), array<int, 2>({1, N_MM_NK_TOTAL}));
        auto tBv = tensor(ptrB + loop_k + rb * strideB, dextents<int32_t, 2>(kExt, N - rb), array<int, 2>({1, strideB}));

        mm.run(tBv, tAv, cT);

        threadgroup_barrier(mem_flags::mem_threadgroup);
    }

    // Store result tile to output matrix (with batch offset)
    // cT.store handles bounds checking via tD's extents (M, N)
    device float * dstBatch = (device float *)dst + im * N * M;

    auto tD = tensor(dstBatch, dextents<int32_t, 2>(M, N), array<int, 2>({1, M}));
    cT.store(tD.slice(ra, rb));
"""

# The #else branch: the classic body on 8 x 8 simdgroup_matrix fragments (64 x 32 tiles of 4
# SIMD-groups), simdgroup_load from threadgroup memory, simdgroup_store to device or threadgroup memory.
GGML_MUL_MM_SIMDGROUP = """
    threadgroup S0 * sa = (threadgroup S0 *)(shmem);
    threadgroup S1 * sb = (threadgroup S1 *)(shmem + 4096);

    constexpr int NR0 = 64;
    constexpr int NR1 = 32;

    constexpr int NK  = 32;
    constexpr int NL0 = NK/16;
    constexpr int NL1 = NK/8;

    const int im = tgpig.z;
    const int r0 = tgpig.y*NR0;
    const int r1 = tgpig.x*NR1;

    // if this block is of 64x32 shape or smaller
    const short nr0 = (args.ne0 - r0 < NR0) ? (args.ne0 - r0) : NR0;
    const short nr1 = (args.ne1 - r1 < NR1) ? (args.ne1 - r1) : NR1;

    // a thread shouldn't load data outside of the matrix
    const short lr0 = ((short)tiitg/NL0) < nr0 ? ((short)tiitg/NL0) : nr0 - 1; // 0 .. 63
    const short lr1 = ((short)tiitg/NL1) < nr1 ? ((short)tiitg/NL1) : nr1 - 1; // 0 .. 31

    const short il0 = (tiitg % NL0);

    short il = il0;

    const int i12 = im % FC_mul_mm_ne12;
    const int i13 = im / FC_mul_mm_ne12;

    const uint64_t offset0 = (i12/FC_mul_mm_r2)*args.nb02 + (i13/FC_mul_mm_r3)*args.nb03;
    const short    offset1 = il0/nl;

    device const block_q * x = (device const block_q *)(src0 + args.nb01*(r0 + lr0) + offset0) + offset1;

    const short iy = 8*(tiitg % NL1);

    device const T1 * y = (device const T1 *)(src1
        + args.nb13*i13
        + args.nb12*i12
        + args.nb11*(r1 + lr1)
        + args.nb10*iy);

    S0_8x8 ma[4];
    S1_8x8 mb[2];

    simdgroup_float8x8 mc[8];

    for (short i = 0; i < 8; i++){
        mc[i] = make_filled_simdgroup_matrix<float, 8>(0.f);
    }

    for (int loop_k = 0; loop_k < args.ne00; loop_k += NK) {
        // load data and store to threadgroup memory
        if (is_same<T0_4x4, block_q>::value && FC_mul_mm_bc_inp) {
            threadgroup_barrier(mem_flags::mem_threadgroup);

            // no need for dequantization
            for (short i = 0; i < 16; i++) {
                const short sx = 2*il0 + i/8;
                const short sy = (tiitg/NL0)/8;

              //const short lx = i%8;
              //const short ly = (tiitg/NL0)%8;
                const short lx = (tiitg/NL0)%8;
                const short ly = i%8;

                const short ib = 8*sx + sy;

                *(sa + 64*ib + 8*ly + lx) = loop_k + 16*il + i < args.ne00 ? *((device T0 *) x + i) : 0;
            }
        } else {
            S0_4x4 temp_a;
            dequantize_func(x, il, temp_a);

            threadgroup_barrier(mem_flags::mem_threadgroup);

            FOR_UNROLL (short i = 0; i < 16; i++) {
                const short sx = 2*il0 + i/8;
                const short sy = (tiitg/NL0)/8;

              //const short lx = i%8;
              //const short ly = (tiitg/NL0)%8;
                const short lx = (tiitg/NL0)%8;
                const short ly = i%8;

                const short ib = 8*sx + sy;

                // NOTE: this is massively slower.. WTF?
                //sa[64*ib + 8*ly + lx] = temp_a[i/4][i%4];

                *(sa + 64*ib + 8*ly + lx) = temp_a[i/4][i%4];
            }
        }

        if (FC_mul_mm_bc_inp) {
            for (short i = 0; i < 8; ++i) {
                const short sx = (tiitg%NL1);
                const short sy = (tiitg/NL1)/8;

                const short lx = i;
                const short ly = (tiitg/NL1)%8;
              //const short lx = (tiitg/NL1)%8;
              //const short ly = i;

                const short ib = 4*sx + sy;

                *(sb + 64*ib + 8*ly + lx) = loop_k + iy + i < args.ne00 ? (S1) *((device T1 *) y + i) : 0;
            }
        } else {
            const short sx = (tiitg%NL1);
            const short sy = (tiitg/NL1)/8;

          //const short dx = sx;
          //const short dy = sy;

            const short ly = (tiitg/NL1)%8;

            const short ib = 4*sx + sy;

            *(threadgroup S1_2x4 *)(sb + 64*ib + 8*ly) = (S1_2x4)(*((device T1_2x4 *) y));
        }

        il = (il + 2 < nl) ? il + 2 : il % 2;
        x  = (il < 2) ? x + (2 + nl - 1)/nl : x;

        y += NK;

        threadgroup_barrier(mem_flags::mem_threadgroup);

        // load matrices from threadgroup memory and conduct outer products
        threadgroup const S0 * lsma = (sa + 4*64*(sgitg%2));
        threadgroup const S1 * lsmb = (sb + 2*64*(sgitg/2));

        FOR_UNROLL (short ik = 0; ik < NK/8; ik++) {
            simdgroup_barrier(mem_flags::mem_none);

            FOR_UNROLL (short i = 0; i < 4; i++) {
                simdgroup_load(ma[i], lsma + 64*i, 8, 0, false);
            }

            simdgroup_barrier(mem_flags::mem_none);

            FOR_UNROLL (short i = 0; i < 2; i++) {
                simdgroup_load(mb[i], lsmb + 64*i, 8, 0, false);
            }

            simdgroup_barrier(mem_flags::mem_none);

            FOR_UNROLL (short i = 0; i < 8; i++){
                simdgroup_multiply_accumulate(mc[i], mb[i/4], ma[i%4], mc[i]);
            }

            lsma += 8*64;
            lsmb += 4*64;
        }
    }

    if (!FC_mul_mm_bc_out || (r0 + NR0 <= args.ne0 && r1 + NR1 <= args.ne1)) {
        // if no bounds checks on the output are needed, we can directly write to device memory
        device float * C = (device float *) dst +
            (r0 + 32*(sgitg &  1)) + \\
            (r1 + 16*(sgitg >> 1)) * args.ne0 + im*args.ne1*args.ne0;

        for (short i = 0; i < 8; i++) {
            simdgroup_store(mc[i], C + 8*(i%4) + 8*args.ne0*(i/4), args.ne0, 0, false);
        }
    } else {
        // block is smaller than 64x32, we should avoid writing data outside of the matrix
        threadgroup_barrier(mem_flags::mem_threadgroup);

        threadgroup float * temp_str = ((threadgroup float *) shmem) + 32*(sgitg&1) + (16*(sgitg >> 1))*NR0;

        for (short i = 0; i < 8; i++) {
            simdgroup_store(mc[i], temp_str + 8*(i%4) + 8*NR0*(i/4), NR0, 0, false);
        }

        threadgroup_barrier(mem_flags::mem_threadgroup);

        if (sgitg == 0) {
            for (int j = tiitg; j < nr1; j += NR1) {
                device float  * D  = (device float  *) dst + r0 + (r1 + j)*args.ne0 + im*args.ne1*args.ne0;
                device float4 * D4 = (device float4 *) D;

                threadgroup float  * C  = temp_str + (j*NR0);
                threadgroup float4 * C4 = (threadgroup float4 *) C;

                int i = 0;
                for (; i < nr0/4; i++) {
                    *(D4 + i) = *(C4 + i);
                }

                i *= 4;
                for (; i < nr0; i++) {
                    *(D + i) = *(C + i);
                }
            }
        }
    }
"""


# kernel_mul_mm_f16_f32: dst[n, m] = sum_k src1[n, k] * src0[m, k] (src0 f16 M x K, src1 f32 N x K),
# dispatched as ggml-metal-ops.cpp does (ceil(N / 32) x ceil(M / 64) threadgroups of 128 threads;
# the tensor branch's tiles are 128 x 64). The kernel's parameters become a prologue: the kargs
# built from the sizes, the function constants bc_inp / bc_out as the host computes them, the
# threadgroup(0) buffer declared. K = 40 takes the unaligned, bounds-checked paths; K = 64 with
# whole tiles the half4x4 dequantize and float2x4 -> half2x4 loads and direct stores. (M is a
# multiple of 4: the edge store writes dst rows through float4 pointers, which MSL aligns to 16 bytes.)
@pytest.mark.parametrize("path", ["tensor", "simdgroup"])
@pytest.mark.parametrize("M,N,K", [(68, 50, 40), (128, 64, 64)])
def test_llama_cpp_mul_mm_f16_f32(device, path, M, N, K):
    bc_inp, bc_out = K % 32 != 0, M % 64 != 0 or N % 32 != 0
    prologue = f"""
    constexpr bool FC_mul_mm_bc_inp = {str(bc_inp).lower()};
    constexpr bool FC_mul_mm_bc_out = {str(bc_out).lower()};
    const ggml_metal_kargs_mul_mm args = {{ {K}, 1, {K * 2}, {M * K * 2}, {M * K * 2}, 1, 4, {K * 4}, {N * K * 4},
                                            {N * K * 4}, {M}, {N}, 1, 1 }};
    threadgroup char shmem[8192];
    device const char * srcA = (device const char *)src0_in; device const char * src0 = srcA;
    device const char * srcB = (device const char *)src1_in; device const char * src1 = srcB;
    device char * dst = (device char *)dst_out;
    uint3 tgpig = threadgroup_position_in_grid;
    ushort tiitg = thread_index_in_threadgroup, sgitg = simdgroup_index_in_threadgroup;
"""
    body = prologue + (GGML_MUL_MM_TENSOR if path == "tensor" else GGML_MUL_MM_SIMDGROUP)
    mul_mm = kk.metal_kernel(name=f"ggml_mul_mm_{path}", input_names=["src0_in", "src1_in"], output_names=["dst_out"],
                             source=body, header=GGML_HEADER)
    src0, src1 = torch.randn(M, K).half(), torch.randn(N, K)
    NR1 = 128 if path == "tensor" else 32
    dst = launch(mul_mm, device, inputs=[src0.to(device), src1.to(device)],
                 grid=(-(-N // NR1) * 128, -(-M // 64), 1), threadgroup=(128, 1, 1),
                 output_shapes=[(N, M)], output_dtypes=[torch.float32])[0]
    # the simdgroup path stages src1 as half; the tensor path reads it as float
    b = src1.half().double() if path == "simdgroup" else src1.double()
    ref = b @ src0.double().T
    if path == "tensor" and device.type == "cuda":
        # its descriptor asks for relaxed_precision: on a GPU the float operand enters the tensor
        # cores as tf32 (10 fraction bits, rounded or truncated), each product off by up to 2^-10
        bound = 2.0**-10 * (src1.double().abs() @ src0.double().abs().T) + 1e-5
        assert bool(((dst.cpu().double() - ref).abs() <= bound).all())
    else:
        close(dst, ref, rtol=1e-4, atol=1e-4)


# --- ml-explore/mlx: mlx/backend/metal/kernels/steel/gemm/nax.h, BaseNAXFrag ---------------------------

# BaseNAXFrag's fragment coordinates, load, store and its first mma (one 16 x 16 A fragment times two
# 16 x 16 B fragments, through matmul2d(16, 32, 16) on execution_simdgroup with cooperative inputs
# filled element by element), verbatim but for two shims: Apple's __metal_get_thread_index_in_simdgroup
# (a builtin outside the MSL specification) reads kernelkit's lane, and dtype_frag_t, MLX's
# metal::vec<U, 8> (Apple's compiler takes 8-element vectors; kernelkit's vec stops at 4), is an
# array of 8. Steel's defines and integral_constant.h's Int are written out.
NAX_HEADER = """
#include <metal_stdlib>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
#define STEEL_CONST static constant constexpr const
#define STEEL_PRAGMA_UNROLL _Pragma("clang loop unroll(full)")
#define METAL_FUNC inline
template <int val> using Int = integral_constant<int, val>;
template <typename T> struct pointer_element {};
template <typename T> struct pointer_element<thread T*> { using type = remove_cv_t<T>; };
template <typename T> using pointer_element_t = typename pointer_element<remove_cv_t<T>>::type;
inline ushort __metal_get_thread_index_in_simdgroup(ushort) { return ushort(kk::simd_lane()); }

struct BaseNAXFrag {
  STEEL_CONST short kFragRows = 16;
  STEEL_CONST short kFragCols = 16;

  STEEL_CONST short kElemsPerFrag = (kFragRows * kFragCols) / 32;

  STEEL_CONST short kElemRows = 2;
  STEEL_CONST short kElemCols = 4;

  STEEL_CONST short kElemRowsJump = 8;

  static_assert(
      kElemRows * kElemCols == kElemsPerFrag,
      "MMAFrag shape is not consistent with MMAFrag size");

  template <typename U>
  using dtype_frag_t = metal::array<U, kElemsPerFrag>;  // MLX: typename metal::vec<U, kElemsPerFrag>

  METAL_FUNC static short2 get_coord() {
    const ushort simd_lane_id = __metal_get_thread_index_in_simdgroup(ushort());
    const short qid = simd_lane_id >> 2;
    const short fm = ((qid & 4) | ((simd_lane_id >> 1) & 3));
    const short fn = ((qid & 2) | (simd_lane_id & 1)) * 4;
    return short2{fn, fm};
  }

  template <
      typename T,
      typename SrcPtrType,
      typename StrX,
      typename StrY,
      typename OffX = Int<0>,
      typename OffY = Int<0>>
  METAL_FUNC static constexpr void load(
      thread dtype_frag_t<T>& dst,
      SrcPtrType src,
      StrX str_x,
      StrY str_y,
      OffX off_x = {},
      OffY off_y = {}) {
    const short2 sc = get_coord();
    src += sc.y * str_x + sc.x * str_y;

    STEEL_PRAGMA_UNROLL
    for (short i = 0; i < kElemRows; i++) {
      const auto r = off_x + i * kElemRowsJump;
      const auto c = off_y;

      if constexpr (metal::is_same_v<StrY, Int<1>>) {
        STEEL_PRAGMA_UNROLL
        for (short j = 0; j < kElemCols; j++) {
          dst[i * kElemCols + j] = static_cast<T>(src[r * str_x + c + j]);
        }
      } else {
        STEEL_PRAGMA_UNROLL
        for (short j = 0; j < kElemCols; j++) {
          dst[i * kElemCols + j] =
              static_cast<T>(src[r * str_x + (c + j) * str_y]);
        }
      }
    }
  }

  template <
      typename T,
      typename DstPtrType,
      typename StrX,
      typename StrY,
      typename OffX = Int<0>,
      typename OffY = Int<0>>
  METAL_FUNC static constexpr void store(
      const thread dtype_frag_t<T>& src,
      DstPtrType dst,
      StrX str_x,
      StrY str_y,
      OffX off_x = {},
      OffY off_y = {}) {
    using U = pointer_element_t<DstPtrType>;

    const short2 sc = get_coord();
    dst += sc.y * str_x + sc.x * str_y;

    STEEL_PRAGMA_UNROLL
    for (short i = 0; i < kElemRows; i++) {
      const auto r = off_x + i * kElemRowsJump;
      const auto c = off_y;

      if constexpr (metal::is_same_v<StrY, Int<1>>) {
        STEEL_PRAGMA_UNROLL
        for (short j = 0; j < kElemCols; j++) {
          dst[r * str_x + c + j] = static_cast<U>(src[i * kElemCols + j]);
        }
      } else {
        STEEL_PRAGMA_UNROLL
        for (short j = 0; j < kElemCols; j++) {
          dst[r * str_x + (c + j) * str_y] =
              static_cast<U>(src[i * kElemCols + j]);
        }
      }
    }
  }

  template <
      typename CType,
      typename AType,
      typename BType,
      bool transpose_a = false,
      bool transpose_b = false>
  METAL_FUNC static constexpr void mma(
      thread dtype_frag_t<CType>& Cn0,
      thread dtype_frag_t<CType>& Cn1,
      const thread dtype_frag_t<AType>& A,
      metal::bool_constant<transpose_a>,
      const thread dtype_frag_t<BType>& Bn0,
      const thread dtype_frag_t<BType>& Bn1,
      metal::bool_constant<transpose_b>) {
    constexpr auto desc = mpp::tensor_ops::matmul2d_descriptor(
        16,
        32,
        16,
        transpose_a,
        transpose_b,
        true,
        mpp::tensor_ops::matmul2d_descriptor::mode::multiply_accumulate);

    // Create matmul op
    mpp::tensor_ops::matmul2d<desc, metal::execution_simdgroup> gemm_op;

    // Create matmul operands in registers
    auto ct_a =
        gemm_op
            .template get_left_input_cooperative_tensor<AType, BType, CType>();
    auto ct_b =
        gemm_op
            .template get_right_input_cooperative_tensor<AType, BType, CType>();

    // Create matmul output in register
    auto ct_c = gemm_op.template get_destination_cooperative_tensor<
        metal::remove_addrspace_t<decltype(ct_a)>,
        metal::remove_addrspace_t<decltype(ct_b)>,
        CType>();

    // Load A in to left operand registers
    STEEL_PRAGMA_UNROLL
    for (short i = 0; i < kElemsPerFrag; i++) {
      ct_a[i] = A[i];
    }

    // Load B into right operand registers
    STEEL_PRAGMA_UNROLL
    for (short i = 0; i < kElemsPerFrag; i++) {
      ct_b[i] = Bn0[i];
      ct_b[kElemsPerFrag + i] = Bn1[i];
    }

    // Load C into output registers (op handles accumulation)
    STEEL_PRAGMA_UNROLL
    for (short i = 0; i < kElemsPerFrag; i++) {
      ct_c[i] = Cn0[i];
      ct_c[kElemsPerFrag + i] = Cn1[i];
    }

    // Do matmul
    gemm_op.run(ct_a, ct_b, ct_c);

    // Copy out results
    STEEL_PRAGMA_UNROLL
    for (short i = 0; i < kElemsPerFrag; i++) {
      Cn0[i] = ct_c[i];
      Cn1[i] = ct_c[kElemsPerFrag + i];
    }
  }
};
"""

# C (16 x 32) += A (16 x 16) * B (16 x 32) as NAX steel's tiles call it: fragments loaded with
# load(frag, ptr, Int<ld>, Int<1>), one mma, stores. It assumes Apple's element order for a
# cooperative tensor of this op (lane l holds rows fm and fm + 8 of a 16 x 16 block, four adjacent
# columns from fn: get_coord), which Apple leaves implementation-defined; kernelkit's is mma.sync's
# m16n8 fragment (layout.h: lane l holds rows l / 4 and l / 4 + 8, columns 2 (l % 4) and the next,
# in 8-column blocks), so element i of each operand names another matrix element and the product
# is wrong. (A body written to Apple's documentation reads get_multidimensional_index instead.)
NAX_BODY = """
  using Frag = BaseNAXFrag;
  Frag::dtype_frag_t<half> fa, fb0, fb1;
  Frag::dtype_frag_t<float> fc0, fc1;
  Frag::load<half>(fa, a, Int<16>{}, Int<1>{});
  Frag::load<half>(fb0, b, Int<32>{}, Int<1>{});
  Frag::load<half>(fb1, b + 16, Int<32>{}, Int<1>{});
  Frag::load<float>(fc0, c, Int<32>{}, Int<1>{});
  Frag::load<float>(fc1, c + 16, Int<32>{}, Int<1>{});
  Frag::mma(fc0, fc1, fa, metal::bool_constant<false>{}, fb0, fb1, metal::bool_constant<false>{});
  Frag::store<float>(fc0, out, Int<32>{}, Int<1>{});
  Frag::store<float>(fc1, out + 16, Int<32>{}, Int<1>{});
"""


@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="kernelkit's cooperative-tensor element order is mma.sync's, "
                   "not the one MLX's NAX fragments assume (see the comment above)")
def test_mlx_nax_fragment_mma(device):
    mma = kk.metal_kernel(name="mlx_nax_frag_mma", input_names=["a", "b", "c"], output_names=["out"],
                          source=NAX_BODY, header=NAX_HEADER)
    a, b, c = torch.randn(16, 16).half(), torch.randn(16, 32).half(), torch.randn(16, 32)
    out = launch(mma, device, inputs=[t.to(device) for t in (a, b, c)], grid=(32, 1, 1), threadgroup=(32, 1, 1),
                 output_shapes=[(16, 32)], output_dtypes=[torch.float32])[0]
    close(out, c.double() + a.double() @ b.double(), rtol=1e-3, atol=1e-3)

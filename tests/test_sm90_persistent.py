"""tensor_ops/sm90_persistent.h from a user's CUDA body: a persistent Hopper GEMM with the body's
own epilogue (here GELU of the product plus a residual read as the epilogue's source, a pair at
a time or staged by TMA).

On the CPU: the kernel compiles for sm_90a with NVRTC and names its shared memory for the launcher.
On an H100: against float64 torch, sizes off the tiles (matmul_add_relu's tests cover the
operand majorness and batches)."""

import math

import pytest
import torch

import kernelkit as kk

BODY = """
  // a (M x K) and b (K x N) row-major: A is K-major, B is N-major
  using G = kk::tops::sm90::persistent_gemm<T, true, false, 16, STAGED != 0>;
  const int M = a_shape[0], K = a_shape[1], N = b_shape[1];
  const G::operand A{a, 0, K, 1}, B{b, 0, N, 1}, R{residual, 0, N, 1};
  G::run(A, B, R, out, 1, M, N, K, [](float& v0, float& v1, float r0, float r1, int, int, int) {
    v0 = 0.5f * v0 * (1.0f + erff(v0 * 0.70710678f)) + r0;
    v1 = 0.5f * v1 * (1.0f + erff(v1 * 0.70710678f)) + r1;
  });
"""
HEADER = "#define KK_MAX_THREADS_PER_THREADGROUP 384\n#include <kernelkit/tensor_ops.h>\n"
SMEM = 4 * 384 * 128 + 2 * 128 * 128 + 2048  # persistent_gemm::smem_bytes


def _kernel():
    return kk.cuda_kernel("gemm_gelu_residual", ["a", "b", "residual"], ["out"], BODY, header=HEADER)


def _launch(kernel, a, b, residual, staged):
    M, N = a.shape[0], b.shape[1]
    tiles = math.ceil(M / 128) * math.ceil(N / 256)
    ctas = min(tiles, torch.cuda.get_device_properties(a.device).multi_processor_count)
    return kernel(inputs=[a, b, residual], template=[("T", a.dtype), ("STAGED", staged)], output_shapes=[(M, N)],
                  output_dtypes=[a.dtype], grid=(ctas * 384, 1, 1), threadgroup=(384, 1, 1))[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("staged", [0, 1])
def test_compiles_for_sm90a_and_names_its_shared_memory(dtype, staged, nvrtc):
    from kernelkit.backends.cuda import tensor_ops_shared
    m = torch.empty(300, 200, dtype=dtype, device="meta")
    compiled = kk.compile_for(_kernel(), "sm_90", inputs=[m, m, m], output_shapes=[(300, 200)],
                              output_dtypes=[dtype], template=[("T", dtype), ("STAGED", staged)],
                              grid=(384, 1, 1), threadgroup=(384, 1, 1))
    assert compiled.arch == "sm_90a" and tensor_ops_shared(compiled.binary) == SMEM


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                    reason="needs an sm_90 GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M, N, K", [(333, 264, 200), (1100, 2056, 1000)])
@pytest.mark.parametrize("staged", [0, 1])  # the residual a pair at a time, or by TMA
def test_matches_float64(dtype, M, N, K, staged):
    a, b, residual = (torch.randn(s, device="cuda").to(dtype) for s in ((M, K), (K, N), (M, N)))
    out = _launch(_kernel(), a, b, residual, staged)
    ref = torch.nn.functional.gelu(a.double() @ b.double()) + residual.double()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-2

"""mma.sync's peak bf16 rate on this GPU, beside cuBLAS's: the ceiling of a simdgroup_matrix GEMM.

    PYTHONPATH=src python bench/mma_sync_peak.py            (needs an NVIDIA GPU)

A `simdgroup_multiply_accumulate` is one 8 x 8 x 8 product; on NVIDIA the smallest bf16 mma.sync
is m16n8k8, so each call can use at most half of one (issue 16's simdgroup_matrix bar: 40% of
cuBLAS). This times warps issuing independent mma.sync m16n8k16 and m16n8k8 back to back (8
accumulators a warp, 4 warps a threadgroup, 16 threadgroups an SM) and torch.matmul bf16 at
8192^3, and prints each rate and the 8 x 8 x 8 ceiling (half of m16n8k8's) as a share of cuBLAS.
"""

import argparse

import torch

import kernelkit as kk
from kernelkit.benchmarks import cuda_median_ms

SOURCE = r"""
const unsigned lane = threadIdx.x & 31;
float acc[8][4];
#pragma unroll
for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
const unsigned a0 = 0x3c003c00u ^ lane, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, b0 = 0x3c003c00u, b1 = b0 ^ lane;
const int iters = n[0];
for (int it = 0; it < iters; ++it) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    if (K == 16)
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                   : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
      asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                   : "+f"(acc[j][0]), "+f"(acc[j][1]), "+f"(acc[j][2]), "+f"(acc[j][3])
                   : "r"(a0), "r"(a1), "r"(b0));
  }
}
float s = 0.0f;
#pragma unroll
for (int j = 0; j < 8; ++j) s += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
out[blockIdx.x * blockDim.x + threadIdx.x] = s;
"""
KERNEL = kk.cuda_kernel(name="mma_sync_peak", input_names=["n"], output_names=["out"], source=SOURCE)
THREADS = 128  # 4 warps a threadgroup


def launch(k: int, iters: int, groups: int):
    return KERNEL(inputs=[iters], template=[("K", k)], grid=(groups * THREADS, 1, 1),
                  threadgroup=(THREADS, 1, 1), output_shapes=[(groups * THREADS,)],
                  output_dtypes=[torch.float32])[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=4096)
    a = p.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    groups = 16 * sms
    rates = {}
    for k in (16, 8):
        ms = cuda_median_ms(lambda: launch(k, a.iters, groups), repeat=5, warmup=1)
        flop = 2 * 16 * 8 * k * 8 * a.iters * groups * (THREADS // 32)
        rates[k] = flop / ms / 1e9
    x, y = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    cublas = 2 * 8192 ** 3 / cuda_median_ms(lambda: torch.matmul(x, y), repeat=5, warmup=1) / 1e9
    print(f"{torch.cuda.get_device_name()}: TFLOP/s, bf16")
    print(f"cuBLAS (torch.matmul 8192^3)   {cublas:7.0f}")
    for k in (16, 8):
        print(f"mma.sync m16n8k{k:<2d}             {rates[k]:7.0f}   ({rates[k] / cublas:.0%} of cuBLAS)")
    print(f"8x8x8 products on m16n8k8 (half of it, no other cost): {rates[8] / 2:.0f} "
          f"({rates[8] / 2 / cublas:.0%} of cuBLAS; issue 16's bar is 40%)")


if __name__ == "__main__":
    main()

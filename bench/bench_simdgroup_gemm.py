"""A GEMM written with simdgroup_matrix 8 x 8 fragments as MLX's steel kernels write it
(tests/test_tensor_ops.py STEEL_GEMM: 64 x 64 x 16 threadgroup tiles, 2 x 2 SIMD-groups of 4 x 4
float fragments), beside torch.matmul (cuBLAS) in one process, interleaved: issue 16's
simdgroup_matrix line. bench/mma_sync_peak.py measures the ceiling that an 8 x 8 x 8 product on
mma.sync sets (half of an m16n8k8: 30% of cuBLAS on the H200).

    PYTHONPATH=src python bench/bench_simdgroup_gemm.py [--sizes 4096 8192] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

import torch

import kernelkit as kk
from kernelkit.benchmarks import interleaved_ms, record, relative_error

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_tensor_ops import STEEL_GEMM, STEEL_HEADER  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out")
    args = p.parse_args()
    kernel = kk.metal_kernel("steel_gemm", ["a", "b"], ["c"], STEEL_GEMM, header=STEEL_HEADER)
    rows = []
    for n in args.sizes:
        for name in args.dtypes:
            dtype = getattr(torch, name)
            a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))

            def steel():
                return kernel(inputs=[a, b], output_shapes=[(n, n)], output_dtypes=[torch.float32],
                              template=[("T", dtype)], grid=(128 * (n // 64), n // 64, 1),
                              threadgroup=(128, 1, 1))[0]

            error = relative_error(steel(), a.double() @ b.double())
            ms = interleaved_ms({"steel": steel, "torch": lambda: torch.matmul(a, b)}, args.rounds,
                                max(1, int(2e12 / (2 * n ** 3))))
            flop = 2 * n ** 3
            row = {"n": n, "dtype": name, "steel_ms": ms["steel"], "torch_ms": ms["torch"],
                   "steel_tflops": flop / ms["steel"] / 1e9, "torch_tflops": flop / ms["torch"] / 1e9,
                   "share_of_cublas": ms["torch"] / ms["steel"], "relative_error": error}
            rows.append(row)
            print(f"{n}^3 {name:9s} steel simdgroup_matrix {row['steel_tflops']:6.0f} TFLOP/s   "
                  f"cuBLAS {row['torch_tflops']:6.0f}   {100 * row['share_of_cublas']:5.1f}% "
                  f"(error {error:.1e})", flush=True)
    if args.out:
        command = shlex.join(["python", "bench/bench_simdgroup_gemm.py", *sys.argv[1:]])
        with open(args.out, "w") as f:
            json.dump(record("simdgroup_gemm", {"rows": rows}, torch.device("cuda"), command), f, indent=2)


if __name__ == "__main__":
    main()

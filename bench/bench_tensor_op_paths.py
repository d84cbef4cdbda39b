"""Times the talk's tile matmul (tests/test_tensor_ops.py TILE_MATMUL) on each NVIDIA path beside
torch.matmul, and an MLX-steel-style simdgroup_matrix GEMM; prints the path each kernel's runs
took (KERNELKIT_TENSOR_OPS_REPORT). A first look: the issue's benchmark of the talk's kernel is
bench_talk_matmul.py (bench_tensor_ops.py: warpgroup_gemm called directly).

    PYTHONPATH=src python bench/bench_tensor_op_paths.py --size 4096
"""

import argparse
import os
import sys

import torch

import kernelkit as kk

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_tensor_ops import HEADER, SIMDGROUP_GEMM, TILE_MATMUL  # noqa: E402


def timed(fn, reps=10):
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--size", type=int, default=4096)
    n = p.parse_args().size
    a, b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16), torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    flop = 2 * n ** 3
    ms = timed(lambda: torch.matmul(a, b))
    print(f"torch.matmul bf16 {n}^3: {ms:.3f} ms, {flop / ms / 1e9:.0f} TFLOP/s")
    ref = a.float() @ b.float()
    for tm, tn in [(128, 128), (64, 32)]:
        tmpl = [("TILEM", tm), ("TILEN", tn), ("TL", False), ("TR", False), ("ACC", False), ("RELAXED", False)]
        grid = (128 * n // tn, n // tm, 1)
        for report in (True, False):
            os.environ["KERNELKIT_TENSOR_OPS_REPORT"] = "1" if report else "0"
            k = kk.metal_kernel(f"tile_{tm}x{tn}{'_report' if report else ''}", ["a", "b"], ["c"], TILE_MATMUL,
                                header=HEADER)
            run = lambda: k(inputs=[a, b], output_shapes=[(n, n)], output_dtypes=[torch.float32], grid=grid,  # noqa: E731
                            threadgroup=(128, 1, 1), template=tmpl)[0]
            if report:
                run()
                torch.cuda.synchronize()
                continue
            err = (run() - ref).abs().max().item()
            ms = timed(run, 3 if tm == 64 else 10)
            print(f"tile matmul {tm}x{tn}, execution_simdgroups<4>: {ms:.3f} ms, {flop / ms / 1e9:.0f} TFLOP/s "
                  f"(max error {err:.2e})")
    k = kk.metal_kernel("sg_gemm", ["a", "b"], ["c", "extra"], SIMDGROUP_GEMM, header="#include <metal_simdgroup_matrix>\n")
    run = lambda: k(inputs=[a, b], output_shapes=[(n, n), (8, 8)], output_dtypes=[torch.float32] * 2,  # noqa: E731
                    grid=(128 * (n // 32), n // 32, 1), threadgroup=(128, 1, 1),
                    template=[("T", torch.float32), ("TI", torch.bfloat16), ("N", n), ("K", n)])
    err = (run()[0] - ref).abs().max().item()
    ms = timed(run, 3)
    print(f"simdgroup_matrix GEMM (MLX steel style, 32x32 per threadgroup): {ms:.3f} ms, "
          f"{flop / ms / 1e9:.0f} TFLOP/s (max error {err:.2e})")


if __name__ == "__main__":
    main()

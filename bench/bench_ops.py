"""kernelkit.ops against torch on a GPU (issue 5).

grid_sample bilinear/zeros float32 at the seed's shape (x 8x1024x1024x64, grid 8x256x256x2):
forward, and forward+backward (x_grad and grid_grad), beside torch.nn.functional.grid_sample
(NCHW data, and the NHWC view) and the composed reference; matmul_add_relu at batch 8 x
2048^3 in bfloat16 and float32 beside torch (cuBLAS matmul + bias + relu); mxfp8_matmul and
flash_attention beside torch's bf16 matmul and SDPA; cholesky and qr (4096 matrices of 32 x 32,
one of 4096 x 4096) beside torch.linalg's. CUDA-event medians.

    python bench/bench_ops.py [--quick] [--device cuda:N] [--out bench/results/<tag>/ops.json]

The code is ops_figures in kernelkit/benchmarks/ops.py, which `kernelkit bench` runs too.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

from kernelkit.benchmarks import script_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(script_main("ops"))

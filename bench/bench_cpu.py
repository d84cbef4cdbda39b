"""The CPU backend's figures (issue 3).

- exp over 64M float32 (a barrier-free kernel: plain loops, no fibers) against torch.exp;
- the seed's grid_sample forward and VJP (fibers: simd_sum) at 1/16 of the seed's batch x grid
  size (x 2x1024x1024x64, grid 2x128x128x2: batch 8 -> 2 and grid 256x256 -> 128x128), against
  torch's forward and forward + backward;
- matmul_add_relu (fibers: barriers), 2 x 512^3 float32, against relu(baddbmm);
- compile time of a kernel: cold (empty cache, fresh process) and a disk-cache hit.

    python bench/bench_cpu.py [--quick] [--out bench/results/<tag>/cpu.json]

The code is cpu_figures in kernelkit/benchmarks/cpu.py, which `kernelkit bench --device cpu` runs too.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

from kernelkit.benchmarks import script_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(script_main("cpu"))

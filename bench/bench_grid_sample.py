"""grid_sample forward and VJP through metal_kernel against a hand-written CUDA port (issue 2).

The seed's shape: x 8x1024x1024x64, grid 8x256x256x2, float32, grid uniform in [-1, 1].
The hand port is the same kernel written in CUDA C++ and launched through CuPy's
RawKernel (independent of kernelkit's pipeline; skipped, with a note, without CuPy).
Times are CUDA-event medians. Also measures compile time: the first call with an empty
cache, and a fresh process reaching its first launch from a warm disk cache.

    python bench/bench_grid_sample.py [--quick] [--device cuda:N] [--out bench/results/<tag>/grid_sample.json]

The code is grid_sample_figures in kernelkit/benchmarks/grid_sample.py, which `kernelkit bench` runs too.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

from kernelkit.benchmarks import script_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(script_main("grid_sample"))

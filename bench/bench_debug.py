"""Checked calls (issue 7): check_bounds=True and timeout= against plain calls of the same
kernels (exp, a row sum with a loop, the seed's grid_sample forward).

    python bench/bench_debug.py [--quick] [--device cuda|cpu] [--out FILE.json]

The code is debug_figures in kernelkit/benchmarks/debug.py, which `kernelkit bench` runs too.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

from kernelkit.benchmarks import script_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(script_main("debug"))

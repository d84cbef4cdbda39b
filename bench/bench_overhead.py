"""Per-call host overhead of a cached kernel (issue 6), beside torch's own small op.

A kernel with one input and one output of 32 float32 elements, called in a loop;
host time per call including output allocation, no sync inside the loop.

    python bench/bench_overhead.py [--quick] [--device cuda|cpu] [--out FILE.json]

The code is overhead_figures in kernelkit/benchmarks/overhead.py, which `kernelkit bench` runs too.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

from kernelkit.benchmarks import script_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(script_main("overhead"))

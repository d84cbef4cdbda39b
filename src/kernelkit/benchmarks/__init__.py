"""The benchmark suite behind BENCHMARKS.md, shared by `kernelkit bench` and the bench/ scripts.

Five benchmarks, each a function returning a JSON-ready dict, each in its own module:

- `grid_sample` (GPU; bench/bench_grid_sample.py): the seed's grid_sample forward and VJP
  through `metal_kernel` against the same kernel hand-written in CUDA C++
  (grid_sample_hand_port.cu, through CuPy's RawKernel, when CuPy is installed), and the compile
  times of a fresh process (compile_times.py);
- `ops` (GPU; bench/bench_ops.py): `kernelkit.ops.grid_sample`, `matmul_add_relu`, `mxfp8_matmul` and
  `flash_attention` against torch;
- `cpu` (bench/bench_cpu.py): the CPU backend's exp, grid_sample and matmul_add_relu against
  torch, and its compile times;
- `overhead` (either device; bench/bench_overhead.py): host time per call of a cached kernel;
- `debug` (either device; bench/bench_debug.py): checked calls (`check_bounds=True`, `timeout=`)
  against plain calls of the same kernels.

suite.py runs them by name; timing.py holds what they share, among it `record`, which adds what
makes a figure reproducible: date, device, versions (kernelkit, torch, NVRTC, driver, C++
compiler) and the command. report.py's `markdown` turns results (also the older files under
bench/results/) into BENCHMARKS.md's tables; `write_results` writes them, with charts
(matplotlib).
"""

from .cpu import cpu_figures
from .debug import debug_figures
from .grid_sample import grid_sample_figures
from .ops import ops_figures
from .overhead import overhead_figures
from .progress import Progress
from .report import MATPLOTLIB_NOTE, bar_chart, have_matplotlib, load, markdown, write_results
from .suite import CPU_SUITE, GPU_SUITE, KINDS, RUNNERS, STEPS, run, script_main
from .timing import (best_device, cuda_median_ms, device_name, device_tag, interleaved_ms,
                     per_call_us, record, relative_error, results_dir, time_ms)

__all__ = ["grid_sample_figures", "ops_figures", "cpu_figures", "overhead_figures", "debug_figures",
           "KINDS", "GPU_SUITE", "CPU_SUITE", "STEPS", "RUNNERS", "run", "script_main", "Progress",
           "load", "markdown", "write_results", "bar_chart", "have_matplotlib", "MATPLOTLIB_NOTE",
           "best_device", "device_name", "device_tag", "results_dir", "record", "cuda_median_ms",
           "interleaved_ms", "time_ms", "per_call_us", "relative_error"]

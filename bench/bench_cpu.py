"""The CPU backend's figures (issue 3).

- exp over 64M float32 (a barrier-free kernel: plain loops, no fibers) against torch.exp;
- the seed's grid_sample forward and VJP (fibers: simd_sum) at 1/16 of the seed's batch x grid
  size (x 2x1024x1024x64, grid 2x128x128x2... i.e. batch 8 -> 2 and grid 256x256 -> 128x128);
- compile time of a kernel: cold (empty cache, fresh process) and a disk-cache hit.

    python bench/bench_cpu.py --out bench/results/cpu-<machine>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
import time

import torch

# A fresh process's first call of the seed's exp kernel; argv[1] varies the source (a new kernel).
FIRST_CALL = textwrap.dedent("""
    import json, sys, time, torch
    import kernelkit as kk
    from kernelkit.ops.exp import EXP_SOURCE
    k = kk.metal_kernel(name="myexp", input_names=["inp"], output_names=["out"],
                        source=EXP_SOURCE + "// variant " + sys.argv[1])
    a = torch.randn(1000)
    t0 = time.perf_counter()
    k(inputs=[a], template=[("T", a.dtype)], grid=(a.numel(), 1, 1), threadgroup=(256, 1, 1),
      output_shapes=[a.shape], output_dtypes=[a.dtype])
    print(json.dumps({"first_call_s": time.perf_counter() - t0}))
""")


def best_of(fn, repeat: int) -> float:
    fn()
    return min(_timed(fn) for _ in range(repeat))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def first_call(cache: str, variant: str) -> float:
    env = dict(os.environ, KERNELKIT_CACHE_DIR=cache)
    proc = subprocess.run([sys.executable, "-c", FIRST_CALL, variant], env=env, capture_output=True,
                          text=True)
    if proc.returncode:
        raise RuntimeError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])["first_call_s"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    from kernelkit.ops import exp, grid_sample_seed as grid_sample, grid_sample_vjp
    from kernelkit.ops.grid_sample import grid_sample_reference

    torch.manual_seed(0)
    a = torch.randn(64 * 2**20)
    t_ours, t_torch = best_of(lambda: exp(a), 5), best_of(lambda: torch.exp(a), 5)
    assert torch.allclose(exp(a), torch.exp(a), rtol=1e-5, atol=1e-6)

    B, H, W, C, gH, gW = 2, 1024, 1024, 64, 128, 128
    x = torch.randn(B + 2, H, W, C)[1:-1]  # margin: the seed reads outside x before masking
    grid = torch.rand(B, gH, gW, 2) * 2 - 1
    cot = torch.randn(B, gH, gW, C)
    t_fwd = best_of(lambda: grid_sample(x, grid), 3)
    t_fwd_torch = best_of(lambda: grid_sample_reference(x, grid), 3)
    t_vjp = best_of(lambda: grid_sample_vjp(x, grid, cot), 3)

    with tempfile.TemporaryDirectory() as cache:
        first_call(cache, "a")  # builds the CPU runtime library, once per install
        cold = first_call(cache, "b")  # a kernel not in the cache
        warm = first_call(cache, "b")  # the same kernel, from the disk cache

    results = {
        "device": f"cpu ({platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads)",
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "command": "python bench/bench_cpu.py",
        "exp_64M_float32": {"kernelkit_ms": t_ours * 1e3, "torch_exp_ms": t_torch * 1e3,
                            "throughput_vs_torch": t_torch / t_ours},
        "grid_sample_1_16": {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2]},
                             "forward_ms": t_fwd * 1e3, "torch_forward_ms": t_fwd_torch * 1e3,
                             "vjp_ms": t_vjp * 1e3},
        "compile_s": {"cold_first_call": cold, "disk_cache_first_call": warm},
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

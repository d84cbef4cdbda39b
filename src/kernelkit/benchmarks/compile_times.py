"""Compile times: a fresh process's first call with an empty kernel cache, then with the kernel
in the disk cache (the grid_sample and cpu suites report them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from .progress import Tick, _no_tick


FIRST_CALL = textwrap.dedent("""
    import json, sys, time, torch
    device, variant = torch.device(sys.argv[1]), sys.argv[2]
    if device.type == "cuda":
        torch.cuda.init()
        torch.cuda.set_device(device.index or 0)
        # the seed's grid_sample (margin: it reads outside x before masking)
        x = torch.randn(3, 64, 64, 64, device=device)[1:2]
        g = torch.rand(1, 16, 16, 2, device=device) * 2 - 1
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        from kernelkit.ops import grid_sample_seed as grid_sample
        t1 = time.perf_counter()
        grid_sample(x, g)
        t2 = time.perf_counter()
        torch.cuda.synchronize()
    else:
        # the seed's exp; `variant` changes its source: a kernel not in the cache
        import kernelkit as kk
        from kernelkit.ops.exp import EXP_SOURCE
        k = kk.metal_kernel(name="myexp", input_names=["inp"], output_names=["out"],
                            source=EXP_SOURCE + "// variant " + variant)
        a = torch.randn(1000)
        t0 = t1 = time.perf_counter()
        k(inputs=[a], template=[("T", a.dtype)], grid=(a.numel(), 1, 1), threadgroup=(256, 1, 1),
          output_shapes=[a.shape], output_dtypes=[a.dtype])
        t2 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "call_to_launch_s": t2 - t1}))
""")


def _first_call(cache: str, device: torch.device, variant: str) -> float:
    src = str(Path(__file__).resolve().parents[2])  # kernelkit importable in the child
    path = os.environ.get("PYTHONPATH")
    env = dict(os.environ, KERNELKIT_CACHE_DIR=cache,
               PYTHONPATH=src + (os.pathsep + path if path else ""))
    proc = subprocess.run([sys.executable, "-c", FIRST_CALL, str(device), variant], env=env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"first-call process failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["call_to_launch_s"]


def compile_times(device: torch.device, tick: Tick = _no_tick) -> dict:
    """A fresh process's first call with an empty cache, then with the kernel in the disk cache.
    GPU: the seed's grid_sample (NVRTC compile, load, launch). CPU: the seed's exp, once the
    CPU runtime library is built (a first process builds it, once per install)."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="kernelkit-bench-") as cache:
        if device.type == "cpu":
            tick("compile: CPU runtime library")
            _first_call(cache, device, "a")
        tick("compile: cold first call")
        cold = _first_call(cache, device, "b")
        tick("compile: first call from the disk cache")
        warm = _first_call(cache, device, "b")
    return {"cold_first_call_s": cold, "warm_disk_first_call_s": warm}

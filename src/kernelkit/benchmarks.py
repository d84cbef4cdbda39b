"""The benchmark suite behind BENCHMARKS.md, shared by `kernelkit bench` and the bench/ scripts.

Four benchmarks, each a function returning a JSON-ready dict:

- `grid_sample` (GPU; bench/bench_grid_sample.py): the seed's grid_sample forward and VJP
  through `metal_kernel` against the same kernel hand-written in CUDA C++ (through CuPy's
  RawKernel, when CuPy is installed), and the compile times of a fresh process;
- `ops` (GPU; bench/bench_ops.py): `kernelkit.ops.grid_sample`, `matmul_add_relu`, `mxfp8_matmul` and
  `flash_attention` against torch;
- `cpu` (bench/bench_cpu.py): the CPU backend's exp, grid_sample and matmul_add_relu against
  torch, and its compile times;
- `overhead` (either device; bench/bench_overhead.py): host time per call of a cached kernel;
- `debug` (either device; bench/bench_debug.py): checked calls (`check_bounds=True`, `timeout=`)
  against plain calls of the same kernels.

`record` adds what makes a figure reproducible: date, device, versions (kernelkit, torch,
NVRTC, driver, C++ compiler) and the command. `markdown` turns results (also the older files
under bench/results/) into BENCHMARKS.md's tables; `write_charts` draws them (matplotlib).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import statistics
import textwrap
import time
from pathlib import Path
from typing import Callable

import torch

Tick = Callable[[str], None]

GPU_SUITE = ("grid_sample", "ops", "overhead", "debug")
CPU_SUITE = ("cpu", "overhead", "debug")
KINDS = ("grid_sample", "ops", "cpu", "overhead", "debug")
STEPS = {"grid_sample": 8, "ops": 13, "cpu": 11, "overhead": 3, "debug": 3}  # progress ticks of each
SCRIPTS = {"grid_sample": "bench_grid_sample.py", "ops": "bench_ops.py", "cpu": "bench_cpu.py",
           "overhead": "bench_overhead.py", "debug": "bench_debug.py"}
# What a speed-up column means, under each table that has one.
SPEED_UP = "Speed-up: the reference's time over kernelkit's (above 1, kernelkit is faster)."
CPU_SPEED_UP = (SPEED_UP[:-1] + ". On the CPU, below 1 is expected: the CPU backend runs a kernel "
                "body thread by thread as C++, to develop and test GPU kernels without a GPU, "
                "against torch's vectorised CPU code.")


def _no_tick(label: str) -> None:
    pass


# --- devices, versions, records --------------------------------------------------------------

def best_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def results_dir(device: torch.device) -> Path:
    """Where `kernelkit bench` writes without --out: the user's data directory, per device."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "kernelkit" / "bench" / device_tag(device)


def device_tag(device: torch.device) -> str:
    """A short name for result directories: "h100", "cpu-x86_64-2core"."""
    if device.type == "cuda":
        words = [w for w in torch.cuda.get_device_name(device).split() if w.upper() != "NVIDIA"]
        picked = []
        for w in words:
            picked.append(w)
            if any(c.isdigit() for c in w):
                break
        return re.sub(r"[^a-z0-9]+", "-", "-".join(picked).lower()).strip("-") or "gpu"
    return f"cpu-{platform.machine()}-{os.cpu_count()}core"


def record(kind: str, body: dict, device: torch.device, command: str, quick: bool = False) -> dict:
    """A result: what was measured, and where, when, with what, by which command."""
    from .doctor import versions
    return {"benchmark": kind, "device": device_name(device), "date": time.strftime("%Y-%m-%d"),
            "command": command, "quick": quick, "torch": torch.__version__,
            "versions": versions(device), **body}


# --- timing ------------------------------------------------------------------------------------

def cuda_median_ms(fn, repeat: int = 50, warmup: int = 5) -> float:
    """Median of CUDA-event times on the current stream."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2]


def interleaved_ms(fns: dict, rounds: int, iters) -> dict:
    """Median ms a call of each of `fns` (name -> fn), the fns taking turns: each round times
    `iters` calls of each (an int, or a dict by name) with CUDA events. A sleep kernel keeps the
    GPU busy while a round's first calls are enqueued, so that a round times the GPU's work (and
    the host only where it cannot keep up), not its first call's host latency after the
    synchronisation before it (as triton's do_bench hides it behind its cache flush): on the
    H100 host that latency was most of the 7% between matmul_add_relu and its bare kernel launch
    in 10-call rounds of 0.24 ms calls. As run(), in the steady state."""
    from . import fastcall

    fastcall.module(block=True)
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    times = {n: [] for n in fns}
    for _ in range(rounds):
        for n, f in fns.items():
            count = iters[n] if isinstance(iters, dict) else iters
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)  # ~0.5 ms at the H100's clocks
            start.record()
            for _ in range(count):
                f()
            end.record()
            end.synchronize()
            times[n].append(start.elapsed_time(end) / count)
    return {n: statistics.median(t) for n, t in times.items()}


def cpu_best_ms(fn, repeat: int = 3, warmup: int = 1) -> float:
    """Best host time of `repeat` calls (the CPU's noise only ever adds)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def time_ms(fn, device: torch.device, repeat: int, warmup: int = 1) -> float:
    """CUDA-event median on a GPU, best host time on the CPU."""
    if device.type == "cuda":
        return cuda_median_ms(fn, repeat=repeat, warmup=warmup)
    return cpu_best_ms(fn, repeat=repeat, warmup=warmup)


def relative_error(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖, in float64."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))


# --- compile times: fresh processes ----------------------------------------------------------

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
    src = str(Path(__file__).resolve().parent.parent)  # kernelkit importable in the child
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


# --- grid_sample against a hand-written CUDA port (GPU) --------------------------------------

HAND_PORT = r"""
extern "C" __global__ void fwd(const float* x, const float* grid, float* out,
                               int H, int W, int C, int gH, int gW, unsigned n) {
  // the seed's arithmetic and integer types, as CUDA C++
  unsigned elem = blockIdx.x * blockDim.x + threadIdx.x;
  if (elem >= n) return;
  int w_stride = C, h_stride = W * w_stride, b_stride = H * h_stride;
  unsigned grid_idx = elem / C * 2;
  float ix = ((grid[grid_idx] + 1) * W - 1) / 2;
  float iy = ((grid[grid_idx + 1] + 1) * H - 1) / 2;
  int ix_nw = floorf(ix), iy_nw = floorf(iy);
  int ix_ne = ix_nw + 1, iy_ne = iy_nw, ix_sw = ix_nw, iy_sw = iy_nw + 1, ix_se = ix_nw + 1, iy_se = iy_nw + 1;
  float nw = (ix_se - ix) * (iy_se - iy), ne = (ix - ix_sw) * (iy_sw - iy);
  float sw = (ix_ne - ix) * (iy - iy_ne), se = (ix - ix_nw) * (iy - iy_nw);
  int batch_idx = elem / C / gH / gW * b_stride;
  int channel_idx = elem % C;
  int base = batch_idx + channel_idx;
  float I_nw = x[base + iy_nw * h_stride + ix_nw * w_stride];
  float I_ne = x[base + iy_ne * h_stride + ix_ne * w_stride];
  float I_sw = x[base + iy_sw * h_stride + ix_sw * w_stride];
  float I_se = x[base + iy_se * h_stride + ix_se * w_stride];
  I_nw = iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1 ? I_nw : 0;
  I_ne = iy_ne >= 0 && iy_ne <= H - 1 && ix_ne >= 0 && ix_ne <= W - 1 ? I_ne : 0;
  I_sw = iy_sw >= 0 && iy_sw <= H - 1 && ix_sw >= 0 && ix_sw <= W - 1 ? I_sw : 0;
  I_se = iy_se >= 0 && iy_se <= H - 1 && ix_se >= 0 && ix_se <= W - 1 ? I_se : 0;
  out[elem] = nw * I_nw + ne * I_ne + sw * I_sw + se * I_se;
}

extern "C" __global__ void vjp(const float* x, const float* grid, const float* cot, float* x_grad,
                               float* grid_grad, int H, int W, int C, int gH, int gW, unsigned n) {
  unsigned elem = blockIdx.x * blockDim.x + threadIdx.x;
  if (elem >= n) return;
  int C_padded = (C + 31) / 32 * 32;
  int w_stride = C, h_stride = W * w_stride, b_stride = H * h_stride;
  unsigned grid_idx = elem / C_padded * 2;
  float ix = ((grid[grid_idx] + 1) * W - 1) / 2;
  float iy = ((grid[grid_idx + 1] + 1) * H - 1) / 2;
  int ix_nw = floorf(ix), iy_nw = floorf(iy);
  int ix_ne = ix_nw + 1, iy_ne = iy_nw, ix_sw = ix_nw, iy_sw = iy_nw + 1, ix_se = ix_nw + 1, iy_se = iy_nw + 1;
  float nw = (ix_se - ix) * (iy_se - iy), ne = (ix - ix_sw) * (iy_sw - iy);
  float sw = (ix_ne - ix) * (iy - iy_ne), se = (ix - ix_nw) * (iy - iy_nw);
  int batch_idx = elem / C_padded / gH / gW * b_stride;
  int channel_idx = elem % C_padded;
  int base = batch_idx + channel_idx;
  float gix = 0, giy = 0;
  if (channel_idx < C) {
    float c = cot[elem / C_padded * C + channel_idx];
    if (iy_nw >= 0 && iy_nw <= H - 1 && ix_nw >= 0 && ix_nw <= W - 1) {
      int o = base + iy_nw * h_stride + ix_nw * w_stride;
      atomicAdd(&x_grad[o], nw * c); float I = x[o];
      gix -= I * (iy_se - iy) * c; giy -= I * (ix_se - ix) * c;
    }
    if (iy_ne >= 0 && iy_ne <= H - 1 && ix_ne >= 0 && ix_ne <= W - 1) {
      int o = base + iy_ne * h_stride + ix_ne * w_stride;
      atomicAdd(&x_grad[o], ne * c); float I = x[o];
      gix += I * (iy_sw - iy) * c; giy -= I * (ix - ix_sw) * c;
    }
    if (iy_sw >= 0 && iy_sw <= H - 1 && ix_sw >= 0 && ix_sw <= W - 1) {
      int o = base + iy_sw * h_stride + ix_sw * w_stride;
      atomicAdd(&x_grad[o], sw * c); float I = x[o];
      gix -= I * (iy - iy_ne) * c; giy += I * (ix_ne - ix) * c;
    }
    if (iy_se >= 0 && iy_se <= H - 1 && ix_se >= 0 && ix_se <= W - 1) {
      int o = base + iy_se * h_stride + ix_se * w_stride;
      atomicAdd(&x_grad[o], se * c); float I = x[o];
      gix += I * (iy - iy_nw) * c; giy += I * (ix - ix_nw) * c;
    }
  }
  for (int s = 16; s > 0; s >>= 1) {
    gix += __shfl_xor_sync(0xffffffffu, gix, s);
    giy += __shfl_xor_sync(0xffffffffu, giy, s);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&grid_grad[grid_idx], gix * (W / 2));
    atomicAdd(&grid_grad[grid_idx + 1], giy * (H / 2));
  }
}
"""


def _hand_port(device, x, grid, cot):
    """(forward, vjp) of the hand-written CUDA port through CuPy, or (None, why not)."""
    if device.type != "cuda":
        return None, "the hand-written port is CUDA"
    try:
        import cupy
    except ImportError:
        return None, "CuPy is not installed (pip install cupy-cuda12x or cupy-cuda13x)"
    B, H, W, C = x.shape
    _, gH, gW, _ = grid.shape
    with cupy.cuda.Device(device.index or 0):
        mod = cupy.RawModule(code=HAND_PORT, options=("-std=c++17",))
        fwd, vjp = mod.get_function("fwd"), mod.get_function("vjp")
    n_fwd = B * gH * gW * C
    n_vjp = B * gH * gW * ((C + 31) // 32 * 32)
    dims = (cupy.int32(H), cupy.int32(W), cupy.int32(C), cupy.int32(gH), cupy.int32(gW))

    def stream():
        return cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream)

    def forward():
        out = torch.empty(B, gH, gW, C, device=device)
        fwd(((n_fwd + 255) // 256,), (256,),
            (x.data_ptr(), grid.data_ptr(), out.data_ptr(), *dims, cupy.uint32(n_fwd)), stream=stream())
        return out

    def backward():
        xg, gg = torch.zeros_like(x), torch.zeros_like(grid)
        vjp(((n_vjp + 255) // 256,), (256,),
            (x.data_ptr(), grid.data_ptr(), cot.data_ptr(), xg.data_ptr(), gg.data_ptr(), *dims,
             cupy.uint32(n_vjp)), stream=stream())
        return xg, gg

    return (forward, backward), None


def grid_sample_figures(device: torch.device | None = None, quick: bool = False,
                        tick: Tick = _no_tick) -> dict:
    """The seed's grid_sample through metal_kernel, against the hand port and torch; compile times."""
    device = device or best_device()
    B, H, W, C, gH, gW = (2, 512, 512, 64, 128, 128) if quick else (8, 1024, 1024, 64, 256, 256)
    result = {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2], "dtype": "float32"},
              **_seed_grid_sample_times(device, (B, H, W, C, gH, gW), quick, tick),
              "compile": compile_times(device, tick)}  # after the big inputs are freed
    if result["forward_ms"]["hand_port"] is not None:
        result["forward_ratio"] = result["forward_ms"]["kernelkit"] / result["forward_ms"]["hand_port"]
        result["vjp_ratio"] = result["vjp_ms"]["kernelkit"] / result["vjp_ms"]["hand_port"]
    return result


def _seed_grid_sample_times(device, shape, quick: bool, tick: Tick) -> dict:
    from .ops import grid_sample_seed as grid_sample, grid_sample_vjp
    from .ops.grid_sample import grid_sample_reference

    torch.manual_seed(0)
    B, H, W, C, gH, gW = shape
    reps, vjp_reps = (10, 5) if quick else (50, 20)
    tick("grid_sample: inputs, hand port")
    x = torch.randn(B + 2, H, W, C, device=device)[1:-1]  # the seed reads up to a row outside x
    grid = torch.rand(B, gH, gW, 2, device=device) * 2 - 1
    cot = torch.randn(B, gH, gW, C, device=device)
    port, why_not = _hand_port(device, x, grid, cot)

    tick("grid_sample: correctness")
    ref = grid_sample_reference(x, grid)
    xr, gr = x.detach().requires_grad_(), grid.detach().requires_grad_()
    grid_sample_reference(xr, gr).backward(cot)
    errors = {}
    for name, fwd, vjp in [("kernelkit", lambda: grid_sample(x, grid), lambda: grid_sample_vjp(x, grid, cot)),
                           *([("hand_port", *port)] if port else [])]:
        errors[name] = {"forward": relative_error(fwd(), ref),
                        "vjp": max(relative_error(g, w) for g, w in zip(vjp(), (xr.grad, gr.grad)))}
        assert errors[name]["forward"] < 1e-5 and errors[name]["vjp"] < 1e-4, (name, errors[name])
    del xr, gr, ref  # free the reference's memory before timing

    def t(fn, repeat):
        return time_ms(fn, device, repeat, warmup=5 if device.type == "cuda" else 1)

    tick("grid_sample: forward")
    forward = {"kernelkit": t(lambda: grid_sample(x, grid), reps)}
    tick("grid_sample: forward, hand port")
    forward["hand_port"] = t(port[0], reps) if port else None
    tick("grid_sample: forward, torch")
    forward["torch_grid_sample_nhwc_view"] = t(lambda: grid_sample_reference(x, grid), reps)
    tick("grid_sample: VJP")
    vjp = {"kernelkit": t(lambda: grid_sample_vjp(x, grid, cot), vjp_reps),
           "hand_port": t(port[1], vjp_reps) if port else None}
    out = {"forward_ms": forward, "vjp_ms": vjp, "relative_error": errors}
    if not port:
        out["hand_port_note"] = why_not
    return out


# --- kernelkit.ops against torch (GPU) --------------------------------------------------------

def ops_figures(device: torch.device | None = None, quick: bool = False, tick: Tick = _no_tick) -> dict:
    """kernelkit.ops.grid_sample and matmul_add_relu against torch."""
    device = device or best_device()
    cuda = device.type == "cuda"

    def t(fn, repeat, warmup=5):
        if quick:
            repeat = max(repeat // 5, 3)
        return time_ms(fn, device, repeat if cuda else min(repeat, 3), warmup if cuda else 1)

    shape = (2, 512, 512, 64, 128, 128) if quick else (8, 1024, 1024, 64, 256, 256)
    if cuda:
        batch, n = (2, 1024) if quick else (8, 2048)
    else:
        batch, n = (1, 256) if quick else (2, 512)
    if cuda:
        mx, attention = (2048, (2, 8, 1024, 128)) if quick else (8192, (4, 16, 4096, 128))
    else:
        mx, attention = (128, (1, 2, 128, 64)) if quick else (256, (1, 4, 256, 64))
    return {"grid_sample": _ops_grid_sample(device, shape, t, tick),
            "matmul_add_relu": _ops_matmul(device, batch, n, t, tick),
            "mxfp8_matmul": _ops_mxfp8(device, mx, t, tick),
            "flash_attention": _ops_attention(device, attention, t, tick)}


def _ops_mxfp8(device, n: int, t, tick: Tick) -> dict:
    """mxfp8_matmul (bf16 out) beside torch's bf16 matmul of the matrices it quantises and, on a
    GPU, torch._scaled_mm's fp8 matmul with per-tensor scales."""
    from .ops import dequantize_mxfp8, mxfp8_matmul, quantize_mxfp8

    tick("ops: mxfp8_matmul")
    torch.manual_seed(0)
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    (qa, sa), (qb, sb) = quantize_mxfp8(a), quantize_mxfp8(b)
    err = relative_error(mxfp8_matmul(qa, sa, qb, sb),
                         dequantize_mxfp8(qa, sa).double() @ dequantize_mxfp8(qb, sb).double().T)
    assert err < 1e-2, err
    out = {"m": n, "n": n, "k": n, "out_dtype": "bfloat16", "relative_error": err,
           "kernelkit_ms": t(lambda: mxfp8_matmul(qa, sa, qb, sb), 10),
           "torch_bf16_ms": t(lambda: a @ b.T, 10)}
    if device.type == "cuda":
        one, a8, b8 = torch.ones((), device=device), a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        out["torch_scaled_mm_ms"] = t(lambda: torch._scaled_mm(a8, b8.T, one, one, out_dtype=torch.bfloat16), 10)
    for k in [k for k in out if k.endswith("_ms")]:
        out[k[:-3] + "_tflops"] = 2 * n ** 3 / out[k] / 1e9
    return out


def _ops_attention(device, shape, t, tick: Tick) -> dict:
    """flash_attention (causal and not; forward, and forward + backward) beside torch's
    scaled_dot_product_attention (bf16 on a GPU, float32 on the CPU)."""
    from .ops import flash_attention, flash_attention_reference

    F = torch.nn.functional
    B, H, S, D = shape
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    cot = torch.randn(shape, device=device, dtype=dtype)
    out = {"shape": list(shape), "dtype": str(dtype).split(".")[1]}
    for causal in (False, True):
        name = "causal" if causal else "full"
        tick(f"ops: flash_attention {name}")
        with torch.no_grad():
            err = relative_error(flash_attention(q, k, v, causal=causal),
                                 flash_attention_reference(q.double(), k.double(), v.double(), causal=causal))
        assert err < 2e-2, err

        def ours(bwd=False):
            o = flash_attention(q, k, v, causal=causal)
            return torch.autograd.grad(o, (q, k, v), cot) if bwd else o

        def sdpa(bwd=False):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return torch.autograd.grad(o, (q, k, v), cot) if bwd else o

        flop = 4 * B * H * S * S * D / (2 if causal else 1)
        with torch.no_grad():
            fwd = {"kernelkit": t(ours, 10), "torch_sdpa": t(sdpa, 10)}
        both = {"kernelkit": t(lambda: ours(True), 5), "torch_sdpa": t(lambda: sdpa(True), 5)}
        out[name] = {"relative_error": err, "forward_ms": fwd, "forward_backward_ms": both,
                     "forward_tflops": {k_: flop / v_ / 1e9 for k_, v_ in fwd.items()},
                     "forward_backward_tflops": {k_: 3.5 * flop / v_ / 1e9 for k_, v_ in both.items()}}
    return out


def _ops_grid_sample(device, shape, t, tick: Tick) -> dict:
    from .ops import grid_sample, grid_sample_torch

    F = torch.nn.functional
    torch.manual_seed(0)
    B, H, W, C, gH, gW = shape
    tick("ops: grid_sample inputs")
    x = torch.randn(B, H, W, C, device=device)
    grid = torch.rand(B, gH, gW, 2, device=device) * 2 - 1
    cot = torch.randn(B, gH, gW, C, device=device)
    x_nchw = x.permute(0, 3, 1, 2).contiguous()

    def torch_nchw():
        return F.grid_sample(x_nchw, grid, align_corners=False)

    def torch_nhwc_view():
        return F.grid_sample(x.permute(0, 3, 1, 2), grid, align_corners=False)

    def fwd_bwd(fn, *inputs):
        leaves = [v.detach().requires_grad_() for v in inputs]
        out = fn(*leaves)
        return torch.autograd.grad(out, leaves, cot if out.shape == cot.shape else cot.permute(0, 3, 1, 2))

    def torch_fwd_bwd(grid):
        return fwd_bwd(lambda a, g: F.grid_sample(a.permute(0, 3, 1, 2), g, align_corners=False), x, grid)

    err = relative_error(grid_sample(x, grid), torch_nhwc_view().permute(0, 2, 3, 1))
    assert err < 1e-5, err
    tick("ops: grid_sample forward")
    forward = {"kernelkit": t(lambda: grid_sample(x, grid), 50)}
    tick("ops: grid_sample forward, torch NCHW")
    forward["torch_grid_sample_nchw"] = t(torch_nchw, 50)
    tick("ops: grid_sample forward, torch NHWC view")
    forward["torch_grid_sample_nhwc_view"] = t(torch_nhwc_view, 50)
    tick("ops: grid_sample forward, composed reference")
    forward["composed_reference"] = t(lambda: grid_sample_torch(x, grid), 10)
    tick("ops: grid_sample forward + backward")
    backward = {"kernelkit": t(lambda: fwd_bwd(grid_sample, x, grid), 20),
                "torch_grid_sample_nhwc_view": t(lambda: torch_fwd_bwd(grid), 10)}
    # every point in the centre tenth of x (each way): far more per tile of the backward than its
    # slots hold, the overflow's path
    tick("ops: grid_sample forward + backward, crowded grid")
    crowded = grid * 0.1
    backward_crowded = {"grid_scale": 0.1, "kernelkit": t(lambda: fwd_bwd(grid_sample, x, crowded), 20),
                        "torch_grid_sample_nhwc_view": t(lambda: torch_fwd_bwd(crowded), 10)}
    return {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2], "dtype": "float32", "mode": "bilinear",
                      "padding_mode": "zeros"},
            "forward_ms": forward, "forward_backward_ms": backward,
            "forward_backward_crowded_ms": backward_crowded, "relative_error": err}


def _ops_matmul(device, batch: int, n: int, t, tick: Tick) -> dict:
    flops = 2 * batch * n ** 3
    out = {"batch": batch, "m": n, "n": n, "k": n}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).split(".")[1]
        tick(f"ops: matmul_add_relu {name}")
        out[name] = _ops_matmul_one(device, batch, n, dtype, t, tick)
        out[name]["kernelkit_tflops"] = flops / out[name]["kernelkit_ms"] / 1e9
        out[name]["torch_tflops"] = flops / out[name]["torch_ms"] / 1e9
    return out


def _ops_matmul_one(device, batch: int, n: int, dtype, t, tick: Tick) -> dict:
    from .ops import matmul_add_relu

    torch.manual_seed(0)
    a, b, bias = (torch.randn(batch, n, n, device=device, dtype=dtype) for _ in range(3))
    err = relative_error(matmul_add_relu(a, b, bias).float(),
                         torch.relu(a.float() @ b.float() + bias.float()))
    assert err < (2e-2 if dtype == torch.bfloat16 else 1e-4), (dtype, err)
    t_ours = t(lambda: matmul_add_relu(a, b, bias), 5, 1)
    tick(f"ops: matmul_add_relu {str(dtype).split('.')[1]}, torch")
    t_torch = t(lambda: torch.relu(torch.baddbmm(bias, a, b)), 10)
    return {"kernelkit_ms": t_ours, "torch_ms": t_torch, "relative_error": err}


# --- the CPU backend ---------------------------------------------------------------------------

def cpu_figures(device: torch.device | None = None, quick: bool = False, tick: Tick = _no_tick) -> dict:
    """exp (plain loops), the seed's grid_sample forward and VJP (fibers) and kernelkit.ops'
    grid_sample, matmul_add_relu (fibers: barriers) on the CPU backend against torch; compile
    times."""
    # exp over 64M; grid_sample at 1/16 of the seed's batch x grid (batch 8 -> 2, grid 256² -> 128²)
    n = (1 << 22) if quick else (1 << 26)
    shape = (1, 256, 256, 64, 64, 64) if quick else (2, 1024, 1024, 64, 128, 128)
    batch, m = (1, 256) if quick else (2, 512)
    return {"exp": _cpu_exp(n, tick), "grid_sample": _cpu_grid_sample(shape, tick),
            "matmul_add_relu": _cpu_matmul(batch, m, tick),
            "compile": compile_times(torch.device("cpu"), tick)}


def _cpu_exp(n: int, tick: Tick) -> dict:
    from .ops import exp

    torch.manual_seed(0)
    tick("cpu: exp")
    a = torch.randn(n)
    err = relative_error(exp(a), torch.exp(a.double()))
    assert err < 1e-6, err
    t_ours = cpu_best_ms(lambda: exp(a), 5)
    tick("cpu: exp, torch")
    t_torch = cpu_best_ms(lambda: torch.exp(a), 5)
    return {"n": n, "dtype": "float32", "kernelkit_ms": t_ours, "torch_ms": t_torch,
            "throughput_vs_torch": t_torch / t_ours, "relative_error": err}


def _cpu_grid_sample(shape, tick: Tick) -> dict:
    from .ops import grid_sample as grid_sample_op
    from .ops import grid_sample_seed as grid_sample, grid_sample_vjp
    from .ops.grid_sample import grid_sample_reference

    torch.manual_seed(0)
    B, H, W, C, gH, gW = shape
    tick("cpu: grid_sample forward")
    x = torch.randn(B + 2, H, W, C)[1:-1]  # margin: the seed reads outside x before masking
    grid = torch.rand(B, gH, gW, 2) * 2 - 1
    cot = torch.randn(B, gH, gW, C)
    err_fwd = relative_error(grid_sample(x, grid), grid_sample_reference(x, grid))
    assert err_fwd < 1e-5, err_fwd
    t_fwd = cpu_best_ms(lambda: grid_sample(x, grid), 3)
    tick("cpu: grid_sample forward, torch")
    t_fwd_torch = cpu_best_ms(lambda: grid_sample_reference(x, grid), 3)
    tick("cpu: grid_sample VJP")
    xr, gr = x.detach().requires_grad_(), grid.detach().requires_grad_()

    def torch_fwd_bwd():
        return torch.autograd.grad(grid_sample_reference(xr, gr), (xr, gr), cot)

    err_vjp = max(relative_error(g, w) for g, w in zip(grid_sample_vjp(x, grid, cot), torch_fwd_bwd()))
    assert err_vjp < 1e-4, err_vjp
    t_vjp = cpu_best_ms(lambda: grid_sample_vjp(x, grid, cot), 3)
    tick("cpu: grid_sample forward + backward, torch")
    t_vjp_torch = cpu_best_ms(torch_fwd_bwd, 3)
    tick("cpu: kernelkit.ops.grid_sample")

    def op_fwd_bwd():
        return torch.autograd.grad(grid_sample_op(xr, gr), (xr, gr), cot)

    err_op = max(relative_error(g, w) for g, w in zip(op_fwd_bwd(), torch_fwd_bwd()))
    assert err_op < 1e-4, err_op
    return {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2]},
            "forward_ms": t_fwd, "torch_forward_ms": t_fwd_torch, "vjp_ms": t_vjp,
            "torch_forward_backward_ms": t_vjp_torch,
            "op_forward_ms": cpu_best_ms(lambda: grid_sample_op(x, grid), 3),
            "op_forward_backward_ms": cpu_best_ms(op_fwd_bwd, 3),
            "relative_error": {"forward": err_fwd, "vjp": err_vjp, "op_forward_backward": err_op}}


def _cpu_matmul(batch: int, m: int, tick: Tick) -> dict:
    from .ops import matmul_add_relu

    torch.manual_seed(0)
    tick("cpu: matmul_add_relu")
    lhs, rhs, bias = (torch.randn(batch, m, m) for _ in range(3))
    err = relative_error(matmul_add_relu(lhs, rhs, bias), torch.relu(torch.baddbmm(bias, lhs, rhs)))
    assert err < 1e-4, err
    t_ours = cpu_best_ms(lambda: matmul_add_relu(lhs, rhs, bias), 3)
    tick("cpu: matmul_add_relu, torch")
    t_torch = cpu_best_ms(lambda: torch.relu(torch.baddbmm(bias, lhs, rhs)), 3)
    return {"batch": batch, "m": m, "n": m, "k": m, "dtype": "float32", "kernelkit_ms": t_ours,
            "torch_ms": t_torch, "relative_error": err}


# --- per-call overhead -------------------------------------------------------------------------

def per_call_us(fn, n: int, sync, repeat: int = 5) -> float:
    """Best mean host time per call over `repeat` loops of n calls (no sync inside a loop)."""
    for _ in range(100):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        sync()
        best = min(best, (t1 - t0) / n)
    return best * 1e6


def overhead_figures(device: torch.device | None = None, quick: bool = False,
                     tick: Tick = _no_tick) -> dict:
    """Host time per call of a cached kernel (32 float32 in, 32 out, output allocated), beside
    torch's own small ops."""
    import kernelkit as kk

    device = device or best_device()
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    k = kk.metal_kernel(name="overhead", input_names=["inp"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i] + 1.0f;")
    x = torch.randn(32, device=device)
    kw = dict(inputs=[x], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
              output_dtypes=[torch.float32])
    assert torch.equal(k(**kw)[0], x + 1)
    y = torch.randn(32, device=device)
    calls = {"kernelkit_call_us": lambda: k(**kw), "torch_add__us": lambda: y.add_(1.0),
             "torch_empty_us": lambda: torch.empty(32, device=device)}
    try:
        import cupy as cp
    except ImportError:
        cp = None
    if device.type == "cuda" and cp is not None:  # the host's speed: issue 6 measured CuPy too
        with cp.cuda.Device(device.index or 0):
            raw = cp.RawKernel(r'extern "C" __global__ void f(const float* a, float* b) '
                               r'{ int i = threadIdx.x; b[i] = a[i] + 1.0f; }', "f")
            a, b = cp.zeros(32, dtype=cp.float32), cp.zeros(32, dtype=cp.float32)
            calls["cupy_rawkernel_us"] = lambda: raw((1,), (32,), (a, b))
    # A host's speed drifts over minutes: measure in rounds, every call once per round, and take
    # medians, beside the median ratio to torch's add_ within a round.
    n, repeat, rounds = (1000, 2, 3) if quick else (5000, 3, 9)
    per_round = {name: [] for name in calls}
    for r in range(rounds):
        if r % (rounds // 3) == 0:  # three ticks (STEPS)
            tick(f"overhead: round {r + 1} of {rounds}")
        for name, fn in calls.items():
            per_round[name].append(per_call_us(fn, n, sync, repeat))
    result = {"calls": n, "rounds": rounds,
              **{name: statistics.median(v) for name, v in per_round.items()},
              "kernelkit_over_torch_add_": statistics.median(
                  a / b for a, b in zip(per_round["kernelkit_call_us"], per_round["torch_add__us"])),
              "per_round_us": per_round}
    return result


# --- checked calls (issue 7) -------------------------------------------------------------------

DEBUG_MODES = {"plain": {}, "check_bounds": {"check_bounds": True}, "timeout": {"timeout": 60.0},
               "check_bounds_timeout": {"check_bounds": True, "timeout": 60.0}}
_ROW_SUM = """
    uint r = thread_position_in_grid.x;
    int n = inp_shape[1];
    float acc = 0.0f;
    for (int c = 0; c < n; ++c) acc += inp[r * n + c];
    out[r] = acc;"""


def debug_figures(device: torch.device | None = None, quick: bool = False,
                  tick: Tick = _no_tick) -> dict:
    """Checked calls against plain calls of the same kernel: exp (one access per thread, no
    loop), a row sum (a loop: the timeout's poll runs in it), the seed's grid_sample forward
    (grid samples inside the image: no report). A checked call synchronises and reads its
    record back, so its time is the call's wall time; the plain calls' are too (one sync each)."""
    import kernelkit as kk
    from .ops.grid_sample import FORWARD_SOURCE, grid_sample_reference

    device = device or best_device()
    gpu = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if gpu else (lambda: None)
    repeat = (5 if quick else 20) if gpu else (2 if quick else 7)
    torch.manual_seed(0)

    def timed(k, check, **kw):
        """Best time of each mode, the modes interleaved round by round (a noisy machine's
        drift then favours none of them)."""
        def fn(mode):
            out = k(**kw, **DEBUG_MODES[mode])
            sync()
            return out
        for mode in DEBUG_MODES:
            err = relative_error(fn(mode)[0], check)
            assert err < 1e-4, (mode, err)
        best = dict.fromkeys(DEBUG_MODES, float("inf"))
        for _ in range(repeat):
            for mode in DEBUG_MODES:
                t0 = time.perf_counter()
                fn(mode)
                best[mode] = min(best[mode], (time.perf_counter() - t0) * 1e3)
        return {f"{mode}_ms": t for mode, t in best.items()}

    tick("debug: exp")
    n = (1 << 22 if quick else 1 << 26) if gpu else (1 << 20 if quick else 1 << 24)
    exp = kk.metal_kernel(name="debug_exp", input_names=["inp"], output_names=["out"],
                          source="uint i = thread_position_in_grid.x; out[i] = metal::exp(inp[i]);")
    a = torch.randn(n, device=device)
    res = {"exp": {"n": n, "dtype": "float32", **timed(
        exp, torch.exp(a), inputs=[a], grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,)],
        output_dtypes=[torch.float32])}}

    tick("debug: row sum (a loop)")
    rows, cols = (1024, 1024) if quick else (16384, 4096) if gpu else (4096, 1024)
    rs = kk.metal_kernel(name="debug_row_sum", input_names=["inp"], output_names=["out"],
                         source=_ROW_SUM)
    m = torch.randn(rows, cols, device=device)
    res["row_sum"] = {"rows": rows, "cols": cols, "dtype": "float32", **timed(
        rs, m.sum(1), inputs=[m], grid=(rows, 1, 1), threadgroup=(64, 1, 1),
        output_shapes=[(rows,)], output_dtypes=[torch.float32])}

    tick("debug: grid_sample forward (seed)")
    B, H, W, C, gH, gW = (1, 128, 128, 32, 64, 64) if quick else \
        (8, 1024, 1024, 64, 256, 256) if gpu else (1, 256, 256, 64, 128, 128)  # GPU: the seed's
    gs = kk.metal_kernel(name="debug_grid_sample", input_names=["x", "grid"], output_names=["out"],
                         source=FORWARD_SOURCE)
    x = torch.randn(B, H, W, C, device=device)
    g = (torch.rand(B, gH, gW, 2, device=device) * 2 - 1) * 0.95  # inside: the corners exist
    res["grid_sample_forward"] = {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2]}, **timed(
        gs, grid_sample_reference(x, g), inputs=[x, g], template=[("T", torch.float32)],
        output_shapes=[(B, gH, gW, C)], output_dtypes=[torch.float32],
        grid=(B * gH * gW * C, 1, 1), threadgroup=(256, 1, 1))}
    return res


_DEBUG_ROWS = (("exp", lambda r: f"exp, {_count(r['n'])} float32 (no loop)"),
               ("row_sum", lambda r: f"row sum, {r['rows']}×{r['cols']} float32 (a loop)"),
               ("grid_sample_forward", lambda r: f"grid_sample forward (MLX's example), x {_shape(r['shape']['x'])}"))


def _count(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else str(n)


def _md_debug(r: dict, path) -> list[str]:
    lines = ["## Checked calls (`check_bounds`, `timeout`)", "", _meta(r, path), "",
             "Wall time per call, synchronised (a checked call waits for its kernel and reads its "
             "record back), and the ratio to the plain call.", ""]
    rows = []
    for key, label in _DEBUG_ROWS:
        f = r.get(key)
        if not f:
            continue
        plain = f["plain_ms"]
        rows.append([label(f), _ms(plain)] + [f"{_ms(f[f'{m}_ms'])} ({f[f'{m}_ms'] / plain:.2f}×)"
                                           for m in list(DEBUG_MODES)[1:]])
    return lines + _table(["", "plain", "check_bounds", "timeout", "both"], rows)


def _bars_debug(r: dict):
    groups = [key for key, _ in _DEBUG_ROWS if r.get(key)]
    names = {"plain": "plain", "check_bounds": "check_bounds", "timeout": "timeout",
             "check_bounds_timeout": "both"}
    series = {names[m]: [r[g][f"{m}_ms"] for g in groups] for m in DEBUG_MODES}
    return "checked calls", "ms", [g.replace("_", " ") for g in groups], series

RUNNERS = {"grid_sample": grid_sample_figures, "ops": ops_figures, "cpu": cpu_figures,
           "overhead": overhead_figures, "debug": debug_figures}


def run(kind: str, device: torch.device, quick: bool, command: str, tick: Tick = _no_tick) -> dict:
    """One benchmark, as a result record, timed in the steady state: the C fast call path built
    (once per machine, in a background thread that the first calls do not wait for) and loaded.
    On a fresh machine a grid_sample forward + backward took ~1.3 ms of host time until then,
    0.5-0.7 ms after (H100 host)."""
    from . import fastcall

    fastcall.module(block=True)
    if kind == "cpu":
        device = torch.device("cpu")
    if device.type == "cuda":
        with torch.cuda.device(device):
            body = RUNNERS[kind](device, quick, tick)
    else:
        body = RUNNERS[kind](device, quick, tick)
    return record(kind, body, device, command, quick)


# --- progress ----------------------------------------------------------------------------------

class Progress:
    """A one-line progress bar on stderr, drawn only when stderr is a terminal."""

    def __init__(self, total: int, stream=None, enabled: bool | None = None):
        self.stream = stream or sys.stderr
        self.total, self.done = max(total, 1), 0
        try:
            tty = self.stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        self.enabled = tty if enabled is None else enabled
        self.start = time.perf_counter()

    def tick(self, label: str) -> None:
        """A step begins: draw the bar with the steps done so far and the step's label."""
        self._draw(label)
        self.done = min(self.done + 1, self.total - 1)

    def _draw(self, label: str) -> None:
        if not self.enabled:
            return
        width = max(shutil.get_terminal_size((80, 24)).columns - 1, 20)
        bar = 24
        filled = bar * self.done // self.total
        text = (f"[{'#' * filled}{'.' * (bar - filled)}] {self.done}/{self.total} "
                f"{time.perf_counter() - self.start:4.0f}s  {label}")
        self.stream.write("\r" + text[:width].ljust(width))
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            width = max(shutil.get_terminal_size((80, 24)).columns - 1, 20)
            self.stream.write("\r" + " " * width + "\r")
            self.stream.flush()


# --- results: loading, Markdown, charts --------------------------------------------------------

def kind_of(result: dict) -> str | None:
    if result.get("benchmark") in KINDS:
        return result["benchmark"]
    command = result.get("command", "")
    for kind, script in SCRIPTS.items():
        if script in command:
            return kind
    return None


def upgrade(result: dict) -> dict:
    """A result in the current layout; the files recorded before `kernelkit bench` used other keys."""
    r = dict(result)
    kind = r["benchmark"] = kind_of(r)
    if kind == "cpu" and "exp_64M_float32" in r:
        e = r.pop("exp_64M_float32")
        r["exp"] = {"n": 64 * 2**20, "dtype": "float32", "kernelkit_ms": e["kernelkit_ms"],
                    "torch_ms": e["torch_exp_ms"], "throughput_vs_torch": e["throughput_vs_torch"]}
    if kind == "cpu" and "grid_sample_1_16" in r:
        r["grid_sample"] = r.pop("grid_sample_1_16")
    if kind == "cpu" and "compile_s" in r:
        c = r.pop("compile_s")
        r["compile"] = {"cold_first_call_s": c["cold_first_call"],
                        "warm_disk_first_call_s": c["disk_cache_first_call"]}
    if kind == "ops" and "grid_sample_bilinear_zeros_float32" in r:
        r["grid_sample"] = r.pop("grid_sample_bilinear_zeros_float32")
        r["grid_sample"].setdefault("shape", {"x": [8, 1024, 1024, 64], "grid": [8, 256, 256, 2],
                                              "dtype": "float32"})
    for key in [k for k in r if k.startswith("matmul_add_relu_batch")]:
        batch, n = (int(v) for v in re.findall(r"\d+", key)[:2])
        r["matmul_add_relu"] = {"batch": batch, "m": n, "n": n, "k": n, **r.pop(key)}
    r.setdefault("versions", {"torch": r.get("torch")})
    return r


def load(paths) -> list[tuple[dict, str]]:
    """(result, file) for each JSON file given, or each *.json in a directory given."""
    out = []
    for p in map(Path, paths):
        files = sorted(p.glob("*.json"), key=lambda f: (KINDS.index(f.stem) if f.stem in KINDS
                                                        else len(KINDS), f.name)) if p.is_dir() else [p]
        for f in files:
            data = json.loads(f.read_text())
            for r in data if isinstance(data, list) else [data]:
                if kind_of(r):
                    out.append((upgrade(r), str(f)))
    return out


def _num(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def _ms(v: float | None) -> str:
    return "n/a" if v is None else f"{_num(v)} ms"


def _s(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{_num(v * 1e3)} ms" if v < 0.1 else f"{_num(v)} s"


def _shape(dims) -> str:
    return "×".join(str(d) for d in dims)


def _on_cpu(r: dict) -> bool:
    return r["benchmark"] == "cpu" or str(r.get("device", "")).startswith("cpu")


def _meta(r: dict, path: str | None) -> str:
    v = r.get("versions") or {}
    parts = [r.get("device", "?"), f"torch {v.get('torch') or r.get('torch', '?')}"]
    if _on_cpu(r):
        if v.get("cxx"):
            parts.append(v["cxx"])
    else:
        if v.get("nvrtc"):
            parts.append(f"NVRTC {v['nvrtc']}")
        if v.get("driver"):
            parts.append(f"driver CUDA {v['driver']}")
    if v.get("kernelkit"):
        parts.append(f"kernelkit {v['kernelkit']}")
    parts.append(r.get("date", "?"))
    line = ", ".join(parts) + f", `{r.get('command', '?')}`"
    if path:
        line += f" (`{path}`)"
    return line + (". Quick (reduced) sizes." if r.get("quick") else ".")


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(row) + " |" for row in rows])


def _ratio(a, b) -> str:
    return "n/a" if a is None or b is None else f"{a / b:.2f}×"


def _md_grid_sample(r: dict, path) -> list[str]:
    s, f, v, c = r["shape"], r["forward_ms"], r["vjp_ms"], r.get("compile", {})
    timing = "best host times" if str(r.get("device", "")).startswith("cpu") else "CUDA-event medians"
    lines = ["## grid_sample through `metal_kernel` against a hand-written CUDA port", "", _meta(r, path),
             f"x {_shape(s['x'])}, grid {_shape(s['grid'])}, {s.get('dtype', 'float32')}, grid uniform "
             f"in [-1, 1]; {timing}. \"Hand port\" is the same kernel written as CUDA C++ and launched "
             "through CuPy's `RawKernel`, outside kernelkit.", ""]
    lines += _table(["", "kernelkit `metal_kernel` (MLX's grid_sample example, unchanged)",
                     "hand-written CUDA port", "kernelkit / hand port"], [
        ["forward", _ms(f["kernelkit"]), _ms(f.get("hand_port")), _ratio(f["kernelkit"], f.get("hand_port"))],
        ["VJP (incl. zero fill of the outputs)", _ms(v["kernelkit"]), _ms(v.get("hand_port")),
         _ratio(v["kernelkit"], v.get("hand_port"))],
        ["`torch.nn.functional.grid_sample` (NHWC view), forward",
         _ms(f.get("torch_grid_sample_nhwc_view")), "", ""]])
    if r.get("hand_port_note"):
        lines += ["", f"No hand port: {r['hand_port_note']}."]
    if c and _on_cpu(r):
        lines += ["", _cpu_compile_line(c)]
    elif c:
        lines += ["", "Compile time, fresh processes: first call with an empty cache (NVRTC compile, "
                  f"load, launch) **{_s(c['cold_first_call_s'])}**; "
                  "first call in a fresh process with the kernel in the disk cache "
                  f"**{_s(c['warm_disk_first_call_s'])}**."]
    return lines


def _cpu_compile_line(c: dict) -> str:
    return ("Compile time of a kernel (fresh process, CPU runtime library already built): cold "
            f"**{_s(c['cold_first_call_s'])}**, disk-cache hit **{_s(c['warm_disk_first_call_s'])}**.")


def _md_ops(r: dict, path) -> list[str]:
    g, m = r.get("grid_sample"), r.get("matmul_add_relu")
    lines = ["## `kernelkit.ops` against torch", "", _meta(r, path), ""]
    rows = []
    if g:
        f, b, s = g["forward_ms"], g["forward_backward_ms"], g["shape"]
        shapes = f"x {_shape(s['x'])}, grid {_shape(s['grid'])}"
        rows += [["grid_sample forward (bilinear, zeros, float32)", shapes, _ms(f["kernelkit"]),
                  f"{_ms(f.get('torch_grid_sample_nchw'))} (`F.grid_sample`, NCHW data)",
                  _ratio(f.get("torch_grid_sample_nchw"), f["kernelkit"])],
                 ["", "", "", f"{_ms(f.get('torch_grid_sample_nhwc_view'))} (NHWC view)",
                  _ratio(f.get("torch_grid_sample_nhwc_view"), f["kernelkit"])],
                 ["", "", "", f"{_ms(f.get('composed_reference'))} (composed torch ops)",
                  _ratio(f.get("composed_reference"), f["kernelkit"])],
                 ["grid_sample forward + backward", "same", _ms(b["kernelkit"]),
                  f"{_ms(b.get('torch_grid_sample_nhwc_view'))} (NHWC view)",
                  _ratio(b.get("torch_grid_sample_nhwc_view"), b["kernelkit"])]]
        c = g.get("forward_backward_crowded_ms")
        if c:
            rows.append([f"grid_sample forward + backward, grid × {_num(c['grid_scale'])} (points crowded "
                         "in the centre of x)", "same", _ms(c["kernelkit"]),
                         f"{_ms(c.get('torch_grid_sample_nhwc_view'))} (NHWC view)",
                         _ratio(c.get("torch_grid_sample_nhwc_view"), c["kernelkit"])])
    if m:
        shapes = f"{m['batch']} × {m['m']}×{m['k']} @ {m['k']}×{m['n']}"
        for dtype in ("bfloat16", "float16", "float32", "float64"):
            if dtype in m:
                d = m[dtype]
                rows.append([f"matmul_add_relu {dtype}", shapes,
                             f"{_ms(d['kernelkit_ms'])} ({_num(d['kernelkit_tflops'])} TFLOP/s)",
                             f"{_ms(d['torch_ms'])} ({_num(d['torch_tflops'])} TFLOP/s, `relu(baddbmm)`)",
                             _ratio(d["torch_ms"], d["kernelkit_ms"])])
    x = r.get("mxfp8_matmul")
    if x:
        shapes = f"{x['m']}×{x['k']} @ ({x['n']}×{x['k']})ᵀ"
        rows.append(["mxfp8_matmul, bf16 out", shapes,
                     f"{_ms(x['kernelkit_ms'])} ({_num(x['kernelkit_tflops'])} TFLOP/s)",
                     f"{_ms(x['torch_bf16_ms'])} ({_num(x['torch_bf16_tflops'])} TFLOP/s, bf16 `matmul`)",
                     _ratio(x["torch_bf16_ms"], x["kernelkit_ms"])])
        if "torch_scaled_mm_ms" in x:
            rows.append(["", "", "", f"{_ms(x['torch_scaled_mm_ms'])} ({_num(x['torch_scaled_mm_tflops'])} "
                         "TFLOP/s, `_scaled_mm` fp8 per-tensor)", _ratio(x["torch_scaled_mm_ms"], x["kernelkit_ms"])])
    a = r.get("flash_attention")
    if a:
        shapes = f"{_shape(a['shape'])} {a['dtype']}"
        for name in ("full", "causal"):
            for part, label in (("forward", "forward"), ("forward_backward", "forward + backward")):
                d, f = a[name][part + "_ms"], a[name][part + "_tflops"]
                rows.append([f"flash_attention {name}, {label}", shapes,
                             f"{_ms(d['kernelkit'])} ({_num(f['kernelkit'])} TFLOP/s)",
                             f"{_ms(d['torch_sdpa'])} ({_num(f['torch_sdpa'])} TFLOP/s, SDPA)",
                             _ratio(d["torch_sdpa"], d["kernelkit"])])
    return lines + _table(["op", "shapes", "kernelkit", "torch", "speed-up"], rows) + [
        "", CPU_SPEED_UP if _on_cpu(r) else SPEED_UP]


def _md_cpu(r: dict, path) -> list[str]:
    lines = ["## The CPU backend", "", _meta(r, path) + " Best of several runs.", ""]
    rows = []
    e = r.get("exp")
    if e:
        n = e["n"]
        size = f"{n >> 20}M" if n % (1 << 20) == 0 else str(n)
        rows.append([f"exp, {size} {e.get('dtype', 'float32')} (plain loops)", _ms(e["kernelkit_ms"]),
                     f"{_ms(e['torch_ms'])} (`torch.exp`)", _ratio(e["torch_ms"], e["kernelkit_ms"])])
    g = r.get("grid_sample")
    if g:
        s = g["shape"]
        rows.append([f"grid_sample forward (MLX's example), x {_shape(s['x'])}, grid {_shape(s['grid'])}",
                     _ms(g["forward_ms"]), f"{_ms(g['torch_forward_ms'])} (`F.grid_sample`, NHWC view)",
                     _ratio(g["torch_forward_ms"], g["forward_ms"])])
        ref = g.get("torch_forward_backward_ms")
        rows.append(["grid_sample VJP (MLX's example), same shapes (fibers: `simd_sum`)", _ms(g["vjp_ms"]),
                     f"{_ms(ref)} (`F.grid_sample` forward + backward)" if ref else "",
                     _ratio(ref, g["vjp_ms"])])
        if g.get("op_forward_ms"):
            rows.append(["`kernelkit.ops.grid_sample` forward, same shapes", _ms(g["op_forward_ms"]),
                         f"{_ms(g['torch_forward_ms'])}", _ratio(g["torch_forward_ms"], g["op_forward_ms"])])
            rows.append(["`kernelkit.ops.grid_sample` forward + backward (plain loops, atomics)",
                         _ms(g["op_forward_backward_ms"]), f"{_ms(ref)}" if ref else "",
                         _ratio(ref, g["op_forward_backward_ms"])])
    m = r.get("matmul_add_relu")
    if m:
        rows.append([f"matmul_add_relu {m.get('dtype', 'float32')}, {m['batch']} × {m['m']}×{m['k']} @ "
                     f"{m['k']}×{m['n']} (fibers: barriers)", _ms(m["kernelkit_ms"]),
                     f"{_ms(m['torch_ms'])} (`relu(baddbmm)`)", _ratio(m["torch_ms"], m["kernelkit_ms"])])
    lines += _table(["", "kernelkit (CPU backend)", "torch", "speed-up"], rows) + ["", CPU_SPEED_UP]
    c = r.get("compile")
    if c:
        lines += ["", _cpu_compile_line(c)]
    return lines


def _md_overhead(r: dict, path) -> list[str]:
    lines = ["## Per-call host overhead", "", _meta(r, path), "",
             "A cached kernel with one input and one output of 32 float32, called in a loop; host "
             "time per call including the output's allocation, no sync inside the loop."
             + (f" Median of {r['rounds']} rounds (each call measured once per round: the host's "
                f"speed drifts); kernelkit / torch add_ within a round: "
                f"{_num(r['kernelkit_over_torch_add_'])}." if r.get("rounds") else ""), ""]
    return lines + _table(["", "µs per call"], [
        ["kernelkit `metal_kernel` call", _num(r["kernelkit_call_us"])],
        ["torch `y.add_(1.0)`", _num(r["torch_add__us"])],
        ["torch `torch.empty(32)`", _num(r["torch_empty_us"])]] + (
        [["CuPy `RawKernel` launch (no allocation)", _num(r["cupy_rawkernel_us"])]]
        if r.get("cupy_rawkernel_us") else []))


_MARKDOWN = {"grid_sample": _md_grid_sample, "ops": _md_ops, "cpu": _md_cpu, "overhead": _md_overhead,
             "debug": _md_debug}


def markdown(results: list[tuple[dict, str | None]]) -> str:
    """BENCHMARKS.md's tables for these results ((result, file it came from))."""
    sections = []
    for r, path in results:
        r = upgrade(r)
        sections.append("\n".join(_MARKDOWN[r["benchmark"]](r, path)).replace("\n\n\n", "\n\n"))
    return "\n\n".join(sections) + "\n"


def bars(r: dict) -> tuple[str, str, list[str], dict[str, list]]:
    """(title, unit, groups, series) of a result's chart: kernelkit against its references."""
    r = upgrade(r)
    kind = r["benchmark"]
    if kind == "grid_sample":
        f, v = r["forward_ms"], r["vjp_ms"]
        return ("grid_sample (MLX's example kernels)", "ms", ["forward", "VJP"],
                {"kernelkit": [f["kernelkit"], v["kernelkit"]],
                 "hand-written CUDA": [f.get("hand_port"), v.get("hand_port")],
                 "torch (NHWC view)": [f.get("torch_grid_sample_nhwc_view"), None]})
    if kind == "ops":
        groups, ours, ref = [], [], []
        g, m = r.get("grid_sample"), r.get("matmul_add_relu") or {}
        if g:
            groups += ["grid_sample fwd", "grid_sample fwd+bwd"]
            ours += [g["forward_ms"]["kernelkit"], g["forward_backward_ms"]["kernelkit"]]
            ref += [g["forward_ms"].get("torch_grid_sample_nhwc_view"),
                    g["forward_backward_ms"].get("torch_grid_sample_nhwc_view")]
        for dtype in ("bfloat16", "float16", "float32", "float64"):
            if dtype in m:
                groups.append(f"matmul_add_relu {dtype}")
                ours.append(m[dtype]["kernelkit_ms"])
                ref.append(m[dtype]["torch_ms"])
        return "kernelkit.ops", "ms", groups, {"kernelkit": ours, "torch": ref}
    if kind == "cpu":
        groups, ours, ref = [], [], []
        if r.get("exp"):
            groups.append("exp")
            ours.append(r["exp"]["kernelkit_ms"])
            ref.append(r["exp"]["torch_ms"])
        if r.get("grid_sample"):
            g = r["grid_sample"]
            groups += ["grid_sample fwd", "grid_sample VJP"]
            ours += [g["forward_ms"], g["vjp_ms"]]
            ref += [g["torch_forward_ms"], g.get("torch_forward_backward_ms")]
        if r.get("matmul_add_relu"):
            groups.append("matmul_add_relu")
            ours.append(r["matmul_add_relu"]["kernelkit_ms"])
            ref.append(r["matmul_add_relu"]["torch_ms"])
        return "CPU backend", "ms", groups, {"kernelkit": ours, "torch": ref}
    if kind == "debug":
        return _bars_debug(r)
    return ("per-call host overhead", "µs", ["one call"],
            {"kernelkit": [r["kernelkit_call_us"]], "torch add_": [r["torch_add__us"]],
             "torch empty": [r["torch_empty_us"]]})


@functools.lru_cache(maxsize=None)
def have_matplotlib() -> bool:
    """matplotlib is importable and can draw (some installs import but fail inside their C++)."""
    try:
        import io

        from matplotlib.figure import Figure
        fig = Figure(figsize=(1, 1))
        fig.subplots().bar([0], [1])
        fig.savefig(io.BytesIO(), format="png")
    except Exception:  # noqa: BLE001 - any failure means: no charts, and say so
        return False
    return True


MATPLOTLIB_NOTE = ("matplotlib is not installed or cannot draw here: no PNG charts "
                   "(pip install matplotlib, or pip install 'kernelkit[plot]')")


def bar_chart(path, title: str, unit: str, groups: list[str], series: dict[str, list]) -> None:
    """Grouped bars on a log scale, each labelled with its value; no pyplot, no display needed."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    series = {name: values for name, values in series.items() if any(values)}
    fig = Figure(figsize=(max(6.0, 1.6 * len(groups) + 2), 4.5), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [j + (i - (len(series) - 1) / 2) * width for j, v in enumerate(values) if v]
        ys = [v for v in values if v]
        if not ys:
            continue
        rects = ax.bar(xs, ys, width, label=name)
        ax.bar_label(rects, labels=[_num(v) for v in ys], fontsize=7, padding=1)
    ax.set_yscale("log")
    values = [v for vs in series.values() for v in vs if v]
    if values:
        ax.set_ylim(min(values) / 3, max(values) * 2)
    fmt = FuncFormatter(lambda v, _: f"{v:g}")
    ax.yaxis.set_major_formatter(fmt)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xticks(range(len(groups)), groups, fontsize=8)
    ax.set_ylabel(f"time ({unit}, log scale; lower is better)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)


def write_chart(r: dict, path) -> None:
    title, unit, groups, series = bars(r)
    bar_chart(path, f"{title}\n{r.get('device', '')}, {r.get('date', '')}", unit, groups, series)


# --- writing a run's results ------------------------------------------------------------------

def write_results(results: dict[str, dict], out: Path, charts: bool = True) -> tuple[list[Path], list[str]]:
    """<kind>.json, results.md and <kind>.png under `out`; (files written, notes)."""
    out.mkdir(parents=True, exist_ok=True)
    written, notes = [], []
    for kind, r in results.items():
        p = out / f"{kind}.json"
        p.write_text(json.dumps(r, indent=2) + "\n")
        written.append(p)
    if results:
        md = out / "results.md"
        md.write_text(markdown([(r, f"{kind}.json") for kind, r in results.items()]))
        written.append(md)
    if charts and results:
        if have_matplotlib():
            for kind, r in results.items():
                try:
                    write_chart(r, out / f"{kind}.png")
                    written.append(out / f"{kind}.png")
                except Exception as e:  # noqa: BLE001 - a chart is never worth the figures
                    notes.append(f"no chart for {kind}: {type(e).__name__}: {e}")
        else:
            notes.append(MATPLOTLIB_NOTE)
    return written, notes


# --- the bench/ scripts ----------------------------------------------------------------------

def script_main(kind: str, argv=None) -> int:
    """What each bench/bench_<kind>.py runs: the benchmark, its JSON on stdout and in --out."""
    ap = argparse.ArgumentParser(description=(RUNNERS[kind].__doc__ or "").strip())
    ap.add_argument("--out", help="write the JSON result here too")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    if kind in ("overhead", "ops", "grid_sample", "debug"):
        ap.add_argument("--device", help="cuda[:N] or cpu (default: the GPU if there is one)")
    args = ap.parse_args(argv)
    device = torch.device(getattr(args, "device", None) or ("cpu" if kind == "cpu" else best_device()))
    argv = sys.argv[1:] if argv is None else list(argv)
    command = shlex.join(["python", f"bench/{SCRIPTS[kind]}", *argv])
    progress = Progress(STEPS[kind])
    try:
        result = run(kind, device, args.quick, command, progress.tick)
    finally:
        progress.close()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0

"""The grid_sample suite (GPU; bench/bench_grid_sample.py): the seed's grid_sample forward and VJP
through `metal_kernel` against the same kernels hand-written in CUDA C++
(grid_sample_hand_port.cu, through CuPy's RawKernel when CuPy is installed) and torch, and the
compile times of a fresh process."""

from __future__ import annotations

from pathlib import Path

import torch

from .compile_times import compile_times
from .progress import Tick, _no_tick
from .timing import best_device, relative_error, time_ms

HAND_PORT = Path(__file__).with_name("grid_sample_hand_port.cu").read_text()


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
    from ..ops import grid_sample_seed as grid_sample, grid_sample_vjp
    from ..ops.grid_sample import grid_sample_reference

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

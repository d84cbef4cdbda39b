"""MLX code as its users write it, against the same calls with the kernel held, a hand-written
CUDA port (GPU) and plain autograd.Function; and the per-call overhead beside CuPy's launch.

    python bench/bench_mlx_as_written.py [--quick] [--device cuda|cpu] [--out DIR]

- grid_sample forward and VJP written as MLX's custom-kernel document writes them: the kernel is
  built inside the function on every call, the grid is `np.prod(out_shape)`; beside the same
  calls on kernels built once ("held") and the hand-written CUDA port (CuPy, on a GPU). Rounds
  interleave the three; each figure is the median over rounds of a per-round median (CUDA
  events on a GPU, best host time on the CPU).
- custom_function host time: forward + backward of a one-kernel function with a one-kernel vjp,
  against a plain torch.autograd.Function launching the same two kernels and the two bare
  launches (tiny tensors: host time is the whole time).
- per-call overhead (kernelkit.benchmarks.overhead_figures: kernelkit, torch add_, CuPy RawKernel).

Writes mlx_as_written.json into DIR (default bench/results/<device>/) and prints a table.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

import kernelkit as kk  # noqa: E402
from kernelkit import benchmarks as bm  # noqa: E402
from kernelkit import fastcall  # noqa: E402
from kernelkit.benchmarks.grid_sample import _hand_port  # noqa: E402
from kernelkit.ops.grid_sample import FORWARD_SOURCE, VJP_SOURCE, grid_sample_reference  # noqa: E402


# --- the seed's wrappers, as written (kernel built per call) ----------------------------------

def seed_forward(x, grid):
    B, _, _, C = x.shape
    _, gN, gM, D = grid.shape
    out_shape = (B, gN, gM, C)
    kernel = kk.metal_kernel(name="grid_sample", input_names=["x", "grid"], output_names=["out"],
                             source=FORWARD_SOURCE)
    outputs = kernel(inputs=[x, grid], template=[("T", x.dtype)], output_shapes=[out_shape],
                     output_dtypes=[x.dtype], grid=(np.prod(out_shape), 1, 1),
                     threadgroup=(256, 1, 1))
    return outputs[0]


def seed_vjp(x, grid, cotangent):
    B, _, _, C = x.shape
    _, gN, gM, D = grid.shape
    kernel = kk.metal_kernel(name="grid_sample_grad", input_names=["x", "grid", "cotangent"],
                             output_names=["x_grad", "grid_grad"], source=VJP_SOURCE,
                             atomic_outputs=True)
    simdgroup_size = 32
    C_padded = (C + simdgroup_size - 1) // simdgroup_size * simdgroup_size
    grid_size = B * gN * gM * C_padded
    outputs = kernel(inputs=[x, grid, cotangent], template=[("T", x.dtype)],
                     output_shapes=[x.shape, grid.shape], output_dtypes=[x.dtype, x.dtype],
                     grid=(grid_size, 1, 1), threadgroup=(256, 1, 1), init_value=0)
    return outputs[0], outputs[1]


def held_calls():
    """The same calls on kernels built once (what users who hold their kernel get)."""
    fwd_k = kk.kernel.Kernel(kk._metal, "grid_sample", ["x", "grid"], ["out"], FORWARD_SOURCE)
    vjp_k = kk.kernel.Kernel(kk._metal, "grid_sample_grad", ["x", "grid", "cotangent"],
                             ["x_grad", "grid_grad"], VJP_SOURCE, atomic_outputs=True)

    def forward(x, grid):
        B, _, _, C = x.shape
        _, gN, gM, _ = grid.shape
        out_shape = (B, gN, gM, C)
        return fwd_k(inputs=[x, grid], template=[("T", x.dtype)], output_shapes=[out_shape],
                     output_dtypes=[x.dtype], grid=(np.prod(out_shape), 1, 1),
                     threadgroup=(256, 1, 1))[0]

    def vjp(x, grid, cotangent):
        B, _, _, C = x.shape
        _, gN, gM, _ = grid.shape
        grid_size = B * gN * gM * ((C + 31) // 32 * 32)
        return vjp_k(inputs=[x, grid, cotangent], template=[("T", x.dtype)],
                     output_shapes=[x.shape, grid.shape], output_dtypes=[x.dtype, x.dtype],
                     grid=(grid_size, 1, 1), threadgroup=(256, 1, 1), init_value=0)

    return forward, vjp


def grid_sample_figures(device, quick: bool) -> dict:
    torch.manual_seed(0)
    if device.type == "cuda":
        B, H, W, C, gH, gW = (2, 512, 512, 64, 128, 128) if quick else (8, 1024, 1024, 64, 256, 256)
        rounds, reps = (3, 10) if quick else (7, 20)
    else:
        B, H, W, C, gH, gW = (1, 64, 64, 32, 32, 32) if quick else (2, 128, 128, 64, 64, 64)
        rounds, reps = (3, 2) if quick else (5, 3)
    x = torch.randn(B + 2, H, W, C, device=device)[1:-1]  # the seed reads up to a row outside x
    grid = torch.rand(B, gH, gW, 2, device=device) * 2 - 1
    cot = torch.randn(B, gH, gW, C, device=device)
    held_fwd, held_vjp = held_calls()
    port, why_not = _hand_port(device, x, grid, cot)

    ref = grid_sample_reference(x, grid)
    xr, gr = x.detach().requires_grad_(), grid.detach().requires_grad_()
    grid_sample_reference(xr, gr).backward(cot)
    errors = {"per_call": {"forward": bm.relative_error(seed_forward(x, grid), ref),
                           "vjp": max(bm.relative_error(a, b) for a, b in
                                      zip(seed_vjp(x, grid, cot), (xr.grad, gr.grad)))}}
    assert errors["per_call"]["forward"] < 1e-5 and errors["per_call"]["vjp"] < 1e-4, errors
    del xr, gr, ref

    calls = {"forward": {"per_call": lambda: seed_forward(x, grid), "held": lambda: held_fwd(x, grid)},
             "vjp": {"per_call": lambda: seed_vjp(x, grid, cot), "held": lambda: held_vjp(x, grid, cot)}}
    if port:
        calls["forward"]["hand_port"], calls["vjp"]["hand_port"] = port
    per_round = {op: {name: [] for name in fns} for op, fns in calls.items()}
    for _ in range(rounds):
        for op, fns in calls.items():
            for name, fn in fns.items():
                per_round[op][name].append(bm.time_ms(fn, device, reps, warmup=2))
    ms = {op: {name: statistics.median(v) for name, v in names.items()}
          for op, names in per_round.items()}
    out = {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2], "dtype": "float32"},
           "rounds": rounds, "ms": ms, "per_round_ms": per_round, "relative_error": errors,
           "per_call_over_held": {op: ms[op]["per_call"] / ms[op]["held"] for op in ms}}
    if port:
        out["per_call_over_hand_port"] = {op: ms[op]["per_call"] / ms[op]["hand_port"] for op in ms}
    else:
        out["hand_port_note"] = why_not
    return out


# --- custom_function host time ------------------------------------------------------------------

def custom_function_figures(device, quick: bool) -> dict:
    fwd_k = kk.metal_kernel("cf_forward", ["x"], ["y"],
                            "uint i = thread_position_in_grid.x; y[i] = x[i] * x[i];")
    bwd_k = kk.metal_kernel("cf_backward", ["x", "g"], ["dx"],
                            "uint i = thread_position_in_grid.x; dx[i] = 2.0f * x[i] * g[i];")

    def forward(x):
        return fwd_k(inputs=[x], grid=(x.numel(), 1, 1), threadgroup=(32, 1, 1),
                     output_shapes=[x.shape], output_dtypes=[x.dtype])[0]

    def backward(x, g):
        return bwd_k(inputs=[x, g], grid=(x.numel(), 1, 1), threadgroup=(32, 1, 1),
                     output_shapes=[x.shape], output_dtypes=[x.dtype])[0]

    @kk.custom_function
    def square(x):
        return forward(x)

    @square.vjp
    def square_vjp(primals, cotangent, output):
        return backward(primals, cotangent)

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return forward(x)

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return backward(x, g)

    x = torch.randn(32, device=device, requires_grad=True)
    g = torch.randn(32, device=device)
    (gk,) = torch.autograd.grad(square(x), x, g)
    torch.testing.assert_close(gk, 2 * x.detach() * g)

    def custom():
        torch.autograd.grad(square(x), x, g)

    def function():
        torch.autograd.grad(Square.apply(x), x, g)

    def bare():
        backward(x.detach(), forward(x.detach()))

    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    n, rounds = (500, 3) if quick else (2000, 9)
    per_round = {"custom_function_us": [], "autograd_function_us": [], "two_launches_us": []}
    for _ in range(rounds):
        for name, fn in zip(per_round, (custom, function, bare)):
            per_round[name].append(bm.per_call_us(fn, n, sync, repeat=3))
    return {"calls": n, "rounds": rounds,
            **{name: statistics.median(v) for name, v in per_round.items()},
            "custom_over_autograd_function": statistics.median(
                a / b for a, b in zip(per_round["custom_function_us"], per_round["autograd_function_us"])),
            "per_round_us": per_round}


def table(r: dict) -> str:
    g, c, o = r["grid_sample"], r["custom_function"], r["overhead"]
    lines = [f"{r['device']}, {r['date']}: {r['command']}",
             f"grid_sample x {g['shape']['x']} grid {g['shape']['grid']} (ms, median of {g['rounds']} rounds)",
             "| op | built per call | held | hand port | per call / held | per call / hand port |",
             "|---|---|---|---|---|---|"]
    for op in ("forward", "vjp"):
        ms = g["ms"][op]
        port = ms.get("hand_port")
        port_cells = ("-", "-") if port is None else (f"{port:.4f}", f"{ms['per_call'] / port:.3f}")
        lines.append(f"| {op} | {ms['per_call']:.4f} | {ms['held']:.4f} | {port_cells[0]} | "
                     f"{g['per_call_over_held'][op]:.3f} | {port_cells[1]} |")
    lines += [f"custom_function fwd+bwd host time: {c['custom_function_us']:.1f} us; autograd.Function "
              f"{c['autograd_function_us']:.1f} us; ratio {c['custom_over_autograd_function']:.2f} "
              f"(two bare launches {c['two_launches_us']:.1f} us)",
              f"per-call overhead: kernelkit {o['kernelkit_call_us']:.2f} us, torch add_ "
              f"{o['torch_add__us']:.2f} us" + (f", CuPy RawKernel {o['cupy_rawkernel_us']:.2f} us, ratio "
                                               f"{o['kernelkit_call_us'] / o['cupy_rawkernel_us']:.2f}"
                                               if o.get("cupy_rawkernel_us") else "")]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    device = torch.device(a.device) if a.device else bm.best_device()
    fastcall.module(block=True)  # the steady state: the C fast call path built and loaded
    command = "python bench/bench_mlx_as_written.py " + " ".join(sys.argv[1:])
    t0 = time.time()
    body = {"grid_sample": grid_sample_figures(device, a.quick),
            "custom_function": custom_function_figures(device, a.quick),
            "overhead": bm.overhead_figures(device, a.quick)}
    result = bm.record("mlx_as_written", body, device, command.strip(), a.quick)
    result["seconds"] = time.time() - t0
    out = Path(a.out) if a.out else Path(__file__).resolve().parent / "results" / bm.device_tag(device)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mlx_as_written.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

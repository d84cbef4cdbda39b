"""The seed's grid_sample forward and VJP kernels under each math mode, beside the hand-written
CUDA port (NVRTC's defaults: multiply-adds fused), interleaved in one process (GPU).

    python bench/bench_math_modes.py [--quick] [--out DIR]

Modes: "safe" (metal_kernel's default, as MLX's: multiply-adds fused, as Metal's contraction
"on"), "safe" with `#pragma METAL fp contract(off)` (nothing fused), "relaxed" and "fast". Each
figure is the median over rounds of a round's CUDA-event median; the ratios are to the hand port.
Writes math_modes.json into DIR (default bench/results/<device>/) and prints a table.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

import kernelkit as kk  # noqa: E402
from kernelkit import benchmarks as bm  # noqa: E402
from kernelkit.benchmarks.grid_sample import _hand_port  # noqa: E402
from kernelkit.ops.grid_sample import FORWARD_SOURCE, VJP_SOURCE, grid_sample_reference  # noqa: E402

VARIANTS = {"safe": ("", "safe"), "safe_contract_off": ("#pragma METAL fp contract(off)\n", "safe"),
            "relaxed": ("", "relaxed"), "fast": ("", "fast")}


def kernels(variant: str):
    pragma, mode = VARIANTS[variant]
    options = {"math_mode": mode}
    fwd = kk.metal_kernel(name="grid_sample", input_names=["x", "grid"], output_names=["out"],
                          source=pragma + FORWARD_SOURCE, compile_options=options)
    vjp = kk.metal_kernel(name="grid_sample_grad", input_names=["x", "grid", "cotangent"],
                          output_names=["x_grad", "grid_grad"], source=pragma + VJP_SOURCE,
                          atomic_outputs=True, compile_options=options)

    def forward(x, grid):
        B, _, _, C = x.shape
        _, gN, gM, _ = grid.shape
        shape = (B, gN, gM, C)
        return fwd(inputs=[x, grid], template=[("T", x.dtype)], output_shapes=[shape],
                   output_dtypes=[x.dtype], grid=(B * gN * gM * C, 1, 1), threadgroup=(256, 1, 1))[0]

    def backward(x, grid, cot):
        B, _, _, C = x.shape
        _, gN, gM, _ = grid.shape
        return vjp(inputs=[x, grid, cot], template=[("T", x.dtype)], output_shapes=[x.shape, grid.shape],
                   output_dtypes=[x.dtype, x.dtype], grid=(B * gN * gM * ((C + 31) // 32 * 32), 1, 1),
                   threadgroup=(256, 1, 1), init_value=0)

    return forward, backward


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    B, H, W, C, gH, gW = (2, 512, 512, 64, 128, 128) if args.quick else (8, 1024, 1024, 64, 256, 256)
    rounds, reps = (3, 10) if args.quick else (9, 20)
    x = torch.randn(B + 2, H, W, C, device=device)[1:-1]  # the seed reads up to a row outside x
    grid = torch.rand(B, gH, gW, 2, device=device) * 2 - 1
    cot = torch.randn(B, gH, gW, C, device=device)
    port, why_not = _hand_port(device, x, grid, cot)
    if port is None:
        print(why_not)
        return 1
    ref = grid_sample_reference(x, grid)
    calls = {"forward": {"hand_port": lambda: port[0]()}, "vjp": {"hand_port": lambda: port[1]()}}
    errors = {}
    for name in VARIANTS:
        fwd, vjp = kernels(name)
        errors[name] = bm.relative_error(fwd(x, grid), ref)
        calls["forward"][name] = lambda f=fwd: f(x, grid)
        calls["vjp"][name] = lambda v=vjp: v(x, grid, cot)
    per_round = {op: {n: [] for n in fns} for op, fns in calls.items()}
    for _ in range(rounds):
        for op, fns in calls.items():
            for n, fn in fns.items():
                per_round[op][n].append(bm.time_ms(fn, device, reps, warmup=2))
    ms = {op: {n: statistics.median(v) for n, v in names.items()} for op, names in per_round.items()}
    over_port = {op: {n: ms[op][n] / ms[op]["hand_port"] for n in VARIANTS} for op in ms}
    body = {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2], "dtype": "float32"}, "rounds": rounds,
            "ms": ms, "over_hand_port": over_port, "forward_relative_error": errors,
            "per_round_ms": per_round}
    out_dir = args.out or Path(__file__).resolve().parent / "results" / bm.device_tag(device)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = "python bench/bench_math_modes.py" + (" --quick" if args.quick else "")
    (out_dir / "math_modes.json").write_text(json.dumps(bm.record("math_modes", body, device, command,
                                                                  args.quick), indent=1))
    print(f"{'':20s} {'forward ms':>11s} {'/ port':>7s} {'vjp ms':>9s} {'/ port':>7s}")
    for n in ["hand_port", *VARIANTS]:
        print(f"{n:20s} {ms['forward'][n]:11.4f} {ms['forward'][n] / ms['forward']['hand_port']:7.3f} "
              f"{ms['vjp'][n]:9.4f} {ms['vjp'][n] / ms['vjp']['hand_port']:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a repeated kernel call's host time goes on a GPU, part by part, beside CuPy's launch.

    python bench/profile_call_overhead.py [--out FILE.json]      (needs an NVIDIA GPU and CuPy)

Prints, and writes with --out, the median over interleaved rounds of: the whole call; the same
call with fastcall_torch withdrawn (tensors read and outputs allocated through torch's Python
methods, as before it existed); fastcall's `call` without Kernel.__call__; the plan alone
(allocate, pack, launch); the plan key; torch's allocation from Python (empty_like of an
expanded prototype, the Python path's); the driver launch through fastcall's `launch`; CuPy's
RawKernel launch (no allocation); torch's add_. Beside them, the median over rounds of the
call's ratio to CuPy's launch in the same round.
"""

import argparse
import json
import re
import shlex
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

import kernelkit as kk  # noqa: E402
from kernelkit import fastcall  # noqa: E402
from kernelkit.benchmarks import per_call_us, record  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON result here too")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    import cupy as cp
    dev = torch.device("cuda")
    k = kk.metal_kernel(name="overhead", input_names=["inp"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i] + 1.0f;")
    x = torch.randn(32, device=dev)
    kw = dict(inputs=[x], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
              output_dtypes=[torch.float32])
    mod = fastcall.module(block=True)
    helper = fastcall.torch_helper()
    if isinstance(helper, str):
        sys.exit(f"fastcall_torch is unavailable: {helper}")
    for _ in range(5):  # compiled, planned
        assert torch.equal(k(**kw)[0], x + 1)
    shapes, dtypes = [(32,)], [torch.float32]
    plans = k._plans
    plan = plans[mod.key([x], dtypes, (32, 1, 1), (32, 1, 1), None)]
    variant = next(iter(k._variants.values()))
    fn, ctx = int(variant.program.func), variant.program.device._context_int
    block = variant.pack([x], [torch.empty(32, device=dev)], (32, 1, 1, 0))
    proto = torch.empty((), device=dev).expand(32)
    raw = cp.RawKernel(r'extern "C" __global__ void f(const float* a, float* b) '
                       r'{ int i = threadIdx.x; b[i] = a[i] + 1.0f; }', "f")
    a_, b_ = cp.zeros(32, dtype=cp.float32), cp.zeros(32, dtype=cp.float32)
    stream = torch._C._cuda_getCurrentRawStream
    lent = fastcall.addresses(helper)
    calls = {  # name -> (call, whether fastcall_torch is lent while it is timed)
        "kernel call": (lambda: k(**kw), True),
        "kernel call, torch's Python methods": (lambda: k(**kw), False),
        "fastcall.call": (lambda: mod.call(plans, [x], shapes, dtypes, (32, 1, 1), (32, 1, 1), None), True),
        "plan run": (lambda: mod.run(plan, [x], shapes), True),
        "plan key": (lambda: mod.key([x], dtypes, (32, 1, 1), (32, 1, 1), None), True),
        "torch empty_like": (lambda: torch.empty_like(proto), True),
        "launch": (lambda: mod.launch(fn, ctx, 1, 1, 1, 32, 1, 1, 0, stream(0), block), True),
        "CuPy RawKernel": (lambda: raw((1,), (32,), (a_, b_)), True),
        "torch add_": (lambda: x.add_(0.0), True),
    }
    rounds = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, (fn_, with_torch) in calls.items():
            if with_torch:
                mod.set_torch(*lent)
            else:
                mod.set_torch()
            rounds[name].append(per_call_us(fn_, 3000, torch.cuda.synchronize, repeat=2))
    mod.set_torch(*lent)
    ratio = statistics.median(a / b for a, b in zip(rounds["kernel call"], rounds["CuPy RawKernel"]))
    print(f"{torch.cuda.get_device_name(dev)}: host time per call (median of {args.rounds} rounds)")
    for name, v in rounds.items():
        print(f"{name:36s} {statistics.median(v):6.2f} us")
    print(f"{'kernel call / CuPy RawKernel':36s} {ratio:6.2f} (median of the rounds' ratios)")
    if args.out:
        command = shlex.join(["python", "bench/profile_call_overhead.py", *sys.argv[1:]])
        rounds = {_key(name): v for name, v in rounds.items()}
        body = {"rounds": args.rounds, "calls": 3000,
                **{f"{name}_us": statistics.median(v) for name, v in rounds.items()},
                "kernel_call_over_cupy_rawkernel": ratio, "per_round_us": rounds}
        Path(args.out).write_text(json.dumps(record("profile_call_overhead", body, dev, command),
                                             indent=2) + "\n")


def _key(name: str) -> str:
    """A part's name as a JSON key ("torch empty_like" -> torch_empty_like)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower().replace("'", "")).strip("_")


if __name__ == "__main__":
    main()

"""Where a repeated kernel call's host time goes on a GPU, part by part, beside CuPy's launch.

    python bench/profile_call_overhead.py      (needs an NVIDIA GPU and CuPy)

Prints the median over rounds of: the whole call; fastcall's `call` without Kernel.__call__;
the plan alone (allocate, pack, launch); the plan key; torch's allocation (empty_like of an
expanded prototype, as plans allocate); the driver launch through fastcall's `launch`; CuPy's
RawKernel launch; torch's add_. The call's floor is the allocation plus the launch.
"""

import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

import kernelkit as kk  # noqa: E402
from kernelkit import fastcall  # noqa: E402
from kernelkit.benchmarks import per_call_us  # noqa: E402


def main() -> None:
    import cupy as cp
    dev = torch.device("cuda")
    k = kk.metal_kernel(name="overhead", input_names=["inp"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i] + 1.0f;")
    x = torch.randn(32, device=dev)
    kw = dict(inputs=[x], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
              output_dtypes=[torch.float32])
    mod = fastcall.module(block=True)
    for _ in range(5):  # compiled, planned
        k(**kw)
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
    calls = {
        "kernel call": lambda: k(**kw),
        "fastcall.call": lambda: mod.call(plans, [x], shapes, dtypes, (32, 1, 1), (32, 1, 1), None),
        "plan run": lambda: mod.run(plan, [x], shapes),
        "plan key": lambda: mod.key([x], dtypes, (32, 1, 1), (32, 1, 1), None),
        "torch empty_like": lambda: torch.empty_like(proto),
        "launch": lambda: mod.launch(fn, ctx, 1, 1, 1, 32, 1, 1, 0, stream(0), block),
        "CuPy RawKernel": lambda: raw((1,), (32,), (a_, b_)),
        "torch add_": lambda: x.add_(0.0),
    }
    rounds = {name: [] for name in calls}
    for _ in range(7):
        for name, fn_ in calls.items():
            rounds[name].append(per_call_us(fn_, 3000, torch.cuda.synchronize, repeat=2))
    print(f"{torch.cuda.get_device_name(dev)}: host time per call (median of 7 rounds)")
    for name, v in rounds.items():
        print(f"{name:18s} {statistics.median(v):6.2f} us")


if __name__ == "__main__":
    main()

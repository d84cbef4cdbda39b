"""The overhead suite (either device; bench/bench_overhead.py): host time per call of a cached
kernel, beside torch's own small ops and CuPy's launch."""

from __future__ import annotations

import statistics

import torch

from .progress import Tick, _no_tick
from .timing import best_device, per_call_us


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

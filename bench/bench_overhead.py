"""Per-call host overhead of a cached kernel (issue 6), beside torch's own small op.

A kernel with one input and one output of 32 float32 elements, called in a loop;
host time per call including output allocation, no sync inside the loop.

    python bench/bench_overhead.py [--device cuda|cpu] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import kernelkit as kk


def per_call_us(fn, n: int, sync) -> float:
    for _ in range(100):
        fn()
    sync()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        sync()
        best = min(best, (t1 - t0) / n)
    return best * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out")
    args = ap.parse_args()
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    k = kk.metal_kernel(name="overhead", input_names=["inp"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i] + 1.0f;")
    x = torch.randn(32, device=device)
    kw = dict(inputs=[x], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
              output_dtypes=[torch.float32])
    assert torch.equal(k(**kw)[0], x + 1)
    y = torch.randn(32, device=device)
    results = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "date": time.strftime("%Y-%m-%d"),
        "command": f"python bench/bench_overhead.py --device {args.device}",
        "kernelkit_call_us": per_call_us(lambda: k(**kw), 5000, sync),
        "torch_add__us": per_call_us(lambda: y.add_(1.0), 5000, sync),
        "torch_empty_us": per_call_us(lambda: torch.empty(32, device=device), 5000, sync),
    }
    print(json.dumps(results, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            f.write(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()

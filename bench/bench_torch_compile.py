"""torch.compile against eager, and the per-call overhead against an earlier kernelkit.

    python bench/bench_torch_compile.py [--quick] [--device cuda|cpu] [--baseline SRC] [--out DIR]
                                        [--name NAME]

- A model whose layer is kk.ops.grid_sample (with a linear layer before it), forward +
  backward, eager and under torch.compile (fullgraph), timed interleaved in rounds (CUDA events on
  a GPU, host time on the CPU): compiling must not make it slower. Several sizes: where the host's
  work per step dominates (host-bound) and where the device's does; on a GPU, each step's host time
  too (its launches alone, no sync), which says which one bounds the step. Beside it, the same
  model with torch's own F.grid_sample, eager and compiled: what torch.compile costs a model of
  native ops at that size. On a GPU, both models also under mode="reduce-overhead" (CUDA graphs:
  a step's launches replayed at once, what torch.compile offers host-bound steps).
- With --baseline SRC (the `src` directory of an earlier kernelkit): the per-call overhead of a
  cached kernel (kernelkit.benchmarks.overhead_figures) of this checkout and of SRC, measured in
  alternating fresh processes, so that a change in the call path shows as a ratio.

Writes NAME.json (default torch_compile) into DIR (default bench/results/<device>/) and prints a
table.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))  # this checkout's kernelkit

import kernelkit as kk  # noqa: E402
from kernelkit import benchmarks as bm  # noqa: E402
from kernelkit import fastcall  # noqa: E402


class Sampler(torch.nn.Module):
    """A linear layer over channels, then grid_sample at learned offsets of a base grid."""

    def __init__(self, C: int):
        super().__init__()
        self.proj = torch.nn.Linear(C, C)
        self.offset = torch.nn.Parameter(torch.zeros(2))

    def forward(self, x, grid):
        return kk.ops.grid_sample(self.proj(x), grid + self.offset)


class TorchSampler(Sampler):
    """The same model on torch's own grid_sample (channels first; bilinear, zero padding)."""

    def forward(self, x, grid):
        return torch.nn.functional.grid_sample(self.proj(x).permute(0, 3, 1, 2), grid + self.offset,
                                               align_corners=False)


# (B, H, W, C, gH, gW) of x (B, H, W, C) and grid (B, gH, gW, 2)
SIZES = {
    # GPU: host-bound (~0.1-0.5 ms of GPU work a step), then the GPU's work dominates
    "cuda": [(2, 128, 128, 32, 64, 64), (4, 256, 256, 64, 128, 128), (8, 512, 512, 64, 256, 256)],
    # CPU: the host's Python and torch's wrappers alone, then the kernels' work dominates
    "cpu": [(1, 8, 8, 4, 4, 4), (2, 64, 64, 32, 32, 32)],
}


def compile_figures(device, size, quick: bool) -> dict:
    torch.manual_seed(0)
    torch._dynamo.reset()  # a graph of this size's own, not one recompiled for dynamic shapes
    B, H, W, C, gH, gW = size
    # (more rounds on the CPU: its kernels' thread pool makes rounds bimodal on 2 cores)
    rounds, reps = (3, 10) if quick else (15 if device.type == "cpu" else 7, 20)
    model = Sampler(C).to(device)
    x = torch.randn(B, H, W, C, device=device)
    grid = torch.rand(B, gH, gW, 2, device=device) * 2 - 1
    compiled = torch.compile(model, fullgraph=True)

    def step(m, *inputs):
        def run():
            m.zero_grad(set_to_none=True)
            m(*inputs).square().sum().backward()
        return run

    def grads(m, *inputs):
        step(m, *inputs)()
        return [p.grad.double().clone() for p in m.parameters()]

    # Against a float64 run: the weight's gradient sums ~1e5 products of mean-zero terms, where
    # two float32 summation orders differ by ~1e-2 relative; compiled must be as close as eager.
    reference = grads(_double(model), x.double(), grid.double())
    ours = {"eager": model, "compiled": compiled}
    native = TorchSampler(C).to(device)
    theirs = {"torch_eager": native, "torch_compiled": torch.compile(native, fullgraph=True)}
    if device.type == "cuda":  # the mode torch.compile offers host-bound steps: CUDA graphs
        ours["cudagraphs"] = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        theirs["torch_cudagraphs"] = torch.compile(native, mode="reduce-overhead", fullgraph=True)
    errors = {name: [bm.relative_error(g, r) for g, r in zip(grads(m, x, grid), reference)]
              for name, m in ours.items()}
    assert all(c <= 2 * e + 1e-5 for name in ours for c, e in zip(errors[name], errors["eager"])), errors
    models = {**ours, **theirs}
    per_round = {f"{name}_ms": [] for name in models}
    if device.type == "cuda":
        per_round.update({f"{name}_host_ms": [] for name in ours})
    for _ in range(rounds):
        for name, m in models.items():
            per_round[f"{name}_ms"].append(bm.time_ms(step(m, x, grid), device, reps, warmup=2))
            if device.type == "cuda" and name in ours:
                per_round[f"{name}_host_ms"].append(_host_ms(step(m, x, grid), reps))
    ms = {k: statistics.median(v) for k, v in per_round.items()}
    return {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2]}, "rounds": rounds, "reps": reps,
            **ms, **{f"{name}_over_eager": ms[f"{name}_ms"] / ms["eager_ms"] for name in ours if name != "eager"},
            **{f"{name}_over_eager": ms[f"{name}_ms"] / ms["torch_eager_ms"] for name in theirs
               if name != "torch_eager"},
            "grad_relative_error_to_float64": errors, "per_round_ms": per_round}


def _host_ms(fn, reps: int) -> float:
    """Host time a step, queued without waiting for the GPU (synchronized before and after)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return t / reps * 1e3


def _double(model: Sampler) -> Sampler:
    """A float64 copy of the model, same parameters."""
    import copy
    return copy.deepcopy(model).double()


_OVERHEAD = ("import sys, json, torch; sys.path.insert(0, {src!r}); "
             "from kernelkit import fastcall; fastcall.module(block=True); "  # built and loaded
             "from kernelkit.benchmarks import overhead_figures; "
             "r = overhead_figures(torch.device({device!r}), quick=True); "
             "print(json.dumps([r['kernelkit_call_us'], r['torch_add__us']]))")


def overhead_against(baseline: str, device, rounds: int = 3) -> dict:
    """Per-call overhead of this checkout and of `baseline`, in alternating fresh processes; each
    figure beside torch's add_ of the same process (the host's speed drifts)."""
    runs = {"this": [], "baseline": []}
    for _ in range(rounds):
        for name, src in (("this", str(HERE.parent / "src")), ("baseline", baseline)):
            out = subprocess.run([sys.executable, "-c", _OVERHEAD.format(src=src, device=str(device))],
                                 capture_output=True, text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    med = {name: statistics.median(r[0] for r in v) for name, v in runs.items()}
    rel = {name: statistics.median(r[0] / r[1] for r in v) for name, v in runs.items()}
    return {"this_us": med["this"], "baseline_us": med["baseline"], "baseline_src": baseline,
            "this_over_baseline": rel["this"] / rel["baseline"], "runs_us_and_torch_add_us": runs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="the smallest size only, fewer rounds")
    p.add_argument("--device", default=None)
    p.add_argument("--baseline", metavar="SRC", help="an earlier kernelkit's src directory")
    p.add_argument("--out", default=None)
    p.add_argument("--name", default="torch_compile", help="the result file's name, without .json")
    a = p.parse_args()
    device = torch.device(a.device) if a.device else bm.best_device()
    fastcall.module(block=True)  # the steady state: the C fast call path built and loaded
    t0 = time.time()
    sizes = SIZES[device.type][:1] if a.quick else SIZES[device.type]
    body = {"compile": [compile_figures(device, size, a.quick) for size in sizes]}
    if a.baseline:
        body["overhead"] = overhead_against(a.baseline, device)
    command = ("python bench/bench_torch_compile.py " + " ".join(sys.argv[1:])).strip()
    result = {**bm.record("torch_compile", body, device, command, a.quick), "seconds": time.time() - t0}
    out = Path(a.out) if a.out else HERE / "results" / bm.device_tag(device)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{a.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['device']}, {result['date']}: {command}")
    for c in body["compile"]:
        host = (f" (host {c['eager_host_ms']:.3f} / {c['compiled_host_ms']:.3f} ms)"
                if "eager_host_ms" in c else "")
        print(f"grid_sample model fwd+bwd, x {c['shape']['x']}: eager {c['eager_ms']:.3f} ms, "
              f"torch.compile {c['compiled_ms']:.3f} ms, compiled / eager {c['compiled_over_eager']:.3f}"
              + host + f"; with torch's F.grid_sample: eager {c['torch_eager_ms']:.3f} ms, compiled "
              f"{c['torch_compiled_ms']:.3f} ms, compiled / eager {c['torch_compiled_over_eager']:.3f}")
        if "cudagraphs_ms" in c:
            print(f"  mode='reduce-overhead' (CUDA graphs): {c['cudagraphs_ms']:.3f} ms, / eager "
                  f"{c['cudagraphs_over_eager']:.3f}; torch's F.grid_sample {c['torch_cudagraphs_ms']:.3f} ms, "
                  f"/ eager {c['torch_cudagraphs_over_eager']:.3f}")
    if a.baseline:
        o = body["overhead"]
        print(f"per-call overhead: this {o['this_us']:.2f} us, baseline {o['baseline_us']:.2f} us, "
              f"ratio (each over torch add_) {o['this_over_baseline']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

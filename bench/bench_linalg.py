"""kk.ops.cholesky and kk.ops.qr against torch.linalg (cuSOLVER / MAGMA on a GPU, LAPACK on the
CPU), interleaved in one process, on batches of small matrices and on large ones.

    PYTHONPATH=src python bench/bench_linalg.py [--device cuda|cpu] [--ops cholesky qr] [--quick]
                                                [--out DIR]

Each case is first checked against float64 (relative error of L, of Q R against A). On a GPU the
contenders take turns in rounds timed with CUDA events (kernelkit.benchmarks.interleaved_ms); on
the CPU each round times one call of each (best of the rounds). Writes linalg.json into DIR
(default bench/results/<device>/) and prints a table: ms a call and torch's time over ours.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

import kernelkit as kk  # noqa: E402
from kernelkit.benchmarks import device_tag, interleaved_ms, record, relative_error  # noqa: E402

# (batch, n) / (batch, m, n): many small matrices, then fewer large ones
CHOLESKY = {"cuda": [(16384, 16), (4096, 32), (2048, 64), (512, 128), (64, 512), (1, 1024), (1, 4096)],
            "cpu": [(4096, 16), (512, 64), (16, 256), (1, 1024)]}
QR = {"cuda": [(16384, 16, 16), (4096, 32, 32), (1024, 64, 64), (256, 128, 128), (256, 512, 32),
               (16, 512, 512), (1, 4096, 4096)],
      "cpu": [(4096, 16, 16), (256, 64, 64), (16, 256, 32), (4, 256, 256), (1, 1024, 1024)]}
DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _spd(batch: int, n: int, dtype, device) -> torch.Tensor:
    x = torch.randn(batch, n, n, dtype=torch.float64, device=device)
    return (x @ x.mT / n + torch.eye(n, dtype=torch.float64, device=device)).to(dtype)


def _time(fns: dict, device: torch.device, rounds: int) -> dict:
    if device.type == "cuda":
        return interleaved_ms(fns, rounds, 3)
    for f in fns.values():
        f()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return {name: min(t) for name, t in times.items()}


def _case(op: str, shape, dtype, device, rounds: int) -> dict:
    torch.manual_seed(0)
    if op == "cholesky":
        a = _spd(shape[0], shape[1], dtype, device)
        err = relative_error(kk.ops.cholesky(a), torch.linalg.cholesky(a.double()))
        fns = {"kernelkit": lambda: kk.ops.cholesky(a), "torch": lambda: torch.linalg.cholesky(a)}
    else:
        a = torch.randn(*shape, dtype=dtype, device=device)
        q, r = kk.ops.qr(a)
        err = relative_error(q.double() @ r.double(), a)
        fns = {"kernelkit": lambda: kk.ops.qr(a), "torch": lambda: torch.linalg.qr(a)}
    ms = _time(fns, device, rounds)
    return {"op": op, "shape": list(shape), "dtype": str(dtype).removeprefix("torch."),
            "relative_error": err, "kernelkit_ms": ms["kernelkit"], "torch_ms": ms["torch"],
            "speedup": ms["torch"] / ms["kernelkit"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"], choices=list(DTYPES))
    parser.add_argument("--quick", action="store_true", help="the first two cases of each op, 3 rounds")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--ops", nargs="+", default=["cholesky", "qr"], choices=["cholesky", "qr"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    kind = "cuda" if device.type == "cuda" else "cpu"
    rounds = 3 if args.quick else args.rounds
    cases = [(op, s) for op, shapes in (("cholesky", CHOLESKY), ("qr", QR)) if op in args.ops
             for s in shapes[kind]]
    if args.quick:
        cases = [c for op in args.ops for c in [c for c in cases if c[0] == op][:2]]
    results = []
    for op, shape in cases:
        for name in args.dtypes:
            r = _case(op, shape, DTYPES[name], device, rounds)
            results.append(r)
            print(f"{op:9s} {'x'.join(map(str, shape)):>14s} {name:8s} kernelkit {r['kernelkit_ms']:9.3f} ms"
                  f"  torch {r['torch_ms']:9.3f} ms  x{r['speedup']:6.2f}  (error {r['relative_error']:.1e})",
                  flush=True)
    out = args.out or Path(__file__).resolve().parent / "results" / device_tag(device)
    out.mkdir(parents=True, exist_ok=True)
    body = {"rounds": rounds, "cases": results,
            "geomean_speedup": statistics.geometric_mean(r["speedup"] for r in results)}
    path = out / "linalg.json"
    path.write_text(json.dumps(record("linalg", body, device, " ".join(["python", *sys.argv]), args.quick),
                               indent=1))
    print(f"geometric mean of torch's time over kernelkit's: {body['geomean_speedup']:.2f}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

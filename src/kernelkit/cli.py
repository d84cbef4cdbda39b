"""The `kernelkit` command: demo | cache."""

from __future__ import annotations

import argparse
import sys
import time


def _best_device():
    import torch
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _time(fn, device, repeat: int) -> float:
    """Median seconds per call, synchronising the device around each timed call."""
    import torch
    fn()  # warm up: compile, load, allocate
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def demo(args) -> int:
    import torch

    from .ops import exp, exp_strided, grid_sample_seed as grid_sample, grid_sample_vjp
    from .ops.grid_sample import grid_sample_reference

    device = torch.device(args.device) if args.device else _best_device()
    gpu = device.type == "cuda"
    # The seed's grid_sample shape on a GPU; 1/16 of its batch x grid size on the CPU.
    B, H, W, C, gH, gW = (8, 1024, 1024, 64, 256, 256) if gpu else (2, 256, 256, 64, 128, 128)
    n = 1 << 24 if gpu else 1 << 22
    repeat = 20 if gpu else 5
    torch.manual_seed(0)

    a = torch.randn(n, device=device)
    a_strided = torch.randn(2 * n // 1024, 1024, device=device)[::2]
    storage = torch.randn(B + 2, H, W, C, device=device)
    x = storage[1:-1]  # margin: the seed's forward reads up to a row outside x before masking
    grid = torch.rand(B, gH, gW, 2, device=device) * 2 - 1
    cot = torch.randn(B, gH, gW, C, device=device)

    def ref_vjp():
        xr, gr = x.detach().requires_grad_(), grid.detach().requires_grad_()
        grid_sample_reference(xr, gr).backward(cot)
        return xr.grad, gr.grad

    def vjp_error():
        ours = grid_sample_vjp(x, grid, cot)
        return max(_relerr(o, r) for o, r in zip(ours, ref_vjp()))

    rows = [
        ("exp", f"{n}", lambda: exp(a), lambda: torch.exp(a), lambda: _relerr(exp(a), torch.exp(a))),
        ("exp (strided view)", f"{tuple(a_strided.shape)}", lambda: exp_strided(a_strided),
         lambda: torch.exp(a_strided), lambda: _relerr(exp_strided(a_strided), torch.exp(a_strided))),
        ("grid_sample", f"x {B}x{H}x{W}x{C}, grid {B}x{gH}x{gW}x2", lambda: grid_sample(x, grid),
         lambda: grid_sample_reference(x, grid),
         lambda: _relerr(grid_sample(x, grid), grid_sample_reference(x, grid))),
        ("grid_sample VJP", "same", lambda: grid_sample_vjp(x, grid, cot), ref_vjp, vjp_error),
    ]
    print(f"kernelkit demo on {_device_name(device)} (float32; reference: torch)")
    header = f"{'op':<20} {'shapes':<36} {'rel. error':>10} {'ours':>10} {'torch':>10} {'speed-up':>9}"
    print(header)
    print("-" * len(header))
    failed = False
    for op, shapes, ours, ref, err in rows:
        e = err()
        t_ours, t_ref = _time(ours, device, repeat), _time(ref, device, repeat)
        ok = e < 1e-4
        failed |= not ok
        print(f"{op:<20} {shapes:<36} {e:>10.1e} {_ms(t_ours):>10} {_ms(t_ref):>10} "
              f"{t_ref / t_ours:>8.1f}x{'' if ok else '  MISMATCH'}")
    return 1 if failed else 0


def _relerr(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def _ms(t: float) -> str:
    return f"{t * 1e3:.3f} ms"


def _device_name(device) -> str:
    import platform

    import torch
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def cache(args) -> int:
    from .cache import CACHE, cache_dir
    if args.action == "clear":
        print(f"removed {CACHE.clear()} files from {cache_dir()}")
    else:
        entries = CACHE.entries()
        size = sum(p.stat().st_size for p in entries)
        print(f"{cache_dir()}: {len(entries)} files, {size / 1e6:.1f} MB")
        if args.action == "list":
            for p in entries:
                print(f"  {p.relative_to(cache_dir())}  {p.stat().st_size} B")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kernelkit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("demo", help="run the seeds' kernels, check them, time them against torch")
    p.add_argument("--device", help="cpu or cuda[:N] (default: the GPU if there is one)")
    p.set_defaults(func=demo)
    p = sub.add_parser("cache", help="show, list or clear the compile cache")
    p.add_argument("action", nargs="?", choices=["info", "list", "clear"], default="info")
    p.set_defaults(func=cache)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())

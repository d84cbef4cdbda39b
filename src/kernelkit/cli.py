"""The `kernelkit` command.

    kernelkit demo    run seven example kernels on the best device, check them, time them against torch
    kernelkit bench   the benchmark suite behind BENCHMARKS.md: JSON, Markdown and charts
    kernelkit doctor  what this machine offers (GPUs, driver, NVRTC, headers, C++ compiler, cache)
    kernelkit cache   show, list or clear the compile cache
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path


def _device(name: str | None, command: str):
    """The device asked for (else the GPU if there is one, else the CPU); None if unusable."""
    import torch
    if not name:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        from .backends import cuda
        try:
            cuda._nvrtc()
        except cuda.CudaUnavailable as e:
            print(f"kernelkit {command}: {e}; running on the CPU", file=sys.stderr)
            return torch.device("cpu")
        return torch.device("cuda")
    try:
        device = torch.device(name)
    except RuntimeError:
        print(f"kernelkit {command}: unknown device {name!r}; use cpu or cuda[:N]", file=sys.stderr)
        return None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print(f"kernelkit {command}: no CUDA device here (torch.cuda.is_available() is False); "
                  "use --device cpu, and see `kernelkit doctor`", file=sys.stderr)
            return None
        if device.index is not None and device.index >= torch.cuda.device_count():
            print(f"kernelkit {command}: {device} does not exist ({torch.cuda.device_count()} GPUs)",
                  file=sys.stderr)
            return None
        return torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    if device.type != "cpu":
        print(f"kernelkit {command}: kernelkit runs on cpu and cuda[:N], not {device}", file=sys.stderr)
        return None
    return device


def _on(device):
    """The device's context for a CUDA device (current stream, events), else nothing."""
    import contextlib

    import torch
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


# --- demo --------------------------------------------------------------------------------------

def _demo_sizes(device, small: bool) -> dict:
    """The seed's sizes on a GPU; smaller on the CPU; tiny with --small."""
    if small:
        return dict(n=1 << 16, grid_sample=(1, 64, 64, 64, 32, 32), matmul=(1, 128), mxfp8=128,
                    attention=(1, 2, 64, 64), repeat=2)
    if device.type == "cuda":
        return dict(n=1 << 24, grid_sample=(8, 1024, 1024, 64, 256, 256), matmul=(8, 1024), mxfp8=8192,
                    attention=(4, 16, 4096, 128), repeat=20)
    # 1/16 of the seed's x and of its grid; exp over 4M
    return dict(n=1 << 22, grid_sample=(2, 256, 256, 64, 128, 128), matmul=(2, 512), mxfp8=256,
                attention=(1, 4, 256, 64), repeat=5)


# A bfloat16 result carries 8 significant bits: its relative error is ~2^-9 at best.
BF16_TOLERANCE = 1e-2


def _demo_cases(device, sizes: dict) -> list[tuple]:
    """(op, shapes, ours, reference, error, reference's name[, tolerance floor]) for each of the
    seeds' examples."""
    import torch

    from .benchmarks import relative_error
    from .ops import (dequantize_mxfp8, exp, exp_strided, flash_attention, flash_attention_reference,
                      grid_sample_seed, grid_sample_vjp, matmul_add_relu, mxfp8_matmul, quantize_mxfp8)
    from .ops.grid_sample import grid_sample_reference

    torch.manual_seed(0)
    n = sizes["n"]
    a = torch.randn(n, device=device)
    a_strided = torch.randn(2 * n // 1024, 1024, device=device)[::2]
    B, H, W, C, gH, gW = sizes["grid_sample"]
    storage = torch.randn(B + 2, H, W, C, device=device)
    x = storage[1:-1]  # margin: the seed's forward reads up to a row outside x before masking
    grid = torch.rand(B, gH, gW, 2, device=device) * 2 - 1
    cot = torch.randn(B, gH, gW, C, device=device)
    mb, mn = sizes["matmul"]
    lhs, rhs, bias = (torch.randn(mb, mn, mn, device=device) for _ in range(3))

    def ref_vjp():
        xr, gr = x.detach().requires_grad_(), grid.detach().requires_grad_()
        return torch.autograd.grad(grid_sample_reference(xr, gr), (xr, gr), cot)

    def vjp_error():
        return max(relative_error(o, r) for o, r in zip(grid_sample_vjp(x, grid, cot), ref_vjp()))

    def matmul_ref():
        return torch.relu(torch.baddbmm(bias, lhs, rhs))

    # MXFP8 operands from bf16 matrices; the reference multiplies the bf16 matrices
    mx = sizes["mxfp8"]
    wide = torch.randn(mx, mx, device=device, dtype=torch.bfloat16), torch.randn(mx, mx, device=device, dtype=torch.bfloat16)
    (qa, sa), (qb, sb) = quantize_mxfp8(wide[0]), quantize_mxfp8(wide[1])

    def mxfp8_error():
        exact = dequantize_mxfp8(qa, sa).double() @ dequantize_mxfp8(qb, sb).double().T
        return relative_error(mxfp8_matmul(qa, sa, qb, sb), exact)

    # attention in bf16 on a GPU (float32 on the CPU, which has no bf16 tensor cores to stand in for)
    aB, aH, aS, aD = sizes["attention"]
    adt = torch.bfloat16 if device.type == "cuda" else torch.float32
    q, k, v = (torch.randn(aB, aH, aS, aD, device=device, dtype=adt) for _ in range(3))

    def attention_error():
        return relative_error(flash_attention(q, k, v, causal=True),
                              flash_attention_reference(q.double(), k.double(), v.double(), causal=True))

    return [
        ("exp", f"{n} ({_count(n)})", lambda: exp(a), lambda: torch.exp(a),
         lambda: relative_error(exp(a), torch.exp(a.double())), "torch.exp"),
        ("exp (strided view)", "x".join(map(str, a_strided.shape)) + " of every 2nd row",
         lambda: exp_strided(a_strided), lambda: torch.exp(a_strided),
         lambda: relative_error(exp_strided(a_strided), torch.exp(a_strided.double())), "torch.exp"),
        ("grid_sample", f"x {B}x{H}x{W}x{C}, grid {B}x{gH}x{gW}x2", lambda: grid_sample_seed(x, grid),
         lambda: grid_sample_reference(x, grid),
         lambda: relative_error(grid_sample_seed(x, grid), grid_sample_reference(x, grid)),
         "F.grid_sample (NHWC view)"),
        ("grid_sample VJP", "same", lambda: grid_sample_vjp(x, grid, cot), ref_vjp, vjp_error,
         "F.grid_sample forward + backward"),
        ("matmul_add_relu", f"{mb} x {mn}x{mn} @ {mn}x{mn}", lambda: matmul_add_relu(lhs, rhs, bias),
         matmul_ref,
         lambda: relative_error(matmul_add_relu(lhs, rhs, bias),
                                torch.relu(torch.baddbmm(bias.double(), lhs.double(), rhs.double()))),
         "torch.relu(torch.baddbmm)"),
        ("mxfp8_matmul", f"{mx}x{mx} @ {mx}x{mx}^T, MXFP8 -> bf16", lambda: mxfp8_matmul(qa, sa, qb, sb),
         lambda: wide[0] @ wide[1].T, mxfp8_error, "torch.matmul of the bf16 matrices", BF16_TOLERANCE),
        ("flash_attention", f"{aB}x{aH}x{aS}x{aD} {str(adt)[6:]}, causal", lambda: flash_attention(q, k, v, causal=True),
         lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), attention_error,
         "F.scaled_dot_product_attention", BF16_TOLERANCE if adt == torch.bfloat16 else None),
    ]


def _count(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def demo(args) -> int:
    from . import benchmarks

    device = _device(args.device, "demo")
    if device is None:
        return 2
    if args.plot and not benchmarks.have_matplotlib():
        print("kernelkit demo: --plot needs matplotlib (pip install matplotlib, or pip install "
              "'kernelkit[plot]')", file=sys.stderr)
        return 2
    sizes = _demo_sizes(device, args.small)
    repeat = args.repeat or sizes["repeat"]
    stat = f"CUDA-event median of {repeat}" if device.type == "cuda" else f"best of {repeat}"
    print(f"kernelkit demo on {benchmarks.device_name(device)}: float32 unless the shapes say, times are "
          f"the {stat} after a warm-up call; error is ||out - ref|| / ||ref||", flush=True)
    header = (f"{'op':<19} {'device':<7} {'shapes':<36} {'rel. error':>10} {'ours':>11} "
              f"{'reference':>11} {'speed-up':>9}")
    print(header)
    print("-" * len(header), flush=True)
    failed, plotted = False, []
    try:
        with _on(device):
            cases = _demo_cases(device, sizes)
    except Exception as e:  # noqa: BLE001 - e.g. out of memory
        print(f"could not set up the inputs: {type(e).__name__}: {e}")
        return 1
    dev = str(device)
    for op, shapes, ours, ref, error, ref_name, *floor in cases:
        try:
            with _on(device):  # CUDA events on the device's own stream
                err = error()
                t_ours = benchmarks.time_ms(ours, device, repeat)
                t_ref = benchmarks.time_ms(ref, device, repeat)
        except Exception as e:  # noqa: BLE001 - report the op, go on with the others
            failed = True
            message = str(e).strip().splitlines()[0] if str(e).strip() else ""
            print(f"{op:<19} {dev:<7} {shapes:<36} FAILED: {type(e).__name__}: {message}", flush=True)
            continue
        tolerance = max(args.tolerance, *floor) if floor and floor[0] else args.tolerance
        ok = err < tolerance
        failed |= not ok
        plotted.append((op, t_ours, t_ref))
        print(f"{op:<19} {dev:<7} {shapes:<36} {err:>10.1e} {t_ours:>8.3f} ms {t_ref:>8.3f} ms "
              f"{t_ref / t_ours:>8.2f}x{'' if ok else '  MISMATCH (tolerance %.0e)' % tolerance}",
              flush=True)
    print("references: " + "; ".join(f"{c[0]}: {c[5]}" for c in cases))
    print("speed-up: the reference's time over kernelkit's" + (
        "" if device.type == "cuda" else "; on the CPU, below 1 is expected: the CPU backend runs a "
        "kernel body thread by thread as C++ (to develop and test GPU kernels without a GPU), "
        "against torch's vectorised CPU code"))
    if args.plot and plotted:
        try:
            benchmarks.bar_chart(args.plot, f"kernelkit demo\n{benchmarks.device_name(device)}", "ms",
                                 [p[0] for p in plotted],
                                 {"kernelkit": [p[1] for p in plotted], "torch": [p[2] for p in plotted]})
            print(f"chart: {args.plot}")
        except Exception as e:  # noqa: BLE001 - the table is the result; the chart is a picture of it
            print(f"no chart: {type(e).__name__}: {e}")
    print("all checks passed" if not failed else "some checks FAILED")
    return 1 if failed else 0


# --- bench -------------------------------------------------------------------------------------

def bench(args) -> int:
    from . import benchmarks

    if args.markdown:
        try:
            results = benchmarks.load(args.markdown)
        except (OSError, ValueError) as e:
            print(f"kernelkit bench --markdown: {e}", file=sys.stderr)
            return 2
        if not results:
            print("kernelkit bench --markdown: no benchmark results in " + ", ".join(args.markdown),
                  file=sys.stderr)
            return 2
        print(benchmarks.markdown(results), end="")
        return 0

    device = _device(args.device, "bench")
    if device is None:
        return 2
    kinds = args.only or (benchmarks.GPU_SUITE if device.type == "cuda" else benchmarks.CPU_SUITE)
    out = Path(args.out) if args.out else benchmarks.results_dir(device)
    command = shlex.join(["kernelkit", *args.argv])
    progress = benchmarks.Progress(sum(benchmarks.STEPS[k] for k in kinds))
    results, errors = {}, {}
    try:
        for kind in kinds:
            try:
                results[kind] = benchmarks.run(kind, device, args.quick, command, progress.tick)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - the other benchmarks still run
                import traceback
                errors[kind] = f"{type(e).__name__}: {e}"
                progress.close()
                traceback.print_exc()
    finally:
        progress.close()
    written, notes = benchmarks.write_results(results, out, charts=not args.no_charts)
    if results:
        print(benchmarks.markdown([(r, str(out / f"{k}.json")) for k, r in results.items()]))
    if written:
        print("wrote " + ", ".join(str(p) for p in written))
    for note in notes:
        print(f"note: {note}")
    for kind, err in errors.items():
        print(f"FAILED {kind}: {err}")
    return 1 if errors else 0


# --- doctor ------------------------------------------------------------------------------------

def doctor(args) -> int:
    from .doctor import main
    return main(json_output=args.json, run=args.check)


# --- cache -------------------------------------------------------------------------------------

def _size(n: float) -> str:
    """Binary units, as KERNELKIT_CACHE_MAX counts."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _entry_name(src: Path | None) -> str:
    """The kernel a cache entry holds, from its saved source."""
    import re
    try:
        text = src.read_text(errors="replace") if src else ""
    except OSError:
        return "?"
    if "kk_rt_abi_version" in text and "custom_kernel_" not in text:
        return "(kernelkit CPU runtime)"
    if "PyInit__fastcall" in text:
        return "(kernelkit fast call path)"
    if "kk_fingerprint" in text:
        return "(kernelkit fast call path: libtorch helper)"
    m = re.search(r"custom_kernel_(\w+)", text)
    return m.group(1) if m else "?"


def cache(args) -> int:
    from . import __version__
    from . import cache as cc

    store = cc.disk()
    if store is None:
        print(f"kernelkit cache: {cc.no_disk_reason()}", file=sys.stderr)
        return 1
    root = store.root
    if args.action == "clear":
        removed, size = cc.CACHE.clear(stale=args.stale)
        what = "other kernelkit versions' " if args.stale else ""
        print(f"removed {removed} {what}files ({_size(size)}) from {root}")
        return 0
    try:
        limit = cc.max_bytes()
    except ValueError as e:
        print(f"kernelkit cache: {e}", file=sys.stderr)
        return 2
    usage = cc.usage(root)
    files, size = sum(u[1] for u in usage), sum(u[2] for u in usage)
    print(f"{root}: {files} files, {_size(size)} (limit {_size(limit) if limit else 'none'}"
          f"{', KERNELKIT_CACHE_MAX' if os.environ.get('KERNELKIT_CACHE_MAX') else ''})"
          + (f"; in place of {store.refused}" if store.refused else ""))
    for version, n, nbytes in usage:
        mark = " (this kernelkit)" if version == __version__ else " (another kernelkit version)"
        print(f"  {version}/{mark}: {n} file{'s' if n != 1 else ''}, {_size(nbytes)}")
    if args.action == "list":
        for e in cc.entries(root):
            target = {".cubin": "cuda", ".so": "cpu"}.get(e.path.suffix, "?")
            src = next((f for f in e.files if f.name.endswith(".src")), None)
            rel = e.path.relative_to(root)
            print(f"  {rel.parent}/{rel.name[:16]}…  {target:<4} {_size(e.size):>9}  {_entry_name(src)}")
    return 0


# --- the command line ------------------------------------------------------------------------

def parser() -> argparse.ArgumentParser:
    from . import __version__
    from .benchmarks import KINDS
    ap = argparse.ArgumentParser(prog="kernelkit", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"kernelkit {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="{demo,bench,doctor,cache,check}")

    p = sub.add_parser("demo", help="run seven example kernels, check them, time them against torch",
                       description="Run seven example kernels (exp, exp of a strided view, grid_sample "
                       "and its VJP, matmul_add_relu, mxfp8_matmul, flash_attention) on the best device "
                       "present, check each against "
                       "torch (relative error ||out - ref|| / ||ref||) and time both. Exits 1 if a "
                       "check fails.")
    p.add_argument("--device", help="cpu or cuda[:N] (default: the GPU if there is one, else the CPU)")
    p.add_argument("--small", action="store_true", help="tiny shapes: a smoke test in seconds")
    p.add_argument("--repeat", type=int, help="timed calls per op (default: 20 on a GPU, 5 on the CPU)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="largest relative error that passes "
                   "(default 1e-4; at least 1e-2 for bfloat16 results)")
    p.add_argument("--plot", metavar="FILE.png", help="draw the times (ours and the reference's, log "
                   "scale) into FILE.png (needs matplotlib)")
    p.set_defaults(func=demo)

    p = sub.add_parser("bench", help="run the benchmark suite: JSON, Markdown and charts",
                       description="Run the benchmarks behind BENCHMARKS.md on one device (a GPU: "
                       "grid_sample against a hand-written CUDA port, kernelkit.ops against torch, "
                       "per-call overhead; the CPU: the CPU backend against torch, compile times, "
                       "per-call overhead; both: checked calls against plain ones). Writes <benchmark>.json, results.md and <benchmark>.png "
                       "(with matplotlib) into --out. With --markdown, prints the Markdown tables of "
                       "recorded JSON results instead, running nothing.")
    p.add_argument("--device", help="cpu or cuda[:N] (default: the GPU if there is one)")
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repeats")
    p.add_argument("--only", nargs="+", choices=KINDS, metavar="NAME",
                   help=f"run only these benchmarks ({', '.join(KINDS)})")
    p.add_argument("--out", metavar="DIR", help="where to write (default: "
                   "$XDG_DATA_HOME/kernelkit/bench/<device>/, else ~/.local/share/kernelkit/bench/<device>/)")
    p.add_argument("--no-charts", action="store_true", help="write no PNG charts")
    p.add_argument("--markdown", nargs="+", metavar="JSON",
                   help="print the Markdown tables of these result files (or directories of them)")
    p.set_defaults(func=bench)

    p = sub.add_parser("doctor", help="what this machine offers: GPUs, driver, NVRTC, CUDA headers, "
                       "C++ compiler, cache", description="Report the GPUs, the NVIDIA driver, NVRTC, "
                       "CUDA's headers, the C++ compiler of the CPU backend and the compile cache, each "
                       "with the fix for a missing piece. Exits 1 when no backend can run kernels, or "
                       "when a --check fails (its message is the error, the compiler's included).")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--check", action="store_true", help="also compile and run a small kernel on every "
                   "device")
    p.set_defaults(func=doctor)

    p = sub.add_parser("cache", help="show, list or clear the compile cache",
                       description="The compile cache (KERNELKIT_CACHE_DIR, default ~/.cache/kernelkit; "
                       "capped at KERNELKIT_CACHE_MAX bytes, default 1G): one directory per kernelkit "
                       "version, each marked by a CACHEDIR.TAG file. Only kernelkit's entries in "
                       "marked directories are ever removed.")
    p.add_argument("action", nargs="?", choices=["info", "list", "clear"], default="info",
                   help="info (default): sizes per version directory; list: every entry; clear: "
                   "remove kernelkit's entries")
    p.add_argument("--stale", action="store_true", help="with clear: only other kernelkit versions' "
                   "entries (their directories go too)")
    p.set_defaults(func=cache)

    p = sub.add_parser("check", help="run a script, compiling each kernel it builds for GPU "
                       "architectures (no GPU needed)",
                       description="kernelkit check [--arch sm_XX]... FILE.py [ARGS...]: run FILE.py "
                       "as `python FILE.py ARGS` would (options before FILE.py); every "
                       "kernel it builds is also compiled with NVRTC for each --arch, which needs no "
                       "GPU: a CPU-only CI proves its kernels compile for the GPUs it ships to. Exits "
                       "1 at the first kernel that does not compile (the compiler's message on your "
                       "lines), else with the script's status.")
    p.add_argument("file", metavar="FILE.py")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    p.add_argument("--arch", action="append", metavar="sm_XX",
                   help="an architecture to compile for (repeatable; default sm_90)")
    p.set_defaults(func=check)
    return ap


def check(args) -> int:
    """`kernelkit check FILE.py`: the script runs; its kernels are compiled for --arch too."""
    import runpy

    from . import cross
    from .errors import CompileError
    archs = args.arch or ["sm_90"]
    cross.set_check_archs(archs)
    argv, sys.argv = sys.argv, [args.file, *args.args]
    try:
        runpy.run_path(args.file, run_name="__main__")
        status = 0
    except CompileError as e:
        print(f"kernelkit check: {e}", file=sys.stderr)
        return 1
    except SystemExit as e:
        status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
        cross.set_check_archs(None)
    names = sorted({name for name, _ in cross.compiled})
    print(f"kernelkit check: {len(names)} kernel(s) compiled for {', '.join(archs)}: "
          f"{', '.join(names) or 'none'}", file=sys.stderr)
    return status


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kernelkit cache list | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())

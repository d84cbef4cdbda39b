"""What every suite shares: the device and where its results go, a result's record (date,
device, versions, command), the timers and the relative error."""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from pathlib import Path

import torch


# --- devices, versions, records --------------------------------------------------------------

def best_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def results_dir(device: torch.device) -> Path:
    """Where `kernelkit bench` writes without --out: the user's data directory, per device."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "kernelkit" / "bench" / device_tag(device)


def device_tag(device: torch.device) -> str:
    """A short name for result directories: "h100", "cpu-x86_64-2core"."""
    if device.type == "cuda":
        words = [w for w in torch.cuda.get_device_name(device).split() if w.upper() != "NVIDIA"]
        picked = []
        for w in words:
            picked.append(w)
            if any(c.isdigit() for c in w):
                break
        return re.sub(r"[^a-z0-9]+", "-", "-".join(picked).lower()).strip("-") or "gpu"
    return f"cpu-{platform.machine()}-{os.cpu_count()}core"


def record(kind: str, body: dict, device: torch.device, command: str, quick: bool = False) -> dict:
    """A result: what was measured, and where, when, with what, by which command."""
    from ..doctor import versions
    return {"benchmark": kind, "device": device_name(device), "date": time.strftime("%Y-%m-%d"),
            "command": command, "quick": quick, "torch": torch.__version__,
            "versions": versions(device), **body}


# --- timing ------------------------------------------------------------------------------------

def cuda_median_ms(fn, repeat: int = 50, warmup: int = 5) -> float:
    """Median of CUDA-event times on the current stream."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return times[len(times) // 2]


def interleaved_ms(fns: dict, rounds: int, iters) -> dict:
    """Median ms a call of each of `fns` (name -> fn), the fns taking turns: each round times
    `iters` calls of each (an int, or a dict by name) with CUDA events. A sleep kernel keeps the
    GPU busy while a round's first calls are enqueued, so that a round times the GPU's work (and
    the host only where it cannot keep up), not its first call's host latency after the
    synchronisation before it (as triton's do_bench hides it behind its cache flush): on the
    H100 host that latency was most of the 7% between matmul_add_relu and its bare kernel launch
    in 10-call rounds of 0.24 ms calls. As run(), in the steady state."""
    from .. import fastcall

    fastcall.module(block=True)
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    times = {n: [] for n in fns}
    for _ in range(rounds):
        for n, f in fns.items():
            count = iters[n] if isinstance(iters, dict) else iters
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)  # ~0.5 ms at the H100's clocks
            start.record()
            for _ in range(count):
                f()
            end.record()
            end.synchronize()
            times[n].append(start.elapsed_time(end) / count)
    return {n: statistics.median(t) for n, t in times.items()}


def cpu_best_ms(fn, repeat: int = 3, warmup: int = 1) -> float:
    """Best host time of `repeat` calls (the CPU's noise only ever adds)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def time_ms(fn, device: torch.device, repeat: int, warmup: int = 1) -> float:
    """CUDA-event median on a GPU, best host time on the CPU."""
    if device.type == "cuda":
        return cuda_median_ms(fn, repeat=repeat, warmup=warmup)
    return cpu_best_ms(fn, repeat=repeat, warmup=warmup)


def relative_error(out, ref) -> float:
    """‖out − ref‖ / ‖ref‖, in float64."""
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))


def per_call_us(fn, n: int, sync, repeat: int = 5) -> float:
    """Best mean host time per call over `repeat` loops of n calls (no sync inside a loop)."""
    for _ in range(100):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        sync()
        best = min(best, (t1 - t0) / n)
    return best * 1e6

"""The suite: its benchmarks by name (`KINDS`, `RUNNERS`), `run`, which times one as a result
record, and `script_main`, what each bench/bench_<kind>.py runs."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

from .cpu import cpu_figures
from .debug import debug_figures
from .grid_sample import grid_sample_figures
from .ops import ops_figures
from .overhead import overhead_figures
from .progress import Progress, Tick, _no_tick
from .timing import best_device, record

GPU_SUITE = ("grid_sample", "ops", "overhead", "debug")
CPU_SUITE = ("cpu", "overhead", "debug")
KINDS = ("grid_sample", "ops", "cpu", "overhead", "debug")
STEPS = {"grid_sample": 8, "ops": 15, "cpu": 11, "overhead": 3, "debug": 3}  # progress ticks of each
SCRIPTS = {"grid_sample": "bench_grid_sample.py", "ops": "bench_ops.py", "cpu": "bench_cpu.py",
           "overhead": "bench_overhead.py", "debug": "bench_debug.py"}

RUNNERS = {"grid_sample": grid_sample_figures, "ops": ops_figures, "cpu": cpu_figures,
           "overhead": overhead_figures, "debug": debug_figures}


def run(kind: str, device: torch.device, quick: bool, command: str, tick: Tick = _no_tick) -> dict:
    """One benchmark, as a result record, timed in the steady state: the C fast call path built
    (once per machine, in a background thread that the first calls do not wait for) and loaded.
    On a fresh machine a grid_sample forward + backward took ~1.3 ms of host time until then,
    0.5-0.7 ms after (H100 host)."""
    from .. import fastcall

    fastcall.module(block=True)
    if kind == "cpu":
        device = torch.device("cpu")
    if device.type == "cuda":
        with torch.cuda.device(device):
            body = RUNNERS[kind](device, quick, tick)
    else:
        body = RUNNERS[kind](device, quick, tick)
    return record(kind, body, device, command, quick)


def script_main(kind: str, argv=None) -> int:
    """What each bench/bench_<kind>.py runs: the benchmark, its JSON on stdout and in --out."""
    ap = argparse.ArgumentParser(description=(RUNNERS[kind].__doc__ or "").strip())
    ap.add_argument("--out", help="write the JSON result here too")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    if kind in ("overhead", "ops", "grid_sample", "debug"):
        ap.add_argument("--device", help="cuda[:N] or cpu (default: the GPU if there is one)")
    args = ap.parse_args(argv)
    device = torch.device(getattr(args, "device", None) or ("cpu" if kind == "cpu" else best_device()))
    argv = sys.argv[1:] if argv is None else list(argv)
    command = shlex.join(["python", f"bench/{SCRIPTS[kind]}", *argv])
    progress = Progress(STEPS[kind])
    try:
        result = run(kind, device, args.quick, command, progress.tick)
    finally:
        progress.close()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0

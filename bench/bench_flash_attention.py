"""kk.ops.flash_attention beside torch's scaled_dot_product_attention on its cuDNN and flash
(FlashAttention-2) backends, in one process, interleaved: issue 18's speed acceptance.

    PYTHONPATH=src python bench/bench_flash_attention.py                 # the issue's cases
    PYTHONPATH=src python bench/bench_flash_attention.py --cases 4,16,4096,128 --modes fwd

A case is B,H,S,D (bf16, (B, H, S, D) tensors), each run causal and not. TFLOP/s counts
4 * B * H * Sq * Sk * D for the forward (halved for causal) and 2.5 times that for the forward
and backward together (the same count for every contender: the ratios are what the issue asks
for). Each contender's output is compared with the cuDNN backend's (max abs difference); the
tests check kernelkit against float64. Writes the rows to --out as JSON and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import shutil
import subprocess
import tempfile

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernelkit as kk
from kernelkit import fastcall
from kernelkit.benchmarks import interleaved_ms

CASES = ["4,16,4096,128", "4,16,1024,128", "4,16,4096,64", "4,16,16384,128"]  # the longest last
BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def contenders(causal: bool) -> dict:
    F = torch.nn.functional

    def sdpa(backend):
        def f(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return f
    return {"kernelkit": lambda q, k, v: kk.ops.flash_attention(q, k, v, causal=causal),
            **{name: sdpa(b) for name, b in BACKENDS.items()}}


def time_interleaved(fns: dict, rounds: int, target_ms: float) -> dict:
    """Median ms a call of each fn, the fns taking turns; each round calls a fn as often as makes
    target_ms (at least once), so slow and fast contenders both fit the budget."""
    iters = {}
    for n, f in fns.items():
        f()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        f()
        end.record()
        end.synchronize()
        iters[n] = max(1, min(50, math.ceil(target_ms / max(start.elapsed_time(end), 1e-3))))
    return interleaved_ms(fns, rounds, iters)


def sass_counts() -> dict:
    """HGMMA / HMMA (mma.sync), shuffle, spill and MUFU counts in each kernel's SASS for bf16
    D=128 (forward_sm90, backward_sm90: Hopper's; the others: the talk-style kernels, which run
    where the Hopper ones do not apply), where cuobjdump is installed."""
    tool = shutil.which("cuobjdump")
    if tool is None:
        return {}
    import importlib
    fa = importlib.import_module("kernelkit.ops.flash_attention")
    meta = torch.empty(4, 16, 4096, 128, dtype=torch.bfloat16, device="meta")
    acc = torch.empty(4, 16, 4096, dtype=torch.float32, device="meta")
    out = {}
    for name, kernel, inputs, dts in (
            ("forward_sm90", fa._sm90_forward[128], [meta, meta, meta, 0.1],
             [torch.bfloat16, torch.float32, torch.int32]),
            ("backward_sm90", fa._sm90_backward, [meta, meta, meta, meta, acc, acc, acc.flatten(), 0.1],
             [torch.bfloat16, torch.bfloat16]),
            ("forward", fa._forward, [meta, meta, meta, 0.1, False], [torch.bfloat16, torch.float32]),
            ("dq", fa._dq, [meta, meta, meta, meta, meta, acc, acc, 0.1, False], [torch.bfloat16, torch.float32]),
            ("dkdv", fa._dkdv, [meta, meta, meta, meta, acc, acc, 0.1, False], [torch.bfloat16] * 2)):
        if name == "forward_sm90":
            launch = dict(template=[("T", torch.bfloat16), ("D", 128), ("BSHD", False), ("CAUSAL", False)],
                          grid=(384, 1, 1), threadgroup=(384, 1, 1), output_shapes=[meta.shape, acc.shape, (1,)])
        elif name == "backward_sm90":
            launch = dict(template=[("T", torch.bfloat16), ("D", 128), ("BSHD", False), ("CAUSAL", False)],
                          grid=(384, 1, 1), threadgroup=(384, 1, 1), output_shapes=[meta.shape, meta.shape])
        else:
            launch = dict(template=fa._template(torch.bfloat16, 128, "bhsd", name))
        binary = kk.compile_for(kernel, "sm_90", inputs=inputs, output_dtypes=dts, **launch).binary
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(binary)
            f.flush()
            sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        out[name] = {op: len(re.findall(rf"\b{op}\b", sass)) for op in ("HGMMA", "HMMA", "SHFL", "LDS", "STL", "MUFU")}
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", nargs="+", default=CASES, help="B,H,S,D")
    p.add_argument("--modes", nargs="+", default=["fwd", "fwd+bwd"])
    p.add_argument("--causal", nargs="+", default=["no", "yes"])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--target-ms", type=float, default=100.0)
    p.add_argument("--out", default="bench/results/h100/flash_attention.json")
    args = p.parse_args()
    fastcall.module(block=True)  # the steady state: kernelkit's C fast path built (once per machine) and loaded
    sass = sass_counts()
    print("sass (bf16, D=128):", sass, flush=True)
    rows = []
    for case in args.cases:
        B, H, S, D = map(int, case.split(","))
        for causal in (c == "yes" for c in args.causal):
            q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            dout = torch.randn_like(q)
            fwd_flop = 4 * B * H * S * S * D / (2 if causal else 1)
            fns = contenders(causal)
            outs = {}
            for n, f in fns.items():
                try:
                    outs[n] = f(q, k, v)
                except RuntimeError as e:  # a backend torch cannot run here
                    print(f"{n}: unavailable ({str(e).splitlines()[0]})")
            fns = {n: f for n, f in fns.items() if n in outs}
            ref = outs.get("cudnn", outs.get("flash"))
            errs = {n: (o.float() - ref.float()).abs().max().item() for n, o in outs.items()}
            del outs
            for mode in args.modes:
                if mode == "fwd":
                    timed = {n: (lambda f=f: f(q, k, v)) for n, f in fns.items()}
                    flop = fwd_flop
                else:
                    leaves = [x.detach().requires_grad_() for x in (q, k, v)]

                    def both(f, leaves=leaves):
                        torch.autograd.grad(f(*leaves), leaves, dout)
                    timed = {n: (lambda f=f: both(f)) for n, f in fns.items()}
                    flop = 2.5 * fwd_flop
                ms = time_interleaved(timed, args.rounds, args.target_ms)
                for n, t in ms.items():
                    rows.append(dict(B=B, H=H, S=S, D=D, causal=causal, mode=mode, contender=n, ms=t,
                                     tflops=flop / t / 1e9, of_cudnn=ms.get("cudnn", math.nan) / t,
                                     of_flash=ms.get("flash", math.nan) / t, max_abs_diff_vs_cudnn=errs[n]))
                report(rows, args, len(ms), sass)
            torch.cuda.empty_cache()


def report(rows, args, new, sass):
    """Prints the last `new` rows; writes them all to --out."""
    if len(rows) == new:
        print(f"{'B,H,S,D':>16} {'causal':>6} {'mode':>7} {'contender':>9} {'ms':>9} {'TFLOP/s':>8} "
              f"{'x cuDNN':>7} {'x flash':>7} {'|diff|':>8}")
    for r in rows[-new:]:
        print(f"{r['B']:>4},{r['H']:>3},{r['S']:>5},{r['D']:>3} {str(r['causal']):>6} {r['mode']:>7} "
              f"{r['contender']:>9} {r['ms']:9.3f} {r['tflops']:8.1f} {r['of_cudnn']:7.3f} {r['of_flash']:7.3f} "
              f"{r['max_abs_diff_vs_cudnn']:8.1e}", flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       cudnn=torch.backends.cudnn.version(),
                       date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       command="PYTHONPATH=src python bench/bench_flash_attention.py " +
                       " ".join(f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                                for k, v in vars(args).items()),
                       flop_count="forward 4*B*H*S*S*D (halved causal); forward+backward 2.5x the forward",
                       sass_bf16_d128=sass, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

"""Where flash attention's host time goes at a host-bound size, beside cuDNN's (issue 18, S = 1024).

    PYTHONPATH=src python bench/profile_attention_host.py [--case 4,16,1024,128] [--causal]

The GPU is held busy by a sleep kernel while each contender is called `--calls` times, so what is
timed is the enqueueing alone: host µs a call (median of rounds, contenders interleaved): the
forward and backward as bench_flash_attention.py times them (torch.autograd.grad), also with
autograd's backward on the calling thread (torch.autograd.set_multithreading_enabled(False)); a
plain autograd.Function over the op's forward and backward, and one that launches nothing
(autograd's own cost of a Python node); the forward alone; the op's glue and launches. Then
cProfile of kernelkit's forward + backward, its functions by their own time.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import statistics
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import kernelkit as kk
from kernelkit import autodiff, fastcall

fa = importlib.import_module("kernelkit.ops.flash_attention")  # (kk.ops.flash_attention is the op)


def host_us(fn, calls: int) -> float:
    """Host µs a call of fn, the GPU kept busy meanwhile (a sleep kernel queued first)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e8))  # ~0.1 s at the H200's clock: the calls queue behind it
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - t) / calls * 1e6
    torch.cuda.synchronize()
    return host


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", default="4,16,1024,128")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--rounds", type=int, default=9)
    a = p.parse_args()
    fastcall.torch_helper()
    B, H, S, D = map(int, a.case.split(","))
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
    F = torch.nn.functional

    leaves = [q, k, v]

    def kk_fwd_bwd():  # as bench_flash_attention times it
        torch.autograd.grad(kk.ops.flash_attention(q, k, v, causal=a.causal), leaves, g)

    def cudnn_fwd_bwd():  # the backend chosen once, outside the timed calls
        torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=a.causal), leaves, g)

    class Null(torch.autograd.Function):  # autograd's own cost of a Python node: no kernels
        @staticmethod
        def forward(ctx, q, k, v):
            return torch.empty_like(q)

        @staticmethod
        def backward(ctx, dout):
            return dout, dout, dout

    class Plain(torch.autograd.Function):  # the op's forward and backward, without custom_function
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = fa._attend(q, k, v, a.causal, None, "bhsd")
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, dout):
            return fa._gradients(*ctx.saved_tensors, dout, None, a.causal, None, "bhsd")

    qd, kd, vd = q.detach(), k.detach(), v.detach()
    o, lse = fa.flash_attention_forward(qd, kd, vd, causal=a.causal)
    scale = 1 / D ** 0.5
    def single_threaded(fn):  # autograd's backward on the calling thread, not CUDA's device thread
        def run():
            with torch.autograd.set_multithreading_enabled(False):
                fn()
        return run

    fns = {
        "kk fwd+bwd": kk_fwd_bwd,
        "cudnn fwd+bwd": cudnn_fwd_bwd,
        "kk fwd+bwd, single-threaded autograd": single_threaded(kk_fwd_bwd),
        "cudnn fwd+bwd, single-threaded autograd": single_threaded(cudnn_fwd_bwd),
        "plain autograd.Function fwd+bwd": lambda: torch.autograd.grad(Plain.apply(q, k, v), leaves, g),
        "null autograd.Function fwd+bwd": lambda: torch.autograd.grad(Null.apply(q, k, v), leaves, g),
        "kk forward (grad mode)": lambda: kk.ops.flash_attention(q, k, v, causal=a.causal),
        "cudnn forward (grad mode)": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=a.causal),
        "kk forward (no grad)": lambda: kk.ops.flash_attention(qd, kd, vd, causal=a.causal),
        "kk _sm90 (forward glue+launch)": lambda: fa._sm90(qd, kd, vd, a.causal, scale, "bhsd"),
        "kk _sm90_gradients": lambda: fa._sm90_gradients(qd, kd, vd, o, lse, g, None, a.causal, scale, "bhsd"),
        "kk _zeros_like(lse)": lambda: autodiff._zeros_like(lse),
        "torch.empty_like(q)": lambda: torch.empty_like(q),
    }
    rounds = {n: [] for n in fns}
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(a.rounds):
            for n, f in fns.items():
                f()
                rounds[n].append(host_us(f, a.calls))
    print(f"{torch.cuda.get_device_name()}: host µs a call, B={B} H={H} S={S} D={D} bf16"
          f"{' causal' if a.causal else ''} (median of {a.rounds} rounds of {a.calls} calls)")
    for n, r in rounds.items():
        print(f"{n:42s} {statistics.median(r):8.1f}   ({min(r):.1f}-{max(r):.1f})")
    prof = cProfile.Profile()
    torch.cuda._sleep(int(2e8))
    prof.enable()
    for _ in range(a.calls):
        kk_fwd_bwd()
    prof.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    print("\n".join(s.getvalue().splitlines()[:50]))


if __name__ == "__main__":
    main()

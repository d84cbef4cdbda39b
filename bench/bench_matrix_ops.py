"""The seeds' matrix ops (issue 17) beside torch on a GPU, interleaved in one process:

- kk.ops.matmul_add_relu against torch's relu(baddbmm(bias, lhs, rhs)) and torch.compile of the
  reference relu(lhs @ rhs + bias): bf16 batch 8 x 2048^3, bf16 8192^3, fp16 batch 8 x 2048^3
  (bias the output's full shape, as Burn's example).
- kk.ops.mxfp8_matmul (MXFP8 operands, 32-element blocks along K, bf16 out) against torch bf16
  matmul on the same shapes, torch._scaled_mm with per-tensor scales, and with 128-element block
  scales where the installed torch takes them.

    PYTHONPATH=src python bench/bench_matrix_ops.py [--sizes 8192] [--out results.json]

TFLOP/s count 2 M N K per matrix product; CUDA-event medians over rounds that interleave the
contenders; SASS counts of kernelkit's kernels (cuobjdump, where installed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
import kernelkit as kk  # noqa: E402
from kernelkit.ops import dequantize_mxfp8, matmul_add_relu, mxfp8_matmul, quantize_mxfp8  # noqa: E402
from kernelkit.benchmarks import interleaved_ms  # noqa: E402
from kernelkit.ops import hopper  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_talk_matmul import sass_counts  # noqa: E402


def rel(out, ref) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def kernel_sass(kernel, **compile_args) -> dict:
    return sass_counts(kk.compile_for(kernel, "sm_90", **compile_args).binary)


def fused_case(batch: int, n: int, dtype, iters: int, rounds: int) -> list[dict]:
    mar = sys.modules["kernelkit.ops.matmul_add_relu"]
    shape = (batch, n, n) if batch > 1 else (n, n)
    lhs, rhs, bias = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    reference = torch.compile(lambda a, b, c: torch.relu(a @ b + c))
    baddbmm = ((lambda: torch.relu(torch.baddbmm(bias, lhs, rhs))) if batch > 1
               else (lambda: torch.relu(torch.addmm(bias, lhs, rhs))))
    fns = {"kernelkit": lambda: matmul_add_relu(lhs, rhs, bias), "torch baddbmm+relu": baddbmm,
           "torch.compile": lambda: reference(lhs, rhs, bias)}
    ref = torch.relu(lhs.double() @ rhs.double() + bias.double())
    errs = {k: rel(f(), ref) for k, f in fns.items()}
    del ref
    ms = interleaved_ms(fns, rounds, iters)
    # the persistent kernel's SASS (these operands are row-major: lhs K-major, rhs N-major)
    views = [t.view(-1, *t.shape[-2:]) for t in (lhs, rhs, bias)]
    sass = kernel_sass(mar._persistent_kernel, inputs=views, output_dtypes=[dtype], output_shapes=[views[2].shape],
                       template=[("T", dtype), ("KA", 1), ("KB", 0), ("BIAS", 3), ("RELU", 1)],  # bias staged
                       grid=(hopper.THREADS, 1, 1), threadgroup=(hopper.THREADS, 1, 1))
    flop = 2 * batch * n ** 3
    name = f"matmul_add_relu {str(dtype).split('.')[1]} {batch} x {n}^3"
    return [dict(case=name, contender=k, ms=v, tflops=flop / v / 1e9, ratio_to_ours=v / ms["kernelkit"],
                 rel_err=errs[k], sass=sass if k == "kernelkit" else {}) for k, v in ms.items()]


def mxfp8_case(n: int, iters: int, rounds: int) -> list[dict]:
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    (ad, as_), (bd, bs) = quantize_mxfp8(a), quantize_mxfp8(b)
    mx = sys.modules["kernelkit.ops.mxfp8"]
    fns = {"kernelkit mxfp8": lambda: mxfp8_matmul(ad, as_, bd, bs), "torch bf16 matmul": lambda: a @ b.T,
           "kernelkit mxfp8, the talk's tiled kernel": lambda: mx.tiled_matmul(ad.view(torch.uint8), as_,
                                                                                bd.view(torch.uint8), bs,
                                                                                torch.bfloat16)}
    # per-tensor fp8: the data scaled into e4m3's range once, as users of _scaled_mm do
    one = torch.ones((), device="cuda")
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
    fns["torch._scaled_mm per-tensor"] = lambda: torch._scaled_mm(a8, b8.T, one, one, out_dtype=torch.bfloat16)
    try:  # 1 x 128 scales for a, 128 x 128 for b (DeepSeek-style), where torch has them on Hopper
        sa = torch.ones(n, n // 128, device="cuda")
        sb = torch.ones(n // 128, n // 128, device="cuda")
        torch._scaled_mm(a8, b8.T, sa, sb.T, out_dtype=torch.bfloat16)
        fns["torch._scaled_mm 128-blocks"] = lambda: torch._scaled_mm(a8, b8.T, sa, sb.T, out_dtype=torch.bfloat16)
    except Exception as e:  # noqa: BLE001 - torch's message says what it lacks
        print(f"note: torch._scaled_mm with 128-element block scales: {type(e).__name__}: {str(e)[:200]}")
    ref = dequantize_mxfp8(ad, as_).double() @ dequantize_mxfp8(bd, bs).double().T
    err = rel(mxfp8_matmul(ad, as_, bd, bs), ref)
    del ref
    ms = interleaved_ms(fns, rounds, iters)
    sass = kernel_sass(mx._persistent_matmul, inputs=[ad.view(torch.uint8), as_, bd.view(torch.uint8), bs],
                       output_dtypes=[torch.bfloat16], template=[("TC", torch.bfloat16)],
                       grid=(hopper.THREADS, 1, 1), threadgroup=(hopper.THREADS, 1, 1))
    flop = 2 * n ** 3
    return [dict(case=f"mxfp8_matmul {n}^3 bf16 out", contender=k, ms=v, tflops=flop / v / 1e9,
                 ratio_to_ours=v / ms["kernelkit mxfp8"], rel_err=err if k == "kernelkit mxfp8" else None,
                 sass=sass if k == "kernelkit mxfp8" else {}) for k, v in ms.items()]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fused", nargs="*", default=["bf16:8:2048", "bf16:1:8192", "fp16:8:2048"],
                   help="dtype:batch:n cases of matmul_add_relu")
    p.add_argument("--mxfp8", type=int, nargs="*", default=[8192], help="sizes of mxfp8_matmul")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out")
    args = p.parse_args()
    rows = []
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    cases = [lambda c=c: fused_case(int(c.split(":")[1]), int(c.split(":")[2]), dtypes[c.split(":")[0]],
                                    args.iters, args.rounds) for c in args.fused]
    cases += [lambda n=n: mxfp8_case(n, args.iters, args.rounds) for n in args.mxfp8]
    for case in cases:
        new = case()
        rows += new
        torch.cuda.empty_cache()
        for r in new:
            err = "" if r["rel_err"] is None else f"{r['rel_err']:.2e}"
            print(f"{r['case']:>34} {r['contender']:>28} {r['ms']:8.3f} ms {r['tflops']:6.0f} TFLOP/s "
                  f"(kernelkit {r['ratio_to_ours']:.2f}x) {err:>9} {r['sass']}", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                               date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               command="PYTHONPATH=src python bench/bench_matrix_ops.py " + " ".join(sys.argv[1:]),
                               rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

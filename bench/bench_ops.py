"""kernelkit.ops against torch on a GPU (issue 5).

grid_sample bilinear/zeros float32 at the seed's shape (x 8x1024x1024x64, grid 8x256x256x2):
forward, and forward+backward (x_grad and grid_grad), beside torch.nn.functional.grid_sample
(NCHW data, and the NHWC view) and the composed reference; matmul_add_relu at batch 8 x
2048^3 in bfloat16 and float32 beside torch (cuBLAS matmul + bias + relu). CUDA-event medians.

    python bench/bench_ops.py --out bench/results/ops-<device>.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from bench_grid_sample import median_ms


def grid_sample_figures() -> dict:
    from kernelkit.ops import grid_sample, grid_sample_torch

    torch.manual_seed(0)
    B, H, W, C, gH, gW = 8, 1024, 1024, 64, 256, 256
    x = torch.randn(B, H, W, C, device="cuda")
    grid = torch.rand(B, gH, gW, 2, device="cuda") * 2 - 1
    cot = torch.randn(B, gH, gW, C, device="cuda")
    x_nchw = x.permute(0, 3, 1, 2).contiguous()

    def torch_nchw():
        return torch.nn.functional.grid_sample(x_nchw, grid, align_corners=False)

    def torch_nhwc_view():
        return torch.nn.functional.grid_sample(x.permute(0, 3, 1, 2), grid, align_corners=False)

    def fwd_bwd(fn, *inputs):
        leaves = [t.detach().requires_grad_() for t in inputs]
        out = fn(*leaves)
        grads = torch.autograd.grad(out, leaves, cot if out.shape == cot.shape else cot.permute(0, 3, 1, 2))
        return grads

    ours = grid_sample(x, grid)
    ref = torch_nhwc_view().permute(0, 2, 3, 1)
    assert float((ours - ref).norm() / ref.norm()) < 1e-5
    return {
        "forward_ms": {
            "kernelkit": median_ms(lambda: grid_sample(x, grid)),
            "torch_grid_sample_nchw": median_ms(torch_nchw),
            "torch_grid_sample_nhwc_view": median_ms(torch_nhwc_view),
            "composed_reference": median_ms(lambda: grid_sample_torch(x, grid), repeat=10),
        },
        "forward_backward_ms": {
            "kernelkit": median_ms(lambda: fwd_bwd(grid_sample, x, grid), repeat=20),
            "torch_grid_sample_nhwc_view": median_ms(
                lambda: fwd_bwd(lambda a, g: torch.nn.functional.grid_sample(
                    a.permute(0, 3, 1, 2), g, align_corners=False), x, grid), repeat=10),
        },
    }


def matmul_figures() -> dict:
    from kernelkit.ops import matmul_add_relu

    out = {}
    batch, n = 8, 2048
    flops = 2 * batch * n ** 3
    for dtype in (torch.bfloat16, torch.float32):
        a = torch.randn(batch, n, n, device="cuda", dtype=dtype)
        b = torch.randn(batch, n, n, device="cuda", dtype=dtype)
        bias = torch.randn(batch, n, n, device="cuda", dtype=dtype)
        ours = matmul_add_relu(a, b, bias)
        ref = torch.relu(a.float() @ b.float() + bias.float())
        err = float((ours.float() - ref).norm() / ref.norm())
        t_ours = median_ms(lambda: matmul_add_relu(a, b, bias), repeat=5, warmup=1)
        t_torch = median_ms(lambda: torch.relu(torch.baddbmm(bias, a, b)), repeat=10)
        out[str(dtype).split(".")[1]] = {
            "kernelkit_ms": t_ours, "torch_ms": t_torch, "relative_error": err,
            "kernelkit_tflops": flops / t_ours / 1e9, "torch_tflops": flops / t_torch / 1e9,
        }
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    results = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d"),
               "torch": torch.__version__, "command": "python bench/bench_ops.py",
               "grid_sample_bilinear_zeros_float32": grid_sample_figures(),
               "matmul_add_relu_batch8_2048": matmul_figures()}
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

"""The ops suite (GPU; bench/bench_ops.py): `kernelkit.ops.grid_sample`, `matmul_add_relu`,
`mxfp8_matmul`, `flash_attention`, `cholesky` and `qr` against torch."""

from __future__ import annotations

import torch

from .progress import Tick, _no_tick
from .timing import best_device, relative_error, time_ms


def ops_figures(device: torch.device | None = None, quick: bool = False, tick: Tick = _no_tick) -> dict:
    """The ops against torch (the module's docstring lists them), at sizes for `device`."""
    device = device or best_device()
    cuda = device.type == "cuda"

    def t(fn, repeat, warmup=5):
        if quick:
            repeat = max(repeat // 5, 3)
        return time_ms(fn, device, repeat if cuda else min(repeat, 3), warmup if cuda else 1)

    shape = (2, 512, 512, 64, 128, 128) if quick else (8, 1024, 1024, 64, 256, 256)
    if cuda:
        batch, n = (2, 1024) if quick else (8, 2048)
    else:
        batch, n = (1, 256) if quick else (2, 512)
    if cuda:
        mx, attention = (2048, (2, 8, 1024, 128)) if quick else (8192, (4, 16, 4096, 128))
    else:
        mx, attention = (128, (1, 2, 128, 64)) if quick else (256, (1, 4, 256, 64))
    # a batch of small matrices, then one large one
    factor = ([(1024, 32), (1, 1024)] if quick else [(4096, 32), (1, 4096)]) if cuda else [(1024, 16), (1, 256)]
    return {"grid_sample": _ops_grid_sample(device, shape, t, tick),
            "matmul_add_relu": _ops_matmul(device, batch, n, t, tick),
            "mxfp8_matmul": _ops_mxfp8(device, mx, t, tick),
            "flash_attention": _ops_attention(device, attention, t, tick),
            "linalg": _ops_linalg(device, factor, t, tick)}


def _ops_linalg(device, sizes, t, tick: Tick) -> list:
    """cholesky and qr (float32) beside torch.linalg's (cuSOLVER / MAGMA, LAPACK on the CPU), for
    batches of n x n matrices: [{"op", "batch", "n", "kernelkit_ms", "torch_ms", ...}]."""
    from ..ops import cholesky, qr

    out = []
    for name, ours, theirs in (("cholesky", cholesky, torch.linalg.cholesky), ("qr", qr, torch.linalg.qr)):
        tick(f"ops: {name}")
        for batch, n in sizes:
            torch.manual_seed(0)
            a = torch.randn(batch, n, n, device=device)
            if name == "cholesky":
                a = a @ a.mT / n + torch.eye(n, device=device)
                err = relative_error(ours(a), theirs(a.double()))
            else:
                err = relative_error(torch.matmul(*ours(a)), a)
            assert err < 1e-4, (name, batch, n, err)
            out.append({"op": name, "batch": batch, "n": n, "dtype": "float32", "relative_error": err,
                        "kernelkit_ms": t(lambda: ours(a), 10, 2), "torch_ms": t(lambda: theirs(a), 10, 2)})
    return out


def _ops_mxfp8(device, n: int, t, tick: Tick) -> dict:
    """mxfp8_matmul (bf16 out) beside torch's bf16 matmul of the matrices it quantises and, on a
    GPU, torch._scaled_mm's fp8 matmul with per-tensor scales."""
    from ..ops import dequantize_mxfp8, mxfp8_matmul, quantize_mxfp8

    tick("ops: mxfp8_matmul")
    torch.manual_seed(0)
    a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
    (qa, sa), (qb, sb) = quantize_mxfp8(a), quantize_mxfp8(b)
    err = relative_error(mxfp8_matmul(qa, sa, qb, sb),
                         dequantize_mxfp8(qa, sa).double() @ dequantize_mxfp8(qb, sb).double().T)
    assert err < 1e-2, err
    out = {"m": n, "n": n, "k": n, "out_dtype": "bfloat16", "relative_error": err,
           "kernelkit_ms": t(lambda: mxfp8_matmul(qa, sa, qb, sb), 10),
           "torch_bf16_ms": t(lambda: a @ b.T, 10)}
    if device.type == "cuda":
        one, a8, b8 = torch.ones((), device=device), a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        out["torch_scaled_mm_ms"] = t(lambda: torch._scaled_mm(a8, b8.T, one, one, out_dtype=torch.bfloat16), 10)
    for k in [k for k in out if k.endswith("_ms")]:
        out[k[:-3] + "_tflops"] = 2 * n ** 3 / out[k] / 1e9
    return out


def _ops_attention(device, shape, t, tick: Tick) -> dict:
    """flash_attention (causal and not; forward, and forward + backward) beside torch's
    scaled_dot_product_attention (bf16 on a GPU, float32 on the CPU)."""
    from ..ops import flash_attention, flash_attention_reference

    F = torch.nn.functional
    B, H, S, D = shape
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    cot = torch.randn(shape, device=device, dtype=dtype)
    out = {"shape": list(shape), "dtype": str(dtype).split(".")[1]}
    for causal in (False, True):
        name = "causal" if causal else "full"
        tick(f"ops: flash_attention {name}")
        with torch.no_grad():
            err = relative_error(flash_attention(q, k, v, causal=causal),
                                 flash_attention_reference(q.double(), k.double(), v.double(), causal=causal))
        assert err < 2e-2, err

        def ours(bwd=False):
            o = flash_attention(q, k, v, causal=causal)
            return torch.autograd.grad(o, (q, k, v), cot) if bwd else o

        def sdpa(bwd=False):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return torch.autograd.grad(o, (q, k, v), cot) if bwd else o

        flop = 4 * B * H * S * S * D / (2 if causal else 1)
        with torch.no_grad():
            fwd = {"kernelkit": t(ours, 10), "torch_sdpa": t(sdpa, 10)}
        both = {"kernelkit": t(lambda: ours(True), 5), "torch_sdpa": t(lambda: sdpa(True), 5)}
        out[name] = {"relative_error": err, "forward_ms": fwd, "forward_backward_ms": both,
                     "forward_tflops": {k_: flop / v_ / 1e9 for k_, v_ in fwd.items()},
                     "forward_backward_tflops": {k_: 3.5 * flop / v_ / 1e9 for k_, v_ in both.items()}}
    return out


def _ops_grid_sample(device, shape, t, tick: Tick) -> dict:
    from ..ops import grid_sample, grid_sample_torch

    F = torch.nn.functional
    torch.manual_seed(0)
    B, H, W, C, gH, gW = shape
    tick("ops: grid_sample inputs")
    x = torch.randn(B, H, W, C, device=device)
    grid = torch.rand(B, gH, gW, 2, device=device) * 2 - 1
    cot = torch.randn(B, gH, gW, C, device=device)
    x_nchw = x.permute(0, 3, 1, 2).contiguous()

    def torch_nchw():
        return F.grid_sample(x_nchw, grid, align_corners=False)

    def torch_nhwc_view():
        return F.grid_sample(x.permute(0, 3, 1, 2), grid, align_corners=False)

    def fwd_bwd(fn, *inputs):
        leaves = [v.detach().requires_grad_() for v in inputs]
        out = fn(*leaves)
        return torch.autograd.grad(out, leaves, cot if out.shape == cot.shape else cot.permute(0, 3, 1, 2))

    def torch_fwd_bwd(grid):
        return fwd_bwd(lambda a, g: F.grid_sample(a.permute(0, 3, 1, 2), g, align_corners=False), x, grid)

    err = relative_error(grid_sample(x, grid), torch_nhwc_view().permute(0, 2, 3, 1))
    assert err < 1e-5, err
    tick("ops: grid_sample forward")
    forward = {"kernelkit": t(lambda: grid_sample(x, grid), 50)}
    tick("ops: grid_sample forward, torch NCHW")
    forward["torch_grid_sample_nchw"] = t(torch_nchw, 50)
    tick("ops: grid_sample forward, torch NHWC view")
    forward["torch_grid_sample_nhwc_view"] = t(torch_nhwc_view, 50)
    tick("ops: grid_sample forward, composed reference")
    forward["composed_reference"] = t(lambda: grid_sample_torch(x, grid), 10)
    tick("ops: grid_sample forward + backward")
    backward = {"kernelkit": t(lambda: fwd_bwd(grid_sample, x, grid), 20),
                "torch_grid_sample_nhwc_view": t(lambda: torch_fwd_bwd(grid), 10)}
    # every point in the centre tenth of x (each way): far more per tile of the backward than its
    # slots hold, the overflow's path
    tick("ops: grid_sample forward + backward, crowded grid")
    crowded = grid * 0.1
    backward_crowded = {"grid_scale": 0.1, "kernelkit": t(lambda: fwd_bwd(grid_sample, x, crowded), 20),
                        "torch_grid_sample_nhwc_view": t(lambda: torch_fwd_bwd(crowded), 10)}
    return {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2], "dtype": "float32", "mode": "bilinear",
                      "padding_mode": "zeros"},
            "forward_ms": forward, "forward_backward_ms": backward,
            "forward_backward_crowded_ms": backward_crowded, "relative_error": err}


def _ops_matmul(device, batch: int, n: int, t, tick: Tick) -> dict:
    flops = 2 * batch * n ** 3
    out = {"batch": batch, "m": n, "n": n, "k": n}
    for dtype in (torch.bfloat16, torch.float32):
        name = str(dtype).split(".")[1]
        tick(f"ops: matmul_add_relu {name}")
        out[name] = _ops_matmul_one(device, batch, n, dtype, t, tick)
        out[name]["kernelkit_tflops"] = flops / out[name]["kernelkit_ms"] / 1e9
        out[name]["torch_tflops"] = flops / out[name]["torch_ms"] / 1e9
    return out


def _ops_matmul_one(device, batch: int, n: int, dtype, t, tick: Tick) -> dict:
    from ..ops import matmul_add_relu

    torch.manual_seed(0)
    a, b, bias = (torch.randn(batch, n, n, device=device, dtype=dtype) for _ in range(3))
    err = relative_error(matmul_add_relu(a, b, bias).float(),
                         torch.relu(a.float() @ b.float() + bias.float()))
    assert err < (2e-2 if dtype == torch.bfloat16 else 1e-4), (dtype, err)
    t_ours = t(lambda: matmul_add_relu(a, b, bias), 5, 1)
    tick(f"ops: matmul_add_relu {str(dtype).split('.')[1]}, torch")
    t_torch = t(lambda: torch.relu(torch.baddbmm(bias, a, b)), 10)
    return {"kernelkit_ms": t_ours, "torch_ms": t_torch, "relative_error": err}

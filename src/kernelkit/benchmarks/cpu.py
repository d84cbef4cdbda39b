"""The cpu suite (bench/bench_cpu.py): the CPU backend's exp, grid_sample and matmul_add_relu
against torch, and its compile times."""

from __future__ import annotations

import torch

from .compile_times import compile_times
from .progress import Tick, _no_tick
from .timing import cpu_best_ms, relative_error


def cpu_figures(device: torch.device | None = None, quick: bool = False, tick: Tick = _no_tick) -> dict:
    """exp (plain loops), the seed's grid_sample forward and VJP (fibers) and kernelkit.ops'
    grid_sample, matmul_add_relu (fibers: barriers) on the CPU backend against torch; compile
    times."""
    # exp over 64M; grid_sample at 1/16 of the seed's batch x grid (batch 8 -> 2, grid 256² -> 128²)
    n = (1 << 22) if quick else (1 << 26)
    shape = (1, 256, 256, 64, 64, 64) if quick else (2, 1024, 1024, 64, 128, 128)
    batch, m = (1, 256) if quick else (2, 512)
    return {"exp": _cpu_exp(n, tick), "grid_sample": _cpu_grid_sample(shape, tick),
            "matmul_add_relu": _cpu_matmul(batch, m, tick),
            "compile": compile_times(torch.device("cpu"), tick)}


def _cpu_exp(n: int, tick: Tick) -> dict:
    from ..ops import exp

    torch.manual_seed(0)
    tick("cpu: exp")
    a = torch.randn(n)
    err = relative_error(exp(a), torch.exp(a.double()))
    assert err < 1e-6, err
    t_ours = cpu_best_ms(lambda: exp(a), 5)
    tick("cpu: exp, torch")
    t_torch = cpu_best_ms(lambda: torch.exp(a), 5)
    return {"n": n, "dtype": "float32", "kernelkit_ms": t_ours, "torch_ms": t_torch,
            "throughput_vs_torch": t_torch / t_ours, "relative_error": err}


def _cpu_grid_sample(shape, tick: Tick) -> dict:
    from ..ops import grid_sample as grid_sample_op
    from ..ops import grid_sample_seed as grid_sample, grid_sample_vjp
    from ..ops.grid_sample import grid_sample_reference

    torch.manual_seed(0)
    B, H, W, C, gH, gW = shape
    tick("cpu: grid_sample forward")
    x = torch.randn(B + 2, H, W, C)[1:-1]  # margin: the seed reads outside x before masking
    grid = torch.rand(B, gH, gW, 2) * 2 - 1
    cot = torch.randn(B, gH, gW, C)
    err_fwd = relative_error(grid_sample(x, grid), grid_sample_reference(x, grid))
    assert err_fwd < 1e-5, err_fwd
    t_fwd = cpu_best_ms(lambda: grid_sample(x, grid), 3)
    tick("cpu: grid_sample forward, torch")
    t_fwd_torch = cpu_best_ms(lambda: grid_sample_reference(x, grid), 3)
    tick("cpu: grid_sample VJP")
    xr, gr = x.detach().requires_grad_(), grid.detach().requires_grad_()

    def torch_fwd_bwd():
        return torch.autograd.grad(grid_sample_reference(xr, gr), (xr, gr), cot)

    err_vjp = max(relative_error(g, w) for g, w in zip(grid_sample_vjp(x, grid, cot), torch_fwd_bwd()))
    assert err_vjp < 1e-4, err_vjp
    t_vjp = cpu_best_ms(lambda: grid_sample_vjp(x, grid, cot), 3)
    tick("cpu: grid_sample forward + backward, torch")
    t_vjp_torch = cpu_best_ms(torch_fwd_bwd, 3)
    tick("cpu: kernelkit.ops.grid_sample")

    def op_fwd_bwd():
        return torch.autograd.grad(grid_sample_op(xr, gr), (xr, gr), cot)

    err_op = max(relative_error(g, w) for g, w in zip(op_fwd_bwd(), torch_fwd_bwd()))
    assert err_op < 1e-4, err_op
    return {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2]},
            "forward_ms": t_fwd, "torch_forward_ms": t_fwd_torch, "vjp_ms": t_vjp,
            "torch_forward_backward_ms": t_vjp_torch,
            "op_forward_ms": cpu_best_ms(lambda: grid_sample_op(x, grid), 3),
            "op_forward_backward_ms": cpu_best_ms(op_fwd_bwd, 3),
            "relative_error": {"forward": err_fwd, "vjp": err_vjp, "op_forward_backward": err_op}}


def _cpu_matmul(batch: int, m: int, tick: Tick) -> dict:
    from ..ops import matmul_add_relu

    torch.manual_seed(0)
    tick("cpu: matmul_add_relu")
    lhs, rhs, bias = (torch.randn(batch, m, m) for _ in range(3))
    err = relative_error(matmul_add_relu(lhs, rhs, bias), torch.relu(torch.baddbmm(bias, lhs, rhs)))
    assert err < 1e-4, err
    t_ours = cpu_best_ms(lambda: matmul_add_relu(lhs, rhs, bias), 3)
    tick("cpu: matmul_add_relu, torch")
    t_torch = cpu_best_ms(lambda: torch.relu(torch.baddbmm(bias, lhs, rhs)), 3)
    return {"batch": batch, "m": m, "n": m, "k": m, "dtype": "float32", "kernelkit_ms": t_ours,
            "torch_ms": t_torch, "relative_error": err}

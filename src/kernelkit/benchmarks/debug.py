"""The debug suite (either device; bench/bench_debug.py): checked calls (`check_bounds=True`,
`timeout=`) against plain calls of the same kernels (issue 7)."""

from __future__ import annotations

import time

import torch

from .progress import Tick, _no_tick
from .timing import best_device, relative_error


DEBUG_MODES = {"plain": {}, "check_bounds": {"check_bounds": True}, "timeout": {"timeout": 60.0},
               "check_bounds_timeout": {"check_bounds": True, "timeout": 60.0}}
_ROW_SUM = """
    uint r = thread_position_in_grid.x;
    int n = inp_shape[1];
    float acc = 0.0f;
    for (int c = 0; c < n; ++c) acc += inp[r * n + c];
    out[r] = acc;"""


def debug_figures(device: torch.device | None = None, quick: bool = False,
                  tick: Tick = _no_tick) -> dict:
    """Checked calls against plain calls of the same kernel: exp (one access per thread, no
    loop), a row sum (a loop: the timeout's poll runs in it), the seed's grid_sample forward
    (grid samples inside the image: no report). A checked call synchronises and reads its
    record back, so its time is the call's wall time; the plain calls' are too (one sync each)."""
    import kernelkit as kk
    from ..ops.grid_sample import FORWARD_SOURCE, grid_sample_reference

    device = device or best_device()
    gpu = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if gpu else (lambda: None)
    repeat = (5 if quick else 20) if gpu else (2 if quick else 7)
    torch.manual_seed(0)

    def timed(k, check, **kw):
        """Best time of each mode, the modes interleaved round by round (a noisy machine's
        drift then favours none of them)."""
        def fn(mode):
            out = k(**kw, **DEBUG_MODES[mode])
            sync()
            return out
        for mode in DEBUG_MODES:
            err = relative_error(fn(mode)[0], check)
            assert err < 1e-4, (mode, err)
        best = dict.fromkeys(DEBUG_MODES, float("inf"))
        for _ in range(repeat):
            for mode in DEBUG_MODES:
                t0 = time.perf_counter()
                fn(mode)
                best[mode] = min(best[mode], (time.perf_counter() - t0) * 1e3)
        return {f"{mode}_ms": t for mode, t in best.items()}

    tick("debug: exp")
    n = (1 << 22 if quick else 1 << 26) if gpu else (1 << 20 if quick else 1 << 24)
    exp = kk.metal_kernel(name="debug_exp", input_names=["inp"], output_names=["out"],
                          source="uint i = thread_position_in_grid.x; out[i] = metal::exp(inp[i]);")
    a = torch.randn(n, device=device)
    res = {"exp": {"n": n, "dtype": "float32", **timed(
        exp, torch.exp(a), inputs=[a], grid=(n, 1, 1), threadgroup=(256, 1, 1), output_shapes=[(n,)],
        output_dtypes=[torch.float32])}}

    tick("debug: row sum (a loop)")
    rows, cols = (1024, 1024) if quick else (16384, 4096) if gpu else (4096, 1024)
    rs = kk.metal_kernel(name="debug_row_sum", input_names=["inp"], output_names=["out"],
                         source=_ROW_SUM)
    m = torch.randn(rows, cols, device=device)
    res["row_sum"] = {"rows": rows, "cols": cols, "dtype": "float32", **timed(
        rs, m.sum(1), inputs=[m], grid=(rows, 1, 1), threadgroup=(64, 1, 1),
        output_shapes=[(rows,)], output_dtypes=[torch.float32])}

    tick("debug: grid_sample forward (seed)")
    B, H, W, C, gH, gW = (1, 128, 128, 32, 64, 64) if quick else \
        (8, 1024, 1024, 64, 256, 256) if gpu else (1, 256, 256, 64, 128, 128)  # GPU: the seed's
    gs = kk.metal_kernel(name="debug_grid_sample", input_names=["x", "grid"], output_names=["out"],
                         source=FORWARD_SOURCE)
    x = torch.randn(B, H, W, C, device=device)
    g = (torch.rand(B, gH, gW, 2, device=device) * 2 - 1) * 0.95  # inside: the corners exist
    res["grid_sample_forward"] = {"shape": {"x": [B, H, W, C], "grid": [B, gH, gW, 2]}, **timed(
        gs, grid_sample_reference(x, g), inputs=[x, g], template=[("T", torch.float32)],
        output_shapes=[(B, gH, gW, C)], output_dtypes=[torch.float32],
        grid=(B * gH * gW * C, 1, 1), threadgroup=(256, 1, 1))}
    return res

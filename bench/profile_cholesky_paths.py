"""kk.ops.cholesky's GPU kernels for small matrices side by side, beside torch.linalg's.

    PYTHONPATH=src python bench/profile_cholesky_paths.py          (needs an NVIDIA GPU)

For each batch x n and dtype: the lane-a-row kernel (cholesky_simd.metal: a SIMD-group's lanes,
two SIMD-groups' past 32) and the threadgroup-a-matrix one (cholesky.metal) alone, the op with its
error check (a sync), and torch.linalg.cholesky_ex / cholesky: µs a call, interleaved rounds timed
with CUDA events (kernelkit.benchmarks.interleaved_ms); the lanes' relative error to float64 (kernelkit.benchmarks.relative_error).
"""

import importlib

import torch

import kernelkit as kk
from bench_linalg import _spd  # (this script's folder is on sys.path when it runs)
from kernelkit.benchmarks import interleaved_ms, relative_error

la = importlib.import_module("kernelkit.ops.linalg")
CASES = ((16384, 16), (4096, 32), (2048, 33), (2048, 48), (2048, 64), (512, 64))


def on_path(simd_max_n: int, fn):
    """fn with linalg.SIMD_MAX_N set for CUDA (0: the threadgroup kernel for every n)."""
    def run():
        la.SIMD_MAX_N = {"cuda": simd_max_n}
        return fn()
    return run


def main() -> None:
    default = dict(la.SIMD_MAX_N)
    print(f"{torch.cuda.get_device_name()}: µs a call (median of interleaved rounds)")
    for batch, n in CASES:
        for dt in (torch.float32, torch.float64):
            a = _spd(batch, n, dt, "cuda")
            L, _ = on_path(64, lambda: la._factor(a, False))()
            err = relative_error(L, torch.linalg.cholesky(a.double()))
            fns = {"lanes": on_path(64, lambda: la._factor(a, False)),
                   "threadgroup": on_path(0, lambda: la._factor(a, False)),
                   "kk cholesky": on_path(64, lambda: kk.ops.cholesky(a)),
                   "torch cholesky_ex": lambda: torch.linalg.cholesky_ex(a),
                   "torch cholesky": lambda: torch.linalg.cholesky(a)}
            ms = interleaved_ms(fns, 7, 20)
            print(f"{batch}x{n} {str(dt)[6:]} (error {err:.1e}): "
                  + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in ms.items()))
    la.SIMD_MAX_N = default


if __name__ == "__main__":
    main()

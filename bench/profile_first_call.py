"""Where a fresh process's first call of a cached kernel spends its time (run it twice:
the first run fills the disk cache). Prints the slowest functions by cumulative time.

    KERNELKIT_CACHE_DIR=/tmp/kk python bench/profile_first_call.py
"""

import cProfile
import pstats
import time

import torch

torch.cuda.init()
x = torch.randn(3, 64, 64, 64, device="cuda")[1:2]  # margin: the seed reads outside x
g = torch.rand(1, 16, 16, 2, device="cuda") * 2 - 1
torch.cuda.synchronize()
from kernelkit.ops import grid_sample_seed as grid_sample  # noqa: E402

profile = cProfile.Profile()
t0 = time.perf_counter()
profile.enable()
grid_sample(x, g)
profile.disable()
print(f"first call: {time.perf_counter() - t0:.4f} s")
pstats.Stats(profile).sort_stats("cumtime").print_stats(30)

"""What the seed's grid_sample forward does on the GPU at the borders (issue 2's note).

The seed's forward reads the four corners of x before it masks them, so samples near
the border read up to (W+1)*C elements before or after x. Run under compute-sanitizer
to see those reads:

    compute-sanitizer --tool memcheck --print-limit 3 python bench/seed_oob_reads.py

Without the sanitizer the reads return whatever memory is there and the masks discard
it: the output is still right, unless the addresses are unmapped (a fault).
"""

import torch

from kernelkit.ops import grid_sample_seed as grid_sample
from kernelkit.ops.grid_sample import grid_sample_reference

torch.manual_seed(0)
x = torch.randn(1, 32, 32, 8, device="cuda")  # a fresh allocation of its own: no margin around x
grid = torch.tensor([[[[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0], [-0.999, 0.999]]]], device="cuda")
out = grid_sample(x, grid)
torch.cuda.synchronize()
err = float((out - grid_sample_reference(x, grid)).abs().max())
print(f"max |out - torch| = {err:.2e} (corner samples at (-1,-1) and (1,1) read outside x)")

"""A CUDA-dialect kernel with dynamic shared memory: a sum per block, then over blocks.

`grid` counts threads, not blocks (as in MLX): the launch has ceil(grid / threadgroup)
blocks, and the body guards its index as any CUDA kernel does.

    python examples/cuda_shared_memory.py
"""

import torch

import kernelkit as kk

device = "cuda" if torch.cuda.is_available() else "cpu"
BLOCK = 256

block_sum = kk.cuda_kernel(
    name="block_sum",
    input_names=["x"],
    output_names=["out"],
    source="""
        extern __shared__ float partial[];  // shared_memory= bytes, one float per thread
        unsigned tid = threadIdx.x;
        unsigned i = blockIdx.x * blockDim.x + tid;
        partial[tid] = i < x_shape[0] ? x[i] : 0.0f;
        __syncthreads();
        // pairs at distance 1, 2, 4...: any blockDim (a grid smaller than one block gets a
        // block of grid's size, as Metal clamps it)
        for (unsigned s = 1; s < blockDim.x; s <<= 1) {
            if (tid % (2 * s) == 0 && tid + s < blockDim.x) partial[tid] += partial[tid + s];
            __syncthreads();
        }
        if (tid == 0) out[blockIdx.x] = partial[0];
    """,
    shared_memory=BLOCK * 4,
)


def total(x):
    while x.numel() > 1:
        blocks = -(-x.numel() // BLOCK)
        (x,) = block_sum(inputs=[x], grid=(x.numel(), 1, 1), threadgroup=(BLOCK, 1, 1),
                         output_shapes=[(blocks,)], output_dtypes=[torch.float32])
    return x[0]


for n in (1, 255, 256, 100_000, 1 << 20):
    x = torch.rand(n, device=device)
    torch.testing.assert_close(total(x), x.sum(), rtol=1e-5, atol=1e-4)
    print(f"sum of {n} floats on {device}: ok")

"""Row sums with SIMD-group functions: each threadgroup sums one row; simd_sum reduces its
32 lanes, threadgroup memory and a barrier combine the SIMD-groups. On the CPU backend, the
threads of a group run as fibers, so simd_sum and the barrier behave as on the GPU.

    python examples/simd_reduction.py
"""

import torch

import kernelkit as kk

device = "cuda" if torch.cuda.is_available() else "cpu"
THREADS = 256

row_sum = kk.metal_kernel(
    name="row_sum",
    input_names=["x"],
    output_names=["out"],
    source="""
        uint row = threadgroup_position_in_grid.y;
        uint lane = thread_index_in_simdgroup;
        uint group = simdgroup_index_in_threadgroup;
        threadgroup float partial[32];

        float acc = 0.0f;
        for (uint c = thread_position_in_threadgroup.x; c < N; c += threads_per_threadgroup.x)
            acc += x[row * N + c];
        acc = simd_sum(acc);
        if (lane == 0) partial[group] = acc;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        if (group == 0) {
            acc = lane < simdgroups_per_threadgroup ? partial[lane] : 0.0f;
            acc = simd_sum(acc);
            if (lane == 0) out[row] = acc;
        }
    """,
)

for rows, cols in ((1, 1), (7, 1000), (64, 4096)):
    x = torch.randn(rows, cols, device=device)
    # one threadgroup of THREADS threads per row: grid (THREADS, rows) threads
    (out,) = row_sum(inputs=[x], template=[("N", cols)], grid=(THREADS, rows, 1),
                     threadgroup=(THREADS, 1, 1), output_shapes=[(rows,)],
                     output_dtypes=[torch.float32])
    torch.testing.assert_close(out, x.sum(dim=1), rtol=1e-5, atol=1e-4)
    print(f"row sums of {rows}x{cols} on {device}: ok")

"""exp, the first kernel: a Metal body, one thread per element, checked against torch.exp.

    python examples/exp.py
"""

import torch

import kernelkit as kk

device = "cuda" if torch.cuda.is_available() else "cpu"

kernel = kk.metal_kernel(
    name="myexp",
    input_names=["inp"],
    output_names=["out"],
    source="""
        uint elem = thread_position_in_grid.x;
        T tmp = inp[elem];
        out[elem] = metal::exp(tmp);
    """,
)

for dtype in (torch.float32, torch.float16, torch.bfloat16):
    a = torch.randn(4, 1000, dtype=dtype, device=device)
    # `grid` counts threads: one per element (the last threadgroup is partial)
    (out,) = kernel(inputs=[a], template=[("T", dtype)], grid=(a.numel(), 1, 1),
                    threadgroup=(256, 1, 1), output_shapes=[a.shape], output_dtypes=[dtype])
    # the reference in float64, rounded once: torch's own float32 exp on the CPU (MKL) was seen
    # off by 1.5e-4 in some processes
    torch.testing.assert_close(out, torch.exp(a.double()).to(dtype))
    print(f"exp {dtype} on {device}: ok")

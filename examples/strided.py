"""A kernel that reads a strided view where it lies: ensure_row_contiguous=False and MLX's
elem_to_loc, which turns a row-major element index into the view's memory offset.

    python examples/strided.py
"""

import torch

import kernelkit as kk

device = "cuda" if torch.cuda.is_available() else "cpu"

kernel = kk.metal_kernel(
    name="strided_exp",
    input_names=["inp"],
    output_names=["out"],
    source="""
        uint elem = thread_position_in_grid.x;
        // the body mentions inp_shape, inp_strides and inp_ndim, so the signature has them
        int64_t loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        out[elem] = metal::exp(inp[loc]);
    """,
    ensure_row_contiguous=False,  # no copy: the kernel sees the view's own strides
)

base = torch.randn(64, 96, device=device)
for view in (base.t(), base[::2, 5:], base[:, ::3].t()):
    assert not view.is_contiguous()
    (out,) = kernel(inputs=[view], grid=(view.numel(), 1, 1), threadgroup=(256, 1, 1),
                    output_shapes=[view.shape], output_dtypes=[view.dtype])
    torch.testing.assert_close(out, torch.exp(view.double()).float())  # the reference in float64
    print(f"exp of a {tuple(view.shape)} view with strides {view.stride()} on {device}: ok")

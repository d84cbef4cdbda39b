"""Elementwise exp: the first example of MLX's custom Metal kernel guide, unchanged."""

from __future__ import annotations

import torch

from .. import metal_kernel
from ..preconditions import FLOATS, Preconditions

# Seed 1 (mlx_custom_metal_kernels.txt, "Simple Example"), kernel source verbatim.
EXP_SOURCE = """
        uint elem = thread_position_in_grid.x;
        T tmp = inp[elem];
        out[elem] = metal::exp(tmp);
    """

# Seed 1, "Using Shape/Strides": the strided variant, verbatim.
EXP_STRIDED_SOURCE = """
        uint elem = thread_position_in_grid.x;
        // Utils from `mlx/backend/metal/kernels/utils.h` are automatically included
        uint loc = elem_to_loc(elem, inp_shape, inp_strides, inp_ndim);
        T tmp = inp[loc];
        // Output arrays are always row contiguous
        out[elem] = metal::exp(tmp);
    """

_exp = metal_kernel(name="myexp", input_names=["inp"], output_names=["out"], source=EXP_SOURCE)
_exp_strided = metal_kernel(name="myexp_strided", input_names=["inp"], output_names=["out"],
                            source=EXP_STRIDED_SOURCE, ensure_row_contiguous=False)


def exp(a: torch.Tensor) -> torch.Tensor:
    """exp of a (row-contiguous copy made if needed), computed in a.dtype."""
    Preconditions("exp").tensor("a", a, dtype=FLOATS)
    if a.numel() == 0:
        return torch.empty(a.shape, dtype=a.dtype, device=a.device)
    return _exp(inputs=[a], template=[("T", a.dtype)], grid=(a.numel(), 1, 1),
                threadgroup=(256, 1, 1), output_shapes=[a.shape], output_dtypes=[a.dtype])[0]


def exp_strided(a: torch.Tensor) -> torch.Tensor:
    """exp of a read through its own strides (no copy)."""
    Preconditions("exp_strided").tensor("a", a, dtype=FLOATS)
    if a.numel() == 0:
        return torch.empty(a.shape, dtype=a.dtype, device=a.device)
    return _exp_strided(inputs=[a], template=[("T", a.dtype)], grid=(a.numel(), 1, 1),
                        threadgroup=(256, 1, 1), output_shapes=[a.shape], output_dtypes=[a.dtype])[0]


def exp_reference(a: torch.Tensor) -> torch.Tensor:
    return torch.exp(a.double())

"""PyTorch / NumPy interop: dtypes, devices, streams, and array conversion.

Small paired converters, one place for each (as NVIDIA Warp's torch interop).
kernelkit's own array type is ``torch.Tensor``; NumPy arrays are viewed as CPU
tensors on the way in and handed back as NumPy on the way out.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True, eq=False)  # one instance per dtype: identity is equality, hashing is cheap
class DType:
    """An element type as kernelkit knows it."""

    name: str  # canonical name, as torch and NumPy spell it ("float16")
    ctype: str  # the type name generated code uses (MLX's spelling)
    torch: torch.dtype
    itemsize: int
    struct_code: str  # `struct` format of one value (for scalars in the argument block)

    def __repr__(self) -> str:
        return f"kernelkit.{self.name}"


_DTYPES = [
    DType("bool", "bool", torch.bool, 1, "?"),
    DType("int8", "int8_t", torch.int8, 1, "b"),
    DType("int16", "int16_t", torch.int16, 2, "h"),
    DType("int32", "int32_t", torch.int32, 4, "i"),
    DType("int64", "int64_t", torch.int64, 8, "q"),
    DType("uint8", "uint8_t", torch.uint8, 1, "B"),
    DType("uint16", "uint16_t", torch.uint16, 2, "H"),
    DType("uint32", "uint32_t", torch.uint32, 4, "I"),
    DType("uint64", "uint64_t", torch.uint64, 8, "Q"),
    DType("float16", "float16_t", torch.float16, 2, "e"),
    DType("bfloat16", "bfloat16_t", torch.bfloat16, 2, "H"),
    DType("float32", "float", torch.float32, 4, "f"),
    DType("float64", "double", torch.float64, 8, "d"),
    # MLX's complex64_t (two floats, the real part first; include/kernelkit/complex.h). Arrays only:
    # a Python complex is no scalar input, so its struct format is never used.
    DType("complex64", "complex64_t", torch.complex64, 8, "Q"),
]
_BY_NAME = {d.name: d for d in _DTYPES}
_BY_TORCH = {d.torch: d for d in _DTYPES}
DTYPE_OF_TORCH = _BY_TORCH
_ALIASES = {"half": "float16", "float": "float32", "double": "float64", "bfloat": "bfloat16",
            "int": "int32", "uint": "uint32", "long": "int64", "bool_": "bool"}

SUPPORTED = ", ".join(d.name for d in _DTYPES)


def dtype_of(spec) -> DType:
    """A DType from a torch dtype, a NumPy dtype (or type), a DType, or a name."""
    if isinstance(spec, DType):
        return spec
    if spec is None:  # NumPy would read it as float64
        raise TypeError(f"None is not a dtype; expected one of: {SUPPORTED} "
                        "(as a torch dtype, a NumPy dtype or a name)")
    found = _BY_TORCH.get(spec) if isinstance(spec, torch.dtype) else None
    if found is not None:
        return found
    if isinstance(spec, torch.dtype):
        found = _BY_TORCH.get(spec)
    elif isinstance(spec, str):
        found = _BY_NAME.get(_ALIASES.get(spec, spec))
    else:
        try:
            found = _BY_NAME.get(np.dtype(spec).name)
        except TypeError:
            found = None
    if found is None:
        raise TypeError(f"unsupported dtype {spec!r}; expected one of: {SUPPORTED} "
                        "(as a torch dtype, a NumPy dtype or a name)")
    return found


def integral(value) -> int:
    """`value` as an int wherever MLX takes one: anything `operator.index` takes (NumPy integers,
    0-d integer tensors, torch.Size entries), but no bool; TypeError otherwise (floats too)."""
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, torch.Tensor)
                                               and value.dtype == torch.bool):
        raise TypeError(f"expected an int, got the bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"expected an int, got {value!r} ({type(value).__name__})") from None


# Python scalars are typed as MLX types them.
SCALAR_DTYPES = {bool: _BY_NAME["bool"], int: _BY_NAME["int32"], float: _BY_NAME["float32"]}


def is_scalar(x) -> bool:
    return type(x) in SCALAR_DTYPES


def as_tensor(x):
    """A torch view of an array input, and whether it came from NumPy; None if x is no array.

    Arrays of other libraries come in without a copy through DLPack (CuPy, JAX...; on a GPU,
    on torch's current stream) or `__cuda_array_interface__` (Numba...); their outputs are
    torch tensors."""
    if isinstance(x, torch.Tensor):
        return x, False
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x), True
    if isinstance(x, np.generic):
        return torch.from_numpy(np.asarray(x)), True
    if hasattr(x, "__dlpack__") and not isinstance(x, type):
        return torch.from_dlpack(x), False
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, type):
        return torch.as_tensor(x, device="cuda"), False
    return None, False


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.numpy()  # the kernel checked that the outputs have NumPy dtypes


def resolve_stream(stream, device: torch.device | None) -> torch.device:
    """The device a call runs on, from `stream=` (a torch stream or a device) and the inputs'."""
    if stream is None:
        if device is not None:
            return device
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() \
            else torch.device("cpu")
    if isinstance(stream, torch.cuda.Stream):
        sdev = stream.device
    else:
        try:
            sdev = torch.device(stream)
        except (TypeError, RuntimeError):
            raise TypeError(f"stream must be a torch.cuda.Stream or a device, got {stream!r}") from None
        if sdev.type == "cuda" and sdev.index is None:
            sdev = torch.device("cuda", torch.cuda.current_device())
    if device is not None and sdev != device:
        raise ValueError(f"stream is on {sdev} but the array inputs are on {device}")
    return sdev


def aligned(t: torch.Tensor, size: int) -> bool:
    """Whether t's data starts on a multiple of `size` bytes (vector loads, TMA). A tensor without
    data (torch.compile's fake tensors) counts as aligned: what the real call sees decides."""
    try:
        return t.data_ptr() % size == 0
    except RuntimeError:
        return True

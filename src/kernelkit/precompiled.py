"""MLX's `mx.fast.precompiled_cuda_kernel`: a kernel compiled elsewhere (PTX, a cubin or a
fatbin: nvcc, NVRTC, Triton, a library's build) run on torch tensors, with MLX's calling
convention, so that code written for MLX's CUDA backend runs as written.

The kernel's parameters are the inputs' data pointers, then the outputs', then the scalars by
value (bool, int32, float32), in that order; nothing else (no shapes: a precompiled kernel gets
what its author passes as scalars). The grid counts threads, as `cuda_kernel`'s: the launch has
ceil(grid / threadgroup) blocks of the threadgroup clamped to the grid, and the kernel guards its
own index. The module is loaded once per device and binary. It runs only on an NVIDIA GPU; the
CPU backend cannot run PTX.
"""

from __future__ import annotations

import ctypes
import numbers
from collections.abc import Sequence
from typing import Any

import torch

from . import arrays
from .backends import get_backend
from .kernel import array_input, dims, listed, new_output, output_shape

CALLER = "precompiled_cuda_kernel"
# Scalars as MLX passes them: a bool as a byte, an int as int32, a float as float32.
_SCALAR_TYPES = {bool: ctypes.c_bool, int: ctypes.c_int32, float: ctypes.c_float}


def precompiled_cuda_kernel(*, name: str, compiled_source: bytes, inputs: Sequence[Any],
                            output_shapes: Sequence[Sequence[int]], output_dtypes: Sequence[Any],
                            scalars: Sequence[bool | int | float], grid: tuple[int, int, int],
                            threadgroup: tuple[int, int, int], shared_memory: int = 0,
                            init_value: float | None = None, ensure_row_contiguous: bool = False,
                            stream: torch.cuda.Stream | torch.device | str | None = None
                            ) -> list[torch.Tensor]:
    """Run a precompiled CUDA kernel, as MLX's `mx.fast.precompiled_cuda_kernel`.

    Args:
        name: the kernel's symbol in the module (its mangled name, unless it is `extern "C"`).
        compiled_source: the module as bytes: PTX text, a cubin or a fatbin.
        inputs: arrays (torch tensors, or anything with `__dlpack__`), or Python numbers (made
            0-d arrays: bool, int32, float32), passed as pointers, in order.
        output_shapes: a shape for each output.
        output_dtypes: a dtype for each output (torch dtypes, NumPy dtypes or names).
        scalars: bools, ints and floats passed by value after the outputs (bool as one byte,
            int as int32, float as float32).
        grid: threads in x, y and z (not blocks), as `cuda_kernel`'s.
        threadgroup: threads in a block in x, y and z.
        shared_memory: bytes of dynamic shared memory a block (more than 48 KiB where the GPU
            has it).
        init_value: a number every output is filled with before the launch; None leaves them
            uninitialised.
        ensure_row_contiguous: copy inputs that are not row-contiguous first (default False:
            the kernel gets each input's data pointer as it is).
        stream: a torch.cuda.Stream or a device to run on; default the inputs' device and its
            current stream.

    Returns:
        The outputs, torch tensors on the GPU.

    Raises:
        TypeError, ValueError: bad arguments, a module the driver refuses, or no kernel `name`
            in it; ValueError too for inputs that are not on an NVIDIA GPU.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"[{CALLER}] name must be the kernel's symbol, a non-empty str, got {name!r}.")
    binary = _module(compiled_source)
    inputs = listed(inputs, "inputs", CALLER)
    output_shapes = listed(output_shapes, "output_shapes", CALLER)
    output_dtypes = listed(output_dtypes, "output_dtypes", CALLER)
    if len(output_shapes) != len(output_dtypes):
        raise ValueError(f"[{CALLER}] Expected `output_dtypes` to have size {len(output_shapes)} (one "
                         f"per output shape) but got size {len(output_dtypes)}.")
    params = [_scalar(s, i) for i, s in enumerate(listed(scalars, "scalars", CALLER))]
    tensors, device = _inputs(inputs)
    device = arrays.resolve_stream(stream, device)
    if device.type != "cuda":
        raise ValueError(f"[{CALLER}] runs on an NVIDIA GPU (compiled_source is GPU code), but the call "
                         f"is on {device}: pass CUDA tensors or stream=.")
    shapes = [output_shape(s, f"output_shapes[{i}]", CALLER) for i, s in enumerate(output_shapes)]
    out_dtypes = [_dtype(d, i) for i, d in enumerate(output_dtypes)]
    grid = dims(grid, "grid", 0, CALLER)
    group = dims(threadgroup, "threadgroup", 1, CALLER)
    if not isinstance(shared_memory, numbers.Integral) or isinstance(shared_memory, bool) or shared_memory < 0:
        raise ValueError(f"[{CALLER}] shared_memory must be a non-negative int (bytes), got {shared_memory!r}.")
    if init_value is not None and (isinstance(init_value, bool) or not isinstance(init_value, numbers.Real)):
        raise TypeError(f"[{CALLER}] init_value must be a number or None, got {init_value!r}.")
    group = tuple(min(t, g) for t, g in zip(group, grid))  # (MLX's: a block never exceeds the grid)
    backend = get_backend(device)
    if 0 not in grid:
        backend.check_dispatch(device, grid, group, int(shared_memory), CALLER)
        func = backend.load_precompiled(device, binary, name, CALLER)
    # Copies, outputs and the launch in the order of one stream: `stream`'s, else the current one.
    with torch.cuda.stream(stream) if isinstance(stream, torch.cuda.Stream) else torch.cuda.device(device):
        tensors = [t.to(device) for t in tensors]  # (0-d ones were made on the CPU)
        if ensure_row_contiguous:
            tensors = [t.contiguous() for t in tensors]
        outputs = [new_output(s, d, device, init_value) for s, d in zip(shapes, out_dtypes)]
        if 0 in grid:  # an empty launch: the outputs as made
            return outputs
        pointers = [ctypes.c_void_p(t.data_ptr()) for t in (*tensors, *outputs)]
        backend.launch_params(func, device, grid, group, int(shared_memory), pointers + params, name)
    return outputs


def _module(source) -> bytes:
    """The module's bytes; PTX (text) NUL-terminated, as the driver reads it."""
    if isinstance(source, str):
        source = source.encode()
    if not isinstance(source, (bytes, bytearray, memoryview)) or not len(source):
        raise TypeError(f"[{CALLER}] compiled_source must be the compiled module as non-empty bytes "
                        f"(PTX, a cubin or a fatbin), got {type(source).__name__}.")
    source = bytes(source)
    binary = source.startswith(b"\x7fELF") or source.startswith(b"\x50\xed\x55\xba")  # cubin, fatbin
    return source if binary or source.endswith(b"\0") else source + b"\0"


def _scalar(value, i: int):
    kind = _SCALAR_TYPES.get(type(value))
    if kind is None:
        raise TypeError(f"[{CALLER}] scalars[{i}] must be a bool, an int or a float, got {value!r} "
                        f"({type(value).__name__}).")
    if kind is ctypes.c_int32 and not -2**31 <= value < 2**31:
        raise OverflowError(f"[{CALLER}] scalars[{i}] = {value} does not fit the kernel's int (int32).")
    return kind(value)


def _inputs(inputs) -> tuple[list[torch.Tensor], torch.device | None]:
    """The inputs as tensors, and the device of the array ones (None without any)."""
    tensors, device = [], None
    for i, x in enumerate(inputs):
        if arrays.is_scalar(x):
            tensors.append(torch.tensor(x, dtype=arrays.SCALAR_DTYPES[type(x)].torch))
            continue
        t, _ = array_input(x, f"inputs[{i}]", CALLER)
        if device is not None and t.device != device:
            raise ValueError(f"[{CALLER}] inputs are on different devices ({device} and {t.device}); "
                             "move them to one GPU first.")
        device = t.device
        tensors.append(t)
    return tensors, device


def _dtype(spec, i: int) -> arrays.DType:
    try:
        return arrays.dtype_of(spec)
    except TypeError as e:
        raise TypeError(f"[{CALLER}] output_dtypes[{i}]: {e}") from None

"""kernelkit: GPU kernels from source bodies, on NVIDIA GPUs and on the CPU.

    import kernelkit as kk
    kernel = kk.metal_kernel(name, input_names, output_names, source)
    outs = kernel(inputs=[...], output_shapes=[...], output_dtypes=[...],
                  grid=(n, 1, 1), threadgroup=(256, 1, 1))
"""

from __future__ import annotations

__version__ = "0.1.0"

import os as _os  # noqa: E402
from typing import TYPE_CHECKING as _TYPE_CHECKING  # noqa: E402

from .autodiff import custom_function  # noqa: E402
from .dialects import cuda as _cuda, metal as _metal  # noqa: E402
from .kernel import prepared as _prepared  # noqa: E402
from .cross import CompiledKernel, compile_for  # noqa: E402
from .errors import CompileError, GPUFault, KernelLaunchError, UnwrittenOutputWarning  # noqa: E402
from .preconditions import Preconditions  # noqa: E402
from .precompiled import precompiled_cuda_kernel  # noqa: E402


def _load_gpu_bindings() -> None:
    """Where an NVIDIA driver is installed, load NVIDIA's driver bindings with kernelkit
    (about 20 ms) rather than inside the first kernel call."""
    if _os.path.exists("/dev/nvidiactl"):
        try:
            from .backends.cuda import _driver
            _driver()
        except Exception:  # a broken CUDA install shows up, clearly, at the first CUDA call
            pass


_load_gpu_bindings()

if _TYPE_CHECKING:
    from collections.abc import Sequence

    from .kernel import Kernel


def metal_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str,
                 header: str = "", ensure_row_contiguous: bool = True,
                 atomic_outputs: bool = False,
                 compile_options: dict[str, str] | None = None) -> Kernel:
    """A kernel from the body of a Metal Shading Language function, as MLX's
    `mx.fast.metal_kernel`: only the body is given, and the signature is generated.

    The signature holds each input as a `const device T*` (a 0-d input or a Python scalar as
    `const constant T&`), each output as a `device T*`, `<name>_shape`, `<name>_strides` and
    `<name>_ndim` for each input the body mentions them for, and the Metal attributes the body
    names (`thread_position_in_grid`, `threadgroup_position_in_grid`,
    `thread_index_in_simdgroup`, ...). The body runs unchanged on an NVIDIA GPU (NVRTC) and on
    the CPU (the system C++ compiler; fibers make barriers and SIMD-group functions work).
    Building the same kernel again (inside a function called every step, as MLX code does)
    costs next to nothing.

    The kernel is called with keyword arguments only, as MLX's:

        outputs = kernel(inputs=[...], output_shapes=[...], output_dtypes=[...],
                         grid=(x, y, z), threadgroup=(x, y, z))

    - `inputs`: one per `input_names`: torch tensors (a kernel runs where they live: `cuda:N`
      on GPU N, on the current torch stream; CPU tensors on the CPU backend), NumPy arrays
      (CPU) or Python scalars (passed by value).
    - `output_shapes`, `output_dtypes`: one per `output_names`; the outputs are allocated
      (uninitialised unless `init_value`) and returned as a list of tensors.
    - `grid`: the number of **threads** (not threadgroups) in x, y, z, as Metal's
      `dispatchThreads`; `threadgroup`: the threads of one group (at most 1024).
    - `template`: `[("T", torch.float32), ("N", 4), ("FLAG", True)]`: dtypes, ints and bools
      the body sees as compile-time types and constants; each new combination compiles once.
    - `init_value`: fill the outputs before the launch: one value for all, or a list with a
      value (or None) per output.
    - `verbose=True` prints the full generated source; `stream=` a torch stream or device to
      launch on; `ensure_row_contiguous=` overrides the kernel's choice for this call.
    - `check_bounds=True`: raise `IndexError` at the first out-of-bounds buffer access;
      `timeout=seconds`: raise `TimeoutError` when a loop runs past it (both compile a checked
      variant and make the call synchronous).

    Args:
        name: the kernel's name, a C identifier (`kk_<name>` in profilers).
        input_names: the names the body uses for the inputs, in call order.
        output_names: the names the body uses for the outputs, in return order.
        source: the body: statements of the kernel function, without its signature.
        header: code placed before the kernel (helper functions, `#include`s, constants).
        ensure_row_contiguous: copy inputs that are not row-contiguous before the launch
            (MLX's default). With False, strided views are passed as they are: index them
            with `elem_to_loc(i, inp_shape, inp_strides, inp_ndim)`.
        atomic_outputs: declare the outputs `device atomic<T>*` for
            `atomic_fetch_add_explicit` and the other Metal atomics.
        compile_options: `{"math_mode": "safe" | "relaxed" | "fast"}`; MLX's default "safe"
            (`metal::precise::` functions stay accurate, `metal::fast::` fast, in every mode).
            As in Metal, "safe" fuses multiply-adds; `#pragma METAL fp contract(off)` in the
            source turns that off and `#pragma METAL fp math_mode(...)` sets the mode, each for
            the whole kernel (docs/msl.md).

    Returns:
        A kernel object; calling it compiles (once per dtypes, template values and device,
            cached in memory and on disk) and launches it.

    Example:
        ```python
        import torch
        import kernelkit as kk

        kernel = kk.metal_kernel(
            name="myexp", input_names=["inp"], output_names=["out"],
            source=\"\"\"
                uint elem = thread_position_in_grid.x;
                out[elem] = metal::exp(inp[elem]);
            \"\"\",
        )
        a = torch.randn(4096)
        out = kernel(inputs=[a], grid=(a.numel(), 1, 1), threadgroup=(256, 1, 1),
                     output_shapes=[a.shape], output_dtypes=[a.dtype])[0]
        ```

    Raises:
        TypeError, ValueError: bad names, source or options, at once with the kernel's name;
            bad call arguments at the call.
        CompileError: at the first call, quoting the body's line.
    """
    return _prepared(_metal, name, input_names, output_names, source, header, ensure_row_contiguous,
                     atomic_outputs, compile_options)


def cuda_kernel(name: str, input_names: Sequence[str], output_names: Sequence[str], source: str,
                header: str = "", ensure_row_contiguous: bool = True, shared_memory: int = 0,
                compile_options: dict[str, str] | None = None) -> Kernel:
    """A kernel from the body of a CUDA C++ `__global__` function, as MLX's
    `mx.fast.cuda_kernel`: the same call as `metal_kernel`'s.

    The generated signature holds each input as a `const T*`, each output as a `T*`,
    `<name>_shape` and `<name>_strides` as fixed-size arrays (with `.data()`) and `<name>_ndim`
    for inputs the body mentions them for, and template values as compile-time constants and
    type aliases. The body may use `threadIdx`, `blockIdx`, `blockDim`, `gridDim`,
    `__syncthreads`, warp shuffles, atomics, `cooperative_groups` (as `cg`), `elem_to_loc`
    and `WARP_SIZE`; on the CPU backend too.

    `grid` counts **threads**, not blocks, as in MLX: a launch has
    `ceil(grid / threadgroup)` whole blocks, so the body guards its index
    (`if (i < n)`), as a CUDA kernel does.

    Args:
        name: the kernel's name, a C identifier (`kk_<name>` in profilers).
        input_names: the names the body uses for the inputs, in call order.
        output_names: the names the body uses for the outputs, in return order.
        source: the body: statements of the kernel function, without its signature.
        header: code placed before the kernel (`__device__` helpers, `#include`s).
        ensure_row_contiguous: copy inputs that are not row-contiguous before the launch.
            With False, index strided views with `elem_to_loc`.
        shared_memory: bytes of dynamic shared memory per block, for an
            `extern __shared__` array (48 KiB and more are allowed where the GPU has them).
        compile_options: `{"math_mode": "safe" | "relaxed" | "fast"}`; default "relaxed"
            (NVRTC's default); "fast" is `--use_fast_math`.

    Returns:
        A kernel object; calling it compiles (once per dtypes, template values and device,
            cached in memory and on disk) and launches it; the call's arguments are
            `metal_kernel`'s.

    Example:
        ```python
        import torch
        import kernelkit as kk

        kernel = kk.cuda_kernel(
            name="axpy", input_names=["x", "y"], output_names=["out"],
            source=\"\"\"
                auto i = blockIdx.x * blockDim.x + threadIdx.x;
                if (i < x_shape[0]) out[i] = a * x[i] + y[i];
            \"\"\",
        )
        x, y = torch.randn(1000), torch.randn(1000)
        out = kernel(inputs=[x, y], template=[("a", 2)], grid=(1000, 1, 1),
                     threadgroup=(256, 1, 1), output_shapes=[x.shape],
                     output_dtypes=[x.dtype])[0]
        ```

    Raises:
        TypeError, ValueError: bad names, source or options, at once with the kernel's name;
            bad call arguments at the call.
        CompileError: at the first call, quoting the body's line.
    """
    return _prepared(_cuda, name, input_names, output_names, source, header, ensure_row_contiguous,
                     False, compile_options, shared_memory)


def __getattr__(name):
    if name == "ops":  # `kk.ops` without `import kernelkit.ops`; imported on first use
        import importlib
        return importlib.import_module(".ops", __name__)
    raise AttributeError(f"module 'kernelkit' has no attribute {name!r}")


__all__ = ["metal_kernel", "cuda_kernel", "precompiled_cuda_kernel", "custom_function", "compile_for",
           "CompiledKernel", "ops",
           "CompileError",
           "KernelLaunchError", "GPUFault", "UnwrittenOutputWarning", "__version__"]

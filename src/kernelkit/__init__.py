"""kernelkit: GPU kernels from source bodies, on NVIDIA GPUs and on the CPU.

    import kernelkit as kk
    kernel = kk.metal_kernel(name, input_names, output_names, source)
    outs = kernel(inputs=[...], output_shapes=[...], output_dtypes=[...],
                  grid=(n, 1, 1), threadgroup=(256, 1, 1))
"""

__version__ = "0.1.0"

import os as _os  # noqa: E402

from .autodiff import custom_function  # noqa: E402
from .errors import CompileError, GPUFault, KernelLaunchError  # noqa: E402
from .preconditions import Preconditions  # noqa: E402


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


def metal_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True,
                 atomic_outputs=False, compile_options=None):
    """A kernel from a Metal Shading Language body, as MLX's `mx.fast.metal_kernel`."""
    from .dialects import metal
    from .kernel import Kernel
    return Kernel(metal, name, input_names, output_names, source, header, ensure_row_contiguous,
                  atomic_outputs, compile_options)


def cuda_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True,
                shared_memory=0, compile_options=None):
    """A kernel from a CUDA C++ body, as MLX's `mx.fast.cuda_kernel`; the same call as
    metal_kernel's (`grid` counts threads). `shared_memory`: dynamic shared memory in bytes."""
    from .dialects import cuda
    from .kernel import Kernel
    return Kernel(cuda, name, input_names, output_names, source, header, ensure_row_contiguous,
                  False, compile_options, shared_memory)


__all__ = ["metal_kernel", "cuda_kernel", "custom_function", "CompileError", "KernelLaunchError",
           "GPUFault", "__version__"]

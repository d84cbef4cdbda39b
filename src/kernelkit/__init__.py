"""kernelkit: GPU kernels from source bodies, on NVIDIA GPUs and on the CPU.

    import kernelkit as kk
    kernel = kk.metal_kernel(name, input_names, output_names, source)
    outs = kernel(inputs=[...], output_shapes=[...], output_dtypes=[...],
                  grid=(n, 1, 1), threadgroup=(256, 1, 1))
"""

__version__ = "0.1.0"

from .errors import CompileError, KernelLaunchError  # noqa: E402


def metal_kernel(name, input_names, output_names, source, header="", ensure_row_contiguous=True,
                 atomic_outputs=False, compile_options=None):
    """A kernel from a Metal Shading Language body, as MLX's `mx.fast.metal_kernel`."""
    from .dialects import metal
    from .kernel import Kernel
    return Kernel(metal, name, input_names, output_names, source, header, ensure_row_contiguous,
                  atomic_outputs, compile_options)


__all__ = ["metal_kernel", "CompileError", "KernelLaunchError", "__version__"]

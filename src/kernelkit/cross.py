"""Compiling kernels for a GPU without one: `compile_for`, and `kernelkit check`.

NVRTC needs no GPU, so a machine without one (a laptop, CI) can prove that its kernels compile
for an NVIDIA architecture: `kk.compile_for(kernel, "sm_90", **call_args)` compiles the kernel a
call with those arguments would launch; with KERNELKIT_CHECK_ARCH=sm_90[,sm_80...] (what
`kernelkit check FILE.py` sets) every kernel a program builds is also compiled for those
architectures, through the compile cache, a CompileError naming the architecture if one fails.
"""

from __future__ import annotations

import operator
import os
from dataclasses import dataclass

from .errors import CompileError

_ARCHS = tuple(a for a in os.environ.get("KERNELKIT_CHECK_ARCH", "").split(",") if a)
compiled: list[tuple[str, str]] = []  # (kernel name, arch) compiled by the check, in order


@dataclass(frozen=True)
class CompiledKernel:
    """A kernel compiled for one architecture: the machine code and the unit it came from."""

    name: str
    arch: str  # what it was compiled for: "sm_90", or "sm_90a" for tensor-op kernels on sm_90
    binary: bytes  # the cubin
    source: str  # the generated CUDA C++


def set_check_archs(archs) -> None:
    """Compile every kernel built from now on for these architectures too (None: none)."""
    global _ARCHS
    _ARCHS = tuple(archs or ())


def check_archs() -> tuple[str, ...]:
    return _ARCHS


def build_for(kernel, sig, arch: str) -> CompiledKernel:
    """The variant of `sig` compiled for `arch`, through the compile cache."""
    from .backends import cuda
    from .cache import CACHE, key_of
    source = kernel._generate("cuda", sig)
    flags = tuple(kernel.dialect.compile_flags("cuda", kernel.math_mode, kernel.fp_contract))
    target = cuda.target_arch(arch, source)
    try:
        binary = CACHE.get(key_of(source, kernel.math_mode, *flags, target, cuda.nvrtc_identity()),
                           ".cubin", source,
                           lambda: cuda.compile_source(source, target, kernel.math_mode, flags))
    except CompileError as e:
        raise e.with_context(f"[{kernel.caller}] kernel {kernel.name!r} for {target}",
                             kernel.source, kernel.header) from None
    compiled.append((kernel.name, target))
    return CompiledKernel(kernel.name, target, binary, source)


def compile_for(kernel, arch: str = "sm_90", **call_args) -> CompiledKernel:
    """Compile `kernel` for the NVIDIA architecture `arch` ("sm_80", "sm_90"...), as a call with
    `call_args` (the call's own keywords: inputs, output_dtypes, template...; output_shapes,
    grid and threadgroup may be left out) would launch it; no GPU needed. Inputs may be tensors on
    any device, "meta" ones included, or Python scalars. Raises CompileError if it does not compile.

        kk.compile_for(kernel, "sm_90", inputs=[torch.empty(8, device="meta")],
                       output_dtypes=[torch.float32], template=[("T", torch.float32)])
    """
    from .signature import Signature
    unknown = set(call_args) - {"inputs", "output_dtypes", "output_shapes", "grid", "threadgroup",
                                "template", "init_value", "ensure_row_contiguous", "stream",
                                "verbose", "check_bounds", "timeout"}
    if unknown:
        raise TypeError(f"[compile_for] unknown call arguments {sorted(unknown)}.")
    if not isinstance(arch, str) or not arch.startswith("sm_"):
        raise ValueError(f"[compile_for] arch must name an NVIDIA architecture like 'sm_90', "
                         f"got {arch!r}.")
    inputs = kernel._sequence(call_args.get("inputs"), "inputs", len(kernel.input_names))
    dtypes = kernel._sequence(call_args.get("output_dtypes"), "output_dtypes",
                              len(kernel.output_names))
    contiguous = call_args.get("ensure_row_contiguous")
    _, specs, _, _ = kernel._inputs(inputs, kernel.ensure_row_contiguous if contiguous is None
                                    else contiguous)
    out_dtypes = tuple(kernel._dtype(d, i) for i, d in enumerate(dtypes))
    group, grid = call_args.get("threadgroup"), call_args.get("grid")
    if group is not None:  # as the launch clamps it to the grid
        group = [min(operator.index(g), operator.index(n)) for g, n in zip(group, grid or group)]
    sig = Signature(list(zip(kernel.input_names, specs)), list(zip(kernel.output_names, out_dtypes)),
                    kernel.atomic_outputs, kernel._template(call_args.get("template")),
                    kernel._uses, None, mma_lanes=kernel._mma_lanes(group))
    return build_for(kernel, sig, arch)

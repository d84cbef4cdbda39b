"""The CUDA front end: MLX's `cuda_kernel` bodies.

A CUDA body is already C++ for NVRTC; the front end only rewrites `extern
__shared__` arrays (so the CPU can hand each group its dynamic shared memory)
and renders the signature as MLX's CUDA custom kernels have it: inputs `const
T*` (0-d arrays too), outputs `T*`, `name_shape` / `name_strides` as fixed-size
arrays with `.data()`, `name_ndim` an int, template values as compile-time
constants and type aliases at the top of the body.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..signature import ATTRIBUTES, Param, render_template_value
from .tokens import identifiers, tokenize, untokenize

NAME = "cuda_kernel"
PRELUDE = "kernelkit/cuda.h"
NAMESPACE = "kk_cuda"
DEFAULT_MATH_MODE = "relaxed"  # nvcc's and NVRTC's default: fused multiply-add, IEEE division
# As MLX's CUDA custom kernels: ceil(grid / threadgroup) whole blocks, threads past `grid` included
# (bodies guard with `if (i < n)`), so block-wide reductions see full blocks. Unlike MLX, a block
# is never larger than the grid (as Metal clamps it), so a grid smaller than one block runs no
# thread past it.
WHOLE_GROUPS = True
CALL_PROLOGUE = "KK_CUDA_BIND_THREAD(t, a.kk_shared); "
_CPU_STUBS = Path(__file__).resolve().parent.parent / "include" / "cpu_cuda_stubs"

_TYPES = {"float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float", "float64": "double",
          "bool": "bool"}
_SYNC = re.compile(r"__syncthreads\w*|__syncwarp|__shfl\w*|__ballot_sync|__any_sync|__all_sync|__uni_sync|"
                   r"__reduce_\w+_sync|__match_\w+_sync|__activemask|cooperative_groups|cg|"
                   r"this_thread_block|tiled_partition|coalesced_threads|"
                   r"(?:matmul|convolution)2d\w*|\w*cooperative_tensor\w*|reduce_(?:rows|columns)")  # tensor ops: SIMD-group ops
_COOPERATIVE = {"cooperative_groups", "cg"}
_TENSOR_OPS = re.compile(r"#\s*include\s*[<\"]kernelkit/tensor_ops\.h[>\"]")


def type_name(dtype) -> str:
    if dtype.name == "complex64":  # (complex64_t is the Metal prelude's)
        raise TypeError("[cuda_kernel] complex64 buffers are for metal_kernel (complex64_t); pass "
                        "torch.view_as_real(x), a float32 view, to a cuda_kernel.")
    return _TYPES.get(dtype.name, dtype.name + "_t")  # int8 -> int8_t ...


def uses_sync(idents: set[str]) -> bool:
    return any(_SYNC.fullmatch(i) for i in idents)


def fp_pragmas(header: str, body: str) -> tuple[str | None, bool]:
    """CUDA C++ sets its math in compile options alone."""
    return None, True


def compile_flags(target: str, math_mode: str, contract: bool = True) -> list[str]:
    if target == "cuda":
        return ["--use_fast_math"] if math_mode == "fast" else []
    return [f"-I{_CPU_STUBS}"]  # <cuda_fp16.h>, <cooperative_groups.h>... in a user's header


def front_end(header: str, body: str) -> tuple[str, str]:
    return _extern_shared(header), _extern_shared(body)


def _extern_shared(source: str) -> str:
    """`extern __shared__ T name[];` -> `KK_EXTERN_SHARED(T, name);` (same line count)."""
    tokens = tokenize(source)
    code = [i for i, t in enumerate(tokens) if t.kind not in ("ws", "comment")]
    for n, i in enumerate(code):
        if tokens[i].text != "extern" or n + 1 >= len(code) or tokens[code[n + 1]].text != "__shared__":
            continue
        # extern __shared__ <type tokens> name [ ] ;
        end = next((k for k in range(n + 2, len(code)) if tokens[code[k]].text == ";"), None)
        if end is None or end - n < 6 or [tokens[code[k]].text for k in (end - 2, end - 1)] != ["[", "]"]:
            continue
        name = tokens[code[end - 3]].text
        ctype = untokenize(tokens[code[n + 2]:code[end - 3]]).strip()
        for k in range(code[n], code[end]):
            if "\n" not in tokens[k].text:
                tokens[k].text = ""
        tokens[code[n]].text = f"KK_EXTERN_SHARED({ctype}, {name})"
    return untokenize(tokens)


def mentions(body: str) -> set[str]:
    """Identifiers that shape the signature: `name_shape` & co. (Metal's attributes are plain
    names in CUDA)."""
    return identifiers(body) - set(ATTRIBUTES)


def defines(header: str, body: str) -> list[str]:
    out = []
    if _COOPERATIVE & (identifiers(header) | identifiers(body)):
        out.append("#define KK_CUDA_COOPERATIVE_GROUPS 1")
    if _TENSOR_OPS.search(header) or _TENSOR_OPS.search(body):
        out.append("#define KK_TENSOR_OPS 1")  # codegen.TENSOR_OPS: C++20, the header after the prelude
    return out


def uses_simdgroup_matrix(header: str, body: str) -> bool:
    return False  # MSL's type: a CUDA body's lanes are the hardware's


def open_unit(header: str, body: str) -> list[str]:
    """As MLX: the user's header at global scope, the kernel in its own namespace."""
    lines = ['#line 1 "header"', header, '#line 1 "kernelkit-generated"', f"namespace {NAMESPACE} {{"]
    if _COOPERATIVE & (identifiers(header) | identifiers(body)):
        lines.append("namespace cg = cooperative_groups;")
    return lines


def kernel_function(fn: str, sig, body: str) -> list[str]:
    params = ",\n    ".join(param_decl(p) for p in sig.params)
    constants = [f"  {_constant(n, v)}" for n, v in sig.template]
    return [f"KK_FN void {fn}(\n    {params}) {{", *constants, '#line 1 "body"', body, "}"]


def _constant(name: str, value) -> str:
    if isinstance(value, bool):
        return f"constexpr bool {name} = {render_template_value(value, type_name)};"
    if isinstance(value, int):
        return f"constexpr int {name} = {value};"
    return f"using {name} = {type_name(value)};"


def call_target(fn: str, sig) -> str:
    return fn


def param_decl(p: Param) -> str:
    t = type_name(p.dtype) if p.dtype else ""
    if p.role == "input":  # arrays, 0-d arrays and Python scalars alike, as MLX's CUDA kernels
        return f"const {t}* {p.name}"
    if p.role == "output":
        return f"{t}* {p.name}"
    if p.role == "shape":
        return f"const kk::array<int, {p.capacity}>& {p.name}"
    if p.role == "strides":
        return f"const kk::array<int64_t, {p.capacity}>& {p.name}"
    if p.role == "ndim":
        return f"const int {p.name}"
    raise AssertionError(p)


def call_arg(p: Param) -> str:
    if p.role in ("shape", "strides"):
        return f"kk::as_array(a.{p.name})"
    if p.by_value:  # a Python scalar travels in the argument block; the body reads it as name[0]
        return f"&a.{p.name}"
    return f"a.{p.name}"


def source_view(name: str, signature, header: str, body: str) -> str:
    """The kernel as MLX generates it for CUDA (printed by `verbose=True`)."""
    lines = [header.rstrip(), ""] if header.strip() else []
    params = ",\n    ".join(param_decl(p) for p in signature.params)
    lines.append(f"__global__ void custom_kernel_{name}(\n    {params}) {{")
    lines += [f"  {_constant(n, v)}" for n, v in signature.template]
    lines += [body.rstrip(), "}"]
    return "\n".join(lines) + "\n"

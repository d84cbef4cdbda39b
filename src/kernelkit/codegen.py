"""One translation unit from a signature, a dialect front end and a target.

The frame is the same for every dialect and target (DESIGN.md): prelude, the
dialect's part (the user's header and the kernel function), the argument block
(its layout checked against signature.py's by static_assert), `kk_call`, which
passes the block's fields to the kernel function, and the target's entry, which
turns the target's thread ids into a kk_thread_ctx and calls `kk_call`.
"""

from __future__ import annotations

import os

from .signature import Signature

# A kernel that uses tensor ops (include/kernelkit/tensor_ops.h) says so with this line, which the
# dialect's `defines` emits: the header follows the prelude, and the backends compile the unit as
# C++20 (matmul2d takes its descriptor as a class-type template argument) and, on a Hopper GPU,
# for sm_90a.
TENSOR_OPS = "#define KK_TENSOR_OPS 1"


def uses_tensor_ops(source: str) -> bool:
    return TENSOR_OPS in source


# A Metal kernel that uses simdgroup_matrix, launched in whole warps, numbers its lanes as mma.sync's
# fragments (target_cuda.h): a variant of its own (Signature.mma_lanes), so that only one lane
# order's code is compiled into it.
MMA_LANES = "#define KK_MMA_LANE_ORDER 1"


MATH_MODES = ("safe", "relaxed", "fast")  # compile_options' math_mode, strictest first
MATH_MACROS = {"safe": "KK_MATH_SAFE", "relaxed": "KK_MATH_RELAXED", "fast": "KK_MATH_FAST"}
# The header that defines each target's entry machinery.
_ENTRY_HEADER = {"cuda": "kernelkit/entry_cuda.h", "cpu": "kernelkit/cpu_group.h"}


def function_name(name: str) -> str:
    return f"custom_kernel_{name}"


def generate(dialect, target: str, name: str, sig: Signature, header: str, body: str,
             math_mode: str, uses_sync: bool, debug=None) -> str:
    """Full C++ source for `target` ("cuda" or "cpu"); `uses_sync`: barriers or SIMD functions;
    `debug`: a checked variant's debugging.Plan (header and body already rewritten for it)."""
    ns = dialect.NAMESPACE
    fn = function_name(name)
    defines = dialect.defines(header, body)
    if sig.tensor_views and TENSOR_OPS not in defines:  # name_tensor views (dialects/metal.py)
        defines.append(TENSOR_OPS)
    out = [f"#define KK_TARGET_{target.upper()} 1",
           f"#define {MATH_MACROS[math_mode]} 1",
           *defines, *([MMA_LANES] if sig.mma_lanes else []),
           f"#include <{dialect.PRELUDE}>"]
    if TENSOR_OPS in defines:
        if "KK_EXTERN_SHARED(" in header + body:  # the body's dynamic shared memory starts where
            out.append("#define KK_TOPS_NO_WARPGROUP 1")  # the warpgroup path's would: mma.sync
        if sig.report or os.environ.get("KERNELKIT_TENSOR_OPS_REPORT", "0") not in ("", "0"):
            out.append("#define KK_TOPS_REPORT 1")  # each run prints its path (tensor_ops/matmul2d.h)
        out.append("#include <kernelkit/tensor_ops.h>")
    if target == "cpu":  # threads of a group as fibers, or as a plain loop
        out.append(f"#define KK_CPU_SYNC {int(uses_sync)}")
    out.append(f"#include <{_ENTRY_HEADER[target]}>")
    if debug is not None:
        out += debug.prelude()
    out += dialect.open_unit(header, body)
    out += dialect.kernel_function(fn, sig, body)
    out.append('#line 1 "kernelkit-generated"')
    out.append(_argument_block(sig, dialect.type_name))
    args = ", ".join(dialect.call_arg(p) for p in sig.params)
    prologue = dialect.CALL_PROLOGUE
    if debug is not None:
        out.append(debug.bind_function())
        prologue = debug.call_prologue(target) + prologue
    out.append(f"KK_FN void kk_call(const kk_args& a, const kk_thread_ctx& t) {{\n"
               f"  {prologue}{dialect.call_target(fn, sig)}({args});\n}}")
    out.append(f"}}  // namespace {ns}")
    if target == "cuda":
        out.append("#include <kernelkit/entry_bounds.h>")
    entry = debug.entry(target, ns, entry_name(name)) if debug is not None else None
    out.append(entry or _ENTRY[target].format(ns=ns, entry=entry_name(name)))
    return "\n".join(out) + "\n"


_FIELD_TYPES = {"int": "int", "int64": "int64_t", "dim3": "kk_dim3", "unsigned": "unsigned",
                "record": "unsigned long long*", "llong": "long long"}


def _argument_block(sig: Signature, type_name) -> str:
    lines = ["struct kk_args {"]
    for f in sig.fields:
        ctype = {"pointer": lambda: type_name(f.dtype) + "*", "value": lambda: type_name(f.dtype)}.get(
            f.kind, lambda: _FIELD_TYPES[f.kind])()
        count = 1 if f.kind == "dim3" else f.count
        lines.append(f"  {ctype} {f.name}" + (f"[{count}];" if count > 1 else ";"))
    lines.append("};")
    # The Python side packs this block from signature.py's layout: check that the compiler agrees
    # (field offsets where the compiler has __builtin_offsetof: not every NVRTC does).
    lines.append("#if defined(KK_TARGET_CPU)")
    lines += [f"static_assert(__builtin_offsetof(kk_args, {f.name}) == {f.offset}, "
              f"\"kernelkit: argument block layout ({f.name})\");" for f in sig.fields]
    lines.append("#endif")
    lines.append(f"static_assert(sizeof(kk_args) == {sig.block.size}, \"kernelkit: argument block size\");")
    return "\n".join(lines)


def entry_name(name: str) -> str:
    """The GPU entry's symbol: profilers (Nsight, nvprof) list kernels by it."""
    return f"kk_{name}"


_ENTRY = {
    "cuda": """extern "C" __global__ void KK_ENTRY_BOUNDS {entry}(const {ns}::kk_args a) {{
  kk_thread_ctx t;
  if (!kk::cuda_thread_ctx(a.kk_grid, t)) return;
  {ns}::kk_call(a, t);
}}""",
    "cpu": """static inline void kk_thread_body(const {ns}::kk_args& a, const kk_thread_ctx& t) {{
  {ns}::kk_call(a, t);
}}
KK_CPU_ENTRY({ns}::kk_args, kk_thread_body)""",
}

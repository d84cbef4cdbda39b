"""One translation unit from a signature, a dialect front end and a target.

The shape is the same for every dialect and target (DESIGN.md): prelude,
the user's header and the body function inside the dialect's namespace, the
argument block (its layout checked against signature.py's by static_assert),
and the target's entry, which turns the target's thread ids into a
kk_thread_ctx and calls the body function.
"""

from __future__ import annotations

from .signature import Signature, render_template_value

MATH_MACROS = {"safe": "KK_MATH_SAFE", "relaxed": "KK_MATH_RELAXED", "fast": "KK_MATH_FAST"}


def function_name(name: str) -> str:
    return f"custom_kernel_{name}"


# The header that defines each target's entry machinery.
_ENTRY_HEADER = {"cuda": "kernelkit/entry_cuda.h", "cpu": "kernelkit/cpu_group.h"}


def generate(dialect, target: str, name: str, sig: Signature, header: str, body: str,
             math_mode: str, uses_sync: bool) -> str:
    """Full C++ source for `target` ("cuda" or "cpu"); `uses_sync`: barriers or SIMD functions."""
    ns = dialect.NAMESPACE
    fn = function_name(name)
    out = [f"#define KK_TARGET_{target.upper()} 1",
           f"#define {MATH_MACROS[math_mode]} 1",
           f"#include <{dialect.PRELUDE}>"]
    out += [f"#include <{h}>" for h in dialect.ENTRY_PRELUDES]
    if target == "cpu":  # threads of a group as fibers, or as a plain loop
        out.append(f"#define KK_CPU_SYNC {int(uses_sync)}")
    out.append(f"#include <{_ENTRY_HEADER[target]}>")
    out.append(f"namespace {ns} {{")
    out.append('#line 1 "header"')
    out.append(header)
    if sig.template:
        out.append('#line 1 "kernelkit-generated"')
        out.append("template <" + ", ".join(dialect.template_param(n, v) for n, v in sig.template) + ">")
    params = ",\n    ".join(dialect.param_decl(p) for p in sig.params)
    out.append(f"KK_FN void {fn}(\n    {params}) {{")
    out.append('#line 1 "body"')
    out.append(body)
    out.append("}")
    out.append('#line 1 "kernelkit-generated"')
    out.append(_argument_block(sig))
    targs = ""
    if sig.template:
        targs = "<" + ", ".join(render_template_value(v) for _, v in sig.template) + ">"
    args = ", ".join(dialect.call_arg(p) for p in sig.params)
    # Called from the target's entry; inside the namespace, so template values name its types.
    out.append(f"KK_FN void kk_call(const kk_args& a, const kk_thread_ctx& t) {{\n"
               f"  {fn}{targs}({args});\n}}")
    out.append(f"}}  // namespace {ns}")
    out.append(_ENTRY[target].format(call=f"{ns}::kk_call(a, t);", args=f"{ns}::kk_args"))
    return "\n".join(out) + "\n"


def _argument_block(sig: Signature) -> str:
    lines = ["struct kk_args {"]
    for f in sig.fields:
        if f.name == "kk_grid":
            lines.append("  kk_dim3 kk_grid;")
        else:
            lines.append(f"  {f.ctype} {f.name}" + (f"[{f.count}];" if f.count > 1 else ";"))
    lines.append("};")
    # The Python side packs this block from signature.py's layout: check that the compiler agrees
    # (field offsets where the compiler has __builtin_offsetof: not every NVRTC does).
    lines.append("#if defined(KK_TARGET_CPU)")
    lines += [f"static_assert(__builtin_offsetof(kk_args, {f.name}) == {f.offset}, "
              f"\"kernelkit: argument block layout ({f.name})\");" for f in sig.fields]
    lines.append("#endif")
    lines.append(f"static_assert(sizeof(kk_args) == {sig.block.size}, \"kernelkit: argument block size\");")
    return "\n".join(lines)


_ENTRY = {
    "cuda": """extern "C" __global__ void kk_entry(const {args} a) {{
  kk_thread_ctx t;
  if (!kk::cuda_thread_ctx(a.kk_grid, t)) return;
  {call}
}}""",
    "cpu": """static inline void kk_thread_body(const {args}& a, const kk_thread_ctx& t) {{
  {call}
}}
KK_CPU_ENTRY({args}, kk_thread_body)""",
}

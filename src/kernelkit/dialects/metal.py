"""The Metal Shading Language front end.

MSL is C++14 with address spaces, attributes and a standard library. The
library is the prelude (`include/kernelkit/metal.h`), compiled inside
`namespace metal` so MSL's names hide CUDA's and libc's. What is left for this
front end is a token-level rewrite that keeps line numbers:

- `device`, `thread`, and `threadgroup` on pointers and references vanish (one
  flat address space on both targets); `constant` becomes `const`; of overloads
  on address spaces alone then the same, the later definition goes;
- a `threadgroup` declaration becomes `KK_THREADGROUP` storage (CUDA shared
  memory; per-group memory on the CPU); program-scope `constant` data is put
  in `KK_PROGRAM_CONSTANT` storage (CUDA constant memory);
- swizzles: `v.xy` -> `v.template swizzle<0,1>()`, `c.rgb` likewise, and the
  single colour names `.r .g .b .a` -> `.x .y .z .w`, unless the user's source
  declares that name for something else;
- `c ? a : b`: each operand cast to its type for the pair (`kk_detail::cond_operand_t`),
  so that a half or bfloat meets another arithmetic type as in MSL (`c ? h : 0.0f` is a
  float) rather than as two class-convertible types C++ refuses.
"""

from __future__ import annotations

import re

from ..codegen import MATH_MODES
from ..signature import Param, render_template_value
from .tokens import Token, identifiers, tokenize, untokenize

NAME = "metal_kernel"
PRELUDE = "kernelkit/metal.h"
NAMESPACE = "metal"
DEFAULT_MATH_MODE = "safe"  # MLX's metal_kernel default (compile_options math_mode, "safe")
# Metal's dispatchThreads: threadgroups clamped to the grid, edge groups partial.
WHOLE_GROUPS = False

_SWIZZLE = re.compile(r"(?:[xyzw]{1,4}|[rgba]{1,4})\Z")
_COMPONENT = {c: i for i, c in enumerate("xyzw")} | {c: i for i, c in enumerate("rgba")}
# Names whose use means the kernel synchronises threads: the CPU runs it as fibers.
_SYNC = re.compile(r"(?:simd_|quad_)\w+|(?:threadgroup|simdgroup)_barrier")
# Tensor ops (include/kernelkit/tensor_ops.h): a body or header that includes their Metal headers or
# names them. Their ops are SIMD-group operations: the CPU runs such kernels as fibers.
_TENSOR_OPS_INCLUDE = re.compile(
    r"#\s*include\s*<(?:metal_tensor|metal_simdgroup_matrix|MetalPerformancePrimitives/\w+\.h)>")
# (simdgroup_barrier and the attribute simdgroup_index_in_threadgroup are not tensor ops)
_TENSOR_OPS_NAMES = re.compile(r"(?:matmul|convolution)2d\w*|\w*cooperative_tensor\w*|reduce_(?:rows|columns)|dextents|"
                               r"tensor_(?:inline|handle|offset)|"
                               r"simdgroup_(?!barrier\Z|index_in_threadgroup\Z)\w+|make_filled_simdgroup_matrix")
# simdgroup_matrix's names: such a kernel numbers its lanes as mma.sync's fragments (target_cuda.h)
_SIMDGROUP_MATRIX = re.compile(r"simdgroup_(?:matrix|(?:float|half|bfloat)8x8|multiply(?:_accumulate)?|load|store)|"
                               r"make_filled_simdgroup_matrix")


def uses_sync(idents: set[str]) -> bool:
    return any(_SYNC.fullmatch(i) or _TENSOR_OPS_NAMES.fullmatch(i) for i in idents)


def uses_tensor_ops(header: str, body: str) -> bool:
    return any(_TENSOR_OPS_INCLUDE.search(t) for t in (header, body)) or \
        any(_TENSOR_OPS_NAMES.fullmatch(i) for i in identifiers(header) | identifiers(body))


def lower(source: str, avoid: set[str], program_scope: bool) -> str:
    """Rewrite MSL-only syntax; `avoid` are identifiers that must not be read as swizzles."""
    tokens = tokenize(source)
    written = [t.text for t in tokens]
    _lower_tokens(tokens, avoid, program_scope)
    _address_space_overloads(tokens, written)
    return untokenize(tokens)


def _lower_tokens(tokens: list[Token], avoid: set[str], program_scope: bool) -> None:
    code = [i for i, t in enumerate(tokens) if t.kind not in ("ws", "comment")]
    depth = 0  # braces and parentheses: `constant` at depth 0 of a header is program-scope data
    for n, i in enumerate(code):
        t = tokens[i]
        if t.kind == "pp":
            m = re.match(r"#\s*define\s+\w+(?:\([^)]*\))?", t.text)
            if m:  # a macro's replacement text is MSL too
                t.text = m.group() + lower(t.text[m.end():], avoid, program_scope=False)
            elif _FP_PRAGMA.match(t.text):
                t.text = ""  # read by fp_pragmas: the unit's compile flags
            else:
                t.text = _loop_pragma(t.text)
            continue
        if t.kind == "punct":
            depth += t.text in "{(" and len(t.text) == 1
            depth -= t.text in "})" and len(t.text) == 1
            continue
        if t.kind == "number":
            t.text = _literal(t.text)
            continue
        if t.kind != "ident":
            continue
        if t.text == "_Pragma":  # _Pragma("clang loop ..."): MLX's STEEL_PRAGMA_UNROLL
            _pragma_operator(tokens, code, n)
            continue
        prev = tokens[code[n - 1]].text if n else ""
        if prev in (".", "->"):
            if _SWIZZLE.match(t.text) and t.text not in avoid and len(t.text) > 1 \
                    or t.text in "rgba" and t.text not in avoid:
                after = tokens[code[n + 1]].text if n + 1 < len(code) else ""
                t.text = _swizzle(t.text, written=after in _ASSIGNMENTS)
            continue
        if t.text == "constant":
            t.text = _constant(tokens, code, n, program_scope and depth == 0)
        elif t.text in ("device", "thread"):
            t.text = ""
        elif t.text == "threadgroup":
            # a template argument (`tensor<threadgroup half, ...>`) or a pointer/reference: vanishes
            template_argument = n and tokens[code[n - 1]].text in ("<", ",")
            t.text = "" if template_argument or _is_pointer_or_reference(tokens, code, n) else "KK_THREADGROUP"
    _conditionals(tokens, code)


# Names before a parenthesis and a brace that are not a function's: `if (c) {`...
_STATEMENTS = {"if", "for", "while", "switch", "catch", "return", "sizeof", "alignof", "decltype", "static_assert",
               "noexcept", "requires", "else", "do"}
_SCOPES = {"struct", "class", "union", "namespace"}  # bodies that hold definitions
_BRANCH = re.compile(r"#\s*(?:if|ifdef|ifndef|elif|else|endif)\b")


def _address_space_overloads(tokens: list[Token], written: list[str]) -> None:
    """Drop the definitions that MSL overloads on address spaces alone (`float sum(device float4*
    v) {...}` beside `float sum(thread float4* v) {...}`): with the address spaces gone they are one
    definition twice, which C++ refuses. A later definition goes where it is then the same as an
    earlier one of its scope, token for token (so it compiles to the same function: one flat
    address space), and was not as written (two definitions the same as written stay: a
    redefinition in MSL too). Its lines stay, empty, so that diagnostics keep their line numbers."""
    code = [i for i, t in enumerate(tokens) if t.kind not in ("ws", "comment") and t.text]
    match, stack = {}, []
    for n, i in enumerate(code):
        text = tokens[i].text
        if text in ("(", "{", "["):
            stack.append(n)
        elif text in (")", "}", "]") and stack:
            match[n] = stack.pop()
            match[match[n]] = n
    scopes = [None]  # the `{` of each enclosing scope that holds definitions; False: a block or function
    definitions = []  # (scope, first and last code index) of each function defined in such a scope
    region = 0  # conditional compilation: definitions in different #if branches are never the same
    for n, i in enumerate(code):
        text = tokens[i].text
        if tokens[i].kind == "pp" and _BRANCH.match(text):
            region += 1
        elif text == "}" and len(scopes) > 1:
            scopes.pop()
        elif text == "{":
            start, name = _declaration(tokens, code, match, n)
            if name is not None and scopes[-1] is not False and n in match:
                definitions.append(((scopes[-1], region), start, match[n]))
                scopes.append(False)
            else:
                head = {tokens[code[k]].text for k in range(start, n)}
                scopes.append(n if head & _SCOPES and scopes[-1] is not False else False)
    seen: dict[tuple, str] = {}
    for scope, start, end in definitions:
        first, last = code[start], code[end]
        key = (scope, " ".join(tokens[code[k]].text for k in range(start, end + 1)))
        as_written = " ".join(written[k] for k in range(first, last + 1) if tokens[k].kind not in ("ws", "comment"))
        if seen.setdefault(key, as_written) != as_written:
            for k in range(first, last + 1):
                tokens[k].text = "\n" * tokens[k].text.count("\n")


def _declaration(tokens: list[Token], code: list[int], match: dict, n: int) -> tuple[int, str | None]:
    """(where the declaration before the `{` at code[n] starts, its function's name or None where
    the brace opens no function's body)."""
    start = n
    while start and tokens[code[start - 1]].text not in (";", "{", "}", ":") and \
            tokens[code[start - 1]].kind != "pp":
        start -= 1
    if start and tokens[code[start - 1]].text == ":" and \
            (start < 2 or tokens[code[start - 2]].text not in ("public", "private", "protected")):
        return start, None  # (a constructor's initializers, whose own declaration starts earlier)
    p = n - 1
    while p >= start and tokens[code[p]].text in ("const", "noexcept", "override", "final", "&", "&&", "mutable"):
        p -= 1
    if p < start or tokens[code[p]].text != ")" or match.get(p, -1) <= start:
        return start, None
    name = tokens[code[match[p] - 1]]
    return start, name.text if name.kind == "ident" and name.text not in _STATEMENTS else None


# `c ? a : b` -> `c ? static_cast<C<a, b>>(a) : static_cast<C<b, a>>(b)`: C is
# kk_detail::cond_operand_t<decltype((a)), decltype((b))> (kernelkit/metal/half.h).
_COND_CAST = "static_cast<::metal::kk_detail::cond_operand_t<decltype(({})), decltype(({}))>>("
_COND_COPY_LIMIT = 4096  # characters of operands an outer conditional copies: chains triple them
_NULL_POINTER = re.compile(r"(?:0[xX][0-9a-fA-F']+|[0-9][0-9']*)[uUlLzZ]*|NULL|nullptr")
_WORD = re.compile(r"\w+")


def _conditionals(tokens: list[Token], code: list[int]) -> None:
    """Cast the operands of every conditional operator (the module's docstring). Inner ones go
    first, so an outer one copies them cast. One stays as written where an operand's extent is
    unclear (_operand_end) or an operand is a lone integer literal: a null pointer constant must
    stay one, and an integer never meets a half ambiguously."""
    texts = [tokens[i].text for i in code]  # as lowered: the structure; copies read the tokens
    for n in reversed([n for n, x in enumerate(texts) if x == "?"]):
        colon = _operand_end(texts, n + 1, second=True)
        end = None if colon is None else _operand_end(texts, colon + 1, second=False)
        if end is None:
            continue
        spans = ((n + 1, colon), (colon + 1, end))
        if any(hi == lo or hi - lo == 1 and _NULL_POINTER.fullmatch(texts[lo]) for lo, hi in spans):
            continue  # GNU's `c ?: b`, or a lone integer
        a, b = (" ".join(tokens[code[k]].text for k in range(lo, hi)) for lo, hi in spans)
        if len(a) + len(b) > _COND_COPY_LIMIT:
            continue
        tokens[code[n + 1]].text = _COND_CAST.format(a, b) + tokens[code[n + 1]].text
        tokens[code[colon - 1]].text += ")"
        tokens[code[colon + 1]].text = _COND_CAST.format(b, a) + tokens[code[colon + 1]].text
        tokens[code[end - 1]].text += ")"


def _operand_end(texts: list[str], k: int, second: bool) -> int | None:
    """The code position that ends the conditional's operand starting at k: its `:` (second
    operand), or the `,` `;` `:` or closing bracket after it (third); None where unclear: a
    lambda, a macro's line break, a `<` or `>` that may close a template argument list."""
    depth = nested = angle = 0
    for j in range(k, len(texts)):
        x = texts[j]
        subscript = j > k and (_WORD.fullmatch(texts[j - 1]) or texts[j - 1] in (")", "]"))
        if x[:1] in ("#", "\\") or x == "[" and not subscript:
            return None  # a preprocessor line or continuation, or a lambda's captures
        if x in ("(", "[", "{"):
            depth += 1
        elif x in (")", "]", "}"):
            if depth == 0:
                return None if second else j
            depth -= 1
        elif depth:
            continue
        elif x == "?":
            nested += 1
        elif x == ":" and nested:
            nested -= 1
        elif x == ":":
            return j
        elif x == ";":
            return None if second else j
        elif second:
            continue  # up to its `:`, a second operand may hold commas and template arguments
        elif x == ",":
            return None if angle else j
        elif x == "<" and _WORD.fullmatch(texts[j - 1]):
            angle += 1  # a template's arguments, maybe: a `,` in them stays in the operand
        elif x in (">", ">>"):
            if not angle:
                return None  # a comparison, or the end of an enclosing template argument list
            angle = max(0, angle - len(x))
    return None if second else len(texts)


def _pragma_operator(tokens: list[Token], code: list[int], n: int) -> None:
    """`_Pragma("clang loop unroll(full)")` (in a macro, as MLX's steel kernels write it) as the
    #pragma line it stands for (_loop_pragma)."""
    parts = [tokens[i] for i in code[n + 1:n + 4]]
    if len(parts) < 3 or parts[0].text != "(" or parts[1].kind != "string" or parts[2].text != ")":
        return
    line = "#pragma " + parts[1].text[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    hint = _loop_pragma(line)
    if hint != line:
        tokens[code[n]].text = hint
        for t in parts:
            t.text = ""


def _loop_pragma(line: str) -> str:
    """Clang's loop hints (`#pragma clang loop unroll(full)`, as the tensor-ops talk writes its
    loops over cooperative tensors) as the target compiler's: a loop NVRTC leaves rolled keeps a
    cooperative tensor indexed at run time, in local memory. Other hints (vectorize, interleave)
    go: neither compiler reads them."""
    m = re.match(r"#\s*pragma\s+clang\s+loop\b(.*)", line, re.S)
    if not m:
        return line
    hints = dict(re.findall(r"(\w+)\s*\(\s*(\w+)\s*\)", m.group(1)))
    unroll, count = hints.get("unroll"), hints.get("unroll_count")
    if count is not None:
        return f"KK_UNROLL_COUNT({count})"
    if unroll in ("full", "enable"):
        return "KK_UNROLL_FULL"
    if unroll == "disable":
        return "KK_UNROLL_COUNT(1)"
    return ""


def _constant(tokens: list[Token], code: list[int], n: int, program_scope: bool) -> str:
    """`constant` data is read-only: C++ `const`, in constant storage at program scope."""
    declaration = [tokens[i].text for i in code[n + 1:n + 64]]
    declaration = declaration[:next((k for k, x in enumerate(declaration) if x in (";", "=", "{")),
                                    len(declaration))]
    neighbours = {tokens[code[n - 1]].text if n else "", *declaration[:1]}
    already = "const" in neighbours or "constexpr" in declaration
    if program_scope and not _is_pointer_or_reference(tokens, code, n):
        return "KK_PROGRAM_CONSTANT" if already else "KK_PROGRAM_CONSTANT const"
    return "" if already else "const"


def _is_pointer_or_reference(tokens: list[Token], code: list[int], n: int) -> bool:
    """Does the declaration starting after code[n] declare a pointer or reference?"""
    angle = 0
    for i in code[n + 1:]:
        text = tokens[i].text
        if text == "<":
            angle += 1
        elif text == ">":
            angle -= 1
        elif text == ">>":
            angle -= 2
        elif angle <= 0:
            if text in ("*", "&", "&&"):
                return True
            if text == "(":  # `(&r)[N]`, `(*p)[N]`: a parenthesised declarator
                after = next((tokens[j].text for j in code if j > i), "")
                return after in ("*", "&", "&&")
            if text in (";", "=", "[", ")", ",", "{", "}"):
                return False
    return False


_ASSIGNMENTS = {"=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "<<=", ">>="}


def _swizzle(name: str, written: bool = False) -> str:
    """`v.xy` as a read (a new vector), or left of an assignment a reference to those components
    (MSL: "the component group notation can occur on the left-hand side")."""
    if len(name) == 1:
        return "xyzw"[_COMPONENT[name]]
    member = "swizzle_ref" if written else "swizzle"
    return f"template {member}<" + ",".join(str(_COMPONENT[c]) for c in name) + ">()"


# MSL's half and bfloat literals: 0.5h / 0.5H, 0.5bf / 0.5BF (a decimal floating literal; 0xbf is hex).
_FLOAT16_LITERAL = re.compile(r"((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)(h|H|bf|BF)")


def _literal(text: str) -> str:
    m = _FLOAT16_LITERAL.fullmatch(text)
    if not m or text[:2] in ("0x", "0X"):
        return text
    number = m.group(1) if any(c in m.group(1) for c in ".eE") else m.group(1) + "."  # 2h: 2.f
    return f"{'half' if m.group(2) in 'hH' else 'bfloat'}({number}f)"


def member_names(source: str) -> set[str]:
    """Names the user's struct/class/union bodies declare as members (data or functions): those
    are never read as swizzles. Names inside member function bodies, enumerators, and parameter
    lists like `g(struct Pt p)` or `template <class T>` declare no members."""
    tokens = [t for t in tokenize(source) if t.kind not in ("ws", "comment")]
    found, depth, bodies = set(), 0, []  # brace depths of the open aggregate bodies
    head = None  # after struct/class/union: "name" (may see a name), "bases", or None
    for n, t in enumerate(tokens):
        text, prev = t.text, tokens[n - 1].text if n else ""
        if t.kind == "ident" and text in ("struct", "class", "union") and prev != "enum" \
                and not (text == "class" and prev in ("<", ",")):
            head = "name"
        elif head == "name" and t.kind == "ident":
            head = "after-name"
        elif head in ("name", "after-name") and text == ":":
            head = "bases"
        elif head and text == "{":
            bodies.append(depth + 1)
            head = None
        elif head and head != "bases":
            head = None  # `struct S s;`, `struct Pt p)`: no body follows
        if text == "{":
            depth += 1
        elif text == "}":
            if bodies and bodies[-1] == depth:
                bodies.pop()
            depth -= 1
        elif t.kind == "ident" and bodies and bodies[-1] == depth and n + 1 < len(tokens) \
                and tokens[n + 1].text in (";", ",", "[", "=", ":", "(") and prev not in (".", "->"):
            found.add(text)
    return found


# --- rendering of the signature --------------------------------------------------------------

CALL_PROLOGUE = ""


def type_name(dtype) -> str:
    return dtype.ctype  # MLX's Metal spelling: float16_t, bfloat16_t, float, int32_t...


def defines(header: str, body: str) -> list[str]:
    if uses_tensor_ops(header, body):  # codegen.TENSOR_OPS, and simdgroup_matrix (MSL only)
        return ["#define KK_TENSOR_OPS 1", "#define KK_TENSOR_OPS_MSL 1"]
    return []


def uses_simdgroup_matrix(header: str, body: str) -> bool:
    """Whether a launch in whole warps numbers its lanes as mma.sync's fragments (codegen.MMA_LANES)."""
    return "simdgroup_matrix" in header + body or any(
        _SIMDGROUP_MATRIX.fullmatch(i) for i in identifiers(header) | identifiers(body))


# MSL's floating-point pragmas (MSL spec 1.6.3; clang's and C's contraction pragmas too)
_FP_PRAGMA = re.compile(r"#\s*pragma\s+(?:METAL\s+fp\s+(math_mode|contract)|clang\s+fp\s+(contract))\s*"
                        r"\(\s*([\w-]+)\s*\)|#\s*pragma\s+STDC\s+(FP_CONTRACT)\s+(\w+)")


def fp_pragmas(header: str, body: str) -> tuple[str | None, bool]:
    """(math mode, contraction) that the source's `#pragma METAL fp math_mode(...)` and
    `#pragma METAL fp contract(...)` (or clang's `fp contract`, C's `STDC FP_CONTRACT`) ask for.
    Metal applies them from where they stand; NVRTC and g++ take these settings for a whole unit,
    so the unit gets the strictest asked: the first of safe, relaxed, fast that a pragma names
    (None: none names one), and contraction off where any pragma turns it off."""
    modes, contract = set(), True
    if "pragma" not in header and "pragma" not in body:  # the usual kernel: no second tokenizing
        return None, contract
    for text in (header, body):
        for t in tokenize(text):
            m = _FP_PRAGMA.match(t.text) if t.kind == "pp" else None
            if m is None:
                continue
            what, value = m.group(1) or m.group(2) or m.group(4), (m.group(3) or m.group(5)).lower()
            if what == "math_mode":
                if value not in MATH_MODES:
                    raise ValueError(f"[{NAME}] #pragma METAL fp math_mode({value}): expected one of "
                                     f"{', '.join(MATH_MODES)}.")
                modes.add(value)
            elif value == "off":
                contract = False
    return next((m for m in MATH_MODES if m in modes), None), contract


def compile_flags(target: str, math_mode: str, contract: bool = True) -> list[str]:
    if contract:
        return []
    return ["-fmad=false"] if target == "cuda" else ["-ffp-contract=off"]


def open_unit(header: str, body: str) -> list[str]:
    """The user's header goes inside namespace metal, where MSL's names hide the target's; its
    includes of other than Metal's headers (<cstdio>, <vector>...) are made first, at global scope,
    where the C++ library must be declared (each keeps its line for messages)."""
    hoisted, header = _hoist_includes(header)
    return [*hoisted, f"namespace {NAMESPACE} {{", '#line 1 "header"', header]


_INCLUDE = re.compile(r"\s*#\s*include\s*[<\"]([^>\"]+)[>\"]")
_CONDITIONAL = re.compile(r"\s*#\s*(if|ifdef|ifndef|endif)\b")
_METAL_HEADER = re.compile(r"metal_\w+|MetalPerformancePrimitives/.*|kernelkit/.*")


def _hoist_includes(header: str) -> tuple[list[str], str]:
    """(#line + #include lines for global scope, the header with those lines left blank). Only
    unconditional includes move: one under #if stays where it is, as written."""
    hoisted, lines, depth = [], header.split("\n"), 0
    for i, line in enumerate(lines):
        m = _CONDITIONAL.match(line)
        if m:
            depth += -1 if m.group(1) == "endif" else 1
            continue
        m = _INCLUDE.match(line)
        if m and depth == 0 and not _METAL_HEADER.fullmatch(m.group(1)):
            hoisted += [f'#line {i + 1} "header"', line]
            lines[i] = ""
    return hoisted, "\n".join(lines)


def kernel_function(fn: str, sig, body: str) -> list[str]:
    lines = []
    if sig.template:
        lines += ['#line 1 "kernelkit-generated"',
                  "template <" + ", ".join(template_param(n, v) for n, v in sig.template) + ">"]
    params = ",\n    ".join(param_decl(p) for p in sig.params)
    views = [tensor_view(name, rank) for name, rank in sig.tensor_views]
    return lines + [f"KK_FN void {fn}(\n    {params}) {{", *views, '#line 1 "body"', body, "}"]


def tensor_view(name: str, rank: int) -> str:
    """`name_tensor`: an inline metal::tensor over input `name`, extents and strides innermost first."""
    dims = ", ".join(f"{name}_shape[{rank - 1 - d}]" for d in range(rank))
    strides = ", ".join(f"int({name}_strides[{rank - 1 - d}])" for d in range(rank))
    return f"auto {name}_tensor = tensor({name}, dextents<int, {rank}>({dims}), array<int, {rank}>{{{strides}}});"


def call_target(fn: str, sig) -> str:
    if not sig.template:
        return fn
    return fn + "<" + ", ".join(render_template_value(v, type_name) for _, v in sig.template) + ">"


def param_decl(p: Param) -> str:
    """The C++ parameter of the body function (what the body sees)."""
    t = type_name(p.dtype) if p.dtype else ""
    if p.role == "input":
        return f"const {t}& {p.name}" if p.scalar else f"const {t}* {p.name}"
    if p.role == "output":
        return f"atomic<{t}>* {p.name}" if p.atomic else f"{t}* {p.name}"
    if p.role == "shape":
        return f"const int* {p.name}"
    if p.role == "strides":
        return f"const int64_t* {p.name}"
    if p.role == "ndim":
        return f"const int& {p.name}"
    return f"const {p.attribute_type} {p.name}"


def msl_param_decl(p: Param, buffer: int) -> str:
    """The same parameter as MLX writes it in Metal, for `verbose`."""
    if p.role == "attribute":
        return f"{p.attribute_type} {p.name} [[{p.name}]]"
    t = type_name(p.dtype) if p.dtype else ""
    if p.role == "input":
        decl = f"const constant {t}& {p.name}" if p.scalar else f"const device {t}* {p.name}"
    elif p.role == "output":
        decl = f"device atomic<{t}>* {p.name}" if p.atomic else f"device {t}* {p.name}"
    elif p.role == "shape":
        decl = f"const constant int* {p.name}"
    elif p.role == "strides":
        decl = f"const constant int64_t* {p.name}"
    else:
        decl = f"const constant int& {p.name}"
    return f"{decl} [[buffer({buffer})]]"


def call_arg(p: Param) -> str:
    """How kk_call passes the argument-block field `a.<name>` to the body function."""
    if p.role == "attribute":
        return f"kk_attr::{p.name}(t)"
    if p.role == "input" and p.scalar and not p.by_value:
        return f"*a.{p.name}"
    if p.role == "output" and p.atomic:
        return f"reinterpret_cast<atomic<{type_name(p.dtype)}>*>(a.{p.name})"
    return f"a.{p.name}"


def source_view(name: str, signature, header: str, body: str) -> str:
    """The kernel as MLX would generate it in Metal (printed by `verbose=True`)."""
    lines = [header.rstrip(), ""] if header.strip() else []
    if signature.template:
        lines.append("template <" + ", ".join(template_param(n, v) for n, v in signature.template) + ">")
    buffers = [p for p in signature.params if p.role != "attribute"]
    decls = [msl_param_decl(p, i) for i, p in enumerate(buffers)]
    decls += [msl_param_decl(p, 0) for p in signature.params if p.role == "attribute"]
    lines.append(f"[[kernel]] void custom_kernel_{name}(\n  " + ",\n  ".join(decls) + ") {")
    lines += [body.rstrip(), "}"]
    return "\n".join(lines) + "\n"


def template_param(name: str, value) -> str:
    if isinstance(value, bool):
        return f"bool {name}"
    if isinstance(value, int):
        return f"int {name}"
    return f"typename {name}"


def front_end(header: str, body: str) -> tuple[str, str]:
    """Lowered (header, body)."""
    avoid = member_names(header) | member_names(body)
    return lower(header, avoid, program_scope=True), lower(body, avoid, program_scope=False)


def mentions(body: str) -> set[str]:
    return identifiers(body)

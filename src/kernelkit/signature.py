"""The kernel's parameters, described once for every dialect and target.

A `Signature` is built from the names, the call's arrays and template values,
and the identifiers the body mentions (as MLX does: `inp_shape` only if the
body says `inp_shape`, each attribute only if the body names it). The dialects
render it (MSL text, C++ parameters, the entry's call); the backends pack the
argument block from the same description, so the layout is written once.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .arrays import DType, dtype_of, integral

# MLX's 20 Metal attributes, with their types.
ATTRIBUTES = {
    **{n: "uint3" for n in (
        "thread_position_in_grid", "thread_position_in_threadgroup",
        "threadgroup_position_in_grid", "threadgroups_per_grid", "threads_per_grid",
        "threads_per_threadgroup", "dispatch_threads_per_threadgroup", "grid_origin",
        "grid_size")},
    **{n: "uint" for n in (
        "thread_index_in_threadgroup", "thread_index_in_simdgroup", "thread_index_in_quadgroup",
        "simdgroup_index_in_threadgroup", "quadgroup_index_in_threadgroup",
        "simdgroups_per_threadgroup", "quadgroups_per_threadgroup",
        "dispatch_simdgroups_per_threadgroup", "dispatch_quadgroups_per_threadgroup",
        "threads_per_simdgroup", "thread_execution_width")},
}

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# C++20's keywords and alternative tokens, and MSL's address spaces and attribute words.
_KEYWORDS = frozenset("""
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t
char32_t class compl concept const consteval constexpr constinit const_cast continue co_await
co_return co_yield decltype default delete do double dynamic_cast else enum explicit export extern
false float for friend goto if inline int long mutable namespace new noexcept not not_eq nullptr
operator or or_eq private protected public register reinterpret_cast requires return short signed
sizeof static static_assert static_cast struct switch template this thread_local throw true try
typedef typeid typename union unsigned using virtual void volatile wchar_t while xor xor_eq
device constant thread threadgroup threadgroup_imageblock ray_data object_data kernel vertex
fragment visible stitchable
""".split())
# Names the preludes (kernelkit/metal.h, kernelkit/cuda.h and their targets) define: types,
# macros and namespaces a parameter of that name would hide or break.
_VECTOR_BASES = ("bool", "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half",
                 "float", "double", "bfloat")
_PRELUDE_NAMES = frozenset("""
half bfloat bfloat16_t float16_t uchar ushort ulong uint size_t ptrdiff_t intptr_t uintptr_t
int8_t int16_t int32_t int64_t uint8_t uint16_t uint32_t uint64_t dim3 uint3 metal std mpp cg
NULL INFINITY NAN MAXFLOAT HUGE_VALF HUGE_VAL FLT_MAX FLT_MIN DBL_MAX INT_MAX INT_MIN UINT_MAX
METAL_FUNC WARP_SIZE threadIdx blockIdx blockDim gridDim warpSize
""".split()) | {f"{b}{n}" for b in _VECTOR_BASES for n in (2, 3, 4)}
# How fastcall.cpp fills each field of the argument block (the order of its FieldKind).
FILL_KINDS = ("input_pointer", "output_pointer", "bool_value", "int_value", "float_value", "shape",
              "strides", "ndim")
# Strides and shapes travel in fixed-size arrays; more dims compile a wider variant.
NDIM_CAPACITY = 8


def check_identifier(name, what: str, caller: str, prefixed: bool = False) -> str:
    """name, if the generated code can declare it; else ValueError saying why not. A `prefixed`
    name only ever follows a prefix (a kernel's: custom_kernel_<name>, kk_<name>), so any
    identifier will do, as in MLX (ZMLX names every kernel kk_...)."""
    if not isinstance(name, str) or not _IDENT.match(name):
        raise ValueError(f"[{caller}] {what} {name!r} is not a C++ identifier (letters, digits "
                         "and '_', not starting with a digit).")
    if prefixed:
        return name
    why = None
    if name in _KEYWORDS:
        why = "is a C++ or Metal keyword"
    elif name in _PRELUDE_NAMES:
        why = "is a type, macro or namespace the kernel's prelude defines"
    elif name.lower().startswith("kk_") or name.startswith("__") or re.match(r"_[A-Z]", name):
        why = "is reserved ('kk_'/'KK_' names are kernelkit's, '__' and '_X' names the compiler's)"
    if why:
        raise ValueError(f"[{caller}] {what} {name!r} {why}; choose another name.")
    return name


class InputSpec(NamedTuple):
    """What the generated code needs to know of one input (not its shape: binaries are shape-free)."""

    dtype: DType
    scalar: bool  # a 0-d array or a Python scalar: `const T& name`
    by_value: bool  # a Python scalar: its value travels in the argument block
    ndim_capacity: int  # capacity of name_shape/name_strides when the body uses them
    rank: int = 0  # the exact ndim when the body mentions name_tensor (its metal::tensor view's rank)


@dataclass(frozen=True)
class Param:
    name: str
    role: str  # input | output | shape | strides | ndim | attribute
    dtype: DType | None = None  # element type of inputs and outputs (the dialect spells it)
    index: int = 0  # position among inputs/outputs; for shape/strides/ndim: the input's
    scalar: bool = False
    by_value: bool = False
    atomic: bool = False
    capacity: int = 0
    attribute_type: str = ""  # "uint3" or "uint", for attributes


@dataclass(frozen=True)
class Field:
    """One field of the argument block, laid out as a C compiler lays out a struct."""

    name: str
    kind: str  # pointer | value (of dtype) | int | int64 | dim3 | unsigned
    dtype: DType | None
    code: str  # struct format code of one element
    count: int
    size: int  # of one element
    offset: int


class Signature:
    def __init__(self, inputs: list[tuple[str, InputSpec]], outputs: list[tuple[str, DType]],
                 atomic_outputs: bool, template: list[tuple[str, object]], uses: set[str],
                 debug=None, report: bool = False, mma_lanes: bool = False):
        self.template = template
        self.mma_lanes = mma_lanes  # simdgroup_matrix in whole warps: lanes in mma.sync's order
        self.debug = debug  # a checked variant's debugging.Plan (its fields end the block)
        self.report = report  # tensor ops: each matmul2d run prints its path (verbose=True)
        # (name, rank) of each input whose body mentions name_tensor: the dialect declares that
        # view (tensor ops) from the input's pointer, shape and strides.
        self.tensor_views = [(name, spec.rank) for name, spec in inputs
                             if not spec.scalar and spec.rank and f"{name}_tensor" in uses]
        views = {name for name, _ in self.tensor_views}
        params: list[Param] = []
        for i, (name, spec) in enumerate(inputs):
            params.append(Param(name, "input", spec.dtype, i, spec.scalar, spec.by_value))
            if spec.scalar:
                continue
            cap = spec.ndim_capacity
            if f"{name}_shape" in uses or name in views:
                params.append(Param(f"{name}_shape", "shape", index=i, capacity=cap))
            if f"{name}_strides" in uses or name in views:
                params.append(Param(f"{name}_strides", "strides", index=i, capacity=cap))
            if f"{name}_ndim" in uses:
                params.append(Param(f"{name}_ndim", "ndim", index=i))
        for i, (name, dtype) in enumerate(outputs):
            params.append(Param(name, "output", dtype, i, atomic=atomic_outputs))
        for name, ctype in ATTRIBUTES.items():
            if name in uses:
                params.append(Param(name, "attribute", attribute_type=ctype))
        self.params = params
        self.fields = self._layout()
        self.block = struct.Struct("<" + "".join(
            _pad(prev, f) + (f"{f.count}{f.code}" if f.count > 1 else f.code)
            for prev, f in zip([None] + self.fields[:-1], self.fields)) + _tail(self.fields))

    def packer(self):
        """pack(inputs, outputs, tail) -> the argument block (bytes), `tail` = (*grid, shared).

        Generated Python, one expression per field (as Triton's launchers are), so that packing
        costs about one `struct.pack` however many parameters the kernel has.
        """
        exprs = []
        for p in self.params:
            x = f"ins[{p.index}]"
            if p.role == "input":
                exprs.append(x if p.by_value else f"{x}.data_ptr()")
            elif p.role == "output":
                exprs.append(f"outs[{p.index}].data_ptr()")
            elif p.role in ("shape", "strides"):
                values = f"{x}.shape" if p.role == "shape" else f"{x}.stride()"
                exprs.append(f"*{values}, *_ZEROS[:{p.capacity} - {x}.dim()]")
            elif p.role == "ndim":
                exprs.append(f"{x}.dim()")
        code = f"lambda ins, outs, tail: pack({', '.join(exprs + ['*tail'])})"
        return eval(code, {"pack": self.block.pack, "_ZEROS": (0,) * 64})  # noqa: S307 - our own text

    def fill_table(self) -> tuple[tuple[int, int, int, int], ...]:
        """(kind, index, offset, capacity) of each field a call fills: what the compiled launcher
        (fastcall.cpp, its FieldKind) packs in place of packer()."""
        value_kinds = {"?": "bool_value", "i": "int_value", "f": "float_value"}
        table = []
        for p, f in zip((p for p in self.params if p.role != "attribute"), self.fields):
            if p.role == "input":
                kind = value_kinds[f.code] if p.by_value else "input_pointer"
            else:
                kind = {"output": "output_pointer"}.get(p.role, p.role)
            table.append((FILL_KINDS.index(kind), p.index, f.offset, p.capacity))
        return tuple(table)

    def constant_block(self, tail) -> bytes:
        """The argument block with only kk_grid and kk_shared filled (`tail` = (*grid, shared))."""
        constant = {"kk_grid": tuple(tail[:3]), "kk_shared": (tail[3],)}
        return self.block.pack(*(v for f in self.fields for v in constant.get(f.name, (0,) * f.count)))

    def _layout(self) -> list[Field]:
        fields, offset = [], 0

        def add(name, kind, dtype, code, size, count=1):
            nonlocal offset
            offset = -(-offset // size) * size  # natural alignment of the element
            fields.append(Field(name, kind, dtype, code, count, size, offset))
            offset += size * count

        for p in self.params:
            if p.role == "attribute":
                continue
            if p.role == "input" and p.by_value:
                add(p.name, "value", p.dtype, p.dtype.struct_code, p.dtype.itemsize)
            elif p.role in ("input", "output"):
                add(p.name, "pointer", p.dtype, "Q", 8)
            elif p.role == "shape":
                add(p.name, "int", None, "i", 4, p.capacity)
            elif p.role == "strides":
                add(p.name, "int64", None, "q", 8, p.capacity)
            elif p.role == "ndim":
                add(p.name, "int", None, "i", 4)
        add("kk_grid", "dim3", None, "I", 4, 3)  # Metal's grid, in threads
        add("kk_shared", "unsigned", None, "I", 4)  # dynamic shared memory, bytes
        if self.debug is not None:  # checked variants (debugging.py): packed after kk_shared
            add("kk_dbg", "record", None, "Q", 8)  # the record buffer
            add("kk_timeout_ns", "llong", None, "q", 8)
            if self.debug.buffers:  # each checked buffer's size in elements
                add("kk_dbg_size", "llong", None, "q", 8, len(self.debug.buffers))
        return fields


def _pad(prev: Field | None, f: Field) -> str:
    end = 0 if prev is None else prev.offset + prev.size * prev.count
    return "x" * (f.offset - end)


def _tail(fields: list[Field]) -> str:
    end = fields[-1].offset + fields[-1].size * fields[-1].count
    align = max(f.size for f in fields)
    return "x" * (-(-end // align) * align - end)


def template_args(template, param_names: set[str], caller: str) -> list[tuple[str, object]]:
    """Checked (name, value) pairs: value is a DType, a bool or an int."""
    if template is None:
        return []
    if isinstance(template, dict):
        template = list(template.items())
    out, seen = [], set()
    for item in template:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise TypeError(f"[{caller}] template entries must be (name, value) pairs, got {item!r}.")
        name, value = item
        check_identifier(name, "template name", caller)
        if name in param_names or name in ATTRIBUTES:
            raise ValueError(f"[{caller}] template name {name!r} collides with a parameter of "
                             "the kernel; rename one of them.")
        if name in seen:
            raise ValueError(f"[{caller}] template name {name!r} is given twice.")
        seen.add(name)
        out.append((name, _template_value(name, value, caller)))
    return out


def _template_value(name: str, value, caller: str):
    """A template value as generated code takes it: a bool, an int (anything integral, as
    `operator.index` takes it), or a DType."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if not isinstance(value, (float, np.floating)):
        try:
            value = integral(value)
        except TypeError:
            pass
        else:
            if not -2**31 <= value < 2**31:
                raise ValueError(f"[{caller}] template value {name}={value} does not fit an int.")
            return value
    try:
        return dtype_of(value)
    except TypeError:
        raise TypeError(f"[{caller}] template value for {name!r} must be a dtype, an int "
                        f"or a bool, got {value!r}.") from None


def render_template_value(value, type_name) -> str:
    if isinstance(value, DType):
        return type_name(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)

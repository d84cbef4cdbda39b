"""Property-based tests (issue 7): hypothesis drives the signature generator and the MSL front end
with random dtypes, shapes, strides, templates and attribute sets on the CPU backend, and compares
against references written here in torch, NumPy or plain Python.

Compiles are what cost: every new (body, dtypes, template values) compiles a CPU kernel (and,
without a GPU, conftest compiles it for sm_90 with NVRTC too). So an example compiles at most one
kernel and then launches it on several random views; the tests that vary only shapes, strides and
values reuse a few kernels; the front-end grammar tests compile nothing.
"""

import contextlib
import io
import math
import random
import re
import struct
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kernelkit as kk
from kernelkit import codegen
from kernelkit.arrays import dtype_of
from kernelkit.backends import cpu as cpu_backend
from kernelkit.dialects import cuda as cuda_dialect
from kernelkit.dialects import metal
from kernelkit.signature import ATTRIBUTES, InputSpec, Signature

# Every example is independent; no example database is written into the checkout.
FAST = settings(deadline=None, database=None, max_examples=150,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COMPILING = settings(FAST, max_examples=20)

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "bfloat16", "float32", "float64"]
HELPERS = ("shape", "strides", "ndim")
ATTRS = list(ATTRIBUTES)
DIALECTS = {"metal": metal, "cuda": cuda_dialect}
MAKE = {"metal": kk.metal_kernel, "cuda": kk.cuda_kernel}
CUDA_TYPE = {"bool": "bool", "float16": "__half", "bfloat16": "__nv_bfloat16", "float32": "float",
             "float64": "double"}
PY_DTYPE = {"bool": "bool", "int": "int32", "float": "float32"}  # Python scalars, typed as MLX does


# =============================================================================================
# The signature generator, end to end
#
# A kernel plan fixes the body: its inputs (arrays, 0-d arrays, Python scalars; the dtype of
# each; which of name_shape / name_strides / name_ndim the body mentions), its templates (kinds),
# the Metal attributes it mentions. The body adds up, for output element e, each input's value
# (through elem_to_loc when it has all three helpers, else its first element), the template
# values, and writes the sum to every value output (`store` converts it as torch's .to() does);
# element 0 also writes what it saw of each input's shape, strides and ndim to `meta`, and each
# thread the attributes it mentions to `attrs`. All integer arithmetic: the reference is exact.

_INT_RANGES = {"bool": (0, 2), "int8": (-2**7, 2**7), "int16": (-2**15, 2**15),
               "int32": (-2**31, 2**31), "int64": (-2**40, 2**40), "uint8": (0, 2**8),
               "uint16": (0, 2**16), "uint32": (0, 2**32), "uint64": (0, 2**40)}

METAL_HEADER = """
// int64 views of every element type (float -> int truncates, as torch's .to(int64) does)
template <typename T> inline int64_t to_i64(const thread T& v) { return int64_t(v); }
template <typename T> inline void store(device T* p, int64_t v) { *p = T(v); }
"""
CUDA_HEADER = """
template <typename T> __device__ inline int64_t to_i64(T v) { return (int64_t)v; }
__device__ inline int64_t to_i64(__half v) { return (int64_t)(float)v; }
__device__ inline int64_t to_i64(__nv_bfloat16 v) { return (int64_t)(float)v; }
template <typename T> __device__ inline void store(T* p, int64_t v) { *p = T(v); }
__device__ inline void store(__half* p, int64_t v) { *p = __half(float(v)); }
__device__ inline void store(__nv_bfloat16* p, int64_t v) { *p = __nv_bfloat16(float(v)); }
__device__ inline void store(bool* p, int64_t v) { *p = v != 0; }
"""
META = 17  # per input: shape[8], strides[8], ndim


def _random_values(dtype: str, shape, gen: torch.Generator) -> torch.Tensor:
    t = dtype_of(dtype).torch
    if dtype in _INT_RANGES:
        lo, hi = _INT_RANGES[dtype]
        return torch.randint(lo, hi, tuple(shape), generator=gen, dtype=torch.int64).to(t)
    return (torch.randn(tuple(shape), generator=gen, dtype=torch.float64) * 300).to(t)


def _as_i64(t: torch.Tensor) -> torch.Tensor:
    """What the kernel's to_i64 computes, element-wise."""
    if t.dtype.is_floating_point:
        return t.to(torch.float64).trunc().to(torch.int64)
    return t.to(torch.int64)


def _input_plan(draw):
    kind = draw(st.sampled_from(["array", "array", "array", "zero_d", "py"]))
    dtype = draw(st.sampled_from(list(PY_DTYPE) if kind == "py" else DTYPES))
    mentions = draw(st.frozensets(st.sampled_from(HELPERS))) if kind == "array" else frozenset()
    return dict(kind=kind, dtype=dtype, mentions=mentions, weight=draw(st.integers(1, 4)),
                idx=draw(st.sampled_from(["uint", "int64_t"])))


@st.composite
def kernel_plans(draw, dialect=None):
    dialect = dialect or draw(st.sampled_from(["metal", "cuda"]))
    plan = dict(dialect=dialect,
                inputs=[_input_plan(draw) for _ in range(draw(st.integers(1, 4)))],
                n_vals=draw(st.integers(1, 2)),
                templates=draw(st.lists(st.sampled_from(["type", "int", "bool"]), max_size=3)),
                recipe=draw(st.sampled_from(["grid", "groups"])))
    # metal: the attributes the body mentions besides those it needs for its position;
    # cuda: attribute names the body declares as its own variables (plain names in CUDA)
    plan["attrs"] = sorted(draw(st.frozensets(st.sampled_from(ATTRS), max_size=6)), key=ATTRS.index)
    return plan


def _position_attrs(plan) -> list[str]:
    return (["thread_position_in_grid", "threads_per_grid"] if plan["recipe"] == "grid" else
            ["threadgroup_position_in_grid", "dispatch_threads_per_threadgroup",
             "thread_position_in_threadgroup", "grid_size"])


def _attr_columns(plan):
    return [(a, c) for a in plan["attrs"] for c in (("x", "y", "z") if ATTRIBUTES[a] == "uint3" else (None,))]


def _template_names(plan):
    return [f"{kind[0].upper()}{i}" for i, kind in enumerate(plan["templates"])]


def kernel_source(plan) -> tuple[str, str]:
    """(header, body) of the plan's kernel."""
    cuda = plan["dialect"] == "cuda"
    lines = []
    if cuda:
        lines += ["unsigned px_ = blockIdx.x * blockDim.x + threadIdx.x;",
                  "unsigned py_ = blockIdx.y * blockDim.y + threadIdx.y;",
                  "unsigned pz_ = blockIdx.z * blockDim.z + threadIdx.z;",
                  "unsigned e = (pz_ * (gridDim.y * blockDim.y) + py_) * (gridDim.x * blockDim.x) + px_;",
                  "int64_t acc = 0;"]
        # Metal's attribute names are plain names in CUDA: a parameter of that name would clash
        lines += [f"int64_t {a} = {100 + k}; acc += {a};" for k, a in enumerate(plan["attrs"])]
    else:
        if plan["recipe"] == "grid":
            lines += ["uint3 pos_ = thread_position_in_grid;", "uint3 size_ = threads_per_grid;"]
        else:
            lines += ["uint3 pos_ = threadgroup_position_in_grid * dispatch_threads_per_threadgroup",
                      "             + thread_position_in_threadgroup;",
                      "uint3 size_ = grid_size;"]
        lines += ["uint e = (pos_.z * size_.y + pos_.y) * size_.x + pos_.x;", "int64_t acc = 0;"]
    for i, p in enumerate(plan["inputs"]):
        name, w = f"in{i}", p["weight"]
        if p["kind"] != "array":  # metal: `const constant T&`; cuda: `const T*`, as MLX has them
            lines.append(f"acc += {w} * to_i64({name}{'[0]' if cuda else ''});")
        elif p["mentions"] == set(HELPERS):
            shape, strides = (f"{name}_shape.data()", f"{name}_strides.data()") if cuda else \
                (f"{name}_shape", f"{name}_strides")
            idx = "unsigned" if cuda and p["idx"] == "uint" else p["idx"]
            lines += [f"int64_t n{i}_ = 1;",
                      f"for (int k = 0; k < {name}_ndim; ++k) n{i}_ *= {name}_shape[k];",
                      f"acc += {w} * to_i64({name}[elem_to_loc({idx}(e % n{i}_), {shape}, {strides}, "
                      f"{name}_ndim)]);"]
        else:
            lines.append(f"acc += {w} * to_i64({name}[0]);")
    for name, kind in zip(_template_names(plan), plan["templates"]):
        lines.append({"type": f"acc += int64_t(sizeof({name})) * 5 + to_i64({name}(3));",
                      "int": f"acc += {name};", "bool": f"acc += {name} ? 11 : 0;"}[kind])
    lines += [f"store(out{j} + e, acc + {j});" for j in range(plan["n_vals"])]
    if not cuda and plan["attrs"]:
        cols = _attr_columns(plan)
        lines.append(f"device uint* row_ = attrs + e * {len(cols)};")
        lines += [f"row_[{c}] = {a}{'.' + comp if comp else ''};" for c, (a, comp) in enumerate(cols)]
    lines.append("if (e == 0) {")
    unmentioned = []
    for i, p in enumerate(plan["inputs"]):
        name, base = f"in{i}", i * META
        for h, offset, count in (("shape", 0, 8), ("strides", 8, 8), ("ndim", 16, 1)):
            seen = p["kind"] == "array" and h in p["mentions"]
            unmentioned += [] if seen else [f"{name}_{h}"]
            value = (f"{name}_{h}[k]" if count > 1 else f"{name}_{h}") if seen else "-1"
            lines.append(f"  for (int k = 0; k < {count}; ++k) meta[{base + offset} + k] = {value};")
    lines.append("}")
    # names in comments and strings are no mentions
    unmentioned += [a for a in ATTRS if a not in plan["attrs"] + _position_attrs(plan)] if not cuda else []
    lines.append("// not used: " + " ".join(unmentioned))
    lines.append(f'(void)"{" ".join(unmentioned)}";')
    return (CUDA_HEADER if cuda else METAL_HEADER), "\n".join("    " + line for line in lines) + "\n"


_KERNELS: dict[tuple, object] = {}


def get_kernel(plan):
    """One kernel object per source: examples with the same body share its compiled variants."""
    header, body = kernel_source(plan)
    outputs = [f"out{j}" for j in range(plan["n_vals"])] + ["meta"] + (
        ["attrs"] if plan["dialect"] == "metal" and plan["attrs"] else [])
    key = (plan["dialect"], header, body, tuple(outputs), len(plan["inputs"]))
    if key not in _KERNELS:
        _KERNELS[key] = MAKE[plan["dialect"]](
            name="prop_sig", input_names=[f"in{i}" for i in range(len(plan["inputs"]))],
            output_names=outputs, source=body, header=header, ensure_row_contiguous=False)
    return _KERNELS[key], outputs


# --- random views --------------------------------------------------------------------------

# per dimension: size, step of the slice, its start, whether the dimension is broadcast (stride 0)
_DIM = st.tuples(st.integers(1, 4), st.integers(1, 3), st.integers(0, 1), st.booleans())


@st.composite
def view_plans(draw):
    dims = draw(st.lists(_DIM, min_size=1, max_size=5))
    return dims, draw(st.permutations(range(len(dims))))


def make_view(plan, dtype, gen) -> torch.Tensor:
    """A non-contiguous view: a permuted base, sliced with steps and offsets, some dims expanded."""
    dims, perm = plan
    full = [1 if expand else start + (size - 1) * step + 1 for size, step, start, expand in dims]
    base = _random_values(dtype, [full[p] for p in perm], gen)
    view = base.permute([perm.index(j) for j in range(len(perm))])
    view = view[tuple(slice(None) if expand else slice(start, start + (size - 1) * step + 1, step)
                      for size, step, start, expand in dims)]
    view = view.expand([size if expand else -1 for size, _, _, expand in dims])
    assert list(view.shape) == [d[0] for d in dims]
    return view


@st.composite
def call_plans(draw, plan):
    inputs = []
    for p in plan["inputs"]:
        if p["kind"] == "array":
            inputs.append(("view", draw(view_plans())))
        elif p["kind"] == "zero_d":
            inputs.append(("element", draw(st.integers(0, 2))))  # a 0-d view at a storage offset
        else:
            inputs.append(("py", draw({"bool": st.booleans(), "int": st.integers(-2**31, 2**31 - 1),
                                       "float": st.floats(-1e9, 1e9, width=32)}[p["dtype"]])))
    group = draw(st.tuples(st.integers(1, 8), st.integers(1, 3), st.integers(1, 2)))
    if plan["dialect"] == "cuda":  # whole blocks (MLX's CUDA rule): a grid of whole groups
        blocks = draw(st.tuples(st.integers(1, 3), st.integers(1, 2), st.integers(1, 2)))
        grid = tuple(b * g for b, g in zip(blocks, group))
    else:  # Metal: any grid; edge groups are partial, groups larger than the grid are clamped
        grid = draw(st.tuples(st.integers(1, 9), st.integers(1, 3), st.integers(1, 3)))
    return dict(inputs=inputs, grid=grid, group=group, seed=draw(st.integers(0, 2**31)),
                contiguous=draw(st.booleans()), shaped=draw(st.booleans()))


@st.composite
def signature_cases(draw, plans):
    plan = draw(plans)
    out_dtypes = [draw(st.sampled_from(DTYPES)) for _ in range(plan["n_vals"])]
    tvalues = [draw({"type": st.sampled_from(DTYPES), "int": st.integers(-2**31, 2**31 - 1),
                     "bool": st.booleans()}[kind]) for kind in plan["templates"]]
    calls = draw(st.lists(call_plans(plan), min_size=1, max_size=3))
    return plan, out_dtypes, tvalues, calls


# --- the reference -------------------------------------------------------------------------

def _attribute_model(grid, group):
    """Metal's attributes of every thread (row-major over the grid, x fastest), from Metal's
    definitions (as tests/test_dispatch.py has them)."""
    group = tuple(min(t, g) for t, g in zip(group, grid))
    groups = tuple(-(-n // g) for n, g in zip(grid, group))
    rows = []
    for z in range(grid[2]):
        for y in range(grid[1]):
            for x in range(grid[0]):
                pos = (x, y, z)
                gid = tuple(p // g for p, g in zip(pos, group))
                tid = tuple(p % g for p, g in zip(pos, group))
                size = tuple(min(g, n - i * g) for g, n, i in zip(group, grid, gid))
                tindex = tid[0] + size[0] * (tid[1] + size[1] * tid[2])  # over the (edge) group's own size
                nthreads, ndispatch = math.prod(size), math.prod(group)
                rows.append({
                    "thread_position_in_grid": pos, "thread_position_in_threadgroup": tid,
                    "threadgroup_position_in_grid": gid, "threadgroups_per_grid": groups,
                    "threads_per_grid": grid, "threads_per_threadgroup": size,
                    "dispatch_threads_per_threadgroup": group, "grid_origin": (0, 0, 0),
                    "grid_size": grid, "thread_index_in_threadgroup": tindex,
                    "thread_index_in_simdgroup": tindex % 32, "thread_index_in_quadgroup": tindex % 4,
                    "simdgroup_index_in_threadgroup": tindex // 32,
                    "quadgroup_index_in_threadgroup": tindex // 4,
                    "simdgroups_per_threadgroup": -(-nthreads // 32),
                    "quadgroups_per_threadgroup": -(-nthreads // 4),
                    "dispatch_simdgroups_per_threadgroup": -(-ndispatch // 32),
                    "dispatch_quadgroups_per_threadgroup": -(-ndispatch // 4),
                    "threads_per_simdgroup": 32, "thread_execution_width": 32})
    return rows


def _expected_decls(plan, out_dtypes, outputs):
    """The kernel's parameters as MLX declares them in Metal (verbose=True prints them), or, for
    cuda_kernel, (name, declaration-or-None) in order."""
    cuda = plan["dialect"] == "cuda"
    decls = []
    for i, p in enumerate(plan["inputs"]):
        name = f"in{i}"
        dt = dtype_of(PY_DTYPE[p["dtype"]] if p["kind"] == "py" else p["dtype"])
        if cuda:
            decls.append((name, f"const {CUDA_TYPE.get(dt.name, dt.name + '_t')}* {name}"))
        elif p["kind"] == "array":
            decls.append((name, re.compile(
                rf"const (device|constant) {re.escape(dt.ctype)}\* {name} \[\[buffer\(\d+\)\]\]")))
        else:
            decls.append((name, f"const constant {dt.ctype}& {name} [[buffer(?)]]"))
        if p["kind"] == "array":
            for h in HELPERS:
                if h in p["mentions"]:
                    decls.append((f"{name}_{h}", None if cuda else {
                        "shape": f"const constant int* {name}_shape [[buffer(?)]]",
                        "strides": f"const constant int64_t* {name}_strides [[buffer(?)]]",
                        "ndim": f"const constant int& {name}_ndim [[buffer(?)]]"}[h]))
    for name, d in zip(outputs, out_dtypes + ["int64", "uint32"]):
        dt = dtype_of(d)
        decls.append((name, f"{CUDA_TYPE.get(dt.name, dt.name + '_t')}* {name}" if cuda
                      else f"device {dt.ctype}* {name} [[buffer(?)]]"))
    if not cuda:
        used = set(plan["attrs"]) | set(_position_attrs(plan))
        decls += [(a, f"{ATTRIBUTES[a]} {a} [[{a}]]") for a in ATTRS if a in used]
    # buffer numbers: in order, attributes excluded
    numbered, b = [], 0
    for name, d in decls:
        if isinstance(d, str) and "[[buffer(?)]]" in d:
            d = d.replace("[[buffer(?)]]", f"[[buffer({b})]]")
        if isinstance(d, re.Pattern):
            d = re.compile(d.pattern.replace(r"\d+", str(b)))
        b += (name not in ATTRIBUTES)
        numbered.append((name, d))
    return numbered


def _check_view(view_text, plan, out_dtypes, outputs):
    expected = _expected_decls(plan, out_dtypes, outputs)
    if plan["dialect"] == "metal":
        m = re.search(r"\[\[kernel\]\] void custom_kernel_prop_sig\(\n(.*?)\) \{\n", view_text, re.S)
        if plan["templates"]:
            kinds = {"type": "typename", "int": "int", "bool": "bool"}
            assert "template <" + ", ".join(f"{kinds[k]} {n}" for k, n in zip(
                plan["templates"], _template_names(plan))) + ">" in view_text
    else:
        m = re.search(r"__global__ void custom_kernel_prop_sig\(\n(.*?)\) \{\n", view_text, re.S)
    got = [d.strip() for d in m.group(1).split(",\n")]
    assert [re.findall(r"(\w+)(?: \[\[.*\]\])?$", d)[0] for d in got] == [n for n, _ in expected], got
    for d, (name, want) in zip(got, expected):
        if isinstance(want, re.Pattern):
            assert want.fullmatch(d), (d, want.pattern)
        elif want is not None:
            assert d == want


def run_signature_case(plan, out_dtypes, tvalues, calls):
    kernel, outputs = get_kernel(plan)
    template = list(zip(_template_names(plan), [dtype_of(v).torch if k == "type" else v
                                                 for k, v in zip(plan["templates"], tvalues)]))
    for n_call, call in enumerate(calls):
        gen = torch.Generator().manual_seed(call["seed"])
        args, seen = [], []  # what the kernel is passed, and what it sees
        for p, (how, what) in zip(plan["inputs"], call["inputs"]):
            if how == "view":
                t = make_view(what, p["dtype"], gen)
                args.append(t)
                seen.append(t.contiguous() if call["contiguous"] and not t.is_contiguous() else t)
            elif how == "element":
                t = _random_values(p["dtype"], [3], gen)[what]
                args.append(t)
                seen.append(t)
            else:
                args.append({"bool": bool, "int": int, "float": float}[p["dtype"]](what))
                seen.append(args[-1])
        grid, group = call["grid"], call["group"]
        n = math.prod(grid)
        val_shape = (grid[2], grid[1], grid[0]) if call["shaped"] else (n,)
        shapes = [val_shape] * plan["n_vals"] + [(len(plan["inputs"]), META)]
        dtypes = [dtype_of(d).torch for d in out_dtypes] + [torch.int64]
        if len(outputs) > len(shapes):
            shapes.append((n, len(_attr_columns(plan))))
            dtypes.append(torch.uint32)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            results = kernel(inputs=args, output_shapes=shapes, output_dtypes=dtypes, grid=grid,
                             threadgroup=group, template=template or None, verbose=n_call == 0,
                             ensure_row_contiguous=call["contiguous"])
        if n_call == 0:
            _check_view(buf.getvalue().split("// the C++ that is compiled")[0], plan, out_dtypes,
                        outputs)

        # the reference
        e = torch.arange(n)
        acc = torch.zeros(n, dtype=torch.int64)
        for p, x in zip(plan["inputs"], seen):
            if p["kind"] == "py":
                acc += p["weight"] * math.trunc(x)
            elif p["kind"] == "zero_d":
                acc += p["weight"] * int(_as_i64(x))
            elif p["mentions"] == set(HELPERS):
                flat = _as_i64(x.reshape(-1))
                acc += p["weight"] * flat[e % flat.numel()]
            else:
                acc += p["weight"] * int(_as_i64(x.reshape(-1)[0]))
        for kind, v in zip(plan["templates"], tvalues):
            acc += {"type": lambda: dtype_of(v).itemsize * 5 + (1 if v == "bool" else 3),
                    "int": lambda: v, "bool": lambda: 11 if v else 0}[kind]()
        if plan["dialect"] == "cuda":
            acc += sum(100 + k for k in range(len(plan["attrs"])))
        for j, d in enumerate(out_dtypes):
            got = results[j].reshape(-1).cpu()  # on the GPU when no input is an array and one exists
            want = (acc + j).to(dtype_of(d).torch)
            cmp = torch.float64 if want.dtype.is_floating_point else torch.int64
            assert torch.equal(got.to(cmp), want.to(cmp)), (j, d, got, want)
        meta = results[plan["n_vals"]]
        for i, (p, x) in enumerate(zip(plan["inputs"], seen)):
            row = meta[i].tolist()
            for h, offset in (("shape", 0), ("strides", 8), ("ndim", 16)):
                if p["kind"] == "array" and h in p["mentions"]:
                    want = {"shape": list(x.shape), "strides": list(x.stride()), "ndim": [x.dim()]}[h]
                    assert row[offset:offset + len(want)] == want, (i, h, row, want)
                else:
                    assert row[offset:offset + (1 if h == "ndim" else 8)] == [-1] * (1 if h == "ndim" else 8)
        if len(results) > plan["n_vals"] + 1:
            model = _attribute_model(grid, group)
            want = torch.tensor([[r[a] if c is None else r[a]["xyz".index(c)] for a, c in _attr_columns(plan)]
                                 for r in model], dtype=torch.int64)
            assert torch.equal(results[-1].cpu().to(torch.int64), want)


@COMPILING
@given(signature_cases(kernel_plans()))
# found on the GPU machine: no array input, so the outputs are on the GPU
@example(({"dialect": "metal", "inputs": [{"kind": "py", "dtype": "bool", "mentions": frozenset(), "weight": 1,
                                           "idx": "uint"}], "n_vals": 1, "templates": [], "recipe": "grid",
           "attrs": []},
          ["bool"], [], [{"inputs": [("py", False)], "grid": (1, 1, 1), "group": (1, 1, 1), "seed": 0,
                          "contiguous": False, "shaped": False}]))
@pytest.mark.slow
def test_signature_random_kernels(case):
    """Random inputs (dtypes, arrays / 0-d / scalars), helper mentions, templates, attributes and
    output dtypes: one compile per example, each launched on 1-3 random non-contiguous views."""
    run_signature_case(*case)


# A few fixed plans: the kernels compile once, then hypothesis varies only shapes, strides,
# values, grids and ensure_row_contiguous.
_FIXED = [
    dict(dialect="metal", n_vals=2, templates=["type", "int"], recipe="grid",
         attrs=["thread_index_in_threadgroup", "threads_per_threadgroup"],
         inputs=[dict(kind="array", dtype="bfloat16", mentions=frozenset(HELPERS), weight=3, idx="uint"),
                 dict(kind="array", dtype="uint64", mentions=frozenset(HELPERS), weight=1, idx="int64_t"),
                 dict(kind="py", dtype="float", mentions=frozenset(), weight=2, idx="uint"),
                 dict(kind="array", dtype="bool", mentions=frozenset({"shape", "ndim"}), weight=4,
                      idx="uint")]),
    dict(dialect="metal", n_vals=1, templates=["bool"], recipe="groups", attrs=[],
         inputs=[dict(kind="array", dtype="float16", mentions=frozenset(HELPERS), weight=1, idx="int64_t"),
                 dict(kind="zero_d", dtype="int8", mentions=frozenset(), weight=2, idx="uint")]),
    dict(dialect="cuda", n_vals=1, templates=["type"], recipe="grid", attrs=["grid_size"],
         inputs=[dict(kind="array", dtype="int16", mentions=frozenset(HELPERS), weight=2, idx="uint"),
                 dict(kind="array", dtype="float64", mentions=frozenset(HELPERS), weight=1, idx="int64_t"),
                 dict(kind="py", dtype="int", mentions=frozenset(), weight=1, idx="uint")]),
]
_FIXED_ARGS = [(["float16", "uint8"], ["float64", 77]), (["int32"], [True]), (["bfloat16"], ["uint16"])]


@st.composite
def fixed_cases(draw):
    k = draw(st.integers(0, len(_FIXED) - 1))
    plan = _FIXED[k]
    out_dtypes, tvalues = _FIXED_ARGS[k]
    return plan, out_dtypes, tvalues, draw(st.lists(call_plans(plan), min_size=1, max_size=3))


@settings(FAST, max_examples=40)
@given(fixed_cases())
def test_signature_fixed_kernels_random_views(case):
    run_signature_case(*case)


# =============================================================================================
# The argument block's layout

_C_ALIGN = {"pointer": (8, 8), "int": (4, 4), "int64": (8, 8), "ndim": (4, 4)}


@st.composite
def signatures(draw, attributes=True):
    inputs, uses = [], set()
    for i in range(draw(st.integers(0, 6))):
        dt = dtype_of(draw(st.sampled_from(DTYPES)))
        kind = draw(st.sampled_from(["array", "zero_d", "value"]))
        cap = draw(st.sampled_from([8, 16, 24]))
        inputs.append((f"in{i}", InputSpec(dt, kind != "array", kind == "value", cap)))
        if kind == "array":
            uses |= {f"in{i}_{h}" for h in draw(st.frozensets(st.sampled_from(HELPERS)))}
    outputs = [(f"out{j}", dtype_of(draw(st.sampled_from(DTYPES)))) for j in range(draw(st.integers(0, 3)))]
    if attributes:  # a Metal body's attributes (no field of the block; CUDA bodies have none)
        uses |= draw(st.frozensets(st.sampled_from(ATTRS)))
    return Signature(inputs, outputs, draw(st.booleans()), [], uses)


def _c_layout(sig):
    """(name, offset) of each field and the struct's size, as a C compiler lays the block out,
    computed from the parameters alone."""
    members = []
    for p in sig.params:
        if p.role == "attribute":
            continue
        if p.role == "input" and p.by_value:
            members.append((p.name, p.dtype.itemsize, p.dtype.itemsize))
        elif p.role in ("input", "output"):
            members.append((p.name, 8, 8))  # a pointer
        elif p.role == "shape":
            members.append((p.name, 4, 4 * p.capacity))
        elif p.role == "strides":
            members.append((p.name, 8, 8 * p.capacity))
        else:
            members.append((p.name, 4, 4))
    members += [("kk_grid", 4, 12), ("kk_shared", 4, 4)]  # kk_dim3, unsigned
    out, offset = [], 0
    for name, align, size in members:
        offset = -(-offset // align) * align
        out.append((name, offset))
        offset += size
    align = max(a for _, a, _ in members)
    return out, -(-offset // align) * align


def _field_values(f, rng: random.Random):
    def one():
        code = f.code
        if code == "?":
            return rng.random() < 0.5
        if code in "bhiq":
            bits = struct.calcsize(code) * 8
            return rng.randrange(-2**(bits - 1), 2**(bits - 1))
        if code in "BHIQ":
            return rng.randrange(0, 2**(struct.calcsize(code) * 8))
        if code == "e":
            return float(rng.randrange(-2048, 2048))
        if code == "f":
            return float(np.float32(rng.uniform(-1e6, 1e6)))
        return rng.uniform(-1e300, 1e300)
    return [one() for _ in range(f.count)]


@FAST
@given(signatures(), st.integers(0, 2**32))
def test_argument_block_layout_is_c_layout(sig, seed):
    """Field offsets follow C's natural alignment, the struct's size its largest alignment; the
    `struct` format packs every field at its offset."""
    params = [p for p in sig.params if p.role != "attribute"]
    assert [f.name for f in sig.fields] == [p.name for p in params] + ["kk_grid", "kk_shared"]
    layout, size = _c_layout(sig)
    assert [(f.name, f.offset) for f in sig.fields] == layout
    assert sig.block.size == size == struct.calcsize(sig.block.format)
    for f in sig.fields:
        assert f.offset % f.size == 0
    rng = random.Random(seed)
    values = [_field_values(f, rng) for f in sig.fields]
    block = sig.block.pack(*[v for vs in values for v in vs])
    assert len(block) == size
    for f, vs in zip(sig.fields, values):
        assert list(struct.unpack_from(f"<{f.count}{f.code}", block, f.offset)) == vs, f


def _compile_blocks(dialect, blocks: list[str]) -> subprocess.CompletedProcess:
    """g++ checks argument blocks (their offsetof/sizeof static_asserts) in one translation unit."""
    unit = ["#define KK_TARGET_CPU 1", "#define KK_MATH_SAFE 1", f"#include <{dialect.PRELUDE}>",
            f"namespace {dialect.NAMESPACE} {{"]
    for n, block in enumerate(blocks):
        unit += [f"namespace kk_sig{n} {{", block, "}"]
    unit.append("}")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "blocks.cpp"
        src.write_text("\n".join(unit) + "\n")
        return subprocess.run([cpu_backend.compiler()[0], "-std=c++17", "-fsyntax-only",
                               f"-I{cpu_backend.INCLUDE}", *dialect.compile_flags("cpu", "safe"),
                               str(src)], capture_output=True, text=True)


@settings(FAST, max_examples=8)
@given(st.sampled_from(sorted(DIALECTS)).flatmap(lambda d: st.tuples(
    st.just(d), st.lists(signatures(attributes=d == "metal"), min_size=1, max_size=12))))
def test_argument_block_offsets_checked_by_the_compiler(case):
    """A batch of random blocks in one unit: the compiler agrees with every offset and size
    signature.py computed (the static_asserts each generated CPU kernel carries)."""
    dialect_name, sigs = case
    dialect = DIALECTS[dialect_name]
    blocks = []
    for sig in sigs:
        block = codegen._argument_block(sig, dialect.type_name)
        for f in sig.fields:
            assert f"static_assert(__builtin_offsetof(kk_args, {f.name}) == {f.offset}," in block
        assert f"static_assert(sizeof(kk_args) == {sig.block.size}," in block
        blocks.append(block)
    # the block is the one a generated kernel carries
    source = codegen.generate(dialect, "cpu", "blk", sigs[0], "", "", "safe", False)
    assert blocks[0] in source
    proc = _compile_blocks(dialect, blocks)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_a_wrong_offset_fails_the_static_assert():
    """The check above has teeth: the same block with one offset off by one does not compile."""
    sig = Signature([("x", InputSpec(dtype_of("int8"), True, True, 0)),
                     ("y", InputSpec(dtype_of("float64"), True, True, 0))], [], False, [], set())
    block = codegen._argument_block(sig, metal.type_name)
    y = next(f for f in sig.fields if f.name == "y")
    assert y.offset == 8
    assert _compile_blocks(metal, [block]).returncode == 0
    bad = block.replace("kk_args, y) == 8,", "kk_args, y) == 9,")
    proc = _compile_blocks(metal, [bad])
    assert proc.returncode != 0 and "argument block layout (y)" in proc.stderr


# =============================================================================================
# The MSL front end on random token soups
#
# The grammar builds a header (program scope) and a body from declarations with address spaces
# (pointers, references, arrays, casts, parameters, program-scope constants), member accesses
# that may be swizzles, structs whose data members may be named like swizzles, comments and
# string literals full of the same words, and #define lines. Each piece carries its expected
# lowering, from the front end's documented rules.

AS_WORDS = ("device", "constant", "thread", "threadgroup")
TYPES = ("float", "half", "int", "uint", "float4", "half2", "bfloat", "vec<float, 4>", "atomic_int",
         "metal::array<int, 3>")
DATA_TYPES = ("float", "half", "int", "uint", "float4")
OTHER_MEMBERS = ("size", "data", "count", "xyzwx", "rgbar", "xr", "rgb_", "w2", "value")
STANDALONE = ("xy", "rgb", "r", "a", "w", "xyzw", "src_", "v", "c", "bgr")
COMMENT_WORDS = ("device", "constant", "thread", "threadgroup", "v.xy", "c.rgb", "p->a", "x.r",
                 "float*", "&ref", "'q'", '"s"', "#define", "M(v)", "threadgroup float t[4];")
STRING_WORDS = ("device", "constant", "thread", "threadgroup", "v.xy", "c.rgb", "p->a", "x.r",
                "float*", "//", "/*", "*/", '\\"', "\\\\", "'", "#define")
RAW_WORDS = ("device", "constant", "thread", "threadgroup", ".xy", ".rgb", "->a", '"q"', "//", "\\")
CHARS = ("'a'", "'r'", "'.'", "'\\''", "'\"'", "'/'")
_SWZ = re.compile(r"[xyzw]{2,4}|[rgba]{2,4}")


class Member(str):
    """A name after `.` or `->`: its lowering depends on the names the source's structs declare."""


def lowered_member(name: str, avoid: set[str]) -> str:
    if name in avoid:
        return name
    if _SWZ.fullmatch(name):
        return "template swizzle<" + ",".join(
            str("xyzw".index(c) if c in "xyzw" else "rgba".index(c)) for c in name) + ">()"
    if name in ("r", "g", "b", "a"):
        return "xyzw"["rgba".index(name)]
    return name


def expected_space(word, pointer: bool, const_near: bool, program_scope: bool) -> str:
    if word in ("device", "thread"):
        return ""
    if word == "threadgroup":
        return "" if pointer else "KK_THREADGROUP"
    if program_scope and not pointer:
        return "KK_PROGRAM_CONSTANT" if const_near else "KK_PROGRAM_CONSTANT const"
    return "" if const_near else "const"


class Soup:
    """Pieces (source text, expected lowering) and the struct members declared so far."""

    def __init__(self):
        self.pieces = []
        self.members = set()

    def add(self, src, expected=None):
        self.pieces.append((src, src if expected is None else expected))

    def render(self, avoid):
        src = "".join(s for s, _ in self.pieces)
        exp = "".join(lowered_member(e, avoid) if isinstance(e, Member) else e for _, e in self.pieces)
        return src, exp


def _n(draw, prefix):
    return f"{prefix}{draw(st.integers(0, 99))}"


def _words(draw, pool, sep=(" ",)):
    words = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=6))
    return "".join(w + draw(st.sampled_from(sep)) for w in words).rstrip(" \n")


def g_member(draw):
    return Member(draw(st.one_of(
        st.text(alphabet=draw(st.sampled_from(["xyzw", "rgba"])), min_size=1, max_size=4),
        st.sampled_from(OTHER_MEMBERS))))


def g_qualified(draw, soup, program_scope=False, declarators=("*", "&", "* const", "*&", "**"),
                end=""):
    """`[const] AS [const] T<declarator> name`: a pointer or reference (parameter or variable)."""
    word = draw(st.sampled_from(AS_WORDS))
    pre, post = draw(st.sampled_from(["", "const "])), draw(st.sampled_from(["", "const "]))
    decl = draw(st.sampled_from(declarators))
    soup.add(pre)
    soup.add(word, expected_space(word, True, bool(pre or post), program_scope))
    soup.add(f" {post}{draw(st.sampled_from(TYPES))}{decl} {_n(draw, 'p')}" +
             (" = src_" if "&" in decl or draw(st.booleans()) else "") + end)


def g_storage(draw, soup, program_scope=False):
    """threadgroup arrays and values; constant data."""
    t = draw(st.sampled_from(DATA_TYPES))
    if draw(st.booleans()):
        dims = draw(st.sampled_from(["", "[4]", "[2][8]", "[4], other_[8]"]))
        soup.add("threadgroup", expected_space("threadgroup", False, False, program_scope))
        soup.add(f" {t} {_n(draw, 'tg')}{dims};")
        return
    pre = draw(st.sampled_from(["", "const "]))
    post = draw(st.sampled_from(["", "const ", "constexpr "]))
    dims, init = draw(st.sampled_from([("", "1"), ("[3]", "{1, 2, 3}"), ("[2][2]", "{{1, 2}, {3, 4}}")]))
    soup.add(pre)
    soup.add("constant", expected_space("constant", False, bool(pre or post), program_scope))
    soup.add(f" {post}{t} {_n(draw, 'k')}{dims} = {init};")


def g_cast(draw, soup):
    word = draw(st.sampled_from(AS_WORDS))
    pre, post = draw(st.sampled_from(["", "const "])), draw(st.sampled_from(["", "const "]))
    t = draw(st.sampled_from(TYPES))
    form = draw(st.sampled_from(["c", "static_cast", "reinterpret_cast"]))
    soup.add(f"auto {_n(draw, 'q')} = " + ("(" if form == "c" else f"{form}<") + pre)
    soup.add(word, expected_space(word, True, bool(pre or post), False))
    soup.add(f" {post}{t}*" + (")(src_);" if form == "c" else ">(src_);"))


def g_access(draw, soup, one_line=False):
    """An expression of member accesses (maybe swizzles) and plain names spelled like swizzles."""
    for k in range(draw(st.integers(1, 4))):
        if k:
            soup.add(draw(st.sampled_from([" + ", " * ", " - ", ", "])))
        if draw(st.integers(0, 3)) == 0:
            soup.add(draw(st.sampled_from(STANDALONE)))
            continue
        soup.add(draw(st.sampled_from(["v", "c", "p[0]", "f(v)", "(v + w)", "float4(1.0f)"])))
        for _ in range(draw(st.integers(1, 2))):
            soup.add(draw(st.sampled_from([".", "->", " . "] + ([] if one_line else ["\n    ."]))))
            m = g_member(draw)
            soup.add(str(m), m)


def g_struct(draw, soup):
    names = draw(st.lists(st.one_of(st.sampled_from(STANDALONE[:4] + ("a", "g", "xyz")),
                                    st.sampled_from(OTHER_MEMBERS)), min_size=1, max_size=3, unique=True))
    soup.members |= set(names)
    sep = draw(st.sampled_from([" ", "\n  "]))
    fields = "".join(f"{sep}{draw(st.sampled_from(DATA_TYPES))} {m}{draw(st.sampled_from(['', '[2]']))};"
                     for m in names)
    soup.add(f"struct {_n(draw, 'S')} {{{fields}{sep.rstrip(' ')} }};")


def g_protected(draw, soup):
    kind = draw(st.sampled_from(["block", "string", "char", "raw"]))
    if kind == "block":
        soup.add("/* " + _words(draw, COMMENT_WORDS, (" ", "\n")) + " */")
    elif kind == "string":
        soup.add(f'const char* {_n(draw, "s")} = "' + _words(draw, STRING_WORDS) + '";')
    elif kind == "char":
        soup.add(f"char {_n(draw, 'ch')} = {draw(st.sampled_from(CHARS))};")
    else:
        soup.add(f'const char* {_n(draw, "r")} = R"kk(' + _words(draw, RAW_WORDS, (" ", "\n")) + ')kk";')


def g_statement(draw, soup):
    kind = draw(st.sampled_from(["qualified", "storage", "cast", "access", "lambda", "struct",
                                 "protected", "protected"]))
    if kind == "qualified":
        g_qualified(draw, soup, end=";")
    elif kind == "storage":
        g_storage(draw, soup)
    elif kind == "cast":
        g_cast(draw, soup)
    elif kind == "access":
        soup.add(f"auto {_n(draw, 'a')} = ")
        g_access(draw, soup)
        soup.add(";")
    elif kind == "lambda":
        soup.add(f"auto {_n(draw, 'fn')} = [&](")
        g_qualified(draw, soup, declarators=("*", "&"), end="")
        soup.add(") { return 0; };")
    elif kind == "struct":
        g_struct(draw, soup)
    else:
        g_protected(draw, soup)


def g_define(draw, soup):
    """A #define line: its replacement is MSL too (lowered as code inside a function)."""
    soup.add(f"#define {_n(draw, 'M')}" + draw(st.sampled_from(["(v) ", " ", "(v, w) "])))
    for k in range(draw(st.integers(1, 2))):
        if k:
            soup.add(draw(st.sampled_from([" + ", " \\\n    "])))
        kind = draw(st.sampled_from(["access", "cast", "tile"]))
        if kind == "access":
            g_access(draw, soup, one_line=True)
        elif kind == "cast":
            word = draw(st.sampled_from(AS_WORDS))
            soup.add("((")
            soup.add(word, expected_space(word, True, False, False))
            soup.add(" float*)(v))[0]")
        else:
            soup.add("threadgroup", "KK_THREADGROUP")
            soup.add(" float tile_[16];")
    if draw(st.booleans()):
        soup.add(" // " + _words(draw, COMMENT_WORDS))
    soup.add("\n")


def g_line(draw, soup, indent="    "):
    if draw(st.integers(0, 5)) == 0:
        g_define(draw, soup)
        return
    soup.add(indent)
    for k in range(draw(st.integers(1, 3))):
        if k:
            soup.add(draw(st.sampled_from([" ", "  ", "\t"])))
        g_statement(draw, soup)
    if draw(st.booleans()):
        soup.add(" // " + _words(draw, COMMENT_WORDS))
    soup.add("\n")


def g_header_item(draw, soup):
    kind = draw(st.sampled_from(["constant", "function", "template", "struct", "define", "comment",
                                 "qualified"]))
    if kind == "constant":  # program-scope constant data
        g_storage_constant = draw(st.booleans())
        if g_storage_constant:
            pre = draw(st.sampled_from(["", "static ", "const "]))
            post = draw(st.sampled_from(["", "const ", "constexpr ", "constexpr const "]))
            t = draw(st.sampled_from(DATA_TYPES))
            dims, init = draw(st.sampled_from([("", "3"), ("[4]", "{0.5f, 1, 2, 4}")]))
            soup.add(pre)
            soup.add("constant", expected_space("constant", False, "const" in pre + post, True))
            soup.add(f" {post}{t} {_n(draw, 'K')}{dims} = {init};\n")
        else:
            g_storage(draw, soup, program_scope=True)
            soup.add("\n")
    elif kind in ("function", "template"):
        if kind == "template":
            soup.add("template <typename T>\n")
        soup.add(f"inline {draw(st.sampled_from(DATA_TYPES))} {_n(draw, 'f')}(")
        for k in range(draw(st.integers(0, 3))):
            if k:
                soup.add(", ")
            g_qualified(draw, soup, declarators=("*", "&", "* const"))
        soup.add(") {\n")
        for _ in range(draw(st.integers(0, 3))):
            g_line(draw, soup)
        soup.add("    return 0;\n}\n")
    elif kind == "struct":
        g_struct(draw, soup)
        soup.add("\n")
    elif kind == "define":
        g_define(draw, soup)
    elif kind == "comment":
        soup.add(draw(st.sampled_from(["// ", "/// "])) + _words(draw, COMMENT_WORDS) + "\n")
    else:  # a pointer or reference at program scope is no constant storage
        g_qualified(draw, soup, program_scope=True, declarators=("*", "* const"), end=";\n")


@st.composite
def msl_sources(draw):
    """(header, body, expected lowered header, expected lowered body)."""
    header, body = Soup(), Soup()
    for _ in range(draw(st.integers(0, 6))):
        g_header_item(draw, header)
    for _ in range(draw(st.integers(1, 8))):
        g_line(draw, body)
    avoid = header.members | body.members
    h, eh = header.render(avoid)
    b, eb = body.render(avoid)
    return h, b, eh, eb


_PROTECTED = re.compile(r'''//[^\n]*|/\*.*?\*/|R"(?P<d>[^(\s]*)\(.*?\)(?P=d)"|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*\'''',
                        re.S)
_SPACE_WORD = re.compile(r"\b(device|constant|thread|threadgroup)\b")
_AFTER_ACCESS = re.compile(r"(?:\.|->)\s*([A-Za-z_]\w*)")


def protected_spans(text):
    """(line number, text) of every comment and string literal, scanned independently of kernelkit."""
    return [(text.count("\n", 0, m.start()), m.group()) for m in _PROTECTED.finditer(text)]


def code_only(text):
    return _PROTECTED.sub(lambda m: " " + "\n" * m.group().count("\n") + " ", text)


def standalone_swizzle_names(code):
    """Identifiers spelled like swizzles that do not follow `.` or `->`."""
    names = []
    for m in re.finditer(r"[A-Za-z_]\w*", code):
        before = code[:m.start()].rstrip()
        if before.endswith(".") or before.endswith("->"):
            continue
        if _SWZ.fullmatch(m.group()) or m.group() in ("r", "g", "b", "a"):
            names.append(m.group())
    return names


def normalized_lines(text):
    """Lines with whitespace runs collapsed and no blanks around punctuation (the front end
    leaves a blank where it deletes a word; that is no difference)."""
    out = []
    for line in text.split("\n"):
        line = re.sub(r"\s+", " ", line).strip()
        out.append(re.sub(r" ?([^\w\s]) ?", r"\1", line))
    return out


@FAST
@given(msl_sources())
def test_front_end_keeps_lines_comments_and_strings(src):
    header, body, _, _ = src
    out_h, out_b = metal.front_end(header, body)
    for before, after in ((header, out_h), (body, out_b)):
        assert after.count("\n") == before.count("\n")
        assert protected_spans(after) == protected_spans(before)


@FAST
@given(msl_sources())
def test_front_end_leaves_no_address_space_and_rewrites_swizzles_only_after_access(src):
    header, body, _, _ = src
    avoid = metal.member_names(header) | metal.member_names(body)
    out_h, out_b = metal.front_end(header, body)
    for before, after in ((header, out_h), (body, out_b)):
        code = code_only(after)
        assert not _SPACE_WORD.search(code), _SPACE_WORD.search(code)
        for m in _AFTER_ACCESS.finditer(code):
            name = m.group(1)
            assert name in avoid or not (_SWZ.fullmatch(name) or name in ("r", "g", "b", "a")), \
                (name, code[max(0, m.start() - 40):m.end() + 40])
        # names spelled like swizzles elsewhere are kept, in order
        assert standalone_swizzle_names(code) == standalone_swizzle_names(code_only(before))


@FAST
@given(msl_sources())
@pytest.mark.slow
def test_front_end_matches_the_grammar(src):
    """Every piece lowered as the front end's rules say (MSL declarations with their address
    spaces, swizzles, struct members, #define replacement text)."""
    header, body, expected_header, expected_body = src
    out_h, out_b = metal.front_end(header, body)
    assert normalized_lines(out_h) == normalized_lines(expected_header)
    assert normalized_lines(out_b) == normalized_lines(expected_body)


@FAST
@given(msl_sources())
@pytest.mark.slow
def test_front_end_is_idempotent(src):
    header, body, _, _ = src
    once = metal.front_end(header, body)
    assert metal.front_end(*once) == once


# --- declarators the grammar above leaves out: one property each --------------------------

@FAST
@given(st.sampled_from(["(&{n})[{k}] = tile_", "(*{n})[{k}] = &tile_", "(&{n})[{k}][2] = tile2_",
                        "(*const {n})[{k}] = &tile_"]),
       st.integers(1, 64), st.sampled_from(["", "const "]), st.booleans())
def test_parenthesised_threadgroup_declarators_are_pointers_or_references(form, k, cv, in_header):
    """`threadgroup float (&r)[N] = tile;` declares a reference (and `(*p)[N]` a pointer) to
    threadgroup memory: the qualifier vanishes as for `threadgroup float* p` (shared storage with
    an initialiser does not compile for CUDA)."""
    decl = form.format(n="ref", k=k)
    line = f"threadgroup {cv}float {decl};"
    if in_header:
        lowered, _ = metal.front_end(f"inline void f(threadgroup float* tile_) {{ {line} }}\n", "")
    else:
        _, lowered = metal.front_end("", f"threadgroup float tile_[{k}];\n{line}\n")
        lowered = lowered.split("\n")[1]
    assert "KK_THREADGROUP" not in lowered and "threadgroup" not in lowered, lowered
    assert decl in lowered


@FAST
@given(st.sampled_from(["method", "method_param", "enum_class", "elaborated_parameter",
                        "template_class"]),
       st.text(alphabet="xyzw", min_size=2, max_size=4) | st.text(alphabet="rgba", min_size=1, max_size=4))
def test_only_declared_members_keep_a_swizzle_name(context, swz):
    """Only the names a struct declares as its members are kept from swizzle rewriting: a struct's
    member functions may swizzle (and name parameters like swizzles), enumerators are no members,
    and neither `struct S` in a parameter list nor `template <class T>` opens a struct. None of
    these may stop `.xy` from being a swizzle, there or elsewhere."""
    header = {
        "method": f"struct Pixel {{\n  float4 c;\n  auto get() const {{ return c.{swz}; }}\n}};\n",
        "method_param": f"struct Pixel {{\n  float4 c;\n  float f(float4 {swz}) const {{ return {swz}.x; }}\n}};\n",
        "enum_class": f"enum class Channel {{ {', '.join(dict.fromkeys(swz))} }};\n",
        "elaborated_parameter": f"struct Pt {{ float4 c; }};\ninline auto g(struct Pt p) {{ return p.c.{swz}; }}\n",
        "template_class": f"template <class T>\ninline auto h(T c) {{ return c.{swz}; }}\n",
    }[context]
    body = f"auto q = v.{swz};\n"
    out_h, out_b = metal.front_end(header, body)
    want = lowered_member(swz, set())
    assert out_b == f"auto q = v.{want};\n"
    if context in ("method", "elaborated_parameter", "template_class"):
        assert f"c.{want};" in out_h


# =============================================================================================
# End to end: swizzle arithmetic computed by a kernel equals NumPy's

_CONSTANTS = (0.5, 1.5, 2.0, -3.0, 0.25)


def _components(draw, base_size, n):
    alphabet = draw(st.sampled_from(["xyzw", "rgba"]))[:base_size]
    return "".join(draw(st.sampled_from(alphabet)) for _ in range(n))


def _index(name):
    return ["xyzw".index(c) if c in "xyzw" else "rgba".index(c) for c in name]


def g_expr(draw, n, depth):
    """(MSL text, f(env) -> (threads, n) float32 array) of an expression of size n."""
    kinds = ["leaf", "leaf"] + (["binary", "mixed", "neg", "ctor", "swizzled"] if depth else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "mixed" and n == 1 or kind == "ctor" and n == 1:
        kind = "binary"
    if kind == "leaf":
        choice = draw(st.sampled_from(["v", "w", "const"]))
        if choice == "const":
            c = draw(st.sampled_from(_CONSTANTS))
            return (f"{c}f" if n == 1 else f"float{n}({c}f)"), \
                lambda env: np.full((env["v"].shape[0], n), c, dtype=np.float32)
        size = 4 if choice == "v" else 2
        if n == size and draw(st.booleans()):
            return choice, lambda env: env[choice]
        sw = _components(draw, size, n)
        return f"{choice}.{sw}", lambda env: env[choice][:, _index(sw)]
    if kind == "binary":
        op = draw(st.sampled_from("+-*"))
        (a, fa), (b, fb) = g_expr(draw, n, depth - 1), g_expr(draw, n, depth - 1)
        return f"({a} {op} {b})", lambda env: _apply(op, fa(env), fb(env))
    if kind == "mixed":  # vector op scalar, either way round
        op = draw(st.sampled_from("+-*"))
        (a, fa), (s, fs) = g_expr(draw, n, depth - 1), g_expr(draw, 1, depth - 1)
        if draw(st.booleans()):
            return f"({a} {op} {s})", lambda env: _apply(op, fa(env), fs(env))
        return f"({s} {op} {a})", lambda env: _apply(op, fs(env), fa(env))
    if kind == "neg":
        a, fa = g_expr(draw, n, depth - 1)
        return f"(-({a}))", lambda env: -fa(env)
    if kind == "ctor":
        parts = []
        left = n
        while left:
            k = draw(st.integers(1, left if parts else left - 1))
            parts.append(k)
            left -= k
        subs = [g_expr(draw, k, depth - 1) for k in parts]
        return f"float{n}(" + ", ".join(s for s, _ in subs) + ")", \
            lambda env: np.concatenate([f(env) for _, f in subs], axis=1)
    m = draw(st.integers(2, 4))  # a swizzle of a parenthesised vector expression
    a, fa = g_expr(draw, m, depth - 1)
    sw = _components(draw, m, n)
    return f"({a}).{sw}", lambda env: fa(env)[:, _index(sw)]


def _apply(op, a, b):
    return {"+": np.add, "-": np.subtract, "*": np.multiply}[op](a, b)


@st.composite
def swizzle_programs(draw):
    n = draw(st.integers(1, 4))
    expr, model = g_expr(draw, n, draw(st.integers(1, 3)))
    outs = [draw(st.sampled_from(["xyzw", "rgba"]))[k] for k in range(n)]
    return n, expr, model, outs


@settings(COMPILING, max_examples=12)
@given(swizzle_programs(), st.integers(0, 2**31), st.integers(1, 70))
@pytest.mark.slow
def test_swizzle_arithmetic_matches_numpy(program, seed, threads):
    """Inputs named like swizzles (`xy`, `b`), an output named `rgba`, a random expression of
    float4 / float2 swizzles, constructors and scalars; exact in float32 with math_mode safe."""
    n, expr, model, outs = program
    lines = ["uint i = thread_position_in_grid.x;",
             "float4 v = float4(xy[4 * i], xy[4 * i + 1], xy[4 * i + 2], xy[4 * i + 3]);",
             "float2 w = float2(b[2 * i], b[2 * i + 1]);",
             f"{'float' if n == 1 else f'float{n}'} r_ = {expr};"]
    lines += [f"rgba[{n} * i + {k}] = r_{'.' + c if n > 1 else ''};" for k, c in enumerate(outs)]
    body = "\n".join(lines) + "\n"
    k = _KERNELS.get(("swz", body))
    if k is None:
        k = _KERNELS[("swz", body)] = kk.metal_kernel(
            name="swizzle_expr", input_names=["xy", "b"], output_names=["rgba"], source=body,
            compile_options={"math_mode": "safe"})
    rng = np.random.default_rng(seed)
    xy = rng.standard_normal((threads, 4)).astype(np.float32)
    bb = rng.standard_normal((threads, 2)).astype(np.float32)
    out = k(inputs=[xy.reshape(-1), bb.reshape(-1)], grid=(threads, 1, 1), threadgroup=(32, 1, 1),
            output_shapes=[(threads, n)], output_dtypes=[np.float32])[0]
    want = model({"v": xy, "w": bb})
    np.testing.assert_array_equal(out, want, err_msg=body)


# --- the two front-end gaps above, end to end --------------------------------------------------

def test_threadgroup_array_reference_kernel(device):
    """A reference to a threadgroup array, as MSL allows; without a GPU conftest also compiles
    it for sm_90, where `__shared__ float (&r)[64] = tile;` is rejected."""
    body = """
    uint t = thread_index_in_threadgroup;
    threadgroup float tile[64];
    threadgroup float (&r)[64] = tile;
    r[t] = inp[thread_position_in_grid.x];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    out[thread_position_in_grid.x] = tile[(t + 1) % threads_per_threadgroup.x];
    """
    k = kk.metal_kernel(name="tg_array_ref", input_names=["inp"], output_names=["out"], source=body)
    x = torch.arange(128, dtype=torch.float32, device=device)
    out = k(inputs=[x], grid=(128, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(128,)],
            output_dtypes=[torch.float32])[0]
    assert torch.equal(out.cpu(), x.cpu().view(2, 64).roll(-1, dims=1).reshape(-1))


def test_struct_with_a_swizzling_member_function(device):
    header = """
struct Pixel {
  float4 c;
  float2 uv() const { return c.xy; }
};
"""
    body = """
    uint i = thread_position_in_grid.x;
    Pixel p{float4(inp[4 * i], inp[4 * i + 1], inp[4 * i + 2], inp[4 * i + 3])};
    float2 q = p.uv() + p.c.zw;
    out[2 * i] = q.x;
    out[2 * i + 1] = q.y;
    """
    k = kk.metal_kernel(name="pixel_uv", input_names=["inp"], output_names=["out"], source=body,
                        header=header)
    x = torch.arange(16, dtype=torch.float32, device=device)
    out = k(inputs=[x], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(8,)],
            output_dtypes=[torch.float32])[0]
    v = x.cpu().view(4, 4)
    assert torch.equal(out.cpu(), (v[:, :2] + v[:, 2:]).reshape(-1))


def test_a_macro_continued_over_lines_is_one_directive():
    """Found by test_front_end_matches_the_grammar: a backslash-newline inside a #define ended
    the directive, so `constant` on the continued line was lowered as code and read a later
    `constexpr` declaration as its own."""
    body = ("#define M0(v) threadgroup float tile_[16]; \\\n    ((constant float*)(v))[0]\n"
            "    constant constexpr float k0 = 1;\n")
    _, lowered = metal.front_end("", body)
    assert "((const float*)(v))[0]" in lowered
    assert lowered.count("\n") == body.count("\n")  # lines stay where they were

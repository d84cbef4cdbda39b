"""Kernel calls and custom_functions as torch.library custom ops, for torch.compile.

Eager calls never come here: they keep the fast path. A call traced by torch.compile (Dynamo),
or made on fake tensors (torch.compile's shape propagation, AOTAutograd, torch.library.opcheck),
goes through one of two opaque ops instead:

- `kernelkit::launch(spec, tensors, scalars, grid, threadgroup, shapes)`: a kernel call. Its
  fake implementation makes the outputs from output_shapes and output_dtypes; grid, threadgroup
  and shapes may be symbolic (dynamic shapes).
- `kernelkit::custom_function(spec, tensors)`: a custom_function call. Its fake implementation
  runs the function on fake tensors, where each of its kernels answers through
  `kernelkit::launch`'s. Its autograd formula is `kernelkit::custom_function_vjp`, the vjp rule as
  an opaque op of its own (run as written when the backward runs, never traced).

What the ops' arguments cannot carry (which kernel or function, template values, dtypes,
init_value, the structure and non-tensor arguments of a custom_function call) is the *spec*: a
string that says it all in Python literals, so that a graph compiled in one process and taken
from torch's caches in another still means the same call. Kernels and functions are named in it
by keys that the same program makes again in every process (see `register`). Dynamo computes a
spec while tracing (a constant of the graph).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import threading
import weakref

import torch

# Kernels and custom_functions by key, registered at construction (outside any tracing): each
# key's live objects (equal kernels share a key; any one of them serves). Weak: whatever a
# compiled graph calls is held by the code that calls it.
_OBJECTS: dict[str, weakref.WeakSet] = {}
_SEEN_NAMES: dict = {}  # custom_function qualname -> how many were made
_LOCAL: dict = {}  # spec -> non-literal arguments of a custom_function call (this process only)
_SCALAR_KINDS = {bool: "b", int: "i", float: "f"}
_SCALAR_TYPES = {"b": bool, "i": int, "f": float}
_fake = threading.local()  # fake.depth > 0: inside a fake implementation (its mode is off there)


def kernel_key(kernel) -> str:
    """A kernel's key: its dialect, name and a digest of everything that makes it (every process
    that builds the same kernel gets the same key)."""
    what = repr((kernel.caller, kernel.name, kernel.input_names, kernel.output_names, kernel.source,
                 kernel.header, kernel.ensure_row_contiguous, kernel.atomic_outputs,
                 kernel.math_mode, kernel.shared_memory))
    key = f"{kernel.caller}:{kernel.name}:{hashlib.sha1(what.encode()).hexdigest()[:16]}"
    _OBJECTS.setdefault(key, weakref.WeakSet()).add(kernel)
    return key


def function_key(fun) -> str:
    """A custom_function's key: its qualified name, and its rank among those of that name
    (functions made in a loop), in the order the program makes them."""
    name = f"{getattr(fun, '__module__', '?')}.{getattr(fun, '__qualname__', fun.__name__)}"
    n = _SEEN_NAMES[name] = _SEEN_NAMES.get(name, 0) + 1
    key = f"{name}#{n}"
    _OBJECTS.setdefault(key, weakref.WeakSet()).add(fun)
    return key


def _find(key: str):
    obj = next(iter(_OBJECTS.get(key, ())), None)
    if obj is None:
        raise RuntimeError(f"[kernelkit] a compiled graph calls {key!r}, which this process has not "
                           "built (torch.compile's caches hold graphs of other runs): build it first, "
                           "as the program that compiled the graph did.")
    return obj


_get_mode, _FAKE_MODE = torch._C._get_dispatch_mode, torch._C._TorchDispatchModeKey.FAKE


def tracing() -> bool:
    """Whether a kernel call must go through the ops: Dynamo is tracing, a fake mode is on, or a
    fake implementation is running the function."""
    return torch.compiler.is_compiling() or _get_mode(_FAKE_MODE) is not None or \
        getattr(_fake, "depth", 0) > 0


def _literal(value):
    """value with torch dtypes as ("dtype", name): a Python literal."""
    if isinstance(value, torch.dtype):
        return ("dtype", str(value).removeprefix("torch."))
    if isinstance(value, (tuple, list)):
        return tuple(_literal(v) for v in value)
    return value


def _unliteral(value):
    if isinstance(value, tuple):
        if len(value) == 2 and value[0] == "dtype" and isinstance(value[1], str):
            return getattr(torch, value[1])
        return tuple(_unliteral(v) for v in value)
    return value


@functools.lru_cache(maxsize=4096)
def _parse(spec: str):
    return _unliteral(ast.literal_eval(spec))


# --- kernel calls -------------------------------------------------------------------------------

@torch._dynamo.assume_constant_result
def _launch_spec(kernel: str, layout, template, output_dtypes, ndims, init_value, contiguous) -> str:
    spec = repr(_literal((kernel, layout, template, output_dtypes, ndims, init_value, contiguous)))
    ast.literal_eval(spec)  # a literal, or the arguments hold something a graph cannot keep
    return spec


def launch(kernel, inputs, output_shapes, output_dtypes, grid, threadgroup, template, init_value,
           contiguous) -> list:
    """A kernel call, through kernelkit::launch."""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    scalars = [float(x) for x in inputs if not isinstance(x, torch.Tensor)]
    layout = "".join("t" if isinstance(x, torch.Tensor) else _SCALAR_KINDS.get(type(x), "?")
                     for x in inputs)
    if "?" in layout:
        raise TypeError(f"[{kernel.caller}] under torch.compile, inputs must be tensors or Python "
                        f"bool/int/float; got {[type(x).__name__ for x in inputs]}.")
    spec = _launch_spec(kernel._op_key, layout,
                        None if template is None else tuple(tuple(p) for p in template),
                        tuple(output_dtypes), tuple(len(s) for s in output_shapes),
                        tuple(init_value) if isinstance(init_value, (list, tuple)) else init_value,
                        contiguous)
    shapes = [s for shape in output_shapes for s in shape]
    return torch.ops.kernelkit.launch(spec, tensors, scalars, list(grid), list(threadgroup), shapes)


def _launch_parts(spec: str, shapes):
    kernel, layout, template, dtypes, ndims, init, contiguous = _parse(spec)
    out, i = [], 0
    for n in ndims:
        out.append(tuple(shapes[i:i + n]))
        i += n
    return _find(kernel), layout, template, dtypes, out, init, contiguous


@torch.library.custom_op("kernelkit::launch", mutates_args=())
def _launch(spec: str, tensors: list[torch.Tensor], scalars: list[float], grid: list[int],
            threadgroup: list[int], shapes: list[int]) -> list[torch.Tensor]:
    kernel, layout, template, dtypes, out_shapes, init, contiguous = _launch_parts(spec, shapes)
    t, s = iter(tensors), iter(scalars)
    inputs = [next(t) if k == "t" else _SCALAR_TYPES[k](next(s)) for k in layout]
    return kernel(inputs=inputs, output_shapes=out_shapes, output_dtypes=list(dtypes),
                  grid=tuple(grid), threadgroup=tuple(threadgroup),
                  template=None if template is None else list(template), init_value=init,
                  ensure_row_contiguous=contiguous)


@_launch.register_fake
def _launch_fake(spec, tensors, scalars, grid, threadgroup, shapes):
    from .arrays import dtype_of, resolve_stream
    _, _, _, dtypes, out_shapes, _, _ = _launch_parts(spec, shapes)
    device = tensors[0].device if tensors else resolve_stream(None, None)
    return [torch.empty(shape, dtype=dtype_of(d).torch, device=device)
            for shape, d in zip(out_shapes, dtypes)]


# --- custom_function calls ----------------------------------------------------------------------

_NODE_NAMES = {tuple: "tuple", list: "list", dict: "dict"}
_NODE_TYPES = {v: k for k, v in _NODE_NAMES.items()}


def _structure_literal(spec):
    """autodiff's structure spec with its node types named (namedtuples stay local)."""
    if spec is None:
        return None
    kind, children = spec
    name = _NODE_NAMES.get(kind)
    if name is None:
        raise TypeError("a node type of no literal name")
    if type(children) is int:
        return (name, children)
    if kind is dict:
        return (name, tuple((k, _structure_literal(c)) for k, c in children))
    return (name, tuple(_structure_literal(c) for c in children))


def _structure(lit):
    if lit is None:
        return None
    name, children = lit
    kind = _NODE_TYPES[name]
    if type(children) is int:
        return kind, children
    if kind is dict:
        return kind, tuple((k, _structure(c)) for k, c in children)
    return kind, tuple(_structure(c) for c in children)


@torch._dynamo.assume_constant_result
def _call_spec(fun: str, args_spec, kwargs_spec, n_primal, tensor_at, others) -> str:
    try:
        spec = repr((fun, _structure_literal(args_spec), _structure_literal(kwargs_spec), n_primal,
                     tensor_at, _literal(others)))
        ast.literal_eval(spec)
        return spec
    except (TypeError, ValueError, SyntaxError):  # arguments only this process can hold
        spec = repr(("local", len(_LOCAL)))
        _LOCAL[spec] = (fun, args_spec, kwargs_spec, n_primal, tensor_at, others)
        return spec


def _call_parts(spec: str):
    if spec in _LOCAL:
        fun, args_spec, kwargs_spec, n_primal, tensor_at, others = _LOCAL[spec]
    else:
        fun, args_lit, kwargs_lit, n_primal, tensor_at, others = _parse(spec)
        args_spec, kwargs_spec = _structure(args_lit), _structure(kwargs_lit)
    return _find(fun), args_spec, kwargs_spec, n_primal, tensor_at, others


def _leaves(tensor_at, others, tensors) -> list:
    t, o, at = iter(tensors), iter(others), set(tensor_at)
    return [next(t) if i in at else next(o) for i in range(len(tensor_at) + len(others))]


def custom_function_call(fun, leaves, args_spec, kwargs_spec, n_primal) -> tuple[list, str]:
    """(flat outputs, spec) of a custom_function call, through kernelkit::custom_function."""
    tensor_at = tuple(i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor))
    others = tuple(x for x in leaves if not isinstance(x, torch.Tensor))
    spec = _call_spec(fun._op_key, args_spec, kwargs_spec, n_primal, tensor_at, others)
    return torch.ops.kernelkit.custom_function(spec, [leaves[i] for i in tensor_at]), spec


_OUT_SPECS: dict = {}  # spec -> the structure of the function's outputs


@torch._dynamo.assume_constant_result
def out_spec(spec: str):
    """The output structure of a call of this spec (known once its forward ran, fake or real), as
    a literal: some Dynamo versions cannot guard on the node types a structure would hold."""
    try:
        return _structure_literal(_OUT_SPECS[spec])
    except TypeError:  # a namedtuple result: the structure itself, by the spec
        return ("local", spec)


def unflatten(lit, flat):
    """A custom_function's result from its flat outputs and out_spec's literal structure."""
    if lit is not None and lit[0] == "local":
        from .autodiff import _unflatten
        return _unflatten(_OUT_SPECS[lit[1]], flat)
    return _build_literal(lit, iter(flat))


def _build_literal(lit, it):
    if lit is None:
        return next(it)
    name, children = lit
    if isinstance(children, int):
        items = [next(it) for _ in range(children)]
    elif name == "dict":
        return {k: _build_literal(c, it) for k, c in children}
    else:
        items = [_build_literal(c, it) for c in children]
    return tuple(items) if name == "tuple" else items


def _forward(spec: str, tensors) -> list:
    from .autodiff import _flatten, _unflatten
    fun, args_spec, kwargs_spec, n_primal, tensor_at, others = _call_parts(spec)
    leaves = _leaves(tensor_at, others, tensors)
    args = _unflatten(args_spec, leaves[:n_primal])
    kwargs = {} if kwargs_spec is None else _unflatten(kwargs_spec, leaves[n_primal:])
    flat = []
    _OUT_SPECS[spec] = _flatten(fun._fun(*args, **kwargs), flat)
    # An op's outputs may not alias its inputs: a returned input is copied.
    return [o.clone() if any(o is t for t in tensors) else o for o in flat]


@torch.library.custom_op("kernelkit::custom_function", mutates_args=())
def _custom_function(spec: str, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return _forward(spec, tensors)


@_custom_function.register_fake
def _custom_function_fake(spec, tensors):
    _fake.depth = getattr(_fake, "depth", 0) + 1
    try:
        return _forward(spec, tensors)  # its kernels answer through launch's fake
    finally:
        _fake.depth -= 1


def _setup_context(ctx, inputs, output):
    ctx.spec, tensors = inputs
    ctx.save_for_backward(*tensors, *output)
    ctx.n = len(tensors)


def _backward(ctx, grads):
    saved = ctx.saved_tensors
    tensors, outputs = saved[:ctx.n], saved[ctx.n:]
    from .autodiff import _zeros_like  # missing cotangents: one zero seen through every index
    grads = [_zeros_like(o) if g is None else g for g, o in zip(grads, outputs)]
    return None, torch.ops.kernelkit.custom_function_vjp(ctx.spec, list(tensors), list(outputs),
                                                         grads)


_custom_function.register_autograd(_backward, setup_context=_setup_context)


# The vjp rule is opaque too: it runs as written when the backward runs, never traced with fake
# tensors. A rule decides things from its tensors' data (alignment, how many entries spilled) and
# may launch kernels that add into buffers they take as inputs: a traced copy would bake the
# first and drop the second (an op with no outputs is dead code to a compiler).
@torch.library.custom_op("kernelkit::custom_function_vjp", mutates_args=())
def _custom_function_vjp(spec: str, tensors: list[torch.Tensor], outputs: list[torch.Tensor],
                         grads: list[torch.Tensor]) -> list[torch.Tensor]:
    from .autodiff import vjp_gradients
    fun, args_spec, kwargs_spec, n_primal, tensor_at, others = _call_parts(spec)
    gradients = vjp_gradients(fun, _leaves(tensor_at, others, tensors), args_spec, kwargs_spec,
                              n_primal, _OUT_SPECS[spec], outputs, grads)
    # one per tensor (zeros for none); never an alias of an argument
    return [torch.zeros_like(t) if g is None else
            g.to(t.dtype).clone() if any(g is a for a in (*tensors, *outputs, *grads)) else g.to(t.dtype)
            for g, t in zip(gradients, tensors)]


@_custom_function_vjp.register_fake
def _custom_function_vjp_fake(spec, tensors, outputs, grads):
    return [torch.empty_like(t) for t in tensors]

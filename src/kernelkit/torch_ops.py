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
by keys that the same program makes again in every process (see `kernel_key`). Dynamo computes a
spec while tracing (a constant of the graph).

A compiled graph runs the ops on every step, so their run-time path is kept short: they are
defined with torch.library.Library rather than torch.library.custom_op (whose Python wrappers
around the implementation cost ~5 us a call on a 2-core x86 host), a spec is parsed once per
process, missing cotangents are made at run time rather than filled in the graph, and the
functions run their kernels on the eager fast path.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import threading
import weakref

import torch

# (an import cycle: autodiff imports this module too; its names are read at call time only)
from . import autodiff as _autodiff

# Kernels and custom_functions by key, registered at construction (outside any tracing): each
# key's live objects (equal kernels share a key; any one of them serves). Weak: whatever a
# compiled graph calls is held by the code that calls it.
_OBJECTS: dict[str, weakref.WeakSet] = {}
_FOUND = weakref.WeakValueDictionary()  # key -> the live object _find last gave
_SEEN_NAMES: dict = {}  # custom_function qualname -> how many were made
_LOCAL: dict = {}  # spec -> non-literal arguments of a custom_function call (this process only)
_SCALAR_KINDS = {bool: "b", int: "i", float: "f"}
_SCALAR_TYPES = {"b": bool, "i": int, "f": float}


class _Depth(threading.local):
    depth = 0  # every thread's first (a class default: a missing attribute costs a raised error)


_fake = _Depth()  # fake.depth > 0: inside a fake implementation (its mode is off there)


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
    obj = _FOUND.get(key)
    if obj is None:  # first use, or the one found before is gone: iterating a WeakSet is slow
        obj = next(iter(_OBJECTS.get(key, ())), None)
        if obj is None:
            raise RuntimeError(f"[kernelkit] a compiled graph calls {key!r}, which this process has "
                               "not built (torch.compile's caches hold graphs of other runs): build "
                               "it first, as the program that compiled the graph did.")
        _FOUND[key] = obj
    return obj


_get_mode, _FAKE_MODE = torch._C._get_dispatch_mode, torch._C._TorchDispatchModeKey.FAKE


def tracing() -> bool:
    """Whether a kernel call must go through the ops: Dynamo is tracing, a fake mode is on, or a
    fake implementation is running the function."""
    return torch.compiler.is_compiling() or _get_mode(_FAKE_MODE) is not None or \
        _fake.depth > 0


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


# --- the ops -----------------------------------------------------------------------------------

_lib = torch.library.Library("kernelkit", "DEF")
_BELOW_AUTOGRAD = torch._C._after_autograd_keyset


def _define(name: str, schema: str, impl, fake, autograd=None) -> torch._ops.OpOverload:
    """The op kernelkit::name: impl on every device, fake on fake tensors and meta. autograd (a
    kernel taking the dispatch key set) at the Autograd key, else a fallthrough there: no Python
    call on the way to impl, and outputs that do not require grad (as an eager kernel's)."""
    _lib.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    _lib.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"kernelkit::{name}", fake, lib=_lib)
    if autograd is None:
        _lib.impl(name, torch.library.fallthrough_kernel, "Autograd")
    else:
        _lib.impl(name, autograd, "Autograd", with_keyset=True)
    return getattr(torch.ops.kernelkit, name).default


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


@functools.lru_cache(maxsize=4096)
def _launch_parts(spec: str):
    """(kernel key, layout, template, dtypes, ndims, init_value, contiguous) of a spec, with the
    template and dtypes as a kernel call takes them (never changed by it: shared by its calls)."""
    key, layout, template, dtypes, ndims, init, contiguous = _parse(spec)
    return (key, layout, None if template is None else list(template), list(dtypes), ndims, init,
            contiguous)


def _output_shapes(ndims, shapes) -> list:
    out, i = [], 0
    for n in ndims:
        out.append(tuple(shapes[i:i + n]))
        i += n
    return out


def _launch(spec, tensors, scalars, grid, threadgroup, shapes):
    key, layout, template, dtypes, ndims, init, contiguous = _launch_parts(spec)
    if layout.count("t") == len(layout):
        inputs = tensors
    else:
        t, s = iter(tensors), iter(scalars)
        inputs = [next(t) if k == "t" else _SCALAR_TYPES[k](next(s)) for k in layout]
    return _find(key)(inputs=inputs, output_shapes=_output_shapes(ndims, shapes),
                      output_dtypes=dtypes, grid=tuple(grid), threadgroup=tuple(threadgroup),
                      template=template, init_value=init, ensure_row_contiguous=contiguous)


def _launch_fake(spec, tensors, scalars, grid, threadgroup, shapes):
    from .arrays import dtype_of, resolve_stream
    _, _, _, dtypes, ndims, _, _ = _launch_parts(spec)
    device = tensors[0].device if tensors else resolve_stream(None, None)
    return [torch.empty(shape, dtype=dtype_of(d).torch, device=device)
            for shape, d in zip(_output_shapes(ndims, shapes), dtypes)]


_define("launch", "(str spec, Tensor[] tensors, float[] scalars, SymInt[] grid, "
        "SymInt[] threadgroup, SymInt[] shapes) -> Tensor[]", _launch, _launch_fake)


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


class _OpCall:
    """A custom_function call of one spec, as its ops run it: the function's key and how its
    arguments are made from the call's tensors (worked out once per spec)."""

    __slots__ = ("fun", "args_spec", "kwargs_spec", "n_primal", "tensor_at", "others", "kwargs",
                 "primal", "direct")

    def __init__(self, fun, args_spec, kwargs_spec, n_primal, tensor_at, others):
        self.fun, self.args_spec, self.kwargs_spec = fun, args_spec, kwargs_spec
        self.n_primal, self.tensor_at, self.others = n_primal, tensor_at, others
        # The usual call: tensors among the positional arguments only, keyword arguments flat.
        # Its kwargs are then the same every time (** copies the dict), and its leaves the
        # `primal` template with the tensors put in; `direct`: its positional arguments are
        # its tensors.
        self.kwargs = self.primal = None
        if all(i < n_primal for i in tensor_at) and (kwargs_spec is None or (
                type(kwargs_spec[1]) is tuple and all(c is None for _, c in kwargs_spec[1]))):
            leaves = _leaves(tensor_at, others, [None] * len(tensor_at))
            kwargs = leaves[n_primal:]
            self.kwargs = {} if kwargs_spec is None else _autodiff._unflatten(kwargs_spec, kwargs)
            self.primal = leaves
        self.direct = self.kwargs is not None and args_spec == (tuple, n_primal) and \
            tensor_at == tuple(range(n_primal))

    def leaves(self, tensors) -> list:
        if self.primal is None:
            return _leaves(self.tensor_at, self.others, tensors)
        leaves = self.primal.copy()
        for i, t in zip(self.tensor_at, tensors):
            leaves[i] = t
        return leaves

    def arguments(self, leaves):
        """(args, kwargs) of the call."""
        n, unflatten = self.n_primal, _autodiff._unflatten
        args = unflatten(self.args_spec, leaves[:n] if len(leaves) > n else leaves)
        if self.kwargs is not None:
            return args, self.kwargs
        return args, ({} if self.kwargs_spec is None else unflatten(self.kwargs_spec, leaves[n:]))


@functools.lru_cache(maxsize=4096)
def _literal_call(spec: str) -> _OpCall:
    fun, args_lit, kwargs_lit, n_primal, tensor_at, others = _parse(spec)
    return _OpCall(fun, _structure(args_lit), _structure(kwargs_lit), n_primal, tensor_at, others)


def _call_of(spec: str) -> _OpCall:
    local = _LOCAL.get(spec)
    if local is None:
        return _literal_call(spec)
    if type(local) is not _OpCall:
        local = _LOCAL[spec] = _OpCall(*local)
    return local


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
        return _autodiff._unflatten(_OUT_SPECS[lit[1]], flat)
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
    call = _call_of(spec)
    fun = _find(call.fun)._fun
    if call.direct:
        result = fun(*tensors, **call.kwargs)
    else:
        args, kwargs = call.arguments(call.leaves(tensors))
        result = fun(*args, **kwargs)
    flat = []
    _OUT_SPECS[spec] = _autodiff._flatten(result, flat)
    # An op's outputs may not alias its inputs: a returned input is copied.
    for i, o in enumerate(flat):
        for t in tensors:
            if o is t:
                flat[i] = o.clone()
                break
    return flat


def _custom_function_fake(spec, tensors):
    _fake.depth += 1
    try:
        return _forward(spec, tensors)  # its kernels answer through launch's fake
    finally:
        _fake.depth -= 1


class _Differentiated(torch.autograd.Function):
    """kernelkit::custom_function where autograd records it (AOTAutograd traces its backward into
    the compiled graph): the backward is kernelkit::custom_function_vjp."""

    @staticmethod
    def forward(spec, *tensors):
        with torch._C._AutoDispatchBelowAutograd():
            return tuple(_CUSTOM_FUNCTION(spec, list(tensors)))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.spec, ctx.n = inputs[0], len(inputs) - 1
        ctx.save_for_backward(*inputs[1:], *output)
        # Missing cotangents stay None: the vjp op makes them at run time as zero-strided views,
        # where zeros in the graph would be filled buffers the size of the outputs, every step.
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, *grads):
        saved = ctx.saved_tensors
        return None, *_CUSTOM_FUNCTION_VJP(ctx.spec, list(saved[:ctx.n]), list(saved[ctx.n:]),
                                           list(grads))


_BELOW_IN_PLACE = torch._C._after_ADInplaceOrView_keyset  # (a functional op: nothing to do there)
_BACKENDS = (torch._C.DispatchKey.CPU, torch._C.DispatchKey.CUDA)


def _custom_function_autograd(keyset, spec, tensors):
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return list(_Differentiated.apply(spec, *tensors))
    # Nothing for autograd to record: a compiled graph's step. Where the implementation comes next
    # (plain tensors, no fake or functional ones), it is called here rather than redispatched to.
    with torch._C._AutoDispatchBelowAutograd():
        if (keyset & _BELOW_IN_PLACE).highestPriorityTypeId() in _BACKENDS:
            return _forward(spec, tensors)
        return _CUSTOM_FUNCTION.redispatch(keyset & _BELOW_AUTOGRAD, spec, tensors)


_CUSTOM_FUNCTION = _define("custom_function", "(str spec, Tensor[] tensors) -> Tensor[]", _forward,
                           _custom_function_fake, _custom_function_autograd)


# The vjp rule is opaque too: it runs as written when the backward runs, never traced with fake
# tensors. A rule decides things from its tensors' data (alignment, how many entries spilled) and
# may launch kernels that add into buffers they take as inputs: a traced copy would bake the
# first and drop the second (an op with no outputs is dead code to a compiler).
def _custom_function_vjp(spec, tensors, outputs, grads):
    call = _call_of(spec)
    leaves = call.leaves(tensors)
    args, kwargs = (tuple(tensors), call.kwargs) if call.direct else call.arguments(leaves)
    grads = _autodiff.cotangents(grads, outputs)
    gradients = _autodiff.vjp_gradients(_find(call.fun), args, kwargs, leaves, call.n_primal,
                                        _OUT_SPECS[spec], outputs, grads)
    # one per tensor (zeros for none), of its dtype and laid out as empty_like makes it (what the
    # fake gave the compiled graph, which checks the strides); never an alias of an argument
    given = {id(a) for a in (*tensors, *outputs, *grads)}
    out = []
    for g, t in zip(gradients, tensors):
        if g is None:
            out.append(torch.zeros_like(t))
            continue
        if not (g.dtype == t.dtype and g.stride() == t.stride() and t.is_contiguous()):  # (usual)
            like = torch.empty_like(t)
            if g.dtype != t.dtype or g.stride() != like.stride():
                out.append(like.copy_(g))
                continue
        out.append(g.clone() if id(g) in given else g)
    return out


def _custom_function_vjp_fake(spec, tensors, outputs, grads):
    return [torch.empty_like(t) for t in tensors]


_CUSTOM_FUNCTION_VJP = _define("custom_function_vjp", "(str spec, Tensor[] tensors, "
                               "Tensor[] outputs, Tensor?[] grads) -> Tensor[]",
                               _custom_function_vjp, _custom_function_vjp_fake)

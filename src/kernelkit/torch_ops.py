"""Kernel calls and custom_functions as torch.library custom ops, for torch.compile.

Eager calls never come here: they keep the fast path. A call traced by torch.compile (Dynamo),
or made on fake tensors (torch.compile's shape propagation, AOTAutograd, torch.library.opcheck),
goes through one of two opaque ops instead:

- `kernelkit::launch(spec, tensors, scalars, grid, threadgroup, shapes)`: a kernel call. Its
  fake implementation makes the outputs from output_shapes and output_dtypes; grid, threadgroup
  and shapes may be symbolic (dynamic shapes).
- `kernelkit::custom_function(spec, tensors)`: a custom_function call, with its vjp rule as the
  op's autograd formula. Its fake implementation runs the function on fake tensors, where each of
  its kernels answers through `kernelkit::launch`'s.

What the ops' arguments cannot carry (the kernel, template values, dtypes, init_value, the
structure and non-tensor arguments of a custom_function call) is a *spec*, registered once per
distinct value and passed by number; Dynamo computes the number while tracing (a constant of the
graph).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import NamedTuple

import torch

# Kernels and custom_functions by name, given at construction (outside any tracing: Dynamo
# would defer the registration past the graph that needs it). Weak: a compiled graph's function
# holds what it calls.
_OBJECTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
_next_number = itertools.count()
_SPECS: list = []  # spec number -> _Launch or _Call
_SPEC_NUMBERS: dict = {}
_SCALAR_KINDS = {bool: "b", int: "i", float: "f"}
_SCALAR_TYPES = {"b": bool, "i": int, "f": float}


def register(obj) -> str:
    """A name for a kernel or custom_function, by which the ops' specs find it (a string: Dynamo
    keeps strings constant, where an int attribute may become symbolic under dynamic shapes)."""
    name = f"#{next(_next_number)}"
    _OBJECTS[name] = obj
    return name


def _number(spec) -> int:
    try:
        n = _SPEC_NUMBERS.get(spec)
    except TypeError:  # an unhashable non-tensor argument: a number of its own
        _SPECS.append(spec)
        return len(_SPECS) - 1
    if n is None:
        n = _SPEC_NUMBERS[spec] = len(_SPECS)
        _SPECS.append(spec)
    return n


_fake = threading.local()  # fake.depth > 0: inside a fake implementation (its mode is off there)


def tracing() -> bool:
    """Whether a kernel call must go through the ops: Dynamo is tracing, a fake mode is on, or a
    fake implementation is running the function."""
    return torch.compiler.is_compiling() or torch._C._get_dispatch_mode(
        torch._C._TorchDispatchModeKey.FAKE) is not None or getattr(_fake, "depth", 0) > 0


# --- kernel calls -------------------------------------------------------------------------------

class _Launch(NamedTuple):
    kernel: str  # the kernel's name in _OBJECTS
    layout: str  # per input: "t" a tensor, "b"/"i"/"f" a Python scalar
    template: tuple | None
    output_dtypes: tuple
    ndims: tuple  # each output's number of dims
    init_value: object
    contiguous: bool | None

    def inputs(self, tensors, scalars) -> list:
        t, s = iter(tensors), iter(scalars)
        return [next(t) if k == "t" else _SCALAR_TYPES[k](next(s)) for k in self.layout]

    def shapes(self, flat) -> list[list]:
        out, i = [], 0
        for n in self.ndims:
            out.append(list(flat[i:i + n]))
            i += n
        return out


@torch._dynamo.assume_constant_result
def _launch_spec(kernel_number, layout, template, output_dtypes, ndims, init_value, contiguous) -> int:
    return _number(_Launch(kernel_number, layout, template, output_dtypes, ndims, init_value,
                           contiguous))


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
    spec = _launch_spec(kernel._op_number, layout,
                        None if template is None else tuple(tuple(p) for p in template),
                        tuple(output_dtypes), tuple(len(s) for s in output_shapes),
                        None if init_value is None else (tuple(init_value) if isinstance(
                            init_value, (list, tuple)) else init_value), contiguous)
    shapes = [s for shape in output_shapes for s in shape]
    return torch.ops.kernelkit.launch(spec, tensors, scalars, list(grid), list(threadgroup), shapes)


@torch.library.custom_op("kernelkit::launch", mutates_args=())
def _launch(spec: int, tensors: list[torch.Tensor], scalars: list[float], grid: list[int],
            threadgroup: list[int], shapes: list[int]) -> list[torch.Tensor]:
    s = _SPECS[spec]
    return _OBJECTS[s.kernel](
        inputs=s.inputs(tensors, scalars), output_shapes=[tuple(x) for x in s.shapes(shapes)],
        output_dtypes=list(s.output_dtypes), grid=tuple(grid), threadgroup=tuple(threadgroup),
        template=None if s.template is None else list(s.template), init_value=s.init_value,
        ensure_row_contiguous=s.contiguous)


@_launch.register_fake
def _launch_fake(spec, tensors, scalars, grid, threadgroup, shapes):
    from .arrays import dtype_of, resolve_stream
    s = _SPECS[spec]
    device = tensors[0].device if tensors else resolve_stream(None, None)
    return [torch.empty(shape, dtype=dtype_of(d).torch, device=device)
            for shape, d in zip(s.shapes(shapes), s.output_dtypes)]


# --- custom_function calls ----------------------------------------------------------------------

class _Call(NamedTuple):
    fun_number: str  # the custom_function's name in _OBJECTS
    args_spec: object
    kwargs_spec: object
    n_primal: int
    tensor_at: tuple  # leaf positions of the tensors
    others: tuple  # the non-tensor leaves, in order

    def leaves(self, tensors) -> list:
        t, o = iter(tensors), iter(self.others)
        at = set(self.tensor_at)
        return [next(t) if i in at else next(o) for i in range(len(self.tensor_at) + len(self.others))]

    @property
    def fun(self):
        return _OBJECTS[self.fun_number]

    def fun_arguments(self, tensors) -> tuple:
        from .autodiff import _unflatten
        leaves = self.leaves(tensors)
        args = _unflatten(self.args_spec, leaves[:self.n_primal])
        kwargs = {} if self.kwargs_spec is None else _unflatten(self.kwargs_spec, leaves[self.n_primal:])
        return args, kwargs


@torch._dynamo.assume_constant_result
def _call_spec(fun_number, args_spec, kwargs_spec, n_primal, tensor_at, others) -> int:
    return _number(_Call(fun_number, args_spec, kwargs_spec, n_primal, tensor_at, others))


def custom_function_call(fun, leaves, args_spec, kwargs_spec, n_primal) -> tuple[list, int]:
    """(flat outputs, spec number) of a custom_function call, through kernelkit::custom_function."""
    tensor_at = tuple(i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor))
    others = tuple(x for x in leaves if not isinstance(x, torch.Tensor))
    spec = _call_spec(fun._op_number, args_spec, kwargs_spec, n_primal, tensor_at, others)
    return torch.ops.kernelkit.custom_function(spec, [leaves[i] for i in tensor_at]), spec


_OUT_SPECS: dict = {}  # spec number -> the structure of the function's outputs


@torch._dynamo.assume_constant_result
def out_spec(spec: int):
    """The output structure of a call of this spec (known once its forward ran, fake or real)."""
    return _OUT_SPECS[spec]


def _forward(spec: int, tensors) -> list:
    from .autodiff import _flatten
    s: _Call = _SPECS[spec]
    args, kwargs = s.fun_arguments(tensors)
    flat = []
    _OUT_SPECS[spec] = _flatten(s.fun._fun(*args, **kwargs), flat)
    # An op's outputs may not alias its inputs: a returned input is copied.
    return [o.clone() if any(o is t for t in tensors) else o for o in flat]


@torch.library.custom_op("kernelkit::custom_function", mutates_args=())
def _custom_function(spec: int, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return _forward(spec, tensors)


@_custom_function.register_fake
def _custom_function_fake(spec, tensors):
    _fake.depth = getattr(_fake, "depth", 0) + 1
    try:
        return _forward(spec, tensors)  # its kernels answer through launch's fake
    finally:
        _fake.depth -= 1


def _setup_context(ctx, inputs, output):
    spec, tensors = inputs
    ctx.spec = spec
    ctx.save_for_backward(*tensors, *output)
    ctx.n = len(tensors)


def _backward(ctx, grads):
    from .autodiff import vjp_gradients
    s: _Call = _SPECS[ctx.spec]
    saved = ctx.saved_tensors
    tensors, outputs = saved[:ctx.n], saved[ctx.n:]
    grads = [torch.zeros_like(o) if g is None else g for g, o in zip(grads, outputs)]
    return None, vjp_gradients(s.fun, s.leaves(tensors), s.args_spec, s.kwargs_spec, s.n_primal,
                               _OUT_SPECS[ctx.spec], list(outputs), grads)


_custom_function.register_autograd(_backward, setup_context=_setup_context)

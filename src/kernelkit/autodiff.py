"""`custom_function`: MLX's `mx.custom_function` on PyTorch.

    @kk.custom_function
    def f(x, y): ...                          # any torch code, typically kernelkit kernels

    @f.vjp
    def f_vjp(primals, cotangents, outputs): ...   # -> one gradient per primal
    @f.jvp
    def f_jvp(primals, tangents): ...              # -> the output tangent(s)
    @f.vmap
    def f_vmap(inputs, axes): ...                  # -> (outputs, out_axes)

A kernel is opaque to autograd, so a call goes through a `torch.autograd.Function`
made for `f` (its `grad_fn` reads `fBackward`) whose backward, jvp and vmap
staticmethods call the rules. That is the road both `torch.autograd`
(`.backward()`, `autograd.grad`, `gradcheck`, forward AD) and `torch.func`
(`grad`, `vjp`, `jvp`, `vmap`, `jacrev`...) take. The usual call, which only
plain autograd records, takes a shorter one of the same meaning: its forward
runs below autograd and a C++ node (autograd_node.cpp, also `fBackward`) calls
the vjp rule. Backward runs where autograd runs it: on the stream of the
forward, with no sync here.

The rules see what MLX's see:
- `primals` / `inputs`: the positional arguments as a tuple, or the argument
  itself when there is exactly one. Non-tensor arguments (Python numbers,
  NumPy arrays, anything) are passed through unchanged and get no gradient;
  arguments may be nested tuples/lists/dicts of them.
- `cotangents` / `outputs`: shaped like f's return value: a single tensor
  where f returns one, not a 1-tuple.
- keyword arguments are passed to f and to every rule (`**kwargs`) as
  constants: no gradient, no tangent, never batched. Differentiate through
  positional arguments.
- A vjp returns one gradient per positional argument (a single one where
  there is one argument), shaped like `primals`; None for no gradient.
- `tangents` mirrors `primals`: None for non-tensor arguments, zeros for a
  tensor without a tangent (a zero-strided view, as missing cotangents below).
- `axes` mirrors `inputs`: the batched axis of each tensor, or None. The
  vmap rule returns `(outputs, out_axes)`; out_axes may be a single int/None
  for every output.

Choices where PyTorch and MLX differ:
- Missing cotangents (an output the loss does not use) arrive as zeros, as in
  MLX: a zero-strided view of one zero, kept per dtype and device (no memory
  filled; a kernel taking it gets a row-contiguous copy, as for any view). Do
  not write into cotangents.
- Outputs of integer or bool dtype are marked non-differentiable: they get no
  gradient and their cotangent is zeros; their tangent is dropped.
- A transform whose rule was not given goes through f itself, as MLX's does:
  torch.func differentiates or batches f's own torch code (for a vjp, f runs
  again in the backward). A kernel has no derivative or batching of its own,
  so where f calls one the transform raises NotImplementedError naming f and
  the rule to define. Calling f without a transform never needs a rule.
- Under `torch.func.grad`/`jvp` the vjp and jvp rules run one functorch level
  down, on plain tensors, as the forward does, so kernels can read them. Their
  results are still differentiable by outer transforms (grad of grad works),
  but not again at that same level, which only matters when mixing
  `torch.autograd.grad(create_graph=True)` inside a `torch.func` transform.
"""

from __future__ import annotations

import functools
import sys

import torch
from torch.autograd import forward_ad as _forward_ad

from . import fastcall as _fastcall
from . import torch_ops as _torch_ops

_LEAF = None  # the structure of a leaf (see _flatten)
_functorch = torch._C._functorch
_unwrap_if_dead = _functorch.unwrap_if_dead  # tensors of a torch.func transform now gone
_level_of = _functorch.maybe_get_level


def _flatten(tree, leaves: list):
    """Append the leaves of nested tuples/lists/dicts to `leaves`; return the structure.

    Our own, rather than torch's private pytree: there, None is an empty node,
    and MLX's rules use None as a leaf (no gradient, no tangent, no axis).
    A plain tuple or list of leaves (the usual arguments and results) is (type, n).
    """
    if isinstance(tree, (tuple, list)):
        if type(tree) in (tuple, list):
            for x in tree:  # (a loop: this runs on every call, and any() over a generator is slower)
                if isinstance(x, _NODES):
                    break
            else:
                leaves.extend(tree)
                return type(tree), len(tree)
        return type(tree), tuple(_flatten(x, leaves) for x in tree)
    if isinstance(tree, dict):
        return dict, tuple((k, _flatten(v, leaves)) for k, v in tree.items())
    leaves.append(tree)
    return _LEAF


_NODES = (tuple, list, dict)
_HELD = (torch.Tensor, *_NODES)  # keyword values that go to autograd as leaves, not held


def _unflatten(spec, leaves):
    if spec is _LEAF:
        return leaves[0]
    if type(spec[1]) is int and len(leaves) == spec[1]:
        return spec[0](leaves)  # a flat tuple or list: the common case, in one step
    return _build(spec, iter(leaves))


def _build(spec, it):
    if spec is _LEAF:
        return next(it)
    kind, children = spec
    if type(children) is int:
        return kind(next(it) for _ in range(children))
    if kind is dict:
        return {k: _build(c, it) for k, c in children}
    items = [_build(c, it) for c in children]
    return kind(*items) if hasattr(kind, "_fields") else kind(items)  # namedtuples take fields


_ZERO: dict[tuple, torch.Tensor] = {}  # one zero per (dtype, device), seen by _zeros_like
_ZEROS: dict[tuple, torch.Tensor] = {}  # its views by (dtype, device, shape): an expand costs ~3 us


def _zeros_like(t: torch.Tensor) -> torch.Tensor:
    """Zeros shaped like t, as one element seen through every index (no memory filled). Shapes of
    more than one element share one zero per dtype and device (filling a new one is a kernel
    launch per missing cotangent), and one view of it per shape: writing into such a view fails
    (its elements overlap), and the zero is made again if it was written all the same (its
    version counter, which its views share, moved)."""
    if t.numel() <= 1 or (t.is_cuda and torch.cuda.is_current_stream_capturing()):
        # (a CUDA graph's zero is its own: the shared one may be made again while it replays)
        return torch.zeros((), dtype=t.dtype, device=t.device).expand(t.shape)
    try:
        shaped = (t.dtype, t.device, t.shape)
        view = _ZEROS.get(shaped)
    except TypeError:  # a symbolic shape
        shaped = view = None
    if view is not None and not view._version:
        return view
    key = (t.dtype, t.device)
    zero = _ZERO.get(key)
    if zero is None or zero._version:
        if t.is_cuda:
            # Made on a stream of its own, outside any memory pool the current stream allocates
            # from (torch.compile's CUDA graphs count every live block of theirs as theirs), and
            # filled before any stream reads it.
            side = torch.cuda.Stream(t.device)
            with torch.cuda.stream(side):
                zero = torch.zeros((), dtype=t.dtype, device=t.device)
            side.synchronize()
        else:
            zero = torch.zeros((), dtype=t.dtype, device=t.device)
        _ZERO[key] = zero
    view = zero.expand(t.shape)
    if shaped is not None:
        if len(_ZEROS) >= 256:
            _ZEROS.clear()
        _ZEROS[shaped] = view
    return view


def _missing(fun: "custom_function", rule: str, purpose: str) -> NotImplementedError:
    name = fun.__name__
    return NotImplementedError(f"[custom_function] {name} has no {rule} rule: define one with "
                               f"@{name}.{rule} to {purpose} (without one, the transform goes "
                               f"through {name} itself, and a kernel there cannot be gone through)")


def _through(fun: "custom_function", rule: str, purpose: str, transform):
    """transform(): a torch.func transform through f itself, where f has no such rule (MLX's
    default). A kernel that f calls cannot read torch.func's tensors (they have no storage): that
    is the missing rule, said as such."""
    try:
        return transform()
    except RuntimeError as e:
        if "have storage" not in str(e):
            raise
        raise _missing(fun, rule, purpose) from e


def _differentiable(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


class _Call:
    """One call of a custom_function: what the autograd.Function needs beyond tensors.

    It travels as the first (non-tensor) argument of `apply`, so the staticmethods know
    which function they serve, and carries the output structure back to `__call__` from
    whichever of forward or the vmap rule produced the outputs.
    """

    __slots__ = ("fun", "args_spec", "kwargs_spec", "kwargs", "n_primal", "tensor_at", "out_spec", "leaves",
                 "outs")

    def __init__(self, fun, args_spec, kwargs_spec, kwargs, n_primal, tensor_at):
        self.fun, self.args_spec, self.kwargs_spec, self.kwargs = fun, args_spec, kwargs_spec, kwargs
        self.n_primal, self.tensor_at, self.out_spec = n_primal, tensor_at, None
        self.leaves = None  # the C++ node's call: its non-tensor leaves (see _held_leaves)
        self.outs = None  # _Direct's: the outputs of a forward already run

    def unflatten(self, leaves):
        """(args, kwargs) of the call, from its leaves: keyword arguments are leaves past the
        positional ones where they hold tensors, else held as given (`kwargs`)."""
        if len(leaves) == self.n_primal:
            return _unflatten(self.args_spec, leaves), self.kwargs
        return (_unflatten(self.args_spec, leaves[:self.n_primal]),
                _unflatten(self.kwargs_spec, leaves[self.n_primal:]))

    def arguments(self, leaves):
        """(rule_args, kwargs): positional args as MLX hands them to rules, and the kwargs."""
        args, kwargs = self.unflatten(leaves)
        return (args[0] if len(args) == 1 else args), kwargs

    def outputs(self, out, what: str) -> list:
        flat = []
        self.out_spec = _flatten(out, flat)
        for o in flat:
            if not isinstance(o, torch.Tensor):
                raise TypeError(f"[custom_function] {self.fun.__name__}'s {what} must return a "
                                f"tensor or a tuple/list/dict of tensors, got {type(o).__name__}.")
        return flat


def _grad_interpreter():
    """The innermost live functorch interpreter if it is a grad or jvp one, else None."""
    if not torch._C._are_functorch_transforms_active():
        return None
    from torch._C._functorch import TransformType
    from torch._functorch.pyfunctorch import retrieve_current_functorch_interpreter
    interpreter = retrieve_current_functorch_interpreter()
    return interpreter if interpreter.key() in (TransformType.Grad, TransformType.Jvp) else None


def _below_functorch(fun, what: str, rule, tensors: list) -> list:
    """rule(tensors) -> list of tensors/None, run where a kernel can read the tensors.

    Inside torch.func.grad/jvp, backward and jvp get tensors wrapped for that level (no
    storage: a kernel cannot take their data_ptr). Like functorch does for forward, we
    unwrap them, run the rule one level down and wrap its results. Wrappers of a level
    that is gone (torch.func.vjp's vjp_fn called later) are simply unwrapped.
    """
    tensors = [t if t is None else _unwrap_if_dead(t) for t in tensors]
    interpreter = _grad_interpreter()
    level = None if interpreter is None else interpreter.level()
    try:
        if level is None or not any(t is not None and _level_of(t) == level for t in tensors):
            return rule(tensors)  # plain autograd, or nothing of this level here
        tensors = [t if t is None else _functorch._unwrap_for_grad(t, level) for t in tensors]
        with interpreter.lower():
            results = rule(tensors)
        return [r if r is None else _functorch._wrap_for_grad(r, level) for r in results]
    except RuntimeError as e:
        # What is still wrapped is batched by an outer vmap (jacrev, jacfwd, vmap of grad).
        if "have storage" in str(e) and any(t is not None and _functorch.is_functorch_wrapped_tensor(t)
                                            for t in tensors):
            raise RuntimeError(
                f"[custom_function] {fun.__name__}'s {what} rule runs under torch.func.vmap "
                "(vmap, jacrev, jacfwd...) and a kernel cannot read batched tensors: write the "
                "rule with custom_functions that have vmap rules.") from e
        raise


class _Function(torch.autograd.Function):
    """The autograd.Function behind every custom_function (subclassed per function for its name).

    apply(call, *leaves): leaves are the flattened (args, kwargs), tensors or not; forward
    returns the flat tuple of outputs. setup_context style, as torch.func requires.
    """

    generate_vmap_rule = False  # the vmap staticmethod below calls the user's rule

    @staticmethod
    def forward(call, *leaves):
        args, kwargs = call.unflatten(leaves)
        outs = call.outputs(call.fun._fun(*args, **kwargs), "forward")
        # An input returned as-is cannot be saved for backward (setup_context style): a view can.
        ins = {id(leaves[i]) for i in call.tensor_at}
        return tuple(o.view_as(o) if id(o) in ins else o for o in outs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _keep(ctx, inputs[0], inputs[1:], output, direct=False)

    @staticmethod
    def backward(ctx, *grads):
        return _backward(ctx, grads)

    @staticmethod
    def jvp(ctx, _call_tangent, *tangents):
        call = ctx.call
        n_in = len(ctx.tensor_at)

        def rule(tensors):
            leaves = _with_tensors(ctx.leaves, ctx.tensor_at, tensors[:n_in])
            if call.fun._jvp is None:
                return _traced_jvp(call, leaves, tensors[n_in:], ctx.out_diff)
            primals, kwargs = call.arguments(leaves)
            # tangents mirror the primals: None for non-tensors, zeros for a tensor without one
            tangent_leaves = [None] * (n_in if ctx.leaves is None else len(ctx.leaves))
            for i, t in zip(ctx.tensor_at, tensors[n_in:]):
                tangent_leaves[i] = t
            rule_tangents, _ = call.arguments(tangent_leaves)
            flat = []
            _flatten(call.fun._jvp(primals, rule_tangents, **kwargs), flat)
            if len(flat) != len(ctx.out_diff):
                raise ValueError(f"[custom_function] {call.fun.__name__}'s jvp returned "
                                 f"{len(flat)} tangents for {len(ctx.out_diff)} outputs.")
            return [t if d else None for t, d in zip(flat, ctx.out_diff)]

        saved = ctx.saved_tensors
        tangents = [_zeros_like(x) if tangents[i] is None else tangents[i] for i, x in zip(ctx.tensor_at, saved)]
        return tuple(_below_functorch(call.fun, "jvp", rule, [*saved, *tangents]))

    @staticmethod
    def vmap(info, in_dims, call, *leaves):
        fun = call.fun
        inputs, kwargs = call.arguments(leaves)
        axes = call.arguments(in_dims[1:])[0]
        if any(a is not None for a in in_dims[1 + call.n_primal:]):  # a tensor among the kwargs
            raise ValueError(f"[custom_function] {fun.__name__}: keyword arguments cannot be "
                             "vmapped over; pass batched tensors positionally.")
        if fun._vmap is None:  # MLX batches f itself: torch.func.vmap through it, on axis 0 out
            args, arg_axes = call.unflatten(leaves)[0], call.unflatten(in_dims[1:])[0]
            batched = torch.func.vmap(functools.partial(fun._fun, **kwargs), in_dims=arg_axes)
            result = _through(fun, "vmap", "use torch.func.vmap", lambda: batched(*args)), 0
        else:
            result = fun._vmap(inputs, axes, **kwargs)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(f"[custom_function] {fun.__name__}'s vmap rule must return "
                            "(outputs, out_axes).")
        outs = call.outputs(result[0], "vmap rule")
        out_axes = result[1]
        flat_axes = [out_axes] * len(outs) if out_axes is None or isinstance(out_axes, int) \
            else _leaves(out_axes)
        if len(flat_axes) != len(outs):
            raise ValueError(f"[custom_function] {fun.__name__}'s vmap rule returned "
                             f"{len(flat_axes)} out_axes for {len(outs)} outputs.")
        flat_axes = [a if a is None or a >= 0 else a + o.dim() for a, o in zip(flat_axes, outs)]
        return tuple(outs), tuple(flat_axes)


class _Direct(torch.autograd.Function):
    """The autograd.Function of the usual call (which neither torch.func nor forward-mode AD sees,
    whose positional arguments are flat and keyword arguments hold no tensor) where the C++ node
    cannot take it (see _record): old-style (its forward takes ctx), so a call runs one Python
    frame each way and rebuilds no structure, where _Function's setup_context style (which
    torch.func needs) runs three. Its backward is _Function's.

    apply(call, *args) -> the flat tuple of outputs, those of the forward already run (call.outs).
    """

    @staticmethod
    def forward(ctx, call, *args):
        outs, call.outs = call.outs, None  # (kept on the call, they would keep the graph alive)
        _keep(ctx, call, args, outs, direct=True)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grads):
        return _backward(ctx, grads)


def _keep(ctx, call, leaves, outputs, direct: bool) -> None:
    """What a call's backward (and jvp) needs, on its ctx: the call, its non-tensor leaves as they
    are, its tensors and outputs saved; direct: whether _Direct made it."""
    ctx.call, ctx.direct = call, direct
    ctx.tensor_at = call.tensor_at
    ctx.leaves = _held_leaves(leaves, call.tensor_at)
    tensors = [leaves[i] for i in call.tensor_at]
    ctx.out_diff = [o.is_floating_point() or o.is_complex() for o in outputs]
    if False in ctx.out_diff:
        ctx.mark_non_differentiable(*[o for o, d in zip(outputs, ctx.out_diff) if not d])
    ctx.set_materialize_grads(False)  # backward makes its zeros without filling memory
    # MLX's vjp gets primals and outputs, its jvp the primals: save exactly those.
    ctx.save_for_backward(*tensors, *outputs)
    if _forward_ad._current_level >= 0 or torch._C._are_functorch_transforms_active():
        ctx.save_for_forward(*tensors)  # only forward-mode AD runs jvp


def _backward(ctx, grads) -> tuple:
    """The gradients of a call's apply arguments by the vjp rule: None for `call` and the
    non-tensor leaves."""
    grads = _rule_gradients(ctx.call, ctx.leaves, ctx.saved_tensors, grads, ctx.direct)
    if ctx.leaves is None:
        return (None, *grads)
    out = [None] * (1 + len(ctx.leaves))
    for i, g in zip(ctx.tensor_at, grads):
        out[1 + i] = g
    return tuple(out)


def _compiled_autograd_on() -> bool:
    """Whether compiled autograd is on (torch._dynamo's, if imported; its config flag turns it on
    while a compiled frame runs): it traces Python autograd nodes, so a call then goes through
    torch.autograd.Function."""
    compiled = sys.modules.get("torch._dynamo.compiled_autograd")
    return compiled is not None and compiled.compiled_autograd_enabled


def record_op(fun: "custom_function", inputs: tuple, kwargs: dict, backward):
    """fun(*inputs, **kwargs) for kernelkit's own ops (inputs: tensors, kwargs: constants). Under
    plain autograd fun's function runs below autograd and the C++ node records it, its backward
    `backward(*inputs, *outputs, *cotangents, **kwargs)` -> a gradient (or None) per input, the
    cotangents as custom_function's rules get them (zeros where not given): custom_function's
    handling of MLX's argument structures cost flash attention's forward + backward ~13 us of
    host time on the CPU, ~40 on the H200's host. Everywhere else (no input requires grad, grad
    mode off, a torch.func transform, forward AD, torch.compile or compiled autograd on, the node
    not built) fun itself, which handles every case."""
    if _torch_ops.tracing():  # (first: Dynamo would guard on what the others read, and compile again)
        return fun(*inputs, **kwargs)
    attach = _fastcall.node_attach
    if attach is None or not torch.is_grad_enabled() or _forward_ad._current_level >= 0 \
            or torch._C._are_functorch_transforms_active() or _compiled_autograd_on():
        return fun(*inputs, **kwargs)
    for x in inputs:  # (a loop: any() over a generator costs more, on every call)
        if x.requires_grad:
            break
    else:
        return fun(*inputs, **kwargs)
    unwrapped = [_unwrap_if_dead(x) for x in inputs]
    out = _without_grad(fun._fun, *unwrapped, **kwargs)
    outs = list(out) if type(out) in (tuple, list) else [out]
    if not attach(_op_backward, (fun, backward, kwargs, len(unwrapped)), unwrapped, outs, fun._node_name):
        return fun(*inputs, **kwargs)  # (an output aliases an input: fun's road gives it a view of its own)
    return out


def _without_grad(fn, *args, **kwargs):
    """fn(*args, **kwargs) with grad mode off, called where it is on (torch.no_grad()'s context
    manager costs ~3 us more)."""
    torch._C._set_grad_enabled(False)
    try:
        return fn(*args, **kwargs)
    finally:
        torch._C._set_grad_enabled(True)


def kernel_backward(backward):
    """An op's backward made of kernels, run without grad mode: kernels have no derivative, so under
    create_graph or torch.func.grad (where grad mode is on) they would only warn of it."""
    @functools.wraps(backward)
    def run(*args, **kwargs):
        return _without_grad(backward, *args, **kwargs) if torch.is_grad_enabled() else backward(*args, **kwargs)
    return run


def _op_backward(call, *tensors) -> list:
    """record_op's node's backward: call is (fun, backward, kwargs, number of inputs)."""
    fun, backward, kwargs, n_in = call
    saved, grads = _node_arguments(tensors, n_in)
    tensors = [*saved, *cotangents(grads, saved[n_in:])]
    if torch._C._are_functorch_transforms_active():  # (a graph recorded outside, run inside)
        return _below_functorch(fun, "vjp", lambda ts: backward(*ts, **kwargs), tensors)
    return backward(*tensors, **kwargs)


def _node_arguments(tensors: tuple, n_in: int) -> tuple:
    """(a call's tensors and outputs, their cotangents) of what the C++ node hands its backward."""
    n_saved = n_in + (len(tensors) - n_in) // 2
    return tensors[:n_saved], tensors[n_saved:]


def cotangents(grads, outputs) -> list:
    """The outputs' cotangents as the rules get them: zeros (as MLX) where autograd gives None."""
    return [_zeros_like(o) if g is None else g for g, o in zip(grads, outputs)]


def _node_backward(call, *tensors) -> list:
    """The C++ node's backward (autograd_node.cpp): `tensors` are the call's tensors, its outputs,
    then their cotangents (None where not given); one gradient per tensor of the call."""
    return _rule_gradients(call, call.leaves, *_node_arguments(tensors, len(call.tensor_at)), True)


def _rule_gradients(call, leaves, saved, grads, direct: bool) -> list:
    """The gradient of each tensor of a call by its vjp rule. leaves: the call's leaves with None
    at its tensors (None: all are tensors); saved: its tensors, then its outputs; grads: the
    outputs' cotangents, None where not given (zeros then, as MLX); direct: whether its forward
    ran outside torch.func."""
    n_in = len(call.tensor_at)
    outputs = saved[n_in:]
    grads = cotangents(grads, outputs)
    plain = direct and not torch._C._are_functorch_transforms_active()  # (nothing is wrapped)
    if plain and leaves is None:  # the usual call: its tensors are its positional arguments, as they are
        args = saved[:n_in]
        return vjp_gradients(call.fun, args, call.kwargs, args, call.n_primal, call.out_spec, outputs, grads)

    def rule(tensors):
        full = _with_tensors(leaves, call.tensor_at, tensors[:n_in])
        args, kwargs = call.unflatten(full)
        n_out = (len(tensors) - n_in) // 2
        return vjp_gradients(call.fun, args, kwargs, full, call.n_primal, call.out_spec,
                             tensors[n_in:n_in + n_out], tensors[n_in + n_out:])

    return rule([*saved, *grads]) if plain else _below_functorch(call.fun, "vjp", rule, [*saved, *grads])


def vjp_gradients(fun, args, kwargs, leaves, n_primal, out_spec, outputs, grads) -> list:
    """The vjp rule's gradient for each tensor leaf of a call (torch_ops' autograd formula), from
    the call's arguments and their leaves."""
    if fun._vjp is None:
        return _traced_vjp(fun, args, kwargs, leaves, n_primal, outputs, grads)
    primals = args[0] if len(args) == 1 else args
    result = fun._vjp(primals, _unflatten(out_spec, grads), _unflatten(out_spec, outputs), **kwargs)
    return _gradients(fun, n_primal, leaves, result)


def _traced_vjp(fun, args, kwargs, leaves, n_primal, outputs, grads) -> list:
    """MLX's vjp of a function without a vjp rule: torch.func.vjp through f, run again on the
    primals (the forward kept no graph: it ran below autograd). One gradient (or None) per tensor
    leaf, as vjp_gradients."""
    at = [i for i, x in enumerate(leaves[:n_primal])
          if isinstance(x, torch.Tensor) and _differentiable(x)]
    keep = [i for i, o in enumerate(outputs) if _differentiable(o)]  # integer outputs: no cotangent
    by_leaf = {}
    if at and keep:
        def transform():
            _, pull = torch.func.vjp(_function_of(fun, args, kwargs, at, keep),
                                     *[leaves[i] for i in at])
            return pull(tuple(grads[i] for i in keep))

        by_leaf = dict(zip(at, _through(fun, "vjp", "differentiate it", transform)))
    return [by_leaf.get(i) for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]


def _traced_jvp(call, leaves, tangents, out_diff) -> list:
    """MLX's jvp of a function without a jvp rule, through f: the vjp of f's vjp (linear in the
    cotangents, so its own vjp is the jvp), as torch.func.jvp would nest a forward-AD level that
    plain forward AD (already in one here) refuses. `tangents` are those of the call's tensors
    (call.tensor_at); keyword arguments are constants. One tangent per output, None for those
    out_diff marks non-differentiable."""
    fun = call.fun
    tangent_of = dict(zip(call.tensor_at, tangents))
    at = [i for i in call.tensor_at if i < call.n_primal and _differentiable(leaves[i])]
    keep = [i for i, d in enumerate(out_diff) if d]
    by_output = {}
    if at and keep:
        def transform():
            args, kwargs = call.unflatten(leaves)
            outs, pull = torch.func.vjp(_function_of(fun, args, kwargs, at, keep),
                                        *[leaves[i] for i in at])
            _, push = torch.func.vjp(pull, tuple(torch.zeros_like(o) for o in outs))
            return push(tuple(tangent_of[i] for i in at))[0]

        by_output = dict(zip(keep, _through(fun, "jvp", "use forward-mode AD (torch.func.jvp, "
                                                        "jacfwd...)", transform)))
    return [by_output.get(i) for i in range(len(out_diff))]


def _function_of(fun, args, kwargs, at, keep):
    """f as a function of the tensors at `at` among its positional leaves (the other leaves and
    the kwargs held as they are), returning its flat outputs at `keep`."""
    primal = []
    spec = _flatten(args, primal)

    def traced(*tensors):
        new = list(primal)
        for i, t in zip(at, tensors):
            new[i] = t
        out = _leaves(fun._fun(*_unflatten(spec, new), **kwargs))
        return tuple(out[i] for i in keep)
    return traced


def _leaves(tree) -> list:
    flat = []
    _flatten(tree, flat)
    return flat


def _with_tensors(held, tensor_at, tensors) -> list:
    """A call's leaves: those `held` (None at its tensors; None: all are tensors), with `tensors`
    (saved or unwrapped) at the tensor positions `tensor_at`."""
    if held is None:  # all tensors
        return list(tensors)
    leaves = list(held)
    for i, t in zip(tensor_at, tensors):
        leaves[i] = t
    return leaves


def _held_leaves(leaves, tensor_at):
    """A call's leaves to keep for its backward: None where all are tensors, else the list with
    None at its tensors (saved apart, with their version checks)."""
    if len(tensor_at) == len(leaves):
        return None
    held = list(leaves)
    for i in tensor_at:
        held[i] = None
    return held


def _gradients(fun: "custom_function", n_primal: int, leaves: list, result) -> list:
    """The vjp's result as one gradient (or None) per tensor leaf of the call.

    The result mirrors the primals (MLX): one entry per primal leaf, or per primal *tensor*
    (non-tensor arguments left out, as MLX's flattening of arrays does). Keyword arguments
    are constants: None.
    """
    if type(result) is torch.Tensor and len(leaves) == 1 and type(leaves[0]) is torch.Tensor \
            and result.shape == leaves[0].shape:
        return [result]  # one tensor argument, one gradient: the usual case
    if type(result) in (tuple, list) and len(result) == n_primal:
        for x, g in zip(leaves, result):  # (a loop: all() over a generator costs more on every call)
            if type(x) is not torch.Tensor or not (g is None or type(g) is torch.Tensor and g.shape == x.shape):
                break
        else:  # tensor arguments only, a gradient or None for each: the other usual case
            return [*result, *(None for x in leaves[n_primal:] if isinstance(x, torch.Tensor))]
    name = fun.__name__
    flat = _leaves(result)
    primal = leaves[:n_primal]
    tensor_idx = [i for i, x in enumerate(primal) if isinstance(x, torch.Tensor)]
    if len(flat) == len(primal):
        by_leaf = dict(enumerate(flat))
    elif len(flat) == len(tensor_idx):
        by_leaf = dict(zip(tensor_idx, flat))
    else:
        raise ValueError(f"[custom_function] {name}'s vjp returned {len(flat)} gradients for "
                         f"{len(primal)} primals ({len(tensor_idx)} of them tensors).")
    grads = []
    for i, x in enumerate(leaves):
        if not isinstance(x, torch.Tensor):
            continue
        g = by_leaf.get(i)
        if g is not None:
            if not isinstance(g, torch.Tensor):
                raise TypeError(f"[custom_function] {name}'s vjp returned a {type(g).__name__} "
                                f"for primal leaf {i}; expected a tensor or None.")
            if g.shape != x.shape:
                raise ValueError(f"[custom_function] {name}'s vjp returned a gradient of shape "
                                 f"{tuple(g.shape)} for primal leaf {i} of shape {tuple(x.shape)}.")
        grads.append(g)
    return grads


class custom_function:
    """Set up a function for custom vjp, jvp and vmap rules, as MLX's `mx.custom_function`.

    `f(*args, **kwargs)` returns what the wrapped function returns; torch.autograd and
    torch.func transforms of it use the rules given with `@f.vjp`, `@f.jvp`, `@f.vmap`
    (see the module docstring for their arguments), and go through f itself for a rule not
    given, as MLX's do (which a kernel in f does not allow: define its rules).
    """

    def __init__(self, fun):
        if not callable(fun):
            raise TypeError(f"[custom_function] expected a function, got {type(fun).__name__}.")
        functools.update_wrapper(self, fun)  # __name__, __doc__, __wrapped__...
        self._fun = fun
        self._vjp = self._jvp = self._vmap = None
        name = getattr(fun, "__name__", "custom_function")
        self._function = type(name, (_Function,), {"__module__": _Function.__module__})
        self._apply = super(torch.autograd.Function, self._function).apply  # the C apply
        direct = type(name, (_Direct,), {"__module__": _Function.__module__})
        self._direct = super(torch.autograd.Function, direct).apply
        self._node_name = f"{name}Backward"  # (the C++ node's, as torch names a Function's)
        self._op_key = _torch_ops.function_key(self)  # its name in torch.compile's op specs

    # As MLX, each setter returns the custom_function itself.
    def vjp(self, rule):
        """Define the vjp: rule(primals, cotangents, outputs) -> gradients of the primals."""
        self._vjp = rule
        return self

    def jvp(self, rule):
        """Define the jvp: rule(primals, tangents) -> tangents of the outputs."""
        self._jvp = rule
        return self

    def vmap(self, rule):
        """Define the vmap rule: rule(inputs, axes) -> (outputs, out_axes)."""
        self._vmap = rule
        return self

    def __call__(self, *args, **kwargs):
        leaves = []
        args_spec = _flatten(args, leaves)
        n_primal = len(leaves)
        tracing = _torch_ops.tracing()
        # Keyword arguments are constants: autograd sees them (as leaves) only where they hold a
        # tensor, which torch.func must then unwrap, or where the ops carry them (tracing).
        kwargs_spec, held = None, kwargs
        if kwargs:
            for x in kwargs.values():  # (a loop: any() over a generator costs more, on every call)
                if tracing or isinstance(x, _HELD):
                    kwargs_spec, held = _flatten(kwargs, leaves), {}
                    break
        tensor_at, recorded = [], False  # recorded: a tensor that autograd would record
        for i, x in enumerate(leaves):
            if isinstance(x, torch.Tensor):
                tensor_at.append(i)
                recorded = recorded or x.requires_grad
        if tracing:
            # torch.compile, or fake tensors: the op, with the vjp as formula, grad or no grad (its
            # Python then runs at run time, on real tensors: ops that look at their data, as
            # grid_sample's alignment check, never see a fake one)
            flat, spec = _torch_ops.custom_function_call(self, leaves, args_spec, kwargs_spec,
                                                         n_primal)
            return _torch_ops.unflatten(_torch_ops.out_spec(spec), flat)
        transformed = torch._C._are_functorch_transforms_active()
        if not transformed and _forward_ad._current_level < 0 and not (recorded and torch.is_grad_enabled()):
            return self._fun(*args, **kwargs)  # nothing records it: no autograd.Function (~25 us)
        call = _Call(self, args_spec, kwargs_spec, held, n_primal, tensor_at)
        if transformed:
            flat = self._function.apply(call, *leaves)  # sets call.out_spec
        else:
            # What Function.apply does outside torch.func, without binding the arguments to
            # forward's signature (inspect.signature: ~35% of a small call's host time; forward
            # takes *leaves, so the binding changes nothing).
            for i in tensor_at:
                leaves[i] = _unwrap_if_dead(leaves[i])
            direct = _forward_ad._current_level < 0 and kwargs_spec is None and args_spec == (tuple, n_primal)
            flat = self._record(call, leaves) if direct else self._apply(call, *leaves)
        return _unflatten(call.out_spec, flat)

    def _record(self, call, leaves):
        """The usual call, recorded for plain autograd: the forward below autograd, then the C++
        node over it (autograd_node.cpp: torch.autograd.Function's work less its Python; on the
        H200's host a one-kernel function's forward + backward went from 1.34x a hand-written
        autograd.Function to ~1.13x); torch.autograd.Function (_Direct) where that node is not
        built yet (or cannot be here), compiled autograd is on, or the node cannot own the
        outputs (an input or a view returned, which torch gives a view of its own)."""
        outs = call.outputs(_without_grad(self._fun, *leaves, **call.kwargs), "forward")
        attach = _fastcall.node_attach
        if attach is None:
            _fastcall.module(block=False)  # (the node's library: built in the background, once)
        elif _compiled_autograd_on():
            attach = None
        call.leaves = _held_leaves(leaves, call.tensor_at)
        if attach is not None and attach(_node_backward, call, [leaves[i] for i in call.tensor_at], outs,
                                         self._node_name):
            return outs
        call.leaves, call.outs = None, outs
        return self._direct(call, *leaves)

    def __repr__(self) -> str:
        rules = [r for r in ("vjp", "jvp", "vmap") if getattr(self, f"_{r}") is not None]
        return f"<kernelkit.custom_function {self.__name__} (rules: {', '.join(rules) or 'none'})>"

"""The kernel object: argument checks, the compiled variant for the call, the launch.

`metal_kernel` and `cuda_kernel` build the same `Kernel`; only the dialect
front end differs. A call turns its arrays into a variant key (dtypes, which
inputs are scalars, template values: never shapes), finds or builds the
variant (signature -> source -> compile cache -> loaded binary), allocates the
outputs, packs the argument block and launches on the arrays' device.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import struct
import warnings
from collections import OrderedDict
from functools import partial
from dataclasses import dataclass

import torch

from . import arrays, codegen, cross, debugging, fastcall, torch_ops
from .arrays import DType, dtype_of
from .backends import Fill, get_backend
from .dialects import identifiers
from .errors import CompileError
from .signature import ATTRIBUTES, NDIM_CAPACITY, InputSpec, Signature, check_identifier, template_args

_POISON = os.environ.get("KERNELKIT_POISON_OUTPUTS", "") not in ("", "0")
_is_compiling = torch.compiler.is_compiling  # (Dynamo folds it to True while it traces)
_transform_level = torch._C._functorch.maybe_get_level  # >= 0: a tensor of a live torch.func transform


@dataclass
class Variant:
    """One compiled specialisation of a kernel on one device."""

    signature: Signature
    source: str
    program: object  # the backend's loaded binary
    pack: object  # pack(inputs, outputs, tail) -> argument block: Signature.packer()
    debug: object = None  # a checked variant's debugging.Plan (check_bounds / timeout)


_PREPARED: OrderedDict[tuple, "Kernel"] = OrderedDict()  # kernels by their constructor arguments
_PREPARED_MAX = 1024  # least recently built ones dropped past this


def prepared(dialect, name, input_names, output_names, source, header, ensure_row_contiguous,
             atomic_outputs, compile_options, shared_memory=0) -> "Kernel":
    """The kernel of these constructor arguments, prepared once per process: MLX code builds its
    kernel inside the function it calls on every step, and that must cost next to nothing. Every
    argument is in the key (scalars with their types, so 1024 and 1024.0 stay apart); arguments
    that give no key (unhashable, unsortable options) build a kernel each time, which raises."""
    try:
        key = (dialect.NAME, name, _names_key(input_names), _names_key(output_names), source, header,
               *_typed((ensure_row_contiguous, atomic_outputs, shared_memory)),
               _options_key(compile_options))
        kernel = _PREPARED.get(key)
    except TypeError:
        key = kernel = None
    if kernel is not None:
        _PREPARED.move_to_end(key)
        return kernel
    kernel = Kernel(dialect, name, input_names, output_names, source, header, ensure_row_contiguous,
                    atomic_outputs, compile_options, shared_memory)
    if key is not None:
        _PREPARED[key] = kernel
        if len(_PREPARED) > _PREPARED_MAX:
            _PREPARED.popitem(last=False)
    return kernel


def _names_key(names):
    return tuple(names) if type(names) in (list, tuple) else names


def _options_key(options):
    if type(options) is not dict:
        return options
    return tuple(sorted((k, v, type(v)) for k, v in options.items()))


class Kernel:
    def __init__(self, dialect, name: str, input_names, output_names, source: str, header: str = "",
                 ensure_row_contiguous: bool = True, atomic_outputs: bool = False,
                 compile_options=None, shared_memory: int = 0):
        self.caller = dialect.NAME
        self.dialect = dialect
        self.name = check_identifier(name, "kernel name", self.caller, prefixed=True)
        self.input_names = self._names(input_names, "input_names")
        self.output_names = self._names(output_names, "output_names")
        clash = set(self.input_names) & set(self.output_names)
        if clash:
            raise ValueError(f"[{self.caller}] {sorted(clash)} named both as input and output.")
        if not isinstance(source, str) or not isinstance(header, str):
            raise TypeError(f"[{self.caller}] source and header must be strings.")
        self.source, self.header = source, header
        _check_source(dialect, source, header, shared_memory, self.caller)
        self.ensure_row_contiguous = bool(ensure_row_contiguous)
        self.atomic_outputs = bool(atomic_outputs)
        self.math_mode = self._math_mode(compile_options)
        pragma_mode, self.fp_contract = dialect.fp_pragmas(header, source)  # MSL's `#pragma METAL fp`
        self.math_mode = pragma_mode or self.math_mode
        if not isinstance(shared_memory, int) or shared_memory < 0:
            raise ValueError(f"[{self.caller}] shared_memory must be a non-negative int (bytes), "
                             f"got {shared_memory!r}.")
        self.shared_memory = shared_memory
        self._lowered_header, self._lowered_body = dialect.front_end(header, source)
        self._uses = dialect.mentions(source)
        self._simdgroup_matrix = dialect.uses_simdgroup_matrix(self._lowered_header, self._lowered_body)
        self.uses_sync = dialect.uses_sync(identifiers(source) | identifiers(header))
        self._variants: dict[tuple, Variant] = {}
        self._checked: dict[tuple, object] = {}  # call arguments already validated
        self._plans: dict[tuple, object] = {}  # plain calls already made: run(inputs, shapes)
        self._last_plan = None  # the plan fastcall's tp_call ran last (it compares the next call's key)
        self._filled_plans: dict[tuple, dict] = {}  # the same for calls with an init_value, by value
        self._seen: set[tuple] = set()  # keys of plain calls made once
        self._grad_warned = False  # warned once that it is not differentiable
        self._op_key = torch_ops.kernel_key(self)  # its name in torch.compile's op specs

    # --- construction checks ----------------------------------------------------------------

    def _names(self, names, what: str) -> tuple[str, ...]:
        if isinstance(names, str) or not isinstance(names, (list, tuple)):
            raise TypeError(f"[{self.caller}] {what} must be a list of strings, got {names!r}.")
        for n in names:
            check_identifier(n, what[:-1].replace("_", " "), self.caller)
            if n in ATTRIBUTES:
                raise ValueError(f"[{self.caller}] {n!r} is a Metal attribute name; "
                                 "choose another name.")
            for suffix in ("_shape", "_strides", "_ndim"):
                if n.endswith(suffix):
                    raise ValueError(f"[{self.caller}] {n!r} ends in {suffix}, which names "
                                     "generated helpers; choose another name.")
        if len(set(names)) != len(names):
            raise ValueError(f"[{self.caller}] {what} has duplicates: {list(names)}.")
        return tuple(names)

    def _math_mode(self, options) -> str:
        options = {} if options is None else options
        if not isinstance(options, dict):
            raise TypeError(f"[{self.caller}] compile_options must be a dict, got {options!r}.")
        unknown = set(options) - {"math_mode"}
        if unknown:
            raise ValueError(f"[{self.caller}] unknown compile_options {sorted(unknown)}; "
                             "expected only 'math_mode'.")
        mode = options.get("math_mode", self.dialect.DEFAULT_MATH_MODE)
        if mode not in codegen.MATH_MODES:
            raise ValueError(f"[{self.caller}] math_mode {mode!r} is not one of {codegen.MATH_MODES}.")
        return mode

    # --- the call ---------------------------------------------------------------------------

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
                 init_value=None, verbose: bool = False, stream=None, ensure_row_contiguous=None,
                 check_bounds=None, timeout=None):
        if _is_compiling():  # Dynamo traces: the opaque op (fake tensors alone: see _call)
            return self._op_call(inputs, output_shapes, output_dtypes, grid, threadgroup, template,
                                 init_value, verbose, stream, ensure_row_contiguous, check_bounds,
                                 timeout)
        key = plans = None
        if stream is None and ensure_row_contiguous is None and not verbose and check_bounds is None \
                and timeout is None:
            # The fast path: a plain call like an earlier one (init_value included) runs that
            # call's plan.
            plans = self._plans if init_value is None else self._plans_filled(init_value)
            if plans is not None:
                key = _fast_call(plans, inputs, output_shapes, output_dtypes, grid, threadgroup, template)
                if type(key) is list:  # the outputs
                    return key
        return self._call(inputs, output_shapes, output_dtypes, grid, threadgroup, template,
                          init_value, verbose, stream, ensure_row_contiguous, key, plans,
                          check_bounds, timeout)

    def _op_call(self, inputs, output_shapes, output_dtypes, grid, threadgroup, template,
                 init_value, verbose, stream, ensure_row_contiguous, check_bounds, timeout):
        """The call as torch_ops' kernelkit::launch, for torch.compile and fake tensors."""
        if stream is not None or verbose or check_bounds or timeout is not None:
            raise ValueError(f"[{self.caller}] stream, verbose, check_bounds and timeout are not "
                             "supported under torch.compile; call the kernel eagerly.")
        return torch_ops.launch(self, inputs, output_shapes, output_dtypes, grid, threadgroup,
                                template, init_value, ensure_row_contiguous)

    def _plans_filled(self, init_value) -> dict | None:
        """The plans of calls with this init_value; None for one that is no key (a tensor)."""
        values = tuple(init_value) if isinstance(init_value, (list, tuple)) else (init_value,)
        if any(isinstance(v, torch.Tensor) for v in values):
            return None
        key = (type(init_value), *((type(v), v) for v in values))  # 1, 1.0 and True apart
        try:
            return self._filled_plans.setdefault(key, {})
        except TypeError:  # unhashable: the general path says what is wrong
            return None

    def _call(self, inputs, output_shapes, output_dtypes, grid, threadgroup, template, init_value,
              verbose, stream, ensure_row_contiguous, plan_key, plans=None, check_bounds=None,
              timeout=None):
        """The general path: every argument checked and converted, the variant found or built."""
        if torch_ops.tracing():  # fake tensors (AOTAutograd, opcheck): never on the fast path
            return self._op_call(inputs, output_shapes, output_dtypes, grid, threadgroup, template,
                                 init_value, verbose, stream, ensure_row_contiguous, check_bounds,
                                 timeout)
        c = self.caller
        inputs = self._sequence(inputs, "inputs", len(self.input_names))
        output_shapes = self._sequence(output_shapes, "output_shapes", len(self.output_names))
        output_dtypes = self._sequence(output_dtypes, "output_dtypes", len(self.output_names))
        contiguous = self.ensure_row_contiguous if ensure_row_contiguous is None else ensure_row_contiguous

        tensors, specs, device, numpy_in = self._inputs(inputs, contiguous)
        if not self._grad_warned and torch.is_grad_enabled() and any(
                isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
            self._grad_warned = True
            warnings.warn(f"[{c}] kernel {self.name!r} is not differentiable: its outputs do not "
                          "require grad, so no gradient flows back to its inputs. Wrap the call in "
                          "a kk.custom_function with a vjp rule to differentiate it.", stacklevel=3)
        device = arrays.resolve_stream(stream, device)
        backend = get_backend(device)
        out_dtypes = _memo(self._checked, ("dtypes", *output_dtypes), lambda: tuple(
            self._dtype(d, i) for i, d in enumerate(output_dtypes)))
        shapes = [self._shape(s, i) for i, s in enumerate(output_shapes)]
        grid, group = _memo(self._checked, ("dispatch", device, *_typed(grid), *_typed(threadgroup)),
                            lambda: self._dispatch(backend, device, grid, threadgroup))
        targs = self._template(template)
        fills = self._initial_values(init_value)
        if numpy_in and any(d.name == "bfloat16" for d in out_dtypes):
            raise TypeError(f"[{c}] NumPy has no bfloat16: pass torch tensors for bfloat16 outputs.")
        if group is None or (shapes and all(0 in s for s in shapes)):
            # Nothing to run (an empty grid, or every output empty): outputs made, no kernel.
            outputs = [new_output(s, d, device, f) for s, d, f in zip(shapes, out_dtypes, fills)]
            return [arrays.to_numpy(o) for o in outputs] if numpy_in else outputs

        key = (device, tuple(specs), out_dtypes, targs)
        checks = debugging.request(check_bounds, timeout, c)  # None: a plain call
        if checks is not None:
            key += (checks.mode,)
        # verbose on a tensor-op kernel: a variant whose matmul2d runs print the path each took
        report = bool(verbose) and self._tensor_ops()
        if report:
            key += ("report",)
        mma_lanes = self._mma_lanes(group)
        if mma_lanes:
            key += ("mma_lanes",)
        variant = self._variants.get(key)
        if variant is None:
            variant = self._build(key, backend, device, specs, out_dtypes, targs,
                                  None if checks is None else checks.mode, report, mma_lanes)
        if verbose:
            self._print(variant)

        outputs = [new_output(s, d, device, f) for s, d, f in zip(shapes, out_dtypes, fills)]
        launch = backend.launcher(variant.program, device, grid, group, self.shared_memory, stream,
                                  self.name)
        tail = (*grid, self.shared_memory)
        if checks is not None:  # checked: synchronous, raises IndexError / TimeoutError
            debugging.run(self, variant, checks, launch, tensors, outputs, tail, device, stream, group,
                          fills)
            plan_key = None
        else:
            launch(variant.pack(tensors, outputs, tail))
            if report and device.type == "cuda":
                torch.cuda.synchronize(device)  # the device's printf reaches stdout with this call
        # A call the fast path can repeat: arrays used as given, only torch tensors and scalars.
        # A plan is made when such a call comes again (a call made once costs nothing more), and
        # waits for fastcall's extension (built in the background on first use).
        if plan_key is not None and self._repeated((id(plans), plan_key)) and _fast_call_ready() \
                and all(t is x and (type(x) is torch.Tensor or arrays.is_scalar(x))
                        for t, x in zip(tensors, inputs)) and _key_fixes_device(tensors):
            # (empty: no memory, which a CUDA graph's pool would count as leaked by the graph)
            prototypes = tuple(torch.empty(0, dtype=d.torch, device=device) for d in out_dtypes)
            prepare = tuple(Fill(f) if f is not None else _poison if _POISON else None for f in fills)
            plans[plan_key] = backend.compiled_plan(
                variant.program, grid, group, self.shared_memory, self.name, variant.signature,
                prototypes, prepare) or _Plan(prototypes, prepare, variant.pack, tail, launch).run
        if numpy_in:
            return [arrays.to_numpy(o) for o in outputs]
        return outputs

    def _repeated(self, plan_key) -> bool:
        """Whether a plain call with this key (and plans) came before."""
        if plan_key in self._seen:
            return True
        self._seen.add(plan_key)
        return False

    def _template(self, template) -> tuple:
        def check():
            return tuple(template_args(template, self._param_names(), self.caller))
        if template is None:
            return ()
        if isinstance(template, (list, tuple)):  # remembered by its pairs and their types
            try:
                key = ("template", *(_typed(p) for p in template))
            except TypeError:  # not pairs: check() says so
                return check()
            return _memo(self._checked, key, check)
        return check()

    def _dispatch(self, backend, device, grid, threadgroup):
        """(grid, group) of the launch; group None for an empty grid (no launch)."""
        grid = dims(grid, "grid", 0, self.caller)
        group = dims(threadgroup, "threadgroup", 1, self.caller)
        if 0 in grid:
            return grid, None
        # Groups are clamped to the grid (Metal's rule; a group never holds more threads than the
        # grid). Metal's edge groups are then partial; CUDA's dialect runs whole groups instead.
        group = tuple(min(t, g) for t, g in zip(group, grid))
        if self.dialect.WHOLE_GROUPS:
            grid = dims(tuple(-(-n // g) * g for n, g in zip(grid, group)), "grid", 1, self.caller)
        backend.check_dispatch(device, grid, group, self.shared_memory, self.caller)
        return grid, group

    def _sequence(self, value, what: str, expected: int):
        listed(value, what, self.caller)
        if len(value) != expected:
            raise ValueError(f"[{self.caller}] Expected `{what}` to have size {expected} "
                             f"but got size {len(value)}.")
        return value

    def _initial_values(self, init_value) -> tuple:
        """init_value per output: one number for every output (MLX's), or a sequence with a number
        or None (left as allocated) for each."""
        def number(v):
            return isinstance(v, numbers.Real) or (isinstance(v, torch.Tensor) and v.numel() == 1)
        if init_value is None or number(init_value):
            return (init_value,) * len(self.output_names)
        if isinstance(init_value, (list, tuple)) and len(init_value) == len(self.output_names) and all(
                v is None or number(v) for v in init_value):
            return tuple(init_value)
        raise TypeError(f"[{self.caller}] init_value must be a number, or a list of a number or None "
                        f"for each of the {len(self.output_names)} outputs {list(self.output_names)}; "
                        f"got {init_value!r}.")

    def _inputs(self, inputs, contiguous: bool):
        tensors, specs, device, numpy_in = [], [], None, False
        for i, (name, x) in enumerate(zip(self.input_names, inputs)):
            if arrays.is_scalar(x):
                if type(x) is int and not -2**31 <= x < 2**31:
                    raise OverflowError(f"[{self.caller}] input {name!r} = {x} does not fit int32, the "
                                        "type of Python ints (as in MLX); pass a tensor instead.")
                tensors.append(x)
                specs.append(InputSpec(arrays.SCALAR_DTYPES[type(x)], True, True, 0))
                continue
            t, from_numpy = array_input(x, f"input {name!r}", self.caller)
            if _transform_level(t) >= 0:
                # Said before any output is made (filling one would fail first, and obscurely);
                # worded as torch's own data_ptr error, which the fast path raises.
                raise RuntimeError(
                    f"[{self.caller}] kernel {self.name!r}: input {name!r} is a tensor of a "
                    "torch.func transform (grad, jvp, vmap...), which doesn't have storage for a "
                    "kernel to read. Call the kernel from a kk.custom_function with a rule for "
                    "that transform (vjp, jvp or vmap).")
            numpy_in |= from_numpy
            if device is None:
                device = t.device
            elif t.device != device:
                raise ValueError(f"[{self.caller}] inputs are on different devices: "
                                 f"{self.input_names[0]!r}... on {device}, {name!r} on {t.device}.")
            dt = arrays.DTYPE_OF_TORCH.get(t.dtype) or self._dtype(t.dtype, i, what="input")
            if contiguous and not t.is_contiguous():
                t = t.contiguous()
            ndim = t.dim()
            cap = NDIM_CAPACITY if ndim <= NDIM_CAPACITY else -(-ndim // 8) * 8
            tensors.append(t)
            specs.append(InputSpec(dt, ndim == 0, False, cap, ndim if f"{name}_tensor" in self._uses else 0))
        return tensors, specs, device, numpy_in

    def _dtype(self, spec, i: int, what: str = "output") -> DType:
        try:
            return dtype_of(spec)
        except TypeError as e:
            names = self.output_names if what == "output" else self.input_names
            raise TypeError(f"[{self.caller}] {what} {names[i]!r}: {e}") from None

    def _shape(self, shape, i: int) -> tuple[int, ...]:
        if type(shape) in (tuple, torch.Size) and all(type(s) is int and s >= 0 for s in shape):
            return shape
        return output_shape(shape, f"output_shapes[{i}] for {self.output_names[i]!r}", self.caller)

    def _param_names(self) -> set[str]:
        names = set(self.input_names) | set(self.output_names)
        for n in self.input_names:
            names |= {f"{n}_shape", f"{n}_strides", f"{n}_ndim"}
        return names

    # --- variants ---------------------------------------------------------------------------

    def _build(self, key, backend, device, specs, out_dtypes, targs, debug=None, report=False,
               mma_lanes=False) -> Variant:
        plan = None if debug is None else debugging.plan(self, specs, debug)
        sig = Signature(list(zip(self.input_names, specs)), list(zip(self.output_names, out_dtypes)),
                        self.atomic_outputs, targs, self._uses, plan, report, mma_lanes)
        source = self._generate(backend.target, sig)
        context = f"[{self.caller}] kernel {self.name!r}"
        if plan is not None:  # the rewritten source: say so, should it not compile
            context += f" (its checked variant: {debugging.describe(plan.mode)})"
        try:
            flags = self.dialect.compile_flags(backend.target, self.math_mode, self.fp_contract)
            program = backend.build(source, device, self.math_mode, tuple(flags),
                                    self.uses_sync, context, self.source, self.header,
                                    sig.block.size, codegen.entry_name(self.name))
        except CompileError as e:
            hints = self._hints(specs)
            if hints:
                e.args = (e.args[0] + "".join(f"\nhint: {h}" for h in hints), *e.args[1:])
            raise
        if plan is not None:
            debugging.prepare(program)
        for arch in cross.check_archs():  # KERNELKIT_CHECK_ARCH / kernelkit check: every arch too
            cross.build_for(self, sig, arch)
        variant = Variant(sig, source, program, sig.packer(), plan)
        self._variants[key] = variant
        return variant

    def _hints(self, specs) -> list[str]:
        """What a failed compile may come from, in the user's terms: habits from other tools."""
        hints = []
        for name, spec in zip(self.input_names, specs):  # (CUDA's read every input as name[i])
            if self.dialect.NAME == "metal_kernel" and spec.scalar and \
                    re.search(rf"\b{name}\s*\[", self.source):
                hints.append(f"input {name!r} is a 0-d array or a Python number: it is passed as a "
                             f"value (`const constant T& {name}`), not a pointer; write `{name}`, "
                             "not an index into it, or pass a 1-element array.")
        if self.atomic_outputs:
            written = [n for n in self.output_names
                       if re.search(rf"\b{n}\s*\[[^\]]*\]\s*[-+*/%&|^]?=(?!=)", self.source)]
            if written:
                hints.append(f"with atomic_outputs=True every output is `device atomic<T>*`: "
                             f"{written} cannot be assigned; write with atomic_store_explicit("
                             f"&{written[0]}[i], v, memory_order_relaxed) or atomic_fetch_add_explicit.")
        return hints

    def _mma_lanes(self, group) -> bool:
        """Whether a launch in threadgroups of `group` (None: not known, whole warps assumed) numbers
        its lanes as mma.sync's fragments (codegen.MMA_LANES)."""
        return self._simdgroup_matrix and (group is None or math.prod(group) % 32 == 0)

    def _tensor_ops(self) -> bool:
        """Whether the body uses tensor ops (matmul2d...; not counting name_tensor views alone)."""
        return codegen.TENSOR_OPS in self.dialect.defines(self._lowered_header, self._lowered_body)

    def _generate(self, target: str, sig: Signature) -> str:
        """The generated unit for `target`; a checked variant's (sig.debug) rewrites the source."""
        header, body = self._lowered_header, self._lowered_body
        if sig.debug is not None:
            header, body = debugging.rewrite(header, body, sig.debug)
        return codegen.generate(self.dialect, target, self.name, sig, header, body, self.math_mode,
                                self.uses_sync, sig.debug)

    def _print(self, variant: Variant) -> None:
        print(f"// kernelkit {self.caller} {self.name!r}: the kernel in its own dialect")
        print(self.dialect.source_view(self.name, variant.signature, self.header, self.source))
        print("// the C++ that is compiled")
        print(variant.source)


def _plan_key(inputs, output_dtypes, grid, threadgroup, template) -> tuple | None:
    """What decides a plain call's variant and dispatch, read cheaply off its arguments; None
    where they give no key (the general path checks them). fastcall.cpp's plan_key is the same
    in C (tests/test_fast_path.py holds them equal)."""
    if type(inputs) not in (list, tuple) or type(output_dtypes) not in (list, tuple):
        return None
    if template is not None:
        if type(template) not in (list, tuple):
            return None
        try:  # 1 and True stay distinct
            template = tuple((*p, *map(type, p)) for p in template)
        except TypeError:
            return None
    key = (_dims_key(grid), _dims_key(threadgroup), template, len(inputs), *(
        (x.dtype, x.device, x.dim(), x.is_contiguous(), x.requires_grad) if type(x) is torch.Tensor
        else type(x)
        for x in inputs), *output_dtypes)
    try:
        hash(key)
    except TypeError:  # a list grid, say
        return None
    return key


def _key_fixes_device(tensors) -> bool:
    """Whether a plan key holds the call's device: an array input's device is in it; a call with
    none runs on the current GPU, which the key does not hold, so with several GPUs it gets no
    plan (one made under cuda:0 would launch there under torch.cuda.device(1))."""
    return any(type(t) is torch.Tensor for t in tensors) or torch.cuda.device_count() < 2


def _dims_key(dims):
    """grid / threadgroup in a plan key: as given when it holds exact ints, else with the types of
    its items, so (8.0, 1, 1) never finds the plan of (8, 1, 1) (they compare equal)."""
    if type(dims) is not tuple:
        return (dims,)
    if all(type(v) is int for v in dims):
        return dims
    return (dims, *map(type, dims))


def _python_call(plans, inputs, output_shapes, output_dtypes, grid, threadgroup, template):
    """fastcall.cpp's `call` in Python: the outputs of the call's plan, else its key (or None)."""
    key = _plan_key(inputs, output_dtypes, grid, threadgroup, template)
    plan = plans.get(key) if key is not None else None
    if plan is not None:
        # (a C plan, a capsule, where another thread loaded the extension after this call began)
        run = plan if callable(plan) else partial(fastcall.peek().run, plan)
        outputs = run(inputs, output_shapes)
        if outputs is not None:
            return outputs
    return key


_fast_call = _python_call  # fastcall.cpp's call once the extension is loaded


def _fast_call_ready() -> bool:
    """Whether fastcall's extension is settled (loaded, or known to be unavailable). Once loaded,
    Kernel's plain calls with a plan run in it without __call__'s Python layer (its set_call)."""
    global _fast_call
    module = fastcall.module(block=False)
    if module is None:
        return False
    if not isinstance(module, str):
        _fast_call = module.call
        module.set_call(Kernel, Kernel.__call__, torch.compiler)
    return True


class _Plan:
    """Everything of a plain call but its arrays, kept after a first call made the general way:
    `run` allocates the outputs, packs and launches. (Both backends have the same in C,
    fastcall.cpp's plans; this one runs where that extension is absent.)"""

    __slots__ = ("prototypes", "prepare", "pack", "tail", "launch")

    def __init__(self, prototypes, prepare, pack, tail, launch):
        # new_empty on an empty tensor of the output's dtype and device: quicker than torch.empty;
        # prepare: per output, None or what fills a new one (init_value, or the tests' poison)
        self.prototypes, self.prepare, self.pack, self.tail, self.launch = (
            prototypes, prepare, pack, tail, launch)

    def run(self, inputs, output_shapes):
        """The outputs, or None when the shapes need the general path's checks, or when every
        output is empty (the general path makes them and runs no kernel)."""
        if len(output_shapes) != len(self.prototypes):
            return None
        outputs, empty = [], True
        for proto, shape in zip(self.prototypes, output_shapes):
            if type(shape) is not tuple and type(shape) is not torch.Size:
                return None
            empty = empty and 0 in shape
            try:
                outputs.append(proto.new_empty(shape))
            except (TypeError, RuntimeError):  # negative or non-int sizes: reported by _shape
                return None
        if outputs and empty:
            return None
        try:
            block = self.pack(inputs, outputs, self.tail)
        except struct.error:  # a Python int beyond int32: the general path says so
            return None
        for o, prepare in zip(outputs, self.prepare):  # after packing, as fastcall.cpp's run_plan
            if prepare is not None:
                prepare(o)
        self.launch(block)
        return outputs


def _memo(cache: dict, key, compute):
    """compute(), remembered under key; arguments that cannot be keys (lists) are checked every time."""
    try:
        return cache[key]
    except KeyError:
        value = cache[key] = compute()
        return value
    except TypeError:
        return compute()


# A whole kernel function where only its body belongs (CuPy's, load_inline's or Metal's habit).
_WHOLE_FUNCTION = re.compile(r'(?:extern\s+"C"\s+)?(?:__global__|\[\[\s*kernel\s*\]\]|\bkernel)\s+'
                             r'void\s+(\w+)\s*\(')
_EXTERN_SHARED = re.compile(r"\bextern\s+__shared__\b")


def _check_source(dialect, source: str, header: str, shared_memory: int, caller: str) -> None:
    """Errors a new user meets before any compiler would say them clearly."""
    m = _WHOLE_FUNCTION.search(source)
    if m:
        raise ValueError(
            f"[{caller}] `source` holds a whole kernel function ({m.group(0).strip()}...); pass only "
            "the statements inside its braces: kernelkit writes the signature from input_names and "
            "output_names (inputs `const T* name`, outputs `T* name`, plus the names the body uses).")
    if dialect.NAME == "cuda_kernel" and shared_memory == 0 and (
            _EXTERN_SHARED.search(source) or _EXTERN_SHARED.search(header)):
        raise ValueError(
            f"[{caller}] the kernel declares `extern __shared__` memory but shared_memory=0: pass "
            "shared_memory=<bytes> to cuda_kernel (the dynamic shared memory each block gets).")


def _typed(values) -> tuple:
    """values with their types, as a memo key: 8 and 8.0 (equal, same hash) stay apart."""
    values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
    return (*values, *map(type, values))


def listed(value, what: str, caller: str):
    """A call's list argument as given (a list or a tuple), else TypeError."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"[{caller}] Expected `{what}` to be a list, got {type(value).__name__}.")
    return value


def array_input(x, what: str, caller: str) -> tuple[torch.Tensor, bool]:
    """An array input as a torch tensor, and whether it came from NumPy (arrays.as_tensor);
    TypeError saying what `what` may be where it is no array, or DLPack refuses it."""
    try:
        t, from_numpy = arrays.as_tensor(x)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:  # DLPack refused it
        raise TypeError(f"[{caller}] {what}: its {type(x).__name__} could not be taken through "
                        f"DLPack: {e}") from None
    if t is None:
        raise TypeError(f"[{caller}] {what} must be a torch.Tensor, a NumPy array, an array with "
                        "__dlpack__ or __cuda_array_interface__ (CuPy, JAX...), or a Python "
                        f"bool/int/float; got {type(x).__name__}.")
    return t, from_numpy


def output_shape(shape, what: str, caller: str) -> tuple[int, ...]:
    """An output's shape: non-negative ints, anything integral (arrays.integral)."""
    try:
        shape = tuple(map(arrays.integral, shape))
    except TypeError:
        shape = (-1,)
    if any(s < 0 for s in shape):
        raise ValueError(f"[{caller}] {what} must be a sequence of non-negative ints.")
    return shape


def dims(value, what: str, lowest: int, caller: str) -> tuple[int, int, int]:
    """A grid or threadgroup: three ints in [lowest, 2**32), anything integral, no bools or floats."""
    try:
        got = tuple(map(arrays.integral, value)) if isinstance(value, (tuple, list)) else ()
    except TypeError:
        got = ()
    if len(got) != 3 or not all(lowest <= v < 2**32 for v in got):
        kind = "positive" if lowest else "non-negative"
        raise ValueError(f"[{caller}] `{what}` must be three {kind} ints (below 2**32), got {value!r}.")
    return got


def new_output(shape, dtype, device, fill) -> torch.Tensor:
    """A new output: filled with its init_value, else poisoned in the tests."""
    o = torch.empty(shape, dtype=dtype.torch, device=device)
    if fill is not None:
        o.fill_(fill)
    elif _POISON:
        _poison(o)
    return o


def _poison(t: torch.Tensor) -> None:
    """Fill an output with a value no kernel writes by accident, so unwritten elements show."""
    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).max)

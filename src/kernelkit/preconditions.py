"""Preconditions: check an op's arguments before dispatching a kernel.

A kernel trusts its arguments: a wrong dtype, layout or size reads the wrong memory, or fails
deep inside the launch with a message about the kernel rather than the call. An op therefore
checks its arguments first, and says what was wrong in its own terms: which op, which argument,
what it got and what it expected.

    from kernelkit.preconditions import FLOATS, Preconditions

    def grid_sample(x, grid, mode="bilinear"):
        pre = Preconditions("grid_sample")
        pre.tensor("x", x, dtype=FLOATS, shape=("B", "H", "W", "C"))
        pre.tensor("grid", grid, dtype="x", shape=("B", "gH", "gW", 2))
        pre.choice("mode", mode, ("bilinear", "nearest"))
        B, H, W, C = pre["B"], pre["H"], pre["W"], pre["C"]
        ...

    grid_sample(x, torch.rand(2, 5, 5, 3))
    ValueError: grid_sample: grid has shape (2, 5, 5, 3); expected (B=2, gH, gW, 2): dim 3 is 3,
    expected 2.

`shape` lists the expected dims: an int is that size, a string a symbol that every tensor of the
call must agree on (bound by the first tensor that has it; `pre["B"]` reads it), None any size,
and a leading `...` any number of leading dims (`shape=(..., "M", "K")`). Tensors of one
Preconditions must be on one device, unless `same_device=False`. Type errors (not a tensor, a
wrong dtype, a non-bool flag) raise TypeError; wrong values (shape, device, layout, choice)
ValueError. Every message starts with the op's name.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

__all__ = ["Preconditions", "FLOATS", "check_once", "dtype_names"]

# The floating-point dtypes kernelkit's ops compute in.
FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    """"float16, bfloat16, float32 or float64"."""
    names = [str(d).removeprefix("torch.") for d in dtypes]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


_CHECKED: set = set()  # the signatures check_once has seen pass (a bounded number)


def check_once(check, *args) -> None:
    """check(*args), once for each signature of the arguments: a tensor's type, shape, dtype and
    device, any other argument's type and value. For checks that read no more than that (an op's
    Preconditions), so that an op's repeated calls skip them: they cost a small call's host time
    several times over. Arguments that cannot be hashed (or symbolic shapes) are checked every
    call, and so is a call Dynamo traces (once a graph: a guard on what this has seen would make
    torch.compile compile the graph again after its first step, and check that guard every step)."""
    if torch.compiler.is_compiling():
        check(*args)
        return
    key = [check]
    for a in args:  # (a loop: a generator costs more, on every call)
        if isinstance(a, torch.Tensor):
            key += (type(a), a.shape, a.dtype, a.device)
        else:
            key += (type(a), a)
    try:
        key = tuple(key)
        if key in _CHECKED:
            return
    except TypeError:
        key = None
    check(*args)
    if key is not None:
        if len(_CHECKED) >= 1024:
            _CHECKED.clear()
        _CHECKED.add(key)


class Preconditions:
    """The checks of one call of op `op`: tensors (dtype, shape with symbolic dims, layout,
    device) and settings (choices, flags). Symbolic dims and the device bind across the call."""

    def __init__(self, op: str):
        self.op = op
        self.dims: dict[str, int] = {}      # symbol -> size
        self._bound_by: dict[str, str] = {}  # symbol -> the argument that bound it
        self._tensors: dict[str, torch.Tensor] = {}
        self.device: torch.device | None = None
        self._device_of: str | None = None   # the argument that set the device

    def __getitem__(self, symbol: str) -> int:
        return self.dims[symbol]

    # --- raising -----------------------------------------------------------------------------

    def fail(self, message: str, error: type[Exception] = ValueError):
        """Raise error("<op>: <message>") (for the checks only the op knows)."""
        raise error(f"{self.op}: {message}")

    # --- tensors -----------------------------------------------------------------------------

    def tensor(self, name: str, value: Any, *, dtype=None, ndim: int | None = None, shape=None,
               contiguous: bool = False, device=None, same_device: bool = True) -> torch.Tensor:
        """Check argument `name` and return it.

        dtype: a torch.dtype, a collection of them, or the name of an earlier tensor argument
        (same dtype as it). ndim: the number of dims. shape: the dims (see the module). contiguous:
        row-contiguous. device: a device or device type ("cuda"). same_device: on the device of
        the call's other tensors."""
        if not isinstance(value, torch.Tensor):
            self.fail(f"{name} must be a torch.Tensor, got {type(value).__name__}.", TypeError)
        self._check_dtype(name, value, dtype)
        if ndim is not None and value.ndim != ndim:
            self.fail(f"{name} has shape {tuple(value.shape)}; expected {ndim} dims.")
        if shape is not None:
            self._check_shape(name, value, tuple(shape))
        if contiguous and not value.is_contiguous():
            self.fail(f"{name} is not contiguous (shape {tuple(value.shape)}, strides {value.stride()}); "
                      "expected a contiguous tensor.")
        if device is not None:
            want = torch.device(device)
            if value.device.type != want.type or (want.index is not None and value.device != want):
                self.fail(f"{name} is on {value.device}; expected {want}.")
        if same_device:
            if self.device is None:
                self.device, self._device_of = value.device, name
            elif value.device != self.device:
                self.fail(f"{name} is on {value.device} but {self._device_of} is on {self.device}; "
                          "expected one device.")
        self._tensors[name] = value
        return value

    def _check_dtype(self, name: str, value: torch.Tensor, dtype) -> None:
        if dtype is None:
            return
        if isinstance(dtype, str):
            other = self._tensors.get(dtype)
            if other is None:
                raise KeyError(f"Preconditions: dtype={dtype!r} names no earlier tensor of {self.op}.")
            if value.dtype != other.dtype:
                self.fail(f"{name} has dtype {dtype_names([value.dtype])}; expected "
                          f"{dtype_names([other.dtype])} (the dtype of {dtype}).", TypeError)
            return
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if value.dtype not in allowed:
            self.fail(f"{name} has dtype {dtype_names([value.dtype])}; expected {dtype_names(allowed)}.",
                      TypeError)

    def _check_shape(self, name: str, value: torch.Tensor, spec: tuple) -> None:
        leading = len(spec) > 0 and spec[0] is Ellipsis
        dims = spec[1:] if leading else spec
        if any(d is Ellipsis for d in dims):
            raise ValueError("Preconditions: `...` may only lead a shape.")
        got = tuple(value.shape)
        if (len(got) < len(dims)) if leading else (len(got) != len(dims)):
            count = f"at least {len(dims)}" if leading else str(len(dims))
            self.fail(f"{name} has shape {got}; expected {count} dims {self._pattern(spec)}.")
        offset = len(got) - len(dims)
        before = dict(self.dims)  # a message shows the dims bound before this tensor
        for i, (want, size) in enumerate(zip(dims, got[offset:])):
            at = offset + i
            if want is None:
                continue
            if isinstance(want, str):
                bound = self.dims.get(want)
                if bound is None:
                    self.dims[want], self._bound_by[want] = size, name
                elif size != bound:
                    where = "" if self._bound_by[want] == name else f" (as in {self._bound_by[want]})"
                    self.fail(f"{name} has shape {got}; expected {self._pattern(spec, before)}: dim {at} "
                              f"is {size}, expected {want}={bound}{where}.")
            elif size != want:
                self.fail(f"{name} has shape {got}; expected {self._pattern(spec, before)}: dim {at} is "
                          f"{size}, expected {want}.")

    def _pattern(self, spec: tuple, dims: dict | None = None) -> str:
        dims = self.dims if dims is None else dims

        def one(d):
            if d is Ellipsis:
                return "..."
            if d is None:
                return "*"
            if isinstance(d, str):
                return f"{d}={dims[d]}" if d in dims else d
            return str(d)
        return "(" + ", ".join(one(d) for d in spec) + (",)" if len(spec) == 1 else ")")

    # --- settings ----------------------------------------------------------------------------

    def choice(self, name: str, value: Any, options: Iterable) -> Any:
        """value, one of options (compared with ==)."""
        options = tuple(options)
        if not any(type(value) is type(o) and value == o for o in options):
            self.fail(f"{name} must be one of {options}, got {value!r}.")
        return value

    def flag(self, name: str, value: Any) -> bool:
        """value, a bool."""
        if not isinstance(value, bool):
            self.fail(f"{name} must be a bool, got {value!r}.", TypeError)
        return value

"""Checked calls: `check_bounds=True` and `timeout=` (issue 7).

A checked call compiles a *checked variant* of the kernel (the mode is part of the variant
key, and of the compile cache's key through the generated source). The user's source is not
changed; the front end below rewrites it, keeping every line where it was:

- bounds (`check_bounds=True`, or KERNELKIT_CHECK_BOUNDS=1 when kernelkit is imported): each
  use of an input or output buffer in the body (and in the header's macros) becomes a checked
  pointer (`KK_CHK(x, b)`, `kk::dbg::ptr<T>` in include/kernelkit/debug.h) whose accesses
  `x[i]`, `*x`, `*(x + i)` check the address against the buffer; a local pointer declared
  from a buffer (`const device T* row = x + k;`) is declared `auto`, so it stays checked;
  where a raw pointer is wanted (a helper's argument, a cast) the raw pointer is passed;
- timeout (`timeout=` seconds): every loop of the body and the header polls a clock in its
  condition (`while (KK_POLL(0), cond)`).

DESIGN.md ("Checked calls") has the rules and what they do not cover.

The argument block of a checked variant ends with three more fields: the record buffer (a
small int64 tensor on the call's device), the timeout in ns, and each checked buffer's size
in elements. After the launch (the call synchronises its stream) the record says whether,
where and by which thread an access went out of bounds or the launch timed out; the call
raises IndexError or TimeoutError from it.
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .dialects.tokens import tokenize, untokenize
from .errors import GPUFault, KernelLaunchError, UnwrittenOutputWarning

RECORD_WORDS = 32  # kk::dbg::kRecordWords
_STATUS, _START, _BUFFER, _INDEX, _LINE, _TID, _GID = 0, 1, 2, 3, 4, 5, 8
_OUT_OF_BOUNDS, _TIMED_OUT = 1, 2

# KERNELKIT_CHECK_BOUNDS=1: every call is bounds-checked unless it says check_bounds=False.
CHECK_BOUNDS = os.environ.get("KERNELKIT_CHECK_BOUNDS", "") not in ("", "0")


class Mode(NamedTuple):
    """What a checked variant checks: part of the variant key."""

    bounds: bool
    timeout: bool


def describe(mode: Mode) -> str:
    return " and ".join(n for n, on in (("check_bounds=True", mode.bounds), ("timeout", mode.timeout))
                        if on)


class Request(NamedTuple):
    """The checks a call asked for."""

    mode: Mode
    timeout_ns: int
    timeout_s: float


def request(check_bounds, timeout, caller: str) -> Request | None:
    """The call's checks, or None for a plain call."""
    if check_bounds is None:
        check_bounds = CHECK_BOUNDS
    elif not isinstance(check_bounds, (bool, int)):
        raise TypeError(f"[{caller}] check_bounds must be a bool, got {check_bounds!r}.")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0 \
                or timeout == float("inf"):
            raise ValueError(f"[{caller}] timeout must be a positive number of seconds (or None), "
                             f"got {timeout!r}.")
    if not check_bounds and timeout is None:
        return None
    ns = 0 if timeout is None else max(1, min(int(timeout * 1e9), 2**63 - 1))
    return Request(Mode(bool(check_bounds), timeout is not None), ns, timeout or 0.0)


class Buffer(NamedTuple):
    name: str
    role: str  # input | output
    index: int  # among the inputs or outputs


@dataclass(frozen=True)
class Plan:
    """A checked variant: its mode and the buffers it checks (numbered in this order)."""

    mode: Mode
    buffers: tuple[Buffer, ...]

    # --- what codegen puts around the kernel --------------------------------------------------

    def prelude(self) -> list[str]:
        return [f"#define KK_DBG_NBUF {len(self.buffers)}", "#include <kernelkit/debug.h>"]

    def bind_function(self) -> str:
        """kk_dbg_bind(a, t): hands the argument block's debug fields to kk::dbg::bind."""
        if self.buffers:
            bases = ", ".join(f"(const void*)a.{b.name}" for b in self.buffers)
            sizes = "a.kk_dbg_size" if len(self.buffers) > 1 else "&a.kk_dbg_size"  # 1: no array
            lines = [f"  const void* const kk_base[] = {{{bases}}};",
                     f"  ::kk::dbg::bind(a.kk_dbg, a.kk_timeout_ns, kk_base, {sizes}, a.kk_grid, t);"]
        else:
            lines = ["  ::kk::dbg::bind(a.kk_dbg, a.kk_timeout_ns, nullptr, nullptr, a.kk_grid, t);"]
        return "\n".join(["KK_FN void kk_dbg_bind(const kk_args& a, const kk_thread_ctx* t) {",
                          *lines, "}"])

    def call_prologue(self, target: str) -> str:
        """First statement of kk_call: the CPU binds per thread (the GPU in its entry)."""
        return "kk_dbg_bind(a, &t); " if target == "cpu" else ""

    def entry(self, target: str, ns: str, name: str) -> str | None:
        """The GPU's entry: the block binds the state (all its threads, then a barrier) before
        threads outside the grid return."""
        if target != "cuda":
            return None
        return (f'extern "C" __global__ void KK_ENTRY_BOUNDS {name}(const {ns}::kk_args a) {{\n'
                f"  {ns}::kk_dbg_bind(a, nullptr);\n"
                "  if (::kk::dbg::stopped()) return;\n"
                "  kk_thread_ctx t;\n"
                "  if (!kk::cuda_thread_ctx(a.kk_grid, t)) return;\n"
                f"  {ns}::kk_call(a, t);\n}}")


def prepare(program) -> None:
    """A checked GPU variant keeps its state in static shared memory (kk::dbg::g_state), so
    its dynamic shared memory limit must be raised for any size, not only past 48 KiB."""
    if hasattr(program, "shared_limit"):  # the CUDA backend's program
        program.shared_limit = 0


def plan(kernel, specs, mode: Mode) -> Plan:
    """The buffers a checked variant checks: array inputs the body reaches through a pointer
    (in MSL a 0-d array is a reference, in CUDA a pointer) and every output."""
    buffers = []
    if mode.bounds:
        by_pointer = kernel.dialect.NAME == "cuda_kernel"
        for i, (name, spec) in enumerate(zip(kernel.input_names, specs)):
            if not spec.by_value and (by_pointer or not spec.scalar):
                buffers.append(Buffer(name, "input", i))
        buffers += [Buffer(name, "output", i) for i, name in enumerate(kernel.output_names)]
    return Plan(mode, tuple(buffers))


# --- the front end ---------------------------------------------------------------------------

_ASSIGN = {"=", "+=", "-=", "++", "--"}
_NOT_CALLS = {"if", "while", "for", "switch", "return", "case", "else", "do", "and", "or", "not"}
_EXPRESSION_WORDS = {"return", "case", "else", "do", "sizeof", "and", "or", "not", "co_return",
                     "throw", "co_yield", "co_await"}
_QUALIFIERS = {"const", "volatile", "restrict", "__restrict", "__restrict__"}
_OPEN, _CLOSE = {"(": ")", "[": "]", "{": "}"}, {")": "(", "]": "[", "}": "{"}


def rewrite(header: str, body: str, plan: Plan) -> tuple[str, str]:
    """The lowered (header, body) of a checked variant, every line where it was."""
    names = {b.name: i for i, b in enumerate(plan.buffers)}
    # The header's functions do not see the buffers; its macros may, when the body uses them.
    header = _Rewriter(header, names, poll=1 if plan.mode.timeout else None, macros_only=True).run()
    return header, _Rewriter(body, names, poll=0 if plan.mode.timeout else None).run()


class _Rewriter:
    """One pass over a source's tokens. Decisions read the original tokens; the edits (text
    before, after or instead of a token) are applied at the end. No newline is added."""

    def __init__(self, source: str, buffers: dict[str, int], poll: int | None, derived=None,
                 macros_only: bool = False):
        self.tokens = tokenize(source)
        self.code = [i for i, t in enumerate(self.tokens) if t.kind not in ("ws", "comment")]
        self.texts = [self.tokens[i].text for i in self.code]
        self.buffers, self.poll = buffers, poll
        # Local pointers declared from a buffer (`const float* row = x + i;` -> `auto row = ...`):
        # checked pointers too, passed raw to functions and casts.
        self.derived = set() if derived is None else derived
        self.macros_only = macros_only  # buffers only in #define text (the user's header)
        self.pre, self.post, self.instead = {}, {}, {}

    def run(self) -> str:
        for n, i in enumerate(self.code):
            t = self.tokens[i]
            if t.kind == "pp":  # a macro's replacement text is code too (lines: its uses')
                m = re.match(r"#\s*define\s+\w+(?:\([^)]*\))?", t.text)
                if m:
                    t.text = m.group() + _Rewriter(t.text[m.end():], self.buffers, self.poll,
                                                   self.derived).run()
                continue
            if self.macros_only and t.text not in ("while", "for"):
                continue
            if t.kind != "ident":
                continue
            if self.poll is not None and t.text in ("while", "for") and self._at(n + 1) == "(":
                self._poll_loop(n)
            elif t.text in ("reinterpret_cast", "const_cast") and self._at(n + 1) == "<":
                self._raw_operand(n)
            elif t.text in self.buffers:
                self._use(n, self.buffers[t.text])
            elif t.text in self.derived:
                self._use(n, None)
        for n, text in self.instead.items():
            self.tokens[self.code[n]].text = text
        for n, text in self.pre.items():
            self.tokens[self.code[n]].text = text + self.tokens[self.code[n]].text
        for n, text in self.post.items():
            self.tokens[self.code[n]].text += text
        return untokenize(self.tokens)

    def _at(self, n: int) -> str:
        return self.texts[n] if 0 <= n < len(self.texts) else ""

    def _add(self, where: dict, n: int, text: str, first: bool = False) -> None:
        where[n] = text + where.get(n, "") if first else where.get(n, "") + text

    # --- loops ---------------------------------------------------------------------------------

    def _poll_loop(self, n: int) -> None:
        """`while (` -> `while (KK_POLL(w), `;
        `for (init; cond; inc)` -> `for (init; KK_POLL(w), cond; inc)`."""
        poll = f"KK_POLL({self.poll}), "
        if self.texts[n] == "while":
            self._add(self.post, n + 1, poll)
            return
        depth = 0
        for k in range(n + 1, len(self.texts)):
            x = self.texts[k]
            if x in _OPEN:
                depth += 1
            elif x in _CLOSE:
                depth -= 1
                if depth == 0:
                    return  # a range-for (no `;`): it ends with its range
            elif x == ";" and depth == 1:
                empty = self._at(k + 1) == ";"
                self._add(self.post, k, f" KK_POLL({self.poll}), true" if empty else " " + poll)
                return

    def _raw_operand(self, n: int) -> None:
        """`reinterpret_cast<T*>(e)` -> `reinterpret_cast<T*>(::kk::dbg::raw(e))`: these casts
        cannot convert a checked pointer (a class), whatever expression made it."""
        for k in range(n + 2, len(self.texts)):
            if self.texts[k] in (";", "{", "}"):
                return
            if self.texts[k] == "(" and self._at(k - 1) in (">", ">>"):
                end = _argument_end(self.texts, k + 1)
                if self._at(end + 1) == ")":
                    self._add(self.post, k, "::kk::dbg::raw(")
                    self._add(self.pre, end + 1, ")", first=True)
                return

    # --- buffer uses ---------------------------------------------------------------------------

    def _use(self, n: int, b: int | None) -> None:
        """A use of buffer b (or, b None, of a derived checked pointer) at code position n."""
        name, prev, prev2, nxt = self.texts[n], self._at(n - 1), self._at(n - 2), self._at(n + 1)
        if prev in (".", "->", "::") or nxt == "::":
            return  # a member or a qualified name, not the parameter
        if nxt in _ASSIGN or prev in ("++", "--"):
            return  # the pointer itself changes: left as it is (checks compare addresses)
        if prev == "&" and nxt != "[":
            return  # the parameter's address
        if _is_word(prev) and prev not in _EXPRESSION_WORDS:
            return  # the declaration of another variable of that name (`float x`)
        if prev in ("*", "&") and _is_word(prev2) and prev2 not in _EXPRESSION_WORDS:
            return  # `float* x`
        if prev == "[":
            return  # a lambda capture
        raw = f"::kk::dbg::raw({name})" if b is None else name
        if prev == ")" and prev2 in ("*", "&"):
            self.instead[n] = raw  # the operand of a C-style cast to a pointer: the raw pointer
            return
        if prev in ("(", ","):
            opener = _opener(self.texts, n)
            if opener is not None and self.texts[opener] == "[":
                return
            if opener is not None and self.texts[opener] == "(" and _is_call(self.texts, opener):
                callee = self._at(opener - 1)
                strict = callee.startswith(("atomic", "__ld", "__st"))  # they access the element
                wrap = "::kk::dbg::elem(" if strict else "::kk::dbg::arg("
                if nxt in (",", ")"):  # the whole argument
                    if strict:
                        self.instead[n] = wrap + (name if b is None else _chk(name, b)) + ")"
                    else:
                        self.instead[n] = raw  # a helper gets the raw pointer
                    return
                if nxt in ("+", "-"):  # `f(x + i)`: the pointer must lie in the buffer
                    self._add(self.pre, n, wrap)
                    self._add(self.post, _argument_end(self.texts, n), ")")
        if b is None:
            return  # already a checked pointer
        if prev == "=":
            self._derive(n)
        self._add(self.pre, n, "KK_CHK(", first=False)
        self._add(self.post, n, f", {b})", first=True)

    def _derive(self, n: int) -> None:
        """`T* p = x;` / `T* p = x + i;` (one declarator): `auto p = ...`, a checked pointer."""
        k = n - 2
        if not _is_word(self._at(k)) or self._at(k) in _EXPRESSION_WORDS:
            return
        local = self._at(k)
        k -= 1
        while self._at(k) in _QUALIFIERS:
            k -= 1
        if self._at(k) == "auto":  # `auto p = x + i;`: already a checked pointer; track its uses
            k -= 1
            while self._at(k) in _QUALIFIERS:
                k -= 1
            if self._at(k) in ("", ";", "{", "}", "(") and self._declarator_ends(n):
                self.derived.add(local)
            return
        if self._at(k) != "*":
            return
        star, k = k, k - 1
        while _is_word(self._at(k)) or self._at(k) in ("::", ">"):
            if self._at(k) in _EXPRESSION_WORDS or self._at(k) in _NOT_CALLS:
                return
            if self._at(k) == ">":  # template arguments: `atomic<float>* p = ...`
                depth = 0
                while k >= 0:
                    depth += {">": 1, "<": -1}.get(self._at(k), 0)
                    if depth == 0 or self._at(k) in (";", "{", "}", "="):
                        break
                    k -= 1
                if self._at(k) != "<":
                    return
            k -= 1
        if k + 1 == star or self._at(k) not in ("", ";", "{", "}", "(") or \
                not self._declarator_ends(n):
            return
        self.instead[k + 1] = "auto"
        for j in range(k + 2, n - 2):
            self.instead[j] = ""
        self.derived.add(local)


    def _declarator_ends(self, n: int) -> bool:
        """Whether the initialiser `x` / `x + i` / `x - i` at n ends its declaration (`;`)."""
        end = n if self._at(n + 1) == ";" else (
            _argument_end(self.texts, n) if self._at(n + 1) in ("+", "-") else None)
        return end is not None and self._at(end + 1) == ";"


def _chk(name: str, b: int) -> str:
    return f"KK_CHK({name}, {b})"


def _is_word(text: str) -> bool:
    return bool(text) and (text[0].isalpha() or text[0] == "_")


def _opener(texts: list[str], n: int) -> int | None:
    """The unmatched bracket enclosing code position n."""
    depth = 0
    for k in range(n - 1, -1, -1):
        x = texts[k]
        if x in _CLOSE:
            depth += 1
        elif x in _OPEN:
            if depth == 0:
                return k
            depth -= 1
        elif x == ";" and depth == 0:
            return None
    return None


def _is_call(texts: list[str], opener: int) -> bool:
    before = texts[opener - 1] if opener else ""
    if _is_word(before):
        return before not in _NOT_CALLS
    return before in (">", ")", "]")


def _argument_end(texts: list[str], n: int) -> int:
    """The last code position of the expression starting at n (ends at `,` `;` or a closing
    bracket at its depth)."""
    depth = 0
    for k in range(n, len(texts)):
        x = texts[k]
        if x in _OPEN:
            depth += 1
        elif x in _CLOSE:
            if depth == 0:
                return k - 1
            depth -= 1
        elif x in (",", ";") and depth == 0:
            return k - 1
    return len(texts) - 1


# --- the call --------------------------------------------------------------------------------

def extent(t: torch.Tensor) -> int:
    """Elements from a view's first element to its last, inclusive: the range its pointer may
    reach (numel for a contiguous array)."""
    if t.numel() == 0:
        return 0
    return 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))


def run(kernel, variant, req: Request, launch, tensors, outputs, tail, device, stream, group,
        fills) -> None:
    """Launch a checked variant and raise what its record says; with check_bounds, warn of
    output elements the kernel never wrote (outputs without an init_value)."""
    marked = [i for i, (o, f) in enumerate(zip(outputs, fills))
              if f is None and o.dtype in _UNWRITTEN] if req.mode.bounds else []
    for i in marked:
        outputs[i].view(_UNWRITTEN[outputs[i].dtype][0]).fill_(_UNWRITTEN[outputs[i].dtype][1])
    _launch_checked(kernel, variant, req, launch, tensors, outputs, tail, device, stream, group)
    for i in marked:
        _warn_unwritten(kernel, outputs[i], i)


# The bits an output element holds until the kernel writes it, per dtype, and the integer view
# they are written through: NaNs with a payload no arithmetic makes for floats, 0xA5 bytes else.
_SAME_WIDTH_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_UNWRITTEN = {
    torch.float16: (torch.int16, 0x7D5A), torch.bfloat16: (torch.int16, 0x7FA5),
    torch.float32: (torch.int32, 0x7FA5A5A5), torch.float64: (torch.int64, 0x7FF4A5A5A5A5A5A5),
    **{t: (_SAME_WIDTH_INT[t.itemsize], int.from_bytes(b"\xa5" * t.itemsize, "little", signed=True))
       for t in (torch.int8, torch.int16, torch.int32, torch.int64,
                 torch.uint8, torch.uint16, torch.uint32, torch.uint64)}}


def _warn_unwritten(kernel, out: torch.Tensor, i: int) -> None:
    view_dtype, bits = _UNWRITTEN[out.dtype]
    left = (out.view(view_dtype) == bits).flatten()
    n = int(left.sum())
    if n:
        first = int(left.nonzero()[0])
        warnings.warn(
            f"[{kernel.caller}] kernel {kernel.name!r} left {n} of the {out.numel()} elements of "
            f"output {kernel.output_names[i]!r} unwritten (the first at flat index {first}); their "
            "values are undefined. If that is meant, pass init_value; else check the grid: it "
            "counts threads, not threadgroups (a CUDA-style grid of blocks runs too few threads).",
            UnwrittenOutputWarning, stacklevel=4)


def _launch_checked(kernel, variant, req, launch, tensors, outputs, tail, device, stream, group):
    plan: Plan = variant.debug
    record = torch.zeros(RECORD_WORDS, dtype=torch.int64, device=device)
    sizes = [extent(tensors[b.index]) if b.role == "input" else outputs[b.index].numel()
             for b in plan.buffers]
    block = variant.pack(tensors, outputs, (*tail, record.data_ptr(), req.timeout_ns, *sizes))
    try:
        launch(block)
    except KernelLaunchError:
        if device.type != "cpu":
            raise
        words = record.tolist()
        if words[_STATUS] == 0:
            raise
        _raise(kernel, plan, req, words, tensors, sizes, group)
    if device.type == "cuda":
        try:
            if isinstance(stream, torch.cuda.Stream):
                stream.synchronize()
            else:
                torch.cuda.current_stream(device).synchronize()
            words = record.cpu().tolist()
        except RuntimeError as e:
            if "CUDA" not in str(e):
                raise
            raise GPUFault(
                f"[{kernel.caller}] kernel {kernel.name!r} faulted on {device} during a checked call: "
                f"{str(e).strip().splitlines()[0]}. The CUDA context of this process is lost: every "
                "later CUDA call fails, in torch too; restart the process. check_bounds checks the "
                "accesses through the kernel's input and output buffers in its body; this fault came "
                "from another access (a raw pointer in a helper function, threadgroup memory...) or "
                "from a kernel that ran before it.") from e
    else:
        words = record.tolist()
    if words[_STATUS]:
        _raise(kernel, plan, req, words, tensors, sizes, group)


def _raise(kernel, plan: Plan, req: Request, words: list[int], tensors, sizes, group) -> None:
    c, name = kernel.caller, kernel.name
    thread = _thread_text(kernel, words, group)
    line, where = words[_LINE] & 0xFFFFFFFF, "header" if words[_LINE] >> 32 else "body"
    text = (kernel.header if where == "header" else kernel.source).splitlines()
    at = f"{where} line {line}"
    if 1 <= line <= len(text):
        at += f":\n    {text[line - 1].strip()}\n"
    else:
        at += "\n"
    if words[_STATUS] == _TIMED_OUT:
        raise TimeoutError(
            f"[{c}] kernel {name!r} ran past its timeout of {req.timeout_s:g} s and was stopped: "
            f"{thread} was in the loop at {at}(its outputs are incomplete; the next call runs as "
            "usual)") from None
    b = words[_BUFFER]
    buf = plan.buffers[b] if 0 <= b < len(plan.buffers) else Buffer("?", "buffer", 0)
    index, size = words[_INDEX], sizes[b] if 0 <= b < len(sizes) else 0
    if buf.role == "input" and tensors[buf.index].numel() != size:
        t = tensors[buf.index]
        has = (f"{buf.name!r} spans {size} elements (a strided view of shape {tuple(t.shape)} with "
               f"strides {tuple(t.stride())}, from its first element to its last)")
    else:
        has = f"{buf.name!r} has {size} element{'s' if size != 1 else ''}"
    raise IndexError(
        f"[{c}] kernel {name!r}: out-of-bounds access to {buf.role} {buf.name!r} at index {index} "
        f"({has}) by {thread} at {at}(check_bounds: the access was not made; on the GPU the "
        "thread went on with a dummy element, on the CPU the launch stopped)") from None


def _thread_text(kernel, words: list[int], group) -> str:
    tid = tuple(words[_TID:_TID + 3])
    gid = tuple(words[_GID:_GID + 3])
    if kernel.dialect.NAME == "cuda_kernel":
        return f"thread threadIdx {_xyz(tid)} of blockIdx {_xyz(gid)}"
    pos = tuple(g * n + t for g, n, t in zip(gid, group, tid))
    return (f"thread_position_in_grid {_xyz(pos)} (thread_position_in_threadgroup {_xyz(tid)} of "
            f"threadgroup_position_in_grid {_xyz(gid)})")


def _xyz(v) -> str:
    return "(" + ", ".join(str(x) for x in v) + ")"


"""kernelkit's exceptions, and compiler diagnostics pointed at the user's own lines."""

from __future__ import annotations

import re

# NVRTC writes `body(3): error: ...`; g++ and clang write `body:3:5: error: ...`; NVRTC names the
# line that instantiated a template as `... at line 2 of body`.
_LOCATION = re.compile(r'^"?(body|header)"?(?:\((\d+)\)|:(\d+)(?::\d+)?):', re.MULTILINE)
_INSTANTIATED_AT = re.compile(r'at line (\d+) of "?(body|header)"?\s*$')


class CompileError(RuntimeError):
    """The compiler rejected a kernel; `log` is its full diagnostic, `source` what it compiled."""

    def __init__(self, log: str, source: str, context: str = ""):
        self.log = log
        self.source = source
        self.context = context
        super().__init__(log)

    def with_context(self, context: str, body: str, header: str) -> "CompileError":
        """The same error, its message naming the kernel and quoting the user's lines."""
        err = CompileError(self.log, self.source, context)
        err.args = (f"{context} failed to compile:\n{annotate(self.log, body, header)}\n"
                    "(the full generated source is in the exception's `source`, or printed "
                    "with verbose=True)",)
        return err


class KernelLaunchError(RuntimeError):
    """A driver call failed, or the CPU runtime stopped a launch."""


class UnwrittenOutputWarning(UserWarning):
    """A checked call (check_bounds=True) found output elements the kernel never wrote."""


class GPUFault(KernelLaunchError):
    """A kernel faulted on the GPU (reported at a later launch): the process's CUDA context is lost."""


def annotate(log: str, body: str, header: str) -> str:
    """The compiler log, each diagnostic on the user's body or header followed by that line."""
    texts = {"body": body.splitlines(), "header": header.splitlines()}
    out = []
    for line in log.splitlines():
        out.append(line)
        m = _LOCATION.match(line)
        at = None if m else _INSTANTIATED_AT.search(line)
        if m or at:
            if m:
                where, number = m.group(1), int(m.group(2) or m.group(3))
            else:
                where, number = at.group(2), int(at.group(1))
            lines = texts[where]
            if 1 <= number <= len(lines):
                out.append(f"    {where} line {number}: {lines[number - 1].strip()}")
    return "\n".join(out)

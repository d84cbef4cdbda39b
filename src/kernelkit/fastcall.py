"""The compiled half of the fast call path: `fastcall.cpp`, a CPython extension.

Built on first use with the CPU backend's C++ compiler and kept in the compile cache (as
Triton builds its launchers). It reads a repeated call's plan key off the arguments and runs
the plan (`call`), and on CUDA runs whole plans in C (`make_plan`, `run`). Where it cannot be
built (no C++ compiler, no Python headers) kernel.py computes the same key in Python
(`kernel._plan_key`) and the CUDA backend launches through cuda-bindings; `kernelkit doctor`
says which.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import platform
import sys
import sysconfig
import threading
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("fastcall.cpp")


_result = None  # the module, or a line saying why there is none; None until known
_builder: threading.Thread | None = None
_lock = threading.Lock()


def module(block: bool = True):
    """The extension module, or a line saying why there is none. The first use builds it in a
    background thread (a compile costs ~1 s, once per machine); with block=False, None while
    that runs, so that no call waits for it: calls take the general path meanwhile."""
    global _builder
    if _result is None:
        with _lock:
            if _builder is None:
                _builder = threading.Thread(target=_build, name="kernelkit-fastcall", daemon=True)
                _builder.start()
        if block:
            _builder.join()
    return _result


def peek():
    """The module, or why there is none, if known by now; None otherwise. Starts nothing."""
    return _result


def _build() -> None:
    global _result
    try:
        _result = _load()
    except Exception as e:  # noqa: BLE001 - an unusable extension means the Python path, never a crash
        _result = f"{type(e).__name__}: {e}".splitlines()[0]


def _load():
    from .backends import cpu
    from .cache import key_of
    from .errors import CompileError
    try:
        source = SOURCE.read_text()
        include = sysconfig.get_paths()["include"]
        key = key_of(source, "fastcall", sys.version, platform.machine(), cpu.compiler()[1])
        path = cpu.library_path(key, source, lambda: cpu.compile_source(source, "safe", (f"-I{include}",)))
        name = "kernelkit._fastcall"
        spec = importlib.util.spec_from_loader(name, importlib.machinery.ExtensionFileLoader(name, str(path)))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    except (CompileError, cpu.CompilerNotFound, OSError, ImportError) as e:
        return (str(e).strip() or type(e).__name__).splitlines()[0]
    mod.set_tensor_type(torch.Tensor)
    return mod

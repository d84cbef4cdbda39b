"""The compiled half of the fast call path: `fastcall.cpp`, a CPython extension.

A wheel carries it built at install time (setup.py), as `kernelkit._fastcall`. Where it is
absent (an editable install, or a build without a C++ compiler or Python headers) it is built
on first use with the CPU backend's C++ compiler and kept in the compile cache, keyed by the
source (as Triton builds its launchers). It reads a repeated call's plan key off the arguments and runs
the plan (`call`), and on CUDA runs whole plans in C (`make_plan`, `run`). Where it cannot be
built (no C++ compiler, no Python headers) kernel.py computes the same key in Python
(`kernel._plan_key`) and the CUDA backend launches through cuda-bindings; `kernelkit doctor`
says which.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import logging
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
    """The extension module, or a line saying why there is none. An installed one is loaded at
    once; else the first use builds it in a background thread (a compile costs ~1 s, once per
    machine) and, with block=False, this is None while that runs, so that no call waits for it:
    calls take the general path meanwhile."""
    global _builder, _result
    if _result is None:
        with _lock:
            if _result is None and _builder is None:
                _result = _installed()
                if _result is None:
                    _builder = threading.Thread(target=_build, name="kernelkit-fastcall", daemon=True)
                    _builder.start()
        if block and _builder is not None:
            _builder.join()
    return _result


def peek():
    """The module, or why there is none, if known by now; None otherwise. Starts nothing."""
    return _result


def _installed():
    """The extension a wheel carries, ready; None where there is none (or it does not load)."""
    try:
        from . import _fastcall
    except ImportError:
        return None
    _fastcall.set_tensor_type(torch.Tensor)
    return _fastcall


def _build() -> None:
    global _result
    try:
        _result = _built()
    except Exception as e:  # noqa: BLE001 - an unusable extension means the Python path, never a crash
        _result = f"{type(e).__name__}: {e}".splitlines()[0]
    if isinstance(_result, str):
        logging.getLogger("kernelkit").info("the fast call path's C extension is unavailable (%s): "
                                            "repeated calls take the Python path", _result)


def _built():
    """The extension built from SOURCE with the CPU backend's compiler (cached), or why not."""
    from .backends import cpu
    from .cache import key_of
    from .errors import CompileError
    try:
        source = SOURCE.read_text()
        include = sysconfig.get_paths()["include"]
        key = key_of(source, "fastcall", sys.version, platform.machine(), cpu.compiler()[1])
        mod = cpu.load_cached(key, source, lambda: cpu.compile_source(source, "safe", (f"-I{include}",)),
                              _extension)
    except (CompileError, cpu.CompilerNotFound, OSError, ImportError) as e:
        return (str(e).strip() or type(e).__name__).splitlines()[0]
    mod.set_tensor_type(torch.Tensor)
    return mod


def _extension(path: str):
    name = "kernelkit._fastcall"
    spec = importlib.util.spec_from_loader(name, importlib.machinery.ExtensionFileLoader(name, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

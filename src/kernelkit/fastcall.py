"""The compiled half of the fast call path: `fastcall.cpp`, a CPython extension.

A wheel carries it built at install time (setup.py), as `kernelkit._fastcall`. Where it is
absent (an editable install, or a build without a C++ compiler or Python headers) it is built
on first use with the CPU backend's C++ compiler and kept in the compile cache, keyed by the
source (as Triton builds its launchers). It reads a repeated call's plan key off the arguments and runs
the plan (`call`), and on CUDA runs whole plans in C (`make_plan`, `run`). Where it cannot be
built (no C++ compiler, no Python headers) kernel.py computes the same key in Python
(`kernel._plan_key`) and the CUDA backend launches through cuda-bindings; `kernelkit doctor`
says which.

fastcall.cpp includes no torch header, so that a wheel can carry it whatever torch is installed;
it then reads tensors and allocates outputs through torch's Python methods. Its companion
`fastcall_torch.cpp` does those steps through libtorch's C++ API, which halves a repeated GPU
call's host time; libtorch's C++ ABI changes with each torch release, so it is always built
here, against the installed torch (as torch's own extensions are), after fastcall.cpp and in
the same background thread, cached by torch's version and place, and lent to the extension
(`set_torch`). Without it (no torch headers, a compile error) the Python methods remain.
The same library holds custom_function's C++ autograd node (`autograd_node.cpp`, `node_attach`);
without it custom_function goes through torch.autograd.Function.
"""

from __future__ import annotations

import ctypes
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
TORCH_SOURCES = (Path(__file__).with_name("fastcall_torch.cpp"), Path(__file__).with_name("autograd_node.cpp"))


_result = None  # the module, or a line saying why there is none; None until known
_torch = None  # fastcall_torch's library (lent to the module), or why there is none; None until known
node_attach = None  # autograd_node.cpp's attach, once that library is loaded (autodiff reads it)
_builder: threading.Thread | None = None
_lock = threading.Lock()


def module(block: bool = True):
    """The extension module, or a line saying why there is none. An installed one is loaded at
    once; else the first use builds it in a background thread (a compile costs ~1 s, once per
    machine) and, with block=False, this is None while that runs, so that no call waits for it:
    calls take the general path meanwhile. The same thread then builds fastcall_torch.cpp (~10 s
    once per machine and torch); block=True waits for both."""
    global _builder, _result
    if _builder is None:
        with _lock:
            if _builder is None:
                _result = _installed()
                _builder = threading.Thread(target=_build, name="kernelkit-fastcall", daemon=True)
                _builder.start()
    if block:
        _builder.join()
    return _result


def torch_helper(block: bool = True):
    """fastcall_torch's loaded library, or a line saying why there is none (None while it is
    being built, with block=False)."""
    module(block)
    return _torch


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
    global _result, _torch, node_attach
    if _result is None:
        try:
            _result = _built()
        except Exception as e:  # noqa: BLE001 - an unusable extension means the Python path, never a crash
            _result = f"{type(e).__name__}: {e}".splitlines()[0]
        if isinstance(_result, str):
            logging.getLogger("kernelkit").info("the fast call path's C extension is unavailable "
                                                "(%s): repeated calls take the Python path", _result)
    if isinstance(_result, str):
        _torch = "the fast call path's C extension is unavailable"
        return
    try:
        _torch = _lend_torch(_result)
        if not isinstance(_torch, str):
            node_attach = ctypes.PYFUNCTYPE(ctypes.py_object)(("kk_attach_function", _torch))()
    except Exception as e:  # noqa: BLE001 - as above: torch's Python methods remain
        _torch = f"{type(e).__name__}: {e}".splitlines()[0]
    if isinstance(_torch, str):
        logging.getLogger("kernelkit").info("fastcall_torch.cpp is unavailable (%s): repeated GPU "
                                            "calls read tensors through torch's Python methods", _torch)


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


def _lend_torch(mod):
    """fastcall_torch.cpp built against the installed torch (cached), loaded, and lent to `mod`;
    or why not."""
    from .backends import cpu
    from .cache import key_of
    from .errors import CompileError
    root = Path(torch.__file__).resolve().parent
    include, lib = root / "include", root / "lib"
    if not (include / "torch" / "csrc" / "autograd" / "python_variable.h").is_file():
        return f"torch's C++ headers are not installed (no {include})"
    flags = ("-std=c++20", f"-I{sysconfig.get_paths()['include']}", f"-I{include}",
             f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}",
             f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
             # every library a dependency, wherever the linker puts the source among them
             "-Wl,--no-as-needed", f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python",
             f"-Wl,-rpath,{lib}")
    try:
        source = "".join(f'#line 1 "{p.name}"\n{p.read_text()}' for p in TORCH_SOURCES)  # one library
        # the library is bound to this torch: its version, and its place (the rpath above)
        key = key_of(source, "fastcall_torch", sys.version, platform.machine(), cpu.compiler()[1],
                     torch.__version__, str(torch.version.git_version), str(lib), *flags)
        helper = cpu.load_cached(key, source, lambda: cpu.compile_source(source, "safe", flags),
                                 ctypes.CDLL)
    except (CompileError, cpu.CompilerNotFound, OSError) as e:
        return (str(e).strip() or type(e).__name__).splitlines()[0]
    mod.set_torch(*addresses(helper))
    return helper


def addresses(helper) -> tuple[int, ...]:
    """What set_torch takes: the addresses of fastcall_torch's functions in its loaded library."""
    return tuple(ctypes.cast(getattr(helper, name), ctypes.c_void_p).value
                 for name in ("kk_fingerprint", "kk_view", "kk_empty", "kk_stream",
                              "kk_signature"))


def _extension(path: str):
    name = "kernelkit._fastcall"
    spec = importlib.util.spec_from_loader(name, importlib.machinery.ExtensionFileLoader(name, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod

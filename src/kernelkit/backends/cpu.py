"""The CPU backend: the system C++ compiler builds the generated kernel into a
shared library; the kernelkit runtime (`include/kernelkit/cpu_runtime.cpp`,
itself compiled once and cached) spreads threadgroups over the cores and runs
a group's threads as fibers when the kernel synchronises them.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Callable, TypeVar

import torch

from .. import codegen
from ..cache import CACHE, key_of, private_dir
from ..errors import CompileError, KernelLaunchError
from . import groups_per_grid

T = TypeVar("T")

INCLUDE = Path(__file__).resolve().parent.parent / "include"
RUNTIME_SOURCE = INCLUDE / "kernelkit" / "cpu_runtime.cpp"
_RUNTIME_HEADERS = ("cpu_runtime.h", "launch.h")  # part of the runtime's cache key
_RUNTIME_ABI = 2  # KK_RT_ABI_VERSION in cpu_runtime.h
MAX_THREADS_PER_GROUP = 1024
_ERROR_CAPACITY = 2048  # bytes for the runtime's error message
# -fstack-clash-protection: a frame larger than a page is touched page by page, so a kernel that
# overflows its stack hits the guard page below it (an error) instead of another thread's stack.
_BASE_FLAGS = ["-std=c++17", "-O3", "-fPIC", "-shared", "-pthread", "-fvisibility=hidden",
               "-Wno-attributes", "-fstack-clash-protection"]
_MATH_FLAGS = {
    "safe": ["-ffp-contract=off"],
    "relaxed": ["-ffp-contract=fast", "-fno-math-errno"],
    # fast math without -ffinite-math-only: isnan/isinf keep working, as on the GPU
    "fast": ["-ffp-contract=fast", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
             "-freciprocal-math", "-fassociative-math"],
}


class CompilerNotFound(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def compiler() -> tuple[str, str]:
    """(path, identity) of the C++ compiler: $CXX, else g++ or clang++ on PATH."""
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "clang++", "c++"]
    broken = []
    for c in candidates:
        path = shutil.which(c)
        if path:
            try:
                proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as e:
                broken.append(f"`{path} --version` failed ({e})")
                continue
            if proc.returncode == 0:
                return path, proc.stdout.splitlines()[0] if proc.stdout.strip() else c
            said = (proc.stderr or proc.stdout).strip().splitlines()
            broken.append(f"`{path} --version` {_exit_status(proc.returncode)}"
                          + (f": {said[0]}" if said else " and printed nothing"))
    raise CompilerNotFound(
        "no C++ compiler found for kernelkit's CPU backend"
        + (f" ({'; '.join(broken)})" if broken else "")
        + ": install g++ or clang++ (e.g. `apt-get install g++`), or set CXX")


def compile_source(source: str, math_mode: str, extra: tuple[str, ...] = ()) -> bytes:
    cxx, _ = compiler()
    with tempfile.TemporaryDirectory(prefix="kernelkit-") as tmp:
        src, out = os.path.join(tmp, "kernel.cpp"), os.path.join(tmp, "kernel.so")
        Path(src).write_text(source)
        std = ["-std=c++20"] if codegen.uses_tensor_ops(source) else []  # after _BASE_FLAGS' c++17
        cmd = [cxx, *_BASE_FLAGS, *std, *_MATH_FLAGS[math_mode], *extra, f"-I{INCLUDE}", src, "-o", out]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            log = (proc.stderr + proc.stdout).replace(src + ":", "kernel.cpp:").strip()
            raise CompileError(log or f"`{shlex.join(cmd)}` {_exit_status(proc.returncode)} and "
                               "printed nothing", source)
        return Path(out).read_bytes()


def _exit_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def load_cached(key: str, source: str, build, load: Callable[[str], T]) -> T:
    """`load(path)` of the shared library `key` from the compile cache. The loader reads a file
    written from the bytes the cache verified (or built) in this process, in a directory of this
    call's own (mode 0700, removed once loaded): nobody can swap it between the check and the
    load. (Removing it is safe: the loaded mapping keeps the file's inode, which the dynamic
    loader compares to tell libraries apart, from being reused.)"""
    binary = CACHE.get(key, ".so", source, build)
    with private_dir() as private:
        path = os.path.join(private, key + ".so")
        with open(path, "xb") as f:
            f.write(binary)
        return load(path)


class _LaunchDesc(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("group", ctypes.c_uint * 3),
                ("num_groups", ctypes.c_uint * 3), ("uses_sync", ctypes.c_int),
                ("kernel_name", ctypes.c_char_p)]


class CpuBackend:
    target = "cpu"

    def __init__(self):
        self._runtime = None
        self._libraries: dict[str, ctypes.CDLL] = {}  # compile-cache key -> loaded library
        self._lock = threading.Lock()

    def runtime(self) -> ctypes.CDLL:
        """libkkrt, loaded RTLD_GLOBAL so kernel libraries resolve the runtime's symbols."""
        if self._runtime is None:
            with self._lock:
                if self._runtime is None:
                    source = RUNTIME_SOURCE.read_text()
                    headers = [(INCLUDE / "kernelkit" / h).read_text() for h in _RUNTIME_HEADERS]
                    key = key_of(source, *headers, "runtime", platform.machine(), compiler()[1])
                    lib = load_cached(key, source, lambda: compile_source(source, "safe"),
                                      lambda path: ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
                    if lib.kk_rt_abi_version() != _RUNTIME_ABI:
                        raise RuntimeError(f"kernelkit's CPU runtime reports ABI "
                                           f"{lib.kk_rt_abi_version()}, expected {_RUNTIME_ABI}")
                    self._runtime = lib
        return self._runtime

    def check_dispatch(self, device, grid, group, shared: int, caller: str) -> None:
        threads = group[0] * group[1] * group[2]
        if threads > MAX_THREADS_PER_GROUP:
            raise ValueError(f"[{caller}] threadgroup {group} has {threads} threads; at most "
                             f"{MAX_THREADS_PER_GROUP} are allowed.")

    def build(self, source: str, device, math_mode: str, flags: tuple[str, ...], uses_sync: bool,
              context: str, body: str, header: str, block_size: int, entry: str):
        self.runtime()
        key = key_of(source, math_mode, *flags, platform.machine(), compiler()[1])

        def compile_():
            try:
                return compile_source(source, math_mode, flags)
            except CompileError as e:
                raise e.with_context(context, body, header) from None

        lib = self._libraries.get(key)
        if lib is None:  # one load per library and process: each load maps a new copy
            lib = self._libraries.setdefault(key, load_cached(key, source, compile_, ctypes.CDLL))
        return _Program(lib, uses_sync)

    def compiled_plan(self, program, grid, group, shared: int, name: str, signature, prototypes,
                      prepare):
        """A repeated plain call's plan in C (fastcall.cpp's make_plan: the outputs allocated, the
        block packed and the library's kk_launch called there, without the GIL as ctypes calls
        it; ~0.8 us of host time a call against ~4 through kernel.py's plans), or None without
        the extension."""
        from .. import fastcall
        module = fastcall.peek()
        if module is None or isinstance(module, str):
            return None
        desc = _launch_desc(program, grid, group, name)
        return module.make_plan(
            ctypes.cast(program.launch, ctypes.c_void_p).value, ctypes.addressof(desc), (0,) * 7,
            signature.fill_table(), signature.constant_block((*grid, shared)), prototypes, torch.Size,
            None, 0, prepare, _launch_failed, desc)

    def launcher(self, program, device, grid, group, shared: int, stream, name: str):
        """launch(block): runs the program over this dispatch with a packed argument block."""
        desc = _launch_desc(program, grid, group, name)
        desc_ref, run = ctypes.byref(desc), program.launch

        def launch(block: bytes) -> None:
            err = ctypes.create_string_buffer(_ERROR_CAPACITY)
            if run(block, desc_ref, err, _ERROR_CAPACITY) != 0:
                _launch_failed(err.value)
        return launch


def _launch_desc(program, grid, group, name: str) -> _LaunchDesc:
    return _LaunchDesc((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*group),
                       (ctypes.c_uint * 3)(*groups_per_grid(grid, group)), program.uses_sync, name.encode())


def _launch_failed(message: bytes):
    """The runtime's failure (a barrier that cannot complete, a fault...) as the call's error."""
    raise KernelLaunchError(message.decode(errors="replace"))


class _Program:
    __slots__ = ("lib", "launch", "uses_sync")

    def __init__(self, lib: ctypes.CDLL, uses_sync: bool):
        self.lib = lib
        self.uses_sync = int(uses_sync)
        self.launch = lib.kk_launch  # kk_rt_launch with this library's group function
        self.launch.restype = ctypes.c_int
        self.launch.argtypes = [ctypes.c_char_p, ctypes.POINTER(_LaunchDesc), ctypes.c_char_p,
                                ctypes.c_size_t]


BACKEND = CpuBackend()

"""The NVIDIA backend: NVRTC to machine code for the device's own architecture,
the driver API to load and launch, on the current torch stream.

NVIDIA's own bindings (cuda-bindings) for both; headers and NVRTC come from
NVIDIA's wheels or from a CUDA toolkit (`CUDA_HOME`), found by cuda-pathfinder.
Every NVRTC and driver call goes through `_check`, which raises with the
compiler's log or the driver's error name.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import numbers
import os
import re
import sys
import threading
from pathlib import Path

import torch

from .. import codegen
from ..errors import CompileError, GPUFault, KernelLaunchError
from . import Fill, groups_per_grid

INCLUDE = Path(__file__).resolve().parent.parent / "include"
# "fast" is --use_fast_math less its rewriting of the C math functions into intrinsics: the
# prelude picks the fast functions itself (KK_MATH_FAST), so that MSL's metal::precise:: stays
# accurate in every mode. "safe" fuses multiply-adds as Metal's does (MSL's safe mode sets
# contraction "on": within a statement; NVRTC's -fmad has no such granularity and fuses across
# statements too); a kernel's `#pragma METAL fp contract(off)` adds -fmad=false (extra), which
# replaces the mode's.
_MATH_FLAGS = {
    "safe": ["-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=true"],
    "relaxed": ["-ftz=false", "-prec-div=true", "-prec-sqrt=true", "-fmad=true"],
    "fast": ["-ftz=true", "-prec-div=false", "-prec-sqrt=false", "-fmad=true"],
}


# NVIDIA's wheels (bindings, NVRTC, headers) are the `cuda` extra: the CPU backend needs none.
INSTALL = 'pip install "kernelkit[cuda]"'


class CudaUnavailable(RuntimeError):
    pass


@functools.lru_cache(maxsize=None)
def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as e:
        raise CudaUnavailable(
            f"NVIDIA's Python bindings (cuda-bindings) are missing: {INSTALL} for the GPU "
            "backend; the CPU backend is available") from e
    return driver


@functools.lru_cache(maxsize=None)
def _nvrtc():
    """NVRTC's bindings: imported only to compile, and NVRTC loaded with them."""
    _driver()
    from cuda.bindings import nvrtc
    try:
        nvrtc.nvrtcVersion()  # loads libnvrtc: a missing one is said here, not mid-compile
    except RuntimeError as e:  # cuda-pathfinder's DynamicLibNotFoundError
        raise CudaUnavailable(f"NVRTC not found ({str(e).strip().splitlines()[0]}): {INSTALL}, "
                              "or set CUDA_HOME to a CUDA toolkit") from e
    return nvrtc


@functools.lru_cache(maxsize=None)
def cuda_include_dirs() -> tuple[str, ...]:
    """CUDA's headers (cuda_fp16.h, ...): NVIDIA's wheels first, else CUDA_HOME."""
    dirs = []
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for name in ("cudart", "cccl"):  # cuda_fp16.h...; cuda/std/*, needed by cooperative_groups
        found = None
        try:
            from cuda.pathfinder import find_nvidia_header_directory
            found = find_nvidia_header_directory(name)
        except Exception:
            pass
        fallback = os.path.join(home, "include", *(("cccl",) if name == "cccl" else ()))
        if not found and os.path.isdir(fallback):
            found = fallback
        if found:
            dirs.append(found)
    if not dirs:
        raise CudaUnavailable(f"CUDA headers not found: {INSTALL}, or set CUDA_HOME")
    return tuple(dirs)


def _check(result, what: str):
    """Unpack a cuda-bindings result tuple, raising with the driver's or NVRTC's error name."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        if type(err).__name__ == "nvrtcResult":
            name = _nvrtc().nvrtcGetErrorString(err)[1].decode()
        else:
            name = _driver().cuGetErrorName(err)[1]
            name = name.decode() if name else str(err)
        raise KernelLaunchError(f"{what} failed: {name}")
    return values[0] if len(values) == 1 else values


@functools.lru_cache(maxsize=None)
def nvrtc_identity() -> str:
    """Which NVRTC compiles, for cache keys, without loading it when a wheel says which.

    NVIDIA's bindings take NVRTC from its wheel first (cuda-pathfinder's search order);
    the wheel's dist-info names its version. Loading NVRTC to ask it costs a fresh
    process tens of milliseconds, which a cached kernel's first call should not pay.
    """
    for path in sys.path:
        try:
            wheels = sorted(n for n in os.listdir(path or ".")
                            if n.startswith("nvidia_cuda_nvrtc") and n.endswith(".dist-info"))
        except OSError:
            continue
        if wheels:
            return "+".join(wheels)
    return nvrtc_version()


def nvrtc_version() -> str:
    nvrtc = _nvrtc()
    major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    return f"nvrtc-{major}.{minor}"


_TOPS_SHARED = re.compile(rb"kk_tops_dynamic_smemILi(\d+)EE")


def tensor_ops_shared(cubin: bytes) -> int:
    """The dynamic shared memory a tensor-op kernel's warpgroup runs stage through: each run site on
    that path names its need in a symbol (include/kernelkit/tensor_ops/warpgroup.h)."""
    return max((int(n) for n in _TOPS_SHARED.findall(cubin)), default=0)


def target_arch(arch: str, source: str) -> str:
    """The architecture to compile `source` for on a device of `arch`: Hopper's wgmma (tensor ops)
    needs the arch-specific sm_90a."""
    return arch + "a" if arch == "sm_90" and codegen.uses_tensor_ops(source) else arch


def _math_flags(math_mode: str, extra: tuple[str, ...]) -> list[str]:
    """The mode's flags less those `extra` sets itself (NVRTC warns of an option given twice)."""
    named = {e.split("=")[0] for e in extra}
    return [f for f in _MATH_FLAGS[math_mode] if f.split("=")[0] not in named]


def compile_source(source: str, arch: str, math_mode: str, extra: tuple[str, ...] = ()) -> bytes:
    """CUDA C++ -> cubin for `arch` (e.g. "sm_90")."""
    nvrtc = _nvrtc()
    prog = _check(nvrtc.nvrtcCreateProgram(source.encode(), b"kernel.cu", 0, [], []), "nvrtcCreateProgram")
    try:
        std = "-std=c++20" if codegen.uses_tensor_ops(source) else "-std=c++17"
        opts = [f"-arch={arch}", std, "-default-device", f"-I{INCLUDE}",
                *(f"-I{d}" for d in cuda_include_dirs()), *_math_flags(math_mode, extra), *extra]
        opts = [o.encode() for o in opts]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if int(err) != 0:
            raise CompileError(_log(prog), source)
        size = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _log(prog) -> str:
    nvrtc = _nvrtc()
    size = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    log = b" " * size
    _check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
    return log.rstrip(b"\0 ").decode(errors="replace")


class Device:
    """One GPU: its architecture, limits, primary context, and the modules loaded on it."""

    _all: dict[int, "Device"] = {}
    _lock = threading.Lock()

    def __init__(self, index: int):
        driver = _driver()
        _check(driver.cuInit(0), "cuInit")
        self.index = index
        self.handle = _check(driver.cuDeviceGet(index), "cuDeviceGet")
        attr = driver.CUdevice_attribute

        def get(a):
            return _check(driver.cuDeviceGetAttribute(a, self.handle), "cuDeviceGetAttribute")

        major = get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        self.arch = f"sm_{major}{minor}"
        self.max_threads = get(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)
        self.max_block = (get(attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X),
                          get(attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y),
                          get(attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z))
        self.max_grid = (get(attr.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X),
                         get(attr.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y),
                         get(attr.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z))
        self.max_shared_optin = get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        self.context = _check(driver.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        self._context_int = int(self.context)
        self.modules: dict = {}  # compile-cache key (or a precompiled module's) -> loaded entry

    @classmethod
    def get(cls, index: int) -> "Device":
        dev = cls._all.get(index)
        if dev is None:
            with cls._lock:
                dev = cls._all.get(index) or cls._all.setdefault(index, Device(index))
        return dev

    def load(self, cubin: bytes, entry: str):
        """A CUfunction of the cubin's `entry`, loaded into this device's primary context."""
        driver = _driver()
        with self.current():
            module = _check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
            func = _check(driver.cuModuleGetFunction(module, entry.encode()), "cuModuleGetFunction")
        return func

    def load_precompiled(self, binary: bytes, entry: str, caller: str):
        """A CUfunction `entry` of a module compiled elsewhere (PTX, cubin or fatbin), loaded once
        per device; ValueError saying why where the driver refuses the module or the name."""
        key = ("precompiled", hashlib.sha256(binary).hexdigest(), entry)
        func = self.modules.get(key)
        if func is not None:
            return func
        driver = _driver()
        with self.current():
            err, module = driver.cuModuleLoadData(binary)
            if int(err):
                raise ValueError(f"[{caller}] the driver could not load compiled_source on cuda:{self.index} "
                                 f"({self.arch}): {_error_name(err)}. Expected PTX, a cubin or a fatbin "
                                 "built for this GPU (or PTX of an older architecture).")
            err, func = driver.cuModuleGetFunction(module, entry.encode())
            if int(err):
                driver.cuModuleUnload(module)
                raise ValueError(f"[{caller}] compiled_source has no kernel named {entry!r} "
                                 f"({_error_name(err)}); a C++ kernel's name is its mangled one "
                                 "unless it is declared extern \"C\".")
        return self.modules.setdefault(key, func)

    def current(self):
        return _ContextGuard(self)

    def static_shared(self, func) -> int:
        """The kernel's static shared memory (its __shared__ / threadgroup arrays), in bytes."""
        driver = _driver()
        with self.current():
            return int(_check(driver.cuFuncGetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, func), "cuFuncGetAttribute"))

    def set_max_dynamic_shared(self, func, nbytes: int) -> None:
        driver = _driver()
        with self.current():  # the function's context: torch's current device may be another
            _check(driver.cuFuncSetAttribute(
                func, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                nbytes), "cuFuncSetAttribute")


class _ContextGuard:
    """Makes the device's primary context current for a while, restoring whatever was current.

    torch keeps its current device in the driver's current context, so a launch
    on another device must not leave its context behind.
    """

    __slots__ = ("device", "pushed")

    def __init__(self, device: Device):
        self.device = device
        self.pushed = False

    def __enter__(self):
        driver = _driver()
        current = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(current) != self.device._context_int:
            _check(driver.cuCtxPushCurrent(self.device.context), "cuCtxPushCurrent")
            self.pushed = True
        return self

    def __exit__(self, *exc):
        if self.pushed:
            driver = _driver()
            _check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")
        return False


# Errors a kernel leaves behind that the driver reports on every later call: the process's
# CUDA context is lost (CUDA's "sticky" errors).
_STICKY = {"CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_MISALIGNED_ADDRESS",
           "CUDA_ERROR_ILLEGAL_INSTRUCTION", "CUDA_ERROR_HARDWARE_STACK_ERROR", "CUDA_ERROR_INVALID_PC",
           "CUDA_ERROR_INVALID_ADDRESS_SPACE", "CUDA_ERROR_ASSERT", "CUDA_ERROR_LAUNCH_TIMEOUT"}


def _error_name(err) -> str:
    """The driver's name of a CUresult (or of its int value)."""
    driver = _driver()
    result = driver.CUresult(int(err))
    name = driver.cuGetErrorName(result)[1]
    return name.decode() if name else str(result)


def _launch_failed(err: int, device: Device, name: str) -> None:
    """Raise for a failed cuLaunchKernel: GPUFault for a sticky error left by an earlier kernel."""
    driver = _driver()
    result = driver.CUresult(err)
    error = _error_name(err)
    if error in _STICKY:
        raise GPUFault(
            f"launching kernel {name!r} on cuda:{device.index}: the GPU reports {error} from a "
            "kernel that ran before it (launches are asynchronous). The CUDA context of this "
            "process is lost: every later CUDA call fails, in torch too; restart the process. "
            "To find the faulty access, run the kernel on the CPU backend with CPU tensors, or "
            "under `compute-sanitizer --tool memcheck`.")
    if error in ("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "CUDA_ERROR_INVALID_VALUE"):
        raise KernelLaunchError(
            f"cuLaunchKernel of kernel {name!r} failed: {error}: its threadgroup needs more than an "
            "SM holds (registers a thread x threads, or shared memory), or is larger than the "
            "kernel's KK_MAX_THREADS_PER_THREADGROUP.")
    _check((result,), f"cuLaunchKernel of kernel {name!r}")


_launcher = None  # fastcall's module with the driver's entry points set, or why there is none


def compiled_launcher():
    """fastcall's module ready to launch, a line saying why there is none, or None while it is
    not built (kernel.py starts its build when a call repeats): launches go through
    cuda-bindings meanwhile."""
    global _launcher
    if _launcher is None:
        from .. import fastcall
        module = fastcall.peek()
        if module is None or isinstance(module, str):
            return module
        driver = _driver()
        flags = driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
        entry = [_check(driver.cuGetProcAddress(n.encode(), 12000, flags), f"cuGetProcAddress({n})")[0]
                 for n in ("cuLaunchKernel", "cuCtxGetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent",
                           "cuMemsetD8Async", "cuMemsetD16Async", "cuMemsetD32Async")]
        if not all(entry):
            _launcher = "the driver does not export cuLaunchKernel, the context calls and the memsets"
        else:
            module.set_driver(*map(int, entry))
            _launcher = module
    return _launcher


class CudaBackend:
    target = "cuda"

    def check_dispatch(self, device, grid, group, shared: int, caller: str) -> None:
        dev = Device.get(device.index)
        threads = group[0] * group[1] * group[2]
        if threads > dev.max_threads or any(g > m for g, m in zip(group, dev.max_block)):
            raise ValueError(f"[{caller}] threadgroup {group} exceeds the device's limits: at most "
                             f"{dev.max_threads} threads, {dev.max_block} per dimension.")
        blocks = groups_per_grid(grid, group)
        if any(b > m for b, m in zip(blocks, dev.max_grid)):
            raise ValueError(f"[{caller}] grid {grid} with threadgroup {group} needs {blocks} "
                             f"threadgroups; the device allows at most {dev.max_grid}.")
        if shared > dev.max_shared_optin:
            raise ValueError(f"[{caller}] shared_memory={shared} bytes exceeds the device's "
                             f"{dev.max_shared_optin} bytes per block.")

    def build(self, source: str, device, math_mode: str, flags: tuple[str, ...], uses_sync: bool,
              context: str, body: str, header: str, block_size: int, entry: str):
        from ..cache import CACHE, key_of
        dev = Device.get(device.index)
        arch = target_arch(dev.arch, source)
        key = key_of(source, math_mode, *flags, arch, nvrtc_identity())

        def compile_():
            try:
                return compile_source(source, arch, math_mode, flags)
            except CompileError as e:
                raise e.with_context(context, body, header) from None

        loaded = dev.modules.get(key)
        if loaded is None:
            cubin = CACHE.get(key, ".cubin", source, compile_)
            func, tops_shared = dev.load(cubin, entry), tensor_ops_shared(cubin)
            # no room beside the kernel's static shared memory: those runs take mma.sync
            if tops_shared and tops_shared + dev.static_shared(func) > dev.max_shared_optin:
                tops_shared = 0
            loaded = dev.modules.setdefault(key, (func, tops_shared))
        func, tops_shared = loaded
        return _Program(dev, func, block_size, tops_shared)

    def launcher(self, program, device, grid, group, shared: int, stream, name: str):
        """launch(block): launches the program over this dispatch with a packed argument block, on
        `stream` (a torch stream), else on the current stream at each launch."""
        dev, func = program.device, program.func
        shared += program.tops_shared
        if shared > program.shared_limit:
            dev.set_max_dynamic_shared(func, shared)
            program.shared_limit = shared
        blocks = groups_per_grid(grid, group)
        fixed = stream.cuda_stream if hasattr(stream, "cuda_stream") else None
        index, current_stream = dev.index, _current_stream
        fast = compiled_launcher()
        if fast is not None and not isinstance(fast, str):
            call, fn, ctx = fast.launch, int(func), dev._context_int
            (bx, by, bz), (tx, ty, tz) = blocks, group

            def launch(block: bytes) -> None:
                stream = current_stream(index) if fixed is None else fixed
                err = call(fn, ctx, bx, by, bz, tx, ty, tz, shared, stream, block)
                if err:
                    _launch_failed(err, dev, name)
            return launch

        driver = _driver()

        def launch(block: bytes) -> None:
            handle = current_stream(index) if fixed is None else fixed
            with program.lock:  # the driver copies the block during cuLaunchKernel
                ctypes.memmove(program.block, block, len(block))
                with dev.current():
                    err, = driver.cuLaunchKernel(func, *blocks, *group, shared, handle,
                                                 program.params_address, 0)
            if int(err):
                _launch_failed(int(err), dev, name)
        return launch

    def load_precompiled(self, device, binary: bytes, entry: str, caller: str):
        return Device.get(device.index).load_precompiled(binary, entry, caller)

    def launch_params(self, func, device, grid, group, shared: int, params, name: str) -> None:
        """Launch a kernel of separate parameters (a precompiled one) on the device's current
        stream: `params`, ctypes values in the kernel's parameter order, over `grid` threads in
        groups of `group` (whole groups)."""
        dev = Device.get(device.index)
        if shared > 48 * 1024:
            dev.set_max_dynamic_shared(func, shared)
        handle = _current_stream(dev.index)
        pointers = (ctypes.c_void_p * max(1, len(params)))(*map(ctypes.addressof, params))
        driver = _driver()
        with dev.current():  # (the driver copies the parameters during the call)
            err, = driver.cuLaunchKernel(func, *groups_per_grid(grid, group), *group, shared, handle,
                                         ctypes.addressof(pointers) if params else 0, 0)
        if int(err):
            _launch_failed(int(err), dev, name)

    def compiled_plan(self, program, grid, group, shared: int, name: str, signature, prototypes,
                      prepare):
        """A repeated plain call's plan in C (fastcall.cpp's make_plan), or None without the
        compiled launcher. Called after `launcher` set the shared limit."""
        module = compiled_launcher()
        if module is None or isinstance(module, str):
            return None
        dev = program.device
        blocks = groups_per_grid(grid, group)
        prepare = tuple(_memset(p, o.dtype) or p if type(p) is Fill else p for p, o in zip(prepare, prototypes))
        plan = module.make_plan(
            int(program.func), dev._context_int, (*blocks, *group, shared + program.tops_shared),
            signature.fill_table(),
            signature.constant_block((*grid, shared)), prototypes, torch.Size,
            _raw_stream or _current_stream, dev.index, prepare,
            functools.partial(_launch_failed, device=dev, name=name), None)
        return plan


def _memset(fill: Fill, dtype: torch.dtype) -> tuple | None:
    """fastcall.cpp's memset of a fill: (unit, pattern, units an element), where the value's
    bytes in dtype are a pattern of 4, 2 or 1 bytes repeated (zeros of any dtype; float32 and
    32-bit integers of any value); None for what fill_ must do (a tensor value, say)."""
    if isinstance(fill.value, torch.Tensor) or not isinstance(fill.value, numbers.Number):
        return None
    raw = torch.empty(1, dtype=dtype).fill_(fill.value).view(torch.uint8).tolist()
    for unit in (4, 2, 1):
        if len(raw) % unit == 0 and raw == raw[:unit] * (len(raw) // unit):
            return unit, int.from_bytes(bytes(raw[:unit]), "little"), len(raw) // unit
    return None


class _Program:
    """A loaded kernel, and the host buffer cuda-bindings launches pass its argument block from."""

    def __init__(self, device: Device, func, block_size: int, tops_shared: int = 0):
        self.device, self.func, self.shared_limit = device, func, 48 * 1024
        # Dynamic shared memory for the tensor ops' warpgroup path, launched before the body's own.
        self.tops_shared = tops_shared
        self.block = ctypes.create_string_buffer(block_size)
        self.params = (ctypes.c_void_p * 1)(ctypes.addressof(self.block))  # the one kernel parameter
        self.params_address = ctypes.addressof(self.params)
        self.lock = threading.Lock()


# What Triton's launcher uses: the current stream's handle without building a Stream object.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _current_stream(index: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


BACKEND = CudaBackend()

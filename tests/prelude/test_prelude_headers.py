"""Tests of the C++ prelude headers (src/kernelkit/include): the MSL layer
(kernelkit/metal.h), utils.h and target_cuda.h.

Each tests/prelude/test_*.cpp is a small program written like a kernel body.
It is
  - built with g++ against a single-lane target shim and run (CPU);
  - compiled with g++ against the real CPU target; test_simd_lanes also runs
    there, on 32 fibers of the CPU runtime (fiber_driver.cpp);
  - compiled by NVRTC to an sm_90 cubin (no GPU needed), and run on one warp
    when a CUDA GPU is present.
All builds start at once on a thread pool, so the whole file takes a few seconds.
"""

import concurrent.futures
import os
import pathlib
import shutil
import subprocess

import pytest

HERE = pathlib.Path(__file__).resolve().parent
INCLUDE = HERE.parents[1] / "src" / "kernelkit" / "include"

# Programs the single-lane shim can run; test_simd_lanes needs 32 real lanes.
SINGLE_LANE = ["test_types", "test_vector", "test_math", "test_sync", "test_kernels"]
ALL_PROGRAMS = SINGLE_LANE + ["test_simd_lanes"]
LANES = {name: 32 if name == "test_simd_lanes" else 1 for name in ALL_PROGRAMS}

# (program, extra defines)
CPU_RUNS = [(name, ()) for name in SINGLE_LANE] + [
    ("test_math", ("KK_MATH_FAST", "KK_PORTABLE_BITS")),  # fast names; the plain C++ bit functions
]
# The programs that exercise the target interface (atomics, SIMD-group, barriers).
# (test_simd_lanes is built against it too, to run on fibers: see below.)
CPU_TARGET_BUILDS = [(name, ("KK_TARGET_CPU", "KK_MATH_FAST")) for name in ("test_sync", "test_kernels")]
# Both math modes (test_math calls precise:: and fast:: explicitly in either).
CUDA_BUILDS = [(name, ("KK_MATH_FAST",)) for name in ALL_PROGRAMS] + [("test_types", ("KK_MATH_SAFE",))]

GXX = shutil.which("g++")
RUNTIME = INCLUDE / "kernelkit" / "cpu_runtime.cpp"
HAVE_CPU_TARGET = (INCLUDE / "kernelkit" / "target_cpu.h").exists()


def _id(build):
    name, defines = build
    return "-".join([name, *defines]) if defines else name


# ---------------------------------------------------------------------------
# Builders (run on the pool).


def _gxx(name, defines, out_dir, syntax_only):
    cmd = [GXX, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", f"-I{INCLUDE}", f"-I{HERE}"]
    cmd += [f"-D{d}=1" for d in defines]
    cmd.append(str(HERE / f"{name}.cpp"))
    exe = out_dir / ("_".join([name, *defines]) or name)
    cmd += ["-fsyntax-only"] if syntax_only else ["-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or syntax_only:
        return proc.returncode, proc.stdout + proc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    return run.returncode, proc.stderr + run.stdout + run.stderr


def _gxx_fibers(name, out_dir):
    """name.cpp against the real CPU target, run by 32 fibers of the CPU runtime."""
    exe = out_dir / f"{name}_fibers"
    cmd = [GXX, "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", f"-I{INCLUDE}", f"-I{HERE}",
           "-DKK_TARGET_CPU=1", "-DKK_MATH_FAST=1", str(HERE / f"{name}.cpp"), str(HERE / "fiber_driver.cpp"),
           str(RUNTIME), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return proc.returncode, proc.stdout + proc.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    return run.returncode, run.stdout + run.stderr


def _nvrtc(name, defines, arch):
    from cuda.bindings import nvrtc

    src = (HERE / f"{name}.cpp").read_bytes()
    err, prog = nvrtc.nvrtcCreateProgram(src, f"{name}.cpp".encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS
    try:
        # -default-device: helper functions in user headers carry no __device__.
        opts = [b"-std=c++17", f"-arch={arch}".encode(), b"-default-device", f"-I{INCLUDE}".encode(),
                f"-I{HERE}".encode(), b"-DKK_TARGET_CUDA=1"] + [f"-D{d}=1".encode() for d in defines]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, log)
        log = log.rstrip(b"\0 ").decode(errors="replace")
        cubin = None
        if res == nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetCUBINSize(prog)
            cubin = b" " * size
            nvrtc.nvrtcGetCUBIN(prog, cubin)
        return cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _have_nvrtc():
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError:
        return False
    return True


def _gpu_arch():
    """sm_XY of CUDA device 0, or None without a usable GPU."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
    except Exception:  # no bindings, or no driver library on this machine
        return None
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS or count == 0:
        return None
    attr = driver.CUdevice_attribute
    _, major = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0)
    _, minor = driver.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0)
    return f"sm_{major}{minor}"


@pytest.fixture(scope="session")
def builds(tmp_path_factory):
    """Every build of this file, started together; maps a key to a future."""
    out_dir = tmp_path_factory.mktemp("prelude")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2))
    jobs = {}  # the longest first
    if GXX and HAVE_CPU_TARGET and RUNTIME.exists():
        jobs["fibers"] = pool.submit(_gxx_fibers, "test_simd_lanes", out_dir)
    if _have_nvrtc():
        for name, defines in CUDA_BUILDS:
            jobs["cuda", name, defines] = pool.submit(_nvrtc, name, defines, "sm_90")
        arch = _gpu_arch()
        if arch:
            for name in ALL_PROGRAMS:
                jobs["gpu", name] = pool.submit(_nvrtc, name, ("KK_MATH_FAST",), arch)
    if GXX:
        for name, defines in CPU_RUNS:
            jobs["cpu", name, defines] = pool.submit(_gxx, name, defines, out_dir, False)
        if HAVE_CPU_TARGET:
            for name, defines in CPU_TARGET_BUILDS:
                jobs["cpu_target", name, defines] = pool.submit(_gxx, name, defines, out_dir, True)
    yield jobs
    pool.shutdown(wait=True)


# ---------------------------------------------------------------------------
# Tests.


@pytest.mark.skipif(GXX is None, reason="g++ not found")
@pytest.mark.parametrize("build", CPU_RUNS, ids=_id)
def test_cpu_single_lane(builds, build):
    name, defines = build
    rc, output = builds["cpu", name, defines].result()
    assert rc == 0, output
    assert " 0 failed" in output, output


@pytest.mark.skipif(GXX is None, reason="g++ not found")
@pytest.mark.skipif(not HAVE_CPU_TARGET, reason="no CPU target yet")
@pytest.mark.parametrize("build", CPU_TARGET_BUILDS, ids=_id)
def test_cpu_target_compiles(builds, build):
    name, defines = build
    rc, output = builds["cpu_target", name, defines].result()
    assert rc == 0, output


@pytest.mark.skipif(GXX is None, reason="g++ not found")
@pytest.mark.skipif(not (HAVE_CPU_TARGET and RUNTIME.exists()), reason="no CPU runtime yet")
def test_cpu_fibers_simd_lanes(builds):
    """The SIMD-group functions on 32 lanes of the CPU runtime (divergent parts are GPU-only)."""
    rc, output = builds["fibers"].result()
    assert rc == 0, output
    assert " 0 failed" in output, output


@pytest.mark.skipif(not _have_nvrtc(), reason="cuda-bindings (NVRTC) not installed")
@pytest.mark.parametrize("build", CUDA_BUILDS, ids=_id)
def test_nvrtc_compiles_sm90(builds, build):
    name, defines = build
    cubin, log = builds["cuda", name, defines].result()
    assert cubin, log
    assert "warning" not in log.lower(), log


@pytest.mark.parametrize("name", ALL_PROGRAMS)
def test_gpu_runs(builds, name):
    if ("gpu", name) not in builds:
        pytest.skip("no CUDA GPU")
    from cuda.bindings import driver

    cubin, log = builds["gpu", name].result()
    assert cubin, log

    def check(result):
        err, *values = result if isinstance(result, tuple) else (result,)
        assert err == driver.CUresult.CUDA_SUCCESS, err
        return values[0] if len(values) == 1 else values

    dev = check(driver.cuDeviceGet(0))
    ctx = check(driver.cuDevicePrimaryCtxRetain(dev))
    check(driver.cuCtxPushCurrent(ctx))
    try:
        module = check(driver.cuModuleLoadData(cubin))
        kernel = check(driver.cuModuleGetFunction(module, b"kk_test_kernel"))
        counts = check(driver.cuMemAlloc(8))
        check(driver.cuMemsetD32(counts, 0, 2))
        import ctypes

        arg = ctypes.c_uint64(int(counts))
        params = (ctypes.c_void_p * 1)(ctypes.addressof(arg))
        check(driver.cuLaunchKernel(kernel, 1, 1, 1, 32, 1, 1, 0, 0, ctypes.addressof(params), 0))
        check(driver.cuCtxSynchronize())
        host = (ctypes.c_int * 2)()
        check(driver.cuMemcpyDtoH(ctypes.addressof(host), counts, 8))
        check(driver.cuMemFree(counts))
        check(driver.cuModuleUnload(module))
    finally:
        driver.cuCtxPopCurrent()
        driver.cuDevicePrimaryCtxRelease(dev)
    checks, failures = host[0], host[1]
    assert checks > 0 and failures == 0, f"{name}: {failures} of {checks} checks failed (device printf shows which)"

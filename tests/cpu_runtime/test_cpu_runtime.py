"""The CPU runtime (libkkrt, cpu_runtime.cpp) and its headers, tested without
the Python pipeline: C++ test programs that include the headers directly
(rt_tests.cpp) and kernel libraries driven through ctypes (ctypes_driver.py).

Everything is built once per module with the system g++ into a temporary
directory; building takes a few seconds, the tests a few more.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
INCLUDE = HERE.parents[1] / "src" / "kernelkit" / "include"
RUNTIME = INCLUDE / "kernelkit" / "cpu_runtime.cpp"
CXX = os.environ.get("CXX", "g++")
FLAGS = ["-std=c++17", "-O2", "-pthread", "-Wall", "-Wextra", "-Werror"]
# What the CPU backend is expected to use for the runtime and for kernel libraries.
RUNTIME_FLAGS = [*FLAGS, "-fPIC", "-shared"]
KERNEL_FLAGS = [*FLAGS, "-fPIC", "-shared", "-fvisibility=hidden", "-I", str(INCLUDE)]

pytestmark = pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX})")


def _has_f16c():
    try:
        return " f16c" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


HAS_F16C = _has_f16c()


def _compile(argv):
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if proc.returncode:
        raise AssertionError(f"compile failed: {' '.join(map(str, argv))}\n{proc.stderr}")
    return proc.stderr


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpu_runtime")
    (d / "rt").mkdir()
    (d / "uc").mkdir()
    kernel = HERE / "kernel_lib.cpp"
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        runtimes = [
            pool.submit(_compile, [CXX, *RUNTIME_FLAGS, RUNTIME, "-o", d / "rt" / "libkkrt.so"]),
            pool.submit(
                _compile,
                [CXX, *RUNTIME_FLAGS, "-DKK_RT_UCONTEXT", RUNTIME, "-o", d / "uc" / "libkkrt.so"],
            ),
        ]
        others = [
            pool.submit(_compile, [CXX, *KERNEL_FLAGS, "-DSYNC=0", kernel, "-o", d / "k0.so"]),
            pool.submit(_compile, [CXX, *KERNEL_FLAGS, "-DSYNC=1", kernel, "-o", d / "k1.so"]),
            pool.submit(
                _compile,
                [CXX, *KERNEL_FLAGS, "-DSYNC=1", "-DTG_FLOATS=64", kernel, "-o", d / "k1_tg64.so"],
            ),
            pool.submit(_compile, [CXX, *KERNEL_FLAGS, "-DSYNC=2", kernel, "-o", d / "k2.so"]),
        ]
        runtimes[0].result()  # the test programs link against it
        tests = [
            pool.submit(
                _compile,
                [CXX, *FLAGS, "-I", INCLUDE, HERE / "rt_tests.cpp", "-L", d / "rt", "-lkkrt",
                 "-o", d / "rt_tests"],
            )
        ]
        if HAS_F16C:  # the same tests with the F16C conversions
            tests.append(pool.submit(
                _compile,
                [CXX, *FLAGS, "-mf16c", "-I", INCLUDE, HERE / "rt_tests.cpp", "-L", d / "rt",
                 "-lkkrt", "-o", d / "rt_tests_f16c"],
            ))
        for f in [*runtimes, *others, *tests]:
            f.result()
    return d


def _run(argv, libdir, timeout=60):
    env = dict(os.environ, LD_LIBRARY_PATH=str(libdir))
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env,
                          timeout=timeout)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


RT_TESTS = ["reduce", "simd", "edge", "early_return", "registers", "fenv", "divergent",
            "deadlock", "fail", "atomics", "half", "concurrent", "segv"]


@pytest.mark.parametrize("name", RT_TESTS)
def test_runtime(build, name):
    out = _run([build / "rt_tests", name], build / "rt")
    assert f"ok {name}" in out


@pytest.mark.skipif(not HAS_F16C, reason="no F16C")
def test_half_f16c(build):
    out = _run([build / "rt_tests_f16c", "half"], build / "rt")
    assert "half: F16C" in out and "ok half" in out


def test_ucontext_fallback(build):
    """The portable switch (other architectures) behaves the same."""
    names = ["simd", "edge", "early_return", "registers", "fenv", "divergent", "deadlock", "fail",
             "segv"]
    out = _run([build / "rt_tests", *names], build / "uc")
    for name in names:
        assert f"ok {name}" in out


def test_error_text(build):
    out = _run([build / "rt_tests", "deadlock"], build / "rt")
    assert re.search(
        r"kernel 'deadlock': threadgroup_barrier at \S+:\d+ in threadgroup \(0,0,0\) cannot "
        r"complete: threads 0-127 wait there while threads 128-255 wait at threadgroup_barrier "
        r"at \S+:\d+", out), out


def _run_expecting_segv(argv, libdir, env=None):
    env = dict(os.environ, LD_LIBRARY_PATH=str(libdir), **(env or {}))
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env,
                          timeout=60)
    print(proc.stdout, proc.stderr)
    assert "faulting outside a kernel" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == -signal.SIGSEGV, (proc.returncode, proc.stdout + proc.stderr)
    return proc


def test_segv_outside_kernel_still_crashes(build):
    """The runtime's SIGSEGV handler passes faults outside kernels on: default action."""
    _run_expecting_segv([build / "rt_tests", "segv_outside"], build / "rt")


def test_segv_outside_kernel_reaches_faulthandler(build):
    """... or Python's faulthandler, installed before the runtime's handler."""
    pytest.importorskip("numpy")
    proc = _run_expecting_segv([sys.executable, HERE / "ctypes_driver.py", build, "segv_outside"],
                               build / "rt")
    assert "Fatal Python error: Segmentation fault" in proc.stderr, proc.stderr


def test_bench(build):
    """Prints the fiber switch cost and the launch overhead (run pytest -s to see)."""
    out = _run([build / "rt_tests", "bench"], build / "rt")
    per_switch = [float(x) for x in re.findall(r"([\d.]+) ns per thread per barrier", out)]
    overhead = [float(x) for x in re.findall(r"([\d.]+) us per launch", out)]
    assert per_switch and overhead, out
    assert max(per_switch) < 1000, out  # tens of ns; generous for loaded CI machines
    assert overhead[0] < 50, out


@pytest.mark.parametrize("check", ["loop", "fiber", "entry", "errors", "threads",
                                   "separate_tg_memory", "segv"])
def test_ctypes(build, check):
    pytest.importorskip("numpy")
    out = _run([sys.executable, HERE / "ctypes_driver.py", build, check], build / "rt")
    assert f"ok {check}" in out


def test_kernel_exports(build):
    """Kernel libraries export only the entry points (threadgroup memory stays
    private to its library: no STB_GNU_UNIQUE TLS shared between libraries)."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm")
    for lib, want in [("k0.so", {"kk_group", "kk_launch"}),
                      ("k1.so", {"kk_group", "kk_launch", "kk_thread"}),
                      ("k2.so", {"kk_group", "kk_launch", "kk_thread"})]:
        proc = subprocess.run([nm, "-D", "--defined-only", build / lib], capture_output=True,
                              text=True, check=True)
        names = {line.split()[-1] for line in proc.stdout.splitlines() if line.strip()}
        assert names == want, proc.stdout


@pytest.mark.parametrize("entry", ["KK_CPU_KERNEL(kk_args, body, 0)",
                                   "KK_CPU_ENTRY(kk_args, body)"])
def test_loop_mode_vectorizes(tmp_path, entry):
    """The loop-mode template lets g++ vectorise a simple barrier-free body."""
    src = tmp_path / "vec.cpp"
    src.write_text(
        "#include <kernelkit/target_cpu.h>\n#include <kernelkit/cpu_group.h>\n"
        "struct kk_args { const float* inp; float* out; };\n"
        "static inline void body(const kk_args& a, const kk_thread_ctx& t) {\n"
        "  const unsigned gid = t.gid.x * t.tg_dispatch.x + t.tid.x;\n"
        "  a.out[gid] = a.inp[gid] * 2.0f + 1.0f;\n}\n"
        f"{entry}\n")
    log = _compile([CXX, *KERNEL_FLAGS, "-O3", "-fopt-info-vec-optimized", src,
                    "-o", tmp_path / "vec.so"])
    assert "loop vectorized" in log, log

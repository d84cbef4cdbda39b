"""Drives kernel libraries through ctypes the way the CPU backend will.

Run by test_cpu_runtime.py in a subprocess (so that this libkkrt, loaded with
RTLD_GLOBAL, never meets the backend's own in the test process):

    python ctypes_driver.py BUILD_DIR CHECK

BUILD_DIR holds rt/libkkrt.so and the kernel libraries built from
kernel_lib.cpp: k0.so (loop mode, y = 2x + 1), k1.so (fiber mode, per-group
sums), k1_tg64.so (the same kernel with a bigger threadgroup array) and k2.so
(KK_CPU_ENTRY, as codegen.py emits: both, picked by the descriptor's uses_sync).
"""

import ctypes
import sys
import threading
import time
from pathlib import Path

import numpy as np


class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class LaunchDesc(ctypes.Structure):  # kk_launch_desc (launch.h)
    _fields_ = [
        ("grid", Dim3),
        ("group", Dim3),
        ("num_groups", Dim3),
        ("uses_sync", ctypes.c_int),
        ("kernel_name", ctypes.c_char_p),
    ]


class Args(ctypes.Structure):  # kk_args of kernel_lib.cpp
    _fields_ = [("inp", ctypes.c_void_p), ("out", ctypes.c_void_p), ("n", ctypes.c_uint)]


BUILD = Path(sys.argv[1])
# The runtime first, RTLD_GLOBAL: kernel libraries resolve kk_rt_* against it.
RT = ctypes.CDLL(str(BUILD / "rt" / "libkkrt.so"), mode=ctypes.RTLD_GLOBAL)


def load(name):
    lib = ctypes.CDLL(str(BUILD / name))  # RTLD_LOCAL
    lib.kk_launch.argtypes = [
        ctypes.c_void_p,
        ctypes.POINTER(LaunchDesc),
        ctypes.c_char_p,
        ctypes.c_size_t,
    ]
    lib.kk_launch.restype = ctypes.c_int
    return lib


def launch(lib, inp, out, grid, group, sync, name=b"k", num_groups=None):
    """Returns None, or the error text."""
    n = grid
    ng = num_groups if num_groups is not None else (-(-grid // group))
    desc = LaunchDesc(Dim3(grid, 1, 1), Dim3(group, 1, 1), Dim3(ng, 1, 1), sync, name)
    args = Args(inp.ctypes.data, out.ctypes.data, n)
    err = ctypes.create_string_buffer(1024)
    rc = lib.kk_launch(ctypes.byref(args), ctypes.byref(desc), err, len(err))
    return err.value.decode() if rc else None


def group_sums(x, group):
    pad = -len(x) % group
    return np.concatenate([x, np.zeros(pad, x.dtype)]).reshape(-1, group).sum(1)


def check_loop():
    k0 = load("k0.so")
    x = np.random.default_rng(0).standard_normal(100_003).astype(np.float32)
    y = np.full_like(x, np.nan)
    assert launch(k0, x, y, len(x), 256, 0) is None
    np.testing.assert_array_equal(y, x * 2 + 1)
    # per-call cost of a 32-thread kernel, ctypes included
    x32, y32 = x[:32].copy(), y[:32].copy()
    for _ in range(1000):
        launch(k0, x32, y32, 32, 32, 0)
    reps = 20000
    t0 = time.perf_counter()
    for _ in range(reps):
        launch(k0, x32, y32, 32, 32, 0)
    dt = time.perf_counter() - t0
    print(f"launch through ctypes, 32-thread loop-mode kernel: {dt / reps * 1e6:.2f} us per call")


def check_fiber():
    k1 = load("k1.so")
    rng = np.random.default_rng(1)
    for n, group in [(1, 1), (31, 32), (1000, 256), (4096, 1024), (70_001, 128)]:
        x = rng.integers(-100, 100, n).astype(np.float32)  # exact sums
        out = np.full(-(-n // group), np.nan, np.float32)
        assert launch(k1, x, out, n, group, 1) is None
        np.testing.assert_array_equal(out, group_sums(x, group))


def check_entry():
    k2 = load("k2.so")
    x = np.random.default_rng(2).integers(-9, 9, 5000).astype(np.float32)
    y = np.zeros_like(x)
    assert launch(k2, x, y, len(x), 128, 0) is None
    np.testing.assert_array_equal(y, x * 2 + 1)
    out = np.zeros(-(-len(x) // 128), np.float32)
    assert launch(k2, x, out, len(x), 128, 1) is None
    np.testing.assert_array_equal(out, group_sums(x, 128))


def check_errors():
    k1 = load("k1.so")
    x = np.ones(4096, np.float32)
    out = np.zeros(4, np.float32)
    e = launch(k1, x, out, 4096, 2048, 1, name=b"huge")
    assert e is not None and "kernel 'huge'" in e and "exceeds the maximum of 1024" in e, e
    e = launch(k1, x, out, 4096, 1024, 1, name=b"bad", num_groups=3)
    assert e is not None and "num_groups" in e, e
    assert launch(k1, x, out, 4096, 1024, 1) is None
    np.testing.assert_array_equal(out, [1024] * 4)


def check_threads():
    """Python threads launch at once: ctypes releases the GIL, the pool is shared."""
    k0, k1 = load("k0.so"), load("k1.so")
    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        try:
            for _ in range(20):
                n = int(rng.integers(1, 50_000))
                x = rng.integers(-50, 50, n).astype(np.float32)
                out = np.zeros(-(-n // 256), np.float32)
                assert launch(k1, x, out, n, 256, 1) is None
                np.testing.assert_array_equal(out, group_sums(x, 256))
                y = np.zeros_like(x)
                assert launch(k0, x, y, n, 64, 0) is None
                np.testing.assert_array_equal(y, x * 2 + 1)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def check_separate_threadgroup_memory():
    """Two libraries with the same kernel (same mangled names), different
    threadgroup arrays: each keeps its own storage (-fvisibility=hidden)."""
    a, b = load("k1.so"), load("k1_tg64.so")
    x = np.arange(64 * 1024, dtype=np.float32) % 7
    for lib in (a, b, a, b):
        out = np.zeros(64, np.float32)
        assert launch(lib, x, out, len(x), 1024, 1) is None
        np.testing.assert_array_equal(out, group_sums(x, 1024))


def check_segv():
    """A kernel reading an invalid address fails its launch; Python lives on."""
    k0, k1 = load("k0.so"), load("k1.so")
    x = np.ones(4096, np.float32)
    y = np.zeros_like(x)
    # 16 groups over the pool: whichever participant faults first reports.
    for lib, sync, where in [(k0, 0, "(SIGSEGV) in thread (0,0,0) of threadgroup ("),
                             (k1, 1, "(SIGSEGV) in thread (0,0,0) of threadgroup (")]:
        desc = LaunchDesc(Dim3(4096, 1, 1), Dim3(256, 1, 1), Dim3(16, 1, 1), sync, b"wild")
        args = Args(0x10, y.ctypes.data, 4096)  # inp: an invalid address
        err = ctypes.create_string_buffer(1024)
        assert lib.kk_launch(ctypes.byref(args), ctypes.byref(desc), err, len(err)) != 0
        e = err.value.decode()
        assert e.startswith("kernel 'wild': invalid memory access at address 0x") and where in e \
            and "(SIGSEGV)" in e and "out-of-bounds index is the usual cause" in e, e
    assert launch(k0, x, y, len(x), 256, 0) is None
    np.testing.assert_array_equal(y, x * 2 + 1)


def check_segv_outside():
    """With faulthandler on, a fault outside any kernel goes to it (after a launch
    installed the runtime's handlers), and the process dies of SIGSEGV."""
    import faulthandler
    faulthandler.enable()
    check_segv()
    print("faulting outside a kernel", flush=True)
    ctypes.string_at(0x10, 4)


CHECKS = {
    "loop": check_loop,
    "fiber": check_fiber,
    "entry": check_entry,
    "errors": check_errors,
    "threads": check_threads,
    "separate_tg_memory": check_separate_threadgroup_memory,
    "segv": check_segv,
    "segv_outside": check_segv_outside,
}

if __name__ == "__main__":
    assert RT.kk_rt_abi_version() == 2
    CHECKS[sys.argv[2]]()
    print("ok", sys.argv[2])

"""The CPU backend under kernels that misbehave (issue 15): arithmetic faults, traps, aborts and
wild accesses become a KernelLaunchError naming the kernel and the thread, and the next call
works; a kernel cannot exit the process; fiber stacks fit kernels with large local arrays; and
timeout= never fires early, however many OS threads share the launch.

Checks that need a fresh runtime (its thread count, stack size) run in a subprocess.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import kernelkit as kk

CPU = torch.device("cpu")


def run_python(code: str, timeout=240, **env) -> subprocess.CompletedProcess:
    """Runs code in a fresh interpreter (a fresh CPU runtime) with env added."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **env})
    return proc


# --- timeout= on many OS threads ---------------------------------------------------------------

@pytest.mark.slow
def test_timeout_never_fires_early_with_many_threads():
    """Finding 12: with 64 workers on 2 cores, a worker could read the clock before another that
    set the launch's start later; the unsigned difference wrapped and timeout=10 fired at once."""
    proc = run_python("""
        import torch, kernelkit as kk
        body = '''
            uint i = thread_position_in_grid.x;
            float acc = 0.0f;
            for (uint k = 0; k < 64; ++k) acc += inp[(i + k) % n];
            out[i] = acc;
        '''
        k = kk.metal_kernel(name="timeout_race", input_names=["inp", "n"], output_names=["out"],
                            source=body)
        n = 8192
        x = torch.randint(-4, 5, (n,)).float()
        ref = sum(torch.roll(x, -s) for s in range(64))
        for _ in range(600):
            out = k(inputs=[x, n], grid=(n, 1, 1), threadgroup=(64, 1, 1), output_shapes=[(n,)],
                    output_dtypes=[torch.float32], timeout=10.0)[0]
        assert torch.equal(out, ref)
        print("ok")
    """, KERNELKIT_NUM_THREADS="64")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


# --- faults become KernelLaunchError -----------------------------------------------------------

def run(k, inputs, n, group=8, **kw):
    return k(inputs=inputs, grid=(n, 1, 1), threadgroup=(group, 1, 1), output_shapes=[(n,)],
             output_dtypes=[torch.int32], stream=CPU, **kw)[0]


CHECKS = [{}, {"check_bounds": True}, {"timeout": 5.0}]
SYNC = ["", "threadgroup_barrier(mem_flags::mem_threadgroup);"]  # loop mode, fibers


def thread_of(message):
    """The thread a fault message names: (thread x, threadgroup x, grid x)."""
    m = re.search(r"in thread \((\d+),0,0\) of threadgroup \((\d+),0,0\), grid position "
                  r"\((\d+),0,0\)", message)
    assert m, message
    return tuple(int(g) for g in m.groups())


def works_after(k, inputs, n, ref):
    assert run(k, inputs, n).tolist() == ref


def divide(name: str, sync: str):
    """out = 100 / inp, elementwise (a SIGFPE where inp is 0)."""
    return kk.metal_kernel(name=name, input_names=["inp"], output_names=["out"], source=f"""
        uint i = thread_position_in_grid.x;
        {sync}
        out[i] = 100 / inp[i];
    """)


@pytest.mark.parametrize("checks", CHECKS, ids=["plain", "check_bounds", "timeout"])
@pytest.mark.parametrize("sync", SYNC, ids=["loop", "fibers"])
def test_integer_division_by_zero(checks, sync):
    k = divide("div_zero", sync)
    n = 64
    x = torch.randint(1, 50, (n,), dtype=torch.int32)
    bad = int(torch.randint(0, n, ()))
    x[bad] = 0
    with pytest.raises(kk.KernelLaunchError) as e:
        run(k, [x], n, **checks)
    msg = str(e.value)
    assert "kernel 'div_zero'" in msg and "integer division by zero" in msg and "SIGFPE" in msg
    assert thread_of(msg) == (bad % 8, bad // 8, bad)
    x[bad] = 7
    works_after(k, [x], n, [100 // v for v in x.tolist()])


@pytest.mark.parametrize("sync", SYNC, ids=["loop", "fibers"])
def test_a_fault_on_the_fast_path_is_a_launch_error(sync):
    """A plain call repeated runs on its plan (fastcall.cpp calls the library without the GIL):
    a fault there is the same KernelLaunchError, and the next call works."""
    from kernelkit import fastcall
    if isinstance(fastcall.module(), str):  # (plans wait for the extension: have it now)
        pytest.skip("no fastcall extension here")
    k = divide("div_zero_plan", sync)
    n = 32
    x = torch.randint(1, 50, (n,), dtype=torch.int32)

    def call():
        return k(inputs=[x], grid=(n, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(n,)],
                 output_dtypes=[torch.int32])[0]
    for _ in range(3):  # by the third, a plan
        assert call().tolist() == [100 // v for v in x.tolist()]
    assert k._plans
    x[13] = 0
    with pytest.raises(kk.KernelLaunchError) as e:
        call()
    assert "kernel 'div_zero_plan'" in str(e.value) and "SIGFPE" in str(e.value)
    assert thread_of(str(e.value)) == (5, 1, 13)
    x[13] = 4
    assert call().tolist() == [100 // v for v in x.tolist()]


@pytest.mark.parametrize("sync", SYNC, ids=["loop", "fibers"])
def test_int_min_divided_by_minus_one(sync):
    k = kk.metal_kernel(name="div_overflow", input_names=["a", "b"], output_names=["out"],
                        source=f"""
        uint i = thread_position_in_grid.x;
        {sync}
        out[i] = a[i] / b[i];
    """)
    n = 40
    a = torch.randint(-1000, 1000, (n,), dtype=torch.int32)
    b = torch.randint(1, 9, (n,), dtype=torch.int32)
    a[29], b[29] = -2**31, -1
    with pytest.raises(kk.KernelLaunchError, match="overflowing one such as INT_MIN / -1") as e:
        run(k, [a, b], n)
    assert thread_of(str(e.value)) == (5, 3, 29)
    b[29] = 1
    works_after(k, [a, b], n, [int(x / y) for x, y in zip(a.tolist(), b.tolist())])


@pytest.mark.parametrize("checks", CHECKS, ids=["plain", "check_bounds", "timeout"])
@pytest.mark.parametrize("sync", SYNC, ids=["loop", "fibers"])
def test_trap_is_a_launch_error(checks, sync):
    """g++ puts a trap where it proves undefined behaviour (here a division by zero), as at
    __builtin_trap(): SIGILL on x86-64, SIGTRAP on aarch64."""
    k = kk.metal_kernel(name="trap", input_names=["inp"], output_names=["out"], source=f"""
        uint i = thread_position_in_grid.x;
        int zero = 0;
        {sync}
        out[i] = inp[i] < 0 ? inp[i] / zero : inp[i];
    """)
    n = 32
    x = torch.randint(0, 50, (n,), dtype=torch.int32)
    x[19] = -1
    with pytest.raises(kk.KernelLaunchError, match=r"kernel 'trap': (illegal instruction \(SIGILL\)"
                                                   r"|trap \(SIGTRAP\))") as e:
        run(k, [x], n, **checks)
    assert thread_of(str(e.value)) == (3, 2, 19)
    x[19] = 1
    works_after(k, [x], n, x.tolist())


ASSERT_HEADER = """
#if defined(KK_TARGET_CPU)
#include <assert.h>
#else
#define assert(c) ((void)0)  // (the test compiles every kernel for sm_90 too)
#endif
"""


@pytest.mark.parametrize("sync", SYNC, ids=["loop", "fibers"])
def test_failed_assert_is_a_launch_error(sync):
    """assert() aborts inside the C library: the runtime takes the SIGABRT of a kernel thread."""
    k = kk.metal_kernel(name="asserts", input_names=["inp"], output_names=["out"],
                        header=ASSERT_HEADER, source=f"""
        uint i = thread_position_in_grid.x;
        {sync}
        assert(inp[i] >= 0);
        out[i] = inp[i];
    """)
    n = 16
    x = torch.arange(n, dtype=torch.int32)
    x[11] = -5
    with pytest.raises(kk.KernelLaunchError, match=r"kernel 'asserts': abort\(\) was called "
                                                   r"\(SIGABRT\)") as e:
        run(k, [x], n)
    assert thread_of(str(e.value)) == (3, 1, 11)
    x[11] = 11
    works_after(k, [x], n, x.tolist())


@pytest.mark.parametrize("checks", CHECKS, ids=["plain", "check_bounds", "timeout"])
def test_wild_pointer_is_a_launch_error(checks):
    """A pointer that is no buffer is not checked by check_bounds: its fault is still caught."""
    k = kk.metal_kernel(name="wild_ptr", input_names=["inp"], output_names=["out"], source="""
        uint i = thread_position_in_grid.x;
        device const int* p = (device const int*)(size_t(inp[i]) * 4096u);
        out[i] = inp[i] ? p[0] : 0;
    """)
    n = 24
    x = torch.zeros(n, dtype=torch.int32)
    x[21] = 1  # reads address 4096: never mapped
    with pytest.raises(kk.KernelLaunchError, match=r"invalid memory access at address 0x1000 "
                                                   r"\(SIGSEGV\)") as e:
        run(k, [x], n, **checks)
    assert thread_of(str(e.value)) == (5, 2, 21)
    works_after(k, [torch.zeros(n, dtype=torch.int32)], n, [0] * n)


def test_misaligned_vector_access_is_a_launch_error_that_says_so():
    """A float4 stored through a pointer 4 bytes off its 16-byte alignment (UB in Metal, a fault on
    a GPU): on x86 a general-protection fault, which reports no address; the error names the
    misalignment rather than an address 0x0."""
    k = kk.metal_kernel(name="misaligned_float4", input_names=["inp"], output_names=["out"], source="""
        uint i = thread_position_in_grid.x;
        *(device float4*)(out + 1 + 4 * i) = ((const device float4*)(inp + 1 + 4 * i))[0] * 2.0f;
    """)
    x = torch.randn(68)
    with pytest.raises(kk.KernelLaunchError, match=r"kernel 'misaligned_float4': invalid memory access "
                                                   r"\(SIG(SEGV|BUS), a (general-protection fault|misaligned)"
                                                   r".*not aligned to the vector's size"):
        k(inputs=[x], grid=(16, 1, 1), threadgroup=(16, 1, 1), output_shapes=[(68,)],
          output_dtypes=[torch.float32])


def test_bus_error_is_a_launch_error(tmp_path):
    """An input mapped from a file that was truncated under it: SIGBUS."""
    import mmap
    import numpy as np
    path = tmp_path / "data"
    path.write_bytes(bytes(2 * mmap.PAGESIZE))
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 2 * mmap.PAGESIZE)
    x = torch.from_numpy(np.frombuffer(m, dtype=np.int32))
    os.truncate(path, 0)
    k = kk.metal_kernel(name="bus", input_names=["inp"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i * 1024u];")
    with pytest.raises(kk.KernelLaunchError, match=r"kernel 'bus': invalid memory access at "
                                                   r"address 0x[0-9a-f]+ \(SIGBUS\)"):
        run(k, [x], 2, group=1)
    del x
    works_after(k, [torch.arange(2048, dtype=torch.int32)], 2, [0, 1024])


# --- a kernel cannot end the process -----------------------------------------------------------

@pytest.mark.parametrize("call", ["exit(0)", "exit(3)", "_Exit(0)", "quick_exit(0)",
                                  "abort()", "_exit(0)"])
def test_exit_in_a_kernel_is_a_compile_error(call):
    k = kk.metal_kernel(name="exits", input_names=["inp"], output_names=["out"], source=f"""
        uint i = thread_position_in_grid.x;
        if (inp[i] == 42) {call};
        out[i] = inp[i];
    """)
    with pytest.raises(kk.CompileError, match="a kernel cannot end the process"):
        run(k, [torch.zeros(8, dtype=torch.int32)], 8)


def test_a_process_whose_kernel_calls_exit_fails():
    """The process that calls a kernel with exit() fails loudly: it does not end with status 0."""
    proc = run_python("""
        import torch, kernelkit as kk
        k = kk.metal_kernel(name="exits_sub", input_names=["inp"], output_names=["out"],
                            source="exit(0);")
        k(inputs=[torch.zeros(4)], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
          output_dtypes=[torch.float32])
    """)
    assert proc.returncode == 1 and "CompileError" in proc.stderr, proc.stderr


# --- stacks: large local arrays ----------------------------------------------------------------

BIG_LOCALS = """
    uint i = thread_position_in_grid.x;
    int buf[262144];                      // 1 MiB per thread (a GPU keeps it in local memory)
    for (uint k = i % 1024u; k < 262144u; k += 1024u) buf[k] = inp[(i + k) % n];   // every page
    {sync}
    int s = 0;
    for (uint k = i % 1024u; k < 262144u; k += 4096u) s += buf[(uint(inp[k % n]) * 1024u + k) % 262144u];
    out[i] = s;
"""


def big_locals_reference(x, threads):
    n, xs = len(x), x.tolist()
    return [sum(xs[(i + (xs[k % n] * 1024 + k) % 262144) % n] for k in range(i % 1024, 262144, 4096))
            for i in range(threads)]


def big_locals_kernel(sync):
    return kk.metal_kernel(name="big_locals" + ("_sync" if sync else ""),
                           input_names=["inp", "n"], output_names=["out"],
                           source=BIG_LOCALS.replace("{sync}", sync))


@pytest.mark.parametrize("sync", SYNC, ids=["loop", "fibers"])
def test_one_mib_of_locals_per_thread(sync):
    """Finding 13: fiber stacks were 256 KiB; a thread's stack now fits what a GPU thread keeps
    in local memory (CUDA allows 512 KiB), in both modes, on every worker."""
    k = big_locals_kernel(sync)
    x = torch.randint(0, 1000, (97,), dtype=torch.int32)
    threads = 512 if sync else 4096  # enough for the launch to use the pool's workers too
    out = k(inputs=[x, 97], grid=(threads, 1, 1), threadgroup=(32, 1, 1),
            output_shapes=[(threads,)], output_dtypes=[torch.int32], stream=CPU)[0]
    assert out.tolist() == big_locals_reference(x, threads)


@pytest.mark.slow
def test_stack_size_from_the_environment():
    """KERNELKIT_CPU_STACK_SIZE sets every kernel thread's stack: too small a stack is a clear
    error (the next call works), and a value that is no size is one too."""
    proc = run_python(f"""
        import torch, kernelkit as kk
        BIG_LOCALS = {BIG_LOCALS!r}
        x = torch.randint(0, 1000, (97,), dtype=torch.int32)
        for sync in {SYNC!r}:
            k = kk.metal_kernel(name="big_locals" + ("_sync" if sync else ""),
                                input_names=["inp", "n"], output_names=["out"],
                                source=BIG_LOCALS.replace("{{sync}}", sync))
            try:
                k(inputs=[x, 97], grid=(64, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(64,)],
                  output_dtypes=[torch.int32])
            except kk.KernelLaunchError as e:
                print("ERROR", e)
            small = kk.metal_kernel(name="small", input_names=["a"], output_names=["b"],
                                    source="b[thread_position_in_grid.x] = a[thread_position_in_grid.x] + 1;")
            assert small(inputs=[x], grid=(97, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(97,)],
                         output_dtypes=[torch.int32])[0].tolist() == (x + 1).tolist()
    """, KERNELKIT_CPU_STACK_SIZE="256K")
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR")]
    assert proc.returncode == 0 and len(errors) == 2, proc.stdout + proc.stderr
    for e in errors:
        assert re.search(r"kernel 'big_locals(_sync)?': stack overflow \(invalid memory access at "
                         r"address 0x[0-9a-f]+ in the guard page of the thread's 256 KiB stack, "
                         r"SIGSEGV\) in thread \(0,0,0\) of threadgroup \(\d,0,0\).*"
                         r"KERNELKIT_CPU_STACK_SIZE sets the stack size \(now 256K\)", e), e

    proc = run_python("""
        import torch, kernelkit as kk
        k = kk.metal_kernel(name="small", input_names=["a"], output_names=["b"],
                            source="b[thread_position_in_grid.x] = a[thread_position_in_grid.x] + 1;")
        k(inputs=[torch.zeros(4, dtype=torch.int32)], grid=(4, 1, 1), threadgroup=(4, 1, 1),
          output_shapes=[(4,)], output_dtypes=[torch.int32])
    """, KERNELKIT_CPU_STACK_SIZE="lots")
    assert proc.returncode == 1 and "KERNELKIT_CPU_STACK_SIZE='lots' is not a stack size" in \
        proc.stderr, proc.stderr


THROWING_HEADER = """
#if defined(KK_TARGET_CPU)
inline int checked(int v) { if (v < 0) throw v; return v; }
#else
KK_FN int checked(int v) { return v; }  // (the test compiles every kernel for sm_90 too)
#endif
"""


@pytest.mark.parametrize("sync", SYNC, ids=["loop", "fibers"])
def test_exception_escaping_a_kernel_is_a_launch_error(sync):
    """A C++ exception leaving the body would otherwise reach std::terminate."""
    k = kk.metal_kernel(name="throws", input_names=["inp"], output_names=["out"],
                        header=THROWING_HEADER, source=f"""
        uint i = thread_position_in_grid.x;
        {sync}
        out[i] = checked(inp[i]);
    """)
    n = 16
    x = torch.arange(n, dtype=torch.int32)
    x[6] = -1
    with pytest.raises(kk.KernelLaunchError, match="kernel 'throws': a C\\+\\+ exception escaped "
                                                   "the kernel"):
        run(k, [x], n)
    x[6] = 6
    works_after(k, [x], n, x.tolist())


def test_the_c_library_still_compiles_beside_the_exit_guard(tmp_path):
    """The guard redeclares glibc's functions as glibc does: a unit that includes the CPU entry
    header, then <cstdlib>, <unistd.h> and <cassert>, compiles and uses them (but not exit)."""
    from kernelkit.backends import cpu
    src = tmp_path / "unit.cpp"
    src.write_text("#define KK_TARGET_CPU 1\n#include <kernelkit/metal.h>\n"
                   "#include <kernelkit/cpu_group.h>\n#include <cstdlib>\n#include <unistd.h>\n"
                   "#include <cassert>\n#include <vector>\n"
                   "int f(int v) { assert(v != 3); std::vector<int> w(4, v); return std::abs(w[1]); }\n")
    proc = subprocess.run([cpu.compiler()[0], "-std=c++17", "-O3", "-fPIC", "-shared",
                           f"-I{cpu.INCLUDE}", str(src), "-o", str(tmp_path / "unit.so")],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

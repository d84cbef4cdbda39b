"""Where a repeated kernel call's host time goes on a GPU, part by part, beside CuPy's launch.

    python bench/profile_call_overhead.py [--out FILE.json]      (needs an NVIDIA GPU and CuPy)

Prints, and writes with --out, the median over interleaved rounds of: the whole call (through
fastcall's tp_call); the same through Kernel.__call__'s Python layer (set_call undone); the same
with fastcall_torch withdrawn (tensors read and outputs allocated through torch's Python methods,
as before it existed); fastcall's `call` without Kernel.__call__; the plan alone (allocate,
pack, launch); the plan key; torch's allocation from Python (empty_like of an expanded
prototype, the Python path's); the driver launch through fastcall's `launch`; CuPy's RawKernel
launch (no allocation); torch's add_. Then parts timed in a C loop (no Python loop around them):
the whole call and CuPy's launch again, cuLaunchKernel alone, fastcall_torch's allocation with
the output's release, its stream id read, and torch's raw stream read through Python. Beside
them, the median over rounds of the call's ratio to CuPy's launch in the same round.
"""

import argparse
import json
import re
import shlex
import statistics
import struct
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # this checkout's kernelkit

import kernelkit as kk  # noqa: E402
from kernelkit import fastcall  # noqa: E402
from kernelkit.benchmarks import per_call_us, record  # noqa: E402

# Loops in C around single steps, so that the Python loop's own ~0.1 us is not in their time.
LOOPS = r"""
#include <Python.h>
#include <chrono>
#include <cstdint>

namespace {
using Launch = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       void*, void**, void**);
using Empty = PyObject* (*)(PyObject*, const int64_t*, int64_t);
using Stream = int (*)(int64_t, int64_t*);

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// launches(n, cuLaunchKernel, function, threads, stream, block, parameters) -> seconds per launch
// (or -err); the kernel's parameters are the block's first `parameters` 8-byte words, or the block
PyObject* launches(PyObject*, PyObject* const* a, Py_ssize_t) {
  long n = PyLong_AsLong(a[0]);
  auto launch = reinterpret_cast<Launch>(PyLong_AsVoidPtr(a[1]));
  void* fn = PyLong_AsVoidPtr(a[2]);
  unsigned threads = PyLong_AsUnsignedLong(a[3]);
  void* stream = PyLong_AsVoidPtr(a[4]);
  char* block = PyBytes_AsString(a[5]);
  long words = PyLong_AsLong(a[6]);
  void* params[8] = {block};
  for (long i = 1; i < words && i < 8; ++i) params[i] = block + 8 * i;
  if (PyErr_Occurred()) return nullptr;
  double t0 = now();
  for (long i = 0; i < n; ++i) {
    int err = launch(fn, 1, 1, 1, threads, 1, 1, 0, stream, params, nullptr);
    if (err) return PyFloat_FromDouble(-err);
  }
  return PyFloat_FromDouble((now() - t0) / n);
}

// contexts(n, cuCtxGetCurrent) -> seconds per read
PyObject* contexts(PyObject*, PyObject* const* a, Py_ssize_t) {
  long n = PyLong_AsLong(a[0]);
  auto get = reinterpret_cast<int (*)(void**)>(PyLong_AsVoidPtr(a[1]));
  if (PyErr_Occurred()) return nullptr;
  void* ctx = nullptr;
  double t0 = now();
  for (long i = 0; i < n; ++i) get(&ctx);
  return PyFloat_FromDouble((now() - t0) / n);
}

// empties(n, kk_empty, prototype, numel) -> seconds per allocation and release
PyObject* empties(PyObject*, PyObject* const* a, Py_ssize_t) {
  long n = PyLong_AsLong(a[0]);
  auto empty = reinterpret_cast<Empty>(PyLong_AsVoidPtr(a[1]));
  int64_t numel = PyLong_AsLongLong(a[3]);
  if (PyErr_Occurred()) return nullptr;
  double t0 = now();
  for (long i = 0; i < n; ++i) {
    PyObject* t = empty(a[2], &numel, 1);
    if (t == nullptr) return nullptr;
    Py_DECREF(t);
  }
  return PyFloat_FromDouble((now() - t0) / n);
}

// stream_ids(n, kk_stream, index) -> seconds per read
PyObject* stream_ids(PyObject*, PyObject* const* a, Py_ssize_t) {
  long n = PyLong_AsLong(a[0]);
  auto stream = reinterpret_cast<Stream>(PyLong_AsVoidPtr(a[1]));
  int64_t index = PyLong_AsLongLong(a[2]), id = 0;
  if (PyErr_Occurred()) return nullptr;
  double t0 = now();
  for (long i = 0; i < n; ++i)
    if (stream(index, &id) != 0) return nullptr;
  return PyFloat_FromDouble((now() - t0) / n);
}

// calls(n, callable, args, kwargs or None) -> seconds per call, its result released
PyObject* calls(PyObject*, PyObject* const* a, Py_ssize_t) {
  long n = PyLong_AsLong(a[0]);
  PyObject* kwargs = a[3] == Py_None ? nullptr : a[3];
  if (PyErr_Occurred()) return nullptr;
  double t0 = now();
  for (long i = 0; i < n; ++i) {
    PyObject* r = PyObject_Call(a[1], a[2], kwargs);
    if (r == nullptr) return nullptr;
    Py_DECREF(r);
  }
  return PyFloat_FromDouble((now() - t0) / n);
}

PyMethodDef methods[] = {
    {"launches", (PyCFunction)(void (*)())launches, METH_FASTCALL, ""},
    {"empties", (PyCFunction)(void (*)())empties, METH_FASTCALL, ""},
    {"contexts", (PyCFunction)(void (*)())contexts, METH_FASTCALL, ""},
    {"stream_ids", (PyCFunction)(void (*)())stream_ids, METH_FASTCALL, ""},
    {"calls", (PyCFunction)(void (*)())calls, METH_FASTCALL, ""},
    {nullptr, nullptr, 0, nullptr}};
PyModuleDef module = {PyModuleDef_HEAD_INIT, "_loops", nullptr, -1, methods};
}  // namespace

extern "C" PyMODINIT_FUNC PyInit__loops() { return PyModule_Create(&module); }
"""


def _loops():
    """LOOPS built with the CPU backend's compiler and loaded (as fastcall.py builds its own)."""
    import importlib.machinery
    import importlib.util
    import sysconfig
    import tempfile

    from kernelkit.backends import cpu
    binary = cpu.compile_source(LOOPS, "safe", (f"-I{sysconfig.get_paths()['include']}",))
    path = Path(tempfile.mkdtemp(prefix="kk-loops-")) / "_loops.so"
    path.write_bytes(binary)
    loader = importlib.machinery.ExtensionFileLoader("_loops", str(path))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader("_loops", loader))
    loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON result here too")
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    import cupy as cp
    dev = torch.device("cuda")
    k = kk.metal_kernel(name="overhead", input_names=["inp"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = inp[i] + 1.0f;")
    x = torch.randn(32, device=dev)
    kw = dict(inputs=[x], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(32,)],
              output_dtypes=[torch.float32])
    mod = fastcall.module(block=True)
    helper = fastcall.torch_helper()
    if isinstance(helper, str):
        sys.exit(f"fastcall_torch is unavailable: {helper}")
    for _ in range(5):  # compiled, planned
        assert torch.equal(k(**kw)[0], x + 1)
    shapes, dtypes = [(32,)], [torch.float32]
    plans = k._plans
    plan = plans[mod.key([x], dtypes, (32, 1, 1), (32, 1, 1), None)]
    variant = next(iter(k._variants.values()))
    fn, ctx = int(variant.program.func), variant.program.device._context_int
    launched_into = torch.empty(32, device=dev)  # the launches' output, kept alive
    block = variant.pack([x], [launched_into], (32, 1, 1, 0))
    proto = torch.empty((), device=dev).expand(32)
    raw = cp.RawKernel(r'extern "C" __global__ void f(const float* a, float* b) '
                       r'{ int i = threadIdx.x; b[i] = a[i] + 1.0f; }', "f")
    a_, b_ = cp.zeros(32, dtype=cp.float32), cp.zeros(32, dtype=cp.float32)
    stream = torch._C._cuda_getCurrentRawStream
    lent = fastcall.addresses(helper)
    loops = _loops()
    from kernelkit.backends import cuda
    driver = cuda._driver()
    cu_launch, cu_context = (int(cuda._check(driver.cuGetProcAddress(
        name, 12000, driver.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT),
        "cuGetProcAddress")[0]) for name in (b"cuLaunchKernel", b"cuCtxGetCurrent"))
    cupy_block = struct.pack("QQ", a_.data.ptr, b_.data.ptr)
    kernel_call = type(k).__call__
    n_loop = 3000

    def in_c(name, *args):  # a C loop's seconds per step, as per_call_us gives microseconds
        def timed():
            best = float("inf")
            for _ in range(2):
                best = min(best, getattr(loops, name)(n_loop, *args))
                torch.cuda.synchronize()
            return best * 1e6
        return timed

    calls = {  # name -> (microseconds per call, fastcall_torch lent, fastcall's tp_call)
        "kernel call": (lambda: k(**kw), True, True),
        "kernel call, Python __call__": (lambda: k(**kw), True, False),
        "kernel call, torch's Python methods": (lambda: k(**kw), False, True),
        "fastcall.call": (lambda: mod.call(plans, [x], shapes, dtypes, (32, 1, 1), (32, 1, 1), None), True, True),
        "plan run": (lambda: mod.run(plan, [x], shapes), True, True),
        "plan key": (lambda: mod.key([x], dtypes, (32, 1, 1), (32, 1, 1), None), True, True),
        "torch empty_like": (lambda: torch.empty_like(proto), True, True),
        "launch": (lambda: mod.launch(fn, ctx, 1, 1, 1, 32, 1, 1, 0, stream(0), block), True, True),
        "CuPy RawKernel": (lambda: raw((1,), (32,), (a_, b_)), True, True),
        "torch add_": (lambda: x.add_(0.0), True, True),
        "C loop: kernel call": (in_c("calls", k, (), kw), True, True),
        "C loop: CuPy RawKernel": (in_c("calls", raw, ((1,), (32,), (a_, b_)), None), True, True),
        "C loop: cuLaunchKernel": (in_c("launches", cu_launch, fn, 32, stream(0), block, 1), True, True),
        "C loop: cuLaunchKernel, CuPy's kernel": (
            in_c("launches", cu_launch, raw.kernel.ptr, 32, stream(0), cupy_block, 2), True, True),
        "C loop: cuCtxGetCurrent": (in_c("contexts", cu_context), True, True),
        "C loop: kk_empty and release": (in_c("empties", lent[2], proto, 32), True, True),
        "C loop: kk_stream": (in_c("stream_ids", lent[3], 0), True, True),
        "C loop: raw stream through Python": (in_c("calls", stream, (0,), None), True, True),
    }
    rounds = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, (fn_, with_torch, with_call) in calls.items():
            if with_torch:
                mod.set_torch(*lent)
            else:
                mod.set_torch()
            if with_call:
                mod.set_call(type(k), kernel_call, torch.compiler)
            else:
                mod.set_call()
            timed = fn_ if name.startswith("C loop") else (
                lambda f=fn_: per_call_us(f, n_loop, torch.cuda.synchronize, repeat=2))
            rounds[name].append(timed())
    mod.set_call(type(k), kernel_call, torch.compiler)
    mod.set_torch(*lent)
    ratio = statistics.median(a / b for a, b in zip(rounds["kernel call"], rounds["CuPy RawKernel"]))
    print(f"{torch.cuda.get_device_name(dev)}: host time per call (median of {args.rounds} rounds)")
    for name, v in rounds.items():
        print(f"{name:38s} {statistics.median(v):6.2f} us")
    print(f"{'kernel call / CuPy RawKernel':38s} {ratio:6.2f} (median of the rounds' ratios)")
    print("per round, kernel call / CuPy RawKernel (us):",
          ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(rounds["kernel call"], rounds["CuPy RawKernel"])))
    if args.out:
        command = shlex.join(["python", "bench/profile_call_overhead.py", *sys.argv[1:]])
        rounds = {_key(name): v for name, v in rounds.items()}
        body = {"rounds": args.rounds, "calls": n_loop,
                **{f"{name}_us": statistics.median(v) for name, v in rounds.items()},
                "kernel_call_over_cupy_rawkernel": ratio, "per_round_us": rounds}
        Path(args.out).write_text(json.dumps(record("profile_call_overhead", body, dev, command),
                                             indent=2) + "\n")


def _key(name: str) -> str:
    """A part's name as a JSON key ("torch empty_like" -> torch_empty_like)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower().replace("'", "")).strip("_")


if __name__ == "__main__":
    main()

"""Kernels on several GPUs (issue 20): one process driving two GPUs, and data-parallel training
with one process per device (torchrun) sharing one cold compile cache. The data-parallel check also
runs on the CPU backend with gloo, so CI runs it without a GPU."""

import collections
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

import kernelkit as kk
from kernelkit import cache, fastcall

HAS_TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
two_gpus = pytest.mark.skipif(not HAS_TWO_GPUS, reason="needs two NVIDIA GPUs")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "multi_gpu_ddp.py"
SLEEP_CYCLES = 1 << 27  # ~70 ms of GPU time: a kernel launched on the wrong stream runs meanwhile

BODIES = {  # out = a * 2 + 1, in each dialect
    "metal": "uint i = thread_position_in_grid.x; out[i] = a[i] * 2 + 1;",
    "cuda": "int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < a_shape[0]) out[i] = a[i] * 2 + 1;",
}


def _kernel(dialect: str, fresh: bool = False):
    """out = a * 2 + 1; `fresh`: with a source no cache has seen, so that its compile shows."""
    source = BODIES[dialect] + (f"\n// {uuid.uuid4().hex}" if fresh else "")
    make = kk.metal_kernel if dialect == "metal" else kk.cuda_kernel
    return make(name=f"twice_plus_one_{dialect}", input_names=["a"], output_names=["out"],
                source=source)


def _call(k, a, **kw):
    return k(inputs=[a], grid=(a.numel(), 1, 1), threadgroup=(128, 1, 1), output_shapes=[a.shape],
             output_dtypes=[a.dtype], **kw)[0]


@pytest.fixture(scope="module")
def _fastcall_built():
    fastcall.module()  # plans wait for the extension, built in the background on first use


def _counting(monkeypatch, owner, name: str, key=lambda *args: None) -> collections.Counter:
    """Calls of owner.name, counted by key(*args)."""
    counts = collections.Counter()
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        counts[key(*args)] += 1
        return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, counted)
    return counts


# --- one process, two GPUs ------------------------------------------------------------------------

@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_one_kernel_compiles_once_per_arch_and_loads_once_per_device(dialect, monkeypatch):
    from kernelkit.backends import cuda
    compiles = _counting(monkeypatch, cuda, "compile_source")
    loads = _counting(monkeypatch, cuda.Device, "load", key=lambda device, *_: device.index)
    k = _kernel(dialect, fresh=True)
    torch.cuda.set_device(0)
    a0, a1 = torch.randn(4096, device="cuda:0"), torch.randn(4096, device="cuda:1")
    for _ in range(3):
        out0, out1 = _call(k, a0), _call(k, a1)
        torch.testing.assert_close(out0, a0 * 2 + 1)
        torch.testing.assert_close(out1, a1 * 2 + 1)
    assert (out0.device, out1.device) == (a0.device, a1.device)
    assert torch.cuda.current_device() == 0  # the launches on cuda:1 left the current device alone
    arches = {cuda.Device.get(i).arch for i in (0, 1)}
    assert sum(compiles.values()) == len(arches)  # the cache key has the arch, not the device
    assert loads == {0: 1, 1: 1}
    programs = [v.program for v in k._variants.values()]
    assert sorted(p.device.index for p in programs) == [0, 1]
    assert int(programs[0].func) != int(programs[1].func)  # each device's own module


@pytest.mark.gpu
@two_gpus
@pytest.mark.parametrize("dialect", ["metal", "cuda"])
def test_runs_on_the_current_stream_of_cuda_1(dialect):
    """A side stream of cuda:1 sleeps, then writes the input: a kernel launched on any other
    stream would read the input before it is written."""
    k = _kernel(dialect)
    torch.cuda.set_device(0)
    a = torch.zeros(1 << 16, device="cuda:1")
    _call(k, a)  # compiled and loaded before the timed part
    torch.cuda.synchronize(1)
    with torch.cuda.device(1):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            a.fill_(3)
            current = _call(k, a)
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        a.fill_(5)
    explicit = _call(k, a, stream=side)  # current device 0, the stream of cuda:1 given
    side.synchronize()
    assert current.device == explicit.device == torch.device("cuda:1")
    assert current.eq(7).all() and explicit.eq(11).all()


@pytest.mark.gpu
@two_gpus
def test_fast_path_alternating_devices(_fastcall_built):
    k = _kernel("metal")
    torch.cuda.set_device(0)
    a = {i: torch.randn(1000, device=f"cuda:{i}") for i in (0, 1)}
    for step in range(6):
        for i in (step % 2, 1 - step % 2):
            out = _call(k, a[i])
            assert out.device == a[i].device
            torch.testing.assert_close(out, a[i] * 2 + 1)
    assert len(k._plans) == 2  # one plan per device: the device is in the plan key
    x = torch.zeros(1 << 16, device="cuda:1")
    with torch.cuda.device(1):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            for value in (1, 2, 3):  # the plans launch on the current stream of cuda:1 too
                torch.cuda._sleep(SLEEP_CYCLES // 4)
                x.fill_(value)
                out = _call(k, x)
    side.synchronize()
    assert out.eq(7).all()
    assert len(k._plans) == 3  # x's grid is another: its own plan, made and run on cuda:1


@pytest.mark.gpu
@two_gpus
def test_kernel_without_array_inputs_runs_on_the_current_device(_fastcall_built):
    k = kk.metal_kernel(name="iota", input_names=[], output_names=["out"],
                        source="out[thread_position_in_grid.x] = thread_position_in_grid.x;")
    for i in (1, 0, 1):  # repeated calls: a plan made under one device must not serve the other
        with torch.cuda.device(i):
            for _ in range(3):
                out = k(inputs=[], grid=(10, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(10,)],
                        output_dtypes=[torch.int32])[0]
                assert out.device == torch.device("cuda", i)
                assert out.tolist() == list(range(10))


@pytest.mark.gpu
@two_gpus
def test_inputs_on_two_devices_are_an_error():
    k = kk.metal_kernel(name="add", input_names=["a", "b"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = a[i] + b[i];")
    a, b = torch.ones(8, device="cuda:0"), torch.ones(8, device="cuda:1")
    for inputs in ([a, b], [b, a], [a, b.cpu()]):
        for _ in range(3):  # the fast path too
            with pytest.raises(ValueError, match="inputs are on different devices"):
                k(inputs=inputs, grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)],
                  output_dtypes=[torch.float32])
    with pytest.raises(ValueError, match="stream is on cuda:1 but the array inputs are on cuda:0"):
        _call(_kernel("metal"), a, stream=torch.cuda.Stream(1))


@pytest.mark.gpu
@two_gpus
def test_custom_function_ops_on_cuda_1_match_cuda_0():
    """grid_sample (forward and backward) and matmul_add_relu (kk.custom_function ops) on cuda:1,
    called while cuda:0 is current, give cuda:0's results."""
    torch.cuda.set_device(0)
    g = torch.Generator().manual_seed(0)
    x, grid = torch.randn(2, 16, 16, 8, generator=g), torch.rand(2, 12, 12, 2, generator=g) * 2 - 1
    lhs, rhs, bias = torch.randn(3, 96, 64, generator=g), torch.randn(64, 80, generator=g), \
        torch.randn(80, generator=g)

    def run(device):
        leaves = [t.to(device).requires_grad_() for t in (x, grid, lhs, rhs, bias)]
        sampled = kk.ops.grid_sample(leaves[0], leaves[1])
        fused = kk.ops.matmul_add_relu(*leaves[2:])
        (sampled.square().sum() + fused.sum()).backward()
        return [t.detach().cpu() for t in (sampled, fused, *(leaf.grad for leaf in leaves))]

    on_1, on_0 = run("cuda:1"), run("cuda:0")
    assert torch.cuda.current_device() == 0
    for got, want in zip(on_1, on_0):  # grid_sample's backward adds up with atomics
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_call_without_array_inputs_makes_no_plan_with_several_gpus(monkeypatch, _fastcall_built):
    """Its plan key holds no device (the current GPU's): with two GPUs it keeps the general path.
    On the CPU backend, with torch told of two GPUs."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    iota = kk.metal_kernel(name="iota", input_names=[], output_names=["out"],
                           source="out[thread_position_in_grid.x] = thread_position_in_grid.x;")
    twice = _kernel("metal")
    a = torch.randn(16)
    for _ in range(3):
        out = iota(inputs=[], grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)],
                   output_dtypes=[torch.int32])[0]
        assert out.tolist() == [0, 1, 2, 3]
        torch.testing.assert_close(_call(twice, a), a * 2 + 1)
    assert not iota._plans and len(twice._plans) == 1


# --- data parallel: one process per device, one shared cold cache ---------------------------------

# Runs the example in a process of torchrun's, printing each compile this process made and stored
# (a background build cut off at exit, as fastcall's may be, is not one).
COUNTING = """
import runpy, sys
from kernelkit import cache
load_or_build = cache.CompileCache._load_or_build

def counted(self, key, suffix, source, build):
    built = []
    binary = load_or_build(self, key, suffix, source, lambda: built.append(1) or build())
    if built:
        print(f"kernelkit compiled {key}{suffix}", flush=True)
    return binary

cache.CompileCache._load_or_build = counted
runpy.run_path(sys.argv[1], run_name="__main__")
"""


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, two_gpus])])
@pytest.mark.slow
def test_ddp_step_under_torchrun_matches_one_process_and_shares_the_cache(device, tmp_path):
    """torchrun --nproc-per-node=2 runs examples/multi_gpu_ddp.py (a DDP step through
    kk.ops.grid_sample and kk.ops.matmul_add_relu; each rank compares its gradients with the
    one-process step on the global batch) with a cold compile cache shared by both ranks: each
    kernel compiled once, every entry whole."""
    wrapper = tmp_path / "counting.py"
    wrapper.write_text(COUNTING)
    root = tmp_path / "cache"
    env = dict(os.environ, KERNELKIT_CACHE_DIR=str(root), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(EXAMPLE.parent.parent / "src"),
                                           os.environ.get("PYTHONPATH", "")]))
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU backend and gloo, GPUs or not
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node=2", str(wrapper), str(EXAMPLE)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    for rank in (0, 1):
        on = "cpu" if device == "cpu" else f"cuda:{rank}"
        assert f"rank {rank} on {on}: DDP gradients match the one-process step: ok" in out, out
    compiled = collections.Counter(line.split()[-1] for line in out.splitlines()
                                   if line.startswith("kernelkit compiled "))
    assert compiled, out
    assert {k: n for k, n in compiled.items() if n > 1} == {}, "compiled by both ranks"
    store = cache.DiskCache(root)
    for name in compiled:
        key, suffix = name[:64], name[64:]
        assert store.read(key, suffix) is not None, f"{name}: no verified entry"
    leftovers = [p.name for p in (root / kk.__version__).rglob("*") if p.name.startswith((".tmp", ".load-"))]
    assert leftovers == []

"""The compile cache (SPEC §2): once per source/options/target, in memory and on disk."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kernelkit as kk
from kernelkit.cache import CACHE

SCRIPT = textwrap.dedent("""
    import sys, torch, kernelkit as kk
    from kernelkit.backends import cpu
    if sys.argv[1] == "forbid-compile":
        def refuse(*a, **k):
            raise SystemExit("compiled although the disk cache holds the kernel")
        cpu.compile_source = refuse
    k = kk.metal_kernel(name="cached", input_names=["a"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = a[i] * 3;")
    out = k(inputs=[torch.arange(8.0)], grid=(8, 1, 1), threadgroup=(8, 1, 1),
            output_shapes=[(8,)], output_dtypes=[torch.float32])[0]
    assert out.tolist() == [3.0 * i for i in range(8)], out
    print("ok")
""")


def _run(tmp_path, mode):
    env = dict(os.environ, KERNELKIT_CACHE_DIR=str(tmp_path))
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_fresh_process_finds_the_kernel_on_disk(tmp_path):
    first = _run(tmp_path, "compile")
    assert first.stdout.strip() == "ok", first.stderr
    second = _run(tmp_path, "forbid-compile")
    assert second.stdout.strip() == "ok", second.stderr
    sources = [p for p in tmp_path.rglob("*.src")]
    assert sources and any("custom_kernel_cached" in p.read_text() for p in sources)


@pytest.mark.slow
def test_corrupt_or_truncated_binary_is_a_miss(tmp_path):
    assert _run(tmp_path, "compile").stdout.strip() == "ok"
    binaries = [p for p in tmp_path.rglob("*.so") if "custom_kernel_cached" in
                p.with_name(p.name + ".src").read_text()]
    assert binaries
    for p in binaries:
        p.write_bytes(p.read_bytes()[:100])  # half-written
    again = _run(tmp_path, "compile")
    assert again.stdout.strip() == "ok", again.stderr


@pytest.mark.slow
def test_processes_sharing_the_cache_concurrently(tmp_path):
    env = dict(os.environ, KERNELKIT_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, "compile"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert out.strip() == "ok", err


def test_same_name_different_source_never_share_a_binary(device):
    a = kk.metal_kernel(name="same", input_names=["x"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = x[i] + 1;")
    b = kk.metal_kernel(name="same", input_names=["x"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = x[i] * 10;")
    x = torch.arange(4.0, device=device)
    args = dict(grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)], output_dtypes=[torch.float32])
    ra, rb = a(inputs=[x], **args)[0], b(inputs=[x], **args)[0]  # back to back, no sync between
    assert ra.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert rb.tolist() == [0.0, 10.0, 20.0, 30.0]


def test_one_kernel_two_dtypes(device):
    k = kk.metal_kernel(name="twice", input_names=["x"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = x[i] * 2;")
    for dtype in (torch.float16, torch.float32):
        x = torch.randn(16, device=device).to(dtype)
        out = k(inputs=[x], grid=(16, 1, 1), threadgroup=(16, 1, 1), output_shapes=[(16,)],
                output_dtypes=[dtype])[0]
        assert out.dtype == dtype
        torch.testing.assert_close(out, x * 2)


def test_memory_cache_compiles_once(monkeypatch, device):
    k = kk.metal_kernel(name="once", input_names=["x"], output_names=["out"],
                        source="uint i = thread_position_in_grid.x; out[i] = x[i] - 1;")
    x = torch.arange(4.0, device=device)
    args = dict(grid=(4, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(4,)], output_dtypes=[torch.float32])
    k(inputs=[x], **args)
    calls = []
    original = CACHE.get
    monkeypatch.setattr(CACHE, "get", lambda *a, **kw: calls.append(a) or original(*a, **kw))
    for _ in range(3):
        k(inputs=[x], **args)
    assert calls == []

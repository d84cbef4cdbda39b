"""The CPU backend under kernels that misbehave (issue 15): arithmetic faults, traps, aborts and
wild accesses become a KernelLaunchError naming the kernel and the thread, and the next call
works; a kernel cannot exit the process; fiber stacks fit kernels with large local arrays; and
timeout= never fires early, however many OS threads share the launch.

Checks that need a fresh runtime (its thread count, stack size) run in a subprocess.
"""

import os
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

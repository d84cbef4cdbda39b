"""Where a call runs (SPEC §1): on the inputs' device and the current stream of that device."""

import pytest
import torch

import kernelkit as kk

HAS_TWO_GPUS = torch.cuda.is_available() and torch.cuda.device_count() >= 2
BODY = "uint i = thread_position_in_grid.x; out[i] = a[i] * 2 + 1;"


def _kernel():
    return kk.metal_kernel(name="twice_plus_one", input_names=["a"], output_names=["out"], source=BODY)


def _call(k, a, **kw):
    return k(inputs=[a], grid=(a.numel(), 1, 1), threadgroup=(128, 1, 1), output_shapes=[a.shape],
             output_dtypes=[a.dtype], **kw)[0]


def test_no_array_input_runs_on_the_stream_argument(device):
    k = kk.metal_kernel(name="iota", input_names=[], output_names=["out"],
                        source="out[thread_position_in_grid.x] = thread_position_in_grid.x;")
    out = k(inputs=[], grid=(10, 1, 1), threadgroup=(4, 1, 1), output_shapes=[(10,)],
            output_dtypes=[torch.int32], stream=device)[0]
    assert out.device.type == device.type
    assert out.tolist() == list(range(10))


def test_stream_on_another_device_than_the_inputs_is_an_error():
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    with pytest.raises(ValueError, match="stream is on cuda:0 but the array inputs are on cpu"):
        _call(_kernel(), torch.zeros(4), stream=torch.device("cuda:0"))


@pytest.mark.gpu
def test_runs_on_a_side_stream_without_host_sync():
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    k = _kernel()
    a = torch.randn(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = _call(k, a)  # the current stream is `side`
    explicit = _call(k, a, stream=side)
    side.synchronize()
    torch.testing.assert_close(out, a * 2 + 1)
    torch.testing.assert_close(explicit, a * 2 + 1)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TWO_GPUS, reason="needs two NVIDIA GPUs")
def test_inputs_on_cuda_1_run_on_cuda_1():
    k = _kernel()
    torch.cuda.set_device(0)
    a1 = torch.randn(4096, device="cuda:1")
    a0 = torch.randn(4096, device="cuda:0")
    out1 = _call(k, a1)
    out0 = _call(k, a0)
    assert out1.device == torch.device("cuda:1") and out0.device == torch.device("cuda:0")
    torch.testing.assert_close(out1, a1 * 2 + 1)
    torch.testing.assert_close(out0, a0 * 2 + 1)
    assert torch.cuda.current_device() == 0  # the launch on cuda:1 left the current device alone
    with torch.cuda.device(1):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            out_s = _call(k, a1)
        out_0 = _call(k, a0)  # the inputs decide, not the current device
        s.synchronize()
    explicit = _call(k, a1, stream=s)  # cuda:1's stream given while cuda:0 is current
    s.synchronize()
    assert out_0.device == torch.device("cuda:0") and explicit.device == torch.device("cuda:1")
    torch.testing.assert_close(out_s, a1 * 2 + 1)
    torch.testing.assert_close(out_0, a0 * 2 + 1)
    torch.testing.assert_close(explicit, a1 * 2 + 1)
    assert torch.cuda.current_device() == 0


@pytest.mark.gpu
def test_gpu_fault_is_a_clear_error():
    """A kernel writing through a bad pointer loses the CUDA context; the next kernelkit launch
    says so. In a child process: the context does not come back."""
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    import subprocess
    import sys
    import textwrap
    script = textwrap.dedent("""
        import torch, kernelkit as kk
        bad = kk.cuda_kernel(name="bad", input_names=["a"], output_names=["out"],
                             source="*(float*)(0x10) = a[0]; out[0] = 1;")
        a = torch.ones(1, device="cuda")
        bad(inputs=[a], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,)],
            output_dtypes=[torch.float32])
        try:
            torch.cuda.synchronize()
        except Exception as e:
            print("torch:", type(e).__name__)
        try:
            bad(inputs=[a], grid=(1, 1, 1), threadgroup=(1, 1, 1), output_shapes=[(1,)],
                output_dtypes=[torch.float32])
        except kk.KernelLaunchError as e:
            print("kernelkit:", type(e).__name__, e)
    """)
    import os
    env = dict(os.environ, KERNELKIT_POISON_OUTPUTS="0")  # no torch fill between the two launches
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env=env)
    assert "kernelkit: GPUFault" in r.stdout, r.stdout + r.stderr
    assert "CUDA context of this process is lost" in r.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_profilers_list_the_kernel_by_its_name():
    a = torch.randn(1000, device="cuda")
    k = _kernel()
    _call(k, a)  # compiled and loaded outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _call(k, a)
        torch.cuda.synchronize()
    assert "kk_twice_plus_one" in {e.name for e in prof.events()}

"""kk.precompiled_cuda_kernel, MLX's mx.fast.precompiled_cuda_kernel: a module compiled elsewhere
(PTX, a cubin) run with MLX's calling convention (input pointers, output pointers, then the
scalars by value); its argument checks on any machine, its launches on an NVIDIA GPU."""

import pytest
import torch

import kernelkit as kk

SOURCE = r"""
extern "C" __global__ void axpb(const float* x, const float* b, float* out, int* count,
                                float a, int n, bool negate) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = a * x[i] + b[0];
  out[i] = negate ? -v : v;
  atomicAdd(count, 1);
}

extern "C" __global__ void block_sizes(int* out) {
  // each thread writes the block's size at its index in the grid (x only)
  out[blockIdx.x * blockDim.x + threadIdx.x] = blockDim.x;
}

extern "C" __global__ void reverse_in_shared(const float* x, float* out, int n) {
  extern __shared__ float buf[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = x[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buf[n - 1 - i];
}
"""

CALL = dict(name="axpb", compiled_source=b"// PTX", inputs=[torch.ones(4), torch.ones(1)],
            output_shapes=[(4,), (1,)], output_dtypes=[torch.float32, torch.int32],
            scalars=[2.0, 4, False], grid=(4, 1, 1), threadgroup=(32, 1, 1))


def test_arguments_are_keywords_and_checked_before_anything_runs():
    with pytest.raises(TypeError):
        kk.precompiled_cuda_kernel("axpb", b"// PTX")
    bad = [
        (dict(name=""), TypeError, "name must be the kernel's symbol"),
        (dict(compiled_source=123), TypeError, "compiled_source must be the compiled module"),
        (dict(compiled_source=b""), TypeError, "non-empty bytes"),
        (dict(inputs=torch.ones(4)), TypeError, "Expected `inputs` to be a list"),
        (dict(output_dtypes=[torch.float32]), ValueError, "Expected `output_dtypes` to have size 2"),
        (dict(scalars=["2"]), TypeError, r"scalars\[0\] must be a bool, an int or a float"),
        (dict(scalars=[2**31]), OverflowError, "does not fit the kernel's int"),
        (dict(inputs=[torch.ones(4), object()]), TypeError, r"inputs\[1\] must be a torch.Tensor"),
    ]
    for change, error, message in bad:
        with pytest.raises(error, match=message):
            kk.precompiled_cuda_kernel(**{**CALL, **change})


def test_cpu_inputs_are_a_clear_error():
    with pytest.raises(ValueError, match="runs on an NVIDIA GPU .* but the call is on cpu"):
        kk.precompiled_cuda_kernel(**CALL)


def _compiled(kind: str) -> bytes:
    """SOURCE compiled by NVRTC for this GPU: "ptx" or "cubin"."""
    from kernelkit.backends import cuda
    major, minor = torch.cuda.get_device_capability()
    if kind == "cubin":
        return cuda.compile_source(SOURCE, f"sm_{major}{minor}", "relaxed")
    nvrtc = cuda._nvrtc()
    prog = cuda._check(nvrtc.nvrtcCreateProgram(SOURCE.encode(), b"axpb.cu", 0, [], []), "create")
    try:
        opts = [f"-arch=compute_{major}{minor}".encode()]
        cuda._check(nvrtc.nvrtcCompileProgram(prog, len(opts), opts), "compile")
        size = cuda._check(nvrtc.nvrtcGetPTXSize(prog), "size")
        ptx = b" " * size
        cuda._check(nvrtc.nvrtcGetPTX(prog, ptx), "ptx")
        return ptx.rstrip(b"\0")  # (the call adds the NUL the driver reads PTX up to)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@pytest.fixture
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU")
    return torch.device("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["ptx", "cubin"])
def test_runs_with_mlx_calling_convention(gpu, kind):
    """Input pointers, output pointers, then a float, an int and a bool by value; a grid of
    threads that is no multiple of the threadgroup; init_value fills every output first."""
    module = _compiled(kind)
    n = 1000
    x, b = torch.randn(n, device=gpu), torch.randn(1, device=gpu)
    for negate in (False, True):
        out, count = kk.precompiled_cuda_kernel(
            name="axpb", compiled_source=module, inputs=[x, b], output_shapes=[(n,), (1,)],
            output_dtypes=[torch.float32, torch.int32], scalars=[1.5, n, negate], grid=(n, 1, 1),
            threadgroup=(256, 1, 1), init_value=0)
        expected = (1.5 * x.double() + b.double()) * (-1 if negate else 1)
        torch.testing.assert_close(out.double(), expected, rtol=1e-6, atol=1e-6)
        assert count.item() == n


@pytest.mark.gpu
def test_blocks_are_clamped_to_the_grid_and_numbers_become_arrays(gpu):
    module = _compiled("cubin")
    (sizes,) = kk.precompiled_cuda_kernel(
        name="block_sizes", compiled_source=module, inputs=[], output_shapes=[(10,)],
        output_dtypes=[torch.int32], scalars=[], grid=(10, 1, 1), threadgroup=(256, 1, 1))
    assert sizes.tolist() == [10] * 10  # a block of the grid's 10 threads, not of 256
    # a Python number among the inputs is a 0-d array: the kernel gets its pointer
    out, _ = kk.precompiled_cuda_kernel(
        name="axpb", compiled_source=module, inputs=[torch.ones(3, device=gpu), 0.25],
        output_shapes=[(3,), (1,)], output_dtypes=[torch.float32, torch.int32], scalars=[2.0, 3, False],
        grid=(3, 1, 1), threadgroup=(32, 1, 1), init_value=0)
    assert out.tolist() == [2.25] * 3


@pytest.mark.gpu
def test_dynamic_shared_memory_past_48_kib_and_a_side_stream(gpu):
    module = _compiled("cubin")
    n = 16384  # 64 KiB of floats in shared memory
    x = torch.randn(n, device=gpu)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    (out,) = kk.precompiled_cuda_kernel(
        name="reverse_in_shared", compiled_source=module, inputs=[x], output_shapes=[(n,)],
        output_dtypes=[torch.float32], scalars=[n], grid=(256, 1, 1), threadgroup=(256, 1, 1),
        shared_memory=4 * n, stream=side)
    side.synchronize()
    assert torch.equal(out, x.flip(0))


@pytest.mark.gpu
def test_a_missing_kernel_or_a_bad_module_is_a_clear_error(gpu):
    call = {**CALL, "inputs": [torch.ones(4, device=gpu), torch.ones(1, device=gpu)]}
    with pytest.raises(ValueError, match="compiled_source has no kernel named 'nope'"):
        kk.precompiled_cuda_kernel(**{**call, "name": "nope", "compiled_source": _compiled("cubin")})
    with pytest.raises(ValueError, match="the driver could not load compiled_source"):
        kk.precompiled_cuda_kernel(**{**call, "compiled_source": b"not a module"})

"""The talk's matmul as the issue's benchmark writes it (bench/bench_talk_matmul.py): each
threadgroup slices its tile and runs matmul2d once over all of K, on execution_simdgroups<8> (two
Hopper warpgroups sharing a 256 x 128 tile) and <4> (one, 128 x 128), with tiles walked in bands
or not; sizes that are not tile multiples, output in the input type or float, rows that are
whole 16-byte chunks or not."""

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    spec = importlib.util.spec_from_file_location("bench_talk_matmul", ROOT / "bench" / "bench_talk_matmul.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("variant", ["256x128sg8b8", "256x128sg8", "128x128sg4b16"])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)])
@pytest.mark.parametrize("N", [200, 203])  # rows of whole 16-byte chunks or not (staged_io.h)
def test_talk_matmul(device, variant, dtype, out_dtype, N):
    bench = _bench()
    M, K = 300, 100
    a, b = torch.randn(M, K, device=device).to(dtype), torch.randn(K, N, device=device).to(dtype)
    c = bench.kernel(dtype, out_dtype, variant)(**bench.call_args(a, b, out_dtype, variant))[0]
    ref = a.double() @ b.double()
    tol = 1e-2 if out_dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(c.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())


def test_two_warpgroups_take_their_shared_memory(nvrtc):
    """execution_simdgroups<8> on sm_90a instantiates warpgroup_gemm<256, 128, .., 4 stages, 2
    warpgroups>: the cubin asks the launcher for its 4 * (256 + 128) * 128 + 1536 bytes."""
    from kernelkit.backends import cuda
    import kernelkit as kk
    bench = _bench()
    meta = torch.empty(512, 512, dtype=torch.bfloat16, device="meta")
    args = bench.call_args(meta, meta, torch.bfloat16, "256x128sg8b8")
    compiled = kk.compile_for(bench.kernel(torch.bfloat16, torch.bfloat16, "256x128sg8b8"), "sm_90",
                              inputs=args["inputs"], output_dtypes=args["output_dtypes"], template=args["template"])
    assert compiled.arch == "sm_90a"
    assert cuda.tensor_ops_shared(compiled.binary) == 4 * (256 + 128) * 128 + 1536

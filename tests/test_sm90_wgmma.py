"""tensor_ops/sm90_wgmma.h: one Hopper warpgroup's tile GEMM (wgmma, sm_90a).

On the CPU: the header compiles for sm_90a with NVRTC for every type it takes, without spills,
and its SASS holds the tensor-core instructions where cuobjdump or nvdisasm is installed. On a
GPU: the benchmark's tile-matmul kernel (bench/bench_tensor_ops.py) against float64 torch, for
sizes that are not tile multiples, transposed operands and unaligned strides.
"""

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

TU = r"""
#define KK_TARGET_CUDA 1
#include <kernelkit/tensor_ops/sm90_wgmma.h>
using G = kk::tops::sm90::warpgroup_gemm<TILE, T, T, ACC, STAGES, WARPGROUPS>;
static_assert(G::supported, "the sm_90a path takes these types");
static_assert(!kk::tops::sm90::warpgroup_gemm<128, 128, __half, __nv_bfloat16, float>::supported, "");
extern "C" __global__ void k(const T* A, const T* B, ACC* C, int M, int N, int K, long ars, long acs,
                             long brs, long bcs) {
  ACC acc[G::acc_per_thread];
  G::run(acc, A, ars, acs, B, brs, bcs, M, N, K, false);
#pragma unroll
  for (int i = 0; i < G::acc_per_thread; ++i) {
    int r, c;
    G::coord(i, threadIdx.x, r, c);
    if (r < M && c < N) C[r * N + c] = acc[i];
  }
}
"""
# operand type, accumulator type, the SASS instruction that must appear; then the shapes the
# benchmark uses beyond 128x128 (register pressure: a spill here is a slow kernel there)
TYPES = [("__nv_bfloat16", "float", "HGMMA"), ("__half", "float", "HGMMA"),
         ("__nv_fp8_e4m3", "float", "QGMMA"), ("__nv_fp8_e5m2", "float", "QGMMA"),
         ("float", "float", "HGMMA"), ("signed char", "int", "IGMMA")]
SHAPES = [("__nv_bfloat16", "float", "HGMMA", "256, 128", 4, 2),
          ("__nv_fp8_e4m3", "float", "QGMMA", "128, 192", 4, 1),
          ("__nv_fp8_e4m3", "float", "QGMMA", "256, 192", 4, 2)]


def _compile(ctype, acc, arch="sm_90a", tile="128, 128", stages=3, warpgroups=1):
    """NVRTC -> (cubin, ptxas's report) for the test unit."""
    from kernelkit.backends import cuda
    nvrtc = cuda._nvrtc()
    source = (TU.replace("ACC", acc).replace("T*", f"{ctype}*").replace("T, T", f"{ctype}, {ctype}")
              .replace("TILE", tile).replace("STAGES", str(stages)).replace("WARPGROUPS", str(warpgroups)))
    prog = cuda._check(nvrtc.nvrtcCreateProgram(source.encode(), b"wgmma.cu", 0, [], []), "create")
    try:
        opts = [f"-arch={arch}", "-std=c++17", "-default-device", f"-I{cuda.INCLUDE}",
                *(f"-I{d}" for d in cuda.cuda_include_dirs()), "--ptxas-options=-v"]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        log = cuda._log(prog)
        assert int(err) == 0, log
        size = cuda._check(nvrtc.nvrtcGetCUBINSize(prog), "size")
        cubin = b" " * size
        cuda._check(nvrtc.nvrtcGetCUBIN(prog, cubin), "cubin")
        return cubin, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_or_skip():
    try:
        from kernelkit.backends import cuda
        cuda._nvrtc()
        cuda.cuda_include_dirs()
    except Exception as e:  # noqa: BLE001 - any missing piece of NVIDIA's install
        pytest.skip(f"NVRTC unavailable: {e}")


@pytest.mark.parametrize("ctype,acc,sass,tile,stages,warpgroups",
                         [(*t, "128, 128", 3, 1) for t in TYPES] + SHAPES)
def test_compiles_for_sm90a_without_spills(ctype, acc, sass, tile, stages, warpgroups, tmp_path):
    _nvrtc_or_skip()
    cubin, log = _compile(ctype, acc, tile=tile, stages=stages, warpgroups=warpgroups)
    assert " 0 bytes spill stores" in log and "C7510" not in log, log  # C7510: serialised wgmma
    tool = shutil.which("cuobjdump") or shutil.which("nvdisasm")
    if tool is None:
        pytest.skip("no cuobjdump or nvdisasm here: the SASS check runs where the CUDA toolkit has them")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    cmd = [tool, "-sass", str(path)] if tool.endswith("cuobjdump") else [tool, str(path)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    n = tile.split(", ")[1]
    assert re.search(rf"\b{sass}\.64x{n}x", text), f"no {sass}.64x{n} in the SASS"


def test_not_supported_without_sm90a():
    """On plain sm_90 the path reports itself unsupported (wgmma needs the sm_90a target)."""
    _nvrtc_or_skip()
    with pytest.raises(AssertionError, match="sm_90a"):
        _compile("__nv_bfloat16", "float", arch="sm_90")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_tensor_ops", ROOT / "bench" / "bench_tensor_ops.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _operand(rows, cols, dtype, transposed, pad=0):
    """A rows x cols matrix, row-major or a transposed view, its rows `pad` elements apart more."""
    shape = (cols, rows) if transposed else (rows, cols)
    x = torch.randn(shape[0], shape[1] + pad, device="cuda") * (8 if dtype.itemsize == 1 else 1)
    x = x.to(dtype)[:, :shape[1]]
    return x.t() if transposed else x


CASES = [  # M, N, K, A transposed, B transposed, row padding (elements)
    (128, 128, 64, False, False, 0), (200, 136, 72, False, False, 0), (129, 257, 1000, False, True, 0),
    (300, 100, 520, True, False, 0), (65, 64, 200, True, True, 0), (1, 72, 16, False, False, 0),
    (257, 130, 99, False, False, 0), (96, 200, 136, False, True, 3)]


def _check(device, dtype, M, N, K, ta, tb, pad, **tile):
    if device.type != "cuda":
        pytest.skip("the wgmma path is the GPU's (tensor_ops' CPU loops are tested with tensor_ops)")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs a Hopper GPU")
    bench = _bench()
    bench.use_sm90a()
    a = _operand(M, K, dtype, ta, pad)
    b = _operand(K, N, dtype, tb, pad)
    out_dtype = torch.float16 if dtype == torch.float16 else torch.bfloat16
    scale = torch.tensor([0.5], device="cuda")
    out = bench.matmul(a, b, scale, out_dtype, **tile)
    ref = (a.double() @ b.double()) * 0.5
    assert out.shape == (M, N) and not out.isnan().any()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < (2e-3 if dtype == torch.float16 else 8e-3), err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2],
                         ids=str)
@pytest.mark.parametrize("M,N,K,ta,tb,pad", CASES)
def test_matches_float64(device, dtype, M, N, K, ta, tb, pad):
    _check(device, dtype, M, N, K, ta, tb, pad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("M,N,K,ta,tb,pad", [CASES[2], CASES[3], CASES[7]])
def test_two_warpgroups_share_a_tile(device, dtype, M, N, K, ta, tb, pad):
    """Warpgroups = 2: a 256-thread threadgroup computes a 256 x 128 tile, 128 rows each."""
    _check(device, dtype, M, N, K, ta, tb, pad, bm=256, bn=128, stages=4, warpgroups=2)


def test_cp_async_staging(device):
    """The staging TMA replaces, forced where TMA would be taken."""
    _check(device, torch.bfloat16, 200, 136, 520, False, True, 0, staging="cp.async")

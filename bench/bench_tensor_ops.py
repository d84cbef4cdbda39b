"""The talk's tile matmul on Hopper's tensor cores, beside cuBLAS, in one process.

Each threadgroup of 128 threads (one warpgroup) takes its BM x BN tile of C, calls
kk::tops::sm90::warpgroup_gemm::run once over all of K and stores the accumulators through
`coord` (tensor_ops/sm90_wgmma.h). Timed interleaved with torch.matmul (bf16, fp16) and
torch._scaled_mm (fp8 e4m3, per-tensor scales), B row-major (K x N, "nn") and K-major (B^T
row-major, as weights are stored, "nt"); every variant is checked against float64 first.

    PYTHONPATH=src python bench/bench_tensor_ops.py --sizes 4096 8192 --out results.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
import subprocess

import torch

import kernelkit as kk
from kernelkit.benchmarks import interleaved_ms

HEADER = """
#include <kernelkit/tensor_ops/sm90_wgmma.h>
__device__ __forceinline__ void store1(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }
__device__ __forceinline__ void store1(__half* p, float x) { *p = __float2half_rn(x); }
__device__ __forceinline__ void store2(__nv_bfloat16* p, float x, float y) {
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x, y);
}
__device__ __forceinline__ void store2(__half* p, float x, float y) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x, y);
}
"""

# Tiles are walked in bands of GROUP tile rows, down each band's columns, so that the
# threadgroups resident at once share rows of A and columns of B in L2.
BODY = """
using G = kk::tops::sm90::warpgroup_gemm<BM, BN, TA_T, TB_T, float, STAGES, WARPGROUPS>;
const int M = a_shape[0], K = a_shape[1], N = b_shape[1];
const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
const int id = blockIdx.x, band = id / (GROUP * tiles_n), first = band * GROUP;
const int rows = min(GROUP, tiles_m - first), in_band = id - band * GROUP * tiles_n;
const int m0 = (first + in_band % rows) * BM, n0 = (in_band / rows) * BN;
float acc[G::acc_per_thread];
G::run(acc, reinterpret_cast<const TA_T*>(a) + m0 * a_strides[0], a_strides[0], a_strides[1],
       reinterpret_cast<const TB_T*>(b) + n0 * b_strides[1], b_strides[0], b_strides[1],
       min(BM, M - m0), min(BN, N - n0), K, false);
const float s = scale[0];
const bool even = (N & 1) == 0;
#pragma unroll
for (int i = 0; i < G::acc_per_thread; i += 2) {
  int r, c;
  G::coord(i, threadIdx.x, r, c);
  r += m0;
  c += n0;
  if (r >= M) continue;
  if (even && c + 1 < N) {
    store2(out + (long)r * N + c, acc[i] * s, acc[i + 1] * s);
  } else {
    if (c < N) store1(out + (long)r * N + c, acc[i] * s);
    if (c + 1 < N) store1(out + (long)r * N + c + 1, acc[i + 1] * s);
  }
}
"""

TYPES = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half",
         torch.float8_e4m3fn: "__nv_fp8_e4m3", torch.float8_e5m2: "__nv_fp8_e5m2"}
_kernels: dict = {}


def use_sm90a() -> None:
    """Compile for sm_90a (wgmma) on this Hopper: until backends/cuda.py picks sm_90a for kernels
    that use tensor ops, the bench and the tests set the device's target themselves."""
    from kernelkit.backends import cuda
    dev = cuda.Device.get(torch.cuda.current_device())
    if dev.arch == "sm_90":
        dev.arch = "sm_90a"


def smem_bytes(bm: int, bn: int, stages: int) -> int:
    return stages * (bm + bn) * 128 + 1024 + 512  # warpgroup_gemm::smem_bytes


def matmul_kernel(ta, tb, bm=128, bn=128, stages=3, group=16, staging="tma", warpgroups=1):
    """A cuda_kernel: out[M, N] = scale * a[M, K] @ b[K, N], any strides, through warpgroup_gemm.
    staging="cp.async" turns TMA off (to compare the two)."""
    key = (ta, tb, bm, bn, stages, group, staging, warpgroups)
    if key not in _kernels:
        body = BODY.replace("TA_T", TYPES[ta]).replace("TB_T", TYPES[tb])
        header = ("#define KK_SM90_STAGING_CP_ASYNC 1\n" if staging == "cp.async" else "") + HEADER
        k = kk.cuda_kernel(name=f"wgmma_{bm}x{bn}_s{stages}_w{warpgroups}", input_names=["a", "b", "scale"],
                           output_names=["out"], source=body, header=header,
                           ensure_row_contiguous=False, shared_memory=smem_bytes(bm, bn, stages))
        _kernels[key] = k
    return _kernels[key]


def matmul(a, b, scale=None, out_dtype=torch.bfloat16, bm=128, bn=128, stages=3, group=16,
           staging="tma", warpgroups=1):
    """Run the kernel: a (M x K), b (K x N) torch tensors on the GPU, any strides; `warpgroups`
    warpgroups per threadgroup share each BM x BN tile (BM / warpgroups rows each)."""
    k = matmul_kernel(a.dtype, b.dtype, bm, bn, stages, group, staging, warpgroups)
    M, N = a.shape[0], b.shape[1]
    if scale is None:
        scale = torch.ones(1, device=a.device)
    tiles = ((M + bm - 1) // bm) * ((N + bn - 1) // bn)
    # fp8 travels as bytes (kernelkit's signature has no fp8 dtype); strides are unchanged.
    view = (lambda t: t.view(torch.uint8)) if a.element_size() == 1 else (lambda t: t)
    return k(inputs=[view(a), view(b), scale], output_shapes=[(M, N)], output_dtypes=[out_dtype],
             grid=(tiles * 128 * warpgroups, 1, 1), threadgroup=(128 * warpgroups, 1, 1),
             template=[("BM", bm), ("BN", bn), ("STAGES", stages), ("GROUP", group),
                       ("WARPGROUPS", warpgroups)])[0]


def rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def case(size: int, dtype, layout: str, variants: list, iters: int, rounds: int) -> list:
    M = N = K = size
    dev = "cuda"
    if dtype.itemsize == 1:  # fp8: per-tensor scales, B K-major as _scaled_mm takes it
        a32, w32 = torch.randn(M, K, device=dev), torch.randn(N, K, device=dev)
        sa, sb = a32.abs().max() / 448, w32.abs().max() / 448
        a, w = (a32 / sa).to(dtype), (w32 / sb).to(dtype)
        b = w.t()
        scale = (sa * sb).reshape(1).float()
        ref = (a.double() @ b.double()) * scale.double()
        out_dtype = torch.bfloat16
        base = ("torch._scaled_mm", lambda: torch._scaled_mm(a, b, scale_a=sa.float(), scale_b=sb.float(),
                                                              out_dtype=out_dtype))
    else:
        a = torch.randn(M, K, device=dev, dtype=dtype)
        b = torch.randn(K, N, device=dev, dtype=dtype) if layout == "nn" else \
            torch.randn(N, K, device=dev, dtype=dtype).t()
        scale = None
        ref = a.double() @ b.double()
        out_dtype = dtype
        base = ("torch.matmul", lambda: torch.matmul(a, b))
    rows = []
    fns = {base[0]: base[1]}
    errs = {base[0]: rel_err(base[1](), ref)}
    for bm, bn, stages, group, staging, wgs in variants:
        name = (f"wgmma {bm}x{bn} s{stages} g{group}" + (f" {wgs}wg" if wgs > 1 else "") +
                (" cp.async" if staging == "cp.async" else ""))
        fn = (lambda bm=bm, bn=bn, stages=stages, group=group, staging=staging, wgs=wgs:
              matmul(a, b, scale, out_dtype, bm, bn, stages, group, staging, wgs))
        errs[name] = rel_err(fn(), ref)
        fns[name] = fn
    del ref
    ms = interleaved_ms(fns, rounds, iters)
    flops = 2.0 * M * N * K
    base_tf = flops / ms[base[0]] / 1e9
    for n in fns:
        tf = flops / ms[n] / 1e9
        rows.append(dict(size=size, dtype=str(dtype).replace("torch.", ""), layout=layout, kernel=n,
                         ms=ms[n], tflops=tf, of_base=tf / base_tf, rel_err=errs[n]))
    return rows


def sass_summary() -> list:
    """Per compiled kernel of this benchmark (kernelkit's disk cache), how many tensor-core,
    TMA and cp.async instructions its SASS holds (cuobjdump), and one HGMMA/QGMMA line."""
    import tempfile
    from kernelkit import cache
    tool = shutil.which("cuobjdump")
    if tool is None:
        return []
    rows = []
    for entry in sorted(cache.cache_dir().rglob("*.cubin")):
        data = entry.read_bytes()
        if data.startswith(cache._MAGIC):  # a cache entry: magic and HMAC before the cubin
            data = data[cache._HEADER:]
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(data)
            f.flush()
            text = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True).stdout
        name = re.search(r"Function : (kk_wgmma\w+)", text)
        if name is None:
            continue
        ops = {op: len(re.findall(rf"\b{op}\b", text)) for op in
               ("HGMMA", "QGMMA", "UTMALDG", "LDGSTS", "UTMACCTL")}
        line = re.search(r"[HQ]GMMA\.\S+[^\n]*", text)
        rows.append(dict(kernel=name.group(1), **ops, example=line.group(0)[:90] if line else ""))
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16", "float8_e4m3fn"])
    p.add_argument("--layouts", nargs="+", default=["nn", "nt"])
    p.add_argument("--variants", nargs="+", default=["128x128s3g16"],
                   help="BMxBNsSTAGESgGROUP[wN][c], e.g. 128x128s3g16, 256x128s4g16w2: N warpgroups "
                        "a threadgroup; a trailing c: cp.async staging")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--sass", action="store_true", help="count HGMMA/QGMMA/TMA in each kernel's SASS")
    args = p.parse_args()
    use_sm90a()
    variants = []
    for v in args.variants:
        staging = "cp.async" if v.endswith("c") else "tma"
        v, _, wgs = v.rstrip("c").partition("w")
        tile, rest = v.split("s")
        stages, group = rest.split("g")
        bm, bn = tile.split("x")
        variants.append((int(bm), int(bn), int(stages), int(group), staging, int(wgs or 1)))
    rows = []
    for size in args.sizes:
        for dname in args.dtypes:
            dtype = getattr(torch, dname)
            for layout in (["nt"] if dtype.itemsize == 1 else args.layouts):
                rows += case(size, dtype, layout, variants, args.iters, args.rounds)
                torch.cuda.empty_cache()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"))
    sass = sass_summary() if args.sass else []
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows, sass=sass), f, indent=1)
    for r in sass:
        print(r)
    print(meta)
    print(f"{'size':>5} {'dtype':>14} {'lay':>3} {'kernel':<35} {'ms':>8} {'TFLOP/s':>8} {'of base':>7} {'rel err':>8}")
    for r in rows:
        print(f"{r['size']:>5} {r['dtype']:>14} {r['layout']:>3} {r['kernel']:<35} {r['ms']:8.3f} "
              f"{r['tflops']:8.1f} {r['of_base']:7.1%} {r['rel_err']:8.1e}")


if __name__ == "__main__":
    main()

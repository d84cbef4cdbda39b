"""The talk's matmul, written as in the talk (a metal_kernel body: tensor views of the inputs,
each threadgroup slices its tile, matmul2d<descriptor, execution_simdgroups<N>>::run once over
all of K, dynamic K), beside torch.matmul in one process: the issue's speed acceptance for the
tensor-op layer (bench_tensor_ops.py times warpgroup_gemm called directly).

    PYTHONPATH=src python bench/bench_talk_matmul.py --sizes 8192 4096 --out results.json
    PYTHONPATH=src python bench/bench_talk_matmul.py --inspect   # no GPU: ptxas's report

Variants: TILEMxTILEN on execution_simdgroups<SG> (SG * 32 threads a threadgroup); "b16" walks
the tiles in bands of 16 tile rows (tile ids remapped in the body) so that the threadgroups in
flight share rows of A and columns of B in L2; without it the grid's x runs along N.
"standalone": bench_tensor_ops.py's cuda_kernel calling warpgroup_gemm<256, 128, .., 4 stages,
2 warpgroups> directly (bands of 16), the number the layer's path should match.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys

import torch

import kernelkit as kk
from kernelkit.benchmarks import interleaved_ms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_tensor_ops  # noqa: E402

HEADER = """#include <metal_tensor>
#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>
using namespace metal;
using namespace mpp::tensor_ops;
"""

BODY = """
  const int M = a_shape[0], K = a_shape[1], N = b_shape[1];
  int tm = threadgroup_position_in_grid.y, tn = threadgroup_position_in_grid.x;
  if (BAND > 0) {  // bands of BAND tile rows, walked down their columns
    const int tiles_m = threadgroups_per_grid.y, tiles_n = threadgroups_per_grid.x;
    const int id = tm * tiles_n + tn, first = id / (BAND * tiles_n) * BAND;
    const int rows = min(BAND, tiles_m - first), in_band = id - first * tiles_n;
    tm = first + in_band % rows;
    tn = in_band / rows;
  }
  auto A = tensor(a, dextents<int, 2>(K, M));
  auto B = tensor(b, dextents<int, 2>(N, K));
  auto C = tensor(c, dextents<int, 2>(N, M));
  auto tA = A.slice(0, tm * TILEM);
  auto tB = B.slice(tn * TILEN, 0);
  auto tC = C.slice(tn * TILEN, tm * TILEM);
  constexpr auto descriptor = matmul2d_descriptor(TILEM, TILEN, dynamic_length_v<int>, false, false);
  matmul2d<descriptor, execution_simdgroups<SG>> op;
  op.run(tA, tB, tC);
"""

MSL = {torch.bfloat16: "bfloat", torch.float16: "half", torch.float32: "float"}
VARIANTS = ["256x128sg8b16", "256x128sg8b8", "256x128sg8", "128x128sg4b16", "128x128sg4", "standalone"]
_kernels: dict = {}


def parse(v: str):
    m = re.fullmatch(r"(\d+)x(\d+)sg(\d+)(?:b(\d+))?", v)
    return int(m[1]), int(m[2]), int(m[3]), int(m[4] or 0)


def kernel(dtype, out_dtype, v):
    key = (dtype, out_dtype, v)
    if key not in _kernels:
        _kernels[key] = kk.metal_kernel(f"talk_matmul_{v}", ["a", "b"], ["c"], BODY, header=HEADER)
    return _kernels[key]


def call_args(a, b, out_dtype, v):
    tm, tn, sg, band = parse(v)
    M, N = a.shape[0], b.shape[1]
    return dict(inputs=[a, b], output_shapes=[(M, N)], output_dtypes=[out_dtype],
                grid=(32 * sg * -(-N // tn), -(-M // tm), 1), threadgroup=(32 * sg, 1, 1),
                template=[("TILEM", tm), ("TILEN", tn), ("SG", sg), ("BAND", band)])


def inspect():
    """No GPU: each variant compiled for sm_90a; ptxas's registers, spills and warnings (C7510:
    wgmma serialised), and the dynamic shared memory the backend would give."""
    from kernelkit.backends import cuda
    meta = torch.empty(256, 256, dtype=torch.bfloat16, device="meta")
    for dt, out in [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]:
        for v in VARIANTS[:-1]:  # (not "standalone": bench_tensor_ops.py's kernel)
            a = call_args(meta, meta, out, v)
            compiled = kk.compile_for(kernel(dt, out, v), "sm_90", **{k: a[k] for k in ("inputs", "output_dtypes",
                                                                                         "template")})
            src = compiled.source
            k = kernel(dt, out, v)
            flags = tuple(k.dialect.compile_flags("cuda", k.math_mode))
            nvrtc = cuda._nvrtc()
            prog = cuda._check(nvrtc.nvrtcCreateProgram(src.encode(), b"k.cu", 0, [], []), "create")
            opts = [f"-arch={compiled.arch}", "-std=c++20", "-default-device", f"-I{cuda.INCLUDE}",
                    *(f"-I{d}" for d in cuda.cuda_include_dirs()), *cuda._MATH_FLAGS[k.math_mode], *flags,
                    "--ptxas-options=-v"]
            (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
            log = cuda._log(prog)
            nvrtc.nvrtcDestroyProgram(prog)
            info = " | ".join(ln.strip() for ln in log.splitlines()
                              if re.search(r"registers|spill|C7510|warning", ln))
            print(f"{MSL[dt]}->{MSL[out]} {v} ({compiled.arch}): smem {cuda.tensor_ops_shared(compiled.binary)} B; "
                  f"{info}")


def sass_counts(binary: bytes) -> dict:
    """Counts of the tensor-core, staging and store instructions in the kernel's SASS (cuobjdump or
    nvdisasm, where installed)."""
    tool = shutil.which("cuobjdump") or shutil.which("nvdisasm")
    if tool is None:
        return {}
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(binary)
        f.flush()
        sass = subprocess.run([tool, "-sass" if tool.endswith("cuobjdump") else "-c", f.name],
                              capture_output=True, text=True).stdout
    return {op: len(re.findall(rf"\b{op}\b", sass)) for op in ("HGMMA", "QGMMA", "HMMA", "UTMALDG", "LDGSTS", "STG.E", "STL")}


def _compile(job):
    """Compiles one kernel into kernelkit's on-disk cache (in a worker process)."""
    name, v, size = job
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}[name]
    meta = torch.empty(size, size, dtype=dt, device="meta")
    ca = call_args(meta, meta, dt, v)
    kk.compile_for(kernel(dt, dt, v), "sm_90", inputs=ca["inputs"], output_dtypes=ca["output_dtypes"],
                   template=ca["template"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="+", default=[4096, 8192])
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp16"])
    p.add_argument("--variants", nargs="+", default=VARIANTS)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out")
    p.add_argument("--inspect", action="store_true")
    args = p.parse_args()
    if args.inspect:
        return inspect()
    # NVRTC takes seconds a kernel: compile them all at once first (spawned workers, before CUDA starts)
    import concurrent.futures
    import multiprocessing
    jobs = [(n, v, s) for n in args.dtypes for v in args.variants if v != "standalone" for s in args.sizes[:1]]
    with concurrent.futures.ProcessPoolExecutor(min(len(jobs), os.cpu_count() or 1) or 1,
                                                mp_context=multiprocessing.get_context("spawn")) as ex:
        list(ex.map(_compile, jobs))
    if "standalone" in args.variants:
        bench_tensor_ops.use_sm90a()
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    rows, sass = [], {}
    for size in args.sizes:
        for name in args.dtypes:
            dt = dtypes[name]
            a = torch.randn(size, size, device="cuda", dtype=dt)
            b = torch.randn(size, size, device="cuda", dtype=dt)
            ref = a.double() @ b.double()
            ref_norm = ref.norm()
            fns = {"torch": lambda: torch.matmul(a, b)}
            errs = {"torch": ((torch.matmul(a, b).double() - ref).norm() / ref_norm).item()}
            for v in args.variants:
                if v == "standalone":
                    fns[v] = (lambda: bench_tensor_ops.matmul(a, b, out_dtype=dt, bm=256, bn=128, stages=4,
                                                              warpgroups=2))
                else:
                    k, ca = kernel(dt, dt, v), call_args(a, b, dt, v)
                    fns[v] = (lambda k=k, ca=ca: k(**ca)[0])
                    if v not in sass:
                        sass[v] = sass_counts(kk.compile_for(k, "sm_90", inputs=[a, b], output_dtypes=[dt],
                                                             template=ca["template"]).binary)
                errs[v] = ((fns[v]().double() - ref).norm() / ref_norm).item()
            del ref
            torch.cuda.empty_cache()
            ms = interleaved_ms(fns, args.rounds, args.iters)
            flop = 2 * size ** 3
            for n, t in ms.items():
                rows.append(dict(size=size, dtype=name, variant=n, ms=t, tflops=flop / t / 1e9,
                                 ratio=ms["torch"] / t, rel_err=errs[n],
                                 ok=errs[n] <= 2 * errs["torch"] + 1e-6, sass=sass.get(n, {})))
            report(rows, args, len(ms))  # after each case: a run cut short keeps what it measured


def report(rows, args, new):
    """Prints the last `new` rows; writes them all to --out."""
    print(f"{'size':>5} {'dtype':>5} {'variant':>15} {'ms':>8} {'TFLOP/s':>8} {'of torch':>8} {'rel err':>9} ok  sass")
    for r in rows[-new:]:
        print(f"{r['size']:>5} {r['dtype']:>5} {r['variant']:>15} {r['ms']:8.3f} {r['tflops']:8.0f} "
              f"{100 * r['ratio']:7.1f}% {r['rel_err']:9.2e} {'y' if r['ok'] else 'N'}  {r['sass']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                           command="PYTHONPATH=src python bench/bench_talk_matmul.py " +
                           " ".join(f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                                    for k, v in vars(args).items() if v not in (None, False)),
                           rows=rows), f, indent=1)


if __name__ == "__main__":
    main()

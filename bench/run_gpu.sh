#!/usr/bin/env bash
# One call on a GPU machine: the test suite (CUDA variants included), then the benchmarks.
# Results land in ${OUT:-bench/results}; the last lines printed are a short table.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-bench/results}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export KERNELKIT_CACHE_DIR=${KERNELKIT_CACHE_DIR:-$(mktemp -d)}
tag=$(python3 -c "import torch; print(torch.cuda.get_device_name().split()[1].lower())")
python3 -m pytest -q "$@" > "$out/pytest-$tag.log" 2>&1; rc=$?
python3 -W ignore bench/bench_grid_sample.py --out "$out/grid_sample-$tag.json" > "$out/bench-$tag.log" 2>&1
python3 -W ignore bench/bench_overhead.py --out "$out/overhead-$tag.json" >> "$out/bench-$tag.log" 2>&1
python3 -W ignore bench/bench_ops.py --out "$out/ops-$tag.json" >> "$out/bench-$tag.log" 2>&1
tail -3 "$out/pytest-$tag.log"
python3 - "$out" "$tag" <<'PY'
import json, sys
out, tag = sys.argv[1:]
g = json.load(open(f"{out}/grid_sample-{tag}.json"))
o = json.load(open(f"{out}/overhead-{tag}.json"))
ops = json.load(open(f"{out}/ops-{tag}.json"))
gs, mm = ops["grid_sample_bilinear_zeros_float32"], ops["matmul_add_relu_batch8_2048"]
rows = [("grid_sample fwd (ms)", g["forward_ms"]["kernelkit"], g["forward_ms"]["hand_port"]),
        ("grid_sample vjp (ms)", g["vjp_ms"]["kernelkit"], g["vjp_ms"]["hand_port"]),
        ("cold first call (s)", g["compile"]["cold_first_call_s"], None),
        ("warm-disk first call (s)", g["compile"]["warm_disk_first_call_s"], None),
        ("call overhead (us)", o["kernelkit_call_us"], o["torch_add__us"]),
        ("op grid_sample fwd (ms)", gs["forward_ms"]["kernelkit"], gs["forward_ms"]["torch_grid_sample_nchw"]),
        ("op grid_sample fwd+bwd (ms)", gs["forward_backward_ms"]["kernelkit"],
         gs["forward_backward_ms"]["torch_grid_sample_nhwc_view"]),
        ("matmul_add_relu bf16 (TFLOP/s)", mm["bfloat16"]["kernelkit_tflops"], mm["bfloat16"]["torch_tflops"]),
        ("matmul_add_relu fp32 (TFLOP/s)", mm["float32"]["kernelkit_tflops"], mm["float32"]["torch_tflops"])]
print(f"{'':28}{'kernelkit':>12}{'reference':>12}")
for name, ours, ref in rows:
    print(f"{name:28}{ours:12.4f}{'' if ref is None else f'{ref:12.4f}'}")
PY
exit $rc

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
tail -3 "$out/pytest-$tag.log"
python3 - "$out" "$tag" <<'PY'
import json, sys
out, tag = sys.argv[1:]
g = json.load(open(f"{out}/grid_sample-{tag}.json"))
o = json.load(open(f"{out}/overhead-{tag}.json"))
rows = [("grid_sample fwd (ms)", g["forward_ms"]["kernelkit"], g["forward_ms"]["hand_port"]),
        ("grid_sample vjp (ms)", g["vjp_ms"]["kernelkit"], g["vjp_ms"]["hand_port"]),
        ("cold first call (s)", g["compile"]["cold_first_call_s"], None),
        ("warm-disk first call (s)", g["compile"]["warm_disk_first_call_s"], None),
        ("call overhead (us)", o["kernelkit_call_us"], o["torch_add__us"])]
print(f"{'':28}{'kernelkit':>12}{'reference':>12}")
for name, ours, ref in rows:
    print(f"{name:28}{ours:12.4f}{'' if ref is None else f'{ref:12.4f}'}")
PY
exit $rc

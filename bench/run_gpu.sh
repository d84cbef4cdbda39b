#!/usr/bin/env bash
# One call on a GPU machine: `kernelkit doctor`, the test suite (CUDA variants included),
# `kernelkit demo` (seed sizes) and the benchmark suite (`kernelkit bench`; BENCH_ARGS="--quick"
# for smaller sizes). Everything lands in ${OUT:-bench/results}/<device-tag>/: doctor.txt,
# pytest.log, demo.txt, demo.png, bench.log, <benchmark>.json, results.md, <benchmark>.png
# (RESULTS= picks another root; with $OUT set, they are also archived into $OUT; TESTS=0 skips
# the test suite, for a run that only measures).
# The last lines printed are the demo's table and the benchmarks' Markdown tables.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${RESULTS:-bench/results}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export KERNELKIT_CACHE_DIR=${KERNELKIT_CACHE_DIR:-$(mktemp -d)}
tag=$(python3 -c "import torch; from kernelkit.benchmarks import device_tag, best_device; print(device_tag(best_device()))")
dir="$out/$tag"
mkdir -p "$dir"
python3 -m kernelkit doctor > "$dir/doctor.txt" 2>&1
rc=0
if [ "${TESTS:-1}" != 0 ]; then python3 -m pytest -q "$@" > "$dir/pytest.log" 2>&1 || rc=1; fi
python3 -W ignore -m kernelkit demo --plot "$dir/demo.png" > "$dir/demo.txt" 2>&1 || rc=1
# shellcheck disable=SC2086
python3 -W ignore -m kernelkit bench ${BENCH_ARGS:-} --out "$dir" > "$dir/bench.log" 2>&1 || rc=1
if [ -f "$dir/pytest.log" ]; then tail -3 "$dir/pytest.log"; fi
cat "$dir/demo.txt"
if [ -f "$dir/results.md" ]; then cat "$dir/results.md"; fi
grep -E "^(note|FAILED)" "$dir/bench.log"
# On the lent GPU machine ($OUT set) everything comes back as one archive.
if [ -n "${OUT:-}" ]; then tar -czf "$OUT/results-$tag.tgz" -C "$out" "$tag"; fi
exit $rc

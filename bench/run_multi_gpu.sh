#!/usr/bin/env bash
# Issue 20 on a machine with two NVIDIA GPUs (no network, no pip): the multi-GPU tests
# (tests/test_multi_gpu.py, tests/test_devices.py), then examples/multi_gpu_ddp.py under
# `torchrun --nproc-per-node=2` with a cold compile cache shared by both ranks, then the same
# warm. Logs land in ${OUT:-bench/results/multi_gpu}/; the last lines printed are the summary.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# NVLink multicast stays off (the lent machines' rule; the DDP check needs none)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dir=${OUT:-bench/results/multi_gpu}
mkdir -p "$dir"
export KERNELKIT_CACHE_DIR=$(mktemp -d)  # cold for the tests (the torchrun test makes its own)
ddp_cache=$(mktemp -d)

nvidia-smi -L > "$dir/gpus.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'GPUs', torch.cuda.device_count())" \
    >> "$dir/gpus.txt" 2>&1

python3 -m pytest -q -rs tests/test_multi_gpu.py tests/test_devices.py > "$dir/pytest.log" 2>&1
tests_rc=$?

ddp() {  # $1: the log's name
    KERNELKIT_CACHE_DIR=$ddp_cache python3 -m torch.distributed.run --standalone \
        --nproc-per-node=2 examples/multi_gpu_ddp.py > "$dir/$1" 2>&1
}
ddp ddp_cold.log; cold_rc=$?
ddp ddp_warm.log; warm_rc=$?
KERNELKIT_CACHE_DIR=$ddp_cache python3 -m kernelkit cache list > "$dir/ddp_cache.txt" 2>&1

echo "== summary (logs in $dir) =="
cat "$dir/gpus.txt"
grep -E "^(FAILED|ERROR)|needs two NVIDIA GPUs" "$dir/pytest.log"
echo "tests (rc $tests_rc): $(tail -1 "$dir/pytest.log")"
for run in cold warm; do
    echo "torchrun DDP, $run cache:"
    grep -E "DDP gradients|Error|error" "$dir/ddp_$run.log" | head -5
done
echo "torchrun DDP rc: cold $cold_rc, warm $warm_rc; shared cache: $(head -1 "$dir/ddp_cache.txt")"
[ "$tests_rc" = 0 ] && [ "$cold_rc" = 0 ] && [ "$warm_rc" = 0 ]

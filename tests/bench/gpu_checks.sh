#!/usr/bin/env bash
# Issue 17's GPU checks in one go, on a machine with a CUDA GPU and this project's Python packages:
# the CUDA-marked tests, the DP-SGD throughput table (batch 256 / 1024 / 4096) and the PATE teachers
# table (250 MNIST teachers, stacked ensemble against the one-by-one loop). Each part has its own time
# limit, so one that hangs still leaves the others' results. Each part's output is also written to OUT.
#
#   tests/bench/gpu_checks.sh DATA_DIR [OUT]      # DATA_DIR holds mnist/ (the four IDX .gz files)
set -u
data=${1:?usage: tests/bench/gpu_checks.sh DATA_DIR [OUT]  (DATA_DIR holds mnist/)}
out=${2:-.}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 QT_QPA_PLATFORM=offscreen
mkdir -p "$out"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"
"$py" -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| cuda', torch.version.cuda, '|', torch.cuda.get_device_name(0))" 2>&1 | tee -a "$out/gpu.txt"

echo "== CUDA tests"
DPW_TEST_MNIST_DIR="$data/mnist" timeout "${CUDA_TESTS_S:-230}" \
  "$py" -m pytest -m cuda tests/engine/test_cuda.py tests/engine/test_cuda_graphs.py -v -p no:cacheprovider 2>&1 | tee "$out/cuda_tests.txt"

echo "== DP-SGD throughput"
timeout "${BENCH_DPSGD_S:-170}" "$py" tests/bench/bench_dpsgd.py --data-dir "$data" --device cuda \
  --batches 256,1024,4096 --no-memory 2>&1 | tee "$out/bench_dpsgd.txt"

echo "== PATE teachers"
timeout "${BENCH_PATE_S:-150}" "$py" tests/bench/bench_pate.py --data-dir "$data" --device cuda --only-teachers \
  --teachers 250 --group-sizes auto,50,250 2>&1 | tee "$out/bench_pate.txt"

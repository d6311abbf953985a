#!/usr/bin/env bash
# The one prepared run of a session lent a GPU (docs/gpu.md): the GPU tier, then the --device cuda
# benchmarks; each part's output goes under $OUT (./gpu-check-out elsewhere) as it runs, so a run cut
# short keeps what finished. Run from the repository root, with the wheels of `make gpu-wheels` carried
# in .whl/ (the machine has torch, numpy, pytest and tensorboard, not pyzmq, pydantic or DeepSpeed).
#
#   bash benchmarks/gpu_check.sh [tests] [overhead] [checkpoints] [large]  (no argument: the first three)
#
# Sized for one 10-minute device command: the tier ~3 min, each benchmark part ~2-3 min. `large` (the largest
# model ZeRO-2 trains and the largest ZeRO-3 + CPU offload trains, benchmarks/largest_model.py, 4-5 min) is
# not in the default run, which it would push past 10 minutes: run it as its own device command,
# `bash benchmarks/gpu_check.sh large` (timeout_s 420), on its own or after the default run.
set -u
out_dir=${OUT:-gpu-check-out}
mkdir -p "$out_dir"
py=${PYTHON:-python3}
if [ -d .whl ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH="/tmp/site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 DET_DEEPSPEED_SHM_COMM=0
# the modules holding gpu-marked tests: collecting the whole suite would import the UI and Ray extras
gpu_modules="tests/gpu/test_gpu.py tests/pytorch/test_pytorch_amp_resume.py tests/pytorch/checkpoint/test_snapshot_buffers.py \
tests/deepspeed/test_deepspeed_resume_device.py tests/pytorch/metrics/test_pytorch_metrics.py"

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
} > "$out_dir/card.txt" 2>&1
"$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA here: this script is for a GPU \
machine (make test-gpu runs, or lists as skipped, the tier anywhere)')" || exit 1

status=0
for part in ${*:-tests overhead checkpoints}; do
  case $part in
    tests)
      # shellcheck disable=SC2086  # the module list splits on purpose
      "$py" -m pytest -m gpu -v -rs -p no:cacheprovider $gpu_modules 2>&1 | tee "$out_dir/test-gpu.txt"
      status=$((status | PIPESTATUS[0])) ;;
    overhead)
      "$py" benchmarks/overhead.py --device cuda --rounds 7 --batches 1000 --period 250 2>&1 \
        | tee "$out_dir/overhead-launch-bound.txt"
      status=$((status | PIPESTATUS[0]))
      "$py" benchmarks/overhead.py --device cuda --shape gpu-bound --rounds 7 --batches 300 --period 100 \
        --report 50 2>&1 | tee "$out_dir/overhead-gpu-bound.txt"
      status=$((status | PIPESTATUS[0])) ;;
    checkpoints)
      # batches of 4096 (~20 ms a step): each write ends well within the 100 batches before the next
      "$py" benchmarks/async_checkpoint.py --device cuda --width 4096 --optimizer adamw --batch 4096 --rounds 7 \
        --batches 300 --period 100 2>&1 | tee "$out_dir/async-checkpoint.txt"
      status=$((status | PIPESTATUS[0])) ;;
    large)
      # one JSON line per try as it ends (a cut-short run keeps them), then the summary and the ratio
      "$py" benchmarks/largest_model.py 2>&1 | tee "$out_dir/largest-model.txt"
      status=$((status | PIPESTATUS[0])) ;;
    *)
      echo "unknown part '$part': choose from tests, overhead, checkpoints, large" >&2
      exit 2 ;;
  esac
done
exit "$status"

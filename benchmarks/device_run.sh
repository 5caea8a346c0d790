#!/usr/bin/env bash
# One call on the GPU machine (through the device tool): install the carried wheels, then run
# the stages named in $@ (tests, kernels, flex, gatedact, throughput:<model>:<workload>[:extra args],
# parity:<model>, worker:<model>:<workload>[:extra args]: also needs the .whl-worker wheels).
# Logs and results go to $OUT (the tool brings them back). See docs/performance.md.
# STAGE_TIMEOUT (seconds, default 3000: set it under the device call's limit, e.g. 555) bounds the
# throughput and worker stages, so a long one still ends before the call's limit and the files
# come back; PROFILE=0 skips the per-op profiles.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
FINAL=${OUT:-/tmp/out}; OUT=/tmp/run; mkdir -p "$OUT" "$FINAL"  # everything is tarred into $FINAL/run.tgz (8-file limit)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv
num=0
for stage in "$@"; do
  num=$((num + 1))  # in the file names: two stages of one workload do not overwrite each other
  IFS=: read -r kind model workload extra <<<"$stage"
  echo "=== $stage ($(date +%T))"
  case $kind in
    tests) python3 -m pytest -q -m gpu -p no:cacheprovider tests/engine/kernels tests/engine/layers/test_attention_cuda.py tests/engine/checks/test_gpu_parity.py tests/engine/extraction/test_gpu_slots.py 2>&1 | tee "$OUT/gpu_tests.log" | tail -30 ;;
    kernels) python3 benchmarks/kernel_bench.py --out "$OUT/kernels.json" 2>&1 | tee "$OUT/kernel_bench.log" | tail -50 ;;
    flex) python3 benchmarks/flex_options.py --variants tma --probe-mask-cost --out "$OUT/flex-$num.json" 2>&1 | grep -v Warning | tail -20 ;;
    gatedact) python3 benchmarks/gated_act_options.py --out "$OUT/gated-act-$num.json" 2>&1 | grep -v Warning | tail -20 ;;
    throughput) profile=(); [ "${PROFILE:-1}" = 0 ] || profile=(--profile "$OUT/profile-$workload-$model-$num.txt")
      TORCH_LOGS=recompiles timeout "${STAGE_TIMEOUT:-3000}" python3 benchmarks/throughput.py --model "$model" --workload "$workload" --commit "${COMMIT:-unknown}" "${profile[@]}" $extra 2>&1 | tee "$OUT/throughput-$workload-$model-$num.log" | grep -v Warning | tail -40 ;;
    worker) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-worker/*.whl || exit 1
      timeout "${STAGE_TIMEOUT:-3000}" python3 benchmarks/worker_throughput.py --model "$model" --workload "$workload" --commit "${COMMIT:-unknown}" $extra 2>&1 | tee "$OUT/worker-$workload-$model-$num.log" | grep -v Warning | tail -20 ;;
    parity) python3 benchmarks/gpu_parity.py --model "$model" --layer-std 0.5 --logit-std 4 1 $extra --out "$OUT/parity-$model$workload.json" 2>&1 | tee "$OUT/parity-$model.log" | tail -20 ;;
  esac
  cp benchmarks/results/*.json benchmarks/results/*.md "$OUT/" 2>/dev/null
  tar czf "$FINAL/run.tgz" -C "$OUT" .  # after every stage: a timeout still brings back what ran
done
cp benchmarks/results/*.json benchmarks/results/*.md "$OUT/" 2>/dev/null
tar czf "$FINAL/run.tgz" -C "$OUT" . && ls "$OUT"

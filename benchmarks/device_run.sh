#!/usr/bin/env bash
# One call on the GPU machine (through the device tool): install the carried wheels, then run
# the stages named in $@ (tests[:<test path>, default tests/engine], kernels, decodemm[:<rows,...>], flex, gatedact, throughput:<model>:<workload>[:extra args],
# parity:<model>, script:<path to a python script>[:<its args>], worker:<model>:<workload>[:extra args] and service:<model>:<workload>[:extra args]:
# these two and tests also need the .whl-worker wheels). Tokenizers come as .tok/ or, smaller, as
# .tokgz/<name>.tgz (unpacked into .tok/ here).
# Each script writes its result into benchmarks/results/ under the name of what it measures
# (benchmarks/result_files.py), with $COMMIT inside (pass it as a literal hash: the copy's own git, if any, need not be at its tree's commit); this run's
# new result files and the logs come back in $OUT/run.tgz. See docs/performance.md.
# STAGE_TIMEOUT (seconds, default 3000: set it under the device call's limit, e.g. 555) bounds the
# throughput and worker stages, so a long one still ends before the call's limit and the files
# come back; PROFILE=0 skips the per-op profiles.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false COMMIT=${COMMIT:-unknown}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
for archive in .tokgz/*.tgz; do [ -e "$archive" ] && { mkdir -p .tok && tar xzf "$archive" -C .tok; }; done  # tokenizers carried gzipped
export PYTHONPATH=/tmp/site:$PWD
FINAL=${OUT:-/tmp/out}; OUT=/tmp/run; mkdir -p "$OUT/results" "$FINAL"  # everything is tarred into $FINAL/run.tgz (8-file limit)
touch /tmp/run.start  # result files newer than this are this run's
nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv
num=0
for stage in "$@"; do
  num=$((num + 1))  # in the log names: two stages of one kind keep both logs
  IFS=: read -r kind model workload extra <<<"$stage"
  echo "=== $stage ($(date +%T))"
  case $kind in
    tests) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-worker/*.whl || exit 1  # redis: tests/conftest.py
      log="$OUT/results/gpu-tests.log"; [ -z "$model" ] || log="$OUT/gpu-tests-$num.log"  # tests:<path>: a part, not the record
      { echo "commit $COMMIT, $(date +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader): python3 -m pytest -q -m gpu -p no:cacheprovider ${model:-tests/engine} --tb=short"
        python3 -m pytest -q -m gpu -p no:cacheprovider "${model:-tests/engine}" --tb=short 2>&1 | grep -v Warning | tail -40; } | tee "$log" | tail -30 ;;
    kernels) python3 benchmarks/kernel_bench.py 2>&1 | tee "$OUT/kernels-$num.log" | tail -50 ;;
    decodemm) python3 benchmarks/decode_matmul_options.py ${model:+--rows $model} 2>&1 | tee "$OUT/decodemm-$num.log" | tail -25 ;;
    flex) python3 benchmarks/flex_options.py --variants tma --probe-mask-cost 2>&1 | grep -v Warning | tail -20 ;;
    gatedact) python3 benchmarks/gated_act_options.py 2>&1 | grep -v Warning | tail -20 ;;
    throughput) profile=(); [ "${PROFILE:-1}" = 0 ] || profile=(--profile)
      TORCH_LOGS=recompiles timeout "${STAGE_TIMEOUT:-3000}" python3 benchmarks/throughput.py --model "$model" --workload "$workload" "${profile[@]}" $extra 2>&1 | tee "$OUT/throughput-$workload-$model-$num.log" | grep -v Warning | tail -40 ;;
    worker) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-worker/*.whl || exit 1
      timeout "${STAGE_TIMEOUT:-3000}" python3 benchmarks/worker_throughput.py --model "$model" --workload "$workload" $extra 2>&1 | tee "$OUT/worker-$workload-$model-$num.log" | grep -v Warning | tail -20 ;;
    service) python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl-worker/*.whl || exit 1
      timeout "${STAGE_TIMEOUT:-3000}" python3 benchmarks/service_load.py --model "$model" --workload "$workload" $extra 2>&1 | tee "$OUT/service-$workload-$model-$num.log" | grep -v Warning | tail -30 ;;
    script) timeout "${STAGE_TIMEOUT:-3000}" python3 "$model" $workload $extra 2>&1 | tee "$OUT/script-$num.log" | grep -v Warning | tail -120 ;;
    parity) python3 benchmarks/gpu_parity.py --model "$model" --layer-std 0.5 --logit-std 4 1 $extra 2>&1 | tee "$OUT/parity-$model-$num.log" | tail -20 ;;
  esac
  find benchmarks/results -type f -newer /tmp/run.start -exec cp {} "$OUT/results/" \;
  tar czf "$FINAL/run.tgz" -C "$OUT" .  # after every stage: a timeout still brings back what ran
done
ls "$OUT" "$OUT/results"

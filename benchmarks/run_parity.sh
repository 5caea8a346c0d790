#!/usr/bin/env bash
# Real-model parity runs on the CPU (the tiny configs run in CI). Usage:
#   bash benchmarks/run_parity.sh MODEL [CONTENTS]
# Writes benchmarks/results/parity-cpu-MODEL.txt (named as benchmarks/result_files.py names
# results) with the command, commit, machine and result.
set -uo pipefail
model=$1; contents=${2:-20}
out=benchmarks/results/parity-cpu-$model.txt
cmd="spinf-jobs parity --model $model --contents $contents"
{
  echo "command: $cmd"
  echo "commit: $(git rev-parse --short HEAD)  date: $(date -u +%FT%TZ)  machine: $(nproc) CPU cores, no GPU, float32"
  start=$(date +%s)
  python3 -m spinf_jobs.cli parity --model "$model" --contents "$contents" 2>/dev/null
  echo "exit=$?  wall_s=$(( $(date +%s) - start ))"
} > "$out"
cat "$out"

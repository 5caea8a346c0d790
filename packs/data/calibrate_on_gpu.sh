#!/usr/bin/env bash
# Score the official packs' labelled sets on the GPU machine with the default model (bf16, the GPU
# workers' numerics) and bring the raw scores back; the fits are made here with
# `spinf-jobs calibrate --scores` (no model needed). Run through the device tool, after the
# default model's GGUF was carried over in pieces and concatenated into $GGUF:
#   carry .whl (pydantic, orjson, gguf ... wheels), .calib/<served name>/ (the converted folder
#   without model.safetensors), .data/labelled/ (python3 packs/data/make_labelled.py)
#   bash packs/data/calibrate_on_gpu.sh             # -> $OUT/calibration-scores.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
GGUF=${GGUF:-/root/model.gguf}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD SPINF_CACHE_DIR=/root/spinf-cache
FINAL=${OUT:-/tmp/out}; REPORTS=/tmp/calibration; mkdir -p "$FINAL" "$REPORTS"
python3 packs/data/gpu_checkpoint.py "$GGUF" .calib/qwen2.5-coder-1.5b-instruct || exit 1
for pair in moderation:fixtures/labelled/moderation.jsonl support-triage:fixtures/labelled/support.jsonl \
            news-topics:.data/labelled/news-topics.jsonl product-reviews:.data/labelled/product-reviews.jsonl; do
  IFS=: read -r pack data <<<"$pair"
  echo "=== spinf/$pack ($(date +%T))"
  python3 -m spinf_jobs.cli calibrate --pack "spinf/$pack" --data "$data" --device cuda --batch-size 64 \
    --model qwen2.5-coder-1.5b-instruct --reports-dir "$REPORTS" --no-write 2>&1 | tail -4
  tar czf "$FINAL/calibration-scores.tgz" -C "$REPORTS" .  # after every pack: a timeout keeps what ran
done

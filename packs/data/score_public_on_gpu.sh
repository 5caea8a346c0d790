#!/usr/bin/env bash
# Score the four public labelled sets (packs/data/public_sets.py) on the GPU machine with the
# default model (bf16) and bring the scores back. Run through the device tool, after the
# default model's GGUF parts were carried over one per call into /root/stage/ (each part is
# 50 MiB, a call carries at most 64 MiB), with .whl (pydantic, orjson, gguf ... wheels) and
# .cache/gpu/calib/<served name>/ (the converted folder without model.safetensors) and
# .cache/gpu/rows/ (`python3 packs/data/public_sets.py export --out .cache/gpu/rows`) carried
# and copied to /root/stage/ in the first call:
#   bash packs/data/score_public_on_gpu.sh        # -> $OUT/public-scores.tgz
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD SPINF_CACHE_DIR=/root/spinf-cache
FINAL=${OUT:-/tmp/out}; REPORTS=/tmp/public; mkdir -p "$FINAL" "$REPORTS"
if [ ! -f /root/model.gguf ]; then cat /root/stage/part{01..22}.bin > /root/model.gguf || exit 1; fi
python3 packs/data/gpu_checkpoint.py /root/model.gguf /root/stage/calib/qwen2.5-coder-1.5b-instruct || exit 1
for name in rotten-tomatoes amazon-food convention-speeches bbc-news; do
  echo "=== $name ($(date +%T))"
  python3 packs/data/public_sets.py score "$name" --device cuda --batch-size 64 --reports-dir "$REPORTS" \
    --max-minutes 6 --rows-dir /root/stage/rows 2>&1 | tail -2
  tar czf "$FINAL/public-scores.tgz" -C "$REPORTS" .  # after every set: a timeout keeps what ran
done

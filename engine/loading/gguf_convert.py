"""GGUF file -> HF safetensors folder, one tensor at a time.

    GGUF --(transformers: config + tokenizer from GGUF metadata)--> config.json, tokenizer files
         --(gguf reader, dequantize, transformers' name map + tensor processor)--> model.safetensors

transformers' own `from_pretrained(gguf_file=...)` dequantizes every tensor into one dict
before building the model (up to 14 GB for the 1.5B). Here the safetensors header is laid
out first from the model's parameter shapes (built on the meta device), then each tensor is
dequantized, fixed up by transformers' tensor processor for the architecture (Llama q/k
un-permute, Gemma norm - 1) and written straight to disk, so peak memory is about one
tensor. Weights are stored as fp32: the dequantized values are not exact in 16 bits, and
fp32 keeps the folder bit-identical to what transformers gets from the GGUF.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
from pathlib import Path

import numpy as np
import torch

WEIGHTS_FILE = "model.safetensors"
_F32_BYTES = 4


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> str:
    """Write config.json, tokenizer files and model.safetensors (fp32) for `gguf_path` into
    `out_dir`; returns the SHA-256 of model.safetensors."""
    from transformers import AutoConfig, AutoTokenizer

    if sys.byteorder != "little":  # safetensors is little-endian; we write numpy's native bytes
        raise RuntimeError("the GGUF converter needs a little-endian machine")
    out_dir.mkdir(parents=True, exist_ok=True)
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, config=config)
    weights_sha256, architecture = write_weights(gguf_path, config, out_dir / WEIGHTS_FILE)
    config.architectures = [architecture]
    config.dtype = torch.float32
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return weights_sha256


def write_weights(gguf_path: Path, config, out_file: Path) -> tuple[str, str]:
    """Dequantize every tensor of `gguf_path` into one fp32 safetensors file laid out for
    `config`'s model; -> (SHA-256 of the file, the model class name). Also used on its own by
    packs/data/gpu_checkpoint.py, which brings the config and tokenizer files along."""
    from gguf import GGUFReader, dequantize
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        read_field,
    )

    reader = GGUFReader(gguf_path)
    gguf_arch = read_field(reader, "general.architecture")[0]
    with torch.device("meta"):
        meta_model = AutoModelForCausalLM.from_config(config)
    processor = TENSOR_PROCESSORS.get(gguf_arch, TensorProcessor)(config=config.to_dict())
    expected = {name: tuple(t.shape) for name, t in meta_model.state_dict().items()}
    name_map = _gguf_to_hf_names(gguf_arch, config.num_hidden_layers, expected)
    if getattr(config, "tie_word_embeddings", False):
        expected.pop("lm_head.weight", None)

    plan = [(t, name_map[t.name]) for t in reader.tensors if name_map.get(t.name) in expected]
    missing = sorted(set(expected) - {hf_name for _, hf_name in plan})
    if missing:
        raise ValueError(f"{gguf_path.name}: no GGUF tensor for {missing[:5]} ({len(missing)} missing)")

    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for _, hf_name in plan:
        size = int(np.prod(expected[hf_name])) * _F32_BYTES
        header[hf_name] = {"dtype": "F32", "shape": list(expected[hf_name]), "data_offsets": [offset, offset + size]}
        offset += size
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # data starts 8-byte aligned

    digest = hashlib.sha256()
    with out_file.open("wb") as out:
        for chunk in (struct.pack("<Q", len(header_bytes)), header_bytes):
            out.write(chunk)
            digest.update(chunk)
        for tensor, hf_name in plan:
            weights = dequantize(tensor.data, tensor.tensor_type)
            result = processor.process(weights=weights, name=tensor.name)
            if result.name != tensor.name:
                raise ValueError(f"tensor processor renamed {tensor.name} to {result.name}; not supported")
            array = np.ascontiguousarray(result.weights, dtype=np.float32)
            if tuple(array.shape) != expected[hf_name]:
                raise ValueError(f"{tensor.name}: shape {array.shape}, model expects {expected[hf_name]}")
            data = memoryview(array).cast("B")
            out.write(data)
            digest.update(data)
    return digest.hexdigest(), type(meta_model).__name__


def _gguf_to_hf_names(gguf_arch: str, num_layers: int, hf_names) -> dict[str, str]:
    """gguf tensor name -> HF parameter name, through gguf-py's own HF->GGUF name table (what
    transformers' get_gguf_hf_weights_map does, without rebuilding the table per submodule)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == gguf_arch), None)
    if arch is None:
        raise ValueError(f"gguf-py does not know the architecture {gguf_arch!r}")
    table = get_tensor_name_map(arch, num_layers)
    mapping = {}
    for hf_name in hf_names:
        base, _, suffix = hf_name.rpartition(".")
        gguf_base = table.get_name(base)
        if gguf_base is not None:
            mapping[f"{gguf_base}.{suffix}"] = hf_name
    return mapping

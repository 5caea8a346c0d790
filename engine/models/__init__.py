"""Model stacks: one readable nn.Module per HF family, all behind the `CausalLM` contract
(engine/models/causal_lm.py). `build_model(hf_config)` picks the stack by `model_type`."""

from __future__ import annotations

from engine.models.causal_lm import CausalLM
from engine.models.gemma3 import Gemma3ForCausalLM
from engine.models.llama import LlamaForCausalLM

MODEL_STACKS: dict[str, type[CausalLM]] = {
    "llama": LlamaForCausalLM,
    "qwen2": LlamaForCausalLM,
    "qwen3": LlamaForCausalLM,
    "gemma3_text": Gemma3ForCausalLM,
}
SUPPORTED_MODEL_TYPES = tuple(MODEL_STACKS)


def build_model(hf_config) -> CausalLM:
    """An uninitialised (torch.empty) model for `hf_config`; fill it with
    `model.load_checkpoint_state(state_dict)`."""
    model_type = getattr(hf_config, "model_type", None)
    stack = MODEL_STACKS.get(model_type)
    if stack is None:
        raise ValueError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            " (docs/models.md says how to add a family)"
        )
    return stack(hf_config).eval()


__all__ = ["CausalLM", "MODEL_STACKS", "SUPPORTED_MODEL_TYPES", "build_model"]

"""Pieces every model stack shares: the CausalLM contract, parameter holders, RoPE tables,
the scoring head and checkpoint-name mapping.

    input_ids, positions [T] --embed--> x [T, D] --layers(x, rope, attn)--> x [T, D]
        --gather scored rows--> h [S, D] --final norm, LM head (SCORE_CHUNK rows)--> logits [S, V] fp32

Parameter names mirror the HF `*ForCausalLM` state dict (`model.layers.0.self_attn.q_proj.weight`,
`lm_head.weight`), so a safetensors checkpoint loads with `load_state_dict(strict=True)` after
`normalize_checkpoint_keys`. Every projection runs through `engine.ops.linear`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.attention import AttentionMetadata
from engine.ops import ROW_CHUNK, SCORE_CHUNK, linear, rms_norm, rope_cos_sin


class Linear(nn.Module):
    """Holds weight [out, in] (and bias [out]); forward is the batch-invariant `ops.linear`."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor, row_chunk: int = ROW_CHUNK) -> torch.Tensor:
        return linear(x, self.weight, self.bias, row_chunk=row_chunk)


class Embedding(nn.Module):
    """Holds the token embedding table weight [vocab, D]."""

    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:  # [T] -> [T, D]
        return self.weight.index_select(0, input_ids)


class RMSNorm(nn.Module):
    """RMSNorm over the last dim in fp32. Gemma stores (scale - 1): weight_offset=1."""

    def __init__(self, dim: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.eps = eps
        self.weight_offset = weight_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.weight_offset)


class RotaryTable:
    """inv_freq of one RoPE flavour (fp32, CPU master copy) and HF's attention_scaling."""

    def __init__(self, inv_freq: torch.Tensor, attention_scaling: float) -> None:
        self.inv_freq = inv_freq.float().cpu()
        self.attention_scaling = float(attention_scaling)
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [T] -> cos, sin: [T, 1, head_dim] in dtype."""
        inv_freq = self._on_device.get(positions.device)
        if inv_freq is None:
            inv_freq = self._on_device.setdefault(positions.device, self.inv_freq.to(positions.device))
        if self.attention_scaling == 1.0:
            return rope_cos_sin(positions, inv_freq, dtype)
        cos, sin = rope_cos_sin(positions, inv_freq, torch.float32)  # scale in fp32, as HF does
        return (cos * self.attention_scaling).to(dtype), (sin * self.attention_scaling).to(dtype)


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotary_table(config, layer_type: str | None = None) -> RotaryTable:
    """RoPE inverse frequencies for `config` (llama3 / linear / yarn / ... through transformers'
    own ROPE_INIT_FUNCTIONS). `layer_type` picks the per-layer-type entry when
    `config.rope_parameters` is keyed by layer type (Gemma 3: full vs sliding attention)."""
    params = config.rope_parameters
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    else:
        layer_type = None  # flat rope_parameters: one table for every layer
    rope_type = params.get("rope_type", "default")
    with torch.device("cpu"):  # real values even when the model is built under torch.device("meta")
        if rope_type == "default":
            dim = head_dim_of(config)
            exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
            return RotaryTable(1.0 / (params["rope_theta"] ** exponent), 1.0)
        kwargs = {"layer_type": layer_type} if layer_type is not None else {}
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"), **kwargs)
    return RotaryTable(inv_freq, scaling)


def layer_types_of(config) -> list[str]:
    """One of "full_attention" / "sliding_attention" per layer (HF's `layer_types`)."""
    types = getattr(config, "layer_types", None)
    return list(types) if types else ["full_attention"] * config.num_hidden_layers


class CausalLM(nn.Module):
    """The contract the runner calls. Subclasses build `self.model` (embed_tokens, layers, norm)
    and `self.lm_head` (None when tied), and implement `hidden_states`."""

    config: object
    final_logit_softcapping: float | None = None

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] long; T a multiple of ROW_CHUNK (packed stream, pads are token 0)
        positions: torch.Tensor,  # [T] long; depth in the token tree (RoPE position)
        attn: AttentionMetadata,  # tree mask spans
        scored_index: torch.Tensor,  # [S] long rows whose next-token logits are needed; S % SCORE_CHUNK == 0
    ) -> torch.Tensor:  # [S, vocab] float32 logits
        if scored_index.shape[0] % SCORE_CHUNK:
            raise ValueError(f"{scored_index.shape[0]} scored rows is not a multiple of SCORE_CHUNK={SCORE_CHUNK}")
        x = self.hidden_states(input_ids, positions, attn)  # [T, D], before the final norm
        h = self.model.norm(x.index_select(0, scored_index))  # [S, D]
        logits = linear(h, self.lm_head_weight, row_chunk=SCORE_CHUNK, out_dtype=torch.float32)  # [S, V]
        if self.final_logit_softcapping is not None:
            cap = self.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        raise NotImplementedError

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def load_checkpoint_state(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load an HF-named state dict (prefixes mapped, tied lm_head dropped), strictly, by
        assignment: the tensors given become the parameters (no second copy)."""
        state = normalize_checkpoint_keys(state_dict, is_tied=self.lm_head is None)
        self.load_state_dict(state, strict=True, assign=True)
        for param in self.parameters():
            param.requires_grad_(False)


_PREFIX_MAP = (
    ("model.language_model.", "model."),  # Gemma3ForConditionalGeneration (transformers >= 4.52)
    ("language_model.model.", "model."),  # older multimodal checkpoints
    ("language_model.lm_head.", "lm_head."),
)


def normalize_checkpoint_keys(state_dict: Mapping[str, torch.Tensor], is_tied: bool) -> dict[str, torch.Tensor]:
    """HF checkpoint names -> our names: multimodal prefixes stripped, a bare base-model save
    (`layers.0...`) given its `model.` prefix, vision weights and a tied lm_head dropped."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        for old, new in _PREFIX_MAP:
            if key.startswith(old):
                key = new + key[len(old) :]
                break
        if key.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")):
            continue
        if not key.startswith(("model.", "lm_head.")):
            key = "model." + key
        if is_tied and key == "lm_head.weight":
            continue
        out[key] = tensor
    return out


def embed_scale(config, dtype: torch.dtype) -> torch.Tensor:
    """Gemma multiplies embeddings by sqrt(hidden) rounded to the activation dtype (via fp32, as HF)."""
    return torch.tensor(math.sqrt(config.hidden_size), dtype=torch.float32).to(dtype)

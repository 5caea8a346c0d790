"""Llama-style decoder stacks: HF `llama`, `qwen2` and `qwen3`.

    x = embed(ids)                                     # [T, D]
    per layer:  x = x + attn(norm(x))                  # GQA, RoPE, tree mask (+ sliding window)
                x = x + down(act(gate(norm(x))) * up(norm(x)))

The families differ only in flags read from the config:
  llama  q/k/v/o bias = attention_bias, MLP bias = mlp_bias
  qwen2  q/k/v bias always, no o bias; sliding layers from layer_types (rarely on)
  qwen3  per-head q_norm / k_norm (RMSNorm over head_dim) before RoPE, explicit head_dim
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.layers.attention import AttentionMetadata, tree_attention
from engine.layers.modules import (
    Embedding,
    GatedMLP,
    Linear,
    QKVProjections,
    RMSNorm,
    RotaryTable,
    layer_types_of,
    rotary_table,
    run_decoder_layers,
)
from engine.layers.ops import Fp8Rows, add_rms_norm, apply_rope, norm_rope
from engine.models.causal_lm import CausalLM

FAMILIES = ("llama", "qwen2", "qwen3")


@dataclass(frozen=True, slots=True)
class LlamaFlags:
    qkv_bias: bool  # bias on q/k/v projections
    o_bias: bool  # bias on the output projection
    mlp_bias: bool
    qk_norm: bool  # per-head RMSNorm on q and k (qwen3)

    @staticmethod
    def from_config(config) -> LlamaFlags:
        kind = config.model_type
        if kind == "qwen2":
            return LlamaFlags(qkv_bias=True, o_bias=False, mlp_bias=False, qk_norm=False)
        attention_bias = bool(getattr(config, "attention_bias", False))
        if kind == "qwen3":
            return LlamaFlags(qkv_bias=attention_bias, o_bias=attention_bias, mlp_bias=False, qk_norm=True)
        if kind == "llama":
            mlp_bias = bool(getattr(config, "mlp_bias", False))
            return LlamaFlags(qkv_bias=attention_bias, o_bias=attention_bias, mlp_bias=mlp_bias, qk_norm=False)
        raise ValueError(f"llama.py serves {FAMILIES}, not {kind!r}")


class Attention(QKVProjections):
    def __init__(self, config, flags: LlamaFlags, sliding_window: int | None) -> None:
        super().__init__(config, qkv_bias=flags.qkv_bias, o_bias=flags.o_bias)
        self.scale = self.head_dim**-0.5
        self.sliding_window = sliding_window
        if flags.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def forward(
        self, x: torch.Tensor | Fp8Rows, rope: tuple[torch.Tensor, torch.Tensor], attn: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v, num_padded = self.project_qkv(x, attn)  # [T, Hq, d], [T, Hkv, d], [T or Tp, Hkv, d]
        cos, sin = rope  # [T, 1, d]
        if self.q_norm is not None:  # qwen3: per-head RMSNorm, then RoPE (one fused kernel on CUDA)
            q = norm_rope(q, self.q_norm.weight, self.q_norm.eps, cos, sin, num_rows_out=num_padded)
            k = norm_rope(k, self.k_norm.weight, self.k_norm.eps, cos, sin, num_rows_out=num_padded)
        else:  # [T] rows: flex attention pads q and k (v comes padded)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = tree_attention(q, k, v, attn, self.scale, self.sliding_window, self.layer_index)  # [T, Hq, d]
        return self.project_out(out)  # [T, D]


class DecoderLayer(nn.Module):
    def __init__(self, config, flags: LlamaFlags, layer_type: str) -> None:
        super().__init__()
        self.layer_type = layer_type
        sliding_window = config.sliding_window if layer_type == "sliding_attention" else None
        self.self_attn = Attention(config, flags, sliding_window)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act, flags.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, h: torch.Tensor | Fp8Rows, rope: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata, next_norm: tuple | None, quantize_next: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows | None]:
        """x: residual [T, D], h = input_layernorm(x) -> (x after the layer, next_norm(x) or None).
        h and the MLP's input come as Fp8Rows where their projection holds an Fp8Weight (CUDA)."""
        x, h = add_rms_norm(x, self.self_attn(h, rope, attn), self.post_attention_layernorm.params,
                            quantize=self.mlp.gate_up_proj.wants_fp8_rows)
        return add_rms_norm(x, self.mlp(h), next_norm, quantize=quantize_next)


class LlamaBackbone(nn.Module):
    def __init__(self, config, flags: LlamaFlags) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, flags, t) for t in layer_types_of(config))
        for index, layer in enumerate(self.layers):  # the kept K/V of extraction slots are per layer
            layer.self_attn.layer_index = index
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(CausalLM):
    """llama / qwen2 / qwen3 (see module docstring for the flags)."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.flags = LlamaFlags.from_config(config)
        self.model = LlamaBackbone(config, self.flags)
        tied = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = None if tied else Linear(config.hidden_size, config.vocab_size)
        self.rope_tables: dict[str, RotaryTable] = {
            t: rotary_table(config, t) for t in sorted(set(layer_types_of(config)))
        }

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # [T, D]
        ropes = {t: table.cos_sin(positions, x.dtype) for t, table in self.rope_tables.items()}
        return run_decoder_layers(self.model.layers, x, ropes, attn)  # [T, D]

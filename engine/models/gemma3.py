"""Gemma 3 text decoder (HF `gemma3_text`).

    x = embed(ids) * sqrt(D)                           # scale rounded to the activation dtype
    per layer:  x = x + post_attn_norm(attn(input_norm(x)))
                x = x + post_ffw_norm(down(gelu_tanh(gate(pre_ffw_norm(x))) * up(pre_ffw_norm(x))))
    logits = softcap(lm_head(norm(x)))                 # softcap only if final_logit_softcapping

Differences from llama.py: every RMSNorm scales by (1 + w); q/k get a per-head norm before
RoPE; the attention scale is query_pre_attn_scalar**-0.5; "sliding_attention" layers see
only keys less than `sliding_window` positions back and use the local RoPE base
(rope_parameters["sliding_attention"], from rope_local_base_freq), the global layers the
"full_attention" one (rope_theta, with any rope scaling).
"""

from __future__ import annotations

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
    embed_scale,
    layer_types_of,
    rotary_table,
    run_decoder_layers,
)
from engine.layers.ops import Fp8Rows, add_rms_norm, norm_rope
from engine.models.causal_lm import CausalLM

GEMMA_NORM_OFFSET = 1.0  # Gemma stores the RMSNorm scale as (scale - 1)


class Gemma3Attention(QKVProjections):
    def __init__(self, config, sliding_window: int | None) -> None:
        bias = bool(getattr(config, "attention_bias", False))
        super().__init__(config, qkv_bias=bias, o_bias=bias)
        self.scale = config.query_pre_attn_scalar**-0.5
        self.sliding_window = sliding_window
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, GEMMA_NORM_OFFSET)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, GEMMA_NORM_OFFSET)

    def forward(
        self, x: torch.Tensor | Fp8Rows, rope: tuple[torch.Tensor, torch.Tensor], attn: AttentionMetadata
    ) -> torch.Tensor:
        q, k, v, num_padded = self.project_qkv(x, attn)  # [T, Hq, d], [T, Hkv, d], [T or Tp, Hkv, d]
        cos, sin = rope  # [T, 1, d]
        q = norm_rope(q, self.q_norm.weight, self.q_norm.eps, cos, sin, GEMMA_NORM_OFFSET, num_padded)
        k = norm_rope(k, self.k_norm.weight, self.k_norm.eps, cos, sin, GEMMA_NORM_OFFSET, num_padded)
        out = tree_attention(q, k, v, attn, self.scale, self.sliding_window, self.layer_index)  # [T, Hq, d]
        return self.project_out(out)  # [T, D]


class Gemma3DecoderLayer(nn.Module):
    def __init__(self, config, layer_type: str) -> None:
        super().__init__()
        self.layer_type = layer_type
        sliding_window = config.sliding_window if layer_type == "sliding_attention" else None
        self.self_attn = Gemma3Attention(config, sliding_window)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_activation)
        dim, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(dim, eps, GEMMA_NORM_OFFSET)
        self.post_attention_layernorm = RMSNorm(dim, eps, GEMMA_NORM_OFFSET)
        self.pre_feedforward_layernorm = RMSNorm(dim, eps, GEMMA_NORM_OFFSET)
        self.post_feedforward_layernorm = RMSNorm(dim, eps, GEMMA_NORM_OFFSET)

    def forward(
        self, x: torch.Tensor, h: torch.Tensor | Fp8Rows, rope: tuple[torch.Tensor, torch.Tensor],
        attn: AttentionMetadata, next_norm: tuple | None, quantize_next: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows | None]:
        """x: residual [T, D], h = input_layernorm(x) -> (x after the layer, next_norm(x) or None).
        h and the MLP's input come as Fp8Rows where their projection holds an Fp8Weight (CUDA)."""
        attn_out = self.self_attn(h, rope, attn)
        x, h = add_rms_norm(x, attn_out, self.pre_feedforward_layernorm.params, self.post_attention_layernorm.params,
                            quantize=self.mlp.gate_up_proj.wants_fp8_rows)
        return add_rms_norm(x, self.mlp(h), next_norm, self.post_feedforward_layernorm.params, quantize=quantize_next)


class Gemma3Backbone(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Gemma3DecoderLayer(config, t) for t in layer_types_of(config))
        for index, layer in enumerate(self.layers):  # the kept K/V of extraction slots are per layer
            layer.self_attn.layer_index = index
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, GEMMA_NORM_OFFSET)


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, config) -> None:
        super().__init__()
        if getattr(config, "use_bidirectional_attention", False):
            raise ValueError("gemma3_text with use_bidirectional_attention is an encoder; not served")
        if getattr(config, "attn_logit_softcapping", None) is not None:
            raise ValueError("gemma3_text with attn_logit_softcapping is not supported by tree_attention")
        self.config = config
        self.model = Gemma3Backbone(config)
        tied = bool(getattr(config, "tie_word_embeddings", True))
        self.lm_head = None if tied else Linear(config.hidden_size, config.vocab_size)
        self.final_logit_softcapping = getattr(config, "final_logit_softcapping", None)
        self.rope_tables: dict[str, RotaryTable] = {
            t: rotary_table(config, t) for t in sorted(set(layer_types_of(config)))
        }

    def hidden_states(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)  # [T, D]
        x = x * embed_scale(self.config, x.dtype).item()  # the scale is exact in x's dtype
        ropes = {t: table.cos_sin(positions, x.dtype) for t, table in self.rope_tables.items()}
        return run_decoder_layers(self.model.layers, x, ropes, attn)  # [T, D]

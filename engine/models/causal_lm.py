"""The CausalLM contract the runner calls, and checkpoint-name mapping.

    input_ids, positions [T] --embed--> x [T, D] --layers(x, rope, attn)--> x [T, D]
        --gather scored rows--> h [S, D] --final norm, LM head (SCORE_CHUNK rows)--> logits [S, V] fp32

Parameter names mirror the HF `*ForCausalLM` state dict (`model.layers.0.self_attn.q_proj.weight`,
`lm_head.weight`), so a safetensors checkpoint loads with `load_state_dict(strict=True)` after
`normalize_checkpoint_keys`; loading then fuses the projections (engine/layers/modules.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from engine.layers.attention import AttentionMetadata
from engine.layers.ops import SCORE_CHUNK, linear


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
        return self.head_logits(self.scored_hidden(input_ids, positions, attn, scored_index))

    def scored_hidden(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                      scored_index: torch.Tensor) -> torch.Tensor:  # [S, D] final-normed rows to score
        x = self.hidden_states(input_ids, positions, attn)  # [T, D], before the final norm
        return self.model.norm(x.index_select(0, scored_index))

    def head_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: [S, D] -> [S, V] float32 logits, SCORE_CHUNK rows per matmul (so a block of rows
        gives the same bits alone as inside a larger h)."""
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
        self.fuse_projections()

    def fuse_projections(self) -> None:
        """q/k/v -> qkv_proj, gate/up -> gate_up_proj in every layer (the forward needs them);
        the HF-named unfused weights are freed (the state dict then has the fused names)."""
        for module in list(self.modules()):
            if module is not self and hasattr(module, "fuse_projections"):
                module.fuse_projections()


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

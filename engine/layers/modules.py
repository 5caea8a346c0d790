"""The layers every model stack shares: parameter holders, fused projections, norms, RoPE
tables, and the loop over decoder layers.

    x [T, D] --run_decoder_layers(layers, x, ropes, attn)--> x [T, D] (before the final norm)

Parameter names mirror the HF `*ForCausalLM` state dict (`model.layers.0.self_attn.q_proj.weight`),
so a checkpoint loads strictly (engine/models/causal_lm.py). Every projection runs through
`engine.layers.ops.linear`.

After loading, projections that read the same input are fused (`fuse_projections`):

    q_proj [Hq·d, D], k_proj [Hkv·d, D], v_proj [Hkv·d, D] --cat--> qkv_proj [(Hq+2Hkv)·d, D]
    gate_proj [I, D], up_proj [I, D]                       --cat--> gate_up_proj [2I, D]

one matmul launch instead of three (two), and under fp8 one activation quantization of the
shared input (quantization runs after loading, so on the fused weights; per-output-channel
scales make the fused fp8 weight the rows of the separately quantized ones). The forward
slices the fused output (views). On CUDA the Triton matmul runs every output column through
the same K loop whatever N is, so the fused result is bit-identical to the unfused one
(tests/engine/kernels/test_kernel_fused_projections.py); on CPU `F.linear` may block a
wider N differently, which moves results by rounding only.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from engine.layers.attention import AttentionMetadata
from engine.layers.ops import (
    ROW_CHUNK,
    Fp8Rows,
    gated_mlp,
    linear,
    rms_norm,
    rope_cos_sin,
    wants_fp8_rows,
)


class Linear(nn.Module):
    """Holds weight [out, in] (and bias [out]); forward is the batch-invariant `ops.linear`."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None

    def forward(
        self, x: torch.Tensor | Fp8Rows, row_chunk: int = ROW_CHUNK, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        return linear(x, self.weight, self.bias, row_chunk=row_chunk, out=out)

    @property
    def wants_fp8_rows(self) -> bool:
        """An Fp8Weight: the norm before it hands over quantized rows (`ops.wants_fp8_rows`)."""
        return wants_fp8_rows(self.weight)

    @classmethod
    def fused(cls, parts: list[Linear]) -> Linear:
        """One Linear whose output is the parts' outputs side by side: weight [ΣN, D]."""
        with torch.device("meta"):
            fused = cls(parts[0].weight.shape[1], sum(p.weight.shape[0] for p in parts), parts[0].bias is not None)
        fused.weight = nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=False)
        if fused.bias is not None:
            fused.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
        return fused


def fuse_linears(module: nn.Module, names: tuple[str, ...], fused_name: str) -> None:
    """Replace module.<names> (Linears over one input) by module.<fused_name>, freeing them."""
    setattr(module, fused_name, Linear.fused([getattr(module, name) for name in names]))
    for name in names:
        delattr(module, name)


def split_heads(qkv: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int):
    """qkv: [T, (Hq+2Hkv)·d] -> q [T, Hq, d], k [T, Hkv, d], v [T, Hkv, d], views (token stride (Hq+2Hkv)·d)."""
    num_rows = qkv.shape[0]
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    return (
        q.view(num_rows, num_heads, head_dim),
        k.view(num_rows, num_kv_heads, head_dim),
        v.view(num_rows, num_kv_heads, head_dim),
    )


class QKVProjections(nn.Module):
    """The projections of an attention block: q/k/v (HF names, fused to qkv_proj after loading)
    and o. Subclasses add the norms and the forward."""

    def __init__(self, config, qkv_bias: bool, o_bias: bool) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        self.layer_index = 0  # set by the backbone; tree_attention keys kept K/V by it
        hidden, q_dim, kv_dim = config.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_proj = Linear(hidden, q_dim, bias=qkv_bias)
        self.k_proj = Linear(hidden, kv_dim, bias=qkv_bias)
        self.v_proj = Linear(hidden, kv_dim, bias=qkv_bias)
        self.o_proj = Linear(q_dim, hidden, bias=o_bias)

    def fuse_projections(self) -> None:
        fuse_linears(self, ("q_proj", "k_proj", "v_proj"), "qkv_proj")

    def project_qkv(
        self, x: torch.Tensor | Fp8Rows, attn: AttentionMetadata
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int | None]:
        """x: [T, D] (or Fp8Rows) -> q [T, Hq, d], k [T, Hkv, d], v [T or Tp, Hkv, d] (views of one
        matmul's output), and Tp or None. On a packed flex pass (`attn.block_mask`) the matmul writes the
        first T rows of the pass's [Tp, N] buffer whose tail rows are zero: v is already padded
        for flex attention, and q/k are to be normed into Tp rows (`norm_rope(num_rows_out=Tp)`)."""
        masks = attn.block_mask if attn.decode is None else None
        if masks is None:
            return (*split_heads(self.qkv_proj(x), self.num_heads, self.num_kv_heads, self.head_dim), None)
        num_rows = x.shape[0]
        buffer = masks.padded_buffer(self.qkv_proj.weight.shape[0], x.dtype, x.device)  # [Tp, N]
        self.qkv_proj(x, out=buffer[:num_rows])
        q, k, v = split_heads(buffer, self.num_heads, self.num_kv_heads, self.head_dim)  # [Tp, H, d]
        return q[:num_rows], k[:num_rows], v, masks.num_padded

    def project_out(self, out: torch.Tensor) -> torch.Tensor:  # [T, Hq, d] -> [T, D]
        return self.o_proj(out.reshape(out.shape[0], self.num_heads * self.head_dim))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)); gate/up fused to gate_up_proj [2I, D] after loading."""

    def __init__(self, hidden: int, intermediate: int, activation: str, bias: bool = False) -> None:
        super().__init__()
        self.gate_proj = Linear(hidden, intermediate, bias=bias)
        self.up_proj = Linear(hidden, intermediate, bias=bias)
        self.down_proj = Linear(intermediate, hidden, bias=bias)
        self.activation = activation  # an ACT2FN name: gelu_pytorch_tanh (Gemma), silu (llama, qwen)

    def fuse_projections(self) -> None:
        fuse_linears(self, ("gate_proj", "up_proj"), "gate_up_proj")

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:  # [T, D] -> [T, D]
        gate_up, down = self.gate_up_proj, self.down_proj
        return gated_mlp(x, gate_up.weight, gate_up.bias, self.activation, down.weight, down.bias)  # [T, D]


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

    @property
    def params(self) -> tuple[torch.Tensor, float, float]:
        """(weight, eps, weight_offset): the norm as `ops.add_rms_norm` takes it."""
        return self.weight, self.eps, self.weight_offset


def run_decoder_layers(layers, x: torch.Tensor, ropes: dict, attn: AttentionMetadata) -> torch.Tensor:
    """x: [T, D] embeddings -> the residual stream after the last layer (before the final norm).
    A layer takes (x, h = its input_layernorm(x)) and returns the next layer's pair: the residual
    add and the next norm are one fused kernel on CUDA (`ops.add_rms_norm`). Where qkv_proj holds
    an Fp8Weight, h comes quantized (Fp8Rows on CUDA, `quantize_next`), as does the MLP's input."""
    layers = list(layers)
    h = rms_norm(x, *layers[0].input_layernorm.params, quantize=layers[0].self_attn.qkv_proj.wants_fp8_rows)
    for layer, following in zip(layers, [*layers[1:], None]):
        next_norm = following.input_layernorm.params if following is not None else None
        quantize_next = following is not None and following.self_attn.qkv_proj.wants_fp8_rows
        x, h = layer(x, h, ropes[layer.layer_type], attn, next_norm, quantize_next)
    return x


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


def embed_scale(config, dtype: torch.dtype) -> torch.Tensor:
    """Gemma multiplies embeddings by sqrt(hidden) rounded to the activation dtype (via fp32, as HF)."""
    return torch.tensor(math.sqrt(config.hidden_size), dtype=torch.float32).to(dtype)

"""Batch-invariant building blocks shared by the model stacks.

A content's scores must be bit-identical whether it runs alone or packed with others.
BLAS picks its kernel (and so its reduction order) by the shape of the whole matmul, so
`linear(x[:1]) != linear(x)[:1]` in general. The packer starts every content at a multiple
of ROW_CHUNK and pads it to a multiple of ROW_CHUNK; `linear` then runs one fixed-shape
matmul per ROW_CHUNK rows, so a row's result depends only on that row.
On CUDA the same holds through a fixed-tile Triton matmul (the GPU issue).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ROW_CHUNK = 64  # rows per fixed-shape matmul; the packer aligns contents to it
SCORE_CHUNK = 8  # rows per fixed-shape LM-head matmul; each content's scored rows are padded to it
SCORE_CHUNK = 8  # rows per fixed-shape LM-head matmul; the packer pads each tree's scored rows to it


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, row_chunk: int = ROW_CHUNK
) -> torch.Tensor:
    """x: [T, D_in] with T a multiple of row_chunk; weight: [D_out, D_in] -> [T, D_out]."""
    num_rows = x.shape[0]
    if num_rows % row_chunk:
        raise ValueError(f"linear: {num_rows} rows is not a multiple of row_chunk={row_chunk}")
    out = x.new_empty(num_rows, weight.shape[0])
    for start in range(0, num_rows, row_chunk):
        out[start : start + row_chunk] = F.linear(x[start : start + row_chunk], weight, bias)
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    """x: [..., D] -> [..., D], computed in fp32. Gemma stores (weight - 1): weight_offset=1."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (weight.float() + weight_offset)).to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [T], inv_freq: [head_dim/2] -> cos, sin: [T, 1, head_dim] (HF's half-split layout)."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]  # [T, head_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, head_dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, head_dim]."""
    return x * cos + rotate_half(x) * sin

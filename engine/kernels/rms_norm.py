"""Batch-invariant RMSNorm, and RMSNorm fused with RoPE for per-head q/k norms (Qwen3, Gemma3).

    hidden [R, D] ──rms_norm_kernel (one program per row)──> [R, D]
                    (quantize=True: Fp8Rows, e4m3 [R, D] + scale [R], fp8_matmul.store_row)
    q or k [T, H, d], cos/sin [T, d] ──qk_norm_rope_kernel (one program per token)──> [T, H, d]

Why a kernel: torch's mean over the last dim picks its reduction strategy from the whole
tensor's shape, so a row's sum can change with the number of rows. Here a row is always
reduced by one program with one fixed block: the row's bits depend on the row alone.
The fused kernel also saves the ~8 elementwise passes of norm-then-rope over q and k.
The references are `engine.layers.ops`' CPU maths (fp32 norm, rounded to the input dtype).
"""

from __future__ import annotations

import torch

from engine.kernels._triton import HAS_TRITON, jit, next_power_of_2, tl
from engine.kernels.fp8_matmul import (
    FP8_DTYPE,
    FP8_MAX,
    MIN_AMAX,
    Fp8Rows,
    row_block,
    store_row,
)


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (weight.float() + weight_offset)).to(x.dtype)


def qk_norm_rope_reference(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, weight_offset: float = 0.0
) -> torch.Tensor:
    """x: [T, H, d], cos/sin: [T, d] (HF half-split layout) -> [T, H, d]."""
    y = rms_norm_reference(x, weight, eps, weight_offset)
    half = y.shape[-1] // 2
    rotated = torch.cat((-y[..., half:], y[..., :half]), dim=-1)
    return y * cos[:, None, :] + rotated * sin[:, None, :]


@jit
def rms_norm_kernel(
    x_ptr, w_ptr, y_ptr, y_scale_ptr, stride_x, D, eps, weight_offset, BLOCK_D: tl.constexpr,
    QUANTIZE: tl.constexpr, FP8_MAX_: tl.constexpr, MIN_AMAX_: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) + weight_offset
    y = (x * inv_rms * w).to(x_ptr.dtype.element_ty)  # QUANTIZE: y_ptr e4m3, y quantized by store_row
    store_row(y, y_ptr, y_scale_ptr, row, offs, mask, D, QUANTIZE, FP8_MAX_, MIN_AMAX_)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0, quantize: bool = False
) -> torch.Tensor | Fp8Rows:
    """x: [..., D] (last dim contiguous) -> [..., D] contiguous, x's dtype. quantize: the rows
    [R, D] as Fp8Rows, quantize_rows' maths on the normed rows (the first layer's input norm
    when qkv_proj holds an Fp8Weight); row-local, but within rounding of, not bit-identical
    to, rms_norm then quantize_rows on the H200 (see add_rms_norm)."""
    if not HAS_TRITON:
        raise RuntimeError("rms_norm: Triton is not installed")
    num_cols = x.shape[-1]
    rows = x.reshape(-1, num_cols)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    y = torch.empty(rows.shape, dtype=FP8_DTYPE if quantize else x.dtype, device=x.device)
    y_scale = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device) if quantize else y
    if rows.shape[0]:
        block, num_warps = norm_launch_config(num_cols)
        rms_norm_kernel[(rows.shape[0],)](
            rows, weight, y, y_scale, rows.stride(0), num_cols, eps, weight_offset, BLOCK_D=block,
            QUANTIZE=quantize, FP8_MAX_=FP8_MAX, MIN_AMAX_=MIN_AMAX, num_warps=num_warps,
        )
    return Fp8Rows(y, y_scale, x.dtype) if quantize else y.view(x.shape)


def norm_launch_config(num_cols: int) -> tuple[int, int]:
    """(BLOCK_D, num_warps) of a row norm over num_cols: they fix the reduction order, so every
    kernel that must match rms_norm's bits (add_rms_norm.py) launches with these."""
    block = row_block(num_cols)
    return block, min(16, max(1, block // 512))


@jit
def qk_norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, stride_t, stride_h, H, T, eps, weight_offset,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)  # rows t >= T (padding of the output) are written as zeros
    heads = tl.arange(0, BLOCK_H)[:, None]  # [BH, 1]
    offs = tl.arange(0, HALF)[None, :]  # [1, HALF]
    mask = heads < H
    is_row = (t + offs * 0) < T  # [1, HALF]: a tensor mask (the interpreter takes no scalar one)
    base = x_ptr + t * stride_t + heads * stride_h
    x1 = tl.load(base + offs, mask=mask & is_row, other=0.0).to(tl.float32)  # [BH, HALF]
    x2 = tl.load(base + HALF + offs, mask=mask & is_row, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
    w1 = tl.load(w_ptr + offs).to(tl.float32) + weight_offset
    w2 = tl.load(w_ptr + HALF + offs).to(tl.float32) + weight_offset
    # Round the normed values to the output dtype first, as the unfused path does.
    y1 = (x1 * inv_rms * w1).to(y_ptr.dtype.element_ty).to(tl.float32)
    y2 = (x2 * inv_rms * w2).to(y_ptr.dtype.element_ty).to(tl.float32)
    cos1 = tl.load(cos_ptr + t * 2 * HALF + offs, mask=is_row, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + t * 2 * HALF + HALF + offs, mask=is_row, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + t * 2 * HALF + offs, mask=is_row, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + t * 2 * HALF + HALF + offs, mask=is_row, other=0.0).to(tl.float32)
    out = y_ptr + t * H * 2 * HALF + heads * 2 * HALF
    tl.store(out + offs, (y1 * cos1 - y2 * sin1).to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(out + HALF + offs, (y2 * cos2 + y1 * sin2).to(y_ptr.dtype.element_ty), mask=mask)


def qk_norm_rope(
    x: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, eps: float, weight_offset: float = 0.0,
    num_rows_out: int | None = None,
) -> torch.Tensor:
    """x: [T, H, d] (last dim contiguous, any token/head strides), cos/sin: [T, d] ->
    [num_rows_out or T, H, d]; rows past T are zeros (the padded stream of flex attention)."""
    if not HAS_TRITON:
        raise RuntimeError("qk_norm_rope: Triton is not installed")
    num_tokens, num_heads, head_dim = x.shape
    if x.stride(-1) != 1 or head_dim & (head_dim - 1):
        raise ValueError(f"qk_norm_rope: needs a contiguous power-of-two head_dim, got {tuple(x.shape)}")
    cos, sin = cos.reshape(num_tokens, head_dim).contiguous(), sin.reshape(num_tokens, head_dim).contiguous()
    num_rows_out = num_tokens if num_rows_out is None else num_rows_out
    if num_rows_out < num_tokens:
        raise ValueError(f"qk_norm_rope: num_rows_out={num_rows_out} < {num_tokens} rows")
    y = torch.empty(num_rows_out, num_heads, head_dim, dtype=x.dtype, device=x.device)
    if num_rows_out:
        qk_norm_rope_kernel[(num_rows_out,)](
            x, weight, cos, sin, y, x.stride(0), x.stride(1), num_heads, num_tokens, eps, weight_offset,
            HALF=head_dim // 2, BLOCK_H=max(2, next_power_of_2(num_heads)), num_warps=4,
        )
    return y

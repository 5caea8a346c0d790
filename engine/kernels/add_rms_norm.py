"""Residual add fused with the RMSNorms around it: one read of the stream per sub-block.

    x [R, D] (residual), delta [R, D] (attention or MLP output)
      ──add_rms_norm_kernel (one program per row, one fixed block)──>
        x_new = round(x + round(delta_norm(delta)))   # Gemma 3: post-attention / post-ffw norm
                                                       # (llama: delta as is)
        h     = round(norm(x_new))                     # the next sub-block's input norm

Unfused this is rms_norm (read D, write D), the torch add (read 2D, write D) and rms_norm
again (read D, write D); fused it reads 2D and writes 2D. The kernel rounds exactly as the
unfused path (each norm's output and the sum rounded to the dtype, the second norm over the
rounded sum) and reduces a row with the block and warps of `rms_norm_kernel`, so on the GPU
its outputs are bit-identical to rms_norm + torch add + rms_norm (tests/engine/kernels/).
One program per row: a row's bits depend on the row alone (batch invariant).

quantize=True (the projection reading h holds an Fp8Weight): the same kernel, compiled with
QUANTIZE, quantizes the rounded h (`fp8_matmul.store_row`: e4m3 [R, D] and one fp32 scale a
row, `Fp8Rows`), so quantize_rows_kernel no longer runs on h and h never goes to memory in
bf16. Not bit-identical to the bf16 build then quantize_rows on the H200: compiled with the
quantize step, the kernel reduces a row's squares in another order, so x_new and h can move by
a bf16 ulp or two (tests/engine/kernels/test_kernel_norm_fp8.py). Still one program per row.
"""

from __future__ import annotations

import torch

from engine.kernels._triton import HAS_TRITON, jit, tl
from engine.kernels.fp8_matmul import FP8_DTYPE, FP8_MAX, MIN_AMAX, Fp8Rows, store_row
from engine.kernels.rms_norm import norm_launch_config, rms_norm_reference


def add_rms_norm_reference(
    x: torch.Tensor, delta: torch.Tensor, norm: tuple | None, delta_norm: tuple | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """norm, delta_norm: (weight, eps, weight_offset) or None -> (x + delta_norm(delta), norm(that))."""
    if delta_norm is not None:
        delta = rms_norm_reference(delta, *delta_norm)
    x = x + delta
    return x, (rms_norm_reference(x, *norm) if norm is not None else None)


@jit
def add_rms_norm_kernel(
    x_ptr, d_ptr, dw_ptr, w_ptr, x_out_ptr, h_ptr, h_scale_ptr, stride_x, stride_d, D, d_eps, d_offset, eps, offset,
    HAS_DELTA_NORM: tl.constexpr, HAS_NORM: tl.constexpr, BLOCK_D: tl.constexpr,
    QUANTIZE: tl.constexpr, FP8_MAX_: tl.constexpr, MIN_AMAX_: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    dtype = x_out_ptr.dtype.element_ty
    d = tl.load(d_ptr + row * stride_d + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA_NORM:  # rms_norm_kernel's maths, rounded to the dtype
        inv_rms = tl.rsqrt(tl.sum(d * d, axis=0) / D + d_eps)
        dw = tl.load(dw_ptr + offs, mask=mask, other=0.0).to(tl.float32) + d_offset
        d = (d * inv_rms * dw).to(dtype).to(tl.float32)
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    s = (x + d).to(dtype)
    tl.store(x_out_ptr + row * D + offs, s, mask=mask)
    if HAS_NORM:
        s = s.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(s * s, axis=0) / D + eps)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) + offset
        h = (s * inv_rms * w).to(dtype)  # QUANTIZE: h_ptr e4m3, h quantized by store_row
        store_row(h, h_ptr, h_scale_ptr, row, offs, mask, D, QUANTIZE, FP8_MAX_, MIN_AMAX_)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, norm: tuple | None, delta_norm: tuple | None = None, quantize: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows | None]:
    """Triton version of add_rms_norm_reference: x, delta [R, D] (last dim contiguous) ->
    (x_new [R, D], h [R, D] or None when norm is None), x's dtype. quantize: h as Fp8Rows,
    quantize_rows' maths on the bf16-rounded h (fp8_linear's input as it is). Row-local, so batch
    invariant; on the H200 not bit-identical to quantize_rows(add_rms_norm(...)) at real widths (the
    compiled kernel sums the squares in another order: a bf16 ulp in x_new and h)."""
    if not HAS_TRITON:
        raise RuntimeError("add_rms_norm: Triton is not installed")
    if x.shape != delta.shape or x.dtype != delta.dtype or x.ndim != 2:
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)} {x.dtype} vs delta {tuple(delta.shape)} {delta.dtype}")
    if quantize and norm is None:
        raise ValueError("add_rms_norm: quantize=True needs a norm (it quantizes h)")
    x, delta = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, delta))
    num_rows, num_cols = x.shape
    x_new = torch.empty(num_rows, num_cols, dtype=x.dtype, device=x.device)
    h_dtype = FP8_DTYPE if quantize else x.dtype
    h = torch.empty(num_rows, num_cols, dtype=h_dtype, device=x.device) if norm is not None else None
    h_scale = torch.empty(num_rows, dtype=torch.float32, device=x.device) if quantize else None
    if num_rows:
        block, num_warps = norm_launch_config(num_cols)
        w, eps, offset = norm if norm is not None else (x_new, 0.0, 0.0)
        dw, d_eps, d_offset = delta_norm if delta_norm is not None else (x_new, 0.0, 0.0)
        add_rms_norm_kernel[(num_rows,)](
            x, delta, dw, w, x_new, h if h is not None else x_new, h_scale if quantize else x_new,
            x.stride(0), delta.stride(0), num_cols, d_eps, d_offset, eps, offset,
            HAS_DELTA_NORM=delta_norm is not None, HAS_NORM=norm is not None, BLOCK_D=block, QUANTIZE=quantize,
            FP8_MAX_=FP8_MAX, MIN_AMAX_=MIN_AMAX, num_warps=num_warps,
        )
    return x_new, (Fp8Rows(h, h_scale, x.dtype) if quantize else h)

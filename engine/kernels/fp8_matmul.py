"""fp8 (e4m3) linear on Hopper: per-output-channel weight scales, per-token activation scales.

    w [N, K] bf16 ──quantize_weight (offline, once)──> Fp8Weight(qweight e4m3 [N, K], scale [N])
    x [M, K] bf16 ──quantize_rows_kernel──> xq e4m3 [M, K], x_scale [M]
        (or Fp8Rows(xq, x_scale) straight from the kernel that produced x, the norms of
        add_rms_norm.py and rms_norm.py with quantize=True: the same maths, `store_row`)
    (xq, x_scale, Fp8Weight) ──fp8_matmul_persistent_kernel──> y [M, N] bf16
        y[m, n] = (Σ_k xq[m, k] · wq[n, k]) · x_scale[m] · w_scale[n]

Both steps are row-local with a fixed tile config and no split-K, so the result is batch
invariant like the bf16 kernel (matmul.py). `fp8_linear_reference` is the same maths in
fp32 on any device: it is how the drift of a real small model is measured on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels._triton import HAS_TRITON, jit, next_power_of_2, num_sms, tl
from engine.kernels.matmul import TileConfig, _tile_coords, output_buffer, triton_cdiv

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
MIN_AMAX = 1e-6  # keeps an all-zero row (pads) from a zero scale

# 3 stages: 4 would need 263 KB of shared memory with the epilogue tile (H200 limit: 227 KB).
FP8_TILES = TileConfig(block_m=128, block_n=256, block_k=128, group_m=8, num_warps=8, num_stages=3)


@dataclass(slots=True)
class Fp8Weight:
    qweight: torch.Tensor  # [N, K] float8_e4m3fn
    scale: torch.Tensor  # [N] fp32: w ≈ qweight * scale[:, None]
    _qweight_f32: torch.Tensor | None = None  # CPU emulation: qweight upcast once, not per call

    def qweight_float(self) -> torch.Tensor:
        if self.qweight.is_cuda:
            return self.qweight.float()
        if self._qweight_f32 is None:
            self._qweight_f32 = self.qweight.float()
        return self._qweight_f32

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.qweight.float() * self.scale[:, None]).to(dtype)


@dataclass(slots=True)
class Fp8Rows:
    """Activation rows quantized (`store_row`) by the kernel that produced them (a norm with
    quantize=True): fp8_linear's input without a quantize_rows launch."""

    xq: torch.Tensor  # [M, K] float8_e4m3fn
    scale: torch.Tensor  # [M] fp32
    dtype: torch.dtype  # the dtype of the rows they stand for: the matmul's output dtype

    @property
    def shape(self) -> torch.Size:
        return self.xq.shape

    @property
    def device(self) -> torch.device:
        return self.xq.device

    @property
    def is_cuda(self) -> bool:
        return self.xq.is_cuda


def quantize_weight(w: torch.Tensor) -> Fp8Weight:
    """w: [N, K] -> per-output-channel e4m3 (the scale maps each row's amax to FP8_MAX)."""
    scale = w.float().abs().amax(dim=1).clamp_min(MIN_AMAX) / FP8_MAX  # [N]
    qweight = (w.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return Fp8Weight(qweight=qweight.contiguous(), scale=scale.contiguous())


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [M, K] -> (e4m3 [M, K], scale [M] fp32), one scale per token."""
    scale = x.float().abs().amax(dim=1).clamp_min(MIN_AMAX) / FP8_MAX
    xq = (x.float() / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return xq, scale


def fp8_linear_reference(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize-dequantize emulation in fp32 (CPU or GPU): what fp8_linear computes."""
    xq, x_scale = quantize_rows_reference(x)
    y = (xq.float() @ weight.qweight_float().t()) * x_scale[:, None] * weight.scale[None, :]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def row_block(num_cols: int) -> int:
    """The block of a kernel that holds a whole row of num_cols (a power of two, at least 16)."""
    return max(16, next_power_of_2(num_cols))


@jit
def store_row(
    y, y_ptr, scale_ptr, row, offs, mask, K,
    QUANTIZE: tl.constexpr, FP8_MAX_: tl.constexpr, MIN_AMAX_: tl.constexpr,
):
    """Row `row` of a producer kernel that holds the whole row y (rounded to its dtype, lanes
    past K zero) into y_ptr [M, K]: as is, or (QUANTIZE; y_ptr e4m3, scale_ptr [M] fp32)
    quantized: one scale per row (amax / FP8_MAX), then e4m3 — quantize_rows_kernel's own step.
    A producer that computes y itself may round y differently from the kernel it replaces
    (the norms on the H200: see add_rms_norm); the step after y is the same code."""
    if QUANTIZE:
        x = y.to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), MIN_AMAX_) / FP8_MAX_  # max is exact: order-free
        xq = tl.clamp(x / scale, -FP8_MAX_, FP8_MAX_)
        tl.store(y_ptr + row * K + offs, xq.to(y_ptr.dtype.element_ty), mask=mask)
        tl.store(scale_ptr + row, scale)
    else:
        tl.store(y_ptr + row * K + offs, y, mask=mask)


@jit
def quantize_rows_kernel(x_ptr, xq_ptr, scale_ptr, K, BLOCK_K: tl.constexpr, FP8_MAX_: tl.constexpr, MIN_AMAX_: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + row * K + offs, mask=offs < K, other=0.0)
    store_row(x, xq_ptr, scale_ptr, row, offs, offs < K, K, True, FP8_MAX_, MIN_AMAX_)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton version of quantize_rows_reference (one program per token)."""
    x = x.contiguous()
    num_rows, num_cols = x.shape
    xq = torch.empty(num_rows, num_cols, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(num_rows, dtype=torch.float32, device=x.device)
    if num_rows:
        block = row_block(num_cols)
        quantize_rows_kernel[(num_rows,)](
            x, xq, scale, num_cols, BLOCK_K=block, FP8_MAX_=FP8_MAX, MIN_AMAX_=MIN_AMAX,
            num_warps=min(16, max(4, block // 1024)),
        )
    return xq, scale


@jit(do_not_specialize=["M"])
def fp8_matmul_persistent_kernel(
    x_desc, w_desc, y_desc, x_scale_ptr, w_scale_ptr, bias_ptr, M, N, K,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
):
    num_tiles_m = tl.cdiv(M, BLOCK_M)
    num_tiles_n = tl.cdiv(N, BLOCK_N)
    for tile_id in tl.range(tl.program_id(0), num_tiles_m * num_tiles_n, NUM_SMS, flatten=True):
        tile_m, tile_n = _tile_coords(tile_id, num_tiles_m, num_tiles_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            x = x_desc.load([tile_m * BLOCK_M, k])  # [BM, BK] e4m3
            w = w_desc.load([tile_n * BLOCK_N, k])  # [BN, BK] e4m3
            acc = tl.dot(x, w.T, acc)
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        x_scale = tl.load(x_scale_ptr + rows, mask=rows < M, other=0.0)
        w_scale = tl.load(w_scale_ptr + cols, mask=cols < N, other=0.0)
        acc = acc * x_scale[:, None] * w_scale[None, :]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        y_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(y_desc.dtype))


def fp8_matmul(
    xq: torch.Tensor, x_scale: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16, tiles: TileConfig = FP8_TILES, out: torch.Tensor | None = None,
) -> torch.Tensor:
    """xq: [M, K] e4m3, x_scale: [M] -> [M, N] out_dtype (written into `out` when given)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if not HAS_TRITON:
        raise RuntimeError("fp8_matmul: Triton is not installed")
    if xq.shape[1] % tiles.block_k or xq.shape[1] != weight.shape[1]:
        raise ValueError(f"fp8_matmul: x {tuple(xq.shape)} vs w {tuple(weight.shape)} (block_k={tiles.block_k})")
    num_rows, num_cols = xq.shape[0], weight.shape[0]
    y = output_buffer(out, num_rows, num_cols, out_dtype, xq.device)
    if num_rows == 0:
        return y
    x_desc = TensorDescriptor.from_tensor(xq, [tiles.block_m, tiles.block_k])
    w_desc = TensorDescriptor.from_tensor(weight.qweight, [tiles.block_n, tiles.block_k])
    y_desc = TensorDescriptor.from_tensor(y, [tiles.block_m, tiles.block_n])
    num_tiles = triton_cdiv(num_rows, tiles.block_m) * triton_cdiv(num_cols, tiles.block_n)
    sms = num_sms(xq.device)
    fp8_matmul_persistent_kernel[(min(sms, num_tiles),)](
        x_desc, w_desc, y_desc, x_scale, weight.scale, bias if bias is not None else y,
        num_rows, num_cols, xq.shape[1], HAS_BIAS=bias is not None,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
        NUM_SMS=sms, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return y


def fp8_linear(
    x: torch.Tensor | Fp8Rows, weight: Fp8Weight, bias: torch.Tensor | None = None, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x: [M, K] bf16 -> [M, N] bf16 through per-token quantization and the fp8 kernel; rows
    that come quantized (Fp8Rows) go to the kernel as they are."""
    xq, x_scale = (x.xq, x.scale) if isinstance(x, Fp8Rows) else quantize_rows(x)
    return fp8_matmul(xq, x_scale, weight, bias, out_dtype=x.dtype if out is None else out.dtype, out=out)


def fp8_linear_scaled_mm(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same product through torch._scaled_mm (cuBLASLt/CUTLASS rowwise): faster perhaps,
    but its kernel choice follows M, so it is NOT batch invariant; for comparison only."""
    xq, x_scale = quantize_rows(x)
    return torch._scaled_mm(
        xq, weight.qweight.t(), scale_a=x_scale[:, None], scale_b=weight.scale[None, :],
        bias=bias, out_dtype=x.dtype,
    )

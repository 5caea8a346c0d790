"""Batch-invariant bf16 matmul: y[M, N] = x[M, K] @ w[N, K]^T (+ bias), for `ops.linear` on CUDA.

    x (activations, any M) ──┐
    w (nn.Linear layout)  ───┴─ matmul_persistent_kernel ── one fixed tile config ──> y

Why invariant: cuBLAS picks its kernel (tile shape, split-K) from the whole problem shape,
so a row's reduction order over K changes with M. Here the tile config is a constant of
the module, there is no split-K, and each output tile runs the same K loop whichever
program computes it; a row's bits therefore depend only on that row and the weight.
`mm(x[:k], w) == mm(x, w)[:k]` bit for bit is the test (tests/engine/kernels/).

The kernel is persistent (one program per SM walking the tiles) and reads its tiles
through Hopper's bulk tensor copy (TMA descriptors). `matmul_pointer_kernel` is the
plain pointer-based variant, kept for GPUs without TMA and as a cross-check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels._triton import HAS_TRITON, jit, num_sms, tl


@dataclass(frozen=True, slots=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int  # tiles of one column band walked together, for L2 reuse of w
    num_warps: int
    num_stages: int


# Fixed for every call: changing it changes the numerics (and the system_fingerprint).
# Chosen on an H200 among 6 candidates (benchmarks/kernel_bench.py tile_sweep): 751 TFLOP/s on
# the Gemma-3-12B MLP shape at 16k rows, cuBLAS 708-782 on the same shapes.
BF16_TILES = TileConfig(block_m=128, block_n=256, block_k=64, group_m=16, num_warps=8, num_stages=3)
# fp32 output (logits): the epilogue tile is twice the bytes, so half the width.
FP32_OUT_TILES = TileConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
# Decoding passes (tens to hundreds of rows, `decoding_tiles`): more, smaller tiles, so more SMs
# share the weight's read. Every tile config here runs each output element's K loop in the same
# order, block_k columns at a time into one fp32 accumulator, so they give BF16_TILES's bits
# (tests/engine/kernels/test_kernel_matmul.py checks it on the GPU at decoding row counts).
FEW_ROWS_TILES = TileConfig(block_m=64, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=4)
NARROW_TILES = TileConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4)
FEW_ROWS = 128  # a decoding pass of at most this many rows takes FEW_ROWS_TILES
NARROW_COLS = 4096  # a product of at most this many columns (o_proj, down) takes NARROW_TILES


def decoding_tiles(num_rows: int, num_cols: int) -> TileConfig:
    """The tiles of a decoding pass's [num_rows, K] x [num_cols, K]^T bf16 product: chosen
    among configs timed at 64 and 320 rows on the Gemma-3-12B projections
    (benchmarks/decode_matmul_options.py); the same bits as BF16_TILES whichever is chosen,
    so choosing by the row count keeps a row's bits independent of its pass."""
    if num_rows <= FEW_ROWS:
        return FEW_ROWS_TILES
    return NARROW_TILES if num_cols <= NARROW_COLS else BF16_TILES


BLAS_BLOCK_ROWS = 384  # rows of every cuBLAS call of `matmul_blas_blocks` (a decoding pass's projections)


def matmul_blas_blocks(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                       block_rows: int = BLAS_BLOCK_ROWS) -> torch.Tensor:
    """x [M, K] @ w [N, K]^T (+ bias) as cuBLAS calls of exactly `block_rows` rows each (x's
    last block padded with zero rows): cuBLAS picks its kernel from the call's shape, which is
    then always (block_rows, N, K), so a row's bits depend only on that row, as for the CPU
    path's fixed ROW_CHUNK blocks (tests/engine/kernels/test_kernel_matmul.py checks it on the
    GPU). Not this module's kernel and not its bits: decoding passes only (ops.decoding_matmuls)."""
    num_rows = x.shape[0]
    padded_rows = -(-num_rows // block_rows) * block_rows
    if padded_rows != num_rows:
        x = torch.cat((x, x.new_zeros(padded_rows - num_rows, x.shape[1])))
    y = torch.empty(padded_rows, w.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, padded_rows, block_rows):
        rows = slice(start, start + block_rows)
        if bias is None:
            torch.mm(x[rows], w.t(), out=y[rows])
        else:
            torch.addmm(bias, x[rows], w.t(), out=y[rows])
    return y[:num_rows]


def matmul_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same product in fp32 accumulation, rounded once: what the kernel approximates."""
    y = x.float() @ w.float().t()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@jit
def _tile_coords(tile_id, num_tiles_m, num_tiles_n, GROUP_M: tl.constexpr):
    tiles_per_group = GROUP_M * num_tiles_n
    group = tile_id // tiles_per_group
    first_m = group * GROUP_M
    group_size = min(num_tiles_m - first_m, GROUP_M)
    tile_m = first_m + (tile_id % tiles_per_group) % group_size
    tile_n = (tile_id % tiles_per_group) // group_size
    return tile_m, tile_n


@jit(do_not_specialize=["M"])
def matmul_persistent_kernel(
    x_desc, w_desc, y_desc, bias_ptr, M, N, K,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
):
    num_tiles_m = tl.cdiv(M, BLOCK_M)
    num_tiles_n = tl.cdiv(N, BLOCK_N)
    for tile_id in tl.range(tl.program_id(0), num_tiles_m * num_tiles_n, NUM_SMS, flatten=True):
        tile_m, tile_n = _tile_coords(tile_id, num_tiles_m, num_tiles_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            x = x_desc.load([tile_m * BLOCK_M, k])  # [BM, BK]
            w = w_desc.load([tile_n * BLOCK_N, k])  # [BN, BK]
            acc = tl.dot(x, w.T, acc)
        if HAS_BIAS:
            offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        y_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], acc.to(y_desc.dtype))


@jit(do_not_specialize=["M"])
def matmul_pointer_kernel(
    x_ptr, w_ptr, y_ptr, bias_ptr, M, N, K,
    HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    num_tiles_m = tl.cdiv(M, BLOCK_M)
    num_tiles_n = tl.cdiv(N, BLOCK_N)
    tile_m, tile_n = _tile_coords(tl.program_id(0), num_tiles_m, num_tiles_n, GROUP_M)
    offs_m = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M  # wrapped rows: read, never stored
    offs_n = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None] * K + offs_k[None, :]  # [BM, BK]
    w_ptrs = w_ptr + offs_n[None, :] * K + offs_k[:, None]  # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):  # K % BLOCK_K == 0 (checked by the launcher)
        acc = tl.dot(tl.load(x_ptrs), tl.load(w_ptrs), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


def check_operands(x: torch.Tensor, w: torch.Tensor, block_k: int) -> None:
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"matmul: x {tuple(x.shape)} and w {tuple(w.shape)} do not chain")
    if x.shape[1] % block_k:
        raise ValueError(f"matmul: K={x.shape[1]} is not a multiple of block_k={block_k}")
    if not HAS_TRITON:
        raise RuntimeError("matmul: Triton is not installed")


def matmul(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
    tiles: TileConfig | None = None, is_persistent: bool = True, out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [M, K] bf16, w: [N, K] bf16 (contiguous), bias: [N] or None -> [M, N] out_dtype.

    out_dtype defaults to x's; float32 keeps the accumulator unrounded (the LM head: a bf16
    logit near 20 is only good to 0.06 nats). `out`: a contiguous [M, N] tensor to write
    (e.g. the first M rows of a padded buffer); the same bits as a fresh one."""
    out_dtype = out.dtype if out is not None else (out_dtype or x.dtype)
    tiles = tiles or (FP32_OUT_TILES if out_dtype == torch.float32 else BF16_TILES)
    check_operands(x, w, tiles.block_k)
    x = x.contiguous()
    num_rows, num_cols = x.shape[0], w.shape[0]
    y = output_buffer(out, num_rows, num_cols, out_dtype, x.device)
    if num_rows == 0:
        return y
    bias_arg = bias if bias is not None else y
    if is_persistent:
        _launch_persistent(x, w, y, bias_arg, bias is not None, tiles)
    else:
        grid = (triton_cdiv(num_rows, tiles.block_m) * triton_cdiv(num_cols, tiles.block_n),)
        matmul_pointer_kernel[grid](
            x, w, y, bias_arg, num_rows, num_cols, x.shape[1], HAS_BIAS=bias is not None,
            BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
            num_warps=tiles.num_warps, num_stages=tiles.num_stages,
        )
    return y


def _launch_persistent(x, w, y, bias_arg, has_bias: bool, tiles: TileConfig) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    num_rows, num_cols = y.shape
    x_desc = TensorDescriptor.from_tensor(x, [tiles.block_m, tiles.block_k])
    w_desc = TensorDescriptor.from_tensor(w, [tiles.block_n, tiles.block_k])
    y_desc = TensorDescriptor.from_tensor(y, [tiles.block_m, tiles.block_n])
    num_tiles = triton_cdiv(num_rows, tiles.block_m) * triton_cdiv(num_cols, tiles.block_n)
    sms = num_sms(x.device)
    matmul_persistent_kernel[(min(sms, num_tiles),)](
        x_desc, w_desc, y_desc, bias_arg, num_rows, num_cols, x.shape[1], HAS_BIAS=has_bias,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
        NUM_SMS=sms, num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )


def output_buffer(out: torch.Tensor | None, num_rows: int, num_cols: int, dtype: torch.dtype, device) -> torch.Tensor:
    """`out` checked (contiguous [num_rows, num_cols], a TMA store target), or a new tensor."""
    if out is None:
        return torch.empty(num_rows, num_cols, dtype=dtype, device=device)
    if tuple(out.shape) != (num_rows, num_cols) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous {(num_rows, num_cols)} tensor, got {tuple(out.shape)} {out.stride()}")
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)

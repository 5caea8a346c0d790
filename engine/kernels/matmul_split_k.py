"""Batch-invariant bf16 matmul for decoding passes: K split in a fixed number of parts.

    x [M, K] ──┐  split_k_partial_kernel, grid (M/BM x N/BN tiles, S parts): part s sums
    w [N, K] ──┴─ the K columns [s K/S, (s+1) K/S) in fp32 ──> partials [S, M, N] fp32
    partials ── split_k_reduce_kernel: ((p0 + p1) + p2) ... + bias, rounded once ──> y [M, N]

A decoding pass has tens to hundreds of rows. On the narrow projections (o_proj, down:
N = 3,840) the scoring passes' tiles make 15-30 column tiles over a K of 4k-15k, so a few
dozen SMs walk the whole K while the rest idle (benchmarks/decode_matmul_options.py). Here
each tile's K is cut into S parts computed by S programs side by side.

Why invariant: S and the tiles are a function of the weight's shape (N, K) only
(`decoding_config`), never of M; every element's K loop inside a part and the order in
which parts are added are the same whatever tile or program computes it. A row's bits
therefore depend only on that row and the weight, as with `matmul.matmul` (not the same
bits as it: with `ModelRunner.decoding_matmul = "split_k"`, decoding passes use this kernel
for every row count, scoring passes never). Not the default: on the H100 it cut o_proj and
down at 320 rows in isolation but decoded 8 news texts x 5 slots slower end to end than the
scoring kernel (docs/extraction.md, Cost).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels._triton import jit, tl
from engine.kernels.matmul import TileConfig, _tile_coords, check_operands, output_buffer, triton_cdiv

DECODING_TILES = TileConfig(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)
PROGRAMS_PER_ROW_BAND = 128  # column tiles x parts aimed at for one band of block_m rows (about one per SM)
MIN_PART_COLUMNS = 512  # a part walks at least this much of K
REDUCE_BLOCK = 1024  # output elements per program of the reduction


@dataclass(frozen=True, slots=True)
class SplitKConfig:
    tiles: TileConfig
    num_parts: int  # S: K is cut into S equal parts, each a multiple of tiles.block_k


def decoding_config(num_cols: int, num_inner: int, tiles: TileConfig = DECODING_TILES) -> SplitKConfig:
    """The config of an [M, K] x [N, K]^T product in a decoding pass: the largest power of
    two S with column tiles x S <= PROGRAMS_PER_ROW_BAND, parts of at least MIN_PART_COLUMNS
    columns that divide K in multiples of block_k. A function of (N, K) only."""
    column_tiles = triton_cdiv(num_cols, tiles.block_n)
    parts = 1
    while (column_tiles * parts * 2 <= PROGRAMS_PER_ROW_BAND and num_inner % (parts * 2 * tiles.block_k) == 0
           and num_inner // (parts * 2) >= MIN_PART_COLUMNS):
        parts *= 2
    return SplitKConfig(tiles, parts)


def matmul_split_k_reference(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, num_parts: int) -> torch.Tensor:
    """The same sum in fp32: each part's product, the parts added in order, + bias, rounded once."""
    total = None
    for part_x, part_w in zip(x.float().chunk(num_parts, dim=1), w.float().chunk(num_parts, dim=1), strict=True):
        product = part_x @ part_w.t()
        total = product if total is None else total + product
    if bias is not None:
        total = total + bias.float()
    return total.to(x.dtype)


@jit(do_not_specialize=["M"])
def split_k_partial_kernel(
    x_ptr, w_ptr, part_ptr, M, N, K, PART_K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
):
    num_tiles_m = tl.cdiv(M, BLOCK_M)
    num_tiles_n = tl.cdiv(N, BLOCK_N)
    tile_m, tile_n = _tile_coords(tl.program_id(0), num_tiles_m, num_tiles_n, GROUP_M)
    part = tl.program_id(1)
    offs_m = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M  # wrapped rows: read, never stored
    offs_n = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = part * PART_K + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * K + offs_k[None, :]  # [BM, BK]
    w_ptrs = w_ptr + offs_n[None, :].to(tl.int64) * K + offs_k[:, None]  # [BK, BN]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, PART_K, BLOCK_K):  # PART_K % BLOCK_K == 0 (decoding_config)
        acc = tl.dot(tl.load(x_ptrs), tl.load(w_ptrs), acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    out = part_ptr + part.to(tl.int64) * M * N + rows[:, None].to(tl.int64) * N + cols[None, :]
    tl.store(out, acc, mask=mask)


@jit(do_not_specialize=["M"])
def split_k_reduce_kernel(
    part_ptr, bias_ptr, y_ptr, M, N,
    NUM_PARTS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    total = tl.load(part_ptr + offs, mask=mask, other=0.0)
    for part in tl.static_range(1, NUM_PARTS):  # parts added in order: the same sum for every element
        total += tl.load(part_ptr + part * M * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=mask)


def matmul_split_k(
    x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, config: SplitKConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [M, K] bf16, w: [N, K] bf16, bias: [N] or None -> [M, N] in x's dtype (or into
    `out`, a contiguous [M, N] tensor). `config` defaults to `decoding_config(N, K)`."""
    config = config or decoding_config(w.shape[0], w.shape[1])
    tiles = config.tiles
    check_operands(x, w, tiles.block_k * config.num_parts)  # also: Triton installed
    x, w = x.contiguous(), w.contiguous()
    num_rows, num_cols, num_inner = x.shape[0], w.shape[0], x.shape[1]
    y = output_buffer(out, num_rows, num_cols, x.dtype, x.device)
    if num_rows == 0:
        return y
    parts = torch.empty(config.num_parts, num_rows, num_cols, dtype=torch.float32, device=x.device)
    grid = (triton_cdiv(num_rows, tiles.block_m) * triton_cdiv(num_cols, tiles.block_n), config.num_parts)
    split_k_partial_kernel[grid](
        x, w, parts, num_rows, num_cols, num_inner, num_inner // config.num_parts,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    split_k_reduce_kernel[(triton_cdiv(num_rows * num_cols, REDUCE_BLOCK),)](
        parts, bias if bias is not None else parts, y, num_rows, num_cols,
        NUM_PARTS=config.num_parts, HAS_BIAS=bias is not None, BLOCK=REDUCE_BLOCK, num_warps=4,
    )
    return y

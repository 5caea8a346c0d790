import pytest
import torch
from kernel_inputs import fresh

from engine.kernels.matmul import (
    BF16_TILES, FEW_ROWS, FEW_ROWS_TILES, NARROW_COLS, NARROW_TILES, decoding_tiles, matmul, matmul_blas_blocks,
    matmul_reference,
)
from engine.layers import ops

GEMMA_3_12B = {"qkv": (8192, 3840), "o": (3840, 4096), "gate_up": (30720, 3840), "down": (3840, 15360)}  # (N, K)


def test_reference_is_the_fp32_product_rounded_once():
    x, w, b = fresh((33, 64), seed=1), fresh((48, 64), seed=2), fresh((48,), seed=3)
    exact = (x.double() @ w.double().t() + b.double()).to(torch.bfloat16)
    got = matmul_reference(x, w, b)
    assert (got.float() - exact.float()).abs().max() <= exact.float().abs().max() * 2**-7


def test_cpu_linear_keeps_the_row_chunk_loop():
    x, w = fresh((128, 32), dtype=torch.float32, seed=4), fresh((16, 32), dtype=torch.float32, seed=5)
    chunks = torch.cat([torch.nn.functional.linear(x[i : i + 64], w) for i in (0, 64)])
    assert torch.equal(ops.linear(x, w), chunks)
    with pytest.raises(ValueError, match="multiple"):
        ops.linear(x[:100], w)


@pytest.mark.gpu
@pytest.mark.parametrize("is_persistent", [True, False])
@pytest.mark.parametrize("has_bias", [False, True])
def test_gpu_matmul_matches_reference(cuda, is_persistent, has_bias):
    x, w = fresh((1000, 3840), cuda, seed=6), fresh((4352, 3840), cuda, seed=7, scale=0.02)
    bias = fresh((4352,), cuda, seed=8) if has_bias else None
    y = matmul(x, w, bias, is_persistent=is_persistent)
    ref = matmul_reference(x, w, bias)
    rel = (y.float() - ref.float()).norm() / ref.float().norm()
    assert rel < 5e-3, rel


@pytest.mark.gpu
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_gpu_matmul_is_batch_invariant(cuda, out_dtype):
    """A row's bits depend only on that row: any slice of rows, anywhere, alone or packed."""
    x, w = fresh((2113, 4096), cuda, seed=9), fresh((6144, 4096), cuda, seed=10, scale=0.02)
    full = matmul(x, w, out_dtype=out_dtype)
    assert not torch.isnan(full).any()
    for start, stop in [(0, 1), (0, 7), (0, 64), (5, 133), (1000, 2113), (64, 1088)]:
        assert torch.equal(matmul(x[start:stop], w, out_dtype=out_dtype), full[start:stop]), (start, stop)
    assert torch.equal(ops.linear(x[:64], w, out_dtype=out_dtype), full[:64])


def test_decoding_tiles_by_rows_and_columns():
    assert decoding_tiles(1, 30720) == decoding_tiles(FEW_ROWS, 3840) == FEW_ROWS_TILES
    assert decoding_tiles(FEW_ROWS + 1, NARROW_COLS) == decoding_tiles(320, 3840) == NARROW_TILES
    assert decoding_tiles(320, NARROW_COLS + 1) == decoding_tiles(2048, 30720) == BF16_TILES
    assert {tiles.block_k % 64 for tiles in (FEW_ROWS_TILES, NARROW_TILES, BF16_TILES)} == {0}  # K = 64 k


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GEMMA_3_12B))
def test_gpu_decoding_tiles_give_the_scoring_bits(cuda, name):
    """Whatever decoding_tiles picks for a row count, a row gets the bits BF16_TILES gives it
    among 2,048 rows: a decoding row's bits do not depend on its pass's row count."""
    num_cols, num_inner = GEMMA_3_12B[name]
    x, w = fresh((2048, num_inner), cuda, seed=16), fresh((num_cols, num_inner), cuda, seed=17, scale=0.02)
    scoring = matmul(x, w)
    for num_rows in (1, 8, 64, FEW_ROWS, FEW_ROWS + 64, 320, 448):
        tiles = decoding_tiles(num_rows, num_cols)
        assert torch.equal(matmul(x[:num_rows], w, tiles=tiles), scoring[:num_rows]), (num_rows, tiles)
        with ops.decoding_matmuls("tiles"):
            assert torch.equal(ops.linear(x[-num_rows:], w), scoring[-num_rows:]), num_rows


def _rows_keep_their_bits_in_blas_blocks(device, dtype, num_inner: int, num_cols: int, block_rows: int) -> None:
    """A row's output from matmul_blas_blocks is the same bits alone, among other rows, at any
    place in any block, and in a last block padded with zeros; close to the fp32 product."""
    x = fresh((3 * block_rows, num_inner), device, dtype, seed=18)
    w, bias = fresh((num_cols, num_inner), device, dtype, seed=19, scale=0.02), fresh((num_cols,), device, dtype, seed=20)
    for b in (None, bias):
        full = matmul_blas_blocks(x, w, b, block_rows)
        assert full.shape == (3 * block_rows, num_cols)
        ref = matmul_reference(x, w, b)
        assert ((full.float() - ref.float()).norm() / ref.float().norm()) < 1e-2
        for start, stop in [(0, 1), (5, 9), (block_rows - 3, block_rows + 40), (64, 3 * block_rows - 1)]:
            assert torch.equal(matmul_blas_blocks(x[start:stop], w, b, block_rows), full[start:stop]), (start, stop)
        moved = torch.cat((x[7:8], x[:7]))  # row 7 at row 0 among other rows
        assert torch.equal(matmul_blas_blocks(moved, w, b, block_rows)[0], full[7])


def test_cpu_blas_blocks_keep_a_rows_bits():
    _rows_keep_their_bits_in_blas_blocks("cpu", torch.float32, 256, 96, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GEMMA_3_12B))
def test_gpu_blas_blocks_keep_a_rows_bits(cuda, name):
    """cuBLAS in calls of BLAS_BLOCK_ROWS rows (the decoding passes' "blas" kernel) on the
    Gemma-3-12B projections: a row's bits do not depend on the rows beside it."""
    from engine.kernels.matmul import BLAS_BLOCK_ROWS

    num_cols, num_inner = GEMMA_3_12B[name]
    _rows_keep_their_bits_in_blas_blocks(cuda, torch.bfloat16, num_inner, num_cols, BLAS_BLOCK_ROWS)
    x, w = fresh((320, num_inner), cuda, seed=25), fresh((num_cols, num_inner), cuda, seed=26, scale=0.02)
    with ops.decoding_matmuls("blas"):
        assert torch.equal(ops.linear(x, w), matmul_blas_blocks(x, w))

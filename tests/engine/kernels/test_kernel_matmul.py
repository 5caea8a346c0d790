import pytest
import torch
from kernel_inputs import fresh

from engine.kernels.matmul import BF16_TILES, FEW_ROWS_TILES, NARROW_TILES, bf16_tiles_for, matmul, matmul_reference
from engine.layers import ops


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


@pytest.mark.gpu
@pytest.mark.parametrize("num_cols, num_inner", [(3840, 4096), (3840, 15360), (8192, 3840), (30720, 3840)])
def test_gpu_matmul_rows_keep_their_bits_across_tile_configs(cuda, num_cols, num_inner):
    """The Gemma-3-12B projections: a pass of few rows (FEW_ROWS_TILES), of a few hundred
    (NARROW_TILES on the narrow ones) and of thousands (BF16_TILES) give a row the same bits."""
    x, w = fresh((1088, num_inner), cuda, seed=11), fresh((num_cols, num_inner), cuda, seed=12, scale=0.02)
    full = matmul(x, w)
    assert bf16_tiles_for(1088, num_cols, num_inner) is BF16_TILES
    for stop in (8, 64, 128, 320, 512):
        assert torch.equal(matmul(x[:stop], w), full[:stop]), stop
    assert bf16_tiles_for(64, num_cols, num_inner) is FEW_ROWS_TILES
    assert (bf16_tiles_for(320, num_cols, num_inner) is NARROW_TILES) == (num_cols <= 4096)

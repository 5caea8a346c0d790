import pytest
import torch
from interpreted import run_interpreted
from kernel_inputs import fresh

from engine.kernels.matmul import matmul
from engine.kernels.matmul_split_k import (
    DECODING_TILES, MIN_PART_COLUMNS, PROGRAMS_PER_ROW_BAND, decoding_config, matmul_split_k,
    matmul_split_k_reference,
)
from engine.layers import ops

GEMMA_3_12B = {"qkv": (8192, 3840), "o": (3840, 4096), "gate_up": (30720, 3840), "down": (3840, 15360)}  # (N, K)


def test_reference_adds_the_parts_in_order():
    x, w = fresh((5, 64), dtype=torch.float32, seed=1), fresh((6, 64), dtype=torch.float32, seed=2)
    parts = [x[:, i : i + 16] @ w[:, i : i + 16].t() for i in range(0, 64, 16)]
    assert torch.equal(matmul_split_k_reference(x, w, None, 4), ((parts[0] + parts[1]) + parts[2]) + parts[3])
    exact = x.double() @ w.double().t()
    torch.testing.assert_close(matmul_split_k_reference(x, w, None, 4).double(), exact, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_cols, num_inner", [*GEMMA_3_12B.values(), (2048, 8192), (896, 4864), (151936, 896)])
def test_decoding_config_cuts_k_into_whole_blocks_by_the_weight_shape(num_cols, num_inner):
    """A power of two, parts of whole blocks and at least MIN_PART_COLUMNS (or one part), the
    programs of a row band within PROGRAMS_PER_ROW_BAND: from (N, K) alone."""
    config = decoding_config(num_cols, num_inner)
    parts = config.num_parts
    assert config.tiles == DECODING_TILES and parts & (parts - 1) == 0
    assert num_inner % (parts * DECODING_TILES.block_k) == 0
    assert parts == 1 or num_inner // parts >= MIN_PART_COLUMNS
    column_tiles = -(-num_cols // DECODING_TILES.block_n)
    assert parts == 1 or column_tiles * parts <= PROGRAMS_PER_ROW_BAND
    doubled = parts * 2  # the largest such: twice the parts breaks one of the rules
    assert (column_tiles * doubled > PROGRAMS_PER_ROW_BAND or num_inner % (doubled * DECODING_TILES.block_k)
            or num_inner // doubled < MIN_PART_COLUMNS)


def test_decoding_config_on_the_gemma_3_12b_projections():
    assert {name: decoding_config(*shape).num_parts for name, shape in GEMMA_3_12B.items()} == {
        "qkv": 2, "o": 4, "gate_up": 1, "down": 4}


def test_split_k_kernel_interpreted():
    run_interpreted("matmul_split_k")


@pytest.mark.parametrize("kernel", ops.DECODING_MATMULS)
def test_cpu_linear_ignores_decoding_matmuls(kernel):
    x, w = fresh((64, 32), dtype=torch.float32, seed=4), fresh((16, 32), dtype=torch.float32, seed=5)
    with ops.decoding_matmuls(kernel):
        inside = ops.linear(x, w)
    assert torch.equal(inside, ops.linear(x, w))


def test_decoding_matmuls_names_the_kernels_it_knows():
    with pytest.raises(ValueError, match="split_k"):
        with ops.decoding_matmuls("splitk"):
            pass


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GEMMA_3_12B))
def test_gpu_split_k_matches_reference_and_rows_keep_their_bits(cuda, name):
    """The Gemma-3-12B projections at decoding row counts: close to the parts summed in fp32,
    and any slice of rows alone has the bits it has among 320 (or 1,088) rows."""
    num_cols, num_inner = GEMMA_3_12B[name]
    x, w = fresh((1088, num_inner), cuda, seed=11), fresh((num_cols, num_inner), cuda, seed=12, scale=0.02)
    bias = fresh((num_cols,), cuda, seed=13)
    config = decoding_config(num_cols, num_inner)
    full = matmul_split_k(x, w, bias)
    ref = matmul_split_k_reference(x, w, bias, config.num_parts)
    assert ((full.float() - ref.float()).norm() / ref.float().norm()) < 5e-3
    among_320 = matmul_split_k(x[:320], w, bias)
    assert torch.equal(among_320, full[:320])
    for start, stop in [(0, 1), (0, 8), (3, 67), (64, 128), (200, 320)]:
        assert torch.equal(matmul_split_k(x[start:stop], w, bias), among_320[start:stop]), (start, stop)


@pytest.mark.gpu
def test_gpu_linear_uses_split_k_only_inside_decoding_matmuls(cuda):
    x, w = fresh((320, 4096), cuda, seed=14), fresh((3840, 4096), cuda, seed=15, scale=0.02)
    with ops.decoding_matmuls("split_k"):
        decoding = ops.linear(x, w)
        logits = ops.linear(x, w, out_dtype=torch.float32)  # fp32 out (the LM head): the scoring kernel
    assert torch.equal(decoding, matmul_split_k(x, w))
    assert torch.equal(logits, matmul(x, w, out_dtype=torch.float32))
    assert torch.equal(ops.linear(x, w), matmul(x, w))
    with ops.decoding_matmuls("scoring"):
        assert torch.equal(ops.linear(x, w), matmul(x, w))

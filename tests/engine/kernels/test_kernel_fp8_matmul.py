import pytest
import torch
from kernel_inputs import fresh

from engine.kernels.fp8_matmul import (
    FP8_MAX,
    fp8_linear,
    fp8_linear_reference,
    fp8_linear_scaled_mm,
    quantize_rows,
    quantize_rows_reference,
    quantize_weight,
)
from engine.layers import ops


def test_weight_quantization_is_per_channel_and_close():
    w = fresh((64, 128), dtype=torch.float32, seed=1) * torch.linspace(0.01, 10, 64)[:, None]
    q = quantize_weight(w)
    assert q.qweight.dtype == torch.float8_e4m3fn and q.scale.shape == (64,)
    assert torch.allclose(q.qweight.float().abs().amax(1), torch.full((64,), FP8_MAX))
    rel = (q.dequantize() - w).norm(dim=1) / w.norm(dim=1)
    assert rel.max() < 0.05  # e4m3 keeps 3 mantissa bits: ~2-3% per element at worst


def test_row_quantization_zero_rows_and_scale():
    x = fresh((8, 256), dtype=torch.float32, seed=2)
    x[3] = 0.0  # a padding row must not divide by zero
    xq, scale = quantize_rows_reference(x)
    assert torch.isfinite(xq.float()).all() and (xq.float()[3] == 0).all()
    assert torch.allclose(xq.float().abs().amax(1)[[0, 1, 2, 4]], torch.full((4,), FP8_MAX))


def test_cpu_emulation_tracks_the_bf16_product():
    x, w = fresh((128, 256), dtype=torch.float32, seed=3), fresh((96, 256), dtype=torch.float32, seed=4)
    weight = quantize_weight(w)
    y = ops.linear(x, weight)  # the CPU path: quantize-dequantize emulation per ROW_CHUNK
    assert torch.equal(y[:64], fp8_linear_reference(x[:64], weight))
    exact = x @ w.t()
    assert (y - exact).norm() / exact.norm() < 0.06


@pytest.mark.gpu
def test_gpu_quantize_rows_matches_reference(cuda):
    x = fresh((777, 3840), cuda, seed=5)
    xq, scale = quantize_rows(x)
    ref_q, ref_scale = quantize_rows_reference(x)
    assert torch.equal(scale, ref_scale)
    assert torch.equal(xq.float(), ref_q.float())


@pytest.mark.gpu
def test_gpu_fp8_matmul_matches_reference_and_is_invariant(cuda):
    x, w = fresh((1500, 3840), cuda, seed=6), fresh((4096, 3840), cuda, seed=7, scale=0.02)
    weight = quantize_weight(w)
    y = fp8_linear(x, weight)
    ref = fp8_linear_reference(x, weight)
    assert (y.float() - ref.float()).norm() / ref.float().norm() < 5e-3
    exact = matmul_exact = x.float() @ w.float().t()
    assert (y.float() - exact).norm() / matmul_exact.norm() < 0.08
    for start, stop in [(0, 1), (3, 70), (700, 1500)]:
        assert torch.equal(fp8_linear(x[start:stop], weight), y[start:stop]), (start, stop)
    scaled = fp8_linear_scaled_mm(x, weight)
    assert (scaled.float() - ref.float()).norm() / ref.float().norm() < 5e-3

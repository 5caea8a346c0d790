"""Fused projections (engine/layers/modules.py: qkv_proj, gate_up_proj) against the separate ones.

Per-output-channel weight scales make the fused fp8 weight the rows of the separately
quantized ones (checked on any machine). On CUDA every output column runs the same K loop
whatever N is, so the fused matmul's slices are bit-identical to the separate matmuls
(bf16 and fp8, with and without bias, column splits on and off the 256-wide tiles).
"""

import pytest
import torch
from kernel_inputs import fresh

from engine.kernels.fp8_matmul import fp8_linear, quantize_weight
from engine.kernels.matmul import matmul

# (K, output widths): Gemma-3-12B q/k/v, Gemma-3-12B gate/up, Qwen2.5-0.5B q/k/v (off-tile splits)
SHAPES = [(3840, (4096, 2048, 2048)), (3840, (15360, 15360)), (896, (896, 128, 128))]


def parts(device, num_in: int, widths: tuple[int, ...], has_bias: bool, seed: int = 0):
    weights = [fresh((n, num_in), device, seed=seed + i, scale=0.02) for i, n in enumerate(widths)]
    biases = [fresh((n,), device, seed=seed + 10 + i) if has_bias else None for i, n in enumerate(widths)]
    return weights, biases


def cat_or_none(tensors):
    return None if tensors[0] is None else torch.cat(tensors)


def test_fused_fp8_weight_is_the_separately_quantized_rows():
    weights, _ = parts("cpu", 128, (64, 32, 32), has_bias=False)
    weights[1] = weights[1] * 40  # a part with a larger range must not change the others' scales
    fused = quantize_weight(torch.cat(weights))
    separate = [quantize_weight(w) for w in weights]
    assert torch.equal(fused.scale, torch.cat([q.scale for q in separate]))
    assert torch.equal(fused.qweight.float(), torch.cat([q.qweight.float() for q in separate]))


@pytest.mark.gpu
@pytest.mark.parametrize("num_in,widths", SHAPES)
@pytest.mark.parametrize("has_bias", [False, True])
def test_gpu_fused_bf16_matmul_is_bit_identical(cuda, num_in, widths, has_bias):
    x = fresh((1000, num_in), cuda, seed=1)
    weights, biases = parts(cuda, num_in, widths, has_bias, seed=2)
    fused = matmul(x, torch.cat(weights), cat_or_none(biases))
    for got, w, b in zip(fused.split(list(widths), dim=1), weights, biases):
        assert torch.equal(got, matmul(x, w, b))


@pytest.mark.gpu
@pytest.mark.parametrize("num_in,widths", [SHAPES[0], SHAPES[1]])  # fp8 needs K % 128 == 0
@pytest.mark.parametrize("has_bias", [False, True])
def test_gpu_fused_fp8_matmul_is_bit_identical(cuda, num_in, widths, has_bias):
    x = fresh((1000, num_in), cuda, seed=3)
    weights, biases = parts(cuda, num_in, widths, has_bias, seed=4)
    fused = fp8_linear(x, quantize_weight(torch.cat(weights)), cat_or_none(biases))
    for got, w, b in zip(fused.split(list(widths), dim=1), weights, biases):
        assert torch.equal(got, fp8_linear(x, quantize_weight(w), b))


@pytest.mark.gpu
@pytest.mark.parametrize("is_fp8", [False, True])
def test_gpu_matmul_writes_into_the_rows_of_a_padded_buffer(cuda, is_fp8):
    """out= (attention_cuda's padded q/k/v buffer): the same bits, the tail rows untouched."""
    x, w = fresh((1000, 3840), cuda, seed=5), fresh((8192, 3840), cuda, seed=6, scale=0.02)
    buffer = torch.zeros(2048, 8192, dtype=torch.bfloat16, device=cuda)
    if is_fp8:
        weight = quantize_weight(w)
        assert torch.equal(fp8_linear(x, weight, out=buffer[:1000]), fp8_linear(x, weight))
    else:
        assert torch.equal(matmul(x, w, out=buffer[:1000]), matmul(x, w))
    assert torch.equal(buffer[:1000], (fp8_linear(x, quantize_weight(w)) if is_fp8 else matmul(x, w)))
    assert not buffer[1000:].any()

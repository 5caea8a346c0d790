import pytest
import torch
from kernel_inputs import fresh

from engine.kernels.fp8_gate_up import fp8_gate_up_act, fp8_gate_up_act_reference, takes
from engine.kernels.fp8_matmul import fp8_linear, quantize_rows, quantize_weight
from engine.kernels.gated_act import GATED_ACTIVATIONS, gated_act, gated_act_fp8
from engine.layers import ops


def _gate_up(cuda, inner: int, depth: int, seed: int):
    """A gate_up weight whose gate and up halves differ in scale (swapping them shows)."""
    w = fresh((2 * inner, depth), cuda, seed=seed, scale=0.02)
    w[inner:] *= 3.0
    return quantize_weight(w)


def test_cpu_gated_mlp_is_linear_then_gated_linear():
    x = fresh((64, 256), dtype=torch.float32, seed=1)
    gate_up, down = _gate_up("cpu", 96, 256, seed=2), quantize_weight(fresh((256, 96), dtype=torch.float32, seed=3))
    want = ops.gated_linear(ops.linear(x, gate_up), "silu", down, None)
    assert torch.equal(ops.gated_mlp(x, gate_up, None, "silu", down, None), want)
    exact = torch.nn.functional.silu(x @ gate_up.dequantize()[:96].t()) * (x @ gate_up.dequantize()[96:].t())
    ref = fp8_gate_up_act_reference(x, gate_up, "silu")
    assert (ref - exact).norm() / exact.norm() < 0.1  # e4m3 rows: a few % per element
    swapped = torch.nn.functional.silu(x @ gate_up.dequantize()[96:].t()) * (x @ gate_up.dequantize()[:96].t())
    assert (ref - swapped).norm() / swapped.norm() > 0.3  # gate rows first, then up


def test_the_kernel_takes_an_intermediate_size_of_whole_16_byte_rows():
    assert takes(_gate_up("cpu", 15360, 128, seed=6)) and takes(_gate_up("cpu", 1096, 128, seed=6))
    assert not takes(_gate_up("cpu", 1100, 128, seed=6))


def test_fp8_gate_ups_names_its_choices():
    with pytest.raises(ValueError, match="fused"):
        with ops.fp8_gate_ups("fast"):
            pass


@pytest.mark.gpu
@pytest.mark.parametrize("activation", sorted(GATED_ACTIVATIONS))
@pytest.mark.parametrize("inner", [15360, 1096])  # 1096: a last column tile past I
def test_gpu_fp8_gate_up_act_is_the_unfused_path_bit_for_bit(cuda, activation, inner):
    """The epilogue's act(gate) * up: the bits of fp8_matmul's gate_up then gated_act, so
    down_proj's fp8 rows are those of gated_act_fp8; row-invariant; near the fp32 emulation."""
    x = fresh((1001, 3840), cuda, seed=4)
    gate_up = _gate_up(cuda, inner, 3840, seed=5)
    xq, x_scale = quantize_rows(x)
    y = fp8_gate_up_act(xq, x_scale, gate_up, activation)
    unfused = fp8_linear(x, gate_up)
    assert torch.equal(y, gated_act(unfused, activation))
    want_q, want_scale = gated_act_fp8(unfused, activation)
    got_q, got_scale = quantize_rows(y)
    assert torch.equal(got_scale, want_scale) and torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
    for start, stop in [(0, 1), (9, 200), (900, 1001)]:
        assert torch.equal(fp8_gate_up_act(xq[start:stop], x_scale[start:stop], gate_up, activation), y[start:stop])
    assert torch.equal(fp8_gate_up_act(xq, x_scale, gate_up, activation, one_dot=False), y)
    ref = fp8_gate_up_act_reference(x, gate_up, activation).float()
    assert (y.float() - ref).norm() / ref.norm() < 5e-3


@pytest.mark.gpu
def test_gpu_a_shape_the_kernel_does_not_take_is_refused_with_the_reason(cuda):
    x = fresh((300, 256), cuda, seed=12)
    with pytest.raises(ValueError, match="multiple of 8"):
        fp8_gate_up_act(*quantize_rows(x), _gate_up(cuda, 1100, 256, seed=13), "silu")


@pytest.mark.gpu
def test_gpu_gated_mlp_fused_and_unfused_agree(cuda):
    x = fresh((777, 3840), cuda, seed=8)
    gate_up, down = _gate_up(cuda, 15360, 3840, seed=9), quantize_weight(fresh((3840, 15360), cuda, seed=10, scale=0.02))
    with ops.fp8_gate_ups("fused"):  # each side its own setting, whatever the default is
        fused = ops.gated_mlp(x, gate_up, None, "gelu_pytorch_tanh", down, None)
        other = ops.gated_mlp(x, _gate_up(cuda, 15360, 3840, seed=11), None, "gelu_pytorch_tanh", down, None)
    with ops.fp8_gate_ups("unfused"):
        unfused = ops.gated_mlp(x, gate_up, None, "gelu_pytorch_tanh", down, None)
    assert torch.equal(fused, unfused)
    assert not torch.equal(fused, other)

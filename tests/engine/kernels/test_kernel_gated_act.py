import pytest
import torch
from interpreted import assert_gated_act_close, run_interpreted
from kernel_inputs import fresh

from engine.kernels.fp8_matmul import fp8_linear, quantize_rows, quantize_weight
from engine.kernels.gated_act import (
    GATED_ACTIVATIONS,
    gated_act,
    gated_act_fp8,
    gated_act_reference,
)
from engine.layers import ops


@pytest.mark.parametrize("activation", sorted(GATED_ACTIVATIONS))
def test_reference_is_what_the_model_computed(activation):
    """The unfused MLP: act(gate_proj(x)) * up_proj(x), in the activation dtype."""
    from transformers.activations import ACT2FN

    gate, up = fresh((5, 48), seed=1, scale=3.0), fresh((5, 48), seed=2)
    expected = ACT2FN[activation](gate) * up
    assert torch.equal(gated_act_reference(torch.cat([gate, up], dim=1), activation), expected)
    assert torch.equal(ops.gated_activation(torch.cat([gate, up], dim=1), activation), expected)


def test_kernel_under_the_triton_interpreter():
    run_interpreted("gated_act")


def test_fp8_kernel_under_the_triton_interpreter():
    run_interpreted("gated_act_fp8")


def test_cpu_gated_linear_is_the_activation_then_the_linear():
    """Against torch's own maths (gate columns first, silu, then the product): not the code's."""
    gate_up, w = fresh((64, 96), dtype=torch.float32, seed=4), fresh((32, 48), dtype=torch.float32, seed=5)
    activated = torch.nn.functional.silu(gate_up[:, :48]) * gate_up[:, 48:]
    want = ops.linear(gated_act_reference(gate_up, "silu"), w, None)
    assert torch.equal(want, ops.linear(activated, w, None))
    assert torch.equal(ops.gated_linear(gate_up, "silu", w, None), want)
    fp8 = quantize_weight(w)
    assert torch.equal(ops.gated_linear(gate_up, "silu", fp8, None), ops.linear(gated_act_reference(gate_up, "silu"), fp8))
    assert not torch.equal(ops.gated_linear(gate_up.flip(1), "silu", w, None), want)  # gate and up are not interchangeable


@pytest.mark.gpu
@pytest.mark.parametrize("activation", sorted(GATED_ACTIVATIONS))
@pytest.mark.parametrize("num_cols", [15360, 12288, 1100])
def test_gpu_gated_act_matches_and_is_invariant(cuda, activation, num_cols):
    gate_up = fresh((3001, 2 * num_cols), cuda, seed=3, scale=3.0)
    y = gated_act(gate_up, activation)
    ref = gated_act_reference(gate_up, activation)
    # An activation one ulp off can make the rounded product two off; |up| reaches ~16 here.
    assert_gated_act_close(y, ref, bf16_ulps=2, atol=1e-4)
    assert (y != ref).float().mean() < 0.05  # and rarely any ulp at all
    for start, stop in [(0, 1), (9, 200), (2000, 3001)]:
        assert torch.equal(gated_act(gate_up[start:stop], activation), y[start:stop])
    assert torch.equal(ops.gated_activation(gate_up, activation), y)


@pytest.mark.gpu
@pytest.mark.parametrize("activation", sorted(GATED_ACTIVATIONS))
@pytest.mark.parametrize("num_cols", [15360, 12288, 1536])
def test_gpu_gated_act_fp8_is_gated_act_then_quantize_rows(cuda, activation, num_cols):
    """The fused fp8 epilogue: the same e4m3 bits and scales as the two kernels it replaces."""
    gate_up = fresh((1001, 2 * num_cols), cuda, seed=6, scale=3.0)
    xq, scale = gated_act_fp8(gate_up, activation)
    want_q, want_scale = quantize_rows(gated_act(gate_up, activation))
    assert torch.equal(scale, want_scale)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8))
    alone_q, alone_scale = gated_act_fp8(gate_up[9:200], activation)
    assert torch.equal(alone_q.view(torch.uint8), xq[9:200].view(torch.uint8)) and torch.equal(alone_scale, scale[9:200])
    weight = quantize_weight(fresh((3840, num_cols), cuda, seed=7, scale=0.02))
    fused = ops.gated_linear(gate_up, activation, weight, None)
    assert torch.equal(fused, fp8_linear(gated_act(gate_up, activation), weight))

import pytest
import torch

from engine import ops
from engine.kernels.gated_act import GATED_ACTIVATIONS, gated_act, gated_act_reference
from interpreted import assert_gated_act_close, run_interpreted
from kernel_inputs import fresh


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


@pytest.mark.gpu
@pytest.mark.parametrize("activation", sorted(GATED_ACTIVATIONS))
@pytest.mark.parametrize("num_cols", [15360, 12288, 1100])
def test_gpu_gated_act_matches_and_is_invariant(cuda, activation, num_cols):
    gate_up = fresh((3001, 2 * num_cols), cuda, seed=3, scale=3.0)
    y = gated_act(gate_up, activation)
    ref = gated_act_reference(gate_up, activation)
    assert_gated_act_close(y, ref)
    assert (y != ref).float().mean() < 0.05  # and rarely even that
    for start, stop in [(0, 1), (9, 200), (2000, 3001)]:
        assert torch.equal(gated_act(gate_up[start:stop], activation), y[start:stop])
    assert torch.equal(ops.gated_activation(gate_up, activation), y)

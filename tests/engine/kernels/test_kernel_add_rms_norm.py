import pytest
import torch
from interpreted import run_interpreted
from kernel_inputs import fresh, norms

from engine.kernels.add_rms_norm import add_rms_norm, add_rms_norm_reference
from engine.kernels.rms_norm import rms_norm
from engine.layers import ops


def test_reference_is_the_unfused_ops_path():
    """Gemma 3: x + post_norm(delta), then the next norm; llama: x + delta, then the norm."""
    x, delta = fresh((7, 64), seed=1, scale=3.0), fresh((7, 64), seed=2)
    norm, delta_norm = norms(64)
    x_new, h = add_rms_norm_reference(x, delta, norm, delta_norm)
    assert torch.equal(x_new, x + ops.rms_norm(delta, *delta_norm))
    assert torch.equal(h, ops.rms_norm(x_new, *norm))
    assert torch.equal(add_rms_norm_reference(x, delta, norm)[0], x + delta)
    assert add_rms_norm_reference(x, delta, None)[1] is None
    for args in ((norm, delta_norm), (norm, None), (None, delta_norm)):
        for got, want in zip(ops.add_rms_norm(x, delta, *args), add_rms_norm_reference(x, delta, *args)):
            assert (got is None and want is None) or torch.equal(got, want)


def test_kernel_under_the_triton_interpreter():
    run_interpreted("add_rms_norm")


@pytest.mark.gpu
@pytest.mark.parametrize("dim,offset", [(3840, 1.0), (4096, 0.0), (896, 0.0)])
@pytest.mark.parametrize("has_delta_norm", [True, False])
def test_gpu_add_rms_norm_is_the_unfused_kernels_bit_for_bit(cuda, dim, offset, has_delta_norm):
    """Bit-identical to rms_norm kernel + torch add + rms_norm kernel, and row invariant."""
    x, delta = fresh((3001, dim), cuda, seed=3, scale=3.0), fresh((3001, dim), cuda, seed=4, scale=0.5)
    norm, delta_norm = norms(dim, cuda, offset=offset)
    delta_norm = delta_norm if has_delta_norm else None
    x_new, h = add_rms_norm(x, delta, norm, delta_norm)
    unfused_delta = rms_norm(delta, *delta_norm) if has_delta_norm else delta
    want_x = x + unfused_delta
    assert torch.equal(x_new, want_x)
    assert torch.equal(h, rms_norm(want_x, *norm))
    assert add_rms_norm(x, delta, None, delta_norm)[1] is None
    assert torch.equal(add_rms_norm(x, delta, None, delta_norm)[0], want_x)
    for start, stop in [(0, 1), (9, 200), (2000, 3001)]:
        alone = add_rms_norm(x[start:stop], delta[start:stop], norm, delta_norm)
        assert torch.equal(alone[0], x_new[start:stop]) and torch.equal(alone[1], h[start:stop])
    got = ops.add_rms_norm(x, delta, norm, delta_norm)
    assert torch.equal(got[0], x_new) and torch.equal(got[1], h)

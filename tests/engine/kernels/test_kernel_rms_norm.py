import pytest
import torch
from interpreted import run_interpreted
from kernel_inputs import fresh

from engine.kernels.rms_norm import (
    qk_norm_rope,
    qk_norm_rope_reference,
    rms_norm,
    rms_norm_reference,
)
from engine.layers import ops


def rope_tables(num_tokens: int, head_dim: int, device="cpu", dtype=torch.bfloat16):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim))
    return ops.rope_cos_sin(torch.arange(num_tokens, device=device) * 3 % 500, inv_freq, dtype)


def test_cpu_norm_rope_pads_with_zero_rows():
    x, w = fresh((5, 7, 64), seed=1), fresh((64,), seed=2)
    cos, sin = rope_tables(5, 64)
    padded = ops.norm_rope(x, w, 1e-6, cos, sin, num_rows_out=9)
    assert torch.equal(padded[:5], ops.norm_rope(x, w, 1e-6, cos, sin)) and not padded[5:].any()


def test_qk_norm_rope_under_the_triton_interpreter():
    run_interpreted("qk_norm_rope")


def test_references_are_the_ops_maths():
    x, w = fresh((5, 7, 64), seed=1), fresh((64,), seed=2)
    assert torch.equal(rms_norm_reference(x, w, 1e-6, 1.0), ops.rms_norm(x, w, 1e-6, 1.0))
    cos, sin = rope_tables(5, 64)
    fused = qk_norm_rope_reference(x, w, cos[:, 0], sin[:, 0], 1e-6)
    assert torch.equal(fused, ops.norm_rope(x, w, 1e-6, cos, sin))


@pytest.mark.gpu
@pytest.mark.parametrize("dim,offset", [(3840, 1.0), (4096, 0.0), (256, 1.0)])
def test_gpu_rms_norm_matches_and_is_invariant(cuda, dim, offset):
    x, w = fresh((3000, dim), cuda, seed=3, scale=3.0), fresh((dim,), cuda, seed=4)
    y = rms_norm(x, w, 1e-6, offset)
    ref = rms_norm_reference(x, w, 1e-6, offset)
    assert (y.float() - ref.float()).abs().max() <= ref.float().abs().max() * 2**-7
    for start, stop in [(0, 1), (9, 200), (2000, 3000)]:
        assert torch.equal(rms_norm(x[start:stop], w, 1e-6, offset), y[start:stop])
    assert torch.equal(ops.rms_norm(x, w, 1e-6, offset), y)


@pytest.mark.gpu
@pytest.mark.parametrize("num_heads,head_dim", [(16, 256), (32, 128), (8, 128)])
def test_gpu_qk_norm_rope_matches_and_is_invariant(cuda, num_heads, head_dim):
    fused_qkv = fresh((1000, (num_heads + 2) * head_dim), cuda, seed=5, scale=2.0)
    q = fused_qkv[:, : num_heads * head_dim].view(1000, num_heads, head_dim)  # strided view
    w = fresh((head_dim,), cuda, seed=6)
    cos, sin = rope_tables(1000, head_dim, cuda)
    y = qk_norm_rope(q, w, cos, sin, 1e-6, 1.0)
    ref = qk_norm_rope_reference(q, w, cos[:, 0], sin[:, 0], 1e-6, 1.0)
    assert (y.float() - ref.float()).abs().max() < 0.05 * ref.float().abs().max()
    assert torch.equal(qk_norm_rope(q[100:300], w, cos[100:300], sin[100:300], 1e-6, 1.0), y[100:300])
    padded = qk_norm_rope(q, w, cos, sin, 1e-6, 1.0, num_rows_out=1088)  # flex's padded stream
    assert padded.shape == (1088, num_heads, head_dim)
    assert torch.equal(padded[:1000], y) and not padded[1000:].any()
    assert torch.equal(ops.norm_rope(q, w, 1e-6, cos, sin, 1.0, num_rows_out=1088), padded)

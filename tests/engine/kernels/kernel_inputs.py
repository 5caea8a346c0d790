"""Inputs for the kernel tests."""

import torch


def fresh(shape, device="cpu", dtype=torch.bfloat16, seed=0, scale=1.0) -> torch.Tensor:
    """Random data from its own generator (never zeros: they hide unwritten outputs)."""
    gen = torch.Generator(device).manual_seed(seed)
    return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale).to(dtype)


def norms(dim: int, device="cpu", dtype=torch.bfloat16, offset: float = 1.0):
    """(norm, delta_norm) arguments of add_rms_norm: (weight, eps, weight_offset) each."""
    return (fresh((dim,), device, dtype, seed=11), 1e-6, offset), (fresh((dim,), device, dtype, seed=12), 1e-6, offset)

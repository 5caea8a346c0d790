"""Triton where it is installed; the torch references everywhere.

CPU machines (CI) carry no Triton. Kernel modules import `jit` and `tl` from here so
that they still import there: `jit` leaves the function plain, and the kernels' `tl.*`
annotations stay unevaluated strings (`from __future__ import annotations`).
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only install: launchers are never called there
    triton = None
    tl = None

HAS_TRITON = triton is not None


def jit(fn=None, **options):
    """`@jit` or `@jit(do_not_specialize=[...])`; a no-op without Triton."""
    if fn is None:
        return lambda f: jit(f, **options)
    return triton.jit(fn, **options) if HAS_TRITON else fn


def num_sms(device) -> int:
    import torch

    if torch.device(device).type != "cuda":  # TRITON_INTERPRET=1 runs kernels on CPU tensors
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (n >= 1): a block size that covers n."""
    return 1 << (n - 1).bit_length()

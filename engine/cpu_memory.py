"""Freed memory goes back to the system on CPU: glibc's malloc otherwise raises its mmap
threshold as large blocks are freed, after which a pass's large tensors come from the heap
and stay there (a 64-question request of 16,384-token passes left a CPU worker 2.7 GiB
higher; with a fixed threshold, 129 MiB: benchmarks/results/request-memory-llama.md).

    Engine(device="cpu") --bound_freed_memory()--> mallopt(M_MMAP_THRESHOLD, 128 KiB), mallopt(M_TRIM_THRESHOLD, 128 KiB)

A fixed threshold (glibc's own default, without its adjustment) makes every block of 128 KiB
or more an mmap of its own, unmapped when freed. Process-wide, once; nothing where the C
library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 128 * 1024


def bound_freed_memory() -> bool:
    """True when glibc took the fixed thresholds."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
        mallopt = libc.mallopt if libc is not None else None
    except (OSError, AttributeError):
        return False
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD_BYTES))

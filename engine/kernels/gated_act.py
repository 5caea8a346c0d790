"""act(gate) * up over the fused gate_up projection (GeGLU for Gemma 3, SwiGLU for llama/qwen).

    gate_up [T, 2I] (gate columns | up columns, rows may be strided)
      ──gated_act_kernel (grid: T × I/BLOCK)──> y [T, I] in gate_up's dtype
        y = round(round(act(gate)) * up)   # act in fp32 rounded to the dtype, then the product
      ──gated_act_fp8_kernel (one program per row)──> quantize_rows(y): e4m3 [T, I], scale [T]
        (down_proj an Fp8Weight: y never goes to memory in bf16)

Why: torch runs the activation and the product as two kernels (read I, write I; read 2I,
write I per row); this reads 2I and writes I once: 3 of 5 passes over [T, I].
Elementwise, so a row's bits depend on that row alone (batch invariant).
The reference is engine.layers.ops' CPU maths (ACT2FN, then the product), which rounds the same way;
the kernel's tanh (from exp) differs from torch's by a few fp32 ulps, so an element may differ
by one ulp from the reference, or by ~1e-6 absolute where 1 + tanh cancels (gelu of x < -3,
|y| < 0.005); never from itself: the tests check row invariance bit for bit.
"""

from __future__ import annotations

import math

import torch
from transformers.activations import ACT2FN

from engine.kernels._triton import HAS_TRITON, jit, tl
from engine.kernels.fp8_matmul import FP8_DTYPE, FP8_MAX, MIN_AMAX, row_block, store_row
from engine.kernels.matmul import triton_cdiv

# ACT2FN names the kernel computes -> its ACT constant
GATED_ACTIVATIONS = {"gelu_pytorch_tanh": 0, "silu": 1}
BLOCK_I = 1024
GELU_TANH_C = math.sqrt(2.0 / math.pi)


def gated_act_reference(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """gate_up: [T, 2I] -> act(gate) * up: [T, I], in gate_up's dtype (what ops does on CPU)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return ACT2FN[activation](gate) * up


@jit
def _gated(gate, up, ACT: tl.constexpr, C: tl.constexpr, DTYPE: tl.constexpr):
    """fp32 gate, up -> act(gate) * up rounded to DTYPE, as torch rounds it."""
    if ACT == 0:  # gelu tanh: 0.5·x·(1 + tanh(z)), z = √(2/π)(x + 0.044715x³), torch's formula
        z = C * (gate + 0.044715 * gate * gate * gate)
        e = tl.exp(-2.0 * tl.abs(z))  # tanh from one exp, without overflow: sign(z)(1 - e)/(1 + e)
        tanh = tl.where(z < 0, -1.0, 1.0) * (1.0 - e) / (1.0 + e)
        act = 0.5 * gate * (1.0 + tanh)
    else:  # silu
        act = gate / (1.0 + tl.exp(-gate))
    act = act.to(DTYPE).to(tl.float32)  # torch rounds the activation first
    return (act * up).to(DTYPE)


@jit
def _chunk_of_y(x_ptr, row, stride_x, cols, I, ACT: tl.constexpr, C: tl.constexpr):
    """y at `cols` of `row` as gated_act_kernel writes it, in fp32 (lanes past I: 0)."""
    mask = cols < I
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + I + cols, mask=mask, other=0.0).to(tl.float32)
    return _gated(gate, up, ACT, C, x_ptr.dtype.element_ty).to(tl.float32)


@jit
def gated_act_kernel(x_ptr, y_ptr, stride_x, I, ACT: tl.constexpr, C: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    y = _chunk_of_y(x_ptr, row, stride_x, cols, I, ACT, C)  # y's dtype is gate_up's: back exactly
    tl.store(y_ptr + row * I + cols, y.to(y_ptr.dtype.element_ty), mask=cols < I)


@jit
def gated_act_fp8_kernel(
    x_ptr, xq_ptr, scale_ptr, stride_x, I, ACT: tl.constexpr, C: tl.constexpr, BLOCK: tl.constexpr,
    FP8_MAX_: tl.constexpr, MIN_AMAX_: tl.constexpr,
):
    """One program per row (the row's amax): y as gated_act_kernel writes it, then
    fp8_matmul.quantize_rows_kernel's maths on it (`store_row`)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    y = _chunk_of_y(x_ptr, row, stride_x, cols, I, ACT, C)  # lanes past I: 0
    store_row(y, xq_ptr, scale_ptr, row, cols, cols < I, I, True, FP8_MAX_, MIN_AMAX_)


def gated_act(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """Triton version of gated_act_reference; gate_up [T, 2I] with a contiguous last dim."""
    if not HAS_TRITON:
        raise RuntimeError("gated_act: Triton is not installed")
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"gated_act: no kernel for {activation!r}; one of {sorted(GATED_ACTIVATIONS)}")
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    num_rows, num_cols = gate_up.shape[0], gate_up.shape[1] // 2
    y = torch.empty(num_rows, num_cols, dtype=gate_up.dtype, device=gate_up.device)
    if num_rows:
        gated_act_kernel[(num_rows, triton_cdiv(num_cols, BLOCK_I))](
            gate_up, y, gate_up.stride(0), num_cols, ACT=GATED_ACTIVATIONS[activation], C=GELU_TANH_C,
            BLOCK=BLOCK_I, num_warps=4,
        )
    return y


def _fp8_num_warps(block: int) -> int:
    """A whole row per program: 32 warps for the 16,384-wide rows (0.420 ms against 0.438 with
    16 and 0.486 with 8 on a 15,872 x 30,720 gate_up on the H100, bit-identical:
    benchmarks/gated_act_options.py, benchmarks/results/gated-act-options.json); narrower rows
    get 4-16 (not measured)."""
    return 32 if block >= 16384 else min(16, max(4, block // 1024))


def gated_act_fp8(
    gate_up: torch.Tensor, activation: str, num_warps: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """quantize_rows(gated_act(gate_up)) in one kernel: -> (e4m3 [T, I], scale [T] fp32), the
    input of fp8_matmul for a down projection held as an Fp8Weight (no [T, I] bf16 round trip).
    The whole row per program (a two-sweep kernel, CHUNK columns at a time, took 0.60-0.68 ms
    against 0.39 at every chunk of 1,024-4,096 on the H200: gated-act-options.json at 0af8ef9);
    an fp8 MLP without bias runs fp8_gate_up.py instead (the same bits);
    num_warps: the launch (the same bits whatever it is)."""
    if not HAS_TRITON:
        raise RuntimeError("gated_act_fp8: Triton is not installed")
    if gate_up.stride(-1) != 1:
        gate_up = gate_up.contiguous()
    num_rows, num_cols = gate_up.shape[0], gate_up.shape[1] // 2
    xq = torch.empty(num_rows, num_cols, dtype=FP8_DTYPE, device=gate_up.device)
    scale = torch.empty(num_rows, dtype=torch.float32, device=gate_up.device)
    if num_rows:
        block = row_block(num_cols)
        gated_act_fp8_kernel[(num_rows,)](
            gate_up, xq, scale, gate_up.stride(0), num_cols, ACT=GATED_ACTIVATIONS[activation], C=GELU_TANH_C,
            BLOCK=block, FP8_MAX_=FP8_MAX, MIN_AMAX_=MIN_AMAX, num_warps=num_warps or _fp8_num_warps(block),
        )
    return xq, scale

"""Batch-invariant building blocks shared by the model stacks.

A content's scores must be bit-identical whether it runs alone or packed with others.
BLAS picks its kernel (and so its reduction order) by the shape of the whole matmul, so
`linear(x[:1]) != linear(x)[:1]` in general. The packer starts every content at a multiple
of ROW_CHUNK and pads it to a multiple of ROW_CHUNK; `linear` then runs one fixed-shape
matmul per ROW_CHUNK rows, so a row's result depends only on that row.
On CUDA the same holds through fixed-tile Triton kernels (engine/kernels/): `linear` runs
the persistent bf16 matmul (or the fp8 one for an `Fp8Weight`), `rms_norm` one program per
row; neither depends on the number of rows, so there is no chunk loop there.
A decoding pass (tens to hundreds of rows) runs its bf16 projections inside
`decoding_matmuls(kernel)`, `ModelRunner.decoding_matmul` naming the kernel: "blas" (the
default) cuBLAS in calls of a fixed BLAS_BLOCK_ROWS rows (`matmul.matmul_blas_blocks`:
invariant as the CPU path's ROW_CHUNK blocks, other bits), "tiles" the same persistent
matmul as the scoring passes with tiles chosen for few rows (`matmul.decoding_tiles`, the
scoring passes' bits), "split_k" the split-K matmul
(engine/kernels/matmul_split_k.py, invariant by the same argument as the persistent one, other
bits), "scoring" the scoring passes' tiles.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F

from engine.kernels import add_rms_norm as add_rms_norm_kernels
from engine.kernels import fp8_gate_up, fp8_matmul, gated_act, matmul, matmul_split_k
from engine.kernels import rms_norm as rms_norm_kernels
from engine.kernels.fp8_matmul import Fp8Rows, Fp8Weight
from engine.kernels.int8_weight import Int8Weight

ROW_CHUNK = 64  # rows per fixed-shape matmul; the packer aligns contents to it
SCORE_CHUNK = 8  # rows per fixed-shape LM-head matmul; the packer pads each tree's scored rows to it

DECODING_MATMULS = ("tiles", "blas", "split_k", "scoring")  # the kernels a decoding pass's projections may run on
_DECODING_MATMUL = ContextVar("decoding_matmul", default="scoring")
FP8_GATE_UPS = ("fused", "unfused")  # an fp8 MLP's gate_up: act(gate) * up in its epilogue, or its own kernel
FP8_GATE_UP = "fused"  # the default of FP8_GATE_UPS (the same bits either way)
_FP8_GATE_UP = ContextVar("fp8_gate_up", default=FP8_GATE_UP)


@contextmanager
def chosen(var: ContextVar, value: str, choices: tuple[str, ...]) -> Iterator[None]:
    """`var` set to `value`, one of `choices`, inside the block (a ValueError naming them else)."""
    if value not in choices:
        raise ValueError(f"{var.name}: {value!r} is not one of {choices}")
    token = var.set(value)
    try:
        yield
    finally:
        var.reset(token)


def decoding_matmuls(kernel: str):
    """Inside: `linear`'s bf16-output products on CUDA run on `kernel` (one of
    DECODING_MATMULS; the passes of engine/extraction, and a CUDA graph captured inside keeps
    it). CPU: no effect."""
    return chosen(_DECODING_MATMUL, kernel, DECODING_MATMULS)


def fp8_gate_ups(mode: str):
    """Inside: an fp8 MLP on CUDA runs its gate_up `mode` (one of FP8_GATE_UPS; the one that is
    not FP8_GATE_UP is there for same-run comparisons). CPU: no effect."""
    return chosen(_FP8_GATE_UP, mode, FP8_GATE_UPS)


def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Host -> device without blocking the host on CUDA: a copy from pageable memory waits for
    every kernel already queued (the pass in flight), one from pinned memory does not."""
    device = torch.device(device)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def linear(
    x: torch.Tensor | Fp8Rows,
    weight: torch.Tensor | Fp8Weight | Int8Weight,
    bias: torch.Tensor | None = None,
    row_chunk: int = ROW_CHUNK,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [T, D_in]; weight: [D_out, D_in] (or an Fp8Weight) -> [T, D_out] in out_dtype (x's).

    On CPU T must be a multiple of row_chunk. out_dtype=float32 on CUDA keeps the kernel's
    fp32 accumulator (the LM head); on CPU it only casts. `out`: a contiguous [T, D_out]
    tensor of x's dtype to write into (the padded q/k/v buffer of attention_cuda).
    x may be Fp8Rows (a norm's output quantized for this Fp8Weight, `wants_fp8_rows`): CUDA only."""
    if isinstance(x, Fp8Rows) and not (x.is_cuda and isinstance(weight, Fp8Weight)):
        raise ValueError("linear: Fp8Rows input needs an Fp8Weight on CUDA")
    if isinstance(weight, Int8Weight):  # weight-only: dequantize, then the bf16 path
        weight = weight.dequantize(x.dtype)
    if out is not None and (out_dtype not in (None, out.dtype) or out.dtype != x.dtype):
        raise ValueError("linear: out= needs x's dtype")
    if x.is_cuda:
        if isinstance(weight, Fp8Weight):
            y = fp8_matmul.fp8_linear(x, weight, bias, out=out)
            return y if out_dtype in (None, y.dtype) else y.to(out_dtype)
        kernel = _DECODING_MATMUL.get() if out_dtype in (None, x.dtype) else "scoring"
        if kernel == "split_k":
            return matmul_split_k.matmul_split_k(x, weight, bias, out=out)
        if kernel == "blas":
            y = matmul.matmul_blas_blocks(x, weight, bias)
            return y if out is None else out.copy_(y)
        tiles = matmul.decoding_tiles(x.shape[0], weight.shape[0]) if kernel == "tiles" else None
        return matmul.matmul(x, weight, bias, tiles=tiles, out_dtype=out_dtype, out=out)
    num_rows = x.shape[0]
    if num_rows % row_chunk:
        raise ValueError(f"linear: {num_rows} rows is not a multiple of row_chunk={row_chunk}")
    out = matmul.output_buffer(out, num_rows, weight.shape[0], x.dtype, x.device)
    for start in range(0, num_rows, row_chunk):
        rows = slice(start, start + row_chunk)
        if isinstance(weight, Fp8Weight):  # quantize-dequantize emulation (drift studies)
            out[rows] = fp8_matmul.fp8_linear_reference(x[rows], weight, bias)
        else:
            out[rows] = F.linear(x[rows], weight, bias)
    return out if out_dtype in (None, out.dtype) else out.to(out_dtype)


def wants_fp8_rows(weight: torch.Tensor | Fp8Weight | Int8Weight) -> bool:
    """Whether the norm feeding a projection with this weight should hand it Fp8Rows (on CUDA:
    the norm kernel quantizes its rows, no quantize_rows launch; on CPU the flag is ignored)."""
    return isinstance(weight, Fp8Weight)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0, quantize: bool = False
) -> torch.Tensor | Fp8Rows:
    """x: [..., D] -> [..., D], computed in fp32. Gemma stores (weight - 1): weight_offset=1.
    quantize (CUDA; `wants_fp8_rows` of the consumer): the rows as Fp8Rows, quantized by the
    norm kernel (within a bf16 ulp or two of norm-then-quantize_rows, see add_rms_norm.py).
    On CPU ignored: the fp8 emulation quantizes in linear."""
    if x.is_cuda:
        return rms_norm_kernels.rms_norm(x, weight, eps, weight_offset, quantize)
    return rms_norm_kernels.rms_norm_reference(x, weight, eps, weight_offset)


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, norm: tuple | None, delta_norm: tuple | None = None, quantize: bool = False
) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows | None]:
    """The residual step: x [T, D] += delta_norm(delta) (delta as is when None), then
    h = norm(x) (None when norm is None). norm / delta_norm: (weight, eps, weight_offset).
    One fused kernel on CUDA, bit-identical to these unfused ops there; quantize as rms_norm's
    (h as Fp8Rows on CUDA, within rounding of quantizing h in fp8_linear; ignored on CPU)."""
    if x.is_cuda:
        return add_rms_norm_kernels.add_rms_norm(x, delta, norm, delta_norm, quantize)
    return add_rms_norm_kernels.add_rms_norm_reference(x, delta, norm, delta_norm)


def gated_activation(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """gate_up: [T, 2I] (gate columns, then up) -> act(gate) * up: [T, I] in gate_up's dtype.
    One fused kernel on CUDA (gelu_pytorch_tanh, silu)."""
    if gate_up.is_cuda and activation in gated_act.GATED_ACTIVATIONS:
        return gated_act.gated_act(gate_up, activation)
    return gated_act.gated_act_reference(gate_up, activation)


def gated_linear(
    gate_up: torch.Tensor, activation: str, weight: torch.Tensor | Fp8Weight | Int8Weight, bias: torch.Tensor | None
) -> torch.Tensor:
    """The MLP's down projection over act(gate) * up: gate_up [T, 2I] -> [T, D]. With an fp8
    weight on CUDA the activation kernel also quantizes its rows (the same bits as
    gated_activation then fp8 linear, one [T, I] bf16 write and read fewer)."""
    if gate_up.is_cuda and isinstance(weight, Fp8Weight) and activation in gated_act.GATED_ACTIVATIONS:
        return linear(Fp8Rows(*gated_act.gated_act_fp8(gate_up, activation), gate_up.dtype), weight, bias)
    return linear(gated_activation(gate_up, activation), weight, bias)


def gated_mlp(
    x: torch.Tensor | Fp8Rows, gate_up: torch.Tensor | Fp8Weight | Int8Weight, gate_up_bias: torch.Tensor | None,
    activation: str, down: torch.Tensor | Fp8Weight | Int8Weight, down_bias: torch.Tensor | None,
) -> torch.Tensor:
    """down(act(gate) * up) for x [T, D] and gate_up [2I, D] -> [T, D]. Both weights fp8 on
    CUDA, gate_up without bias: gate_up's kernel applies the activation in its epilogue and
    writes [T, I] (fp8_gate_up.py; unless `fp8_gate_ups("unfused")`), quantize_rows feeds down.
    Otherwise linear, then gated_linear."""
    fused = x.is_cuda and _FP8_GATE_UP.get() == "fused" and activation in gated_act.GATED_ACTIVATIONS
    if fused and gate_up_bias is None and isinstance(gate_up, Fp8Weight) and isinstance(down, Fp8Weight):
        rows = x if isinstance(x, Fp8Rows) else Fp8Rows(*fp8_matmul.quantize_rows(x), x.dtype)
        y = fp8_gate_up.fp8_gate_up_act(rows.xq, rows.scale, gate_up, activation, out_dtype=rows.dtype)
        return linear(Fp8Rows(*fp8_matmul.quantize_rows(y), y.dtype), down, down_bias)
    return gated_linear(linear(x, gate_up, gate_up_bias), activation, down, down_bias)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [T], inv_freq: [head_dim/2] -> cos, sin: [T, 1, head_dim] (HF's half-split layout)."""
    freqs = positions.float()[:, None] * inv_freq.float()[None, :]  # [T, head_dim/2]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [T, 1, head_dim]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, head_dim]."""
    return x * cos + rotate_half(x) * sin


def norm_rope(
    x: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, weight_offset: float = 0.0,
    num_rows_out: int | None = None,
) -> torch.Tensor:
    """Per-head q/k RMSNorm then RoPE: x [T, H, d], cos/sin [T, 1, d] -> [num_rows_out or T, H, d],
    rows past T zero (flex attention's padded stream). One fused kernel on CUDA."""
    if x.is_cuda:
        return rms_norm_kernels.qk_norm_rope(x, weight, cos, sin, eps, weight_offset, num_rows_out)
    y = apply_rope(rms_norm(x, weight, eps, weight_offset), cos, sin)
    return y if num_rows_out is None else F.pad(y, (0, 0, 0, 0, 0, num_rows_out - y.shape[0]))

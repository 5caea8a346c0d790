"""The fp8 gate_up projection with act(gate) * up in its epilogue (Hopper, TMA).

    x rows (xq e4m3 [M, D], x_scale [M]) + gate_up Fp8Weight (qweight [2I, D]: gate rows | up rows)
      ──fp8_gate_up_act_kernel (one output tile [BM, BN] = a gate tile and its up tile)──>
        y [M, I] bf16 = act(gate) * up, gate / up as fp8_matmul would have written them
      ──quantize_rows──> down_proj's input (e4m3 [M, I], scale [M])

Unfused, fp8_matmul writes gate_up [M, 2I] bf16 and gated_act_fp8 reads it back: 4I bytes
written and 4I read per row. Here each program accumulates the gate tile (weight rows
n .. n+BN) and the up tile (rows I+n .. I+n+BN) of the same columns: one TMA box of a
[2, I, K] view of the weight and one [BM, 2 BN] dot (ONE_DOT, the engine's launch; two dots
run 30% slower: docs/performance.md), the accumulator split in the epilogue.
It rounds both to the output dtype (the values gate_up would hold in memory) and stores only
act(gate) * up: 2I bytes written, then 2I read by quantize_rows. Every step is the unfused
path's own maths on the same values (the K loop is fp8_matmul's, `gated_act._gated` is the
activation kernel's, quantize_rows applies `store_row` as gated_act_fp8 does), so the fp8 rows
are bit-identical to fp8_matmul then gated_act_fp8 (tests/engine/kernels/test_kernel_fp8_gate_up.py;
timings in benchmarks/gated_act_options.py).
Fixed tiles, no split-K: a row's result depends on that row alone (batch invariant).
`fp8_gate_up_act_reference` is the unfused maths in torch (fp8 emulation, any device).
"""

from __future__ import annotations

import torch

from engine.kernels._triton import HAS_TRITON, jit, num_sms, tl
from engine.kernels.fp8_matmul import FP8_TILES, Fp8Weight, fp8_linear_reference
from engine.kernels.gated_act import GATED_ACTIVATIONS, GELU_TANH_C, _gated, gated_act_reference
from engine.kernels.matmul import TileConfig, _tile_coords, triton_cdiv

# The unfused kernel's [128, 256] output tile as a gate half and an up half: the same shared
# memory per stage (x [128, 128] + two w [128, 128] e4m3), half the epilogue tile.
GATE_UP_TILES = TileConfig(block_m=128, block_n=128, block_k=FP8_TILES.block_k, group_m=FP8_TILES.group_m,
                           num_warps=FP8_TILES.num_warps, num_stages=FP8_TILES.num_stages)


def takes(weight: Fp8Weight) -> bool:
    """Whether the kernel takes this gate_up weight: an even number of rows, I of them a
    multiple of 8 (y's rows and the [2, I, K] view's planes 16-byte aligned for TMA)."""
    return weight.shape[0] % 16 == 0


def fp8_gate_up_act_reference(x: torch.Tensor, weight: Fp8Weight, activation: str) -> torch.Tensor:
    """x: [M, D] -> act(gate) * up [M, I] in x's dtype: fp8_linear_reference, then the activation."""
    return gated_act_reference(fp8_linear_reference(x, weight), activation)


@jit(do_not_specialize=["M"])
def fp8_gate_up_act_kernel(
    x_desc, w_desc, y_desc, x_scale_ptr, w_scale_ptr, M, I, K,
    ACT: tl.constexpr, C: tl.constexpr, ONE_DOT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
):
    """ONE_DOT: w_desc views the weight as [2, I, K] and one load brings a gate tile and its up
    tile as [2 x BN, BK] (one dot, the accumulator split in the epilogue); else w_desc is
    [2I, K] and the two tiles are two loads and two dots."""
    num_tiles_m = tl.cdiv(M, BLOCK_M)
    num_tiles_n = tl.cdiv(I, BLOCK_N)
    for tile_id in tl.range(tl.program_id(0), num_tiles_m * num_tiles_n, NUM_SMS, flatten=True):
        tile_m, tile_n = _tile_coords(tile_id, num_tiles_m, num_tiles_n, GROUP_M)
        if ONE_DOT:
            acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                x = x_desc.load([tile_m * BLOCK_M, k])  # [BM, BK] e4m3
                w = w_desc.load([0, tile_n * BLOCK_N, k]).reshape(2 * BLOCK_N, BLOCK_K)  # gate rows | up rows
                acc = tl.dot(x, w.T, acc)
            acc_gate, acc_up = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N)), (0, 2, 1)))
        else:
            acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                x = x_desc.load([tile_m * BLOCK_M, k])  # [BM, BK] e4m3
                w_gate = w_desc.load([tile_n * BLOCK_N, k])  # [BN, BK]: gate rows
                w_up = w_desc.load([I + tile_n * BLOCK_N, k])  # [BN, BK]: the up rows of the same columns
                acc_gate = tl.dot(x, w_gate.T, acc_gate)
                acc_up = tl.dot(x, w_up.T, acc_up)
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)  # lanes past I hold other rows' sums: never stored
        x_scale = tl.load(x_scale_ptr + rows, mask=rows < M, other=0.0)[:, None]
        gate_scale = tl.load(w_scale_ptr + cols, mask=cols < I, other=0.0)[None, :]
        up_scale = tl.load(w_scale_ptr + I + cols, mask=cols < I, other=0.0)[None, :]
        gate = (acc_gate * x_scale * gate_scale).to(y_desc.dtype).to(tl.float32)  # gate_up's bits in memory
        up = (acc_up * x_scale * up_scale).to(y_desc.dtype).to(tl.float32)
        y_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], _gated(gate, up, ACT, C, y_desc.dtype))


def fp8_gate_up_act(
    xq: torch.Tensor, x_scale: torch.Tensor, weight: Fp8Weight, activation: str,
    out_dtype: torch.dtype = torch.bfloat16, tiles: TileConfig = GATE_UP_TILES, one_dot: bool = True,
) -> torch.Tensor:
    """xq [M, D] e4m3, x_scale [M], weight [2I, D] (gate rows, then up rows) -> act(gate) * up [M, I].
    one_dot: the kernel's ONE_DOT (the launch; the same bits either way)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    if not HAS_TRITON:
        raise RuntimeError("fp8_gate_up_act: Triton is not installed")
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"fp8_gate_up_act: no kernel for {activation!r}; one of {sorted(GATED_ACTIVATIONS)}")
    num_rows, depth = xq.shape
    if depth % tiles.block_k or depth != weight.shape[1] or not takes(weight):
        raise ValueError(f"fp8_gate_up_act: x {tuple(xq.shape)} vs w {tuple(weight.shape)}: D a multiple of"
                         f" {tiles.block_k}, w's rows 2I with I a multiple of 8")
    inner = weight.shape[0] // 2
    y = torch.empty(num_rows, inner, dtype=out_dtype, device=xq.device)
    if num_rows == 0:
        return y
    x_desc = TensorDescriptor.from_tensor(xq, [tiles.block_m, tiles.block_k])
    if one_dot:  # the weight as [2, I, K]: gate rows and up rows of one column tile in one box
        w_desc = TensorDescriptor.from_tensor(weight.qweight.view(2, inner, depth), [2, tiles.block_n, tiles.block_k])
    else:
        w_desc = TensorDescriptor.from_tensor(weight.qweight, [tiles.block_n, tiles.block_k])
    y_desc = TensorDescriptor.from_tensor(y, [tiles.block_m, tiles.block_n])
    num_tiles = triton_cdiv(num_rows, tiles.block_m) * triton_cdiv(inner, tiles.block_n)
    sms = num_sms(xq.device)
    fp8_gate_up_act_kernel[(min(sms, num_tiles),)](
        x_desc, w_desc, y_desc, x_scale, weight.scale, num_rows, inner, depth,
        ACT=GATED_ACTIVATIONS[activation], C=GELU_TANH_C, ONE_DOT=one_dot, BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, GROUP_M=tiles.group_m, NUM_SMS=sms,
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )
    return y

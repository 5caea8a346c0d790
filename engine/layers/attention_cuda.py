"""Tree attention on CUDA: the packer's tree spans as a flex_attention BlockMask.

    AttentionMetadata(spans: subtree ends [n] per span, or dense [n, n] masks)
      --prepare_cuda_attention (CPU: classify 64x64 blocks, copy per-token tables)-->
    AttentionMetadata(block_mask=TreeBlockMasks)   (GPU: per-token tables, block tables)
      --tree_attention -> flex_tree_attention--> compiled flex_attention, one BlockMask per window

Blocks are BLOCK_SIZE = ROW_CHUNK = 64 tokens, and the packer starts every tree at a multiple
of 64, so a content's tiles (which are empty, partial or full, and in what order they are
visited) are the same wherever it sits: its attention is bit-identical alone or packed.
A tree's nodes are in preorder (engine/pipeline/tree.py), so token q sees token kv exactly when
    kv <= q < subtree_end[kv]
(one load per key column, no per-(row, column) table; subtree ends never leave their span, so
nothing crosses spans). The same intervals classify the blocks: block (bq, bk) below the
diagonal is full when every column's subtree covers the row block, and partial when some
column's does in part. Spans without subtree ends (a custom mask_fn, e.g. the parity's leaky
negative control) make the pass read one bit of the span's dense mask per (row, column):
    bits[row_base[q] + (kv - span_start[q]) // 32] >> ((kv - span_start[q]) % 32) & 1
which cost ~30% of a layer's attention on the H200 (benchmarks/flex_options.py --probe-mask-cost).
Both give the same mask (+ `pos[q] - pos[kv] < window` on sliding layers), so the same outputs
bit for bit. The stream is padded to a multiple of
BUCKET tokens so flex_attention compiles once per bucket, not once per pass. The padding is
made once per pass, not per layer: `TreeBlockMasks.padded_buffer` is a [Tp, N] buffer with
zero tail rows that every layer's fused q/k/v matmul writes (v comes padded, a view), and the
q/k norm + RoPE kernel writes Tp rows, zero past T; only inputs of T rows are padded here.
Construction is vectorised (per block from the subtree ends; per span for dense masks: numpy
packbits, block any/all); there is no loop per token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from engine.layers.ops import ROW_CHUNK, to_device

BLOCK_SIZE = ROW_CHUNK  # flex tile = packer alignment: the batch-invariance argument above
BUCKET = 2048  # the stream is padded to a multiple of this (one compiled kernel per bucket)
# Fixed tile shape and launch config: flex's defaults may vary with the problem, and a tile
# larger than BLOCK_SIZE would mix tokens of neighbouring contents in one reduction order.
# USE_TMA (Hopper's bulk tensor copies for the q/k/v tiles): 1.18 -> 1.04 ms per full-attention
# layer, 1.36 -> 1.12 ms sliding, outputs bit-identical on the news masks (benchmarks/flex_options.py,
# benchmarks/results/flex-options-gemma-3-12b.json); num_stages 3 does not fit in shared memory.
KERNEL_OPTIONS = {"BLOCK_M": BLOCK_SIZE, "BLOCK_N": BLOCK_SIZE, "num_warps": 4, "num_stages": 2, "USE_TMA": True}

_compiled_flex = None


@dataclass(slots=True)
class TreeBlockMasks:
    num_tokens: int  # real stream length T (a multiple of BLOCK_SIZE)
    num_padded: int  # T rounded up to BUCKET
    positions: torch.Tensor  # [Tp] int64: RoPE positions (depth), for sliding windows
    any_blocks: torch.Tensor  # [Tp/64, Tp/64] bool: the tree mask has a True in the block
    full_blocks: torch.Tensor  # [Tp/64, Tp/64] bool: the tree mask is all True in the block
    block_pos_min: torch.Tensor  # [Tp/64] int64 per block, for window classification
    block_pos_max: torch.Tensor
    subtree_end: torch.Tensor | None = None  # [Tp] int32: kv is seen by rows [kv, subtree_end[kv])
    bits: torch.Tensor | None = None  # [capacity] int32 (no subtree ends): every span's mask rows, 32 columns a word
    row_base: torch.Tensor | None = None  # [Tp] int64: first word of token q's mask row
    span_start: torch.Tensor | None = None  # [Tp] int64: first token of q's span (pads: Tp)
    span_end: torch.Tensor | None = None  # [Tp] int64: one past the last token of q's span (pads: Tp)
    _by_window: dict[int | None, BlockMask] = field(default_factory=dict)
    _padded_buffers: dict[tuple, torch.Tensor] = field(default_factory=dict)

    def padded_buffer(self, num_cols: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """[Tp, num_cols], rows past num_tokens zero, made once per pass: every layer's fused q/k/v
        matmul writes its first num_tokens rows (the next layer overwrites them after this
        layer's attention has read them: one stream), so v needs no pad and no copy."""
        key = (num_cols, dtype, device)
        if key not in self._padded_buffers:
            buffer = torch.empty(self.num_padded, num_cols, dtype=dtype, device=device)
            buffer[self.num_tokens :].zero_()  # finite padded keys/values (NaN would poison P @ V)
            self._padded_buffers[key] = buffer
        return self._padded_buffers[key]

    def for_window(self, window: int | None) -> BlockMask:
        if window not in self._by_window:
            self._by_window[window] = self._build(window)
        return self._by_window[window]

    def _build(self, window: int | None) -> BlockMask:
        full, any_ = self.full_blocks, self.any_blocks
        if window is not None:  # conservative: full only if every pair is in the window
            full = full & (self.block_pos_max[:, None] - self.block_pos_min[None, :] < window)
            any_ = any_ & (self.block_pos_min[:, None] - self.block_pos_max[None, :] < window)
        partial = any_ & ~full
        kv_num, kv_idx = _dense_to_ordered(partial)
        full_num, full_idx = _dense_to_ordered(full)
        return BlockMask.from_kv_blocks(
            kv_num[None, None], kv_idx[None, None], full_num[None, None], full_idx[None, None],
            BLOCK_SIZE=BLOCK_SIZE, mask_mod=self._mask_mod(window), seq_lengths=(self.num_padded, self.num_padded),
        )

    def _mask_mod(self, window: int | None):
        if self.subtree_end is not None:
            return self._subtree_mask_mod(window)
        bits, row_base, span_start, span_end, pos = self.bits, self.row_base, self.span_start, self.span_end, self.positions

        def tree_mask_mod(b, h, q, kv):
            offset = kv - span_start[q]
            in_span = (kv >= span_start[q]) & (kv < span_end[q])
            word = bits[row_base[q] + torch.where(in_span, offset, 0) // 32]
            keep = in_span & (((word >> (offset % 32)) & 1) == 1)
            if window is not None:
                keep = keep & (pos[q] - pos[kv] < window)
            return keep

        return tree_mask_mod

    def _subtree_mask_mod(self, window: int | None):
        subtree_end, pos = self.subtree_end, self.positions

        def subtree_mask_mod(b, h, q, kv):
            keep = (kv <= q) & (q < subtree_end[kv])
            if window is not None:
                keep = keep & (pos[q] - pos[kv] < window)
            return keep

        return subtree_mask_mod


def _dense_to_ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[nq, nk] bool -> (count [nq] int32, indices [nq, nk] int32, the True columns first, ascending)."""
    counts = dense.sum(-1, dtype=torch.int32)
    order = torch.argsort(dense.to(torch.int8), dim=-1, descending=True, stable=True)
    return counts, order.to(torch.int32)


def prepare_cuda_attention(meta, device: torch.device | str):
    """AttentionMetadata with CPU span masks -> the same with `block_mask` set (every other field kept)."""
    return dataclasses.replace(meta, block_mask=build_tree_block_masks(meta.spans, torch.device(device)))


def build_tree_block_masks(
    spans, device: torch.device | str, bucket: int = BUCKET, use_subtrees: bool = True
) -> TreeBlockMasks:
    """use_subtrees: read the spans' subtree ends when every span has them (False: the dense
    masks' bits, which every span must then have)."""
    device = torch.device(device)
    num_tokens = spans[-1].start + spans[-1].num_tokens
    num_padded = -(-num_tokens // bucket) * bucket
    positions = np.zeros(num_padded, dtype=np.int64)
    for span in spans:
        if span.num_tokens % BLOCK_SIZE or span.start % BLOCK_SIZE:
            raise ValueError(f"span at {span.start} of {span.num_tokens} tokens is not aligned to {BLOCK_SIZE}")
        positions[span.start : span.start + span.num_tokens] = np.asarray(span.positions)
    block_pos = positions.reshape(-1, BLOCK_SIZE)

    def to_dev(a: np.ndarray) -> torch.Tensor:  # pinned on CUDA: the copy does not wait for the pass in flight
        return to_device(torch.from_numpy(a), device)

    common = dict(num_tokens=num_tokens, num_padded=num_padded, positions=to_dev(positions),
                  block_pos_min=to_dev(block_pos.min(axis=1)), block_pos_max=to_dev(block_pos.max(axis=1)))
    if use_subtrees and all(span.subtree_end is not None for span in spans):
        subtree_end = np.arange(num_padded, dtype=np.int32)  # bucket padding: seen by no row
        for span in spans:
            subtree_end[span.start : span.start + span.num_tokens] = span.subtree_end + span.start
        any_blocks, full_blocks = _classify_subtree_blocks(subtree_end)
        return TreeBlockMasks(**common, any_blocks=to_dev(any_blocks), full_blocks=to_dev(full_blocks),
                              subtree_end=to_dev(subtree_end))
    return _bits_block_masks(spans, device, common, to_dev)


def _classify_subtree_blocks(subtree_end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[Tp] subtree ends -> (any, full) [nb, nb] bool for the mask kv <= q < subtree_end[kv].
    Below the diagonal (bk < bq) every column precedes every row, so the block is full when
    the smallest end in column block bk reaches past row block bq, and has a True when the
    largest end enters it. On the diagonal some column reaches its own row unless every end
    is empty; above it nothing is visible."""
    num_blocks = subtree_end.shape[0] // BLOCK_SIZE
    columns = np.arange(subtree_end.shape[0]).reshape(num_blocks, BLOCK_SIZE)
    ends = subtree_end.reshape(num_blocks, BLOCK_SIZE)
    row_block_start = np.arange(num_blocks)[:, None] * BLOCK_SIZE  # [bq, 1]
    below = np.tri(num_blocks, k=-1, dtype=bool)  # [bq, bk]: bk < bq
    full = below & (ends.min(axis=1)[None, :] >= row_block_start + BLOCK_SIZE)
    any_ = below & (ends.max(axis=1)[None, :] > row_block_start)
    any_[np.diag_indices(num_blocks)] = (ends > columns).any(axis=1)
    return any_, full


def _bits_block_masks(spans, device: torch.device, common: dict, to_dev) -> TreeBlockMasks:
    """The dense masks as bits (32 columns a word) plus per-token span tables; blocks classified
    per span from the bits."""
    num_padded = common["num_padded"]
    num_blocks = num_padded // BLOCK_SIZE
    row_base = np.zeros(num_padded, dtype=np.int64)
    span_start = np.full(num_padded, num_padded, dtype=np.int64)
    span_end = np.full(num_padded, num_padded, dtype=np.int64)
    any_blocks = np.zeros((num_blocks, num_blocks), dtype=bool)
    full_blocks = np.zeros((num_blocks, num_blocks), dtype=bool)
    words: list[np.ndarray] = []
    num_words = 0
    for span in spans:
        if span.mask is None:
            raise ValueError(f"span at {span.start} has neither subtree ends nor a dense mask")
        mask = span.mask.numpy() if isinstance(span.mask, torch.Tensor) else span.mask
        n, start = mask.shape[0], span.start
        span_bits = np.packbits(mask, axis=1, bitorder="little").view("<i4")  # [n, n/32]
        rows = slice(start, start + n)
        row_base[rows] = num_words + np.arange(n) * (n // 32)
        span_start[rows], span_end[rows] = start, start + n
        blocks = span_bits.reshape(n // BLOCK_SIZE, BLOCK_SIZE, n // BLOCK_SIZE, BLOCK_SIZE // 32)
        b0, nb = start // BLOCK_SIZE, n // BLOCK_SIZE
        any_blocks[b0 : b0 + nb, b0 : b0 + nb] = (blocks != 0).any(axis=(1, 3))
        full_blocks[b0 : b0 + nb, b0 : b0 + nb] = (blocks == -1).all(axis=(1, 3))
        words.append(span_bits.reshape(-1))
        num_words += span_bits.size
    # Capacity depends only on the bucket, so the compiled kernel's input shapes repeat.
    # Words past num_words are never read (the mask_mod reads only inside q's span): empty, not zeros.
    bits = torch.empty(num_padded * num_padded // 32, dtype=torch.int32, device=device)
    words_host = torch.from_numpy(np.concatenate(words))
    bits[:num_words].copy_(words_host.pin_memory() if device.type == "cuda" else words_host, non_blocking=True)
    return TreeBlockMasks(
        **common, any_blocks=to_dev(any_blocks), full_blocks=to_dev(full_blocks), bits=bits,
        row_base=to_dev(row_base), span_start=to_dev(span_start), span_end=to_dev(span_end),
    )


def flex_tree_attention(
    q: torch.Tensor,  # [T or Tp, Hq, d]
    k: torch.Tensor,  # [T or Tp, Hkv, d]
    v: torch.Tensor,  # [T or Tp, Hkv, d]
    masks: TreeBlockMasks,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:  # [T, Hq, d]
    """Inputs already of Tp rows (zero past T: the models' padded q/k/v path) are used as they
    are; inputs of T rows are padded here."""
    num_tokens = masks.num_tokens

    def heads_first(x: torch.Tensor) -> torch.Tensor:  # [T or Tp, H, d] -> [1, H, Tp, d]
        if x.shape[0] != masks.num_padded:
            x = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, masks.num_padded - x.shape[0]))
        return x.transpose(0, 1)[None]

    out = _flex(q.is_cuda)(
        heads_first(q), heads_first(k), heads_first(v), block_mask=masks.for_window(sliding_window),
        scale=scale, enable_gqa=q.shape[1] != k.shape[1], kernel_options=KERNEL_OPTIONS if q.is_cuda else None,
    )  # [1, Hq, Tp, d]
    return out[0, :, :num_tokens].transpose(0, 1)


def _flex(is_cuda: bool):
    """flex_attention compiled on first use (CUDA); eager on CPU, where the tests run."""
    global _compiled_flex
    if not is_cuda:
        return flex_attention
    if _compiled_flex is None:
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex

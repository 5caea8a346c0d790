"""Tree attention behind one seam.

    PackedBatch (packer) --prepare_attention--> AttentionMetadata --tree_attention--> [T, Hq, d]

Every content's token tree occupies its own span of the packed stream, aligned to
ROW_CHUNK. Inside a span a token sees its ancestors and itself (the tree mask); nothing
crosses spans. On CPU each span runs SDPA per block of query rows, each block against only
the keys its rows may see (span_block: found from the subtree ends, no [n, n] mask is held),
so a content's attention has the same shapes whatever it is packed with (batch invariance). On CUDA
`engine.layers.attention_cuda.prepare_cuda_attention` turns the spans into a flex_attention block
mask (`meta.block_mask`; for tree masks from the subtree ends alone, no [n, n] mask is
made), and `tree_attention` runs the compiled flex kernel.
Extraction slots (engine/extraction/kv_cache.py) use the same seam: on a packed pass `meta.capture`
keeps the slots' prompt K/V per layer; on a decoding pass `meta.decode` replaces the spans
(new rows attend to the kept K/V). Both are why every layer passes its `layer_index`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from engine.extraction.kv_cache import KVCapture
from engine.layers.decode_attention import DecodeMetadata

if TYPE_CHECKING:  # a type only: importing it loads flex_attention, which CPU passes never use
    from engine.layers.attention_cuda import TreeBlockMasks


@dataclass(slots=True)
class TreeSpan:
    start: int  # first row in the packed stream (a multiple of ROW_CHUNK)
    mask: torch.Tensor | None  # [n, n] bool: row may attend to column (ancestor or self); pads see
    # themselves. None when the packer left it out (CUDA reads subtree_end instead)
    positions: torch.Tensor  # [n] depth of each token in its tree (pads: 0)
    subtree_end: np.ndarray | None = None  # [n] int32 when `mask` is packer.tree_mask's: row i sees
    # column j exactly when j <= i < subtree_end[j] (None: another mask)

    @property
    def num_tokens(self) -> int:
        return self.positions.shape[0]


@dataclass(slots=True)
class AttentionMetadata:
    spans: list[TreeSpan]  # one per tree, in stream order, covering the whole stream
    block_mask: TreeBlockMasks | None = None  # CUDA: the flex_attention block masks of the spans; None on CPU
    capture: KVCapture | None = None  # a packed pass with slots: keep their prompt K/V
    decode: DecodeMetadata | None = None  # a decoding pass over kept K/V (replaces the spans)


def span_mask(span: TreeSpan, sliding_window: int | None, start: int = 0, stop: int | None = None,
              columns: torch.Tensor | None = None) -> torch.Tensor:
    """Rows [start, stop) of the span's tree mask, narrowed to keys less than `sliding_window`
    positions back: [stop - start, n] bool, or [stop - start, len(columns)] for those columns
    only. Without a dense mask (the packer's tree mask, left out), the rows are made from the
    subtree ends: row i sees column j when j <= i < end[j]."""
    num_tokens = span.positions.shape[0]
    stop = num_tokens if stop is None else stop
    every_column = columns is None
    columns = torch.arange(num_tokens) if every_column else columns
    if span.mask is not None:
        mask = span.mask[start:stop] if every_column else span.mask[start:stop][:, columns]
    elif span.subtree_end is not None:
        rows = torch.arange(start, stop)[:, None]
        ends = torch.from_numpy(span.subtree_end[columns.numpy()].astype(np.int64))  # only the columns' ends
        mask = (columns[None, :] <= rows) & (rows < ends[None, :])
    else:
        raise ValueError("this span has neither a dense mask nor subtree ends")
    if sliding_window is None:
        return mask
    positions = span.positions if every_column else span.positions[columns]
    distance = span.positions[start:stop, None] - positions[None, :]  # [rows, columns]
    return mask & (distance < sliding_window)


def span_block(span: TreeSpan, sliding_window: int | None, start: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns rows [start, stop) of the span may see, and the rows' mask over them:
    ([m] long, [stop - start, m] bool). With subtree ends they are found without a mask of the
    whole row width: column j < stop is seen when end[j] > start (j's subtree reaches a row of
    the block; in a tree that is start's ancestors and the block's own rows)."""
    if span.mask is None and span.subtree_end is not None:
        columns = torch.from_numpy(np.flatnonzero(span.subtree_end[:stop] > start))
        mask = span_mask(span, sliding_window, start, stop, columns)
        if sliding_window is None:
            return columns, mask
        return visible_columns(mask, columns)
    return visible_columns(span_mask(span, sliding_window, start, stop))


def visible_columns(mask: torch.Tensor, columns: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """mask [r, m] bool (over `columns`, else over 0..m-1) -> the columns some row sees, and the
    mask narrowed to them."""
    seen = torch.nonzero(mask.any(dim=0)).squeeze(1)
    return (seen if columns is None else columns[seen]), mask[:, seen]


def tree_attention(
    q: torch.Tensor,  # [T, Hq, d]
    k: torch.Tensor,  # [T, Hkv, d]
    v: torch.Tensor,  # [T, Hkv, d]
    meta: AttentionMetadata,
    scale: float,
    sliding_window: int | None = None,
    layer_index: int = 0,
) -> torch.Tensor:  # [T, Hq, d]
    if meta.capture is not None:
        meta.capture.save(layer_index, k, v)
    if meta.decode is not None:
        from engine.layers.decode_attention import decode_attention

        return decode_attention(q, k, v, meta.decode, layer_index, scale, sliding_window)
    if meta.block_mask is not None:
        from engine.layers.attention_cuda import (
            flex_tree_attention,  # imports flex_attention lazily
        )

        return flex_tree_attention(q, k, v, meta.block_mask, scale, sliding_window)
    out = torch.empty_like(q)
    for span in meta.spans:
        rows = slice(span.start, span.start + span.num_tokens)
        out[rows] = sdpa_in_row_blocks(q[rows], k[rows], v[rows], partial(span_block, span, sliding_window), scale)
    return out


CPU_SCORES_PER_BLOCK = 1 << 24  # scores [Hq, rows, n] a block of rows may hold on CPU (64 MiB of float32;
# SDPA holds several buffers of that size; a block reading fewer keys holds less; the memory a pass
# gives back: tests/engine/test_cpu_memory.py)


def sdpa_in_row_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       block: torch.Tensor | Callable[[int, int], tuple[torch.Tensor, torch.Tensor]],
                       scale: float) -> torch.Tensor:
    """`sdpa` over blocks of query rows, each against only the keys its rows may see. A tree
    span's rows see their ancestors: a block of rows deep in a span of 400 questions sees the
    content and its own questions, a few hundred of the span's 14,000 keys, so the block reads
    those alone (a dense call over every key computes, then masks, all 14,000). Blocks bound
    the memory too: a block holds at most CPU_SCORES_PER_BLOCK scores (a whole 6,000-token span
    of 4 heads held 1.5 GB). The blocks and their columns depend only on the span, so a
    content's attention is the same bits whatever it is packed with. `block`: the [n, m] bool
    mask, or (start, stop) -> (columns, the rows' mask over them): span_block."""
    block_of = block if callable(block) else lambda start, stop: visible_columns(block[start:stop])
    num_rows = q.shape[0]
    rows = max(1, CPU_SCORES_PER_BLOCK // (q.shape[1] * k.shape[0]))
    out = torch.empty_like(q)
    for start in range(0, num_rows, rows):
        stop = min(start + rows, num_rows)
        columns, mask = block_of(start, stop)
        out[start:stop] = sdpa(q[start:stop], k[columns], v[columns], mask, scale)
    return out


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """q: [n, Hq, d], k/v: [m, Hkv, d], mask: [n, m] -> [n, Hq, d]."""
    num_groups = q.shape[1] // k.shape[1]
    if num_groups > 1:
        k = k.repeat_interleave(num_groups, dim=1)
        v = v.repeat_interleave(num_groups, dim=1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, scale=scale
    )  # [Hq, n, d]
    return out.transpose(0, 1)

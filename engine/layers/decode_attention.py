"""Attention of a decoding pass: new rows against the K/V a slot kept from the read.

    DecodeSpan per slot (its live hypotheses' new tokens, its SlotKV in an arena; or a finished
        slot held in place, whose padding rows only see themselves)
        --group_spans--> DecodeGroup per (arena, rows per slot): host index tensors and masks,
        built once per pass (a CUDA graph's replay copies them into its own: decode_graphs.py);
        on the device each mask becomes SDPA's additive bias once per pass, not at every layer
    decode_attention, per layer and group (`decoding_attention(kernel)` picks how):
        "triton" (CUDA): one launch of engine/kernels/decode_attention.py per group: each span
            writes its new rows' K/V into its entry and attends to the keys it may see only
            (a span row [start, entry, first_new, key_lo, key_hi], its mask [n, C])
        "sdpa" (CPU always): the new rows' K/V written into their slots' entries in place,
            then ONE SDPA over the group's entries [B, Hkv, C, d] at full capacity

The arenas and the capture that fills them are engine/extraction/kv_cache.py; that module's
docstring states the batch-invariance argument for the shapes used here.
"""

from __future__ import annotations

import math
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from engine.kernels import decode_attention as decode_attention_kernels
from engine.layers.ops import chosen, to_device

if TYPE_CHECKING:
    from engine.extraction.kv_cache import KVArena, SlotKV


SHARED_TRUNKS = True  # the Triton kernel reads the trunk the slots of one content share from one sibling's entry (False: each its own copy)
DECODING_ATTENTION = ("triton", "sdpa")  # how a decoding pass's attention runs on CUDA (CPU: always sdpa)
_DECODING_ATTENTION = ContextVar("decoding_attention", default="triton")


def decoding_attention(kernel: str):
    """Inside: `decode_attention` on CUDA runs as `kernel` (one of DECODING_ATTENTION)."""
    return chosen(_DECODING_ATTENTION, kernel, DECODING_ATTENTION)


@dataclass(slots=True)
class DecodeSpan:
    start: int  # first row in the decoding stream (a multiple of SCORE_CHUNK)
    num_rows: int  # rows of this slot, padded to SCORE_CHUNK
    num_real: int  # live hypotheses (rows past them are padding)
    kv: SlotKV  # in its arena, with room for num_rows more rows
    mask: torch.Tensor  # [num_rows, first_new_row + num_rows] bool over (the entry's rows before the new ones, the new)
    positions: torch.Tensor  # [num_rows] long positions of the new rows
    first_new_row: int  # where the new rows' K/V go in its entry: kv.num_rows (held: capacity - num_rows)


@dataclass(slots=True)
class DecodeGroup:
    """The spans of a pass in one arena with the same rows per slot: one SDPA per layer over
    the arena's entries [first_entry, first_entry + num_entries). Host tensors; `on` copies."""

    arena: KVArena
    first_entry: int
    num_entries: int  # B
    num_rows: int  # n rows per entry
    query_rows: torch.Tensor  # [B * n] long stream row of each query (row 0 for entries not in the pass)
    rows: torch.Tensor  # [P * n] long stream rows of the group's spans
    write_rows: torch.Tensor  # [P * n] long their K/V's rows in the arena's flat [E * C] rows
    out_rows: torch.Tensor  # [P * n] long their rows in the group's flat [B * n] output
    mask: torch.Tensor  # [B, n, C] bool
    positions: torch.Tensor  # [B, n] long positions of the queries
    key_positions: torch.Tensor  # [B, C] long positions of the keys (0 past a slot's rows)
    spans: torch.Tensor  # [P, 7] int32 per span (start, entry, first_new, key_lo, key_hi, trunk_entry, trunk_end): the Triton kernel's
    _on: dict = field(default_factory=dict, repr=False)  # device / (window, device, G) -> tensors there
    _biases: dict = field(default_factory=dict, repr=False)  # (window, device, G, dtype) -> [B, 1, G * n, C] bias

    def indices(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(query_rows, rows, write_rows, out_rows, spans) on `device`, copied once per pass."""
        if device not in self._on:
            self._on[device] = tuple(to_device(t, device) for t in self.host_indices())
        return self._on[device]

    def host_indices(self) -> tuple[torch.Tensor, ...]:
        return self.query_rows, self.rows, self.write_rows, self.out_rows, self.spans

    def attention_mask(self, sliding_window: int | None, device: torch.device, num_groups: int | None) -> torch.Tensor:
        """`host_mask` on `device`, made once per pass."""
        key = (sliding_window, device, num_groups)
        if key not in self._on:
            self._on[key] = to_device(self.host_mask(sliding_window, num_groups), device)
        return self._on[key]

    def attention_bias(self, sliding_window: int | None, device: torch.device, num_groups: int,
                       dtype: torch.dtype) -> torch.Tensor:
        """`attention_mask` as SDPA's additive bias (0 where attended, -inf where not), made once
        per pass on the device, not by SDPA at every layer: the values SDPA makes of a bool
        mask, so the same bits."""
        key = (sliding_window, device, num_groups, dtype)
        if key not in self._biases:
            mask = self.attention_mask(sliding_window, device, num_groups)
            self._biases[key] = torch.zeros(mask.shape, dtype=dtype, device=device).masked_fill_(~mask, -math.inf)
        return self._biases[key]

    def host_mask(self, sliding_window: int | None, num_groups: int | None) -> torch.Tensor:
        """[B, 1, G * n, C]: `mask` narrowed to keys less than `sliding_window` positions back,
        repeated for the G query heads folded into each kv head (SDPA's); num_groups None:
        [P, n, C], the same per span (the Triton kernel's)."""
        mask, positions, key_positions = self.mask.numpy(), self.positions.numpy(), self.key_positions.numpy()
        if num_groups is None:  # the spans' entries, in span order (before the window: fewer rows to narrow)
            entries = self.spans[:, 1].numpy().astype(np.int64) - self.first_entry
            mask, positions, key_positions = mask[entries], positions[entries], key_positions[entries]
        if sliding_window is not None and int(positions.max(initial=0)) >= sliding_window:  # else no key is out of it
            mask = mask & (positions[:, :, None] - key_positions[:, None, :] < sliding_window)
        mask = torch.from_numpy(np.ascontiguousarray(mask))
        if num_groups is None:
            return mask
        b, n, c = mask.shape
        return mask[:, None, None].expand(b, 1, num_groups, n, c).reshape(b, 1, num_groups * n, c)

    def mask_keys(self) -> list[tuple[int | None, torch.device, int]]:
        """The (sliding_window, device, G) of every mask this pass's attention asked for."""
        return [key for key in self._on if isinstance(key, tuple)]

    def shape(self) -> tuple:
        """What a CUDA graph of a pass bakes in for this group: the arena's tensors (by address:
        an arena that grew has new ones), the entries attended and the index lengths."""
        arena = self.arena
        return (id(arena), arena.keys[0].data_ptr(), arena.values[0].data_ptr(), arena.capacity, self.first_entry,
                self.num_entries, self.num_rows, self.rows.shape[0])


@dataclass(slots=True)
class DecodeMetadata:
    spans: list[DecodeSpan]  # one per slot in the pass
    groups: list[DecodeGroup] = field(init=False)  # group_spans(spans): one SDPA per group and layer

    def __post_init__(self) -> None:
        self.groups = group_spans(self.spans)


def group_spans(spans: list[DecodeSpan]) -> list[DecodeGroup]:
    """The spans grouped by (arena, rows per slot), in order of first appearance."""
    by_key: dict[tuple[int, int], list[DecodeSpan]] = {}
    for span in spans:
        by_key.setdefault((id(span.kv.arena), span.num_rows), []).append(span)
    return [_group(members) for members in by_key.values()]


def _group(spans: list[DecodeSpan]) -> DecodeGroup:
    """The group's host tensors, built in numpy (a pass builds them for every group; torch's
    per-op overhead on these small tensors was most of the cost) and handed over as tensors."""
    arena, n = spans[0].kv.arena, spans[0].num_rows
    capacity = arena.capacity
    entry_of = np.array([span.kv.entry for span in spans], dtype=np.int64)
    first = int(entry_of.min())
    num_entries = int(entry_of.max()) + 1 - first
    entries = entry_of - first  # [P]
    new = np.arange(n)
    rows = np.array([span.start for span in spans], dtype=np.int64)[:, None] + new  # [P, n]
    first_new = np.array([span.first_new_row for span in spans], dtype=np.int64)  # [P]
    query_rows = np.zeros((num_entries, n), dtype=np.int64)
    query_rows[entries] = rows
    mask = np.zeros((num_entries, n, capacity), dtype=np.bool_)
    mask[:, :, 0] = True  # entries not in the pass: a dummy query that sees one (finite) key
    mask[entries, :, 0] = False
    positions = np.zeros((num_entries, n), dtype=np.int64)
    positions[entries] = np.stack([span.positions.numpy() for span in spans])
    key_positions = np.zeros((num_entries, capacity), dtype=np.int64)
    for entry, span in zip(entries.tolist(), spans):
        mask[entry, :, : span.first_new_row + n] = span.mask.numpy()
        if span.num_real:  # a held span's rows see only themselves: key positions stay 0, as theirs
            key_positions[entry, : span.first_new_row + n] = np.concatenate((span.kv.positions.numpy(),
                                                                              span.positions.numpy()))
    live = np.array([span.num_real > 0 for span in spans])
    trunk_entry, trunk_end = _trunks(spans)
    span_table = np.stack((rows[:, 0], entry_of, first_new, np.where(live, 0, first_new), first_new + n,
                           trunk_entry, trunk_end), 1)
    tensor = torch.from_numpy
    return DecodeGroup(arena, first, num_entries, n, tensor(query_rows.reshape(-1)), tensor(rows.reshape(-1)),
                       tensor((((entry_of * capacity + first_new)[:, None]) + new).reshape(-1)),
                       tensor((entries[:, None] * n + new).reshape(-1)), tensor(mask), tensor(positions),
                       tensor(key_positions), tensor(span_table.astype(np.int32)))


def _trunks(spans: list[DecodeSpan]) -> tuple[np.ndarray, np.ndarray]:
    """Per span (trunk_entry, trunk_end) of the kernel's span table: a live span whose slot
    shares a trunk with the first live span of the group that has it reads that span's entry
    for the trunk's rows (rounded down to whole key blocks); any other: its own, none."""
    if not SHARED_TRUNKS:
        return np.array([span.kv.entry for span in spans], dtype=np.int64), np.zeros(len(spans), dtype=np.int64)
    first_of: dict[int, DecodeSpan] = {}  # id(trunk) -> the first live span with it
    entry, end = [], []
    for span in spans:
        trunk = span.kv.trunk
        if not span.num_real or trunk is None:
            entry.append(span.kv.entry)
            end.append(0)
            continue
        first = first_of.setdefault(id(trunk), span)
        entry.append(first.kv.entry)
        end.append(trunk.num_rows // decode_attention_kernels.BLOCK_N * decode_attention_kernels.BLOCK_N)
    return np.array(entry, dtype=np.int64), np.array(end, dtype=np.int64)


def decode_attention(
    q: torch.Tensor,  # [T, Hq, d]
    k: torch.Tensor,  # [T, Hkv, d]
    v: torch.Tensor,  # [T, Hkv, d]
    meta: DecodeMetadata,
    layer: int,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:  # [T, Hq, d]; rows outside every span are zero
    out = torch.zeros_like(q)
    if q.is_cuda and _DECODING_ATTENTION.get() == "triton":
        for group in meta.groups:
            spans = group.indices(q.device)[-1]
            mask = group.attention_mask(sliding_window, q.device, None)
            decode_attention_kernels.decode_attention(q, k, v, group.arena.keys[layer], group.arena.values[layer],
                                                      spans, mask, group.num_rows, scale, out, SHARED_TRUNKS)
        return out
    for group in meta.groups:
        query_rows, rows, write_rows, out_rows, _ = group.indices(q.device)
        keys, values = group.arena.keys[layer], group.arena.values[layer]  # [E, C, Hkv, d]
        keys.view(-1, *k.shape[1:]).index_copy_(0, write_rows, k.index_select(0, rows))  # in place
        values.view(-1, *v.shape[1:]).index_copy_(0, write_rows, v.index_select(0, rows))
        entries = slice(group.first_entry, group.first_entry + group.num_entries)
        num_groups = q.shape[1] // k.shape[1]
        attended = F.scaled_dot_product_attention(
            _fold(q.index_select(0, query_rows), group.num_rows, k.shape[1]),  # [B, Hkv, G * n, d]
            keys[entries].transpose(1, 2),  # [B, Hkv, C, d], a view
            values[entries].transpose(1, 2),
            attn_mask=group.attention_bias(sliding_window, q.device, num_groups, q.dtype),
            scale=scale,
        )  # [B, Hkv, G * n, d]
        out.index_copy_(0, rows, _unfold(attended, group.num_rows).index_select(0, out_rows))
    return out


def _fold(q: torch.Tensor, n: int, num_kv_heads: int) -> torch.Tensor:
    """[B * n, Hq, d] -> [B, Hkv, G * n, d]: query head h = kv head h // G (as repeat_interleave)."""
    rows, num_heads, d = q.shape
    g = num_heads // num_kv_heads
    return q.view(rows // n, n, num_kv_heads, g, d).permute(0, 2, 3, 1, 4).reshape(rows // n, num_kv_heads, g * n, d)


def _unfold(out: torch.Tensor, n: int) -> torch.Tensor:
    """[B, Hkv, G * n, d] -> [B * n, Hq, d]."""
    b, num_kv_heads, gn, d = out.shape
    g = gn // n
    return out.view(b, num_kv_heads, g, n, d).permute(0, 3, 1, 2, 4).reshape(b * n, num_kv_heads * g, d)


def decode_mask(kv: SlotKV, hypothesis_rows: list[list[int]], num_rows: int) -> torch.Tensor:
    """[num_rows, L + num_rows]: a live hypothesis sees the prompt, its own decoded rows and
    itself; a padding row only itself."""
    num_kept = kv.num_rows
    mask = np.zeros((num_rows, num_kept + num_rows), dtype=np.bool_)  # numpy: a third of torch's time here
    mask[: len(hypothesis_rows), : kv.num_prompt_rows] = True
    rows = [row for row, own in enumerate(hypothesis_rows) for _ in own]
    if rows:  # one scatter for every hypothesis's decoded rows
        mask[rows, [col for own in hypothesis_rows for col in own]] = True
    index = np.arange(num_rows)
    mask[index, num_kept + index] = True
    return torch.from_numpy(mask)


def held_span(start: int, num_rows: int, kv: SlotKV) -> DecodeSpan:
    """A finished slot kept in its pass's layout (so the pass keeps its shape, decode_graphs.py):
    padding rows at `start` that write the last rows of its arena entry and see only
    themselves. The slot's K/V is no longer read."""
    first_new = kv.arena.capacity - num_rows
    mask = torch.zeros(num_rows, first_new + num_rows, dtype=torch.bool)
    index = torch.arange(num_rows)
    mask[index, first_new + index] = True
    return DecodeSpan(start, num_rows, 0, kv, mask, torch.zeros(num_rows, dtype=torch.long), first_new)
